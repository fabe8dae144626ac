// The codec alone on the founding rows, Node (runner `codec_node`): per repeat every row of the
// scenario encoded and decoded back into an object with node/'s own codecs (`codec(name)` of
// node/dist: JSON, msgpackr, cbor-x), one row at a time, in one process; passes repeat until the
// scenario's window has passed. Figures: rows_per_s (encode + decode), encode_rows_per_s,
// decode_rows_per_s. Usage: node codec_node.mjs '<scenario json>'
import { existsSync } from "node:fs";
import { figure, loadScenario, ok, peakRssKib, unsupported } from "../incumbents/node/common.mjs";
import { indexField, isFounding, rowFactory } from "../incumbents/node/founding.mjs";

const RUNNER = "codec_node";
const DIST = new URL("../../node/dist/index.js", import.meta.url);

function measure(rows, c, key, window) {
  let both = 0, enc = 0, dec = 0, nBoth = 0, nEnc = 0, nDec = 0;
  const start = performance.now();
  while (nBoth === 0 || performance.now() - start < window * 1000) {
    let t = performance.now();
    for (const row of rows) if (c.decode(c.encode(row))[key] !== row[key]) throw new Error("round trip changed the row");
    both += performance.now() - t;
    nBoth += rows.length;
    t = performance.now();
    const encoded = rows.map((row) => c.encode(row));
    enc += performance.now() - t;
    nEnc += rows.length;
    t = performance.now();
    for (let k = 0; k < rows.length; k++) if (c.decode(encoded[k])[key] !== rows[k][key]) throw new Error("decode changed the row");
    dec += performance.now() - t;
    nDec += rows.length;
  }
  return [nBoth / (both / 1000), nEnc / (enc / 1000), nDec / (dec / 1000)];
}

async function main() {
  const sc = loadScenario();
  if (!isFounding(sc.shape)) return unsupported(RUNNER, sc, "the codec alone is measured on the founding shapes only");
  if (!existsSync(DIST)) return unsupported(RUNNER, sc, "node/dist is not built (bench/runners/wirepool_node.mjs --prepare)");
  const { codec } = await import(DIST.href);
  let c;
  try {
    c = codec(sc.codec ?? "json");
  } catch (e) {
    return unsupported(RUNNER, sc, String(e));
  }
  const make = rowFactory(sc.shape);
  const rows = Array.from({ length: sc.n }, (_, i) => make(i));
  const key = indexField(sc.shape);
  const out = [[], [], []];
  for (let r = 0; r < sc.repeats; r++) measure(rows, c, key, sc.duration_s ?? 0.1).forEach((v, k) => out[k].push(v));
  ok(RUNNER, sc, [figure("rows_per_s", "rows/s", out[0]), figure("encode_rows_per_s", "rows/s", out[1]),
    figure("decode_rows_per_s", "rows/s", out[2])], peakRssKib(), null,
  `node/dist codec('${sc.codec ?? "json"}') encode + decode into an object, one row at a time, one process; encode and decode alone beside`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
