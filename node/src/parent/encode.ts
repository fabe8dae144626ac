/**
 * A request's body from the caller's value (PROTOCOL.md 22.4): a value the call's codec cannot
 * carry faithfully is BAD_REQUEST (202), raised before anything is sent, never sent as `null`
 * or `{}`. JSON.stringify drops or nulls functions, symbols and `undefined`, writes a Map, a Set
 * or a class instance as `{}` and a Buffer as `{type, data}`; msgpackr writes a function as an
 * extension and a class instance as `{}`. The shipped JSON, MessagePack and CBOR codecs are
 * encoded first (a cycle or an integer they cannot hold fails there), then the value is walked
 * once for what they would write in silence. Custom codecs decide for themselves; their throws
 * become BAD_REQUEST too. An omitted request (`undefined` at the top) is `null`, as Python's
 * default None; `undefined` inside an object or an array stays BAD_REQUEST.
 * @internal
 * @module
 */

import { cbor, type Codec, json, msgpack } from "../codecs/index.js";
import { ErrorCode } from "../proto/constants.js";
import { wirepoolError, type WirepoolError } from "./errors.js";
import { cut } from "./quote.js";

const I64_MIN = -(2n ** 63n);
const U64_MAX = 2n ** 64n - 1n;

/** Nesting the walk follows (the codecs have already refused cycles; this bounds the rest). */
const DEPTH_MAX = 1000;

/** The body of `value` with `codec`. @throws WirepoolError BAD_REQUEST (202). */
export function encodeRequest(codec: Codec, value: unknown): Uint8Array {
  // An omitted request (undefined at the top: `pool.call("whoami")`) is null, as Python's
  // default None; undefined inside a value is still refused (the walk below).
  if (value === undefined) value = null;
  let body: Uint8Array;
  try {
    body = codec.encode(value);
  } catch (e) {
    throw badRequest(codec, cut(String((e as Error)?.message ?? e)), e);
  }
  const binary = codec === msgpack || codec === cbor;
  if (codec === json || binary) {
    const why = offence(value, !binary, 0);
    if (why !== null) throw badRequest(codec, why);
  }
  return body;
}

function badRequest(codec: Codec, why: string, cause?: unknown): WirepoolError {
  return wirepoolError(ErrorCode.BAD_REQUEST, `the request cannot be encoded with codec ${codec.name}: ${why}`, { cause });
}

/** What in `v` the codec would not carry as it is (null: nothing). */
function offence(v: unknown, isJson: boolean, depth: number): string | null {
  switch (typeof v) {
    case "string":
    case "number":
    case "boolean":
      return null;
    case "bigint":
      return v < I64_MIN || v > U64_MAX ? "an integer outside the 64-bit range" : null;
    case "object":
      return v === null ? null : objectOffence(v, isJson, depth);
    default:
      return `${typeof v === "undefined" ? "undefined" : `a ${typeof v}`} (no codec form)`;
  }
}

function objectOffence(v: object, isJson: boolean, depth: number): string | null {
  if (depth >= DEPTH_MAX) return `nesting deeper than ${DEPTH_MAX}`;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const why = offence(v[i], isJson, depth + 1);
      if (why !== null) return why;
    }
    return null;
  }
  const proto = Object.getPrototypeOf(v);
  if (proto === Object.prototype || proto === null) {
    for (const k in v) {
      const why = offence((v as Record<string, unknown>)[k], isJson, depth + 1);
      if (why !== null) return why;
    }
    return null;
  }
  if (ArrayBuffer.isView(v) || v instanceof ArrayBuffer) return isJson ? "bytes (JSON has no bytes: use msgpack, cbor or raw)" : null;
  if (v instanceof Date) return null;
  if (v instanceof Map) return isJson ? "a Map (JSON objects have string keys: use a plain object)" : mapOffence(v, depth);
  // A JSON value of its own choosing (toJSON), as JSON.stringify writes it.
  if (isJson && typeof (v as { toJSON?: unknown }).toJSON === "function") return null;
  return `an object of class ${cut(String(proto?.constructor?.name ?? "?"))} (no codec type)`;
}

function mapOffence(m: Map<unknown, unknown>, depth: number): string | null {
  for (const [k, x] of m) {
    const why = offence(k, false, depth + 1) ?? offence(x, false, depth + 1);
    if (why !== null) return why;
  }
  return null;
}
