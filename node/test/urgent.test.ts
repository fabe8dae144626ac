// PING and PONG jump the queue (PROTOCOL.md 8.5), in the core: they are taken ahead of every
// other frame not yet taken, never inside a frame, in the order they were sent; takeOutput(max)
// hands a large output over whole frames at a time, the frames of every message in order.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";

import { CodecId, Connection, type ConnectionEvent, FrameType, MethodKind } from "../src/proto/index.js";

const FRAME = 65536;

function pair(): { parent: Connection; worker: Connection } {
  const parent = new Connection("parent");
  const worker = new Connection("worker");
  worker.sendHello({
    minVersion: 1, maxVersion: 1, pid: 7, maxConcurrency: 64, maxFrameSize: 16777216, sdkName: "test", sdkVersion: "1",
    methods: [{ name: "echo", kind: MethodKind.UNARY, codecs: [CodecId.RAW] }],
  });
  for (const b of worker.takeOutput()) parent.receive(b);
  assert.equal(parent.nextEvent()?.type, FrameType.HELLO);
  parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize: FRAME, initialCredit: 4096, heartbeatMs: 1000, maxInFlight: 64, maxMessageSize: 1 << 24 });
  for (const b of parent.takeOutput()) worker.receive(b);
  assert.equal(worker.nextEvent()?.type, FrameType.WELCOME);
  return { parent, worker };
}

/** The frames of one take as [type, id, total bytes], walking its headers; it must end at a frame boundary. */
function framesOf(parts: Buffer[]): [number, number, number][] {
  const data = Buffer.concat(parts);
  const out: [number, number, number][] = [];
  let at = 0;
  while (at < data.length) {
    assert.ok(at + 16 <= data.length, "a take ends inside a frame header");
    const size = 16 + data.readUInt32LE(at);
    assert.ok(at + size <= data.length, `a take ends inside a frame (${data.length - at} of its ${size} bytes)`);
    out.push([data[at + 4], data.readUInt32LE(at + 8), size]);
    at += size;
  }
  return out;
}

function body(id: number, n: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + id) & 0xff;
  return b;
}

function nonce(k: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeUInt32LE(k, 0);
  return b;
}

const isUrgent = (t: number): boolean => t === FrameType.PING || t === FrameType.PONG;

type Op = { op: "result"; size: number } | { op: "pong" } | { op: "take"; max: number | undefined };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ op: fc.constant("result" as const), size: fc.oneof(fc.integer({ min: 0, max: 300 }), fc.integer({ min: 1000, max: 20000 }), fc.integer({ min: FRAME - 4, max: 5 * FRAME + 7 })) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("pong" as const) }) },
  { weight: 3, arbitrary: fc.record({ op: fc.constant("take" as const), max: fc.option(fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 200 }), fc.integer({ min: 1, max: 3 * FRAME })), { nil: undefined }) }) },
);

