// The parent driver against hostile or unlucky workers (issue 11's list, beyond parent.test.ts):
// 100 MiB of stderr, close() with calls and streams in flight, garbage after the handshake, and
// workers killed again and again. The worker is test/hostile-fixture.ts. Every test is bounded by
// its timeout, closes its pool, and waits on outcomes or on the pool's accounting, never on a
// sleep.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { runInNewContext } from "node:vm";
import { setFlagsFromString } from "node:v8";
import {
  ErrorCode,
  Pool,
  ProtocolViolationError,
  WirepoolError,
  WorkerExitedError,
} from "../src/index.js";
import { alivePids, fixturePools, rejection, until } from "./pool-helpers.js";

const FIXTURE = new URL("./hostile-fixture.js", import.meta.url).pathname;
const CRASH_LINE = "hostile fixture: crash requested";
const T = { timeout: 120_000 };

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

const start = fixturePools(FIXTURE);

function readyCount(pool: Pool): number {
  return pool.metrics().workers.filter((w) => w.state === "ready").length;
}

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

test("100 MiB of stderr: the pool keeps serving, memory stays bounded, a later error's tail is the last lines", T, async (t) => {
  const tailLines = 4;
  const pool = await start({ stderrTailLines: tailLines, heartbeatMs: 200 });
  const pid = alivePids(pool)[0];
  gc();
  await new Promise((r) => setImmediate(r));
  const base = process.memoryUsage();
  let peakRss = base.rss;
  const flood = pool.call<number>("flood", { mb: 100, line: 1000, longLine: 8 << 20, tail: 10 });
  // Calls to the same worker are answered while it floods (the parent never stops reading).
  let served = 0;
  let floodDone = false;
  void flood.then(() => (floodDone = true), () => (floodDone = true));
  while (!floodDone) {
    assert.equal(await pool.call("echo", served), served);
    served++;
    peakRss = Math.max(peakRss, process.memoryUsage().rss);
  }
  const written = await flood;
  assert.ok(written >= 100 << 20, `the worker wrote ${written} bytes`);
  assert.ok(served > 1, `only ${served} calls answered during the flood`);
  // Holding the stream (or one 8 MiB line) would take 100 MiB here; the tail is a few lines.
  // V8 frees array buffers on a background sweeper after a full GC: collect, let it run, repeat.
  let held = Infinity;
  for (let k = 0; k < 20 && held >= 8 << 20; k++) {
    gc();
    await new Promise((r) => setImmediate(r));
    const after = process.memoryUsage();
    held = Math.min(held, after.heapUsed + after.arrayBuffers - (base.heapUsed + base.arrayBuffers));
  }
  assert.ok(held < 8 << 20, `the parent holds ${held} more bytes after the flood`);
  assert.ok(peakRss - base.rss < 96 << 20, `the parent's RSS grew by ${peakRss - base.rss} bytes during the flood`);
  t.diagnostic(`${served} calls answered during the flood; RSS peak +${((peakRss - base.rss) / 2 ** 20).toFixed(1)} MiB, held after +${(held / 2 ** 20).toFixed(2)} MiB`);
  // The same worker, not hung (200 ms heartbeats throughout), not replaced.
  assert.deepEqual(alivePids(pool), [pid]);
  assert.equal(pool.metrics().restarts, 0);
  const e = await rejection(pool.call("crash", null));
  assert.ok(e instanceof WorkerExitedError, `got ${e}`);
  assert.deepEqual(e.stderrTail.split("\n"), ["tail line 7", "tail line 8", "tail line 9", CRASH_LINE]);
  assert.equal(await pool.call("echo", "after"), "after");
});

