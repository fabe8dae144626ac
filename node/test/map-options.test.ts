// pool.map's options (the Python parent's map(ordered=False) and gather's return_exceptions):
// results as they finish, errors as values, the window of calls in flight and the bound on
// unread results, and bad options as INVALID_ARGUMENT (PROTOCOL.md 22.2). The worker is
// test/map-fixture.ts; which call finishes first is decided by the test (a gate the test opens),
// never by a clock. Every test is bounded by its timeout and closes its pool.

import assert from "node:assert/strict";
import { test } from "node:test";
import { setImmediate as turn } from "node:timers/promises";
import { ErrorCode, InvalidArgumentError, MapResults, Pool, RequestError, WirepoolError } from "../src/index.js";
import { fixturePools, rejectionOf, until } from "./pool-helpers.js";

const FIXTURE = new URL("./map-fixture.js", import.meta.url).pathname;
const T = { timeout: 60_000 };
const start = fixturePools(FIXTURE);

/** 0 .. n-1, counting what the map has taken. */
function counted(n: number): { items: Iterable<number>; taken: () => number } {
  let taken = 0;
  return {
    items: (function* () {
      for (let i = 0; i < n; i++) {
        taken++;
        yield i;
      }
    })(),
    taken: () => taken,
  };
}

const idle = (pool: Pool) => pool.metrics().workers.every((w) => w.inFlight === 0) && pool.metrics().queued === 0;

test("ordered (the default): awaited it is the array in order, iterated the same order", T, async () => {
  const pool = await start();
  const items = Array.from({ length: 300 }, (_, i) => ({ v: i }));
  assert.deepEqual(await pool.map("gated", items), items.map((x) => x.v));
  const seen: number[] = [];
  for await (const v of pool.map<{ v: number }, number>("gated", items, { ordered: true })) seen.push(v);
  assert.deepEqual(seen, items.map((x) => x.v));
  const m = pool.map("gated", []);
  assert.ok(m instanceof MapResults);
  assert.deepEqual(await m, []);
});

test("ordered: false: a slow first call comes last; ordered, it comes first", T, async () => {
  const pool = await start();
  const unordered = pool.map<{ v: number; gate?: string }, number>("gated", [{ v: 0, gate: "u" }, { v: 1 }, { v: 2 }, { v: 3 }], { ordered: false });
  const first: number[] = [];
  for (let k = 0; k < 3; k++) {
    const r = await unordered.next();
    assert.equal(r.done, false);
    first.push(r.value);
  }
  assert.deepEqual(first.sort(), [1, 2, 3], "the three quick calls, while the first is held");
  assert.equal(await pool.call("open", "u"), true);
  assert.deepEqual(await unordered.next(), { value: 0, done: false });
  assert.deepEqual(await unordered.next(), { value: undefined, done: true });

  // Ordered: the held first call comes first, although it finishes last.
  const base = pool.metrics().calls;
  const ordered = pool.map<{ v: number; gate?: string }, number>("gated", [{ v: 0, gate: "o" }, { v: 1 }, { v: 2 }, { v: 3 }]);
  const head = ordered.next();
  await until(() => pool.metrics().calls === base + 4 && pool.metrics().workers[0].inFlight === 1, "the quick calls answered, the first held");
  await pool.call("open", "o");
  assert.deepEqual(await head, { value: 0, done: false });
  assert.deepEqual(await ordered, [1, 2, 3], "awaiting after a read gives the rest");
});

test("unordered, awaited: every result once, in the order they finished", T, async () => {
  const pool = await start({ workers: 2 });
  const items = [{ v: -1, gate: "a" }, ...Array.from({ length: 99 }, (_, i) => ({ v: i }))];
  const all = pool.map<unknown, number>("gated", items, { ordered: false });
  await until(() => pool.metrics().calls >= 100 && pool.metrics().workers.reduce((n, w) => n + w.inFlight, 0) === 1, "all but the held call answered");
  // Either worker may hold it: open the gate on both (a lease each, so each gets the call).
  const leases = [await pool.lease(), await pool.lease()];
  for (const l of leases) await l.call("open", "a");
  for (const l of leases) l.release();
  const got = await all;
  assert.equal(got.length, 100);
  assert.equal(got[99], -1, "the held call last");
  assert.deepEqual([...got].sort((a, b) => a - b), [-1, ...Array.from({ length: 99 }, (_, i) => i)]);
});

test("returnExceptions: a failed call's typed error in its place, the map goes on past the unread bound", T, async () => {
  const pool = await start();
  const window = 2;
  const { items, taken } = counted(20);
  const m = pool.map<number, number>("fail_odd", items, { returnExceptions: true, window });
  // Nobody reads: the map takes two windows of requests, calls them, and stalls.
  await until(() => pool.metrics().calls === 2 * window && idle(pool), "two windows called and answered");
  assert.equal(taken(), 2 * window, "no more than two windows taken while nothing is read");
  assert.equal(pool.metrics().calls, 2 * window);
  let read = 0;
  for await (const r of m) {
    if (read % 2 === 1) {
      assert.ok(r instanceof RequestError, `item ${read}: ${String(r)}`);
      assert.ok(r instanceof WirepoolError);
      assert.equal(r.code, 1400);
      assert.deepEqual(r.details, { n: read });
    } else {
      assert.equal(r, read);
    }
    read++;
    assert.ok(taken() - read <= 2 * window, `taken ${taken()} after ${read} read`);
  }
  assert.equal(read, 20);
  assert.equal(pool.metrics().failures, 10);
  // Awaited: the array holds the errors in their places.
  const all = await pool.map<number, number>("fail_odd", [0, 1, 2, 3], { returnExceptions: true });
  assert.equal(all[0], 0);
  assert.ok(all[1] instanceof RequestError);
  assert.equal(all[2], 2);
  assert.ok(all[3] instanceof RequestError);
});

