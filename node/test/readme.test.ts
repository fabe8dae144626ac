// Every code block of node/README.md, and the Node blocks of the top README's taste section,
// holds when copied (issue 28). Each ```ts / ```js / ```sh block is in BLOCKS by its first
// line: run as a program in a scratch folder of its own, where `wirepool` is this package (a
// node_modules link to node/, so its dist/ and its exports, as an installed package), .ts
// compiled by this package's tsc (strict, NodeNext) and run with node; served as a worker
// under a pool this test starts; or listed with the reason it cannot run alone. A block that
// is not in BLOCKS fails the first test, so none is skipped silently. A program must exit 0
// with nothing on stderr; each step is bounded and killed (SIGKILL) past its bound.
//
//   cd node && npm run build && npm run build:test && node --test build/test/readme.test.js

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Pool, RequestError } from "../src/index.js";

const NODE_DIR = fileURLToPath(new URL("../../", import.meta.url)); // from build/test/
const REPO = join(NODE_DIR, "..");
const FIXTURES = join(NODE_DIR, "test", "fixtures");
const TSC = join(NODE_DIR, "node_modules", ".bin", "tsc");
const STEP_MS = 90_000;
// `python3 worker.py` finds the repository's venv (wirepool installed) first, as a reader's
// activated venv would.
const VENV_BIN = join(REPO, ".venv", "bin");
const ENV: NodeJS.ProcessEnv = { ...process.env, PATH: existsSync(VENV_BIN) ? `${VENV_BIN}${delimiter}${process.env.PATH ?? ""}` : process.env.PATH };
delete ENV.WIREPOOL_FD;
delete ENV.WIREPOOL_TICKET;
delete ENV.WIREPOOL_TICKET_FILE;

interface Block {
  readonly doc: string;
  readonly lang: string;
  readonly body: string;
  readonly first: string;
}

type Plan =
  /** A program: `main.ts`, `main.mjs` or `main.cjs`, run with node in a folder holding `files`. */
  | { kind: "program"; files?: Record<string, string>; stdout?: RegExp }
  /** A worker: compiled, started by a pool of this test, then `check` calls it. */
  | { kind: "worker"; check: (pool: Pool) => Promise<void> }
  /** A file other blocks use (written into their folders by name). */
  | { kind: "file"; name: string }
  | { kind: "not run"; reason: string };

const PY_WORKER = { "worker.py": join(FIXTURES, "readme-worker.py") };

