/**
 * The Node parent runner of the conformance matrix (conformance/README.md, "The runner
 * contract"): runs a scenario file against a `Pool` of any language's conformance worker and
 * prints one JSON line per scenario, `{"scenario", "ok", "detail", "elapsed"}`.
 *
 *     node --expose-gc build/parent.js --scenarios conformance/scenarios.json [--only NAME ...] [--transport socketpair|tls|tcp] -- WORKER COMMAND...
 *
 * `--transport tls` (conformance/test_remote.py) runs every pool's workers as children that join
 * a listener of this runner over TCP + TLS 1.3 with a single-use ticket each (`tcp`: plain
 * loopback); every WORKER_EXITED must then say `"connection": "lost"` in its details (21.6).
 *
 * Each scenario gets a fresh pool and is bounded by its `timeout_s`. Besides the scenario's own
 * expectation, every scenario that starts a pool checks that nothing is left in flight within
 * `settle_s`, whether the worker was replaced (`restarted`), the live worker count
 * (`live_workers`), and that the pool still answers the suite's health check. The procedures
 * are the Python and Rust runners' (python/conformance/parent.py).
 */

import { readFileSync, writeFileSync, mkdtempSync, rmSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Listener, Pool, RowStream, WirepoolError, type Lease, type PoolOptions } from "wirepool";

/** `--transport tls|tcp` (conformance/test_remote.py): the listener every pool's workers join (PROTOCOL.md 21). */
let LISTENER: Listener | null = null;

type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any

class ScenarioFailed extends Error {}

interface Suite {
  codes: Record<string, number>;
  defaults: Json;
  health: Json;
}

const gc: (() => void) | undefined = (globalThis as { gc?: () => void }).gc;

function setting(suite: Suite, sc: Json, key: string): Json {
  return key in sc ? sc[key] : suite.defaults[key];
}

function poolConfig(suite: Suite, sc: Json): Json {
  return { ...suite.defaults.pool, ...(sc.pool ?? {}) };
}

function expectedCode(suite: Suite, code: Json): number {
  if (typeof code === "number") return code;
  if (!(code in suite.codes)) throw new ScenarioFailed(`unknown error code name ${JSON.stringify(code)}`);
  return suite.codes[code];
}

function poolOptions(cfg: Json, worker: string[], env: NodeJS.ProcessEnv | undefined): PoolOptions {
  return {
    command: worker,
    env,
    workers: Number(cfg.workers),
    maxInFlight: Number(cfg.max_in_flight),
    startupTimeoutMs: Number(cfg.startup_timeout_s) * 1000,
    heartbeatMs: Number(cfg.heartbeat_ms),
    cancelGraceMs: Number(cfg.cancel_grace_s) * 1000,
    deadlineGraceMs: Number(cfg.deadline_grace_s) * 1000,
    drainGraceMs: Number(cfg.drain_grace_s) * 1000,
    maxFrameSize: Number(cfg.max_frame_size),
    initialCredit: Number(cfg.window),
    maxRequests: cfg.max_requests ?? null,
    // Optional: the SDK's default when a scenario file does not set it.
    ...(cfg.max_message_size != null ? { maxMessageSize: Number(cfg.max_message_size) } : {}),
    codec: "json",
    ...(LISTENER !== null ? { remote: LISTENER } : {}),
  };
}

// -----------------------------------------------------------------------------------------------
// Hostile-worker settings: the worker's environment, the runner's memory and its children

function workerEnv(sc: Json, tmp: string): NodeJS.ProcessEnv | undefined {
  const extra = sc.worker_env;
  if (!extra) return undefined;
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const [k, v] of Object.entries(extra)) env[k] = String(v).replaceAll("{tmp}", tmp);
  return env;
}

function resetPeakRss(): void {
  try {
    writeFileSync("/proc/self/clear_refs", "5");
  } catch {
    // not Linux, or not allowed: the peak then covers the whole run
  }
}

/**
 * Before a scenario's peak is restarted: waits (bounded) until the buffers of earlier scenarios
 * are collected, which can trail a closed pool by a few hundred ms under load (a child's exit and
 * its socket's last reads are still queued), so a scenario's peak is its own. What glibc would
 * keep of them is not retained: languages.json runs this runner with a fixed mmap threshold.
 */
async function releaseEarlierScenarios(): Promise<void> {
  const deadline = performance.now() + 5000;
  for (;;) {
    gc?.();
    if (process.memoryUsage().arrayBuffers < 64 << 20 || performance.now() >= deadline) return;
    await sleep(50);
  }
}

function statusMb(field: string): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync("/proc/self/status", "latin1"));
  return m === null ? 0 : Number(m[1]) / 1024;
}

