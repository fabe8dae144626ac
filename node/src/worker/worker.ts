/**
 * The worker driver (PROTOCOL.md sections 1, 6, 8, 12.3): registers handlers, speaks the
 * protocol on the connection its parent gave it, and exits as the spec says.
 * @module
 */

import net from "node:net";
import { performance } from "node:perf_hooks";
import type { Duplex } from "node:stream";
import { codec as codecOf, type Codec, type CodecName, stringifyJson } from "../codecs/index.js";
import { ErrorCode, FrameType, GoodbyeReason, Limits, MethodKind, PROTOCOL_VERSION, WORKER_DEFAULTS } from "../proto/constants.js";
import { Connection, EventType, type ConnectionEvent, type RowsBuilder } from "../proto/connection.js";
import { feedOutput, mustFeed } from "../feed.js";
import { ProtocolError } from "../proto/errors.js";
import { rowsBatchBytes } from "../proto/policies.js";
import type { MethodInfo, RequestFrame } from "../proto/frames.js";
import { type Context, RequestCancelled, WorkerError } from "./context.js";
import { connectToParent, JoinRefused, ParentWatch, type Ticket, TicketError, ticketFromEnv } from "./remote.js";

/** The SDK's name in HELLO. */
export const SDK_NAME = "wirepool-node";
/** The SDK's version in HELLO (the package's). */
export const SDK_VERSION = "0.1.0";

/** A partly filled ROWS batch waits at most this long (section 17's Node row; the flush bound of section 6 is 10 ms). */
const ROWS_FLUSH_INTERVAL_MS = WORKER_DEFAULTS.rowsFlushIntervalMs;
/** Rows are sent in frames of about this many bytes (section 17; capped at initial_credit / 4 so grants keep flowing). */
const ROWS_BATCH_BYTES = WORKER_DEFAULTS.rowsBatchBytes;
/** Text rows are written into their frame this many bytes at a time (one UTF-8 write each). */
const TEXT_CHUNK_BYTES = 8192;
/** Room given to a codec encoding a row into its frame; a larger row comes back as bytes and is copied in. */
const INTO_ROOM = 512;
/** How often the worker checks that its parent is still its parent (Node has no parent-death signal). */
const PARENT_CHECK_MS = 1000;
/**
 * How long the worker waits for its last frames (GOODBYE, a fatal ERROR) without the socket taking
 * any byte before it exits anyway. Progress, not a total: a slow parent still reading a backlog of
 * rows gets every frame; a parent that stopped reading cannot keep the worker alive.
 */
const EXIT_WRITE_STALL_MS = 2000;
/**
 * Bytes the kernel has taken from the socket so far: what libuv was given less what it still
 * queues. It only grows, unlike the bytes not yet sent as `writableLength` plus libuv's queue
 * (a write handed to libuv is counted in both until it ends, so that sum rises when libuv takes
 * the next buffered write). The fields are internal, hence the fallback (`writableLength`
 * falling is progress too).
 */
function sentBytes(s: Duplex): number {
  const handle = (s as unknown as { _handle?: { bytesWritten?: number; writeQueueSize?: number } })._handle;
  if (typeof handle?.bytesWritten === "number" && typeof handle.writeQueueSize === "number") return handle.bytesWritten - handle.writeQueueSize;
  return -s.writableLength;
}

/** setTimeout's largest delay; a longer deadline re-arms (a u64 budget is valid, section 2). */
const MAX_TIMER_MS = 2_147_483_647;

/** A unary handler: the decoded request in, the value to encode out (or a promise of it). */
export type UnaryHandler<Req = any, Res = unknown> = (req: Req, ctx: Context) => Res | PromiseLike<Res>;

/**
 * A stream handler: a generator (sync or async) whose yielded values are the rows and whose
 * `return` value is the summary (none when undefined or null); or any iterable of rows.
 * Partly filled frames leave on a timer, so a generator that holds the event loop between two
 * rows (synchronous work, no `await`) delays them as it delays PONG; an async generator that
 * awaits between rows never does.
 */
export type StreamHandler<Req = any, Row = unknown, Summary = unknown> = (
  req: Req,
  ctx: Context,
) =>
  | AsyncGenerator<Row, Summary, undefined>
  | Generator<Row, Summary, undefined>
  | AsyncIterable<Row>
  | Iterable<Row>
  | PromiseLike<AsyncIterable<Row> | Iterable<Row>>;

/** Options of one method. */
export interface MethodOptions {
  /**
   * The codecs the method accepts, by name or as {@link Codec} objects; the parent picks one
   * per call. Default: `["json", "msgpack", "cbor"]`. Raw bytes (`"raw"`) are opt-in.
   */
  readonly codecs?: readonly (CodecName | Codec)[];
}

/** Options of a {@link Worker}. */
export interface WorkerOptions {
  /** Requests run at once (HELLO's max_concurrency; the parent's max_in_flight is at most this). Default 64. */
  readonly maxConcurrency?: number;
  /** The largest frame payload offered in HELLO; the parent's choice decides below it. Default 16 MiB. */
  readonly maxFrameSize?: number;
}

/** Options of {@link Worker.serve}. */
export interface ServeOptions {
  /**
   * The connection to serve. Default: the socket inherited in `WIREPOOL_FD` (section 1), which
   * is then removed from the environment; without `WIREPOOL_FD`, the parent named by the join
   * ticket in `WIREPOOL_TICKET` (or the file named by `WIREPOOL_TICKET_FILE`), over TCP and
   * TLS 1.3 (section 21: see the README's "Remote workers").
   */
  readonly socket?: Duplex;
  /** Exit the process with the status when done (section 8.4). Default: true with the inherited socket, false with `socket`. */
  readonly exit?: boolean;
  /** Poll `process.ppid` and stop when the parent is gone. Default: true with the inherited socket (a remote worker watches its parent by heartbeats instead). */
  readonly watchParent?: boolean;
}

