/**
 * The errors a parent raises: every failure of a call is a {@link WirepoolError} with the
 * spec's numeric code (PROTOCOL.md section 3), its name, the request id, and, when a worker
 * died, its exit status, signal and the tail of its stderr. Catch a subclass to handle one kind
 * of failure, or WirepoolError for all of them.
 *
 * @example
 * ```ts
 * try {
 *   await pool.call("parse", text);
 * } catch (e) {
 *   if (e instanceof WorkerExitedError) console.log(e.exitStatus, e.signal, e.stderrTail);
 *   else if (e instanceof WirepoolError && e.code === ErrorCode.HANDLER_ERROR) console.log(e.message);
 *   else throw e;
 * }
 * ```
 * @module
 */

import { ErrorCode } from "../proto/constants.js";
import { errorName } from "../proto/errors.js";

/** What a {@link WirepoolError} may carry besides its code and message. */
export interface WirepoolErrorInit {
  /** The request id on its worker's connection (0: not a request's, or not sent yet). */
  readonly requestId?: number;
  /** The ERROR frame's details (JSON text, parsed), or a local error's structured details. */
  readonly details?: unknown;
  /** The worker's exit status, when it exited normally (null: killed by a signal, or unknown). */
  readonly exitStatus?: number | null;
  /** The number of the signal that killed the worker (null: none, or unknown). */
  readonly signal?: number | null;
  /** The last lines the worker wrote to its stderr. */
  readonly stderrTail?: string;
  /** The worker's process id. */
  readonly pid?: number;
  /** The 1xx code of a PROTOCOL_VIOLATION (also in `details.protocol_code`). */
  readonly protocolCode?: number;
  readonly cause?: unknown;
}

/** Every failure of a call, with the spec's stable code (section 3). */
export class WirepoolError extends Error {
  /** The numeric code (e.g. 203 HANDLER_ERROR, 300 WORKER_EXITED, or an application code >= 1000). */
  readonly code: number;
  /** The code's name (`HANDLER_ERROR`), the same in every SDK. */
  readonly codeName: string;
  /** The request id on its worker's connection, 0 when the error is not a sent request's. */
  readonly requestId: number;
  /** The worker's ERROR details (parsed JSON), or structured local details; undefined if none. */
  readonly details: unknown;
  /** The dead worker's exit status (null: killed by a signal, or not known). */
  readonly exitStatus: number | null;
  /** The number of the signal that killed the worker (null: none or not known). */
  readonly signal: number | null;
  /** The last lines of the dead worker's stderr ("" when none). */
  readonly stderrTail: string;
  /** The process id of the worker involved (0 when none). */
  readonly pid: number;

  constructor(code: number, message: string, init: WirepoolErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.code = code;
    this.codeName = errorName(code);
    this.requestId = init.requestId ?? 0;
    this.details = init.details;
    this.exitStatus = init.exitStatus ?? null;
    this.signal = init.signal ?? null;
    this.stderrTail = init.stderrTail ?? "";
    this.pid = init.pid ?? 0;
  }

  override get name(): string {
    return `${this.constructor.name}[${this.codeName}]`;
  }
}

/**
 * The worker ended the request with an error: codes 200-299 and application codes >= 1000, and
 * any other code a worker put on the wire for a request (unassigned, 1xx, 3xx: section 3).
 */
