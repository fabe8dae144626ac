// The connection core's API (PROTOCOL.md section 14) beyond the vectors: every refusal of 14.3
// with its code, zero-copy receiving, views that stay valid, messages written frame by frame.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";

import { CodecId, Connection, type ConnectionEvent, encodeFrames, EventType, FrameDecoder, FrameType, MethodKind } from "../src/proto/index.js";
import { frameArb } from "./arbitraries.js";
import { toJson } from "./vectors.js";

function pair(opts: { maxFrameSize?: number; initialCredit?: number; maxInFlight?: number; maxMessageSize?: number } = {}) {
  const parent = new Connection("parent");
  const worker = new Connection("worker");
  worker.sendHello({
    minVersion: 1, maxVersion: 1, pid: 7, maxConcurrency: 8, maxFrameSize: 16777216, sdkName: "test", sdkVersion: "1",
    methods: [
      { name: "echo", kind: MethodKind.UNARY, codecs: [CodecId.RAW, CodecId.JSON] },
      { name: "count", kind: MethodKind.STREAM, codecs: [CodecId.RAW] },
    ],
  });
  pass(worker, parent);
  parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize: opts.maxFrameSize ?? 65536, initialCredit: opts.initialCredit ?? 4096, heartbeatMs: 0, maxInFlight: opts.maxInFlight ?? 8, maxMessageSize: opts.maxMessageSize ?? 1 << 20 });
  pass(parent, worker);
  return { parent, worker };
}

function pass(from: Connection, to: Connection): ConnectionEvent[] {
  for (const b of from.takeOutput()) to.receive(b);
  const out: ConnectionEvent[] = [];
  to.nextEvents(out);
  return out;
}

