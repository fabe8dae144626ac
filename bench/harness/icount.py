"""The CI gate: instructions per operation, counted by valgrind, against a committed baseline.

Wall-clock figures on a shared 2-vCPU VM move 20-40% between runs; instruction counts barely
move. One counting run per language pair (rust/wirepool-bench's `wirepool-bench-count`,
bench/icount/count_python.py) runs phases of one operation each, with a mark between phases
that makes callgrind (`--dump-before=getpgrp --trace-children=yes`) write every process's
count so far. Each operation runs in two phases, `base` and `base + delta` times, and

    per operation = (instructions(base + delta) - instructions(base)) / delta

over the parent and its worker together, so start-up, imports and the marks cancel. A new
worker of the `handshake` phases adds its own count up to its first mark (its exit is left
out: the SDKs' grace periods time it, and valgrind is slow enough to exceed them).

Noise, and what removes it: every phase pair runs REPEATS (5) times in the same process and the
smallest count of each is kept; each run is pinned to one CPU with SCHED_BATCH (the parent
and the worker take turns as in lock step: no wake-up preemption, no polling while the other
runs), address-space randomisation off, PYTHONHASHSEED=0, a private compiled copy of
python/wirepool (an edit while counting changes nothing, no run compiles bytecode), heartbeats
off, and glibc's memcpy held to one loop (it otherwise chooses by address). bench/README.md has
the spread of ten runs.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from .setup import BENCH, BUILD

REPO = BENCH.parent
BASELINE = BENCH / "icount" / "baseline.json"
DEFAULT_THRESHOLD = 0.03
# Figures (or operations) that move more than the rest between identical runs
# (bench/README.md): during a handshake the parent waits while valgrind starts a worker ~50x
# slower than usual, and its timers tick meanwhile; the Python 1 MiB echo is mostly memcpy,
# whose instruction count depends on the buffers' relative alignment; a Python worker's rows
# go into frames as its generator thread and I/O loop trade the GIL on a 5 ms clock, which the
# Rust parent's pace shifts.
# Figures measured and printed but not gated, with the reason (bench/README.md).
REPORT_ONLY = {
    "rust_python.rows_raw": "moved 4,473-4,858 (8.5%) in ten unchanged runs and 5,096 in an eleventh: the Python worker batches rows by a GIL hand-off clock",
    "python_python.echo_1mib": "moved 416,607-489,424 (16%) in ten unchanged runs: mostly memcpy, whose count depends on the buffers' relative alignment",
}
OP_THRESHOLDS = {"handshake": 0.08, "rust_python.echo_1mib": 0.06, "rust_python.rows_json": 0.06}
PYCACHE = BUILD / "icount-pycache"
SNAPSHOT = BUILD / "icount-src"  # the copy of python/wirepool the counted runs import

# op -> (what one operation is, its unit)
OPS: dict[str, tuple[str, str]] = {
    "unary": ("one unary round trip, 64 B each way (raw codec)", "instructions/call"),
    "rows_json": ("one small row of a stream, JSON, decoded in the parent", "instructions/row"),
    "large_rows": ("one 4 KiB row of a stream, JSON, decoded in the parent", "instructions/row"),
    "rows_raw": ("one small row of a stream, raw bytes, not decoded", "instructions/row"),
    "echo_1mib": ("one 1 MiB payload to the worker and back (raw codec)", "instructions/call"),
    "handshake": ("one worker started (spawn, HELLO) and shut down", "instructions/worker"),
}

# The counts of the base run; a figure's run adds `delta` of one operation to them. Deltas
# are sized so that each difference is tens of millions of instructions (the run-to-run noise
# of a whole run is a few hundred thousand) while valgrind spends about a second on it.
BASE = {"unary": 2, "rows_json": 64, "large_rows": 16, "rows_raw": 64, "echo_1mib": 2,
        "handshake": 0}
# A pair counts the operations its DELTAS name (large_rows: the Rust pair only so far).
DELTAS: dict[str, dict[str, int]] = {
    "rust_rust": {"unary": 2000, "rows_json": 6000, "large_rows": 1000, "rows_raw": 36000,
                  "echo_1mib": 200, "handshake": 6},
    "python_python": {"unary": 120, "rows_json": 2000, "rows_raw": 2400, "echo_1mib": 20,
                      "handshake": 1},
    "rust_python": {"unary": 400, "rows_json": 2400, "rows_raw": 5000, "echo_1mib": 24,
                    "handshake": 1},
    "python_rust": {"unary": 180, "rows_json": 3000, "rows_raw": 4200, "echo_1mib": 24,
                    "handshake": 5},
}
# Each phase pair runs this many times in the same process and the smallest count of each phase
# is kept: the noise left (a loop woken once more than needed, a timer firing during a slow
# phase, a first-phase warm-up) mostly adds instructions. A Python worker's start-up barely
# varies and costs ~280 M instructions, so its handshakes repeat less.
REPEATS = 5
REPEATS_PYTHON_HANDSHAKE = 2


def repeats_of(pair: str, op: str) -> int:
    return REPEATS_PYTHON_HANDSHAKE if op == "handshake" and PAIRS[pair][1] == "python" else REPEATS


PAIRS = {  # name -> (parent language, worker language); names as parent_worker
    "rust_rust": ("rust", "rust"),
    "python_python": ("python", "python"),
    "rust_python": ("rust", "python"),
    "python_rust": ("python", "rust"),
}


def rust_bin(name: str) -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "rust" / "target"))
    return target / "release" / name


def parent_argv(pair: str, python: str) -> list[str]:
    parent, worker = PAIRS[pair]
    if parent == "rust":
        return [str(rust_bin("wirepool-bench-count")), "--worker", worker]
    return [python, str(BENCH / "icount" / "count_python.py"), "--worker", worker]


def snapshot_python_sdk(python: str, snapshot: Path = SNAPSHOT) -> Path:
    """A copy of python/wirepool, compiled to bytecode: the counted runs import it, so an edit
    of the shared tree while they run (a recompiled module costs ~100 M instructions) changes
    nothing, and no counted run compiles anything."""
    dest = snapshot / "wirepool"
    shutil.rmtree(snapshot, ignore_errors=True)
    shutil.copytree(REPO / "python" / "wirepool", dest,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([python, "-m", "compileall", "-q", str(dest)],
                   env=count_env(python, snapshot=snapshot), check=True, capture_output=True,
                   timeout=120)
    return snapshot


def count_env(python: str, plant: str | None = None, snapshot: Path = SNAPSHOT
              ) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # imports must read cached bytecode, not compile
    env.pop("WIREPOOL_ICOUNT_PLANT", None)
    # glibc picks memcpy's loop for a large copy by size *and by address* (`rep movsb` above
    # a threshold unless source and destination alias within a page; non-temporal stores
    # above another), and valgrind counts `rep movsb` per byte: a 1 MiB copy then cost
    # 0.1-1 M instructions depending on where malloc put the buffers. One loop for all sizes.
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [
        env.get("GLIBC_TUNABLES", ""), "glibc.cpu.x86_rep_movsb_threshold=1073741824",
        "glibc.cpu.x86_non_temporal_threshold=1073741824"]))
    # Busy polling (a caller or idle worker watching its socket before it sleeps) counts the
    # turns of a wait, not work: one CPU runs parent and worker in turns here, so each poll
    # would spin its whole budget. The Python pool and worker sleep at once with 0 (the Rust
    # worker's 30 us watch before parking is counted as it always was).
    env["WIREPOOL_BUSY_POLL_US"] = "0"
    env.update(PYTHONHASHSEED="0", PYTHONPYCACHEPREFIX=str(PYCACHE), WIREPOOL_REPO=str(REPO),
               WIREPOOL_BENCH_PYTHON=python, WIREPOOL_PYTHON_SRC=str(snapshot))
    if plant:
        env["WIREPOOL_ICOUNT_PLANT"] = plant
    return env


def missing_tools(pairs: list[str]) -> list[str]:
    """What this machine lacks to count `pairs` (an empty list: nothing)."""
    out = []
    if shutil.which("valgrind") is None:
        out.append("valgrind not found on PATH (Debian: apt-get install valgrind)")
    for pair in pairs:
        parent, worker = PAIRS[pair]
        if "rust" in (parent, worker):
            for name in ("wirepool-bench-count", "wirepool-bench-worker"):
                if not os.access(rust_bin(name), os.X_OK):
                    out.append(f"{rust_bin(name)} not built (cd rust && cargo build --release "
                               "-p wirepool-bench)")
    return sorted(set(out))


def warm_up(pairs: list[str], python: str, snapshot: Path = SNAPSHOT) -> None:
    """One native run of each parent with tiny counts: fills the bytecode cache (PYCACHE) so that
    no counted run compiles a module, and fails early and clearly when a pair cannot run."""
    for pair in pairs:
        tiny = [f"{op}=1" for op in ops_of(pair, list(OPS))]
        r = subprocess.run(parent_argv(pair, python) + tiny,
                           env=count_env(python, snapshot=snapshot),
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{pair}: the counting parent failed natively (exit "
                               f"{r.returncode}): {r.stderr.strip()[-800:]}")


def ops_of(pair: str, ops: list[str]) -> list[str]:
    """The operations of `ops` that `pair` counts (those its DELTAS name)."""
    return [op for op in ops if op in DELTAS[pair]]


def phases(ops: list[str], pair: str, repeats: int | None = None) -> list[tuple[str, int]]:
    """The phases of one counting run: for every operation the pair counts, `repeats` (default
    `repeats_of`) times its base count and its base + delta count, alternating."""
    out = []
    for op in ops_of(pair, ops):
        out += [(op, BASE[op]), (op, BASE[op] + DELTAS[pair][op])] * (
            repeats or repeats_of(pair, op))
    return out


def _parts(tmp: Path) -> dict[int, dict[int, int]]:
    """pid -> {part number: instructions} from callgrind's files (`cl.<pid>[.<part>]`)."""
    out: dict[int, dict[int, int]] = {}
    for path in tmp.glob("cl.*"):
        pid = int(path.name.split(".")[1])
        part = total = None
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("part:"):
                part = int(line.split()[1])
            elif line.startswith("summary:"):
                total = int(line.split()[1])
        if part is None or total is None:
            raise RuntimeError(f"{path.name}: no part or summary line")
        out.setdefault(pid, {})[part] = total
    return out


