/**
 * Codecs (PROTOCOL.md section 7): how a request's body, its result, its rows and its summary
 * turn into bytes and back. The protocol carries only a codec id; the worker and the parent
 * driver share these objects, so both sides of a Node pool agree by construction.
 *
 * | name | id | values |
 * |---|---|---|
 * | `raw` | 0 | bytes as they are: a `Buffer` view of the received frame (zero-copy); encodes `Uint8Array` or `string` (UTF-8) |
 * | `json` | 1 | JSON text; integers beyond ±(2^53 - 1) as `bigint`, so u64/i64 values round-trip |
 * | `msgpack` | 2 | MessagePack ([msgpackr](https://github.com/kriszyp/msgpackr)); 64-bit integers beyond the safe range as `bigint` |
 * | `cbor` | 3 | CBOR ([cbor-x](https://github.com/kriszyp/cbor-x)); 64-bit integers beyond the safe range as `bigint` |
 * | `arrow` | 4 | an Arrow IPC stream of one apache-arrow `Table`; needs the optional package [apache-arrow](https://www.npmjs.com/package/apache-arrow) (see `./arrow.ts`) |
 *
 * @example
 * ```ts
 * import { codec } from "wirepool/codecs";
 * const json = codec("json");
 * json.decode(json.encode({ n: 18446744073709551615n })); // { n: 18446744073709551615n }
 * ```
 * @module
 */

import { Decoder as CborDecoder, Encoder as CborEncoder } from "cbor-x";
import { Packr, RESET_BUFFER_MODE, REUSE_BUFFER_MODE, Unpackr } from "msgpackr";
import { CodecId } from "../proto/constants.js";
import type { RowSpans } from "../proto/frames.js";
import { arrowCodec } from "./arrow.js";
import { parseJson, parseJsonRows, stringifyJson } from "./json.js";

export { arrowAvailable, arrowCodec, type ArrowModule } from "./arrow.js";
export { parseJson, parseJsonRows, stringifyJson } from "./json.js";

/** The name of a codec this SDK ships. */
export type CodecName = "raw" | "json" | "msgpack" | "cbor" | "arrow";

/** One codec: its wire id and name, and how values become bytes and back. */
export interface Codec {
  /** The codec id carried in REQUEST (section 7). */
  readonly id: number;
  /** The name used in method options (`codecs: ["json"]`). */
  readonly name: string;
  /**
   * Bytes of `value`. The result may be a view of a buffer the codec reuses for later values
   * only when it is never overwritten (msgpackr and cbor-x allocate anew rather than rewrite).
   */
  encode(value: unknown): Uint8Array;
  /**
   * The value of `bytes`, a view of the received frame. A codec that returns views of it
   * (raw) relies on the core never overwriting bytes it handed out.
   * @throws anything on bytes it cannot decode (the worker answers BAD_REQUEST).
   */
  decode(bytes: Buffer): unknown;
  /**
   * Optional, for text codecs: the encoding as a string, which a driver writes straight into
   * its frame buffer (a stream's rows then cost no Buffer each). Must equal `encode` as UTF-8.
   */
  encodeString?(value: unknown): string;
  /**
   * Optional, for binary codecs: `encode(value)` written straight into `buf` at `start` (a ROWS
   * frame being filled: `RowsBuilder.appendWith`), returning where it ends; or, when the bytes
   * do not fit in `buf`, returning them (valid until the next encode: the caller copies them at
   * once). Saves a Buffer per row.
   */
  encodeInto?(value: unknown, buf: Buffer, start: number): number | Uint8Array;
  /**
   * Optional: decodes the rows of `rows` (a ROWS frame, or `rowSpans(...)` of `wirepool/proto`
   * over any rows) from `start` on into `out`, in order, as `decode` would one by one but cheaper per row (no
   * Buffer per row). Each row must still fail on its own when it is not a valid encoding.
   * @throws the first bad row's error; `out` then holds the values of the rows before it.
   */
  decodeRows?(rows: RowSpans, start: number, out: unknown[]): void;
}

const EMPTY = Buffer.alloc(0);

/** Raw bytes: no copy either way. A handler gets a `Buffer` view of the frame. */
export const raw: Codec = {
  id: CodecId.RAW,
  name: "raw",
  encode(value: unknown): Uint8Array {
    if (value instanceof Uint8Array) return value;
    if (typeof value === "string") return Buffer.from(value, "utf8");
    if (value === undefined || value === null) return EMPTY;
    if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
    if (value instanceof ArrayBuffer) return new Uint8Array(value);
    throw new TypeError(`the raw codec encodes Uint8Array, ArrayBuffer or string, not ${typeof value}`);
  },
  decode(bytes: Buffer): unknown {
    return bytes;
  },
};

