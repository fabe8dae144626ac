"""The hostile-worker suite: every parent runner of ``languages.json`` against the scripted
hostile worker (``hostile/scenarios.json``, one test per parent x scenario) and against the
fuzzing worker (seeded runs for a bounded time, plus every committed regression seed).

A scenario's expectation is the spec's outcome for that misbehaviour: the error code (and the
1xx code of a PROTOCOL_VIOLATION), a time bound, the worker replaced or not, the pool still
serving, exactly ``workers`` live worker processes, and the runner's own peak RSS. Mutants
(scenarios whose expectation is wrong on purpose) must be reported as failed, so every kind of
check can fail. Nothing is skipped or expected to fail: a parent that hangs on a hostile worker
fails here until it is fixed.

``HOSTILE_FUZZ_SECONDS`` (default 20) is the fuzzing budget per parent; ``make fuzz`` raises it.
A seed that fails in a new way (its report, digits left out, is not one recorded for that parent
yet) is added to ``hostile/fuzz_regressions.json`` (commit it) and replayed on every run.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

import test_matrix as matrix

HERE = Path(__file__).resolve().parent
HOSTILE = HERE / "hostile"
SCENARIOS = json.loads((HOSTILE / "scenarios.json").read_text(encoding="utf-8"))
NAMES = [sc["name"] for sc in SCENARIOS["scenarios"]]
REGRESSIONS_PATH = HOSTILE / "fuzz_regressions.json"
HOSTILE_WORKER = [sys.executable, str(HOSTILE / "hostile_worker.py")]
FUZZ_WORKER = [sys.executable, str(HOSTILE / "fuzz_worker.py")]
PARENTS = [lang["name"] for lang in matrix.LANGUAGES if "parent" in lang]

RUNNER_TIMEOUT_S = 600  # one runner invocation: every hostile scenario and mutant of a parent
FUZZ_SECONDS = float(os.environ.get("HOSTILE_FUZZ_SECONDS", "20"))
FUZZ_BATCH = 8  # seeds per runner invocation

pytestmark = pytest.mark.timeout(matrix.BUILD_TIMEOUT_S + RUNNER_TIMEOUT_S + 120)


def run_runner(parent: str, doc: dict, worker_argv: list[str]) -> matrix.RunnerRun:
    """Runs ``parent``'s runner on the scenarios of ``doc`` against ``worker_argv``, bounded in
    time, in its own session; collects its reports and any process it leaves behind."""
    error = matrix.build(parent)
    if error is not None:
        return matrix.RunnerRun(error=f"{parent}: {error}")
    argv = matrix.expand(matrix.BY_NAME[parent]["parent"])
    program = Path(argv[0])
    if program.is_absolute() and not program.exists():
        return matrix.RunnerRun(error=f"the parent runner {program} does not exist")
    marker = uuid.uuid4().hex
    run = matrix.RunnerRun()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenarios.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
        with open(Path(tmp) / "out", "w+b") as out, open(Path(tmp) / "err", "w+b") as err:
            try:
                proc = subprocess.Popen([*argv, "--scenarios", str(path), "--", *worker_argv],
                                        cwd=matrix.REPO,
                                        env={**os.environ, matrix.MARKER_ENV: marker},
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        start_new_session=True)
            except OSError as e:
                return matrix.RunnerRun(error=f"cannot start the {parent} parent runner: {e}")
            try:
                run.returncode = proc.wait(timeout=RUNNER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                run.error = f"the runner did not finish within {RUNNER_TIMEOUT_S}s (killed)"
            out.seek(0)
            err.seek(0)
            lines = out.read().decode(errors="replace").splitlines()
            run.stderr_tail = err.read().decode(errors="replace")[-4000:]
    deadline = time.monotonic() + matrix.LEAK_WAIT_S
    while matrix.marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)  # bounded wait for asynchronous parent-death signals, not a sync point
    run.leaked = matrix.marked_processes(marker)
    matrix.kill_marked(marker)
    for line in lines:
        try:
            report = json.loads(line)
            name = report["scenario"]
        except (ValueError, KeyError, TypeError):
            run.garbage.append(line)
            continue
        if name in run.reports:
            run.duplicates.append(name)
        run.reports[name] = report
    return run


# ---------------------------------------------------------------------------------------------
# Mutants: wrong on purpose, each must be reported as failed
# ---------------------------------------------------------------------------------------------


def mutants() -> list[dict]:
    """Each with ``why``: text the runner's failure detail must contain, so it is the mutated
    check that failed, not something else."""
    base = {sc["name"]: sc for sc in SCENARIOS["scenarios"]}
    out = []

    def mutant(of: str, what: str, why: str, change) -> None:
        sc = copy.deepcopy(base[of])
        sc["name"] = f"mutant_{of}_{what}"
        sc["why"] = why
        change(sc)
        out.append(sc)

    def expect(**kv):
        return lambda sc: sc["expect"].update(kv)

    def error(**kv):
        return lambda sc: sc["expect"]["error"].update(kv)

    mutant("unknown_frame_type", "protocol_code", "expected protocol code 104",
           error(protocol_code=104))
    mutant("id_zero_on_result", "code", "WORKER_HUNG", error(code="WORKER_HUNG"))
    mutant("exit_before_hello", "exit_status", "exit with status 8", error(exit_status=8))
    mutant("replacements_die_before_hello", "exit_status", "exit with status 5",
           error(exit_status=5))
    mutant("kind_mismatch_rows_for_unary", "too_tight", "more than 0", expect(max_elapsed_s=0.0))
    mutant("never_hello", "too_tight", "more than 0.5", expect(max_elapsed_s=0.5))
    mutant("duplicate_terminal", "restarted", "expected the worker to be replaced",
           lambda sc: sc.update(restarted=True))
    mutant("flood_stdout_stderr", "rss", "above the bound of 5",
           lambda sc: sc.update(max_parent_rss_mb=5))
    mutant("hello_byte_by_byte", "timeout", "expected start-up to fail", lambda sc: sc.update(
        expect={"error": {"code": "STARTUP_TIMEOUT"}}))
    mutant("impossible_row_count", "rows", "expected 1 rows",
           lambda sc: sc["expect"]["rows"].update(count=1))
    mutant("duplicate_terminal", "live_workers", "expected 2",
           lambda sc: sc.update(live_workers=2))
    mutant("length_4gib", "rss_after", "bound 1", expect(max_rss_after_mb=1))
    return out


MUTANTS = mutants()


# ---------------------------------------------------------------------------------------------
# One runner invocation per parent (scenarios and mutants), all parents at once
# ---------------------------------------------------------------------------------------------

_runs: dict[str, matrix.RunnerRun] = {}
_lock = threading.Lock()


def hostile_run(parent: str) -> matrix.RunnerRun:
    """Every parent's run, started together on first use (they are independent processes)."""
    with _lock:
        if not _runs:
            for lang in PARENTS:  # build first: the builds share one cargo target directory
                matrix.build(lang)
            doc = {**SCENARIOS, "scenarios": SCENARIOS["scenarios"] + MUTANTS}
            results: dict[str, matrix.RunnerRun] = {}

            def one(lang: str) -> None:
                results[lang] = run_runner(lang, doc, HOSTILE_WORKER)

            threads = [threading.Thread(target=one, args=(lang,)) for lang in PARENTS]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            _runs.update(results)
    return _runs[parent]


