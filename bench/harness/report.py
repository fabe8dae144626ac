"""The Markdown report: one table per workload, memory, and where wirepool loses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import founding
from .analysis import fmt_duration
from .scenarios import FOUNDING_SHAPES, WORKLOAD_TITLES

# Repeats whose max - min exceeds half the median are marked `~` in the tables.
NOISY_SPREAD = 0.5

STATUS_CELL = {"unsupported": "unsupported", "timeout": "TIMEOUT", "error": "ERROR",
               "not_available": "not available", "not_applicable": "n/a"}


CODEC_NOTE = (
    "Codecs: the `wirepool codec` column is the codec the wirepool runners used (rows decoded "
    "into typed structs in Rust, dicts in Python; `raw` rows are the JSON text handed over as "
    "bytes, not decoded). Every baseline uses its own codec whatever the column says: floor_c "
    "JSON bytes it never parses, jsonl_* and node_fork_json JSON, node_fork_advanced V8 "
    "serialization, mp_* and process_pool_executor pickle, procwire msgpack, ipc_channel* bincode; on the other "
    "codecs they show `n/a`, and a codec row's `best incumbent` is the best baseline of the same "
    "rows in the scenario without the codec suffix (their own codec), which its `[.. best]` "
    "ratios are against.")


def fmt(v: float | None) -> str:
    if v is None or v != v:
        return "-"
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.2f}G"
    if a >= 1e6:
        return f"{v / 1e6:.2f}M"
    if a >= 1e4:
        return f"{v / 1e3:.0f}k"
    if a >= 1e3:
        return f"{v / 1e3:.1f}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f}"


def _status_index(results: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["runner"], r["scenario"]): r for r in results["results"]}


def _workload_table(results: dict[str, Any], workload: str, runners: list[dict[str, Any]]
                    ) -> list[str]:
    scens = {s["id"]: s for s in results["scenarios"] if s["workload"] == workload}
    scen_ids = list(scens)
    if not scen_ids:
        return []
    idx = _status_index(results)
    rows = [c for c in results["comparisons"] if c["scenario"] in scen_ids]
    names = [r["name"] for r in runners]
    # Which codec the wirepool runners used; the baselines always use their own (CODEC_NOTE).
    codec_col = any("codec" in s for s in scens.values())
    head = ["scenario", "figure"] + (["wirepool codec"] if codec_col else []) + names + [
        "best incumbent"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    covered = set()
    for c in rows:
        covered.add(c["scenario"])
        cells = [c["scenario"], f"{c['figure']} ({c['unit']})"]
        if codec_col:
            cells.append(scens[c["scenario"]].get("codec", "-"))
        for name in names:
            fig = c["runners"].get(name)
            if fig is not None:
                kind = next(r["kind"] for r in runners if r["name"] == name)
                cell = fmt(fig["median"])
                if (fig.get("spread") or 0) > NOISY_SPREAD:
                    cell += "~"
                if kind != "floor" and fig["vs_floor"] is not None:
                    cell += f" ({fmt_ratio(fig['vs_floor'])})"
                if kind == "wirepool" and fig["vs_best_incumbent"] is not None:
                    cell += f" [{fmt_ratio(fig['vs_best_incumbent'])} best]"
                cells.append(cell)
            else:
                res = idx.get((name, c["scenario"]))
                cells.append(STATUS_CELL.get(res["status"], res["status"]) if res else "-")
        best = c["best_incumbent"]
        borrowed = f" (of {best['scenario']})" if best and best.get("scenario") else ""
        cells.append(f"{best['runner']} {fmt(best['median'])}{borrowed}" if best else "-")
        lines.append("| " + " | ".join(cells) + " |")
    for sid in scen_ids:
        if sid in covered:
            continue
        cells = [sid, "-"] + ([scens[sid].get("codec", "-")] if codec_col else [])
        for name in names:
            res = idx.get((name, sid))
            cells.append(STATUS_CELL.get(res["status"], res["status"]) if res else "-")
        cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


FOUNDING_NOTE = (
    "The founding workload (issue 26, `bench/shapes/founding.json`): every runner makes the same "
    "rows (the digests are checked by `bench/tests/test_founding.py`), the worker yields one row "
    "at a time, the parent reads each row into a typed struct (Rust, serde), a dict (Python) or an "
    "object (Node) and checks its index. Three ways in one run: wirepool end to end; the "
    "incumbents (their own codec: ipc-channel bincode, Pipe pickle, fork JSON / V8, procwire "
    "msgpack; per message and batched by hand 256 rows per message); the codec alone (encode + "
    "decode of the same rows in one process with the SDK's own codec functions). `codec alone` "
    "of a mixed pair is the worker language's encode plus the parent language's decode per row; "
    "`e2e / codec` is the end-to-end median over it. `vs incumbent` is the median over the best "
    "incumbent of the parent's language in this run (any variant).")


def founding_section(results: dict[str, Any], langs: dict[str, tuple[str, str]]) -> list[str]:
    """One table per founding shape (harness/founding.py): rows/s min / median / max, the codec
    alone, end to end / codec alone, and the ratio to the best incumbent of the same language."""
    tabs = founding.tables(results, langs)
    lines: list[str] = []
    for shape in FOUNDING_SHAPES:
        rows = tabs.get(shape)
        if not rows:
            continue
        lines += ["", f"## {WORKLOAD_TITLES[shape]}", "", FOUNDING_NOTE, "",
                  "| pair | runner | codec | rows/s median | min - max | codec alone | "
                  "e2e / codec | best incumbent (same language) | vs incumbent |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            codec = r["codec"] if r["kind"] != "incumbent" else "own"
            if r["kind"] == "codec":
                alone = f"encode {fmt(r.get('encode'))}, decode {fmt(r.get('decode'))}"
            else:
                alone = fmt(r["codec_alone"])
            best = r["best_incumbent"]
            best_cell = f"{best['runner']} {fmt(best['median'])}" if best else "-"
            lines.append(
                f"| {founding.pair_label(r)} | {r['runner']} | {codec} | {fmt(r['median'])} | "
                f"{fmt(r['min'])} - {fmt(r['max'])} | {alone} | {fmt_ratio(r['vs_codec'])} | "
                f"{best_cell} | {fmt_ratio(r['vs_incumbent'])} |")
    return lines


def _memory_table(results: dict[str, Any], runners: list[dict[str, Any]]) -> list[str]:
    idx = _status_index(results)
    scen_ids = [s["id"] for s in results["scenarios"] if s["workload"] in ("W3", "W4", "W6")]
    if not scen_ids:
        return []
    names = [r["name"] for r in runners]
    lines = ["| scenario | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for sid in scen_ids:
        cells = [sid]
        for name in names:
            res = idx.get((name, sid))
            if res is None:
                cells.append("-")
            elif res["status"] != "ok":
                cells.append(STATUS_CELL.get(res["status"], res["status"]))
            else:
                rss = res.get("rss_kib") or {}
                cells.append(f"{mib(rss.get('parent'))} / {mib(rss.get('children'))}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _losses(results: dict[str, Any], runners: list[dict[str, Any]]) -> list[str]:
    wirepool = [r for r in runners if r["kind"] == "wirepool"]
    out: list[str] = []
    if not wirepool:
        return ["No wirepool runner is registered."]
    idx = _status_index(results)
    for r in wirepool:
        if not r["available"]:
            out.append(f"- **{r['name']}: not available in this run** ({r['reason']}). Every "
                       "figure below is a baseline; wirepool has not been measured.")
            continue
        losses, missing = [], []
        for c in results["comparisons"]:
            fig = c["runners"].get(r["name"])
            best = c["best_incumbent"]
            if fig is None:
                continue
            if best and fig["vs_best_incumbent"] is not None and fig["vs_best_incumbent"] < 1:
                losses.append(f"  - {c['scenario']} {c['figure']}: {fmt(fig['median'])} "
                              f"{c['unit']} against {best['runner']} {fmt(best['median'])} "
                              f"({fmt_ratio(fig['vs_best_incumbent'])})")
        for s in results["scenarios"]:
            res = idx.get((r["name"], s["id"]))
            if res is not None and res["status"] != "ok":
                missing.append(f"  - {s['id']}: {res['status']} ({res.get('reason', '')})")
        out.append(f"- **{r['name']}** loses to the best incumbent on {len(losses)} figure(s)"
                   + (":" if losses else "."))
        out.extend(losses)
        if missing:
            out.append(f"- **{r['name']}** did not produce a figure for {len(missing)} "
                       "scenario(s):")
            out.extend(missing)
    return out


def _other_repeats(results: dict[str, Any]) -> str:
    other = [f"{s['id']} {s['repeats']}" for s in results["scenarios"]
             if s.get("repeats", results["repeats"]) != results["repeats"]]
    return f" (except {', '.join(other)})" if other else ""


def _duration_lines(d: dict[str, Any] | None) -> list[str]:
    """The run's wall time, and where it went (the slowest scenarios and runners)."""
    if not d:
        return []
    top = ", ".join(f"{k} {v:.0f} s" for k, v in list(d["per_scenario_s"].items())[:5])
    runners = ", ".join(f"{k} {v:.0f} s" for k, v in d["per_runner_s"].items())
    return [f"- duration: {fmt_duration(d['total_s'])} (setup {fmt_duration(d['setup_s'])}, "
            f"measuring {fmt_duration(d['measuring_s'])}, the rest the report and plots); "
            f"slowest scenarios (all runners): {top}; per runner: {runners}"]


