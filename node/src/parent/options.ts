/**
 * The one place where a pool's options and a call's options are checked against PROTOCOL.md
 * 22.2 and resolved into settings: every value out of its range, of the wrong type, NaN or
 * infinite is an {@link InvalidArgumentError} (308) naming the option and its range, raised
 * before any worker is spawned or anything is sent. Nothing is clamped or defaulted in silence.
 * @internal
 * @module
 */

import { Listener } from "./listener.js";
import { availableParallelism } from "node:os";
import { codec as resolveCodec, type Codec } from "../codecs/index.js";
import { CallerInput, ErrorCode, Limits, PARENT_DEFAULTS } from "../proto/constants.js";
import { InvalidArgumentError } from "./errors.js";
import type { CallOptions, CodecLike, PoolOptions } from "./pool.js";
import { describe } from "./quote.js";
import type { RequiredMethod, WorkerSettings } from "./worker.js";

/** A pool's options, resolved: every number checked, every default applied, 0 = none. */
export interface Settings extends WorkerSettings {
  readonly workers: number;
  readonly codec: Codec;
  readonly cancelGraceMs: number;
  readonly deadlineGraceMs: number;
  readonly drainGraceMs: number;
  readonly restartBackoffMs: number;
  readonly restartBackoffMaxMs: number;
  readonly maxRestarts: number;
  readonly restartWindowMs: number;
  readonly maxRequests: number;
  readonly maxRssBytes: number;
  readonly maxIdleMs: number;
  /** The retry policy (PROTOCOL.md 21.7), or null: nothing is ever sent again. */
  readonly retry: RetrySettings | null;
}

/** A pool's retry option, checked. */
export interface RetrySettings {
  readonly methods: ReadonlySet<string>;
  readonly attempts: number;
}

/** The most tries a retried call has in all (PROTOCOL.md 22.2 retry_attempts). */
export const MAX_RETRY_ATTEMPTS = 100;
/** Tries in all when the retry option gives no `attempts` (as Python's and Rust's RetryPolicy). */
export const DEFAULT_RETRY_ATTEMPTS = 3;

/** The `retry` option: none, or `{methods, attempts?}` (attempts 1 - 100, never clamped). */
function retryOption(v: unknown): RetrySettings | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== "object" || Array.isArray(v)) throw invalid("retry", "an object {methods, attempts?}", v);
  const o = v as { methods?: unknown; attempts?: unknown };
  const m = o.methods;
  let methods: Set<string>;
  if (m === undefined) methods = new Set();
  else if (typeof m === "string") throw invalid("retry.methods", "an array of method names, not one string", m);
  else if (m !== null && typeof m === "object" && typeof (m as Iterable<unknown>)[Symbol.iterator] === "function") {
    methods = new Set();
    for (const name of m as Iterable<unknown>) {
      if (typeof name !== "string") throw invalid("retry.methods", "an array of method names (strings)", name);
      methods.add(name);
    }
  } else throw invalid("retry.methods", "an array of method names", m);
  const attempts = int("retry.attempts", given(o.attempts, DEFAULT_RETRY_ATTEMPTS), 1, MAX_RETRY_ATTEMPTS);
  return { methods, attempts };
}

const MAX_MS = CallerInput.maxTimeoutMs;
const MAX_COUNT = CallerInput.maxCount;
const MAX_SIZE = CallerInput.maxSize;
const FRAME_MIN = Limits.minMaxFrameSize;
const FRAME_MAX = Limits.maxMaxFrameSize;
const CREDIT_MAX = Limits.maxCredit;
const CODEC_NAMES = new Set(["raw", "json", "msgpack", "cbor", "arrow"]);

/** The error for option `name`, which must be `range`, given `value`. */
export function invalid(name: string, range: string, value: unknown, cause?: unknown): InvalidArgumentError {
  return new InvalidArgumentError(ErrorCode.INVALID_ARGUMENT, `${name} must be ${range}, not ${describe(value)}`, { details: { option: name }, cause });
}

/** An integer in [min, max]. */
function int(name: string, v: unknown, min: number, max: number): number {
  if (typeof v === "number" && Number.isInteger(v) && v >= min && v <= max) return v;
  throw invalid(name, `an integer from ${min} to ${max}`, v);
}

