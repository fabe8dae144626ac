/**
 * Remote workers (PROTOCOL.md section 21): the join ticket, the connection back to the parent
 * (TCP, TLS 1.3 with the parent's certificate pinned by the ticket's fingerprint, the JOIN block
 * before HELLO) and the worker's watch on a parent that may go silent (21.5). From HELLO on the
 * worker driver is the one of the inherited socket: {@link Worker.serve} joins by itself when it
 * is started with `WIREPOOL_TICKET` (or `WIREPOOL_TICKET_FILE`) instead of `WIREPOOL_FD`.
 * @module
 */

import { createHash, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import net from "node:net";
import { performance } from "node:perf_hooks";
import tls from "node:tls";
import { inspect } from "node:util";
import { Remote } from "../proto/constants.js";
import { Liveness } from "../proto/liveness.js";

/** The environment variable holding a join ticket's text (21.2), read when `WIREPOOL_FD` is absent. */
export const TICKET_ENV = "WIREPOOL_TICKET";
/** The environment variable naming a file that holds the ticket (when `WIREPOOL_TICKET` is unset). */
export const TICKET_FILE_ENV = "WIREPOOL_TICKET_FILE";

/** TCP connect, then the TLS handshake, bounded by the parent's `join_timeout` default (21.4). */
const CONNECT_TIMEOUT_MS = Remote.joinTimeoutMs;
const ID_BYTES = 16;
const SECRET_BYTES = 32;
const FINGERPRINT_BYTES = 32;
/** A file is read up to this many bytes: a ticket and some whitespace. */
const TICKET_FILE_MAX_BYTES = Remote.ticketMaxChars + 64;

/** A ticket that cannot be used: malformed, of another version, or unsafe (plain TCP to a non-loopback address). */
export class TicketError extends Error {
  override name = "TicketError";
}

/** The worker could not join: unreachable, not TLS 1.3, the wrong certificate, or an expired ticket. */
export class JoinRefused extends Error {
  override name = "JoinRefused";
}

/**
 * A join ticket (21.2): where to connect, whom to trust, what to prove. The secret is kept out of
 * `inspect`, `JSON.stringify` and messages: a ticket is named by its {@link Ticket.name | id}.
 */
export class Ticket {
  readonly #secret: Buffer;

  constructor(
    readonly host: string,
    readonly port: number,
    readonly tls: boolean,
    /** SHA-256 of the parent certificate's DER; present exactly when `tls`. */
    readonly fingerprint: Buffer | null,
    readonly id: Buffer,
    secret: Buffer,
    /** Unix time in seconds after which the parent refuses the ticket. */
    readonly expires: number,
  ) {
    this.#secret = secret;
  }

  /** The ticket's id in hex: how messages name it. */
  get name(): string {
    return this.id.toString("hex");
  }

  /** True once `expires` has passed (by this machine's clock). */
  expired(nowMs: number = Date.now()): boolean {
    return Math.floor(nowMs / 1000) > this.expires;
  }

  /** The 64 bytes a worker sends before its HELLO (21.3). */
  joinBlock(): Buffer {
    const block = Buffer.alloc(Remote.joinBytes);
    block.write(Remote.joinMagic, 0, "latin1");
    block.writeUInt16LE(Remote.joinVersion, 8);
    this.id.copy(block, 16);
    this.#secret.copy(block, 32);
    return block;
  }

  /** The text form (`wirepool-ticket-1.` + base64url JSON) {@link parseTicket} reads: a secret, never log it. */
  encode(): string {
    const doc: Record<string, unknown> = { v: 1, host: this.host, port: this.port, tls: this.tls };
    if (this.fingerprint !== null) doc.fingerprint = "sha256:" + this.fingerprint.toString("hex");
    doc.id = this.name;
    doc.secret = this.#secret.toString("hex");
    doc.expires = this.expires;
    return Remote.ticketPrefix + Buffer.from(JSON.stringify(doc), "utf8").toString("base64url");
  }

  /** Constant-time comparison with a JOIN block's secret (the parent's check, 21.4). */
  matches(secret: Buffer): boolean {
    return secret.length === SECRET_BYTES && timingSafeEqual(this.#secret, secret);
  }

  toJSON(): object {
    return { host: this.host, port: this.port, tls: this.tls, id: this.name, expires: this.expires };
  }

  [inspect.custom](): string {
    return `${this.constructor.name} { host: ${JSON.stringify(this.host)}, port: ${this.port}, tls: ${this.tls}, id: ${this.name}, expires: ${this.expires} }`;
  }
}

/** True for `localhost` and loopback IP literals (127.0.0.0/8, ::1), with or without brackets. */
export function isLoopback(host: string): boolean {
  if (host === "localhost") return true;
  const bare = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
  if (net.isIPv4(bare)) return bare.split(".")[0] === "127";
  if (net.isIPv6(bare)) {
    try {
      return new URL(`http://[${bare}]/`).hostname === "[::1]"; // the canonical form
    } catch {
      return false;
    }
  }
  return false;
}

function hexField(value: unknown, bytes: number, field: string): Buffer {
  if (typeof value !== "string" || !new RegExp(`^[0-9a-f]{${2 * bytes}}$`).test(value)) {
    throw new TicketError(`ticket field '${field}' must be ${2 * bytes} lowercase hex digits`);
  }
  return Buffer.from(value, "hex");
}

function integer(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value);
}

/** Reads a ticket's text form (21.2); {@link TicketError} says what is wrong with it. */
export function parseTicket(text: string): Ticket {
  text = text.trim();
  if (text.length > Remote.ticketMaxChars) throw new TicketError(`a ticket is at most ${Remote.ticketMaxChars} characters`);
  if (!text.startsWith(Remote.ticketPrefix)) throw new TicketError(`not a wirepool ticket (it must start with ${JSON.stringify(Remote.ticketPrefix)})`);
  const body = text.slice(Remote.ticketPrefix.length);
  // Buffer's base64url decoder skips what it does not know: the alphabet is checked first.
  const notBase64 = new TicketError("the ticket's body is not base64url JSON");
  if (!/^[A-Za-z0-9_-]*={0,2}$/.test(body) || body.replace(/=+$/, "").length % 4 === 1) throw notBase64;
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(Buffer.from(body, "base64url")));
  } catch {
    throw notBase64;
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) throw new TicketError("the ticket's body is not a JSON object");
  const d = doc as Record<string, unknown>;
  if (d.v !== 1) throw new TicketError(`ticket version ${JSON.stringify(d.v ?? null)} is not supported (1)`);
  const { host, port, tls: useTls, expires } = d;
  if (typeof host !== "string") throw new TicketError("ticket field 'host' must be a string");
  const hostBytes = Buffer.byteLength(host, "utf8");
  if (hostBytes < 1 || hostBytes > 253) throw new TicketError("ticket host must be 1-253 bytes");
  if (!integer(port)) throw new TicketError("ticket field 'port' must be an integer");
  if (port < 1 || port > 65535) throw new TicketError("ticket port must be 1-65535");
  if (typeof useTls !== "boolean") throw new TicketError("ticket field 'tls' must be true or false");
  if (!integer(expires)) throw new TicketError("ticket field 'expires' must be an integer (Unix seconds)");
  let fingerprint: Buffer | null = null;
  if (useTls) {
    const fp = d.fingerprint;
    if (typeof fp !== "string" || !fp.startsWith("sha256:")) throw new TicketError("ticket field 'fingerprint' must be 'sha256:' and 64 hex digits");
    fingerprint = hexField(fp.slice("sha256:".length), FINGERPRINT_BYTES, "fingerprint");
  } else if (!isLoopback(host)) {
    throw new TicketError(`plain TCP (tls false) is allowed on loopback only, not ${JSON.stringify(host)}`);
  }
  return new Ticket(host, port, useTls, fingerprint, hexField(d.id, ID_BYTES, "id"), hexField(d.secret, SECRET_BYTES, "secret"), expires);
}

