"""Running one runner on one scenario: bounded in time, its whole process group killed after."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .setup import BENCH

# Process groups of runners still running, so an interrupted harness can kill them all.
_live_groups: set[int] = set()


def kill_live_groups() -> None:
    for pgid in list(_live_groups):
        _kill_group(pgid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _live_groups.discard(pgid)


def discover(stem: str, runners: Path = BENCH / "runners") -> list[str] | None:
    """argv prefix for bench/runners/<stem>.<ext>, or None when no such file exists."""
    candidates = sorted(p for p in runners.glob(stem + ".*") if p.is_file())
    exact = runners / stem
    if exact.is_file():
        candidates.insert(0, exact)
    for path in candidates:
        if path.suffix == ".py":
            return ["{python}", str(path)]
        if path.suffix in (".mjs", ".js"):
            return ["{node}", str(path)]
        if path.suffix == ".sh":
            return ["bash", str(path)]
        if os.access(path, os.X_OK):
            return [str(path)]
    return None


def expand(argv: list[str] | tuple[str, ...], values: dict[str, str]) -> list[str]:
    return [a.format(**values) for a in argv]


def placeholder_values(python: str, floor: Path, rust_child: Path) -> dict[str, str]:
    return {"python": python, "node": shutil.which("node") or "node", "bench": str(BENCH),
            "floor": str(floor), "jsonl_rust_child": str(rust_child)}


def _tail(text: str, lines: int = 8) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])[-1200:]


def run_process(argv: list[str], timeout_s: float) -> tuple[int | None, str, str, float]:
    """Run argv in its own session; returns (exit code or None on timeout, stdout, stderr, s)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=str(BENCH))
    _live_groups.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        code = None
    finally:
        # Children that outlive their runner (a stuck worker, a leaked pool) die with the group.
        _kill_group(proc.pid)
    return code, out, err, time.monotonic() - start


def prepare(argv: list[str], timeout_s: float = 900.0) -> str | None:
    code, out, err, _ = run_process(argv + ["--prepare"], timeout_s)
    if code is None:
        return f"--prepare timed out after {timeout_s:.0f} s"
    if code != 0:
        return f"--prepare exited {code}: {_tail(err or out)}"
    return None


def plan(catalogue: list[dict[str, Any]], runners: list[dict[str, Any]]
         ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """(results known without running, (scenario, runner) jobs to run).

    A scenario's `only` drops other runners entirely (floor-only references); its
    `runner_kinds` keeps the others as `not_applicable` results with the scenario's reason
    (baselines on a codec they do not have), so the report shows "n/a", never a silent gap.
    """
    results: list[dict[str, Any]] = []
    jobs = []
    for sc in catalogue:
        for r in runners:
            if sc.get("only") and r["name"] not in sc["only"]:
                continue
            if sc.get("runner_kinds") and r["kind"] not in sc["runner_kinds"]:
                results.append({"runner": r["name"], "scenario": sc["id"],
                                "status": "not_applicable", "reason": sc["not_applicable"]})
            elif not r["available"]:
                results.append({"runner": r["name"], "scenario": sc["id"],
                                "status": "not_available", "reason": r["reason"]})
            else:
                jobs.append((sc, r))
    return results, jobs


def run_scenario(argv: list[str], scenario: dict[str, Any]) -> dict[str, Any]:
    """One runner on one scenario. Always returns a result with a status, never raises."""
    limit = float(scenario.get("time_limit_s", 60))
    code, out, err, elapsed = run_process(argv + [json.dumps(scenario)], limit)
    base = {"scenario": scenario["id"], "wall_s": round(elapsed, 3)}
    if code is None:
        return {**base, "status": "timeout",
                "reason": f"killed after {limit:.0f} s; stderr: {_tail(err)}"}
    result = None
    for line in reversed(out.strip().splitlines()):
        try:
            candidate = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(candidate, dict) and "status" in candidate:
            result = candidate
            break
    if code != 0 or result is None:
        return {**base, "status": "error",
                "reason": f"exit {code}; stderr: {_tail(err) or '(empty)'}"}
    result.update(base)
    return result
