// A Python worker's result of N bytes to a Node parent (`--method blob`), or an echo of N bytes
// both ways (`--method echo`), through the socket and through the shared-memory lane
// (WIREPOOL_SHM_LANE=1), alternated in one run: ms per call (the parent reads a byte of every
// page of the result, so the lane's lazily mapped view pays its faults).
//
// Run: cd node && npm run build:native && npm run build:test && node build/bench/shm-pool.js [--sizes 64,256] [--rounds 5] [--method blob|echo]
import { existsSync } from "node:fs";
import { join } from "node:path";

import { Pool } from "../src/index.js";
import { REPO } from "../test/vectors.js";

const MiB = 1 << 20;
const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const sizes = arg("--sizes", "64,256").split(",").map((s) => Number(s) * MiB);
const rounds = Number(arg("--rounds", "5"));
const method = arg("--method", "blob");
const VENV = join(REPO, ".venv", "bin", "python");
const PYTHON = existsSync(VENV) ? VENV : "python3";
const WORKER = join(REPO, "node", "test", "fixtures", "shm_worker.py");

function use(b: Buffer): void {
  let sum = 0;
  for (let i = 0; i < b.length; i += 4096) sum += b[i];
  if (sum < 0) throw new Error("unreachable");
}

async function start(lane: boolean): Promise<Pool> {
  process.env.WIREPOOL_SHM_LANE = lane ? "1" : "0";
  return Pool.start({ command: [PYTHON, WORKER], workers: 1, env: { ...process.env, PYTHONPATH: join(REPO, "python") } });
}

const pools = { socket: await start(false), lane: await start(true) };
const ms: Record<string, number[]> = {};
for (const size of sizes) {
  const request = method === "echo" ? Buffer.alloc(size, 7) : Buffer.from(String(size));
  for (const pool of Object.values(pools)) use((await pool.call(method, request, { codec: "raw" })) as Buffer); // warm-up
  for (let i = 0; i < rounds; i++) {
    for (const [name, pool] of Object.entries(pools)) {
      const t0 = performance.now();
      const r = (await pool.call(method, request, { codec: "raw" })) as Buffer;
      use(r);
      (ms[`${size / MiB} MiB ${name}`] ??= []).push(performance.now() - t0);
    }
  }
}
await Promise.all(Object.values(pools).map((p) => p.close()));
console.log(`node ${process.version}, a Python worker's raw ${method === "echo" ? "echo" : "result"}, ${rounds} rounds alternated after a warm-up; ms per call`);
for (const [k, v] of Object.entries(ms)) {
  const s = [...v].sort((a, b) => a - b);
  const med = s[Math.floor(s.length / 2)];
  console.log(`${k.padEnd(16)} min ${s[0].toFixed(1)} med ${med.toFixed(1)} max ${s[s.length - 1].toFixed(1)}`);
}