interface MethodEntry {
  readonly name: string;
  readonly kind: MethodKind;
  readonly codecs: readonly Codec[];
  readonly handler: UnaryHandler | StreamHandler;
}

const DEFAULT_CODECS: readonly CodecName[] = ["json", "msgpack", "cbor"];

/**
 * A wirepool worker: register methods, then `serve()`. Handlers run on Node's event loop,
 * concurrently up to `maxConcurrency`; the driver answers PING between them, so a handler must
 * not block the loop for long (CPU-heavy work belongs in `worker_threads`, or yields now and
 * then). Rows of a stream are batched into ROWS frames and sent as the parent's credit allows:
 * a generator that outruns its consumer simply waits at its `yield`.
 *
 * @example
 * ```ts
 * import { Worker, WorkerError } from "wirepool";
 *
 * const w = new Worker();
 * w.method("add", (req: { a: number; b: number }) => ({ sum: req.a + req.b }));
 * w.method("echo", (body: Buffer) => body, { codecs: ["raw"] });
 * w.stream("count", async function* (req: { n: number }, ctx) {
 *   for (let i = 0; i < req.n && !ctx.cancelled; i++) yield { i };
 *   return { rows: req.n }; // the summary
 * });
 * await w.serve(); // until the parent drains, closes or dies; then the process exits
 * ```
 */
export class Worker {
  private readonly entries: MethodEntry[] = [];
  private readonly names = new Set<string>();
  private readonly maxConcurrency: number;
  private readonly maxFrameSize: number;
  private serving = false;

  constructor(options: WorkerOptions = {}) {
    this.maxConcurrency = options.maxConcurrency ?? WORKER_DEFAULTS.maxConcurrency;
    this.maxFrameSize = options.maxFrameSize ?? WORKER_DEFAULTS.maxFrameSize;
    if (!(Number.isInteger(this.maxConcurrency) && this.maxConcurrency >= 1 && this.maxConcurrency <= 0xffffffff)) {
      throw new RangeError(`maxConcurrency must be an integer >= 1, not ${this.maxConcurrency}`);
    }
    if (!(Number.isInteger(this.maxFrameSize) && this.maxFrameSize >= Limits.minMaxFrameSize && this.maxFrameSize <= Limits.maxMaxFrameSize)) {
      throw new RangeError(`maxFrameSize must be ${Limits.minMaxFrameSize}-${Limits.maxMaxFrameSize}, not ${this.maxFrameSize}`);
    }
  }

  /** Registers a unary method: one request, one result. */
  method<Req = any, Res = unknown>(name: string, handler: UnaryHandler<Req, Res>, options: MethodOptions = {}): this {
    return this.add(name, MethodKind.UNARY, handler as UnaryHandler, options);
  }

  /** Registers a stream method: one request, rows (each yielded value), then a summary. */
  stream<Req = any, Row = unknown, Summary = unknown>(name: string, handler: StreamHandler<Req, Row, Summary>, options: MethodOptions = {}): this {
    return this.add(name, MethodKind.STREAM, handler as StreamHandler, options);
  }

  /** The methods as HELLO will offer them, in registration order. */
  methods(): MethodInfo[] {
    return this.entries.map((e) => ({ name: e.name, kind: e.kind, codecs: e.codecs.map((c) => c.id) }));
  }

  private add(name: string, kind: MethodKind, handler: UnaryHandler | StreamHandler, options: MethodOptions): this {
    if (this.serving) throw new Error("methods must be registered before serve()");
    if (typeof handler !== "function") throw new TypeError(`the handler of ${name} is not a function`);
    const len = Buffer.byteLength(name, "utf8");
    if (len < Limits.methodNameBytes[0] || len > Limits.methodNameBytes[1]) throw new RangeError(`a method name is 1-255 bytes of UTF-8, not ${len}`);
    if (this.names.has(name)) throw new Error(`method ${name} is already registered`);
    if (this.entries.length >= Limits.maxMethods) throw new RangeError(`at most ${Limits.maxMethods} methods`);
    const codecs = (options.codecs ?? DEFAULT_CODECS).map(codecOf);
    const ids = new Set(codecs.map((c) => c.id));
    if (codecs.length < 1 || codecs.length > Limits.maxCodecsPerMethod || ids.size !== codecs.length) {
      throw new RangeError(`method ${name}: 1-${Limits.maxCodecsPerMethod} distinct codecs`);
    }
    this.names.add(name);
    this.entries.push({ name, kind, codecs, handler });
    return this;
  }

