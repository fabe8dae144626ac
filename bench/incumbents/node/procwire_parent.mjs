// Baseline: procwire (npm @procwire/core + @procwire/client), Node parent, Node child.
// Usage: node procwire_parent.mjs [--batch 1] '<scenario json>'
// (--batch 1: the founding workload's rows one per chunk, runner procwire_unbatched.)
// Payloads use rawCodec (Buffers, its fastest path); rows are a msgpack "stream" method, 256 rows
// per chunk (batched by hand). procwire has no pool: a "pool" is N modules with two requests in
// flight each, which is what its README leaves a user to write.
import { Module, ModuleManager } from "@procwire/core";
import { msgpackCodec, rawCodec } from "@procwire/codecs";
import { fileURLToPath } from "node:url";
import {
  figure, loadScenario, maxPeakRssKib, ok, payloadBuffer, peakRssKib, runEchoScenario,
  runPoolScenario, sleep, unsupported,
} from "./common.mjs";

const BATCH = process.argv.includes("--batch") ? Number(process.argv[process.argv.indexOf("--batch") + 1]) : 256;
const RUNNER = BATCH === 1 ? "procwire_unbatched" : "procwire";
const CHILD = fileURLToPath(new URL("./procwire_child.mjs", import.meta.url));

function defineWorker(name) {
  return new Module(name)
    .executable(process.execPath, [CHILD])
    .method("echo", { codec: rawCodec })
    .method("oneway", { codec: rawCodec })
    .method("spin", { codec: msgpackCodec })
    .method("rows", { codec: msgpackCodec, response: "stream" })
    // Its README: 4 MiB socket buffers "for large payloads"; the harness bounds run time, so
    // procwire's own 30 s request timeout is switched off rather than tripping on 256 MiB.
    .spawnPolicy({ socketBufferSize: 4 * 1024 * 1024 })
    .requestTimeout(0);
}

// procwire does not expose the child's pid; find it among our children by its script path.
import { readdirSync, readFileSync } from "node:fs";
function childPids() {
  const pids = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "ascii");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      if (ppid === process.pid) pids.push(Number(entry));
    } catch { /* raced with an exit */ }
  }
  return pids;
}

// The founding workload (bench/shapes/founding.json): every row's index checked.
async function readFounding(sc, worker, n) {
  let seen = 0;
  for await (const chunk of worker.stream("rows", { shape: sc.shape, n, batch: BATCH })) {
    for (const row of BATCH === 1 ? [chunk] : chunk) {
      if (row.id !== seen) throw new Error("row stream out of order");
      seen++;
    }
  }
  if (seen !== n) throw new Error(`got ${seen} rows, expected ${n}`);
}

async function runRows(sc, worker) {
  const rates = [];
  if (sc.founding) {
    await readFounding(sc, worker, Math.min(sc.n, 256));
    // A repeat: whole streams for the scenario's window (at least one).
    const windowNs = BigInt(Math.round((sc.duration_s ?? 0.25) * 1e9));
    for (let r = 0; r < sc.repeats; r++) {
      const start = process.hrtime.bigint();
      let rows = 0;
      while (rows === 0 || process.hrtime.bigint() - start < windowNs) {
        await readFounding(sc, worker, sc.n);
        rows += sc.n;
      }
      rates.push(rows / (Number(process.hrtime.bigint() - start) / 1e9));
    }
    return [figure("rows_per_s", "rows/s", rates)];
  }
  for (let r = 0; r < sc.repeats; r++) {
    const start = process.hrtime.bigint();
    let seen = 0, last = null;
    for await (const batch of worker.stream("rows", { shape: sc.shape, n: sc.n })) {
      for (const row of batch) {
        last = row;
        seen++;
        if (sc.every && seen % sc.every === 0) await sleep(sc.pause_ms);
      }
    }
    if (seen !== sc.n || last.i !== sc.n - 1) throw new Error("row stream out of order");
    rates.push(sc.n / (Number(process.hrtime.bigint() - start) / 1e9));
  }
  return [figure("rows_per_s", "rows/s", rates)];
}

async function main() {
  const sc = loadScenario();
  if (sc.kind === "frames") return unsupported(RUNNER, sc, "floor-only scenario");
  if (BATCH === 1 && !sc.founding) return unsupported(RUNNER, sc, "one row per chunk: the founding workload's rows only");
  const manager = new ModuleManager();
  const count = sc.kind === "pool" ? sc.workers : 1;
  const workers = Array.from({ length: count }, (_, i) => defineWorker(`w${i}`));
  for (const w of workers) manager.register(w);
  try {
    await manager.spawn();
    let figs, notes = sc.kind.endsWith("rows") ? (BATCH === 1 ? "msgpack stream method, one row per chunk" : "msgpack stream method, 256 rows per chunk")
      : "rawCodec (Buffer) payloads";
    if (sc.kind === "pool") {
      figs = await runPoolScenario(sc, workers, (w, us) => w.send("spin", { us }));
      notes = "no pool in procwire: N modules, 2 requests in flight each";
    } else if (sc.kind === "rows" || sc.kind === "slow_rows") {
      figs = await runRows(sc, workers[0]);
    } else {
      const method = sc.kind === "oneway" ? "oneway" : "echo";
      const p = payloadBuffer(sc.payload);
      figs = await runEchoScenario(sc, async () => {
        const reply = await workers[0].send(method, p);
        const got = method === "echo" ? reply.length : reply.readUInt32LE(0);
        if (got !== sc.payload) throw new Error(`reply carried ${got}, expected ${sc.payload}`);
      });
    }
    const childKib = maxPeakRssKib(childPids());
    ok(RUNNER, sc, figs, peakRssKib(), childKib, notes);
  } finally {
    await manager.shutdown();
  }
}

main().then(() => process.exit(0), (err) => {
  console.error(err);
  process.exit(1);
});
