// The rows fast paths must mean exactly what the one-row paths mean: the JSON codec's
// decodeRows against parseJson row by row (values, 64-bit integers, the first bad row and the
// rows before it), and RowsBuilder.appendText against append of the UTF-8 bytes.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { json, parseJson, parseJsonRows } from "../src/codecs/index.js";
import { DecodeFailedError, Pool } from "../src/index.js";
import { CodecId, Connection, type ConnectionEvent, encodeFrames, ErrorCode, FrameDecoder, FrameType, MethodKind, type RowsBuilder, rowSpans, type RowSpans, type RowsFrame, spansToViews } from "../src/proto/index.js";

/** The rows as the parent's core hands them out: views of one received ROWS frame. */
function received(rows: Buffer[]): RowsFrame {
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

/** What decoding row by row gives: the values before the first bad row, and its error (or null). */
function oneByOne(spans: RowSpans, start: number): { values: unknown[]; error: unknown } {
  const values: unknown[] = [];
  const rows = spansToViews(spans, 0);
  for (let i = start; i < rows.length; i++) {
    try {
      values.push(parseJson(rows[i].toString("utf8")));
    } catch (e) {
      return { values, error: e };
    }
  }
  return { values, error: null };
}

function together(spans: RowSpans, start: number): { values: unknown[]; error: unknown } {
  const values: unknown[] = [];
  try {
    parseJsonRows(spans, start, values);
  } catch (e) {
    return { values, error: e };
  }
  return { values, error: null };
}

function same(spans: RowSpans, start = 0): void {
  const a = oneByOne(spans, start);
  const b = together(spans, start);
  assert.deepEqual(b.values, a.values);
  assert.equal(b.error === null, a.error === null, `error ${String(b.error)} against ${String(a.error)}`);
  if (a.error !== null) assert.equal((b.error as Error).name, (a.error as Error).name);
}

const texts = (...t: string[]): Buffer[] => t.map((s) => Buffer.from(s, "utf8"));

describe("json.decodeRows (parseJsonRows)", () => {
  test("is the codec's batch decoder", () => {
    assert.equal(json.decodeRows, parseJsonRows);
  });

  test("plain ASCII rows, from any start", () => {
    const rows = received(Array.from({ length: 300 }, (_, i) => Buffer.from(JSON.stringify({ i, name: `decl_${i}`, kind: "theorem" }))));
    same(rows);
    same(rows, 297);
    same(rows, 5);
  });

  test("64-bit integers stay exact wherever the long digit run lies (row start, end, next to a length prefix)", () => {
    const rows = received(texts("1", "18446744073709551615", '{"a":-9223372036854775808}', "[1,2]", '"12345678901234567890"',
      "123456789012345", "9007199254740993", "0.12345678901234567890", "1e1234567890123456789", "2", "3"));
    same(rows);
    const v: unknown[] = [];
    parseJsonRows(rows, 0, v);
    assert.equal(v[1], 18446744073709551615n);
    assert.deepEqual(v[2], { a: -9223372036854775808n });
    assert.equal(v[6], 9007199254740993n);
    assert.equal(v[4], "12345678901234567890");
  });

  test("non-ASCII rows and rows whose length prefix has a byte above 0x7f decode as UTF-8", () => {
    same(received(texts('"é"', '{"k":"日本"}', "[1]", '"\u{1f600}"', "3")));
    same(received([...texts("1", "2", "3"), Buffer.from(JSON.stringify("x".repeat(200)))]));
  });

  test("a row that is not one JSON value fails alone, after the rows before it, even when the rows joined would parse", () => {
    for (const bad of [texts("1", "2", "[1", "2]", "3,4"), texts("1", '"a', 'b"', "5", "6"), texts("{}", "{}", "{}", "", "1"),
      texts("1", "2", "3", "4 5"), [...texts("1", "2", "3"), Buffer.from([0xff, 0x31])]]) {
      const rows = received(bad);
      same(rows);
      assert.notEqual(together(rows, 0).error, null);
    }
  });

  test("rows that are not views in order of one buffer decode one by one", () => {
    const a = received(texts("1", "2", "3", "4", "5"));
    const b = received(texts('"x"', '"y"'));
    const av = a.rows;
    same(rowSpans([av[0], b.rows[0], av[1], av[2], av[3]]));
    same(pick(a, [3, 2, 1, 0]));
    same(pick(a, [0, 0, 0, 0, 0]));
    same(pick(a, [0, 2, 4, 1]));
    same(rowSpans(texts("1", "2", "3", "4", "5", "[6]")));
  });

  test("property: the same as parseJson row by row, for any rows", () => {
    const jsonText = fc.jsonValue().map((v) => JSON.stringify(v));
    const bigint = fc.bigInt({ min: -(1n << 64n), max: 1n << 64n }).map((n) => `{"n":${n}}`);
    const row = fc.oneof(jsonText, jsonText, bigint, fc.string(), fc.string({ unit: "binary" })).map((s) => Buffer.from(s, "utf8"));
    fc.assert(
      fc.property(fc.array(row, { minLength: 1, maxLength: 40 }), fc.nat(), (rs, s) => {
        const rows = received(rs);
        same(rows, s % rows.count);
      }),
      { numRuns: 500 },
    );
  });
});

describe("json.decodeRows: rows cut anywhere from valid JSON (the batch parse must not join them)", () => {
  test("property: JSON text of values cut at any positions into rows decodes as parseJson row by row", () => {
    const cuts = fc.tuple(fc.array(fc.jsonValue({ maxDepth: 3 }), { minLength: 1, maxLength: 12 }), fc.array(fc.nat(), { maxLength: 12 }), fc.constantFrom(",", ", ", ",\n", "  ,"));
    fc.assert(
      fc.property(cuts, ([values, at, sep]) => {
        const text = values.map((v) => JSON.stringify(v)).join(sep);
        const points = [...new Set(at.map((a) => a % (text.length + 1)))].sort((a, b) => a - b);
        const rows: Buffer[] = [];
        let from = 0;
        for (const p of [...points, text.length]) {
          rows.push(Buffer.from(text.slice(from, p), "utf8"));
          from = p;
        }
        while (rows.length < 5) rows.push(Buffer.from("0"));
        same(received(rows));
      }),
      { numRuns: 1000 },
    );
  });

  test("property: flat objects with braces and quotes in their strings, cut anywhere (the frame's brace-only fast check)", () => {
    const str = fc.string({ unit: fc.constantFrom("{", "}", '"', "\\", ",", ":", "a", " "), maxLength: 6 });
    const obj = fc.dictionary(str, fc.oneof(str, fc.integer(), fc.constant(null)), { maxKeys: 3 });
    fc.assert(
      fc.property(fc.array(obj, { minLength: 1, maxLength: 10 }), fc.array(fc.nat(), { maxLength: 8 }), (values, at) => {
        const text = values.map((v) => JSON.stringify(v)).join(",");
        const points = [...new Set(at.map((a) => a % (text.length + 1)))].sort((a, b) => a - b);
        const rows: Buffer[] = [];
        let from = 0;
        for (const p of [...points, text.length]) {
          rows.push(Buffer.from(text.slice(from, p), "utf8"));
          from = p;
        }
        while (rows.length < 5) rows.push(Buffer.from("{}"));
        same(received(rows));
        same(received(values.map((v) => Buffer.from(JSON.stringify(v)))));
      }),
      { numRuns: 1000 },
    );
  });

  test("rows that only balance together, with the right count, are each parsed alone", () => {
    // [1,[2 | 3] would parse joined as [1,[2,3]] (2 values for 2 rows); so would {"a":"}" | "b":"{"} with a
    // leading 1, and "a | b",1 (a string across the separator) if the separator had no newline
    for (const bad of [texts("1,[2", "3]", "4", "5"), texts('1,{"a":"}"', '"b":"{"}', "2", "3"), texts("[[", "1]]", "2", "3", "4"),
      texts('"a\\"', '"b"', "1", "2"), texts("{}", "{", "}", "1", "2"), texts('"a', 'b",1', "2", "3"), texts('["x', 'y"]', "[", "]"),
      texts('{"a":1},{"b":2}', '{"c":{}', "{}}", "{}", "{}"), texts('{"a":"}', '"}', "{}", "{}"), texts("{}", "{}", "{}", '{"x":"}')]) {
      const rows = received(bad);
      same(rows);
      assert.notEqual(together(rows, 0).error, null);
    }
  });

  test("the spans of a decoded frame are its rows", () => {
    const rs = texts("1", "", "[2]", "é", "x".repeat(300));
    const f = received(rs);
    assert.equal(f.count, rs.length);
    assert.deepEqual(spansToViews(f, 0), rs);
    assert.deepEqual(f.rows, rs);
    assert.equal(f.rows[0].buffer, f.data.buffer, "views of the received bytes");
    assert.deepEqual(spansToViews(rowSpans(rs), 2), rs.slice(2));
  });
});

describe("RowsBuilder.appendText", () => {
  function worker(maxFrameSize: number): { worker: Connection; id: number } {
    const parent = new Connection("parent");
    const worker = new Connection("worker");
    worker.sendHello({ minVersion: 1, maxVersion: 1, pid: 1, maxConcurrency: 8, maxFrameSize: 16 << 20, sdkName: "test", sdkVersion: "1",
      methods: [{ name: "rows", kind: MethodKind.STREAM, codecs: [CodecId.JSON] }] });
    pass(worker, parent);
    parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize, initialCredit: 1 << 24, heartbeatMs: 0, maxInFlight: 8, maxMessageSize: 1 << 24 });
    pass(parent, worker);
    const id = parent.sendRequest(0, CodecId.JSON, 0, Buffer.from("{}"));
    pass(parent, worker);
    return { worker, id };
  }
  function pass(from: Connection, to: Connection): ConnectionEvent[] {
    for (const b of from.takeOutput()) to.receive(b);
    const out: ConnectionEvent[] = [];
    to.nextEvents(out);
    return out;
  }

  test("writes the bytes append would, fills frames the same way, and refuses a row too large alike", () => {
    const rows = ["", "a", "é", "\u{1f600}", "\ud800", "x".repeat(5000), "日本語".repeat(2000), '{"i":1}'];
    const byText = worker(65536);
    const byBytes = worker(65536);
    const bt = byText.worker.rows(byText.id);
    const bb = byBytes.worker.rows(byBytes.id);
    for (let k = 0; k < 40; k++) {
      for (const r of rows) {
        const okT = bt.appendText(r);
        const okB = bb.append(Buffer.from(r, "utf8"));
        assert.equal(okT, okB);
        assert.equal(bt.payloadLength, bb.payloadLength);
        if (!okT) {
          bt.finish();
          bb.finish();
          assert.equal(bt.appendText(r), bb.append(Buffer.from(r, "utf8")));
        }
      }
    }
    bt.finish();
    bb.finish();
    assert.deepEqual(Buffer.concat(byText.worker.takeOutput()), Buffer.concat(byBytes.worker.takeOutput()));
    assert.throws(() => bt.appendText("y".repeat(70000)), { name: "ROW_TOO_LARGE" });
  });
});

