// A worker that dies on purpose: one typed error, then a replacement. node examples/node/crash.mjs
import { Pool, WorkerExitedError } from "wirepool";

const WORKER = [process.execPath, new URL("./worker.mjs", import.meta.url).pathname];

const pool = await Pool.start({ command: WORKER, workers: 1 });
try {
  try {
    await pool.call("crash", {});
  } catch (e) {
    if (!(e instanceof WorkerExitedError)) throw e;
    console.log(`${e.codeName} (${e.code}): ${e.message}`);
    console.log(`exit status ${e.exitStatus}, stderr: ${e.stderrTail.trim()}`);
  }
  console.log("the pool replaced the worker:", JSON.stringify(await pool.call("add", { a: 40, b: 2 })));
} finally {
  await pool.close();
}
