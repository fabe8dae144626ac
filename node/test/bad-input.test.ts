// The caller-input table (PROTOCOL.md section 22, conformance/bad_input.json) replayed against
// the Node parent with the Node conformance worker (wirepool-conformance, built by
// `npm run build:conformance`). The table is read at test time; a row is skipped only for a
// reason it gives (`inexpressible.node`, or `only` without "node"). Every test is bounded by
// its timeout and closes its pools; nothing waits on a sleep.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import fc from "fast-check";
import {
  ErrorCode,
  InvalidArgumentError,
  type Lease,
  Pool,
  type PoolOptions,
  WirepoolError,
} from "../src/index.js";
import { poolSettings } from "../src/parent/options.js";
import { WorkerProcess } from "../src/parent/worker.js";

const ROOT = new URL("../../", import.meta.url); // node/ (from build/test/)
const TABLE = JSON.parse(readFileSync(new URL("../conformance/bad_input.json", ROOT), "utf8")) as { rows: Row[] };
const WORKER = new URL("wirepool-conformance/build/worker.js", ROOT).pathname;
const COMMAND = [process.execPath, WORKER];
/** A program that cannot be spawned: a construction row that spawned would fail SPAWN_FAILED instead. */
const UNSPAWNABLE = ["/nonexistent/wirepool-bad-input-must-not-spawn"];
const T = { timeout: 30_000 };
/** Any refusal's message stays short (22.4 cuts quoted strings to 200 characters). */
const MESSAGE_MAX = 1000;

interface Row {
  readonly id: string;
  readonly kind: "pool_option" | "call_option" | "method" | "request" | "lifecycle";
  readonly at: "construction" | "call" | "ok";
  readonly code: number | null;
  readonly option?: string;
  readonly value?: unknown;
  readonly method?: unknown;
  readonly request?: unknown;
  readonly codec?: string;
  readonly stream?: boolean;
  readonly result?: unknown;
  readonly pool?: Record<string, unknown>;
  readonly action?: string;
  readonly message_max_chars?: number;
  readonly inexpressible?: Record<string, string>;
  readonly only?: readonly string[];
}

const camel = (s: string) => s.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());

class Opaque {
  method(): number {
    return 1;
  }
}

/** The value a `{"$": ...}` placeholder stands for (the table's "about"). */
function materialize(v: unknown): unknown {
  if (v === null || typeof v !== "object" || Array.isArray(v) || !("$" in v)) return v;
  const s = v as { $: string; s?: string; n?: number };
  switch (s.$) {
    case "nan":
      return NaN;
    case "inf":
      return Infinity;
    case "-inf":
      return -Infinity;
    case "cyclic": {
      const o: Record<string, unknown> = { a: 1 };
      o.self = o;
      return o;
    }
    case "function":
      return () => 1;
    case "symbol":
      return Symbol("s");
    case "undefined":
      return undefined;
    case "undefined_in_object":
      return { a: undefined };
    case "undefined_in_array":
      return [1, undefined];
    case "bigint":
      return 2n ** 64n;
    case "opaque_object":
      return new Opaque();
    case "non_string_key":
      return new Map([[[1, 2], 3]]);
    case "bytes":
      return Buffer.from([1, 2, 3]);
    case "repeat":
      return s.s!.repeat(s.n!);
    case "string_of_bytes":
      return "x".repeat(s.n!);
    default:
      throw new Error(`bad_input.json: unknown special value ${s.$}`);
  }
}

/** The reason the row gives for Node to skip it, or null. */
function skipReason(row: Row): string | null {
  if (row.only !== undefined && !row.only.includes("node")) return `only ${row.only.join(", ")}`;
  const why = row.inexpressible?.node;
  return why === undefined ? null : `inexpressible in Node: ${why}`;
}

/** The pool options of a pool_option row (camelCase; `{"$": "options"}` sets several). */
function rowOptions(row: Row): Record<string, unknown> {
  const v = row.value;
  if (v !== null && typeof v === "object" && !Array.isArray(v) && (v as { $?: string }).$ === "options") {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) if (k !== "$") out[camel(k)] = materialize(x);
    return out;
  }
  // A retry policy's field (as the Rust runner: a policy for one idempotent method).
  if (row.option === "retry_attempts") return { retry: { methods: ["echo"], attempts: materialize(v) } };
  return { [camel(row.option!)]: materialize(v) };
}

/** The error `p` rejects with (a failure if it resolves, or rejects with a non-WirepoolError). */
async function rejection(p: Promise<unknown>, what: string): Promise<WirepoolError> {
  let value: unknown;
  try {
    value = await p;
  } catch (e) {
    assert.ok(e instanceof WirepoolError, `${what}: expected a WirepoolError, got ${(e as Error)?.constructor?.name}: ${String((e as Error)?.message ?? e).slice(0, 300)}`);
    return e;
  }
  assert.fail(`${what}: expected a failure, got ${String(value).slice(0, 100)}`);
}

