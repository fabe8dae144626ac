#!/usr/bin/env python3
"""The wirepool benchmark: every baseline and every wirepool runner, one command.

    python3 bench/run.py [--quick|--full] [--only W1,W3] [--runners a,b] [--out DIR]
    python3 bench/run.py check [--threshold 0.2] [--all-kinds]
    python3 bench/run.py gate [--rebaseline] [--pairs rust_rust,...] [--ops unary,...]

The first form creates bench/.venv (from bench/requirements.txt), installs bench/incumbents/node's npm
packages, builds the C floor, then re-executes itself inside the venv and runs every scenario
against every registered runner. Results go to bench/results/<UTC timestamp>/ (results.json,
report.md, PNG plots). A full run without filters appends its ratios to
bench/history/ratios.jsonl. `check` compares the newest history line with the previous one and
exits 1 when a tracked ratio dropped by more than the threshold. `gate` counts instructions per
operation under valgrind and exits 1 when one grew beyond its threshold against
bench/icount/baseline.json (`--rebaseline` rewrites that file instead). See bench/README.md.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "runners"))

from harness import analysis, execute, history, icount, report, scenarios, setup  # noqa: E402
from registry import LANGS as _LANGS, RUNNERS  # noqa: E402

HISTORY = BENCH / "history" / "ratios.jsonl"
BENCHMARK_DATA = BENCH / "history" / "benchmark-data.json"  # github-action-benchmark's format
T0_ENV = "WIREPOOL_BENCH_T0"  # wall-clock start of the run (seconds since the epoch)


def run_start() -> float:
    try:
        return float(os.environ[T0_ENV])
    except (KeyError, ValueError):
        return time.time()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=["run", "check", "gate"], default="run")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="16 scenarios (the ends of each axis), small counts, 3 repeats, "
                           "about 1 minute (default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="the specified grid, 5 repeats (3 for 256 MiB and 1 M rows), "
                           "about 17 minutes")
    p.add_argument("--only", default="", help="comma-separated workloads or id prefixes: W1,W3.echo")
    p.add_argument("--runners", default="", help="comma-separated runner names (default: all)")
    p.add_argument("--out", default="", help="output directory (default bench/results/<UTC time>)")
    p.add_argument("--no-history", action="store_true", help="do not append to bench/history")
    p.add_argument("--history", default=str(HISTORY), help="history file (check and append)")
    p.add_argument("--threshold", type=float, default=None,
                   help="check: relative drop that counts as a regression (default 0.2); "
                        "gate: relative growth (default: the baseline's, 3%%)")
    p.add_argument("--rebaseline", action="store_true",
                   help="gate: measure and rewrite the baseline instead of comparing")
    p.add_argument("--baseline", default=str(icount.BASELINE), help="gate: the baseline file")
    p.add_argument("--samples", type=int, default=3,
                   help="gate --rebaseline: measurements whose median becomes the baseline "
                        "(default 3)")
    p.add_argument("--pairs", default="", help="gate: comma-separated parent_worker pairs "
                                               f"(default all: {','.join(icount.PAIRS)})")
    p.add_argument("--ops", default="", help="gate: comma-separated operations "
                                             f"(default all: {','.join(icount.OPS)})")
    p.add_argument("--consecutive", type=int, default=history.DEFAULT_CONSECUTIVE,
                   help="check: alert only when a drop holds over this many newest full runs "
                        f"(default {history.DEFAULT_CONSECUTIVE})")
    p.add_argument("--all-kinds", action="store_true",
                   help="check: track incumbents' ratios too, not only wirepool's")
    p.set_defaults(mode="quick")
    return p.parse_args(argv)


def _version(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "not found"


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    mem_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    procwire = "not installed"
    pkg = BENCH / "incumbents" / "node" / "node_modules" / "@procwire" / "core" / "package.json"
    if pkg.exists():
        procwire = json.loads(pkg.read_text())["version"]
    return {
        "cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem_gib,
        "kernel": platform.release(), "platform": platform.platform(),
        "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "versions": {
            "python": platform.python_version(),
            "node": _version(["node", "--version"]),
            "cc": _version([os.environ.get("CC", "cc"), "--version"]),
            "rustc": _version(["rustc", "--version"]),
            "procwire": procwire,
        },
    }


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=BENCH, capture_output=True, text=True,
                                  timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def resolve_runners(selected: set[str], venv_failure: str | None) -> list[dict[str, Any]]:
    """Availability and argv of every registered runner (unselected ones are left out)."""
    floor_path, floor_failure = setup.ensure_floor(log)
    wanted = [r for r in RUNNERS if not selected or r.name in selected]
    npm_failure = cargo_failure = None
    if any("npm" in r.needs for r in wanted):
        npm_failure = setup.ensure_npm(log)
    if any("cargo" in r.needs for r in wanted):
        cargo_failure = setup.ensure_rust_child(log)
    values = execute.placeholder_values(sys.executable, floor_path, setup.rust_child_path())
    failures = {"venv": venv_failure, "npm": npm_failure, "floor": floor_failure,
                "cargo": cargo_failure}
    out = []
    for r in RUNNERS:
        if selected and r.name not in selected:
            continue
        entry = {"name": r.name, "kind": r.kind, "label": r.label, "available": True,
                 "reason": "", "argv": []}
        missing = [f"{need}: {failures[need]}" for need in r.needs if failures.get(need)]
        argv = list(r.argv) if r.argv else (execute.discover(r.discover) if r.discover else None)
        if missing:
            entry.update(available=False, reason="; ".join(missing))
        elif argv is None:
            entry.update(available=False,
                         reason=f"bench/runners/{r.discover}.* not found (not written yet)")
        else:
            entry["argv"] = execute.expand(argv, values)
            if r.discover:
                log(f"bench: preparing {r.name}")
                failure = execute.prepare(entry["argv"])
                if failure:
                    entry.update(available=False, reason=failure)
        out.append(entry)
    return out


class Progress:
    """tqdm when the venv has it, else one rewritten stderr line."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.monotonic()
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="run", dynamic_ncols=True, file=sys.stderr)
        except ImportError:
            self.bar = None

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label[:60])
        else:
            elapsed = time.monotonic() - self.start
            sys.stderr.write(f"\r[{self.done}/{self.total}] {elapsed:5.0f}s {label[:70]:70}")
            sys.stderr.flush()

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\n")