describe("refusals (section 14.3): a ProtocolError with the table's code, nothing written, nothing changed", () => {
  it("before the handshake and after GOODBYE or a fatal report: UNEXPECTED_FRAME", () => {
    const p = new Connection("parent");
    assert.throws(() => p.sendRequest(0, 0, 0, Buffer.alloc(0)), { name: "UNEXPECTED_FRAME", code: 109 });
    assert.throws(() => p.sendPing(Buffer.alloc(8)), { name: "UNEXPECTED_FRAME" });
    assert.throws(() => p.sendWelcome({ version: 1, workerId: 1, maxFrameSize: 65536, initialCredit: 1, heartbeatMs: 0, maxInFlight: 1, maxMessageSize: 65536 }), { name: "UNEXPECTED_FRAME" }, "no HELLO yet");
    const w = new Connection("worker");
    assert.throws(() => w.sendResult(1, Buffer.alloc(0)), { name: "UNEXPECTED_FRAME" });
    assert.throws(() => w.rows(1), { name: "UNEXPECTED_FRAME" });
    assert.equal(p.outputLength() + w.outputLength(), 0);
    const { parent, worker } = pair();
    assert.throws(() => parent.sendResult(1, Buffer.alloc(0)), { name: "UNEXPECTED_FRAME" }, "a type the side cannot send");
    assert.throws(() => worker.sendDrain(0), { name: "UNEXPECTED_FRAME" });
    assert.throws(() => worker.sendHello(worker.hello()!), { name: "UNEXPECTED_FRAME" }, "a second HELLO");
    worker.sendGoodbye(0);
    assert.throws(() => worker.sendPong(Buffer.alloc(8)), { name: "UNEXPECTED_FRAME" });
    assert.equal(worker.isOpen(), false);
    parent.sendFatal({ code: 100, message: "bye" });
    assert.throws(() => parent.sendPing(Buffer.alloc(8)), { name: "UNEXPECTED_FRAME" });
    assert.throws(() => parent.sendFatal({ code: 100, message: "again" }), { name: "UNEXPECTED_FRAME" });
  });

  it("REQUEST: DRAINING, UNKNOWN_METHOD, OVERLOADED, DUPLICATE_ID, MESSAGE_TOO_LARGE", () => {
    const { parent } = pair({ maxInFlight: 2, maxMessageSize: 100000 });
    assert.throws(() => parent.sendRequest(2, 0, 0, Buffer.alloc(0)), { name: "UNKNOWN_METHOD", code: 200 });
    assert.throws(() => parent.sendRequest(0, 0, 0, Buffer.alloc(100000)), { name: "MESSAGE_TOO_LARGE", code: 115 });
    parent.sendRequest(0, 0, 0, Buffer.alloc(0));
    assert.throws(() => parent.send({ type: FrameType.REQUEST, id: 1, more: false, method: 0, codec: 0, timeoutUs: 0, body: Buffer.alloc(0) }), { name: "DUPLICATE_ID", code: 111 });
    parent.sendRequest(0, 0, 0, Buffer.alloc(0));
    assert.equal(parent.canSendRequest(), false);
    assert.throws(() => parent.sendRequest(0, 0, 0, Buffer.alloc(0)), { name: "OVERLOADED", code: 207 });
    const before = parent.outputLength();
    parent.sendDrain(100);
    assert.throws(() => parent.sendRequest(0, 0, 0, Buffer.alloc(0)), { name: "DRAINING", code: 208 });
    assert.equal(parent.outputLength(), before + 20, "only the DRAIN was written");
    assert.deepEqual(parent.inFlightIds(), [1, 2]);
  });

  it("ids, kinds, credit, row counts, frame sizes, continuation", () => {
    const { parent, worker } = pair({ initialCredit: 100 });
    const u = parent.sendRequest(0, 0, 0, Buffer.alloc(0));
    const s = parent.sendRequest(1, 0, 0, Buffer.alloc(0));
    assert.throws(() => parent.sendCancel(9), { name: "UNKNOWN_ID", code: 112 });
    assert.throws(() => parent.sendCredit(u, 1), { name: "KIND_MISMATCH", code: 122 });
    assert.throws(() => parent.sendCredit(s, 2 ** 31 - 100), { name: "CREDIT_OVERFLOW", code: 113 });
    pass(parent, worker);
    assert.throws(() => worker.sendEvent(9, "t"), { name: "UNKNOWN_ID" });
    assert.throws(() => worker.sendResult(s, Buffer.alloc(0)), { name: "KIND_MISMATCH" });
    assert.throws(() => worker.send({ type: FrameType.END, id: s, more: false, rowCount: 1, summary: Buffer.alloc(0) }), { name: "ROW_COUNT_MISMATCH", code: 121 });
    assert.throws(() => worker.send({ type: FrameType.RESULT, id: u, more: false, body: Buffer.alloc(70000) }), { name: "FRAME_TOO_LARGE", code: 102 });
    assert.throws(() => worker.rows(s).append(Buffer.alloc(65536)), { name: "ROW_TOO_LARGE", code: 209 });
    assert.throws(() => worker.send({ type: FrameType.CONTINUATION, id: u, more: false, body: Buffer.alloc(1) }), { name: "CONTINUATION", code: 116 });
    worker.send({ type: FrameType.RESULT, id: u, more: true, body: Buffer.alloc(1) });
    assert.throws(() => worker.sendEvent(u, "t"), { name: "CONTINUATION" }, "another frame mid-message");
    const b = worker.rows(s);
    b.append(Buffer.alloc(200));
    b.finish();
    b.append(Buffer.alloc(1));
    assert.throws(() => b.finish(), { name: "FLOW_CONTROL", code: 114 });
    worker.sendEnd(s);
    assert.throws(() => worker.sendEnd(s), { name: "UNKNOWN_ID" }, "a second terminal");
    worker.sendError(u, 203, "abandons the partial result");
    const evs = pass(worker, parent).map((e) => toJson(e, false));
    assert.deepEqual(evs.map((e) => e.type), ["ROWS", "END", "ERROR"]);
    assert.equal(parent.inFlight(), 0);
    assert.equal(worker.inFlight(), 0);
  });

  it("a REJECT is answered once with sendError", () => {
    const { parent, worker } = pair();
    const id = parent.sendRequest(0, CodecId.MSGPACK, 0, Buffer.alloc(0));
    const [ev] = pass(parent, worker);
    assert.deepEqual(toJson(ev, false), { type: "REJECT", id, code: 201, name: "CODEC_UNSUPPORTED" });
    worker.sendError(id, 201, "the method does not accept codec 2");
    assert.throws(() => worker.sendError(id, 201), { name: "UNKNOWN_ID" });
    const [err] = pass(worker, parent);
    assert.equal(err.type, FrameType.ERROR);
    assert.equal(parent.inFlight(), 0);
  });
});

describe("messages written frame by frame", () => {
  it("a large request interleaved with small ones, then abandoned by CANCEL", () => {
    const { parent, worker } = pair({ maxFrameSize: 65536 });
    const big = Buffer.alloc(300000, 5);
    const c = parent.beginRequest(0, 0, 0, big);
    assert.equal(parent.sendNextFrame(c), false);
    const small = parent.sendRequest(0, 0, 0, Buffer.from("hi"));
    assert.throws(() => parent.sendCredit(c.id, 1), /./);
    let evs = pass(parent, worker);
    assert.deepEqual(evs.map((e) => [e.type, e.id]), [[FrameType.REQUEST, small]]);
    parent.sendCancel(c.id);
    assert.equal(parent.sendNextFrame(c), true, "an abandoned message has nothing left to send");
    evs = pass(parent, worker);
    assert.deepEqual(evs.map((e) => toJson(e, false)), [{ type: "REJECT", id: c.id, code: 205, name: "CANCELLED" }]);
    assert.equal(parent.isInFlight(c.id), true, "in flight until its terminal arrives");
  });

  it("a large result arrives whole", () => {
    const { parent, worker } = pair({ maxFrameSize: 65536 });
    const id = parent.sendRequest(0, 0, 0, Buffer.alloc(0));
    pass(parent, worker);
    const body = Buffer.alloc(200001);
    for (let i = 0; i < body.length; i++) body[i] = i * 7;
    worker.sendResult(id, body);
    const evs = pass(worker, parent);
    assert.equal(evs.length, 1);
    assert.ok((evs[0] as { body: Buffer }).body.equals(body));
  });
});

