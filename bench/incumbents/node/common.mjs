// Helpers shared by the Node.js runners (see bench/README.md, "Runner contract").
import { readFileSync } from "node:fs";

// A large row's 4 KiB field: its index as 8 digits then 4088 "x", distinct in every row (an
// encoder that memoizes repeated values would otherwise send it once).
const LARGE_TAIL = "x".repeat(4088);
export const ROW_BATCH = 256;

export function loadScenario() {
  const last = process.argv[process.argv.length - 1];
  if (last && last.trimStart().startsWith("{")) return JSON.parse(last);
  return JSON.parse(readFileSync(0, "utf8"));
}

export function emit(result) {
  process.stdout.write(JSON.stringify(result) + "\n");
}

export function ok(runner, sc, figures, parentKib, childrenKib, notes = "") {
  emit({ runner, scenario: sc.id, status: "ok", figures,
         rss_kib: { parent: parentKib, children: childrenKib }, notes });
}

export function unsupported(runner, sc, reason) {
  emit({ runner, scenario: sc.id, status: "unsupported", reason });
}

export function figure(name, unit, values, better = "higher") {
  return { name, unit, better, values };
}

export function peakRssKib(pid = "self") {
  try {
    const m = /VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "ascii"));
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

export function maxPeakRssKib(pids) {
  const peaks = pids.map((p) => peakRssKib(p)).filter((k) => k !== null);
  return peaks.length ? Math.max(...peaks) : null;
}

export function percentile(sorted, q) {
  if (!sorted.length) return NaN;
  const rank = Math.max(1, Math.min(sorted.length, Math.round((q / 100) * sorted.length + 0.5)));
  return sorted[rank - 1];
}

export function makeRow(i, shape) {
  if (shape === "small_rows") return { i, name: `decl_${i}`, kind: "theorem" };
  return { i, name: `decl_${i}`, kind: "theorem", blob: String(i).padStart(8, "0") + LARGE_TAIL };
}

export function rowBatch(shape, base, n) {
  const end = Math.min(n, base + ROW_BATCH);
  const rows = new Array(end - base);
  for (let i = base; i < end; i++) rows[i - base] = makeRow(i, shape);
  return rows;
}

// Burns `us` of CPU time (process CPU, the closest Node has to thread CPU time), so a task costs
// the same work however many workers share the cores.
export function spinCpu(us) {
  const start = process.cpuUsage();
  let spins = 0;
  for (;;) {
    const used = process.cpuUsage(start);
    if (used.user + used.system >= us) return spins;
    spins++;
  }
}

export function payloadText(size) {
  return "wirepool".repeat(Math.ceil(size / 8) + 1).slice(0, size);
}

export function payloadBuffer(size) {
  const b = Buffer.allocUnsafe(size);
  for (let i = 0; i < 8 && i < size; i++) b[i] = "wirepool".charCodeAt(i);
  let filled = Math.min(8, size);
  while (filled < size) {
    const n = Math.min(filled, size - filled);
    b.copy(b, filled, 0, n);
    filled += n;
  }
  return b;
}

const nowNs = () => process.hrtime.bigint();
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function timedLoop(callOnce, durationS, minCalls, recordLatency) {
  const latencies = [];
  let calls = 0;
  const start = nowNs();
  const deadline = start + BigInt(Math.round(durationS * 1e9));
  let now = start;
  while (now < deadline || calls < minCalls) {
    const t0 = now;
    await callOnce();
    now = nowNs();
    if (recordLatency) latencies.push(Number(now - t0));
    calls++;
  }
  return [calls, Number(now - start) / 1e9, latencies];
}

// `inflight` lanes, each a sequential loop of calls, keep that many requests outstanding.
export async function pipelined(callOnce, inflight, durationS) {
  let calls = 0;
  const start = nowNs();
  const deadline = start + BigInt(Math.round(durationS * 1e9));
  async function lane() {
    while (nowNs() < deadline) {
      await callOnce();
      calls++;
    }
  }
  await Promise.all(Array.from({ length: inflight }, lane));
  return [calls, Number(nowNs() - start) / 1e9, []];
}

export async function echoFigures(sc, runRepeat) {
  const rates = [], p50 = [], p99 = [], mbs = [];
  for (let r = 0; r < sc.repeats; r++) {
    const [calls, elapsed, lat] = await runRepeat();
    rates.push(calls / elapsed);
    if (sc.kind === "oneway" || sc.kind === "echo_large") {
      const dirs = sc.kind === "echo_large" ? 2 : 1;
      mbs.push((calls * sc.payload * dirs) / elapsed / 1e6);
    }
    if (lat.length) {
      lat.sort((a, b) => a - b);
      p50.push(percentile(lat, 50) / 1000);
      p99.push(percentile(lat, 99) / 1000);
    }
  }
  if (sc.kind === "oneway" || sc.kind === "echo_large") return [figure("mb_per_s", "MB/s", mbs)];
  const figs = [figure("calls_per_s", "calls/s", rates)];
  if (p50.length) figs.push(figure("p50_us", "us", p50, "lower"), figure("p99_us", "us", p99, "lower"));
  return figs;
}

// Runs the echo/oneway scenario through `call(msgFactory)`; shared by fork and procwire runners.
export async function runEchoScenario(sc, callOnce) {
  await timedLoop(callOnce, sc.warmup_s, 1, false);
  const inflight = sc.inflight || 1;
  if (inflight === 1) {
    return echoFigures(sc, () => timedLoop(callOnce, sc.duration_s, sc.min_calls, sc.kind === "echo"));
  }
  return echoFigures(sc, () => pipelined(callOnce, inflight, sc.duration_s));
}

// A hand-rolled pool: two lanes per worker, each taking the next task index until none are left.
export async function runPoolScenario(sc, workers, callSpin) {
  for (const w of workers) await callSpin(w, 1);
  const rates = [];
  for (let r = 0; r < sc.repeats; r++) {
    let next = 0;
    const start = nowNs();
    async function lane(w) {
      while (next < sc.tasks) {
        next++;
        await callSpin(w, sc.task_us);
      }
    }
    await Promise.all(workers.flatMap((w) => [lane(w), lane(w)]));
    rates.push(sc.tasks / (Number(nowNs() - start) / 1e9));
  }
  return [figure("tasks_per_s", "tasks/s", rates)];
}