  /**
   * Serves the registered methods until the parent drains (DRAIN, then GOODBYE: status 0),
   * closes the connection or dies (status 0), or a protocol error ends it (status 1); then,
   * by default, exits the process with that status without waiting for handlers still running
   * (section 8.4).
   *
   * Started without `WIREPOOL_FD` and with a join ticket (`WIREPOOL_TICKET`, or a file named by
   * `WIREPOOL_TICKET_FILE`; both removed from the environment), the worker connects to its
   * parent over TCP + TLS 1.3, pins the parent's certificate by the ticket's fingerprint, joins
   * (section 21.3), then serves the same way; it pings its parent and exits with status 0 when
   * the parent stops answering (21.5). An unusable ticket, a parent it cannot reach or whose
   * certificate is not the ticket's, or the parent's refusal: status 1, saying why on stderr.
   * @returns the exit status, when `exit` is false.
   * @throws Error when neither `WIREPOOL_FD` nor a ticket is set, or `WIREPOOL_FD` is invalid (the program was not started by a parent).
   */
  async serve(options: ServeOptions = {}): Promise<number> {
    if (this.serving) throw new Error("serve() was already called");
    this.serving = true;
    const inherited = options.socket === undefined;
    const exit = options.exit ?? inherited;
    const conn = new Connection("worker");
    let rt: Runtime | null = null;
    let ticket: Ticket | null = null;
    if (inherited && process.env.WIREPOOL_FD === undefined) {
      try {
        ticket = ticketFromEnv();
      } catch (e) {
        if (!(e instanceof TicketError)) throw e;
        return finishServe(1, `wirepool worker: ${e.message}\n`, exit);
      }
    }
    if (ticket !== null) {
      // A remote worker (section 21): the parent's silence is its only notice of the parent's end.
      const watch = new ParentWatch(
        (nonce) => rt?.ping(nonce),
        (why) => rt?.parentGone(why),
      );
      let socket: Duplex;
      try {
        socket = await connectToParent(ticket, { onConnect: () => watch.connected() });
      } catch (e) {
        watch.close();
        if (!(e instanceof JoinRefused)) throw e;
        return finishServe(1, `wirepool worker: ${e.message}\n`, exit);
      }
      rt = new Runtime(conn, this.entries, socket, this.maxConcurrency, this.maxFrameSize, options.watchParent ?? false, watch);
    } else {
      // The inherited socket reads straight into the core's buffer (no copy per read); a given one emits chunks.
      const socket = options.socket ?? inheritedSocket(conn, (n) => rt!.onRead(n));
      rt = new Runtime(conn, this.entries, socket, this.maxConcurrency, this.maxFrameSize, options.watchParent ?? inherited, null);
    }
    return finishServe(await rt.start(), "", exit);
  }
}

/** The end of `serve()`: the message, then the exit status (of the process when `exit`). */
function finishServe(status: number, message: string, exit: boolean): number {
  if (message !== "") process.stderr.write(message);
  if (exit) {
    process.exitCode = status;
    process.exit(status);
  }
  return status;
}

/** The socket of `WIREPOOL_FD`, removed from the environment so our own children do not see it. */
function inheritedSocket(conn: Connection, onRead: (n: number) => void): net.Socket {
  const raw = process.env.WIREPOOL_FD;
  if (raw === undefined) {
    throw new Error("WIREPOOL_FD is not set (nor WIREPOOL_TICKET or WIREPOOL_TICKET_FILE): this program must be started by a wirepool parent");
  }
  delete process.env.WIREPOOL_FD;
  const fd = Number(raw);
  if (!/^\d+$/.test(raw) || !Number.isSafeInteger(fd)) throw new Error(`WIREPOOL_FD=${JSON.stringify(raw)} is not a file descriptor number`);
  // Node has no fcntl: the descriptor cannot be made close-on-exec here. Node's own
  // child_process spawns pass only the stdio they are given, so children do not inherit it.
  // Node's `onread` reads into the buffer the core offers (the rest of a large frame at once),
  // so a 16 MiB body is not copied from 64 KiB chunks; the callback runs once per read.
  const opts: net.SocketConstructorOpts & { onread: net.OnReadOpts } = {
    fd,
    readable: true,
    writable: true,
    // (the Socket constructor takes `onread` as connect() does; @types/node lists it for connect only)
    onread: {
      buffer: () => conn.readBuffer(READ_MIN),
      callback: (n: number) => {
        onRead(n);
        return true;
      },
    },
  };
  return new net.Socket(opts);
}

/** The least room offered to a socket read (the rest of a frame in progress when larger). */
const READ_MIN = 64 * 1024;
const EMPTY = Buffer.alloc(0);
/** Thrown inside a stream's producer when its request stopped (flag set, ended, or the worker stopping). */
const STOP = Symbol("wirepool.stop");

const REJECT_MESSAGES: Record<number, string> = {
  [ErrorCode.DRAINING]: "the worker is draining",
  [ErrorCode.UNKNOWN_METHOD]: "the method index is not in this worker's HELLO",
  [ErrorCode.CODEC_UNSUPPORTED]: "the method does not accept this codec",
  [ErrorCode.OVERLOADED]: "max_in_flight requests already in flight",
  [ErrorCode.CANCELLED]: "cancelled while the request was being sent",
};

/**
 * Writes the waiting text rows into the stream's frame, up to `batchBytes` of payload.
 * @returns true when all of them went in (false: the frame is full, send it first).
 */
function stageTexts(call: Call, batchBytes: number): boolean {
  const texts = call.texts;
  if (texts.length === 0) return true;
  const k = call.builder!.extendText(texts, 0, batchBytes);
  if (k === texts.length) {
    texts.length = 0;
    call.textBytes = 0;
    return true;
  }
  texts.splice(0, k);
  let n = 0;
  for (const t of texts) n += 4 + t.length;
  call.textBytes = n;
  return false;
}

/** A stream's rows not sent yet: in its frame, or text rows waiting to be written into it. */
function staged(call: Call): number {
  return call.builder!.count + call.texts.length;
}

function isThenable(v: unknown): v is PromiseLike<unknown> {
  return v !== null && (typeof v === "object" || typeof v === "function") && typeof (v as { then?: unknown }).then === "function";
}

