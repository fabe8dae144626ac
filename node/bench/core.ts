// A micro-benchmark of the sans-IO core, in process (no sockets): the cost the core adds per
// call, against Node's own 'advanced' serialization (v8.serialize/deserialize, what
// child_process.fork uses) doing the same messages in the same run. Not a test: numbers only.
//
//   npm run build:test && node build/bench/core.js [--calls N] [--repeats R]
import { serialize, deserialize } from "node:v8";

import { CodecId, Connection, type ConnectionEvent, FrameType, MethodKind } from "../src/proto/index.js";

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}
const CALLS = arg("calls", 200_000);
const REPEATS = arg("repeats", 5);
const BATCH = 64;

function pair(): { parent: Connection; worker: Connection } {
  const parent = new Connection("parent");
  const worker = new Connection("worker");
  worker.sendHello({ minVersion: 1, maxVersion: 1, pid: 1, maxConcurrency: 64, maxFrameSize: 16777216, sdkName: "bench", sdkVersion: "",
    methods: [{ name: "echo", kind: MethodKind.UNARY, codecs: [CodecId.RAW] }, { name: "rows", kind: MethodKind.STREAM, codecs: [CodecId.RAW] }] });
  for (const c of worker.takeOutput()) parent.receive(c);
  while (parent.nextEvent());
  parent.sendWelcome({ version: 1, workerId: 1, maxFrameSize: 4194304, initialCredit: 1048576, heartbeatMs: 0, maxInFlight: 64, maxMessageSize: 1 << 30 });
  for (const c of parent.takeOutput()) worker.receive(c);
  while (worker.nextEvent());
  return { parent, worker };
}

/** 64-byte echo calls, 64 in flight: parent send, worker receive + reply, parent receive. */
function wirepoolEcho(calls: number): number {
  const { parent, worker } = pair();
  const body = Buffer.alloc(64, 1);
  const bodies = Array.from({ length: BATCH }, () => body);
  const evs: ConnectionEvent[] = [];
  let done = 0;
  const t0 = process.hrtime.bigint();
  while (done < calls) {
    parent.sendRequests(0, CodecId.RAW, bodies);
    worker.receive(Buffer.concat(parent.takeOutput()));
    evs.length = 0;
    worker.nextEvents(evs);
    for (const ev of evs) if (ev.type === FrameType.REQUEST) worker.sendResult(ev.id, ev.body);
    parent.receive(Buffer.concat(worker.takeOutput()));
    evs.length = 0;
    parent.nextEvents(evs);
    done += evs.length;
  }
  return Number(process.hrtime.bigint() - t0) / calls;
}

/** The same messages through v8.serialize/deserialize (child_process 'advanced'). */
function v8Echo(calls: number): number {
  const body = Buffer.alloc(64, 1);
  let done = 0;
  const t0 = process.hrtime.bigint();
  while (done < calls) {
    const reqs: Buffer[] = [];
    for (let i = 0; i < BATCH; i++) reqs.push(serialize({ id: done + i, method: "echo", body }));
    const replies: Buffer[] = [];
    for (const r of reqs) {
      const m = deserialize(r) as { id: number; body: Buffer };
      replies.push(serialize({ id: m.id, body: m.body }));
    }
    for (const r of replies) deserialize(r);
    done += BATCH;
  }
  return Number(process.hrtime.bigint() - t0) / calls;
}

/** The same messages as JSON lines (child_process 'json': JSON.stringify + parse, a 64-char string body). */
function jsonEcho(calls: number): number {
  const body = "x".repeat(64);
  let done = 0;
  const t0 = process.hrtime.bigint();
  while (done < calls) {
    const reqs: string[] = [];
    for (let i = 0; i < BATCH; i++) reqs.push(JSON.stringify({ id: done + i, method: "echo", body }) + "\n");
    const wire = Buffer.from(reqs.join(""));
    const replies: string[] = [];
    for (const line of wire.toString().split("\n")) {
      if (!line) continue;
      const m = JSON.parse(line) as { id: number; body: string };
      replies.push(JSON.stringify({ id: m.id, body: m.body }) + "\n");
    }
    for (const line of Buffer.from(replies.join("")).toString().split("\n")) if (line) JSON.parse(line);
    done += BATCH;
  }
  return Number(process.hrtime.bigint() - t0) / calls;
}

/** Rows: 64-byte rows, 256 per frame, parent side decode + consumed. ns per row. */
function wirepoolRows(rows: number): number {
  const { parent, worker } = pair();
  const id = parent.sendRequest(1, CodecId.RAW, 0, Buffer.alloc(0));
  worker.receive(Buffer.concat(parent.takeOutput()));
  while (worker.nextEvent());
  const row = Buffer.alloc(64, 2);
  let got = 0;
  const t0 = process.hrtime.bigint();
  const b = worker.rows(id); // one builder per stream, reused frame after frame
  while (got < rows) {
    for (let i = 0; i < 256; i++) b.append(row);
    b.finish();
    parent.receive(Buffer.concat(worker.takeOutput()));
    for (let ev = parent.nextEvent(); ev; ev = parent.nextEvent()) {
      if (ev.type === FrameType.ROWS) {
        got += ev.rows.length;
        parent.consumed(id, ev.payloadLength);
      }
    }
    const grant = parent.takeOutput();
    if (grant.length) {
      worker.receive(Buffer.concat(grant));
      while (worker.nextEvent());
    }
  }
  return Number(process.hrtime.bigint() - t0) / rows;
}

function stats(xs: number[]): string {
  const s = [...xs].sort((a, b) => a - b);
  return `min ${s[0].toFixed(0)} median ${s[Math.floor(s.length / 2)].toFixed(0)} max ${s[s.length - 1].toFixed(0)}`;
}

const w: number[] = [];
const v: number[] = [];
const j: number[] = [];
const r: number[] = [];
wirepoolEcho(CALLS / 4); // warm-up
v8Echo(CALLS / 4);
for (let i = 0; i < REPEATS; i++) {
  // Alternated, so drift on a noisy machine hits both alike.
  w.push(wirepoolEcho(CALLS));
  v.push(v8Echo(CALLS));
  j.push(jsonEcho(CALLS));
  r.push(wirepoolRows(CALLS * 4));
}
console.log(`echo 64 B, 64 in flight, ns per call: wirepool core ${stats(w)}; v8 serialize ${stats(v)}; JSON lines ${stats(j)}`);
console.log(`speed-up per repeat (x100): over v8 ${stats(w.map((x, i) => (100 * v[i]) / x))}; over JSON ${stats(w.map((x, i) => (100 * j[i]) / x))}`);
console.log(`rows 64 B, 256 per frame, ns per row (worker build + parent decode + credit): ${stats(r)}`);