function checkError(row: Row, e: WirepoolError): void {
  assert.equal(e.code, row.code, `${row.id}: code ${e.code} ${e.codeName}: ${e.message.slice(0, 300)}`);
  if (row.code === ErrorCode.INVALID_ARGUMENT) assert.ok(e instanceof InvalidArgumentError, `${row.id}: ${e.constructor.name} is not an InvalidArgumentError`);
  const max = row.message_max_chars ?? MESSAGE_MAX;
  assert.ok(e.message.length <= max, `${row.id}: the message has ${e.message.length} characters (at most ${max})`);
}

async function checkAdd(pool: Pool | Lease, what: string): Promise<void> {
  assert.deepEqual(await pool.call("add", { a: 1, b: 2 }), { sum: 3 }, what);
}

/** Drains a stream; the rows read. */
async function drain(s: AsyncIterable<unknown>): Promise<unknown[]> {
  const out: unknown[] = [];
  for await (const r of s) out.push(r);
  return out;
}

/** Requests the pool's workers have been sent, all told. */
function sent(pool: Pool): number {
  return pool.metrics().workers.reduce((n, w) => n + w.requests, 0);
}

async function withPool<R>(opts: Partial<PoolOptions>, body: (pool: Pool) => Promise<R>): Promise<R> {
  const pool = await Pool.start({ command: COMMAND, workers: 1, ...opts });
  try {
    return await body(pool);
  } finally {
    await pool.close({ graceMs: 0 });
  }
}

// ---------------------------------------------------------------------------------------------
// Pool options

async function poolOptionRow(row: Row): Promise<void> {
  const opts = rowOptions(row);
  if (row.at === "ok") {
    await withPool(opts, (pool) => checkAdd(pool, row.id));
    return;
  }
  // Built with a program that cannot be spawned: 308 proves the refusal came before any spawn.
  const command = "command" in opts ? opts.command : row.code === ErrorCode.INVALID_ARGUMENT ? UNSPAWNABLE : COMMAND;
  const full = { command, workers: 1, ...opts } as unknown as PoolOptions;
  let started: Promise<Pool>;
  try {
    started = Pool.start(full);
  } catch (e) {
    assert.fail(`${row.id}: Pool.start threw synchronously (${e}) instead of rejecting`);
  }
  const e = await rejection(started, row.id);
  checkError(row, e);
}

// ---------------------------------------------------------------------------------------------
// Call-time rows, all on one pool (row pool.survives checks it afterwards)

let shared: Pool;

/** Runs a call-time row's request on `pool`: the call's promise (a stream is read to its end). */
function runCall(pool: Pool, row: Row): Promise<unknown> {
  const method = materialize(row.method) as string;
  const request = materialize(row.request);
  const opts: Record<string, unknown> = {};
  if (row.kind === "call_option") opts[camel(row.option!)] = materialize(row.value);
  if (row.codec !== undefined) opts.codec = row.codec;
  if (row.stream === true) {
    let s: AsyncIterable<unknown>;
    try {
      s = pool.stream(method, request, opts);
    } catch (e) {
      return Promise.reject(new Error(`pool.stream threw synchronously: ${(e as Error)?.message ?? e}`));
    }
    return drain(s);
  }
  try {
    return pool.call(method, request, opts);
  } catch (e) {
    return Promise.reject(new Error(`pool.call threw synchronously: ${(e as Error)?.message ?? e}`));
  }
}

/** Codes that are raised locally, before anything is sent. */
const LOCAL_CODES = new Set<number>([ErrorCode.INVALID_ARGUMENT, ErrorCode.BAD_REQUEST, ErrorCode.UNKNOWN_METHOD, ErrorCode.MESSAGE_TOO_LARGE]);

async function callRow(pool: Pool, row: Row): Promise<void> {
  const before = sent(pool);
  if (row.at === "ok") {
    assert.deepEqual(await runCall(pool, row), row.result, row.id);
    return;
  }
  const e = await rejection(runCall(pool, row), row.id);
  checkError(row, e);
  if (LOCAL_CODES.has(row.code!)) assert.equal(sent(pool), before, `${row.id}: a request was sent`);
}

async function requestRow(row: Row): Promise<void> {
  if (row.pool === undefined) return callRow(shared, row);
  const opts: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(row.pool)) opts[camel(k)] = v;
  await withPool(opts, async (pool) => {
    await callRow(pool, row);
    assert.deepEqual(await pool.call("echo", Buffer.from("after"), { codec: "raw" }), Buffer.from("after"), `${row.id}: the next call`);
  });
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

