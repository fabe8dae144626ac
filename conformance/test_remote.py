"""The conformance matrix once more over TCP + TLS 1.3 (PROTOCOL.md 21): every remote-capable
parent runner, with ``--transport tls``, against every conformance worker, for the scenarios that
make sense remotely.

With ``--transport tls`` a parent runner starts each pool's workers as its children without
``WIREPOOL_FD`` and with a join ticket of their own in ``WIREPOOL_TICKET``: they connect back to
the pool's listener, pin its certificate, present the secret, and from their HELLO on speak the
protocol of the local matrix. The scenario list is ``scenarios.json``, with these differences
(written to a derived file the runners read):

- ``REMOTE_SKIPPED``: scenarios about what only a local worker has, each with its reason;
- ``REMOTE_CHANGED``: a remote worker's death is a lost connection (21.6): ``WORKER_EXITED``
  with no exit status and no signal (``null`` in the expectation) and no stderr tail (a remote
  worker's output is not the pool's). A runner that ignored ``--transport tls`` and ran local
  workers would report their real signal or status and fail these; a runner also checks that a
  remote ``WORKER_EXITED`` says ``"connection": "lost"`` in its details.

Parents: every parent runner of ``languages.json`` runs here unless it is named in
``NOT_REMOTE`` (no listener in scope) or ``REMOTE_PENDING`` (the issue that owes its
``--transport tls``); a parent in neither that lacks the option fails, it is never skipped.
Besides the scenarios: each pair reports every scenario once and leaves no process behind, and a
remote worker exits when its parent runner is SIGKILLed (end of file on its TCP connection: no
parent-death signal reaches another machine, and the launcher puts each worker in a session of
its own here).

Time: the pairs' runs go three at a time (``CONCURRENT_RUNS``); the Python and Rust parents'
six pairs, 453 tests, took 7.5-8.5 min at load 15-17 on the 2-vCPU machine (one after the other:
~15 min; a pool per scenario, as locally).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import copy
import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

import test_matrix as matrix

TRANSPORT = ("--transport", "tls")

# Parents without a listener in issue 14's scope: they are not run here, and the check below
# names them.
NOT_REMOTE: dict[str, str] = {}
# Parents whose runner does not take --transport tls yet, each with the issue that owes it.
REMOTE_PENDING: dict[str, str] = {}

REMOTE_SKIPPED: dict[str, str] = {
    "stdout_flood": "a remote worker's stdout is not the pool's: the pool reads no pipe of a "
                    "remote worker (its output goes wherever its launcher sends it)",
    "stderr_flood": "a remote worker's stderr is not the pool's: the pool reads no pipe of a "
                    "remote worker (its output goes wherever its launcher sends it)",
}
REMOTE_CHANGED: dict[str, str] = {
    "crash_unary": "the worker's death is a lost connection: no signal, no stderr tail (21.6)",
    "worker_exits_mid_request": "the worker's death is a lost connection: no exit status (21.6)",
    "crash_mid_stream": "the worker's death is a lost connection: no signal, no stderr tail "
                        "(21.6)",
}
# What a remote death cannot tell the parent.
LOCAL_ONLY_EXPECTATIONS = ("signal", "exit_status", "stderr_contains")


def remote_scenario(sc: dict) -> dict:
    """The scenario as it runs remotely: a death's signal and exit status are unknown (null)
    and there is no stderr tail."""
    sc = copy.deepcopy(sc)
    err = sc.get("expect", {}).get("error")
    if err is not None and any(k in err for k in LOCAL_ONLY_EXPECTATIONS):
        err.pop("stderr_contains", None)
        err["signal"] = None
        err["exit_status"] = None
    return sc


def remote_doc() -> dict:
    return {**matrix.SCENARIOS,
            "scenarios": [remote_scenario(sc) for sc in matrix.SCENARIOS["scenarios"]
                          if sc["name"] not in REMOTE_SKIPPED]}


NAMES = [sc["name"] for sc in remote_doc()["scenarios"]]
ALL_PARENTS = [lang["name"] for lang in matrix.LANGUAGES if "parent" in lang]
PARENTS = [p for p in ALL_PARENTS if p not in NOT_REMOTE and p not in REMOTE_PENDING]
# A worker-only SDK that has no remote join yet (21) says so in its row: "remote": false and
# "remote_reason"; it then sits out this suite with a notice instead of failing it.
NOT_REMOTE_WORKERS: dict[str, str] = {
    lang["name"]: lang.get("remote_reason", "no reason given")
    for lang in matrix.LANGUAGES if "worker" in lang and lang.get("remote") is False}
REMOTE_WORKERS = [w for w in matrix.WORKERS if w not in NOT_REMOTE_WORKERS]
PAIRS = [(p, w) for p in PARENTS for w in REMOTE_WORKERS]


def pair_id(parent: str, worker: str) -> str:
    return f"{parent}_parent-{worker}_worker-tls"


_scenarios_path: Path | None = None


def scenarios_path(tmp_factory: pytest.TempPathFactory) -> Path:
    global _scenarios_path
    if _scenarios_path is None:
        _scenarios_path = tmp_factory.mktemp("remote") / "scenarios.json"
        _scenarios_path.write_text(json.dumps(remote_doc()), encoding="utf-8")
    return _scenarios_path


_runs: dict[tuple[str, str], matrix.RunnerRun] = {}
_lock = threading.Lock()
# Runner invocations at once: each spends most of its time starting pools and waiting on
# deadlines and graces, so three overlap well on two cores (as the hostile suite runs its
# parents at once).
CONCURRENT_RUNS = 3


def pair_run(parent: str, worker: str, tmp_factory: pytest.TempPathFactory) -> matrix.RunnerRun:
    """Every pair's run, started together on first use (independent processes), at most
    CONCURRENT_RUNS at a time."""
    with _lock:
        if not _runs:
            for lang in {*PARENTS, *REMOTE_WORKERS}:  # builds first: one cargo target dir
                matrix.build(lang)
            path = scenarios_path(tmp_factory)
            with concurrent.futures.ThreadPoolExecutor(CONCURRENT_RUNS) as pool:
                futures = {pair: pool.submit(matrix.run_runner, *pair, path, TRANSPORT)
                           for pair in PAIRS}
            _runs.update({pair: f.result() for pair, f in futures.items()})
    return _runs[(parent, worker)]


@pytest.mark.parametrize("parent,worker,scenario",
                         [(p, w, s) for p, w in PAIRS for s in NAMES],
                         ids=[f"{pair_id(p, w)}-{s}" for p, w in PAIRS for s in NAMES])
def test_scenario(parent: str, worker: str, scenario: str,
                  tmp_path_factory: pytest.TempPathFactory) -> None:
    run = pair_run(parent, worker, tmp_path_factory)
    pair = f"{parent} parent x {worker} worker over TLS"
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
def test_runner_reports_every_scenario_exactly_once(
        parent: str, worker: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = pair_run(parent, worker, tmp_path_factory)
    assert run.error is None, run.error
    assert run.returncode == 0, f"runner exit status {run.returncode}:\n{run.stderr_tail}"
    assert not run.garbage, f"lines that are not reports: {run.garbage[:5]}"
    assert not run.duplicates, f"scenarios reported twice: {run.duplicates}"
    assert sorted(run.reports) == sorted(NAMES), (
        f"missing {sorted(set(NAMES) - set(run.reports))}, "
        f"unknown {sorted(set(run.reports) - set(NAMES))}")


@pytest.mark.parametrize("parent,worker", PAIRS, ids=[pair_id(p, w) for p, w in PAIRS])
def test_no_leaked_processes(parent: str, worker: str,
                             tmp_path_factory: pytest.TempPathFactory) -> None:
    run = pair_run(parent, worker, tmp_path_factory)
    assert run.error is None, run.error
    assert not run.leaked, (f"{parent} parent x {worker} worker over TLS left processes running "
                            f"{matrix.LEAK_WAIT_S}s after the runner exited: {run.leaked}")


@pytest.mark.parametrize("parent,worker", PAIRS, ids=[pair_id(p, w) for p, w in PAIRS])
def test_remote_workers_exit_when_their_parent_is_killed(parent: str, worker: str,
                                                         tmp_path: Path) -> None:
    """SIGKILL the parent runner once its remote worker has connected (it is about to serve a
    60 s call): the worker, in a session of its own and with no parent-death signal, must leave
    by end of file on its TCP connection (21.6) within LEAK_WAIT_S, wherever in its join the kill
    lands (a Python worker once waited for its 15 s welcome timeout: test_remote_join_race.py)."""
    for lang in (parent, worker):
        assert matrix.build(lang) is None, matrix.build(lang)
    busy = {"name": "parent_dies", "kind": "call", "method": "sleep", "codec": "json",
            "request": {"value": 60000}, "timeout_s": 120.0, "expect": {"result": "echo"}}
    path = tmp_path / "parent_dies.json"
    path.write_text(json.dumps({**matrix.SCENARIOS, "scenarios": [busy]}), encoding="utf-8")
    marker = uuid.uuid4().hex
    proc = subprocess.Popen([*matrix.expand(matrix.BY_NAME[parent]["parent"]), "--scenarios",
                             str(path), *TRANSPORT, "--",
                             *matrix.expand(matrix.BY_NAME[worker]["worker"])], cwd=matrix.REPO,
                            env={**os.environ, matrix.MARKER_ENV: marker},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        workers: list[tuple[int, str]] = []
        while not workers and time.monotonic() < deadline and proc.poll() is None:
            workers = [p for p in matrix.marked_processes(marker) if p[0] != proc.pid]
            time.sleep(0.02)  # polling for the spawn, bounded by the deadline
        assert workers, "the runner never started a worker"
        # Wait for the join (the worker's TCP connection to the runner) before the kill: a
        # worker killed before it connects would prove nothing.
        pid = workers[0][0]
        while not _connected(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _connected(pid), f"worker {pid} never connected to its parent"
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + matrix.LEAK_WAIT_S
        while matrix.marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = matrix.marked_processes(marker)
        assert not left, (f"remote workers outlived their killed parent by "
                          f"{matrix.LEAK_WAIT_S}s: {left}; the one that had connected, {pid}: "
                          f"{_describe(pid)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        matrix.kill_marked(marker)


TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK",
              "0B": "CLOSING"}


def _tcp_states(pid: int) -> list[str]:
    """The states of the process's TCP connections (IPv4 and IPv6)."""
    states = []
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[9] in inodes:
                        states.append(TCP_STATES.get(fields[3], fields[3]))
    except OSError:
        pass
    return states


