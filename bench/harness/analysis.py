"""Statistics over repeats and the ratios every report and history line is made of.

A ratio is always oriented so that > 1 means "better than the reference": value / reference for
throughputs, reference / value for latencies.
"""

from __future__ import annotations

import statistics
from typing import Any

# The codec suffixes of the W4 scenario ids (harness/scenarios.CODECS without json).
CODEC_SUFFIXES = ("msgpack", "cbor", "raw")


def summarize(values: list[float]) -> dict[str, float]:
    clean = [v for v in values if isinstance(v, (int, float)) and v == v]
    if not clean:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    return {"min": min(clean), "median": statistics.median(clean), "max": max(clean)}


def goodness(value: float | None, reference: float | None, better: str) -> float | None:
    if value is None or reference is None or value <= 0 or reference <= 0:
        return None
    return value / reference if better == "higher" else reference / value


def add_derived_figures(result: dict[str, Any], scenario: dict[str, Any]) -> None:
    """Pool efficiency: measured tasks/s over the ideal min(workers, cores) / task time."""
    if result.get("status") != "ok" or scenario.get("kind") != "pool":
        return
    ideal = scenario.get("ideal_tasks_per_s")
    for fig in list(result["figures"]):
        if fig["name"] == "tasks_per_s" and ideal:
            result["figures"].append({"name": "efficiency", "unit": "x ideal", "better": "higher",
                                      "values": [v / ideal for v in fig["values"]]})


def attach_stats(result: dict[str, Any]) -> None:
    for fig in result.get("figures", []):
        fig.update(summarize(fig["values"]))


def durations(results: list[dict[str, Any]], setup_s: float, measuring_s: float,
              total_s: float) -> dict[str, Any]:
    """Where a run's time went: setup (venv, npm, builds, --prepare), the runner processes
    (`wall_s` of every result, summed per scenario and per runner, each sorted slowest first),
    and the whole run including the report and plots."""
    per_scenario: dict[str, float] = {}
    per_runner: dict[str, float] = {}
    for res in results:
        wall = res.get("wall_s")
        if wall is None:
            continue
        per_scenario[res["scenario"]] = per_scenario.get(res["scenario"], 0.0) + wall
        per_runner[res["runner"]] = per_runner.get(res["runner"], 0.0) + wall

    def slowest_first(d: dict[str, float]) -> dict[str, float]:
        return {k: round(v, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}

    return {"setup_s": round(setup_s, 3), "measuring_s": round(measuring_s, 3),
            "total_s": round(total_s, 3), "per_scenario_s": slowest_first(per_scenario),
            "per_runner_s": slowest_first(per_runner)}


def fmt_duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def compare(results: list[dict[str, Any]], kinds: dict[str, str]) -> list[dict[str, Any]]:
    """One comparison row per (scenario, figure): the floor, the best incumbent, every runner's
    median and its ratios against both."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    order: list[tuple[str, str]] = []
    for res in results:
        if res.get("status") != "ok":
            continue
        for fig in res["figures"]:
            key = (res["scenario"], fig["name"])
            if key not in rows:
                rows[key] = {"scenario": res["scenario"], "figure": fig["name"],
                             "unit": fig["unit"], "better": fig["better"], "medians": {},
                             "spreads": {}}
                order.append(key)
            rows[key]["medians"][res["runner"]] = fig["median"]
            rows[key]["spreads"][res["runner"]] = (
                (fig["max"] - fig["min"]) / fig["median"] if fig["median"] else None)
    def best_incumbent(key: tuple[str, str]) -> dict[str, Any] | None:
        row = rows.get(key)
        incumbents = {r: m for r, m in row["medians"].items()
                      if kinds.get(r) == "incumbent" and m == m} if row else {}
        if not incumbents:
            return None
        pick = max if row["better"] == "higher" else min
        name = pick(incumbents, key=lambda r: incumbents[r])
        return {"runner": name, "median": incumbents[name]}

    out = []
    for key in order:
        row = rows[key]
        better = row["better"]
        floor = next((m for r, m in row["medians"].items() if kinds.get(r) == "floor"), None)
        best = best_incumbent(key)
        # A codec variant (W4.small_rows.64K.msgpack) has no incumbent of its own: each baseline
        # has one codec, measured on the scenario without the suffix, which is the figure a
        # wirepool codec competes with (issue 17). The borrowed reference says where it is from.
        base, _, codec = key[0].rpartition(".")
        if best is None and codec in CODEC_SUFFIXES:
            best = best_incumbent((base, key[1]))
            if best is not None:
                best["scenario"] = base
        per_runner = {}
        for runner, median in row["medians"].items():
            per_runner[runner] = {
                "median": median,
                "spread": row["spreads"][runner],
                "vs_floor": goodness(median, floor, better),
                "vs_best_incumbent": goodness(median, best["median"] if best else None, better),
            }
        out.append({**{k: row[k] for k in ("scenario", "figure", "unit", "better")},
                    "floor": floor, "best_incumbent": best, "runners": per_runner})
    return out
