/**
 * One worker process as its parent sees it: the spawn, the socket and the sans-IO core, the
 * handshake, batched writes, both liveness clocks (PROTOCOL.md 8.5), the goodbye grace, stdout
 * and stderr read continuously, and the one place where a worker's death ends its requests.
 * The pool (pool.ts) decides routing, restarts and recycling.
 * @internal
 * @module
 */

import { spawn, type ChildProcess } from "node:child_process";
import { constants as osConstants } from "node:os";
import { readFileSync, readSync } from "node:fs";
import type { Socket } from "node:net";
import { Connection, EventType, type ConnectionEvent } from "../proto/connection.js";
import { ErrorCode, FrameType, MethodKind, Remote } from "../proto/constants.js";
import { errorName, ProtocolError } from "../proto/errors.js";
import type { HelloFrame, RowsFrame } from "../proto/frames.js";
import { Liveness } from "../proto/liveness.js";
import { negotiate } from "../proto/policies.js";
import { feedOutput, mustFeed } from "../feed.js";
import { parseDetails, wireError, wirepoolError, type WirepoolError } from "./errors.js";
import { cut, quote } from "./quote.js";
import type { Joined, Listener } from "./listener.js";

/** A method the pool requires every worker to offer (checked at HELLO: CODEC_MISMATCH). */
export interface RequiredMethod {
  readonly method: string;
  readonly kind: "unary" | "stream";
  /** Codec ids the method must accept. */
  readonly codecs: readonly number[];
}

/** What a worker process is started with (the pool's settings, resolved). */
export interface WorkerSettings {
  readonly command: readonly string[];
  readonly env: NodeJS.ProcessEnv;
  readonly cwd: string | undefined;
  readonly startupTimeoutMs: number;
  readonly heartbeatMs: number;
  readonly maxInFlight: number;
  readonly maxFrameSize: number;
  readonly initialCredit: number;
  readonly maxMessageSize: number;
  readonly goodbyeGraceMs: number;
  readonly stderrTailLines: number;
  readonly require: readonly RequiredMethod[];
  /** Remote workers: the listener they join with a single-use ticket each (null: local, WIREPOOL_FD). */
  readonly remote?: Listener | null;
}

/** The hooks a request in flight gives its worker: each is called at most once per terminal. */
export interface Route {
  /** RESULT (unary) arrived. */
  result(body: Buffer): void;
  /** ROWS arrived (streams). */
  rows(frame: RowsFrame): void;
  /** END arrived (streams). */
  end(summary: Buffer): void;
  /** The request ended in an error: the worker's ERROR, or a local one (death, hang, violation). */
  fail(error: WirepoolError): void;
  /** An EVENT for this request. */
  event?(topic: string, data: string): void;
}

/** How a worker's life ended, for WORKER_EXITED and LEASE_LOST. */
export interface Death {
  readonly exitStatus: number | null;
  readonly signal: number | null;
  readonly stderrTail: string;
  /** What the parent saw first: "exited", "hung", "protocol", "startup_timeout", ... */
  readonly why: string;
}

/** What a worker reports to its pool. */
export interface WorkerHooks {
  /** A request ended (a slot is free): the pool can route more. */
  freed(w: WorkerProcess): void;
  /** The process is gone and every request on it has ended. */
  exited(w: WorkerProcess, death: Death): void;
  /** A line of the worker's stdout or stderr (only when someone listens). */
  log?(w: WorkerProcess, stream: "stdout" | "stderr", line: string): void;
  /** An EVENT with id 0 (a connection-level notification). */
  event?(w: WorkerProcess, id: number, topic: string, data: string): void;
  /** max_in_flight was clamped to the worker's offer (logged once per pool). */
  clamped?(configured: number, offered: number): void;
  /** Whether the pool wants every log line (so the worker splits its output into lines). */
  wantsLines(): boolean;
}

export type WorkerState = "starting" | "ready" | "closing" | "dead";

const SIGNALS: Record<string, number> = osConstants.signals as Record<string, number>;
const TAIL_LINE_MAX = 4096;
const EXIT_OUTPUT_WAIT_MS = 200;
/** The most of the stderr tail an error's message quotes (its `stderrTail` has the whole tail). */
const MESSAGE_TAIL_MAX = 4096;

/**
 * A stderr tail as the end of an error's message, as the Python pool words it ("; stderr
 * tail:\n..."; nothing when the worker wrote none), cut to its last 4,096 characters: for
 * WORKER_EXITED, STARTUP_TIMEOUT, WORKER_HUNG and LEASE_LOST alike.
 */
export function tailSuffix(tail: string): string {
  if (tail.length === 0) return "";
  return `; stderr tail:\n${tail.length > MESSAGE_TAIL_MAX ? "..." + tail.slice(-MESSAGE_TAIL_MAX) : tail}`;
}

