/**
 * The parent driver: a pool of worker processes behind the wire protocol (PROTOCOL.md 8, 12.2,
 * 14, 17). Calls, streams with credit granted as the loop reads, batches, leases, cancellation
 * through AbortSignal, deadlines on the wire with the parent's backstop, heartbeats, restarts
 * with backoff and an intensity limit, recycling, drain and close.
 *
 * @example
 * ```ts
 * import { Pool } from "wirepool";
 * const pool = await Pool.start({ command: ["python3", "worker.py"], workers: 4 });
 * try {
 *   const sum = await pool.call("add", { a: 1, b: 2 });            // JSON by default
 *   for await (const row of pool.stream("decls", { n: 1000 })) console.log(row);
 *   const many = await pool.map("add", [{ a: 1, b: 1 }, { a: 2, b: 2 }]);
 *   const ac = new AbortController();
 *   const slow = pool.call("sleep", 60_000, { signal: ac.signal, timeoutMs: 5_000 });
 *   ac.abort(); // slow rejects with CancelledError; the worker gets CANCEL
 * } finally {
 *   await pool.close();
 * }
 * ```
 * @module
 */

import { EventEmitter } from "node:events";
import type { Listener } from "./listener.js";
import type { Codec, CodecName } from "../codecs/index.js";
import { ErrorCode, MethodKind } from "../proto/constants.js";
import { ProtocolError } from "../proto/errors.js";
import type { RowsFrame } from "../proto/frames.js";
import { encodeRequest } from "./encode.js";
import { MapResults, type MapOptions } from "./map.js";
import { WirepoolError, WorkerExitedError, WorkerHungError, wirepoolError } from "./errors.js";
import { callSettings, closeGrace, invalid, methodName, poolSettings, type Settings } from "./options.js";
import { quote } from "./quote.js";
import { tailSuffix, WorkerProcess, type Death, type Route } from "./worker.js";

/** A codec by name (`"raw"`, `"json"`, `"msgpack"`, `"cbor"`) or a {@link Codec} object. */
export type CodecLike = CodecName | Codec;

/**
 * A pool's settings. Every duration is in milliseconds; defaults follow PROTOCOL.md section 17.
 * Each is checked by `Pool.start` before any worker is spawned (ranges in PROTOCOL.md 22.2): a
 * value out of range, of the wrong type, NaN or infinite rejects with InvalidArgumentError (308).
 */
export interface PoolOptions {
  /** The worker program and its arguments, run without a shell. */
  readonly command: readonly string[];
  /**
   * Remote workers (PROTOCOL.md 21): a started {@link Listener} the pool's workers join over
   * TCP + TLS 1.3. Each worker is started as a child with a single-use ticket in
   * `WIREPOOL_TICKET` instead of `WIREPOOL_FD` (the other SDKs' subprocess launcher) and its
   * stdout and stderr are not read; a lost connection is `WORKER_EXITED` with details
   * `{connection: "lost", host, pid}`. The caller closes the listener after the pool.
   */
  readonly remote?: Listener;
  /** The workers' whole environment (default: this process's). `WIREPOOL_FD` is added. */
  readonly env?: NodeJS.ProcessEnv;
  /** The workers' working directory (default: this process's). */
  readonly cwd?: string;
  /** Worker processes kept alive (default: the CPUs this process may use). */
  readonly workers?: number;
  /** Requests in flight per worker (default 64; clamped to the worker's offer, logged once). */
  readonly maxInFlight?: number;
  /** The codec of calls that do not name one (default `"json"`). */
  readonly codec?: CodecLike;
  /** Methods every worker must offer, checked at its HELLO (else CODEC_MISMATCH at start). */
  readonly require?: readonly { readonly method: string; readonly kind: "unary" | "stream"; readonly codec?: CodecLike }[];
  readonly startupTimeoutMs?: number;
  /** PING interval; a worker silent for 3 x this is hung (0: no heartbeat). */
  readonly heartbeatMs?: number;
  /** How long a cancelled request may take to end before its worker is killed. */
  readonly cancelGraceMs?: number;
  /** The parent's deadline backstop above a call's `timeoutMs`. */
  readonly deadlineGraceMs?: number;
  /** How long close() and recycling let requests in flight finish. */
  readonly drainGraceMs?: number;
  /** How long a worker that said GOODBYE (or broke) may take to exit before it is killed. */
  readonly goodbyeGraceMs?: number;
  readonly restartBackoffMs?: number;
  readonly restartBackoffMaxMs?: number;
  /** More unexpected deaths than this within `restartWindowMs` close the pool. */
  readonly maxRestarts?: number;
  readonly restartWindowMs?: number;
  readonly maxFrameSize?: number;
  /** Each stream's credit window in bytes (the unread rows it may hold). */
  readonly initialCredit?: number;
  readonly maxMessageSize?: number;
  readonly stderrTailLines?: number;
  /** Recycle a worker after this many requests. */
  readonly maxRequests?: number | null;
  /** Recycle a worker whose resident memory passes this many bytes (checked every second). */
  readonly maxRssBytes?: number | null;
  /** Recycle a worker idle for this long. */
  readonly maxIdleMs?: number | null;
  /** Receives every line the workers write to stdout and stderr (also the `log` event). */
  readonly logger?: (entry: LogEntry) => void;
  /**
   * Opt-in retries for methods that are safe to run twice (PROTOCOL.md 21.7; Python's
   * `RetryPolicy`, Rust's `RetryPolicy`). Without it (the default) nothing is ever sent again.
   * A `pool.call` or `pool.stream` of one of `methods` (or made with `idempotent: true`) that
   * ends with WorkerExitedError or WorkerHungError, and nothing else, is sent again as a new
   * request (to another worker, or the replacement), up to `attempts` tries in all (default 3,
   * the first included; an integer 1 - 100, else INVALID_ARGUMENT), within what is left of its
   * `timeoutMs`; a stream only while none of its rows has arrived. The caller gets the last try's outcome, its error's details with `attempts`;
   * `metrics().retries` counts the requests sent again. Calls and streams through a lease, and
   * `map`, are never retried.
   */
  readonly retry?: RetryOptions | null;
}

/** The pool's retry policy (see {@link PoolOptions.retry}). */
export interface RetryOptions {
  /** The idempotent methods: their calls may be sent again. */
  readonly methods?: Iterable<string>;
  /** Tries in all, the first included: an integer 1 - 100 (default 3). */
  readonly attempts?: number;
}

/** Options of one call or stream. */
export interface CallOptions {
  /** Aborting it cancels the call: it rejects with CancelledError and the worker gets CANCEL. */
  readonly signal?: AbortSignal;
  /**
   * The call's time budget, 0 to 2,147,483,647 ms (undefined: no deadline): sent on the wire
   * (rounded up to whole microseconds), and enforced here plus `deadlineGraceMs`. 0 has already
   * expired (DeadlineExceededError, nothing sent); negative, NaN, infinite or larger is
   * InvalidArgumentError (PROTOCOL.md 22.3).
   */
  readonly timeoutMs?: number;
  /** The codec of the request and its answer (default: the pool's). */
  readonly codec?: CodecLike;
  /** Progress events the worker sends for this request. */
  readonly onEvent?: (topic: string, data: string) => void;
  /**
   * This call's own mark for the pool's retry policy ({@link PoolOptions.retry}): `true` may
   * send it again when its worker dies although the policy does not list its method (the
   * pool must have a `retry` option), `false` never does. Only `pool.call` and `pool.stream`
   * are retried.
   */
  readonly idempotent?: boolean;
}