async function checkRssAfter(suite: Suite, sc: Json, limit: number): Promise<void> {
  const settle = Number(setting(suite, sc, "settle_s"));
  const deadline = performance.now() + settle * 1000;
  for (;;) {
    gc?.(); // garbage does not count, only what the outcome keeps alive
    if (statusMb("VmRSS") <= limit) return;
    // What the runner still holds: the JS heap and every buffer outside it. RSS can stay above it
    // after a collection, since glibc keeps freed chunks below its dynamic mmap threshold (which
    // rises to the size of the largest freed mapping) for reuse instead of returning them.
    const m = process.memoryUsage();
    const held = (m.heapUsed + m.external) / (1 << 20);
    if (held <= limit) return;
    if (performance.now() >= deadline) {
      throw new ScenarioFailed(`the runner still holds ${held.toFixed(0)} MB (RSS ${statusMb("VmRSS").toFixed(0)} MB) ${settle}s after the outcome (bound ${limit} MB): the outcome keeps buffers alive`);
    }
    await sleep(50);
  }
}

function liveChildren(): number[] {
  const found: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, "latin1");
    } catch {
      continue;
    }
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(fields[1]) === process.pid && fields[0] !== "Z") found.push(Number(entry));
  }
  return found;
}

const LIVE_HOLD_MS = 500;

async function checkLiveWorkers(suite: Suite, sc: Json, want: number): Promise<void> {
  const s = setting(suite, sc, "live_workers");
  if (!s) return;
  if (s !== true) want = Number(s);
  const settle = Number(setting(suite, sc, "settle_s"));
  let since = 0;
  const held = (): boolean => {
    const now = performance.now();
    if (liveChildren().length !== want) since = 0;
    else if (since === 0) since = now;
    return since !== 0 && now - since >= LIVE_HOLD_MS;
  };
  const deadline = performance.now() + settle * 1000 + LIVE_HOLD_MS;
  while (!held() && performance.now() < deadline) await sleep(20); // polling /proc, bounded
  if (!held()) {
    const live = liveChildren().sort((a, b) => a - b);
    throw new ScenarioFailed(`${live.length} live worker processes [${live.join(", ")}] ${settle}s after the outcome, expected ${want} (for ${LIVE_HOLD_MS / 1000}s)`);
  }
}

// -----------------------------------------------------------------------------------------------
// Request forms and comparisons

function pattern(size: number): Buffer {
  const b = Buffer.allocUnsafe(size);
  for (let i = 0; i < size; i++) b[i] = (i * 31 + 17) % 251;
  return b;
}

function patternString(size: number): string {
  const b = Buffer.allocUnsafe(size);
  for (let i = 0; i < size; i++) b[i] = 97 + ((i * 31 + 17) % 26);
  return b.toString("latin1");
}

function request(form: Json): Json {
  if ("value" in form) return form.value;
  if ("bytes" in form) return pattern(Number(form.bytes.size));
  if ("string" in form) return patternString(Number(form.string.size));
  if ("text" in form) return Buffer.from(String(form.text), "utf8");
  throw new ScenarioFailed(`unknown request form ${JSON.stringify(form)}`);
}

/** JSON text with sorted keys; bigints as integers; bytes marked (JSON equality of the runners). */
function canonical(v: Json): string {
  if (v === undefined || v === null) return "null";
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "number") return Number.isFinite(v) ? JSON.stringify(v) : String(v);
  if (typeof v === "string" || typeof v === "boolean") return JSON.stringify(v);
  if (v instanceof Uint8Array) return `bytes:${Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("hex")}`;
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v instanceof Map) return canonical(Object.fromEntries(v));
  const keys = Object.keys(v).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`;
}

function describe(v: Json): string {
  if (v instanceof Uint8Array) return `${v.length} bytes`;
  if (typeof v === "string" && v.length > 64) return `a string of ${v.length} characters`;
  const text = canonical(v);
  return text.length <= 200 ? text : text.slice(0, 200) + "...";
}

function sameBody(want: Json, got: Json): void {
  if (want instanceof Uint8Array && got instanceof Uint8Array) {
    if (Buffer.compare(Buffer.from(want), Buffer.from(got)) !== 0) {
      let first = 0;
      while (first < Math.min(want.length, got.length) && want[first] === got[first]) first++;
      throw new ScenarioFailed(`expected ${want.length} bytes, got ${got.length} bytes differing from offset ${first}`);
    }
    return;
  }
  if (canonical(want) !== canonical(got)) throw new ScenarioFailed(`expected ${describe(want)}, got ${describe(got)}`);
}

function checkError(suite: Suite, want: Json, e: unknown): void {
  if (!(e instanceof WirepoolError)) {
    throw new ScenarioFailed(`expected error ${want.code}, got a non-wirepool exception ${(e as Error)?.name}: ${(e as Error)?.message ?? e}`);
  }
  const code = expectedCode(suite, want.code);
  if (e.code !== code) throw new ScenarioFailed(`expected error ${want.code} (${code}), got code ${e.code}: ${e.message}`);
  if (LISTENER !== null && code === suite.codes.WORKER_EXITED) {
    // PROTOCOL.md 21.6: a remote worker's end is its connection's, named in the details.
    const d = e.details as Json;
    const lost = d !== null && typeof d === "object" ? d.connection : undefined;
    if (lost !== "lost") throw new ScenarioFailed(`a remote worker's WORKER_EXITED must say "connection": "lost" in its details, got ${canonical(d ?? null)} (${e.message})`);
  }
  if ("protocol_code" in want) {
    const d = e.details as Json;
    const got = d !== null && typeof d === "object" ? d.protocol_code : undefined;
    if (got !== want.protocol_code) throw new ScenarioFailed(`expected protocol code ${want.protocol_code} in the details, got ${got} (${e.message})`);
  }
  if (want.message_contains !== undefined && !e.message.includes(want.message_contains)) {
    const m = e.message.length > 300 ? e.message.slice(0, 300) + "..." : e.message;
    throw new ScenarioFailed(`error message ${JSON.stringify(m)} does not contain ${JSON.stringify(want.message_contains).slice(0, 200)}`);
  }
  if ("details" in want && canonical(e.details ?? null) !== canonical(want.details)) {
    throw new ScenarioFailed(`error details ${canonical(e.details ?? null)} differ from the expected ${canonical(want.details)}`);
  }
  if ("signal" in want && e.signal !== want.signal) {
    throw new ScenarioFailed(`expected the worker to die by signal ${want.signal}, got ${e.signal} (${e.message})`);
  }
  if ("exit_status" in want && e.exitStatus !== want.exit_status) {
    throw new ScenarioFailed(`expected the worker to exit with status ${want.exit_status}, got ${e.exitStatus} (${e.message})`);
  }
  if (want.stderr_contains !== undefined && !e.stderrTail.includes(want.stderr_contains)) {
    throw new ScenarioFailed(`the stderr tail ${JSON.stringify(e.stderrTail)} does not contain ${JSON.stringify(want.stderr_contains)}`);
  }
}

