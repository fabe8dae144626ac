// The parent driver end to end (PROTOCOL.md 8, 12.2, 17) against real worker processes: the
// fixture worker (test/parent-fixture.ts, on the Node worker SDK). Every test is bounded by its
// timeout, closes its pool, and waits on outcomes or on the pool's own accounting, never on a
// sleep.

import assert from "node:assert/strict";
import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  CancelledError,
  DeadlineExceededError,
  ErrorCode,
  LeaseLostError,
  Pool,
  RequestError,
  SpawnFailedError,
  StartupTimeoutError,
  WirepoolError,
  WorkerExitedError,
  WorkerHungError,
} from "../src/index.js";
import { alivePids, fixturePools, inFlight, rejection, until } from "./pool-helpers.js";

const FIXTURE = new URL("./parent-fixture.js", import.meta.url).pathname;
const T = { timeout: 60_000 };
const start = fixturePools(FIXTURE);

/** Our live child processes (zombies excluded). */
function liveChildren(): number[] {
  const out: number[] = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, "latin1");
      const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(f[1]) === process.pid && f[0] !== "Z") out.push(Number(e));
    } catch {
      // gone
    }
  }
  return out;
}

test("calls, streams, map and a socketpair on WIREPOOL_FD", T, async () => {
  const pool = await start();
  assert.deepEqual(await pool.call("echo", { a: [1, 2] }), { a: [1, 2] });
  assert.deepEqual(await pool.call("echo", Buffer.from("bytes"), { codec: "raw" }), Buffer.from("bytes"));
  const rows: unknown[] = [];
  const s = pool.stream("rows", { n: 5, size: 1 });
  for await (const row of s) rows.push(row);
  assert.deepEqual(rows, [[0, "x"], [1, "x"], [2, "x"], [3, "x"], [4, "x"]]);
  assert.deepEqual(s.summary, { rows: 5 });
  // A frame at a time: every row once, in order, whatever the batching.
  const b = pool.stream<[number, string]>("rows", { n: 3000, size: 10 });
  let seen = 0;
  let batches = 0;
  for await (const batch of b.batches()) {
    batches++;
    for (const row of batch) assert.equal(row[0], seen++);
  }
  assert.equal(seen, 3000);
  assert.ok(batches < 3000, "rows arrive several to a batch");
  assert.deepEqual(b.summary, { rows: 3000 });
  const many = await pool.map<number, number>("echo", Array.from({ length: 500 }, (_, i) => i));
  assert.deepEqual(many, Array.from({ length: 500 }, (_, i) => i));
  // Section 1: fd 3 of the worker is a Unix stream socket (libuv makes 'pipe' stdio with socketpair).
  const pid = alivePids(pool)[0];
  assert.match(readlinkSync(`/proc/${pid}/fd/3`), /^socket:\[\d+\]$/);
});

test("a crash mid-stream: the rows sent, then WORKER_EXITED with signal and stderr tail; replaced", T, async () => {
  const pool = await start();
  const before = alivePids(pool);
  const got: unknown[] = [];
  let error: WirepoolError | null = null;
  try {
    for await (const row of pool.stream("crash_stream", { n: 3 })) got.push(row);
  } catch (e) {
    error = e as WirepoolError;
  }
  assert.deepEqual(got, [0, 1, 2]);
  assert.ok(error instanceof WorkerExitedError, `got ${error}`);
  assert.equal(error.code, ErrorCode.WORKER_EXITED);
  assert.equal(error.signal, 6);
  assert.equal(error.exitStatus, null);
  assert.match(error.stderrTail, /parent fixture: crash requested/);
  await until(() => alivePids(pool).length === 1 && pool.metrics().workers[0].state === "ready", "a replacement");
  assert.notDeepEqual(alivePids(pool), before);
  assert.equal(pool.metrics().restarts, 1);
  assert.equal(await pool.call("echo", 7), 7);
});

