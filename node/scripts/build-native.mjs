#!/usr/bin/env node
// Builds node/native/, the shared-memory lane's optional addon (Node-API, C), with node-gyp:
// npm's own copy (npm_config_node_gyp, or the one beside npm), against the running Node's
// headers from its prefix when they are there (no download), else node-gyp fetches them.
//
//   node scripts/build-native.mjs              build; a failure fails
//   node scripts/build-native.mjs --optional   a failure says why and exits 0 (npm test: the
//                                              lane's tests then skip, the SDK offers no lane)
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const NATIVE = join(dirname(fileURLToPath(import.meta.url)), "..", "native");
const optional = process.argv.includes("--optional");

function give(why) {
  process.stderr.write(`wirepool: the shared-memory addon was not built (${why}); the lane is off\n`);
  process.exit(optional ? 0 : 1);
}

if (process.platform !== "linux") give("Linux only");
const prefix = join(dirname(process.execPath), "..");
const candidates = [
  process.env.npm_config_node_gyp,
  join(prefix, "lib", "node_modules", "npm", "node_modules", "node-gyp", "bin", "node-gyp.js"),
].filter((p) => p && existsSync(p));
if (candidates.length === 0) give("node-gyp not found (it comes with npm)");
const args = [candidates[0], "rebuild", "--loglevel=error"];
if (existsSync(join(prefix, "include", "node", "node_api.h"))) args.push(`--nodedir=${prefix}`);
const r = spawnSync(process.execPath, args, { cwd: NATIVE, stdio: ["ignore", "ignore", "inherit"], timeout: 120_000 });
if (r.status !== 0) give(r.error ? r.error.message : `node-gyp exited ${r.status ?? r.signal}`);
if (!existsSync(join(NATIVE, "build", "Release", "wirepool_shm.node"))) give("no build/Release/wirepool_shm.node");
