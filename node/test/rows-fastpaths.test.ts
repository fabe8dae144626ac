// The rows fast paths must mean exactly what the one-row paths mean: the JSON codec's
// decodeRows against parseJson row by row (values, 64-bit integers, the first bad row and the
// rows before it), and RowsBuilder.appendText against append of the UTF-8 bytes.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { json, parseJson, parseJsonRows } from "../src/codecs/index.js";
import { DecodeFailedError, Pool } from "../src/index.js";
import { CodecId, Connection, type ConnectionEvent, encodeFrames, ErrorCode, FrameDecoder, FrameType, MethodKind, type RowsFrame } from "../src/proto/index.js";

/** The rows as the parent's core hands them out: views of one received ROWS frame. */
function received(rows: Buffer[]): readonly Buffer[] {
  const dec = new FrameDecoder(16 << 20);
  dec.push(encodeFrames([{ type: FrameType.ROWS, id: 1, more: false, rows }]));
  return (dec.next() as RowsFrame).rows;
}

/** What decoding row by row gives: the values before the first bad row, and its error (or null). */
function oneByOne(rows: readonly Buffer[], start: number): { values: unknown[]; error: unknown } {
  const values: unknown[] = [];
  for (let i = start; i < rows.length; i++) {
    try {
      values.push(parseJson(rows[i].toString("utf8")));
    } catch (e) {
      return { values, error: e };
    }
  }
  return { values, error: null };
}

function together(rows: readonly Buffer[], start: number): { values: unknown[]; error: unknown } {
  const values: unknown[] = [];
  try {
    parseJsonRows(rows, start, values);
  } catch (e) {
    return { values, error: e };
  }
  return { values, error: null };
}

function same(rows: readonly Buffer[], start = 0): void {
  const a = oneByOne(rows, start);
  const b = together(rows, start);
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
    same([a[0], b[0], a[1], a[2], a[3]]);
    same([a[3], a[2], a[1], a[0]]);
    same([a[0], a[0], a[0], a[0], a[0]]);
    same(texts("1", "2", "3", "4", "5", "[6]"));
  });

  test("property: the same as parseJson row by row, for any rows", () => {
    const jsonText = fc.jsonValue().map((v) => JSON.stringify(v));
    const bigint = fc.bigInt({ min: -(1n << 64n), max: 1n << 64n }).map((n) => `{"n":${n}}`);
    const row = fc.oneof(jsonText, jsonText, bigint, fc.string(), fc.string({ unit: "binary" })).map((s) => Buffer.from(s, "utf8"));
    fc.assert(
      fc.property(fc.array(row, { minLength: 1, maxLength: 40 }), fc.nat(), (rs, s) => {
        const rows = received(rs);
        same(rows, s % rows.length);
      }),
      { numRuns: 500 },
    );
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
