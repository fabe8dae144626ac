"""The cross-language conformance matrix: every parent runner x every conformance worker x every
scenario of ``scenarios.json``, one test each, so a failure names the pair and the scenario.

Languages come from ``languages.json`` (one row each); each pair's runner is started once, in its
own session, with a hard time bound, and its JSON lines are cached for the per-scenario tests.
After a runner exits, every process it started must be gone (found by an environment marker
they inherit), else ``test_no_leaked_processes`` fails and the leftovers are killed.

A language whose build fails or whose runner is missing fails its tests; nothing is skipped.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCENARIOS_PATH = HERE / "scenarios.json"
SCENARIOS = json.loads(SCENARIOS_PATH.read_text(encoding="utf-8"))
# Extra languages, from outside the repository: files of the same form as languages.json, named
# by WIREPOOL_LANGUAGES (os.pathsep between several). "{here}" in an extra file's commands is
# that file's own folder, so an SDK kept elsewhere points at its own build.
LANGUAGES_ENV = "WIREPOOL_LANGUAGES"


def load_languages(extra: str | None = None) -> list[dict]:
    """languages.json's rows, then every extra file's; a name may appear once."""
    rows = json.loads((HERE / "languages.json").read_text(encoding="utf-8"))["languages"]
    for path in filter(None, (extra or "").split(os.pathsep)):
        file = Path(path).resolve()
        added = json.loads(file.read_text(encoding="utf-8"))["languages"]
        rows += [json.loads(json.dumps(lang).replace("{here}", str(file.parent)))
                 for lang in added]
    names = [lang["name"] for lang in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"languages named twice (languages.json and {LANGUAGES_ENV}): {dup}")
    for lang in rows:
        if not ("worker" in lang or "parent" in lang):
            raise ValueError(f"language {lang['name']!r} has neither a worker nor a parent")
    return rows


LANGUAGES = load_languages(os.environ.get(LANGUAGES_ENV))
BY_NAME = {lang["name"]: lang for lang in LANGUAGES}
NAMES = [sc["name"] for sc in SCENARIOS["scenarios"]]

BUILD_TIMEOUT_S = 1800  # a cold cargo build on a busy 2-vCPU machine
RUNNER_TIMEOUT_S = 900  # one runner invocation: every scenario of one pair
LEAK_WAIT_S = 10.0  # workers die of the parent-death signal, asynchronously
MARKER_ENV = "WIREPOOL_CONFORMANCE_RUN"

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + RUNNER_TIMEOUT_S + 120)


def cargo_target() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", REPO / "rust" / "target"))


def expand(argv: list[str]) -> list[str]:
    values = {"repo": str(REPO), "python": sys.executable, "cargo_target": str(cargo_target())}
    return [a.format(**values) for a in argv]


# ---------------------------------------------------------------------------------------------
# Builds (once per session) and runner invocations (once per pair)
# ---------------------------------------------------------------------------------------------

_build_errors: dict[str, str | None] = {}


def build(lang: str) -> str | None:
    """Builds the language's artefacts once; returns why it failed, or None."""
    if lang not in _build_errors:
        spec = BY_NAME[lang].get("build")
        error = None
        if spec:
            try:
                done = subprocess.run(expand(spec["command"]), cwd=REPO / spec.get("cwd", "."),
                                      capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
                if done.returncode != 0:
                    error = (f"build {spec['command']} exited {done.returncode}: "
                             f"{done.stderr[-3000:]}")
            except (OSError, subprocess.TimeoutExpired) as e:
                error = f"build {spec['command']} failed: {e}"
        _build_errors[lang] = error
    return _build_errors[lang]


def marked_processes(marker: str) -> list[tuple[int, str]]:
    """Live processes (zombies have no environment) started under ``marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((int(entry), cmd))
    return found


def kill_marked(marker: str) -> None:
    for pid, _ in marked_processes(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class RunnerRun:
    error: str | None = None  # the runner could not run at all
    returncode: int | None = None
    reports: dict[str, dict] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    garbage: list[str] = field(default_factory=list)
    stderr_tail: str = ""
    leaked: list[tuple[int, str]] = field(default_factory=list)


def run_runner(parent: str, worker: str, scenarios_path: Path,
               options: tuple[str, ...] = ()) -> RunnerRun:
    """Runs ``parent``'s runner against ``worker``'s conformance worker, bounded in time, and
    collects its report lines and any process it leaves behind. ``options`` go before the
    worker command (``--transport tls``: test_remote.py)."""
    for lang in (parent, worker):
        error = build(lang)
        if error is not None:
            return RunnerRun(error=f"{lang}: {error}")
    parent_argv = expand(BY_NAME[parent]["parent"])
    worker_argv = expand(BY_NAME[worker]["worker"])
    for role, argv in (("parent runner", parent_argv), ("worker", worker_argv)):
        program = Path(argv[0])
        if program.is_absolute() and not program.exists():
            return RunnerRun(error=f"the {role} {program} does not exist")
        for arg in argv[1:]:
            if arg.startswith(str(REPO)) and not Path(arg).exists():
                return RunnerRun(error=f"the {role} file {arg} does not exist")
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER_ENV: marker}
    run = RunnerRun()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen([*parent_argv, "--scenarios", str(scenarios_path),
                                     *options, "--", *worker_argv], cwd=REPO, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
        except OSError as e:
            return RunnerRun(error=f"cannot start the {parent} parent runner: {e}")
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
    deadline = time.monotonic() + LEAK_WAIT_S
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)  # bounded wait for asynchronous parent-death signals, not a sync point
    run.leaked = marked_processes(marker)
    kill_marked(marker)
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


_runs: dict[tuple[str, str], RunnerRun] = {}
_runs_lock = threading.Lock()
# Runner invocations at once: each spends about half its time waiting (pools starting,
# deadlines, graces), so three overlap well on two cores, as test_remote.py's do.
CONCURRENT_RUNS = 3
# The pairs whose tests this session selected (conftest.py): the first pair_run starts them all.
SELECTED_PAIRS: set[tuple[str, str]] = set()


def pair_run(parent: str, worker: str) -> RunnerRun:
    """The pair's run. The first call starts every selected pair's run, at most CONCURRENT_RUNS
    at a time (independent processes, each marked for its own leak check)."""
    key = (parent, worker)
    with _runs_lock:
        if key not in _runs:
            due = [p for p in PAIRS if p in SELECTED_PAIRS and p not in _runs] or [key]
            if key not in due:
                due.append(key)
            for lang in sorted({lang for pair in due for lang in pair}):
                build(lang)  # builds first, one at a time: one cargo target dir
            with concurrent.futures.ThreadPoolExecutor(CONCURRENT_RUNS) as pool:
                futures = {pair: pool.submit(run_runner, *pair, SCENARIOS_PATH) for pair in due}
            _runs.update({pair: f.result() for pair, f in futures.items()})
    return _runs[key]


# A language may bring its worker before its parent runner ("Adding a language", step 4).
PARENTS = [lang["name"] for lang in LANGUAGES if "parent" in lang]
WORKERS = [lang["name"] for lang in LANGUAGES if "worker" in lang]
PAIRS = [(p, w) for p in PARENTS for w in WORKERS]


def pair_id(parent: str, worker: str) -> str:
    return f"{parent}_parent-{worker}_worker"


# ---------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("parent,worker,scenario",
                         [(p, w, s) for p, w in PAIRS for s in NAMES],
                         ids=[f"{pair_id(p, w)}-{s}" for p, w in PAIRS for s in NAMES])
def test_scenario(parent: str, worker: str, scenario: str) -> None:
    run = pair_run(parent, worker)
    pair = f"{parent} parent x {worker} worker"
    if run.error is not None and scenario not in run.reports:
        pytest.fail(f"{pair}: {run.error}\nrunner stderr tail:\n{run.stderr_tail}")
    report = run.reports.get(scenario)
    if report is None:
        pytest.fail(f"{pair}: the runner reported nothing for {scenario!r} (exit status "
                    f"{run.returncode})\nrunner stderr tail:\n{run.stderr_tail}")
    if report.get("ok") is not True:
        pytest.fail(f"{pair}, scenario {scenario}: {report.get('detail')} "
                    f"(after {report.get('elapsed', 0):.2f}s)", pytrace=False)


@pytest.mark.parametrize("parent,worker", PAIRS, ids=[pair_id(p, w) for p, w in PAIRS])
def test_runner_reports_every_scenario_exactly_once(parent: str, worker: str) -> None:
    run = pair_run(parent, worker)
    assert run.error is None, run.error
    assert run.returncode == 0, f"runner exit status {run.returncode}:\n{run.stderr_tail}"
    assert not run.garbage, f"lines that are not reports: {run.garbage[:5]}"
    assert not run.duplicates, f"scenarios reported twice: {run.duplicates}"
    assert sorted(run.reports) == sorted(NAMES), (
        f"missing {sorted(set(NAMES) - set(run.reports))}, "
        f"unknown {sorted(set(run.reports) - set(NAMES))}")
    for report in run.reports.values():
        assert isinstance(report.get("ok"), bool) and isinstance(report.get("detail"), str)
        assert isinstance(report.get("elapsed"), (int, float)) and report["elapsed"] >= 0


@pytest.mark.parametrize("parent,worker", PAIRS, ids=[pair_id(p, w) for p, w in PAIRS])
def test_no_leaked_processes(parent: str, worker: str) -> None:
    run = pair_run(parent, worker)
    assert run.error is None, run.error
    assert not run.leaked, (f"{parent} parent x {worker} worker left processes running "
                            f"{LEAK_WAIT_S}s after the runner exited: {run.leaked}")


@pytest.mark.parametrize("parent,worker", PAIRS, ids=[pair_id(p, w) for p, w in PAIRS])
def test_workers_die_with_their_parent(parent: str, worker: str, tmp_path: Path) -> None:
    """SIGKILL the parent runner while its worker serves a 60 s call: the worker must not
    outlive it (parent-death signal, or end-of-file on its socket)."""
    for lang in (parent, worker):
        assert build(lang) is None, build(lang)
    busy = {"name": "parent_dies", "kind": "call", "method": "sleep", "codec": "json",
            "request": {"value": 60000}, "timeout_s": 120.0, "expect": {"result": "echo"}}
    path = tmp_path / "parent_dies.json"
    path.write_text(json.dumps({**SCENARIOS, "scenarios": [busy]}), encoding="utf-8")
    marker = uuid.uuid4().hex
    proc = subprocess.Popen([*expand(BY_NAME[parent]["parent"]), "--scenarios", str(path), "--",
                             *expand(BY_NAME[worker]["worker"])], cwd=REPO,
                            env={**os.environ, MARKER_ENV: marker}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        workers: list[tuple[int, str]] = []
        while not workers and time.monotonic() < deadline and proc.poll() is None:
            workers = [p for p in marked_processes(marker) if p[0] != proc.pid]
            time.sleep(0.02)  # polling for the spawn, bounded by the deadline
        assert workers, "the runner never started a worker"
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + LEAK_WAIT_S
        while marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = marked_processes(marker)
        assert not left, f"workers outlived their killed parent by {LEAK_WAIT_S}s: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        kill_marked(marker)


# ---------------------------------------------------------------------------------------------
# The scenario list itself, and the runners' ability to notice a wrong outcome
# ---------------------------------------------------------------------------------------------


def test_scenario_list_is_consistent() -> None:
    assert len(NAMES) == len(set(NAMES)), "scenario names must be unique"
    kinds = {"call", "stream", "cancel_stream", "cancel_call", "slow_consumer", "concurrent",
             "startup", "shutdown_in_flight", "parallel_calls", "lease"}
    codes = SCENARIOS["error_codes"]
    for sc in SCENARIOS["scenarios"]:
        assert sc["kind"] in kinds, sc["name"]
        err = sc.get("expect", {}).get("error")
        if err is not None and isinstance(err["code"], str):
            assert err["code"] in codes, sc["name"]
        rows = sc.get("expect", {}).get("rows", {})
        if "checksum" in rows and "count" in rows:
            n = rows["count"]
            assert rows["checksum"] == n * (n - 1) // 2, f"{sc['name']}: checksum of 0..{n}"
        if sc["kind"] == "slow_consumer":
            pool = {**SCENARIOS["defaults"]["pool"], **sc.get("pool", {})}
            bound = (pool["window"] + 4 * pool["max_frame_size"]) // (sc["size"] + 4) + 2
            assert sc["max_ahead_rows"] == bound, "max_ahead_rows follows its formula"
            # Without flow control the producer would run far past the bound.
            assert sc["n"] > 10 * bound
        if "clamp_notices" in sc.get("expect", {}):  # the conformance workers offer 64
            pool = {**SCENARIOS["defaults"]["pool"], **sc.get("pool", {})}
            assert pool["max_in_flight"] > 64, f"{sc['name']}: no clamp at {pool['max_in_flight']}"
        if sc["kind"] == "lease":  # the matrix asserts one exact code per call
            assert len(sc["crash_codes"]) == 1, sc["name"]
            assert sc["crash_codes"][0] in codes, sc["name"]
    # The frame-size scenarios are about the default 1 MiB frame.
    mfs = SCENARIOS["defaults"]["pool"]["max_frame_size"]
    by_name = {sc["name"]: sc for sc in SCENARIOS["scenarios"]}
    assert by_name["echo_raw_1_mb_one_frame"]["request"]["bytes"]["size"] + 12 <= mfs
    assert by_name["echo_raw_larger_than_one_frame"]["request"]["bytes"]["size"] > 2 * mfs


def mutants() -> list[dict]:
    """Scenarios whose expectation is wrong on purpose: a runner must report each as failed."""
    base = {sc["name"]: sc for sc in SCENARIOS["scenarios"]}
    out = []

    def mutant(of: str, what: str, change) -> None:
        sc = copy.deepcopy(base[of])
        sc["name"] = f"mutant_{of}_{what}"
        change(sc)
        out.append(sc)

    def expect(**kv):
        return lambda sc: sc["expect"].update(kv)

    def rows(**kv):
        return lambda sc: sc["expect"]["rows"].update(kv)

    def error(**kv):
        return lambda sc: sc["expect"]["error"].update(kv)

    mutant("echo_raw_4_kib", "other_bytes", expect(result={"bytes": {"size": 4095}}))
    mutant("echo_json_value", "other_value", expect(result={"value": {"f": 2.5}}))
    mutant("add_typed_json", "other_sum", expect(result={"value": {"sum": 0}}))
    mutant("stream_with_summary_cbor", "checksum", rows(checksum=46))
    mutant("stream_with_summary_cbor", "summary", expect(summary={"value": {"rows": 11}}))
    mutant("stream_with_summary_cbor", "row_shape", rows(shape="int_index"))
    mutant("stream_raw_rows_without_summary", "count", rows(count=999))
    mutant("stream_empty_with_summary", "no_summary", expect(summary="none"))
    mutant("handler_error", "code", error(code="HANDLER_PANIC"))
    mutant("error_with_details", "details", error(details={"request": {"x": 2}}))
    mutant("error_with_details", "message", error(message_contains="no such text"))
    mutant("crash_unary", "signal", error(signal=9))
    mutant("crash_unary", "stderr", error(stderr_contains="not in the tail"))
    mutant("crash_unary", "not_restarted", lambda sc: sc.update(restarted=False))
    mutant("echo_raw_empty", "restarted", lambda sc: sc.update(restarted=True))
    mutant("worker_hung", "exited", error(code="WORKER_EXITED"))
    mutant("shutdown_cancels_past_grace", "finished", lambda sc: sc.update(
        expect={"result": {"value": 60000}}))
    mutant("error_message_longer_than_str16", "uncut", error(message_contains="\u00e9" * 40000))
    mutant("deadline", "too_slow", expect(max_elapsed_s=0.1))
    mutant("deadline", "result", lambda sc: sc.update(expect={"result": "echo"}))
    mutant("crash_mid_stream", "no_rows", rows(max=0))
    mutant("codec_mismatch_at_startup", "started", lambda sc: sc.update(expect={"started": True}))
    mutant("startup_raw_stream_required", "refused",
           lambda sc: sc.update(expect={"error": {"code": "CODEC_MISMATCH"}}))
    mutant("slow_consumer", "tight_bound", lambda sc: sc.update(max_ahead_rows=10))
    mutant("cancel_mid_stream", "finite", lambda sc: sc.update(
        method="decls", request={"value": {"n": 10}}, read_rows=100,
        expect={"rows": {"shape": "decl"}}))
    mutant("lease_then_lease_lost", "crash_lease_lost",
           lambda sc: sc.update(crash_codes=["LEASE_LOST"]))
    mutant("max_in_flight_clamped_once", "per_worker", expect(clamp_notices=2))
    mutant("echo_raw_4_kib", "clamped", expect(clamp_notices=1))
    mutant("cancel_call", "never_in_flight", lambda sc: sc.update(
        method="no_such_method", settle_s=1.0))
    return out


@pytest.mark.parametrize("parent", PARENTS)
def test_runner_detects_wrong_expectations(parent: str, tmp_path: Path) -> None:
    """Every check the matrix relies on can fail: each mutant must be reported as failed."""
    bad = mutants()
    doc = {**SCENARIOS, "scenarios": bad}
    path = tmp_path / "mutants.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    worker = "rust" if "rust" in WORKERS else WORKERS[0]
    run = run_runner(parent, worker, path)
    assert run.error is None, f"{run.error}\n{run.stderr_tail}"
    missing = [sc["name"] for sc in bad if sc["name"] not in run.reports]
    assert not missing, f"no report for {missing}\n{run.stderr_tail}"
    passed = [name for name, r in run.reports.items() if r["ok"]]
    assert not passed, f"the {parent} runner accepted wrong expectations: {passed}"
    assert not run.leaked, f"leaked processes: {run.leaked}"