def count_run(argv: list[str], env: dict[str, str], cpu: int | None, n_phases: int,
              timeout_s: float = 900.0) -> tuple[list[int], list[int]]:
    """Runs `argv` (a counting parent) under callgrind, a dump at every mark; returns the
    instructions of each phase (parent and main worker together) and the first part of every
    extra worker (start-up to its first mark), in the order they were started."""
    with tempfile.TemporaryDirectory(prefix="wirepool-icount-") as tmp:
        vg = ["valgrind", "--tool=callgrind", "--dump-before=getpgrp", "--dump-line=no",
              "--dump-instr=no", "--trace-children=yes", f"--callgrind-out-file={tmp}/cl.%p",
              f"--log-file={tmp}/vg.%p"]
        prefix: list[str] = []
        if cpu is not None and shutil.which("taskset"):
            prefix += ["taskset", "-c", str(cpu)]
        if shutil.which("setarch"):
            prefix += ["setarch", os.uname().machine, "-R"]
        if shutil.which("chrt"):
            prefix += ["chrt", "--batch", "0"]
        # taskset and setarch exec what follows: the parent keeps this pid.
        proc = subprocess.Popen(prefix + vg + argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise RuntimeError(f"{' '.join(argv)}: not done after {timeout_s:.0f} s under valgrind")
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode} under valgrind: "
                               f"{err.strip()[-800:]}")
        parts = _parts(Path(tmp))
        parent = parts.pop(proc.pid, {})
        # Parts: 1 = start-up to the first mark, k + 1 = phase k, n + 2 = after the last mark.
        if len(parent) != n_phases + 2:
            raise RuntimeError(f"{' '.join(argv)}: the parent wrote {len(parent)} parts, "
                               f"expected {n_phases + 2} (a mark missing or called elsewhere?)")
        workers = sorted(parts, key=lambda pid: -len(parts[pid]))
        main = parts[workers[0]] if workers else {}
        if len(main) != n_phases + 2:
            raise RuntimeError(f"{' '.join(argv)}: the worker wrote {len(main)} parts, "
                               f"expected {n_phases + 2}")
        per_phase = [parent[k + 1] + main[k + 1] for k in range(1, n_phases + 1)]
        extra = [parts[pid][1] for pid in sorted(workers[1:])]
        return per_phase, extra