@pytest.mark.parametrize("parent,scenario", [(p, s) for p in PARENTS for s in NAMES],
                         ids=[f"{p}_parent-{s}" for p in PARENTS for s in NAMES])
def test_hostile(parent: str, scenario: str) -> None:
    run = hostile_run(parent)
    if run.error is not None and scenario not in run.reports:
        pytest.fail(f"{parent} parent: {run.error}\nrunner stderr tail:\n{run.stderr_tail}")
    report = run.reports.get(scenario)
    if report is None:
        pytest.fail(f"{parent} parent: the runner reported nothing for {scenario!r} (exit "
                    f"status {run.returncode})\nrunner stderr tail:\n{run.stderr_tail}")
    if report.get("ok") is not True:
        pytest.fail(f"{parent} parent, hostile scenario {scenario}: {report.get('detail')} "
                    f"(after {report.get('elapsed', 0):.2f}s)", pytrace=False)


@pytest.mark.parametrize("parent", PARENTS, ids=[f"{p}_parent" for p in PARENTS])
def test_hostile_runner_reports_every_scenario_once(parent: str) -> None:
    run = hostile_run(parent)
    assert run.error is None, f"{run.error}\n{run.stderr_tail}"
    assert run.returncode == 0, f"runner exit status {run.returncode}:\n{run.stderr_tail}"
    assert not run.garbage, f"lines that are not reports: {run.garbage[:5]}"
    assert not run.duplicates, f"scenarios reported twice: {run.duplicates}"
    want = NAMES + [m["name"] for m in MUTANTS]
    assert sorted(run.reports) == sorted(want), (
        f"missing {sorted(set(want) - set(run.reports))}, "
        f"unknown {sorted(set(run.reports) - set(want))}")


