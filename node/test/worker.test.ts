// The worker driver against a parent made of the core itself, over an in-memory duplex: every
// outcome of PROTOCOL.md 12.3 the driver decides (results, errors, deadline, cancel, credit, the
// flush rule, PING, DRAIN, EOF, fatal input). Waits are on events, each bounded.

import assert from "node:assert/strict";
import { Duplex } from "node:stream";
import { describe, test } from "node:test";
import { Connection, type ConnectionEvent, CodecId, ErrorCode, FrameType, type WelcomeInit } from "../src/proto/index.js";
import { type Context, Worker, WorkerError } from "../src/worker/index.js";

const WAIT_MS = 5000;

/** Two connected in-memory duplexes; ending one ends the other's readable side. */
function duplexPair(): [Duplex, Duplex] {
  const sides: Duplex[] = [];
  const make = (other: () => Duplex) =>
    new Duplex({
      read() {},
      write(chunk, _enc, cb) {
        other().push(chunk);
        cb();
      },
      final(cb) {
        other().push(null);
        cb();
      },
    });
  sides.push(make(() => sides[1]), make(() => sides[0]));
  return [sides[0], sides[1]];
}

const WELCOME: WelcomeInit = {
  version: 1,
  workerId: 7,
  maxFrameSize: 65536,
  initialCredit: 1 << 20,
  heartbeatMs: 0,
  maxInFlight: 8,
  maxMessageSize: 1 << 20,
};

/** A parent made of the core: answers HELLO, records every event, lets a test wait for one. */
class Parent {
  readonly conn = new Connection("parent");
  readonly events: ConnectionEvent[] = [];
  private waiters: (() => void)[] = [];
  ended = false;

  constructor(
    readonly sock: Duplex,
    welcome: Partial<WelcomeInit> = {},
  ) {
    sock.on("data", (chunk: Buffer) => {
      this.conn.receive(chunk);
      for (let ev = this.conn.nextEvent(); ev !== null; ev = this.conn.nextEvent()) {
        if (ev.type === FrameType.HELLO) this.conn.sendWelcome({ ...WELCOME, ...welcome });
        this.events.push(ev);
      }
      this.flush();
      this.notify();
    });
    sock.on("end", () => {
      this.ended = true;
      this.notify();
    });
  }