/** A duration in ms, finite, in [min, max]. */
function ms(name: string, v: unknown, min: number, max = MAX_MS): number {
  if (typeof v === "number" && v >= min && v <= max) return v; // NaN fails both comparisons
  throw invalid(name, `a number of milliseconds from ${min} to ${max}`, v);
}

/** `v`, or `fallback` when the caller left it out. */
function given<T>(v: T | undefined, fallback: T): T {
  return v === undefined ? fallback : v;
}

/** A codec by name or object; the option's name in the error. */
export function codecOption(name: string, v: unknown): Codec {
  if (typeof v === "string" && CODEC_NAMES.has(v)) {
    try {
      return resolveCodec(v as Exclude<CodecLike, Codec>);
    } catch (e) {
      throw invalid(name, "a codec this SDK has (arrow needs the optional package apache-arrow)", v, e);
    }
  }
  if (isCodec(v)) return v;
  throw invalid(name, `a codec name (${[...CODEC_NAMES].join(", ")}) or a Codec object`, v);
}

function isCodec(v: unknown): v is Codec {
  if (v === null || typeof v !== "object") return false;
  const c = v as Partial<Codec>;
  return Number.isInteger(c.id) && c.id! >= 0 && c.id! <= 255 && typeof c.name === "string" && typeof c.encode === "function" && typeof c.decode === "function";
}

function command(v: unknown): readonly string[] {
  if (Array.isArray(v) && v.length > 0 && v.every((a) => typeof a === "string")) return [...v];
  throw invalid("command", "a non-empty array of strings [program, ...args]", v);
}

function required(v: unknown, codec: Codec): RequiredMethod[] {
  if (v === undefined) return [];
  if (!Array.isArray(v)) throw invalid("require", "an array of {method, kind, codec?}", v);
  return v.map((r: unknown, i): RequiredMethod => {
    const o = (r ?? {}) as { method?: unknown; kind?: unknown; codec?: unknown };
    if (typeof o.method !== "string") throw invalid(`require[${i}].method`, "a string", o.method);
    if (o.kind !== "unary" && o.kind !== "stream") throw invalid(`require[${i}].kind`, '"unary" or "stream"', o.kind);
    const c = o.codec === undefined ? codec : codecOption(`require[${i}].codec`, o.codec);
    return { method: o.method, kind: o.kind, codecs: [c.id] };
  });
}

/** `none` (undefined or null) as 0, else an integer in [1, max]. */
function optionalInt(name: string, v: unknown, max: number): number {
  return v === undefined || v === null ? 0 : int(name, v, 1, max);
}

/** The numeric options, checked one by one, then the rules between two of them. */
function numbers(o: PoolOptions) {
  const d = PARENT_DEFAULTS;
  const n = {
    workers: int("workers", given(o.workers, Math.min(availableParallelism(), CallerInput.maxWorkers)), 1, CallerInput.maxWorkers),
    maxInFlight: int("maxInFlight", given(o.maxInFlight, d.maxInFlight), 1, MAX_COUNT),
    startupTimeoutMs: ms("startupTimeoutMs", given(o.startupTimeoutMs, d.startupTimeoutMs), 1),
    heartbeatMs: o.heartbeatMs === 0 ? 0 : ms("heartbeatMs", given(o.heartbeatMs, d.heartbeatMs), 1),
    cancelGraceMs: ms("cancelGraceMs", given(o.cancelGraceMs, d.cancelGraceMs), 0),
    deadlineGraceMs: ms("deadlineGraceMs", given(o.deadlineGraceMs, d.deadlineGraceMs), 0),
    drainGraceMs: ms("drainGraceMs", given(o.drainGraceMs, d.drainGraceMs), 0),
    goodbyeGraceMs: ms("goodbyeGraceMs", given(o.goodbyeGraceMs, d.goodbyeGraceMs), 0),
    restartBackoffMs: ms("restartBackoffMs", given(o.restartBackoffMs, d.restartBackoffMs), 0),
    restartBackoffMaxMs: ms("restartBackoffMaxMs", given(o.restartBackoffMaxMs, d.restartBackoffMaxMs), 0),
    maxRestarts: int("maxRestarts", given(o.maxRestarts, d.maxRestarts), 0, MAX_COUNT),
    restartWindowMs: ms("restartWindowMs", given(o.restartWindowMs, d.restartWindowMs), 1),
    maxFrameSize: int("maxFrameSize", given(o.maxFrameSize, d.maxFrameSize), FRAME_MIN, FRAME_MAX),
    initialCredit: int("initialCredit", given(o.initialCredit, d.initialCredit), 1, CREDIT_MAX),
    stderrTailLines: int("stderrTailLines", given(o.stderrTailLines, d.stderrTailLines), 0, MAX_COUNT),
    maxRequests: optionalInt("maxRequests", o.maxRequests, MAX_SIZE),
    maxRssBytes: optionalInt("maxRssBytes", o.maxRssBytes, MAX_SIZE),
    maxIdleMs: o.maxIdleMs === undefined || o.maxIdleMs === null ? 0 : ms("maxIdleMs", o.maxIdleMs, 1),
  };
  const maxMessageSize = int("maxMessageSize", given(o.maxMessageSize, d.maxMessageSize), n.maxFrameSize, MAX_SIZE);
  if (n.restartBackoffMs > n.restartBackoffMaxMs) {
    throw invalid("restartBackoffMs", `at most restartBackoffMaxMs (${n.restartBackoffMaxMs})`, n.restartBackoffMs);
  }
  return { ...n, maxMessageSize };
}

