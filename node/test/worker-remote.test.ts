// The worker joining a remote parent (PROTOCOL.md 21), as a real process against a small fake
// parent on loopback: without WIREPOOL_FD and with WIREPOOL_TICKET (or WIREPOOL_TICKET_FILE) it
// connects over TCP + TLS 1.3 offering ALPN wirepool/1, pins the parent's certificate by the
// ticket's fingerprint, sends the 64-byte JOIN block, then its HELLO; it pings its parent and
// exits when the parent goes silent. Refusals (its own and the parent's) end it with status 1.
// Unit tests of the ticket's text form and of the heartbeat watch come first.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { createHash, X509Certificate } from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, describe, mock, test } from "node:test";
import tls from "node:tls";
import { inspect } from "node:util";
import { CodecId, Connection, type ConnectionEvent, encodeFrames, ErrorCode, FrameType, Remote } from "../src/proto/index.js";
import { connectToParent, isLoopback, JoinRefused, ParentWatch, parseTicket, TicketError, ticketFromEnv } from "../src/worker/remote.js";
import { REPO } from "./vectors.js";

const WAIT_MS = 15_000;
const SDK = new URL("../src/index.js", import.meta.url).href;
const WORKER = `
import { Worker } from ${JSON.stringify(SDK)};
const w = new Worker();
w.method("env", () => ({
  fd: process.env.WIREPOOL_FD ?? null,
  ticket: process.env.WIREPOOL_TICKET ?? null,
  file: process.env.WIREPOOL_TICKET_FILE ?? null,
  pid: process.pid,
}));
w.method("echo", (b) => b, { codecs: ["raw"] });
await w.serve();
`;

// A self-signed test certificate (P-256, CN "wirepool test parent", valid until 2125), for the
// fake parent only. Its fingerprint is what tickets pin.
const FIXTURES = path.join(REPO, "node", "test", "fixtures");
const CERT = fs.readFileSync(path.join(FIXTURES, "remote-parent.cert.pem"));
const KEY = fs.readFileSync(path.join(FIXTURES, "remote-parent.key.pem"));
const FINGERPRINT = createHash("sha256").update(new X509Certificate(CERT).raw).digest();

const ID = Buffer.from("00112233445566778899aabbccddeeff", "hex");
const SECRET = Buffer.alloc(32, 0x5a);

interface TicketFields {
  v?: unknown;
  host?: unknown;
  port?: unknown;
  tls?: unknown;
  fingerprint?: unknown;
  id?: unknown;
  secret?: unknown;
  expires?: unknown;
  [extra: string]: unknown;
}