const LIFECYCLE: Record<string, (row: Row) => Promise<void>> = {
  async call_after_close(row) {
    const pool = await Pool.start({ command: COMMAND, workers: 1 });
    await pool.close();
    checkError(row, await rejection(pool.call("add", { a: 1, b: 2 }), row.id));
  },
  async stream_after_close(row) {
    const pool = await Pool.start({ command: COMMAND, workers: 1 });
    await pool.close();
    checkError(row, await rejection(drain(pool.stream("decls", { n: 1 })), row.id));
  },
  async lease_after_close(row) {
    const pool = await Pool.start({ command: COMMAND, workers: 1 });
    await pool.close();
    checkError(row, await rejection(pool.lease(), row.id));
  },
  async close_twice() {
    const pool = await Pool.start({ command: COMMAND, workers: 1 });
    await pool.close();
    await pool.close();
  },
  async close_concurrently() {
    const pool = await Pool.start({ command: COMMAND, workers: 1 });
    await Promise.all([pool.close(), pool.close({ graceMs: 0 })]);
  },
  async lease_call_after_release(row) {
    await withPool({}, async (pool) => {
      const lease = await pool.lease();
      await checkAdd(lease, row.id);
      lease.release();
      checkError(row, await rejection(lease.call("add", { a: 1, b: 2 }), row.id));
      await checkAdd(pool, `${row.id}: the pool after`);
    });
  },
  async stream_read_after_end(row) {
    await withPool({}, async (pool) => {
      const s = pool.stream("decls", { n: 2 });
      assert.equal((await drain(s)).length, 2);
      assert.deepEqual(await s.next(), { value: undefined, done: true }, row.id);
      assert.deepEqual(await s.next(), { value: undefined, done: true }, row.id);
      s.cancel(); // cancelling an ended stream: no effect
      await checkAdd(pool, row.id);
    });
  },
  async cancel_after_end(row) {
    await withPool({}, async (pool) => {
      const ac = new AbortController();
      assert.deepEqual(await pool.call("add", { a: 1, b: 2 }, { signal: ac.signal }), { sum: 3 });
      ac.abort(); // the call has ended: no effect
      await checkAdd(pool, row.id);
      assert.equal(pool.metrics().failures, 0, `${row.id}: a failure was counted`);
    });
  },
  async every_refusal_then_call(row) {
    // Every call-time row above ran on `shared` (node:test runs a file's tests in order).
    await checkAdd(shared, row.id);
    assert.equal(poolRestarts(shared), 0, `${row.id}: a worker was replaced`);
  },
};

function poolRestarts(pool: Pool): number {
  return pool.metrics().restarts;
}

// ---------------------------------------------------------------------------------------------

describe("bad_input.json", () => {
  before(async () => {
    shared = await Pool.start({ command: COMMAND, workers: 1 });
  });
  after(async () => {
    await shared?.close({ graceMs: 0 });
  });

  test("the table has rows of every kind, and every row a runner", () => {
    const kinds = new Set(TABLE.rows.map((r) => r.kind));
    assert.deepEqual([...kinds].sort(), ["call_option", "lifecycle", "method", "pool_option", "request"]);
    for (const r of TABLE.rows) if (r.kind === "lifecycle") assert.ok(r.action! in LIFECYCLE, `no runner for action ${r.action}`);
  });

  for (const row of TABLE.rows) {
    const skip = skipReason(row);
    test(row.id, { ...T, skip: skip ?? false }, async () => {
      switch (row.kind) {
        case "pool_option":
          return poolOptionRow(row);
        case "call_option":
        case "method":
          return callRow(shared, row);
        case "request":
          return requestRow(row);
        case "lifecycle":
          return LIFECYCLE[row.action!](row);
      }
    });
  }
});

// ---------------------------------------------------------------------------------------------
// Beyond the table: the WELCOME path, and the numeric option space