@pytest.mark.parametrize("parent", PARENTS, ids=[f"{p}_parent" for p in PARENTS])
def test_hostile_no_leaked_processes(parent: str) -> None:
    run = hostile_run(parent)
    assert run.error is None, run.error
    assert not run.leaked, (f"the {parent} parent runner left processes running "
                            f"{matrix.LEAK_WAIT_S}s after it exited: {run.leaked}")


@pytest.mark.parametrize("parent", PARENTS, ids=[f"{p}_parent" for p in PARENTS])
def test_hostile_runner_detects_wrong_expectations(parent: str) -> None:
    run = hostile_run(parent)
    missing = [m["name"] for m in MUTANTS if m["name"] not in run.reports]
    assert not missing, f"no report for {missing}\n{run.error}\n{run.stderr_tail}"
    passed = [m["name"] for m in MUTANTS if run.reports[m["name"]]["ok"]]
    assert not passed, f"the {parent} runner accepted wrong expectations: {passed}"
    other = {m["name"]: run.reports[m["name"]]["detail"] for m in MUTANTS
             if m["why"] not in run.reports[m["name"]]["detail"]}
    assert not other, f"mutants failed for another reason than their mutation: {other}"


def test_hostile_scenario_list_is_consistent() -> None:
    assert len(NAMES) == len(set(NAMES)), "scenario names must be unique"
    codes = SCENARIOS["error_codes"]
    modes = (HOSTILE / "hostile_worker.py").read_text(encoding="utf-8")
    for sc in SCENARIOS["scenarios"]:
        assert sc["kind"] in {"call", "stream", "startup", "parallel_calls"}, sc["name"]
        err = sc["expect"].get("error")
        if err is not None and isinstance(err["code"], str):
            assert err["code"] in codes, sc["name"]
        if err is not None and "protocol_code" in err:
            assert err["code"] == "PROTOCOL_VIOLATION" and 100 <= err["protocol_code"] < 200
        mode = sc["worker_env"]["HOSTILE_MODE"]
        assert f'mode == "{mode}"' in modes, f"{sc['name']}: no mode {mode!r} in the worker"
        assert sc["worker_env"]["HOSTILE_STATE"] == "{tmp}", sc["name"]
        # A scenario that does not say how long its outcome may take could hang unnoticed.
        assert "max_elapsed_s" in sc["expect"] or sc["kind"] == "parallel_calls" \
            or "pause" in sc or "started" in sc["expect"], sc["name"]


# ---------------------------------------------------------------------------------------------
# Matrix mutants: broken workers that a scenario of scenarios.json must catch
# ---------------------------------------------------------------------------------------------