def run(args: argparse.Namespace, venv_failure: str | None) -> int:
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    selected = {r.strip() for r in args.runners.split(",") if r.strip()}
    unknown = selected - {r.name for r in RUNNERS}
    if unknown:
        log(f"bench: unknown runner(s): {', '.join(sorted(unknown))}")
        return 2
    catalogue = scenarios.select(scenarios.build(args.mode, every_scenario=bool(only)), only)
    if not catalogue:
        log(f"bench: --only {args.only} matches no scenario")
        return 2
    started = dt.datetime.now(dt.timezone.utc)
    machine = machine_info()
    git = git_info()  # at the start: other people may commit while the benchmark runs
    runners = resolve_runners(selected, venv_failure)

    results, jobs = execute.plan(catalogue, runners)

    t0 = run_start()
    measuring_from = time.time()
    progress = Progress(len(jobs))
    try:
        for sc, r in jobs:
            progress.step(f"{sc['id']} {r['name']}")
            payload = {k: v for k, v in sc.items() if k != "only"}
            res = execute.run_scenario(r["argv"], payload)
            res["runner"] = r["name"]
            analysis.add_derived_figures(res, sc)
            analysis.attach_stats(res)
            results.append(res)
            progress.advance()
    finally:
        progress.close()
        execute.kill_live_groups()

    measuring_s = time.time() - measuring_from
    machine["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    kinds = {r["name"]: r["kind"] for r in runners}
    out_dir = Path(args.out) if args.out else (
        BENCH / "results" / started.strftime("%Y%m%dT%H%M%SZ"))
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": 1, "mode": args.mode, "only": only,
        "command": " ".join(["python3", "bench/run.py", *sys.argv[1:]]),
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "repeats": collections.Counter(sc["repeats"] for sc in catalogue).most_common(1)[0][0],
        "machine": machine, "git": git,
        "runners": [{k: v for k, v in r.items() if k != "argv"} for r in runners],
        "scenarios": [{k: v for k, v in sc.items() if k != "only"} | {"only": sc.get("only")}
                      for sc in catalogue],
        "results": results,
        "comparisons": analysis.compare(results, kinds),
        # The founding workload's report (harness/founding.py): each runner's languages.
        "founding_langs": _LANGS,
    }

    plots: list[str] = []
    try:
        from harness import plots as plotting
        plots = plotting.render(doc, out_dir)
    except ImportError as exc:
        log(f"bench: no plots ({exc}); matplotlib comes from bench/.venv")
    # The total covers everything up to here (setup, measuring, plots); the two writes left
    # take milliseconds.
    doc["durations"] = analysis.durations(results, measuring_from - t0, measuring_s,
                                          time.time() - t0)

    # The committed history records whole full runs only, so its lines stay comparable; an
    # explicit --history FILE records any run (e.g. one scenario before and after a change).
    whole_full_run = args.mode == "full" and not only and not selected
    explicit_history = Path(args.history).resolve() != HISTORY.resolve()
    if (whole_full_run or explicit_history) and not args.no_history:
        history.append(Path(args.history), history.history_line(doc))
        log(f"bench: appended ratios to {args.history}")
        if not explicit_history:  # the whole history as github-action-benchmark stores it
            BENCHMARK_DATA.write_text(json.dumps(
                history.benchmark_data(history.load(HISTORY)), indent=1) + "\n")
    # This run as github-action-benchmark's inputs (customBiggerIsBetter / SmallerIsBetter).
    for name, entries in zip(("bigger", "smaller"), history.github_benchmark(doc)):
        (out_dir / f"github-action-benchmark-{name}.json").write_text(
            json.dumps(entries, indent=1) + "\n")
    if args.mode == "full":  # the trend over the full runs, and whether an alert holds
        lines = history.load(Path(args.history))
        said: list[str] = []
        history.check(Path(args.history), history.DEFAULT_THRESHOLD, ("wirepool",),
                      out=said.append, consecutive=history.DEFAULT_CONSECUTIVE)
        trend_plots: list[str] = []
        try:
            from harness import plots as plotting
            trend_plots = plotting.trend(lines, out_dir) if lines else []
        except ImportError:
            pass
        doc["trend"] = {"history": str(args.history), "runs": len(lines), "check": said,
                        "consecutive": history.DEFAULT_CONSECUTIVE, "plots": trend_plots}
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "report.md").write_text(report.render(doc, plots))
    bad = [r for r in results if r["status"] in ("error", "timeout")]
    d = doc["durations"]
    log(f"bench: {len(results)} results, {len(bad)} errors/timeouts; report: "
        f"{out_dir / 'report.md'}")
    log(f"bench: {args.mode} run took {analysis.fmt_duration(d['total_s'])} "
        f"(setup {analysis.fmt_duration(d['setup_s'])}, measuring "
        f"{analysis.fmt_duration(d['measuring_s'])})")
    print(out_dir / "report.md")
    return 0


