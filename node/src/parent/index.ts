/**
 * The parent side of wirepool: a {@link Pool} of worker processes, its streams and leases, and
 * the typed errors every call may end with.
 * @module
 */
export { Pool, RowStream, Lease } from "./pool.js";
export type { PoolOptions, RetryOptions, CallOptions, CodecLike, LogEntry, PoolMetrics, WorkerMetrics } from "./pool.js";
export { MapResults } from "./map.js";
export type { MapOptions } from "./map.js";
export * from "./errors.js";
export { Listener, JoinTicket } from "./listener.js";
export type { ListenerOptions, ListenerStats, Joined } from "./listener.js";
