"""Runner execution: results parsed, failures and time-outs visible, process groups killed."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import execute, report  # noqa: E402

SCENARIO = {"id": "W1.echo.64B", "workload": "W1", "kind": "echo", "time_limit_s": 20}


def script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "runner.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_result_is_the_last_json_line_with_a_status(tmp_path):
    argv = script(tmp_path, """
        import json, sys
        sc = json.loads(sys.argv[-1])
        print("chatter that is not JSON")
        print(json.dumps({"runner": "t", "scenario": sc["id"], "status": "ok", "figures": []}))
    """)
    res = execute.run_scenario(argv, SCENARIO)
    assert res["status"] == "ok" and res["scenario"] == "W1.echo.64B"


def test_a_crashing_runner_is_an_error_with_its_stderr(tmp_path):
    argv = script(tmp_path, """
        import sys
        sys.stderr.write("worker exploded\\n")
        sys.exit(3)
    """)
    res = execute.run_scenario(argv, SCENARIO)
    assert res["status"] == "error"
    assert "exit 3" in res["reason"] and "worker exploded" in res["reason"]


def test_a_hung_runner_times_out_and_its_children_die_with_it(tmp_path):
    pid_file = tmp_path / "child.pid"
    argv = script(tmp_path, f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(600)
    """)
    res = execute.run_scenario(argv, {**SCENARIO, "time_limit_s": 2})
    assert res["status"] == "timeout"
    child = int(pid_file.read_text())
    # SIGKILL to the group is delivered asynchronously: the child may still be running for a
    # moment after killpg returns. It must be gone (or a zombie awaiting its reaper) within 5 s.
    state = Path(f"/proc/{child}/stat")
    deadline = time.monotonic() + 5
    while True:
        try:
            os.waitpid(child, os.WNOHANG)  # reap it if it is ours
        except ChildProcessError:
            pass
        try:
            dead = state.read_text().split(")")[1].split()[0] in ("Z", "X")
        except (FileNotFoundError, ProcessLookupError):
            dead = True
        if dead:
            break
        assert time.monotonic() < deadline, f"child {child} survived its runner's timeout"
        time.sleep(0.01)  # polling a condition, bounded by the deadline


def test_an_undiscoverable_runner_is_reported_not_available():
    assert execute.discover("no_such_runner_for_tests") is None
    doc = {
        "mode": "quick", "started": "s", "finished": "f", "repeats": 3,
        "git": {"commit": "c"},
        "machine": {"cpu": "x", "cores": 2, "mem_gib": 1, "kernel": "k", "load_before": "0",
                    "load_after": "0", "versions": {}},
        "runners": [{"name": "wirepool_rust", "kind": "wirepool", "label": "ours",
                     "available": False, "reason": "bench/runners/wirepool_rust.* not found"}],
        "scenarios": [SCENARIO],
        "results": [{"runner": "wirepool_rust", "scenario": "W1.echo.64B",
                     "status": "not_available", "reason": "not found"}],
        "comparisons": [],
    }
    text = report.render(doc, [])
    assert "wirepool_rust: not available in this run" in text
    assert "| W1.echo.64B | - | not available | - |" in text


def test_report_names_every_figure_where_wirepool_loses():
    from harness import analysis

    kinds = {"floor_c": "floor", "mp_pipe": "incumbent", "wirepool_python": "wirepool"}
    results = []
    for runner, rate, p50 in (("floor_c", 100_000, 5.0), ("mp_pipe", 40_000, 11.0),
                              ("wirepool_python", 30_000, 9.0)):
        # wirepool's calls/s repeats spread by more than half the median: marked noisy.
        rates = [rate, rate * 1.6, rate * 0.9] if runner == "wirepool_python" else [rate]
        res = {"runner": runner, "scenario": "W1.echo.64B", "status": "ok", "figures": [
            {"name": "calls_per_s", "unit": "calls/s", "better": "higher", "values": rates},
            {"name": "p50_us", "unit": "us", "better": "lower", "values": [p50]}]}
        analysis.attach_stats(res)
        results.append(res)
    results.append({"runner": "wirepool_python", "scenario": "W4.small_rows.8K",
                    "status": "timeout", "reason": "killed after 45 s"})
    doc = {
        "mode": "quick", "started": "s", "finished": "f", "repeats": 1, "git": {"commit": "c"},
        "machine": {"cpu": "x", "cores": 2, "mem_gib": 1, "kernel": "k", "load_before": "0",
                    "load_after": "0", "versions": {}},
        "runners": [{"name": n, "kind": k, "label": n, "available": True, "reason": ""}
                    for n, k in kinds.items()],
        "scenarios": [{"id": "W1.echo.64B", "workload": "W1"},
                      {"id": "W4.small_rows.8K", "workload": "W4"}],
        "results": results,
        "comparisons": analysis.compare(results, kinds),
    }
    text = report.render(doc, [])
    assert "**wirepool_python** loses to the best incumbent on 1 figure(s):" in text
    assert "W1.echo.64B calls_per_s: 30k calls/s against mp_pipe 40k (0.75x)" in text
    losses = text.split("## Where wirepool loses")[1].split("\n## ")[0]
    assert "p50_us" not in losses  # 9 us beats mp_pipe's 11 us: not a loss
    assert "W4.small_rows.8K: timeout (killed after 45 s)" in text
    assert "30k~ (0.30x) [0.75x best]" in text
    assert "| 40k (0.40x) |" in text  # mp_pipe: one repeat, no spread


