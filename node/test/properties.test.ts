// Property tests (fast-check) of the frame codec and the connection core.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";

import {
  CodecId,
  Connection,
  type ConnectionEvent,
  encodeFrames,
  EventType,
  FrameType,
  MethodKind,
  ProtocolError,
} from "../src/proto/index.js";
import { cutsArb, frameArb, splitAt } from "./arbitraries.js";
import { decodeAll, toJson, type Json } from "./vectors.js";

const RUNS = Number(process.env.FC_RUNS ?? 300);
const BIG = 16 * 1024 * 1024;

describe("frame codec properties", () => {
  it("decode(encode(frames)) == frames, under any chunking", () => {
    fc.assert(
      fc.property(fc.array(frameArb, { minLength: 1, maxLength: 8 }).chain((fs) => {
        const data = encodeFrames(fs);
        return fc.tuple(fc.constant(fs), fc.constant(data), cutsArb(data.length));
      }), ([frames, data, cuts]) => {
        const want = frames.map((f) => toJson(f as Json));
        const whole = decodeAll([data], BIG);
        assert.equal(whole.error, null, whole.error?.message);
        assert.deepEqual(whole.frames, want);
        const split = decodeAll(splitAt(data, cuts), BIG);
        assert.equal(split.error, null);
        assert.deepEqual(split.frames, want);
        assert.equal(encodeFrames(frames).toString("hex"), data.toString("hex"), "encoding is deterministic");
      }),
      { numRuns: RUNS },
    );
  });

  it("arbitrary bytes: the same frames and error whole or chunked, and only ProtocolErrors", () => {
    const input = fc.oneof(
      fc.uint8Array({ maxLength: 200 }).map((a) => Buffer.from(a)),
      // Mostly valid streams with a few bytes changed: deeper than random bytes get.
      fc.tuple(fc.array(frameArb, { minLength: 1, maxLength: 4 }), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }))
        .map(([fs, edits]) => {
          const b = Buffer.from(encodeFrames(fs));
          for (const [i, v] of edits) b[i % b.length] = v;
          return b;
        }),
    );
    fc.assert(
      fc.property(input.chain((d) => fc.tuple(fc.constant(d), cutsArb(d.length))), ([data, cuts]) => {
        const a = decodeAll([data], 65536);
        const b = decodeAll(splitAt(data, cuts), 65536);
        assert.deepEqual(b.frames, a.frames);
        assert.equal(b.error?.code, a.error?.code);
      }),
      { numRuns: RUNS },
    );
  });
});

/** A parent core and a worker core after a handshake: methods 0 "echo" (unary), 1 "count" (stream). */
function pair(maxFrameSize = 65536, initialCredit = 4096, maxInFlight = 16) {
  const parent = new Connection("parent");
  const worker = new Connection("worker");
  worker.sendHello({
    minVersion: 1, maxVersion: 1, pid: 1, maxConcurrency: 64, maxFrameSize: 16777216, sdkName: "wirepool-node", sdkVersion: "0",
    methods: [
      { name: "echo", kind: MethodKind.UNARY, codecs: [CodecId.RAW] },
      { name: "count", kind: MethodKind.STREAM, codecs: [CodecId.RAW] },
    ],
  });
  move(worker, parent);
  drain(parent);
  parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize, initialCredit, heartbeatMs: 0, maxInFlight, maxMessageSize: 1 << 22 });
  move(parent, worker);
  drain(worker);
  return { parent, worker };
}

function move(from: Connection, to: Connection, cuts: number[] = []): void {
  const data = Buffer.concat(from.takeOutput());
  for (const c of splitAt(data, cuts)) to.receive(c);
}

function drain(c: Connection): ConnectionEvent[] {
  const out: ConnectionEvent[] = [];
  c.nextEvents(out);
  return out;
}

