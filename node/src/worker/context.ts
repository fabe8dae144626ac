/**
 * What a handler sees of its request: the {@link Context}, and the errors it may throw.
 * @module
 */

import type { Codec } from "../codecs/index.js";
import { ErrorCode } from "../proto/constants.js";

/**
 * The request a handler is running for. Cancellation (the parent's CANCEL, the request's
 * deadline, or the end of a DRAIN's grace) sets `cancelled` and aborts `signal`; pass the
 * signal to anything that accepts one (`fetch`, `setTimeout` from `node:timers/promises`,
 * streams). A handler that ignores it still has its request ended: at the deadline by the
 * worker itself (PROTOCOL.md 8.3), on CANCEL by the parent's kill after its grace.
 *
 * @example
 * ```ts
 * import { setTimeout as sleep } from "node:timers/promises";
 * worker.method("slow", async (ms: number, ctx) => {
 *   ctx.progress("started", { ms });
 *   await sleep(ms, undefined, { signal: ctx.signal }); // rejects on cancel or deadline
 *   return ms;
 * });
 * ```
 */
export interface Context {
  /** The request id (unique on this worker's connection). */
  readonly id: number;
  /** The method's name. */
  readonly method: string;
  /** The request's codec: its body, result, rows and summary all use it. */
  readonly codec: Codec;
  /** Aborted when the request is cancelled or its deadline passes; `reason` is a {@link RequestCancelled}. */
  readonly signal: AbortSignal;
  /** True once the request is cancelled or past its deadline. */
  readonly cancelled: boolean;
  /** The deadline as a `Date.now()` time in ms, or null when the request has none. */
  readonly deadline: number | null;
  /** Milliseconds left before the deadline (0 once past), or null without one. */
  remainingMs(): number | null;
  /**
   * Reports progress to the parent (an EVENT frame with `topic` and `data` as JSON). Events are
   * not flow controlled, so they are coalesced: at most one batch per 10 ms, the latest `data`
   * per topic; pending ones are sent before the request's terminal.
   * @throws TypeError when `topic` is not 1-255 bytes of UTF-8.
   */
  progress(topic: string, data?: unknown): void;
}

/** Why a request stopped: its cancellation flag's code (PROTOCOL.md 8.3). */
export class RequestCancelled extends Error {
  override readonly name = "RequestCancelled";
  constructor(
    /** `ErrorCode.CANCELLED` (205) or `ErrorCode.DEADLINE_EXCEEDED` (206). */
    readonly code: number,
  ) {
    super(code === ErrorCode.DEADLINE_EXCEEDED ? "the request's time budget ran out" : "the request was cancelled");
  }
}

/**
 * An application error with its own code: throw it from a handler to end the request with
 * ERROR `code` (1000 or above: codes below belong to the protocol, and a handler that uses one
 * ends with HANDLER_ERROR instead), `message`, and `details` sent as JSON.
 *
 * @example
 * ```ts
 * worker.method("lookup", (req: { key: string }) => {
 *   if (!table.has(req.key)) throw new WorkerError(1404, "no such key", { key: req.key });
 *   return table.get(req.key);
 * });
 * ```
 */
export class WorkerError extends Error {
  override readonly name = "WorkerError";
  constructor(
    /** The error code sent to the parent (1000 and above for applications). */
    readonly code: number,
    message: string,
    /** Sent as JSON in the ERROR's details; undefined sends none. */
    readonly details?: unknown,
  ) {
    super(message);
  }
}