function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** One request in flight at this worker (section 12.3), and its handler's {@link Context}. */
class Call implements Context {
  /** The cancellation flag (section 8.3): 0 unset, else CANCELLED or DEADLINE_EXCEEDED; the first cause wins. */
  flag = 0;
  /** The terminal was sent (or the worker stopped): whatever the handler does later is dropped. */
  ended = false;
  deadline: number | null = null;
  deadlineAt = Infinity;
  deadlineTimer: NodeJS.Timeout | null = null;
  /** Stream: the ROWS frame being filled, its flush timer, and the producer waiting for credit. */
  builder: RowsBuilder | null = null;
  /**
   * Text rows (a text codec's) waiting to go into the builder together: one UTF-8 write per
   * frame instead of one per row. `textBytes`: their size with length fields if all ASCII.
   */
  texts: string[] = [];
  textBytes = 0;
  /** A binary codec's encodeInto for RowsBuilder.appendWith, made once; `rowValue` is the row it writes. */
  writeInto: ((buf: Buffer, start: number) => number | Uint8Array) | null = null;
  rowValue: unknown = undefined;
  flushTimer: NodeJS.Timeout | null = null;
  wake: (() => void) | null = null;
  /** Coalesced progress events: the latest data per topic, and when the last batch left. */
  events: Map<string, string> | null = null;
  eventTimer: NodeJS.Timeout | null = null;
  lastEventAt = -Infinity;
  private controller: AbortController | null = null;

  constructor(
    private readonly rt: Runtime,
    readonly id: number,
    readonly method: string,
    readonly codec: Codec,
  ) {}

  get signal(): AbortSignal {
    // Made on first use: most handlers never look, and an AbortController per call is not free.
    if (this.controller === null) {
      this.controller = new AbortController();
      if (this.flag !== 0) this.controller.abort(new RequestCancelled(this.flag));
    }
    return this.controller.signal;
  }

  get cancelled(): boolean {
    return this.flag !== 0;
  }

  remainingMs(): number | null {
    if (this.deadline === null) return null;
    return Math.max(0, this.deadlineAt - performance.now());
  }

  progress(topic: string, data?: unknown): void {
    const n = Buffer.byteLength(topic, "utf8");
    if (n < Limits.eventTopicBytes[0] || n > Limits.eventTopicBytes[1]) throw new TypeError(`an event topic is 1-255 bytes of UTF-8, not ${n}`);
    this.rt.progress(this, topic, data === undefined ? "" : stringifyJson(data));
  }

  /** Sets the flag unless set; aborts the signal and wakes a producer waiting for credit. */
  setFlag(code: number): void {
    if (this.flag !== 0) return;
    this.flag = code;
    this.controller?.abort(new RequestCancelled(code));
    this.wakeUp();
  }

  wakeUp(): void {
    const w = this.wake;
    if (w !== null) {
      this.wake = null;
      w();
    }
  }

  clearTimers(): void {
    if (this.deadlineTimer !== null) clearTimeout(this.deadlineTimer);
    if (this.flushTimer !== null) clearTimeout(this.flushTimer);
    if (this.eventTimer !== null) clearTimeout(this.eventTimer);
    this.deadlineTimer = this.flushTimer = this.eventTimer = null;
  }
}

/** One connection served: the core, the socket, the calls in flight. */
class Runtime {
  private readonly calls = new Map<number, Call>();
  private flushQueued = false;
  private stopped = false;
  private draining = false;
  private drainTimer: NodeJS.Timeout | null = null;
  private parentTimer: NodeJS.Timeout | null = null;
  private batchBytes: number = ROWS_BATCH_BYTES;
  private resolveDone: (status: number) => void = () => {};
  private readonly flushTick = (): void => {
    this.flushQueued = false;
    this.flush();
  };
  /** A large output is being handed to the socket as it drains (see feed). */
  private feeding = false;
  private readonly feedBound = (): void => this.feed();
  private readonly writeBound = (parts: Buffer[]): void => this.write(parts);

  constructor(
    private readonly conn: Connection,
    private readonly methods: readonly MethodEntry[],
    private readonly socket: Duplex,
    private readonly maxConcurrency: number,
    private readonly maxFrameSize: number,
    private readonly watchParent: boolean,
    /** A remote worker's heartbeat watch on its parent (section 21.5); null on a local socket. */
    private readonly watch: ParentWatch | null,
  ) {}

  /** Sends one of the remote watch's PINGs (nothing once the connection is ending). */
  ping(nonce: Uint8Array): void {
    if (this.stopped || this.conn.isGoodbye()) return;
    try {
      this.conn.sendPing(nonce);
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      return; // the connection failed meanwhile
    }
    this.flush();
  }

  /** The remote watch says the parent is gone: close the connection and end as after end of file (21.5). */
  parentGone(why: string): void {
    if (this.stopped) return;
    process.stderr.write(`wirepool worker: the parent is gone: ${why}; exiting\n`);
    this.stop(0);
    this.socket.destroy(); // nothing is owed to a parent that does not answer
  }

  start(): Promise<number> {
    const done = new Promise<number>((resolve) => (this.resolveDone = resolve));
    const s = this.socket;
    s.on("data", (chunk: Buffer) => this.onData(chunk));
    s.on("end", () => this.onEof());
    s.on("close", () => this.stop(0));
    // EPIPE / ECONNRESET: the parent is gone, like end of file.
    s.on("error", () => this.stop(0));
    if (this.watchParent) {
      const parent = process.ppid;
      this.parentTimer = setInterval(() => {
        if (process.ppid !== parent) {
          process.stderr.write("wirepool worker: the parent process is gone\n");
          this.stop(0);
        }
      }, PARENT_CHECK_MS);
      this.parentTimer.unref();
    }
    this.conn.sendHello({
      minVersion: PROTOCOL_VERSION,
      maxVersion: PROTOCOL_VERSION,
      pid: process.pid,
      maxConcurrency: this.maxConcurrency,
      maxFrameSize: this.maxFrameSize,
      sdkName: SDK_NAME,
      sdkVersion: SDK_VERSION,
      methods: this.methods.map((e) => ({ name: e.name, kind: e.kind, codecs: e.codecs.map((c) => c.id) })),
    });
    this.flush();
    return done;
  }

