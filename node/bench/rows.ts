// A micro-benchmark of the rows hot paths, in process (no sockets), the old way and the new way
// alternated in one run: the parent decoding a ROWS frame's JSON rows (json.decode per row
// against json.decodeRows), and the worker encoding rows into a frame (a Buffer per row and
// RowsBuilder.append against RowsBuilder.appendText and extendText; msgpack append against
// appendWith + encodeInto). Not a test: numbers only.
//
//   npm run build:test && node build/bench/rows.js [--rows N] [--repeats R]
import { type Codec, json, msgpack } from "../src/codecs/index.js";
import { CodecId, Connection, encodeFrames, FrameDecoder, FrameType, MethodKind, type RowsFrame } from "../src/proto/index.js";

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}
const ROWS = arg("rows", 1 << 20);
const REPEATS = arg("repeats", 5);
const FRAME_BYTES = 64 * 1024;

function smallRow(i: number): { i: number; name: string; kind: string } {
  return { i, name: `decl_${i}`, kind: "theorem" };
}

/** ROWS frames of the small rows, about 64 KiB each, decoded by the core (views of one buffer). */
function frames(bigInts: boolean, c: Codec = json): RowsFrame[] {
  const out: RowsFrame[] = [];
  let rows: Buffer[] = [];
  let bytes = 0;
  const flush = (): void => {
    const dec = new FrameDecoder(1 << 20);
    dec.push(encodeFrames([{ type: FrameType.ROWS, id: 1, more: false, rows }]));
    out.push(dec.next() as RowsFrame);
    rows = [];
    bytes = 0;
  };
  for (let i = 0; i < ROWS; i++) {
    const r = c === json
      ? Buffer.from(bigInts && i % 100 === 0 ? `{"i":${i},"big":18446744073709551615}` : JSON.stringify(smallRow(i)))
      : Buffer.from(c.encode(bigInts && i % 100 === 0 ? { i, big: 18446744073709551615n } : smallRow(i)));
    rows.push(r);
    bytes += r.length;
    if (bytes >= FRAME_BYTES) flush();
  }
  if (rows.length > 0) flush();
  return out;
}

function decodePerRow(fs: RowsFrame[], c: Codec = json): number {
  let n = 0;
  for (const f of fs) {
    const out = new Array(f.rows.length);
    for (let i = 0; i < f.rows.length; i++) out[i] = c.decode(f.rows[i]);
    n += out.length;
  }
  return n;
}

function decodeRows(fs: RowsFrame[], c: Codec = json): number {
  let n = 0;
  for (const f of fs) {
    const out: unknown[] = [];
    c.decodeRows!(f, 0, out);
    n += out.length;
  }
  return n;
}

function builder() {
  const worker = new Connection("worker");
  const parent = new Connection("parent");
  worker.sendHello({ minVersion: 1, maxVersion: 1, pid: 1, maxConcurrency: 64, maxFrameSize: 16 << 20, sdkName: "bench", sdkVersion: "",
    methods: [{ name: "rows", kind: MethodKind.STREAM, codecs: [CodecId.JSON] }] });
  for (const c of worker.takeOutput()) parent.receive(c);
  while (parent.nextEvent());
  parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize: 4 << 20, initialCredit: 1 << 30, heartbeatMs: 0, maxInFlight: 64, maxMessageSize: 1 << 30 });
  for (const c of parent.takeOutput()) worker.receive(c);
  while (worker.nextEvent());
  const id = parent.sendRequest(0, CodecId.JSON, 0, Buffer.from("{}"));
  for (const c of parent.takeOutput()) worker.receive(c);
  while (worker.nextEvent());
  return { worker, b: worker.rows(id) };
}

const scratch = Buffer.allocUnsafe(64 * 1024);

function encodeBuffers(): number {
  const { worker, b } = builder();
  for (let i = 0; i < ROWS; i++) {
    const text = json.encodeString!(smallRow(i));
    b.append(scratch.subarray(0, scratch.write(text, 0, "utf8")));
    if (b.payloadLength >= FRAME_BYTES) {
      b.finish();
      worker.takeOutput();
    }
  }
  return ROWS;
}

function encodeText(): number {
  const { worker, b } = builder();
  for (let i = 0; i < ROWS; i++) {
    b.appendText(json.encodeString!(smallRow(i)));
    if (b.payloadLength >= FRAME_BYTES) {
      b.finish();
      worker.takeOutput();
    }
  }
  return ROWS;
}

