/**
 * A Prometheus exporter for a Node {@link Pool} (`wirepool/prometheus`), exporting exactly the
 * required series of the shared metrics contract (`spec/metrics.json`, the same names, types,
 * labels, help and buckets in every parent SDK). It uses
 * [prom-client](https://www.npmjs.com/package/prom-client), an optional peer dependency:
 * `npm install prom-client`; it is loaded when an exporter is made, so this module imports
 * without it.
 *
 * @example
 * ```ts
 * import { Registry } from "prom-client";
 * import { exportPool } from "wirepool/prometheus";
 * const registry = new Registry();
 * const exporter = await exportPool(pool, { registry, name: "resize" });
 * http.createServer(async (_, res) => res.end(await registry.metrics())).listen(9464);
 * ```
 * @module
 */

import type { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { ExportView, Pool, PoolObserver } from "./parent/pool.js";

/** The contract's required series (spec/metrics.json, version 1), word for word. */
const SERIES = {
  "wirepool_workers": { type: "gauge", labels: ["pool"], help: "Workers the pool keeps (its size)." },
  "wirepool_workers_alive": { type: "gauge", labels: ["pool"], help: "Workers whose process runs and finished its handshake (ready, leased or draining)." },
  "wirepool_calls_total": { type: "counter", labels: ["pool"], help: "Unary calls sent to a worker (a retry counts again)." },
  "wirepool_streams_total": { type: "counter", labels: ["pool"], help: "Streams sent to a worker (a retry counts again)." },
  "wirepool_errors_total": { type: "counter", labels: ["pool", "code"], help: "Calls and streams that ended in an error, by error code name." },
  "wirepool_restarts_total": { type: "counter", labels: ["pool", "cause"], help: "Workers replaced after an unexpected death, by cause." },
  "wirepool_recycles_total": { type: "counter", labels: ["pool", "reason"], help: "Healthy workers retired and replaced by a recycling limit, by limit." },
  "wirepool_retries_total": { type: "counter", labels: ["pool"], help: "Requests sent again under the pool's retry policy after their worker died." },
  "wirepool_queue_wait_seconds": { type: "histogram", labels: ["pool"], help: "Time a call or stream waited for a worker with room before it was sent (0 when one had room)." },
  "wirepool_method_duration_seconds": { type: "histogram", labels: ["pool", "method"], help: "Latency of completed calls and streams, from sending to the outcome, by method." },
  "wirepool_worker_state": { type: "gauge", labels: ["pool", "worker", "state"], help: "1 for the worker's current state, 0 for the others." },
  "wirepool_worker_pid": { type: "gauge", labels: ["pool", "worker"], help: "Process id of the worker (a remote worker's on its own machine); absent while none runs." },
  "wirepool_worker_in_flight": { type: "gauge", labels: ["pool", "worker"], help: "Requests in flight on the worker now." },
  "wirepool_worker_requests_total": { type: "counter", labels: ["pool", "worker"], help: "Requests (calls and streams) sent to the worker." },
  "wirepool_worker_rows_total": { type: "counter", labels: ["pool", "worker"], help: "Stream rows received from the worker." },
  "wirepool_worker_sent_bytes_total": { type: "counter", labels: ["pool", "worker"], help: "Bytes sent to the worker (frames, headers included)." },
  "wirepool_worker_received_bytes_total": { type: "counter", labels: ["pool", "worker"], help: "Bytes received from the worker (frames, headers included)." },
  "wirepool_worker_rss_bytes": { type: "gauge", labels: ["pool", "worker"], help: "Resident set size of the worker process; absent when it is not a child of this process or the OS does not say." },
  "wirepool_worker_heartbeat_rtt_seconds": { type: "gauge", labels: ["pool", "worker"], help: "Round trip of the worker's last answered heartbeat PING; absent before the first PONG." },
} as const;

/** spec/metrics.json buckets.latency_seconds. */
const LATENCY_BUCKETS = [0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];
const STATES = ["starting", "ready", "leased", "draining", "dead"] as const;

type Name = keyof typeof SERIES;
type PromClient = typeof import("prom-client");
type AnyMetric = Gauge<string> | Counter<string> | Histogram<string>;

/** Options of {@link exportPool}. */
export interface ExportOptions {
  /** Where the series are registered (default: prom-client's global `register`). */
  readonly registry?: Registry;
  /** The `pool` label (default `"default"`); each pool on one registry needs its own. */
  readonly name?: string;
}

/** A pool's exporter: {@link PoolExporter.stop} takes its samples off the registry. */
export interface PoolExporter {
  readonly registry: Registry;
  readonly name: string;
  stop(): void;
}

interface Entry {
  readonly pool: Pool;
  readonly name: string;
  readonly observer: PoolObserver;
  readonly methods: Set<string>;
}

/** One registry's series, shared by the pools exported on it (told apart by `pool`). */
class Family {
  readonly entries = new Map<string, Entry>();
  readonly metrics = new Map<Name, AnyMetric>();

  constructor(prom: PromClient, registry: Registry) {
    const views = (): [Entry, ExportView][] => [...this.entries.values()].map((e) => [e, e.pool.exportView()]);
    for (const [name, spec] of Object.entries(SERIES) as [Name, (typeof SERIES)[Name]][]) {
      const common = { name, help: spec.help, labelNames: [...spec.labels], registers: [registry] };
      if (spec.type === "histogram") {
        const family = this;
        this.metrics.set(name, new prom.Histogram({
          ...common,
          buckets: LATENCY_BUCKETS,
          collect() {
            // A closed pool exports no samples.
            for (const e of family.entries.values()) if (e.pool.isClosed) family.forget(e, this as Histogram<string>);
          },
        }));
        continue;
      }
      const fill = (m: Gauge<string> | Counter<string>) => {
        m.reset();
        for (const [e, v] of views()) if (!v.closed) sample(name, e.name, v, m);
      };
      if (spec.type === "counter") this.metrics.set(name, new prom.Counter({ ...common, collect() { fill(this as Counter<string>); } }));
      else this.metrics.set(name, new prom.Gauge({ ...common, collect() { fill(this as Gauge<string>); } }));
    }
  }

  /** Drops a pool's histogram samples. */
  forget(e: Entry, h?: Histogram<string>): void {
    const q = h ?? (this.metrics.get("wirepool_queue_wait_seconds") as Histogram<string>);
    const d = this.metrics.get("wirepool_method_duration_seconds") as Histogram<string>;
    if (h === undefined || h === q) q.remove({ pool: e.name });
    if (h === undefined || h === d) for (const m of e.methods) d.remove({ pool: e.name, method: m });
  }
}

const families = new WeakMap<Registry, Family>();

/** The samples of one series for one pool (a value the pool cannot know is left out). */
function sample(name: Name, pool: string, v: ExportView, m: Gauge<string> | Counter<string>): void {
  const set = (labels: Record<string, string>, value: number) => {
    if ("set" in m) m.set({ pool, ...labels }, value);
    else m.inc({ pool, ...labels }, value);
  };
  const bySlot = (f: (s: ExportView["slots"][number]) => number | null) => {
    for (const s of v.slots) {
      const x = f(s);
      if (x !== null) set({ worker: String(s.slot) }, x);
    }
  };
  switch (name) {
    case "wirepool_workers": return set({}, v.size);
    case "wirepool_workers_alive": return set({}, v.alive);
    case "wirepool_calls_total": return set({}, v.callsSent);
    case "wirepool_streams_total": return set({}, v.streamsSent);
    case "wirepool_retries_total": return set({}, v.retries);
    case "wirepool_errors_total":
      for (const [code, n] of Object.entries(v.errorsByCode)) set({ code }, n);
      return;
    case "wirepool_restarts_total":
      for (const [cause, n] of Object.entries(v.restartsByCause)) set({ cause }, n);
      return;
    case "wirepool_recycles_total":
      for (const [reason, n] of Object.entries(v.recyclesByReason)) set({ reason }, n);
      return;
    case "wirepool_worker_state":
      for (const s of v.slots) for (const state of STATES) set({ worker: String(s.slot), state }, s.state === state ? 1 : 0);
      return;
    case "wirepool_worker_pid": return bySlot((s) => s.pid);
    case "wirepool_worker_in_flight": return bySlot((s) => s.inFlight);
    case "wirepool_worker_requests_total": return bySlot((s) => s.requests);
    case "wirepool_worker_rows_total": return bySlot((s) => s.rows);
    case "wirepool_worker_sent_bytes_total": return bySlot((s) => s.sentBytes);
    case "wirepool_worker_received_bytes_total": return bySlot((s) => s.receivedBytes);
    case "wirepool_worker_rss_bytes": return bySlot((s) => s.rssBytes);
    case "wirepool_worker_heartbeat_rtt_seconds": return bySlot((s) => s.heartbeatRttS);
    default:
      return;
  }
}

/**
 * Exports `pool`'s series (spec/metrics.json) on `registry` under the label `pool = name`,
 * computed from the pool at each scrape; the two histograms are observed as calls are sent
 * and end. Loads prom-client (an optional peer dependency): it rejects, naming the package,
 * when prom-client is not installed, and with an Error when `name` is taken on the registry.
 */
export async function exportPool(pool: Pool, opts: ExportOptions = {}): Promise<PoolExporter> {
  let prom: PromClient;
  try {
    prom = await import("prom-client");
  } catch (e) {
    throw new Error("wirepool/prometheus needs the optional peer dependency prom-client: npm install prom-client", { cause: e });
  }
  const registry = opts.registry ?? prom.register;
  const name = opts.name ?? "default";
  if (typeof name !== "string" || name === "") throw new TypeError(`the exporter's name must be a non-empty string`);
  let family = families.get(registry);
  if (family === undefined) {
    family = new Family(prom, registry);
    families.set(registry, family);
  }
  if (family.entries.has(name)) throw new Error(`a pool named ${JSON.stringify(name)} is exported on this registry already`);
  const f = family;
  const queue = f.metrics.get("wirepool_queue_wait_seconds") as Histogram<string>;
  const duration = f.metrics.get("wirepool_method_duration_seconds") as Histogram<string>;
  const methods = new Set<string>();
  const observer: PoolObserver = {
    queueWait: (s) => queue.observe({ pool: name }, s),
    duration: (method, s) => {
      methods.add(method);
      duration.observe({ pool: name, method }, s);
    },
  };
  const entry: Entry = { pool, name, observer, methods };
  f.entries.set(name, entry);
  pool.observers.add(observer);
  return {
    registry,
    name,
    stop() {
      pool.observers.delete(observer);
      if (f.entries.get(name) === entry) {
        f.entries.delete(name);
        f.forget(entry);
      }
    },
  };
}
