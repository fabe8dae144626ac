/**
 * How an error message quotes what a caller passed (PROTOCOL.md 22.4): a string cut to at most
 * `quotedMaxChars` (200) characters, saying how long it was; any other value briefly.
 * @internal
 * @module
 */

import { CallerInput } from "../proto/constants.js";

const MAX = CallerInput.quotedMaxChars;

/** `s` as a JSON string literal, cut to 200 characters with its length when longer. */
export function quote(s: string): string {
  if (s.length <= MAX) return JSON.stringify(s);
  return `${JSON.stringify(s.slice(0, MAX))}... (${s.length} characters)`;
}

/** Free text that may hold a caller's string (an OS error naming a path), cut the same way. */
export function cut(text: string): string {
  return text.length <= MAX ? text : `${text.slice(0, MAX)}... (${text.length} characters)`;
}

/** A caller's value of any type, for a message: never long, never throwing. */
export function describe(v: unknown): string {
  switch (typeof v) {
    case "string":
      return `the string ${quote(v)}`;
    case "number":
    case "boolean":
      return String(v);
    case "bigint":
      return cut(`${v}n`);
    case "undefined":
      return "undefined";
    case "symbol":
      return "a symbol";
    case "function":
      return "a function";
    default:
      if (v === null) return "null";
      if (Array.isArray(v)) return `an array of ${v.length}`;
      return `an object (${cut(Object.prototype.toString.call(v))})`;
  }
}
