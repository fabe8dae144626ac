// The msgpack codec's decodeRows must mean exactly what msgpack.decode row by row means: the
// values (64-bit integers as bigint, binary as bytes), the first bad row (a row that is not
// exactly one MessagePack value: truncated, with bytes after it, empty) and the rows before it.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { msgpack, unpackRows } from "../src/codecs/index.js";
import { pack, unpack } from "msgpackr";
import { CodecId, Connection, encodeFrames, FrameDecoder, FrameType, MethodKind, rowSpans, type RowSpans, type RowsFrame, spansToViews } from "../src/proto/index.js";

/** The rows as the parent's core hands them out: views of one received ROWS frame. */
function received(rows: Uint8Array[]): RowsFrame {
  const dec = new FrameDecoder(16 << 20);
  dec.push(encodeFrames([{ type: FrameType.ROWS, id: 1, more: false, rows }]));
  return dec.next() as RowsFrame;
}

/** Rows `picks` of `spans`, as spans over the same bytes (in any order: not a frame's layout). */
function pick(spans: RowSpans, picks: number[]): RowSpans {
  const bounds = new Uint32Array(picks.length * 2);
  picks.forEach((k, i) => bounds.set(spans.bounds.subarray(2 * k, 2 * k + 2), 2 * i));
  return { data: spans.data, bounds, count: picks.length };
}

function oneByOne(spans: RowSpans, start: number): { values: unknown[]; error: unknown } {
  const values: unknown[] = [];
  const rows = spansToViews(spans, 0);
  for (let i = start; i < rows.length; i++) {
    try {
      values.push(msgpack.decode(rows[i]));
    } catch (e) {
      return { values, error: e };
    }
  }
  return { values, error: null };
}

function together(spans: RowSpans, start: number): { values: unknown[]; error: unknown } {
  const values: unknown[] = [];
  try {
    unpackRows(spans, start, values);
  } catch (e) {
    return { values, error: e };
  }
  return { values, error: null };
}

function same(spans: RowSpans, start = 0): { values: unknown[]; error: unknown } {
  const a = oneByOne(spans, start);
  const b = together(spans, start);
  assert.deepEqual(b.values, a.values);
  assert.equal(b.error === null, a.error === null, `error ${String(b.error)} against ${String(a.error)}`);
  return b;
}

const packed = (...v: unknown[]): Buffer[] => v.map((x) => Buffer.from(msgpack.encode(x)));

describe("msgpack.decodeRows (unpackRows)", () => {
  test("is the codec's batch decoder", () => {
    assert.equal(msgpack.decodeRows, unpackRows);
  });

  test("small and large rows, from any start, 64-bit integers exact and binary as bytes", () => {
    const values = Array.from({ length: 300 }, (_, i) => ({ i, name: `decl_${i}`, kind: "theorem" }));
    values.push({ big: 18446744073709551615n, neg: -9223372036854775808n, safe: 2 ** 40 } as never);
    values.push({ bin: new Uint8Array([1, 2, 3]), long: "é".repeat(300) } as never);
    values.push({ s: "x".repeat(139) } as never, [1.5, null, true, "日本"] as never);
    const rows = received(packed(...values));
    const got = same(rows).values;
    assert.deepEqual(got[300], { big: 18446744073709551615n, neg: -9223372036854775808n, safe: 2 ** 40 });
    assert.deepEqual(got[301], { bin: Buffer.from([1, 2, 3]), long: "é".repeat(300) });
    same(rows, 297);
    same(rows, 302);
    // a decoded binary value keeps its bytes after later rows are decoded
    assert.deepEqual((got[301] as { bin: Buffer }).bin, Buffer.from([1, 2, 3]));
  });

  test("a row that is not exactly one value fails alone, after the rows before it", () => {
    const two = Buffer.concat(packed(1, 2));
    const cut = packed({ a: "hello" })[0].subarray(0, 5);
    const cutLong = packed({ a: "y".repeat(500) })[0].subarray(0, 300);
    for (const bad of [
      [...packed(1, 2), two, ...packed(3)],
      [...packed(1, 2), cut, ...packed(3, 4)],
      [...packed("a", "b"), Buffer.alloc(0), ...packed(5)],
      [...packed(1, 2, 3), cutLong, ...packed(6)],
    ]) {
      const r = same(received(bad));
      assert.notEqual(r.error, null);
    }
    // msgpackr reads the unused byte 0xc1 as a marker value, not an error: alike either way
    same(received([...packed(1), Buffer.from([0xc1]), ...packed(2)]));
  });

  test("rows that are not views in order of one buffer decode one by one", () => {
    const a = received(packed(1, 2, 3, 4, "x".repeat(200)));
    const b = received(packed("x", "y"));
    same(rowSpans([a.rows[0], b.rows[0], a.rows[1], a.rows[2], a.rows[3]]));
    same(pick(a, [4, 3, 2, 1, 0]));
    same(pick(a, [0, 0, 0, 0]));
    same(rowSpans(packed(1, 2, 3, [4])));
  });

  test("property: the same as msgpack.decode row by row, for any rows", () => {
    const value = fc.oneof(
      fc.jsonValue(),
      fc.bigInt({ min: -(1n << 63n), max: (1n << 64n) - 1n }).map((n) => ({ n })),
      fc.uint8Array({ maxLength: 300 }).map((bin) => ({ bin })),
      fc.string({ maxLength: 300 }),
    );
    const good = value.map((v) => Buffer.from(msgpack.encode(v)));
    const row = fc.oneof(
      { weight: 6, arbitrary: good },
      { weight: 1, arbitrary: fc.tuple(good, fc.nat()).map(([b, k]) => b.subarray(0, k % (b.length + 1))) },
      { weight: 1, arbitrary: fc.tuple(good, good).map(([x, y]) => Buffer.concat([x, y])) },
      { weight: 1, arbitrary: fc.uint8Array({ maxLength: 200 }).map((u) => Buffer.from(u)) },
    );
    fc.assert(
      fc.property(fc.array(row, { minLength: 1, maxLength: 40 }), fc.nat(), (rs, s) => {
        const rows = received(rs);
        same(rows, s % rows.count);
      }),
      { numRuns: 500 },
    );
  });
});