test("SIGSTOP: missed heartbeats end the call WORKER_HUNG and the worker is replaced", T, async () => {
  const pool = await start({ heartbeatMs: 100 });
  const started = performance.now();
  const e = await rejection(pool.call("freeze", null));
  assert.ok(e instanceof WorkerHungError, `got ${e}`);
  assert.ok(performance.now() - started < 3000, "found within about 3 x heartbeat");
  assert.equal(await pool.call("echo", 1), 1);
});

test("a handler that throws: HANDLER_ERROR with its message, the worker stays", T, async () => {
  const pool = await start();
  const pid = alivePids(pool);
  const e = await rejection(pool.call("fail", null));
  assert.ok(e instanceof RequestError);
  assert.equal(e.code, ErrorCode.HANDLER_ERROR);
  assert.match(e.message, /the fail method was called/);
  assert.ok(e.requestId > 0);
  assert.deepEqual(alivePids(pool), pid);
});

test("deadlines: the worker answers DEADLINE_EXCEEDED, a deaf handler's too; the parent's backstop", T, async () => {
  const pool = await start({ deadlineGraceMs: 300 });
  let t = performance.now();
  const e1 = await rejection(pool.call("sleep", 10_000, { timeoutMs: 100 }));
  assert.ok(e1 instanceof DeadlineExceededError, `got ${e1}`);
  assert.ok(performance.now() - t >= 99 && performance.now() - t < 2000);
  t = performance.now();
  const e2 = await rejection(pool.call("hang", 10_000, { timeoutMs: 100 }));
  assert.equal(e2.code, ErrorCode.DEADLINE_EXCEEDED);
  assert.ok(performance.now() - t < 2000);
  await until(() => inFlight(pool) === 0, "every request ended");
});

test("the parent's own deadline when the worker does not answer (SIGSTOP, no heartbeat)", T, async () => {
  const pool = await start({ heartbeatMs: 0, deadlineGraceMs: 200, cancelGraceMs: 300 });
  const t = performance.now();
  const e = await rejection(pool.call("freeze", null, { timeoutMs: 100 }));
  assert.ok(e instanceof DeadlineExceededError, `got ${e}`);
  assert.ok(performance.now() - t < 2000);
  // No terminal comes from a stopped worker: the cancel grace kills and replaces it.
  await until(() => pool.metrics().restarts === 1 && inFlight(pool) === 0, "the frozen worker replaced");
  assert.equal(await pool.call("echo", 2), 2);
});

test("cancel through AbortSignal: in flight, queued, and before the call", T, async () => {
  const pool = await start({ maxInFlight: 1 });
  const pid = alivePids(pool);
  const ac = new AbortController();
  const running = pool.call("sleep", 60_000, { signal: ac.signal });
  const queued = pool.call("sleep", 60_000, { signal: ac.signal });
  await until(() => inFlight(pool) === 1 && pool.metrics().queued === 1, "one in flight, one queued");
  await sleep(1); // the REQUEST leaves in this turn's write
  ac.abort();
  assert.ok((await rejection(running)) instanceof CancelledError);
  assert.ok((await rejection(queued)) instanceof CancelledError);
  assert.ok((await rejection(pool.call("echo", 1, { signal: ac.signal }))) instanceof CancelledError);
  // The worker ended the cancelled request itself: no kill, same worker.
  await until(() => inFlight(pool) === 0, "the cancelled request ended at the worker");
  assert.deepEqual(alivePids(pool), pid);
  assert.equal(pool.metrics().restarts, 0);
});

test("leaving a stream's loop cancels it; rows still arriving are counted as read", T, async () => {
  const pool = await start({ initialCredit: 65_536 });
  const pid = alivePids(pool);
  let n = 0;
  for await (const row of pool.stream("forever", null)) {
    assert.equal(row, n);
    if (++n === 1000) break;
  }
  await until(() => inFlight(pool) === 0, "the worker ended the cancelled stream");
  assert.deepEqual(alivePids(pool), pid);
  assert.equal(await pool.call("echo", 3), 3);
});

