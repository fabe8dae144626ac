// A mutation fuzzer for the frame decoder and the connection core, run for a bounded time:
//
//   npm run fuzz -- --seconds 60 [--corpus DIR] [--seed N] [--write-seeds]
//
// Jazzer.js (libFuzzer for Node) would be the first choice, but its prebuilt add-on needs glibc
// 2.38, newer than this project's machines have; so this is a plain random-mutation fuzzer
// without coverage feedback: it keeps inputs whose outcome (frames or events, error code) it has
// not seen before, as a cheap proxy. Each input is checked for (a) nothing but ProtocolError
// thrown, (b) the same frames/events and error whole and under a random chunking.
// A failing input is written to fuzz/artifacts/ (not committed) and the run exits 1.
//
// Input layout for the core target: byte 0 picks the setup (bit 0: worker instead of parent;
// bit 1: after a handshake; bit 2: the parent has sent requests 1 (unary) and 2 (stream); bit 3:
// the parent takes results with takeResults before nextEvent), the
// rest is what the core receives. The decoder target decodes the whole input.
import { createHash } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { CodecId, Connection, FrameDecoder, MethodKind, ProtocolError } from "../src/proto/index.js";

const HERE = dirname(fileURLToPath(import.meta.url));
// Compiled to node/build/fuzz/: the sources (and corpus) are two levels up.
const NODE_DIR = join(HERE, "..", "..");

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const SECONDS = Number(arg("seconds", "60"));
const CORPUS = arg("corpus", join(NODE_DIR, "fuzz", "corpus"));
const MAX_CORPUS = 4096;
const ARTIFACTS = join(NODE_DIR, "fuzz", "artifacts");
let rng = Number(arg("seed", String(Date.now() % 2147483647))) >>> 0 || 1;

/** xorshift32: reproducible runs from --seed. */
function rand(n: number): number {
  rng ^= rng << 13;
  rng >>>= 0;
  rng ^= rng >>> 17;
  rng ^= rng << 5;
  rng >>>= 0;
  return n <= 0 ? 0 : rng % n;
}

const INTERESTING32 = [0, 1, 2, 4, 7, 8, 12, 15, 16, 24, 32, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0x10001, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff];
const TYPES = [0x01, 0x02, 0x10, 0x11, 0x12, 0x13, 0x20, 0x21, 0x22, 0x30, 0x31, 0x32, 0x40, 0x41, 0x7f, 0x00, 0x03, 0xff];

/** Offsets of the frame headers in `b` (after the mode byte), following each header's length. */
function headers(b: Buffer): number[] {
  const out: number[] = [];
  let p = 1;
  while (p + 16 <= b.length && out.length < 64) {
    out.push(p);
    p += 16 + b.readUInt32LE(p);
  }
  return out;
}

/** Structure-aware edits: ids, the first payload field, lengths that fit. */
function mutateFrame(b: Buffer): void {
  const hs = headers(b);
  if (hs.length === 0) return;
  const h = hs[rand(hs.length)];
  switch (rand(4)) {
    case 0:
      b.writeUInt32LE(rand(4), h + 8);
      b.writeUInt32LE(0, h + 12);
      break;
    case 1:
      if (h + 20 <= b.length) b.writeUInt32LE(INTERESTING32[rand(INTERESTING32.length)], h + 16);
      break;
    case 2:
      b.writeUInt32LE(Math.max(0, b.length - h - 16), h);
      break;
    default:
      b[h + 5] = rand(4) === 0 ? rand(256) : rand(2);
      break;
  }
}

function mutate(src: Buffer, corpus: Buffer[]): Buffer {
  let b = Buffer.from(src);
  const rounds = 1 + rand(6);
  for (let r = 0; r < rounds; r++) {
    const p = b.length > 0 ? rand(b.length) : 0;
    switch (rand(12)) {
      case 10:
      case 11:
        mutateFrame(b);
        break;
      case 0:
        if (b.length) b[p] ^= 1 << rand(8);
        break;
      case 1:
        if (b.length) b[p] = rand(256);
        break;
      case 2:
        if (p + 4 <= b.length) b.writeUInt32LE(INTERESTING32[rand(INTERESTING32.length)], p);
        break;
      case 3: {
        const n = 1 + rand(16);
        b = Buffer.concat([b.subarray(0, p), Buffer.alloc(n, rand(256)), b.subarray(p)]);
        break;
      }
      case 4: {
        const n = 1 + rand(16);
        b = Buffer.concat([b.subarray(0, p), b.subarray(Math.min(b.length, p + n))]);
        break;
      }
      case 5: {
        // Repeat a range (frames repeated: duplicate ids, continuations).
        const n = 1 + rand(64);
        b = Buffer.concat([b.subarray(0, p + n), b.subarray(p, p + n), b.subarray(p + n)]);
        break;
      }
      case 6: {
        const other = corpus[rand(corpus.length)];
        const q = rand(other.length + 1);
        b = Buffer.concat([b.subarray(0, p), other.subarray(q)]);
        break;
      }
      case 7:
        b = b.subarray(0, p);
        break;
      case 8:
        // A frame type byte, where a header would have it.
        if (b.length > 5) b[1 + 4 + 16 * rand(Math.max(1, Math.floor((b.length - 5) / 16)))] = TYPES[rand(TYPES.length)];
        break;
      default:
        if (b.length) b[0] = rand(16);
        break;
    }
  }
  return b.length > 1 << 16 ? b.subarray(0, 1 << 16) : b;
}