  // -- I/O ------------------------------------------------------------------------------------

  private onData(chunk: Buffer): void {
    if (this.stopped) return;
    this.conn.receive(chunk);
    this.onInput();
  }

  /** `n` bytes were read into the core's read buffer (the inherited socket's `onread`). */
  onRead(n: number): void {
    if (this.stopped) return;
    this.conn.received(n);
    this.onInput();
  }

  private onInput(): void {
    const conn = this.conn;
    try {
      for (let ev = conn.nextEvent(); ev !== null; ev = this.stopped ? null : conn.nextEvent()) this.onEvent(ev);
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      this.fatal(e);
      return;
    }
    // Everything this read caused (PONGs, inline results, REJECT answers) leaves in one write.
    this.flush();
  }

  private onEof(): void {
    if (this.stopped) return;
    try {
      this.conn.endOfInput();
    } catch (e) {
      if (e instanceof ProtocolError) {
        process.stderr.write(`wirepool worker: the connection ended inside a frame (${e.name})\n`);
        this.stop(1);
        return;
      }
      throw e;
    }
    this.stop(0);
  }

  /** Writes what the core has queued: few pieces (the core packs small frames together), one writev. */
  private flush(): void {
    const queued = this.conn.outputLength();
    if (queued === 0) return;
    // Past the handed-ahead bound with what the socket holds already (8.5): fed as it drains.
    if (this.feeding || mustFeed(queued, this.socket)) return this.flushLarge();
    this.flushAll();
  }

  /** Writes everything queued now (also the last frames, when stopping). */
  private flushAll(): void {
    const parts = this.conn.takeOutput();
    const s = this.socket;
    if (s.destroyed || !s.writable) return;
    if (parts.length === 1) {
      s.write(parts[0]);
      return;
    }
    this.write(parts);
  }

  private write(parts: Buffer[]): void {
    if (parts.length === 0) return;
    const s = this.socket;
    s.cork();
    for (const p of parts) s.write(p);
    s.uncork();
  }

  /** A large output (8.5): fed a frame at a time as the socket drains; PONGs go now. */
  private flushLarge(): void {
    const s = this.socket;
    if (s.destroyed || !s.writable) {
      this.conn.takeOutput();
      return;
    }
    if (this.feeding) this.write(this.conn.takeOutput(0));
    else this.feed();
  }

  /** Feeds a large output as the socket drains (feedOutput), the rest on 'drain'. */
  private feed(): void {
    this.feeding = false;
    const s = this.socket;
    if (s.destroyed || !s.writable) {
      this.conn.takeOutput();
      return;
    }
    if (feedOutput(this.conn, s, this.writeBound)) {
      this.feeding = true;
      s.once("drain", this.feedBound);
    }
  }

  /** Writes at the end of this turn: results finished together leave together. */
  private scheduleFlush(): void {
    if (!this.flushQueued) {
      this.flushQueued = true;
      process.nextTick(this.flushTick);
    }
  }

  private fatal(e: ProtocolError): void {
    process.stderr.write(`wirepool worker: protocol error ${e.code} ${e.name}: ${e.message}\n`);
    try {
      this.conn.sendFatal(e);
    } catch {
      // already failed or closed: nothing can be sent
    }
    this.stop(1);
  }

  /** Ends the connection: every flag set, nothing more sent for the requests, the socket closed. */
  private stop(status: number): void {
    if (this.stopped) return;
    this.stopped = true;
    for (const call of this.calls.values()) {
      call.setFlag(ErrorCode.CANCELLED);
      call.ended = true;
      call.clearTimers();
    }
    this.calls.clear();
    if (this.drainTimer !== null) clearTimeout(this.drainTimer);
    if (this.parentTimer !== null) clearInterval(this.parentTimer);
    this.watch?.close();
    // Everything left goes now, a large output's rest included (the socket holds whole frames).
    this.feeding = false;
    this.flushAll();
    const s = this.socket;
    let sent = sentBytes(s);
    const watch = (): void => {
      const now = sentBytes(s);
      if (now > sent) {
        sent = now;
        guard = setTimeout(watch, EXIT_WRITE_STALL_MS);
      } else {
        finish();
      }
    };
    let guard = setTimeout(watch, EXIT_WRITE_STALL_MS);
    const finish = (): void => {
      clearTimeout(guard);
      this.resolveDone(status);
    };
    if (s.destroyed || s.writableFinished) {
      finish();
    } else {
      s.once("close", finish);
      s.once("finish", finish);
      s.end();
    }
  }

  // -- events ---------------------------------------------------------------------------------

