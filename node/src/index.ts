/**
 * wirepool for Node.js. Today the package holds the sans-IO protocol core (`wirepool/proto`);
 * the worker and parent drivers build on it.
 * @module
 */
export * from "./proto/index.js";
export * from "./worker/index.js";
export { codec, codecById, CODECS, type Codec, type CodecName } from "./codecs/index.js";
export * from "./parent/index.js";