function checkElapsed(expect: Json, elapsed: number): void {
  const low = expect.min_elapsed_s;
  if (low !== undefined && elapsed + 0.001 < low) throw new ScenarioFailed(`the outcome came after ${elapsed.toFixed(3)}s, before the ${low}s deadline`);
  const high = expect.max_elapsed_s;
  if (high !== undefined && elapsed > high) throw new ScenarioFailed(`the outcome took ${elapsed.toFixed(3)}s, more than ${high}s`);
}

function checkCall(suite: Suite, expect: Json, sent: Json, result: Json, error: unknown): void {
  if (expect.any) return;
  if ("error" in expect) {
    if (error === null) throw new ScenarioFailed(`expected error ${expect.error.code}, got the result ${describe(result)}`);
    checkError(suite, expect.error, error);
    return;
  }
  if (!("result" in expect)) throw new ScenarioFailed("the expectation has neither result nor error");
  if (error !== null) throw new ScenarioFailed(`expected a result, got error ${(error as WirepoolError).code}: ${(error as Error).message}`);
  sameBody(expect.result === "echo" ? sent : request(expect.result), result);
}

type Caller = Pool | Lease;

async function call(pool: Caller, method: string, codec: string, body: Json, timeoutS: number | undefined): Promise<[Json, unknown]> {
  try {
    const opts = timeoutS === undefined || timeoutS === null ? { codec: codec as "json" } : { codec: codec as "json", timeoutMs: timeoutS * 1000 };
    return [await pool.call(method, body, opts), null];
  } catch (e) {
    if (e instanceof WirepoolError) return [null, e];
    throw e;
  }
}

// -----------------------------------------------------------------------------------------------
// Streams

class RowShape {
  readonly shape: string;
  readonly size: number;
  constructor(expect: Json) {
    const rows = expect.rows ?? {};
    this.shape = rows.shape ?? "any";
    this.size = Number(rows.size ?? 0);
  }

  check(k: number, row: Json): number {
    let want: Json;
    if (this.shape === "decl") want = { i: k, name: `decl_${k}`, kind: "theorem" };
    else if (this.shape === "int_index") want = k;
    else if (this.shape === "unchecked") return 0;
    else if (this.shape === "raw_index") {
      const prefix = Math.min(this.size, 8);
      const ok = row instanceof Uint8Array && row.length === this.size && (() => {
        const idx = Buffer.alloc(8);
        idx.writeBigUInt64LE(BigInt(k));
        for (let i = 0; i < prefix; i++) if (row[i] !== idx[i]) return false;
        for (let i = prefix; i < this.size; i++) if (row[i] !== 0xab) return false;
        return true;
      })();
      if (!ok) throw new ScenarioFailed(`raw row ${k} (${describe(row)}) is not ${this.size} bytes of index ${k} then 0xAB`);
      return k;
    } else throw new ScenarioFailed(`unknown row shape ${JSON.stringify(this.shape)}`);
    if (canonical(row) !== canonical(want) || typeof row !== typeof want) throw new ScenarioFailed(`row ${k} is ${describe(row)}, expected ${describe(want)}`);
    return k;
  }
}

class Reader {
  count = 0;
  checksum = 0;
  terminal: ["end", Json] | ["error", WirepoolError] | null = null;