def gate(args: argparse.Namespace) -> int:
    """Instructions per operation against the committed baseline (see harness/icount.py)."""
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()] or list(icount.PAIRS)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] or list(icount.OPS)
    unknown = [p for p in pairs if p not in icount.PAIRS] + [o for o in ops if o not in icount.OPS]
    if unknown:
        log(f"bench gate: unknown pair(s) or operation(s): {', '.join(unknown)}")
        return 2
    started = time.time()
    if any("rust" in p for p in pairs):
        failure = execute.prepare(["bash", str(BENCH / "runners" / "wirepool_rust.sh")])
        if failure:
            log(f"bench gate: building rust/wirepool-bench failed: {failure}")
            return 1
    git = git_info()
    samples = max(1, args.samples) if args.rebaseline else 1
    try:
        measured = []
        for i in range(samples):
            if samples > 1:
                log(f"bench gate: measurement {i + 1} of {samples}")
            measured.append(icount.measure(pairs, ops, sys.executable, log=log))
        figures = measured[0] if samples == 1 else icount.median_figures(measured)
    except (RuntimeError, subprocess.SubprocessError) as exc:
        log(f"bench gate: FAILED, could not count: {exc}")
        return 1
    env = icount.environment(sys.executable)
    out_dir = Path(args.out) if args.out else (
        BENCH / "results" / (dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                             + "-icount"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "icount.json").write_text(json.dumps(
        {"git": git, "environment": env, "figures": figures}, indent=1) + "\n")
    (out_dir / "github-action-benchmark-icount.json").write_text(
        json.dumps(icount.github_benchmark(figures), indent=1) + "\n")
    baseline_path = Path(args.baseline)
    baseline = icount.load_baseline(baseline_path)
    took = analysis.fmt_duration(time.time() - started)
    if args.rebaseline:
        icount.write_baseline(baseline_path, figures, git["commit"], env, baseline)
        if baseline is not None:
            log("bench gate: the new counts against the baseline they replace:")
            icount.compare(baseline, figures, git["commit"][:12], args.threshold, env, out=print,
                           verdict=False)
        log(f"bench gate: wrote {baseline_path} ({len(figures)} figures, {took}); commit it")
        return 0
    if baseline is None:
        log(f"bench gate: FAILED, no baseline at {baseline_path}: measure one with "
            "`make bench-baseline` and commit it")
        return 1
    commit = git["commit"][:12] + (" (dirty tree)" if git["dirty"] else "")
    status = icount.compare(baseline, figures, commit, args.threshold, env, out=print)
    log(f"bench gate: {took}; figures in {out_dir / 'icount.json'}")
    return status


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.command == "check":
        kinds = ("wirepool", "incumbent") if args.all_kinds else ("wirepool",)
        threshold = history.DEFAULT_THRESHOLD if args.threshold is None else args.threshold
        return history.check(Path(args.history), threshold, kinds,
                             consecutive=max(1, args.consecutive))

    # The run's clock starts before the venv step; the re-executed harness inherits it.
    if not setup.in_venv() or T0_ENV not in os.environ:
        os.environ[T0_ENV] = repr(time.time())
    venv_failure = setup.ensure_venv(log)
    if venv_failure is None and not setup.in_venv():
        python = str(setup.venv_python())
        os.execv(python, [python, str(Path(__file__).resolve()), *argv])
    if venv_failure:
        log(f"bench: running without the venv ({venv_failure}): no plots, no orjson runner")

    def on_term(signum, frame):  # a killed harness takes its runners with it
        execute.kill_live_groups()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        if args.command == "gate":
            if venv_failure:  # the counts depend on the codec libraries: only the pinned ones
                log(f"bench gate: FAILED, no bench/.venv ({venv_failure})")
                return 1
            return gate(args)
        return run(args, venv_failure)
    except KeyboardInterrupt:
        execute.kill_live_groups()
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
