"""The founding workload's three-way report (issue 26): per shape, every wirepool pair x codec,
the codec alone per language, and the incumbents, from one run's results.

For each end-to-end figure (a wirepool runner or an incumbent on a founding scenario):

- ``codec_alone``: the codec alone on the same rows and codec, in rows/s. A same-language pair
  takes its language's measured encode + decode (one process, one row at a time); a mixed pair
  the worker language's encode and the parent language's decode added up per row,
  ``1 / (1/encode + 1/decode)``.
- ``vs_codec``: end to end / codec alone (> 1 means the two processes overlapped more than the
  wire cost).
- ``best_incumbent``: the best incumbent of the **parent's** language (any variant: per message
  or batched by hand) on the shape's JSON scenario (incumbents have their own codec), and
  ``vs_incumbent`` = median / its median.
"""

from __future__ import annotations

from typing import Any

LANG_NAME = {"rust": "Rust", "python": "Python", "node": "Node", "go": "Go"}
# (no codec-alone runner for Go yet: its pairs' codec_alone is None)
CODEC_RUNNER = {"rust": "codec_rust", "python": "codec_python", "node": "codec_node",
                "go": "codec_go"}


def _figure(res: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((f for f in res.get("figures", []) if f["name"] == name), None)


def _median(res: dict[str, Any] | None, name: str) -> float | None:
    fig = _figure(res, name) if res else None
    return fig["median"] if fig and fig.get("median") == fig.get("median") else None


def codec_alone(by_runner: dict[str, dict[str, Any]], parent: str, worker: str) -> float | None:
    """Rows/s of the codec alone for a pair, from one scenario's codec runners' results."""
    if parent == worker:
        return _median(by_runner.get(CODEC_RUNNER[parent]), "rows_per_s")
    enc = _median(by_runner.get(CODEC_RUNNER[worker]), "encode_rows_per_s")
    dec = _median(by_runner.get(CODEC_RUNNER[parent]), "decode_rows_per_s")
    return 1.0 / (1.0 / enc + 1.0 / dec) if enc and dec else None


def tables(results: dict[str, Any], langs: dict[str, tuple[str, str]]) -> dict[str, list[dict]]:
    """{shape: rows}, each row one (runner, codec) of a founding scenario, as described above."""
    kinds = {r["name"]: r["kind"] for r in results["runners"]}
    scens = [s for s in results["scenarios"] if s.get("founding")]
    ok: dict[str, dict[str, dict[str, Any]]] = {}
    for res in results["results"]:
        if res.get("status") == "ok":
            ok.setdefault(res["scenario"], {})[res["runner"]] = res
    out: dict[str, list[dict]] = {}
    for sc in scens:
        shape = sc["shape"]
        here = ok.get(sc["id"], {})
        json_scenario = ok.get(shape, {})
        best: dict[str, tuple[str, float]] = {}
        for name, res in json_scenario.items():
            med = _median(res, "rows_per_s")
            if kinds.get(name) == "incumbent" and med and name in langs:
                lang = langs[name][0]
                if lang not in best or med > best[lang][1]:
                    best[lang] = (name, med)
        rows = out.setdefault(shape, [])
        for name, res in here.items():
            fig = _figure(res, "rows_per_s")
            if fig is None or name not in langs:
                continue
            parent, worker = langs[name]
            kind = kinds.get(name, "?")
            row = {"scenario": sc["id"], "codec": sc["codec"], "runner": name, "kind": kind,
                   "parent": parent, "worker": worker, "min": fig["min"],
                   "median": fig["median"], "max": fig["max"],
                   "codec_alone": None, "vs_codec": None, "best_incumbent": None,
                   "vs_incumbent": None}
            if kind == "codec":
                row["encode"] = _median(res, "encode_rows_per_s")
                row["decode"] = _median(res, "decode_rows_per_s")
            else:
                if kind == "wirepool":  # (an incumbent has a codec of its own)
                    alone = codec_alone(here, parent, worker)
                    row["codec_alone"] = alone
                    row["vs_codec"] = fig["median"] / alone if alone else None
                if parent in best:
                    row["best_incumbent"] = {"runner": best[parent][0], "median": best[parent][1],
                                             "scenario": shape}
                    row["vs_incumbent"] = fig["median"] / best[parent][1]
            rows.append(row)
    order = {"wirepool": 0, "incumbent": 1, "codec": 2}
    for rows in out.values():
        rows.sort(key=lambda r: (order.get(r["kind"], 3), r["parent"], r["worker"], r["runner"],
                                 r["codec"]))
    return out


def pair_label(row: dict[str, Any]) -> str:
    if row["kind"] == "codec":
        return f"{LANG_NAME[row['parent']]} codec alone"
    if row["kind"] == "incumbent":
        return f"{LANG_NAME[row['parent']]} incumbent"
    return f"{LANG_NAME[row['parent']]} parent x {LANG_NAME[row['worker']]} worker"


def summarize(docs: list[dict[str, Any]], langs: dict[str, tuple[str, str]]
              ) -> dict[str, list[dict[str, Any]]]:
    """Several runs' tables merged: per (shape, runner, scenario) the median over the runs of
    each run's median and ratios, and the smallest and largest run median."""
    import statistics

    merged: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    order: list[tuple[str, str, str]] = []
    for doc in docs:
        for shape, rows in tables(doc, langs).items():
            for r in rows:
                key = (shape, r["runner"], r["scenario"])
                if key not in merged:
                    order.append(key)
                merged.setdefault(key, []).append(r)
    out: dict[str, list[dict[str, Any]]] = {}
    for key in order:
        runs = merged[key]

        def med(field: str) -> float | None:
            vals = [r[field] for r in runs if r.get(field) is not None]
            return statistics.median(vals) if vals else None

        first = runs[0]
        best = [r["best_incumbent"]["runner"] for r in runs if r["best_incumbent"]]
        out.setdefault(key[0], []).append({
            **{k: first[k] for k in ("scenario", "codec", "runner", "kind", "parent", "worker")},
            "runs": len(runs), "median": med("median"),
            "min": min(r["median"] for r in runs), "max": max(r["median"] for r in runs),
            "codec_alone": med("codec_alone"), "vs_codec": med("vs_codec"),
            "vs_incumbent": med("vs_incumbent"),
            "best_incumbent": max(set(best), key=best.count) if best else None})
    return out


def main(argv: list[str]) -> None:
    """``python3 -m harness.founding RESULTS.json...``: the merged table as Markdown."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runners"))
    from registry import LANGS

    from .report import fmt, fmt_ratio

    docs = [json.loads(Path(p).read_text()) for p in argv]
    for shape, rows in summarize(docs, LANGS).items():
        print(f"\n{shape} ({len(docs)} runs: median of the run medians, min - max of them)\n")
        print("| pair | runner | codec | rows/s median | min - max | e2e / codec | "
              "vs best incumbent (which) |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            codec = r["codec"] if r["kind"] != "incumbent" else "own"
            which = f" ({r['best_incumbent']})" if r["best_incumbent"] else ""
            vs = f"{fmt_ratio(r['vs_incumbent'])}{which}" if r["kind"] != "codec" else "-"
            print(f"| {pair_label(r)} | {r['runner']} | {codec} | {fmt(r['median'])} | "
                  f"{fmt(r['min'])} - {fmt(r['max'])} | {fmt_ratio(r['vs_codec'])} | {vs} |")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