/**
 * A pool's settings from its options (defaults of PROTOCOL.md 17).
 * @throws InvalidArgumentError for the first option out of its range (22.2).
 */
export function poolSettings(o: PoolOptions): Settings {
  if (o === null || typeof o !== "object") throw invalid("Pool.start's options", "an object", o);
  const codec = codecOption("codec", given<unknown>(o.codec, "json"));
  if (o.logger !== undefined && typeof o.logger !== "function") throw invalid("logger", "a function", o.logger);
  if (o.cwd !== undefined && typeof o.cwd !== "string") throw invalid("cwd", "a string", o.cwd);
  if (o.env !== undefined && (o.env === null || typeof o.env !== "object")) throw invalid("env", "an object", o.env);
  if (o.remote !== undefined && !(o.remote instanceof Listener)) throw invalid("remote", "a Listener (Listener.start())", o.remote);
  return {
    remote: o.remote ?? null,
    command: command(o.command),
    env: o.env ?? process.env,
    cwd: o.cwd,
    codec,
    require: required(o.require, codec),
    ...numbers(o),
    retry: retryOption(o.retry),
  };
}

/** What a call's options resolve to: its codec and its budget (null: no deadline). */
export interface CallSettings {
  readonly codec: Codec;
  readonly timeoutMs: number | null;
}

/**
 * A call's codec and timeout (22.3): none, or 0 (already expired) to `max_timeout_ms`.
 * @throws InvalidArgumentError for a timeout or codec out of range, or options not an object.
 */
export function callSettings(opts: CallOptions | undefined, poolCodec: Codec): CallSettings {
  if (opts === undefined || opts === null) return { codec: poolCodec, timeoutMs: null };
  if (typeof opts !== "object") throw invalid("call options", "an object", opts);
  const t = opts.timeoutMs;
  const timeoutMs = t === undefined || t === null ? null : ms("timeoutMs", t, 0);
  const codec = opts.codec === undefined ? poolCodec : codecOption("codec", opts.codec);
  if (opts.signal !== undefined && !(opts.signal instanceof AbortSignal)) throw invalid("signal", "an AbortSignal", opts.signal);
  if (opts.onEvent !== undefined && typeof opts.onEvent !== "function") throw invalid("onEvent", "a function", opts.onEvent);
  if (opts.idempotent !== undefined && typeof opts.idempotent !== "boolean") throw invalid("idempotent", "true or false", opts.idempotent);
  return { codec, timeoutMs };
}

/** A method name: a string (an unknown one is UNKNOWN_METHOD later, 22.4). */
export function methodName(v: unknown): string {
  if (typeof v === "string") return v;
  throw invalid("method", "a string", v);
}

/** `close`'s grace, when given. */
export function closeGrace(v: unknown, fallback: number): number {
  return v === undefined ? fallback : ms("graceMs", v, 0);
}
