// A lease holds one worker for a sequence of calls: node examples/node/lease.mjs
import { Pool } from "wirepool";

const WORKER = [process.execPath, new URL("./worker.mjs", import.meta.url).pathname];

const pool = await Pool.start({ command: WORKER, workers: 2 });
try {
  const worker = await pool.lease(); // the pool keeps serving other calls meanwhile
  try {
    for (const item of ["a", "b", "c"]) console.log(JSON.stringify(await worker.call("remember", { item })));
  } finally {
    worker.release();
  }
} finally {
  await pool.close();
}