export class RequestError extends WirepoolError {}
/** The request was cancelled: by the caller's AbortSignal, or by a drain past its grace (205). */
export class CancelledError extends RequestError {}
/** The request's deadline passed (206): the worker's answer, or the parent's own backstop. */
export class DeadlineExceededError extends RequestError {}
/** A local outcome the parent decided (codes 300-399); a 3xx a worker sends is a RequestError. */
export class LocalError extends WirepoolError {}
/** The worker died or closed its connection (300): see exitStatus, signal and stderrTail. */
export class WorkerExitedError extends LocalError {}
/** The worker missed its heartbeats or stopped a frame midway, and was killed (301). */
export class WorkerHungError extends LocalError {}
/** No valid HELLO within the start-up timeout (302). */
export class StartupTimeoutError extends LocalError {}
/** The worker program could not be started (303). */
export class SpawnFailedError extends LocalError {}
/** The pool is closed, or closed itself after too many restarts (304). */
export class PoolClosedError extends LocalError {}
/** The leased worker is gone (305): exitStatus, signal and stderrTail say how it died. */
export class LeaseLostError extends LocalError {}
/** The parent could not decode a result, row or summary with the call's codec (306). */
export class DecodeFailedError extends LocalError {}
/** The connection broke with a protocol violation (307); `protocolCode` is the 1xx code. */
export class ProtocolViolationError extends LocalError {
  /** The 1xx code (also `details.protocol_code`). */
  readonly protocolCode: number;
  constructor(message: string, init: WirepoolErrorInit & { protocolCode: number }) {
    super(ErrorCode.PROTOCOL_VIOLATION, message, init);
    this.protocolCode = init.protocolCode;
  }
}
/**
 * A caller's option or argument is out of its range, of the wrong type, NaN or infinite (308,
 * PROTOCOL.md 22.2): raised at once, by `Pool.start` before any worker is spawned or by the call
 * before anything is sent. The message names the option and its range.
 */
export class InvalidArgumentError extends LocalError {}
/** The worker refused the start: it lacks a method or codec this pool requires (120). */
export class CodecMismatchError extends WirepoolError {}

const LOCAL: Record<number, new (code: number, message: string, init?: WirepoolErrorInit) => WirepoolError> = {
  [ErrorCode.WORKER_EXITED]: WorkerExitedError,
  [ErrorCode.WORKER_HUNG]: WorkerHungError,
  [ErrorCode.STARTUP_TIMEOUT]: StartupTimeoutError,
  [ErrorCode.SPAWN_FAILED]: SpawnFailedError,
  [ErrorCode.POOL_CLOSED]: PoolClosedError,
  [ErrorCode.LEASE_LOST]: LeaseLostError,
  [ErrorCode.DECODE_FAILED]: DecodeFailedError,
  [ErrorCode.CANCELLED]: CancelledError,
  [ErrorCode.DEADLINE_EXCEEDED]: DeadlineExceededError,
  [ErrorCode.CODEC_MISMATCH]: CodecMismatchError,
  [ErrorCode.INVALID_ARGUMENT]: InvalidArgumentError,
};

/** The error of `code`, as the subclass that names it: for outcomes the parent decides itself (see {@link wireError}). */
export function wirepoolError(code: number, message: string, init: WirepoolErrorInit = {}): WirepoolError {
  if (code === ErrorCode.PROTOCOL_VIOLATION) {
    return new ProtocolViolationError(message, { ...init, protocolCode: init.protocolCode ?? 100 });
  }
  const cls = LOCAL[code];
  if (cls !== undefined) return new cls(code, message, init);
  if ((code >= 200 && code < 300) || code >= 1000) return new RequestError(code, message, init);
  return new WirepoolError(code, message, init);
}

/**
 * The error of an ERROR frame a worker sent for request `init.requestId` (PROTOCOL.md section 3):
 * its id decides its fate, never its code. A 2xx code gets its subclass (CancelledError,
 * DeadlineExceededError, else RequestError), 1000 and above a RequestError; any other code
 * (unassigned 0-99 and 400-999, a 1xx, a 3xx) is a plain RequestError carrying it, named by its
 * range or its name, never the local outcome of that name: a wire 300 is no WorkerExitedError
 * (no death, nothing killed, never retried).
 */
export function wireError(code: number, message: string, init: WirepoolErrorInit = {}): RequestError {
  if ((code >= 200 && code < 300) || code >= 1000) return wirepoolError(code, message, init) as RequestError;
  return new RequestError(code, message, init);
}

/** The details of an ERROR frame: JSON text parsed, the text itself if it is not JSON, or undefined. */
export function parseDetails(text: string): unknown {
  if (text.length === 0) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
