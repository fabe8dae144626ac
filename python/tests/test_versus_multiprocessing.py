"""The same scenario against multiprocessing.Pool and wirepool: a worker is SIGKILLed while it
runs a task. multiprocessing.Pool replaces the process but loses the task: its result never
comes, and the caller waits forever (here: until the bounded get() gives up). wirepool ends the
call at once with one typed error naming the signal."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import time

import pytest

import wirepool

from test_pool import BASIC, in_flight, wait_until

pytestmark = pytest.mark.timeout(60)


def _announce_then_sleep(path: str) -> str:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(30)  # the task being killed, not synchronisation
    return "done"


def test_multiprocessing_pool_loses_the_task_of_a_killed_worker() -> None:
    """The incumbent's failure, shown so the comparison cannot silently become meaningless."""
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "pid")
        mp = multiprocessing.get_context("fork").Pool(1)
        try:
            result = mp.apply_async(_announce_then_sleep, (marker,))
            wait_until(lambda: os.path.exists(marker) and os.path.getsize(marker) > 0)
            with open(marker) as f:
                os.kill(int(f.read()), signal.SIGKILL)
            with pytest.raises(multiprocessing.TimeoutError):
                result.get(timeout=3)  # no error ever arrives: the caller would hang
        finally:
            mp.terminate()
            mp.join()


def test_wirepool_ends_the_call_of_a_killed_worker_with_one_typed_error() -> None:
    with wirepool.Pool([sys.executable, BASIC], workers=1) as p:
        (victim,) = p.pids
        fut = p.submit("sleep", {"seconds": 30})
        wait_until(lambda: in_flight(p) == 1)
        started = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(wirepool.WorkerExited) as e:
            fut.result(timeout=10)
        assert time.monotonic() - started < 5, "the error must come promptly, not after a timeout"
        assert e.value.signal == signal.SIGKILL
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}  # replaced, still serving