def _connected(pid: int) -> bool:
    """True when the process holds an established TCP connection."""
    return "ESTABLISHED" in _tcp_states(pid)


def _describe(pid: int) -> str:
    """A leftover process's state and its TCP connections, for the failure message."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
    except OSError:
        return "gone"
    return f"state {state}, waiting in {wchan or '?'}, TCP {_tcp_states(pid)}"


@pytest.mark.parametrize("parent", PARENTS)
def test_runner_detects_wrong_remote_expectations(parent: str, tmp_path: Path) -> None:
    """The local expectations of a death (a signal, an exit status, a stderr tail) must fail
    over TLS: the runner really ran remote workers and still checks what it reports."""
    base = {sc["name"]: sc for sc in matrix.SCENARIOS["scenarios"]}
    bad = []
    for name in REMOTE_CHANGED:
        sc = copy.deepcopy(base[name])
        sc["name"] = f"mutant_{name}_local_expectation"
        bad.append(sc)
    for sc in matrix.mutants():  # the local matrix's mutants that apply remotely
        of = next(n for n in base if sc["name"].startswith(f"mutant_{n}_"))
        if of not in REMOTE_SKIPPED and of not in REMOTE_CHANGED:
            bad.append(sc)
    path = tmp_path / "mutants.json"
    path.write_text(json.dumps({**matrix.SCENARIOS, "scenarios": bad}), encoding="utf-8")
    worker = "rust" if "rust" in matrix.WORKERS else matrix.WORKERS[0]
    run = matrix.run_runner(parent, worker, path, TRANSPORT)
    assert run.error is None, f"{run.error}\n{run.stderr_tail}"
    missing = [sc["name"] for sc in bad if sc["name"] not in run.reports]
    assert not missing, f"no report for {missing}\n{run.stderr_tail}"
    passed = [name for name, r in run.reports.items() if r["ok"]]
    assert not passed, f"the {parent} runner accepted wrong expectations over TLS: {passed}"
    assert not run.leaked, f"leaked processes: {run.leaked}"


def test_remote_lists_are_consistent() -> None:
    names = {sc["name"] for sc in matrix.SCENARIOS["scenarios"]}
    for table in (REMOTE_SKIPPED, REMOTE_CHANGED):
        unknown = sorted(set(table) - names)
        assert not unknown, f"no such scenarios: {unknown}"
    assert not set(REMOTE_SKIPPED) & set(REMOTE_CHANGED)
    # Exactly the scenarios whose expectation a remote run changes are listed, with a reason.
    changed = {sc["name"] for sc in matrix.SCENARIOS["scenarios"]
               if sc["name"] not in REMOTE_SKIPPED and remote_scenario(sc) != sc}
    assert changed == set(REMOTE_CHANGED), (
        f"unlisted: {sorted(changed - set(REMOTE_CHANGED))}, "
        f"listed but unchanged: {sorted(set(REMOTE_CHANGED) - changed)}")
    parents = set(ALL_PARENTS)
    stale = sorted((set(NOT_REMOTE) | set(REMOTE_PENDING)) - parents)
    assert not stale, f"NOT_REMOTE / REMOTE_PENDING name parents that do not exist: {stale}"
    assert not set(NOT_REMOTE) & set(REMOTE_PENDING)
    assert PARENTS, "no parent runs the matrix over TLS"
    for name, why in {**NOT_REMOTE, **REMOTE_PENDING}.items():
        print(f"NOTICE: the {name} parent does not run the matrix over TLS ({why})")
    for name, why in NOT_REMOTE_WORKERS.items():
        print(f"NOTICE: the {name} worker does not join over TLS ({why})")


# A refused join, as each worker reports it (21.3): exit status 1 and one line for people, never
# a language's debug dump of an error value (issue 24 found `Error: Custom { kind: ... }`).
REFUSALS = ["wrong_secret", "expired", "not_a_ticket"]
DEBUG_DUMPS = ("Custom {", "kind:", "Traceback (most recent call last)", "    at ")


async def _run_with_ticket(worker: str, ticket: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("WIREPOOL_FD", "WIREPOOL_TICKET", "WIREPOOL_TICKET_FILE")}
    env["WIREPOOL_TICKET"] = ticket
    proc = await asyncio.create_subprocess_exec(
        *matrix.expand(matrix.BY_NAME[worker]["worker"]), env=env, cwd=matrix.REPO,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, err.decode(errors="replace")


@pytest.mark.parametrize("worker,how", [(w, h) for w in REMOTE_WORKERS for h in REFUSALS],
                         ids=[f"{w}_worker-{h}" for w in REMOTE_WORKERS for h in REFUSALS])
def test_a_refused_join_exits_1_saying_why(worker: str, how: str) -> None:
    pytest.importorskip("cryptography")
    from wirepool import remote

    assert matrix.build(worker) is None, matrix.build(worker)

    async def main() -> tuple[int, str, dict]:
        async with remote.Listener() as listener:
            ticket = listener.issue()
            if how == "wrong_secret":
                text = dataclasses.replace(ticket, secret=os.urandom(32)).encode()
            elif how == "expired":
                text = dataclasses.replace(ticket, expires=int(time.time()) - 60).encode()
            else:
                text = "not a ticket"
            status, err = await _run_with_ticket(worker, text)
            return status, err, dict(listener.counters)

    status, err, counters = asyncio.run(asyncio.wait_for(main(), 60))
    assert status == 1, f"{worker} worker exited {status} on a refused join ({how}):\n{err}"
    assert err.strip(), f"{worker} worker said nothing about the refused join ({how})"
    assert not any(d in err for d in DEBUG_DUMPS), f"a debug dump, not a message:\n{err}"
    assert len(err) < 2000, err
    words = {"wrong_secret": "refused", "expired": "expired", "not_a_ticket": "ticket"}[how]
    assert words in err.lower(), err
    assert counters.get("joined", 0) == 0, counters
