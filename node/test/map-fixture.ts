// A worker for test/map-options.test.ts and test/retry.test.ts (on the Node worker SDK): calls
// held until the test opens their gate (so "which finishes first" is decided by the test, not by
// a clock), calls that fail by their argument, and a call that crashes its worker the first time.

import { existsSync, writeFileSync } from "node:fs";
import { Worker, WorkerError } from "../src/index.js";

const w = new Worker({ maxConcurrency: 64 });
const gates = new Map<string, { promise: Promise<void>; open: () => void }>();

function gate(key: string): { promise: Promise<void>; open: () => void } {
  let g = gates.get(key);
  if (g === undefined) {
    let open!: () => void;
    const promise = new Promise<void>((resolve) => (open = resolve));
    g = { promise, open };
    gates.set(key, g);
  }
  return g;
}

/** `{v}` answers v at once; `{v, gate}` once the gate of that name is opened (`open`). */
w.method("gated", async (req: { v: unknown; gate?: string }) => {
  if (req.gate !== undefined) await gate(req.gate).promise;
  return req.v;
}, { codecs: ["json"] });
w.method("open", (key: string) => {
  gate(key).open();
  return true;
}, { codecs: ["json"] });
/** Even numbers back; an odd one is the worker's error 1400. */
w.method("fail_odd", (n: number) => {
  if (n % 2 === 1) throw new WorkerError(1400, `odd ${n}`, { n });
  return n;
}, { codecs: ["json"] });
w.method("whoami", () => process.pid, { codecs: ["json"] });
/** Crashes the worker unless the file exists (it is created first): one crash, then success. */
w.method("crash_once", (path: string) => {
  if (!existsSync(path)) {
    writeFileSync(path, String(process.pid));
    process.exit(3);
  }
  return process.pid;
}, { codecs: ["json"] });
w.method("crash", () => process.exit(3), { codecs: ["json"] });
/** A stream that crashes its worker before any row unless the file exists (created first). */
w.stream("crash_once_stream", function* (path: string) {
  if (!existsSync(path)) {
    writeFileSync(path, String(process.pid));
    process.exit(3);
  }
  yield 1;
  yield 2;
  return { pid: process.pid };
}, { codecs: ["json"] });
/** A stream that sends rows, then crashes its worker (rows reached the caller: never retried). */
w.stream("rows_then_crash", async function* () {
  yield 1;
  await new Promise((resolve) => setTimeout(resolve, 50)); // the row leaves first (the 10 ms flush)
  process.exit(3);
}, { codecs: ["json"] });
w.method("fail", () => {
  throw new Error("the fail method was called");
}, { codecs: ["json"] });

await w.serve();