  constructor(
    readonly stream: RowStream<Json>,
    readonly shape: RowShape,
  ) {}

  get ended(): boolean {
    return this.terminal !== null;
  }

  async read(until?: number): Promise<void> {
    while (!this.ended && (until === undefined || this.count < until)) {
      let r: IteratorResult<Json>;
      try {
        r = await this.stream.next();
      } catch (e) {
        if (!(e instanceof WirepoolError)) throw e;
        this.terminal = ["error", e];
        break;
      }
      if (r.done) {
        this.terminal = ["end", this.stream.summary];
        break;
      }
      this.checksum += this.shape.check(this.count, r.value);
      this.count++;
    }
    if (this.ended) await this.afterTerminal();
  }

  /** Exactly one terminal: reading again yields nothing new. */
  private async afterTerminal(): Promise<void> {
    let r: IteratorResult<Json>;
    try {
      r = await this.stream.next();
    } catch (e) {
      if (this.terminal![0] === "error" && e === this.terminal![1]) return;
      throw new ScenarioFailed(`a second outcome (${(e as Error).message}) after the stream's terminal`);
    }
    if (!r.done) throw new ScenarioFailed(`a row (${describe(r.value)}) arrived after the stream's terminal`);
  }

  terminalText(): string {
    if (this.terminal === null) return "not ended";
    const [kind, value] = this.terminal;
    return kind === "end" ? "ended normally" : `then error ${(value as WirepoolError).code}: ${(value as WirepoolError).message}`;
  }
}

function checkStream(suite: Suite, expect: Json, reader: Reader): string {
  const rows = expect.rows ?? {};
  const n = reader.count;
  if ("count" in rows && n !== rows.count) throw new ScenarioFailed(`expected ${rows.count} rows, got ${n} (${reader.terminalText()})`);
  if ("min" in rows && n < rows.min) throw new ScenarioFailed(`expected at least ${rows.min} rows, got ${n}`);
  if ("max" in rows && n > rows.max) throw new ScenarioFailed(`expected at most ${rows.max} rows, got ${n}`);
  if ("checksum" in rows && reader.checksum !== rows.checksum) throw new ScenarioFailed(`row checksum ${reader.checksum} differs from ${rows.checksum}`);
  if (reader.terminal === null) throw new ScenarioFailed("the stream has not ended");
  const [kind, value] = reader.terminal;
  if (expect.any) return `${n} rows, then ${reader.terminalText()}`;
  if ("error" in expect) {
    if (kind === "end") throw new ScenarioFailed(`expected error ${expect.error.code} after the rows, the stream ended normally after ${n} rows`);
    checkError(suite, expect.error, value);
    return `${n} rows, then error ${(value as WirepoolError).code}`;
  }
  if (kind === "error") throw new ScenarioFailed(`after ${n} rows the stream failed with ${(value as WirepoolError).code}: ${(value as WirepoolError).message}`);
  const want = expect.summary;
  if (want === "none") {
    if (value !== undefined && value !== null) throw new ScenarioFailed(`expected no summary, got ${describe(value)}`);
  } else if (want !== undefined) {
    const expected = request(want);
    if (value === undefined || canonical(value) !== canonical(expected)) throw new ScenarioFailed(`expected the summary ${describe(expected)}, got ${describe(value)}`);
  }
  return `${n} rows, checksum ${reader.checksum}`;
}

// -----------------------------------------------------------------------------------------------
// The procedures

function snapshot(pool: Pool): [Set<number>, number] {
  const m = pool.metrics();
  return [new Set(m.workers.filter((w) => w.alive).map((w) => w.pid)), m.restarts];
}

function inFlight(pool: Pool): number {
  return pool.metrics().workers.reduce((n, w) => n + w.inFlight, 0);
}

async function waitFor(boundS: number, done: () => boolean): Promise<boolean> {
  const deadline = performance.now() + boundS * 1000;
  while (!done()) {
    if (performance.now() >= deadline) return false;
    await sleep(2); // polling the pool's own accounting, bounded
  }
  return true;
}

function methodOf(sc: Json): [string, string, Json] {
  return [sc.method, sc.codec ?? "json", request(sc.request)];
}

const sorted = (s: Set<number>) => `[${[...s].sort((a, b) => a - b).join(", ")}]`;

