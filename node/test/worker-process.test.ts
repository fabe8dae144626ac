// The worker as a real process on an inherited socket (PROTOCOL.md 1 and 8.4): WIREPOOL_FD is
// taken and removed from the environment, and the exit statuses are the spec's (EOF 0, GOODBYE 0,
// a protocol error 1), including when the parent dies while the connection stays open.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, describe, test } from "node:test";
import { CodecId, Connection, type ConnectionEvent, FrameType } from "../src/proto/index.js";

const WAIT_MS = 10_000;
const SDK = new URL("../src/index.js", import.meta.url).href;
const WORKER = `
import { Worker } from ${JSON.stringify(SDK)};
const w = new Worker();
w.method("env", () => ({ fd: process.env.WIREPOOL_FD ?? null, pid: process.pid }));
w.method("wait", () => new Promise(() => {}));
w.stream("flood", async function* () {
  const row = "x".repeat(1000);
  for (let i = 0; ; i++) {
    if (i === 1800) process.stderr.write("filled\\n"); // ~1.8 MiB of rows queued for the parent
    yield row;
  }
});
await w.serve();
`;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "wirepool-node-worker-"));
const children: ChildProcess[] = [];
after(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  fs.rmSync(dir, { recursive: true, force: true });
});

/** A connected pair of Unix sockets (Node has no socketpair): ours, and the one to hand down. */
async function socketPair(): Promise<[net.Socket, net.Socket]> {
  const p = path.join(dir, `s${Math.random().toString(36).slice(2)}`);
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(p, resolve));
  const ours = net.connect(p);
  const [theirs] = await Promise.all([
    new Promise<net.Socket>((resolve) => server.once("connection", resolve)),
    new Promise((resolve) => ours.once("connect", resolve)),
  ]);
  server.close();
  return [ours, theirs];
}

/** The parent side: the core on our socket, answering HELLO, recording events. */
class Peer {
  readonly conn = new Connection("parent");
  readonly events: ConnectionEvent[] = [];
  ended = false;
  /** Read one chunk, then pause until the test resumes the socket (a slow consumer). */
  trickle = false;
  private wake: () => void = () => {};

  constructor(readonly sock: net.Socket, readonly initialCredit = 65536) {
    sock.on("data", (chunk: Buffer) => {
      this.conn.receive(chunk);
      for (let ev = this.conn.nextEvent(); ev !== null; ev = this.conn.nextEvent()) {
        if (ev.type === FrameType.HELLO) {
          this.conn.sendWelcome({ version: 1, workerId: 1, maxFrameSize: 65536, initialCredit: this.initialCredit, heartbeatMs: 0, maxInFlight: 4, maxMessageSize: 1 << 20 });
        }
        this.events.push(ev);
      }
      this.flush();
      if (this.trickle) sock.pause();
      this.wake();
    });
    sock.on("end", () => {
      this.ended = true;
      this.wake();
    });
    sock.on("error", () => {});
  }

  flush(): void {
    if (this.conn.outputLength() > 0) this.sock.write(Buffer.concat(this.conn.takeOutput()));
  }

  async until<T>(what: string, pred: () => T | undefined | false): Promise<T> {
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      const v = pred();
      if (v !== undefined && v !== false) return v;
      if (Date.now() >= deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, deadline - Date.now());
        this.wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
  }
}

function alive(pid: number): boolean {
  try {
    return fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1][0] !== "Z";
  } catch {
    return false;
  }
}

function exitOf(child: ChildProcess): Promise<number | string> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve(child.exitCode ?? child.signalCode!);
    else child.once("exit", (code, signal) => resolve(code ?? signal!));
  });
}

async function startWorker(initialCredit?: number): Promise<{ peer: Peer; child: ChildProcess }> {
  const [ours, theirs] = await socketPair();
  const child = spawn(process.execPath, ["--input-type=module", "-e", WORKER], {
    stdio: ["ignore", "inherit", "pipe", theirs],
    env: { ...process.env, WIREPOOL_FD: "3" },
  });
  children.push(child);
  theirs.destroy(); // the parent closes its copy of the worker's end (section 1)
  child.stderr!.on("data", (d: Buffer) => {
    if (d.includes("filled")) child.emit("filled");
    else process.stderr.write(d);
  });
  const peer = new Peer(ours, initialCredit);
  await peer.until("the handshake", () => peer.conn.isOpen());
  return { peer, child };
}