def test_discovery_maps_extensions_to_interpreters_and_prepare_reports_failure(tmp_path):
    (tmp_path / "wirepool_fake.py").write_text("")
    assert execute.discover("wirepool_fake", tmp_path) == ["{python}",
                                                           str(tmp_path / "wirepool_fake.py")]
    build = tmp_path / "wirepool_other.sh"
    build.write_text('[ "$1" = --prepare ] && { echo "cargo: no such crate" >&2; exit 101; }\n')
    argv = execute.discover("wirepool_other", tmp_path)
    assert argv == ["bash", str(build)]
    failure = execute.prepare(argv, timeout_s=30)
    assert failure is not None and "exited 101" in failure and "no such crate" in failure
    build.write_text('[ "$1" = --prepare ] && exit 0\n')
    assert execute.prepare(argv, timeout_s=30) is None


def test_plan_marks_baselines_not_applicable_on_a_codec_scenario():
    runners = [{"name": "floor_c", "kind": "floor", "available": True, "reason": ""},
               {"name": "mp_pipe", "kind": "incumbent", "available": True, "reason": ""},
               {"name": "wirepool_rust", "kind": "wirepool", "available": True, "reason": ""},
               {"name": "wirepool_python", "kind": "wirepool", "available": False,
                "reason": "no venv"}]
    json_rows = {"id": "W4.small_rows.8K", "workload": "W4", "codec": "json"}
    cbor_rows = {"id": "W4.small_rows.8K.cbor", "workload": "W4", "codec": "cbor",
                 "runner_kinds": ["floor", "wirepool"], "not_applicable": "own codec"}
    frames = {"id": "W2.frames", "workload": "W2", "only": ["floor_c"]}
    known, jobs = execute.plan([json_rows, cbor_rows, frames], runners)
    assert [(sc["id"], r["name"]) for sc, r in jobs] == [
        ("W4.small_rows.8K", "floor_c"), ("W4.small_rows.8K", "mp_pipe"),
        ("W4.small_rows.8K", "wirepool_rust"), ("W4.small_rows.8K.cbor", "floor_c"),
        ("W4.small_rows.8K.cbor", "wirepool_rust"), ("W2.frames", "floor_c")]
    assert {(k["scenario"], k["runner"], k["status"], k["reason"]) for k in known} == {
        ("W4.small_rows.8K", "wirepool_python", "not_available", "no venv"),
        ("W4.small_rows.8K.cbor", "mp_pipe", "not_applicable", "own codec"),
        ("W4.small_rows.8K.cbor", "wirepool_python", "not_available", "no venv")}


