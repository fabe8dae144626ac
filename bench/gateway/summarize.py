"""Summarize run.sh's results.tsv: min/median/max per contender, the ratios of each round (same
round only) and issue 30's targets met or missed. Standard library only.

    python3 bench/gateway/summarize.py results.tsv [skipped.tsv] [--json PREFIX]

--json PREFIX also writes PREFIX-bigger.json and PREFIX-smaller.json in github-action-benchmark's
customBiggerIsBetter / customSmallerIsBetter format (medians, the rounds' spread as `range`), as
the rest of the bench does: req/s, rows/s and the parity ratios; p99 and the p99 ratio.
"""

import csv
import json
import os
import statistics
import sys
from collections import defaultdict

NAMES = {
    "a": "(a) gateway + Python workers",
    "b": "(b) gateway + Rust workers",
    "c": "(c) gunicorn + uvicorn[standard]",
    "c0": "(c0) gunicorn + plain uvicorn",
    "d": "(d) nginx static",
    "stream_rust": "stream, Rust worker",
    "stream_python": "stream, Python worker",
    "stream_gunicorn": "stream, gunicorn + uvicorn[standard]",
}
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def ms(text: str) -> float | None:
    for unit in ("us", "ms", "s", "m"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * UNITS[unit]
    return None


def spread(values: list[float], fmt) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def fmt_rate(v: float) -> str:
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v:,.0f}"


def fmt_ms(v: float) -> str:
    return f"{v:.2f} ms"


def fmt_x(v: float) -> str:
    return f"{v:.2f}x"


