"""Runner for the shared-memory lane's transport (PROTOCOL.md section 20), Rust x Rust: the
wirepool-io example `shm_lane` (sealed memfd regions announced once with SCM_RIGHTS, a first
frame plus SHM_BODY per message, SHM_RELEASE back; wirepool-proto's Lender/Borrower bookkeeping).
Not yet the pool: the lane is not wired into the cores and drivers (issue 13 part 2). W3 only.

Usage: shm_lane.py --prepare | shm_lane.py '<scenario json>'
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import figure, load_scenario, ok, unsupported

RUNNER = "wirepool_shm_lane"
REPO = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "rust" / "target"))
BINARY = TARGET / "release" / "examples" / "shm_lane"


def prepare() -> int:
    built = subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "wirepool-io",
                            "--example", "shm_lane"], cwd=REPO / "rust").returncode
    if built != 0 and BINARY.exists():
        # The crates are edited in place by their owners (see wirepool_rust.sh): say so loudly.
        print(f"{RUNNER}: build failed; measuring the previous build", file=sys.stderr)
        return 0
    return built


def main() -> None:
    if sys.argv[1:] == ["--prepare"]:
        sys.exit(prepare())
    sc = load_scenario()
    if sc["kind"] not in ("oneway", "echo_large"):
        unsupported(RUNNER, sc, "the lane is measured for large payloads (W3) only")
        return
    if not sys.platform.startswith("linux"):
        unsupported(RUNNER, sc, "memfd and SCM_RIGHTS: Linux only")
        return
    verb = "oneway" if sc["kind"] == "oneway" else "echo"
    argv = [str(BINARY), verb, str(sc["payload"]), str(sc["duration_s"]), str(sc["min_calls"]),
            str(sc["repeats"])]
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    memcpy = statistics.median(res["memcpy_mb_per_s"])
    ok(RUNNER, sc, [figure("mb_per_s", "MB/s", res["mb_per_s"])], res["rss_parent_kib"],
       res["rss_child_kib"],
       "shared-memory lane transport, Rust x Rust (wirepool-io shm + wirepool-proto shm; not yet "
       f"the pool): the sender copies the payload into its sealed region once, the receiver "
       f"gets a zero-copy view; the sender's copy alone runs at {memcpy:,.0f} MB/s (median)")


if __name__ == "__main__":
    main()