describe("worker process", { timeout: 60_000 }, () => {
  test("serves on WIREPOOL_FD, removes it from the environment, exits 0 at end of file", async () => {
    const { peer, child } = await startWorker();
    assert.equal(peer.conn.hello()!.pid, child.pid);
    const id = peer.conn.sendRequest(0, CodecId.JSON, 0, Buffer.from("null"));
    peer.flush();
    const res = await peer.until("the result", () => peer.events.find((e) => e.id === id));
    assert.ok(res.type === FrameType.RESULT);
    assert.deepEqual(JSON.parse(res.body.toString()), { fd: null, pid: child.pid });
    peer.conn.sendRequest(1, CodecId.JSON, 0, Buffer.from("null")); // in flight at EOF: abandoned
    peer.flush();
    peer.sock.end();
    assert.equal(await exitOf(child), 0);
  });

  test("DRAIN with a request in flight: CANCELLED past the grace, GOODBYE, exit 0", async () => {
    const { peer, child } = await startWorker();
    const id = peer.conn.sendRequest(1, CodecId.JSON, 0, Buffer.from("null"));
    peer.conn.sendDrain(20);
    peer.flush();
    await peer.until("GOODBYE", () => peer.events.some((e) => e.type === FrameType.GOODBYE));
    const err = peer.events.find((e) => e.id === id);
    assert.ok(err !== undefined && err.type === FrameType.ERROR && err.code === 205);
    assert.equal(await exitOf(child), 0);
    await peer.until("end of file", () => peer.ended);
  });

  test("a parent reading a backlog slowly still gets the last frames: the worker waits while its writes progress", async () => {
    // 2 MiB of credit and no grants: the worker queues ~2 MiB of rows, then DRAIN 0 cancels the
    // stream. Read at one 64 KiB chunk per 100 ms, the backlog takes ~3 s to reach us, longer than
    // the 2 s a worker once gave its last writes in total (its ERROR and GOODBYE were lost).
    const { peer, child } = await startWorker(2 << 20);
    const filled = new Promise((resolve) => child.once("filled", resolve));
    peer.trickle = true;
    peer.sock.pause();
    const id = peer.conn.sendRequest(2, CodecId.JSON, 0, Buffer.from("null"));
    peer.flush();
    await filled;
    peer.conn.sendDrain(0);
    peer.flush();
    const tick = setInterval(() => peer.sock.resume(), 100);
    try {
      await peer.until("GOODBYE", () => peer.events.some((e) => e.type === FrameType.GOODBYE));
    } finally {
      clearInterval(tick);
    }
    const err = peer.events.find((e) => e.id === id && e.type === FrameType.ERROR);
    assert.ok(err !== undefined && err.type === FrameType.ERROR && err.code === 205);
    peer.trickle = false;
    peer.sock.resume();
    assert.equal(await exitOf(child), 0);
  });

  test("a protocol violation: ERROR id 0 with its code, exit 1", async () => {
    const { peer, child } = await startWorker();
    const frame = Buffer.alloc(16);
    frame[4] = FrameType.HELLO; // a HELLO to the worker: UNEXPECTED_FRAME (109)
    peer.sock.write(frame);
    const fatal = await peer.until("ERROR 0", () => peer.events.find((e) => e.type === FrameType.ERROR && e.id === 0));
    assert.ok(fatal.type === FrameType.ERROR);
    assert.ok(fatal.code >= 100 && fatal.code < 200, `a protocol code, got ${fatal.code}`);
    assert.equal(await exitOf(child), 1);
  });

  test("the parent dies while the connection stays open: the worker notices (ppid) and exits", async () => {
    const [ours, theirs] = await socketPair();
    // An intermediate parent starts the worker and is killed once the worker has said HELLO; we
    // keep the connection open, so only the parent check can end the worker.
    const launcher = `
      const { spawn } = require("node:child_process");
      spawn(process.execPath, ["--input-type=module", "-e", ${JSON.stringify(WORKER)}],
        { stdio: ["ignore", "inherit", "inherit", 3], env: { ...process.env, WIREPOOL_FD: "3" } });
      setInterval(() => {}, 1000);`;
    const mid = spawn(process.execPath, ["-e", launcher], { stdio: ["ignore", "inherit", "inherit", theirs] });
    children.push(mid);
    theirs.destroy();
    const peer = new Peer(ours);
    await peer.until("the handshake", () => peer.conn.isOpen());
    const pid = peer.conn.hello()!.pid;
    try {
      mid.kill("SIGKILL");
      await exitOf(mid);
      await peer.until("the worker's end of file", () => peer.ended);
    } finally {
      if (alive(pid)) process.kill(pid, "SIGKILL");
    }
    // It exits right after closing: bounded poll for the process (a zombie counts as gone, since
    // whoever adopted it may not reap it).
    const deadline = Date.now() + WAIT_MS;
    while (alive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.ok(!alive(pid), `worker ${pid} still running`);
    ours.destroy();
  });
});