  private onEvent(ev: ConnectionEvent): void {
    switch (ev.type) {
      case FrameType.REQUEST:
        this.startCall(ev);
        break;
      case FrameType.CREDIT: {
        const call = this.calls.get(ev.id);
        if (call === undefined) break;
        if (call.wake !== null) call.wakeUp();
        else if (call.builder !== null && staged(call) > 0) this.sendPartial(call);
        break;
      }
      case FrameType.CANCEL:
        this.calls.get(ev.id)?.setFlag(ErrorCode.CANCELLED);
        break;
      case FrameType.PING:
        if (!this.conn.isGoodbye()) this.conn.sendPong(ev.nonce);
        break;
      case FrameType.PONG:
        this.watch?.pong(ev.nonce);
        break;
      case EventType.REJECT:
        this.sendErrorQuietly(ev.id, ev.code, REJECT_MESSAGES[ev.code] ?? ev.name);
        break;
      case FrameType.WELCOME:
        // The core's batch size (14.5): a quarter of the window, 4,096 to max_frame_size - 8.
        this.batchBytes = rowsBatchBytes(ROWS_BATCH_BYTES, ev.initialCredit, ev.maxFrameSize);
        this.watch?.welcome(ev.heartbeatMs);
        break;
      case FrameType.DRAIN:
        this.drain(ev.graceMs);
        break;
      case FrameType.ERROR:
        // id 0: the parent refused the handshake or hit a fatal error.
        process.stderr.write(`wirepool worker: the parent closed the connection: ${ev.code} ${ev.message}\n`);
        this.stop(1);
        break;
      default:
        break; // LATE
    }
  }

  private drain(graceMs: number): void {
    this.draining = true;
    if (graceMs === 0) this.drainExpired();
    else this.drainTimer = setTimeout(() => this.drainExpired(), graceMs);
    this.maybeGoodbye();
  }

  /** The drain's grace is over: what is still in flight ends CANCELLED now, handlers or not (8.4). */
  private drainExpired(): void {
    this.drainTimer = null;
    for (const call of [...this.calls.values()]) {
      call.setFlag(ErrorCode.CANCELLED);
      this.endWithFlag(call);
    }
    this.maybeGoodbye();
  }

  private maybeGoodbye(): void {
    if (!this.draining || this.calls.size > 0 || this.stopped) return;
    try {
      this.conn.sendGoodbye(GoodbyeReason.DRAINED);
    } catch {
      // the connection failed meanwhile: stop anyway
    }
    this.stop(0);
  }

  // -- requests -------------------------------------------------------------------------------

  private startCall(ev: RequestFrame): void {
    const entry = this.methods[ev.method];
    const codec = entry.codecs.find((c) => c.id === ev.codec)!; // the core checked it (CODEC_UNSUPPORTED)
    const call = new Call(this, ev.id, entry.name, codec);
    this.calls.set(call.id, call);
    if (ev.timeoutUs > 0) this.armDeadline(call, ev.timeoutUs / 1000);
    let req: unknown;
    try {
      req = codec.decode(ev.body);
    } catch (e) {
      this.endWithError(call, ErrorCode.BAD_REQUEST, `cannot decode the request body as ${codec.name}: ${messageOf(e)}`);
      return;
    }
    if (entry.kind === MethodKind.UNARY) this.runUnary(call, entry.handler as UnaryHandler, req);
    else void this.runStream(call, entry.handler as StreamHandler, req);
  }

  private armDeadline(call: Call, ms: number): void {
    const now = performance.now();
    call.deadlineAt = now + ms;
    call.deadline = Date.now() + ms;
    const fire = (): void => {
      call.deadlineTimer = null;
      const left = call.deadlineAt - performance.now();
      if (left > 1) {
        call.deadlineTimer = setTimeout(fire, Math.min(left, MAX_TIMER_MS));
        return;
      }
      // Section 8.3: the terminal leaves now, whatever the handler is doing.
      call.setFlag(ErrorCode.DEADLINE_EXCEEDED);
      this.endWithFlag(call);
    };
    call.deadlineTimer = setTimeout(fire, Math.min(ms, MAX_TIMER_MS));
  }

  private runUnary(call: Call, handler: UnaryHandler, req: unknown): void {
    let out: unknown;
    try {
      out = handler(req, call);
    } catch (e) {
      this.endWithThrow(call, e);
      return;
    }
    if (isThenable(out)) {
      out.then(
        (v) => this.endWithValue(call, v),
        (e) => this.endWithThrow(call, e),
      );
    } else {
      this.endWithValue(call, out);
    }
  }

  /**
   * A handler that held the event loop past its deadline kept the timer from firing: the
   * deadline still decides (8.3), so a late outcome ends DEADLINE_EXCEEDED, not with a result.
   */
  private passedDeadline(call: Call): boolean {
    if (call.flag === 0 && call.deadlineAt !== Infinity && performance.now() >= call.deadlineAt) call.setFlag(ErrorCode.DEADLINE_EXCEEDED);
    return call.flag !== 0;
  }

  private endWithValue(call: Call, value: unknown): void {
    if (call.ended) return;
    if (this.passedDeadline(call)) return this.endWithFlag(call);
    let body: Uint8Array;
    try {
      body = call.codec.encode(value);
    } catch (e) {
      return this.endWithError(call, ErrorCode.HANDLER_ERROR, `cannot encode the result as ${call.codec.name}: ${messageOf(e)}`);
    }
    this.beforeTerminal(call);
    try {
      this.conn.sendResult(call.id, body);
    } catch (e) {
      return this.refusedTerminal(call, e);
    }
    this.finish(call);
  }

