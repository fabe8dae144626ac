// wirepool/prometheus against the shared metrics contract (spec/metrics.json): a pool's
// exporter is scraped (prom-client's text format 0.0.4) and every family, help text, type,
// label set and bucket bound is compared with the contract; then the values after calls, a
// stream, an error, a crash and a retry; a closed pool exports no samples. Skipped when
// spec/metrics.json is not in the tree. Bounded by its timeout; the pool is closed.

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Registry } from "prom-client";
import { Pool, WirepoolError } from "../src/index.js";
import { exportPool } from "../src/prometheus.js";

const FIXTURE = new URL("./parent-fixture.js", import.meta.url).pathname;
const CONTRACT = new URL("../../../spec/metrics.json", import.meta.url);
const T = { timeout: 60_000, skip: existsSync(CONTRACT) ? false : "no spec/metrics.json" };

interface Series { name: string; type: string; labels: string[]; required: boolean; help: string; buckets?: string }
interface Contract {
  prefix: string;
  labels: Record<string, { values?: string[]; pattern?: string }>;
  buckets: Record<string, number[]>;
  series: Series[];
}

interface Family { help: string | null; type: string | null; samples: { name: string; labels: Record<string, string>; value: number }[] }

/** The text exposition format, parsed (enough for prom-client's output). */
function parse(text: string): Map<string, Family> {
  const out = new Map<string, Family>();
  const fam = (n: string) => {
    let f = out.get(n);
    if (f === undefined) out.set(n, (f = { help: null, type: null, samples: [] }));
    return f;
  };
  for (const line of text.split("\n")) {
    if (line === "") continue;
    let m = /^# HELP (\S+) (.*)$/.exec(line);
    if (m !== null) {
      fam(m[1]).help = m[2].replace(/\\n/g, "\n").replace(/\\\\/g, "\\");
      continue;
    }
    m = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (m !== null) {
      fam(m[1]).type = m[2];
      continue;
    }
    m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m !== null, `an unparsable line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    const base = m[1].replace(/_(bucket|sum|count)$/, "");
    const family = out.has(m[1]) ? m[1] : out.has(base) ? base : m[1];
    fam(family).samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

function checkAgainstContract(c: Contract, scraped: Map<string, Family>, pool: string): void {
  const required = c.series.filter((s) => s.required);
  const known = new Map(c.series.map((s) => [s.name, s]));
  for (const name of scraped.keys()) {
    if (!name.startsWith(c.prefix)) continue;
    assert.ok(known.has(name), `${name} is not in the contract`);
    assert.ok(known.get(name)!.required, `${name} is optional and not described as exported`);
  }
  for (const s of required) {
    const f = scraped.get(s.name);
    assert.ok(f !== undefined, `${s.name} is missing`);
    assert.equal(f.help, s.help, `${s.name}'s HELP`);
    assert.equal(f.type, s.type, `${s.name}'s TYPE`);
    for (const x of f.samples) {
      const want = s.type === "histogram" && x.name.endsWith("_bucket") ? [...s.labels, "le"] : s.labels;
      assert.deepEqual(Object.keys(x.labels).sort(), [...want].sort(), `${x.name}'s labels ${JSON.stringify(x.labels)}`);
      assert.equal(x.labels.pool, pool);
      assert.ok(Number.isFinite(x.value), `${x.name} ${x.value}`);
      for (const [k, v] of Object.entries(x.labels)) {
        const rule = c.labels[k];
        if (rule?.values !== undefined) assert.ok(rule.values.includes(v), `${x.name}: ${k}="${v}" is not one of the contract's`);
        if (rule?.pattern !== undefined) assert.match(v, new RegExp(rule.pattern), `${x.name}: ${k}`);
      }
      if (s.type === "histogram") assert.match(x.name, new RegExp(`^${s.name}_(bucket|sum|count)$`));
      else assert.equal(x.name, s.name);
    }
    if (s.type === "histogram") {
      const bounds = c.buckets[s.buckets!].map(String);
      const groups = new Map<string, string[]>();
      for (const x of f.samples.filter((y) => y.name.endsWith("_bucket"))) {
        const { le, ...rest } = x.labels;
        const key = JSON.stringify(rest);
        groups.set(key, [...(groups.get(key) ?? []), le]);
      }
      for (const [key, les] of groups) assert.deepEqual(les.map((l) => (l === "+Inf" ? l : String(Number(l)))), [...bounds.map((b) => String(Number(b))), "+Inf"], `${s.name}${key}'s buckets`);
    }
  }
}

