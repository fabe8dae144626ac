/**
 * The parent's listener for remote workers (PROTOCOL.md section 21), one per pool: a TCP
 * listener with TLS 1.3 (ALPN `wirepool/1`, a self-signed ECDSA P-256 certificate made at start
 * and pinned by the tickets' fingerprint), join tickets (issue, revoke, single use, expiry), the
 * 64-byte JOIN block checked in 21.3's order, and 21.4's bounds on an unauthenticated peer
 * (`joinTimeoutMs` from accept to the JOIN block, `helloTimeoutMs` from accept to the hand-over,
 * at most `maxPendingJoins` connections between accept and hand-over). A joined connection is
 * handed to {@link Listener.accept} with the bytes that followed its JOIN block (the start of its
 * HELLO): from there on it is the protocol of a local worker.
 *
 * @example
 * ```ts
 * await using listener = await Listener.start({ host: "127.0.0.1" });
 * const ticket = listener.issue({ singleUse: true });
 * // start a worker with WIREPOOL_TICKET=ticket.encode() ...
 * const joined = await listener.accept({ ticket, timeoutMs: 10_000 });
 * joined.socket; // TLS socket; joined.head holds the first bytes of its HELLO
 * ```
 * @module
 */

import { createHash, generateKeyPairSync, randomBytes, sign, type KeyObject } from "node:crypto";
import net from "node:net";
import tls from "node:tls";
import { ErrorCode, FrameType, Remote } from "../proto/constants.js";
import { encodeFrames } from "../proto/frames.js";
import { isLoopback, Ticket } from "../worker/remote.js";
import { WirepoolError } from "./errors.js";
import { invalid } from "./options.js";

const ID_BYTES = 16;
const SECRET_BYTES = 32;
const REFUSED = "join refused";
/** A refused peer that does not read its answer holds the connection this long at most. */
const REFUSAL_LINGER_MS = 1000;
const MAX_TIMEOUT_MS = 2_147_483_647;
const MAX_TTL_S = 10 * 365 * 86400;

/** A join ticket the listener issued (21.2): the worker's {@link Ticket} (one text form, one parser), plus whether it is forgotten after its first join. Its secret stays out of `inspect`, JSON and messages. */
export class JoinTicket extends Ticket {
  /** @internal */
  constructor(
    host: string,
    port: number,
    tls: boolean,
    fingerprint: Buffer | null,
    id: Buffer,
    secret: Buffer,
    /** Unix time in seconds: the last second the ticket is valid. */
    expires: number,
    /** Forgotten after its first join (a launcher's per-worker ticket). */
    readonly singleUse: boolean,
  ) {
    super(host, port, tls, fingerprint, id, secret, expires);
  }

  override toJSON(): object {
    return { ...super.toJSON(), singleUse: this.singleUse };
  }
}

/** Options of {@link Listener.start}; the defaults are spec/constants.json's `remote` ones. */
export interface ListenerOptions {
  /** Where to listen (default `127.0.0.1`). */
  readonly host?: string;
  /** The port (default 0: any free port). */
  readonly port?: number;
  /** The host name workers use to reach the listener, written into tickets (default `host`). */
  readonly advertise?: string;
  /** TLS 1.3 (default true); false is plain TCP, allowed on a loopback `host` only (21.1). */
  readonly tls?: boolean;
  /** From TCP accept to the TLS handshake and the 64 JOIN bytes (default 5,000 ms). */
  readonly joinTimeoutMs?: number;
  /** From TCP accept to the hand-over to a waiting slot (default 10,000 ms). */
  readonly helloTimeoutMs?: number;
  /** Connections between accept and hand-over at once; more are closed at accept (default 64). */
  readonly maxPendingJoins?: number;
  /** Refusal log lines per second at most (default 10); the rest are counted. */
  readonly refusalLogPerSecond?: number;
  /** Where refusal lines go (default: `process.stderr`). */
  readonly log?: (line: string) => void;
}

/** A connection that passed the join step, for its pool to drive from its HELLO on. */
export interface Joined {
  readonly socket: net.Socket;
  /** Bytes that arrived after the JOIN block (the start of the HELLO); feed them first. */
  readonly head: Buffer;
  /** The peer address the listener saw (`host:port`), for errors and metrics (21.6). */
  readonly peer: string;
  readonly ticket: JoinTicket;
  /** performance.now() by which the HELLO must be complete (accept + helloTimeoutMs). */
  readonly helloDeadline: number;
}

