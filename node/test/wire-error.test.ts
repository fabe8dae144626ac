// An ERROR's fate is decided by its id, never its code (PROTOCOL.md section 3): a code a worker
// puts on the wire for a request (a 3xx, a 1xx, an unassigned one) ends only that request, as
// the worker's error (a RequestError carrying the code), never as the local outcome of that name
// (a wire 300 is no WorkerExitedError: no death, nothing killed, the worker keeps serving). The
// worker is test/wire-error-fixture.ts (the bare core). Bounded by its timeout; the pool closes.

import assert from "node:assert/strict";
import { test } from "node:test";
import { LocalError, Pool, RequestError, WirepoolError } from "../src/index.js";

const FIXTURE = new URL("./wire-error-fixture.js", import.meta.url).pathname;

test("wire codes of every range end only their request, as the worker's RequestError", { timeout: 60_000 }, async () => {
  const pool = await Pool.start({ command: [process.execPath, FIXTURE], workers: 1 });
  try {
    const pid = pool.metrics().workers[0].pid;
    const cases: [number, string][] = [
      [0, "UNKNOWN"], [50, "UNKNOWN"], [150, "PROTOCOL"], [120, "CODEC_MISMATCH"],
      [300, "WORKER_EXITED"], [301, "WORKER_HUNG"], [305, "LEASE_LOST"], [307, "PROTOCOL_VIOLATION"],
      [399, "LOCAL"], [400, "UNKNOWN"], [999, "UNKNOWN"],
    ];
    for (const [code] of cases) {
      let err: unknown;
      try {
        await pool.call("fail", code);
      } catch (e) {
        err = e;
      }
      assert.ok(err instanceof RequestError, `code ${code}: a RequestError, got ${(err as Error)?.name}`);
      assert.ok(!(err instanceof LocalError), `code ${code}: not a local outcome`);
      assert.equal((err as WirepoolError).code, code);
      assert.equal((err as WirepoolError).message, "sent by the worker");
      assert.equal((err as WirepoolError).exitStatus, null);
    }
    // The same worker answers still: nothing was killed, restarted or counted as a death.
    assert.deepEqual(await pool.call("echo", { n: 1 }), { n: 1 });
    const m = pool.metrics();
    assert.equal(m.restarts, 0);
    assert.equal(m.workers.length, 1);
    assert.equal(m.workers[0].pid, pid);
    assert.equal(m.workers[0].state, "ready");
    // On a lease too: a wire 305 is the worker's error, the lease is not lost.
    const lease = await pool.lease();
    try {
      await assert.rejects(lease.call("fail", 305), (e: unknown) => e instanceof RequestError && e.code === 305);
      assert.deepEqual(await lease.call("echo", [2]), [2]);
    } finally {
      lease.release();
    }
  } finally {
    await pool.close({ graceMs: 0 });
  }
});
