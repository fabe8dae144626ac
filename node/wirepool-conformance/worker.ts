/**
 * The Node conformance worker: the method set of conformance/README.md on the Node SDK, so that
 * every parent runner of the matrix drives it with the one scenario list. Started by a parent
 * (`WIREPOOL_FD`), or joining one with a ticket (`WIREPOOL_TICKET`: conformance/test_remote.py);
 * not meant to be run by hand.
 *
 * Node runs handlers on one event loop, so the methods that "block" in the other workers wait on
 * timers here (`hang` ignores its signal; `spin` busy-loops in 5 ms slices, yielding between
 * them so the I/O loop still answers PING, as a CPU-bound Node handler should).
 */

import { setTimeout as sleepMs } from "node:timers/promises";
import { type Context, Worker, WorkerError } from "wirepool";

const CRASH_LINE = "conformance worker: crash requested";
const APP_ERROR_CODE = 1042;

const w = new Worker({ maxConcurrency: 64 });

w.method("echo", (body: unknown) => body, { codecs: ["raw", "json", "msgpack", "cbor"] });

w.method("add", (req: { a: number | bigint; b: number | bigint }) => {
  const { a, b } = req;
  if (typeof a === "bigint" || typeof b === "bigint") return { sum: BigInt(a) + BigInt(b) };
  const sum = a + b;
  return { sum: Number.isSafeInteger(sum) ? sum : BigInt(a) + BigInt(b) };
}, { codecs: ["json"] });

function decl(i: number) {
  return { i, name: `decl_${i}`, kind: "theorem" };
}

w.stream("decls", function* (req: { n: number }, ctx: Context) {
  const n = Number(req.n);
  for (let i = 0; i < n; i++) {
    if (ctx.cancelled) return null;
    yield decl(i);
  }
  return { rows: n };
}, { codecs: ["json", "msgpack", "cbor"] });

let produced = 0;

w.stream("raw_rows", function* (req: Buffer, ctx: Context) {
  const [n, size] = req.toString("utf8").trim().split(/\s+/).map(Number);
  produced = 0;
  const prefix = Math.min(size, 8);
  const index = Buffer.alloc(8);
  for (let i = 0; i < n; i++) {
    if (ctx.cancelled) return null;
    const row = Buffer.alloc(size, 0xab);
    index.writeBigUInt64LE(BigInt(i));
    index.copy(row, 0, 0, prefix);
    produced = i + 1; // counted before the hand-over, which may wait for credit
    yield row;
  }
  return null;
}, { codecs: ["raw"] });

w.method("raw_rows_produced", () => produced, { codecs: ["json"] });

w.stream("forever", function* (_req: unknown, ctx: Context) {
  for (let i = 0; !ctx.cancelled; i++) yield i;
}, { codecs: ["json"] });

w.stream("one_row_then_wait", async function* (_req: unknown, ctx: Context) {
  yield 0;
  // Blocks until cancelled: the SDK must still send row 0 (the flush rule, spec 6).
  if (!ctx.cancelled) await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
}, { codecs: ["json"] });

w.method("sleep", async (ms: number, ctx: Context) => {
  await sleepMs(ms, undefined, { signal: ctx.signal }); // rejects on cancel or deadline
  return ms;
}, { codecs: ["json"] });

w.method("hang", async (ms: number) => {
  await sleepMs(ms); // deaf to cancellation and deadline on purpose
  return ms;
}, { codecs: ["json"] });

w.method("fail", () => {
  throw new Error("the fail method was called");
}, { codecs: ["json"] });

w.method("fail_app", (req: unknown) => {
  throw new WorkerError(APP_ERROR_CODE, "application failure", { request: req });
}, { codecs: ["json"] });

w.method("fail_long", (req: { n: number }) => {
  throw new WorkerError(APP_ERROR_CODE, "long failure: " + "\u00e9".repeat(req.n));
}, { codecs: ["json"] });

/** The scenarios' {"string": {"size": N}}: character i is 'a' + (31 i + 17) mod 26. */
function patternString(size: number): string {
  const b = Buffer.allocUnsafe(size);
  for (let i = 0; i < size; i++) b[i] = 97 + ((i * 31 + 17) % 26);
  return b.toString("latin1");
}

w.stream("big_summary", function* (req: { size: number }) {
  yield 0;
  return patternString(req.size);
}, { codecs: ["json"] });

w.stream("fail_after", function* (req: { n: number }) {
  for (let i = 0; i < req.n; i++) yield decl(i);
  throw new Error("failed after the rows");
}, { codecs: ["json"] });

let gathered = 0;
const gatherWaiters = new Set<() => void>();

w.method("gather", async (n: number, ctx: Context) => {
  gathered++;
  for (const wake of gatherWaiters) wake();
  while (gathered < n) {
    if (ctx.cancelled) throw new Error("cancelled while gathering");
    await new Promise<void>((resolve) => {
      const done = () => {
        gatherWaiters.delete(done);
        ctx.signal.removeEventListener("abort", done);
        resolve();
      };
      gatherWaiters.add(done);
      ctx.signal.addEventListener("abort", done, { once: true });
    });
  }
  return n;
}, { codecs: ["json"] });

function abort(): never {
  process.stderr.write(CRASH_LINE + "\n"); // synchronous on pipes and files (Linux)
  // SIGABRT by default action: process.abort() would print a native backtrace to stderr first,
  // pushing the crash line out of the parent's stderr tail.
  process.kill(process.pid, "SIGABRT");
  throw new Error("unreachable: SIGABRT was delivered");
}

w.method("crash", () => abort(), { codecs: ["json"] });

w.stream("crash_stream", async function* (req: { n: number }) {
  for (let i = 0; i < req.n; i++) yield decl(i);
  abort();
}, { codecs: ["json"] });

w.method("spin", async (ms: number, ctx: Context) => {
  const end = performance.now() + ms;
  while (performance.now() < end && !ctx.cancelled) {
    const slice = Math.min(end, performance.now() + 5);
    while (performance.now() < slice) {
      // busy: this is the CPU-bound part
    }
    await new Promise((resolve) => setImmediate(resolve));
  }
  if (ctx.cancelled) throw ctx.signal.reason;
  return ms;
}, { codecs: ["json"] });

w.method("whoami", () => process.pid, { codecs: ["json"] });

w.method("exit", (req: { status: number }) => {
  process.exit(req.status);
}, { codecs: ["json"] });

w.method("freeze", async () => {
  process.kill(process.pid, "SIGSTOP");
  // Resumed: never answer, so the outcome cannot depend on when the resume came.
  await new Promise(() => {});
}, { codecs: ["json"] });

w.method("print", (req: { stream: string; n: number }) => {
  const out = req.stream === "stdout" ? process.stdout : req.stream === "stderr" ? process.stderr : null;
  if (out === null) throw new Error(`no stream named ${JSON.stringify(req.stream)}`);
  out.write("x".repeat(req.n));
  return req.n;
}, { codecs: ["json"] });

await w.serve();