/** A worker process and its connection. */
export class WorkerProcess {
  /** The core; replaced by an idle one once the connection is over, so a failed core's buffers
   * (up to max_message_size of a refused message) are not kept alive by this object. */
  conn = new Connection("parent");
  state: WorkerState = "starting";
  /** Set for a worker taken out of routing (recycling, drain, lease end). */
  retiring = false;
  /** The lease holding it, if any (opaque to the worker). */
  leasedBy: object | null = null;
  /** Requests routed to it (recycling by count). */
  requests = 0;
  /** When it last had nothing in flight (ms, performance.now()); for idle recycling. */
  idleSince = performance.now();
  /** Method name -> index in HELLO, and its kind. */
  readonly methods = new Map<string, { index: number; kind: number; codecs: readonly number[] }>();
  pid = 0;
  /** A remote worker's peer address as the listener saw it (null: a local worker). */
  host: string | null = null;
  /** The pid the worker's HELLO gave (a remote worker's, on its own machine). */
  helloPid: number | null = null;
  death: Death | null = null;
  /** A replacement was already started for it (recycling): its exit needs none. */
  replaced = false;
  /** Resolves once the process is gone and every request on it has ended. */
  readonly gone: Promise<void>;
  private markGone!: () => void;

  private child: ChildProcess | null = null;
  private socket: Socket | null = null;
  private readonly routes = new Map<number, Route>();
  private flushScheduled = false;
  private readonly flushBound = () => this.flush();
  /** A large output is being handed to the socket as it drains (see feed). */
  private feeding = false;
  private readonly feedBound = () => this.feed();
  private startResolve: (() => void) | null = null;
  private startReject: ((e: WirepoolError) => void) | null = null;
  private startTimer: NodeJS.Timeout | null = null;
  private heartbeat: NodeJS.Timeout | null = null;
  private killTimer: NodeJS.Timeout | null = null;
  private killAt = 0;
  private exitWait: NodeJS.Timeout | null = null;
  /** The liveness judge (8.5, the core's): both clocks and the starvation guard; null: no heartbeat. */
  private judge: Liveness | null = null;
  /** Bytes read from the worker so far (the judge's frame clock reads it; the metrics too). */
  bytesIn = 0;
  /** Bytes written to the worker's connection so far (metrics). */
  bytesOut = 0;
  /** The pool's slot this worker fills (0 to size-1; a replacement takes the same). */
  slot = 0;
  /** It finished its handshake once (a death before is a failed start, for the metrics). */
  everReady = false;
  /** A remote worker (its pid is the HELLO's, on its own machine; its RSS unknown here). */
  get isRemote(): boolean {
    return this.remote !== null;
  }
  /** Why the pool recycled it (metrics). */
  recycleReason: "requests" | "rss" | "idle" | null = null;
  /** Set by the pool before a kill it decides (the cancel grace ran out): the death's cause. */
  killedFor: string | null = null;
  /** The round trip of the last answered PING in ms (null: none answered yet). */
  heartbeatRttMs: number | null = null;
  /** PINGs sent and not answered yet: nonce -> when (at most a few: 3 periods is a hang). */
  private readonly pings = new Map<string, number>();
  /** A local error decided before the exit (hung, protocol violation): what requests get. */
  private brokenBy: WirepoolError | null = null;
  private why = "exited";
  private exitStatus: number | null = null;
  private exitSignal: number | null = null;
  private exited = false;
  /** A remote worker's child process has exited (the subprocess launcher's). */
  private childGone = false;
  private outputsOpen = 0;
  /** The connection's end of file (or read error) has been seen: every byte of it was fed. */
  private socketEnded = false;
  /** A write failed (the worker closed its end): nothing more is written, the rest is read. */
  private writeFailed = false;
  private readonly tail: string[] = [];
  private partial: Record<"stdout" | "stderr", string> = { stdout: "", stderr: "" };
  private readonly resultIds: number[] = [];
  private readonly resultBodies: Buffer[] = [];

  private readonly settings: WorkerSettings;
  /** The listener of a remote worker (null: local). */
  private readonly remote: Listener | null;

  constructor(
    readonly workerId: number,
    settings: WorkerSettings,
    private readonly hooks: WorkerHooks,
  ) {
    this.remote = settings.remote ?? null;
    // A remote connection's heartbeat is never 0 (21.5).
    this.settings = this.remote !== null && settings.heartbeatMs === 0 ? { ...settings, heartbeatMs: Remote.remoteHeartbeatMs } : settings;
    this.gone = new Promise<void>((resolve) => {
      this.markGone = resolve;
    });
  }

