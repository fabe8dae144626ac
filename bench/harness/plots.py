"""PNG plots of a results.json (needs matplotlib from bench/.venv)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLE = {"floor": dict(color="black", linewidth=2.5), "wirepool": dict(linewidth=2.5)}


def _series(results: dict[str, Any], workload: str, figure: str, id_prefix: str = ""
            ) -> dict[str, list[tuple[float, float, float, float]]]:
    """runner -> [(x, min, median, max)] for one figure of one workload."""
    # One line per runner: the JSON rows (the codec scenarios would stack points on one x).
    scen = {s["id"]: s for s in results["scenarios"] if s["workload"] == workload
            and s["id"].startswith(id_prefix) and s.get("codec", "json") == "json"}
    out: dict[str, list[tuple[float, float, float, float]]] = {}
    for res in results["results"]:
        if res.get("status") != "ok" or res["scenario"] not in scen:
            continue
        for fig in res["figures"]:
            if fig["name"] == figure:
                out.setdefault(res["runner"], []).append(
                    (scen[res["scenario"]]["x"], fig["min"], fig["median"], fig["max"]))
    for pts in out.values():
        pts.sort()
    return out


def _colors(results: dict[str, Any]) -> dict[str, Any]:
    """One colour per runner for every plot: black for the floor, tab20 for the others."""
    import matplotlib

    palette = matplotlib.colormaps["tab20"].colors
    others = [r["name"] for r in results["runners"] if r["kind"] != "floor"]
    colors = {name: palette[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20]
              for i, name in enumerate(others)}
    colors.update({r["name"]: "black" for r in results["runners"] if r["kind"] == "floor"})
    return colors


def _draw(ax, series, kinds, colors, linestyle="-", label=True):
    for runner, pts in series.items():
        xs = [p[0] for p in pts]
        med = [p[2] for p in pts]
        err = [[p[2] - p[1] for p in pts], [p[3] - p[2] for p in pts]]
        style = dict(STYLE.get(kinds.get(runner, ""), {}))
        style.setdefault("color", colors.get(runner))
        ax.errorbar(xs, med, yerr=err, marker="o", markersize=3, capsize=2, linestyle=linestyle,
                    label=runner if label else None, **style)


def render(results: dict[str, Any], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = {r["name"]: r["kind"] for r in results["runners"]}
    colors = _colors(results)
    written: list[str] = []

    # Throughput against payload size.
    panels = [("W1", "calls_per_s", "", "W1 unary echo, 1 in flight", "calls/s"),
              ("W3", "mb_per_s", "W3.oneway", "W3 one-way", "MB/s"),
              ("W3", "mb_per_s", "W3.echo", "W3 echo (both directions)", "MB/s")]
    panels = [p for p in panels if _series(results, p[0], p[1], p[2])]
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
        for ax, (wl, name, prefix, title, unit) in zip(axes[0], panels):
            _draw(ax, _series(results, wl, name, prefix), kinds, colors)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("payload bytes")
            ax.set_ylabel(unit)
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "throughput_vs_payload.png", dpi=110)
        plt.close(fig)
        written.append("throughput_vs_payload.png")

    # Latency percentiles.
    p50 = _series(results, "W1", "p50_us")
    if p50:
        fig, ax = plt.subplots(figsize=(8, 5))
        _draw(ax, p50, kinds, colors, "-")
        _draw(ax, _series(results, "W1", "p99_us"), kinds, colors, "--", label=False)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("payload bytes")
        ax.set_ylabel("round trip, us")
        ax.set_title("W1 round trip, one in flight: p50 solid, p99 dashed")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "latency_percentiles.png", dpi=110)
        plt.close(fig)
        written.append("latency_percentiles.png")

    # Pool scaling.
    tasks = sorted({s["task_us"] for s in results["scenarios"] if s["workload"] == "W5"})
    tasks = [t for t in tasks if _series(results, "W5", "efficiency", f"W5.task{t}us.")]
    if tasks:
        fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.5), squeeze=False)
        for ax, t in zip(axes[0], tasks):
            _draw(ax, _series(results, "W5", "efficiency", f"W5.task{t}us."), kinds, colors)
            ax.axhline(1.0, color="grey", linestyle=":", label="ideal")
            ax.set_xlabel("workers")
            ax.set_ylabel("tasks/s over ideal min(workers, cores)/task")
            ax.set_title(f"W5 pool scaling, {t} us tasks")
            ax.set_xticks([1, 2, 4])
            ax.set_ylim(0, 1.2)
            ax.grid(True, alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "pool_scaling.png", dpi=110)
        plt.close(fig)
        written.append("pool_scaling.png")

    # W7: one bar per runner (median, min-max whiskers), the floor moving the same bytes first.
    w7 = _series(results, "W7", "mb_per_s")
    if w7:
        names = sorted(w7, key=lambda r: (kinds.get(r) != "floor", r))
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) + 2), 4.5))
        for i, r in enumerate(names):
            _, lo, med, hi = w7[r][0]
            ax.bar(i, med, color=colors.get(r), yerr=[[med - lo], [hi - med]], capsize=3)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("MB/s of the IPC stream")
        ax.set_title("W7 Arrow batch (1 M rows), worker to parent")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "arrow_batches.png", dpi=110)
        plt.close(fig)
        written.append("arrow_batches.png")

    # The founding workload: one horizontal bar per (runner, codec) and shape, median with
    # min-max whiskers, wirepool pairs first, then the incumbents and the codec alone.
    from . import founding
    from .scenarios import FOUNDING_SHAPES

    tabs = founding.tables(results, results.get("founding_langs") or {})
    for shape in FOUNDING_SHAPES:
        rows = tabs.get(shape)
        if not rows:
            continue
        rows = rows[::-1]
        fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.6))
        for i, r in enumerate(rows):
            med = r["median"]
            ax.barh(i, med, color=colors.get(r["runner"]),
                    xerr=[[med - r["min"]], [r["max"] - med]], capsize=2)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{r['runner']} ({r['codec'] if r['kind'] != 'incumbent' else 'own'})"
                            for r in rows], fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("rows/s (median, min-max)")
        ax.set_title(f"{shape}: wirepool end to end, incumbents, codec alone")
        ax.grid(True, axis="x", which="both", alpha=0.3)
        fig.tight_layout()
        name = f"founding_{shape}.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def trend(lines: list[dict[str, Any]], out_dir: Path, metric: str = "vs_floor") -> list[str]:
    """One PNG per workload: every wirepool ratio (`metric`, > 1 better) across the full runs of
    the history, oldest first, so a change that holds shows as a step and noise as jitter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{line['timestamp'][:16]}\n{line['commit'][:7]}" for line in lines]
    per_workload: dict[str, dict[str, list[float | None]]] = {}
    for i, line in enumerate(lines):
        for key, fig in line["ratios"].items():
            runner, scenario, _ = key.split("|", 2)
            if line.get("kinds", {}).get(runner) != "wirepool":
                continue
            series = per_workload.setdefault(scenario.split(".", 1)[0], {}).setdefault(
                key, [None] * len(lines))
            series[i] = fig.get(metric)
    written = []
    for workload, series in sorted(per_workload.items()):
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(lines) + 4), 5))
        for key, values in sorted(series.items()):
            pts = [(i, v) for i, v in enumerate(values) if v is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                        linewidth=1, label=key.replace("|", " "))
        ax.set_xticks(range(len(lines)))
        ax.set_xticklabels(labels, fontsize=6)
        ax.set_yscale("log")
        ax.set_ylabel(f"{metric} (> 1 better)")
        ax.set_title(f"{workload}: wirepool {metric} over the full runs in the history")
        ax.grid(True, which="both", alpha=0.3)
        if len(series) <= 24:
            ax.legend(fontsize=5, loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.tight_layout()
        name = f"trend_{workload}.png"
        fig.savefig(out_dir / name, dpi=100)
        plt.close(fig)
        written.append(name)
    return written
