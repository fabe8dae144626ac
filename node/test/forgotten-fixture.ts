// A script that forgets its pool (test/forgotten.test.ts): it starts two workers, calls each,
// prints their pids as JSON on the first line of stdout, and never calls close(). Modes:
//   idle      the script ends with the pool idle: Node must exit by itself;
//   inflight  a call still in flight when the script's code ends: Node stays for its answer
//             (printed as "late <n>"), then exits;
//   throw     an exception before close(): Node exits with it (status 1).

import { Pool } from "../src/index.js";

const FIXTURE = new URL("./parent-fixture.js", import.meta.url).pathname;
const mode = process.argv[2] ?? "idle";
const pool = await Pool.start({ command: [process.execPath, FIXTURE], workers: 2 });
const pids = pool.metrics().workers.map((w) => w.pid);
await pool.map("whoami", [null, null]);
process.stdout.write(JSON.stringify(pids) + "\n");
if (mode === "inflight") {
  // Not awaited: only the pool's hold on the event loop keeps the process alive for it.
  void pool.call("sleep", 200).then((v) => process.stdout.write(`late ${v}\n`));
} else if (mode === "throw") {
  throw new Error("an exception before close()");
}
