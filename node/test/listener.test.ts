// The parent's listener for remote workers (src/parent/listener.ts, PROTOCOL.md 21.3-21.4): a
// real Node worker (test/parent-fixture.ts) and, when the repository's venv is there, a Python
// worker join over TLS 1.3 and pin the generated certificate; refused tickets (wrong secret,
// revoked, expired) make the worker exit 1; a peer that connects and never speaks is closed by
// the join timer; connections past maxPendingJoins are closed at accept; bad options are
// INVALID_ARGUMENT. Every test is bounded by its timeout and closes its listener and children.

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { once } from "node:events";
import { test } from "node:test";
import { ErrorCode, FrameType } from "../src/proto/constants.js";
import { Listener, type Joined, type JoinTicket } from "../src/parent/listener.js";
import { WirepoolError } from "../src/parent/errors.js";

const FIXTURE = new URL("./parent-fixture.js", import.meta.url).pathname;
const REPO = path.resolve(new URL("../../..", import.meta.url).pathname);
const VENV_PYTHON = path.join(REPO, ".venv/bin/python");
const PY_WORKER = path.join(REPO, "python/conformance/worker.py");
const RUST_WORKER = path.join(process.env.CARGO_TARGET_DIR ?? path.join(REPO, "rust/target"), "debug/conformance_worker");
const T = { timeout: 30_000 };

