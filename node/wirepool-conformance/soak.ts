/**
 * The Node parent's soak driver (`Pool` of the Node SDK): mixed load on a pool of conformance
 * workers while their processes are killed and stopped at random, then a pool whose replacements
 * keep failing. It measures and prints one JSON line (the summary); `conformance/test_soak.py`
 * holds the invariants and asserts them on the summary. It does what the Python parent's driver
 * (`python/conformance/soak.py`, whose docstring describes the procedure) and the Rust
 * one (`rust/wirepool-conformance/src/bin/soak_parent.rs`) do, step for step, so the summaries
 * have the same fields.
 *
 *     node --expose-gc build/soak.js --seed N [--seconds S] [--workers W] [--max-restarts R]
 *         [--fail-fast-seconds F] --python PY --fail-after conformance/soak/fail_after.py
 *         -- WORKER COMMAND...
 *
 * `--expose-gc` lets the memory figures be read after a full collection (garbage is not a leak),
 * as the Python driver reads them after `gc.collect()`.
 *
 * Where Node differs in how it measures (the figures are the same ones): RSS is read once V8 has
 * returned the pages a collection freed (settledRssMb); V8's young generation gets its working
 * size before the baseline (growYoungGeneration); one child process is spawned before the
 * descriptor count (firstSpawn). Each says why.
 *
 * Node has one event loop: the load tasks, the chaos and the pool share it, and an operation
 * cannot be abandoned as Python cancels a coroutine: one that has no outcome within the bound is
 * counted `no_outcome`, and whatever it would record later is dropped (one outcome each).
 *
 * The seed fixes every random choice (the schedule still depends on timing); it is in the summary.
 */

import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { getHeapSpaceStatistics } from "node:v8";
import { Pool, WirepoolError, type Lease, type PoolOptions } from "wirepool";

type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any

const LOAD_TASKS = 6;
/** Calls at once in a burst (the pool's max_in_flight is 32 per worker). */
const BURST = 48;
const MAP_ITEMS = 64;
/** An operation without an outcome by then is a hang. */
const OP_BOUND_MS = 30_000;
/** After the chaos: the pool back to `workers` live workers (> STARTUP_TIMEOUT_MS). */
const SETTLE_MS = 15_000;
/** The live count must hold this long (a late extra replacement shows up). */
const LIVE_HOLD_MS = 500;
const HEARTBEAT_MS = 250;
/** A worker stopped before its HELLO is found by the start-up timeout, not the heartbeat: short
 * enough to settle soon after the chaos, long enough for a Python worker on a busy machine. */
const STARTUP_TIMEOUT_MS = 4000;
/** What a killed or stopped worker's requests get. */
const CHAOS_CODES = ["WORKER_EXITED", "WORKER_HUNG"];
/** From the kill to the pool giving up. */
const TRIP_BOUND_MS = 20_000;
/** What a pool that gave up says (every parent). */
const GAVE_UP = "restart intensity exceeded";
/** Unexpected outcomes kept verbatim in the summary. */
const SAMPLES = 8;

// The outcomes an operation may end in: its own, or what a killed or stopped worker gives.
const OK = new Set(["ok", ...CHAOS_CODES]);
const DEADLINE = new Set(["DEADLINE_EXCEEDED", ...CHAOS_CODES]);
const FAILED = new Set(["HANDLER_ERROR", ...CHAOS_CODES]);

const gc: () => void = (globalThis as { gc?: () => void }).gc ?? (() => {});

function log(msg: string): void {
  process.stderr.write(`soak.js: ${msg}\n`);
}

// -----------------------------------------------------------------------------------------------
// Arguments

interface Args {
  seed: number;
  seedText: string;
  seconds: number;
  workers: number;
  maxRestarts: number;
  failFastSeconds: number;
  python: string;
  failAfter: string;
  worker: string[];
}

function usage(problem: string): never {
  process.stderr.write(
    `soak.js: ${problem}\nusage: soak.js --seed N [--seconds S] [--workers W] [--max-restarts R] ` +
      `[--fail-fast-seconds F] --python PY --fail-after SCRIPT -- WORKER COMMAND...\n`,
  );
  process.exit(2);
}

