// fast-check arbitraries of valid frames (every rule of PROTOCOL.md section 11.1 kept), shared
// by the property tests and the fuzzer's seed corpus.
import fc from "fast-check";

import { FrameType, MethodKind, type FrameInit } from "../src/proto/index.js";

const u8 = fc.integer({ min: 0, max: 255 });
const u16 = fc.integer({ min: 0, max: 0xffff });
const u32 = fc.integer({ min: 0, max: 0xffffffff });
const u64 = fc.oneof(fc.nat({ max: Number.MAX_SAFE_INTEGER }), fc.constant(0), fc.constant(2 ** 64));
const reqId = fc.oneof(fc.integer({ min: 1, max: 1000 }), fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }));
const anyId = fc.oneof(fc.constant(0), reqId);
const bytes = (max: number) => fc.uint8Array({ maxLength: max }).map((a) => Buffer.from(a));
/** A string of at most `max` UTF-8 bytes and at least `min`. */
const text = (min: number, max: number) =>
  fc.string({ unit: "binary", minLength: min, maxLength: max }).filter((s) => {
    const n = Buffer.byteLength(s);
    return n >= min && n <= max && Buffer.from(s).toString() === s; // lone surrogates do not round-trip
  });
const more = fc.boolean();

const method = fc.record({
  name: text(1, 40),
  kind: fc.constantFrom(MethodKind.UNARY, MethodKind.STREAM),
  codecs: fc.uniqueArray(u8, { minLength: 1, maxLength: 16 }),
});

export const frameArb: fc.Arbitrary<FrameInit> = fc.oneof(
  fc.record({
    type: fc.constant(FrameType.HELLO), id: fc.constant(0), more: fc.constant(false),
    minVersion: fc.integer({ min: 1, max: 3 }), maxVersion: fc.integer({ min: 3, max: 0xffff }), pid: u32,
    maxConcurrency: fc.integer({ min: 1, max: 0xffffffff }), maxFrameSize: fc.integer({ min: 65536, max: 16777216 }),
    sdkName: text(1, 64), sdkVersion: text(0, 64),
    methods: fc.uniqueArray(method, { maxLength: 5, selector: (m) => m.name }),
  }),
  fc.integer({ min: 65536, max: 16777216 }).chain((mfs) =>
    fc.record({
      type: fc.constant(FrameType.WELCOME), id: fc.constant(0), more: fc.constant(false),
      version: u16, workerId: u32, maxFrameSize: fc.constant(mfs),
      initialCredit: fc.integer({ min: 1, max: 2 ** 31 - 1 }), heartbeatMs: u32,
      maxInFlight: fc.integer({ min: 1, max: 0xffffffff }),
      maxMessageSize: fc.integer({ min: mfs, max: Number.MAX_SAFE_INTEGER }),
    }),
  ),
  fc.record({ type: fc.constant(FrameType.REQUEST), id: reqId, more, method: u16, codec: u8, timeoutUs: u64, body: bytes(300) }),
  fc.record({ type: fc.constant(FrameType.CANCEL), id: reqId, more: fc.constant(false) }),
  fc.record({ type: fc.constant(FrameType.RESULT), id: reqId, more, body: bytes(300) }),
  fc.record({ type: fc.constant(FrameType.ERROR), id: anyId, more: fc.constant(false), code: u32, message: text(0, 100), details: text(0, 100) }),
  fc.record({ type: fc.constant(FrameType.ROWS), id: reqId, more: fc.constant(false), rows: fc.array(bytes(40), { minLength: 1, maxLength: 20 }) }),
  fc.record({ type: fc.constant(FrameType.END), id: reqId, more, rowCount: u64, summary: bytes(100) }),
  fc.record({ type: fc.constant(FrameType.CREDIT), id: reqId, more: fc.constant(false), bytes: fc.integer({ min: 1, max: 0xffffffff }) }),
  fc.record({ type: fc.constant(FrameType.EVENT), id: anyId, more: fc.constant(false), topic: text(1, 255), data: text(0, 100) }),
  fc.record({ type: fc.constant(FrameType.PING), id: fc.constant(0), more: fc.constant(false), nonce: fc.uint8Array({ minLength: 8, maxLength: 8 }).map((a) => Buffer.from(a)) }),
  fc.record({ type: fc.constant(FrameType.PONG), id: fc.constant(0), more: fc.constant(false), nonce: fc.uint8Array({ minLength: 8, maxLength: 8 }).map((a) => Buffer.from(a)) }),
  fc.record({ type: fc.constant(FrameType.DRAIN), id: fc.constant(0), more: fc.constant(false), graceMs: u32 }),
  fc.record({ type: fc.constant(FrameType.GOODBYE), id: fc.constant(0), more: fc.constant(false), reason: u32 }),
  fc.record({ type: fc.constant(FrameType.CONTINUATION), id: reqId, more, body: bytes(300) }),
) as fc.Arbitrary<FrameInit>;

/** Cut points for splitting `n` bytes into chunks. */
export const cutsArb = (n: number) => fc.uniqueArray(fc.integer({ min: 1, max: Math.max(1, n - 1) }), { maxLength: 12 }).map((a) => a.sort((x, y) => x - y));

export function splitAt(data: Buffer, cuts: number[]): Buffer[] {
  const out: Buffer[] = [];
  let p = 0;
  for (const c of cuts) {
    if (c <= p || c >= data.length) continue;
    out.push(data.subarray(p, c));
    p = c;
  }
  out.push(data.subarray(p));
  return out;
}
