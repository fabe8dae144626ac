"""The opt-in retry policy (PROTOCOL.md 21.7, wirepool.RetryPolicy): only methods marked
idempotent, only after WORKER_EXITED or WORKER_HUNG, as a new request to another worker, at
most ``attempts`` tries within the original deadline, a stream only before its first row; the
caller sees the last try's outcome with ``details["attempts"]``.

The worker (workers/flaky.py) dies on a request's first try and serves the next: a marker file
named in the request says whether the first try happened, and a log file counts the tries.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import wirepool

WORKER = [sys.executable, str(Path(__file__).resolve().parent / "workers" / "flaky.py")]


def _pool(retry: wirepool.RetryPolicy | None, workers: int = 1, **kw: Any) -> wirepool.Pool:
    return wirepool.Pool(WORKER, workers=workers, retry=retry, restart_backoff=0.01,
                         worker_output="discard", **kw)


def _req(tmp: Path, **extra: Any) -> dict:
    return {"marker": str(tmp / "marker"), "log": str(tmp / "log"), **extra}


def _tries(tmp: Path) -> list[int]:
    """The pid of each try the workers saw, in order."""
    path = tmp / "log"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_the_policy_checks_its_arguments() -> None:
    assert wirepool.RetryPolicy().methods == frozenset()
    assert wirepool.RetryPolicy(methods={"a"}, attempts=2).methods == frozenset({"a"})
    with pytest.raises(ValueError):
        wirepool.RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        wirepool.RetryPolicy(attempts=101)
    with pytest.raises(TypeError):
        wirepool.RetryPolicy(methods="add")
    with pytest.raises(TypeError):
        wirepool.AsyncPool(WORKER, retry=3)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_an_idempotent_call_whose_worker_died_is_sent_again(tmp_path: Path) -> None:
    with _pool(wirepool.RetryPolicy(methods={"dies_first"}, attempts=2)) as pool:
        result = pool.call("dies_first", _req(tmp_path))
        first, second = _tries(tmp_path)
        assert result == {"pid": second} and first != second  # the replacement served it
        assert pool.metrics()["retries"] == 1


@pytest.mark.timeout(60)
def test_prometheus_counts_the_retries(tmp_path: Path) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from wirepool.prometheus import PoolCollector
    registry = prometheus_client.CollectorRegistry()
    with _pool(wirepool.RetryPolicy(methods={"dies_first"}, attempts=2)) as pool:
        registry.register(PoolCollector(pool))
        pool.call("dies_first", _req(tmp_path))
        samples = {s.name: s.value for family in registry.collect() for s in family.samples}
        assert samples["wirepool_retries_total"] == 1


@pytest.mark.timeout(60)
def test_async_pool_and_submit_retry_too(tmp_path: Path) -> None:
    async def main() -> None:
        policy = wirepool.RetryPolicy(methods={"dies_first"}, attempts=2)
        async with wirepool.AsyncPool(WORKER, workers=1, retry=policy, restart_backoff=0.01,
                                      worker_output="discard") as pool:
            result = await pool.call("dies_first", _req(tmp_path / "a"))
            assert result == {"pid": _tries(tmp_path / "a")[1]}
            assert pool.metrics()["retries"] == 1
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    asyncio.run(asyncio.wait_for(main(), 50))
    with _pool(wirepool.RetryPolicy(methods={"dies_first"}, attempts=2)) as pool:
        assert pool.submit("dies_first", _req(tmp_path / "b")).result(30) == {
            "pid": _tries(tmp_path / "b")[1]}


@pytest.mark.timeout(60)
def test_a_method_not_marked_idempotent_is_not_sent_again(tmp_path: Path) -> None:
    for policy in (None, wirepool.RetryPolicy(methods={"other"}, attempts=3)):
        d = tmp_path / str(policy is None)
        d.mkdir()
        with _pool(policy) as pool:
            with pytest.raises(wirepool.WorkerExited) as info:
                pool.call("dies_first", _req(d))
            assert info.value.details is None  # no retry policy touched it
            assert len(_tries(d)) == 1
            assert "retries" not in pool.metrics()


@pytest.mark.timeout(60)
def test_idempotent_on_a_call_overrides_the_methods_named(tmp_path: Path) -> None:
    for d in ("on", "off"):
        (tmp_path / d).mkdir()
    with _pool(wirepool.RetryPolicy(methods={"dies_first"}, attempts=2)) as pool:
        with pytest.raises(wirepool.WorkerExited):
            pool.call("dies_first", _req(tmp_path / "off"), idempotent=False)
        assert len(_tries(tmp_path / "off")) == 1
        assert pool.call("dies_first", _req(tmp_path / "on", delay=0.0), idempotent=True)
    with _pool(wirepool.RetryPolicy(attempts=2)) as pool:  # no method named: per call only
        (tmp_path / "empty").mkdir()
        assert pool.call("dies_first", _req(tmp_path / "empty"), idempotent=True) == {
            "pid": _tries(tmp_path / "empty")[1]}
    with _pool(None) as pool:
        with pytest.raises(ValueError, match="retry policy"):
            pool.call("pid", None, idempotent=True)


@pytest.mark.timeout(60)
def test_when_the_attempts_run_out_the_last_worker_exited_says_how_many(tmp_path: Path) -> None:
    with _pool(wirepool.RetryPolicy(methods={"always_dies"}, attempts=3)) as pool:
        with pytest.raises(wirepool.WorkerExited) as info:
            pool.call("always_dies", _req(tmp_path))
        assert info.value.details == {"attempts": 3}
        assert info.value.exit_status == 3
        assert len(set(_tries(tmp_path))) == 3  # three workers, one try each
        assert pool.metrics()["retries"] == 2


@pytest.mark.timeout(60)
def test_a_handler_error_is_the_answer_not_retried(tmp_path: Path) -> None:
    with _pool(wirepool.RetryPolicy(methods={"fails"}, attempts=3)) as pool:
        with pytest.raises(wirepool.HandlerError) as info:
            pool.call("fails", _req(tmp_path))
        assert isinstance(info.value.details, dict) and info.value.details["attempts"] == 1
        assert len(_tries(tmp_path)) == 1
        assert "retries" not in pool.metrics()


@pytest.mark.timeout(60)
def test_a_hung_worker_counts_as_dead_and_the_call_is_sent_again(tmp_path: Path) -> None:
    with _pool(wirepool.RetryPolicy(methods={"freezes_first"}, attempts=2),
               heartbeat_ms=100) as pool:
        assert pool.call("freezes_first", _req(tmp_path)) == {"pid": _tries(tmp_path)[1]}
        assert pool.metrics()["retries"] == 1
        assert pool.metrics()["restart_causes"] == {"hung": 1}


@pytest.mark.timeout(60)
def test_a_deadline_is_not_retried_and_a_retry_keeps_the_original_deadline(tmp_path: Path) -> None:
    policy = wirepool.RetryPolicy(methods={"waits_until_cancelled", "dies_first_then_waits"},
                                  attempts=3)
    with _pool(policy, workers=2, deadline_grace=0.2) as pool:
        (tmp_path / "a").mkdir()
        with pytest.raises(wirepool.DeadlineExceeded) as info:
            pool.call("waits_until_cancelled", _req(tmp_path / "a"), timeout=0.3)
        assert info.value.details["attempts"] == 1
        assert len(_tries(tmp_path / "a")) == 1
        # The first try dies after 1.5 s of a 2.5 s budget: the second gets the 1 s left.
        # With a fresh budget it would end after 1.5 + 2.5 = 4 s.
        (tmp_path / "b").mkdir()
        started = time.monotonic()
        try:
            outcome: Any = pool.call("dies_first_then_waits", _req(tmp_path / "b", delay=1.5),
                                     timeout=2.5)
        except wirepool.DeadlineExceeded as e:
            assert e.details["attempts"] == 2
            outcome = e
        took = time.monotonic() - started
        assert len(_tries(tmp_path / "b")) == 2
        assert took < 3.4, (took, outcome)
        if isinstance(outcome, dict):  # the worker answered at its own deadline
            assert outcome["waited"] < 1.2, outcome
        assert pool.metrics()["retries"] == 1


@pytest.mark.timeout(60)
def test_a_stream_that_died_before_its_first_row_is_sent_again(tmp_path: Path) -> None:
    policy = wirepool.RetryPolicy(methods={"rows_die_first", "row_then_dies"}, attempts=3)
    with _pool(policy) as pool:
        with pool.stream("rows_die_first", _req(tmp_path, n=5)) as rows:
            got = list(rows)
        second = _tries(tmp_path)[1]
        assert got == [{"i": i, "pid": second} for i in range(5)]
        assert pool.metrics()["retries"] == 1


@pytest.mark.timeout(60)
def test_a_stream_whose_row_reached_the_caller_is_not_sent_again(tmp_path: Path) -> None:
    policy = wirepool.RetryPolicy(methods={"row_then_dies"}, attempts=3)
    with _pool(policy) as pool:
        go = tmp_path / "go"
        with pytest.raises(wirepool.WorkerExited) as info:
            with pool.stream("row_then_dies", _req(tmp_path, go=str(go))) as rows:
                for row in rows:
                    assert row["i"] == 0
                    go.touch()  # the row reached us: now the worker dies
        assert info.value.details == {"attempts": 1}
        assert len(_tries(tmp_path)) == 1
        assert "retries" not in pool.metrics()


@pytest.mark.timeout(60)
def test_async_stream_before_its_first_row_is_sent_again(tmp_path: Path) -> None:
    async def main() -> None:
        policy = wirepool.RetryPolicy(methods={"rows_die_first"}, attempts=2)
        async with wirepool.AsyncPool(WORKER, workers=2, retry=policy, restart_backoff=0.01,
                                      worker_output="discard") as pool:
            rows = [r async for r in pool.stream("rows_die_first", _req(tmp_path, n=3))]
            assert [r["i"] for r in rows] == [0, 1, 2]
            assert pool.metrics()["retries"] == 1
    asyncio.run(asyncio.wait_for(main(), 50))


@pytest.mark.timeout(60)
def test_the_retry_goes_to_another_worker(tmp_path: Path) -> None:
    with _pool(wirepool.RetryPolicy(methods={"dies_first"}, attempts=2), workers=2) as pool:
        before = set(pool.pids)
        assert len(before) == 2
        result = pool.call("dies_first", _req(tmp_path, delay=0.0))
        dead, served = _tries(tmp_path)
        assert dead in before and result == {"pid": served} and served != dead


@pytest.mark.timeout(90)
def test_a_remote_call_whose_connection_was_cut_is_sent_again(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from test_remote_pool import ProxiedChildren

    async def main() -> None:
        launcher = ProxiedChildren()
        policy = wirepool.RetryPolicy(methods={"hangs_first"}, attempts=2)
        async with wirepool.AsyncPool(WORKER, workers=2, launcher=launcher, retry=policy,
                                      heartbeat_ms=200, restart_backoff=0.01,
                                      worker_output="discard", drain_grace=2.0) as pool:
            assert launcher.proxy is not None
            call = asyncio.ensure_future(pool.call(
                "hangs_first", _req(tmp_path, release=str(tmp_path / "release"))))
            while len(_tries(tmp_path)) < 1:
                await asyncio.sleep(0.01)
            old = set(launcher.children)
            launcher.proxy.cut()
            (tmp_path / "release").touch()  # the first try's worker may now go on, too late
            result = await call
            first, second = _tries(tmp_path)
            assert result == {"pid": second} and first in old and second != first
            assert pool.metrics()["retries"] == 1
    asyncio.run(asyncio.wait_for(main(), 80))
