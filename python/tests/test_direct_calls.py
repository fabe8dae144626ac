"""Pool.call on an idle worker reads its own answer (issue 17): the caller's thread writes the
request and reads the result, without a hop through the pool's loop. These tests prove the
path is taken and that every way out of it (slow handler, error, event, death, deadline,
recycle, concurrency with the loop's own users) still ends each call exactly once."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

import wirepool
from wirepool._pooled_worker import _CALLER, _PARKED

BASIC = os.path.join(os.path.dirname(__file__), "workers", "basic.py")


def pool(workers: int = 1, **kw) -> wirepool.Pool:
    return wirepool.Pool([sys.executable, BASIC], workers=workers, **kw)


def direct_counts(p: wirepool.Pool) -> tuple[int, int]:
    """(calls sent directly, calls also ended directly) over the pool's workers."""
    ws = list(p._apool._all)
    return sum(w.direct_calls for w in ws), sum(w.direct_completed for w in ws)


def wait_parked(p: wirepool.Pool) -> None:
    deadline = time.monotonic() + 10
    while not any(w.direct == _PARKED for w in p._apool.workers):
        assert time.monotonic() < deadline, "no worker was parked"
        p.call("add", {"a": 0, "b": 0})  # a call through the loop parks its worker after it


def test_sequential_calls_take_the_direct_path_and_count_in_metrics() -> None:
    with pool() as p:
        wait_parked(p)
        before_calls, before_done = direct_counts(p)
        m0 = p.metrics()
        for i in range(200):
            assert p.call("add_inline", {"a": i, "b": 1}) == {"sum": i + 1}
        calls, done = direct_counts(p)
        # Heartbeats take a parked worker back now and then: most calls, not all, go direct.
        assert calls - before_calls >= 150 and done - before_done >= 150, (calls, done)
        m1 = p.metrics()
        assert m1.get("calls", 0) - m0.get("calls", 0) == 200
        assert m1.get("completed", 0) - m0.get("completed", 0) == 200


def test_a_slow_handler_is_handed_back_to_the_loop_and_ends_once() -> None:
    with pool(heartbeat_ms=100) as p:
        wait_parked(p)
        calls, done = direct_counts(p)
        # 0.3 s: past the caller's own wait, so the loop finishes it (heartbeats run meanwhile).
        assert p.call("sleep", {"seconds": 0.3}) == {"slept": 0.3}
        calls2, done2 = direct_counts(p)
        assert calls2 == calls + 1 and done2 == done, "it should have been sent directly"
        assert p.call("add", {"a": 2, "b": 3}) == {"sum": 5}
        assert p.metrics()["workers"][0]["in_flight"] == 0


def test_errors_through_the_direct_path_keep_their_types() -> None:
    with pool() as p:
        wait_parked(p)
        with pytest.raises(wirepool.WorkerError) as e:
            p.call("fail", {"thing": "x"})
        assert e.value.code == 1042
        with pytest.raises(wirepool.UnknownMethod):
            p.call("no_such_method", {})
        with pytest.raises(wirepool.UnknownMethod):
            p.call("rows", {"n": 1})  # a stream method through call
        with pytest.raises(wirepool.BadRequest):
            p.call("add", {"a": object()})
        with pytest.raises(wirepool.HandlerError):
            p.call("boom", {})
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}


def test_deadline_of_a_direct_call_is_enforced() -> None:
    with pool() as p:
        wait_parked(p)
        started = time.monotonic()
        with pytest.raises(wirepool.DeadlineExceeded):
            p.call("sleep_stubborn", {"seconds": 5}, timeout=0.3)
        assert time.monotonic() - started < 4.0
        assert p.call("add", {"a": 1, "b": 1}, timeout=10) == {"sum": 2}


def test_a_worker_killed_during_a_direct_call_ends_it_worker_exited() -> None:
    with pool() as p:
        wait_parked(p)
        victim = p.pids[0]
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                p.call("sleep_stubborn", {"seconds": 30})
            except BaseException as e:  # noqa: BLE001 - the outcome is what we check
                outcome.append(e)

        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 10
        while not any(w.direct == _CALLER or w.requests for w in p._apool.workers):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(victim, signal.SIGKILL)
        t.join(15)
        assert not t.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], wirepool.WorkerExited), outcome
        assert p.call("add", {"a": 1, "b": 1}, timeout=20) == {"sum": 2}


def test_progress_events_and_streams_use_the_loop_and_park_again() -> None:
    seen: list[object] = []
    with pool() as p:
        wait_parked(p)
        assert p.call("progress", {"n": 5}, on_event=lambda t, d: seen.append(d)) == {"done": 5}
        assert seen
        assert [r["i"] for r in p.stream("rows", {"n": 50})] == list(range(50))
        wait_parked(p)
        assert p.call("add_inline", {"a": 1, "b": 1}) == {"sum": 2}


def test_recycle_by_request_count_still_happens_with_direct_calls() -> None:
    with pool(max_requests=20) as p:
        first = p.call("pid", {})
        for _ in range(60):
            p.call("add_inline", {"a": 1, "b": 1})
        deadline = time.monotonic() + 10
        while first in p.pids or not p.pids:
            assert time.monotonic() < deadline, "the worker was never recycled"
            time.sleep(0.01)
        assert p.metrics().get("recycled", 0) >= 1


def test_many_threads_with_maps_streams_and_submits_all_end_once() -> None:
    errors: list[BaseException] = []
    with pool(workers=2, max_in_flight=8) as p:
        def caller(k: int) -> None:
            try:
                for i in range(300):
                    assert p.call("add_inline", {"a": i, "b": k}) == {"sum": i + k}
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def mapper() -> None:
            try:
                for _ in range(5):
                    got = list(p.map("add", ({"a": i, "b": 1} for i in range(200))))
                    assert got == [{"sum": i + 1} for i in range(200)]
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def streamer() -> None:
            try:
                for _ in range(10):
                    assert [r["i"] for r in p.stream("rows", {"n": 300})] == list(range(300))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def submitter() -> None:  # calls through the loop, beside the direct ones
            try:
                futures = [p.submit("add", {"a": i, "b": 2}) for i in range(300)]
                assert [f.result(60) for f in futures] == [{"sum": i + 2} for i in range(300)]
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
        threads += [threading.Thread(target=f) for f in (mapper, streamer, submitter)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a thread never finished"
        assert not errors, errors[:3]
        m = p.metrics()
        assert all(w["in_flight"] == 0 for w in m["workers"])
        assert m.get("errors", 0) == 0