async function after(suite: Suite, sc: Json, pool: Pool, before: [Set<number>, number]): Promise<void> {
  const settle = Number(setting(suite, sc, "settle_s"));
  if (!(await waitFor(settle, () => inFlight(pool) === 0))) {
    throw new ScenarioFailed(`${inFlight(pool)} request(s) still in flight at the pool ${settle}s after the outcome: no terminal from the worker`);
  }
  const h = suite.health;
  const body = request(h.request);
  const retryUntil = performance.now() + (sc.kind === "any_outcome" ? settle * 1000 : 0);
  for (;;) {
    const [result, error] = await call(pool, h.method, h.codec, body, undefined);
    try {
      checkCall(suite, h.expect, body, result, error);
      break;
    } catch (e) {
      if (!(e instanceof ScenarioFailed)) throw e;
      if (performance.now() >= retryUntil) throw new ScenarioFailed(`the pool no longer serves: ${h.method}: ${e.message}`);
    }
    await sleep(50);
  }
  const [pids, restarts] = snapshot(pool);
  const want = setting(suite, sc, "restarted");
  const same = pids.size === before[0].size && [...pids].every((p) => before[0].has(p));
  if (want === false && (!same || restarts !== before[1])) {
    throw new ScenarioFailed(`the worker was replaced (pids ${sorted(before[0])} -> ${sorted(pids)}, restarts ${before[1]} -> ${restarts})`);
  }
  if (want === true && [...pids].some((p) => before[0].has(p))) {
    throw new ScenarioFailed(`expected the worker to be replaced, pids ${sorted(before[0])} -> ${sorted(pids)}`);
  }
  await checkLiveWorkers(suite, sc, Number(poolConfig(suite, sc).workers));
}

async function callScenario(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const [method, codec, body] = methodOf(sc);
  const expect = sc.expect;
  const started = performance.now();
  let [result, error] = await call(pool, method, codec, body, sc.call_timeout_s);
  const elapsed = (performance.now() - started) / 1000;
  checkCall(suite, expect, body, result, error);
  checkElapsed(expect, elapsed);
  if ("max_rss_after_mb" in expect) await checkRssAfter(suite, sc, Number(expect.max_rss_after_mb)); // the outcome is still held here
  const text = error !== null ? `error ${(error as WirepoolError).code} in ${elapsed.toFixed(3)}s` : `result ${describe(result)} in ${elapsed.toFixed(3)}s`;
  result = error = null;
  return text;
}

async function streamScenario(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const [method, codec, body] = methodOf(sc);
  const expect = sc.expect;
  const started = performance.now();
  const timeout = sc.call_timeout_s;
  const reader = new Reader(pool.stream(method, body, { codec: codec as "json", timeoutMs: timeout ? timeout * 1000 : undefined }), new RowShape(expect));
  if (sc.pause) {
    const [until, pause] = sc.pause;
    await reader.read(Number(until));
    await sleep(Number(pause) * 1000);
  }
  await reader.read();
  const elapsed = (performance.now() - started) / 1000;
  const detail = checkStream(suite, expect, reader);
  checkElapsed(expect, elapsed);
  return `${detail} in ${elapsed.toFixed(3)}s`;
}

async function cancelStream(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const [method, codec, body] = methodOf(sc);
  const want = Number(sc.read_rows);
  const stream = pool.stream(method, body, { codec: codec as "json" });
  const reader = new Reader(stream, new RowShape(sc.expect));
  await reader.read(want);
  if (reader.ended) throw new ScenarioFailed(`the endless stream ended after ${reader.count} rows (${reader.terminalText()})`);
  await sleep(Number(sc.pause_s ?? 0) * 1000); // not reading lets the worker use up its credit
  await stream.return(); // how a Node caller leaves a stream (break out of for-await)
  return `cancelled after ${want} rows`;
}

async function cancelCall(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const [method, codec, body] = methodOf(sc);
  const settle = Number(setting(suite, sc, "settle_s"));
  const ac = new AbortController();
  let done = false;
  const outcome = pool.call(method, body, { codec: codec as "json", signal: ac.signal }).then(
    (v) => ({ v, e: null as unknown }),
    (e) => ({ v: null, e }),
  );
  void outcome.then(() => (done = true));
  if (!(await waitFor(settle, () => inFlight(pool) >= 1 || done))) {
    ac.abort();
    throw new ScenarioFailed(`the call was not in flight within ${settle}s`);
  }
  if (done) {
    const { v, e } = await outcome;
    throw new ScenarioFailed(e !== null ? `the call ended with ${(e as WirepoolError).code} before it was cancelled: ${(e as Error).message}` : `the call returned ${describe(v)} before it was cancelled`);
  }
  // The REQUEST may still be in this turn's write: then the CANCEL follows it in the same write,
  // and every worker must still end the call CANCELLED (the Python worker once did not).
  ac.abort(); // how a Node caller cancels a call
  const { v, e } = await outcome;
  if (e instanceof WirepoolError && e.code === suite.codes.CANCELLED) return "cancelled while in flight";
  if (e !== null) throw new ScenarioFailed(`the cancelled call ended with ${(e as WirepoolError).code}: ${(e as Error).message}`);
  throw new ScenarioFailed(`the call returned ${describe(v)} instead of being cancelled`);
}