test("a slow consumer slows the producer (credit): it never runs more than the window ahead", T, async () => {
  const window = 64 * 1024;
  const size = 1000;
  const pool = await start({ initialCredit: window });
  const stream = pool.stream<[number, string]>("rows", { n: 5000, size });
  const first = await stream.next();
  assert.deepEqual(first.value?.[0], 0);
  // Sample the producer while nobody reads: a bound on every sample, whatever the timing.
  // Window, one frame sent on the last credit, one batch held by the worker, rounded up.
  const bound = Math.ceil((2 * window + 256 * 1024) / size) + 2;
  let worst = 0;
  for (let k = 0; k < 20; k++) {
    const produced = Number(await pool.call("produced", null));
    worst = Math.max(worst, produced - 1);
    assert.ok(produced - 1 <= bound, `the producer is ${produced - 1} rows ahead, above ${bound}`);
    await sleep(10);
  }
  let read = 1;
  for await (const row of stream) assert.equal(row[0], read++);
  assert.equal(read, 5000);
  assert.deepEqual(stream.summary, { rows: 5000 });
  assert.ok(worst > 0, "the producer ran ahead at all");
});

test("recycling by request count: every call answered, the worker replaced, never more than one idle", T, async () => {
  const pool = await start({ maxRequests: 5 });
  // The pool's "exit" event comes once the process is reaped (and every request on it ended).
  const reaped = new Set<number>();
  pool.on("exit", (e: { pid: number }) => reaped.add(e.pid));
  const served = new Map<number, number>();
  for (let k = 0; k < 20; k++) {
    const pid = Number(await pool.call("whoami", null));
    served.set(pid, (served.get(pid) ?? 0) + 1);
  }
  // One worker, calls one at a time: each process serves exactly maxRequests calls, then is
  // recycled (the 20th call's too: its replacement starts after the loop).
  assert.deepEqual([...served.values()], [5, 5, 5, 5], `calls per process: ${[...served]}`);
  assert.ok(pool.metrics().recycles >= 4);
  // Not the metrics (the last recycled worker is the only one listed until its replacement is
  // spawned): each recycled pid's reap, then its absence from the process table.
  await until(() => [...served.keys()].every((pid) => reaped.has(pid)), `the recycled workers reaped (${[...reaped]} of ${[...served.keys()]})`);
  const live = liveChildren();
  for (const pid of served.keys()) assert.ok(!live.includes(pid), `recycled worker ${pid} still alive`);
  await until(() => alivePids(pool).length === 1 && !served.has(alivePids(pool)[0]), "a fresh worker serving");
  assert.equal(pool.metrics().workers.length, 1, "never more than one worker once idle");
});

test("recycling by idle time and by RSS: the worker is replaced, the pool serves", T, async () => {
  const idle = await start({ maxIdleMs: 100 });
  const first = alivePids(idle);
  await until(() => idle.metrics().recycles >= 1 && alivePids(idle).length === 1 && !first.includes(alivePids(idle)[0]), "an idle recycle");
  assert.equal(await idle.call("echo", 1), 1);
  const fat = await start({ maxRssBytes: 1024 * 1024 }); // any Node process is above 1 MiB
  await until(() => fat.metrics().recycles >= 1, "an RSS recycle");
  assert.equal(await fat.call("echo", 2), 2);
});

test("start-up timeout: a program that never says HELLO is killed and reaped", T, async () => {
  const before = liveChildren().length;
  const t = performance.now();
  const e = await rejection(Pool.start({ command: [process.execPath, "-e", "setInterval(() => {}, 1000)"], workers: 1, startupTimeoutMs: 300 }));
  assert.ok(e instanceof StartupTimeoutError, `got ${e}`);
  assert.ok(performance.now() - t < 5000);
  assert.equal(liveChildren().length, before, "the silent worker was reaped");
});