/** JSON (UTF-8), with exact 64-bit integers as `bigint` (see {@link parseJson}). */
export const json: Codec = {
  id: CodecId.JSON,
  name: "json",
  encode(value: unknown): Uint8Array {
    return Buffer.from(stringifyJson(value), "utf8");
  },
  encodeString: stringifyJson,
  decode(bytes: Buffer): unknown {
    return parseJson(bytes.toString("utf8"));
  },
  decodeRows: parseJsonRows,
};

// Plain maps and arrays, no msgpackr records or cbor-x tags: the other SDKs read standard data.
// int64AsType "auto" (not in msgpackr's typings): a 64-bit integer is a number when safe, else a bigint.
const packr = new Packr({ useRecords: false, int64AsType: "auto" as "bigint", mapsAsObjects: true });

/** An integer msgpackr and cbor-x would write as a float64 (they pack integers beyond 32 bits as doubles). */
function isWideInt(v: number): boolean {
  return (v > 0xffffffff || v < -0x80000000) && Number.isSafeInteger(v);
}

/**
 * `value` with every integer beyond 32 bits as a bigint (msgpackr then writes int64/uint64, as
 * the other SDKs expect an integer to arrive); `value` itself when it has none, so the common
 * case allocates nothing.
 */
function widenInts(value: unknown): unknown {
  if (typeof value === "number") return isWideInt(value) ? BigInt(value) : value;
  if (value === null || typeof value !== "object" || ArrayBuffer.isView(value)) return value;
  if (Array.isArray(value)) {
    let out: unknown[] | null = null;
    for (let i = 0; i < value.length; i++) {
      const v = value[i];
      const w = widenInts(v);
      if (w !== v && out === null) out = value.slice();
      if (out !== null) out[i] = w;
    }
    return out ?? value;
  }
  if (Object.getPrototypeOf(value) !== Object.prototype && Object.getPrototypeOf(value) !== null) return value;
  let out: Record<string, unknown> | null = null;
  for (const k in value) {
    const v = (value as Record<string, unknown>)[k];
    const w = widenInts(v);
    if (w !== v && out === null) out = { ...(value as Record<string, unknown>) };
    if (out !== null) out[k] = w;
  }
  return out ?? value;
}

// msgpackr reads strings in JS (with its key cache) only when the source ends before byte 140
// (`srcEnd < 140`, an absolute offset), else it calls its native extractor per string, which costs
// more than a small row. So a small row is copied into this scratch buffer and read there; its
// binary values are copied out (copyBuffers), as the scratch is overwritten by the next row.
const SMALL_ROW = 140;
const scratch = Buffer.alloc(SMALL_ROW);
const scratchUnpackr = new Unpackr({ useRecords: false, int64AsType: "auto" as "bigint", mapsAsObjects: true, copyBuffers: true });

/** The bounds of one row in its frame, reused: msgpackr reads `start` and `end` and keeps nothing. */
const rowBounds = { start: 0, end: 0 };

/**
 * Unpacks each row (one MessagePack value) of `spans` from `start` on into `out`, in order: the
 * values `msgpack.decode` gives row by row. msgpackr makes a DataView for each Buffer it reads
 * (and adds it to the Buffer as a property), which dominates a small row read from its own view,
 * so no Buffer is made per row: a small row is copied (a byte loop, cheaper than a copy call at
 * this size) into a reused scratch buffer and read there; a larger one is read from the frame's
 * bytes with its bounds. Every row is still read alone and must end exactly at its bound: a row
 * that reads past its end or stops short fails by itself.
 * @throws the first bad row's error; `out` then holds the values of the rows before it.
 */
export function unpackRows(spans: RowSpans, start: number, out: unknown[]): void {
  const { data, bounds, count } = spans;
  for (let i = start; i < count; i++) {
    const a = bounds[2 * i];
    const n = bounds[2 * i + 1] - a;
    if (n > 0 && n < SMALL_ROW) {
      for (let k = 0; k < n; k++) scratch[k] = data[a + k];
      out.push(scratchUnpackr.unpack(scratch, n));
    } else if (n === 0) {
      // msgpackr takes end 0 as "to the end of the source": an empty row is read alone (and fails).
      out.push(packr.unpack(data.subarray(a, a)));
    } else {
      rowBounds.start = a;
      rowBounds.end = a + n;
      out.push(packr.unpack(data, rowBounds));
    }
  }
}