  private async runStream(call: Call, handler: StreamHandler, req: unknown): Promise<void> {
    let it: Iterator<unknown, unknown> | AsyncIterator<unknown, unknown> | null = null;
    let done = false;
    try {
      let src: unknown = handler(req, call);
      if (isThenable(src) && !isIterable(src)) src = await src;
      it = iteratorOf(src);
      call.builder = this.conn.rows(call.id);
      const codec = call.codec;
      const encodeString = codec.encodeString;
      const encodeInto = codec.encodeInto;
      if (encodeString === undefined && encodeInto !== undefined) call.writeInto = (buf, start) => encodeInto.call(codec, call.rowValue, buf, start);
      let summary: unknown;
      for (;;) {
        let r = it.next();
        if (isThenable(r)) r = await r;
        if (call.ended || call.flag !== 0) throw STOP;
        if (r.done) {
          done = true;
          summary = r.value;
          break;
        }
        const pending =
          encodeString !== undefined ? this.pushRow(call, encodeString(r.value))
          : call.writeInto !== null ? this.pushInto(call, r.value)
          : this.pushRow(call, codec.encode(r.value));
        if (pending !== undefined) await pending;
      }
      // Every row leaves before END (section 6), credit permitting.
      if (staged(call) > 0) await this.sendBatch(call, false, true);
      if (call.ended) return;
      if (this.passedDeadline(call)) return this.endWithFlag(call);
      let body: Uint8Array = EMPTY;
      if (summary !== undefined && summary !== null) {
        try {
          body = call.codec.encode(summary);
        } catch (e) {
          return this.endWithError(call, ErrorCode.HANDLER_ERROR, `cannot encode the summary as ${call.codec.name}: ${messageOf(e)}`);
        }
      }
      this.beforeTerminal(call);
      try {
        this.conn.sendEnd(call.id, body);
      } catch (e) {
        return this.refusedTerminal(call, e);
      }
      this.finish(call);
    } catch (e) {
      this.endWithThrow(call, e);
    } finally {
      if (!done && it !== null && typeof it.return === "function") {
        // Runs the generator's finally blocks; an async one still busy gets it when it yields.
        try {
          const r = it.return(undefined);
          if (isThenable(r)) r.then(undefined, () => {});
        } catch {
          // a generator that throws from its finally: the request has its terminal already
        }
      }
    }
  }

  /**
   * Stages one encoded row for the stream's frame; a full frame is sent (waiting for credit).
   * @returns a promise only when the producer must wait (the common case returns undefined, so
   * a fast generator costs no extra promise per row).
   */
  private pushRow(call: Call, row: Uint8Array | string): Promise<void> | undefined {
    const b = call.builder!;
    if (typeof row === "string") {
      // A row that might not fit a frame goes in alone, so ROW_TOO_LARGE is this row's error now.
      if (8 + 3 * row.length > b.maxPayload) return this.pushLargeText(call, row);
      call.texts.push(row);
      if ((call.textBytes += 4 + row.length) >= TEXT_CHUNK_BYTES) {
        // Into the frame a few KiB at a time: the strings die young, the joined one stays small.
        if (!stageTexts(call, this.batchBytes) || b.payloadLength >= this.batchBytes) return this.sendBatch(call, true, false);
      }
    } else {
      if (!b.append(row)) return this.sendThenAppend(call, row);
      if (b.payloadLength >= this.batchBytes) return this.sendBatch(call, true, false);
    }
    if (call.flushTimer === null && staged(call) === 1) {
      call.flushTimer = setTimeout(() => this.flushTimerFired(call), ROWS_FLUSH_INTERVAL_MS);
    }
    return undefined;
  }

  /** pushRow for a codec that encodes into the frame (encodeInto): no Buffer per row. */
  private pushInto(call: Call, value: unknown): Promise<void> | undefined {
    const b = call.builder!;
    call.rowValue = value;
    const ok = b.appendWith(call.writeInto!, INTO_ROOM);
    call.rowValue = undefined;
    // Not in this frame: encoded now (before any wait, while the value is surely the yielded one) for the next.
    if (!ok) return this.sendThenAppend(call, call.codec.encode(value));
    if (b.payloadLength >= this.batchBytes) return this.sendBatch(call, true, false);
    if (call.flushTimer === null && b.count === 1) {
      call.flushTimer = setTimeout(() => this.flushTimerFired(call), ROWS_FLUSH_INTERVAL_MS);
    }
    return undefined;
  }

  private async sendThenAppend(call: Call, row: Uint8Array): Promise<void> {
    await this.sendBatch(call, false, false);
    // An empty frame takes it (a row too large for any frame threw ROW_TOO_LARGE instead).
    const pending = this.pushRow(call, row);
    if (pending !== undefined) await pending;
  }

  /** A text row of a third of a frame or more: the rows before it leave first, then it is appended as bytes. */
  private async pushLargeText(call: Call, row: string): Promise<void> {
    if (call.texts.length > 0) await this.sendBatch(call, false, true);
    const pending = this.pushRow(call, Buffer.from(row, "utf8"));
    if (pending !== undefined) await pending;
  }

  /**
   * Sends the stream's staged rows once credit allows: one frame, then more while the waiting
   * text rows fill another (`all`: until none is left); then lets the event loop turn when
   * `yieldAfter` (a fast producer must not starve I/O).
   */
  private async sendBatch(call: Call, yieldAfter: boolean, all: boolean): Promise<void> {
    const id = call.id;
    for (;;) {
      while (!this.conn.canSendRows(id)) {
        if (call.ended || call.flag !== 0 || this.stopped) throw STOP;
        await new Promise<void>((resolve) => (call.wake = resolve));
      }
      if (call.ended || call.flag !== 0) throw STOP;
      // A CREDIT handled while this producer was being woken may have sent the frame already.
      if (staged(call) > 0) this.finishBatch(call);
      if (call.texts.length === 0 || (!all && call.textBytes < this.batchBytes)) break;
    }
    if (yieldAfter) {
      await nextTurn();
      if (call.ended || call.flag !== 0) throw STOP;
    }
  }

