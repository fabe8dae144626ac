// The release check of the npm package (`make package`): `npm pack` as a publish would, the
// tarball's contents against the manifest, then an install into an empty folder (no link to this
// tree, dependencies from npm's cache when they are there) where the top README's Node example,
// worker and parent, runs as written, every subpath export imports and requires (CommonJS, with a
// pool call from a .cjs file), and a TypeScript program (`await using` a pool, a lease and a
// stream among it) type-checks against the shipped `.d.ts`. Each step is bounded; the scratch folder is removed.
//
//   node scripts/pack-check.mjs [--keep]
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const NODE_DIR = dirname(dirname(fileURLToPath(import.meta.url)));
const REPO = dirname(NODE_DIR);
const STEP_MS = 180_000;
const manifest = JSON.parse(readFileSync(join(NODE_DIR, "package.json"), "utf8"));
const scratch = mkdtempSync(join(tmpdir(), "wirepool-pack-"));
const started = performance.now();

function run(cmd, args, cwd, extra = {}) {
  return execFileSync(cmd, args, { cwd, encoding: "utf8", timeout: STEP_MS, killSignal: "SIGKILL", ...extra });
}
function fail(msg) {
  throw new Error(`pack-check: ${msg}`);
}

/** The two ```js blocks that follow "The same in Node" in the top README: worker, then parent. */
function readmeExample() {
  const text = readFileSync(join(REPO, "README.md"), "utf8");
  const at = text.indexOf("The same in Node");
  if (at < 0) fail("README.md has no 'The same in Node' section");
  const blocks = [...text.slice(at).matchAll(/```js\n([\s\S]*?)```/g)].slice(0, 2).map((m) => m[1]);
  if (blocks.length !== 2 || !blocks[0].includes("w.serve()") || !blocks[1].includes("Pool.start")) {
    fail("README.md's Node section is not a worker block then a parent block");
  }
  return { worker: blocks[0], parent: blocks[1] };
}

