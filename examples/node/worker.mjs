// The worker every Node example starts: a few lines to expose methods.
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "wirepool";

const w = new Worker();

w.method("add", (req) => ({ sum: req.a + req.b }));

// Worker-side session state: a lease keeps later calls on this same process.
const memory = [];
w.method("remember", (req) => {
  memory.push(req.item);
  return { pid: process.pid, items: memory };
});

// ctx.signal aborts on the parent's CANCEL and at the call's deadline.
w.method("sleep", async (req, ctx) => {
  try {
    await sleep(req.ms, undefined, { signal: ctx.signal });
    return { stopped: "done" };
  } catch (e) {
    if (!ctx.cancelled) throw e;
    console.log("sleep: cancelled, stopping early");
    return { stopped: "cancelled" };
  }
});

w.method("crash", () => {
  console.error("crash: about to die on purpose");
  process.exit(3);
});

// Rows are yielded one at a time; the SDK batches them into frames and waits for credit.
w.stream("decls", function* (req, ctx) {
  for (let i = 0; i < req.n && !ctx.cancelled; i++) yield { i, name: `decl_${i}`, kind: "theorem" };
  return { count: req.n }; // the summary
});

await w.serve();
