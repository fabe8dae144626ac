// Shared by the tests: the spec's vector files, and frames/events to and from their JSON objects.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import {
  FRAME_TYPE_RULES,
  FrameType,
  MethodKind,
  type ConnectionEvent,
  type Frame,
  type FrameInit,
  EventType,
  FrameDecoder,
  ProtocolError,
} from "../src/proto/index.js";

/** The repository root (tests run from build/test/, sources live in test/). */
export const REPO = (() => {
  let d = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    try {
      readFileSync(join(d, "spec", "constants.json"));
      return d;
    } catch {
      d = dirname(d);
    }
  }
  throw new Error("spec/constants.json not found above " + fileURLToPath(import.meta.url));
})();

export type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any

export function loadVectors(name: string): Json[] {
  return JSON.parse(readFileSync(join(REPO, "spec", "vectors", name), "utf8")).cases;
}

const TYPE_CODE = new Map<string, number>([...FRAME_TYPE_RULES.values()].map((r) => [r.name, r.code]));
const TYPE_NAME = new Map<number, string>([...FRAME_TYPE_RULES.values()].map((r) => [r.code, r.name]));
const KIND = { unary: MethodKind.UNARY, stream: MethodKind.STREAM } as const;
const KIND_NAME = new Map<number, string>([[MethodKind.UNARY, "unary"], [MethodKind.STREAM, "stream"]]);

export function typeName(code: number): string {
  return TYPE_NAME.get(code) ?? `?${code}`;
}

const h = (s: string) => Buffer.from(s, "hex");
const hx = (b: Uint8Array) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("hex");

/** A vector FRAME object as a frame to encode. */
export function frameFromJson(o: Json): FrameInit {
  const type = TYPE_CODE.get(o.type);
  if (type === undefined) throw new Error(`unknown type ${o.type}`);
  const base = { id: o.id as number, more: Boolean(o.more) };
  switch (type) {
    case FrameType.HELLO:
      return { ...base, type, minVersion: o.min_version, maxVersion: o.max_version, pid: o.pid, maxConcurrency: o.max_concurrency, maxFrameSize: o.max_frame_size, sdkName: o.sdk_name, sdkVersion: o.sdk_version, methods: o.methods.map((m: Json) => ({ name: m.name, kind: KIND[m.kind as "unary" | "stream"], codecs: m.codecs })) };
    case FrameType.WELCOME:
      return { ...base, type, version: o.version, workerId: o.worker_id, maxFrameSize: o.max_frame_size, initialCredit: o.initial_credit, heartbeatMs: o.heartbeat_ms, maxInFlight: o.max_in_flight, maxMessageSize: o.max_message_size };
    case FrameType.REQUEST:
      return { ...base, type, method: o.method, codec: o.codec, timeoutUs: o.timeout_us, body: h(o.body) };
    case FrameType.CANCEL:
      return { ...base, type };
    case FrameType.RESULT:
      return { ...base, type, body: h(o.body) };
    case FrameType.ERROR:
      return { ...base, type, code: o.code, message: o.message, details: o.details };
    case FrameType.ROWS:
      return { ...base, type, rows: o.rows.map(h) };
    case FrameType.END:
      return { ...base, type, rowCount: o.row_count, summary: h(o.summary) };
    case FrameType.CREDIT:
      return { ...base, type, bytes: o.bytes };
    case FrameType.EVENT:
      return { ...base, type, topic: o.topic, data: o.data };
    case FrameType.PING:
      return { ...base, type, nonce: h(o.nonce) };
    case FrameType.PONG:
      return { ...base, type, nonce: h(o.nonce) };
    case FrameType.DRAIN:
      return { ...base, type, graceMs: o.grace_ms };
    case FrameType.GOODBYE:
      return { ...base, type, reason: o.reason };
    case FrameType.CONTINUATION:
      return { ...base, type, body: h(o.body) };
  }
  throw new Error(`unhandled type ${o.type}`);
}

