/**
 * The sans-IO protocol core of wirepool (PROTOCOL.md section 14): constants, the frame codec and
 * the connection state machine. No sockets, no clocks, no handlers: bytes in, events out.
 * @module
 */
export * from "./constants.js";
export * from "./errors.js";
export * from "./frames.js";
export * from "./decoder.js";
export * from "./connection.js";
export * from "./policies.js";
export * from "./liveness.js";
export * from "./shm.js";