function parseArgs(argv: string[]): Args {
  const out: Args = { seed: NaN, seedText: "", seconds: 20, workers: 3, maxRestarts: 5, failFastSeconds: 2, python: "python3", failAfter: "", worker: [] };
  const number = (name: string, text: string | undefined, integer: boolean): number => {
    const v = Number(text);
    if (text === undefined || text === "" || !Number.isFinite(v) || (integer && !Number.isSafeInteger(v)) || v < 0) usage(`bad ${name} ${JSON.stringify(text)}`);
    return v;
  };
  for (let k = 0; k < argv.length; k++) {
    const arg = argv[k];
    const value = (): string => {
      if (k + 1 >= argv.length) usage(`${arg} needs a value`);
      return argv[++k];
    };
    switch (arg) {
      case "--seed":
        out.seedText = value();
        out.seed = number("--seed", out.seedText, true);
        break;
      case "--seconds":
        out.seconds = number(arg, value(), false);
        break;
      case "--workers":
        out.workers = number(arg, value(), true);
        break;
      case "--max-restarts":
        out.maxRestarts = number(arg, value(), true);
        break;
      case "--fail-fast-seconds":
        out.failFastSeconds = number(arg, value(), false);
        break;
      case "--python":
        out.python = value();
        break;
      case "--fail-after":
        out.failAfter = value();
        break;
      case "--":
        out.worker = argv.slice(k + 1);
        k = argv.length;
        break;
      default:
        usage(`unknown argument ${JSON.stringify(arg)}`);
    }
  }
  if (Number.isNaN(out.seed)) usage("--seed N is required");
  if (out.worker.length === 0) usage("the worker command follows --");
  if (out.failAfter === "") usage("--fail-after SCRIPT is required");
  if (out.workers < 1) usage("--workers must be at least 1");
  return out;
}

// -----------------------------------------------------------------------------------------------
// Randomness (seeded, no dependency): SplitMix64, as the Rust driver

class Rng {
  private state: bigint;

  constructor(seed: bigint) {
    this.state = BigInt.asUintN(64, seed);
  }

  private next(): bigint {
    this.state = BigInt.asUintN(64, this.state + 0x9e3779b97f4a7c15n);
    let z = this.state;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    return z ^ (z >> 31n);
  }

  /** Uniform in [0, 1). */
  unit(): number {
    return Number(this.next() >> 11n) / 2 ** 53;
  }

  uniform(lo: number, hi: number): number {
    return lo + (hi - lo) * this.unit();
  }

  /** Uniform in [lo, hi]. */
  int(lo: number, hi: number): number {
    return lo + Number(this.next() % BigInt(hi - lo + 1));
  }
}

// -----------------------------------------------------------------------------------------------
// The process: memory, descriptors, children

/** Where memory is (MB), for the log: what RSS is made of when a bound is near. */
function heapMb(): string {
  const m = process.memoryUsage();
  const mb = (x: number): string => (x / (1 << 20)).toFixed(1);
  const young = getHeapSpaceStatistics().find((sp) => sp.space_name === "new_space")?.space_size ?? 0;
  return `rss ${mb(m.rss)}, JS heap ${mb(m.heapUsed)} used of ${mb(m.heapTotal)} (young generation ${mb(young)}), external ${mb(m.external)}, array buffers ${mb(m.arrayBuffers)}`;
}

function statusMb(field: string): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(readFileSync("/proc/self/status", "latin1"));
    return m === null ? 0 : Number(m[1]) / 1024;
  } catch {
    return 0;
  }
}

/**
 * RSS (MB) after a full collection, once V8 has returned the pages it freed: it unmaps them on a
 * background task after the collection, so a read at once still counts them (up to ~10 MB here,
 * gone a turn of the loop later). Polls /proc until RSS stops falling, bounded (200 ms).
 */
async function settledRssMb(): Promise<number> {
  gc();
  let rss = statusMb("VmRSS");
  for (let k = 0; k < 10; k++) {
    await sleep(20); // polling /proc for the background unmapping, bounded
    const read = statusMb("VmRSS");
    if (read >= rss - 0.1) return Math.min(read, rss);
    rss = read;
  }
  return rss;
}

function openFds(): number {
  return readdirSync("/proc/self/fd").length;
}

/** Our child processes that have not exited (zombies excluded), with their state letter (`T` for
 * a stopped one). */