async function slowConsumer(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const [method, codec, body] = methodOf(sc);
  const expect = sc.expect;
  const bound = Number(sc.max_ahead_rows);
  const reader = new Reader(pool.stream(method, body, { codec: codec as "json" }), new RowShape(expect));
  let worst = 0;
  for (const [until, pause] of sc.checkpoints) {
    await reader.read(Number(until));
    if (reader.ended) throw new ScenarioFailed(`the stream ended after ${reader.count} rows, before checkpoint ${until} (${reader.terminalText()})`);
    await sleep(Number(pause) * 1000); // the consumer is slow: the producer must stall
    const produced = Number(await pool.call("raw_rows_produced", null));
    const ahead = Math.max(0, produced - reader.count);
    worst = Math.max(worst, ahead);
    if (ahead > bound) throw new ScenarioFailed(`the worker produced ${produced} rows while the consumer had read ${reader.count}: ${ahead} ahead, more than the ${bound} flow control allows`);
  }
  await reader.read();
  const detail = checkStream(suite, expect, reader);
  return `${detail}; producer at most ${worst} rows ahead (bound ${bound})`;
}

async function concurrent(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const calls = Number(sc.calls);
  const streams = Number(sc.streams);
  const streamRows = Number(sc.stream_rows);
  const oneCall = async (i: number) => {
    const got = await pool.call("add", { a: i, b: 2 * i });
    if (canonical(got) !== canonical({ sum: 3 * i })) throw new ScenarioFailed(`add #${i} returned ${describe(got)}`);
  };
  const oneStream = async (s: number) => {
    const n = streamRows + s;
    const reader = new Reader(pool.stream("decls", { n }, { codec: "json" }), new RowShape({ rows: { shape: "decl" } }));
    await reader.read();
    if (!(reader.count === n && reader.terminal?.[0] === "end" && canonical(reader.terminal[1]) === canonical({ rows: n }))) {
      throw new ScenarioFailed(`stream #${s}: ${reader.count} of ${n} rows, ${reader.terminalText()}`);
    }
  };
  const all = [...Array.from({ length: calls }, (_, i) => oneCall(i)), ...Array.from({ length: streams }, (_, s) => oneStream(s))];
  const outcomes = await Promise.allSettled(all);
  const errors = outcomes.filter((o): o is PromiseRejectedResult => o.status === "rejected");
  if (errors.length > 0) {
    const first = errors[0].reason as Error;
    throw new ScenarioFailed(`${errors.length} of ${outcomes.length} failed; first: ${first?.name}: ${first?.message}`);
  }
  return `${calls} calls and ${streams} streams at once, all correct`;
}

async function parallelCalls(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const [method, codec, body] = methodOf(sc);
  const outcomes = await Promise.all(Array.from({ length: Number(sc.count) }, () => call(pool, method, codec, body, undefined)));
  outcomes.forEach(([result, error], k) => {
    try {
      checkCall(suite, sc.expect, body, result, error);
    } catch (e) {
      if (e instanceof ScenarioFailed) throw new ScenarioFailed(`call #${k}: ${e.message}`);
      throw e;
    }
  });
  return `${outcomes.length} calls at once, all as expected`;
}

async function leaseScenario(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const calls = Number(sc.calls);
  const allowed = (sc.crash_codes as Json[]).map((c) => expectedCode(suite, c));
  const held = await pool.lease();
  try {
    const pid = held.pid;
    for (let k = 0; k < calls; k++) {
      const got = await held.call("whoami", null);
      if (got !== pid) throw new ScenarioFailed(`call #${k} on the lease of pid ${pid} was served by pid ${got}`);
    }
    const other = await pool.call("whoami", null);
    if (other === pid) throw new ScenarioFailed(`a pool call was served by the leased worker ${pid}`);
    const [, crashed] = await call(held, "crash", "json", null, undefined);
    const c = crashed as WirepoolError | null;
    if (c === null || !allowed.includes(c.code)) throw new ScenarioFailed(`crash on the lease ended with ${c === null ? "a result" : `${c.code} ${c.message}`}, expected one of ${sc.crash_codes}`);
    let value: Json;
    try {
      value = await held.call("add", { a: 1, b: 2 });
    } catch (e) {
      if (!(e instanceof WirepoolError)) throw e;
      if (e.code !== suite.codes.LEASE_LOST) throw new ScenarioFailed(`a call on the lost lease failed with ${e.code} (${e.message}), expected LEASE_LOST`);
      for (const attr of ["signal", "exitStatus", "stderrTail"] as const) {
        if (e[attr] !== c[attr]) throw new ScenarioFailed(`LEASE_LOST ${attr} ${JSON.stringify(e[attr])} differs from the crash's ${JSON.stringify(c[attr])}`);
      }
      return `${calls} calls on pid ${pid}; crash -> ${c.code}; then LEASE_LOST`;
    }
    throw new ScenarioFailed(`a call on the lost lease returned ${describe(value)}`);
  } finally {
    held.release();
  }
}