/** One line of a worker's output. */
export interface LogEntry {
  readonly workerId: number;
  readonly pid: number;
  readonly stream: "stdout" | "stderr";
  readonly line: string;
}

/** One worker in {@link PoolMetrics}. */
export interface WorkerMetrics {
  readonly workerId: number;
  readonly pid: number;
  readonly state: "starting" | "ready" | "closing" | "dead";
  readonly alive: boolean;
  readonly inFlight: number;
  readonly requests: number;
  readonly leased: boolean;
}

/** A snapshot of the pool's accounting. */
export interface PoolMetrics {
  readonly workers: readonly WorkerMetrics[];
  /** Workers replaced after an unexpected death (crash, hang, violation, failed start). */
  readonly restarts: number;
  /** Workers replaced by recycling (request count, RSS, idle). */
  readonly recycles: number;
  /** Calls waiting for a free worker. */
  readonly queued: number;
  /** Requests sent again under the retry policy (a worker died or hung while serving them). */
  readonly retries: number;
  /** Calls and streams started, and those that ended in an error. */
  readonly calls: number;
  readonly failures: number;
  /** Failures by code name. */
  readonly failuresByCode: Readonly<Record<string, number>>;
}


interface SlotTally {
  requests: number;
  rows: number;
  sentBytes: number;
  receivedBytes: number;
}

/** @internal What an exporter is told as it happens (seconds). */
export interface PoolObserver {
  queueWait(seconds: number): void;
  duration(method: string, seconds: number): void;
}

/** @internal One slot in {@link ExportView}. */
export interface ExportSlot {
  readonly slot: number;
  readonly state: "starting" | "ready" | "leased" | "draining" | "dead";
  readonly pid: number | null;
  readonly inFlight: number;
  readonly requests: number;
  readonly rows: number;
  readonly sentBytes: number;
  readonly receivedBytes: number;
  readonly rssBytes: number | null;
  readonly heartbeatRttS: number | null;
}

/** @internal The pool's numbers as spec/metrics.json names them. */
export interface ExportView {
  readonly closed: boolean;
  readonly size: number;
  readonly alive: number;
  readonly callsSent: number;
  readonly streamsSent: number;
  readonly retries: number;
  readonly errorsByCode: Readonly<Record<string, number>>;
  readonly restartsByCause: Readonly<Record<string, number>>;
  readonly recyclesByReason: Readonly<Record<string, number>>;
  readonly slots: readonly ExportSlot[];
}

/** The contract's restart cause (spec/metrics.json labels.cause) of an unexpected death. */
function deathCause(w: WorkerProcess, death: Death): string {
  if (w.killedFor === "cancel_timeout") return "cancel_timeout";
  if (death.why === "hung") return "hung";
  if (death.why === "protocol" || death.why === "codec_mismatch") return "protocol_violation";
  if (death.why === "spawn_failed" || death.why === "startup_timeout" || !w.everReady) return "start_failed";
  if (death.exitStatus === 0 && death.signal === null) return "left_by_itself";
  return "crashed";
}

/** A retried call's final error, its details with the tries made (when an object or empty, 21.7). */
function withAttempts(e: WirepoolError, attempts: number): WirepoolError {
  if (!(e instanceof WirepoolError)) return e;
  const d = e.details;
  if (d === undefined || d === null) (e as { details: unknown }).details = { attempts };
  else if (typeof d === "object" && !Array.isArray(d)) (e as { details: unknown }).details = { ...(d as object), attempts };
  return e;
}

/** The longest delay a timer holds (larger ones fire at once, with a warning). */
const MAX_TIMER_MS = 0x7fffffff;

/** What every request at the pool shares: where it went, its timers, its one outcome. */
abstract class Pending implements Route {
  worker: WorkerProcess | null = null;
  id = 0;
  /** The caller has its outcome. */
  settled = false;
  private deadline: NodeJS.Timeout | null = null;
  private grace: NodeJS.Timeout | null = null;
  private onAbort: (() => void) | null = null;
  /** It keeps the event loop alive (pool.hold) until it is settled and has ended at its worker. */
  private holding = true;
  readonly started = performance.now();
  /** When it was sent to a worker (0: not sent). */
  sentAt = 0;

  constructor(
    readonly pool: Pool,
    readonly method: string,
    readonly kind: number,
    readonly codec: Codec,
    readonly body: Uint8Array,
    readonly timeoutMs: number,
    readonly lease: Lease | null,
    readonly opts: CallOptions | undefined,
  ) {
    pool.hold();
    const signal = opts?.signal;
    if (signal !== undefined) {
      this.onAbort = () => this.abort();
      signal.addEventListener("abort", this.onAbort, { once: true });
    }
    // timeoutMs is at most a timer's range (22.2); with the grace the backstop stays within it.
    if (timeoutMs > 0) {
      this.deadline = setTimeout(() => {
        this.deadline = null;
        this.stop(wirepoolError(ErrorCode.DEADLINE_EXCEEDED, `no answer within the ${timeoutMs} ms deadline (+ ${pool.settings.deadlineGraceMs} ms grace)`, { requestId: this.id }));
      }, Math.min(timeoutMs + pool.settings.deadlineGraceMs, MAX_TIMER_MS));
    }
  }

  /** The wire budget at dispatch: what is left of the caller's deadline. */
  remainingMs(): number {
    if (this.timeoutMs <= 0) return 0;
    return Math.max(0.001, this.timeoutMs - (performance.now() - this.started)); // at least 1 us (22.3)
  }

  private abort(): void {
    const reason = this.opts?.signal?.reason;
    this.stop(wirepoolError(ErrorCode.CANCELLED, "cancelled by the caller", { requestId: this.id, cause: reason }));
  }

  /**
   * The caller gives up (abort, deadline, a stream closed): it gets `error` now; the worker gets
   * CANCEL and has the cancel grace to end the request before it is killed (12.2).
   */
  stop(error: WirepoolError | null): void {
    if (error !== null) {
      if (this.settled) return;
      this.deliverError(error);
    }
    const w = this.worker;
    if (w !== null && w.inFlight(this.id)) {
      w.cancel(this.id);
      if (this.grace === null) {
        this.grace = setTimeout(() => {
          this.grace = null;
          if (w.inFlight(this.id)) {
            w.killedFor = "cancel_timeout";
            w.kill();
          }
        }, this.pool.settings.cancelGraceMs);
      }
    }
  }

  /** Settles the caller with an error (once). */
  abstract deliverError(error: WirepoolError): void;

  /** The request has ended at the worker (terminal or local): timers and listeners go. */
  protected ended(): void {
    if (this.deadline !== null) clearTimeout(this.deadline);
    if (this.grace !== null) clearTimeout(this.grace);
    this.deadline = this.grace = null;
    if (this.onAbort !== null) this.opts?.signal?.removeEventListener("abort", this.onAbort);
    this.onAbort = null;
    this.letGoWhenDone();
  }

  /** Work no more: the caller has its outcome and the worker has ended the request. */
  private letGoWhenDone(): void {
    if (!this.holding || !this.settled || (this.worker !== null && this.worker.inFlight(this.id))) return;
    this.holding = false;
    this.pool.letGo();
  }

