// The Arrow IPC codec (PROTOCOL.md section 7, id 4) over the optional apache-arrow package: round
// trips, zero-copy decoding, the error without the package, and tables to and from a Python
// worker (pyarrow). Tests that need apache-arrow or pyarrow are skipped when it is absent.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, test } from "node:test";
import { arrowAvailable, arrowCodec, codec, codecById } from "../src/codecs/index.js";
import { Pool } from "../src/parent/index.js";
import { CodecId } from "../src/proto/index.js";

// Loaded by name, untyped: the tests must build where the optional package is absent.
const ARROW_NAME = "apache-arrow";
const A: any = arrowAvailable() ? await import(ARROW_NAME) : null;
const needsArrow = { skip: A === null ? "apache-arrow is not installed" : false, timeout: 30_000 };

/** A table's rows as plain objects (bigint for 64-bit integers, as apache-arrow reads them). */
function rowsOf(table: any): Record<string, unknown>[] {
  return table.toArray().map((r: any) => ({ ...r.toJSON() }));
}

function sample(): unknown {
  return new A.Table({
    i: A.vectorFromArray([1, null, -7, 2147483647], new A.Int32()),
    big: A.vectorFromArray([1n, 2n, null, -(2n ** 63n)], new A.Int64()),
    f: A.vectorFromArray([0.5, Number.NEGATIVE_INFINITY, null, Number.NaN], new A.Float64()),
    s: A.vectorFromArray(["a", null, "", "é€😀"], new A.Utf8()),
  });
}

describe("arrow codec", () => {
  test("is codec id 4, by name and by id", needsArrow, () => {
    const arrow = codec("arrow");
    assert.equal(arrow.id, CodecId.ARROW_IPC);
    assert.equal(arrow.id, 4);
    assert.equal(arrow.name, "arrow");
    assert.equal(codecById(4), arrow);
  });

  test("a table of ints, floats, strings and nulls round-trips, schema included", needsArrow, () => {
    const arrow = codec("arrow");
    const table = sample();
    const bytes = arrow.encode(table);
    // An IPC stream (no file magic "ARROW1"): a continuation marker opens the schema message.
    assert.deepEqual([...bytes.subarray(0, 4)], [0xff, 0xff, 0xff, 0xff]);
    const back: any = arrow.decode(Buffer.from(bytes));
    assert.ok(back instanceof A.Table);
    assert.equal(back.numRows, 4);
    assert.deepEqual(
      back.schema.fields.map((f: any) => [f.name, String(f.type), f.nullable]),
      (table as any).schema.fields.map((f: any) => [f.name, String(f.type), f.nullable]),
    );
    assert.deepEqual(rowsOf(back), rowsOf(table));
    assert.deepEqual(rowsOf(back)[1], { i: null, big: 2n, f: Number.NEGATIVE_INFINITY, s: null });
  });

  test("a RecordBatch, an object of columns and an empty table encode too; anything else is a TypeError", needsArrow, () => {
    const arrow = codec("arrow");
    const table: any = sample();
    assert.deepEqual(rowsOf(arrow.decode(Buffer.from(arrow.encode(table.batches[0])))), rowsOf(table));
    const cols = arrow.decode(Buffer.from(arrow.encode({ n: Float64Array.of(1.5, 2), s: ["x", null] })));
    assert.deepEqual(rowsOf(cols), [{ n: 1.5, s: "x" }, { n: 2, s: null }]);
    const empty: any = arrow.decode(Buffer.from(arrow.encode(table.slice(0, 0))));
    assert.equal(empty.numRows, 0);
    assert.deepEqual(empty.schema.names, ["i", "big", "f", "s"]);
    for (const bad of [null, 5, "text", [1, 2], new Uint8Array(4)]) {
      assert.throws(() => arrow.encode(bad), TypeError);
    }
  });

  test("decoding reads column buffers in place (no copy) when the bytes are aligned", needsArrow, () => {
    const arrow = codec("arrow");
    const n = 1 << 16;
    const encoded = arrow.encode(new A.Table({ v: A.vectorFromArray(Float64Array.from({ length: n }, (_, k) => k)) }));
    const frame = Buffer.alloc(encoded.length + 8); // its own ArrayBuffer: offset 0, 8-aligned
    frame.set(encoded, 8);
    const back: any = arrow.decode(frame.subarray(8));
    const values: Float64Array = back.getChild("v").data[0].values;
    assert.equal(values.length, n);
    assert.equal(values[n - 1], n - 1);
    assert.equal(values.buffer, frame.buffer, "the column is a view of the received bytes");
  });

  test("bytes that are no IPC stream fail to decode", needsArrow, () => {
    const arrow = codec("arrow");
    const good = Buffer.from(arrow.encode(sample()));
    assert.throws(() => arrow.decode(Buffer.from("not arrow at all, just text")));
    assert.throws(() => arrow.decode(good.subarray(0, good.length - 40)));
  });

  test("without apache-arrow: codec('arrow') names the package to install", () => {
    const missing = (): never => {
      throw Object.assign(new Error("Cannot find package 'apache-arrow'"), { code: "ERR_MODULE_NOT_FOUND" });
    };
    assert.throws(() => arrowCodec(missing), (e: Error) => {
      assert.match(e.message, /optional package apache-arrow: npm install apache-arrow/);
      assert.equal((e.cause as { code?: string }).code, "ERR_MODULE_NOT_FOUND");
      return true;
    });
    const broken = (): never => {
      throw new SyntaxError("Unexpected token");
    };
    assert.throws(() => arrowCodec(broken), /could not load apache-arrow: Unexpected token/);
    // The real loader, unaffected by the simulated ones: available exactly when installed.
    assert.equal(arrowAvailable(), A !== null);
    if (A === null) {
      assert.throws(() => codec("arrow"), /npm install apache-arrow/);
      assert.equal(codecById(4), undefined);
    }
  });
});