def measure(pairs: list[str], ops: list[str], python: str = sys.executable,
            plant: str | None = None, log: Callable[[str], None] = print,
            cpus: list[int] | None = None, snapshot: Path = SNAPSHOT
            ) -> dict[str, dict[str, Any]]:
    """`pair.op` -> {"count": instructions per operation, "unit", "what"}: one counting run per
    pair, the runs side by side, each pinned to its own CPU of `cpus` (default: all of ours)."""
    missing = missing_tools(pairs)
    if missing:
        raise RuntimeError("cannot count instructions: " + "; ".join(missing))
    snapshot_python_sdk(python, snapshot)
    warm_up(pairs, python, snapshot)
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    width = max(1, min(len(cpus), len(pairs)))
    free: queue.Queue[int] = queue.Queue()
    for cpu in cpus[:width]:
        free.put(cpu)
    env = count_env(python, plant, snapshot)

    def one(pair: str) -> dict[str, dict[str, Any]]:
        steps = phases(ops, pair)
        argv = parent_argv(pair, python) + [f"{op}={n}" for op, n in steps]
        cpu = free.get()
        try:
            per_phase, extra = count_run(argv, env, cpu, len(steps))
        finally:
            free.put(cpu)
        out = {}
        at = 0
        for op in ops_of(pair, ops):
            width = 2 * repeats_of(pair, op)
            mine, counts = steps[at:at + width], per_phase[at:at + width]
            at += width
            n1, n2 = mine[0][1], mine[1][1]
            low = min(c for (_, n), c in zip(mine, counts) if n == n1)
            high = min(c for (_, n), c in zip(mine, counts) if n == n2)
            per_op = (high - low) / (n2 - n1)
            if op == "handshake":
                started = sum(n for _, n in mine)
                if len(extra) != started:
                    raise RuntimeError(f"{pair}: {len(extra)} extra workers counted, "
                                       f"expected {started}")
                per_op += min(extra)
            out[f"{pair}.{op}"] = {"count": round(per_op), "unit": OPS[op][1],
                                   "what": OPS[op][0]}
        return out

    figures: dict[str, dict[str, Any]] = {}
    # The Python pairs first: they take longest, so the CPUs finish at about the same time.
    order = sorted(pairs, key=lambda p: ("python" not in p, p))
    with concurrent.futures.ThreadPoolExecutor(width) as ex:
        futures = {ex.submit(one, pair): pair for pair in order}
        for fut in concurrent.futures.as_completed(futures):
            got = fut.result()
            log(f"icount: {futures[fut]}: " + ", ".join(
                f"{k.split('.', 1)[1]} {v['count']:,}" for k, v in got.items()))
            figures.update(got)
    return dict(sorted(figures.items()))


