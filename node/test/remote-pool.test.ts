// A Pool whose workers join over TCP + TLS 1.3 (PoolOptions.remote, PROTOCOL.md 21): Node and
// Python workers started as children with a single-use ticket each do calls, a stream and a map;
// a remote worker's crash is WORKER_EXITED with details {connection: "lost"} and no exit status;
// the pool replaces it. Every test is bounded by its timeout and closes its pool and listener.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { ErrorCode } from "../src/proto/constants.js";
import { Listener } from "../src/parent/listener.js";
import { Pool } from "../src/parent/pool.js";
import { WorkerExitedError, WirepoolError } from "../src/parent/errors.js";

const FIXTURE = new URL("./parent-fixture.js", import.meta.url).pathname;
const REPO = path.resolve(new URL("../../..", import.meta.url).pathname);
const VENV_PYTHON = path.join(REPO, ".venv/bin/python");
const PY_WORKER = path.join(REPO, "python/conformance/worker.py");
const T = { timeout: 60_000 };

test("remote Node workers over TLS: calls, a stream, a map; a crash is a lost connection, replaced", T, async () => {
  await using listener = await Listener.start({ log: () => {} });
  await using pool = await Pool.start({ command: [process.execPath, FIXTURE], workers: 2, remote: listener });
  assert.deepEqual(await pool.call("echo", { a: [1, 2] }), { a: [1, 2] });
  const rows: unknown[] = [];
  const s = pool.stream("rows", { n: 5, size: 1 });
  for await (const row of s) rows.push(row);
  assert.deepEqual(rows, [[0, "x"], [1, "x"], [2, "x"], [3, "x"], [4, "x"]]);
  assert.deepEqual(await pool.map<number, number>("echo", [1, 2, 3]), [1, 2, 3]);
  assert.equal(listener.stats().joined, 2);
  let error: unknown = null;
  try {
    await pool.call("crash", null);
  } catch (e) {
    error = e;
  }
  assert.ok(error instanceof WorkerExitedError, `got ${error}`);
  assert.equal(error.exitStatus, null);
  assert.equal(error.signal, null);
  assert.equal(error.stderrTail, "");
  assert.equal((error.details as { connection?: string }).connection, "lost");
  assert.match(error.message, /^the remote worker 127\.0\.0\.1:\d+ pid \d+ lost its connection/);
  // Replaced by a third join.
  assert.equal(await pool.call("echo", 7), 7);
  assert.equal(await pool.call("echo", 8), 8);
});

test("remote Python workers over TLS: calls and a stream", { ...T, skip: existsSync(VENV_PYTHON) ? false : "no .venv" }, async () => {
  await using listener = await Listener.start({ log: () => {} });
  await using pool = await Pool.start({ command: [VENV_PYTHON, PY_WORKER], workers: 1, remote: listener });
  assert.deepEqual(await pool.call("echo", { x: "y" }), { x: "y" });
  assert.deepEqual(await pool.call("add", { a: 2, b: 3 }), { sum: 5 });
  const got: unknown[] = [];
  for await (const row of pool.stream("decls", { n: 3 })) got.push(row);
  assert.equal(got.length, 3);
});

test("a remote worker that never joins is STARTUP_TIMEOUT; a bad remote option is INVALID_ARGUMENT", T, async () => {
  await using listener = await Listener.start({ log: () => {} });
  // `sleep` never reads its ticket: no join within the start-up timeout.
  await assert.rejects(Pool.start({ command: ["sleep", "30"], workers: 1, remote: listener, startupTimeoutMs: 300 }),
    (e: unknown) => e instanceof WirepoolError && e.code === ErrorCode.STARTUP_TIMEOUT);
  await assert.rejects(Pool.start({ command: [process.execPath, FIXTURE], remote: {} as unknown as Listener }),
    (e: unknown) => e instanceof WirepoolError && e.code === ErrorCode.INVALID_ARGUMENT);
});
