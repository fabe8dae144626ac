"""The instruction-count gate: its verdicts on given figures, and on a real measured path with a
planted regression (valgrind counting the Python parent and worker of a unary round trip)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import icount  # noqa: E402

UNIT = "instructions/call"


def figs(**counts: int) -> dict:
    return {key.replace("__", "."): {"count": n, "unit": UNIT, "what": "test"}
            for key, n in counts.items()}


def baseline(**counts: int) -> dict:
    return {"commit": "b" * 40, "measured": "2026-01-01T00:00:00+00:00", "threshold": 0.03,
            "thresholds": {"handshake": 0.06}, "figures": figs(**counts)}


def verdict(base: dict, now: dict, **kw) -> tuple[int, str]:
    lines: list[str] = []
    status = icount.compare(base, now, "c0ffee123456", out=lines.append, **kw)
    return status, "\n".join(lines)


def test_growth_beyond_the_threshold_fails_naming_the_operation_counts_and_commit():
    status, text = verdict(baseline(rust_rust__unary=10_000), figs(rust_rust__unary=10_301))
    assert status == 1
    assert "REGRESSION rust_rust.unary: 10,000 -> 10,301" in text
    assert "+3.0%" in text and "c0ffee123456" in text


def test_growth_within_the_threshold_and_improvements_pass():
    base = baseline(rust_rust__unary=10_000, rust_rust__rows_json=3_000)
    status, text = verdict(base, figs(rust_rust__unary=10_300, rust_rust__rows_json=2_000))
    assert status == 0
    assert "improved   rust_rust.rows_json" in text and "make bench-baseline" in text
    assert "passed" in text


def test_a_figure_missing_from_the_run_fails_and_a_new_one_does_not():
    status, text = verdict(baseline(rust_rust__unary=10_000, rust_rust__rows_raw=600),
                           figs(rust_rust__unary=10_000, python_python__unary=170_000))
    assert status == 1
    assert "MISSING    rust_rust.rows_raw" in text
    assert "new        python_python.unary" in text


def test_an_operation_may_have_its_own_threshold_and_the_command_line_overrides_both():
    base = baseline(rust_rust__handshake=1_000_000)
    assert verdict(base, figs(rust_rust__handshake=1_050_000))[0] == 0
    assert verdict(base, figs(rust_rust__handshake=1_070_000))[0] == 1
    assert verdict(base, figs(rust_rust__handshake=1_050_000), threshold=0.01)[0] == 1


def test_a_figure_may_have_its_own_threshold_over_its_operations():
    base = baseline(python_python__echo_1mib=400_000, rust_rust__echo_1mib=30_000)
    base["thresholds"] = {"python_python.echo_1mib": 0.06}
    now = figs(python_python__echo_1mib=420_000, rust_rust__echo_1mib=31_500)
    status, text = verdict(base, now)
    assert status == 1
    assert "ok         python_python.echo_1mib" in text
    assert "REGRESSION rust_rust.echo_1mib" in text


def test_a_report_only_figure_is_printed_and_never_fails():
    base = baseline(rust_python__rows_raw=4_500) | {"report_only": {"rust_python.rows_raw": "noisy"}}
    status, text = verdict(base, figs(rust_python__rows_raw=5_000))
    assert status == 0
    assert "reported   rust_python.rows_raw: 4,500 -> 5,000" in text and "not gated: noisy" in text


def test_rebaselining_writes_the_new_counts_and_keeps_the_thresholds(tmp_path):
    path = tmp_path / "baseline.json"
    old = baseline(rust_rust__unary=10_000) | {"thresholds": {"handshake": 0.1}}
    icount.write_baseline(path, figs(rust_rust__unary=9_000), "d" * 40, {"python": "x"}, old)
    doc = json.loads(path.read_text())
    assert doc["figures"]["rust_rust.unary"]["count"] == 9_000
    assert doc["thresholds"] == {"handshake": 0.1} and doc["commit"] == "d" * 40
    assert verdict(doc, figs(rust_rust__unary=9_000))[0] == 0


def test_a_baseline_is_the_median_of_its_samples_with_their_spread():
    got = icount.median_figures([figs(rust_rust__unary=100), figs(rust_rust__unary=110),
                                 figs(rust_rust__unary=104)])
    assert got["rust_rust.unary"]["count"] == 104
    assert got["rust_rust.unary"]["samples"] == [100, 104, 110]
    assert got["rust_rust.unary"]["spread"] == round(10 / 104, 4)


def test_the_phases_alternate_base_and_base_plus_delta_for_every_operation():
    steps = icount.phases(["unary", "handshake"], "rust_rust", repeats=2)
    d = icount.DELTAS["rust_rust"]
    assert steps == [("unary", 2), ("unary", 2 + d["unary"])] * 2 + [
        ("handshake", 0), ("handshake", d["handshake"])] * 2


@pytest.fixture
def python_unary(tmp_path):
    """Measures python_python.unary (a real valgrind run of the Python parent and worker),
    with or without the planted loop, at the gate's own deltas and repeats; `slot` picks a CPU
    and a private copy of the SDK, so that two measurements can run side by side."""
    assert shutil.which("valgrind"), "valgrind is needed (apt-get install valgrind)"
    cpus = sorted(os.sched_getaffinity(0))

    def measure(plant: str | None = None, slot: int = 0) -> dict:
        return icount.measure(["python_python"], ["unary"], sys.executable, plant=plant,
                              log=lambda m: None, cpus=[cpus[slot % len(cpus)]],
                              snapshot=tmp_path / f"sdk{slot}")
    return measure


def test_a_planted_regression_on_a_measured_path_trips_the_gate_and_no_change_passes(
        python_unary, tmp_path):
    before = python_unary()
    path = tmp_path / "baseline.json"
    icount.write_baseline(path, before, "a" * 40, icount.environment(sys.executable))
    base = icount.load_baseline(path)
    assert base is not None and before["python_python.unary"]["count"] > 10_000

    # Unchanged, and with 3,000 turns of a Python loop after every call (~15% more instructions
    # per call), side by side on two CPUs when there are two.
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        unchanged = ex.submit(python_unary, None, 0)
        slowed = ex.submit(python_unary, "unary:3000", 1)
        unchanged, slowed = unchanged.result(), slowed.result()
    status, text = verdict(base, unchanged)
    assert status == 0, text
    status, text = verdict(base, slowed)
    assert status == 1, text
    assert "REGRESSION python_python.unary" in text