/**
 * The ticket of a worker started without `WIREPOOL_FD`: `WIREPOOL_TICKET`, else the file named by
 * `WIREPOOL_TICKET_FILE`; null when neither is set. Both variables are removed, so that the
 * worker's own children never inherit the secret.
 * @throws TicketError for an unusable ticket or an unreadable file.
 */
export function ticketFromEnv(env: NodeJS.ProcessEnv = process.env): Ticket | null {
  const text = env[TICKET_ENV];
  const file = env[TICKET_FILE_ENV];
  delete env[TICKET_ENV];
  delete env[TICKET_FILE_ENV];
  if (text !== undefined) return parseTicket(text);
  if (file === undefined) return null;
  let content: string;
  try {
    const buf = readFileSync(file);
    content = buf.subarray(0, TICKET_FILE_MAX_BYTES).toString("utf8");
  } catch (e) {
    throw new TicketError(`cannot read ${TICKET_FILE_ENV} ${JSON.stringify(file)}: ${e instanceof Error ? e.message : String(e)}`);
  }
  return parseTicket(content);
}

/** Options of {@link connectToParent}. */
export interface ConnectOptions {
  /** Bound on the TCP connect and the TLS handshake together. Default 5,000 ms. */
  readonly timeoutMs?: number;
  /** Called once when the TCP connect completes, before the TLS handshake: the welcome timer starts there (21.5). */
  readonly onConnect?: () => void;
}