/** A frame or a core event as the vectors' JSON object (`more` only on frames). */
export function toJson(f: Frame | ConnectionEvent, withMore = true): Json {
  if (f.type === EventType.LATE) return { type: "LATE", id: f.id, frame: typeName(f.frame) };
  if (f.type === EventType.REJECT) return { type: "REJECT", id: f.id, code: f.code, name: f.name };
  const o: Json = { type: typeName(f.type), id: f.id };
  if (withMore) o.more = (f as Frame).more;
  switch (f.type) {
    case FrameType.HELLO:
      Object.assign(o, { min_version: f.minVersion, max_version: f.maxVersion, pid: f.pid, max_concurrency: f.maxConcurrency, max_frame_size: f.maxFrameSize, sdk_name: f.sdkName, sdk_version: f.sdkVersion, methods: f.methods.map((m) => ({ name: m.name, kind: KIND_NAME.get(m.kind), codecs: [...m.codecs] })) });
      break;
    case FrameType.WELCOME:
      Object.assign(o, { version: f.version, worker_id: f.workerId, max_frame_size: f.maxFrameSize, initial_credit: f.initialCredit, heartbeat_ms: f.heartbeatMs, max_in_flight: f.maxInFlight, max_message_size: f.maxMessageSize });
      break;
    case FrameType.REQUEST:
      Object.assign(o, { method: f.method, codec: f.codec, timeout_us: f.timeoutUs, body: hx(f.body) });
      break;
    case FrameType.RESULT:
    case FrameType.CONTINUATION:
      o.body = hx(f.body);
      break;
    case FrameType.ERROR:
      Object.assign(o, { code: f.code, message: f.message, details: f.details });
      break;
    case FrameType.ROWS:
      o.rows = f.rows.map(hx);
      break;
    case FrameType.END:
      Object.assign(o, { row_count: f.rowCount, summary: hx(f.summary) });
      break;
    case FrameType.CREDIT:
      o.bytes = f.bytes;
      break;
    case FrameType.EVENT:
      Object.assign(o, { topic: f.topic, data: f.data });
      break;
    case FrameType.PING:
    case FrameType.PONG:
      o.nonce = hx(f.nonce);
      break;
    case FrameType.DRAIN:
      o.grace_ms = f.graceMs;
      break;
    case FrameType.GOODBYE:
      o.reason = f.reason;
      break;
  }
  return o;
}

/** Offsets where frames start in `data` (and its end), reading each header's length. */
export function frameBoundaries(data: Buffer): number[] {
  const out = [0];
  let p = 0;
  while (p + 16 <= data.length) {
    p += 16 + data.readUInt32LE(p);
    out.push(Math.min(p, data.length));
  }
  return out;
}

/**
 * The split rule of PROTOCOL.md section 16: whole, two chunks at every position, one byte at a
 * time; above 4096 bytes, two chunks at every position within 32 bytes of a frame boundary plus
 * every 997th position, and no byte-at-a-time run.
 */
export function* chunkings(data: Buffer): Generator<[string, Buffer[]]> {
  yield ["whole", [data]];
  let cuts: number[];
  if (data.length <= 4096) {
    cuts = [];
    for (let i = 1; i < data.length; i++) cuts.push(i);
    if (data.length > 1) {
      const bytes: Buffer[] = [];
      for (let i = 0; i < data.length; i++) bytes.push(data.subarray(i, i + 1));
      yield ["bytewise", bytes];
    }
  } else {
    const set = new Set<number>();
    for (const b of frameBoundaries(data)) for (let i = b - 32; i <= b + 32; i++) if (i > 0 && i < data.length) set.add(i);
    for (let i = 1; i < data.length; i += 997) set.add(i);
    cuts = [...set].sort((a, b) => a - b);
  }
  for (const i of cuts) yield [`split@${i}`, [data.subarray(0, i), data.subarray(i)]];
}

/** Decodes `chunks` fed one after another, then signals end of input: the frames and the error. */
export function decodeAll(chunks: Buffer[], maxFrameSize: number): { frames: Json[]; error: ProtocolError | null } {
  const dec = new FrameDecoder(maxFrameSize);
  const frames: Json[] = [];
  try {
    for (const c of chunks) {
      dec.push(c);
      for (let f = dec.next(); f !== null; f = dec.next()) frames.push(toJson(f));
    }
    dec.end();
  } catch (e) {
    if (!(e instanceof ProtocolError)) throw e;
    return { frames, error: e };
  }
  return { frames, error: null };
}