describe("receiving", () => {
  it("readBuffer + received gives the same frames as receive, and returned views are never overwritten", () => {
    fc.assert(
      fc.property(fc.array(frameArb, { minLength: 1, maxLength: 10 }), fc.array(fc.integer({ min: 1, max: 300 }), { minLength: 1, maxLength: 20 }), (frames, sizes) => {
        const data = encodeFrames(frames);
        const dec = new FrameDecoder(1 << 24);
        const got: { frame: ReturnType<FrameDecoder["next"]>; json: unknown }[] = [];
        let p = 0;
        for (let i = 0; p < data.length; i++) {
          const room = dec.readBuffer(sizes[i % sizes.length]);
          const n = Math.min(room.length, sizes[i % sizes.length], data.length - p);
          data.copy(room, 0, p, p + n);
          dec.received(n);
          p += n;
          for (let f = dec.next(); f !== null; f = dec.next()) got.push({ frame: f, json: toJson(f) });
        }
        dec.end();
        assert.deepEqual(got.map((g) => g.json), frames.map((f) => toJson(f as never)));
        // The views still read what they read when they were returned.
        assert.deepEqual(got.map((g) => toJson(g.frame!)), got.map((g) => g.json));
      }),
      { numRuns: 200 },
    );
  });

  it("incompleteFrameLen counts a started frame, 0 between frames", () => {
    const { parent, worker } = pair();
    parent.sendPing(Buffer.alloc(8, 1));
    const wire = Buffer.concat(parent.takeOutput());
    worker.receive(wire.subarray(0, 10));
    assert.equal(worker.nextEvent(), null);
    assert.equal(worker.incompleteFrameLen(), 10);
    worker.receive(wire.subarray(10));
    assert.equal(worker.nextEvent()?.type, FrameType.PING);
    assert.equal(worker.incompleteFrameLen(), 0);
    worker.endOfInput();
  });

  it("a failed core repeats its error", () => {
    const p = new Connection("parent");
    p.receive(Buffer.from("0000000012000000010000000000000000", "hex"));
    assert.throws(() => p.nextEvent(), { name: "UNEXPECTED_FRAME" });
    assert.throws(() => p.nextEvent(), { name: "UNEXPECTED_FRAME" });
    assert.throws(() => p.endOfInput(), { name: "UNEXPECTED_FRAME" });
    assert.equal(p.failure()?.code, 109);
    p.sendFatal(p.failure()!);
    assert.ok(p.outputLength() > 16);
    assert.equal(EventType.LATE, 0x100);
  });
});

describe("batch fast paths (section 14.4)", () => {
  it("takeResults then nextEvent reports exactly what nextEvent alone does", () => {
    const input = fc.array(
      fc.oneof(
        fc.record({ kind: fc.constant("result" as const), id: fc.integer({ min: 1, max: 6 }), size: fc.integer({ min: 0, max: 40 }) }),
        fc.record({ kind: fc.constant("raw" as const), frame: frameArb }),
      ),
      { maxLength: 12 },
    );
    fc.assert(
      fc.property(input, fc.integer({ min: 1, max: 64 }), (items, chunk) => {
        const frames = items.map((it) => (it.kind === "result" ? { type: FrameType.RESULT, id: it.id, more: false, body: Buffer.alloc(it.size, it.id) } : it.frame));
        const data = encodeFrames(frames as never);
        const run = (fast: boolean) => {
          const { parent } = pair();
          parent.sendRequests(0, 0, [Buffer.alloc(0), Buffer.alloc(0), Buffer.alloc(0)]);
          parent.sendRequest(1, 0, 0, Buffer.alloc(0));
          const seen: unknown[] = [];
          let error: string | undefined;
          try {
            for (let p = 0; p < data.length; p += chunk) {
              parent.receive(data.subarray(p, p + chunk));
              for (;;) {
                if (fast) {
                  const ids: number[] = [];
                  const bodies: Buffer[] = [];
                  parent.takeResults(ids, bodies);
                  ids.forEach((id, i) => seen.push({ type: "RESULT", id, body: bodies[i].toString("hex") }));
                }
                const ev = parent.nextEvent();
                if (ev === null) break;
                seen.push(toJson(ev, false));
              }
            }
          } catch (e) {
            error = (e as Error).name;
          }
          return { seen, error, inFlight: parent.inFlightIds() };
        };
        assert.deepEqual(run(true), run(false));
      }),
      { numRuns: 300 },
    );
  });
});