async function anyOutcome(suite: Suite, sc: Json, pool: Pool): Promise<string> {
  const [method, codec, body] = methodOf(sc);
  const timeout = sc.call_timeout_s;
  const started = performance.now();
  const oneStream = async () => {
    const reader = new Reader(pool.stream(sc.stream_method, body, { codec: codec as "json", timeoutMs: timeout ? timeout * 1000 : undefined }), new RowShape({ rows: { shape: "unchecked" } }));
    await reader.read();
    return `${reader.count} rows, ${reader.terminalText().slice(0, 80)}`;
  };
  const oneCall = async () => {
    const [, error] = await call(pool, method, codec, body, timeout);
    return error instanceof WirepoolError ? `error ${error.code}` : "a result";
  };
  const outcomes = await Promise.all([
    ...Array.from({ length: Number(sc.calls ?? 0) }, oneCall),
    ...Array.from({ length: Number(sc.streams ?? 0) }, oneStream),
  ]);
  checkElapsed(sc.expect, (performance.now() - started) / 1000);
  return outcomes.join("; ");
}

/** Pools a scenario started: closed when it ends, or at once when it runs out of time. */
class Scope {
  readonly pools = new Set<Pool>();
  async start(opts: PoolOptions): Promise<Pool> {
    const pool = await Pool.start(opts);
    this.pools.add(pool);
    return pool;
  }
  async closeAll(graceMs: number): Promise<void> {
    await Promise.all([...this.pools].map((p) => withTimeout(p.close({ graceMs }), 15_000)));
  }
}

async function startup(suite: Suite, sc: Json, worker: string[], cfg: Json, env: NodeJS.ProcessEnv | undefined, scope: Scope): Promise<string> {
  const require = (sc.require ?? []).map((r: Json) => ({ method: r.method, kind: r.kind, codec: r.codec }));
  const expect = sc.expect;
  const started = performance.now();
  let pool: Pool;
  try {
    pool = await scope.start({ ...poolOptions(cfg, worker, env), require });
  } catch (e) {
    if (!(e instanceof WirepoolError)) throw e;
    const elapsed = (performance.now() - started) / 1000;
    if (!("error" in expect)) throw new ScenarioFailed(`the pool did not start: ${e.code} ${e.message}`);
    checkError(suite, expect.error, e);
    checkElapsed(expect, elapsed);
    await checkLiveWorkers(suite, sc, 0); // the failed worker was reaped
    if (sc.then_start) {
      let again: Pool;
      try {
        again = await scope.start(poolOptions(cfg, worker, env));
      } catch (e2) {
        throw new ScenarioFailed(`refused at start-up as expected (${e.code}), but the next pool failed: ${(e2 as WirepoolError).code} ${(e2 as Error).message}`);
      }
      await after(suite, sc, again, snapshot(again));
      return `refused at start-up in ${elapsed.toFixed(3)}s: ${e.message}; the next pool served`;
    }
    return `refused at start-up in ${elapsed.toFixed(3)}s: ${e.message}`;
  }
  if ("error" in expect) throw new ScenarioFailed(`expected start-up to fail with ${expect.error.code}, the pool started`);
  await after(suite, sc, pool, snapshot(pool));
  return "started and served";
}

async function shutdownInFlight(suite: Suite, sc: Json, worker: string[], cfg: Json, env: NodeJS.ProcessEnv | undefined, scope: Scope): Promise<string> {
  const [method, codec, body] = methodOf(sc);
  const expect = sc.expect;
  const settle = Number(setting(suite, sc, "settle_s"));
  let pool: Pool;
  try {
    pool = await scope.start(poolOptions(cfg, worker, env));
  } catch (e) {
    throw new ScenarioFailed(`the pool did not start: ${(e as WirepoolError).code} ${(e as Error).message}`);
  }
  let done = false;
  const task = call(pool, method, codec, body, undefined);
  void task.then(() => (done = true));
  if (!(await waitFor(settle, () => inFlight(pool) >= 1 || done))) throw new ScenarioFailed(`the call was not in flight within ${settle}s`);
  const started = performance.now();
  await pool.close({ graceMs: Number(cfg.drain_grace_s) * 1000 });
  const shut = (performance.now() - started) / 1000;
  const [result, error] = await task;
  checkCall(suite, expect, body, result, error);
  checkElapsed(expect, shut);
  const [, late] = await call(pool, "add", "json", { a: 1, b: 2 }, undefined);
  if (late === null || (late as WirepoolError).code !== suite.codes.POOL_CLOSED) throw new ScenarioFailed(`a call after shutdown ended with ${late === null ? "a result" : (late as WirepoolError).code} instead of POOL_CLOSED`);
  const ended = error !== null ? `error ${(error as WirepoolError).code}` : describe(result);
  return `shut down in ${shut.toFixed(3)}s; the call ended with ${ended}`;
}

const PROCEDURES: Record<string, (suite: Suite, sc: Json, pool: Pool) => Promise<string>> = {
  call: callScenario,
  stream: streamScenario,
  cancel_stream: cancelStream,
  cancel_call: cancelCall,
  slow_consumer: slowConsumer,
  concurrent,
  parallel_calls: parallelCalls,
  lease: leaseScenario,
  any_outcome: anyOutcome,
};

