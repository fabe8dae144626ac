// The codecs the worker and parent share (PROTOCOL.md section 7): values the other SDKs send
// must come back as they were, 64-bit integers included.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { cbor, codec, codecById, json, msgpack, parseJson, raw, stringifyJson } from "../src/codecs/index.js";
import { CodecId } from "../src/proto/index.js";

describe("codecs", () => {
  test("ids and names follow section 7", () => {
    assert.deepEqual([raw.id, json.id, msgpack.id, cbor.id], [CodecId.RAW, CodecId.JSON, CodecId.MSGPACK, CodecId.CBOR]);
    assert.equal(codec("msgpack"), msgpack);
    assert.equal(codecById(3), cbor);
    assert.throws(() => codec("yaml" as "json"), TypeError);
  });

  test("raw decodes to the received bytes themselves (no copy) and encodes strings as UTF-8", () => {
    const frame = Buffer.from("hello world");
    const body = frame.subarray(6);
    assert.equal(raw.decode(body), body);
    assert.equal(raw.encode(body), body);
    assert.deepEqual(Buffer.from(raw.encode("é")), Buffer.from([0xc3, 0xa9]));
    assert.equal(raw.encode(undefined).length, 0);
    assert.throws(() => raw.encode(5), TypeError);
  });

  test("JSON keeps integers beyond 2^53 exact, and leaves digits in strings and fractions alone", () => {
    const text = '{"u64max":18446744073709551615,"i64min":-9223372036854775808,"safe":9007199254740991,' +
      '"s":"12345678901234567890","f":1.2345678901234567,"e":1e-3000000000000000000,"l":[-12345678901234567890]}';
    const v = parseJson(text) as Record<string, unknown>;
    assert.equal(v.u64max, 18446744073709551615n);
    assert.equal(v.i64min, -9223372036854775808n);
    assert.equal(v.safe, 9007199254740991);
    assert.equal(v.s, "12345678901234567890");
    assert.equal(v.f, 1.2345678901234567);
    assert.equal(v.e, 0);
    assert.deepEqual(v.l, [-12345678901234567890n]);
    assert.equal(
      stringifyJson({ a: 18446744073709551615n, b: [1n, "x"], c: 1.5 }),
      '{"a":18446744073709551615,"b":[1,"x"],"c":1.5}',
    );
    assert.equal(stringifyJson(undefined), "null");
    const round = json.decode(Buffer.from(json.encode(v)));
    assert.deepEqual(round, v);
  });

  test("msgpack writes integers beyond 32 bits as integers, not doubles, and reads them back", () => {
    const small = Buffer.from(msgpack.encode(-123456789012));
    assert.equal(small[0], 0xd3, "int64");
    const big = Buffer.from(msgpack.encode(18446744073709551615n));
    assert.equal(big[0], 0xcf, "uint64");
    const v = { i: -123456789012, u: 18446744073709551615n, f: 1.5, s: "héllo", l: [1, [2, 2 ** 40]], b: Buffer.from([1, 2]) };
    const back = msgpack.decode(Buffer.from(msgpack.encode(v))) as typeof v;
    assert.equal(back.i, -123456789012);
    assert.equal(back.u, 18446744073709551615n);
    assert.deepEqual(back.l, [1, [2, 2 ** 40]]);
    assert.equal(back.s, "héllo");
    assert.deepEqual(Buffer.from(back.b), Buffer.from([1, 2]));
    const plain = { a: 1, b: "x" };
    assert.deepEqual(msgpack.decode(Buffer.from(msgpack.encode(plain))), plain);
  });

  test("cbor round-trips plain data with 64-bit integers and byte strings without tags", () => {
    const v = { i: -123456789012, u: 18446744073709551615n, n: -9223372036854775808n, f: 1.5, s: "✓", z: null, l: [[], {}] };
    assert.deepEqual(cbor.decode(Buffer.from(cbor.encode(v))), v);
    assert.equal(cbor.decode(Buffer.from("1b0000010000000000", "hex")), 2 ** 40, "a safe 8-byte integer is a number");
    assert.equal(Buffer.from(cbor.encode(-123456789012))[0], 0x3b, "a negative integer, not a double");
    assert.equal(Buffer.from(cbor.encode(2 ** 40))[0], 0x1b, "an 8-byte unsigned integer");
    const bytes = Buffer.from(cbor.encode(new Uint8Array([1, 2, 3])));
    assert.equal(bytes[0], 0x43, "a plain byte string, not tag 64");
  });
});