test("close() with calls and streams in flight: each ends in exactly one outcome, no process left", T, async () => {
  // The kill that backs up a worker which does not leave comes a goodbye grace after the drain's;
  // a long one, so a worker slowed by a loaded machine still answers before it. The default 1 MiB
  // credit window leaves up to ~1 MiB of rows queued in the worker when it leaves; a parent
  // starved of CPU was seen reading ~250 KB/s, and the worker's terminals still arrive because it
  // waits for its writes while they progress (EXIT_WRITE_STALL_MS), not for a fixed time.
  const pool = await start({ workers: 2, maxInFlight: 3, goodbyeGraceMs: 10_000 });
  const pids = alivePids(pool);
  assert.equal(pids.length, 2);
  const outcomes = new Map<string, string[]>();
  const record = (name: string, what: string): void => {
    const list = outcomes.get(name) ?? [];
    list.push(what);
    outcomes.set(name, list);
  };
  const track = (name: string, p: Promise<unknown>): Promise<void> =>
    p.then(
      (v) => record(name, `ok:${JSON.stringify(v)}`),
      (e: unknown) => record(name, e instanceof WirepoolError ? e.codeName : `not a WirepoolError: ${e}`),
    );
  // Per worker (3 in flight each): a short call that ends inside the grace, a long one that the
  // drain cancels, and (on one) a handler deaf to cancellation; the rest wait in the queue.
  const calls: Promise<void>[] = [
    track("short-1", pool.call("sleep", 50)),
    track("short-2", pool.call("sleep", 50)),
    track("long-1", pool.call("sleep", 60_000)),
    track("long-2", pool.call("sleep", 60_000)),
    track("deaf", pool.call("hang", 60_000)),
  ];
  // Two streams: one being read, one never read past its first row.
  const read = pool.stream<number>("forever", null);
  const idle = pool.stream<number>("forever", null);
  const readLoop = (async () => {
    let n = 0;
    try {
      for await (const row of read) {
        assert.equal(row, n++);
        if (n === 100) break;
      }
      record("read-stream", "ok:break");
    } catch (e) {
      record("read-stream", e instanceof WirepoolError ? e.codeName : `${e}`);
    }
  })();
  const first = await idle.next();
  assert.equal(first.value, 0);
  for (let k = 0; k < 4; k++) calls.push(track(`queued-${k}`, pool.call("echo", k)));
  await until(() => pool.metrics().queued > 0, "calls queued behind the busy workers", { ms: 30_000 });
  await readLoop;
  const closing = pool.close({ graceMs: 300 });
  const idleEnd = (async () => {
    try {
      for await (const _row of idle) {
        // rows already received are still handed out; the stream then ends once
      }
      record("idle-stream", "ok:end");
    } catch (e) {
      record("idle-stream", e instanceof WirepoolError ? e.codeName : `${e}`);
    }
    // Iterating an ended stream again yields nothing more (no second outcome).
    const again = await idle.next().then((r) => `done:${r.done}`, (e: unknown) => `rejected again: ${e}`);
    record("idle-stream-again", again);
  })();
  const late = rejection(pool.call("echo", "late"));
  await closing;
  await Promise.all([...calls, idleEnd]);
  assert.equal((await late).code, ErrorCode.POOL_CLOSED);

  for (const [name, list] of outcomes) assert.equal(list.length, 1, `${name} ended ${list.length} times: ${list}`);
  const one = (name: string): string => outcomes.get(name)![0];
  assert.equal(one("short-1"), "ok:50");
  assert.equal(one("short-2"), "ok:50");
  // What outlives the grace ends CANCELLED (the worker ends it at the grace, a handler deaf to the
  // cancel too: 8.4), never WORKER_EXITED: the worker's last frames count even when a write of the
  // parent's (a stream's credit) hits the closed socket first (EPIPE) and Node destroys it.
  for (const name of ["long-1", "long-2", "deaf"]) assert.equal(one(name), "CANCELLED", name);
  for (let k = 0; k < 4; k++) {
    const q = one(`queued-${k}`);
    assert.ok(q === `ok:${k}` || q === "POOL_CLOSED", `queued-${k}: ${q}`);
  }
  assert.ok(["ok:end", "CANCELLED"].includes(one("idle-stream")), `idle stream: ${one("idle-stream")}`);
  assert.equal(one("idle-stream-again"), "done:true");
  assert.equal(one("read-stream"), "ok:break");
  // No worker process is left, none is in the pool's books.
  assert.deepEqual(pool.metrics().workers, []);
  for (const pid of pids) assert.ok(!liveChildren().includes(pid), `worker ${pid} is still alive`);
});