/**
 * The pool's clamp notices (PROTOCOL.md 4.2: max_in_flight above the worker's max_concurrency,
 * said once per pool) since the scenario's pool started: process warnings with that text.
 */
const CLAMP_TEXT = "is above the worker's max_concurrency";
let clampNotices = 0;
process.on("warning", (w) => {
  if (w.message.includes(CLAMP_TEXT)) clampNotices++;
});

function checkClampNotices(sc: Json): void {
  const want = sc.expect?.clamp_notices;
  if (typeof want === "number" && clampNotices !== want) {
    throw new ScenarioFailed(`the pool logged ${clampNotices} clamp notice(s) (max_in_flight above the worker's max_concurrency), expected ${want}`);
  }
}

async function runIn(suite: Suite, sc: Json, worker: string[], tmp: string, scope: Scope): Promise<string> {
  const cfg = poolConfig(suite, sc);
  const env = workerEnv(sc, tmp);
  if (sc.kind === "startup") return startup(suite, sc, worker, cfg, env, scope);
  if (sc.kind === "shutdown_in_flight") return shutdownInFlight(suite, sc, worker, cfg, env, scope);
  const procedure = PROCEDURES[sc.kind];
  if (procedure === undefined) throw new ScenarioFailed(`unknown scenario kind ${JSON.stringify(sc.kind)}`);
  clampNotices = 0;
  let pool: Pool;
  try {
    pool = await scope.start(poolOptions(cfg, worker, env));
  } catch (e) {
    if (e instanceof WirepoolError) throw new ScenarioFailed(`the pool did not start: ${e.code} ${e.message}`);
    throw e;
  }
  const before = snapshot(pool);
  const detail = await procedure(suite, sc, pool);
  await after(suite, sc, pool, before);
  checkClampNotices(sc);
  return detail;
}

class TimedOut extends Error {}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<T>((_, reject) => {
      timer = setTimeout(() => reject(new TimedOut()), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const sep = argv.indexOf("--");
  if (sep < 0 || sep === argv.length - 1) {
    process.stderr.write("usage: parent.js --scenarios FILE [--only NAME ...] [--transport socketpair|tls|tcp] -- WORKER COMMAND...\n");
    process.exit(2);
  }
  const worker = argv.slice(sep + 1);
  let file = "";
  const only: string[] = [];
  let transport = "socketpair";
  for (let k = 0; k < sep; k++) {
    if (argv[k] === "--scenarios") file = argv[++k];
    else if (argv[k] === "--only") only.push(argv[++k]);
    else if (argv[k] === "--transport") transport = argv[++k];
  }
  if (!["socketpair", "tls", "tcp"].includes(transport)) {
    process.stderr.write(`--transport must be socketpair, tls or tcp, not ${JSON.stringify(transport)}\n`);
    process.exit(2);
  }
  // Refusals go to stderr (bounded per second by the listener): stdout is the report.
  if (transport !== "socketpair") LISTENER = await Listener.start({ tls: transport === "tls" });
  const doc = JSON.parse(readFileSync(file, "utf8"));
  const suite: Suite = { codes: doc.error_codes, defaults: doc.defaults, health: doc.health_check };
  // Worker output (scenarios flood it) is read and dropped: this runner's stderr is its report.
  for (const sc of doc.scenarios as Json[]) {
    if (only.length > 0 && !only.includes(sc.name)) continue;
    const bound = Number(setting(suite, sc, "timeout_s"));
    const started = performance.now();
    await releaseEarlierScenarios();
    resetPeakRss();
    const tmp = mkdtempSync(join(tmpdir(), "wirepool-scenario-"));
    const scope = new Scope();
    let ok = false;
    let detail: string;
    try {
      detail = await withTimeout(runIn(suite, sc, worker, tmp, scope), bound * 1000);
      ok = true;
    } catch (e) {
      if (e instanceof TimedOut) detail = `did not finish within its timeout_s of ${bound}s`;
      else if (e instanceof ScenarioFailed) detail = e.message;
      else detail = `unexpected ${(e as Error)?.name}: ${(e as Error)?.message ?? e}`;
    }
    try {
      await scope.closeAll(ok ? 1000 : 0);
    } catch (e) {
      if (ok) {
        ok = false;
        detail = `${detail}; the pool did not close: ${(e as Error)?.message ?? e}`;
      }
    }
    rmSync(tmp, { recursive: true, force: true });
    const limit = setting(suite, sc, "max_parent_rss_mb");
    if (limit !== undefined && limit !== null) {
      const peak = statusMb("VmHWM");
      detail += `; parent peak RSS ${peak.toFixed(0)} MB`;
      if (ok && peak > Number(limit)) {
        ok = false;
        detail = `${detail}, above the bound of ${limit} MB`;
      }
    }
    const line = { scenario: sc.name, ok, detail, elapsed: (performance.now() - started) / 1000 };
    process.stdout.write(JSON.stringify(line) + "\n");
  }
  await LISTENER?.close();
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`runner failed: ${(e as Error)?.stack ?? e}\n`);
    process.exit(1);
  },
);