# (scenario of scenarios.json, HOSTILE_MODE of a worker that breaks the MUST it checks, text the
# runner's failure detail must contain). Each scenario runs with the matrix's own defaults and
# health check against the hostile worker twice: misbehaving (it must be reported as failed, for
# the reason given) and with no incarnation misbehaving (the control: it must pass, so that the
# failure is the mutation's, not the raw worker's).
MATRIX_MUTANTS = [
    # Spec 8.1: a summary above max_message_size is sent anyway; the parent fails the connection
    # with 115 MESSAGE_TOO_LARGE (code 307) and replaces the worker, where HANDLER_ERROR was due.
    ("summary_above_max_message_size", "oversized_summary", "307"),
    # Spec 8.3: the worker ignores its deadline timer and sends the deaf handler's result when it
    # returns (1.5 s in), where DEADLINE_EXCEEDED was due at the 0.3 s timer.
    ("deadline_wins_over_a_late_return", "late_result", "DEADLINE_EXCEEDED"),
]


def matrix_mutant_doc() -> dict:
    base = {sc["name"]: sc for sc in matrix.SCENARIOS["scenarios"]}
    out = []
    for name, mode, _ in MATRIX_MUTANTS:
        for on, prefix in (("1", "broken"), ("0", "control")):
            sc = copy.deepcopy(base[name])
            sc["name"] = f"{prefix}_{name}"
            sc["worker_env"] = {"HOSTILE_MODE": mode, "HOSTILE_STATE": "{tmp}", "HOSTILE_ON": on}
            out.append(sc)
    return {**matrix.SCENARIOS, "scenarios": out}


_matrix_mutant_runs: dict[str, matrix.RunnerRun] = {}


def matrix_mutant_run(parent: str) -> matrix.RunnerRun:
    if parent not in _matrix_mutant_runs:
        _matrix_mutant_runs[parent] = run_runner(parent, matrix_mutant_doc(), HOSTILE_WORKER)
    return _matrix_mutant_runs[parent]


@pytest.mark.parametrize("parent,scenario", [(p, m[0]) for p in PARENTS for m in MATRIX_MUTANTS],
                         ids=[f"{p}_parent-{m[0]}" for p in PARENTS for m in MATRIX_MUTANTS])
def test_matrix_scenario_fails_on_broken_worker(parent: str, scenario: str) -> None:
    run = matrix_mutant_run(parent)
    assert run.error is None, f"{run.error}\n{run.stderr_tail}"
    assert not run.leaked, f"leaked processes: {run.leaked}"
    why = {m[0]: m[2] for m in MATRIX_MUTANTS}[scenario]
    control = run.reports.get(f"control_{scenario}")
    broken = run.reports.get(f"broken_{scenario}")
    assert control is not None and broken is not None, f"no report\n{run.stderr_tail}"
    assert control["ok"], f"the correct hostile worker fails {scenario}: {control['detail']}"
    assert not broken["ok"], (f"the {parent} runner passed {scenario} against a worker that "
                              f"breaks it: {broken['detail']}")
    assert why in broken["detail"], (f"{scenario} failed for another reason than the "
                                     f"mutation ({why!r}): {broken['detail']}")


def test_matrix_mutants_are_consistent() -> None:
    names = {sc["name"] for sc in matrix.SCENARIOS["scenarios"]}
    modes = (HOSTILE / "hostile_worker.py").read_text(encoding="utf-8")
    for name, mode, _ in MATRIX_MUTANTS:
        assert name in names, f"{name} is not a scenario of scenarios.json"
        assert f'"{mode}"' in modes, f"no mode {mode!r} in the hostile worker"


# ---------------------------------------------------------------------------------------------
# Fuzzing
# ---------------------------------------------------------------------------------------------