  private notify(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  flush(): void {
    if (this.conn.outputLength() > 0) this.sock.write(Buffer.concat(this.conn.takeOutput()));
  }

  /** Resolves once `pred` holds (checked after every read), or fails after WAIT_MS. */
  async until<T>(what: string, pred: () => T | undefined | false): Promise<T> {
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      const v = pred();
      if (v !== undefined && v !== false) return v;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out waiting for ${what}; events: ${JSON.stringify(this.events.map((e) => [e.type, e.id]))}`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  /** The terminal of request `id` (RESULT, END or ERROR). */
  terminal(id: number): Promise<ConnectionEvent> {
    return this.until(`the terminal of ${id}`, () =>
      this.events.find((e) => e.id === id && (e.type === FrameType.RESULT || e.type === FrameType.END || e.type === FrameType.ERROR)),
    );
  }

  request(name: string, codec: number, body: Uint8Array | string, timeoutUs = 0): number {
    const methods = this.conn.hello()!.methods;
    const index = methods.findIndex((m) => m.name === name);
    assert.ok(index >= 0, `no method ${name}`);
    const id = this.conn.sendRequest(index, codec, timeoutUs, typeof body === "string" ? Buffer.from(body) : body);
    this.flush();
    return id;
  }

  rows(id: number): unknown[] {
    const out: unknown[] = [];
    for (const e of this.events) if (e.type === FrameType.ROWS && e.id === id) for (const r of e.rows) out.push(JSON.parse(r.toString()));
    return out;
  }
}

/** A worker serving `w` on one side of a duplex pair, and a parent on the other, handshake done. */
async function start(w: Worker, welcome: Partial<WelcomeInit> = {}): Promise<{ parent: Parent; served: Promise<number> }> {
  const [a, b] = duplexPair();
  const parent = new Parent(b, welcome);
  const served = w.serve({ socket: a });
  await parent.until("HELLO", () => parent.conn.isOpen());
  return { parent, served };
}

function json(v: unknown): Buffer {
  return Buffer.from(JSON.stringify(v));
}

function errorOf(ev: ConnectionEvent): { code: number; message: string; details: string } {
  assert.equal(ev.type, FrameType.ERROR, `expected ERROR, got ${JSON.stringify(ev)}`);
  return ev as { code: number; message: string; details: string } & ConnectionEvent;
}

async function close(parent: Parent, served: Promise<number>): Promise<number> {
  parent.sock.end();
  return served;
}

describe("worker driver", { timeout: 30_000 }, () => {
  test("HELLO offers the methods with their kinds and codecs; unary results in every codec", async () => {
    const w = new Worker({ maxConcurrency: 8 });
    w.method("add", (r: { a: number; b: number }) => ({ sum: r.a + r.b }), { codecs: ["json", "msgpack"] });
    w.method("echo", (b: Buffer) => b, { codecs: ["raw"] });
    w.stream("rows", function* () {
      yield 1;
    });
    const { parent, served } = await start(w);
    const hello = parent.conn.hello()!;
    assert.deepEqual(
      hello.methods.map((m) => [m.name, m.kind, [...m.codecs]]),
      [
        ["add", 1, [CodecId.JSON, CodecId.MSGPACK]],
        ["echo", 1, [CodecId.RAW]],
        ["rows", 2, [CodecId.JSON, CodecId.MSGPACK, CodecId.CBOR]],
      ],
    );
    assert.equal(hello.maxConcurrency, 8);
    assert.equal(hello.sdkName, "wirepool-node");
    const a = parent.request("add", CodecId.JSON, json({ a: 2, b: 40 }));
    const big = Buffer.alloc(200_000, 7); // larger than a frame: continued both ways
    const e = parent.request("echo", CodecId.RAW, big);
    const ra = await parent.terminal(a);
    assert.equal(ra.type, FrameType.RESULT);
    assert.deepEqual(JSON.parse((ra as { body: Buffer } & ConnectionEvent).body.toString()), { sum: 42 });
    const re = await parent.terminal(e);
    assert.ok(re.type === FrameType.RESULT && re.body.equals(big));
    assert.equal(await close(parent, served), 0, "EOF from the parent: status 0");
  });

  test("a throw ends HANDLER_ERROR; WorkerError keeps its code and details; a reserved code does not pass", async () => {
    const w = new Worker();
    w.method("fail", () => {
      throw new Error("boom");
    });
    w.method("app", async (r: unknown) => {
      throw new WorkerError(1042, "application failure", { request: r });
    });
    w.method("forge", () => {
      throw new WorkerError(205, "pretending to be cancelled");
    });
    w.method("bad", () => 1);
    const { parent, served } = await start(w);
    const f = errorOf(await parent.terminal(parent.request("fail", CodecId.JSON, "null")));
    assert.equal(f.code, ErrorCode.HANDLER_ERROR);
    assert.match(f.message, /boom/);
    const a = errorOf(await parent.terminal(parent.request("app", CodecId.JSON, json({ x: 1 }))));
    assert.equal(a.code, 1042);
    assert.deepEqual(JSON.parse(a.details), { request: { x: 1 } });
    assert.equal(errorOf(await parent.terminal(parent.request("forge", CodecId.JSON, "1"))).code, ErrorCode.HANDLER_ERROR);
    assert.equal(errorOf(await parent.terminal(parent.request("bad", CodecId.JSON, "{not json"))).code, ErrorCode.BAD_REQUEST);
    assert.equal(await close(parent, served), 0);
  });

  test("the deadline answers DEADLINE_EXCEEDED at its timer, even for a handler that ignores it", async () => {
    const w = new Worker();
    const gates: (() => void)[] = [];
    let sawAbort = false;
    w.method("deaf", async (_r: unknown, ctx: Context) => {
      ctx.signal.addEventListener("abort", () => (sawAbort = true));
      await new Promise<void>((resolve) => gates.push(resolve));
      return "late";
    });
    const { parent, served } = await start(w);
    const t0 = Date.now();
    const id = parent.request("deaf", CodecId.JSON, "null", 50_000);
    const err = errorOf(await parent.terminal(id));
    assert.equal(err.code, ErrorCode.DEADLINE_EXCEEDED);
    assert.ok(Date.now() - t0 >= 45, "not before the budget");
    assert.ok(sawAbort, "the signal fired");
    gates[0](); // its late result is dropped: exactly one terminal
    const again = parent.request("deaf", CodecId.JSON, "null", 1);
    assert.equal(errorOf(await parent.terminal(again)).code, ErrorCode.DEADLINE_EXCEEDED);
    assert.equal(parent.events.filter((e) => e.id === id && e.type !== FrameType.ERROR).length, 0);
    assert.equal(parent.events.filter((e) => e.id === id).length, 1);
    assert.equal(await close(parent, served), 0);
  });

  test("a handler that holds the event loop past its deadline still ends DEADLINE_EXCEEDED, not with its result", async () => {
    const w = new Worker();
    const spin = (ms: number) => {
      const end = performance.now() + ms;
      while (performance.now() < end) {
        // the timer cannot fire while this runs
      }
    };
    w.method("sync", () => {
      spin(30);
      return "too late";
    });
    w.method("throws", () => {
      spin(30);
      throw new Error("too late as well");
    });
    w.stream("rows", function* () {
      yield 1;
      spin(30);
    });
    const { parent, served } = await start(w);
    for (const m of ["sync", "throws", "rows"]) {
      const err = errorOf(await parent.terminal(parent.request(m, CodecId.JSON, "null", 5_000)));
      assert.equal(err.code, ErrorCode.DEADLINE_EXCEEDED, m);
    }
    assert.equal(await close(parent, served), 0);
  });

  test("CANCEL aborts the signal and the request ends CANCELLED", async () => {
    const w = new Worker();
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    w.method("wait", async (_r: unknown, ctx: Context) => {
      started();
      await new Promise((_, reject) => ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason)));
    });
    const { parent, served } = await start(w);
    const id = parent.request("wait", CodecId.JSON, "null");
    await running;
    parent.conn.sendCancel(id);
    parent.flush();
    assert.equal(errorOf(await parent.terminal(id)).code, ErrorCode.CANCELLED);
    assert.equal(await close(parent, served), 0);
  });

  test("a stream honours credit: the generator waits at its yield until the parent grants more", async () => {
    const w = new Worker();
    let produced = 0;
    const N = 20_000;
    w.stream("count", function* () {
      for (let i = 0; i < N; i++) {
        produced++;
        yield i;
      }
      return { rows: N };
    });
    const window = 8192;
    const { parent, served } = await start(w, { initialCredit: window });
    const id = parent.request("count", CodecId.JSON, "null");
    await parent.until("the window used up", () => parent.conn.credit(id) <= 0);
    for (let i = 0; i < 50; i++) await new Promise((r) => setImmediate(r)); // let a runaway producer show itself
    // The window, one 4 KiB frame past it, one being filled (rows of at least 5 bytes).
    assert.ok(produced < (window + 3 * 4096) / 5, `the producer ran ahead: ${produced} rows`);
    assert.ok(produced < N);
    // Read everything, granting as the consumer goes.
    let seen = 0;
    const end = await parent.until("END", () => {
      for (; seen < parent.events.length; seen++) {
        const e = parent.events[seen];
        if (e.type === FrameType.ROWS) {
          parent.conn.consumed(id, e.payloadLength);
          parent.flush();
        }
      }
      return parent.events.find((e) => e.id === id && e.type !== FrameType.ROWS);
    });
    assert.equal(end.type, FrameType.END);
    const rows = parent.rows(id);
    assert.equal(rows.length, N);
    assert.ok(rows.every((r, i) => r === i));
    assert.ok(end.type === FrameType.END && end.rowCount === N);
    assert.deepEqual(JSON.parse((end as { summary: Buffer } & ConnectionEvent).summary.toString()), { rows: N });
    assert.equal(await close(parent, served), 0);
  });

  test("the flush rule: a row followed by a long wait still arrives; CANCEL wakes the handler", async () => {
    const w = new Worker();
    w.stream("one", async function* (_r: unknown, ctx: Context) {
      yield "first";
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
    });
    const { parent, served } = await start(w);
    const id = parent.request("one", CodecId.JSON, "null");
    await parent.until("the row", () => parent.rows(id).length === 1);
    parent.conn.sendCancel(id);
    parent.flush();
    assert.equal(errorOf(await parent.terminal(id)).code, ErrorCode.CANCELLED);
    assert.equal(await close(parent, served), 0);
  });

  test("PING is answered while handlers are busy; progress events are coalesced and precede the terminal", async () => {
    const w = new Worker();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    w.method("busy", async (_r: unknown, ctx: Context) => {
      for (let i = 0; i < 1000; i++) ctx.progress("step", { i });
      await gate;
      return "done";
    });
    const { parent, served } = await start(w);
    const id = parent.request("busy", CodecId.JSON, "null");
    parent.conn.sendPing(Buffer.from("12345678"));
    parent.flush();
    await parent.until("PONG", () => parent.events.find((e) => e.type === FrameType.PONG));
    release();
    const result = await parent.terminal(id);
    assert.equal(result.type, FrameType.RESULT);
    const events = parent.events.filter((e) => e.type === FrameType.EVENT && e.id === id);
    assert.ok(events.length >= 1 && events.length <= 3, `${events.length} events for 1000 reports`);
    const last = events[events.length - 1];
    assert.ok(last.type === FrameType.EVENT && JSON.parse(last.data).i === 999, "the latest data wins");
    assert.ok(parent.events.indexOf(last) < parent.events.indexOf(result));
    assert.equal(await close(parent, served), 0);
  });

  test("a result above max_message_size ends HANDLER_ERROR and the connection lives on", async () => {
    const w = new Worker();
    w.method("huge", () => Buffer.alloc(70_000), { codecs: ["raw"] });
    w.method("ok", () => 1);
    const { parent, served } = await start(w, { maxMessageSize: 65536 });
    const err = errorOf(await parent.terminal(parent.request("huge", CodecId.RAW, "")));
    assert.equal(err.code, ErrorCode.HANDLER_ERROR);
    assert.match(err.message, /max_message_size/);
    assert.equal((await parent.terminal(parent.request("ok", CodecId.JSON, "null"))).type, FrameType.RESULT);
    assert.equal(await close(parent, served), 0);
  });

  test("DRAIN: new requests are refused, the rest cancelled past the grace, then GOODBYE and status 0", async () => {
    const w = new Worker();
    w.method("forever", () => new Promise(() => {}));
    const { parent, served } = await start(w);
    const id = parent.request("forever", CodecId.JSON, "null");
    parent.conn.sendDrain(30);
    parent.flush();
    assert.equal(errorOf(await parent.terminal(id)).code, ErrorCode.CANCELLED);
    await parent.until("GOODBYE", () => parent.events.find((e) => e.type === FrameType.GOODBYE));
    assert.equal(await served, 0);
    await parent.until("EOF", () => parent.ended);
  });

  test("garbage from the parent: ERROR id 0 with the protocol code, status 1", async () => {
    const w = new Worker();
    w.method("x", () => 1);
    const { parent, served } = await start(w);
    const bad = Buffer.alloc(16);
    bad.writeUInt32LE(0, 0);
    bad[4] = 0x77; // unknown frame type
    parent.sock.write(bad);
    const fatal = await parent.until("ERROR 0", () => parent.events.find((e) => e.type === FrameType.ERROR && e.id === 0));
    assert.equal(errorOf(fatal).code, ErrorCode.UNKNOWN_FRAME_TYPE);
    assert.equal(await served, 1);
  });
});