test("garbage from the worker mid-session: PROTOCOL_VIOLATION for every request in flight, then a replacement", T, async () => {
  const pool = await start({ goodbyeGraceMs: 200 });
  const [pid] = alivePids(pool);
  const sleeping = [pool.call("sleep", 60_000), pool.call("sleep", 60_000)];
  const stream = pool.stream<number>("forever", null);
  assert.equal((await stream.next()).value, 0);
  const garbage = pool.call("garbage", null);
  const errors = await Promise.all([...sleeping, garbage].map(rejection));
  for (const e of errors) {
    assert.ok(e instanceof ProtocolViolationError, `got ${e}`);
    assert.equal(e.code, ErrorCode.PROTOCOL_VIOLATION);
    // FRAME_TOO_LARGE when the garbage lands between frames; another protocol code when it lands
    // inside a ROWS frame the worker's socket was still writing.
    assert.ok(e.protocolCode >= 100 && e.protocolCode < 200, `protocol code ${e.protocolCode}`);
  }
  assert.equal(new Set(errors.map((e) => e.requestId)).size, 3, "each request its own error");
  let streamError: unknown = null;
  try {
    for await (const _row of stream) {
      // rows before the garbage
    }
  } catch (e) {
    streamError = e;
  }
  assert.ok(streamError instanceof ProtocolViolationError, `the stream ended with ${streamError}`);
  assert.ok(!errors.some((e) => e.requestId === (streamError as WirepoolError).requestId), "the stream's own error");
  await until(() => readyCount(pool) === 1 && !alivePids(pool).includes(pid), "a replacement worker", { ms: 30_000 });
  assert.ok(!liveChildren().includes(pid), "the worker that sent garbage was killed and reaped");
  assert.equal(pool.metrics().restarts, 1);
  assert.equal(await pool.call("echo", "again"), "again");
});

test("N workers killed again and again: never more than N, exactly N afterwards, each death counted once", T, async () => {
  const N = 3;
  const pool = await start({ workers: N, maxRestarts: 1000, restartBackoffMs: 1, restartBackoffMaxMs: 20 });
  const seen = new Set(alivePids(pool));
  const bounded = (): void => {
    assert.ok(alivePids(pool).length <= N, `${alivePids(pool).length} workers alive`);
    assert.ok(liveChildren().length <= N, `${liveChildren().length} child processes alive`);
  };
  let deaths = 0;
  for (let round = 0; round < 8; round++) {
    // One worker, then two at once, each with calls in flight (the pool sends to the least
    // loaded, so six calls are two per worker).
    const victims = alivePids(pool).slice(0, round % 2 === 0 ? 1 : 2);
    const ac = new AbortController();
    const calls = Array.from({ length: 2 * N }, () =>
      pool.call("sleep", 60_000, { signal: ac.signal }).then(() => "ok", (e: unknown) => (e instanceof WirepoolError ? e.codeName : `${e}`)),
    );
    await until(() => pool.metrics().workers.every((w) => w.inFlight === 2), "two calls in flight on every worker", { each: bounded, ms: 30_000 });
    for (const pid of victims) process.kill(pid, "SIGKILL");
    deaths += victims.length;
    await until(() => pool.metrics().restarts === deaths && readyCount(pool) === N, `round ${round}: ${N} ready after ${deaths} deaths`, { each: bounded, ms: 30_000 });
    for (const pid of alivePids(pool)) seen.add(pid);
    // The victims' calls ended WORKER_EXITED; the survivors' are cancelled now: one outcome each.
    ac.abort();
    const outcomes = await Promise.all(calls);
    assert.equal(outcomes.filter((o) => o === "WORKER_EXITED").length, 2 * victims.length, `round ${round}: ${outcomes}`);
    assert.equal(outcomes.filter((o) => o === "CANCELLED").length, 2 * (N - victims.length), `round ${round}: ${outcomes}`);
    await until(() => pool.metrics().workers.every((w) => w.inFlight === 0), "the cancelled calls ended at the workers", { each: bounded, ms: 30_000 });
    assert.equal(pool.metrics().restarts, deaths, "each death counted once");
  }
  assert.equal(seen.size, N + deaths, "every death was replaced by a new process");
  assert.equal(alivePids(pool).length, N);
  assert.equal(liveChildren().length, N);
  assert.equal(pool.metrics().restarts, deaths);
  assert.equal(pool.isClosed, false);
  const pids = await Promise.all(Array.from({ length: 30 }, () => pool.call<number>("whoami", null)));
  for (const pid of pids) assert.ok(alivePids(pool).includes(pid), `answered by ${pid}, not a pool worker`);
});
