// Typed unary calls, one and many: node examples/node/unary.mjs
import { Pool } from "wirepool";

const WORKER = [process.execPath, new URL("./worker.mjs", import.meta.url).pathname];

const pool = await Pool.start({ command: WORKER, workers: 2 });
try {
  const { sum } = await pool.call("add", { a: 1, b: 2 });
  console.log("1 + 2 =", sum);
  // Many small calls: map keeps them all in flight across both workers.
  const results = await pool.map("add", Array.from({ length: 10_000 }, (_, i) => ({ a: i, b: 1 })));
  console.log("sum of 10,000 calls:", results.reduce((t, r) => t + r.sum, 0));
} finally {
  await pool.close();
}