def test_w4_table_names_the_codec_of_every_row_and_shows_n_a_for_baselines():
    from harness import analysis

    kinds = {"floor_c": "floor", "mp_pipe": "incumbent", "wirepool_rust": "wirepool"}
    results = []
    for runner, scen, rate in (("floor_c", "W4.small_rows.8K", 9e6),
                               ("mp_pipe", "W4.small_rows.8K", 1e6),
                               ("wirepool_rust", "W4.small_rows.8K", 3e6),
                               ("floor_c", "W4.small_rows.8K.msgpack", 9e6),
                               ("wirepool_rust", "W4.small_rows.8K.msgpack", 4e6)):
        res = {"runner": runner, "scenario": scen, "status": "ok", "figures": [
            {"name": "rows_per_s", "unit": "rows/s", "better": "higher", "values": [rate]}]}
        analysis.attach_stats(res)
        results.append(res)
    results.append({"runner": "mp_pipe", "scenario": "W4.small_rows.8K.msgpack",
                    "status": "not_applicable", "reason": "own codec"})
    doc = {
        "mode": "quick", "started": "s", "finished": "f", "repeats": 1, "git": {"commit": "c"},
        "machine": {"cpu": "x", "cores": 2, "mem_gib": 1, "kernel": "k", "load_before": "0",
                    "load_after": "0", "versions": {}},
        "runners": [{"name": n, "kind": k, "label": n, "available": True, "reason": ""}
                    for n, k in kinds.items()],
        "scenarios": [{"id": "W4.small_rows.8K", "workload": "W4", "codec": "json"},
                      {"id": "W4.small_rows.8K.msgpack", "workload": "W4", "codec": "msgpack"}],
        "results": results,
        "comparisons": analysis.compare(results, kinds),
    }
    text = report.render(doc, [])
    w4 = text.split("## W4")[1].split("\n## ")[0]
    assert "| scenario | figure | wirepool codec | floor_c | mp_pipe | wirepool_rust |" in w4
    assert "| W4.small_rows.8K | rows_per_s (rows/s) | json | 9.00M | 1.00M (0.11x) |" in w4
    # The baselines are n/a in msgpack; the row is compared with their figure on the same rows
    # in their own codec (the JSON scenario), and says so.
    assert ("| W4.small_rows.8K.msgpack | rows_per_s (rows/s) | msgpack | 9.00M | n/a "
            "| 4.00M (0.44x) [4.00x best] | mp_pipe 1.00M (of W4.small_rows.8K) |") in w4
    assert "mp_* and process_pool_executor pickle" in w4  # the baselines' own codecs are named


def test_durations_sum_wall_time_per_scenario_and_runner_and_the_report_states_them():
    from harness import analysis

    results = [{"runner": "a", "scenario": "W1.echo.64B", "status": "ok", "wall_s": 1.5},
               {"runner": "b", "scenario": "W1.echo.64B", "status": "timeout", "wall_s": 45.0},
               {"runner": "a", "scenario": "W5.task50us.w2", "status": "ok", "wall_s": 2.0},
               {"runner": "b", "scenario": "W4.x.raw", "status": "not_applicable"}]
    d = analysis.durations(results, setup_s=3.0, measuring_s=48.6, total_s=125.0)
    assert d["per_scenario_s"] == {"W1.echo.64B": 46.5, "W5.task50us.w2": 2.0}
    assert list(d["per_runner_s"]) == ["b", "a"] and d["per_runner_s"]["a"] == 3.5
    assert (d["setup_s"], d["measuring_s"], d["total_s"]) == (3.0, 48.6, 125.0)
    assert analysis.fmt_duration(125.0) == "2 min 05 s"
    assert analysis.fmt_duration(42.4) == "42 s"
    lines = report._duration_lines(d)
    assert lines[0].startswith("- duration: 2 min 05 s (setup 3 s, measuring 49 s")
    assert "W1.echo.64B 46 s, W5.task50us.w2 2 s" in lines[0]


def test_a_codec_row_is_compared_with_the_incumbents_of_its_rows_in_their_own_codec():
    from harness import analysis

    kinds = {"floor_c": "floor", "ipc_channel": "incumbent", "mp_pipe": "incumbent",
             "wirepool_rust": "wirepool"}
    results = []
    for runner, scenario, rate in (("floor_c", "W4.small_rows.64K", 5e6),
                                   ("ipc_channel", "W4.small_rows.64K", 4e6),
                                   ("mp_pipe", "W4.small_rows.64K", 1e6),
                                   ("wirepool_rust", "W4.small_rows.64K", 3e6),
                                   ("floor_c", "W4.small_rows.64K.msgpack", 5e6),
                                   ("wirepool_rust", "W4.small_rows.64K.msgpack", 2e6),
                                   ("wirepool_rust", "W4.large_rows.4K.weird", 1e5)):
        res = {"runner": runner, "scenario": scenario, "status": "ok", "figures": [
            {"name": "rows_per_s", "unit": "rows/s", "better": "higher", "values": [rate]}]}
        analysis.attach_stats(res)
        results.append(res)
    rows = {c["scenario"]: c for c in analysis.compare(results, kinds)}
    # The JSON row's own best; the msgpack row borrows it and says from where.
    assert rows["W4.small_rows.64K"]["best_incumbent"] == {"runner": "ipc_channel",
                                                           "median": 4e6}
    msgpack = rows["W4.small_rows.64K.msgpack"]
    assert msgpack["best_incumbent"] == {"runner": "ipc_channel", "median": 4e6,
                                         "scenario": "W4.small_rows.64K"}
    assert msgpack["runners"]["wirepool_rust"]["vs_best_incumbent"] == 0.5
    # Not a codec suffix: nothing borrowed.
    assert rows["W4.large_rows.4K.weird"]["best_incumbent"] is None
