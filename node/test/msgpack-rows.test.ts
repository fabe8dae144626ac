// The msgpack codec's decodeRows must mean exactly what msgpack.decode row by row means: the
// values (64-bit integers as bigint, binary as bytes), the first bad row (a row that is not
// exactly one MessagePack value: truncated, with bytes after it, empty) and the rows before it.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { msgpack, unpackRows } from "../src/codecs/index.js";
import { encodeFrames, FrameDecoder, FrameType, type RowsFrame } from "../src/proto/index.js";

/** The rows as the parent's core hands them out: views of one received ROWS frame. */
function received(rows: Uint8Array[]): readonly Buffer[] {
  const dec = new FrameDecoder(16 << 20);
  dec.push(encodeFrames([{ type: FrameType.ROWS, id: 1, more: false, rows }]));
  return (dec.next() as RowsFrame).rows;
}

function oneByOne(rows: readonly Buffer[], start: number): { values: unknown[]; error: unknown } {
  const values: unknown[] = [];
  for (let i = start; i < rows.length; i++) {
    try {
      values.push(msgpack.decode(rows[i]));
    } catch (e) {
      return { values, error: e };
    }
  }
  return { values, error: null };
}

function together(rows: readonly Buffer[], start: number): { values: unknown[]; error: unknown } {
  const values: unknown[] = [];
  try {
    unpackRows(rows, start, values);
  } catch (e) {
    return { values, error: e };
  }
  return { values, error: null };
}

function same(rows: readonly Buffer[], start = 0): { values: unknown[]; error: unknown } {
  const a = oneByOne(rows, start);
  const b = together(rows, start);
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
    same([a[0], b[0], a[1], a[2], a[3]]);
    same([a[4], a[3], a[2], a[1], a[0]]);
    same([a[0], a[0], a[0], a[0]]);
    same(packed(1, 2, 3, [4]));
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
        same(rows, s % rows.length);
      }),
      { numRuns: 500 },
    );
  });
});