function chunks(b: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let p = 0;
  while (p < b.length) {
    const n = 1 + rand(Math.min(64, b.length - p));
    out.push(b.subarray(p, p + n));
    p += n;
  }
  return out;
}

/** A summary of what happened: compared between feedings, and new ones are kept. */
function decodeTarget(parts: Buffer[]): string {
  const dec = new FrameDecoder(65536);
  const seen: string[] = [];
  try {
    for (const c of parts) {
      dec.push(c);
      for (let f = dec.next(); f !== null; f = dec.next()) if (seen.length < 24) seen.push(`${f.type}${f.more ? "+" : ""}`);
    }
    dec.end();
    return seen.join(",") + "|ok";
  } catch (e) {
    if (!(e instanceof ProtocolError)) throw e;
    return seen.join(",") + "|" + e.name;
  }
}

function setup(mode: number): Connection {
  const parent = new Connection("parent");
  const worker = new Connection("worker");
  const isWorker = (mode & 1) === 1;
  if ((mode & 2) === 0) {
    if (isWorker) worker.sendHello(HELLO);
    return isWorker ? worker : parent;
  }
  worker.sendHello(HELLO);
  for (const c of worker.takeOutput()) parent.receive(c);
  while (parent.nextEvent() !== null);
  parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize: 65536, initialCredit: 1024, heartbeatMs: 0, maxInFlight: 4, maxMessageSize: 200000 });
  if ((mode & 4) !== 0) {
    parent.sendRequest(0, 0, 0, Buffer.from("a"));
    parent.sendRequest(1, 0, 0, Buffer.from("b"));
  }
  for (const c of parent.takeOutput()) worker.receive(c);
  while (worker.nextEvent() !== null);
  return isWorker ? worker : parent;
}

const HELLO = {
  minVersion: 1, maxVersion: 1, pid: 1, maxConcurrency: 4, maxFrameSize: 65536, sdkName: "fuzz", sdkVersion: "",
  methods: [
    { name: "echo", kind: MethodKind.UNARY, codecs: [CodecId.RAW, CodecId.JSON] },
    { name: "count", kind: MethodKind.STREAM, codecs: [CodecId.RAW] },
  ],
};

function coreTarget(mode: number, parts: Buffer[]): string {
  const conn = setup(mode);
  const seen: string[] = [];
  try {
    const fast = (mode & 8) !== 0; // the parent's takeResults fast path first
    const ids: number[] = [];
    const bodies: Buffer[] = [];
    for (const c of parts) {
      conn.receive(c);
      if (fast) {
        ids.length = bodies.length = 0;
        const n = conn.takeResults(ids, bodies);
        for (let i = 0; i < n && seen.length < 24; i++) seen.push(String(0x12));
      }
      for (let ev = conn.nextEvent(); ev !== null; ev = conn.nextEvent()) {
        if (seen.length < 24) seen.push(String(ev.type));
        // Exercise the typed answers a driver gives; a refusal is fine, anything else is a bug.
        try {
          if (ev.type === 0x101) conn.sendError(ev.id, ev.code, "rejected");
          else if (ev.type === 0x31) conn.sendPong(ev.nonce);
          else if (ev.type === 0x20) conn.consumed(ev.id, ev.payloadLength);
          else if (ev.type === 0x10 && ev.method === 0) conn.sendResult(ev.id, ev.body);
        } catch (e) {
          if (!(e instanceof ProtocolError)) throw e;
          seen.push(`refused:${e.name}`);
        }
      }
    }
    conn.endOfInput();
    conn.takeOutput();
    return seen.join(",") + "|ok";
  } catch (e) {
    if (!(e instanceof ProtocolError)) throw e;
    return seen.join(",") + "|" + e.name;
  }
}

