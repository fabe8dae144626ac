// Heartbeats beside a large message (PROTOCOL.md 8.5): PING and PONG go at the next frame
// boundary of their peer's output, ahead of the rest of a message already queued, so a message
// of any size over a slow link never makes a healthy worker look hung. The link is a relay
// (conformance/tools/slow_relay.py) between the pool and the fixture worker passing one direction at 25 MB/s:
// 32 MiB take over 1.3 s, the heartbeat is 200 ms (a worker is hung after 600 ms without a
// PONG) and frames are 1 MiB (40 ms each). Before the fix the worker's PONG (a large RESULT) or
// the parent's PING (a large REQUEST) waited behind the rest of the message and the call ended
// WORKER_HUNG. Each test is bounded by its timeout and closes its pool (the relay exits with its
// worker; a killed relay's worker sees end of file).

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { Pool } from "../src/index.js";
import { closedAfterEach } from "./pool-helpers.js";

const FIXTURE = new URL("./parent-fixture.js", import.meta.url).pathname;
const RELAY = fileURLToPath(new URL("../../../conformance/tools/slow_relay.py", import.meta.url));
const RATE = 25_000_000;
const SIZE = 32 << 20;
const T = { timeout: 120_000 };
const track = closedAfterEach();

/** A pool of one fixture worker behind the relay: the worker's output at `down`, the pool's at `up` bytes a second. */
async function start(down: number, up: number): Promise<Pool> {
  const pool = await Pool.start({
    command: ["python3", RELAY, String(down), String(up), process.execPath, FIXTURE],
    workers: 1,
    heartbeatMs: 200,
    maxFrameSize: 1 << 20,
    startupTimeoutMs: 20_000,
  });
  return track(pool);
}

function pids(pool: Pool): number[] {
  return pool.metrics().workers.filter((w) => w.alive).map((w) => w.pid);
}

test("a 32 MiB RESULT over a slow link keeps its worker alive with a 200 ms heartbeat", T, async () => {
  const pool = await start(RATE, 0);
  const before = pids(pool);
  const started = performance.now();
  const got = (await pool.call("fill", Buffer.from(String(SIZE)), { codec: "raw" })) as Buffer;
  const took = performance.now() - started;
  assert.equal(got.length, SIZE);
  for (let i = 0; i < SIZE; i += 4093) assert.equal(got[i], (i * 31 + 7) & 0xff, `byte ${i}`);
  // The link was slow enough for the old behaviour to fail: many heartbeats passed.
  assert.ok(took > 1200, `32 MiB at 25 MB/s took only ${took} ms`);
  assert.deepEqual(pids(pool), before, "the worker was not replaced");
});

test("a 32 MiB REQUEST over a slow link keeps its worker alive with a 200 ms heartbeat", T, async () => {
  const pool = await start(0, RATE);
  const before = pids(pool);
  const body = Buffer.allocUnsafe(SIZE);
  for (let i = 0; i < SIZE; i++) body[i] = (i * 17 + 3) & 0xff;
  let sum = 0;
  for (let i = 0; i < SIZE; i += 4093) sum = (sum + body[i]) >>> 0;
  const started = performance.now();
  const got = (await pool.call("measure", body, { codec: "raw" })) as Buffer;
  const took = performance.now() - started;
  assert.deepEqual(JSON.parse(got.toString()), { n: SIZE, sum });
  assert.ok(took > 1200, `32 MiB at 25 MB/s took only ${took} ms`);
  assert.deepEqual(pids(pool), before, "the worker was not replaced");
});