/**
 * Connects to the parent named by `ticket` and joins (21.1, 21.3): TCP; TLS 1.3 offering ALPN
 * `wirepool/1`; the parent's certificate accepted if and only if the SHA-256 of its DER is the
 * ticket's fingerprint (no CA, no host name: the handshake's CertificateVerify, which OpenSSL
 * checks against that certificate's key whatever the verify mode, proves the parent holds its
 * key); then the JOIN block. Nothing is written before the pin is checked, so a worker never
 * hands its secret to another server. The caller sends its HELLO next, at once.
 * @returns the connection, with the JOIN block written.
 * @throws JoinRefused saying why the join could not be made.
 */
export async function connectToParent(ticket: Ticket, options: ConnectOptions = {}): Promise<net.Socket> {
  if (ticket.expired()) throw new JoinRefused(`ticket ${ticket.name} expired at ${ticket.expires} (Unix time)`);
  const timeoutMs = options.timeoutMs ?? CONNECT_TIMEOUT_MS;
  const host = ticket.host.startsWith("[") && ticket.host.endsWith("]") ? ticket.host.slice(1, -1) : ticket.host;
  const where = `${ticket.host}:${ticket.port}`;
  const socket = await new Promise<net.Socket>((resolve, reject) => {
    let s: net.Socket;
    const fail = (why: string): void => {
      clearTimeout(timer);
      s.destroy();
      reject(new JoinRefused(why));
    };
    const timer = setTimeout(() => fail(`could not connect to ${where} within ${timeoutMs / 1000}s`), timeoutMs);
    let tcp = false;
    const connected = (): void => {
      if (tcp) return;
      tcp = true;
      options.onConnect?.();
    };
    if (ticket.tls) {
      const t = tls.connect({
        host,
        port: ticket.port,
        ALPNProtocols: [Remote.alpn],
        minVersion: "TLSv1.3",
        maxVersion: "TLSv1.3",
        // Trust comes from the pin below, checked before anything is sent: no CA, no host name.
        rejectUnauthorized: false,
        checkServerIdentity: () => undefined,
      });
      s = t;
      t.once("connect", connected); // the TCP connect, before the handshake
      t.once("secureConnect", () => {
        connected();
        const cert = t.getPeerCertificate(true);
        const der = cert !== null && typeof cert === "object" && Buffer.isBuffer(cert.raw) ? cert.raw : null;
        const seen = der === null ? Buffer.alloc(0) : createHash("sha256").update(der).digest();
        const expected = ticket.fingerprint!;
        if (seen.length !== expected.length || !timingSafeEqual(seen, expected)) {
          fail(
            `the parent at ${where} presented a certificate with fingerprint sha256:${seen.toString("hex")}, not the ticket's sha256:${expected.toString("hex")}: not joining`,
          );
          return;
        }
        if (t.getProtocol() !== "TLSv1.3") return fail(`the parent at ${where} negotiated ${t.getProtocol()}, not TLS 1.3: not joining`);
        if (t.alpnProtocol !== Remote.alpn) return fail(`the parent at ${where} did not select ALPN ${Remote.alpn}: not joining`);
        clearTimeout(timer);
        t.removeAllListeners("error");
        resolve(t);
      });
    } else {
      s = net.connect({ host, port: ticket.port });
      s.once("connect", () => {
        connected();
        clearTimeout(timer);
        s.removeAllListeners("error");
        resolve(s);
      });
    }
    s.once("error", (e: Error) => fail(`could not connect to ${where}: ${e.message}`));
  });
  socket.setNoDelay(true); // small frames (PONGs, results) go out at once
  socket.write(ticket.joinBlock());
  return socket;
}

