/**
 * wirepool for Node.js. Today the package holds the sans-IO protocol core (`wirepool/proto`);
 * the worker and parent drivers build on it.
 * @module
 */
export * from "./proto/index.js";