def main() -> None:
    args = sys.argv[1:]
    json_prefix = None
    if "--json" in args:
        i = args.index("--json")
        json_prefix = args[i + 1]
        del args[i : i + 2]
    rows = list(csv.DictReader(open(args[0]), delimiter="\t"))
    skipped = {}
    if len(args) > 1 and os.path.exists(args[1]):
        for line in open(args[1]):
            if line.strip():
                k, why = line.rstrip("\n").split("\t", 1)
                skipped[k] = why
    stream_rows = int(os.environ.get("STREAM_ROWS", "10000"))
    # (contender, conns) -> round -> record
    by = defaultdict(dict)
    for r in rows:
        by[(r["contender"], int(r["conns"]))][int(r["round"])] = r
    rounds = sorted({int(r["round"]) for r in rows})

    print(f"rounds: {len(rounds)}; figures: median (min-max) over the rounds\n")
    print("| contender | connections | req/s | p50 | p99 | non-2xx | socket errors |")
    print("|---|---|---|---|---|---|---|")
    for k in ("a", "b", "c", "c0", "d"):
        if k in skipped:
            print(f"| {NAMES[k]} | | skipped: {skipped[k]} | | | | |")
            continue
        for (kk, conns), per in sorted(by.items()):
            if kk != k:
                continue
            rps = [float(x["rps"]) for x in per.values()]
            p50 = [v for x in per.values() if (v := ms(x["p50"])) is not None]
            p99 = [v for x in per.values() if (v := ms(x["p99"])) is not None]
            non2xx = sum(int(x["non2xx"] or 0) for x in per.values())
            serr = "; ".join(sorted({x["socket_errors"] for x in per.values()}))
            print(f"| {NAMES[k]} | {conns} | {spread(rps, fmt_rate)} | {spread(p50, fmt_ms)} "
                  f"| {spread(p99, fmt_ms)} | {non2xx} | {serr} |")

    print(f"\n| stream of {stream_rows:,} rows (NDJSON) | connections | rows/s | streams/s "
          "| p50 per stream | p99 per stream | non-2xx |")
    print("|---|---|---|---|---|---|---|")
    for k in ("stream_rust", "stream_python", "stream_gunicorn"):
        if k in skipped:
            print(f"| {NAMES[k]} | | skipped: {skipped[k]} | | | | |")
            continue
        for (kk, conns), per in sorted(by.items()):
            if kk != k:
                continue
            rps = [float(x["rps"]) for x in per.values()]
            p50 = [v for x in per.values() if (v := ms(x["p50"])) is not None]
            p99 = [v for x in per.values() if (v := ms(x["p99"])) is not None]
            non2xx = sum(int(x["non2xx"] or 0) for x in per.values())
            print(f"| {NAMES[k]} | {conns} | {spread([v * stream_rows for v in rps], fmt_rate)} "
                  f"| {spread(rps, lambda v: f'{v:,.1f}')} | {spread(p50, fmt_ms)} "
                  f"| {spread(p99, fmt_ms)} | {non2xx} |")

    def ratio(num, den, conns, field):
        out = []
        for rnd in rounds:
            a, b = by.get((num, conns), {}).get(rnd), by.get((den, conns), {}).get(rnd)
            if a is None or b is None:
                continue
            if field == "rps":
                x, y = float(a["rps"]), float(b["rps"])
            else:
                x, y = ms(a[field]), ms(b[field])
            if x is not None and y:
                out.append(x / y)
        return out

    def verdict(values, ok) -> str:
        if not values:
            return "not measured"
        med = statistics.median(values)
        every = all(ok(v) for v in values)
        if ok(med):
            return "**met**" + ("" if every else " (not in every round)")
        return "**missed**" + (" (met in some rounds)" if any(ok(v) for v in values) else "")

    print("\n| target (issue 30) | connections | ratio of each round: median (min-max) | verdict |")
    print("|---|---|---|---|")
    conns_all = sorted({c for (k, c) in by if k in ("a", "b", "c", "c0", "d")})
    for conns in conns_all:
        v = ratio("a", "c", conns, "rps")
        tag = "target" if conns == 64 else "for information"
        print(f"| (a) / (c) req/s >= 2x ({tag}) | {conns} | {spread(v, fmt_x)} "
              f"| {verdict(v, lambda x: x >= 2) if conns == 64 else '-'} |")
        v = ratio("a", "c", conns, "p99")
        print(f"| (a) / (c) p99 <= 0.5x ({tag}) | {conns} | {spread(v, fmt_x)} "
              f"| {verdict(v, lambda x: x <= 0.5) if conns == 64 else '-'} |")
    for conns in conns_all:
        v = ratio("b", "d", conns, "rps")
        print(f"| (b) / (d) req/s >= 0.6x | {conns} | {spread(v, fmt_x)} | {verdict(v, lambda x: x >= 0.6)} |")
    for k in ("stream_rust", "stream_python"):
        for (kk, conns), per in sorted(by.items()):
            if kk != k:
                continue
            v = [float(x["rps"]) * stream_rows for x in per.values()]
            if k == "stream_rust":
                print(f"| stream, Rust worker >= 1 M rows/s | {conns} | {spread(v, fmt_rate)} rows/s "
                      f"| {verdict(v, lambda x: x >= 1e6)} |")
    if json_prefix:
        bigger, smaller = [], []

        def entry(name, unit, values):
            return {"name": name, "unit": unit, "value": round(statistics.median(values), 3),
                    "range": f"{min(values):.3f}-{max(values):.3f}", "extra": f"{len(values)} rounds"}

        for (k, conns), per in sorted(by.items()):
            rps = [float(x["rps"]) for x in per.values()]
            if k.startswith("stream"):
                bigger.append(entry(f"gateway {k} {conns} conns", "rows/s", [v * stream_rows for v in rps]))
                continue
            bigger.append(entry(f"gateway {k} {conns} conns", "req/s", rps))
            p99 = [v for x in per.values() if (v := ms(x["p99"])) is not None]
            if p99:
                smaller.append(entry(f"gateway {k} {conns} conns p99", "ms", p99))
        for conns in conns_all:
            for num, den in (("a", "c"), ("b", "d"), ("a", "d")):
                v = ratio(num, den, conns, "rps")
                if v:
                    bigger.append(entry(f"gateway ratio {num}/{den} {conns} conns", "x", v))
            v = ratio("a", "c", conns, "p99")
            if v:
                smaller.append(entry(f"gateway ratio a/c p99 {conns} conns", "x", v))
        json.dump(bigger, open(f"{json_prefix}-bigger.json", "w"), indent=1)
        json.dump(smaller, open(f"{json_prefix}-smaller.json", "w"), indent=1)

    print("\nfor information, same round:")
    for conns in conns_all:
        for num, den in (("a", "c0"), ("a", "d"), ("c", "d"), ("b", "a"), ("b", "c")):
            v = ratio(num, den, conns, "rps")
            if v:
                print(f"- {conns} connections, {NAMES[num]} / {NAMES[den]} req/s: {spread(v, fmt_x)}")
    for conns in sorted({c for (k, c) in by if k.startswith("stream")}):
        for num, den in (("stream_python", "stream_gunicorn"), ("stream_rust", "stream_gunicorn")):
            v = ratio(num, den, conns, "rps")
            if v:
                print(f"- {conns} connections, {NAMES[num]} / {NAMES[den]} rows/s: {spread(v, fmt_x)}")


if __name__ == "__main__":
    main()
