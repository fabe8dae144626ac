// A pool nobody closes (PoolOptions' docs, README "A forgotten pool"): its handles are unref()ed
// while it is idle, so `node script.js` exits when the script is done, and its workers leave with
// it (end of file on their connection). A call in flight keeps the process alive until it is
// answered. Each case runs test/forgotten-fixture.ts in its own Node process, bounded; waits
// are on the script's exit and on the workers' pids leaving the process table, never on a sleep
// as synchronisation (the poll below only bounds how long a reap may take).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

const SCRIPT = new URL("./forgotten-fixture.js", import.meta.url).pathname;
const T = { timeout: 60_000 };

/** Runs the fixture script; resolves with its exit and output, or kills it and fails after `ms`. */
function runScript(mode: string, ms = 20_000): Promise<{ code: number | null; signal: string | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [SCRIPT, mode], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (s: string) => (stdout += s));
    child.stderr.setEncoding("utf8").on("data", (s: string) => (stderr += s));
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`the script (${mode}) did not exit within ${ms} ms; stdout ${JSON.stringify(stdout)}, stderr ${JSON.stringify(stderr)}`));
    }, ms);
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

/** Whether `pid` still runs (a zombie waiting for its new parent's reap counts as gone). */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** Waits until none of `pids` runs (they get end of file when their parent exits), bounded. */
async function gone(pids: number[], ms = 15_000): Promise<void> {
  const deadline = performance.now() + ms;
  for (;;) {
    const left = pids.filter(running);
    if (left.length === 0) return;
    if (performance.now() > deadline) {
      for (const pid of left) process.kill(pid, "SIGKILL");
      assert.fail(`workers ${left.join(", ")} outlived their parent by ${ms} ms`);
    }
    await sleep(10);
  }
}

function workerPids(stdout: string): number[] {
  const pids = JSON.parse(stdout.split("\n")[0]) as number[];
  assert.equal(pids.length, 2);
  for (const pid of pids) assert.ok(Number.isInteger(pid) && pid > 0);
  return pids;
}

test("a forgotten idle pool: the script exits by itself, status 0, and its workers leave", T, async () => {
  const r = await runScript("idle");
  assert.equal(r.code, 0, r.stderr);
  await gone(workerPids(r.stdout));
});

test("a forgotten pool with a call in flight: the script stays for the answer, then exits", T, async () => {
  const r = await runScript("inflight");
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /\nlate 200\n$/);
  await gone(workerPids(r.stdout));
});

test("an exception before close(): the script exits with it, and its workers leave", T, async () => {
  const r = await runScript("throw");
  assert.equal(r.code, 1);
  assert.match(r.stderr, /an exception before close\(\)/);
  await gone(workerPids(r.stdout));
});
