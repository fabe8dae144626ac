/**
 * JSON with exact integers: JavaScript numbers hold integers exactly only up to 2^53 - 1, while
 * the other SDKs send u64 and i64 values (PROTOCOL.md section 7 leaves the value model to the
 * codec). An integer literal outside the safe range decodes to a `bigint`, and a `bigint`
 * encodes as a bare integer literal, so such values round-trip byte for byte. The common case
 * (no literal of 16 digits or more, no bigint) costs one `JSON.parse` / `JSON.stringify`.
 * @module
 */

import { isAscii, isUtf8 } from "node:buffer";
import type { RowSpans } from "../proto/frames.js";

/** A literal of 16+ digits may be unsafe; the test may also hit digits inside strings (harmless). */
const LONG_DIGITS = /\d{16}/;
/** Strings (skipped as they are) or a long integer literal that is not part of a fraction or exponent. */
const STRING_OR_LONG_INT = /"(?:[^"\\]|\\.)*"|(?<![\d.eE+-])-?\d{16,}(?![\d.eE])/g;

/** A process-unique marker, so that no user string can be mistaken for a placeholder. */
const MARK = `\u0000wirepool-int-${Math.random().toString(36).slice(2)}:`;
const MARK_JSON = JSON.stringify(MARK).slice(1, -1);
const PLACEHOLDER = new RegExp(`"${MARK_JSON.replace(/[\\^$.*+?()[\]{}|]/g, "\\$&")}(-?\\d+)"`, "g");

function reviveInt(_key: string, value: unknown): unknown {
  if (typeof value === "string" && value.startsWith(MARK)) {
    const big = BigInt(value.slice(MARK.length));
    return big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
  }
  return value;
}

/** Parses JSON text; integers outside ±(2^53 - 1) come back as `bigint`. */
export function parseJson(text: string): unknown {
  if (!LONG_DIGITS.test(text)) return JSON.parse(text);
  const marked = text.replace(STRING_OR_LONG_INT, (m) => (m.charCodeAt(0) === 0x22 ? m : `"${MARK_JSON}${m}"`));
  return JSON.parse(marked, reviveInt);
}

/** Below this many rows a frame is decoded row by row (the frame-wide scan would not pay). */
const ROWS_SCAN_MIN = 4;

/**
 * Where `bytes` has runs of 16 or more ASCII digits, as [start, end) pairs in order. Such a run
 * covers a position that is a multiple of 16, so only those are tested, then widened: about a
 * sixteenth of the work of a regex over every byte.
 */
function longDigitRuns(bytes: Uint8Array): number[] {
  const runs: number[] = [];
  const n = bytes.length;
  let done = 0;
  for (let i = 0; i < n; i += 16) {
    if (i < done || (bytes[i] - 0x30) >>> 0 > 9) continue;
    let a = i;
    while (a > 0 && (bytes[a - 1] - 0x30) >>> 0 <= 9) a--;
    let b = i + 1;
    while (b < n && (bytes[b] - 0x30) >>> 0 <= 9) b++;
    done = b;
    if (b - a >= 16) runs.push(a, b);
  }
  return runs;
}

/** Reused for the batch parse of a frame's rows (frames above its size get their own buffer). */
let joinScratch = Buffer.allocUnsafe(64 * 1024);
const JOIN_SCRATCH_MAX = 1 << 20;

/**
 * Parses each row (JSON text as UTF-8) of `spans`' rows from `start` on into `out`, in order:
 * the same values as {@link parseJson} on each row, and the same error for the first row that
 * is not one JSON value (`out` then holds the rows before it).
 *
 * Rows laid out as in a ROWS frame (each 4 bytes after the previous one), all ASCII or valid
 * UTF-8 and clear of integer literals of 16+ digits, are parsed with one `JSON.parse` of
 * `[row, row, ...]` (the length fields become a comma and whitespace). That is the per-row
 * result exactly when every row is one JSON value: the batch is used only if it has one
 * element per row and each row's brackets balance outside its strings (then every comma put
 * between rows is at the top level; a newline in each separator keeps them out of strings).
 * Otherwise, or when the batch fails, each row is parsed alone, so a bad row fails by itself.
 * @throws the first bad row's parse error; `out` then holds the values of the rows before it.
 */
export function parseJsonRows(spans: RowSpans, start: number, out: unknown[]): void {
  const { data, bounds, count } = spans;
  if (count - start < ROWS_SCAN_MIN) {
    for (let i = start; i < count; i++) out.push(parseJson(data.toString("utf8", bounds[2 * i], bounds[2 * i + 1])));
    return;
  }
  const s0 = bounds[2 * start];
  const e0 = bounds[2 * count - 1];
  const whole = data.subarray(s0, Math.max(s0, e0));
  const ascii = isAscii(whole);
  // Runs of 16+ digits (what parseJson tests per row) send their rows down the exact path. The
  // bytes between rows (length fields) may extend a run: that only sends a neighbour there too.
  const runs = longDigitRuns(whole);
  if (runs.length === 0 && (ascii || isUtf8(whole)) && parseBatch(spans, start, ascii, out)) return;
  const text = ascii ? whole.toString("latin1") : null;
  let k = 0;
  let runFrom = runs.length > 0 ? runs[0] : Infinity;
  let runTo = runs.length > 0 ? runs[1] : Infinity;
  for (let i = start; i < count; i++) {
    const a = bounds[2 * i] - s0;
    const b = bounds[2 * i + 1] - s0;
    while (runTo <= a) {
      k += 2;
      runFrom = k < runs.length ? runs[k] : Infinity;
      runTo = k < runs.length ? runs[k + 1] : Infinity;
    }
    // Latin-1 is UTF-8 for ASCII; a row outside the span (not laid out as a frame's) is read alone.
    const inside = a >= 0 && b <= whole.length && b >= a;
    out.push(text !== null && inside && runFrom >= b ? JSON.parse(text.slice(a, b)) : parseJson(data.toString("utf8", bounds[2 * i], bounds[2 * i + 1])));
  }
}