/**
 * A remote worker's watch on its parent (21.5): the WELCOME must come within `welcomeTimeoutMs`
 * of the TCP connect (the timer starts at {@link ParentWatch.connected}); then a PING every `heartbeat_ms` of the WELCOME (1,000 when it says 0), and
 * when the oldest unanswered PING is 3 periods old the parent is gone: `gone(why)` is called once.
 * The verdict is the core's liveness judge ({@link Liveness}: the PONG clock, and no verdict
 * right after this worker's own event loop ran late). The driver calls
 * {@link ParentWatch.welcome} and {@link ParentWatch.pong} on those events.
 */
export class ParentWatch {
  private judge: Liveness | null = null;
  private periodMs = 0;
  private tickMs = 1;
  private closed = false;
  private timer: NodeJS.Timeout | null = null;
  private connectedYet = false;

  constructor(
    private readonly sendPing: (nonce: Buffer) => void,
    private readonly gone: (why: string) => void,
    private readonly welcomeTimeoutMs: number = Remote.welcomeTimeoutMs,
  ) {}

  /**
   * The TCP connect completed: the welcome timer starts now (21.5: `welcome_timeout` runs from
   * the TCP connect, so it covers the TLS handshake, the JOIN block and the HELLO, not the DNS
   * lookup or the connect, which `connect_timeout` bounds). Once; ignored after WELCOME or close.
   */
  connected(): void {
    if (this.closed || this.connectedYet || this.judge !== null) return;
    this.connectedYet = true;
    const ms = this.welcomeTimeoutMs;
    this.timer = setTimeout(() => this.fire(`no WELCOME within ${ms / 1000}s of connecting`), ms);
  }

  /** The WELCOME arrived: start pinging at its heartbeat. */
  welcome(heartbeatMs: number): void {
    if (this.closed) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.periodMs = heartbeatMs > 0 ? heartbeatMs : Remote.remoteHeartbeatMs;
    // Checked four times a period: the verdict comes at most a quarter period late; the first
    // PING leaves at once.
    const tickMs = Math.max(1, this.periodMs / 4);
    const now = performance.now();
    this.judge = new Liveness(this.periodMs, tickMs, now, now);
    this.tickMs = tickMs;
    this.tick();
  }

  /** A PONG answers its PING and every earlier one (the parent answers in order, 8.5). */
  pong(nonce: Uint8Array): void {
    this.judge?.pong(nonce);
  }

  /** Stops the watch (the connection ended). */
  close(): void {
    this.closed = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }

  private tick(): void {
    this.timer = null;
    const judge = this.judge;
    if (this.closed || judge === null) return;
    const t = judge.tick(performance.now());
    if (t.hung !== null) {
      this.fire(`no PONG from the parent for ${(t.hung.ms / 1000).toFixed(1)}s (heartbeat ${this.periodMs} ms)`);
      return;
    }
    if (t.ping !== null) this.sendPing(t.ping);
    this.timer = setTimeout(() => this.tick(), this.tickMs);
  }

  private fire(why: string): void {
    if (this.closed) return;
    this.close();
    this.gone(why);
  }
}