  /** Settles the caller (bookkeeping shared by both kinds). */
  protected settle(error: WirepoolError | null): void {
    this.settled = true;
    this.pool.counted(error);
    if (this.sentAt !== 0) this.pool.finished(this);
    if (this.worker === null || !this.worker.inFlight(this.id)) this.ended();
    else this.letGoWhenDone();
  }

  abstract result(body: Buffer): void;
  abstract rows(frame: RowsFrame): void;
  abstract end(summary: Buffer): void;
  abstract fail(error: WirepoolError): void;

  event(topic: string, data: string): void {
    this.opts?.onEvent?.(topic, data);
  }
}

class UnaryCall<T> extends Pending {
  constructor(
    pool: Pool,
    method: string,
    codec: Codec,
    body: Uint8Array,
    timeoutMs: number,
    lease: Lease | null,
    opts: CallOptions | undefined,
    private readonly resolve: (v: T) => void,
    private readonly reject: (e: WirepoolError) => void,
  ) {
    super(pool, method, MethodKind.UNARY, codec, body, timeoutMs, lease, opts);
  }

  result(body: Buffer): void {
    this.ended();
    if (this.settled) return;
    let value: T;
    try {
      value = this.codec.decode(body) as T;
    } catch (e) {
      this.deliverError(wirepoolError(ErrorCode.DECODE_FAILED, `cannot decode the result with codec ${this.codec.name}: ${(e as Error)?.message ?? e}`, { requestId: this.id, pid: this.worker?.pid, cause: e }));
      return;
    }
    this.settle(null);
    this.resolve(value);
  }

  rows(): void {}
  end(): void {}

  fail(error: WirepoolError): void {
    this.ended();
    if (!this.settled) this.deliverError(error);
  }

  deliverError(error: WirepoolError): void {
    if (this.settled) return;
    this.settle(error);
    this.reject(error);
  }
}

/**
 * The rows of one stream, read with `for await`. Credit goes back to the worker as the loop
 * reads (section 6), so a slow loop slows the worker; leaving the loop (break, throw, return)
 * cancels the stream, and rows still arriving for it are counted as read (14.3). After the
 * loop, `summary` holds the END's summary (undefined when the worker sent none).
 *
 * @example
 * ```ts
 * const rows = pool.stream("decls", { n: 100 });
 * for await (const row of rows) console.log(row);
 * console.log(rows.summary);
 * ```
 */
export class RowStream<T = unknown> extends Pending implements AsyncIterableIterator<T> {
  /** The END's summary, decoded; undefined before the end or when there is none. */
  summary: unknown = undefined;
  /** @internal The retry policy's tries for this stream (null: never sent again). */
  retry: { limit: number; made: number } | null = null;
  private rowsArrived = false;
  private frames: RowsFrame[] = [];
  private head = 0;
  private row = 0;
  private ended_ = false;
  private error: WirepoolError | null = null;
  private errorThrown = false;
  private abandoned = false;
  /** The head frame's rows from `decodedFrom` on, decoded by the codec's decodeRows for the row iterator; then the bad row's error. */
  private decoded: unknown[] | null = null;
  private decodedFrom = 0;
  private decodeError: { e: unknown } | null = null;
  private waiter: { resolve: (r: IteratorResult<unknown>) => void; reject: (e: unknown) => void; batch: boolean } | null = null;