/** By document, then by the block's first line. */
const BLOCKS: Record<string, Record<string, Plan>> = {
  "node/README.md": {
    "npm install wirepool                          # from the registry, once published": {
      kind: "not run", reason: "installs the package: make package (scripts/pack-check.mjs) installs the tarball into an empty folder",
    },
    'import { Pool, Worker } from "wirepool";      // everything; or a part:': { kind: "program" },
    'const { Pool } = require("wirepool");          // Node 20.19+, 22.12+': { kind: "program" },
    "cd node && npm ci && npm test        # tsc, then node --test: vectors, properties, constants": {
      kind: "not run", reason: "the SDK's own development commands (npm test runs this test; gen-constants rewrites src/)",
    },
    'import { Worker, WorkerError, type Context } from "wirepool";': {
      kind: "worker",
      check: async (pool) => {
        assert.deepEqual(await pool.call("add", { a: 1, b: 2 }), { sum: 3 });
        const echoed = await pool.call("echo", Buffer.from("bytes"), { codec: "raw" });
        assert.equal(Buffer.from(echoed as Uint8Array).toString(), "bytes");
        assert.equal(await pool.call("slow", 5), 5);
        await assert.rejects(pool.call("lookup", "k"), (e: unknown) => e instanceof RequestError && e.code === 1404);
        const rows = pool.stream("decls", { n: 3 });
        const got: unknown[] = [];
        for await (const row of rows) got.push(row);
        assert.deepEqual(got, [0, 1, 2].map((i) => ({ i, name: `decl_${i}` })));
        assert.deepEqual(rows.summary, { rows: 3 });
      },
    },
    "WIREPOOL_TICKET='wirepool-ticket-1.eyJ2Ijox...' node worker.js      # the ticket's text": {
      kind: "not run", reason: "needs a ticket from a running parent (elided here); test/worker-remote.test.ts and test/remote-pool.test.ts join with real ones",
    },
    'import { Pool, WirepoolError, WorkerExitedError } from "wirepool";': {
      kind: "program", files: PY_WORKER, stdout: /\{ i: 999, name: 'decl_999' \}\n\{ rows: 1000 \}\nCANCELLED\n$/,
    },
    'import { Pool, WirepoolError } from "wirepool";': {
      kind: "program", files: PY_WORKER, stdout: /^(\{ path: 'img_\d+\.png', width: 64 \}\n){100}$/,
    },
    'import { Pool } from "wirepool";': { kind: "program", files: PY_WORKER },
    "// await using: Node 20.4 or newer": { kind: "program", files: PY_WORKER, stdout: /^$/ },
    'import { Registry } from "prom-client";': {
      kind: "not run", reason: "a fragment: `pool` and `http` are the reader's and it serves forever; test/prometheus.test.ts scrapes exportPool",
    },
    'import { Listener, Pool, WorkerExitedError } from "wirepool";': {
      kind: "program", files: { "worker.js": join(FIXTURES, "readme-worker.mjs") }, stdout: /connection: 'lost'/,
    },
    'import { Connection, FrameType, CodecId, EventType, negotiate, ProtocolError } from "wirepool/proto";': {
      kind: "not run", reason: "a fragment: `socket` is the reader's transport; test/sessions.test.ts and properties.test.ts drive the core",
    },
  },
  "README.md": {
    "// worker.mjs": { kind: "file", name: "worker.mjs" },
    'import { Pool } from "wirepool";': { kind: "program", stdout: /^\{ sum: 3 \}\n$/ },
  },
};

/** The fenced blocks of a document (indented ones in lists too, dedented), in order. */
function blocksOf(doc: string): Block[] {
  let text = readFileSync(join(REPO, doc), "utf8");
  if (doc === "README.md") {
    // The top README: its Node blocks, from "The same in Node" to the next language's.
    const at = text.indexOf("The same in Node");
    assert.ok(at >= 0, "README.md has no 'The same in Node' section");
    text = text.slice(at, text.indexOf("A Rust worker", at));
  }
  const out: Block[] = [];
  for (const m of text.matchAll(/^( *)```([^\n]*)\n([\s\S]*?)^\1```/gm)) {
    const indent = m[1].length;
    const body = m[3].split("\n").map((l) => l.slice(Math.min(indent, l.length - l.trimStart().length))).join("\n");
    out.push({ doc, lang: m[2].trim(), body, first: body.split("\n")[0] });
  }
  return out;
}

const ALL = Object.keys(BLOCKS).flatMap(blocksOf);
const scratch = mkdtempSync(join(tmpdir(), "wirepool-readme-"));
after(() => rmSync(scratch, { recursive: true, force: true }));

function planOf(b: Block): Plan | undefined {
  return BLOCKS[b.doc]?.[b.first];
}

function run(cmd: string, args: string[], cwd: string): Promise<{ code: number | null; signal: string | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(cmd, args, { cwd, env: ENV, timeout: STEP_MS, killSignal: "SIGKILL", maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      const e = err as (NodeJS.ErrnoException & { code?: number | string; signal?: string }) | null;
      resolve({ code: e === null ? 0 : typeof e.code === "number" ? e.code : -1, signal: e?.signal ?? null, stdout, stderr });
    });
  });
}

/** A folder for one block: `wirepool` resolved to this package, ESM by default. */
function folder(name: string): string {
  const dir = join(scratch, name);
  mkdirSync(join(dir, "node_modules"), { recursive: true });
  symlinkSync(NODE_DIR, join(dir, "node_modules", "wirepool"), "dir");
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "readme-block", private: true, type: "module" }));
  return dir;
}