  /** Spawns the process and resolves once the handshake is done (the worker can serve). */
  start(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.startResolve = resolve;
      this.startReject = reject;
      const s = this.settings;
      const [program, ...args] = s.command;
      let child: ChildProcess;
      const remote = this.remote;
      try {
        if (remote !== null) {
          // The subprocess launcher (21.8): a child that joins over TCP + TLS with a ticket of its own.
          const ticket = remote.issue({ singleUse: true, ttlS: Math.ceil(s.startupTimeoutMs / 1000) + 60 });
          const env: NodeJS.ProcessEnv = { ...s.env, WIREPOOL_TICKET: ticket.encode() };
          delete env.WIREPOOL_FD;
          delete env.WIREPOOL_TICKET_FILE;
          child = spawn(program, args, { stdio: "ignore", env, cwd: s.cwd, detached: true });
          remote.accept({ ticket, timeoutMs: s.startupTimeoutMs }).then(
            (j) => this.attachRemote(j),
            () => {}, // the start timer reports it (STARTUP_TIMEOUT)
          );
        } else {
          // A socketpair on fd 3: libuv creates 'pipe' stdio with socketpair(AF_UNIX, SOCK_STREAM)
          // on Unix, keeps its end close-on-exec and closes the child's end after the spawn.
          child = spawn(program, args, {
            stdio: ["ignore", "pipe", "pipe", "pipe"],
            env: { ...s.env, WIREPOOL_FD: "3" },
            cwd: s.cwd,
          });
        }
      } catch (e) {
        this.spawnFailed(e);
        return;
      }
      this.child = child;
      child.once("error", (e) => {
        if (child.pid === undefined) this.spawnFailed(e);
      });
      if (child.pid === undefined) return; // 'error' follows (ENOENT, EACCES)
      this.pid = child.pid;
      child.once("exit", (code, signal) => {
        // A remote worker's end is its connection's (21.6); before it joined, its exit is.
        if (remote !== null) {
          this.childGone = true;
          if (this.socket !== null) return;
        }
        this.onExit(code, signal);
      });
      child.unref();
      if (remote !== null) {
        this.child = child;
        this.armStartTimer();
        return;
      }
      this.watchOutput(child.stdout!, "stdout");
      this.watchOutput(child.stderr!, "stderr");
      const sock = child.stdio[3] as Socket;
      this.socket = sock;
      // Nothing of a worker keeps the event loop alive: the pool holds it while there is work.
      child.unref();
      (child.stdout as Socket).unref();
      (child.stderr as Socket).unref();
      this.keepReadingAfterWriteError(sock);
      this.wireSocket(sock);
      this.armStartTimer();
    });
  }

  /** The connection's handlers: the local socketpair's or a remote worker's TLS socket. */
  private wireSocket(sock: Socket): void {
    sock.unref();
    // The connection counts as an output: requests end only once every byte the worker sent
    // before it left has been read and fed to the core (8.4: GOODBYE and the frames before it).
    this.outputsOpen++;
    sock.on("data", (chunk: Buffer) => this.onData(chunk));
    sock.on("end", () => this.onEof());
    sock.on("error", () => this.onEof());
    if (this.remote !== null) sock.on("close", () => this.onEof());
  }

  /** A remote worker joined (21.3): its connection from the bytes after the JOIN block on. */
  private attachRemote(j: Joined): void {
    if (this.state !== "starting" || this.socket !== null || this.childGone) {
      j.socket.destroy();
      return;
    }
    this.socket = j.socket;
    this.host = j.peer;
    this.wireSocket(j.socket);
    if (j.head.length > 0) this.onData(j.head);
    j.socket.resume();
  }

  private armStartTimer(): void {
    const s = this.settings;
    {
      this.startTimer = setTimeout(() => {
        this.startTimer = null;
        if (this.state !== "starting") return;
        this.breakWith(
          wirepoolError(ErrorCode.STARTUP_TIMEOUT, `no HELLO from the worker (pid ${this.pid}) within ${s.startupTimeoutMs} ms${this.tailSuffix()}`, { pid: this.pid, stderrTail: this.stderrTail() }),
          "startup_timeout",
          true,
        );
      }, s.startupTimeoutMs);
      this.startTimer.unref();
    }
  }

  /**
   * A write fails (EPIPE) once the worker has closed its end, and Node's socket then destroys
   * itself, dropping what the worker wrote before it left (its last RESULTs, ERRORs, GOODBYE)
   * still unread in the receive buffer: those requests would end WORKER_EXITED instead of with
   * the worker's own outcome. So before that destroy, the rest is read here, synchronously (the
   * peer is gone: nothing more can arrive), and fed to the core, then the end of file is handled.
   */
  private keepReadingAfterWriteError(sock: Socket): void {
    const destroy = sock.destroy;
    sock.destroy = (error?: Error): Socket => {
      if (error !== undefined && (error as NodeJS.ErrnoException).syscall === "write" && !this.socketEnded) {
        this.writeFailed = true;
        this.readRest(sock);
        this.onEof();
      }
      return destroy.call(sock, error);
    };
  }

  /** Feeds the core what is left of the connection: Node's buffer, then the kernel's. */
  private readRest(sock: Socket): void {
    while (sock.readableLength > 0 && sock.read() !== null) {
      // read() emits 'data': onData has it
    }
    const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
    if (fd === undefined || fd < 0) return;
    const buf = Buffer.allocUnsafe(64 * 1024);
    for (;;) {
      let n: number;
      try {
        n = readSync(fd, buf);
      } catch {
        return; // EAGAIN (nothing left) or ECONNRESET (the worker left bytes of ours unread)
      }
      if (n === 0 || this.state === "dead" || this.brokenBy !== null) return;
      this.onData(Buffer.from(buf.subarray(0, n)));
    }
  }

  private spawnFailed(e: unknown): void {
    if (this.state === "dead") return;
    const err = wirepoolError(ErrorCode.SPAWN_FAILED, `cannot start ${quote(this.settings.command[0])}: ${cut(String((e as Error)?.message ?? e))}`, { cause: e });
    this.brokenBy = err;
    this.why = "spawn_failed";
    this.exited = true;
    this.finish();
  }

  // ---------------------------------------------------------------------------------------------
  // Sending

  /** Whether a request can be routed here now. */
  available(): boolean {
    return this.state === "ready" && !this.retiring && this.conn.canSendRequest();
  }

  /**
   * Sends a request; the route gets its outcome. Throws the core's ProtocolError when the core
   * refuses (nothing was sent).
   */
  send(route: Route, method: number, codec: number, timeoutMs: number, body: Uint8Array): number {
    // Rounded up: no positive budget reaches the wire as 0, which means no deadline (22.3).
    const id = this.conn.sendRequest(method, codec, timeoutMs > 0 ? Math.ceil(timeoutMs * 1000) : 0, body);
    this.routes.set(id, route);
    this.requests++;
    this.scheduleFlush();
    return id;
  }

  /** Asks the worker to stop request `id` (no-op once it has ended or the worker is closing). */
  cancel(id: number): void {
    if (this.state !== "ready" && this.state !== "closing") return;
    if (!this.conn.isOpen() || !this.conn.isInFlight(id)) return;
    this.conn.sendCancel(id);
    this.scheduleFlush();
  }

  /** The consumer has read (or dropped) `bytes` of stream `id`'s rows: the core grants credit. */
  consumed(id: number, bytes: number): void {
    if (this.state === "dead" || !this.conn.isOpen()) return;
    if (this.conn.consumed(id, bytes) > 0) this.scheduleFlush();
  }

  /** Whether request `id` is still in flight at the core (its terminal not yet in). */
  inFlight(id: number): boolean {
    return this.state !== "dead" && this.routes.has(id);
  }

  /** Requests in flight on this worker. */
  get inFlightCount(): number {
    return this.routes.size;
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    // Every send of this tick goes out in one write (pool.map, Promise.all, a read's grants).
    queueMicrotask(this.flushBound);
  }

  private flush(): void {
    this.flushScheduled = false;
    const sock = this.socket;
    const queued = this.conn.outputLength();
    if (queued === 0) return;
    // Past the handed-ahead bound with what the socket holds already (8.5): fed as it drains.
    if (this.feeding || mustFeed(queued, sock)) {
      if (sock === null || sock.destroyed || this.writeFailed) {
        this.conn.takeOutput();
        return;
      }
      // A large output (8.5): a frame at a time as the socket drains; PINGs go now.
      if (this.feeding) this.write(sock, this.conn.takeOutput(0));
      else this.feed();
      return;
    }
    this.flushAll();
  }

  /** Writes everything queued now (the last frames before a close: a fatal ERROR after a large output). */
  private flushAll(): void {
    const sock = this.socket;
    const bufs = this.conn.takeOutput();
    if (sock === null || sock.destroyed || this.writeFailed) return;
    if (bufs.length === 1) {
      this.bytesOut += bufs[0].length;
      sock.write(bufs[0]);
      return;
    }
    this.write(sock, bufs);
  }

  /** Writes pieces: small ones joined, large bodies as they are (corked: one writev). */
  private write(sock: Socket, bufs: Buffer[]): void {
    if (bufs.length === 0) return;
    if (bufs.length === 1) {
      this.bytesOut += bufs[0].length;
      sock.write(bufs[0]);
      return;
    }
    let total = 0;
    for (const b of bufs) total += b.length;
    this.bytesOut += total;
    if (total <= 256 * 1024) {
      sock.write(Buffer.concat(bufs, total));
    } else {
      sock.cork();
      for (const b of bufs) sock.write(b);
      sock.uncork();
    }
  }

  /** A large output (8.5): fed as the socket drains (feedOutput), the rest on 'drain'. */
  private feed(): void {
    this.feeding = false;
    const sock = this.socket;
    if (sock === null || sock.destroyed || this.writeFailed || this.state === "dead") {
      this.conn.takeOutput();
      return;
    }
    if (feedOutput(this.conn, sock, (bufs) => this.write(sock, bufs))) {
      this.feeding = true;
      sock.once("drain", this.feedBound);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Receiving

  private onData(chunk: Buffer): void {
    if (this.state === "dead" || this.brokenBy !== null) return;
    const conn = this.conn;
    this.bytesIn += chunk.length;
    conn.receive(chunk);
    const ids = this.resultIds;
    const bodies = this.resultBodies;
    try {
      for (;;) {
        // The fast path (14.4): complete one-frame RESULTs without an event object each.
        const n = this.state === "ready" ? conn.takeResults(ids, bodies) : 0;
        if (n > 0) {
          for (let k = 0; k < n; k++) this.onResult(ids[k], bodies[k]);
          ids.length = 0;
          bodies.length = 0;
          if (this.brokenBy !== null || (this.state as WorkerState) === "dead") return;
        }
        const ev = conn.nextEvent();
        if (ev === null) break;
        this.onEvent(ev);
        if (this.brokenBy !== null || (this.state as WorkerState) === "dead") return;
      }
    } catch (e) {
      if (e instanceof ProtocolError) {
        this.violation(e.code, e.message, true);
        return;
      }
      throw e;
    }
  }

  private onEvent(ev: ConnectionEvent): void {
    switch (ev.type) {
      case FrameType.RESULT:
        this.onResult(ev.id, ev.body);
        return;
      case FrameType.ROWS: {
        const r = this.routes.get(ev.id);
        if (r === undefined) {
          this.consumed(ev.id, ev.payloadLength);
          return;
        }
        r.rows(ev);
        return;
      }
      case FrameType.END: {
        const r = this.routes.get(ev.id);
        if (r === undefined) return;
        this.routes.delete(ev.id);
        this.ended();
        r.end(ev.summary);
        return;
      }
      case FrameType.ERROR: {
        if (ev.id === 0) {
          // Fatal for the connection (8.4): the worker's code and message in the details.
          this.violation(ev.code, `the worker reported a fatal error ${ev.code} ${errorName(ev.code)}: ${ev.message}`, false);
          return;
        }
        const r = this.routes.get(ev.id);
        if (r === undefined) return;
        this.routes.delete(ev.id);
        this.ended();
        // Its id decides its fate, not its code (section 3): any code is the worker's error.
        r.fail(wireError(ev.code, ev.message, { requestId: ev.id, details: parseDetails(ev.details), pid: this.pid }));
        return;
      }
      case FrameType.EVENT: {
        if (ev.id !== 0) {
          const r = this.routes.get(ev.id);
          if (r?.event !== undefined) r.event(ev.topic, ev.data);
        }
        this.hooks.event?.(this, ev.id, ev.topic, ev.data);
        return;
      }
      case FrameType.PING:
        this.conn.sendPong(ev.nonce);
        this.scheduleFlush();
        return;
      case FrameType.PONG:
        // A PONG answers its PING and every earlier one (8.5): the judge keeps count.
        this.judge?.pong(ev.nonce);
        this.ponged(ev.nonce);
        return;
      case FrameType.HELLO:
        this.onHello(ev);
        return;
      case FrameType.GOODBYE:
        // Nothing new is routed here; its exit ends what is in flight (WORKER_EXITED).
        this.state = "closing";
        this.stopHeartbeat();
        this.armKill(this.settings.goodbyeGraceMs);
        this.hooks.freed(this);
        return;
      case EventType.LATE:
        return;
      default:
        return;
    }
  }

  private onResult(id: number, body: Buffer): void {
    const r = this.routes.get(id);
    if (r === undefined) return;
    this.routes.delete(id);
    this.ended();
    r.result(body);
  }

  private ended(): void {
    if (this.routes.size === 0) this.idleSince = performance.now();
    this.hooks.freed(this);
  }

  private onHello(h: HelloFrame): void {
    this.helloPid = h.pid;
    const s = this.settings;
    for (let i = 0; i < h.methods.length; i++) {
      const m = h.methods[i];
      this.methods.set(m.name, { index: i, kind: m.kind, codecs: m.codecs });
    }
    for (const r of s.require) {
      const m = this.methods.get(r.method);
      const kind = r.kind === "stream" ? MethodKind.STREAM : MethodKind.UNARY;
      let why: string | null = null;
      if (m === undefined) why = `the worker has no method ${quote(r.method)}`;
      else if (m.kind !== kind) why = `the worker's ${quote(r.method)} is not a ${r.kind} method`;
      else {
        const missing = r.codecs.filter((c) => !m.codecs.includes(c));
        if (missing.length > 0) why = `the worker's ${quote(r.method)} does not accept codec ${missing.join(", ")}`;
      }
      if (why !== null) {
        this.conn.refuse(ErrorCode.CODEC_MISMATCH, why);
        this.flush();
        this.breakWith(wirepoolError(ErrorCode.CODEC_MISMATCH, why, { pid: this.pid }), "codec_mismatch", false);
        return;
      }
    }
    try {
      // The WELCOME is the core's (14.5); the clamp is logged by the pool, once (4.2).
      const { welcome, clamped } = negotiate(h, {
        maxFrameSize: s.maxFrameSize,
        initialCredit: s.initialCredit,
        heartbeatMs: Math.ceil(s.heartbeatMs), // a whole number on the wire (u32 ms); the option may be fractional (22.2)
        maxInFlight: s.maxInFlight,
        maxMessageSize: s.maxMessageSize,
        workerId: this.workerId,
        remote: false,
      });
      if (clamped) this.hooks.clamped?.(s.maxInFlight, h.maxConcurrency);
      this.conn.sendWelcome(welcome);
    } catch (e) {
      // Never thrown from this handler (22.1): a WELCOME the core cannot write fails the start.
      this.welcomeFailed(e);
      return;
    }
    this.flush();
    if (this.startTimer !== null) clearTimeout(this.startTimer);
    this.startTimer = null;
    this.state = "ready";
    this.everReady = true;
    this.idleSince = performance.now();
    if (s.heartbeatMs > 0) {
      // Ticks four times a heartbeat: a verdict comes at most a quarter heartbeat late.
      const tickMs = Math.max(1, Math.floor(s.heartbeatMs / 4));
      this.judge = new Liveness(s.heartbeatMs, tickMs, performance.now());
      this.heartbeat = setInterval(() => this.tick(), tickMs);
      this.heartbeat.unref();
    }
    const resolve = this.startResolve;
    this.startResolve = this.startReject = null;
    resolve?.();
  }

  /** The WELCOME could not be written: the worker is refused and its start fails, typed. */
  private welcomeFailed(e: unknown): void {
    // A bad offer (negotiate's INVALID_ARGUMENT, a local code never sent) is refused on the
    // wire as the out-of-range WELCOME field it would be (4.2: BAD_HANDSHAKE).
    const badOffer = !(e instanceof ProtocolError) || e.code === ErrorCode.INVALID_ARGUMENT;
    const code = !badOffer ? e.code : ErrorCode.BAD_HANDSHAKE;
    const why = cut(String((e as Error)?.message ?? e));
    try {
      this.conn.refuse(code, why);
      this.flush();
    } catch {
      // the refusal is a courtesy; the start fails either way
    }
    if (!badOffer) this.breakWith(this.violationError(code, `the worker's HELLO cannot be answered: ${why}`), "protocol", false);
    else this.breakWith(wirepoolError(ErrorCode.INVALID_ARGUMENT, `the WELCOME cannot be written from these settings: ${why}`, { pid: this.pid, cause: e }), "protocol", false);
  }

  // ---------------------------------------------------------------------------------------------
  // Liveness (8.5)

  /** A housekeeping tick: the judge decides (a parent that itself ran late judges nobody). */
  private tick(): void {
    const judge = this.judge;
    if (judge === null || (this.state !== "ready" && this.state !== "closing")) return;
    const mayPing = this.state === "ready" && this.conn.isOpen();
    const t = judge.tick(performance.now(), { incompleteFrame: this.conn.incompleteFrameLen(), bytesIn: this.bytesIn }, mayPing);
    if (t.hung !== null) {
      this.hang(Liveness.describe(t.hung, this.settings.heartbeatMs));
      return;
    }
    if (t.ping === null) return;
    if (this.pings.size >= 8) this.pings.clear();
    this.pings.set(Buffer.from(t.ping.buffer, t.ping.byteOffset, t.ping.byteLength).toString("hex"), performance.now());
    this.conn.sendPing(t.ping);
    this.scheduleFlush();
  }

  /** A PONG answers its PING and every earlier one: the round trip is its PING's. */
  private ponged(nonce: Uint8Array): void {
    const key = Buffer.from(nonce.buffer, nonce.byteOffset, nonce.byteLength).toString("hex");
    const at = this.pings.get(key);
    if (at === undefined) return;
    this.heartbeatRttMs = performance.now() - at;
    for (const k of [...this.pings.keys()]) {
      this.pings.delete(k);
      if (k === key) break;
    }
  }

  private hang(why: string): void {
    this.breakWith(wirepoolError(ErrorCode.WORKER_HUNG, `the worker (pid ${this.pid}) is hung: ${why}; killed${this.tailSuffix()}`, { pid: this.pid, stderrTail: this.stderrTail() }), "hung", true);
  }

  private stopHeartbeat(): void {
    if (this.heartbeat !== null) clearInterval(this.heartbeat);
    this.heartbeat = null;
  }

  // ---------------------------------------------------------------------------------------------
  // Endings

  private violationError(code: number, message: string): WirepoolError {
    return wirepoolError(ErrorCode.PROTOCOL_VIOLATION, message, {
      pid: this.pid,
      protocolCode: code,
      details: { protocol_code: code, protocol_name: errorName(code), message },
    });
  }

  /** A 1xx violation (ours or the worker's ERROR id 0): requests end now, the worker goes. */
  private violation(code: number, message: string, detectedHere: boolean): void {
    if (detectedHere) {
      try {
        this.conn.sendFatal({ code, message });
      } catch {
        // nothing can be sent (already closed): the close says enough
      }
      this.flushAll();
    }
    this.breakWith(this.violationError(code, `protocol violation ${code} ${errorName(code)}: ${message}`), "protocol", false);
  }

  /**
   * The connection is over for `error`'s reason: every request ends with it now, nothing more is
   * read or routed, and the process is killed now (`killNow`) or after the goodbye grace.
   */
  private breakWith(error: WirepoolError, why: string, killNow: boolean): void {
    if (this.state === "dead" || this.brokenBy !== null) return;
    this.brokenBy = error;
    this.why = why;
    this.stopHeartbeat();
    if (this.state !== "starting") this.state = "closing";
    this.failRoutes(error);
    this.conn = new Connection("parent");
    const sock = this.socket;
    if (sock !== null) {
      sock.end();
      sock.removeAllListeners("data");
    }
    if (killNow) this.kill();
    else this.armKill(this.settings.goodbyeGraceMs);
    if (this.state === "closing") this.hooks.freed(this);
    else this.rejectStart(error);
  }

  private rejectStart(error: WirepoolError): void {
    const reject = this.startReject;
    this.startResolve = this.startReject = null;
    reject?.(error);
  }

  private onEof(): void {
    if (this.socketEnded) return;
    this.socketEnded = true;
    this.outputsOpen--;
    if (this.state !== "dead") this.connectionEnded();
    if (this.remote !== null) {
      // A remote worker's death is its lost connection: status and signal unknown (21.6).
      this.exited = true;
      this.finish();
      return;
    }
    if (this.outputsOpen === 0 && this.exited && this.exitWait !== null) this.finish();
  }

  /** The worker sent all it will: the core is told, nothing new is routed here. */
  private connectionEnded(): void {
    if (this.brokenBy === null) {
      try {
        this.conn.endOfInput();
      } catch {
        // TRUNCATED: the requests end when the exit is known (WORKER_EXITED says more).
      }
    }
    this.stopHeartbeat();
    if (this.state === "ready") {
      this.state = "closing";
      this.hooks.freed(this);
    }
    // Requests end at the exit, with its status; a process that lingers is killed after the grace.
    this.armKill(this.settings.goodbyeGraceMs);
  }

  /** Asks the worker to drain: it finishes or cancels its requests within `graceMs`, then leaves. */
  drain(graceMs: number): void {
    this.retiring = true;
    if (this.state === "starting") {
      this.kill();
      return;
    }
    if (this.state !== "ready") return;
    if (!this.conn.isDraining() && this.conn.isOpen()) {
      this.conn.sendDrain(Math.max(0, Math.min(Math.round(graceMs), 0xffffffff)));
      this.flush();
    }
    // The worker cancels what is left at the grace (at most 250 ms later), says GOODBYE and exits;
    // one that does not is killed a goodbye grace after that.
    this.armKill(graceMs + 250 + this.settings.goodbyeGraceMs);
  }

  /** Kills the process now (SIGKILL: a stopped worker never acts on SIGTERM). */
  kill(): void {
    if (this.remote !== null) {
      // The parent cannot kill a remote process: it closes the connection (21.6); the subprocess
      // launcher also stops the child it started.
      this.socket?.destroy();
      if (this.child !== null && !this.childGone) this.signalChild();
      if (this.socket === null && this.state !== "dead") {
        this.exited = true;
        this.finish();
      }
      return;
    }
    if (this.child !== null && !this.exited) {
      try {
        this.child.kill("SIGKILL");
      } catch {
        // already gone
      }
    }
  }

  private signalChild(): void {
    try {
      this.child?.kill("SIGKILL");
    } catch {
      // already gone
    }
  }

  /** Kills the process in `ms` unless it exits first; an earlier kill already armed stands. */
  private armKill(ms: number): void {
    if (this.exited) return;
    ms = Math.min(ms, 0x7fffffff); // a timer's range: longer ones fire at once
    const at = performance.now() + ms;
    if (this.killTimer !== null) {
      if (this.killAt <= at) return;
      clearTimeout(this.killTimer);
    }
    this.killAt = at;
    this.killTimer = setTimeout(() => {
      this.killTimer = null;
      this.kill();
    }, ms);
    this.killTimer.unref();
  }

  private onExit(code: number | null, signal: NodeJS.Signals | null): void {
    this.exited = true;
    this.exitStatus = code;
    this.exitSignal = signal === null ? null : (SIGNALS[signal] ?? null);
    if (this.killTimer !== null) clearTimeout(this.killTimer);
    this.killTimer = null;
    // Its last frames may still be unread on the connection and its last stderr lines in the
    // pipe: wait for the connection's end of file and the pipes to close, bounded (a process it
    // left behind may hold them open).
    if (this.outputsOpen === 0) this.finish();
    // One poll of the event loop after the timer (setImmediate) reads what is ready, even when a
    // long callback delayed the timer past the bound.
    else (this.exitWait = setTimeout(() => setImmediate(() => this.finish()), EXIT_OUTPUT_WAIT_MS)).unref();
  }

  private finish(): void {
    if (this.state === "dead") return;
    const wasStarting = this.state === "starting";
    this.state = "dead";
    if (this.exitWait !== null) clearTimeout(this.exitWait);
    if (this.startTimer !== null) clearTimeout(this.startTimer);
    if (this.killTimer !== null) clearTimeout(this.killTimer);
    this.exitWait = this.startTimer = this.killTimer = null;
    this.stopHeartbeat();
    const death: Death = { exitStatus: this.exitStatus, signal: this.exitSignal, stderrTail: this.stderrTail(), why: this.why };
    this.death = death;
    if (this.remote !== null && !this.childGone) this.signalChild(); // the launcher stops what it started
    const exitedError = wirepoolError(ErrorCode.WORKER_EXITED, this.describeExit(), {
      details: this.remote !== null ? { connection: "lost", host: this.host, pid: this.helloPid } : undefined,
      pid: this.pid,
      exitStatus: death.exitStatus,
      signal: death.signal,
      stderrTail: death.stderrTail,
    });
    this.failRoutes(exitedError);
    if (this.socket !== null) {
      this.socket.removeAllListeners();
      this.socket.on("error", () => {});
      this.socket.destroy();
    }
    if (wasStarting) this.rejectStart(this.brokenBy ?? exitedError);
    this.markGone();
    this.hooks.exited(this, death);
  }

  private describeExit(): string {
    if (this.remote !== null) {
      const where = this.host === null ? `(child pid ${this.pid}) never joined` : `${this.host} pid ${this.helloPid ?? "?"} lost its connection`;
      return `the remote worker ${where}${this.helloPid === null ? " before its HELLO" : ""}`;
    }
    const how =
      this.exitSignal !== null
        ? `was killed by signal ${this.exitSignal}`
        : this.exitStatus !== null
          ? `exited with status ${this.exitStatus}`
          : "is gone";
    const beforeHello = this.brokenBy === null && this.conn.hello() === null;
    const before = beforeHello ? " before its HELLO" : "";
    // Status 0 and silence before the HELLO: a program that ended without serving (issue 28),
    // worded as the Python and Rust parents word it.
    const hint = beforeHello && this.exitSignal === null && this.exitStatus === 0 && this.stderrTail() === "" ? " (did the worker program call its SDK's serve, e.g. `await worker.serve()`?)" : "";
    return `the worker (pid ${this.pid}) ${how}${before}${hint}${this.tailSuffix()}`;
  }

  private tailSuffix(): string {
    return tailSuffix(this.stderrTail());
  }

  private failRoutes(error: WirepoolError): void {
    if (this.routes.size === 0) return;
    const routes = [...this.routes];
    this.routes.clear();
    for (const [id, r] of routes) {
      r.fail(wirepoolError(error.code, error.message, {
        requestId: id,
        details: error.details,
        exitStatus: error.exitStatus,
        signal: error.signal,
        stderrTail: error.stderrTail,
        pid: error.pid,
        protocolCode: (error as { protocolCode?: number }).protocolCode,
      }));
    }
  }

  // ---------------------------------------------------------------------------------------------
  // stdout and stderr: read continuously, never parsed as protocol (section 1)

  private watchOutput(stream: NodeJS.ReadableStream, name: "stdout" | "stderr"): void {
    this.outputsOpen++;
    stream.on("data", (chunk: Buffer) => this.onOutput(name, chunk));
    stream.once("close", () => {
      this.outputsOpen--;
      if (this.outputsOpen === 0 && this.exited && this.exitWait !== null) this.finish();
    });
  }

  private onOutput(name: "stdout" | "stderr", chunk: Buffer): void {
    const lines = this.hooks.wantsLines();
    if (!lines && name === "stdout") return;
    let text: string;
    if (lines) {
      text = chunk.toString("utf8");
    } else {
      // Only the tail is kept: decode just the chunk's last lines.
      let start = chunk.length;
      for (let k = 0; k <= this.settings.stderrTailLines && start > 0; k++) {
        const nl = chunk.lastIndexOf(10, start - 1);
        if (nl < 0 || chunk.length - nl > this.settings.stderrTailLines * TAIL_LINE_MAX) {
          start = nl < 0 ? 0 : Math.max(nl + 1, chunk.length - this.settings.stderrTailLines * TAIL_LINE_MAX);
          break;
        }
        start = nl;
      }
      if (start > 0) this.partial[name] = "";
      text = chunk.toString("utf8", start > 0 && chunk[start] === 10 ? start + 1 : start);
    }
    let from = 0;
    for (;;) {
      const nl = text.indexOf("\n", from);
      if (nl < 0) break;
      let line = text.slice(from, nl);
      if (this.partial[name].length > 0) {
        line = this.partial[name] + line;
        this.partial[name] = "";
      }
      this.line(name, line);
      from = nl + 1;
    }
    if (from < text.length) {
      const rest = this.partial[name] + text.slice(from);
      this.partial[name] = rest.length > TAIL_LINE_MAX ? rest.slice(0, TAIL_LINE_MAX) : rest;
    }
  }

  private line(name: "stdout" | "stderr", line: string): void {
    if (name === "stderr") {
      this.tail.push(line.length > TAIL_LINE_MAX ? line.slice(0, TAIL_LINE_MAX) : line);
      if (this.tail.length > this.settings.stderrTailLines) this.tail.shift();
    }
    this.hooks.log?.(this, name, line);
  }

  /** The last lines of its stderr (a line without its newline yet included). */
  stderrTail(): string {
    const lines = this.partial.stderr.length > 0 ? [...this.tail, this.partial.stderr] : this.tail;
    return lines.slice(-this.settings.stderrTailLines).join("\n");
  }

  /** Resident memory in bytes (Linux /proc), or 0 when unknown. */
  rssBytes(): number {
    if (this.pid === 0 || this.state === "dead") return 0;
    try {
      const status = readFileSync(`/proc/${this.pid}/status`, "latin1");
      const m = /VmRSS:\s+(\d+) kB/.exec(status);
      return m === null ? 0 : Number(m[1]) * 1024;
    } catch {
      return 0;
    }
  }
}