  /** Writes one frame of the staged rows (the waiting text rows up to the batch size first). */
  private finishBatch(call: Call): void {
    if (call.flushTimer !== null) {
      clearTimeout(call.flushTimer);
      call.flushTimer = null;
    }
    stageTexts(call, this.batchBytes);
    call.builder!.finish();
    this.scheduleFlush();
    // Rows left over for the next frame are under the flush rule too.
    if (call.texts.length > 0) call.flushTimer = setTimeout(() => this.flushTimerFired(call), ROWS_FLUSH_INTERVAL_MS);
  }

  /** The flush rule (section 6): a partly filled frame leaves within the bound when credit allows. */
  private flushTimerFired(call: Call): void {
    call.flushTimer = null;
    if (!call.ended && call.builder !== null && staged(call) > 0) this.sendPartial(call);
  }

  /** Sends a partly filled frame now if the stream has credit (else the CREDIT that comes will). */
  private sendPartial(call: Call): void {
    if (call.wake !== null || call.flag !== 0 || !this.conn.canSendRows(call.id)) return;
    this.finishBatch(call);
  }

  // -- terminals ------------------------------------------------------------------------------

  private endWithThrow(call: Call, e: unknown): void {
    if (call.ended) return;
    if (this.passedDeadline(call) || e === STOP) return this.endWithFlag(call);
    if (e instanceof WorkerError) {
      const details = e.details === undefined ? "" : safeJson(e.details);
      // Codes below 1000 belong to the protocol; an application must not forge them.
      if (Number.isInteger(e.code) && e.code >= 1000 && e.code <= 0xffffffff) return this.endWithError(call, e.code, e.message, details);
      return this.endWithError(call, ErrorCode.HANDLER_ERROR, `WorkerError with reserved code ${e.code}: ${e.message}`, details);
    }
    if (e instanceof ProtocolError && e.code === ErrorCode.ROW_TOO_LARGE) return this.endWithError(call, e.code, e.message);
    const name = e instanceof Error ? e.name : typeof e;
    const stack = e instanceof Error && e.stack !== undefined ? e.stack : undefined;
    this.endWithError(call, ErrorCode.HANDLER_ERROR, `${name}: ${messageOf(e)}`, safeJson({ type: name, stack }));
  }

  private endWithFlag(call: Call): void {
    const code = call.flag === 0 ? ErrorCode.CANCELLED : call.flag;
    this.endWithError(call, code, new RequestCancelled(code).message);
  }

  private endWithError(call: Call, code: number, message: string, details = ""): void {
    if (call.ended) return;
    this.beforeTerminal(call);
    this.sendErrorQuietly(call.id, code, message, details);
    this.finish(call);
  }

  /** The core refused a terminal: a result or summary above max_message_size ends HANDLER_ERROR (8.1). */
  private refusedTerminal(call: Call, e: unknown): void {
    if (!(e instanceof ProtocolError)) throw e;
    const code = e.code === ErrorCode.MESSAGE_TOO_LARGE ? ErrorCode.HANDLER_ERROR : ErrorCode.HANDLER_PANIC;
    this.sendErrorQuietly(call.id, code, e.message);
    this.finish(call);
  }

  private sendErrorQuietly(id: number, code: number, message: string, details = ""): void {
    try {
      this.conn.sendError(id, code, message, details);
    } catch (e) {
      // After GOODBYE or a failure nothing can be sent; the parent ends the request itself.
      if (!(e instanceof ProtocolError)) throw e;
    }
    this.scheduleFlush();
  }

  /** Pending progress events leave before the terminal (none may follow it). */
  private beforeTerminal(call: Call): void {
    if (call.events !== null && call.events.size > 0) this.sendEvents(call);
  }

  private finish(call: Call): void {
    call.ended = true;
    call.clearTimers();
    call.wakeUp();
    this.calls.delete(call.id);
    this.scheduleFlush();
    if (this.draining) this.maybeGoodbye();
  }

  // -- progress events ------------------------------------------------------------------------

  progress(call: Call, topic: string, data: string): void {
    if (call.ended || this.stopped) return;
    (call.events ??= new Map()).set(topic, data);
    if (call.eventTimer !== null) return;
    const wait = call.lastEventAt + WORKER_DEFAULTS.eventIntervalMs - performance.now();
    if (wait <= 0) this.sendEvents(call);
    else
      call.eventTimer = setTimeout(() => {
        call.eventTimer = null;
        if (!call.ended) this.sendEvents(call);
      }, wait);
  }

  private sendEvents(call: Call): void {
    const events = call.events!;
    for (const [topic, data] of events) {
      try {
        this.conn.sendEvent(call.id, topic, data);
      } catch (e) {
        if (!(e instanceof ProtocolError)) throw e;
        // data above max_frame_size: dropped (events are best-effort reports)
      }
    }
    events.clear();
    call.lastEventAt = performance.now();
    this.scheduleFlush();
  }
}

function isIterable(v: unknown): boolean {
  return v !== null && typeof v === "object" && (Symbol.asyncIterator in v || Symbol.iterator in v);
}

function iteratorOf(src: unknown): Iterator<unknown, unknown> | AsyncIterator<unknown, unknown> {
  if (src !== null && typeof src === "object") {
    const a = (src as Partial<AsyncIterable<unknown>>)[Symbol.asyncIterator];
    if (typeof a === "function") return a.call(src);
    const s = (src as Partial<Iterable<unknown>>)[Symbol.iterator];
    if (typeof s === "function") return s.call(src);
  }
  throw new TypeError("a stream handler must return an iterable or async iterable of rows (e.g. be a generator)");
}

function messageOf(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function safeJson(v: unknown): string {
  try {
    return stringifyJson(v);
  } catch {
    return JSON.stringify({ repr: String(v) });
  }
}