describe("msgpack.encodeInto and RowsBuilder.appendWith (rows encoded straight into the frame)", () => {
  function worker(maxFrameSize: number): { worker: Connection; id: number } {
    const parent = new Connection("parent");
    const w = new Connection("worker");
    w.sendHello({ minVersion: 1, maxVersion: 1, pid: 1, maxConcurrency: 8, maxFrameSize: 16 << 20, sdkName: "test", sdkVersion: "1",
      methods: [{ name: "rows", kind: MethodKind.STREAM, codecs: [CodecId.MSGPACK] }] });
    for (const b of w.takeOutput()) parent.receive(b);
    while (parent.nextEvent());
    parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize, initialCredit: 1 << 30, heartbeatMs: 0, maxInFlight: 8, maxMessageSize: 1 << 24 });
    for (const b of parent.takeOutput()) w.receive(b);
    while (w.nextEvent());
    const id = parent.sendRequest(0, CodecId.MSGPACK, 0, Buffer.from([0xc0]));
    for (const b of parent.takeOutput()) w.receive(b);
    while (w.nextEvent());
    return { worker: w, id };
  }

  /** Every value sent as a row, a frame finished whenever one does not fit; the bytes written. */
  function drive(values: unknown[], room: number, into: boolean): Buffer {
    const { worker: w, id } = worker(65536);
    const b = w.rows(id);
    const write = (v: unknown) => (buf: Buffer, start: number) => msgpack.encodeInto!(v, buf, start);
    for (const v of values) {
      const ok = into ? b.appendWith(write(v), room) : b.append(msgpack.encode(v));
      if (!ok) {
        b.finish();
        assert.ok(into ? b.appendWith(write(v), room) : b.append(msgpack.encode(v)));
      }
    }
    if (b.count > 0) b.finish();
    return Buffer.concat(w.takeOutput());
  }

  const value = fc.oneof(
    fc.jsonValue(),
    fc.bigInt({ min: -(1n << 63n), max: (1n << 64n) - 1n }).map((n) => ({ n })),
    fc.integer({ min: 2 ** 32, max: Number.MAX_SAFE_INTEGER }).map((n) => ({ wide: n })),
    fc.uint8Array({ maxLength: 300 }).map((bin) => ({ bin })),
    fc.constantFrom("x".repeat(20000), { s: "é".repeat(9000) }),
  );

  test("property: encodeInto writes what encode returns; appendWith builds the frames append builds", () => {
    fc.assert(
      fc.property(fc.array(value, { minLength: 1, maxLength: 50 }), fc.constantFrom(0, 16, 512, 70000), (values, room) => {
        for (const v of values) {
          const buf = Buffer.alloc(64);
          const r = msgpack.encodeInto!(v, buf, 3);
          const bytes = typeof r === "number" ? buf.subarray(3, r) : Buffer.from(r);
          assert.ok(bytes.equals(Buffer.from(msgpack.encode(v))));
        }
        assert.ok(drive(values, room, true).equals(drive(values, room, false)), "the same frames");
      }),
      { numRuns: 200 },
    );
  });

  test("encodeInto leaves what msgpackr handed out before intact", () => {
    const held = pack({ a: "held", n: [1, 2, 3] });
    const copy = Buffer.from(held);
    const buf = Buffer.alloc(1 << 16);
    let p = 0;
    for (let i = 0; i < 2000; i++) {
      const r = msgpack.encodeInto!({ i, name: `decl_${i}`, kind: "theorem" }, buf, p);
      p = typeof r === "number" && r < buf.length - 100 ? r : 0;
    }
    assert.ok(held.equals(copy));
    assert.deepEqual(unpack(pack({ after: true })), { after: true });
  });

  test("appendWith: a row too large for any frame is ROW_TOO_LARGE, one that does not fit this frame returns false, a throwing writer appends nothing", () => {
    const { worker: w, id } = worker(65536);
    const b = w.rows(id);
    assert.throws(() => b.appendWith((buf, start) => msgpack.encodeInto!("y".repeat(70000), buf, start)), { name: "ROW_TOO_LARGE" });
    assert.throws(() => b.appendWith(() => { throw new Error("boom"); }), /boom/);
    assert.throws(() => b.appendWith((buf) => buf.length + 1), RangeError);
    assert.equal(b.count, 0);
    assert.ok(b.appendWith((buf, start) => msgpack.encodeInto!("z".repeat(60000), buf, start)));
    assert.equal(b.appendWith((buf, start) => msgpack.encodeInto!("z".repeat(6000), buf, start)), false);
    assert.equal(b.count, 1);
    b.finish();
    const f = (() => {
      const dec = new FrameDecoder(16 << 20);
      dec.push(Buffer.concat(w.takeOutput()));
      return dec.next() as RowsFrame;
    })();
    assert.equal(msgpack.decode(f.rows[0]), "z".repeat(60000));
  });
});