describe("PING and PONG jump the queue (8.5)", () => {
  it("takeOutput(max) takes whole frames, at least one, and stops at the first frame that reaches max", () => {
    const { parent, worker } = pair();
    for (let id = 1; id <= 3; id++) parent.sendRequest(0, CodecId.RAW, 0, Buffer.alloc(1));
    for (const b of parent.takeOutput()) worker.receive(b);
    for (let ev = worker.nextEvent(); ev !== null; ev = worker.nextEvent()) assert.equal(ev.type, FrameType.REQUEST);
    worker.sendResult(1, body(1, 10));
    worker.sendResult(2, body(2, 3 * FRAME + 5)); // 4 frames: a body slice each (by reference)
    worker.sendResult(3, body(3, 20));
    const total = worker.outputLength();
    assert.deepEqual(worker.takeOutput(0), [], "max 0: no frame");
    assert.equal(worker.outputLength(), total);
    let f = framesOf(worker.takeOutput(1));
    assert.deepEqual(f, [[FrameType.RESULT, 1, 26]], "max 1: the first frame whole");
    f = framesOf(worker.takeOutput(FRAME + 17));
    assert.deepEqual(f.map(([t, id, n]) => [t, id, n]), [[FrameType.RESULT, 2, FRAME + 16], [FrameType.CONTINUATION, 2, FRAME + 16]], "the frame that reaches max is taken whole");
    // A PONG now goes ahead of the rest of result 2, at the boundary the last take left.
    worker.sendPong(nonce(1));
    f = framesOf(worker.takeOutput(10));
    assert.deepEqual(f, [[FrameType.PONG, 0, 24], [FrameType.CONTINUATION, 2, FRAME + 16]]);
    worker.sendPong(nonce(2));
    worker.sendPong(nonce(3));
    assert.deepEqual(framesOf(worker.takeOutput(0)), [[FrameType.PONG, 0, 24], [FrameType.PONG, 0, 24]], "max 0: the PONGs only");
    f = framesOf(worker.takeOutput());
    assert.deepEqual(f, [[FrameType.CONTINUATION, 2, 5 + 16], [FrameType.RESULT, 3, 36]], "without max: the rest");
    assert.equal(worker.outputLength(), 0);
  });

  it("a PING sent behind a large request is taken first, then the request's frames in order", () => {
    const { parent, worker } = pair();
    const big = body(9, 4 * FRAME);
    parent.sendRequest(0, CodecId.RAW, 0, big);
    parent.sendPing(nonce(7));
    const wire = parent.takeOutput();
    const f = framesOf(wire);
    assert.equal(f[0][0], FrameType.PING);
    assert.deepEqual(f.slice(1).map(([t]) => t), [FrameType.REQUEST, FrameType.CONTINUATION, FrameType.CONTINUATION, FrameType.CONTINUATION, FrameType.CONTINUATION]);
    for (const b of wire) worker.receive(b);
    const evs: ConnectionEvent[] = [];
    worker.nextEvents(evs);
    assert.deepEqual(evs.map((e) => e.type), [FrameType.PING, FrameType.REQUEST]);
    assert.ok((evs[1] as { body: Buffer }).body.equals(big));
  });

  it("send() of a PING or PONG takes the same lane", () => {
    const { worker } = pair();
    worker.sendEvent(0, "t", "");
    worker.send({ type: FrameType.PONG, id: 0, more: false, nonce: nonce(5) });
    assert.deepEqual(framesOf(worker.takeOutput()).map(([t]) => t), [FrameType.PONG, FrameType.EVENT]);
  });

  it("any mix of results, PONGs and takes: PONGs lead the next take in order, never inside a frame; every message arrives whole", () => {
    fc.assert(
      fc.property(fc.array(opArb, { maxLength: 40 }), (ops) => {
        const { parent, worker } = pair();
        const sent: Buffer[] = [];
        const n = ops.filter((o) => o.op === "result").length;
        if (n > 0) {
          parent.sendRequests(0, CodecId.RAW, Array.from({ length: n }, () => Buffer.alloc(0)));
          for (const b of parent.takeOutput()) worker.receive(b);
          for (let ev = worker.nextEvent(); ev !== null; ev = worker.nextEvent()) assert.equal(ev.type, FrameType.REQUEST);
        }
        let pongs = 0; // sent
        let pongsTaken = 0;
        let waiting = 0; // PONGs sent since the last take
        const received: ConnectionEvent[] = [];
        const take = (max: number | undefined): void => {
          const before = worker.outputLength();
          const parts = worker.takeOutput(max);
          const f = framesOf(parts);
          const lead = f.findIndex(([t]) => !isUrgent(t));
          const urgent = lead < 0 ? f.length : lead;
          assert.equal(urgent, waiting, "every PONG waiting leads the take");
          assert.ok(f.slice(urgent).every(([t]) => !isUrgent(t)), "no PONG after another frame");
          const rest = f.slice(urgent);
          const restBytes = rest.reduce((s, [, , k]) => s + k, 0);
          if (max !== undefined) {
            if (max <= 0) assert.equal(rest.length, 0);
            else if (before > waiting * 24) assert.ok(rest.length >= 1, "at least one frame");
            if (rest.length > 0) assert.ok(restBytes - rest[rest.length - 1][2] < Math.max(max, 1), "stops at the frame that reaches max");
          } else {
            assert.equal(worker.outputLength(), 0);
          }
          pongsTaken += waiting;
          waiting = 0;
          for (const b of parts) parent.receive(b);
          parent.nextEvents(received);
        };
        for (const o of ops) {
          if (o.op === "result") {
            const id = sent.length + 1;
            const b = body(id, o.size);
            sent.push(b);
            worker.sendResult(id, b);
          } else if (o.op === "pong") {
            worker.sendPong(nonce(++pongs));
            waiting++;
          } else {
            take(o.max);
          }
        }
        take(undefined);
        assert.equal(pongsTaken, pongs);
        const results = received.filter((e) => e.type === FrameType.RESULT) as { id: number; body: Buffer }[];
        assert.deepEqual(results.map((r) => r.id), sent.map((_, k) => k + 1), "results whole, in order");
        results.forEach((r) => assert.ok(r.body.equals(sent[r.id - 1]), `result ${r.id} arrived changed`));
        const nonces = received.filter((e) => e.type === FrameType.PONG).map((e) => (e as { nonce: Buffer }).nonce.readUInt32LE(0));
        assert.deepEqual(nonces, Array.from({ length: pongs }, (_, k) => k + 1), "PONGs in order");
      }),
      { numRuns: 200 },
    );
  });
});
