// CommonJS: `require("wirepool")` (and each subpath) from a .cjs file, through the package's
// `exports` ("default" condition) by its own name, then a real pool driven from CommonJS
// (test/fixtures/require.cjs; scripts/pack-check.mjs runs the same file on the installed
// tarball). Node loads the ES module build with require(esm): 20.19+ and 22.12+ do it unflagged.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const CJS = fileURLToPath(new URL("../../test/fixtures/require.cjs", import.meta.url)); // from build/test/
const WORKER = fileURLToPath(new URL("./parent-fixture.js", import.meta.url));

test("require('wirepool') from CommonJS: every subpath, the same instances as import(), a pool call", { timeout: 60_000 }, async () => {
  // The package's own dist/ (npm test builds it first), found by name: a self-reference.
  const { stdout, stderr } = await promisify(execFile)(process.execPath, [CJS, WORKER, "echo", '{"cjs":true}', '{"cjs":true}'], { timeout: 30_000, killSignal: "SIGKILL" });
  assert.equal(stdout, "require ok\n", stderr);
  assert.doesNotMatch(stderr, /ERR_|Error/, stderr);
});
