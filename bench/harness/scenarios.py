"""The scenario catalogue: W1-W6 for quick and full mode.

A scenario is a plain dict, passed as JSON to every runner (see bench/README.md). Full mode uses
the sizes the benchmark is specified with; quick mode shrinks counts and windows (never the
payload sizes of W1/W2) and keeps the ends of each axis (QUICK_KEEP) so the whole run fits in
well under three minutes.
"""

from __future__ import annotations

import os
from typing import Any

KIB = 1024
MIB = 1024 * 1024

WORKLOAD_TITLES = {
    "W1": "W1 unary round trip, one in flight",
    "W2": "W2 pipelined echo",
    "W3": "W3 large payloads",
    "W4": "W4 streamed rows, decoded into objects in the parent",
    "W5": "W5 pool scaling, CPU-bound tasks",
    "W6": "W6 memory: peak RSS of parent and children",
    "W7": "W7 Arrow record batches, worker to parent",
    "small_rows_8192": "small_rows_8192: the founding workload's declaration-like rows (97 B of JSON)",
    "large_rows_512": "large_rows_512: the founding workload's 4 KiB payload rows (4,154 B of JSON)",
}

# The founding workload (issue 26; bench/shapes/founding.json): its two named shapes in every
# wirepool pair and codec, the codec alone per language, and the incumbents (their own codec,
# per message and batched by hand), in one run. The JSON scenario has the shape's name as its
# id (the incumbents run there); `<shape>.msgpack` / `.cbor` borrow its best incumbent.
FOUNDING_SHAPES = ("small_rows_8192", "large_rows_512")
FOUNDING_CODECS = ("json", "msgpack", "cbor")
FOUNDING_WIREPOOL = ("wirepool_rust", "wirepool_rust_pyworker", "wirepool_rust_nodeworker",
                     "wirepool_python", "wirepool_python_rsworker", "wirepool_python_nodeworker",
                     "wirepool_node", "wirepool_node_rsworker", "wirepool_go",
                     "wirepool_go_rsworker", "wirepool_rust_goworker")
FOUNDING_CODEC_ALONE = ("codec_rust", "codec_python", "codec_node")
FOUNDING_INCUMBENTS = ("ipc_channel", "ipc_channel_unbatched", "mp_pipe", "mp_pipe_unbatched",
                       "node_fork_json", "node_fork_json_unbatched", "node_fork_advanced",
                       "node_fork_advanced_unbatched", "procwire", "procwire_unbatched",
                       "go_plugin_grpc", "go_plugin_netrpc")


# Codecs of the W4 small-rows scenarios, JSON first (every runner's rows scenarios use JSON or
# the runner's own codec). raw: the row's JSON text as bytes, handed over undecoded.
CODECS = ("json", "msgpack", "cbor", "raw")
NOT_APPLICABLE = ("a baseline has one codec of its own (pickle, V8 or JSON), measured on the "
                  "scenario without a codec suffix")


def size_label(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB}MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB}KiB"
    return f"{n}B"


def count_label(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}K"
    return str(n)


def cores() -> int:
    return os.cpu_count() or 1


# Quick mode is a smoke test of every workload and every runner that has to fit in 3 minutes on
# a loaded 2-vCPU machine (`make bench`, CI). Starting a runner process and its workers costs
# 0.1-0.5 s per (runner, scenario), more than the measuring itself at quick windows, so quick
# keeps fewer scenarios rather than shorter ones: the two ends of each axis.
QUICK_KEEP = frozenset({
    "W1.echo.64B", "W1.echo.64KiB",
    "W2.echo.64B.x256", "W2.echo.1KiB.x16",
    "W3.oneway.1MiB", "W3.echo.16MiB",
    "W4.small_rows.64K", "W4.large_rows.4K",
    "W5.task50us.w2", "W5.task1000us.w4",
})
QUICK_KEEP_PREFIXES = ("W2.frames.", "W4.small_rows.64K.", "W6.")

# Full mode: 5 repeats, except the scenarios whose single repeat already takes seconds (a 256 MiB
# payload, a million rows), where 3 repeats give the median at 60% of the time.
FULL_REPEATS = 5
FULL_REPEATS_HEAVY = 3


