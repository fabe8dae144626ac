// A worker for the parent driver's tests (test/parent.test.ts): the few conformance methods
// they need, on the Node worker SDK, so the tests need no other language's build.

import { setTimeout as sleepMs } from "node:timers/promises";
import { type Context, Worker } from "../src/index.js";

const CRASH_LINE = "parent fixture: crash requested";
const w = new Worker({ maxConcurrency: 64 });

function crash(): never {
  process.stderr.write(CRASH_LINE + "\n");
  process.kill(process.pid, "SIGABRT");
  throw new Error("unreachable");
}

w.method("echo", (body: unknown) => body, { codecs: ["raw", "json"] });
w.method("whoami", () => process.pid, { codecs: ["json"] });
w.method("fail", () => {
  throw new Error("the fail method was called");
}, { codecs: ["json"] });
w.method("sleep", async (ms: number, ctx: Context) => {
  await sleepMs(ms, undefined, { signal: ctx.signal });
  return ms;
}, { codecs: ["json"] });
w.method("hang", async (ms: number) => {
  await sleepMs(ms); // deaf to cancellation on purpose
  return ms;
}, { codecs: ["json"] });
w.method("freeze", async () => {
  process.kill(process.pid, "SIGSTOP");
  await new Promise(() => {});
}, { codecs: ["json"] });
w.method("crash", () => crash(), { codecs: ["json"] });
w.stream("crash_stream", async function* (req: { n: number }) {
  for (let i = 0; i < req.n; i++) yield i;
  // Let the rows leave before dying (the flush bound is 10 ms).
  await sleepMs(50);
  crash();
}, { codecs: ["json"] });
w.stream("forever", function* (_req: unknown, ctx: Context) {
  for (let i = 0; !ctx.cancelled; i++) yield i;
}, { codecs: ["json"] });

let produced = 0;
w.stream("rows", function* (req: { n: number; size: number }, ctx: Context) {
  produced = 0;
  const pad = "x".repeat(req.size);
  for (let i = 0; i < req.n; i++) {
    if (ctx.cancelled) return null;
    const row = [i, pad];
    produced = i + 1; // counted before the hand-over, which may wait for credit
    yield row;
  }
  return { rows: req.n };
}, { codecs: ["json"] });
w.method("produced", () => produced, { codecs: ["json"] });
w.method("print", (req: { n: number }) => {
  process.stderr.write("x".repeat(req.n) + "\nlast line\n");
  return req.n;
}, { codecs: ["json"] });

// A large result from a small request (test/heartbeat-large.test.ts): `n` bytes, byte i = i * 31 + 7.
w.method("fill", (req: Buffer) => {
  const n = Number(req.toString());
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + 7) & 0xff;
  return b;
}, { codecs: ["raw"] });
// The length and a checksum of a (large) request body.
w.method("measure", (body: Buffer) => {
  let sum = 0;
  for (let i = 0; i < body.length; i += 4093) sum = (sum + body[i]) >>> 0;
  return Buffer.from(JSON.stringify({ n: body.length, sum }));
}, { codecs: ["raw"] });

await w.serve();