/** A ticket's text form (21.2), as a parent SDK writes it. */
function ticketText(fields: TicketFields): string {
  const doc: TicketFields = {
    v: 1,
    host: "127.0.0.1",
    port: 1,
    tls: true,
    fingerprint: `sha256:${FINGERPRINT.toString("hex")}`,
    id: ID.toString("hex"),
    secret: SECRET.toString("hex"),
    expires: Math.floor(Date.now() / 1000) + 3600,
    ...fields,
  };
  for (const k of Object.keys(doc)) if (doc[k] === undefined) delete doc[k];
  return Remote.ticketPrefix + Buffer.from(JSON.stringify(doc)).toString("base64url");
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "wirepool-node-remote-"));
const children: ChildProcess[] = [];
const servers: net.Server[] = [];
after(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  for (const s of servers) s.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** Waits for a condition re-checked whenever `notify()` is called, within WAIT_MS. */
class Waiter {
  private wakers = new Set<() => void>();

  notify(): void {
    for (const w of [...this.wakers]) w();
  }

  async until<T>(what: string, pred: () => T | undefined | false, ms = WAIT_MS): Promise<T> {
    const deadline = Date.now() + ms;
    for (;;) {
      const v = pred();
      if (v !== undefined && v !== false) return v;
      if (Date.now() >= deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise<void>((resolve) => {
        const done = (): void => {
          clearTimeout(t);
          this.wakers.delete(done);
          resolve();
        };
        const t = setTimeout(done, deadline - Date.now());
        this.wakers.add(done);
      });
    }
  }
}

/** One connection at the fake parent: the bytes before the JOIN block's end, then the parent core. */
class Accepted {
  readonly conn = new Connection("parent");
  readonly events: ConnectionEvent[] = [];
  readonly alpn: string | false;
  readonly protocol: string | null;
  bytes = 0;
  join: Buffer | null = null;
  ended = false;
  private pending = Buffer.alloc(0);

  constructor(
    readonly sock: net.Socket,
    private readonly parent: FakeParent,
  ) {
    const t = sock as tls.TLSSocket;
    this.alpn = typeof t.alpnProtocol === "string" ? t.alpnProtocol : false;
    this.protocol = typeof t.getProtocol === "function" ? t.getProtocol() : null;
    sock.on("data", (chunk: Buffer) => this.onData(chunk));
    sock.on("end", () => {
      this.ended = true;
      parent.waiter.notify();
    });
    sock.on("close", () => {
      this.ended = true;
      parent.waiter.notify();
    });
    sock.on("error", () => {});
  }

  private onData(chunk: Buffer): void {
    this.bytes += chunk.length;
    let data = chunk;
    if (this.join === null) {
      this.pending = Buffer.concat([this.pending, chunk]);
      if (this.pending.length < Remote.joinBytes) return this.parent.waiter.notify();
      this.join = this.pending.subarray(0, Remote.joinBytes);
      data = this.pending.subarray(Remote.joinBytes);
      if (this.parent.refuse !== null) {
        const [code, message] = this.parent.refuse;
        this.sock.end(encodeFrames([{ type: FrameType.ERROR, id: 0, more: false, code, message, details: "" }]));
        return this.parent.waiter.notify();
      }
    }
    if (data.length > 0) this.conn.receive(data);
    for (let ev = this.conn.nextEvent(); ev !== null; ev = this.conn.nextEvent()) {
      if (ev.type === FrameType.HELLO) {
        this.conn.sendWelcome({ version: 1, workerId: 1, maxFrameSize: 65536, initialCredit: 1 << 20, heartbeatMs: this.parent.heartbeatMs, maxInFlight: 8, maxMessageSize: 64 << 20 });
      } else if (ev.type === FrameType.PING && this.parent.answerPings) {
        this.conn.sendPong(ev.nonce);
      }
      this.events.push(ev);
    }
    this.flush();
    this.parent.waiter.notify();
  }

  flush(): void {
    if (this.conn.outputLength() > 0) this.sock.write(Buffer.concat(this.conn.takeOutput()));
  }

  pings(): number {
    return this.events.filter((e) => e.type === FrameType.PING).length;
  }

  async call(method: number, codec: number, body: Buffer): Promise<ConnectionEvent> {
    const id = this.conn.sendRequest(method, codec, 0, body);
    this.flush();
    return this.parent.waiter.until("the result", () => this.events.find((e) => e.id === id && (e.type === FrameType.RESULT || e.type === FrameType.ERROR)));
  }
}

interface ParentOptions {
  tls?: boolean;
  heartbeatMs?: number;
  tlsOptions?: tls.TlsOptions;
}

/** A listener on loopback that accepts workers the way a parent SDK does, and records what they send. */
class FakeParent {
  readonly waiter = new Waiter();
  readonly accepted: Accepted[] = [];
  readonly server: net.Server;
  /** Connections the TLS layer refused (handshake failures), counted. */
  tlsErrors = 0;
  answerPings = true;
  refuse: [number, string] | null = null;
  readonly heartbeatMs: number;

  constructor(options: ParentOptions = {}) {
    this.heartbeatMs = options.heartbeatMs ?? 0;
    const take = (s: net.Socket): void => {
      this.accepted.push(new Accepted(s, this));
      this.waiter.notify();
    };
    if (options.tls ?? true) {
      const server = tls.createServer({ cert: CERT, key: KEY, minVersion: "TLSv1.3", ALPNProtocols: [Remote.alpn], ...options.tlsOptions }, take);
      server.on("tlsClientError", () => {
        this.tlsErrors++;
        this.waiter.notify();
      });
      this.server = server;
    } else {
      this.server = net.createServer(take);
    }
    servers.push(this.server);
  }

  async listen(): Promise<number> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    return (this.server.address() as net.AddressInfo).port;
  }

  /** The first connection once its worker said HELLO and got its WELCOME. */
  async joined(): Promise<Accepted> {
    return this.waiter.until("a worker's HELLO", () => this.accepted.find((a) => a.conn.isOpen()));
  }
}

interface Started {
  child: ChildProcess;
  stderr: () => string;
  exit: Promise<number | string>;
}

function startWorker(env: Record<string, string>): Started {
  const base = { ...process.env };
  delete base.WIREPOOL_FD;
  delete base.WIREPOOL_TICKET;
  delete base.WIREPOOL_TICKET_FILE;
  const child = spawn(process.execPath, ["--input-type=module", "-e", WORKER], { stdio: ["ignore", "inherit", "pipe"], env: { ...base, ...env } });
  children.push(child);
  let err = "";
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  const exit = new Promise<number | string>((resolve) => child.once("exit", (code, signal) => resolve(code ?? signal!)));
  return { child, stderr: () => err, exit };
}

async function exitWithin(w: Started, ms = WAIT_MS): Promise<number | string> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`the worker did not exit within ${ms} ms; stderr: ${w.stderr()}`)), ms)));
  try {
    return await Promise.race([w.exit, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

// ---------------------------------------------------------------------------------------------

describe("join tickets (21.2)", () => {
  test("a parent SDK's ticket is read field by field; unknown fields are ignored", () => {
    const t = parseTicket(`  ${ticketText({ port: 7700, expires: 2_000_000_000, later: { x: 1 } })}\n`);
    assert.equal(t.host, "127.0.0.1");
    assert.equal(t.port, 7700);
    assert.equal(t.tls, true);
    assert.deepEqual(t.fingerprint, FINGERPRINT);
    assert.deepEqual(t.id, ID);
    assert.equal(t.expires, 2_000_000_000);
    assert.equal(t.name, ID.toString("hex"));
    const block = t.joinBlock();
    assert.equal(block.length, 64);
    assert.equal(block.subarray(0, 8).toString("latin1"), "WIREJOIN");
    assert.equal(block.readUInt16LE(8), 1);
    assert.deepEqual(block.subarray(10, 16), Buffer.alloc(6));
    assert.deepEqual(block.subarray(16, 32), ID);
    assert.deepEqual(block.subarray(32), SECRET);
  });

  test("the secret never shows in inspect or JSON", () => {
    const t = parseTicket(ticketText({}));
    const hex = SECRET.toString("hex");
    assert.ok(!inspect(t).includes(hex) && !inspect(t).includes("5a5a5a"), inspect(t));
    assert.ok(!JSON.stringify(t).includes(hex), JSON.stringify(t));
    assert.ok(inspect(t).includes(ID.toString("hex")));
  });

  test("a plain ticket only for a loopback address", () => {
    for (const host of ["127.0.0.1", "127.8.9.10", "localhost", "::1", "[::1]", "0:0:0:0:0:0:0:1"]) {
      assert.ok(isLoopback(host), host);
      assert.equal(parseTicket(ticketText({ host, tls: false, fingerprint: undefined })).tls, false);
    }
    for (const host of ["10.0.0.7", "example.com", "::2", "::ffff:127.0.0.1", "128.0.0.1", "localhost.example"]) {
      assert.ok(!isLoopback(host), host);
      assert.throws(() => parseTicket(ticketText({ host, tls: false, fingerprint: undefined })), /loopback only/);
    }
  });

  test("every malformed field makes the ticket unusable, saying which", () => {
    const bad: [string, RegExp][] = [
      ["not a ticket", /not a wirepool ticket/],
      [`${Remote.ticketPrefix}!!!`, /not base64url JSON/],
      [`${Remote.ticketPrefix}${Buffer.from("[1]").toString("base64url")}`, /not a JSON object/],
      [`${Remote.ticketPrefix}${Buffer.from([0xff, 0xfe, 0x7b, 0x7d]).toString("base64url")}`, /not base64url JSON/],
      [`${Remote.ticketPrefix}${"A".repeat(Remote.ticketMaxChars)}`, /at most 4096 characters/],
      [ticketText({ v: 2 }), /version 2 is not supported/],
      [ticketText({ v: undefined }), /version null is not supported/],
      [ticketText({ host: 7 }), /'host' must be a string/],
      [ticketText({ host: "" }), /1-253 bytes/],
      [ticketText({ host: "h".repeat(254) }), /1-253 bytes/],
      [ticketText({ port: "7700" }), /'port' must be an integer/],
      [ticketText({ port: 1.5 }), /'port' must be an integer/],
      [ticketText({ port: 0 }), /1-65535/],
      [ticketText({ port: 65536 }), /1-65535/],
      [ticketText({ tls: "yes" }), /'tls' must be true or false/],
      [ticketText({ expires: "soon" }), /'expires' must be an integer/],
      [ticketText({ fingerprint: undefined }), /'fingerprint' must be 'sha256:'/],
      [ticketText({ fingerprint: FINGERPRINT.toString("hex") }), /'fingerprint' must be 'sha256:'/],
      [ticketText({ fingerprint: `sha256:${FINGERPRINT.toString("hex").toUpperCase()}` }), /'fingerprint' must be 64 lowercase hex/],
      [ticketText({ fingerprint: "sha256:abcd" }), /'fingerprint' must be 64 lowercase hex/],
      [ticketText({ id: "00" }), /'id' must be 32 lowercase hex/],
      [ticketText({ id: undefined }), /'id' must be 32 lowercase hex/],
      [ticketText({ secret: "zz".repeat(32) }), /'secret' must be 64 lowercase hex/],
    ];
    for (const [text, why] of bad) assert.throws(() => parseTicket(text), (e: unknown) => e instanceof TicketError && why.test(e.message), text.slice(0, 60));
  });

  test("from the environment: the text wins over the file, both variables are removed", () => {
    const file = path.join(dir, "ticket");
    fs.writeFileSync(file, `\n${ticketText({ port: 9 })}\n`);
    const env: NodeJS.ProcessEnv = { WIREPOOL_TICKET_FILE: file, OTHER: "x" };
    assert.equal(ticketFromEnv(env)!.port, 9);
    assert.deepEqual(env, { OTHER: "x" });
    const both: NodeJS.ProcessEnv = { WIREPOOL_TICKET: ticketText({ port: 10 }), WIREPOOL_TICKET_FILE: file };
    assert.equal(ticketFromEnv(both)!.port, 10);
    assert.deepEqual(both, {});
    assert.equal(ticketFromEnv({}), null);
    assert.throws(() => ticketFromEnv({ WIREPOOL_TICKET_FILE: path.join(dir, "missing") }), /cannot read WIREPOOL_TICKET_FILE/);
  });
});

describe("the parent watch (21.5)", { timeout: 20_000 }, () => {
  test("no WELCOME within its bound: the parent is gone", async () => {
    const why = await new Promise<string>((resolve) => new ParentWatch(() => {}, resolve, 30).connected());
    assert.match(why, /no WELCOME within 0.03s/);
  });

  test("the welcome timer runs from the TCP connect (21.5), not from before connecting", () => {
    mock.timers.enable({ apis: ["setTimeout"] });
    try {
      const gone: string[] = [];
      const watch = new ParentWatch(() => {}, (why) => gone.push(why), 30);
      mock.timers.tick(10_000); // a slow connect: no verdict before it completes
      assert.deepEqual(gone, []);
      watch.connected();
      mock.timers.tick(29);
      assert.deepEqual(gone, []);
      mock.timers.tick(1);
      assert.equal(gone.length, 1);
      assert.match(gone[0], /no WELCOME within 0.03s of connecting/);
      // A WELCOME in time stops it.
      const later: string[] = [];
      const w2 = new ParentWatch(() => {}, (why) => later.push(why), 30);
      w2.connected();
      mock.timers.tick(20);
      w2.welcome(60_000);
      mock.timers.tick(1_000);
      assert.deepEqual(later, []);
      w2.close();
    } finally {
      mock.timers.reset();
    }
  });

  test("connectToParent reports the TCP connect before the TLS handshake (where the welcome timer starts)", async () => {
    // A listener that accepts and never answers the ClientHello.
    const held: net.Socket[] = [];
    const server = net.createServer((s) => held.push(s));
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as net.AddressInfo).port;
    let onConnect: () => void = () => {};
    const connected = new Promise<void>((r) => (onConnect = r));
    let calls = 0;
    const joining = connectToParent(parseTicket(ticketText({ port })), {
      timeoutMs: WAIT_MS,
      onConnect: () => {
        calls++;
        onConnect();
      },
    });
    const refused = assert.rejects(joining, JoinRefused);
    await connected; // the handshake has not happened: the server never spoke
    assert.equal(calls, 1);
    for (const s of held) s.destroy();
    await refused;
    assert.equal(calls, 1);
    server.close();
  });

  test("PINGs every period; a PONG answers its PING and the earlier ones; silence for 3 periods ends it", async () => {
    const sent: bigint[] = [];
    let answer = true;
    const started = Date.now();
    const why = await new Promise<string>((resolve) => {
      const watch = new ParentWatch(
        (nonce) => {
          const n = nonce.readBigUInt64LE(0);
          sent.push(n);
          // Answer every other PING, the later one covering both; unknown nonces are ignored.
          if (answer && n % 2n === 0n) {
            watch.pong(Buffer.alloc(8, 0xff));
            watch.pong(nonce);
          }
          if (n === 6n) answer = false;
        },
        resolve,
      );
      watch.welcome(20);
    });
    const elapsed = Date.now() - started;
    assert.match(why, /no PONG from the parent for 0\.\d+s \(heartbeat 20 ms\)/);
    assert.deepEqual(sent.slice(0, 6), [1n, 2n, 3n, 4n, 5n, 6n]);
    // 6 answered periods, then 3 silent ones (checked every quarter period): ~180 ms at the least.
    assert.ok(elapsed >= 5 * 20 + 3 * 20, `gave up after ${elapsed} ms`);
  });

  test("WELCOME's heartbeat 0 means the remote default, 1,000 ms", async () => {
    const sent: number[] = [];
    const watch = new ParentWatch(() => sent.push(Date.now()), () => {});
    watch.welcome(0);
    assert.equal(sent.length, 1); // the first PING at once
    watch.close();
    assert.equal(Remote.remoteHeartbeatMs, 1000);
  });
});

describe("a remote worker process", { timeout: 120_000 }, () => {
  test("joins over TLS 1.3 with ALPN wirepool/1: JOIN block, then HELLO; serves; drops the ticket from its environment; exits 0 at end of file", async () => {
    const parent = new FakeParent();
    const port = await parent.listen();
    const w = startWorker({ WIREPOOL_TICKET: ticketText({ port }) });
    const a = await parent.joined();
    assert.equal(a.protocol, "TLSv1.3");
    assert.equal(a.alpn, Remote.alpn);
    assert.deepEqual(a.join, parseTicket(ticketText({ port })).joinBlock());
    assert.equal(a.conn.hello()!.pid, w.child.pid);
    const env = await a.call(0, CodecId.JSON, Buffer.from("null"));
    assert.ok(env.type === FrameType.RESULT);
    assert.deepEqual(JSON.parse(env.body.toString()), { fd: null, ticket: null, file: null, pid: w.child.pid });
    // 3 MiB each way: continued messages in 64 KiB frames, many TLS records.
    const big = Buffer.alloc(3 << 20);
    for (let i = 0; i < big.length; i += 4096) big.writeUInt32LE(i, i);
    const echo = await a.call(1, CodecId.RAW, big);
    assert.ok(echo.type === FrameType.RESULT);
    assert.ok(Buffer.compare(echo.body, big) === 0, "the echo differs");
    a.sock.end();
    assert.equal(await exitWithin(w), 0, w.stderr());
  });

  test("WIREPOOL_TICKET_FILE: the same join from a file", async () => {
    const parent = new FakeParent();
    const port = await parent.listen();
    const file = path.join(dir, "ticket-file");
    fs.writeFileSync(file, `${ticketText({ port })}\n`, { mode: 0o600 });
    const w = startWorker({ WIREPOOL_TICKET_FILE: file });
    const a = await parent.joined();
    const env = await a.call(0, CodecId.JSON, Buffer.from("null"));
    assert.ok(env.type === FrameType.RESULT);
    assert.deepEqual(JSON.parse(env.body.toString()).file, null);
    a.sock.end();
    assert.equal(await exitWithin(w), 0, w.stderr());
  });

  test("pings its parent at the WELCOME's heartbeat, stays while answered, exits 0 once the parent goes silent", async () => {
    const heartbeat = 100;
    const parent = new FakeParent({ heartbeatMs: heartbeat });
    const port = await parent.listen();
    const w = startWorker({ WIREPOOL_TICKET: ticketText({ port }) });
    const a = await parent.joined();
    await parent.waiter.until("5 PINGs", () => a.pings() >= 5);
    assert.equal(w.child.exitCode, null, "the worker left while its parent answered");
    const nonces = a.events.filter((e) => e.type === FrameType.PING).map((e) => (e.type === FrameType.PING ? e.nonce.readBigUInt64LE(0) : 0n));
    assert.deepEqual(nonces.slice(0, 5), [1n, 2n, 3n, 4n, 5n]);
    parent.answerPings = false;
    const silent = Date.now();
    assert.equal(await exitWithin(w), 0, w.stderr());
    const elapsed = Date.now() - silent;
    assert.match(w.stderr(), /the parent is gone: no PONG from the parent for [\d.]+s \(heartbeat 100 ms\); exiting/);
    // Three periods after the oldest unanswered PING, checked every quarter period; slack for a loaded machine.
    assert.ok(elapsed >= 2 * heartbeat && elapsed < 4.25 * heartbeat + 5000, `exited ${elapsed} ms after the parent went silent`);
    await parent.waiter.until("the worker's close", () => a.ended);
  });

  test("a certificate that is not the ticket's: nothing is sent, exit 1 naming both fingerprints", async () => {
    const parent = new FakeParent();
    const port = await parent.listen();
    const other = Buffer.alloc(32, 0x11);
    const w = startWorker({ WIREPOOL_TICKET: ticketText({ port, fingerprint: `sha256:${other.toString("hex")}` }) });
    assert.equal(await exitWithin(w), 1, w.stderr());
    assert.ok(w.stderr().includes(`not the ticket's sha256:${other.toString("hex")}`), w.stderr());
    assert.ok(w.stderr().includes(`sha256:${FINGERPRINT.toString("hex")}`), w.stderr());
    // The worker saw the certificate, then closed without a byte of its own (the server may see
    // the handshake complete or cut, depending on when the close reached it).
    await parent.waiter.until("the worker's close", () => parent.tlsErrors > 0 || (parent.accepted.length === 1 && parent.accepted[0].ended));
    assert.ok(parent.accepted.every((a) => a.bytes === 0 && a.join === null));
  });

  test("the parent's refusal (ERROR id 0 'join refused') ends the worker with status 1, saying so", async () => {
    const parent = new FakeParent();
    parent.refuse = [ErrorCode.BAD_HANDSHAKE, "join refused"];
    const port = await parent.listen();
    const w = startWorker({ WIREPOOL_TICKET: ticketText({ port }) });
    assert.equal(await exitWithin(w), 1, w.stderr());
    assert.match(w.stderr(), /join refused/);
    assert.ok(parent.accepted[0].join !== null, "the JOIN block arrived before the refusal");
  });

  test("an expired ticket: exit 1 before connecting", async () => {
    const parent = new FakeParent();
    const port = await parent.listen();
    const w = startWorker({ WIREPOOL_TICKET: ticketText({ port, expires: Math.floor(Date.now() / 1000) - 10 }) });
    assert.equal(await exitWithin(w), 1, w.stderr());
    assert.match(w.stderr(), new RegExp(`ticket ${ID.toString("hex")} expired at \\d+`));
    assert.equal(parent.accepted.length + parent.tlsErrors, 0);
  });

  test("an unusable ticket or an unreachable parent: exit 1 saying why", async () => {
    const plain = startWorker({ WIREPOOL_TICKET: ticketText({ host: "10.0.0.7", tls: false, fingerprint: undefined }) });
    assert.equal(await exitWithin(plain), 1);
    assert.match(plain.stderr(), /wirepool worker: plain TCP \(tls false\) is allowed on loopback only/);
    // A port nobody listens on (listened on, then closed).
    const gone = new FakeParent();
    const port = await gone.listen();
    await new Promise<void>((resolve) => gone.server.close(() => resolve()));
    const w = startWorker({ WIREPOOL_TICKET: ticketText({ port }) });
    assert.equal(await exitWithin(w), 1);
    assert.match(w.stderr(), new RegExp(`could not connect to 127.0.0.1:${port}`));
  });

  test("a parent that offers TLS 1.2 only, or no ALPN wirepool/1, is refused before the JOIN block", async () => {
    const old = new FakeParent({ tlsOptions: { minVersion: "TLSv1.2", maxVersion: "TLSv1.2" } });
    const oldPort = await old.listen();
    const w1 = startWorker({ WIREPOOL_TICKET: ticketText({ port: oldPort }) });
    assert.equal(await exitWithin(w1), 1, w1.stderr());
    assert.match(w1.stderr(), /could not connect/);
    assert.ok(old.accepted.every((a) => a.join === null));
    // A server without ALPN completes the handshake without selecting one: the worker's own check.
    const noAlpn = new FakeParent({ tlsOptions: { ALPNProtocols: undefined } });
    const port = await noAlpn.listen();
    const w2 = startWorker({ WIREPOOL_TICKET: ticketText({ port }) });
    assert.equal(await exitWithin(w2), 1, w2.stderr());
    assert.match(w2.stderr(), /did not select ALPN wirepool\/1: not joining/);
    assert.ok(noAlpn.accepted.every((a) => a.join === null && a.bytes === 0));
  });

  test("plain TCP on loopback when the ticket says tls false", async () => {
    const parent = new FakeParent({ tls: false });
    const port = await parent.listen();
    const w = startWorker({ WIREPOOL_TICKET: ticketText({ port, tls: false, fingerprint: undefined }) });
    const a = await parent.joined();
    assert.deepEqual(a.join, parseTicket(ticketText({ port, tls: false, fingerprint: undefined })).joinBlock());
    const echo = await a.call(1, CodecId.RAW, Buffer.from("over plain tcp"));
    assert.ok(echo.type === FrameType.RESULT && echo.body.toString() === "over plain tcp");
    a.sock.end();
    assert.equal(await exitWithin(w), 0, w.stderr());
  });
});
