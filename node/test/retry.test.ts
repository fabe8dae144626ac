// The pool's retry policy (PROTOCOL.md 21.7, 22.2 retry_attempts; Python's and Rust's
// RetryPolicy): a call of a listed idempotent method whose worker dies is sent again, to
// another worker or the replacement (a stream only before any of its rows); nothing else is.
// The worker is test/map-fixture.ts (crash_once crashes the first time, by a file it creates). Every test is bounded by its
// timeout and closes its pool; nothing waits on a sleep.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { ErrorCode, InvalidArgumentError, Pool, RequestError, WorkerExitedError } from "../src/index.js";
import { fixturePools, rejection } from "./pool-helpers.js";

const FIXTURE = new URL("./map-fixture.js", import.meta.url).pathname;
const T = { timeout: 60_000 };
const DIR = mkdtempSync(join(tmpdir(), "wirepool-retry-"));
let files = 0;
const marker = () => join(DIR, `crash-${files++}`);

after(() => rmSync(DIR, { recursive: true, force: true }));

const start = fixturePools(FIXTURE, { restartBackoffMs: 0 });

test("a listed method whose worker crashes is sent again: success from another worker, counted in retries", T, async () => {
  const pool = await start({ workers: 2, retry: { methods: ["crash_once"], attempts: 3 } });
  const pids = pool.metrics().workers.map((w) => w.pid);
  const pid = await pool.call<number>("crash_once", marker());
  assert.ok(pids.includes(pid), "the other worker, already running, answered");
  assert.equal(pool.metrics().retries, 1);
  assert.equal(pool.metrics().failuresByCode.WORKER_EXITED, 1, "the first try's outcome");
});

test("one worker: the retry waits for the replacement, within the call's deadline", T, async () => {
  const pool = await start({ retry: { methods: ["crash_once"] } });
  const first = pool.metrics().workers[0].pid;
  const pid = await pool.call<number>("crash_once", marker(), { timeoutMs: 30_000 });
  assert.notEqual(pid, first);
  assert.equal(pool.metrics().retries, 1);
  assert.equal(pool.metrics().restarts, 1);
});

test("no retry for a method not listed, for idempotent: false, for a lease or a map; idempotent: true opts one in", T, async () => {
  const pool = await start({ workers: 2, retry: { methods: ["whoami"], attempts: 5 } });
  const e = await rejection(pool.call("crash_once", marker()));
  assert.ok(e instanceof WorkerExitedError, String(e));
  assert.equal(e.code, ErrorCode.WORKER_EXITED);
  assert.equal((e.details as { attempts?: number } | undefined)?.attempts, undefined, "not under the policy: no attempts");
  assert.equal(pool.metrics().retries, 0);

  const listed = await start({ workers: 2, retry: { methods: ["crash_once"] } });
  const off = await rejection(listed.call("crash_once", marker(), { idempotent: false }));
  assert.ok(off instanceof WorkerExitedError);
  const lease = await listed.lease();
  const leased = await rejection(lease.call("crash_once", marker()));
  assert.ok(leased instanceof WorkerExitedError, "a lease is never retried");
  lease.release();
  const [mapped] = await listed.map("crash_once", [marker()], { returnExceptions: true });
  assert.ok(mapped instanceof WorkerExitedError, "a map is never retried");
  assert.equal(listed.metrics().retries, 0);

  const marked = await pool.call<number>("crash_once", marker(), { idempotent: true });
  assert.equal(typeof marked, "number");
  assert.equal(pool.metrics().retries, 1);
});

test("a handler's error is the answer: never retried", T, async () => {
  const pool = await start({ retry: { methods: ["fail", "fail_odd"], attempts: 4 } });
  const e = await rejection(pool.call("fail"));
  assert.ok(e instanceof RequestError, String(e));
  assert.equal(e.code, ErrorCode.HANDLER_ERROR);
  const app = await rejection(pool.call("fail_odd", 3));
  assert.equal(app.code, 1400);
  assert.deepEqual(app.details, { n: 3, attempts: 1 });
  assert.equal(pool.metrics().retries, 0);
  assert.equal(pool.metrics().restarts, 0);
});

