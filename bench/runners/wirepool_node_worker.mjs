// The Node worker of the wirepool benchmark runners (node/'s worker SDK, built in node/dist by
// wirepool_node.mjs --prepare). Same methods as the Rust and Python bench workers: `echo` and
// `oneway` (raw), `rows` (json, msgpack or cbor: {"shape", "n"} -> the rows of bench/README.md,
// one yielded at a time; also the founding shapes of bench/shapes/founding.json), `raw_rows` (raw: b"N" -> the small rows' JSON text as bytes), `spin`
// (JSON: burn `us` of CPU time) and `mark` (raw: a phase boundary, answered empty).
// Started by a wirepool parent (it needs WIREPOOL_FD).
import { makeRow, spinCpu } from "../incumbents/node/common.mjs";
import { isFounding, rowFactory } from "../incumbents/node/founding.mjs";

const { Worker } = await import(new URL("../../node/dist/index.js", import.meta.url).href);

const w = new Worker({ maxConcurrency: 256 });
w.method("echo", (body) => body, { codecs: ["raw"] });
w.method("oneway", (body) => {
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(BigInt(body.length));
  return out;
}, { codecs: ["raw"] });
w.stream("rows", function* (req) {
  const n = Number(req.n);
  if (isFounding(req.shape)) {
    // The founding workload (bench/shapes/founding.json): one row made and yielded at a time.
    const make = rowFactory(req.shape);
    for (let i = 0; i < n; i++) yield make(i);
    return;
  }
  for (let i = 0; i < n; i++) yield makeRow(i, req.shape);
}, { codecs: ["json", "msgpack", "cbor"] });
w.stream("raw_rows", function* (req) {
  const n = Number(req.toString("latin1"));
  for (let i = 0; i < n; i++) yield Buffer.from(`{"i":${i},"name":"decl_${i}","kind":"theorem"}`, "latin1");
}, { codecs: ["raw"] });
w.method("spin", (us) => {
  spinCpu(Number(us));
  return us;
}, { codecs: ["json"] });
w.method("mark", () => Buffer.alloc(0), { codecs: ["raw"] });
await w.serve();
