#!/usr/bin/env python3
"""A/B bench of Node SDK builds against the Node incumbents, alternated in one run.

    python3 node/bench/ab.py --build old=/tmp/old-dist --build new=node/dist \
        --scenario W4.small_rows.1M --repeats 3 [--rust]

Each build is a copy of a node/dist folder; the bench runners (bench/runners/wirepool_node*.mjs)
are copied next to it so they import that build. Every repeat runs every build and every
incumbent once, in turn, so drift hits them alike. Prints min/median/max per runner and the
ratios of the medians against the incumbents of the same run, and each round's ratio
(min/median/max over the rounds).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIOS = {
    "W4.small_rows.1M": dict(workload="W4", kind="rows", shape="small_rows", n=1 << 20, codec="json", repeats=1),
    "W4.small_rows.64K": dict(workload="W4", kind="rows", shape="small_rows", n=1 << 16, codec="json", repeats=1),
    "W4.small_rows.1M.msgpack": dict(workload="W4", kind="rows", shape="small_rows", n=1 << 20, codec="msgpack", repeats=1),
    "W3.echo.16MiB": dict(workload="W3", kind="echo_large", payload=16 << 20, inflight=1, duration_s=0.25, min_calls=1, warmup_s=0, repeats=1),
    "W3.echo.1MiB": dict(workload="W3", kind="echo_large", payload=1 << 20, inflight=1, duration_s=0.25, min_calls=1, warmup_s=0, repeats=1),
}
INCUMBENTS = {
    "node_fork_json": ["bench/incumbents/node/fork_parent.mjs", "json"],
    "node_fork_advanced": ["bench/incumbents/node/fork_parent.mjs", "advanced"],
    "procwire": ["bench/incumbents/node/procwire_parent.mjs"],
}


def layout(name: str, dist: str, tmp: str) -> str:
    """tmp/name/{bench/runners/*.mjs, bench/incumbents -> repo's, node/dist, node/node_modules}."""
    base = os.path.join(tmp, name)
    os.makedirs(os.path.join(base, "bench", "runners"))
    os.makedirs(os.path.join(base, "node"))
    for f in ("wirepool_node.mjs", "wirepool_node_worker.mjs"):
        shutil.copy(os.path.join(ROOT, "bench", "runners", f), os.path.join(base, "bench", "runners", f))
    os.symlink(os.path.join(ROOT, "bench", "incumbents"), os.path.join(base, "bench", "incumbents"))
    shutil.copytree(dist, os.path.join(base, "node", "dist"))
    os.symlink(os.path.join(ROOT, "node", "node_modules"), os.path.join(base, "node", "node_modules"))
    with open(os.path.join(base, "node", "package.json"), "w") as f:
        f.write('{"type":"module"}\n')
    return base


def run(cmd: list[str], sc: dict) -> float | None:
    env = dict(os.environ, CARGO_TARGET_DIR=os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "rust", "target")))
    p = subprocess.run(cmd + [json.dumps(sc)], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    for line in p.stdout.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("status") == "ok":
            return statistics.median(r["figures"][0]["values"])
    sys.stderr.write(f"{cmd[-1]}: {p.stdout[-400:]} {p.stderr[-800:]}\n")
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=True, help="name=path/to/dist")
    ap.add_argument("--scenario", action="append", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rust", action="store_true", help="the Rust bench worker instead of the Node one")
    ap.add_argument("--incumbents", default="node_fork_json,node_fork_advanced,procwire")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="wp-ab-")
    cmds: dict[str, list[str]] = {}
    for spec in a.build:
        name, dist = spec.split("=", 1)
        base = layout(name, os.path.abspath(dist), tmp)
        cmds[name] = ["node", os.path.join(base, "bench", "runners", "wirepool_node.mjs")] + (["--worker", "rust"] if a.rust else [])
    for inc in filter(None, a.incumbents.split(",")):
        cmds[inc] = ["node"] + INCUMBENTS[inc]
    for sid in a.scenario:
        sc = dict(SCENARIOS[sid], id=sid)
        vals: dict[str, list[float]] = {k: [] for k in cmds}
        # per repeat: each build's figure over each incumbent's in the same round
        ratios: dict[tuple[str, str], list[float]] = {}
        for _ in range(a.repeats):
            got: dict[str, float] = {}
            for k, cmd in cmds.items():
                v = run(cmd, sc)
                if v is not None:
                    vals[k].append(v)
                    got[k] = v
            for k in got:
                for i in got:
                    if i in INCUMBENTS and k not in INCUMBENTS:
                        ratios.setdefault((k, i), []).append(got[k] / got[i])
        print(f"== {sid} ({a.repeats} alternated repeats{', Rust worker' if a.rust else ''})")
        med = {k: statistics.median(v) for k, v in vals.items() if v}
        for k, v in vals.items():
            if not v:
                print(f"  {k:20s} failed")
                continue
            vs = " ".join(f"{med[k] / med[i]:.2f}x {i}" for i in med if i in INCUMBENTS and i != k)
            print(f"  {k:20s} min {min(v):12.0f} med {med[k]:12.0f} max {max(v):12.0f}  {vs}")
        for (k, i), r in ratios.items():
            print(f"  ratio {k} / {i} per round: min {min(r):.2f} med {statistics.median(r):.2f} max {max(r):.2f} ({len(r)} rounds)")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
