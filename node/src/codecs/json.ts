/**
 * JSON with exact integers: JavaScript numbers hold integers exactly only up to 2^53 - 1, while
 * the other SDKs send u64 and i64 values (PROTOCOL.md section 7 leaves the value model to the
 * codec). An integer literal outside the safe range decodes to a `bigint`, and a `bigint`
 * encodes as a bare integer literal, so such values round-trip byte for byte. The common case
 * (no literal of 16 digits or more, no bigint) costs one `JSON.parse` / `JSON.stringify`.
 * @module
 */

import { isAscii } from "node:buffer";

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

/**
 * Parses each row (JSON text as UTF-8) of `rows[start..]` into `out`, in order: the same values
 * as {@link parseJson} on each row. Rows that are views of one buffer in order (a ROWS frame's)
 * are read as one Latin-1 string of the span when it is all ASCII (then Latin-1 is UTF-8), and
 * scanned once for runs of 16+ digits (what {@link parseJson} tests per row). A row clear of
 * them is `JSON.parse` of a slice of that string: no UTF-8 decoding and no regex of its own.
 * Every row is still parsed alone, so a row that is not one JSON value fails by itself.
 * @throws the first bad row's parse error; `out` then holds the values of the rows before it.
 */
export function parseJsonRows(rows: readonly Buffer[], start: number, out: unknown[]): void {
  const n = rows.length;
  if (n - start < ROWS_SCAN_MIN) {
    for (let i = start; i < n; i++) out.push(parseJson(rows[i].toString("utf8")));
    return;
  }
  const first = rows[start];
  const last = rows[n - 1];
  const base = first.byteOffset;
  const span = last.byteOffset + last.length - base;
  const whole = span >= 0 && first.buffer === last.buffer ? Buffer.from(first.buffer, base, span) : null;
  if (whole === null || !isAscii(whole)) {
    for (let i = start; i < n; i++) out.push(parseJson(rows[i].toString("utf8")));
    return;
  }
  const text = whole.toString("latin1");
  // A row overlapping a long run takes the exact path. The bytes between rows (length
  // prefixes) may extend a run: that only sends a neighbour down the exact path too.
  const runs = longDigitRuns(whole);
  let k = 0;
  let runFrom = runs.length > 0 ? runs[0] : Infinity;
  let runTo = runs.length > 0 ? runs[1] : Infinity;
  let prevEnd = 0;
  for (let i = start; i < n; i++) {
    const r = rows[i];
    const a = r.byteOffset - base;
    const b = a + r.length;
    if (a < prevEnd || b > span || r.buffer !== first.buffer) {
      // not a view inside the span after the previous row: no slice of `text` is known to be it
      out.push(parseJson(r.toString("utf8")));
      continue;
    }
    prevEnd = b;
    while (runTo <= a) {
      k += 2;
      runFrom = k < runs.length ? runs[k] : Infinity;
      runTo = k < runs.length ? runs[k + 1] : Infinity;
    }
    out.push(runFrom < b ? parseJson(r.toString("utf8")) : JSON.parse(text.slice(a, b)));
  }
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
