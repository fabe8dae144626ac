"""bench/history/ratios.jsonl: one line per full run, and the regression check over it.

Ratios are kept (against the floor and the best incumbent measured in the same run): absolute
figures on a shared 2-vCPU machine move 20-40% between runs, ratios from one run move less. But a
baseline also moves by itself between runs (the C floor's small rows went 18.8 M -> 33.2 M rows/s
between two full runs here, with no change to it), which drops every ratio against it. So a ratio
drop counts as a regression only when the runner's own median (also kept) dropped by the threshold
too; a drop of the ratio alone is reported as the baseline's move, not counted. Lines without the
runner's own median (older ones) are compared by ratio alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS = ("vs_floor", "vs_best_incumbent")
DEFAULT_THRESHOLD = 0.20


def history_line(results: dict[str, Any]) -> dict[str, Any]:
    kinds = {r["name"]: r["kind"] for r in results["runners"]}
    ratios: dict[str, dict[str, float | None]] = {}
    for row in results["comparisons"]:
        for runner, fig in row["runners"].items():
            if kinds.get(runner) == "floor":
                continue
            key = f"{runner}|{row['scenario']}|{row['figure']}"
            ratios[key] = {**{m: fig[m] for m in METRICS}, "median": fig["median"],
                           "better": row["better"]}
    return {"timestamp": results["started"], "commit": results["git"]["commit"],
            "mode": results["mode"], "cpu": results["machine"]["cpu"],
            "kinds": kinds, "ratios": ratios}


def append(path: Path, line: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = []
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if text.strip():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc})") from exc
    return lines


def _own_change(old: dict[str, Any], new: dict[str, Any]) -> float | None:
    """new / old of the runner's own median, > 1 meaning better; None when a line lacks it."""
    a, b = old.get("median"), new.get("median")
    if not a or not b or a != a or b != b or a <= 0 or b <= 0:
        return None
    return b / a if old.get("better", "higher") == "higher" else a / b


def regressions(previous: dict[str, Any], newest: dict[str, Any],
                threshold: float = DEFAULT_THRESHOLD,
                kinds: tuple[str, ...] = ("wirepool",),
                baseline_moves: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every tracked ratio that fell by more than `threshold` (relative) while the runner's own
    median fell by it too (or is not recorded), and every tracked figure the previous run had
    and the newest one lacks (a silent gap is a regression too). Ratio drops with the runner's
    own median steady go to `baseline_moves` when given."""
    found = []
    runner_kind = {**previous.get("kinds", {}), **newest.get("kinds", {})}
    for key, old in sorted(previous["ratios"].items()):
        runner = key.split("|", 1)[0]
        if runner_kind.get(runner) not in kinds:
            continue
        new = newest["ratios"].get(key)
        if new is None:
            found.append({"key": key, "metric": None, "old": None, "new": None,
                          "why": "missing from the newest run"})
            continue
        for metric in METRICS:
            before, after = old.get(metric), new.get(metric)
            if before is None or before <= 0:
                continue
            if after is None or after < before * (1.0 - threshold):
                drop = {"key": key, "metric": metric, "old": before, "new": after,
                        "why": f"dropped {100 * (1 - (after or 0) / before):.0f}%"}
                own = _own_change(old, new) if after is not None else None
                if own is not None and own >= 1.0 - threshold:
                    drop["why"] += f"; its own median moved {100 * (own - 1):+.0f}%"
                    if baseline_moves is not None:
                        baseline_moves.append(drop)
                    continue
                found.append(drop)
    return found


def check(path: Path, threshold: float = DEFAULT_THRESHOLD,
          kinds: tuple[str, ...] = ("wirepool",), out=print) -> int:
    """Exit status for `run.py check`: 1 when the newest run regressed against the previous."""
    lines = load(path)
    if len(lines) < 2:
        out(f"check: {len(lines)} run(s) in {path}; need two to compare, nothing to do")
        return 0
    previous, newest = lines[-2], lines[-1]
    tracked = [k for k in previous["ratios"]
               if previous.get("kinds", {}).get(k.split("|", 1)[0]) in kinds]
    if not tracked:
        out(f"check: the previous run has no ratios for runners of kind {', '.join(kinds)}; "
            "nothing to compare")
        return 0
    moved: list[dict[str, Any]] = []
    bad = regressions(previous, newest, threshold, kinds, moved)
    out(f"check: {newest['commit'][:12]} ({newest['timestamp']}) against "
        f"{previous['commit'][:12]} ({previous['timestamp']}): {len(tracked)} tracked ratios, "
        f"threshold {threshold:.0%}")
    for r in bad:
        metric = f" {r['metric']}" if r["metric"] else ""
        values = "" if r["old"] is None else f" {r['old']:.3f} -> " + (
            "none" if r["new"] is None else f"{r['new']:.3f}")
        out(f"  REGRESSION {r['key']}{metric}:{values} ({r['why']})")
    for r in moved:
        out(f"  not counted, the baseline moved: {r['key']} {r['metric']}: {r['old']:.3f} -> "
            f"{r['new']:.3f} ({r['why']})")
    if not bad:
        out("check: no ratio dropped by more than the threshold")
    return 1 if bad else 0
