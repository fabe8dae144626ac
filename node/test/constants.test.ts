// The Node SDK's constants against spec/constants.json (PROTOCOL.md sections 17-18): the
// generated file is what the generator makes of today's JSON, and its values are the JSON's.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import {
  AdaptiveCredit,
  CodecId,
  Connection,
  Driver,
  ERROR_CLASSES,
  ErrorCode,
  errorClass,
  errorFate,
  errorName,
  FLAG_MORE,
  FLAGS_RESERVED_MASK,
  FRAME_TYPE_RULES,
  FrameType,
  GoodbyeReason,
  HEADER_SIZE,
  Limits,
  MAGIC,
  MethodKind,
  PARENT_DEFAULTS,
  PROTOCOL_VERSION,
  ProtocolDefaults,
  Remote,
  RowsBuilder,
  Timing,
  WORKER_DEFAULTS,
} from "../src/proto/index.js";
import { REPO, type Json } from "./vectors.js";

const C: Json = JSON.parse(readFileSync(join(REPO, "spec", "constants.json"), "utf8"));
const camel = (s: string) => s.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());

describe("constants", () => {
  it("constants.ts is what scripts/gen-constants.mjs makes of spec/constants.json", async () => {
    const gen = await import(join(REPO, "node", "scripts", "gen-constants.mjs"));
    const expected = gen.generate(readFileSync(join(REPO, "spec", "constants.json"), "utf8"));
    const actual = readFileSync(join(REPO, "node", "src", "proto", "constants.ts"), "utf8");
    assert.equal(actual, expected, "run `npm run gen-constants` in node/");
  });

  it("header, flags, magic, version", () => {
    assert.equal(PROTOCOL_VERSION, C.protocol_version);
    assert.equal(MAGIC, C.magic);
    assert.equal(HEADER_SIZE, C.header.size);
    assert.equal(FLAG_MORE, C.flags.MORE);
    assert.equal(FLAGS_RESERVED_MASK, C.flags.reserved_mask);
  });

  it("frame types and their rules", () => {
    assert.deepEqual(Object.fromEntries(Object.entries(FrameType)), Object.fromEntries(C.frame_types.map((t: Json) => [t.name, t.code])));
    assert.equal(FRAME_TYPE_RULES.size, C.frame_types.length);
    for (const t of C.frame_types) {
      const r = FRAME_TYPE_RULES.get(t.code)!;
      assert.deepEqual(
        [r.name, r.direction, r.id, r.moreAllowed, r.continuedPrefix, r.payloadSize],
        [t.name, t.direction, t.id, t.more_allowed, t.continued_prefix, t.payload_size],
        t.name,
      );
    }
  });

  it("error codes, names, classes and fates", () => {
    assert.deepEqual(Object.fromEntries(Object.entries(ErrorCode)), Object.fromEntries(C.error_codes.map((e: Json) => [e.name, e.code])));
    for (const e of C.error_codes) {
      assert.equal(errorName(e.code), e.name);
      assert.equal(errorClass(e.code), e.class, e.name);
      assert.equal(errorFate(e.code), e.fate, e.name);
    }
    assert.deepEqual(ERROR_CLASSES, C.error_classes);
    // Unknown codes are classified by range (section 3).
    assert.equal(errorName(199), "PROTOCOL");
    assert.equal(errorName(4242), "APPLICATION");
    assert.equal(errorFate(150), "connection_closed");
    assert.equal(errorFate(299), "request_ends");
  });

  it("codecs, kinds, goodbye reasons", () => {
    assert.deepEqual(Object.fromEntries(Object.entries(CodecId)), Object.fromEntries(C.codecs.map((k: Json) => [k.name.toUpperCase(), k.id])));
    assert.deepEqual(MethodKind, { UNARY: C.method_kinds.unary, STREAM: C.method_kinds.stream });
    assert.deepEqual(GoodbyeReason, Object.fromEntries(Object.entries(C.goodbye_reasons).map(([k, v]) => [k.toUpperCase(), v])));
  });

  it("limits, timing and protocol defaults", () => {
    assert.deepEqual(Limits, Object.fromEntries(Object.entries(C.limits).map(([k, v]) => [camel(k), v])));
    assert.deepEqual(Timing, Object.fromEntries(Object.entries(C.timing).map(([k, v]) => [camel(k), v])));
    assert.deepEqual(ProtocolDefaults, Object.fromEntries(Object.entries(C.protocol_defaults).map(([k, v]) => [camel(k), v])));
  });

  it("SDK defaults (section 17): every row for all languages or node", () => {
    for (const [side, ours] of [["parent", PARENT_DEFAULTS], ["worker", WORKER_DEFAULTS]] as const) {
      const rows = C.sdk_defaults.filter((r: Json) => r.side === side && (r.language === "all" || r.language === "node"));
      assert.equal(Object.keys(ours).length, rows.length, side);
      const values = Object.values(ours);
      rows.forEach((r: Json, i: number) => assert.equal(values[i], r.value, `${side} ${r.name}`));
    }
  });
});

describe("the core API of PROTOCOL.md section 14 (constants.json core_api)", () => {
  const camel = (s: string) => s.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
  const offers = (cls: { prototype: object }, name: string) =>
    typeof (cls.prototype as Record<string, unknown>)[camel(name)] === "function";

  it("the core offers every operation by its camelCase name", () => {
    const api = C.core_api;
    const required: string[] = [...api.receiving, ...api.sending, ...api.queries, "received"];
    assert.deepEqual(required.filter((n) => !offers(Connection, n)), []);
    assert.deepEqual((api.rows_builder as string[]).filter((n) => !offers(RowsBuilder, n)), []);
  });

  it("remote workers (section 21)", () => {
    const r = C.remote;
    assert.deepEqual(
      [Remote.ticketPrefix, Remote.ticketMaxChars, [...Remote.ticketFields], Remote.alpn, Remote.joinMagic, Remote.joinVersion, Remote.joinBytes],
      [r.ticket_prefix, r.ticket_max_chars, r.ticket_fields, r.alpn, r.join_magic, r.join_version, r.join_bytes],
    );
    assert.equal(r.join_fields.reduce((n: number, f: [string, number]) => n + f[1], 0), Remote.joinBytes);
    for (const [k, v] of Object.entries(r.sdk_defaults)) assert.equal((Remote as Record<string, unknown>)[camel(k)], v, k);
  });

  it("the driver's handed-ahead bound (section 8.5)", () => {
    const d = C.driver;
    assert.equal(Driver.maxHandedAheadBytes, 4_194_304);
    for (const [k, v] of Object.entries(d)) if (k !== "about") assert.equal((Driver as Record<string, unknown>)[camel(k)], v, k);
    assert.deepEqual(Object.keys(Driver).sort(), Object.keys(d).filter((k) => k !== "about").map(camel).sort());
  });

  it("the adaptive window's constants (section 6, adaptive_credit)", () => {
    const a = C.adaptive_credit;
    const keys = Object.keys(a).filter((k) => k !== "about" && k !== "reasons");
    for (const k of keys) assert.equal((AdaptiveCredit as Record<string, unknown>)[camel(k)], a[k], k);
    assert.deepEqual(Object.keys(AdaptiveCredit).sort(), keys.map(camel).sort());
    assert.equal(AdaptiveCredit.maxStreamWindow, 16_777_216);
  });
});