# The remote figures of issue 14 (TLS, W5 on Ray, the listener), recorded apart from the run by
# bench/remote_figures.py: the report includes the last recording as it stands.
REMOTE_FIGURES = Path(__file__).resolve().parent.parent / "remote" / "figures.md"


def _remote_section() -> list[str]:
    if not REMOTE_FIGURES.exists():
        return []
    body = [line for line in REMOTE_FIGURES.read_text(encoding="utf-8").splitlines()
            if not line.startswith("# ")]  # its own title
    return ["", "## Remote workers: TLS, the Ray launcher, the listener", "",
            "Not measured in this run: the last figures recorded by `bench/remote_figures.py` "
            "(`bench/remote/figures.md`), each section with its command, date, commit and load.",
            *body]


def render(results: dict[str, Any], plots: list[str]) -> str:
    m = results["machine"]
    runners = results["runners"]
    lines = [
        f"# wirepool benchmark report ({results['mode']} mode)",
        "",
        f"- `{results.get('command', 'python3 bench/run.py')}`, started {results['started']}, "
        f"finished {results['finished']}",
        f"- commit `{results['git']['commit']}`" + (" (dirty tree)" if results['git'].get('dirty')
                                                     else ""),
        f"- machine: {m['cpu']}, {m['cores']} logical cores, {m['mem_gib']} GiB, "
        f"kernel {m['kernel']}",
        f"- load average before / after: {m['load_before']} / {m['load_after']}",
        *_duration_lines(results.get("durations")),
        f"- versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"- {results['repeats']} repeats per figure{_other_repeats(results)}; cells are medians. `(0.42x)` is the ratio "
        "against the C floor and `[1.3x best]` against the best incumbent of the same run "
        "(> 1 is better; for latencies the ratio is inverted so > 1 still means better). "
        "A `~` marks a figure whose repeats spread by more than half its median.",
        "",
        "Only ratios from one run mean anything: absolute figures on a shared 2-vCPU VM move "
        "20-40% between runs. The floor moves bytes and length prefixes only; it never parses "
        "a payload or a row.",
        "",
        "## Runners",
        "",
        "| runner | kind | what | status |",
        "|---|---|---|---|",
    ]
    for r in runners:
        status = "available" if r["available"] else f"not available: {r['reason']}"
        lines.append(f"| {r['name']} | {r['kind']} | {r['label']} | {status} |")
    lines += ["", "## Where wirepool loses", ""] + _losses(results, runners)
    for wl in ("W1", "W2", "W3", "W4", "W5", "W7"):
        table = _workload_table(results, wl, runners)
        if table:
            lines += ["", f"## {WORKLOAD_TITLES[wl]}", ""]
            if wl == "W4":
                lines += [CODEC_NOTE, ""]
            lines += table
    lines += founding_section(results, results.get("founding_langs") or {})
    mem = _memory_table(results, runners)
    if mem:
        lines += ["", f"## {WORKLOAD_TITLES['W6']}", "",
                  "Cells are `parent / largest child` peak RSS (VmHWM) in MiB, including the "
                  "interpreter. The W6 scenario streams 4 KiB rows to a parent that pauses 1 ms "
                  "every 1/256 of the stream: a transport with backpressure keeps both sides "
                  "small; one without it buffers the stream somewhere.", ""] + mem
    lines += _remote_section()
    problems = [r for r in results["results"] if r["status"] in ("error", "timeout")]
    if problems:
        lines += ["", "## Errors and timeouts", ""]
        for r in problems:
            lines.append(f"- {r['runner']} on {r['scenario']}: {r['status']}: {r.get('reason')}")
    notes: dict[str, list[str]] = {}
    for r in results["results"]:
        if r.get("notes") and r["notes"] not in notes.setdefault(r["runner"], []):
            notes[r["runner"]].append(r["notes"])
    if any(notes.values()):
        lines += ["", "## How each runner was driven", ""]
        lines += [f"- {runner}: " + "; ".join(n) for runner, n in notes.items() if n]
    trend = results.get("trend")
    if trend:
        lines += ["", "## Trend over full runs", "",
                  f"{trend['runs']} full run(s) in `{trend['history']}`. Wall-clock ratios are "
                  "reported, not gated: one full run on this VM differs from the next by more "
                  "than 20% in places for the same code, so `run.py check` alerts only when a "
                  f"drop holds in each of the newest {trend['consecutive']} consecutive full "
                  "runs against the run before them; a drop in the newest run alone is listed "
                  "to watch. The CI gate is the instruction count (`run.py gate`).", "", "```"]
        lines += trend["check"] + ["```", ""]
        lines += [f"![{p}]({p})" for p in trend["plots"]]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"