/**
 * The batch parse of {@link parseJsonRows}: appends the rows' values to `out` and returns true,
 * or returns false with `out` untouched when the batch is not known to equal the rows one by one.
 */
function parseBatch(spans: RowSpans, start: number, ascii: boolean, out: unknown[]): boolean {
  const { data, bounds, count } = spans;
  const s0 = bounds[2 * start];
  const e0 = bounds[2 * count - 1];
  // Each row must start exactly 4 bytes after the previous one ended (a frame's layout).
  for (let i = start + 1; i < count; i++) if (bounds[2 * i] !== bounds[2 * i - 1] + 4) return false;
  const size = e0 - s0 + 3;
  let buf = joinScratch;
  if (size > buf.length) {
    buf = Buffer.allocUnsafe(size);
    if (size <= JOIN_SCRATCH_MAX) joinScratch = buf;
  }
  data.copy(buf, 1, s0, e0);
  buf[0] = 0x5b; // [
  for (let i = start + 1; i < count; i++) {
    const q = bounds[2 * i] - s0 - 3; // the length field, shifted by the "["
    buf[q] = 0x2c; // ,
    buf[q + 1] = 0x0a; // newline: no JSON string holds a raw one
    buf[q + 2] = 0x20;
    buf[q + 3] = 0x20;
  }
  buf[size - 2] = 0x0a; // the last row's end too
  buf[size - 1] = 0x5d; // ]
  const text = buf.toString(ascii ? "latin1" : "utf8", 0, size);
  let values: unknown;
  try {
    values = JSON.parse(text);
  } catch {
    return false;
  }
  const n = count - start;
  if (!Array.isArray(values) || values.length !== n) return false;
  if (!(ascii ? balancedObjects(text, data, bounds, start, count) : balanced(data, bounds, start, count))) return false;
  for (let i = 0; i < n; i++) out.push(values[i]);
  return true;
}

/**
 * {@link balanced} for an ASCII batch, given its text (`[`, the rows, `]`): a row that is
 * `{...}` with no other brace in it, in a batch with no square bracket but the outer pair,
 * balances without a scan: its first byte is outside any string (it follows a separator) and so
 * is its last (a string open there would run into the next separator's newline, and the batch
 * parsed). Two searches per row instead of a loop over its bytes; other rows are scanned.
 */
function balancedObjects(text: string, data: Buffer, bounds: Uint32Array, start: number, count: number): boolean {
  if (text.indexOf("[", 1) !== -1 || text.indexOf("]") !== text.length - 1) return balanced(data, bounds, start, count);
  const shift = 1 - bounds[2 * start]; // a row's offset in `text`
  for (let i = start; i < count; i++) {
    const a = bounds[2 * i] + shift;
    const b = bounds[2 * i + 1] + shift;
    if (b - a >= 2 && text.charCodeAt(a) === 0x7b && text.charCodeAt(b - 1) === 0x7d) {
      const open = text.indexOf("{", a + 1);
      if ((open === -1 || open >= b) && text.indexOf("}", a) === b - 1) continue;
    }
    if (!balanced(data, bounds, i, i + 1)) return false;
  }
  return true;
}

/**
 * Whether each row of `[from, to)` has its brackets balanced outside its strings. With the batch parsed whole, that
 * puts every separator at the batch's top level, so with one element per row each row is
 * exactly one value. Strings end inside their row (a separator's newline cannot be in one).
 */
function balanced(data: Buffer, bounds: Uint32Array, from: number, to: number): boolean {
  for (let i = from; i < to; i++) {
    let q = bounds[2 * i];
    const end = bounds[2 * i + 1];
    let depth = 0;
    while (q < end) {
      const c = data[q++];
      if (c === 0x22) {
        // a string: to its closing quote, escapes skipped
        while (q < end) {
          const d = data[q++];
          if (d === 0x22) break;
          if (d === 0x5c) q++;
        }
      } else if (c === 0x7b || c === 0x5b) depth++;
      else if (c === 0x7d || c === 0x5d) depth--;
    }
    if (depth !== 0) return false;
  }
  return true;
}

function replaceBigint(_key: string, value: unknown): unknown {
  return typeof value === "bigint" ? MARK + value.toString() : value;
}

/** JSON text of `value`; a `bigint` is written as an integer literal. */
export function stringifyJson(value: unknown): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    if (!(e instanceof TypeError) || !/BigInt/i.test(e.message)) throw e;
    text = JSON.stringify(value, replaceBigint).replace(PLACEHOLDER, "$1");
  }
  // JSON.stringify(undefined) is undefined: a handler that returns nothing answers null.
  return text ?? "null";
}
