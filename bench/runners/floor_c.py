"""Runner for the physical floor (floor.c): translates a scenario into the C program's argv and
its output into the runner contract. The binary is built by bench/run.py into bench/.build/.

Usage: floor_c.py <path to floor binary> '<scenario json>'
"""

from __future__ import annotations

import json
import subprocess
import sys

from common import figure, load_scenario, ok, unsupported

RUNNER = "floor_c"
UNITS = {"calls_per_s": ("calls/s", "higher"), "p50_us": ("us", "lower"),
         "p99_us": ("us", "lower"), "mb_per_s": ("MB/s", "higher"),
         "rows_per_s": ("rows/s", "higher"), "tasks_per_s": ("tasks/s", "higher"),
         "frames_per_s": ("frames/s", "higher")}


def argv_for(sc: dict) -> list[str] | None:
    kind = sc["kind"]
    r = str(sc["repeats"])
    if kind in ("echo", "oneway", "echo_large", "arrow"):
        # W7 (arrow): the batch's IPC bytes moved one way.
        one_way = kind in ("oneway", "arrow")
        return ["echo", str(sc["payload"]), str(sc.get("inflight", 1)), str(sc["duration_s"]),
                str(sc["min_calls"]), str(sc["warmup_s"]), r, "1" if one_way else "0",
                "1" if kind == "echo" and sc.get("inflight", 1) == 1 else "0"]
    if kind in ("rows", "slow_rows"):
        pause_us = int(sc.get("pause_ms", 0) * 1000)
        return ["rows", "1" if sc["shape"] == "large_rows" else "0", str(sc["n"]), r,
                str(sc.get("every", 0)), str(pause_us)]
    if kind == "pool":
        return ["pool", str(sc["workers"]), str(sc["task_us"]), str(sc["tasks"]), r]
    if kind == "frames":
        return ["frames", str(sc["frame"]), str(sc["per_write"]), str(sc["frames_total"]), r]
    return None


def main() -> None:
    binary = sys.argv[1]
    sc = load_scenario()
    args = argv_for(sc)
    if args is None:
        unsupported(RUNNER, sc, f"no floor for kind {sc['kind']}")
        return
    # The harness bounds the whole runner; the floor is bounded by its own loop counts.
    out = subprocess.run([binary, *args], check=True, stdout=subprocess.PIPE, text=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    figs = [figure(name, UNITS[name][0], vals, UNITS[name][1]) for name, vals in res["values"].items()]
    ok(RUNNER, sc, figs, res["rss_parent_kib"], res["rss_child_kib"],
       f"socketpair, u32 length prefix, SO_SNDBUF={res['sockbuf']}; payloads never parsed")


if __name__ == "__main__":
    main()