test("attempts exhausted: the last try's error, with the attempts in its details", T, async () => {
  const pool = await start({ workers: 2, retry: { methods: ["crash"], attempts: 3 }, maxRestarts: 10 });
  const e = await rejection(pool.call("crash"));
  assert.ok(e instanceof WorkerExitedError, String(e));
  assert.equal(e.exitStatus, 3);
  assert.equal((e.details as { attempts: number }).attempts, 3);
  assert.equal(pool.metrics().retries, 2);
  assert.equal(pool.metrics().failuresByCode.WORKER_EXITED, 3);
  // attempts: 1 never sends again.
  const once = await start({ retry: { methods: ["crash"], attempts: 1 } });
  const e1 = await rejection(once.call("crash"));
  assert.ok(e1 instanceof WorkerExitedError);
  assert.equal(once.metrics().retries, 0);
});

test("bad retry options are INVALID_ARGUMENT (308) before any worker is spawned; never clamped", T, async () => {
  const unspawnable = ["/nonexistent/wirepool-retry-must-not-spawn"];
  const bad: unknown[] = [
    { methods: ["x"], attempts: 0 },
    { methods: ["x"], attempts: 101 },
    { methods: ["x"], attempts: 1.5 },
    { methods: ["x"], attempts: -1 },
    { methods: ["x"], attempts: NaN },
    { methods: ["x"], attempts: "3" },
    { methods: "crash" },
    { methods: [1] },
    { methods: 5 },
    5,
    "crash",
    [],
  ];
  for (const retry of bad) {
    const e = await rejection(Pool.start({ command: unspawnable, retry: retry as never }));
    assert.ok(e instanceof InvalidArgumentError, `${String(retry)}: ${e}`);
    assert.match(e.message, /^retry(\.methods|\.attempts)? must be/, e.message);
  }
  // The bounds themselves are fine, and null is no policy.
  for (const retry of [{ methods: ["x"], attempts: 1 }, { methods: ["x"], attempts: 100 }, { methods: new Set(["x"]) }, null]) {
    const p = await start({ retry });
    assert.equal(await p.call("gated", { v: 1 }), 1);
  }
  const pool = await start();
  const e = await rejection(pool.call("whoami", null, { idempotent: "yes" as never }));
  assert.ok(e instanceof InvalidArgumentError);
  const none = await rejection(pool.call("whoami", null, { idempotent: true }));
  assert.ok(none instanceof InvalidArgumentError, "idempotent: true needs the pool's retry option");
  assert.equal(await pool.call("whoami", null, { idempotent: false }), pool.metrics().workers[0].pid);
});

test("a stream is sent again only while none of its rows has reached the caller", T, async () => {
  const pool = await start({ workers: 2, retry: { methods: ["crash_once_stream", "rows_then_crash"] } });
  const rows: unknown[] = [];
  const s = pool.stream("crash_once_stream", marker());
  for await (const r of s) rows.push(r);
  assert.deepEqual(rows, [1, 2]);
  assert.equal(typeof (s.summary as { pid: number }).pid, "number");
  assert.equal(pool.metrics().retries, 1);
  const got: unknown[] = [];
  const e = await rejection(
    (async () => {
      for await (const r of pool.stream("rows_then_crash")) got.push(r);
    })(),
  );
  assert.ok(e instanceof WorkerExitedError, String(e));
  assert.deepEqual(got, [1]);
  assert.equal((e.details as { attempts: number }).attempts, 1);
  assert.equal(pool.metrics().retries, 1, "not sent again after a row");
  // Not listed: not retried.
  const plain = await start({ retry: { methods: [] } });
  const e2 = await rejection(
    (async () => {
      for await (const _ of plain.stream("crash_once_stream", marker())) void _;
    })(),
  );
  assert.ok(e2 instanceof WorkerExitedError);
  assert.equal(plain.metrics().retries, 0);
});
