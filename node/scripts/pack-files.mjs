// npm's prepack/postpack hooks (package.json): the tarball is built from a fresh `dist/` (a file
// left there by a removed source would otherwise ship) and carries the repository's two licence
// files, which live at the repository root. `postpack` removes the copies again so the working
// tree stays as git has it.
import { copyFileSync, rmSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(dirname(fileURLToPath(import.meta.url))); // node/
const LICENSES = ["LICENSE-MIT", "LICENSE-APACHE"];

const step = process.argv[2];
if (step === "prepack") {
  rmSync(join(here, "dist"), { recursive: true, force: true });
  execFileSync(process.execPath, [join(here, "node_modules/typescript/bin/tsc"), "-p", "tsconfig.json"], {
    cwd: here,
    stdio: "inherit",
  });
  for (const f of LICENSES) copyFileSync(join(here, "..", f), join(here, f));
} else if (step === "postpack") {
  for (const f of LICENSES) rmSync(join(here, f), { force: true });
} else {
  console.error("usage: node scripts/pack-files.mjs prepack|postpack");
  process.exit(2);
}