  /** @internal */
  constructor(pool: Pool, method: string, codec: Codec, body: Uint8Array, timeoutMs: number, lease: Lease | null, opts: CallOptions | undefined) {
    super(pool, method, MethodKind.STREAM, codec, body, timeoutMs, lease, opts);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** The next row; done after END; rejects once with the stream's error. */
  next(): Promise<IteratorResult<T>> {
    if (this.head < this.frames.length) return this.take();
    if (this.ended_) return this.terminal();
    return new Promise((resolve, reject) => {
      this.waiter = { resolve: resolve as (r: IteratorResult<unknown>) => void, reject, batch: false };
    });
  }

  /** Leaving the loop early: the stream is cancelled (the worker gets CANCEL). */
  return(): Promise<IteratorResult<T>> {
    this.cancel();
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Stops reading: rows not read yet are dropped (and counted as read), the worker gets CANCEL. */
  cancel(): void {
    if (!this.ended_) this.finishWith(wirepoolError(ErrorCode.CANCELLED, "the stream was cancelled by its reader", { requestId: this.id }), true);
    this.errorThrown = true; // the reader chose to stop: nothing more to report
    this.abandon();
    this.stop(null);
  }

  /** `await using`: cancels the stream unless it has ended (its rows not read are dropped). @internal */
  dispose(): void {
    if (!this.ended_ || this.head < this.frames.length) this.cancel();
  }

  /**
   * The rows a ROWS frame at a time, as arrays: fewer promises for a consumer that handles many
   * rows per turn. Credit goes back as each batch is handed out; leaving the loop cancels the
   * stream, as with the row iterator (the two may be mixed).
   *
   * @example
   * ```ts
   * for await (const batch of pool.stream("decls", { n: 100_000 }).batches()) total += batch.length;
   * ```
   */
  batches(): AsyncIterableIterator<T[]> {
    const it: AsyncIterableIterator<T[]> = {
      [Symbol.asyncIterator]: () => it,
      next: () => {
        if (this.head < this.frames.length) return this.takeBatch();
        if (this.ended_) return this.terminal() as Promise<IteratorResult<T[]>>;
        return new Promise<IteratorResult<T[]>>((resolve, reject) => {
          this.waiter = { resolve: resolve as (r: IteratorResult<unknown>) => void, reject, batch: true };
        });
      },
      return: () => this.return() as Promise<IteratorResult<T[]>>,
    };
    return it;
  }

  /** The head frame is read (its bytes go back as credit: the core grants at half the window). */
  private frameRead(f: RowsFrame): void {
    this.frames[this.head++] = undefined as unknown as RowsFrame;
    this.row = 0;
    this.decoded = null;
    if (this.head > 64 && this.head * 2 > this.frames.length) {
      this.frames = this.frames.slice(this.head);
      this.head = 0;
    }
    this.worker?.consumed(this.id, f.payloadLength);
  }

  private decodeFailed(e: unknown): void {
    const error = wirepoolError(ErrorCode.DECODE_FAILED, `cannot decode a row with codec ${this.codec.name}: ${(e as Error)?.message ?? e}`, { requestId: this.id, pid: this.worker?.pid, cause: e });
    if (this.ended_) {
      // The END came before the reader reached the bad row: the reader still gets DECODE_FAILED
      // (unless it has an error already), and the rows after it are dropped.
      if (this.error === null) {
        this.error = error;
        this.errorThrown = false;
      }
      this.abandon();
      return;
    }
    this.finishWith(error, true);
    this.stop(null);
  }

  private take(): Promise<IteratorResult<T>> {
    const f = this.frames[this.head];
    const codec = this.codec;
    if (codec.decodeRows === undefined) {
      const raw = f.rows[this.row++];
      if (this.row === f.count) this.frameRead(f);
      let value: T;
      try {
        value = codec.decode(raw) as T;
      } catch (e) {
        this.decodeFailed(e);
        return this.terminal();
      }
      return Promise.resolve({ value, done: false });
    }
    // The rest of the head frame is decoded in one pass and handed out a row at a time.
    if (this.decoded === null) {
      this.decoded = [];
      this.decodedFrom = this.row;
      this.decodeError = null;
      try {
        codec.decodeRows(f, this.row, this.decoded);
      } catch (e) {
        this.decodeError = { e };
      }
    }
    const k = this.row - this.decodedFrom;
    const ok = k < this.decoded.length;
    const value = ok ? (this.decoded[k] as T) : undefined;
    const error = this.decodeError;
    if (++this.row === f.count) this.frameRead(f);
    if (ok) return Promise.resolve({ value: value as T, done: false });
    this.decodeFailed(error!.e);
    return this.terminal();
  }

  private takeBatch(): Promise<IteratorResult<T[]>> {
    const f = this.frames[this.head];
    const codec = this.codec;
    let out: T[] = [];
    let k = 0;
    try {
      if (codec.decodeRows !== undefined) {
        // One pass over the frame (the JSON codec reads it as one string); on a bad row `out`
        // holds the rows before it.
        codec.decodeRows(f, this.row, out as unknown[]);
        k = out.length;
      } else {
        // A Buffer per row only for a codec without decodeRows (raw hands them out).
        const rows = f.rows;
        out = new Array(rows.length - this.row);
        for (let i = this.row; i < rows.length; i++, k++) out[k] = codec.decode(rows[i]) as T;
      }
    } catch (e) {
      // The rows before the bad one are delivered; the error comes next.
      const good = codec.decodeRows !== undefined ? out.length : k;
      this.frameRead(f);
      this.decodeFailed(e);
      if (good > 0) return Promise.resolve({ value: out.slice(0, good), done: false });
      return this.terminal() as Promise<IteratorResult<T[]>>;
    }
    this.frameRead(f);
    return Promise.resolve({ value: out, done: false });
  }

  private terminal(): Promise<IteratorResult<T>> {
    if (this.error !== null && !this.errorThrown) {
      this.errorThrown = true;
      return Promise.reject(this.error);
    }
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Rows queued and not read are dropped; their bytes are reported as read. */
  private abandon(): void {
    this.abandoned = true;
    const w = this.worker;
    for (let k = this.head; k < this.frames.length; k++) w?.consumed(this.id, this.frames[k].payloadLength);
    this.frames = [];
    this.head = this.row = 0;
    this.decoded = null;
  }

  /** The stream's outcome for its reader (rows already queued are still read first, unless `now`). */
  private finishWith(error: WirepoolError | null, now: boolean): void {
    if (this.ended_) return;
    this.ended_ = true;
    this.error = error;
    if (now) this.abandon();
    this.settle(error);
    this.wake();
  }

  private wake(): void {
    const w = this.waiter;
    if (w === null) return;
    if (this.head < this.frames.length) {
      this.waiter = null;
      (w.batch ? this.takeBatch() : this.take()).then(w.resolve, w.reject);
    } else if (this.ended_) {
      this.waiter = null;
      this.terminal().then(w.resolve, w.reject);
    }
  }

  // Route: what the worker delivers.

  result(): void {
    this.ended();
  }

  rows(frame: RowsFrame): void {
    this.rowsArrived = true;
    this.pool.rowsReceived(this.worker, frame.count);
    if (this.abandoned || this.ended_) {
      this.worker?.consumed(this.id, frame.payloadLength);
      return;
    }
    this.frames.push(frame);
    this.wake();
  }

  end(summary: Buffer): void {
    this.ended();
    if (this.ended_) return;
    let error: WirepoolError | null = null;
    if (summary.length > 0) {
      try {
        this.summary = this.codec.decode(summary);
      } catch (e) {
        error = wirepoolError(ErrorCode.DECODE_FAILED, `cannot decode the summary with codec ${this.codec.name}: ${(e as Error)?.message ?? e}`, { requestId: this.id, cause: e });
      }
    }
    this.finishWith(error, false);
  }

  fail(error: WirepoolError): void {
    const r = this.retry;
    if (r !== null) {
      // Sent again only while none of its rows has reached the caller (21.7): none arrived.
      if (!this.ended_ && !this.rowsArrived && r.made < r.limit && (error instanceof WorkerExitedError || error instanceof WorkerHungError) && !this.pool.isClosed && (this.timeoutMs <= 0 || this.remainingMs() > 0.001)) {
        r.made++;
        this.worker = null;
        this.id = 0;
        this.pool.resend(this);
        return;
      }
      withAttempts(error, r.made);
    }
    this.ended();
    this.finishWith(error, false);
  }

  deliverError(error: WirepoolError): void {
    this.finishWith(error, true);
  }
}

/**
 * One worker reserved for its holder: every call through the lease goes to that worker (state
 * kept in a worker between calls), and the pool routes nothing else to it until `release()`.
 * Once the worker is gone, calls fail with LeaseLostError, which says how it died.
 */
export class Lease {
  /** @internal */
  lost: Death | null = null;
  /** @internal */
  readonly queue: Pending[] = [];
  private released = false;

  /** @internal */
  constructor(
    private readonly pool: Pool,
    /** @internal */ readonly worker: WorkerProcess,
  ) {}

  /** The leased worker's process id. */
  get pid(): number {
    return this.worker.pid;
  }

  /** A unary call on the leased worker. */
  call<T = unknown>(method: string, request?: unknown, opts?: CallOptions): Promise<T> {
    return this.pool.submitCall<T>(method, request, opts, this);
  }

  /** A stream on the leased worker. */
  stream<T = unknown>(method: string, request?: unknown, opts?: CallOptions): RowStream<T> {
    return this.pool.submitStream<T>(method, request, opts, this);
  }

  /** Gives the worker back to the pool (idempotent). */
  release(): void {
    if (this.released) return;
    this.released = true;
    this.pool.releaseLease(this);
  }

  /** @internal */
  get isReleased(): boolean {
    return this.released;
  }
}

/**
 * A pool of worker processes. Start one with {@link Pool.start}; see the module example.
 * An idle pool does not keep the process alive (its handles are unref()ed; it holds the event
 * loop only while a call or stream is in flight, a lease is awaited, a worker starts or a close
 * runs), so a script that forgets close() still exits, and its workers leave on end of file;
 * {@link Pool.ref} keeps it alive while open.
 * Events: `log` ({@link LogEntry}), `event` (`{pid, id, topic, data}` for every EVENT frame),
 * `exit` (`{workerId, pid, exitStatus, signal, why}`), `start` (`{workerId, pid}`).
 */
export class Pool extends EventEmitter {
  /** @internal */
  readonly settings: Settings;
  private readonly workers: WorkerProcess[] = [];
  private queue: Pending[] = [];
  private queueHead = 0;
  private readonly leaseWaiters: { resolve: (l: Lease) => void; reject: (e: WirepoolError) => void }[] = [];
  private readonly leases = new Set<Lease>();
  private nextWorkerId = 1;
  private closed = false;
  private closing: Promise<void> | null = null;
  private closedBy: WirepoolError | null = null;
  private readonly deaths: number[] = [];
  private consecutiveDeaths = 0;
  private readonly restartTimers = new Set<NodeJS.Timeout>();
  private readonly recycleTimer: NodeJS.Timeout | null = null;
  private clampLogged = false;
  private stats = { restarts: 0, recycles: 0, calls: 0, failures: 0, retries: 0, callsSent: 0, streamsSent: 0 };
  private readonly restartsBy: Record<string, number> = {};
  private readonly recyclesBy: Record<string, number> = {};
  /** Per-slot counters that outlive the worker in the slot (metrics: monotonic across restarts). */
  private readonly slots = new Map<number, SlotTally>();
  /** @internal The exporters' hooks (wirepool/prometheus): queue waits and durations, in seconds. */
  readonly observers = new Set<PoolObserver>();
  private readonly failuresByCode: Record<string, number> = {};
  private readonly logger: ((e: LogEntry) => void) | undefined;
  /**
   * The pool's one hold on the event loop: ref()ed while there is work (see hold), unref()ed when
   * idle. Every other handle (the children, their pipes and sockets, the heartbeat, recycle and
   * kill timers) is unref()ed, so a pool nobody closed does not keep Node running. A restart's
   * backoff timer is the exception: a replacement on its way is work.
   */
  private readonly keepAlive: NodeJS.Timeout;
  /** Requests not done, lease waiters, workers starting, a close under way, ref(). */
  private work = 0;
  private pinned = false;

  private constructor(opts: PoolOptions) {
    super();
    this.settings = poolSettings(opts);
    this.logger = opts.logger;
    this.keepAlive = setInterval(() => {}, MAX_TIMER_MS);
    this.keepAlive.unref();
    if (this.settings.maxRssBytes > 0 || this.settings.maxIdleMs > 0) {
      const every = this.settings.maxIdleMs > 0 ? Math.min(1000, Math.max(10, this.settings.maxIdleMs / 2)) : 1000;
      this.recycleTimer = setInterval(() => this.checkRecycling(), every);
      this.recycleTimer.unref();
    }
  }

  /** @internal Work begins: the event loop stays alive until the matching letGo. */
  hold(): void {
    if (this.work++ === 0) this.keepAlive.ref();
  }

  /** @internal */
  letGo(): void {
    if (--this.work === 0) this.keepAlive.unref();
  }

  /**
   * Keeps the process alive while the pool is open, idle or not (until `unref()` or `close()`),
   * as `ref()` does for a socket or a child process. By default an idle pool does not: Node
   * exits once nothing else is left, and the workers leave with it (end of file).
   */
  ref(): this {
    if (!this.pinned && !this.closed) {
      this.pinned = true;
      this.hold();
    }
    return this;
  }

  /** Undoes `ref()`: the pool holds the process only while it has work (the default). */
  unref(): this {
    if (this.pinned) {
      this.pinned = false;
      this.letGo();
    }
    return this;
  }

  /**
   * Starts `workers` processes and resolves once every one has completed its handshake.
   * @throws InvalidArgumentError (308) for an option out of its range (PROTOCOL.md 22.2), before
   * any worker is spawned; SPAWN_FAILED, STARTUP_TIMEOUT, WORKER_EXITED (with its status),
   * PROTOCOL_VIOLATION or CODEC_MISMATCH when a worker cannot start; the pool is then closed.
   */
  static async start(opts: PoolOptions): Promise<Pool> {
    const pool = new Pool(opts);
    const starts: Promise<void>[] = [];
    for (let k = 0; k < pool.settings.workers; k++) starts.push(pool.spawnWorker(k));
    const outcomes = await Promise.allSettled(starts);
    const failed = outcomes.find((o): o is PromiseRejectedResult => o.status === "rejected");
    if (failed !== undefined) {
      await pool.close({ graceMs: 0 });
      throw failed.reason;
    }
    return pool;
  }

  // ---------------------------------------------------------------------------------------------
  // Calls

  /**
   * Calls `method` with `request` (omitted: `null`) and resolves with its decoded result.
   * @throws WirepoolError: the worker's error (RequestError, code and details), or a local one
   * (CancelledError, DeadlineExceededError, WorkerExitedError, WorkerHungError, ...).
   */
  call<T = unknown>(method: string, request?: unknown, opts?: CallOptions): Promise<T> {
    const limit = this.retryLimit(method, opts);
    if (limit <= 1) return this.submitCall<T>(method, request, opts, null);
    return this.callRetrying<T>(method, request, opts, limit);
  }

  /**
   * A call the retry policy covers (PROTOCOL.md 21.7): sent again, as a new request, while it
   * ends with WORKER_EXITED or WORKER_HUNG (the parent's own outcomes, never a worker's ERROR)
   * and tries and time are left; the dead worker has left the routing by then, so another one
   * (or its replacement) serves it. The caller gets the last try's outcome, with `attempts`.
   */
  private async callRetrying<T>(method: string, request: unknown, opts: CallOptions | undefined, limit: number): Promise<T> {
    let timeoutMs: number | null;
    try {
      timeoutMs = callSettings(opts, this.settings.codec).timeoutMs;
    } catch {
      return this.submitCall<T>(method, request, opts, null); // refused as any call is
    }
    const started = performance.now();
    const left = () => (timeoutMs === null ? Infinity : timeoutMs - (performance.now() - started));
    let last: WirepoolError | null = null;
    for (let made = 1; ; made++) {
      let tryOpts = opts;
      if (made > 1 && timeoutMs !== null) tryOpts = { ...opts, timeoutMs: Math.min(Math.max(left(), 0.001), timeoutMs) };
      let pending: Pending | null = null;
      try {
        return await this.submitCall<T>(method, request, tryOpts, null, (p) => (pending = p));
      } catch (e) {
        let error = e as WirepoolError;
        // No worker took the retry within the deadline: the last try's error is the outcome.
        if (last !== null && error.code === ErrorCode.DEADLINE_EXCEEDED && (pending as Pending | null)?.worker == null) error = last;
        const again = made < limit && (error instanceof WorkerExitedError || error instanceof WorkerHungError) && left() > 0 && !this.closed;
        if (!again) throw withAttempts(error, made);
        last = error;
        this.stats.retries++;
      }
    }
  }

  /** Streams `method`'s rows: `for await (const row of pool.stream(...))`. */
  stream<T = unknown>(method: string, request?: unknown, opts?: CallOptions): RowStream<T> {
    const limit = this.retryLimit(method, opts);
    return this.submitStream<T>(method, request, opts, null, limit);
  }

  /** Tries in all for a pool call or stream of `method` under the retry policy (1: never again). */
  private retryLimit(method: unknown, opts: CallOptions | undefined): number {
    const policy = this.settings.retry;
    const mark = opts?.idempotent;
    if (policy === null || mark === false || (mark !== undefined && typeof mark !== "boolean")) return 1;
    return mark === true || (typeof method === "string" && policy.methods.has(method)) ? policy.attempts : 1;
  }

  /** @internal A retried stream goes back to routing as a new request (counted in retries). */
  resend(p: Pending): void {
    this.stats.retries++;
    this.route(p);
  }

  /**
   * Calls `method` once per request and hands back the results: `await` it for an array (in
   * order; it rejects with the first error), or read them with `for await` as they come. At
   * most `window` calls are in flight (default workers x maxInFlight; the requests to a worker
   * leave in few writes) and at most two windows of requests are taken from `requests` and not
   * read back: a slow reader stalls the map, nothing queues without bound. `ordered: false`
   * yields results as the calls finish; `returnExceptions: true` yields a failed call's
   * {@link WirepoolError} in its place and goes on. A bad option (not a boolean, a window out
   * of range, a bad call option) is InvalidArgumentError (308) at the first read, before
   * anything is sent. See {@link MapResults}.
   *
   * @example
   * ```ts
   * const sums = await pool.map("add", [{ a: 1, b: 1 }, { a: 2, b: 2 }]);
   * for await (const r of pool.map("fetch", urls(), { ordered: false, returnExceptions: true })) {
   *   if (r instanceof WirepoolError) console.error(r.codeName, r.message); else use(r);
   * }
   * ```
   */
  map<T = unknown, R = unknown>(method: string, requests: Iterable<T>, opts: MapOptions & { readonly returnExceptions: true }): MapResults<R | WirepoolError>;
  map<T = unknown, R = unknown>(method: string, requests: Iterable<T>, opts?: MapOptions): MapResults<R>;
  map<T = unknown, R = unknown>(method: string, requests: Iterable<T>, opts?: MapOptions): MapResults<R | WirepoolError> {
    return new MapResults<R | WirepoolError>(this, method, requests, opts, this.settings.workers * this.settings.maxInFlight);
  }

  /**
   * Reserves one worker for the caller until `release()` (see {@link Lease}); waits for a
   * worker not already leased.
   */
  lease(): Promise<Lease> {
    if (this.closed) return Promise.reject(this.closedError());
    const w = this.pickForLease();
    if (w !== null) return Promise.resolve(this.makeLease(w));
    this.hold();
    return new Promise<Lease>((resolve, reject) => this.leaseWaiters.push({ resolve, reject })).finally(() => this.letGo());
  }

  /** The request's codec, budget and body, checked (22.2-22.4). @throws WirepoolError 308, 202. */
  private prepare(method: unknown, request: unknown, opts: CallOptions | undefined): { method: string; codec: Codec; timeoutMs: number | null; body: Uint8Array } {
    const name = methodName(method);
    const { codec, timeoutMs } = callSettings(opts, this.settings.codec);
    if (opts?.idempotent === true && this.settings.retry === null) {
      throw invalid("idempotent", "false or left out when the pool has no retry option (PoolOptions.retry: {methods, attempts})", true);
    }
    return { method: name, codec, timeoutMs, body: encodeRequest(codec, request) };
  }

  /** Why a checked request ends before it is sent, or null: cancelled, or a 0 budget (22.3). */
  private endsAtOnce(opts: CallOptions | undefined, timeoutMs: number | null): WirepoolError | null {
    if (opts?.signal?.aborted) return wirepoolError(ErrorCode.CANCELLED, "cancelled by the caller before it started");
    if (timeoutMs === 0) return wirepoolError(ErrorCode.DEADLINE_EXCEEDED, "a timeout of 0 ms has already expired (nothing was sent)");
    return null;
  }

  /** @internal */
  submitCall<T>(method: string, request: unknown, opts: CallOptions | undefined, lease: Lease | null, track?: (p: Pending) => void): Promise<T> {
    let r: ReturnType<Pool["prepare"]>;
    try {
      r = this.prepare(method, request, opts);
    } catch (e) {
      const err = this.refused(e);
      this.stats.calls++;
      this.counted(err);
      return Promise.reject(err);
    }
    return new Promise<T>((resolve, reject) => {
      const p = new UnaryCall<T>(this, r.method, r.codec, r.body, r.timeoutMs ?? 0, lease, opts, resolve, reject);
      track?.(p);
      this.stats.calls++;
      const early = this.endsAtOnce(opts, r.timeoutMs);
      if (early !== null) p.stop(early);
      else this.route(p);
    });
  }

  /** @internal */
  submitStream<T>(method: string, request: unknown, opts: CallOptions | undefined, lease: Lease | null, retryLimit = 1): RowStream<T> {
    let r: ReturnType<Pool["prepare"]>;
    let refusal: WirepoolError | null = null;
    try {
      r = this.prepare(method, request, opts);
    } catch (e) {
      refusal = this.refused(e);
      r = { method: String(method), codec: this.settings.codec, timeoutMs: null, body: new Uint8Array(0) };
    }
    const s = new RowStream<T>(this, r.method, r.codec, r.body, r.timeoutMs ?? 0, lease, refusal === null ? opts : undefined);
    if (retryLimit > 1 && refusal === null) s.retry = { limit: retryLimit, made: 1 };
    this.stats.calls++;
    const early = refusal ?? this.endsAtOnce(opts, r.timeoutMs);
    if (early !== null) s.stop(early);
    else this.route(s);
    return s;
  }

  /** A refusal before sending as a WirepoolError (prepare throws only those; anything else is typed too). */
  private refused(e: unknown): WirepoolError {
    return e instanceof WirepoolError ? e : wirepoolError(ErrorCode.BAD_REQUEST, `the request was refused: ${String((e as Error)?.message ?? e)}`, { cause: e });
  }

  private route(p: Pending): void {
    if (p.settled) return;
    if (this.closed) {
      p.deliverError(this.closedError());
      return;
    }
    const lease = p.lease;
    if (lease !== null) {
      if (lease.lost !== null || lease.isReleased) {
        p.deliverError(this.leaseLost(lease));
      } else if (lease.worker.available()) {
        this.sendOn(lease.worker, p);
      } else {
        lease.queue.push(p);
      }
      return;
    }
    const w = this.pick();
    if (w !== null) this.sendOn(w, p);
    else this.queue.push(p);
  }

  /** The routable worker with the fewest requests in flight. */
  private pick(): WorkerProcess | null {
    let best: WorkerProcess | null = null;
    for (const w of this.workers) {
      if (w.leasedBy !== null || !w.available()) continue;
      if (best === null || w.inFlightCount < best.inFlightCount) best = w;
    }
    return best;
  }

  private sendOn(w: WorkerProcess, p: Pending): void {
    const m = w.methods.get(p.method);
    if (m === undefined) {
      p.deliverError(wirepoolError(ErrorCode.UNKNOWN_METHOD, `the worker offers no method ${quote(p.method)}`, { pid: w.pid }));
      return;
    }
    if (m.kind !== p.kind) {
      const want = p.kind === MethodKind.STREAM ? "stream" : "unary";
      p.deliverError(wirepoolError(ErrorCode.UNKNOWN_METHOD, `${quote(p.method)} is not a ${want} method (use ${want === "stream" ? "call" : "stream"}())`, { pid: w.pid }));
      return;
    }
    try {
      p.id = w.send(p, m.index, p.codec.id, p.remainingMs(), p.body);
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      p.deliverError(wirepoolError(e.code, `the request cannot be sent: ${e.message}`, { pid: w.pid }));
      return;
    }
    p.worker = w;
    p.sentAt = performance.now();
    if (p.kind === MethodKind.STREAM) this.stats.streamsSent++;
    else this.stats.callsSent++;
    this.slotTally(w.slot).requests++;
    for (const o of this.observers) o.queueWait((p.sentAt - p.started) / 1000);
    const max = this.settings.maxRequests;
    if (max > 0 && w.requests >= max && !w.retiring) this.recycle(w, "requests");
  }

  /** Routes waiting calls to workers with room (after a request ended or a worker started). */
  private pump(): void {
    for (const lease of this.leases) {
      while (lease.queue.length > 0 && lease.worker.available()) this.sendOnOrSkip(lease.worker, lease.queue.shift()!);
    }
    while (this.queueHead < this.queue.length) {
      const p = this.queue[this.queueHead];
      if (p.settled) {
        this.queueHead++;
        continue;
      }
      const w = this.pick();
      if (w === null) break;
      this.queueHead++;
      this.sendOn(w, p);
    }
    if (this.queueHead > 0 && this.queueHead === this.queue.length) {
      this.queue = [];
      this.queueHead = 0;
    } else if (this.queueHead > 1024 && this.queueHead * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.queueHead);
      this.queueHead = 0;
    }
    while (this.leaseWaiters.length > 0) {
      const w = this.pickForLease();
      if (w === null) break;
      this.leaseWaiters.shift()!.resolve(this.makeLease(w));
    }
  }

  private sendOnOrSkip(w: WorkerProcess, p: Pending): void {
    if (!p.settled) this.sendOn(w, p);
  }

  private pickForLease(): WorkerProcess | null {
    let best: WorkerProcess | null = null;
    for (const w of this.workers) {
      if (w.leasedBy !== null || w.state !== "ready" || w.retiring) continue;
      if (best === null || w.inFlightCount < best.inFlightCount) best = w;
    }
    return best;
  }

  private makeLease(w: WorkerProcess): Lease {
    const lease = new Lease(this, w);
    w.leasedBy = lease;
    this.leases.add(lease);
    return lease;
  }

  /** @internal */
  releaseLease(lease: Lease): void {
    this.leases.delete(lease);
    for (const p of lease.queue.splice(0)) p.deliverError(this.leaseLost(lease));
    if (lease.worker.leasedBy === lease) lease.worker.leasedBy = null;
    this.pump();
  }

  private leaseLost(lease: Lease): WirepoolError {
    const d = lease.lost;
    if (d === null) return wirepoolError(ErrorCode.LEASE_LOST, "the lease was released", { pid: lease.pid });
    return wirepoolError(ErrorCode.LEASE_LOST, `the leased worker (pid ${lease.pid}) is gone${tailSuffix(d.stderrTail)}`, { pid: lease.pid, exitStatus: d.exitStatus, signal: d.signal, stderrTail: d.stderrTail });
  }

  /** @internal A sent request has its outcome: its duration for the exporters. */
  finished(p: Pending): void {
    if (this.observers.size === 0) return;
    const s = (performance.now() - p.sentAt) / 1000;
    for (const o of this.observers) o.duration(p.method, s);
  }

  /** @internal Rows received on a stream (per slot). */
  rowsReceived(w: WorkerProcess | null, n: number): void {
    if (w !== null) this.slotTally(w.slot).rows += n;
  }

  private slotTally(slot: number): SlotTally {
    let t = this.slots.get(slot);
    if (t === undefined) {
      t = { requests: 0, rows: 0, sentBytes: 0, receivedBytes: 0 };
      this.slots.set(slot, t);
    }
    return t;
  }

  private countIn(m: Record<string, number>, key: string): void {
    m[key] = (m[key] ?? 0) + 1;
  }

  /**
   * @internal The exporter's view (wirepool/prometheus, spec/metrics.json): per slot, the
   * newest worker in it and the counters kept across its replacements.
   */
  exportView(): ExportView {
    const slots: ExportSlot[] = [];
    for (let slot = 0; slot < this.settings.workers; slot++) {
      let w: WorkerProcess | null = null;
      for (const x of this.workers) if (x.slot === slot && (w === null || x.workerId > w.workerId)) w = x;
      const t = this.slotTally(slot);
      const state: ExportSlot["state"] =
        w === null || w.state === "dead" ? "dead" : w.state === "starting" ? "starting" : w.state === "closing" || w.retiring ? "draining" : w.leasedBy !== null ? "leased" : "ready";
      slots.push({
        slot,
        state,
        pid: w === null || w.state === "dead" ? null : w.isRemote ? w.helloPid : w.pid || null,
        inFlight: w?.inFlightCount ?? 0,
        requests: t.requests,
        rows: t.rows,
        sentBytes: t.sentBytes + (w?.bytesOut ?? 0),
        receivedBytes: t.receivedBytes + (w?.bytesIn ?? 0),
        rssBytes: w !== null && !w.isRemote && w.state !== "dead" ? w.rssBytes() || null : null,
        heartbeatRttS: w?.heartbeatRttMs == null ? null : w.heartbeatRttMs / 1000,
      });
    }
    return {
      closed: this.closed,
      size: this.settings.workers,
      alive: slots.filter((x) => x.state === "ready" || x.state === "leased" || x.state === "draining").length,
      callsSent: this.stats.callsSent,
      streamsSent: this.stats.streamsSent,
      retries: this.stats.retries,
      errorsByCode: { ...this.failuresByCode },
      restartsByCause: { ...this.restartsBy },
      recyclesByReason: { ...this.recyclesBy },
      slots,
    };
  }

  /** @internal */
  counted(error: WirepoolError | null): void {
    if (error === null) return;
    this.stats.failures++;
    this.failuresByCode[error.codeName] = (this.failuresByCode[error.codeName] ?? 0) + 1;
  }

  // ---------------------------------------------------------------------------------------------
  // Workers: spawn, death, restart, recycle

  private spawnWorker(slot: number): Promise<void> {
    const w = new WorkerProcess(this.nextWorkerId++, this.settings, {
      freed: () => this.pump(),
      exited: (wp, death) => this.onExited(wp, death),
      log: (wp, stream, line) => {
        const entry: LogEntry = { workerId: wp.workerId, pid: wp.pid, stream, line };
        this.logger?.(entry);
        this.emit("log", entry);
      },
      event: (wp, id, topic, data) => this.emit("event", { pid: wp.pid, id, topic, data }),
      clamped: (configured, offered) => {
        if (this.clampLogged) return;
        this.clampLogged = true;
        process.emitWarning(`wirepool: max_in_flight ${configured} is above the worker's max_concurrency ${offered}: using ${offered}`, {
          code: "WIREPOOL_MAX_IN_FLIGHT_CLAMPED",
        });
      },
      wantsLines: () => this.logger !== undefined || this.listenerCount("log") > 0,
    });
    w.slot = slot;
    this.workers.push(w);
    this.hold();
    const starting = w.start();
    starting.then(
      () => this.letGo(),
      () => this.letGo(),
    );
    const started = starting.then(() => {
      this.consecutiveDeaths = 0;
      this.emit("start", { workerId: w.workerId, pid: w.pid });
      if (this.closed) w.drain(0);
      this.pump();
    });
    return started;
  }

  private onExited(w: WorkerProcess, death: Death): void {
    const k = this.workers.indexOf(w);
    if (k >= 0) this.workers.splice(k, 1);
    const tally = this.slotTally(w.slot);
    tally.sentBytes += w.bytesOut;
    tally.receivedBytes += w.bytesIn;
    this.emit("exit", { workerId: w.workerId, pid: w.pid, exitStatus: death.exitStatus, signal: death.signal, why: death.why });
    const lease = w.leasedBy as Lease | null;
    if (lease !== null) {
      lease.lost = death;
      this.leases.delete(lease);
      for (const p of lease.queue.splice(0)) p.deliverError(this.leaseLost(lease));
    }
    if (this.closed || w.replaced) {
      this.pump();
      return;
    }
    if (w.retiring) {
      // Recycled (idle, RSS, count) without a replacement yet.
      this.stats.recycles++;
      this.countIn(this.recyclesBy, w.recycleReason ?? "requests");
      this.replace(0, w.slot);
      return;
    }
    // An unexpected death, counted once (12.1 of the standards: the restart limit counts deaths).
    const now = performance.now();
    this.deaths.push(now);
    while (this.deaths.length > 0 && now - this.deaths[0] > this.settings.restartWindowMs) this.deaths.shift();
    if (this.deaths.length > this.settings.maxRestarts) {
      // Worded as the Python and Rust pools word it: "restart intensity exceeded" is what a user
      // (and the soak) looks for in every later call's POOL_CLOSED.
      this.closedBy = wirepoolError(ErrorCode.POOL_CLOSED, `restart intensity exceeded: ${this.deaths.length} worker deaths within ${this.settings.restartWindowMs} ms (max_restarts ${this.settings.maxRestarts}); the pool closed itself; the last ${w.pid ? `(pid ${w.pid}) ` : ""}${death.why}, exit status ${death.exitStatus}, signal ${death.signal}`, {
        exitStatus: death.exitStatus,
        signal: death.signal,
        stderrTail: death.stderrTail,
      });
      void this.close({ graceMs: 0 });
      return;
    }
    this.consecutiveDeaths++;
    const s = this.settings;
    const delay = Math.min(s.restartBackoffMs * 2 ** (this.consecutiveDeaths - 1), s.restartBackoffMaxMs);
    this.stats.restarts++;
    this.countIn(this.restartsBy, deathCause(w, death));
    this.replace(delay, w.slot);
  }

  private replace(delayMs: number, slot: number): void {
    const t = setTimeout(() => {
      this.restartTimers.delete(t);
      if (this.closed) return;
      // A failed start is a death like any other: onExited counts it and schedules the next.
      this.spawnWorker(slot).catch(() => {});
    }, delayMs); // ref()ed: a replacement on its way (then starting) is work
    this.restartTimers.add(t);
  }

  /** Takes `w` out of routing, starts its replacement, and drains it. */
  private recycle(w: WorkerProcess, reason: "requests" | "rss" | "idle"): void {
    if (w.retiring || this.closed) return;
    w.replaced = true;
    w.recycleReason = reason;
    this.stats.recycles++;
    this.countIn(this.recyclesBy, reason);
    w.drain(this.settings.drainGraceMs);
    this.replace(0, w.slot);
  }

  private checkRecycling(): void {
    const s = this.settings;
    const now = performance.now();
    for (const w of [...this.workers]) {
      if (w.state !== "ready" || w.retiring || w.leasedBy !== null) continue;
      if (s.maxIdleMs > 0 && w.inFlightCount === 0 && now - w.idleSince > s.maxIdleMs) this.recycle(w, "idle");
      else if (s.maxRssBytes > 0 && w.rssBytes() > s.maxRssBytes) this.recycle(w, "rss");
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Closing

  private closedError(): WirepoolError {
    const c = this.closedBy;
    if (c !== null) return wirepoolError(ErrorCode.POOL_CLOSED, c.message, { exitStatus: c.exitStatus, signal: c.signal, stderrTail: c.stderrTail });
    return wirepoolError(ErrorCode.POOL_CLOSED, "the pool is closed");
  }

  /**
   * Drains and stops every worker: no new call is accepted (POOL_CLOSED), calls in flight get
   * `graceMs` (default `drainGraceMs`) to finish, then the workers cancel them and leave; a
   * worker that does not is killed. Resolves when every worker process is gone.
   */
  close(opts?: { graceMs?: number }): Promise<void> {
    let grace: number;
    try {
      grace = closeGrace(opts?.graceMs, this.settings.drainGraceMs);
    } catch (e) {
      return Promise.reject(e);
    }
    if (this.closing !== null) {
      if (opts?.graceMs !== undefined) for (const w of this.workers) w.drain(grace);
      return this.closing;
    }
    this.closed = true;
    for (const t of this.restartTimers) clearTimeout(t);
    this.restartTimers.clear();
    if (this.recycleTimer !== null) clearInterval(this.recycleTimer);
    const err = this.closedError();
    for (let k = this.queueHead; k < this.queue.length; k++) this.queue[k].deliverError(err);
    this.queue = [];
    this.queueHead = 0;
    for (const l of this.leases) for (const p of l.queue.splice(0)) p.deliverError(err);
    for (const waiter of this.leaseWaiters.splice(0)) waiter.reject(err);
    const gone: Promise<void>[] = [];
    for (const w of [...this.workers]) {
      w.drain(grace);
      gone.push(w.gone);
    }
    this.hold();
    this.unref();
    this.closing = Promise.all(gone).then(() => {
      this.letGo();
      clearInterval(this.keepAlive);
    });
    return this.closing;
  }

  /** Whether close() was called (or the pool closed itself after too many restarts). */
  get isClosed(): boolean {
    return this.closed;
  }

  /** A snapshot of the pool's workers and counters. */
  metrics(): PoolMetrics {
    return {
      workers: this.workers.map((w) => ({
        workerId: w.workerId,
        pid: w.pid,
        state: w.state,
        alive: w.state === "ready" || w.state === "starting",
        inFlight: w.inFlightCount,
        requests: w.requests,
        leased: w.leasedBy !== null,
      })),
      restarts: this.stats.restarts,
      recycles: this.stats.recycles,
      queued: this.queue.length - this.queueHead,
      retries: this.stats.retries,
      calls: this.stats.calls,
      failures: this.stats.failures,
      failuresByCode: { ...this.failuresByCode },
    };
  }
}

// ---------------------------------------------------------------------------------------------
// Explicit resource management (`await using`): a pool disposed is closed, a lease released, a
// stream cancelled when it has not ended. The methods are defined only where the runtime has
// `Symbol.asyncDispose` (Node 18.18, 20.4 and later; no polyfill is installed): on an older
// Node, `await using` itself cannot run, and close(), release() and cancel() are what it calls.
// The types (TypeScript's `AsyncDisposable`) come from TypeScript's `esnext.disposable` lib or
// from @types/node.

/** `await using pool = await Pool.start(...)`: the pool is closed (`close()`) at the scope's end. */
export interface Pool extends AsyncDisposable {
  [Symbol.asyncDispose](): Promise<void>;
}
/** `await using lease = await pool.lease()`: the lease is released at the scope's end. */
export interface Lease extends AsyncDisposable {
  [Symbol.asyncDispose](): Promise<void>;
}
/** `await using rows = pool.stream(...)`: a stream not ended yet is cancelled at the scope's end. */
export interface RowStream<T = unknown> extends AsyncDisposable {
  [Symbol.asyncDispose](): Promise<void>;
}

const asyncDispose = (Symbol as { readonly asyncDispose?: symbol }).asyncDispose;
if (typeof asyncDispose === "symbol") {
  const define = (proto: object, dispose: (this: never) => Promise<void>) =>
    Object.defineProperty(proto, asyncDispose, { value: dispose, writable: true, configurable: true, enumerable: false });
  define(Pool.prototype, function (this: Pool) {
    return this.close();
  });
  define(Lease.prototype, function (this: Lease) {
    this.release();
    return Promise.resolve();
  });
  define(RowStream.prototype, function (this: RowStream) {
    this.dispose();
    return Promise.resolve();
  });
}