test("returnExceptions with ordered: false: errors as values as they finish, bounded", T, async () => {
  const pool = await start();
  const { items, taken } = counted(40);
  const m = pool.map<number, number>("fail_odd", items, { returnExceptions: true, ordered: false, window: 3 });
  await until(() => pool.metrics().calls === 6 && idle(pool), "two windows called and answered");
  assert.equal(taken(), 6);
  const values: number[] = [];
  let errors = 0;
  for await (const r of m) {
    if (r instanceof WirepoolError) {
      assert.equal(r.code, 1400);
      errors++;
    } else values.push(r);
    assert.ok(taken() - values.length - errors <= 6);
  }
  assert.equal(errors, 20);
  assert.deepEqual(values.sort((a, b) => a - b), Array.from({ length: 20 }, (_, i) => 2 * i));
});

test("without returnExceptions the first failed result ends the map with its error; nothing more is taken", T, async () => {
  const pool = await start();
  const { items, taken } = counted(1000);
  const seen: number[] = [];
  const e = await rejectionOf(
    (async () => {
      for await (const r of pool.map<number, number>("fail_odd", items, { window: 4 })) seen.push(r);
    })(),
  );
  assert.ok(e instanceof RequestError, String(e));
  assert.equal(e.code, 1400);
  assert.deepEqual(seen, [0]);
  assert.ok(taken() <= 2 * 4 + 1, `taken ${taken()}`);
  const awaited = await rejectionOf(pool.map("fail_odd", [0, 2, 3, 4]));
  assert.ok(awaited instanceof RequestError);
  assert.deepEqual(awaited.details, { n: 3 });
  // Leaving the loop early stops the map the same way; the pool goes on.
  const more = counted(1000);
  for await (const r of pool.map<number, number>("fail_odd", more.items, { window: 4 })) {
    assert.equal(r, 0);
    break;
  }
  assert.ok(more.taken() <= 9, `taken ${more.taken()}`);
  assert.deepEqual(await pool.map("gated", [{ v: "still" }]), ["still"]);
});

test("the window bounds the calls in flight", T, async () => {
  const pool = await start({ workers: 2 });
  const held = Array.from({ length: 10 }, (_, i) => ({ v: i, gate: "w" }));
  const m = pool.map<unknown, number>("gated", held, { window: 3, ordered: false });
  await until(() => pool.metrics().calls === 3, "three calls sent");
  await turn();
  assert.equal(pool.metrics().calls, 3, "no fourth call while three are in flight");
  const inFlight = () => pool.metrics().workers.reduce((n, w) => n + w.inFlight, 0);
  assert.equal(inFlight(), 3);
  const leases = [await pool.lease(), await pool.lease()];
  for (const l of leases) await l.call("open", "w");
  for (const l of leases) l.release();
  const got = await m;
  assert.deepEqual(got.sort((a, b) => a - b), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
});

test("bad options are INVALID_ARGUMENT (308) before anything is sent", T, async () => {
  const pool = await start();
  const bad: Record<string, unknown>[] = [
    { ordered: "no" },
    { ordered: 0 },
    { ordered: null },
    { returnExceptions: "yes" },
    { returnExceptions: 1 },
    { returnExceptions: null },
    { window: 0 },
    { window: 1.5 },
    { window: 2 ** 32 },
    { window: NaN },
    { window: "4" },
    { timeoutMs: -1 },
  ];
  const before = pool.metrics().calls;
  for (const opts of bad) {
    const e = await rejectionOf(pool.map("gated", [{ v: 1 }], opts as never));
    assert.ok(e instanceof InvalidArgumentError, `${JSON.stringify(opts)}: ${String(e)}`);
    assert.equal(e.code, ErrorCode.INVALID_ARGUMENT);
    const name = Object.keys(opts)[0];
    assert.match(e.message, new RegExp(`^${name} must be`), e.message);
    const it = pool.map("gated", [{ v: 1 }], opts as never);
    await assert.rejects(it.next(), InvalidArgumentError);
    assert.deepEqual(await it.next(), { value: undefined, done: true }, "the error once, then done");
  }
  assert.equal(pool.metrics().calls, before, "nothing was sent");
  await assert.rejects(Promise.resolve(pool.map("gated", 5 as never)), InvalidArgumentError);
  // Booleans of either value are fine.
  assert.deepEqual(await pool.map("gated", [{ v: 1 }], { ordered: false, returnExceptions: false }), [1]);
});

test("an iterable that throws ends the map with its own error after the results before it", T, async () => {
  const pool = await start();
  const boom = new Error("no more requests");
  function* items() {
    yield { v: 1 };
    yield { v: 2 };
    throw boom;
  }
  const seen: unknown[] = [];
  const e = await rejectionOf(
    (async () => {
      for await (const r of pool.map("gated", items())) seen.push(r);
    })(),
  );
  assert.equal(e, boom);
  assert.deepEqual(seen, [1, 2]);
});

test("await using stops a map at the scope's end", T, async () => {
  const pool = await start();
  const { items, taken } = counted(10_000);
  {
    await using m = pool.map<number, number>("fail_odd", items, { window: 2, returnExceptions: true });
    assert.deepEqual(await m.next(), { value: 0, done: false });
  }
  const after = taken();
  assert.ok(after <= 5, `taken ${after}`);
  await until(() => idle(pool), "the calls in flight finished");
  assert.equal(taken(), after, "nothing taken after the scope");
});
