"""The hand-over races of Pool.call's direct path (issue 17): while a blocking caller holds a
worker's connection (it wrote its request and reads the answer itself), everything else still
happens and every call ends exactly once: a second caller arrives, the worker dies, the deadline
passes, heartbeats tick or the worker hangs, the pool closes.

Each test runs its event at a known point: the caller's poll is wrapped so that the event
happens in the caller's thread after its request is written and before it reads, i.e. while it
holds the connection; the tests wait on events, never on sleeps."""
from __future__ import annotations

import collections
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

import pytest

import wirepool
from wirepool._pooled_worker import _CALLER, _PARKED

BASIC = os.path.join(os.path.dirname(__file__), "workers", "basic.py")
BOUND = 20.0  # seconds any single wait in these tests may take before it counts as a hang


def pool(**kw: Any) -> wirepool.Pool:
    return wirepool.Pool([sys.executable, BASIC], workers=1, **kw)


def parked_worker(p: wirepool.Pool) -> Any:
    """The pool's one worker, once parked (a call through the loop parks it after it ends)."""
    deadline = time.monotonic() + BOUND
    while True:
        w = p._apool.workers[0] if p._apool.workers else None
        if w is not None and w.direct == _PARKED:
            return w
        assert time.monotonic() < deadline, "the worker was never parked"
        p.call("add", {"a": 0, "b": 0})


class HookedPoll:
    """Stands in for a worker's poll object in the direct path: the first ``poll`` runs
    ``before`` (the caller holds the connection then, its request written), then polls."""

    def __init__(self, real: Any, before: Callable[[], None]) -> None:
        self.real = real
        self.before: Callable[[], None] | None = before
        self.held_by_caller = False

    def poll(self, timeout_ms: int) -> Any:
        before, self.before = self.before, None
        if before is not None:
            self.held_by_caller = True
            before()
        return self.real.poll(timeout_ms)


def hook(w: Any, before: Callable[[], None]) -> HookedPoll:
    hooked = HookedPoll(w.direct_poll, before)
    w.direct_poll = hooked
    return hooked


