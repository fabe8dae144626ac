"""Baseline: ipc-channel (Rust, serde + bincode over Unix sockets), a Rust parent and child.

Usage: ipc_channel.py --prepare | [--batch N] '<scenario json>'

The program is rust/wirepool-bench/ipc-channel-incumbent (its own cargo workspace, crates.io's
ipc-channel 0.19; --prepare builds it in release). The child produces the W4 rows one at a time
into a `Vec<Row>` and sends it through an `IpcSender` every N rows (default 256: batched by hand,
as a user of ipc-channel writes a stream; `--batch 1` is one row per message); the parent decodes
each message into typed structs and checks every index. Rows scenarios only (W4, in JSON terms:
this baseline's own codec is bincode); everything else is answered "unsupported".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from common import figure, load_scenario, ok, unsupported

HERE = Path(__file__).resolve().parent
CRATE = HERE.parent.parent / "rust" / "wirepool-bench" / "ipc-channel-incumbent"
SHAPES = {"small_rows": "small", "large_rows": "large"}


def binary() -> Path:
    target = os.environ.get("CARGO_TARGET_DIR")
    return (Path(target) if target else CRATE / "target") / "release" / "ipc-channel-incumbent"


def prepare() -> int:
    done = subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=CRATE,
                          stdout=sys.stderr).returncode
    return 0 if done == 0 or binary().is_file() else 1


def main() -> int:
    if "--prepare" in sys.argv:
        return prepare()
    batch = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 256
    runner = "ipc_channel" if batch > 1 else "ipc_channel_unbatched"
    sc = load_scenario()
    founding = bool(sc.get("founding"))
    if sc["kind"] != "rows" or (sc["shape"] not in SHAPES and not founding):
        unsupported(runner, sc, "ipc-channel is measured on the W4 rows only")
        return 0
    # The founding workload's rows (bench/shapes/founding.json): the same crate's founding-ipc,
    # with the same arguments.
    exe = binary().with_name("founding-ipc") if founding else binary()
    if not exe.is_file():
        unsupported(runner, sc, f"{exe} is not built (ipc_channel / wirepool_rust --prepare)")
        return 0
    shape = sc["shape"] if founding else SHAPES[sc["shape"]]
    argv = [str(exe), shape, str(sc["n"]), str(batch), str(sc["repeats"])]
    if founding:  # a repeat: whole streams for the scenario's window
        argv.append(str(sc.get("duration_s", 0.25)))
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rates, parent, child = [], None, None
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["rows_per_s"]:
            rates.append(float(words[1]))
        elif words[:1] == ["rss_kib"]:
            parent, child = int(words[2]), int(words[4])
    how = (f"{batch} rows per message, batched by hand" if batch > 1 else "one row per message")
    ok(runner, sc, [figure("rows_per_s", "rows/s", rates)], parent, child,
       f"ipc-channel 0.19, IpcSender<Vec<Row>> (serde + bincode), {how}; typed structs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