def _kept_in_quick(sc: dict[str, Any]) -> bool:
    return sc["id"] in QUICK_KEEP or sc["id"].startswith(QUICK_KEEP_PREFIXES)


def build(mode: str, every_scenario: bool = False) -> list[dict[str, Any]]:
    """The catalogue of `mode`; quick mode keeps QUICK_KEEP unless `every_scenario` (so that
    `--quick --only W1.echo.1KiB` can still pick a scenario quick mode drops by default)."""
    full = mode == "full"
    repeats = FULL_REPEATS if full else 3
    window = 0.25 if full else 0.06
    warmup = 0.1 if full else 0.03
    limit = 240.0 if full else 45.0
    out: list[dict[str, Any]] = []

    def add(**sc: Any) -> None:
        sc.setdefault("repeats", repeats)
        sc.setdefault("time_limit_s", limit)
        out.append(sc)

    for size in (64, KIB, 16 * KIB, 64 * KIB):
        add(id=f"W1.echo.{size_label(size)}", workload="W1", kind="echo", payload=size,
            inflight=1, duration_s=window, min_calls=10, warmup_s=warmup, x=size)

    for size in (64, KIB):
        for inflight in (16, 64, 256):
            add(id=f"W2.echo.{size_label(size)}.x{inflight}", workload="W2", kind="echo",
                payload=size, inflight=inflight, duration_s=window, min_calls=inflight,
                warmup_s=warmup, x=inflight)
    # Floor-only references: how many 64 B frames the socket moves, batched or one per write.
    # One frame per write moves ~400 k frames/s here: 500 k frames is over a second a repeat.
    for per_write, total in ((256, 8_000_000 if full else 2_000_000),
                             (1, 500_000 if full else 300_000)):
        add(id=f"W2.frames.64B.per_write{per_write}", workload="W2", kind="frames", frame=64,
            per_write=per_write, frames_total=total, only=["floor_c"], x=per_write)

    sizes = (MIB, 16 * MIB, 256 * MIB) if full else (MIB, 16 * MIB)
    for size in sizes:
        for kind in ("oneway", "echo_large"):
            verb = "oneway" if kind == "oneway" else "echo"
            add(id=f"W3.{verb}.{size_label(size)}", workload="W3", kind=kind, payload=size,
                inflight=1, duration_s=window, min_calls=1, warmup_s=0, x=size,
                repeats=FULL_REPEATS_HEAVY if size >= 256 * MIB else repeats)

    # The same at the SDKs' default max_frame_size (4 MiB; the rows above use 16 MiB frames, so
    # 1 and 16 MiB travel in one frame): 16 MiB in four frames, and a payload just below and just
    # above one frame, which should cost the same per byte (issue 13). Baselines have no frames.
    frame = 4 * MIB
    for label, size, kinds in (("16MiB", 16 * MIB, ("oneway", "echo_large")),
                               ("4MiB-1KiB", frame - KIB, ("echo_large",)),
                               ("4MiB+1KiB", frame + KIB, ("echo_large",))):
        for kind in kinds:
            verb = "oneway" if kind == "oneway" else "echo"
            add(id=f"W3.f4MiB.{verb}.{label}", workload="W3", kind=kind, payload=size,
                max_frame_size=frame, inflight=1, duration_s=window, min_calls=1, warmup_s=0,
                x=size, runner_kinds=["floor", "wirepool"],
                not_applicable="a baseline has no frame size: see the 16 MiB-frame rows")

    small = (8192, 1 << 20) if full else (8192, 1 << 16)
    large = (512, 16384) if full else (512, 4096)
    for shape, counts in (("small_rows", small), ("large_rows", large)):
        for n in counts:
            add(id=f"W4.{shape}.{count_label(n)}", workload="W4", kind="rows", shape=shape,
                n=n, codec="json", x=n,
                repeats=FULL_REPEATS_HEAVY if n >= 1 << 20 else repeats)
    # The codec dimension: the same small rows in the wirepool runners' other codecs (quick mode:
    # the largest size only, to stay within its time budget). The baselines each have one codec
    # of their own (pickle, V8, JSON), so they show "n/a" here; the floor moves bytes whatever
    # the codec and stays as the reference.
    for n in small if full else small[-1:]:
        for codec in CODECS[1:]:
            add(id=f"W4.small_rows.{count_label(n)}.{codec}", workload="W4", kind="rows",
                shape="small_rows", n=n, codec=codec, runner_kinds=["floor", "wirepool"],
                not_applicable=NOT_APPLICABLE, x=n,
                repeats=FULL_REPEATS_HEAVY if n >= 1 << 20 else repeats)

    # Raw 4 KiB rows (issue 17's 1 M rows/s): the large row's JSON text as bytes, undecoded, Rust
    # parent x Rust worker (the Python and Node bench workers have no large raw rows) beside the
    # floor moving the same bytes. Full mode (quick with --only), to keep quick mode's time.
    for n in large if full else ():
        add(id=f"W4.large_rows.{count_label(n)}.raw", workload="W4", kind="rows",
            shape="large_rows", n=n, codec="raw", x=n, only=["floor_c", "wirepool_rust"])

    # Seconds' worth of ideal work per repeat: 0.3 s is 30 tasks of 10 ms on one worker.
    target = 0.3 if full else 0.08
    for task_us in (50, 1000, 10000) if full else (50, 1000):
        for workers in (1, 2, 4):
            ideal = min(workers, cores()) / (task_us / 1e6)
            tasks = max(4 * workers, round(target * ideal))
            add(id=f"W5.task{task_us}us.w{workers}", workload="W5", kind="pool",
                task_us=task_us, workers=workers, tasks=tasks, ideal_tasks_per_s=ideal,
                x=workers)

    # W7 (full mode; quick with --only W7): one Arrow record batch of 1 M rows (i int64, x
    # float64, name utf8 "decl_%07d": 33,554,928 IPC bytes) per call from the worker, read
    # zero-copy by the parent; its own runners (each pair through the shm lane and over the
    # socket) and the floor moving the same bytes one way.
    w7 = [f"wirepool_arrow_{p}_{w}worker{sfx}" for p in ("rs", "py") for w in ("rs", "py")
          for sfx in ("", "_socket")]
    w7_rows = 1 << 20
    add(id=f"W7.arrow.{count_label(w7_rows)}", workload="W7", kind="arrow", rows=w7_rows,
        payload=33_554_928, inflight=1, duration_s=window, min_calls=3, warmup_s=0, x=w7_rows,
        only=["floor_c", *w7])

    # The founding workload: full mode every codec, 5 repeats; quick mode JSON only, 3 repeats
    # (the shapes' own sizes are small: starting the runners is most of their time).
    import json as _json
    from pathlib import Path as _Path
    spec = _json.loads((_Path(__file__).resolve().parent.parent / "shapes" / "founding.json")
                       .read_text())["shapes"]
    for shape in FOUNDING_SHAPES:
        n = spec[shape]["n" if full else "quick_n"]
        for codec in FOUNDING_CODECS if full else FOUNDING_CODECS[:1]:
            runners = FOUNDING_WIREPOOL + FOUNDING_CODEC_ALONE
            if codec == "json":
                runners += FOUNDING_INCUMBENTS
            add(id=shape if codec == "json" else f"{shape}.{codec}", workload=shape, kind="rows",
                shape=shape, n=n, codec=codec, founding=True, duration_s=window, x=n,
                only=list(runners))

    n_slow = 16384 if full else 4096
    add(id=f"W6.slow_consumer.large_rows.{count_label(n_slow)}", workload="W6",
        kind="slow_rows", shape="large_rows", n=n_slow, codec="json", every=n_slow // 256,
        pause_ms=1.0, repeats=1 if not full else 3, x=n_slow)
    return out if full or every_scenario else [sc for sc in out if _kept_in_quick(sc)
                                               or sc.get("founding")]


def select(scenarios: list[dict[str, Any]], only: list[str] | None) -> list[dict[str, Any]]:
    """Keep scenarios whose workload (W1) or id prefix (W3.echo) is listed."""
    if not only:
        return scenarios
    return [s for s in scenarios
            if any(s["workload"] == o or s["id"].startswith(o) for o in only)]
