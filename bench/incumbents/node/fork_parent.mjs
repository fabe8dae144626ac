// Baseline: Node.js child_process.fork with 'json' or 'advanced' serialization.
// Usage: node fork_parent.mjs json|advanced [--batch 1] '<scenario json>'
// (--batch 1: the founding workload's rows one per message, runners node_fork_*_unbatched.)
// Payloads are strings for 'json' (JSON has no bytes) and Buffers for 'advanced'. Rows are sent
// 256 per message (batched by hand; one message per row is several times slower) and arrive as
// objects. A "pool" is N forked children with two requests in flight each.
import { fork } from "node:child_process";
import { fileURLToPath } from "node:url";
import {
  figure, loadScenario, maxPeakRssKib, ok, payloadBuffer, payloadText, peakRssKib,
  runEchoScenario, runPoolScenario, sleep, unsupported,
} from "./common.mjs";

const serialization = process.argv[2];
const BATCH = process.argv.includes("--batch") ? Number(process.argv[process.argv.indexOf("--batch") + 1]) : 256;
const RUNNER = (serialization === "advanced" ? "node_fork_advanced" : "node_fork_json") + (BATCH === 1 ? "_unbatched" : "");
const CHILD = fileURLToPath(new URL("./fork_child.mjs", import.meta.url));

class Child {
  constructor() {
    this.proc = fork(CHILD, [], { serialization, stdio: ["ignore", "ignore", "inherit", "ipc"] });
    this.nextId = 1;
    this.pending = new Map();
    this.rowSink = null;
    this.proc.on("message", (m) => {
      if (Array.isArray(m)) return this.rowSink.push(m);
      const resolve = this.pending.get(m.id);
      this.pending.delete(m.id);
      resolve(m);
    });
    this.exited = new Promise((r) => this.proc.once("exit", r));
    this.proc.once("exit", (code, signal) => {
      for (const resolve of this.pending.values()) resolve({ error: `child exited ${code ?? signal}` });
      if (this.rowSink) this.rowSink.fail(new Error("child exited during a row stream"));
    });
  }
  call(msg) {
    const id = this.nextId++;
    msg.id = id;
    return new Promise((resolve) => {
      this.pending.set(id, resolve);
      this.proc.send(msg);
    });
  }
  async close() {
    this.proc.disconnect();
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 5000);
    await this.exited;
    clearTimeout(timer);
  }
}

// Row batches are queued as they arrive (Node reads the channel eagerly; there is no way to
// stop it short of blocking the event loop) and consumed by an async loop.
class RowQueue {
  constructor() { this.items = []; this.waiter = null; this.error = null; }
  push(batch) { this.items.push(batch); if (this.waiter) { this.waiter(); this.waiter = null; } }
  fail(err) { this.error = err; if (this.waiter) { this.waiter(); this.waiter = null; } }
  async next() {
    while (!this.items.length) {
      if (this.error) throw this.error;
      await new Promise((r) => (this.waiter = r));
    }
    return this.items.shift();
  }
}

// The founding workload (bench/shapes/founding.json): every row's index checked.
async function readFounding(sc, child, n) {
  child.rowSink = new RowQueue();
  const done = child.call({ op: "founding_rows", shape: sc.shape, n, batch: BATCH });
  let seen = 0;
  while (seen < n) {
    for (const row of await child.rowSink.next()) {
      if (row.id !== seen) throw new Error("row stream out of order");
      seen++;
    }
  }
  await done;
}

async function runRows(sc, child) {
  const rates = [];
  if (sc.founding) {
    await readFounding(sc, child, Math.min(sc.n, 256));
    // A repeat: whole streams for the scenario's window (at least one).
    const windowNs = BigInt(Math.round((sc.duration_s ?? 0.25) * 1e9));
    for (let r = 0; r < sc.repeats; r++) {
      const start = process.hrtime.bigint();
      let rows = 0;
      while (rows === 0 || process.hrtime.bigint() - start < windowNs) {
        await readFounding(sc, child, sc.n);
        rows += sc.n;
      }
      rates.push(rows / (Number(process.hrtime.bigint() - start) / 1e9));
    }
    return [figure("rows_per_s", "rows/s", rates)];
  }
  for (let r = 0; r < sc.repeats; r++) {
    const start = process.hrtime.bigint();
    child.rowSink = new RowQueue();
    const done = child.call({ op: "rows", shape: sc.shape, n: sc.n });
    let seen = 0, last = null;
    while (seen < sc.n) {
      for (const row of await child.rowSink.next()) {
        last = row;
        seen++;
        if (sc.every && seen % sc.every === 0) await sleep(sc.pause_ms);
      }
    }
    await done;
    if (last.i !== sc.n - 1) throw new Error("row stream out of order");
    rates.push(sc.n / (Number(process.hrtime.bigint() - start) / 1e9));
  }
  return [figure("rows_per_s", "rows/s", rates)];
}

async function main() {
  const sc = loadScenario();
  if (sc.kind === "frames") return unsupported(RUNNER, sc, "floor-only scenario");
  if (sc.kind === "pool") {
    const workers = Array.from({ length: sc.workers }, () => new Child());
    const figs = await runPoolScenario(sc, workers, (w, us) => w.call({ op: "spin", us }));
    const childKib = maxPeakRssKib(workers.map((w) => w.proc.pid));
    await Promise.all(workers.map((w) => w.close()));
    return ok(RUNNER, sc, figs, peakRssKib(), childKib, "hand-rolled pool: 2 requests in flight per child");
  }
  if (BATCH === 1 && !sc.founding) return unsupported(RUNNER, sc, "one row per message: the founding workload's rows only");
  const child = new Child();
  let figs;
  if (sc.kind === "rows" || sc.kind === "slow_rows") {
    figs = await runRows(sc, child);
  } else {
    const echoing = sc.kind !== "oneway";
    const p = serialization === "advanced" ? payloadBuffer(sc.payload) : payloadText(sc.payload);
    figs = await runEchoScenario(sc, async () => {
      const reply = await child.call({ op: echoing ? "echo" : "oneway", p });
      const got = echoing ? reply.p?.length : reply.n;
      if (got !== sc.payload) throw new Error(`reply carried ${got}, expected ${sc.payload}`);
    });
  }
  const childKib = peakRssKib(child.proc.pid);
  await child.close();
  const notes = sc.kind.endsWith("rows") ? (BATCH === 1 ? "one row per message (a one-row array)" : "rows batched 256 per message by hand")
    : `payload as a ${serialization === "advanced" ? "Buffer" : "string"}`;
  ok(RUNNER, sc, figs, peakRssKib(), childKib, notes);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