describe("caller input beyond the table", () => {
  test("a WELCOME the settings cannot carry fails the start, typed, instead of throwing from a handler", T, async () => {
    // Validation refuses these up front; here they reach the handshake anyway (22.1's backstop).
    // A WorkerProcess keeps no hold on the event loop (its pool does, while it has work): the
    // test holds it while it waits for the start and the reap.
    const hold = setInterval(() => {}, 60_000);
    try {
      for (const bad of [{ heartbeatMs: -5 }, { initialCredit: -1 }]) {
        const settings = { ...poolSettings({ command: COMMAND, workers: 1 }), ...bad };
        const w = new WorkerProcess(1, settings, { freed() {}, exited() {}, wantsLines: () => false });
        const e = await rejection(w.start(), JSON.stringify(bad));
        assert.equal(e.code, ErrorCode.INVALID_ARGUMENT, e.message);
        w.kill();
        await w.gone;
      }
    } finally {
      clearInterval(hold);
    }
  });

  // PROTOCOL.md 22.2 as an oracle of its own: [integer?, min, max, none allowed, 0 also allowed].
  const MAX_MS = 2_147_483_647;
  const RANGES: Record<string, readonly [boolean, number, number, boolean?, boolean?]> = {
    workers: [true, 1, 4096],
    maxInFlight: [true, 1, 2 ** 32 - 1],
    startupTimeoutMs: [false, 1, MAX_MS],
    restartWindowMs: [false, 1, MAX_MS],
    heartbeatMs: [false, 1, MAX_MS, false, true],
    cancelGraceMs: [false, 0, MAX_MS],
    deadlineGraceMs: [false, 0, MAX_MS],
    drainGraceMs: [false, 0, MAX_MS],
    goodbyeGraceMs: [false, 0, MAX_MS],
    restartBackoffMs: [false, 0, 5000], // <= restartBackoffMaxMs (default 5000)
    restartBackoffMaxMs: [false, 10, MAX_MS], // >= restartBackoffMs (default 10)
    maxRestarts: [true, 0, 2 ** 32 - 1],
    stderrTailLines: [true, 0, 2 ** 32 - 1],
    maxFrameSize: [true, 65_536, 16_777_216],
    initialCredit: [true, 1, 2 ** 31 - 1],
    maxMessageSize: [true, 4_194_304, 2 ** 53 - 1], // >= maxFrameSize (default 4 MiB)
    maxRequests: [true, 1, 2 ** 53 - 1, true],
    maxRssBytes: [true, 1, 2 ** 53 - 1, true],
    maxIdleMs: [false, 1, MAX_MS, true],
  };
  const NAMES = Object.keys(RANGES);

  function valid(name: string, v: unknown): boolean {
    const [integer, min, max, none, zero] = RANGES[name];
    if (v === undefined || (none === true && v === null)) return true;
    if (typeof v !== "number") return false;
    if (zero === true && v === 0) return true;
    return (!integer || Number.isInteger(v)) && v >= min && v <= max;
  }

  const edge = (name: string) => {
    const [, min, max] = RANGES[name];
    return fc.constantFrom(min, max, min - 1, max + 1, min + 0.5, 0, -0, -1, NaN, Infinity, -Infinity, 1e300, 2 ** 31, 2 ** 32, 2 ** 53);
  };
  const anyValue = (name: string) =>
    fc.oneof(edge(name), fc.integer({ min: -10, max: 2 ** 31 }), fc.double(), fc.constantFrom<unknown>(null, undefined, "100", true, [], {}, 10n));
  const optionAndValue = fc.constantFrom(...NAMES).chain((name) => fc.tuple(fc.constant(name), anyValue(name)));

  test("every value of a numeric option is accepted by its range or refused with INVALID_ARGUMENT (the pool's own validation)", T, () => {
    fc.assert(
      fc.property(optionAndValue, ([name, v]) => {
        let accepted = true;
        try {
          poolSettings({ command: COMMAND, [name]: v } as unknown as PoolOptions);
        } catch (e) {
          assert.ok(e instanceof InvalidArgumentError, `${name}=${String(v)}: ${e}`);
          assert.ok((e as Error).message.includes(name), (e as Error).message);
          accepted = false;
        }
        assert.equal(accepted, valid(name, v), `${name}=${String(v)}`);
      }),
      { numRuns: 2000 },
    );
  });

  // Options a real pool can start with quickly whatever their valid value (no 1 ms start-up timeout).
  const LIVE = ["workers", "maxInFlight", "heartbeatMs", "maxFrameSize", "initialCredit", "maxMessageSize", "maxRestarts", "stderrTailLines", "deadlineGraceMs", "maxRequests"];
  const liveValue = (name: string) => {
    const [integer, min, max] = RANGES[name];
    const top = name === "workers" ? 2 : max;
    const inRange = integer ? fc.integer({ min, max: Math.min(top, 2 ** 31) }) : fc.double({ min: Math.max(min, 50), max: top, noNaN: true });
    return fc.oneof(inRange, edge(name));
  };

  test("a real pool: any value either starts a working pool or is refused with INVALID_ARGUMENT at once", { timeout: 60_000 }, async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...LIVE).chain((name) => fc.tuple(fc.constant(name), liveValue(name))), async ([name, v]) => {
        if (name === "workers" && typeof v === "number" && v > 2 && valid(name, v)) return; // keep the pool small
        const opts = { command: COMMAND, workers: 1, [name]: v } as unknown as PoolOptions;
        if (!valid(name, v)) {
          checkError({ id: `${name}=${String(v)}`, code: 308 } as Row, await rejection(Pool.start({ ...opts, command: UNSPAWNABLE }), name));
          return;
        }
        await withPool(opts, (pool) => checkAdd(pool, `${name}=${String(v)}`));
      }),
      { numRuns: 8 },
    );
  });
});