function children(): Map<number, string> {
  const found = new Map<number, string>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, "latin1");
    } catch {
      continue;
    }
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" "); // after the command name
    if (Number(fields[1]) === process.pid && fields[0] !== "Z") found.set(Number(entry), fields[0]);
  }
  return found;
}

function cmdline(pid: number | "self"): Buffer | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`);
  } catch {
    return undefined;
  }
}

const SELF_CMDLINE = cmdline("self");

/** The child has run exec (its argv is no longer ours). Between fork and exec a child is this
 * process's own copy: stopping it there stops the parent's spawn, not a worker, so the chaos
 * leaves it alone. */
function execd(pid: number): boolean {
  const argv = cmdline(pid);
  return argv !== undefined && SELF_CMDLINE !== undefined && !argv.equals(SELF_CMDLINE);
}

function sortedPids(pids: Iterable<number>): number[] {
  return [...pids].sort((a, b) => a - b);
}

function sameMap(a: Map<number, string>, b: Map<number, string>): boolean {
  if (a.size !== b.size) return false;
  for (const [k, v] of a) if (b.get(k) !== v) return false;
  return true;
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // ESRCH: it died meanwhile
  }
}

function round(x: number, digits: number): number {
  const m = 10 ** digits;
  return Math.round(x * m) / m;
}

function now(): number {
  return performance.now();
}

// -----------------------------------------------------------------------------------------------
// Outcomes

/** An error's outcome name: its code's name if typed, else `untyped:<class>`. */
function outcomeOf(e: unknown): string {
  if (e instanceof WirepoolError) return e.codeName;
  const name = (e as { constructor?: { name?: string } } | null)?.constructor?.name;
  return `untyped:${name ?? typeof e}`;
}

/** An error's text; for an untyped one, where it was raised too (the SDK's bug to find). */
function describe(e: unknown): string {
  if (e instanceof WirepoolError) return e.message;
  const err = e as Error | null;
  const frames = (err?.stack ?? "").split("\n").slice(1, 5).map((l) => l.trim()).join(" <- ");
  return `${err?.name}: ${err?.message ?? String(e)} raised ${frames}`;
}

/** Same JSON value (the results compared here are small objects of numbers and strings). */
function sameJson(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

class TimedOut extends Error {}

/** `p` within `ms`, else TimedOut (`p` still runs; `late` gets its value if it comes after). */
function within<T>(p: Promise<T>, ms: number, what: string, late?: (v: T) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let expired = false;
    const timer = setTimeout(() => {
      expired = true;
      reject(new TimedOut(`${what}: no outcome within ${ms / 1000}s`));
    }, ms);
    p.then(
      (v) => {
        clearTimeout(timer);
        if (expired) late?.(v);
        else resolve(v);
      },
      (e) => {
        clearTimeout(timer);
        if (!expired) reject(e);
      },
    );
  });
}

function increment(counter: Map<string, number>, key: string, n = 1): void {
  counter.set(key, (counter.get(key) ?? 0) + n);
}

function sortedObject(counter: Map<string, number>): Record<string, number> {
  return Object.fromEntries([...counter].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

// -----------------------------------------------------------------------------------------------
// The soak

/** One operation's view of the bookkeeping: once its bound has passed (it counted
 * `no_outcome`), whatever it would still record is dropped, so it has exactly one outcome. */
class Op {
  expired = false;

  constructor(private readonly soak: Soak) {}

  record(op: string, outcome: string, allowed: ReadonlySet<string>, detail = ""): void {
    if (!this.expired) this.soak.record(op, outcome, allowed, detail);
  }

  countRows(what: string): void {
    if (!this.expired) increment(this.soak.rows, what);
  }
}

class Soak {
  readonly outcomes = new Map<string, number>();
  /** Requests started, by operation. */
  readonly started = new Map<string, number>();
  readonly byOp = new Map<string, Map<string, number>>();
  readonly unexpected: string[] = [];
  /** streams, total (rows), complete, closed_early, broken, seq_errors. */
  readonly rows = new Map<string, number>();
  /** kill, stop_cont, stop_left. */
  readonly actions = new Map<string, number>();
  running = true;

  constructor(
    readonly pool: Pool,
    readonly rng: Rng,
  ) {}

  /** One operation's single outcome; an outcome outside `allowed` is unexpected. */
  record(op: string, outcome: string, allowed: ReadonlySet<string>, detail: string): void {
    increment(this.outcomes, outcome);
    let per = this.byOp.get(op);
    if (per === undefined) this.byOp.set(op, (per = new Map()));
    increment(per, outcome);
    if (!allowed.has(outcome)) {
      increment(this.outcomes, "unexpected");
      if (this.unexpected.length < SAMPLES) this.unexpected.push(`${op}: ${outcome}: ${detail}`.slice(0, 400));
    }
  }

  /** Runs one operation, which records its own outcome, within OP_BOUND_MS. A burst's calls are
   * counted as requests each (`burst_call`), the burst itself not. */
  async bounded(op: string, allowed: ReadonlySet<string>, run: (o: Op) => Promise<void>): Promise<void> {
    if (op === "burst") increment(this.started, "burst_call", BURST);
    else increment(this.started, op);
    const o = new Op(this);
    // An exception escaping an operation (none should: each catches its call's) is an outcome too.
    let running: Promise<void>;
    try {
      running = run(o).catch((e) => o.record(op, outcomeOf(e), allowed, describe(e)));
    } catch (e) {
      o.record(op, outcomeOf(e), allowed, describe(e));
      return;
    }
    try {
      await within(running, OP_BOUND_MS, op);
    } catch {
      o.record(op, "no_outcome", allowed, `no outcome within ${OP_BOUND_MS / 1000}s`);
      o.expired = true;
    }
  }

  // -- operations, each drawing nothing random: load() draws for them ----------------------------

  private checkAdd(o: Op, op: string, i: number, got: unknown): void {
    o.record(op, sameJson(got, { sum: 3 * i }) ? "ok" : "wrong_result", OK, `add ${i} answered ${JSON.stringify(got)}`);
  }

  async add(o: Op, i: number, op = "add"): Promise<void> {
    let got: unknown;
    try {
      got = await this.pool.call("add", { a: i, b: 2 * i });
    } catch (e) {
      o.record(op, outcomeOf(e), OK, describe(e));
      return;
    }
    this.checkAdd(o, op, i, got);
  }

  async burst(o: Op, base: number): Promise<void> {
    const calls: Promise<void>[] = [];
    for (let k = 0; k < BURST; k++) calls.push(this.add(o, base + k, "burst_call"));
    await Promise.all(calls);
  }

  /** A map counts as one operation: every result in order, or the first error. */
  async map(o: Op, base: number): Promise<void> {
    const requests = [];
    for (let j = 0; j < MAP_ITEMS; j++) requests.push({ a: base + j, b: 2 * (base + j) });
    let got: unknown[];
    try {
      got = await this.pool.map("add", requests);
    } catch (e) {
      o.record("map", outcomeOf(e), OK, describe(e));
      return;
    }
    for (let k = 0; k < got.length; k++) {
      if (!sameJson(got[k], { sum: 3 * (base + k) })) {
        o.record("map", "wrong_result", OK, `item ${k} answered ${JSON.stringify(got[k])}`);
        return;
      }
    }
    o.record("map", got.length === MAP_ITEMS ? "ok" : "wrong_result", OK, `${got.length} of ${MAP_ITEMS} results`);
  }

  /** Checks row number `k`; false (recorded) if it is not the row of that number. */
  private streamRow(o: Op, op: string, n: number, k: number, row: unknown): boolean {
    if (!sameJson(row, { i: k, name: `decl_${k}`, kind: "theorem" })) {
      o.countRows("seq_errors");
      o.record(op, "wrong_row", OK, `row ${k} of ${n} was ${JSON.stringify(row)}`);
      return false;
    }
    o.countRows("total");
    return true;
  }

  /** `decls`: row k must be row number k (nothing lost or repeated), then the summary; with
   * `closeAfter`, the stream is closed (cancelled) after that many rows. */
  async stream(o: Op, n: number, closeAfter: number | null): Promise<void> {
    const op = closeAfter === null ? "stream" : "stream_closed_early";
    const stream = this.pool.stream("decls", { n });
    o.countRows("streams");
    let k = 0;
    try {
      // Leaving the loop (return) closes the stream: the worker gets CANCEL.
      for await (const row of stream) {
        if (!this.streamRow(o, op, n, k, row)) return;
        k++;
        if (closeAfter !== null && k >= closeAfter) {
          o.countRows("closed_early");
          o.record(op, "ok", OK);
          return;
        }
      }
      const again = await stream.next(); // a second read of an ended stream yields nothing new
      if (!again.done) {
        o.record(op, "read_after_end", OK, `got ${JSON.stringify(again.value)}`);
        return;
      }
    } catch (e) {
      o.countRows("broken");
      o.record(op, outcomeOf(e), OK, `after ${k} of ${n} rows: ${describe(e)}`);
      return;
    }
    if (k !== n || !sameJson(stream.summary, { rows: n })) {
      o.countRows("seq_errors");
      o.record(op, "wrong_rows", OK, `${k} of ${n} rows, summary ${JSON.stringify(stream.summary)}`);
      return;
    }
    o.countRows("complete");
    o.record(op, "ok", OK);
  }

  async deadline(o: Op, ms: number): Promise<void> {
    let got: unknown;
    try {
      got = await this.pool.call("sleep", ms, { timeoutMs: 100 });
    } catch (e) {
      o.record("deadline", outcomeOf(e), DEADLINE, describe(e));
      return;
    }
    o.record("deadline", "ok", DEADLINE, `sleep ${ms} with a 100 ms deadline gave ${JSON.stringify(got)}`);
  }

  async fail(o: Op): Promise<void> {
    let got: unknown;
    try {
      got = await this.pool.call("fail", null);
    } catch (e) {
      o.record("fail", outcomeOf(e), FAILED, describe(e));
      return;
    }
    o.record("fail", "ok", FAILED, `fail answered ${JSON.stringify(got)}`);
  }

  /** Random operations back to back. */
  async load(): Promise<void> {
    const rng = this.rng;
    while (this.running) {
      const r = rng.unit();
      if (r < 0.3) {
        const i = rng.int(0, 2 ** 30 - 1);
        await this.bounded("add", OK, (o) => this.add(o, i));
      } else if (r < 0.55) {
        const n = rng.int(1, 3000);
        await this.bounded("stream", OK, (o) => this.stream(o, n, null));
      } else if (r < 0.62) {
        const n = rng.int(1, 3000);
        const c = rng.int(1, 200);
        await this.bounded("stream_closed_early", OK, (o) => this.stream(o, n, c));
      } else if (r < 0.75) {
        const base = rng.int(0, 2 ** 20 - 1);
        await this.bounded("burst", OK, (o) => this.burst(o, base));
      } else if (r < 0.85) {
        const base = rng.int(0, 2 ** 20 - 1);
        await this.bounded("map", OK, (o) => this.map(o, base));
      } else if (r < 0.95) {
        const ms = rng.int(300, 600);
        await this.bounded("deadline", DEADLINE, (o) => this.deadline(o, ms));
      } else {
        await this.bounded("fail", FAILED, (o) => this.fail(o));
      }
    }
  }

  // -- chaos --------------------------------------------------------------------------------------

  async chaos(): Promise<void> {
    const rng = this.rng;
    while (this.running) {
      await sleep(rng.uniform(50, 400));
      const kids = sortedPids(children().keys()).filter(execd);
      if (kids.length === 0 || !this.running) continue;
      const pid = kids[rng.int(0, kids.length - 1)];
      const r = rng.unit();
      if (r < 0.5) {
        signal(pid, "SIGKILL");
        increment(this.actions, "kill");
      } else if (r < 0.8) {
        signal(pid, "SIGSTOP");
        setTimeout(() => {
          if (children().has(pid)) signal(pid, "SIGCONT"); // still ours (not reaped and reused)
        }, rng.uniform(50, 600));
        increment(this.actions, "stop_cont");
      } else {
        signal(pid, "SIGSTOP");
        increment(this.actions, "stop_left");
      }
    }
  }
}

/** Waits (bounded) for exactly `want` live, running children held for LIVE_HOLD_MS, which must be
 * the pool's own pids; returns what it saw. */
async function settleLive(want: number, poolPids: () => number[]): Promise<Json> {
  const started = now();
  const deadline = started + SETTLE_MS;
  for (;;) {
    const seen = children();
    const running = sortedPids([...seen].filter(([, st]) => st !== "T").map(([p]) => p));
    if (seen.size === want && running.length === want && sameJson(poolPids(), running)) {
      const heldUntil = now() + LIVE_HOLD_MS;
      while (now() < heldUntil && sameMap(children(), seen)) await sleep(50); // polling /proc: nothing to wait on
      if (sameMap(children(), seen)) {
        return { settled: true, after_s: round((now() - started) / 1000, 3), live_pids: sortedPids(seen.keys()), pool_pids: poolPids() };
      }
    }
    if (now() >= deadline) {
      return {
        settled: false,
        after_s: round((now() - started) / 1000, 3),
        live_pids: sortedPids(seen.keys()),
        stopped_pids: sortedPids([...seen].filter(([, st]) => st === "T").map(([p]) => p)),
        pool_pids: poolPids(),
      };
    }
    await sleep(50); // polling /proc, bounded by the deadline
  }
}

/** The pool's own list of its live workers. */
function poolPids(pool: Pool): number[] {
  return sortedPids(pool.metrics().workers.filter((w) => w.alive).map((w) => w.pid));
}

/** `n` leases held at once, each answering `whoami`: the pids of n serving workers. */
async function leasePids(pool: Pool, n: number): Promise<number[]> {
  const leases: Lease[] = [];
  const pids: number[] = [];
  try {
    for (let k = 0; k < n; k++) {
      const lease = await within(pool.lease(), 10_000, `a lease with ${leases.length} held`, (late) => late.release());
      leases.push(lease);
      pids.push(await within(lease.call<number>("whoami", null), 10_000, "whoami through a lease"));
    }
  } finally {
    for (const l of leases) l.release();
  }
  return sortedPids(pids);
}

/** Our children left after the pool closed (bounded wait for them to be reaped). */
async function noChildren(): Promise<number[]> {
  const deadline = now() + 5000;
  while (children().size > 0 && now() < deadline) await sleep(50); // polling /proc, bounded
  return sortedPids(children().keys());
}

/** How long each phase took (seconds), for the summary: where a run's time goes. */
class Phases {
  readonly times: Record<string, number> = {};
  private last = now();

  mark(name: string): void {
    const t = now();
    this.times[name] = round((t - this.last) / 1000, 2);
    this.last = t;
  }
}

async function closePool(pool: Pool, graceMs: number, what: string): Promise<void> {
  try {
    await within(pool.close({ graceMs }), 30_000, `${what} close()`);
  } catch (e) {
    log(`${what}: ${describe(e)}`);
  }
}

/** Node keeps a descriptor open from a process's first spawn on (whatever spawns): one spawn
 * before the count, so the count before the pool has it as the count after does. */
async function firstSpawn(): Promise<void> {
  const child = spawn(process.execPath, ["-e", ""], { stdio: ["ignore", "pipe", "pipe"] });
  child.stdout.resume();
  child.stderr.resume();
  await within(new Promise<void>((resolve) => child.once("close", () => resolve())), 30_000, "a first child process");
}

/**
 * Gives V8's young generation its working size before the memory baseline. V8 grows it (from
 * 2 x 1 MiB to 2 x 16 MiB semi-spaces here) as objects survive its collections and keeps the pages
 * resident once grown: the soak's load grows it to the top within seconds, +28 MB of RSS that an
 * empty young generation holds after a full collection, which is the runtime's sizing and not the
 * soak's growth. The 200 warm-up calls (what the other drivers make) do not grow it. Objects that
 * survive one collection each, until its size stops changing (bounded).
 */
function growYoungGeneration(): void {
  const size = (): number => getHeapSpaceStatistics().find((sp) => sp.space_name === "new_space")?.space_size ?? 0;
  let window: { i: number; s: string }[] = [];
  let last = size();
  let same = 0;
  for (let round = 0; round < 40 && same < 3; round++) {
    for (let i = 0; i < 250_000; i++) {
      window.push({ i, s: `x${i}` });
      if (window.length > 100_000) window = [];
    }
    const now = size();
    same = now === last ? same + 1 : 0;
    last = now;
  }
  window = [];
  log(`young generation: ${(last / (1 << 20)).toFixed(0)} MB`);
}

async function soak(args: Args, rng: Rng, phases: Phases): Promise<Json> {
  await firstSpawn();
  const fdsBefore = openFds();
  const options: PoolOptions = {
    command: args.worker,
    workers: args.workers,
    codec: "json",
    maxInFlight: 32,
    heartbeatMs: HEARTBEAT_MS,
    startupTimeoutMs: STARTUP_TIMEOUT_MS,
    maxRestarts: 100_000,
    restartWindowMs: 60_000,
    restartBackoffMs: 10,
    restartBackoffMaxMs: 200,
  };
  const pool = await Pool.start(options);
  const out: Json = {};
  try {
    for (let i = 0; i < 200; i++) {
      // Warm up before the memory baseline.
      await within(pool.call("add", { a: i, b: 2 * i }), 10_000, "a warm-up call");
    }
    growYoungGeneration();
    const rssBefore = await settledRssMb();
    resetPeakRss(); // the warm-up's own objects are not the soak's peak
    log(`memory before the soak: ${heapMb()}`);
    phases.mark("start");
    const s = new Soak(pool, rng);
    const started = now();
    const chaos = s.chaos();
    const loads: Promise<void>[] = [];
    for (let k = 0; k < LOAD_TASKS; k++) loads.push(s.load());
    await sleep(args.seconds * 1000); // the soak's duration: load and chaos run meanwhile
    phases.mark("chaos");
    s.running = false;
    await chaos;
    await Promise.all(loads);
    const loadS = (now() - started) / 1000;
    phases.mark("load_ends");
    log(`load done after ${loadS.toFixed(1)}s: ${JSON.stringify(sortedObject(s.outcomes))}; chaos ${JSON.stringify(sortedObject(s.actions))}`);
    const live = await settleLive(args.workers, () => poolPids(pool));
    phases.mark("settle");
    try {
      live.lease_pids = await leasePids(pool, args.workers);
    } catch (e) {
      live.answer_error = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    }
    const health = new Map<string, number>();
    for (let i = 0; i < 50; i++) {
      let outcome: string;
      try {
        const got = await within(pool.call("add", { a: i, b: 2 * i }), 10_000, "a health call");
        outcome = sameJson(got, { sum: 3 * i }) ? "ok" : "wrong_result";
      } catch (e) {
        outcome = e instanceof TimedOut ? "no_outcome" : outcomeOf(e);
      }
      increment(health, outcome);
    }
    live.health = sortedObject(health);
    live.in_flight = pool.metrics().workers.reduce((sum, w) => sum + w.inFlight, 0);
    const rssAfter = await settledRssMb();
    log(`memory after the soak: ${heapMb()}`);
    let total = 0;
    for (const [k, v] of s.outcomes) if (k !== "unexpected") total += v;
    Object.assign(out, {
      load_s: round(loadS, 2),
      requests: {
        total,
        by_outcome: sortedObject(s.outcomes),
        started_by_op: sortedObject(s.started),
        by_op: Object.fromEntries([...s.byOp].sort(([a], [b]) => (a < b ? -1 : 1)).map(([op, c]) => [op, sortedObject(c)])),
        unexpected_samples: s.unexpected,
      },
      rows: Object.fromEntries(["total", "streams", "complete", "closed_early", "broken", "seq_errors"].map((k) => [k, s.rows.get(k) ?? 0])),
      chaos: Object.fromEntries(["kill", "stop_cont", "stop_left"].map((k) => [k, s.actions.get(k) ?? 0])),
      final: live,
      memory_mb: { before: round(rssBefore, 1), after: round(rssAfter, 1) },
    });
    phases.mark("final_checks");
  } finally {
    await closePool(pool, 2000, "the soak pool");
  }
  out.children_after_close = await noChildren();
  out.fds = { before: fdsBefore, after: openFds() };
  phases.mark("close");
  return out;
}

// -----------------------------------------------------------------------------------------------
// The restart limit

async function restartLimit(args: Args): Promise<Json> {
  const r = args.maxRestarts;
  const state = mkdtempSync(join(tmpdir(), "wirepool-soak-"));
  const spawns = (): number => readdirSync(state).length;
  try {
    const pool = await Pool.start({
      command: [args.python, args.failAfter, state, "1", "--", ...args.worker],
      workers: 1,
      codec: "json",
      heartbeatMs: HEARTBEAT_MS,
      maxRestarts: r,
      restartWindowMs: 60_000,
      restartBackoffMs: 10,
      restartBackoffMaxMs: 100,
    });
    const out: Json = { max_restarts: r };
    try {
      const first = await within(pool.call<number>("whoami", null), 10_000, "whoami on the first worker");
      const killedAt = now();
      signal(first, "SIGKILL");
      // Calls wait while the slot is being refilled (one sent before the pool saw the kill fails
      // with it); once the pool gives up, they fail saying so.
      let trip: WirepoolError | null = null;
      const before = new Map<string, number>();
      while (now() - killedAt < TRIP_BOUND_MS) {
        try {
          await within(pool.call("add", { a: 1, b: 2 }), TRIP_BOUND_MS, "a call after the kill");
          increment(before, "ok");
        } catch (e) {
          if (e instanceof TimedOut) increment(before, "no_outcome");
          else if (e instanceof WirepoolError && e.message.includes(GAVE_UP)) {
            trip = e;
            break;
          } else increment(before, outcomeOf(e));
        }
      }
      out.trip_s = round((now() - killedAt) / 1000, 3);
      out.before_trip = sortedObject(before);
      out.error = trip !== null ? outcomeOf(trip) : "none";
      out.message = trip !== null ? trip.message.slice(0, 300) : "";
      trip = null;
      // Anything the pool would still start shows up within a few backoffs.
      await sleep(1000); // the time a late spawn gets to appear, not a sync point
      out.spawns = spawns();
      out.live_after_trip = sortedPids(children().keys());
      const codes = new Map<string, number>();
      let slowest = 0;
      let calls = 0;
      const failOnce = async (): Promise<void> => {
        const t = now();
        try {
          await within(pool.call("add", { a: 1, b: 2 }), 5000, "a call on the pool that gave up");
          increment(codes, "ok");
        } catch (e) {
          increment(codes, e instanceof TimedOut ? "no_outcome" : outcomeOf(e));
        }
        slowest = Math.max(slowest, now() - t);
        calls++;
      };
      for (let k = 0; k < 500; k++) await failOnce(); // warm up before the memory baseline
      const rssBefore = await settledRssMb();
      log(`memory before the failing calls: ${heapMb()}`);
      const started = now();
      while (now() - started < args.failFastSeconds * 1000) {
        for (let k = 0; k < 100; k++) await failOnce();
      }
      const took = (now() - started) / 1000;
      const rssAfter = await settledRssMb();
      log(`memory after ${calls} failing calls: ${heapMb()}`);
      out.fail_fast = {
        calls,
        outcomes: sortedObject(codes),
        max_call_ms: round(slowest, 2),
        calls_per_s: Math.round(calls / (took + 1e-9)),
        rss_before_mb: round(rssBefore, 1),
        rss_after_mb: round(rssAfter, 1),
      };
      out.spawns_after_calls = spawns();
    } finally {
      await closePool(pool, 1000, "the restart-limit pool");
    }
    out.children_after_close = await noChildren();
    return out;
  } finally {
    rmSync(state, { recursive: true, force: true });
  }
}

/** VmHWM from here on. */
function resetPeakRss(): void {
  try {
    writeFileSync("/proc/self/clear_refs", "5");
  } catch {
    // not allowed here: the peak then includes what came before, a bound still holds
  }
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  log(`seed ${args.seed}`);
  if ((globalThis as { gc?: unknown }).gc === undefined) log("run with --expose-gc: without it the memory figures include garbage");
  resetPeakRss(); // start-up's peak is not the soak's
  const started = now();
  const rng = new Rng(BigInt(args.seedText));
  const summary: Json = { parent: "node", worker: args.worker, seed: args.seed, seconds: args.seconds, workers: args.workers };
  const phases = new Phases();
  Object.assign(summary, await soak(args, rng, phases));
  summary.restart_limit = await restartLimit(args);
  phases.mark("restart_limit");
  summary.phases_s = phases.times;
  // VmHWM is updated lazily by the kernel: never report a peak below an RSS we read.
  const mem = summary.memory_mb;
  const ff = summary.restart_limit.fail_fast ?? {};
  mem.peak = round(Math.max(statusMb("VmHWM"), mem.before, mem.after, ff.rss_before_mb ?? 0, ff.rss_after_mb ?? 0), 1);
  summary.elapsed_s = round((now() - started) / 1000, 2);
  // Both pools are closed and their processes reaped; exit even if a timer of an operation that
  // never ended (already counted no_outcome) is still pending.
  process.stdout.write(JSON.stringify(summary) + "\n", () => process.exit(0));
}

main().catch((e) => {
  log(`failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
  process.exit(1);
});