def median_figures(samples: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per figure, the median count of several measurements (a baseline from one sample sits
    at one end of the noise as often as in its middle), with their spread, (max - min) / median."""
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(set().union(*samples)):
        counts = sorted(s[key]["count"] for s in samples if key in s)
        median = counts[len(counts) // 2] if len(counts) % 2 else round(
            (counts[len(counts) // 2 - 1] + counts[len(counts) // 2]) / 2)
        first = next(s[key] for s in samples if key in s)
        out[key] = {**first, "count": median, "samples": counts,
                    "spread": round((counts[-1] - counts[0]) / median, 4) if median else 0.0}
    return out


def environment(python: str = sys.executable) -> dict[str, str]:
    """What the counts depend on besides the code: compare only like with like."""
    def version(cmd: list[str]) -> str:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            return (r.stdout or r.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "not found"
    return {"valgrind": version(["valgrind", "--version"]),
            "python": version([python, "--version"]),
            "rustc": version(["rustc", "--version"]),
            "machine": os.uname().machine}


def load_baseline(path: Path = BASELINE) -> dict[str, Any] | None:
    if not path.exists():
        return None
    return json.loads(path.read_text())


def write_baseline(path: Path, figures: dict[str, dict[str, Any]], commit: str,
                   env: dict[str, str], previous: dict[str, Any] | None = None) -> None:
    """Rewrites the baseline with `figures` (the thresholds of `previous` are kept)."""
    prev = previous or {}
    doc = {"comment": "Instructions per operation (parent + worker), the gate of `make bench`. "
                      "Rewritten only on purpose: `make bench-baseline` (bench/README.md).",
           "commit": commit,
           "measured": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "threshold": prev.get("threshold", DEFAULT_THRESHOLD),
           "thresholds": prev.get("thresholds", dict(OP_THRESHOLDS)),
           "report_only": prev.get("report_only", dict(REPORT_ONLY)),
           "environment": env, "figures": figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def threshold_of(baseline: dict[str, Any], key: str, override: float | None = None) -> float:
    """The allowed growth of figure `key` (`pair.op`): `override`, else the baseline's own
    threshold for that figure, else for that operation, else its general one."""
    if override is not None:
        return override
    own = baseline.get("thresholds", {})
    op = key.split(".", 1)[1]
    return float(own.get(key, own.get(op, baseline.get("threshold", DEFAULT_THRESHOLD))))


def compare(baseline: dict[str, Any], figures: dict[str, dict[str, Any]], commit: str,
            threshold: float | None = None, env: dict[str, str] | None = None,
            out: Callable[[str], None] = print, verdict: bool = True) -> int:
    """Exit status of the gate: 1 when a figure grew by more than its threshold against the
    baseline, or a baseline figure was not measured; 0 otherwise. Prints every figure, and the
    verdict unless `verdict` is false (a rebaseline shows the change without judging it)."""
    base = baseline["figures"]
    out(f"icount gate: commit {commit} against the baseline of "
        f"{baseline.get('commit', 'unknown')[:12]} ({baseline.get('measured', '?')}), "
        f"threshold +{threshold_of(baseline, 'x.unary', threshold):.0%}"
        + "".join(f", {op} +{t:.0%}" for op, t in baseline.get("thresholds", {}).items()
                  if threshold is None))
    if env is not None:
        recorded = baseline.get("environment", {})
        for k, v in env.items():
            if recorded.get(k) != v:
                out(f"  NOTE the baseline was measured with {k} {recorded.get(k)!r}, this run "
                    f"has {v!r}: counts may move for that reason alone (make bench-baseline)")
    failures = 0
    for key in sorted(set(base) | set(figures)):
        old = base.get(key, {}).get("count")
        new = figures.get(key, {}).get("count")
        unit = (figures.get(key) or base.get(key))["unit"]
        limit = threshold_of(baseline, key, threshold)
        if key in baseline.get("report_only", {}) and old is not None and new is not None:
            out(f"  reported   {key}: {old:,} -> {new:,} {unit} ({new / old - 1:+.1%}; not "
                f"gated: {baseline['report_only'][key]})")
            continue
        if old is None:
            out(f"  new        {key}: {new:,} {unit} (not in the baseline)")
            continue
        if new is None:
            out(f"  MISSING    {key}: in the baseline ({old:,} {unit}), not measured")
            failures += 1
            continue
        change = new / old - 1 if old else 0.0
        if new > old * (1 + limit):
            out(f"  REGRESSION {key}: {old:,} -> {new:,} {unit} ({change:+.1%}, threshold "
                f"+{limit:.0%}) at commit {commit}")
            failures += 1
        elif new < old * (1 - limit):
            out(f"  improved   {key}: {old:,} -> {new:,} {unit} ({change:+.1%}); lower the "
                "baseline on purpose: make bench-baseline")
        else:
            out(f"  ok         {key}: {old:,} -> {new:,} {unit} ({change:+.1%})")
    if verdict:
        out("icount gate: " + (f"FAILED, {failures} figure(s) above their threshold or missing"
                               if failures else "passed"))
    return 1 if failures else 0


def github_benchmark(figures: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The figures as github-action-benchmark's `customSmallerIsBetter` input."""
    return [{"name": f"icount {key}", "unit": f["unit"], "value": f["count"],
             "extra": f["what"]} for key, f in figures.items()]