function check(input: Buffer): string {
  const whole = decodeTarget([input]);
  const split = decodeTarget(chunks(input));
  if (whole !== split) throw new Error(`decoder: whole ${whole} != chunked ${split}`);
  const mode = input.length ? input[0] & 15 : 0;
  const body = input.subarray(1);
  const cw = coreTarget(mode, [body]);
  const cs = coreTarget(mode, chunks(body));
  if (cw !== cs) throw new Error(`core (mode ${mode}): whole ${cw} != chunked ${cs}`);
  return `${whole}#${mode}#${cw}`;
}

function loadCorpus(): Buffer[] {
  const out: Buffer[] = [];
  try {
    for (const f of readdirSync(CORPUS).sort()) out.push(readFileSync(join(CORPUS, f)));
  } catch {
    /* no corpus: start from nothing */
  }
  if (out.length === 0) out.push(Buffer.alloc(17));
  return out;
}

/** Writes the seed corpus from the spec's vectors (committed once; a run never writes to it). */
function writeSeeds(): void {
  const repo = join(NODE_DIR, "..");
  mkdirSync(CORPUS, { recursive: true });
  let n = 0;
  const put = (data: Buffer) => {
    const name = createHash("sha1").update(data).digest("hex").slice(0, 16);
    writeFileSync(join(CORPUS, name), data);
    n++;
  };
  const frames = JSON.parse(readFileSync(join(repo, "spec", "vectors", "frames.json"), "utf8")).cases;
  frames.forEach((c: { hex: string; error: unknown }, i: number) => {
    const data = Buffer.from(c.hex, "hex");
    if (data.length > 1024) return;
    put(Buffer.concat([Buffer.from([i % 8]), data]));
    // The same frames for request 2 (a stream in flight) of a parent or a worker with requests.
    if (c.error === null && data.length >= 16) {
      const copy = Buffer.from(data);
      for (let p = 0; p + 16 <= copy.length; p += 16 + copy.readUInt32LE(p)) if (copy.readUInt32LE(p + 8) !== 0) copy.writeUInt32LE(2, p + 8);
      put(Buffer.concat([Buffer.from([6 | (i & 1)]), copy]));
    }
  });
  const sessions = JSON.parse(readFileSync(join(repo, "spec", "vectors", "sessions.json"), "utf8")).cases;
  for (const c of sessions) {
    // The steps after the handshake, received by a core that did its own handshake (mode bit 1).
    const recvs = c.steps.filter((s: { recv?: string }) => s.recv !== undefined).map((s: { recv: string }) => Buffer.from(s.recv, "hex"));
    const data = Buffer.concat(c.role === "parent" ? recvs.slice(1) : recvs.slice(1));
    if (data.length > 0 && data.length <= 2048) put(Buffer.concat([Buffer.from([(c.role === "worker" ? 1 : 0) | 2 | 4]), data]));
  }
  console.log(`fuzz: wrote ${n} seed inputs to ${CORPUS}`);
}

function main(): number {
  if (process.argv.includes("--write-seeds")) {
    writeSeeds();
    return 0;
  }
  const corpus = loadCorpus();
  const seen = new Set<string>();
  const seed = rng;
  let execs = 0;
  const deadline = Date.now() + SECONDS * 1000;
  let input: Buffer = corpus[0];
  try {
    for (const c of corpus) {
      input = c;
      seen.add(check(c));
      execs++;
    }
    while (Date.now() < deadline) {
      for (let i = 0; i < 200; i++) {
        input = mutate(corpus[rand(corpus.length)], corpus);
        const sig = check(input);
        execs++;
        if (!seen.has(sig)) {
          seen.add(sig);
          // New outcomes join the corpus (bounded: a run's memory stays small).
          if (corpus.length < MAX_CORPUS) corpus.push(input);
          else corpus[rand(corpus.length)] = input;
        }
      }
    }
  } catch (e) {
    mkdirSync(ARTIFACTS, { recursive: true });
    const path = join(ARTIFACTS, "crash-" + createHash("sha1").update(input).digest("hex").slice(0, 16));
    writeFileSync(path, input);
    console.error(`fuzz: FAILED after ${execs} inputs (seed ${seed}): ${(e as Error).stack}\ninput written to ${path}`);
    return 1;
  }
  console.log(`fuzz: ${execs} inputs in ${SECONDS} s (seed ${seed}), ${seen.size} distinct outcomes, corpus ${corpus.length} (in memory); no failure`);
  return 0;
}

process.exit(main());
