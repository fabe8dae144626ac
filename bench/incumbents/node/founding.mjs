// The founding workload's row shapes (bench/shapes/founding.json) for every Node runner: the
// shape's field list turned once into a function i -> row (compiled from the data, so making a
// row costs what a hand-written object literal costs). `node founding.mjs lines SHAPE N` prints
// rows 0..N-1 as compact JSON lines (bench/tests/test_founding.py hashes them).
import { readFileSync } from "node:fs";

const SPEC = JSON.parse(readFileSync(new URL("../../shapes/founding.json", import.meta.url), "utf8"));
export const SHAPES = SPEC.shapes;

function payloadTail(f) {
  const want = f.len - 8;
  return f.fill.repeat(Math.ceil(want / f.fill.length) + 1).slice(0, want);
}

function fieldExpr(f) {
  switch (f.kind) {
    case "index": return "i";
    case "int": return `(${Number(f.add)} + i % ${Number(f.mod)})`;
    case "str": return f.index_suffix ? `${JSON.stringify(f.prefix)} + i` : JSON.stringify(f.prefix);
    case "payload": return "String(i % 100000000).padStart(8, '0') + TAIL";
    default: throw new Error(`unknown field kind ${f.kind}`);
  }
}

export function isFounding(shape) {
  return Object.hasOwn(SHAPES, shape);
}

const factories = new Map();

// i -> row of `shape` (throws for an unknown shape).
export function rowFactory(shape) {
  if (!isFounding(shape)) throw new Error(`unknown founding shape ${shape}`);
  if (!factories.has(shape)) {
    const fields = SHAPES[shape].fields;
    const payload = fields.find((f) => f.kind === "payload");
    const body = fields.map((f) => `${JSON.stringify(f.name)}: ${fieldExpr(f)}`).join(", ");
    factories.set(shape, new Function("TAIL", `return (i) => ({ ${body} });`)(payload ? payloadTail(payload) : ""));
  }
  return factories.get(shape);
}

export function indexField(shape) {
  return SHAPES[shape].fields.find((f) => f.kind === "index").name;
}

if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href && process.argv[2] === "lines") {
  const make = rowFactory(process.argv[3]);
  const n = Number(process.argv[4]);
  const out = [];
  for (let i = 0; i < n; i++) out.push(JSON.stringify(make(i)));
  process.stdout.write(out.join("\n") + "\n");
}