function packAppend(): number {
  const { worker, b } = builder();
  for (let i = 0; i < ROWS; i++) {
    b.append(msgpack.encode(smallRow(i)));
    if (b.payloadLength >= FRAME_BYTES) {
      b.finish();
      worker.takeOutput();
    }
  }
  return ROWS;
}

/** The worker driver's text path: rows wait as strings and go in 8 KiB at a time (one UTF-8 write each). */
function encodeTexts(): number {
  const { worker, b } = builder();
  const texts: string[] = [];
  let chars = 0;
  const stage = (): void => {
    let k = 0;
    while (k < texts.length) {
      const took = b.extendText(texts, k, FRAME_BYTES);
      k += took;
      if (took === 0 || b.payloadLength >= FRAME_BYTES) {
        b.finish();
        worker.takeOutput();
      }
    }
    texts.length = 0;
    chars = 0;
  };
  for (let i = 0; i < ROWS; i++) {
    const t = json.encodeString!(smallRow(i));
    texts.push(t);
    if ((chars += 4 + t.length) >= 8192) stage();
  }
  stage();
  return ROWS;
}

/** msgpack rows encoded straight into the frame (RowsBuilder.appendWith + msgpack.encodeInto). */
function packInto(): number {
  const { worker, b } = builder();
  let row: unknown;
  const write = (buf: Buffer, start: number): number | Uint8Array => msgpack.encodeInto!(row, buf, start);
  for (let i = 0; i < ROWS; i++) {
    row = smallRow(i);
    b.appendWith(write, 512);
    if (b.payloadLength >= FRAME_BYTES) {
      b.finish();
      worker.takeOutput();
    }
  }
  return ROWS;
}

function packOnly(): number {
  let n = 0;
  for (let i = 0; i < ROWS; i++) n += msgpack.encode(smallRow(i)).length;
  return n > 0 ? ROWS : 0;
}

function stringifyOnly(): number {
  let n = 0;
  for (let i = 0; i < ROWS; i++) n += json.encodeString!(smallRow(i)).length;
  return n > 0 ? ROWS : 0;
}

/** Rows per second of this process's CPU time (user + system): steadier than wall time on a shared machine. */
function rate(f: () => number): number {
  const t0 = process.cpuUsage();
  const n = f();
  const t = process.cpuUsage(t0);
  return n / ((t.user + t.system) / 1e6);
}

const plain = frames(false);
const mixed = frames(true);
// msgpackr caches a DataView on each Buffer it reads: fresh frames for every run, as received.
let packed: RowsFrame[] = [];
let packedMixed: RowsFrame[] = [];
const cases: [string, () => number][] = [
  ["parent decode, json.decode per row", () => decodePerRow(plain)],
  ["parent decode, json.decodeRows", () => decodeRows(plain)],
  ["parent decode 1% u64 rows, per row", () => decodePerRow(mixed)],
  ["parent decode 1% u64 rows, decodeRows", () => decodeRows(mixed)],
  ["parent decode, msgpack.decode per row", () => decodePerRow(packed, msgpack)],
  ["parent decode, msgpack.decodeRows", () => decodeRows(packed, msgpack)],
  ["parent decode msgpack 1% u64, per row", () => decodePerRow(packedMixed, msgpack)],
  ["parent decode msgpack 1% u64, decodeRows", () => decodeRows(packedMixed, msgpack)],
  ["worker encode, stringify only", stringifyOnly],
  ["worker encode msgpack, pack only", packOnly],
  ["worker encode msgpack, pack + append", packAppend],
  ["worker encode msgpack, appendWith(encodeInto)", packInto],
  ["worker encode, Buffer per row + append", encodeBuffers],
  ["worker encode, appendText", encodeText],
  ["worker encode, extendText per 8 KiB", encodeTexts],
];
const results = new Map<string, number[]>(cases.map(([k]) => [k, []]));
for (let r = 0; r < REPEATS; r++) {
  for (const [k, f] of cases) {
    packed = frames(false, msgpack);
    packedMixed = frames(true, msgpack);
    results.get(k)!.push(rate(f));
  }
}
for (const [k, v] of results) {
  v.sort((a, b) => a - b);
  console.log(`${k.padEnd(42)} rows per CPU second min ${(v[0] / 1e6).toFixed(2)}M median ${(v[v.length >> 1] / 1e6).toFixed(2)}M max ${(v[v.length - 1] / 1e6).toFixed(2)}M`);
}
