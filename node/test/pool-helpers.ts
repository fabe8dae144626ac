// What the pool tests share: pools closed after each test, a bounded wait for the pool's own
// accounting (never a sleep as synchronisation), and a promise's rejection as a value.

import assert from "node:assert/strict";
import { afterEach } from "node:test";
import { setImmediate as turn, setTimeout as sleep } from "node:timers/promises";
import { Pool, type PoolOptions, WirepoolError } from "../src/index.js";

/**
 * `track(pool)` has the pool closed (no grace) after each test of the calling file; call it
 * once at the file's top level, where node:test takes its hooks.
 */
export function closedAfterEach(): <P extends Pool>(pool: P) => P {
  const pools: Pool[] = [];
  afterEach(async () => {
    await Promise.all(pools.splice(0).map((p) => p.close({ graceMs: 0 })));
  });
  return (pool) => {
    pools.push(pool);
    return pool;
  };
}

/** `start(opts)`: a pool of one worker running the fixture `fixture` (a compiled test file), closed after each test. */
export function fixturePools(fixture: string, defaults: Partial<PoolOptions> = {}): (opts?: Partial<PoolOptions>) => Promise<Pool> {
  const track = closedAfterEach();
  return async (opts = {}) => track(await Pool.start({ command: [process.execPath, fixture], workers: 1, ...defaults, ...opts }));
}

/**
 * Polls `cond` (the pool's accounting or /proc) until it holds, bounded by `ms`; `each` runs
 * before every poll. Then one event-loop turn, so reactions to the last outcome have run before
 * the caller looks.
 */
export async function until(cond: () => boolean, what: string, { ms = 20_000, each = () => {} }: { ms?: number; each?: () => void } = {}): Promise<void> {
  const deadline = performance.now() + ms;
  for (;;) {
    each();
    if (cond()) break;
    if (performance.now() > deadline) assert.fail(`not within ${ms} ms: ${what}`);
    await sleep(5);
  }
  await turn();
}

/** What `p` rejects with, whatever it is; fails the test if `p` fulfils. */
export async function rejectionOf(p: PromiseLike<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  assert.fail("expected a failure");
}

/** The WirepoolError `p` rejects with; fails the test if it fulfils or rejects with anything else. */
export async function rejection(p: PromiseLike<unknown>): Promise<WirepoolError> {
  const e = await rejectionOf(p);
  assert.ok(e instanceof WirepoolError, `expected a WirepoolError, got ${e}`);
  return e;
}

export function alivePids(pool: Pool): number[] {
  return pool.metrics().workers.filter((w) => w.alive).map((w) => w.pid);
}

/** Requests in flight on all of the pool's workers. */
export function inFlight(pool: Pool): number {
  return pool.metrics().workers.reduce((n, w) => n + w.inFlight, 0);
}