/** What {@link Listener.stats} reports. */
export interface ListenerStats {
  readonly accepted: number;
  readonly joined: number;
  readonly refused: number;
  /** Refusals by cause (`join timeout`, `bad magic`, `unknown or revoked ticket`, ...). */
  readonly refusedBy: Readonly<Record<string, number>>;
  /** Connections between accept and hand-over now. */
  readonly pending: number;
  /** Tickets that can still be used. */
  readonly tickets: number;
}

interface Waiter {
  readonly key: string | null;
  resolve(j: Joined): void;
}

interface Parked {
  readonly joined: Joined;
  /** Ends the parking: taken (true) or refused/closed (false). */
  done(taken: boolean): void;
}

// ---------------------------------------------------------------------------------------------
// A self-signed certificate, in DER by hand (node:crypto makes keys and signatures, not X.509)
// ---------------------------------------------------------------------------------------------

function derLength(n: number): Buffer {
  if (n < 0x80) return Buffer.from([n]);
  if (n < 0x100) return Buffer.from([0x81, n]);
  return Buffer.from([0x82, n >> 8, n & 0xff]);
}

function der(tag: number, ...parts: Buffer[]): Buffer {
  const body = Buffer.concat(parts);
  return Buffer.concat([Buffer.from([tag]), derLength(body.length), body]);
}

function derTime(ms: number): Buffer {
  const iso = new Date(ms).toISOString(); // YYYY-MM-DDTHH:MM:SS.sssZ
  const digits = iso.slice(0, 19).replace(/[-T:]/g, "") + "Z";
  const year = new Date(ms).getUTCFullYear();
  // UTCTime for 1950-2049, GeneralizedTime after (RFC 5280 4.1.2.5).
  return year < 2050 ? der(0x17, Buffer.from(digits.slice(2), "latin1")) : der(0x18, Buffer.from(digits, "latin1"));
}