function startWorker(command: string[], ticket: string): { child: ChildProcess; exit: Promise<[number | null, string]>; stderr: () => string } {
  const env: NodeJS.ProcessEnv = { ...process.env, WIREPOOL_TICKET: ticket };
  delete env.WIREPOOL_FD;
  delete env.WIREPOOL_TICKET_FILE;
  const child = spawn(command[0]!, command.slice(1), { env, stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  child.stderr!.setEncoding("utf8").on("data", (d: string) => {
    if (err.length < 8192) err += d;
  });
  const exit = once(child, "exit").then(([code]) => [code as number | null, err] as [number | null, string]);
  return { child, exit, stderr: () => err };
}

/** Reads from a joined connection until a whole first frame is in; returns its type byte. */
async function firstFrameType(j: Joined): Promise<number> {
  let buf = j.head;
  const s = j.socket;
  while (buf.length < 4 || buf.length < 4 + buf.readUInt32LE(0)) {
    s.resume();
    const [chunk] = (await once(s, "data")) as [Buffer];
    s.pause();
    buf = Buffer.concat([buf, chunk]);
  }
  return buf[4]!;
}

async function withListener(opts: Parameters<typeof Listener.start>[0], body: (l: Listener) => Promise<void>): Promise<void> {
  const l = await Listener.start({ log: () => {}, ...opts });
  try {
    await body(l);
  } finally {
    await l.close();
  }
}

async function joinsAndSaysHello(command: string[]): Promise<void> {
  await withListener({}, async (l) => {
    const ticket = l.issue({ singleUse: true });
    const w = startWorker(command, ticket.encode());
    try {
      const j = await l.accept({ ticket, timeoutMs: 20_000 });
      assert.equal(await firstFrameType(j), FrameType.HELLO);
      assert.match(j.peer, /^127\.0\.0\.1:\d+$/);
      assert.equal(l.stats().joined, 1);
      assert.equal(l.stats().pending, 0);
      // Spent: a second join with it is refused.
      assert.equal(l.stats().tickets, 0);
      j.socket.destroy(); // end of file at the worker: it exits 0 (21.6)
      const [code] = await w.exit;
      assert.equal(code, 0, w.stderr());
    } finally {
      w.child.kill("SIGKILL");
    }
  });
}

test("a Node worker joins with a single-use ticket: TLS pinned, its HELLO follows the JOIN block", T, async () => {
  await joinsAndSaysHello([process.execPath, FIXTURE]);
});

test("a Python worker joins (its ssl module accepts the generated certificate)", { ...T, skip: existsSync(VENV_PYTHON) ? false : "no .venv" }, async () => {
  await joinsAndSaysHello([VENV_PYTHON, PY_WORKER]);
});

test("a Rust worker joins (rustls with its pinning verifier accepts the generated certificate)", { ...T, skip: existsSync(RUST_WORKER) ? false : "no Rust conformance worker built" }, async () => {
  await joinsAndSaysHello([RUST_WORKER]);
});

async function refused(how: (l: Listener, t: JoinTicket) => string, cause: string): Promise<void> {
  await withListener({}, async (l) => {
    const ticket = l.issue();
    const w = startWorker([process.execPath, FIXTURE], how(l, ticket));
    try {
      const [code, err] = await w.exit;
      assert.equal(code, 1, err);
      assert.match(err, /join refused/);
      assert.ok(!err.includes("    at "), err);
      const st = l.stats();
      assert.equal(st.joined, 0);
      assert.equal(st.refused, 1);
      assert.equal(st.refusedBy[cause], 1, JSON.stringify(st));
    } finally {
      w.child.kill("SIGKILL");
    }
  });
}

function withSecret(ticket: JoinTicket, secret: string): string {
  const body = JSON.parse(Buffer.from(ticket.encode().slice("wirepool-ticket-1.".length), "base64url").toString("utf8")) as Record<string, unknown>;
  body.secret = secret;
  return "wirepool-ticket-1." + Buffer.from(JSON.stringify(body)).toString("base64url");
}

test("a wrong secret is refused: join refused, the worker exits 1, counted as 'wrong secret'", T, async () => {
  await refused((_l, t) => withSecret(t, "ab".repeat(32)), "wrong secret");
});

test("a revoked ticket is refused as an unknown one", T, async () => {
  await refused((l, t) => {
    l.revoke(t);
    return t.encode();
  }, "unknown or revoked ticket");
});

test("a peer that connects and never speaks is closed by the join timer", T, async () => {
  await withListener({ joinTimeoutMs: 300 }, async (l) => {
    const s = net.connect(l.port, "127.0.0.1");
    s.on("error", () => {});
    await once(s, "connect");
    assert.equal(l.stats().pending, 1);
    const started = performance.now();
    await once(s, "close");
    const waited = performance.now() - started;
    assert.ok(waited >= 250 && waited < 5000, `closed after ${waited} ms`);
    const st = l.stats();
    assert.equal(st.refusedBy["join timeout"], 1, JSON.stringify(st));
    assert.equal(st.pending, 0);
  });
});

test("a worker that joins but finds no slot is refused 'pool full' at the hello timer", T, async () => {
  await withListener({ helloTimeoutMs: 1000 }, async (l) => {
    const ticket = l.issue();
    const w = startWorker([process.execPath, FIXTURE], ticket.encode());
    try {
      const [code, err] = await w.exit;
      assert.equal(code, 1, err);
      assert.match(err, /the pool is full/);
      assert.equal(l.stats().refusedBy["pool full"], 1, JSON.stringify(l.stats()));
    } finally {
      w.child.kill("SIGKILL");
    }
  });
});

test("connections past maxPendingJoins are closed at accept; plain garbage ends at once", T, async () => {
  await withListener({ maxPendingJoins: 1, joinTimeoutMs: 20_000 }, async (l) => {
    const first = net.connect(l.port, "127.0.0.1");
    first.on("error", () => {});
    await once(first, "connect");
    const second = net.connect(l.port, "127.0.0.1");
    second.on("error", () => {});
    await once(second, "close");
    assert.equal(l.stats().refusedBy["too many pending"], 1, JSON.stringify(l.stats()));
    first.write(Buffer.alloc(64, 0x41)); // not a TLS ClientHello
    await once(first, "close");
    assert.equal(l.stats().refusedBy["tls handshake failed"], 1, JSON.stringify(l.stats()));
    assert.equal(l.stats().pending, 0);
  });
});

test("plain TCP: a JOIN block with a bad magic is closed without a word", T, async () => {
  await withListener({ tls: false }, async (l) => {
    const s = net.connect(l.port, "127.0.0.1");
    s.on("error", () => {});
    await once(s, "connect");
    let got = 0;
    s.on("data", (d: Buffer) => (got += d.length));
    s.write(Buffer.alloc(64, 0x42));
    await once(s, "close");
    assert.equal(got, 0);
    assert.equal(l.stats().refusedBy["bad magic"], 1);
  });
});

test("accept rejects with STARTUP_TIMEOUT when nobody joins, POOL_CLOSED after close", T, async () => {
  const l = await Listener.start({ log: () => {} });
  await assert.rejects(l.accept({ timeoutMs: 50 }), (e: unknown) => e instanceof WirepoolError && e.code === ErrorCode.STARTUP_TIMEOUT);
  const waiting = l.accept({ timeoutMs: 20_000 });
  await l.close();
  await assert.rejects(waiting, (e: unknown) => e instanceof WirepoolError && e.code === ErrorCode.POOL_CLOSED);
});

test("bad options are INVALID_ARGUMENT at start; plain TCP off loopback is refused", T, async () => {
  const bad: Parameters<typeof Listener.start>[0][] = [
    { joinTimeoutMs: -1 },
    { helloTimeoutMs: Number.NaN },
    { maxPendingJoins: 0 },
    { port: 70000 },
    { tls: false, host: "0.0.0.0" },
    { host: "" },
  ];
  for (const o of bad) {
    await assert.rejects(Listener.start(o), (e: unknown) => e instanceof WirepoolError && e.code === ErrorCode.INVALID_ARGUMENT, JSON.stringify(o));
  }
  await withListener({}, async (l) => {
    assert.throws(() => l.issue({ ttlS: 0 }), (e: unknown) => e instanceof WirepoolError && e.code === ErrorCode.INVALID_ARGUMENT);
    const t = l.issue();
    assert.ok(!JSON.stringify(t).includes("secret"));
    assert.match(t.encode(), /^wirepool-ticket-1\.[A-Za-z0-9_-]+$/);
  });
});
