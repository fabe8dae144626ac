/**
 * Error codes as values: their names, classes and fates (PROTOCOL.md section 3), and the typed
 * error every decoder, core and refused send throws.
 * @module
 */

import {
  ERROR_CLASSES,
  ErrorCode,
  type ErrorClass,
  type ErrorFate,
  type ErrorName,
  ShmErrorCode,
} from "./constants.js";

// The shm extension's codes (section 20.6) are named too: a peer on a connection that agreed to
// the lane sends them, and any peer may classify them (by range they are protocol violations).
const NAMES = new Map<number, string>(
  [...Object.entries(ErrorCode), ...Object.entries(ShmErrorCode)].map(([n, c]) => [c, n]),
);

/** Fallback names of unknown codes, by class: a receiver classifies them by range (section 3). */
const CLASS_NAMES: Record<ErrorClass, string> = {
  protocol: "PROTOCOL",
  request: "REQUEST_ERROR",
  local: "LOCAL_ERROR",
  application: "APPLICATION",
  unassigned: "UNKNOWN",
};

function rangeOf(code: number) {
  for (const r of ERROR_CLASSES) if (code >= r.from && code <= r.to) return r;
  return ERROR_CLASSES[ERROR_CLASSES.length - 1];
}

/** The spec's name of `code`; an unknown code gets its class's name (e.g. `APPLICATION`). */
export function errorName(code: number): string {
  return NAMES.get(code) ?? CLASS_NAMES[rangeOf(code).class];
}

/** The class of `code`, by range: protocol, request, local, application or unassigned. */
export function errorClass(code: number): ErrorClass {
  return rangeOf(code).class;
}

/** What `code` does to the connection: `connection_closed` (1xx), `request_ends` or `local_only`. */
export function errorFate(code: number): ErrorFate {
  return rangeOf(code).fate;
}

/**
 * A protocol error with the spec's code and name: a violation found by the decoder or the core
 * (fatal: the connection is closed, section 13), or a send the core refused (nothing was
 * written, the connection lives on, section 14.3).
 *
 * @example
 * ```ts
 * try {
 *   conn.receive(chunk);
 *   for (let ev; (ev = conn.nextEvent()); ) handle(ev);
 * } catch (e) {
 *   if (e instanceof ProtocolError) {
 *     socket.write(Buffer.concat(conn.sendFatal(e)));  // ERROR id 0 with e.code
 *     socket.destroy();
 *   }
 * }
 * ```
 */
export class ProtocolError extends Error {
  /** The numeric code of section 3 (e.g. 102). */
  readonly code: number;
  /** The code's name (e.g. `FRAME_TOO_LARGE`): the same in every SDK; stack traces show it. */
  override readonly name: string;

  /** For 308 INVALID_ARGUMENT from `negotiate` (14.5): the offer field out of range (snake_case, e.g. `initial_credit`). */
  readonly field?: string;

  constructor(code: number, message?: string, field?: string) {
    const name = errorName(code);
    super(message ?? `error ${code}`);
    this.code = code;
    this.name = name;
    if (field !== undefined) this.field = field;
  }

  /** Convenience: a ProtocolError from a code name. */
  static of(name: ErrorName, message?: string): ProtocolError {
    return new ProtocolError(ErrorCode[name], message);
  }

  /** The connection's fate for this code (section 13). */
  get fate(): ErrorFate {
    return errorFate(this.code);
  }
}