const value = (f: Map<string, Family>, name: string, labels: Record<string, string> = {}) =>
  (f.get(name) ?? f.get(name.replace(/_(bucket|sum|count)$/, "")))?.samples.filter((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v)).reduce((n, x) => n + x.value, 0) ?? 0;

test("the exporter's series are exactly spec/metrics.json's required ones; the values follow the pool", T, async () => {
  const contract = JSON.parse(readFileSync(CONTRACT, "utf8")) as Contract;
  const registry = new Registry();
  const pool = await Pool.start({ command: [process.execPath, FIXTURE], workers: 2, heartbeatMs: 50, restartBackoffMs: 0, retry: { methods: ["crash"], attempts: 2 } });
  try {
    const exporter = await exportPool(pool, { registry, name: "test" });
    await assert.rejects(exportPool(pool, { registry, name: "test" }), /exported on this registry already/);
    // Before any call: every family, the per-worker ones for slots 0 and 1.
    let m = parse(await registry.metrics());
    checkAgainstContract(contract, m, "test");
    assert.equal(value(m, "wirepool_workers"), 2);

    assert.equal(await pool.call("echo", 1), 1);
    assert.deepEqual(await pool.map("echo", [1, 2, 3]), [1, 2, 3]);
    let rows = 0;
    for await (const _ of pool.stream("rows", { n: 10, size: 1 })) rows++;
    assert.equal(rows, 10);
    const e = await pool.call("fail").catch((x: unknown) => x);
    assert.ok(e instanceof WirepoolError);
    const crash = await pool.call("crash").catch((x: unknown) => x); // two tries, two deaths
    assert.ok(crash instanceof WirepoolError);
    // The replacements start and a heartbeat is answered on each (the pool's own accounting).
    const deadline = performance.now() + 20_000;
    for (;;) {
      m = parse(await registry.metrics());
      if (value(m, "wirepool_workers_alive") === 2 && m.get("wirepool_worker_heartbeat_rtt_seconds")!.samples.length === 2) break;
      assert.ok(performance.now() < deadline, "two workers alive and pinged");
      await sleep(20);
    }
    checkAgainstContract(contract, m, "test");
    assert.equal(value(m, "wirepool_calls_total"), 1 + 3 + 1 + 2);
    assert.equal(value(m, "wirepool_streams_total"), 1);
    assert.equal(value(m, "wirepool_retries_total"), 1);
    assert.equal(value(m, "wirepool_errors_total", { code: "HANDLER_ERROR" }), 1);
    assert.equal(value(m, "wirepool_errors_total", { code: "WORKER_EXITED" }), 2);
    assert.equal(value(m, "wirepool_restarts_total", { cause: "crashed" }), 2);
    assert.equal(value(m, "wirepool_worker_requests_total"), 8, "the slots' requests, kept across replacements");
    assert.equal(value(m, "wirepool_worker_rows_total"), 10);
    assert.ok(value(m, "wirepool_worker_sent_bytes_total") > 0 && value(m, "wirepool_worker_received_bytes_total") > 0);
    assert.equal(value(m, "wirepool_worker_state", { state: "ready" }), 2);
    assert.equal(m.get("wirepool_worker_pid")!.samples.length, 2);
    assert.deepEqual(new Set(m.get("wirepool_worker_pid")!.samples.map((x) => x.value)), new Set(pool.metrics().workers.map((w) => w.pid)));
    assert.equal(value(m, "wirepool_queue_wait_seconds_count"), 8);
    assert.equal(value(m, "wirepool_method_duration_seconds_count", { method: "echo" }), 4);
    assert.equal(value(m, "wirepool_method_duration_seconds_count", { method: "rows" }), 1);
    exporter.stop();
    const other = await exportPool(pool, { registry, name: "test" });
    await pool.close();
    // A closed pool: the families, no samples.
    m = parse(await registry.metrics());
    for (const s of contract.series.filter((x) => x.required)) {
      assert.ok(m.has(s.name), s.name);
      assert.equal(m.get(s.name)!.samples.length, 0, `${s.name} has samples after close`);
    }
    other.stop();
  } finally {
    await pool.close();
  }
});