/** A self-signed X.509 v3 certificate (ECDSA P-256, SHA-256), valid from an hour ago to 365 days ahead (21.1). */
function selfSigned(): { certPem: string; key: KeyObject; der: Buffer } {
  const { publicKey, privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const ecdsaSha256 = der(0x30, Buffer.from("06082a8648ce3d040302", "hex"));
  const name = der(0x30, der(0x31, der(0x30, Buffer.from("0603550403", "hex"), der(0x0c, Buffer.from("wirepool parent", "utf8")))));
  const serial = randomBytes(16);
  serial[0] = (serial[0]! & 0x7f) | 0x40; // positive, no leading zero byte
  const now = Date.now();
  const tbs = der(
    0x30,
    der(0xa0, der(0x02, Buffer.from([2]))), // v3
    der(0x02, serial),
    ecdsaSha256,
    name,
    der(0x30, derTime(now - 3600_000), derTime(now + 365 * 86400_000)),
    name,
    publicKey.export({ type: "spki", format: "der" }),
  );
  const signature = sign("sha256", tbs, privateKey); // DER ECDSA-Sig-Value
  const cert = der(0x30, tbs, ecdsaSha256, der(0x03, Buffer.from([0]), signature));
  const b64 = cert.toString("base64").replace(/.{64}/g, "$&\n");
  return { certPem: `-----BEGIN CERTIFICATE-----\n${b64}\n-----END CERTIFICATE-----\n`.replace("\n\n", "\n"), key: privateKey, der: cert };
}

// ---------------------------------------------------------------------------------------------
// The listener
// ---------------------------------------------------------------------------------------------

function msOption(name: string, v: unknown, fallback: number): number {
  if (v === undefined) return fallback;
  if (typeof v === "number" && Number.isInteger(v) && v >= 1 && v <= MAX_TIMEOUT_MS) return v;
  throw invalid(name, `an integer number of milliseconds from 1 to ${MAX_TIMEOUT_MS}`, v);
}

function intOption(name: string, v: unknown, fallback: number, min: number, max: number): number {
  if (v === undefined) return fallback;
  if (typeof v === "number" && Number.isInteger(v) && v >= min && v <= max) return v;
  throw invalid(name, `an integer from ${min} to ${max}`, v);
}

function hostOption(name: string, v: unknown, fallback: string): string {
  if (v === undefined) return fallback;
  if (typeof v === "string" && v.length >= 1 && Buffer.byteLength(v) <= 253 && !/[\s/]/.test(v)) return v;
  throw invalid(name, "a host name or IP literal of 1-253 bytes", v);
}

function peerOf(s: net.Socket): string {
  const a = s.remoteAddress ?? "?";
  return `${a.includes(":") ? `[${a}]` : a}:${s.remotePort ?? 0}`;
}

/** The TLS listener remote workers join (21); see the module's example. */
export class Listener {
  readonly host: string;
  readonly advertise: string;
  readonly tls: boolean;
  readonly joinTimeoutMs: number;
  readonly helloTimeoutMs: number;
  readonly maxPendingJoins: number;
  /** SHA-256 of the certificate's DER (null without TLS): every ticket's `fingerprint`. */
  readonly fingerprint: Buffer | null;
  #port = 0;
  readonly #server: net.Server;
  readonly #tickets = new Map<string, JoinTicket>();
  readonly #waiters: Waiter[] = [];
  readonly #parked = new Map<string, Parked[]>();
  readonly #joinedBy = new Map<string, Set<net.Socket>>();
  readonly #open = new Set<net.Socket>();
  readonly #refusedBy: Record<string, number> = Object.create(null) as Record<string, number>;
  readonly #log: (line: string) => void;
  readonly #logPerSecond: number;
  #logSecond = 0;
  #logLines = 0;
  #logDropped = 0;
  #pending = 0;
  #accepted = 0;
  #joined = 0;
  #refused = 0;
  #closed = false;

  private constructor(o: ListenerOptions) {
    if (o === null || typeof o !== "object") throw invalid("options", "an object", o);
    this.host = hostOption("host", o.host, "127.0.0.1");
    this.advertise = hostOption("advertise", o.advertise, this.host);
    if (o.tls !== undefined && typeof o.tls !== "boolean") throw invalid("tls", "a boolean", o.tls);
    this.tls = o.tls ?? true;
    if (!this.tls && !(isLoopback(this.host) && isLoopback(this.advertise))) {
      throw invalid("tls", "true unless host and advertise are loopback addresses (plain TCP is for loopback only)", o.tls);
    }
    this.joinTimeoutMs = msOption("joinTimeoutMs", o.joinTimeoutMs, Remote.joinTimeoutMs);
    this.helloTimeoutMs = msOption("helloTimeoutMs", o.helloTimeoutMs, Remote.helloTimeoutMs);
    this.maxPendingJoins = intOption("maxPendingJoins", o.maxPendingJoins, Remote.maxPendingJoins, 1, 65536);
    this.#logPerSecond = intOption("refusalLogPerSecond", o.refusalLogPerSecond, Remote.refusalLogPerSecond, 0, 1_000_000);
    if (o.log !== undefined && typeof o.log !== "function") throw invalid("log", "a function", o.log);
    this.#log = o.log ?? ((line) => process.stderr.write(line + "\n"));
    intOption("port", o.port, 0, 0, 65535);
    if (this.tls) {
      const cert = selfSigned();
      this.fingerprint = createHash("sha256").update(cert.der).digest();
      this.#server = tls.createServer({
        cert: cert.certPem,
        key: cert.key.export({ type: "pkcs8", format: "pem" }),
        minVersion: "TLSv1.3",
        ALPNProtocols: [Remote.alpn],
        handshakeTimeout: this.joinTimeoutMs,
      });
      this.#server.on("tlsClientError", (e: Error & { code?: string }, s: tls.TLSSocket) =>
        this.#refuse(s, e.code === "ERR_TLS_HANDSHAKE_TIMEOUT" ? "join timeout" : `tls handshake failed (${(e.code ?? String(e.message).split("\n")[0] ?? "").slice(0, 120)})`));
      this.#server.on("secureConnection", (s: tls.TLSSocket) => {
        if (s.alpnProtocol !== Remote.alpn) {
          this.#refuse(s, "tls handshake failed (no ALPN wirepool/1)");
          return;
        }
        this.#readJoin(s);
      });
    } else {
      this.fingerprint = null;
      this.#server = net.createServer(); // #accept reads the JOIN block itself
    }
    // The raw TCP accept: counted and bounded before TLS sees a byte.
    this.#server.on("connection", (raw: net.Socket) => this.#accept(raw));
    this.#server.on("error", () => {}); // reported by start(); later errors close nothing
  }

  /** Starts listening; resolves once the port is bound. Bad options: InvalidArgumentError (308). */
  static async start(options: ListenerOptions = {}): Promise<Listener> {
    const l = new Listener(options);
    const port = options.port ?? 0;
    await new Promise<void>((resolve, reject) => {
      const failed = (e: Error): void => reject(new WirepoolError(ErrorCode.SPAWN_FAILED, `cannot listen on ${l.host}:${port}: ${e.message}`.slice(0, 500), { cause: e }));
      l.#server.once("error", failed);
      l.#server.listen({ host: l.host, port, backlog: Math.max(l.maxPendingJoins, 128) }, () => {
        l.#server.off("error", failed);
        resolve();
      });
    });
    l.#port = (l.#server.address() as net.AddressInfo).port;
    return l;
  }

  /** The bound port. */
  get port(): number {
    return this.#port;
  }

  /** A new ticket valid for `ttlS` seconds (default 86,400). A pool ticket admits any number of workers; a `singleUse` one is spent by its first join that passes the ticket's checks. */
  issue(options: { readonly ttlS?: number; readonly singleUse?: boolean } = {}): JoinTicket {
    if (this.#closed) throw new WirepoolError(ErrorCode.POOL_CLOSED, "the listener is closed");
    const ttl = intOption("ttlS", options.ttlS, Remote.poolTicketTtlS, 1, MAX_TTL_S);
    if (options.singleUse !== undefined && typeof options.singleUse !== "boolean") throw invalid("singleUse", "a boolean", options.singleUse);
    const t = new JoinTicket(this.advertise, this.#port, this.tls, this.fingerprint, randomBytes(ID_BYTES), randomBytes(SECRET_BYTES), Math.floor(Date.now() / 1000) + ttl, options.singleUse ?? false);
    this.#tickets.set(t.name, t);
    return t;
  }

  /** Refuses later joins with `ticket`; `dropWorkers` also closes the connections that joined with it. */
  revoke(ticket: JoinTicket, options: { readonly dropWorkers?: boolean } = {}): void {
    this.#tickets.delete(ticket.name);
    for (const p of this.#parked.get(ticket.name) ?? []) p.done(false);
    const joined = this.#joinedBy.get(ticket.name);
    this.#joinedBy.delete(ticket.name);
    if (options.dropWorkers === true) for (const s of joined ?? []) s.destroy();
  }

  /** Counters of accepted, joined and refused connections (by cause), pending ones and live tickets. */
  stats(): ListenerStats {
    return { accepted: this.#accepted, joined: this.#joined, refused: this.#refused, refusedBy: { ...this.#refusedBy }, pending: this.#pending, tickets: this.#tickets.size };
  }

  /**
   * The next connection that joined with `ticket` (default: any pool ticket). Rejects with
   * STARTUP_TIMEOUT after `timeoutMs` (default helloTimeoutMs), POOL_CLOSED once closed.
   */
  accept(options: { readonly ticket?: JoinTicket; readonly timeoutMs?: number } = {}): Promise<Joined> {
    if (this.#closed) return Promise.reject(new WirepoolError(ErrorCode.POOL_CLOSED, "the listener is closed"));
    let timeoutMs: number;
    try {
      timeoutMs = msOption("timeoutMs", options.timeoutMs, this.helloTimeoutMs);
    } catch (e) {
      return Promise.reject(e);
    }
    const key = options.ticket?.name ?? null;
    const keys = key !== null ? [key] : [...this.#tickets.values()].filter((t) => !t.singleUse).map((t) => t.name);
    for (const k of keys) {
      const parked = this.#parked.get(k);
      const p = parked?.shift();
      if (p !== undefined) {
        p.done(true);
        return Promise.resolve(this.#handOver(p.joined));
      }
    }
    return new Promise<Joined>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#dropWaiter(waiter);
        reject(new WirepoolError(ErrorCode.STARTUP_TIMEOUT, `no worker joined within ${timeoutMs} ms`));
      }, timeoutMs);
      const waiter: Waiter & { reject(e: Error): void } = {
        key,
        resolve: (j) => {
          clearTimeout(timer);
          resolve(j);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      };
      this.#waiters.push(waiter);
    });
  }

  /** Stops listening and closes every connection not yet handed over; waiting `accept`s reject with POOL_CLOSED. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const w of this.#waiters.splice(0)) (w as Waiter & { reject(e: Error): void }).reject(new WirepoolError(ErrorCode.POOL_CLOSED, "the listener is closed"));
    for (const s of this.#open) s.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #dropWaiter(w: Waiter): void {
    const i = this.#waiters.indexOf(w);
    if (i >= 0) this.#waiters.splice(i, 1);
  }

  #accept(raw: net.Socket): void {
    this.#accepted++;
    if (this.#closed || this.#pending >= this.maxPendingJoins) {
      this.#refuse(raw, this.#closed ? "listener closed" : "too many pending");
      return;
    }
    this.#pending++;
    this.#open.add(raw);
    let settled = false;
    const joinTimer = setTimeout(() => this.#refuse(raw, "join timeout"), this.joinTimeoutMs);
    const helloTimer = setTimeout(() => {
      const expire = (raw as RawSocket)[EXPIRE];
      if (expire !== undefined) expire(); // parked: "pool full", with its answer
      else this.#refuse(raw, "hello timeout");
    }, this.helloTimeoutMs);
    const settle = (): void => {
      if (settled) return;
      settled = true;
      clearTimeout(joinTimer);
      clearTimeout(helloTimer);
      this.#pending--;
      this.#open.delete(raw);
    };
    raw.on("error", () => {});
    raw.once("close", settle);
    // What #readJoin and #handOver use to stop the clocks (on the raw socket: a TLS socket wraps it).
    (raw as RawSocket)[JOINED] = () => clearTimeout(joinTimer);
    (raw as RawSocket)[HANDED] = settle;
    (raw as RawSocket)[ACCEPTED_AT] = performance.now();
    if (!this.tls) this.#readJoin(raw);
  }

  #readJoin(s: net.Socket): void {
    const raw = rawOf(s);
    if (raw[HANDED] === undefined) {
      s.destroy(); // accepted past the bound or after close
      return;
    }
    s.on("error", () => {});
    const chunks: Buffer[] = [];
    let have = 0;
    const onData = (chunk: Buffer): void => {
      chunks.push(chunk);
      have += chunk.length;
      if (have < Remote.joinBytes) return;
      s.off("data", onData);
      s.pause(); // nothing more is read before the ticket is checked (21.4)
      raw[JOINED]?.();
      const all = Buffer.concat(chunks, have);
      this.#check(s, raw, all.subarray(0, Remote.joinBytes), Buffer.from(all.subarray(Remote.joinBytes)));
    };
    s.on("data", onData);
  }

  #check(s: net.Socket, raw: RawSocket, block: Buffer, head: Buffer): void {
    if (block.toString("latin1", 0, 8) !== Remote.joinMagic) return this.#refuse(s, "bad magic");
    const version = block.readUInt16LE(8);
    if (version !== Remote.joinVersion) return this.#refuse(s, `join version ${version}`, [ErrorCode.VERSION_MISMATCH, `join version ${version} is not supported (${Remote.joinVersion})`]);
    const refused: [number, string] = [ErrorCode.BAD_HANDSHAKE, REFUSED];
    if (!block.subarray(10, 16).equals(Buffer.alloc(6))) return this.#refuse(s, "reserved bytes not zero", refused);
    const id = block.subarray(16, 32).toString("hex");
    const ticket = this.#tickets.get(id);
    if (ticket === undefined) return this.#refuse(s, "unknown or revoked ticket", refused);
    if (!ticket.matches(block.subarray(32, 64))) return this.#refuse(s, `wrong secret for ticket ${id}`, refused);
    if (Math.floor(Date.now() / 1000) > ticket.expires) return this.#refuse(s, `expired ticket ${id}`, refused);
    if (ticket.singleUse) this.#tickets.delete(id);
    const joined: Joined = { socket: s, head, peer: peerOf(s), ticket, helloDeadline: (raw[ACCEPTED_AT] ?? performance.now()) + this.helloTimeoutMs };
    const w = this.#waiters.find((x) => x.key === id) ?? (ticket.singleUse ? undefined : this.#waiters.find((x) => x.key === null));
    if (w !== undefined) {
      this.#dropWaiter(w);
      w.resolve(this.#handOver(joined));
      return;
    }
    // No slot waits: park until one asks, the connection closes, or the hello bound passes.
    const list = this.#parked.get(id) ?? [];
    this.#parked.set(id, list);
    let over = false;
    const p: Parked = {
      joined,
      done: (taken) => {
        if (over) return;
        over = true;
        s.off("close", lost);
        const i = list.indexOf(p);
        if (i >= 0) list.splice(i, 1);
        if (list.length === 0 && this.#parked.get(id) === list) this.#parked.delete(id);
        if (!taken) this.#refuse(s, "pool full", [ErrorCode.BAD_HANDSHAKE, `${REFUSED}: the pool is full`]);
      },
    };
    const lost = (): void => p.done(false);
    s.once("close", lost);
    list.push(p);
    // The hello timer set at accept refuses it as "hello timeout" if nobody takes it.
    raw[EXPIRE] = () => p.done(false);
  }

  #handOver(j: Joined): Joined {
    const raw = rawOf(j.socket);
    raw[HANDED]?.();
    this.#joined++;
    let set = this.#joinedBy.get(j.ticket.name);
    if (set === undefined) this.#joinedBy.set(j.ticket.name, (set = new Set()));
    set.add(j.socket);
    j.socket.once("close", () => set.delete(j.socket));
    return j;
  }

  /** Counts and logs a refusal, answers with an ERROR id 0 when given one, and closes. */
  #refuse(s: net.Socket, cause: string, answer?: [number, string]): void {
    const raw = rawOf(s);
    if (raw[REFUSED_MARK] === true) return; // counted once per connection
    raw[REFUSED_MARK] = true;
    this.#refused++;
    const key = cause.replace(/ (for )?(ticket )?[0-9a-f]{32}$/, "").replace(/ \([\s\S]*$/, "");
    this.#refusedBy[key] = (this.#refusedBy[key] ?? 0) + 1;
    this.#logLine(`wirepool listener: refused ${peerOf(s)}: ${cause}`);
    raw[HANDED]?.();
    if (answer !== undefined && s.writable && !s.destroyed) {
      s.end(encodeFrames([{ type: FrameType.ERROR, id: 0, more: false, code: answer[0], message: answer[1], details: "" }]));
      const linger = setTimeout(() => s.destroy(), REFUSAL_LINGER_MS);
      s.once("close", () => clearTimeout(linger));
    } else {
      s.destroy();
    }
  }

  #logLine(line: string): void {
    const second = Math.floor(performance.now() / 1000);
    if (second !== this.#logSecond) {
      if (this.#logDropped > 0) this.#safeLog(`wirepool listener: ${this.#logDropped} more refusals not logged`);
      this.#logSecond = second;
      this.#logLines = 0;
      this.#logDropped = 0;
    }
    if (this.#logLines < this.#logPerSecond) {
      this.#logLines++;
      this.#safeLog(line);
    } else {
      this.#logDropped++;
    }
  }

  #safeLog(line: string): void {
    try {
      this.#log(line);
    } catch {
      // a failing log hook must not break the listener
    }
  }
}

const JOINED = Symbol("joined");
const HANDED = Symbol("handed");
const EXPIRE = Symbol("expire");
const ACCEPTED_AT = Symbol("acceptedAt");
const REFUSED_MARK = Symbol("refused");
interface RawSocket extends net.Socket {
  [REFUSED_MARK]?: boolean;
  [JOINED]?: () => void;
  [HANDED]?: () => void;
  [EXPIRE]?: () => void;
  [ACCEPTED_AT]?: number;
}

/** The TCP socket under a TLS socket (the accept's), or the socket itself. */
function rawOf(s: net.Socket): RawSocket {
  const inner = (s as unknown as { _parent?: net.Socket | null })._parent;
  return (inner ?? s) as RawSocket;
}