describe("RowsBuilder.extendText", () => {
  function worker(maxFrameSize: number): { worker: Connection; id: number } {
    const parent = new Connection("parent");
    const w = new Connection("worker");
    w.sendHello({ minVersion: 1, maxVersion: 1, pid: 1, maxConcurrency: 8, maxFrameSize: 16 << 20, sdkName: "test", sdkVersion: "1",
      methods: [{ name: "rows", kind: MethodKind.STREAM, codecs: [CodecId.JSON] }] });
    for (const b of w.takeOutput()) parent.receive(b);
    while (parent.nextEvent());
    parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize, initialCredit: 1 << 30, heartbeatMs: 0, maxInFlight: 8, maxMessageSize: 1 << 24 });
    for (const b of parent.takeOutput()) w.receive(b);
    while (w.nextEvent());
    const id = parent.sendRequest(0, CodecId.JSON, 0, Buffer.from("{}"));
    for (const b of parent.takeOutput()) w.receive(b);
    while (w.nextEvent());
    return { worker: w, id };
  }

  /** What extendText means, row by row with append: rows while the payload stays within min(target, maxPayload); an empty frame takes its first row. */
  function reference(b: RowsBuilder, texts: string[], start: number, target: number): number {
    let k = 0;
    for (let i = start; i < texts.length; i++) {
      const bytes = Buffer.from(texts[i], "utf8");
      if (b.payloadLength + 4 + bytes.length > Math.min(target, b.maxPayload)) {
        if (b.count === 0) return b.append(bytes) ? 1 : 0;
        break;
      }
      assert.ok(b.append(bytes));
      k++;
    }
    return k;
  }

  /** Every row sent with `extend`, frames finished when it takes none; the bytes written and the counts it returned. */
  function drive(maxFrameSize: number, texts: string[], target: number, extend: (b: RowsBuilder, start: number) => number): { wire: Buffer; takes: number[] } {
    const { worker: w, id } = worker(maxFrameSize);
    const b = w.rows(id);
    const takes: number[] = [];
    let i = 0;
    while (i < texts.length) {
      const k = extend(b, i);
      takes.push(k);
      if (k === 0) b.finish();
      i += k;
      if (k > 0 && b.payloadLength >= target) b.finish();
    }
    if (b.count > 0) b.finish();
    return { wire: Buffer.concat(w.takeOutput()), takes };
  }

  const text = fc.oneof(
    { weight: 4, arbitrary: fc.jsonValue().map((v) => JSON.stringify(v)) },
    { weight: 2, arbitrary: fc.string({ unit: "grapheme", maxLength: 40 }) },
    { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 40 }) }, // lone surrogates too
    { weight: 1, arbitrary: fc.constantFrom("", "\0\0\0\0", "é", "\ud800", "x".repeat(30000), "日".repeat(15000), "é".repeat(20000)) },
  );

  test("property: the same frames as append row by row, for any texts, targets and frame sizes", () => {
    fc.assert(
      fc.property(fc.array(text, { minLength: 1, maxLength: 60 }), fc.oneof(fc.integer({ min: 1, max: 300 }), fc.integer({ min: 1, max: 70000 })), fc.constantFrom(65536, 100000), (texts, target, maxFrame) => {
        const a = drive(maxFrame, texts, target, (b, i) => b.extendText(texts, i, target));
        const r = drive(maxFrame, texts, target, (b, i) => reference(b, texts, i, target));
        assert.deepEqual(a.takes, r.takes);
        assert.ok(a.wire.equals(r.wire), "the same bytes");
      }),
      { numRuns: 300 },
    );
  });

  test("a first row too large for any frame is ROW_TOO_LARGE, nothing appended; one that does not fit this frame returns 0", () => {
    const { worker: w, id } = worker(65536);
    const b = w.rows(id);
    assert.throws(() => b.extendText(["y".repeat(70000)]), { name: "ROW_TOO_LARGE" });
    assert.throws(() => b.extendText(["é".repeat(33000)]), { name: "ROW_TOO_LARGE" });
    assert.equal(b.count, 0);
    assert.equal(b.extendText(["1", "2"]), 2);
    assert.equal(b.extendText(["z".repeat(65520)]), 0);
    assert.equal(b.extendText(["é".repeat(32760)]), 0);
    assert.equal(b.extendText(["3", "4"], 1), 1);
    assert.equal(b.count, 3);
    assert.equal(b.extendText([], 0), 0);
  });
});

