/**
 * JSON with exact integers: JavaScript numbers hold integers exactly only up to 2^53 - 1, while
 * the other SDKs send u64 and i64 values (PROTOCOL.md section 7 leaves the value model to the
 * codec). An integer literal outside the safe range decodes to a `bigint`, and a `bigint`
 * encodes as a bare integer literal, so such values round-trip byte for byte. The common case
 * (no literal of 16 digits or more, no bigint) costs one `JSON.parse` / `JSON.stringify`.
 * @module
 */

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
