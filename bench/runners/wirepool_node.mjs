// The wirepool runners with a Node parent (node/'s Pool; see bench/README.md, "Runner contract"):
// `wirepool_node` drives the Node bench worker (wirepool_node_worker.mjs), `wirepool_node_rsworker`
// (`--worker rust`) the Rust one that wirepool_rust.sh --prepare builds in release.
//
//   node bench/runners/wirepool_node.mjs [--worker rust] '<scenario JSON>'
//   node bench/runners/wirepool_node.mjs --prepare      # npm ci (if needed) and tsc in node/
import { execFileSync } from "node:child_process";
import { accessSync, constants, existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import {
  figure, loadScenario, maxPeakRssKib, ok, payloadBuffer, peakRssKib, runEchoScenario, sleep, unsupported,
} from "../incumbents/node/common.mjs";

const NODE_DIR = fileURLToPath(new URL("../../node/", import.meta.url));
const DIST = new URL("../../node/dist/index.js", import.meta.url);
const WORKER_LANG = process.argv.includes("--worker") ? process.argv[process.argv.indexOf("--worker") + 1] : "node";
const RUNNER = WORKER_LANG === "rust" ? "wirepool_node_rsworker" : "wirepool_node";
const TARGET = process.env.CARGO_TARGET_DIR ?? fileURLToPath(new URL("../../rust/target", import.meta.url));
const RUST_WORKER = `${TARGET}/release/wirepool-bench-worker`;
// The founding workload's Rust worker (wirepool-bench's, built by wirepool_rust.sh --prepare).
const FOUNDING_WORKER = `${TARGET}/release/founding-worker`;
const MAX_FRAME = 16 << 20;

function prepare() {
  const npm = (args) => execFileSync("npm", args, { cwd: NODE_DIR, stdio: ["ignore", 2, 2] });
  if (!existsSync(`${NODE_DIR}/node_modules/typescript`)) npm(["ci", "--no-audit", "--no-fund", "--loglevel=error"]);
  npm(["run", "build", "--silent"]);
}

function workerCommand(sc) {
  if (WORKER_LANG === "rust") return [sc?.founding ? FOUNDING_WORKER : RUST_WORKER];
  // $WIREPOOL_BENCH_NODE (as for the Rust parent's runner): e.g. a wrapper running
  // `node --cpu-prof --cpu-prof-dir=DIR "$@"` profiles the worker alone.
  return [process.env.WIREPOOL_BENCH_NODE || process.execPath, fileURLToPath(new URL("./wirepool_node_worker.mjs", import.meta.url))];
}

function childrenPeakKib(pool) {
  return maxPeakRssKib(pool.metrics().workers.filter((w) => w.alive).map((w) => w.pid));
}

async function runEcho(Pool, sc) {
  const inflight = sc.inflight || 1;
  const method = sc.kind === "oneway" ? "oneway" : "echo";
  const body = payloadBuffer(sc.payload);
  const maxFrame = sc.max_frame_size ?? MAX_FRAME;
  const pool = await Pool.start({ command: workerCommand(), workers: 1, maxInFlight: Math.max(inflight, 1), maxFrameSize: maxFrame, startupTimeoutMs: 20_000, codec: "raw" });
  try {
    const check = method === "oneway"
      ? (r) => { if (Number(r.readBigUInt64LE(0)) !== sc.payload) throw new Error(`oneway answered ${r.readBigUInt64LE(0)}`); }
      : (r) => { if (r.length !== sc.payload) throw new Error(`echo answered ${r.length} bytes, expected ${sc.payload}`); };
    const figs = await runEchoScenario(sc, () => pool.call(method, body).then(check));
    const how = inflight > 1 ? `${inflight} lanes each keeping one call outstanding` : "one call at a time";
    return [figs, childrenPeakKib(pool), `Pool.call(codec 'raw'), ${maxFrame >> 10} KiB frames; ${how}`];
  } finally {
    await pool.close({ graceMs: 1000 });
  }
}

async function readRows(pool, sc) {
  if (sc.founding) return readFoundingRows(pool, sc, sc.n);
  const codec = sc.codec ?? "json";
  const every = sc.every ?? 0;
  const pause = sc.pause_ms ?? 0;
  let count = 0;
  if (codec === "raw") {
    for await (const batch of pool.stream("raw_rows", Buffer.from(String(sc.n)), { codec: "raw" }).batches()) count += batch.length;
    return count;
  }
  const stream = pool.stream("rows", { shape: sc.shape, n: sc.n }, { codec });
  if (every) {
    for await (const row of stream) {
      if (row.i !== count) throw new Error(`row ${count} carried index ${row.i}`);
      count++;
      if (count % every === 0) await sleep(pause);
    }
    return count;
  }
  for await (const batch of stream.batches()) {
    if (batch[0].i !== count) throw new Error(`row ${count} carried index ${batch[0].i}`);
    count += batch.length;
  }
  return count;
}

// The founding workload: every row's index checked, as a consumer reads each row.
async function readFoundingRows(pool, sc, n) {
  let count = 0;
  for await (const batch of pool.stream("rows", { shape: sc.shape, n }, { codec: sc.codec ?? "json" }).batches()) {
    for (const row of batch) {
      if (row.id !== count) throw new Error(`row ${count} carried index ${row.id}`);
      count++;
    }
  }
  return count;
}

async function runRows(Pool, sc) {
  const pool = await Pool.start({ command: workerCommand(sc), workers: 1, maxInFlight: 4, maxFrameSize: MAX_FRAME, startupTimeoutMs: 20_000 });
  try {
    const rates = [];
    // One untimed stream first (the founding workload, as every runner of it): start-up and JIT.
    if (sc.founding) {
      await readFoundingRows(pool, sc, Math.min(sc.n, 256));
      // A repeat: whole streams for the scenario's window (at least one).
      for (let r = 0; r < sc.repeats; r++) {
        const start = performance.now();
        let rows = 0;
        while (rows === 0 || performance.now() - start < (sc.duration_s ?? 0.25) * 1000) {
          const got = await readFoundingRows(pool, sc, sc.n);
          if (got !== sc.n) throw new Error(`got ${got} rows, expected ${sc.n}`);
          rows += got;
        }
        rates.push(rows / ((performance.now() - start) / 1000));
      }
    }
    for (let r = 0; r < (sc.founding ? 0 : sc.repeats); r++) {
      const start = performance.now();
      const got = await readRows(pool, sc);
      if (got !== sc.n) throw new Error(`got ${got} rows, expected ${sc.n}`);
      rates.push(sc.n / ((performance.now() - start) / 1000));
    }
    const codec = sc.codec ?? "json";
    const notes = codec === "raw"
      ? "for await over stream(codec 'raw').batches(): the small row's JSON text as Buffer views of the ROWS frames, not decoded"
      : `for await over stream(codec '${codec}').batches() (row by row with a pause: W6): rows decoded into objects a ROWS frame at a time, credit granted as the loop reads`;
    return [[figure("rows_per_s", "rows/s", rates)], childrenPeakKib(pool), notes];
  } finally {
    await pool.close({ graceMs: 1000 });
  }
}

async function runPool(Pool, sc) {
  const { workers, task_us: taskUs, tasks } = sc;
  const pool = await Pool.start({ command: workerCommand(), workers, maxInFlight: 2, startupTimeoutMs: 20_000 });
  try {
    await Promise.all(Array.from({ length: workers * 2 }, () => pool.call("spin", 1)));
    const rates = [];
    for (let r = 0; r < sc.repeats; r++) {
      let left = tasks;
      const driver = async () => {
        while (left > 0) {
          left--;
          if ((await pool.call("spin", taskUs)) !== taskUs) throw new Error("spin answered a different value");
        }
      };
      const start = performance.now();
      await Promise.all(Array.from({ length: workers * 2 }, driver));
      rates.push(tasks / ((performance.now() - start) / 1000));
    }
    return [[figure("tasks_per_s", "tasks/s", rates)], childrenPeakKib(pool), "Pool.call('spin') from 2 x workers lanes, max_in_flight 2; the worker spins on CPU time, one task at a time"];
  } finally {
    await pool.close({ graceMs: 1000 });
  }
}

async function main() {
  if (process.argv.includes("--prepare")) {
    prepare();
    return;
  }
  const sc = loadScenario();
  if (sc.kind === "frames") return unsupported(RUNNER, sc, "floor-only scenario");
  if (!existsSync(DIST)) return unsupported(RUNNER, sc, "node/dist is not built (bench/runners/wirepool_node.mjs --prepare)");
  if (WORKER_LANG === "rust") {
    try {
      accessSync(workerCommand(sc)[0], constants.X_OK);
    } catch {
      return unsupported(RUNNER, sc, `${workerCommand(sc)[0]} not built (bench/runners/wirepool_rust.sh --prepare)`);
    }
  }
  const { Pool } = await import(DIST.href);
  let out;
  if (["echo", "oneway", "echo_large"].includes(sc.kind)) out = await runEcho(Pool, sc);
  else if (sc.kind === "rows" || sc.kind === "slow_rows") out = await runRows(Pool, sc);
  else if (sc.kind === "pool") out = await runPool(Pool, sc);
  else return unsupported(RUNNER, sc, `unknown kind ${sc.kind}`);
  const [figs, children, notes] = out;
  ok(RUNNER, sc, figs, peakRssKib(), children, notes);
}

await main();
process.exit(0);
