/**
 * The core's policies (PROTOCOL.md 14.5): every number a driver would otherwise compute from the
 * handshake or a stream's state, as pure functions, the same rule in every SDK and pinned by
 * `spec/vectors/policies.json`. A driver calls them and uses their answers; it never re-derives
 * a negotiated limit, a batch size, a grant or a fitted error itself.
 * @module
 */

import { AdaptiveCredit, CallerInput, ErrorCode, Limits, PROTOCOL_VERSION, ProtocolDefaults } from "./constants.js";
import { ProtocolError } from "./errors.js";
import type { WelcomeInit } from "./connection.js";

/** The HELLO fields {@link negotiate} reads (a decoded HELLO frame has them all). */
export interface NegotiateHello {
  readonly minVersion: number;
  readonly maxVersion: number;
  readonly maxConcurrency: number;
  readonly maxFrameSize: number;
}

/** What the parent offers a worker (its settings), for {@link negotiate}. */
export interface Offer {
  readonly maxFrameSize: number;
  readonly initialCredit: number;
  /** 0: no heartbeat (on a local connection only, 21.5). */
  readonly heartbeatMs: number;
  readonly maxInFlight: number;
  readonly maxMessageSize: number;
  readonly workerId: number;
  /** A remote worker (section 21): its heartbeat is never 0. */
  readonly remote: boolean;
}

/** {@link negotiate}'s answer: the WELCOME to send, and whether `maxInFlight` was reduced. */
export interface Negotiated {
  readonly welcome: WelcomeInit;
  /** The offer's `maxInFlight` was above the worker's `max_concurrency` (log it once per pool, 4.2). */
  readonly clamped: boolean;
}

/** The offer's fields in the order 14.5 checks them, each with its range of 22.2 (null: the offer's max_frame_size). */
const OFFER_CHECKS: readonly (readonly [keyof Offer, string, number | null, number])[] = [
  ["maxFrameSize", "max_frame_size", Limits.minMaxFrameSize, Limits.maxMaxFrameSize],
  ["initialCredit", "initial_credit", 1, Limits.maxCredit],
  ["heartbeatMs", "heartbeat_ms", 0, CallerInput.maxTimeoutMs],
  ["maxInFlight", "max_in_flight", 1, CallerInput.maxCount],
  ["maxMessageSize", "max_message_size", null, CallerInput.maxSize],
];

/**
 * The WELCOME for `hello` from the parent's `offer` (14.5, 4.2): `version` the highest common,
 * `maxFrameSize` the smaller of both, `initialCredit` and `maxMessageSize` the offer's,
 * `heartbeatMs` the offer's (0 on a remote connection becomes 1,000, 21.5), `maxInFlight` the
 * smaller of the offer and the worker's `maxConcurrency` (`clamped` when that reduced it).
 * @throws ProtocolError 308 INVALID_ARGUMENT naming the first offer field out of its range
 * (`field`, in snake_case), then 118 VERSION_MISMATCH when the worker's versions exclude 1.
 */
export function negotiate(hello: NegotiateHello, offer: Offer): Negotiated {
  for (const [key, field, lo, hi] of OFFER_CHECKS) {
    const value = offer[key] as unknown;
    const low = lo ?? offer.maxFrameSize;
    if (typeof value !== "number" || !Number.isInteger(value) || value < low || value > hi) {
      throw new ProtocolError(ErrorCode.INVALID_ARGUMENT, `${field} ${String(value)} is outside ${low}-${hi}`, field);
    }
  }
  if (!(hello.minVersion <= PROTOCOL_VERSION && PROTOCOL_VERSION <= hello.maxVersion)) {
    throw new ProtocolError(ErrorCode.VERSION_MISMATCH, `the worker speaks versions ${hello.minVersion}-${hello.maxVersion}, this parent ${PROTOCOL_VERSION}`);
  }
  const heartbeatMs = offer.heartbeatMs === 0 && offer.remote ? ProtocolDefaults.heartbeatMs : offer.heartbeatMs;
  const maxInFlight = Math.min(offer.maxInFlight, hello.maxConcurrency);
  return {
    welcome: {
      version: PROTOCOL_VERSION,
      workerId: offer.workerId,
      maxFrameSize: Math.min(offer.maxFrameSize, hello.maxFrameSize),
      initialCredit: offer.initialCredit,
      heartbeatMs,
      maxInFlight,
      maxMessageSize: offer.maxMessageSize,
    },
    clamped: maxInFlight < offer.maxInFlight,
  };
}

/** The smallest ROWS batch (14.5): frames never shrink to a few rows. */
const MIN_BATCH_BYTES = 4096;
/** Room in a frame for the row count and one row's length field. */
const ROWS_PREFIX_ROOM = 8;

