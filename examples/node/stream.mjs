// Stream rows with a summary at the end: node examples/node/stream.mjs
import { Pool } from "wirepool";

const WORKER = [process.execPath, new URL("./worker.mjs", import.meta.url).pathname];

const pool = await Pool.start({ command: WORKER, workers: 1 });
try {
  const rows = pool.stream("decls", { n: 100_000 });
  let count = 0;
  let last;
  for await (const row of rows) { // credit is granted as this loop reads: memory stays bounded
    count++;
    last = row;
  }
  console.log(`${count} rows, last ${JSON.stringify(last)}, summary ${JSON.stringify(rows.summary)}`);
} finally {
  await pool.close();
}