test("garbage from the worker before HELLO: PROTOCOL_VIOLATION with its code, the worker reaped", T, async () => {
  const before = liveChildren().length;
  const garbage = "require('fs').writeSync(3, 'this is not a frame header at all'); setInterval(() => {}, 1000)";
  const e = await rejection(Pool.start({ command: [process.execPath, "-e", garbage], workers: 1, goodbyeGraceMs: 200 }));
  assert.equal(e.code, ErrorCode.PROTOCOL_VIOLATION);
  assert.equal((e.details as { protocol_code: number }).protocol_code, ErrorCode.FRAME_TOO_LARGE);
  assert.equal(liveChildren().length, before, "the lingering worker was killed and reaped");
});

test("a worker that dies at start-up: WORKER_EXITED's message ends with its stderr tail, bounded", T, async () => {
  const script = "process.stderr.write('starting\\n' + 'y'.repeat(10000) + '\\nboom: no such config\\n'); process.exit(3)";
  const e = await rejection(Pool.start({ command: [process.execPath, "-e", script], workers: 1 }));
  assert.ok(e instanceof WorkerExitedError, `got ${e}`);
  assert.equal(e.exitStatus, 3);
  assert.match(e.stderrTail, /boom: no such config$/);
  assert.match(e.message, /^the worker \(pid \d+\) exited with status 3 before its HELLO; stderr tail:\n/);
  assert.match(e.message, /\nboom: no such config$/);
  // The tail in the message is bounded (the 10,000-character line is cut; .stderrTail keeps 4,096 a line).
  assert.ok(e.message.length < 4096 + 200, `the message has ${e.message.length} characters`);
  // Nothing on stderr: no suffix.
  const quiet = await rejection(Pool.start({ command: [process.execPath, "-e", "process.exit(4)"], workers: 1 }));
  assert.match(quiet.message, /^the worker \(pid \d+\) exited with status 4 before its HELLO$/);
});

