// The handed-ahead bound (PROTOCOL.md 8.5, spec/constants.json driver.max_handed_ahead_bytes):
// a driver hands its socket whole frames only while the socket holds fewer than 4,194,304 bytes
// it has not written, counting all it already holds. Many results each well below 4 MiB, finished
// in turns of their own behind a reader that does not read, must stay in the core (where a PONG
// still goes ahead of them), not pile up in the socket's write buffer. Before the fix each one
// was written whole (it was below the bound by itself) and the socket held them all.
// The worker runs in this process on one end of a Unix socket (its socket can be measured); the
// test is the parent, on the bare core, at the other end. Bounded by its timeout; the worker's
// serve() ends at end of file, the server and the sockets are closed.

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { CodecId, Connection, type ConnectionEvent, Driver, FrameType } from "../src/proto/index.js";
import { Pool, Worker } from "../src/index.js";

const BOUND = Driver.maxHandedAheadBytes;
const FRAME = 1 << 20;
const SIZE = 1_000_000; // one frame each, a quarter of the bound
const N = 24; // 24 MB in all, six times the bound

/** One turn of the event loop (each result finishes in a turn of its own). */
const turn = (): Promise<void> => new Promise((r) => setImmediate(r));

test("many sub-4-MiB results behind a reader that does not read stay under the bound in the socket; a PONG goes ahead", { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "wirepool-handed-ahead-"));
  const server = net.createServer();
  const accepted = new Promise<net.Socket>((resolve) => server.once("connection", resolve));
  await new Promise<void>((resolve) => server.listen(join(dir, "s"), resolve));
  const client = net.connect(join(dir, "s"));
  const workerSide = await accepted;
  try {
    let produced = 0;
    const w = new Worker({ maxConcurrency: 64 });
    w.method("blob", async (req: Buffer) => {
      const k = Number(req.toString());
      for (let i = 0; i <= k; i++) await turn();
      produced++;
      return Buffer.alloc(SIZE, k);
    }, { codecs: ["raw"] });
    const served = w.serve({ socket: workerSide, exit: false, watchParent: false });

    const conn = new Connection("parent");
    const events: ConnectionEvent[] = [];
    let got: () => void = () => {};
    client.on("data", (b: Buffer) => {
      conn.receive(b);
      for (let ev = conn.nextEvent(); ev !== null; ev = conn.nextEvent()) {
        // Keep what the assertions need: the bodies are views of the receive buffer.
        events.push(ev.type === FrameType.RESULT ? { ...ev, body: Buffer.from(ev.body.subarray(0, 1)) } : ev);
      }
      got();
    });
    const until = async (cond: () => boolean): Promise<void> => {
      while (!cond()) await new Promise<void>((r) => (got = r));
    };
    const flush = (): void => {
      for (const b of conn.takeOutput()) client.write(b);
    };

    await until(() => events.some((e) => e.type === FrameType.HELLO));
    conn.sendWelcome({ version: 1, workerId: 1, maxFrameSize: FRAME, initialCredit: 1 << 20, heartbeatMs: 1000, maxInFlight: 64, maxMessageSize: 1 << 24 });
    for (let k = 0; k < N; k++) conn.sendRequest(0, CodecId.RAW, 0, Buffer.from(String(k)));
    client.pause(); // the slow reader: nothing more is read until resume()
    flush();

    // Every result is produced, each in its own turn; the socket's write buffer is sampled every turn.
    let most = 0;
    for (let after = 0; after < 4; after += produced === N ? 1 : 0) {
      most = Math.max(most, workerSide.writableLength);
      await turn();
    }
    most = Math.max(most, workerSide.writableLength);
    assert.ok(most > 0, "the socket holds some output (the reader is not reading)");
    assert.ok(most <= BOUND + FRAME + 64, `the socket held ${most} bytes, above the bound ${BOUND} and one frame`);

    // A PING now: its PONG goes ahead of the results still in the worker's core.
    conn.sendPing(Buffer.from("8bytes!!"));
    flush();
    client.resume();
    await until(() => events.filter((e) => e.type === FrameType.RESULT).length === N);
    const results = events.filter((e) => e.type === FrameType.RESULT);
    const pong = events.findIndex((e) => e.type === FrameType.PONG);
    assert.ok(pong >= 0, "the PONG came");
    assert.ok(pong < events.indexOf(results[N - 1]), "the PONG came before the last result");
    assert.deepEqual(results.map((e) => e.id).sort((a, b) => a - b), Array.from({ length: N }, (_, i) => i + 1));
    for (const e of results) if (e.type === FrameType.RESULT) assert.equal(e.body[0], e.id - 1);

    client.end();
    assert.equal(await served, 0);
  } finally {
    client.destroy();
    workerSide.destroy();
    await new Promise((r) => server.close(r));
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the parent too: many sub-4-MiB requests to a worker that reads nothing stay under the bound in the socket", { timeout: 60_000 }, async () => {
  const fixture = new URL("./parent-fixture.js", import.meta.url).pathname;
  const pool = await Pool.start({ command: [process.execPath, fixture], workers: 1, heartbeatMs: 60_000, maxFrameSize: FRAME });
  try {
    const pid = pool.metrics().workers[0].pid;
    // The worker stops itself (SIGSTOP): it reads nothing more. Awaited in /proc, bounded by the timeout.
    const frozen = pool.call("freeze", null).catch(() => {});
    while (readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0] !== "T") await turn();
    const sock = (pool as unknown as { workers: { socket: net.Socket }[] }).workers[0].socket;
    const calls: Promise<unknown>[] = [];
    let most = 0;
    for (let k = 0; k < N; k++) {
      calls.push(pool.call("echo", Buffer.alloc(SIZE, k), { codec: "raw" }).catch(() => {}));
      await turn(); // each request leaves in a flush of its own
      most = Math.max(most, sock.writableLength);
    }
    for (let i = 0; i < 4; i++) {
      await turn();
      most = Math.max(most, sock.writableLength);
    }
    assert.ok(most > 0, "the socket holds some output (the worker is not reading)");
    assert.ok(most <= BOUND + FRAME + 64, `the socket held ${most} bytes, above the bound ${BOUND} and one frame`);
    await pool.close({ graceMs: 0 }); // kills the stopped worker; the calls end
    await Promise.all([frozen, ...calls]);
  } finally {
    await pool.close({ graceMs: 0 });
  }
});