def fuzz_scenario(seed: int) -> dict:
    """Two calls and two streams at once against a fuzzing worker: each must end in one
    outcome within the bound, then the pool must serve with one live worker and bounded RSS."""
    return {"name": f"fuzz_{seed}", "kind": "any_outcome", "method": "echo",
            "stream_method": "decls", "codec": "json", "request": {"value": {"n": 3}},
            "calls": 2, "streams": 2, "call_timeout_s": 1.0,
            "worker_env": {"FUZZ_SEED": str(seed), "HOSTILE_STATE": "{tmp}"},
            "expect": {"any": True, "max_elapsed_s": 5.0}, "restarted": None,
            "max_parent_rss_mb": 400, "timeout_s": 15.0}


def regressions() -> list[int]:
    if not REGRESSIONS_PATH.exists():
        return []
    seeds = [int(s["seed"]) for s in json.loads(REGRESSIONS_PATH.read_text())["seeds"]]
    return list(dict.fromkeys(seeds))  # a seed recorded for two parents runs once


def record_regressions(failed: dict[int, str], parent: str) -> None:
    doc: dict = (json.loads(REGRESSIONS_PATH.read_text()) if REGRESSIONS_PATH.exists() else
                 {"about": "fuzz seeds that once failed a parent: replayed on every run",
                  "seeds": []})
    def shape(detail: str) -> str:  # one seed per way of failing, not per seed
        return re.sub(r"\d+", "N", detail)[:48]

    known = {(s["parent"], shape(s["found"])) for s in doc["seeds"]}
    replayed = {(s["parent"], int(s["seed"])) for s in doc["seeds"]}
    for seed, detail in sorted(failed.items()):
        if (parent, seed) not in replayed and (parent, shape(detail[:300])) not in known:
            known.add((parent, shape(detail[:300])))
            doc["seeds"].append({"seed": seed, "parent": parent, "found": detail[:300]})
    REGRESSIONS_PATH.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


@pytest.mark.parametrize("parent", PARENTS, ids=[f"{p}_parent" for p in PARENTS])
def test_fuzz(parent: str) -> None:
    """Every regression seed, then random seeds for FUZZ_SECONDS: the runner never crashes or
    hangs, every request ends in one outcome in time, memory stays bounded, the pool serves."""
    rng = random.Random()
    queue = regressions()
    started = time.monotonic()
    ran, failed, problems = 0, {}, []
    while queue or time.monotonic() - started < FUZZ_SECONDS:
        # Regression seeds run one per runner, so a crash they once caused is not masked by
        # (or blamed on) another seed of the same runner.
        batch, queue = queue[:1], queue[1:]
        if not batch:
            batch = [rng.randrange(1 << 32) for _ in range(FUZZ_BATCH)]
        doc = {**SCENARIOS, "scenarios": [fuzz_scenario(s) for s in batch]}
        run = run_runner(parent, doc, FUZZ_WORKER)
        if run.error is not None or run.returncode != 0 or run.leaked or run.garbage:
            problems.append(f"seeds {batch}: error {run.error}, exit {run.returncode}, leaked "
                            f"{run.leaked}, garbage {run.garbage[:3]}\n{run.stderr_tail}")
        reported = [seed for seed in batch if f"fuzz_{seed}" in run.reports]
        for seed in reported:
            ran += 1
            report = run.reports[f"fuzz_{seed}"]
            if report.get("ok") is not True:
                failed[seed] = str(report.get("detail"))
        if run.returncode != 0 or len(reported) < len(batch):
            # The runner died right after the last seed it reported (e.g. in the garbage
            # collector) or during the first it did not: both are kept for replay.
            unreported = [seed for seed in batch if seed not in reported]
            for culprit in reported[-1:] + unreported[:1]:
                failed[culprit] = (f"the runner crashed or hung (exit {run.returncode}) around "
                                   f"this seed: {failed.get(culprit, 'no report')}")
    if failed:
        record_regressions(failed, parent)
    assert not problems, f"{len(problems)} runner runs went wrong; the first: {problems[0]}"
    assert not failed, (f"{len(failed)} of {ran} fuzz seeds failed on the {parent} parent "
                        f"(recorded in {REGRESSIONS_PATH.name}): "
                        + "; ".join(f"{s}: {d[:300]}" for s, d in list(failed.items())[:5]))