describe("a stream's JSON rows through the parent (the frame decoded in one pass)", () => {
  // A worker whose "json" writes each row's text as it is, so that it can send rows that are
  // not JSON, and rows that would parse if the frame were read as one array.
  const sdk = new URL("../src/index.js", import.meta.url).href;
  const worker = `
    import { Worker } from ${JSON.stringify(sdk)};
    const verbatim = { id: 1, name: "json", encode: (v) => Buffer.from(String(v)), encodeString: (v) => String(v),
      decode: (b) => JSON.parse(b.toString("utf8")) };
    const w = new Worker();
    w.stream("texts", function* (texts) { yield* texts; }, { codecs: [verbatim] });
    await w.serve();`;
  const rows = ["1", '{"n":18446744073709551615}', '"é"', "[4", "5]", "6,7", "8"];

  test("row by row and by batches: the rows before the bad one, then DECODE_FAILED; u64 exact", async () => {
    const pool = await Pool.start({ command: [process.execPath, "--input-type=module", "-e", worker], workers: 1 });
    try {
      const got: unknown[] = [];
      await assert.rejects(async () => {
        for await (const row of pool.stream("texts", rows)) got.push(row);
      }, (e: unknown) => e instanceof DecodeFailedError && e.code === ErrorCode.DECODE_FAILED);
      assert.deepEqual(got, [1, { n: 18446744073709551615n }, "é"]);
      const batches: unknown[][] = [];
      await assert.rejects(async () => {
        for await (const b of pool.stream("texts", rows).batches()) batches.push(b);
      }, DecodeFailedError);
      assert.deepEqual(batches.flat(), [1, { n: 18446744073709551615n }, "é"]);
      const good: unknown[] = [];
      for await (const row of pool.stream("texts", ["1", "2", "3", "[4]", "5"])) good.push(row);
      assert.deepEqual(good, [1, 2, 3, [4], 5]);
    } finally {
      await pool.close();
    }
  });
});