// Node parent x Python worker: tables made by apache-arrow read by pyarrow, and back.
const PYTHON = process.env.WIREPOOL_TEST_PYTHON ?? fileURLToPath(new URL("../../../.venv/bin/python", import.meta.url));
const WORKER = fileURLToPath(new URL("../../test/arrow_worker.py", import.meta.url));
const pyarrowReady =
  A !== null && existsSync(PYTHON) && spawnSync(PYTHON, ["-c", "import pyarrow, wirepool"], { timeout: 20_000 }).status === 0;

describe("arrow across languages", () => {
  const opts = {
    skip: A === null ? "apache-arrow is not installed" : !pyarrowReady ? `pyarrow (or wirepool) is not importable by ${PYTHON}` : false,
    timeout: 60_000,
  };

  test("a Node parent sends a table to a Python worker and reads the one it returns", opts, async () => {
    const pool = await Pool.start({ command: [PYTHON, WORKER], workers: 1, codec: "arrow" });
    try {
      const described = rowsOf(await pool.call("describe", sample()));
      assert.deepEqual(described, [
        { name: "i", type: "int32", nulls: 1n, values: "[1, None, -7, 2147483647]" },
        { name: "big", type: "int64", nulls: 1n, values: "[1, 2, None, -9223372036854775808]" },
        { name: "f", type: "double", nulls: 1n, values: "[0.5, -inf, None, nan]" },
        { name: "s", type: "string", nulls: 1n, values: "['a', None, '', 'é€😀']" },
      ]);
      const made: any = await pool.call("make", { unused: Int32Array.of(0) });
      assert.deepEqual(rowsOf(made), [
        { i: 1n, f: 0.5, s: "a" },
        { i: null, f: Number.NEGATIVE_INFINITY, s: null },
        { i: -(2n ** 63n), f: null, s: "é" },
      ]);
    } finally {
      await pool.close({ graceMs: 5000 });
    }
  });
});
