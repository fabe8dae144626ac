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
# `run.py check` alerts on a drop only when each of this many newest full runs shows it against
# the run before them: one full run on this VM differs from the next by more than 20% in places
# for the same code; a regression persists, noise does not.
DEFAULT_CONSECUTIVE = 3


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


def persistent_regressions(lines: list[dict[str, Any]], threshold: float = DEFAULT_THRESHOLD,
                           kinds: tuple[str, ...] = ("wirepool",), consecutive: int = 1
                           ) -> list[dict[str, Any]]:
    """The regressions that each of the newest `consecutive` lines shows against the line just
    before them all (same figure, same metric); the newest line's values are reported."""
    reference = lines[-consecutive - 1]
    found = [{(r["key"], r["metric"]): r for r in regressions(reference, newer, threshold, kinds)}
             for newer in lines[-consecutive:]]
    common = set(found[0]).intersection(*found[1:])
    return [found[-1][k] for k in sorted(common, key=lambda k: (k[0], k[1] or ""))]


def _describe(r: dict[str, Any]) -> str:
    metric = f" {r['metric']}" if r["metric"] else ""
    values = "" if r["old"] is None else f" {r['old']:.3f} -> " + (
        "none" if r["new"] is None else f"{r['new']:.3f}")
    return f"{r['key']}{metric}:{values} ({r['why']})"


def check(path: Path, threshold: float = DEFAULT_THRESHOLD,
          kinds: tuple[str, ...] = ("wirepool",), out=print, consecutive: int = 1) -> int:
    """Exit status for `run.py check`: 1 when a tracked ratio fell by more than `threshold` in
    each of the newest `consecutive` full runs against the run before them."""
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
    latest = regressions(previous, newest, threshold, kinds, moved)
    enough = len(lines) >= consecutive + 1
    bad = persistent_regressions(lines, threshold, kinds, consecutive) if enough else []
    reference = lines[-consecutive - 1] if enough else previous
    out(f"check: {newest['commit'][:12]} ({newest['timestamp']}) against "
        f"{reference['commit'][:12]} ({reference['timestamp']}): {len(tracked)} tracked ratios, "
        f"threshold {threshold:.0%}, alert when a drop holds over {consecutive} consecutive "
        f"full run(s)")
    if not enough:
        out(f"check: {len(lines)} full runs in {path}, an alert needs {consecutive + 1}: the "
            "drops below are to watch, not counted")
    for r in bad:
        out(f"  REGRESSION {_describe(r)}, in each of the newest {consecutive} full run(s)")
    alerted = {(r["key"], r["metric"]) for r in bad}
    for r in latest:
        if (r["key"], r["metric"]) not in alerted:
            out(f"  watch (newest run against the previous only) {_describe(r)}")
    for r in moved:
        out(f"  not counted, the baseline moved: {r['key']} {r['metric']}: {r['old']:.3f} -> "
            f"{r['new']:.3f} ({r['why']})")
    if not bad:
        out(f"check: no ratio dropped by more than the threshold over {consecutive} "
            "consecutive full run(s)")
    return 1 if bad else 0


# github-action-benchmark (https://github.com/benchmark-action/github-action-benchmark): its
# `customBiggerIsBetter` / `customSmallerIsBetter` tools read a JSON list of
# {"name", "unit", "value", "range"?, "extra"?}; its chart page reads the stored history
# `window.BENCHMARK_DATA = {"lastUpdate", "repoUrl", "entries": {suite: [run, ...]}}`.
SUITE_BIGGER = "wirepool wall-clock (bigger is better)"
SUITE_SMALLER = "wirepool wall-clock (smaller is better)"


def github_benchmark(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A run's wirepool medians as the action's (customBiggerIsBetter, customSmallerIsBetter)
    inputs, with the spread of the repeats as `range` and the ratios as `extra`."""
    kinds = {r["name"]: r["kind"] for r in doc["runners"]}
    bigger: list[dict[str, Any]] = []
    smaller: list[dict[str, Any]] = []
    for row in doc["comparisons"]:
        for runner, fig in row["runners"].items():
            if kinds.get(runner) != "wirepool" or fig["median"] != fig["median"]:
                continue
            spread = fig.get("spread")
            ratios = ", ".join(f"{m} {fig[m]:.3f}" for m in METRICS if fig.get(m) is not None)
            entry = {"name": f"{runner} {row['scenario']} {row['figure']}", "unit": row["unit"],
                     "value": fig["median"], "extra": ratios or "no baseline in this run"}
            if spread is not None:
                entry["range"] = f"{100 * spread:.0f}% (max - min of repeats / median)"
            (bigger if row["better"] == "higher" else smaller).append(entry)
    return bigger, smaller


def benchmark_data(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole history in the action's stored format (its data.js without the assignment):
    one entry per full run and suite: every wirepool ratio (bigger is better) and, where the
    line has it, the runner's own median."""
    entries: dict[str, list[dict[str, Any]]] = {SUITE_BIGGER: [], SUITE_SMALLER: []}
    for line in lines:
        date_ms = int(_epoch(line["timestamp"]) * 1000)
        benches: dict[str, list[dict[str, Any]]] = {SUITE_BIGGER: [], SUITE_SMALLER: []}
        for key, fig in sorted(line["ratios"].items()):
            runner = key.split("|", 1)[0]
            if line.get("kinds", {}).get(runner) != "wirepool":
                continue
            name = key.replace("|", " ")
            # Ratios are oriented so that bigger is better, latencies included.
            for m in METRICS:
                if fig.get(m) is not None:
                    benches[SUITE_BIGGER].append({"name": f"{name} {m}", "unit": "x",
                                                  "value": fig[m]})
            if fig.get("median") is not None:  # lines before 2026-11-22 04:58 lack it
                suite = SUITE_BIGGER if fig.get("better", "higher") == "higher" else SUITE_SMALLER
                benches[suite].append({"name": name, "unit": "", "value": fig["median"]})
        for suite, tool in ((SUITE_BIGGER, "customBiggerIsBetter"),
                            (SUITE_SMALLER, "customSmallerIsBetter")):
            if benches[suite]:
                entries[suite].append({"commit": {"id": line["commit"],
                                                  "timestamp": line["timestamp"]},
                                       "date": date_ms, "tool": tool, "benches": benches[suite]})
    last = max((e["date"] for runs in entries.values() for e in runs), default=0)
    return {"lastUpdate": last, "repoUrl": "", "entries": entries}


def _epoch(timestamp: str) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(timestamp).timestamp()