try {
  // 1. The tarball (prepack rebuilds dist/ from scratch and copies the licence files in).
  const packed = JSON.parse(run("npm", ["pack", "--json", "--pack-destination", scratch, "--loglevel=error"], NODE_DIR))[0];
  const files = new Set(packed.files.map((f) => f.path));
  const tarball = join(scratch, packed.filename);

  // 2. Its contents: what the manifest points at is there, nothing else sneaks in.
  const required = ["package.json", "README.md", "LICENSE-MIT", "LICENSE-APACHE", manifest.main, manifest.types];
  for (const [sub, entry] of Object.entries(manifest.exports)) {
    if (!entry.types || !entry.import || !entry.default) fail(`export ${sub} lacks types, import or default (require)`);
    required.push(entry.types, entry.import, entry.default);
  }
  for (const f of required) if (!files.has(f.replace(/^\.\//, ""))) fail(`${f} is not in the tarball`);
  const junk = [...files].filter((f) => !/^(dist\/.*\.(js|d\.ts)|package\.json|README\.md|LICENSE-(MIT|APACHE))$/.test(f));
  if (junk.length) fail(`unexpected files in the tarball: ${junk.join(", ")}`);
  for (const f of files) {
    if (f.endsWith(".js") && !files.has(f.replace(/\.js$/, ".d.ts"))) fail(`${f} has no .d.ts beside it`);
  }
  if (!/^>=\s*20\b/.test(manifest.engines?.node ?? "")) fail(`engines.node is ${manifest.engines?.node}, not >=20`);
  if (manifest.type !== "module") fail("the package is not ESM (type: module)");
  if (manifest.license !== "MIT OR Apache-2.0") fail(`license is ${manifest.license}`);

  // 3. An empty folder installs it, as a user would (no workspace link to this tree).
  const app = join(scratch, "app");
  run("mkdir", ["-p", app], scratch);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "pack-check", private: true, type: "module" }));
  run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error", tarball], app);
  const installed = JSON.parse(readFileSync(join(app, "node_modules/wirepool/package.json"), "utf8"));
  if (installed.version !== manifest.version) fail(`installed ${installed.version}, packed ${manifest.version}`);

  // 4. The README's example runs there as written (its 1 M rows streamed through).
  const { worker, parent } = readmeExample();
  writeFileSync(join(app, "worker.mjs"), worker);
  writeFileSync(join(app, "parent.mjs"), parent);
  const out = run(process.execPath, ["parent.mjs"], app);
  if (!/\{ sum: 3 \}/.test(out)) fail(`the README example printed ${JSON.stringify(out)}, not { sum: 3 }`);

  // 5. Every subpath export imports from the installed package.
  const subpaths = Object.keys(manifest.exports).map((s) => (s === "." ? "wirepool" : `wirepool/${s.slice(2)}`));
  const probe = `for (const s of ${JSON.stringify(subpaths)}) { const m = await import(s); if (!Object.keys(m).length) throw new Error(s + " exports nothing"); }`;
  run(process.execPath, ["--input-type=module", "-e", probe], app);

  // 5b. CommonJS: require() of every subpath (the "default" condition, loaded with require(esm))
  // and a call on the README's worker from a .cjs file (node/test/fixtures/require.cjs).
  copyFileSync(join(NODE_DIR, "test/fixtures/require.cjs"), join(app, "require.cjs"));
  const cjs = run(process.execPath, ["require.cjs", "worker.mjs", "add", '{"a":1,"b":2}', '{"sum":3}'], app);
  if (cjs !== "require ok\n") fail(`require.cjs printed ${JSON.stringify(cjs)}`);

  // 6. The types resolve through `exports` for a TypeScript user (NodeNext, strict).
  writeFileSync(
    join(app, "check.ts"),
    [
      'import { Pool, Worker, WirepoolError, type PoolOptions } from "wirepool";',
      'import { Connection } from "wirepool/proto";',
      'import { codec } from "wirepool/codecs";',
      ...("./parent" in manifest.exports ? ['import { Pool as P2 } from "wirepool/parent";', "const same: typeof Pool = P2;", "void same;"] : []),
      ...("./worker" in manifest.exports ? ['import { Worker as W2 } from "wirepool/worker";', "const w2: typeof Worker = W2;", "void w2;"] : []),
      'const opts: PoolOptions = { command: ["node", "worker.mjs"], workers: 1 };',
      "const c = new Connection(\"parent\");",
      "const e: unknown = null;",
      "if (e instanceof WirepoolError) { const n: number = e.code; void n; }",
      "void opts; void c; void codec; void Worker;",
      "export async function disposable(): Promise<void> {",
      "  await using pool = await Pool.start(opts);",
      "  await using lease = await pool.lease();",
      '  await using rows = lease.stream<number>("decls");',
      "  for await (const row of rows) { const n: number = row; void n; }",
      "}",
      "",
    ].join("\n"),
  );
  writeFileSync(
    join(app, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, noEmit: true,
        types: ["node"], typeRoots: [join(NODE_DIR, "node_modules/@types")],
      },
      files: ["check.ts"],
    }),
  );
  run(process.execPath, [join(NODE_DIR, "node_modules/typescript/bin/tsc"), "-p", "tsconfig.json"], app);

  console.log(
    `pack-check: ${packed.filename} (${files.size} files, ${(packed.size / 1024).toFixed(0)} kB) installs into an empty folder, ` +
      `runs the README example, imports and requires ${subpaths.join(", ")} and type-checks; ${((performance.now() - started) / 1000).toFixed(1)} s`,
  );
} catch (e) {
  if (e.stdout) process.stderr.write(String(e.stdout));
  if (e.stderr) process.stderr.write(String(e.stderr));
  console.error(e.message);
  process.exitCode = 1;
} finally {
  if (process.argv.includes("--keep")) console.log(`kept ${scratch}`);
  else rmSync(scratch, { recursive: true, force: true });
}
