"""The regression check over bench/history, driven with synthetic histories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import analysis, history  # noqa: E402

KINDS = {"wirepool_rust": "wirepool", "mp_pipe": "incumbent"}


def line(commit: str, ratios: dict[str, tuple[float | None, float | None]],
         kinds: dict[str, str] = KINDS) -> dict:
    return {"timestamp": f"2026-01-01T00:00:0{len(commit) % 10}", "commit": commit * 8,
            "mode": "full", "cpu": "test cpu", "kinds": kinds,
            "ratios": {k: {"vs_floor": f, "vs_best_incumbent": b} for k, (f, b) in ratios.items()}}


def write(tmp_path: Path, *lines: dict) -> Path:
    path = tmp_path / "ratios.jsonl"
    path.write_text("".join(json.dumps(l) + "\n" for l in lines))
    return path


KEY = "wirepool_rust|W1.echo.64B|calls_per_s"


def test_deliberate_slowdown_fails_the_check(tmp_path):
    path = write(tmp_path, line("a", {KEY: (0.50, 1.40)}), line("b", {KEY: (0.30, 0.84)}))
    messages: list[str] = []
    assert history.check(path, out=messages.append) == 1
    text = "\n".join(messages)
    assert "REGRESSION" in text and KEY in text and "dropped 40%" in text


def test_noise_within_threshold_passes(tmp_path):
    path = write(tmp_path, line("a", {KEY: (0.50, 1.40)}), line("b", {KEY: (0.41, 1.13)}))
    assert history.check(path, out=lambda m: None) == 0


def test_exactly_at_threshold_passes_and_just_below_fails():
    prev = line("a", {KEY: (1.0, 1.0)})
    assert history.regressions(prev, line("b", {KEY: (0.8, 1.0)})) == []
    found = history.regressions(prev, line("b", {KEY: (0.79, 1.0)}))
    assert [(r["metric"], r["new"]) for r in found] == [("vs_floor", 0.79)]


def test_only_the_newest_two_runs_are_compared(tmp_path):
    path = write(tmp_path, line("a", {KEY: (0.9, 2.0)}), line("b", {KEY: (0.5, 1.0)}),
                 line("c", {KEY: (0.5, 1.0)}))
    assert history.check(path, out=lambda m: None) == 0


def with_own(l: dict, medians: dict[str, float], better: str = "higher") -> dict:
    for key, median in medians.items():
        l["ratios"][key].update(median=median, better=better)
    return l


def test_a_ratio_drop_with_the_runners_own_figure_steady_is_the_baseline_moving(tmp_path):
    # The floor got 70% faster by itself between the runs: every ratio against it drops.
    path = write(tmp_path, with_own(line("a", {KEY: (0.50, 1.40)}), {KEY: 1000.0}),
                 with_own(line("b", {KEY: (0.29, 1.40)}), {KEY: 990.0}))
    messages: list[str] = []
    assert history.check(path, out=messages.append) == 0
    text = "\n".join(messages)
    assert "REGRESSION" not in text and "not counted, the baseline moved" in text
    assert "its own median moved -1%" in text


@pytest.mark.parametrize("better, old, new", [("higher", 1000.0, 600.0), ("lower", 20.0, 33.0)])
def test_a_ratio_drop_with_the_runners_own_figure_dropping_too_fails(tmp_path, better, old, new):
    path = write(tmp_path, with_own(line("a", {KEY: (0.50, 1.40)}), {KEY: old}, better),
                 with_own(line("b", {KEY: (0.29, 1.40)}), {KEY: new}, better))
    messages: list[str] = []
    assert history.check(path, out=messages.append) == 1
    assert "REGRESSION" in "\n".join(messages)


def test_a_figure_that_disappears_is_a_regression():
    prev = line("a", {KEY: (0.5, 1.0)})
    found = history.regressions(prev, line("b", {}))
    assert [r["why"] for r in found] == ["missing from the newest run"]


def test_a_ratio_that_becomes_unmeasurable_is_a_regression():
    found = history.regressions(line("a", {KEY: (0.5, 1.0)}), line("b", {KEY: (0.5, None)}))
    assert [(r["metric"], r["new"]) for r in found] == [("vs_best_incumbent", None)]


def test_improvements_and_new_figures_pass():
    other = "wirepool_rust|W2.echo.64B.x16|calls_per_s"
    found = history.regressions(line("a", {KEY: (0.5, 1.0)}),
                                line("b", {KEY: (0.9, 3.0), other: (0.1, 0.1)}))
    assert found == []


def test_incumbent_ratios_are_tracked_only_when_asked():
    key = "mp_pipe|W1.echo.64B|calls_per_s"
    prev, new = line("a", {key: (0.5, 1.0)}), line("b", {key: (0.1, 0.2)})
    assert history.regressions(prev, new) == []
    found = history.regressions(prev, new, kinds=("wirepool", "incumbent"))
    assert {r["metric"] for r in found} == {"vs_floor", "vs_best_incumbent"}


def test_fewer_than_two_runs_is_not_a_failure(tmp_path):
    assert history.check(tmp_path / "absent.jsonl", out=lambda m: None) == 0
    path = write(tmp_path, line("a", {KEY: (0.5, 1.0)}))
    assert history.check(path, out=lambda m: None) == 0


def test_history_without_wirepool_ratios_has_nothing_to_check(tmp_path):
    key = "mp_pipe|W1.echo.64B|calls_per_s"
    path = write(tmp_path, line("a", {key: (0.5, 1.0)}), line("b", {key: (0.1, 0.1)}))
    messages: list[str] = []
    assert history.check(path, out=messages.append) == 0
    assert "nothing to compare" in messages[0]


def test_corrupt_history_line_is_reported_with_its_line_number(tmp_path):
    path = tmp_path / "ratios.jsonl"
    path.write_text(json.dumps(line("a", {})) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"ratios.jsonl:2"):
        history.load(path)


def test_run_py_check_exit_status_follows_the_history(tmp_path):
    slow = write(tmp_path, line("a", {KEY: (0.5, 1.0)}), line("b", {KEY: (0.2, 0.4)}))
    cmd = [sys.executable, str(BENCH / "run.py"), "check", "--consecutive", "1", "--history",
           str(slow)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REGRESSION" in done.stdout
    fine = write(tmp_path, line("a", {KEY: (0.5, 1.0)}), line("b", {KEY: (0.5, 1.0)}))
    cmd[-1] = str(fine)
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=60).returncode == 0


def test_the_alert_needs_the_drop_in_each_of_the_consecutive_newest_runs(tmp_path):
    good, bad = (0.5, 1.0), (0.3, 0.6)
    messages: list[str] = []
    # Dropped in the newest two only, against the reference three runs back: no alert yet.
    path = write(tmp_path, line("a", {KEY: good}), line("b", {KEY: good}),
                 line("c", {KEY: bad}), line("d", {KEY: bad}))
    assert history.check(path, out=messages.append, consecutive=3) == 0
    assert any("watch" in m for m in messages) is False  # d against c: no drop between them
    # A third run with the drop: it holds over three consecutive runs.
    path = write(tmp_path, line("a", {KEY: good}), line("b", {KEY: bad}), line("c", {KEY: bad}),
                 line("d", {KEY: bad}))
    messages.clear()
    assert history.check(path, out=messages.append, consecutive=3) == 1
    assert any("REGRESSION" in m and "newest 3" in m for m in messages)


def test_a_single_noisy_run_is_watched_not_alerted(tmp_path):
    good, bad = (0.5, 1.0), (0.3, 0.6)
    path = write(tmp_path, line("a", {KEY: good}), line("b", {KEY: good}), line("c", {KEY: good}),
                 line("d", {KEY: bad}))
    messages: list[str] = []
    assert history.check(path, out=messages.append, consecutive=3) == 0
    assert any(m.startswith("  watch") and KEY in m for m in messages)
    assert not any("REGRESSION" in m for m in messages)


def test_too_few_runs_for_the_alert_only_watch(tmp_path):
    path = write(tmp_path, line("a", {KEY: (0.5, 1.0)}), line("b", {KEY: (0.3, 0.6)}))
    messages: list[str] = []
    assert history.check(path, out=messages.append, consecutive=3) == 0
    assert any("an alert needs 4" in m for m in messages)
    assert any(m.startswith("  watch") for m in messages)


def _results(medians: dict[str, float], better: str = "higher") -> dict:
    """A minimal results document: one scenario, one figure, the given medians."""
    kinds = {"floor_c": "floor", "mp_pipe": "incumbent", "node_fork_json": "incumbent",
             "wirepool_rust": "wirepool"}
    results = [{"runner": r, "scenario": "W1.echo.64B", "status": "ok",
                "figures": [{"name": "m", "unit": "u", "better": better, "values": [v]}]}
               for r, v in medians.items()]
    for r in results:
        analysis.attach_stats(r)
    return {"started": "t", "git": {"commit": "c" * 40}, "mode": "full",
            "machine": {"cpu": "x"}, "runners": [{"name": n, "kind": k} for n, k in kinds.items()],
            "comparisons": analysis.compare(results, kinds)}


def test_history_line_holds_ratios_against_floor_and_best_incumbent():
    doc = _results({"floor_c": 100.0, "mp_pipe": 20.0, "node_fork_json": 40.0,
                    "wirepool_rust": 50.0})
    ratios = history.history_line(doc)["ratios"]
    assert ratios["wirepool_rust|W1.echo.64B|m"] == {"vs_floor": 0.5, "vs_best_incumbent": 1.25,
                                                     "median": 50.0, "better": "higher"}
    assert ratios["mp_pipe|W1.echo.64B|m"] == {"vs_floor": 0.2, "vs_best_incumbent": 0.5,
                                               "median": 20.0, "better": "higher"}
    assert not any(k.startswith("floor_c|") for k in ratios)


def test_latency_ratios_are_inverted_so_bigger_is_better():
    doc = _results({"floor_c": 5.0, "mp_pipe": 20.0, "node_fork_json": 40.0,
                    "wirepool_rust": 10.0}, better="lower")
    row = doc["comparisons"][0]
    assert row["best_incumbent"] == {"runner": "mp_pipe", "median": 20.0}
    assert row["runners"]["wirepool_rust"]["vs_floor"] == 0.5
    assert row["runners"]["wirepool_rust"]["vs_best_incumbent"] == 2.0


def test_summary_is_min_median_max_of_repeats():
    assert analysis.summarize([3.0, 1.0, 2.0, 10.0, 4.0]) == {"min": 1.0, "median": 3.0,
                                                               "max": 10.0}