/** Compiles `file` (a .ts in `dir`) with this package's tsc, strict; fails on any diagnostic. */
async function compile(dir: string, file: string): Promise<void> {
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, skipLibCheck: true,
        types: ["node"], typeRoots: [join(NODE_DIR, "node_modules", "@types")],
      },
      files: [file],
    }),
  );
  const r = await run(TSC, ["-p", "tsconfig.json"], dir);
  assert.equal(r.code, 0, `tsc on ${file}:\n${readFileSync(join(dir, file), "utf8")}\n${r.stdout}${r.stderr}`);
}

function label(b: Block): string {
  return `${b.doc} \`\`\`${b.lang} "${b.first.slice(0, 60)}"`;
}

test("every block of node/README.md and of the top README's Node section is run or listed with a reason", () => {
  const unlisted = ALL.filter((b) => planOf(b) === undefined).map(label);
  assert.deepEqual(unlisted, [], "blocks neither run nor listed in BLOCKS (test/readme.test.ts)");
  const langs = ALL.filter((b) => !["ts", "js", "sh"].includes(b.lang)).map(label);
  assert.deepEqual(langs, [], "blocks of another language than ts, js or sh");
  const seen = new Set(ALL.map((b) => `${b.doc}\n${b.first}`));
  const stale = Object.entries(BLOCKS).flatMap(([doc, plans]) => Object.keys(plans).filter((first) => !seen.has(`${doc}\n${first}`)).map((f) => `${doc}: ${f}`));
  assert.deepEqual(stale, [], "BLOCKS lists blocks the READMEs no longer have");
  const counted = new Map<string, number>();
  for (const b of ALL) counted.set(`${b.doc}\n${b.first}`, (counted.get(`${b.doc}\n${b.first}`) ?? 0) + 1);
  assert.deepEqual([...counted].filter(([, n]) => n > 1).map(([k]) => k), [], "two blocks start with the same line: tell them apart");
  assert.ok(ALL.filter((b) => planOf(b)?.kind !== "not run").length >= 6, "fewer runnable blocks than expected");
});

const files = new Map<string, string>(); // "worker.mjs" -> the top README's block
for (const b of ALL) {
  const plan = planOf(b);
  if (plan?.kind === "file") files.set(plan.name, b.body);
}

ALL.forEach((b, index) => {
  const plan = planOf(b);
  if (plan === undefined || plan.kind === "file" || plan.kind === "not run") return;
  test(`runs as printed: ${label(b)}`, { timeout: 3 * STEP_MS }, async () => {
    const dir = folder(`block-${index}`);
    for (const [name, body] of files) writeFileSync(join(dir, name), body);
    if (plan.kind === "program") {
      for (const [name, from] of Object.entries(plan.files ?? {})) copyFileSync(from, join(dir, name));
      let main: string;
      if (b.lang === "ts") {
        writeFileSync(join(dir, "main.ts"), b.body);
        await compile(dir, "main.ts");
        main = "main.js";
      } else {
        main = /\brequire\(/.test(b.body) ? "main.cjs" : "main.mjs";
        writeFileSync(join(dir, main), b.body);
      }
      const r = await run(process.execPath, [main], dir);
      assert.equal(r.code, 0, `${label(b)} exited ${r.code} (${r.signal ?? "no signal"}):\n${b.body}\nstdout:\n${r.stdout}\nstderr:\n${r.stderr}`);
      assert.equal(r.stderr, "", `${label(b)} printed to stderr`);
      if (plan.stdout !== undefined) assert.match(r.stdout, plan.stdout);
    } else {
      writeFileSync(join(dir, "worker.ts"), b.body);
      await compile(dir, "worker.ts");
      const pool = await Pool.start({ command: [process.execPath, join(dir, "worker.js")], workers: 1, startupTimeoutMs: 30_000 });
      try {
        await plan.check(pool);
      } finally {
        await pool.close();
      }
    }
  });
});