describe("connection core properties", () => {
  it("parent and worker cores agree: every request ends once, bodies and rows arrive whole", () => {
    const call = fc.record({
      stream: fc.boolean(),
      size: fc.oneof(fc.integer({ min: 0, max: 100 }), fc.integer({ min: 60000, max: 200000 })),
      rows: fc.integer({ min: 0, max: 300 }),
      cancel: fc.boolean(),
    });
    fc.assert(
      fc.property(fc.array(call, { minLength: 1, maxLength: 12 }), fc.array(fc.nat(), { maxLength: 6 }), (calls, cutSeeds) => {
        const { parent, worker } = pair(65536, 1024);
        const expected = new Map<number, (typeof calls)[number] & { body: Buffer }>();
        const outcomes = new Map<number, string>();
        const rowsSeen = new Map<number, number>();
        const pendingStreams = new Map<number, { left: number }>();
        let queue = [...calls];
        const cut = (n: number) => cutSeeds.map((s) => 1 + (s % Math.max(1, n)));
        for (let round = 0; round < 10000 && (queue.length > 0 || parent.inFlight() > 0); round++) {
          while (queue.length > 0 && parent.canSendRequest()) {
            const c = queue[0];
            queue = queue.slice(1);
            const body = Buffer.alloc(c.size, c.size & 0xff);
            const id = parent.sendRequest(c.stream ? 1 : 0, CodecId.RAW, 0, body);
            expected.set(id, { ...c, body });
            if (c.cancel && c.stream) parent.sendCancel(id);
          }
          const pOut = parent.outputLength();
          move(parent, worker, cut(pOut));
          for (const ev of drain(worker)) {
            if (ev.type === FrameType.REQUEST) {
              const c = expected.get(ev.id)!;
              assert.equal(ev.body.length, c.body.length, "request body whole");
              if (ev.method === 0) worker.sendResult(ev.id, ev.body);
              else pendingStreams.set(ev.id, { left: c.rows });
            } else if (ev.type === FrameType.CANCEL && pendingStreams.has(ev.id)) {
              pendingStreams.delete(ev.id);
              worker.sendError(ev.id, 205, "cancelled");
            }
          }
          for (const [id, s] of pendingStreams) {
            while (s.left > 0 && worker.canSendRows(id)) {
              const b = worker.rows(id);
              // Small frames, so that the credit window (1 KiB) binds and grants must flow.
              for (let k = 0; k < 8 && s.left > 0 && b.append(Buffer.alloc(s.left % 50, 7)); k++) s.left--;
              b.finish();
            }
            if (s.left === 0) {
              worker.sendEnd(id);
              pendingStreams.delete(id);
            }
          }
          move(worker, parent, cut(worker.outputLength()));
          for (const ev of drain(parent)) {
            switch (ev.type) {
              case FrameType.RESULT:
                assert.ok(!outcomes.has(ev.id), "one outcome");
                assert.ok(ev.body.equals(expected.get(ev.id)!.body), "echo whole");
                outcomes.set(ev.id, "result");
                break;
              case FrameType.ROWS:
                rowsSeen.set(ev.id, (rowsSeen.get(ev.id) ?? 0) + ev.rows.length);
                parent.consumed(ev.id, ev.payloadLength);
                break;
              case FrameType.END:
                assert.ok(!outcomes.has(ev.id), "one outcome");
                assert.equal(ev.rowCount, expected.get(ev.id)!.rows);
                assert.equal(rowsSeen.get(ev.id) ?? 0, ev.rowCount);
                outcomes.set(ev.id, "end");
                break;
              case FrameType.ERROR:
                assert.ok(!outcomes.has(ev.id), "one outcome");
                assert.equal(ev.code, 205);
                outcomes.set(ev.id, "error");
                break;
              case EventType.LATE:
                break;
              default:
                assert.fail(`unexpected event ${ev.type}`);
            }
          }
        }
        assert.equal(outcomes.size, calls.length, "every request ended");
        assert.equal(parent.inFlight(), 0);
        assert.equal(worker.inFlight(), 0);
      }),
      { numRuns: Math.max(20, RUNS / 5) },
    );
  });

  it("arbitrary bytes after the handshake: the same events and error whole or chunked", () => {
    const input = fc.oneof(
      fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a)),
      fc.tuple(fc.array(frameArb, { minLength: 1, maxLength: 6 }), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 3 }))
        .map(([fs, edits]) => {
          const b = Buffer.from(encodeFrames(fs));
          for (const [i, v] of edits) b[i % b.length] = v;
          return b;
        }),
    );
    fc.assert(
      fc.property(fc.constantFrom("parent", "worker") as fc.Arbitrary<"parent" | "worker">, input.chain((d) => fc.tuple(fc.constant(d), cutsArb(d.length))), (role, [data, cuts]) => {
        const run = (chunks: Buffer[]) => {
          const { parent, worker } = pair();
          if (role === "parent") parent.sendRequests(0, 0, [Buffer.from("x"), Buffer.from("y")]);
          const conn = role === "parent" ? parent : worker;
          const events: Json[] = [];
          let error: ProtocolError | null = null;
          try {
            for (const c of chunks) {
              conn.receive(c);
              for (let ev = conn.nextEvent(); ev !== null; ev = conn.nextEvent()) events.push(toJson(ev, false));
            }
            conn.endOfInput();
          } catch (e) {
            if (!(e instanceof ProtocolError)) throw e;
            error = e;
          }
          return { events, code: error?.code };
        };
        assert.deepEqual(run(splitAt(data, cuts)), run([data]));
      }),
      { numRuns: RUNS },
    );
  });

  it("a refused send writes nothing and changes nothing", () => {
    const { parent, worker } = pair(65536, 4096, 2);
    const a = parent.sendRequest(1, 0, 0, Buffer.alloc(1));
    parent.sendRequest(0, 0, 0, Buffer.alloc(1));
    const before = parent.outputLength();
    assert.throws(() => parent.sendRequest(0, 0, 0, Buffer.alloc(1)), { name: "OVERLOADED", code: 207 });
    assert.throws(() => parent.sendRequest(9, 0, 0, Buffer.alloc(1)), { name: "UNKNOWN_METHOD" });
    assert.throws(() => parent.sendCredit(99, 10), { name: "UNKNOWN_ID" });
    assert.throws(() => parent.sendCredit(a, 2 ** 31), { name: "CREDIT_OVERFLOW" });
    assert.throws(() => parent.sendCredit(2, 10), { name: "KIND_MISMATCH" });
    assert.equal(parent.outputLength(), before);
    assert.equal(parent.inFlight(), 2);
    assert.equal(parent.failure(), null, "refusals do not fail the core");
    move(parent, worker);
    drain(worker);
    assert.throws(() => worker.sendResult(a, Buffer.alloc(1)), { name: "KIND_MISMATCH" });
    assert.throws(() => worker.sendEnd(2), { name: "KIND_MISMATCH" });
    assert.throws(() => worker.rows(a).append(Buffer.alloc(70000)), { name: "ROW_TOO_LARGE" });
    const b = worker.rows(a);
    b.append(Buffer.alloc(5000));
    b.finish(); // credit 4096 -> negative
    assert.equal(worker.canSendRows(a), false);
    b.append(Buffer.alloc(1));
    assert.throws(() => b.finish(), { name: "FLOW_CONTROL" });
    assert.equal(b.count, 1, "a refused finish keeps its rows");
    worker.sendGoodbye(0);
    assert.throws(() => worker.sendEvent(0, "t"), { name: "UNEXPECTED_FRAME" });
  });

  it("consumed grants at half the window and never after the stream ends", () => {
    const { parent, worker } = pair(65536, 1000);
    const id = parent.sendRequest(1, 0, 0, Buffer.alloc(0));
    move(parent, worker);
    drain(worker);
    const b = worker.rows(id);
    b.append(Buffer.alloc(992)); // payload 4 + 4 + 992 = 1000: the whole window
    b.finish();
    move(worker, parent);
    const [rows] = drain(parent);
    assert.equal(rows.type, FrameType.ROWS);
    assert.equal(parent.credit(id), 0);
    assert.equal(parent.consumed(id, 400), 0, "below half the window: no grant yet");
    assert.equal(parent.consumed(id, 100), 500, "half the window: grant what was consumed");
    assert.equal(parent.credit(id), 500);
    move(parent, worker);
    const [credit] = drain(worker);
    assert.deepEqual([credit.type, (credit as Json).bytes], [FrameType.CREDIT, 500]);
    assert.equal(worker.credit(id), 500);
    worker.sendEnd(id);
    move(worker, parent);
    drain(parent);
    assert.equal(parent.consumed(id, 500), 0, "the stream has ended");
    assert.equal(parent.outputLength(), 0);
  });

  it("an ERROR too large for a frame keeps its code, drops details, cuts the message at a character", () => {
    const { parent, worker } = pair();
    const id = parent.sendRequest(0, 0, 0, Buffer.alloc(0));
    move(parent, worker);
    drain(worker);
    worker.sendError(id, 1234, "é".repeat(40000), "x".repeat(70000));
    move(worker, parent);
    const [ev] = drain(parent);
    assert.equal(ev.type, FrameType.ERROR);
    const e = ev as Json;
    assert.equal(e.code, 1234);
    assert.ok(e.message.length > 30000 && /^é+$/.test(e.message));
    assert.ok(e.details === "" || JSON.parse(e.details).truncated === true);
  });

  it("an ERROR message above 65,535 bytes is cut to fit its length field; details that fit stay", () => {
    const { parent, worker } = pair(1 << 20);
    const id = parent.sendRequest(0, 0, 0, Buffer.alloc(0));
    move(parent, worker);
    drain(worker);
    worker.sendError(id, 203, "€".repeat(30000), '{"line":3}');
    move(worker, parent);
    const [ev] = drain(parent);
    const e = ev as Json;
    assert.equal(Buffer.byteLength(e.message), 65535 - (65535 % 3), "cut at a character boundary");
    assert.equal(e.details, '{"line":3}');
  });
});
