// Cancellation and deadlines: node examples/node/cancel.mjs
import { CancelledError, DeadlineExceededError, Pool } from "wirepool";

const WORKER = [process.execPath, new URL("./worker.mjs", import.meta.url).pathname];

const pool = await Pool.start({ command: WORKER, workers: 1 });
try {
  // Aborting the signal sends CANCEL; the handler's ctx.signal fires and it stops.
  const abort = new AbortController();
  const call = pool.call("sleep", { ms: 60_000 }, { signal: abort.signal });
  let abortedAt = 0;
  setTimeout(() => {
    abortedAt = performance.now();
    abort.abort();
  }, 200);
  try {
    await call;
  } catch (e) {
    if (!(e instanceof CancelledError)) throw e;
    console.log(`cancelled: ${e.codeName} ${e.code}; the worker stayed warm (ended ${(performance.now() - abortedAt).toFixed(1)} ms after the abort)`);
  }
  // A deadline travels on the wire and is enforced by the parent too.
  try {
    await pool.call("sleep", { ms: 60_000 }, { timeoutMs: 300 });
  } catch (e) {
    if (!(e instanceof DeadlineExceededError)) throw e;
    console.log("deadline:", e.codeName, e.code);
  }
  console.log("the same worker still answers:", JSON.stringify(await pool.call("add", { a: 2, b: 2 })));
} finally {
  await pool.close();
}