describe("continued messages: large pieces are not copied while reassembled", () => {
  function pair(): { parent: Connection; worker: Connection } {
    const parent = new Connection("parent");
    const worker = new Connection("worker");
    worker.sendHello({ minVersion: 1, maxVersion: 1, pid: 1, maxConcurrency: 8, maxFrameSize: 16 << 20, sdkName: "test", sdkVersion: "1",
      methods: [{ name: "echo", kind: MethodKind.UNARY, codecs: [CodecId.RAW] }] });
    for (const b of worker.takeOutput()) parent.receive(b);
    while (parent.nextEvent());
    parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize: 1 << 20, initialCredit: 1 << 20, heartbeatMs: 0, maxInFlight: 8, maxMessageSize: 1 << 24 });
    for (const b of parent.takeOutput()) worker.receive(b);
    while (worker.nextEvent());
    return { parent, worker };
  }
  const bodyOf = (ev: ConnectionEvent | null): Buffer => {
    assert.ok(ev !== null && ev.type === FrameType.REQUEST);
    return ev.body;
  };

  test("one large frame and an empty continuation: the body is a view of the received bytes", () => {
    const { parent, worker } = pair();
    const body = Buffer.alloc(300_000, 7);
    parent.send({ type: FrameType.REQUEST, id: 1, more: true, method: 0, codec: CodecId.RAW, timeoutUs: 0, body });
    parent.send({ type: FrameType.CONTINUATION, id: 1, more: false, body: Buffer.alloc(0) });
    const wire = Buffer.concat(parent.takeOutput());
    worker.receive(wire);
    const got = bodyOf(worker.nextEvent());
    assert.deepEqual(got, body);
    assert.equal(got.buffer, wire.buffer, "not copied");
  });

  test("large and small pieces in any order reassemble to the same bytes", () => {
    const { parent, worker } = pair();
    const sizes = [70_000, 3, 0, 200_000, 65_535, 65_536, 1, 100_000];
    const pieces = sizes.map((n, i) => Buffer.alloc(n, i + 1));
    parent.send({ type: FrameType.REQUEST, id: 1, more: true, method: 0, codec: CodecId.RAW, timeoutUs: 0, body: pieces[0] });
    for (let i = 1; i < pieces.length; i++) parent.send({ type: FrameType.CONTINUATION, id: 1, more: i < pieces.length - 1, body: pieces[i] });
    for (const b of parent.takeOutput()) worker.receive(b);
    assert.deepEqual(bodyOf(worker.nextEvent()), Buffer.concat(pieces));
    // and one REQUEST split by the core at max_frame_size
    const big = Buffer.alloc(2_500_000);
    for (let i = 0; i < big.length; i++) big[i] = i % 251;
    const id = parent.sendRequest(0, CodecId.RAW, 0, big);
    for (const b of parent.takeOutput()) worker.receive(b);
    const ev = worker.nextEvent();
    assert.ok(ev !== null && ev.type === FrameType.REQUEST && ev.id === id);
    assert.deepEqual(ev.body, big);
  });
});