def direct_counts(w: Any) -> tuple[int, int]:
    return w.direct_calls, w.direct_completed


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread; its outcome lands in the list as ("ok", value) or ("err", e)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - the outcome is what the test checks
            out.append(("err", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


class SignallingDeque(collections.deque):
    """The pool's queue of callers waiting for a slot, telling when one joins it."""

    def __init__(self, joined: threading.Event) -> None:
        super().__init__()
        self.joined = joined

    def append(self, item: Any) -> None:
        super().append(item)
        self.joined.set()


def test_a_second_caller_arriving_while_the_first_reads_goes_through_the_loop() -> None:
    with pool() as p:
        w = parked_worker(p)
        queued = threading.Event()
        assert not p._apool._slot_waiters
        p._apool._slot_waiters = SignallingDeque(queued)
        second: list[Any] = []

        def second_caller_arrives() -> None:
            assert w.direct == _CALLER
            second.append(in_thread(lambda: p.call("add_inline", {"a": 20, "b": 2})))
            # It finds the worker held and waits on the loop for a slot.
            assert queued.wait(BOUND), "the second call never queued for a slot"

        hooked = hook(w, second_caller_arrives)
        calls, done = direct_counts(w)
        assert p.call("add_inline", {"a": 10, "b": 1}) == {"sum": 11}
        assert hooked.held_by_caller
        t, out = second[0]
        t.join(BOUND)
        assert not t.is_alive(), "the second caller was never woken"
        assert out == [("ok", {"sum": 22})]
        # The first went direct; the second, arriving meanwhile, through the loop.
        assert direct_counts(w) == (calls + 1, done + 1)
        assert p.metrics()["workers"][0]["in_flight"] == 0
        w = parked_worker(p)  # and the worker is parked for the next direct call
        assert p.call("add_inline", {"a": 1, "b": 1}) == {"sum": 2}


def test_the_worker_dying_while_the_caller_reads_ends_the_call_worker_exited() -> None:
    with pool() as p:
        w = parked_worker(p)
        victim = w.pid
        hooked = hook(w, lambda: os.kill(victim, signal.SIGKILL))
        calls, _ = direct_counts(w)
        started = time.monotonic()
        with pytest.raises(wirepool.WorkerExited):
            p.call("sleep_stubborn", {"seconds": 30})
        assert time.monotonic() - started < BOUND
        assert hooked.held_by_caller and w.direct_calls == calls + 1
        assert p.call("add", {"a": 1, "b": 1}, timeout=BOUND) == {"sum": 2}  # its replacement
        assert victim not in p.pids
        m = p.metrics()
        assert m.get("errors", 0) == 1 and m["workers"][0]["in_flight"] == 0


def test_a_deadline_passing_while_the_caller_reads_ends_the_call_once() -> None:
    with pool(deadline_grace=0.05) as p:
        w = parked_worker(p)
        pid = w.pid
        # The deadline (10 ms) passes while the caller still waits for the answer (up to 50 ms).
        hooked = hook(w, lambda: None)
        calls, _ = direct_counts(w)
        m0 = p.metrics()
        started = time.monotonic()
        with pytest.raises(wirepool.DeadlineExceeded):
            p.call("sleep", {"seconds": 5}, timeout=0.01)
        assert time.monotonic() - started < 4.0  # not the handler's 5 s
        assert hooked.held_by_caller and w.direct_calls == calls + 1
        assert p.call("add_inline", {"a": 1, "b": 2}, timeout=BOUND) == {"sum": 3}
        m1 = p.metrics()
        # Two calls, each ended once (``completed`` counts failures too), one of them failed.
        assert m1.get("calls", 0) - m0.get("calls", 0) == 2
        assert m1.get("completed", 0) - m0.get("completed", 0) == 2
        assert m1.get("errors", 0) - m0.get("errors", 0) == 1
        assert m1["workers"][0]["in_flight"] == 0 and p.pids == [pid]


def test_heartbeats_while_the_caller_reads_do_not_blame_a_healthy_worker() -> None:
    period = 0.04
    with pool(heartbeat_ms=int(period * 1000)) as p:
        w = parked_worker(p)
        pid = w.pid
        # The caller holds the connection for longer than the hang limit (3 periods): the
        # scenario is a caller holding it that long (its answer waits in the socket), not a
        # synchronisation between threads.
        hooked = hook(w, lambda: threading.Event().wait(4 * period))
        calls, done = direct_counts(w)
        assert p.call("add_inline", {"a": 2, "b": 2}) == {"sum": 4}
        assert hooked.held_by_caller and direct_counts(w) == (calls + 1, done + 1)
        # Heartbeats go on afterwards: a PING is sent and answered (the worker is reclaimed
        # from its parked state for it), and the worker is never declared hung.
        sent = w.pings[-1][0] if w.pings else None
        deadline = time.monotonic() + BOUND
        for i in range(40):
            assert p.call("add_inline", {"a": i, "b": 0}) == {"sum": i}
        while w.pings and (sent is None or w.pings[0][0] <= sent):
            assert time.monotonic() < deadline, "a PING was never answered"
            p.call("add", {"a": 0, "b": 0})
        assert p.pids == [pid] and w.alive


def test_a_worker_hanging_while_the_caller_reads_is_found_by_the_heartbeat() -> None:
    with pool(heartbeat_ms=50) as p:
        w = parked_worker(p)
        victim = w.pid
        hooked = hook(w, lambda: os.kill(victim, signal.SIGSTOP))
        try:
            started = time.monotonic()
            with pytest.raises(wirepool.WorkerHung):
                # A handler that takes 2 s: an inline add can be answered (by a worker watching
                # its socket) before the SIGSTOP lands, and the call then rightly succeeds.
                p.call("sleep", {"seconds": 2.0})
            assert time.monotonic() - started < BOUND
        finally:
            try:
                os.kill(victim, signal.SIGCONT)
            except ProcessLookupError:
                pass  # killed as hung: SIGKILL ends a stopped process too
        assert hooked.held_by_caller
        assert p.call("add", {"a": 1, "b": 1}, timeout=BOUND) == {"sum": 2}
        assert victim not in p.pids


def test_close_while_the_caller_reads_lets_the_call_finish_then_drains() -> None:
    p = pool()
    w = parked_worker(p)
    drain_asked = threading.Event()
    real_drain = w.drain

    def drain(grace_ms: int) -> None:  # on the loop, from close()
        real_drain(grace_ms)
        drain_asked.set()

    w.drain = drain
    closing: list[Any] = []

    def close_meanwhile() -> None:
        closing.append(in_thread(lambda: p.close(grace=5)))
        assert drain_asked.wait(BOUND), "close() never reached the worker"

    hooked = hook(w, close_meanwhile)
    try:
        assert p.call("add_inline", {"a": 3, "b": 4}) == {"sum": 7}
        assert hooked.held_by_caller
        t, out = closing[0]
        t.join(BOUND)
        assert not t.is_alive(), "close() never returned"
        assert out == [("ok", None)]
        assert w.exited.done()
        with pytest.raises(wirepool.PoolClosed):
            p.call("add_inline", {"a": 1, "b": 1})
    finally:
        p.close()


def test_a_request_the_worker_does_not_read_leaves_the_caller_to_the_loop() -> None:
    # A body larger than the socket's buffers to a worker that reads nothing (stopped): the
    # caller writes what fits, then the loop holds the rest and ends the call at its deadline.
    # The socket path: with the shm lane on, the loop sends a body this large through a region.
    with pool(heartbeat_ms=0, deadline_grace=0.05, shm_lane=False) as p:
        w = parked_worker(p)
        victim = w.pid
        calls, _ = direct_counts(w)
        os.kill(victim, signal.SIGSTOP)
        try:
            t, out = in_thread(lambda: p.call("echo", b"x" * (64 << 20), codec="raw",
                                              timeout=0.5))
            t.join(BOUND)
            assert not t.is_alive(), "the caller is stuck writing to a worker that reads nothing"
        finally:
            os.kill(victim, signal.SIGCONT)
        assert len(out) == 1 and out[0][0] == "err", out
        assert isinstance(out[0][1], wirepool.DeadlineExceeded), out
        assert w.direct_calls == calls + 1
        # The rest of the request still reaches the worker intact: the connection goes on.
        assert p.call("echo", {"still": "framed"}, timeout=BOUND) == {"still": "framed"}