/** Rows at most this long are copied byte by byte (a copy call costs more at this size). */
const LOOP_COPY_MAX = 64;

/**
 * `msgpack.encode(value)` into `buf` at `start`. msgpackr packs into its own buffer and, asked
 * to (REUSE_BUFFER_MODE), hands back that buffer with the value's bounds instead of a new view;
 * the bytes are copied out at once, so msgpackr may reuse the space (RESET_BUFFER_MODE): no
 * Buffer per row, and msgpackr's buffer stays the same warm one.
 */
function packInto(value: unknown, buf: Buffer, start: number): number | Uint8Array {
  const t = packr.pack(widenInts(value), REUSE_BUFFER_MODE | RESET_BUFFER_MODE) as Buffer & { start: number; end: number };
  const a = t.start;
  const n = t.end - a;
  // Too large for the room: the bytes as a view of msgpackr's buffer, which the caller copies at once.
  if (start + n > buf.length) return t.subarray(a, a + n);
  if (n <= LOOP_COPY_MAX) {
    for (let k = 0; k < n; k++) buf[start + k] = t[a + k];
  } else {
    t.copy(buf, start, a, a + n);
  }
  return start + n;
}

/** MessagePack through msgpackr; integers keep their type whatever their size. */
export const msgpack: Codec = {
  id: CodecId.MSGPACK,
  name: "msgpack",
  encode(value: unknown): Uint8Array {
    return packr.pack(widenInts(value));
  },
  encodeInto: packInto,
  decode(bytes: Buffer): unknown {
    return packr.unpack(bytes);
  },
  decodeRows: unpackRows,
};

const cborEncoder = new CborEncoder({ useRecords: false, tagUint8Array: false, mapsAsObjects: true });
const cborDecoder = new CborDecoder({ useRecords: false, mapsAsObjects: true });

const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/**
 * cbor-x decodes every 8-byte integer to a bigint; those within ±(2^53 - 1) become numbers, in
 * place (the decoded value is ours), as msgpack's "auto" does.
 */
function narrowInts(value: unknown): unknown {
  if (typeof value === "bigint") return value >= MIN_SAFE && value <= MAX_SAFE ? Number(value) : value;
  if (value === null || typeof value !== "object" || ArrayBuffer.isView(value)) return value;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const v = value[i];
      if (typeof v === "object" || typeof v === "bigint") value[i] = narrowInts(v);
    }
  } else if (Object.getPrototypeOf(value) === Object.prototype) {
    const o = value as Record<string, unknown>;
    for (const k in o) {
      const v = o[k];
      if (typeof v === "object" || typeof v === "bigint") o[k] = narrowInts(v);
    }
  }
  return value;
}

/** CBOR through cbor-x; integers keep their type whatever their size (bigint beyond ±(2^53 - 1)). */
export const cbor: Codec = {
  id: CodecId.CBOR,
  name: "cbor",
  encode(value: unknown): Uint8Array {
    return cborEncoder.encode(widenInts(value));
  },
  decode(bytes: Buffer): unknown {
    return narrowInts(cborDecoder.decode(bytes));
  },
};

/** Every codec this SDK ships that needs no optional package, by name (`arrow` is {@link arrowCodec}). */
export const CODECS: Readonly<Record<Exclude<CodecName, "arrow">, Codec>> = { raw, json, msgpack, cbor };

const BY_ID = new Map<number, Codec>(Object.values(CODECS).map((c) => [c.id, c]));

/**
 * A codec by name, or the codec itself (so options may pass a custom {@link Codec}, e.g. a
 * private-use id 128-255).
 * @throws TypeError for an unknown name; Error for `arrow` without its optional package.
 */
export function codec(nameOrCodec: CodecName | Codec): Codec {
  if (typeof nameOrCodec !== "string") return nameOrCodec;
  if (nameOrCodec === "arrow") return arrowCodec();
  const c = (CODECS as Record<string, Codec | undefined>)[nameOrCodec];
  if (c === undefined) throw new TypeError(`unknown codec ${JSON.stringify(nameOrCodec)} (known: ${Object.keys(CODECS).join(", ")}, arrow)`);
  return c;
}

/** The shipped codec with wire id `id`, or undefined (also for Arrow without apache-arrow). */
export function codecById(id: number): Codec | undefined {
  if (id === CodecId.ARROW_IPC) {
    try {
      return arrowCodec();
    } catch {
      return undefined;
    }
  }
  return BY_ID.get(id);
}
