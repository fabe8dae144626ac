"""The catalogue holds the specified workloads, and every runner it names is registered."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "runners"))

from harness import scenarios  # noqa: E402
from registry import RUNNERS  # noqa: E402

KIB, MIB = 1024, 1024 * 1024


def of(mode: str, workload: str) -> list[dict]:
    return [s for s in scenarios.build(mode) if s["workload"] == workload]


def test_full_mode_has_the_specified_grid():
    assert [s["payload"] for s in of("full", "W1")] == [64, KIB, 16 * KIB, 64 * KIB]
    echo2 = [(s["payload"], s["inflight"]) for s in of("full", "W2") if s["kind"] == "echo"]
    assert echo2 == [(p, k) for p in (64, KIB) for k in (16, 64, 256)]
    w3 = {(s["kind"], s["payload"]) for s in of("full", "W3") if "max_frame_size" not in s}
    assert w3 == {(k, p) for k in ("oneway", "echo_large") for p in (MIB, 16 * MIB, 256 * MIB)}
    # At the default frame size: 16 MiB in four frames, and just below / above one frame.
    framed = {(s["kind"], s["payload"], s["max_frame_size"]) for s in of("full", "W3")
              if "max_frame_size" in s}
    assert framed == {("oneway", 16 * MIB, 4 * MIB), ("echo_large", 16 * MIB, 4 * MIB),
                      ("echo_large", 4 * MIB - KIB, 4 * MIB), ("echo_large", 4 * MIB + KIB, 4 * MIB)}
    w4 = [(s["shape"], s["n"]) for s in of("full", "W4") if s["codec"] == "json"]
    assert w4 == [("small_rows", 8192), ("small_rows", 1 << 20), ("large_rows", 512),
                  ("large_rows", 16384)]
    codecs = [(s["n"], s["codec"]) for s in of("full", "W4")
              if s["codec"] != "json" and s["shape"] == "small_rows"]
    assert codecs == [(n, c) for n in (8192, 1 << 20) for c in ("msgpack", "cbor", "raw")]
    # Raw 4 KiB rows: Rust x Rust and the floor only.
    large_raw = [(s["n"], s["only"]) for s in of("full", "W4")
                 if s["codec"] == "raw" and s["shape"] == "large_rows"]
    assert large_raw == [(n, ["floor_c", "wirepool_rust"]) for n in (512, 16384)]
    w5 = [(s["task_us"], s["workers"]) for s in of("full", "W5")]
    assert w5 == [(t, w) for t in (50, 1000, 10000) for w in (1, 2, 4)]
    assert [s["kind"] for s in of("full", "W6")] == ["slow_rows"]
    assert [(s["kind"], s["rows"]) for s in of("full", "W7")] == [("arrow", 1 << 20)]

def test_full_mode_repeats_five_times_and_three_only_where_one_repeat_takes_seconds():
    for s in scenarios.build("full"):
        heavy = s.get("payload", 0) >= 256 * MIB or s.get("n", 0) >= 1 << 20
        if s["workload"] != "W6":
            assert s["repeats"] == (3 if heavy else 5), s["id"]


def test_quick_mode_keeps_every_workload_and_both_ends_of_each_axis():
    quick = scenarios.build("quick")
    assert all(s["repeats"] == 3 for s in quick if s["workload"] != "W6")
    assert {s["workload"] for s in quick} == {"W1", "W2", "W3", "W4", "W5", "W6",
                                              *scenarios.FOUNDING_SHAPES}
    # Every workload keeps a scenario that every runner runs (none floor-only or codec-only),
    # so each runner is exercised on each workload.
    for wl in ("W1", "W2", "W3", "W4", "W5", "W6"):
        assert any(not s.get("only") and not s.get("runner_kinds") for s in of("quick", wl)), wl
    assert [s["payload"] for s in of("quick", "W1")] == [64, 64 * KIB]
    w2 = {(s["payload"], s["inflight"]) for s in of("quick", "W2") if s["kind"] == "echo"}
    assert w2 == {(64, 256), (KIB, 16)}
    assert {(s["kind"], s["payload"]) for s in of("quick", "W3")} == {
        ("oneway", MIB), ("echo_large", 16 * MIB)}
    assert {(s["task_us"], s["workers"]) for s in of("quick", "W5")} == {(50, 2), (1000, 4)}
    # Every kept id exists in the full catalogue's naming, and nothing is kept by accident.
    every = {s["id"] for s in scenarios.build("quick", every_scenario=True)}
    assert scenarios.QUICK_KEEP <= every
    assert len(quick) < len(every)


def test_quick_only_can_pick_a_scenario_quick_drops_by_default():
    every = scenarios.build("quick", every_scenario=True)
    assert [s["id"] for s in scenarios.select(every, ["W1.echo.1KiB"])] == ["W1.echo.1KiB"]
    assert "W1.echo.1KiB" not in {s["id"] for s in scenarios.build("quick")}


def test_ids_are_unique_and_every_scenario_is_bounded_in_time():
    for mode in ("quick", "full"):
        ids = [s["id"] for s in scenarios.build(mode)]
        assert len(ids) == len(set(ids))
        assert all(0 < s["time_limit_s"] <= 300 for s in scenarios.build(mode))


def test_pool_task_counts_target_the_ideal_rate():
    for s in of("full", "W5"):
        ideal = min(s["workers"], scenarios.cores()) / (s["task_us"] / 1e6)
        assert s["ideal_tasks_per_s"] == ideal
        assert s["tasks"] >= 4 * s["workers"]


def test_only_selects_by_workload_or_id_prefix():
    full = scenarios.build("full")
    assert {s["workload"] for s in scenarios.select(full, ["W1", "W5"])} == {"W1", "W5"}
    picked = scenarios.select(full, ["W3.echo"])
    assert picked and all(s["id"].startswith("W3.echo") for s in picked)
    assert scenarios.select(full, []) == full


def test_registry_names_are_unique_and_floor_only_scenarios_name_the_floor():
    names = [r.name for r in RUNNERS]
    assert len(names) == len(set(names))
    assert [r.name for r in RUNNERS if r.kind == "floor"] == ["floor_c"]
    # One wirepool runner per parent x worker language pair, the Rust pair with the shm lane
    # off (the socket path beside the lane), the lane's transport alone, and the Python
    # parent's blocking Pool.call (W1).
    assert {r.name for r in RUNNERS if r.kind == "wirepool"} == {
        "wirepool_rust", "wirepool_rust_pyworker", "wirepool_python", "wirepool_python_rsworker",
        "wirepool_python_sync",
        "wirepool_shm_lane", "wirepool_shm_lane_pyparent", "wirepool_node", "wirepool_node_rsworker",
        "wirepool_rust_nodeworker", "wirepool_python_nodeworker", "wirepool_rust_socket",
        "wirepool_rust_zerocopy", "wirepool_rust_zerocopy_fill",
        "wirepool_go", "wirepool_go_rsworker", "wirepool_rust_goworker",
        *(f"wirepool_arrow_{p}_{w}worker{sfx}" for p in ("rs", "py") for w in ("rs", "py")
          for sfx in ("", "_socket"))}
    for s in scenarios.build("full"):
        assert set(s.get("only") or []) <= set(names)


def test_small_rows_come_in_every_codec_and_baselines_are_not_applicable_there():
    kinds = {r.kind for r in RUNNERS}
    for mode in ("quick", "full"):
        rows = [s for s in scenarios.build(mode) if s["kind"] in ("rows", "slow_rows")
                and not s.get("founding")]  # (test_founding.py)
        # Every rows scenario names its codec, so the report can say which one a figure used.
        assert all(s["codec"] in scenarios.CODECS for s in rows)
        for s in rows:
            if s["codec"] == "json":
                assert "runner_kinds" not in s  # every runner measures the JSON rows
                continue
            if s["shape"] == "large_rows":  # raw 4 KiB rows: Rust x Rust and the floor
                assert s["codec"] == "raw" and s["only"] and s["id"].endswith(".raw")
                continue
            assert s["shape"] == "small_rows" and s["kind"] == "rows"
            assert s["id"].endswith("." + s["codec"])
            assert set(s["runner_kinds"]) == {"floor", "wirepool"}
            assert set(s["runner_kinds"]) <= kinds
            assert s["not_applicable"]
    # Quick mode adds the codecs at its largest small-rows size only (time budget).
    quick = [(s["n"], s["codec"]) for s in of("quick", "W4") if s["codec"] != "json"]
    assert quick == [(1 << 16, c) for c in ("msgpack", "cbor", "raw")]
