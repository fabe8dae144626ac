// Every Node example runs and prints what its header promises (`npm test` here; `make test`).
import { execFile } from "node:child_process";
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const HERE = fileURLToPath(new URL("..", import.meta.url));

const EXPECTED = {
  "unary.mjs": ["1 + 2 = 3", "sum of 10,000 calls: 50005000"],
  "stream.mjs": ["100000 rows", 'last {"i":99999,"name":"decl_99999","kind":"theorem"}', 'summary {"count":100000}'],
  "lease.mjs": ['"items":["a"]', '"items":["a","b","c"]'],
  "cancel.mjs": ["cancelled: CANCELLED 205; the worker stayed warm", "deadline: DEADLINE_EXCEEDED 206",
    'the same worker still answers: {"sum":4}'],
  "crash.mjs": ["WORKER_EXITED (300)", "exited with status 3", "stderr: crash: about to die on purpose",
    'the pool replaced the worker: {"sum":42}'],
};

/** Runs one example to its end (killed after 60 s) and returns its stdout. */
function run(name) {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [name], { cwd: HERE, timeout: 60_000, killSignal: "SIGKILL" }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${name} failed (${err.code ?? err.signal}):\n${stdout}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

for (const [name, lines] of Object.entries(EXPECTED)) {
  test(name, async () => {
    const out = await run(name);
    for (const line of lines) assert.ok(out.includes(line), `${name}: ${JSON.stringify(line)} not in its output:\n${out}`);
  });
}

test("lease.mjs keeps one worker for every call", async () => {
  const out = await run("lease.mjs");
  const pids = new Set(out.trim().split("\n").map((l) => JSON.parse(l).pid));
  assert.equal(pids.size, 1, out);
});
