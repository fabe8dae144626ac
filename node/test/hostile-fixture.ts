// A worker for test/parent-hostile.test.ts: the misbehaviours the parent must survive that the
// shared fixture (parent-fixture.ts) does not have: a flood of stderr, garbage on the connection
// after the handshake, and a few ordinary methods to keep requests in flight meanwhile.

import { writeSync } from "node:fs";
import { setTimeout as sleepMs } from "node:timers/promises";
import { type Context, Worker } from "../src/index.js";

const CRASH_LINE = "hostile fixture: crash requested";
const w = new Worker({ maxConcurrency: 64 });

w.method("echo", (body: unknown) => body, { codecs: ["json"] });
w.method("whoami", () => process.pid, { codecs: ["json"] });
w.method("sleep", async (ms: number, ctx: Context) => {
  await sleepMs(ms, undefined, { signal: ctx.signal });
  return ms;
}, { codecs: ["json"] });
w.method("hang", async (ms: number) => {
  await sleepMs(ms); // deaf to cancellation on purpose
  return ms;
}, { codecs: ["json"] });
w.method("crash", () => {
  process.stderr.write(CRASH_LINE + "\n");
  process.kill(process.pid, "SIGABRT");
}, { codecs: ["json"] });

// `mb` MiB of stderr in 1 MiB writes (lines of `line` bytes, and one line of `longLine` bytes
// without a newline for a while), yielding to the event loop between writes so the worker keeps
// answering PINGs and other requests; then `tail` numbered lines, the last ones written.
w.method("flood", async (req: { mb: number; line: number; longLine: number; tail: number }) => {
  const MiB = 1 << 20;
  const row = "e".repeat(req.line - 1) + "\n";
  const chunk = Buffer.from(row.repeat(Math.floor(MiB / req.line)));
  let written = 0;
  const write = (b: Buffer): Promise<void> =>
    new Promise((resolve, reject) => process.stderr.write(b, (e) => (e ? reject(e) : resolve())));
  for (let k = 0; written < req.mb * MiB; k++) {
    if (k === 3 && req.longLine > 0) {
      // A line with no newline yet, several chunks long.
      for (let left = req.longLine; left > 0; left -= MiB) {
        const piece = Buffer.alloc(Math.min(MiB, left), "L");
        await write(piece);
        written += piece.length;
      }
      await write(Buffer.from("\n"));
      written += 1;
    }
    await write(chunk);
    written += chunk.length;
    await new Promise((r) => setImmediate(r));
  }
  for (let i = 0; i < req.tail; i++) await write(Buffer.from(`tail line ${i}\n`));
  return written;
}, { codecs: ["json"] });

// Bytes that are no frame, straight onto the connection after the handshake (fd 3: the SDK
// removes WIREPOOL_FD from the environment once read). The parent must fail every request in
// flight on this connection with PROTOCOL_VIOLATION and replace the worker.
w.method("garbage", () => {
  writeSync(3, Buffer.from("this is not a frame header at all, mid-session"));
  return new Promise(() => {}); // never answers: the parent ends it
}, { codecs: ["json"] });

w.stream("forever", function* (_req: unknown, ctx: Context) {
  for (let i = 0; !ctx.cancelled; i++) yield i;
}, { codecs: ["json"] });

await w.serve();