test("a worker that exits 0 before its HELLO, silent: the message asks whether it called serve", T, async () => {
  // A program that registers nothing and never serves: it ends at once with status 0.
  const e = await rejection(Pool.start({ command: [process.execPath, "-e", "0"], workers: 1 }));
  assert.ok(e instanceof WorkerExitedError, `got ${e}`);
  assert.equal(e.code, ErrorCode.WORKER_EXITED);
  assert.equal(e.exitStatus, 0);
  assert.match(e.message, /^the worker \(pid \d+\) exited with status 0 before its HELLO \(did the worker program call its SDK's serve, e\.g\. `await worker\.serve\(\)`\?\)$/);
  // Not for a status other than 0, nor when it said something on stderr (the tail says why).
  const loud = await rejection(Pool.start({ command: [process.execPath, "-e", "process.stderr.write('no config\\n')"], workers: 1 }));
  assert.equal(loud.exitStatus, 0);
  assert.doesNotMatch(loud.message, /did the worker program call/);
  assert.match(loud.message, /before its HELLO; stderr tail:\nno config$/);
  const quiet = await rejection(Pool.start({ command: [process.execPath, "-e", "process.exit(4)"], workers: 1 }));
  assert.doesNotMatch(quiet.message, /did the worker program call/);
});

test("a start-up timeout: the message and .stderrTail carry what the silent worker wrote", T, async () => {
  // sh writes within milliseconds, far inside the 1 s timeout; exec: the pool's SIGKILL reaches sleep.
  const e = await rejection(Pool.start({ command: ["/bin/sh", "-c", "echo 'loading a large model' >&2; exec sleep 60"], workers: 1, startupTimeoutMs: 1000 }));
  assert.ok(e instanceof StartupTimeoutError, `got ${e}`);
  assert.equal(e.stderrTail, "loading a large model");
  assert.match(e.message, /within 1000 ms; stderr tail:\nloading a large model$/);
});

test("WORKER_HUNG's message ends with the worker's stderr tail, bounded", T, async () => {
  const pool = await start({ heartbeatMs: 100 });
  assert.equal(await pool.call("print", { n: 10_000 }), 10_000);
  const e = await rejection(pool.call("freeze", null));
  assert.ok(e instanceof WorkerHungError, `got ${e}`);
  assert.match(e.stderrTail, /\nlast line$/);
  assert.match(e.message, /^the worker \(pid \d+\) is hung: .*; killed; stderr tail:\n/);
  assert.match(e.message, /\nlast line$/);
  assert.ok(e.message.length < 4096 + 200, `the message has ${e.message.length} characters`);
});

test("LEASE_LOST's message ends with the dead worker's stderr tail, bounded", T, async () => {
  const pool = await start();
  const lease = await pool.lease();
  try {
    assert.equal(await lease.call("print", { n: 10_000 }), 10_000);
    const exited = await rejection(lease.call("crash", null));
    assert.ok(exited instanceof WorkerExitedError, `got ${exited}`);
    const e = await rejection(lease.call("echo", 1));
    assert.ok(e instanceof LeaseLostError, `got ${e}`);
    assert.match(e.stderrTail, /parent fixture: crash requested$/);
    assert.match(e.message, /^the leased worker \(pid \d+\) is gone; stderr tail:\n/);
    assert.match(e.message, /\nparent fixture: crash requested$/);
    assert.ok(e.message.length < 4096 + 200, `the message has ${e.message.length} characters`);
  } finally {
    lease.release();
  }
});

test("a missing executable: SPAWN_FAILED", T, async () => {
  const e = await rejection(Pool.start({ command: ["/nonexistent/wirepool-worker"], workers: 1 }));
  assert.ok(e instanceof SpawnFailedError, `got ${e}`);
  assert.equal(e.code, ErrorCode.SPAWN_FAILED);
});

test("a worker that exits before HELLO: WORKER_EXITED with its status", T, async () => {
  const e = await rejection(Pool.start({ command: [process.execPath, "-e", "process.exit(7)"], workers: 1 }));
  assert.ok(e instanceof WorkerExitedError, `got ${e}`);
  assert.equal(e.exitStatus, 7);
});

test("crash loops: each death counted once, exactly `workers` alive, then the pool closes itself", T, async () => {
  const pool = await start({ workers: 2, maxRestarts: 3, restartBackoffMs: 1 });
  for (let k = 0; k < 3; k++) {
    await rejection(pool.call("crash", null));
    await until(() => pool.metrics().workers.filter((w) => w.state === "ready").length === 2, "two ready workers");
    assert.equal(liveChildren().length >= 2 && pool.metrics().workers.length, 2);
  }
  assert.equal(pool.metrics().restarts, 3);
  const e = await rejection(pool.call("crash", null));
  assert.equal(e.code, ErrorCode.WORKER_EXITED);
  await until(() => pool.isClosed, "the pool closed after max_restarts");
  const closed = await rejection(pool.call("echo", 1));
  assert.equal(closed.code, ErrorCode.POOL_CLOSED);
  // The words every SDK uses (and the soak looks for), with the count and the window.
  assert.match(closed.message, /^restart intensity exceeded: 4 worker deaths within 60000 ms \(max_restarts 3\)/);
});

test("close() drains: in-flight work finishes within the grace, later calls POOL_CLOSED", T, async () => {
  const pool = await start();
  const running = pool.call("sleep", 200);
  await until(() => inFlight(pool) === 1, "in flight");
  await sleep(1);
  await pool.close({ graceMs: 5000 });
  assert.equal(await running, 200);
  assert.equal((await rejection(pool.call("echo", 1))).code, ErrorCode.POOL_CLOSED);
  assert.deepEqual(pool.metrics().workers, []);
});

test("stderr is read continuously: a large write does not block, its tail is kept and logged", T, async () => {
  const lines: string[] = [];
  const pool = await start({ logger: (e) => lines.push(e.line) });
  assert.equal(await pool.call("print", { n: 1 << 20 }), 1 << 20);
  await until(() => lines.includes("last line"), "the last line logged");
  const e = await rejection(pool.call("crash", null));
  assert.match(e.stderrTail, /last line\nparent fixture: crash requested/);
});