/**
 * The payload size at which a worker sends a ROWS batch (14.5): a quarter of the credit window
 * (so grants keep flowing), at least 4,096 bytes, at most `preferred` (the SDK's
 * `rows_batch_bytes`, 17) and `maxFrameSize` - 8.
 */
export function rowsBatchBytes(preferred: number, initialCredit: number, maxFrameSize: number): number {
  return Math.min(Math.max(MIN_BATCH_BYTES, Math.min(preferred, Math.floor(initialCredit / 4))), maxFrameSize - ROWS_PREFIX_ROOM);
}

/**
 * The credit `consumed` bytes grant now on a stream that may be granted (14.5, 12.4): nothing
 * before half the window is consumed, then all of it, capped so the stream's `credit` (which
 * may be negative) stays at most 2^31 - 1. 0: no grant.
 */
export function grant(initialCredit: number, credit: number, consumed: number): number {
  if (2 * consumed < initialCredit) return 0;
  return Math.max(0, Math.min(consumed, Limits.maxCredit - credit));
}

/**
 * A stream's adaptive window at a grant (PROTOCOL.md 6 and 14.5), the credit the parent keeps
 * outstanding. `drainedUs`: how long its last half window took to drain; `rttUs`: the
 * connection's smallest PING round trip (0: none yet, the window stays); `connectionRoom`: what
 * the connection's cap leaves above the sum of its streams' windows. Drained within 2 round trips
 * (the window limits the stream): doubled, within max(initialCredit, maxStreamWindow),
 * window + connectionRoom and 2^31 - 1; in more than 8: halved, never below initialCredit;
 * otherwise unchanged.
 *
 * @example
 * streamWindow(1 << 20, 1 << 20, 50_000, 100_000, 16 << 20, 63 << 20); // 2 MiB
 */
export function streamWindow(
  window: number,
  initialCredit: number,
  drainedUs: number,
  rttUs: number,
  maxStreamWindow: number,
  connectionRoom: number,
): number {
  if (rttUs === 0) return window;
  if (drainedUs <= AdaptiveCredit.growWithinRtts * rttUs) {
    const top = Math.min(2 * window, Math.max(initialCredit, maxStreamWindow), window + connectionRoom, Limits.maxCredit);
    return Math.max(window, top);
  }
  if (drainedUs > AdaptiveCredit.shrinkAfterRtts * rttUs) return Math.max(Math.floor(window / 2), initialCredit);
  return window;
}

/** ERROR's fixed prefix: code u32, message length u16. */
const ERROR_PREFIX = 6;

const EMPTY = Buffer.alloc(0);

/** Cuts UTF-8 `bytes` to at most `max` bytes at a character boundary. */
function cutUtf8(bytes: Buffer, max: number): Buffer {
  if (bytes.length <= max) return bytes;
  let n = Math.max(max, 0);
  while (n > 0 && (bytes[n] & 0xc0) === 0x80) n--;
  return bytes.subarray(0, n);
}

/**
 * {@link fitError} on bytes: what the core's `sendError` writes (no second encoding).
 * @internal
 */
export function fitErrorBytes(message: string, details: string, maxFrameSize: number): { message: Buffer; details: Buffer } {
  let m = cutUtf8(Buffer.from(message, "utf8"), Limits.errorMessageMaxBytes);
  let d = details.length === 0 ? EMPTY : Buffer.from(details, "utf8");
  const room = maxFrameSize - ERROR_PREFIX;
  if (m.length + d.length > room) {
    // Details larger than half the room become the note of their size (never dropped in silence).
    if (d.length > Math.floor(room / 2)) d = Buffer.from(`{"truncated": true, "details_bytes": ${d.length}}`, "utf8");
    m = cutUtf8(m, room - d.length);
  }
  return { message: m, details: d };
}

/**
 * What `sendError` sends (14.5; ERROR cannot be continued): the message cut to 65,535 bytes;
 * then, if the frame would exceed `maxFrameSize`, details longer than half of
 * `maxFrameSize` - 6 become the note `{"truncated": true, "details_bytes": N}` (shorter ones are
 * kept whole) and the message is cut to the bytes left. Bytes are counted in UTF-8 and every
 * cut is at a character boundary.
 */
export function fitError(message: string, details: string, maxFrameSize: number): { message: string; details: string } {
  const f = fitErrorBytes(message, details, maxFrameSize);
  return {
    message: f.message.length === Buffer.byteLength(message, "utf8") ? message : f.message.toString("utf8"),
    details: f.details.length === Buffer.byteLength(details, "utf8") ? details : f.details.toString("utf8"),
  };
}
