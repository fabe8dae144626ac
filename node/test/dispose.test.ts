// Explicit resource management: `await using` on a Pool, a Lease and a RowStream (compiled by
// tsc: this file is its downlevel emit's test). A pool disposed is closed and its workers are
// gone, a lease disposed is released, a stream disposed early is cancelled at the worker. Every
// test is bounded by its timeout and closes its pools; waits are on outcomes (close resolving
// once the workers are reaped, the request ending at the worker), never on a sleep.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { Lease, Pool, PoolClosedError, RowStream, type PoolOptions } from "../src/index.js";
import { closedAfterEach, inFlight, until } from "./pool-helpers.js";

const FIXTURE = new URL("./parent-fixture.js", import.meta.url).pathname;
const T = { timeout: 60_000 };
const OPTS: PoolOptions = { command: [process.execPath, FIXTURE], workers: 1 };
const track = closedAfterEach();

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


test("the runtime has Symbol.asyncDispose and the three classes define it", () => {
  assert.equal(typeof Symbol.asyncDispose, "symbol");
  for (const c of [Pool, Lease, RowStream]) assert.equal(typeof c.prototype[Symbol.asyncDispose], "function", c.name);
});

test("await using a pool: closed at the end of the scope, its workers reaped", T, async () => {
  let kept: Pool;
  let pid: number;
  {
    await using pool = await Pool.start(OPTS);
    kept = pool;
    pid = Number(await pool.call("whoami"));
    assert.ok(liveChildren().includes(pid));
  }
  // The dispose awaited close(), which resolves once every worker process is gone.
  assert.ok(kept.isClosed);
  assert.ok(!liveChildren().includes(pid), `worker ${pid} outlived the disposed pool`);
  await assert.rejects(kept.call("whoami"), PoolClosedError);
});

test("await using a pool: an exception in the scope still closes it, and the exception propagates", T, async () => {
  let kept: Pool | null = null;
  let pid = 0;
  const boom = new Error("boom");
  await assert.rejects(async () => {
    await using pool = await Pool.start(OPTS);
    kept = pool;
    pid = Number(await pool.call("whoami"));
    throw boom;
  }, (e) => e === boom);
  assert.ok(kept !== null && (kept as Pool).isClosed);
  assert.ok(!liveChildren().includes(pid), `worker ${pid} outlived the disposed pool`);
});

test("await using a lease: released at the end of the scope, the worker routable again", T, async () => {
  const pool = await Pool.start(OPTS);
  track(pool);
  let kept: Lease;
  {
    await using lease = await pool.lease();
    kept = lease;
    assert.equal(Number(await lease.call("whoami")), lease.pid);
    assert.equal(pool.metrics().workers[0].leased, true);
  }
  assert.equal(pool.metrics().workers[0].leased, false);
  await assert.rejects(kept.call("whoami"), { codeName: "LEASE_LOST" });
  // The only worker is free: a second lease is granted at once.
  const again = await pool.lease();
  again.release();
});

test("await using a stream: leaving the scope early cancels it at the worker", T, async () => {
  const pool = await Pool.start(OPTS);
  track(pool);
  const seen: number[] = [];
  let kept: RowStream<number>;
  {
    await using rows = pool.stream<number>("forever");
    kept = rows;
    const it = rows[Symbol.asyncIterator]();
    for (let k = 0; k < 3; k++) seen.push((await it.next()).value as number);
    assert.equal(inFlight(pool), 1);
  }
  assert.deepEqual(seen, [0, 1, 2]);
  // The worker got CANCEL: the request ends there (an endless stream ends no other way).
  await until(() => inFlight(pool) === 0, "the cancelled stream ended at the worker");
  assert.deepEqual(await kept.next(), { value: undefined, done: true });
  assert.equal(await pool.call("echo", 5), 5);
});

test("await using a stream read to its end: disposing it changes nothing", T, async () => {
  const pool = await Pool.start(OPTS);
  track(pool);
  let kept: RowStream;
  let n = 0;
  {
    await using rows = pool.stream("rows", { n: 10, size: 1 });
    kept = rows;
    for await (const _ of rows) n++;
  }
  assert.equal(n, 10);
  assert.deepEqual(kept.summary, { rows: 10 });
  assert.equal(pool.metrics().failures, 0);
});
