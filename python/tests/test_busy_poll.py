"""Busy polling (issue 17): a lone AsyncPool.call reads its answer in its own task, and an idle
worker watches its socket before its loop sleeps. These tests prove each path is taken when it
should be and not otherwise, and that every outcome (result, error, death, slow handler) still
ends the call exactly once."""
from __future__ import annotations

import asyncio
import collections
import os
import select
import socket
import sys
import time

import pytest

import wirepool
from wirepool._transport import BusyPoll, LaneTransport
from wirepool.worker import _BusyPollSelector

BASIC = os.path.join(os.path.dirname(__file__), "workers", "basic.py")


def apool(**kw) -> wirepool.AsyncPool:
    return wirepool.AsyncPool([sys.executable, BASIC], workers=kw.pop("workers", 1), **kw)


@pytest.fixture
def reads_in_task(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the reads made by a waiting task (LaneTransport.read_now), not by the loop."""
    count = [0]
    real = LaneTransport.read_now

    def counting(self: LaneTransport) -> None:
        count[0] += 1
        real(self)

    monkeypatch.setattr(LaneTransport, "read_now", counting)
    return count


def test_a_lone_call_reads_its_answer_in_its_task(reads_in_task: list[int]) -> None:
    async def main() -> None:
        # A budget of 5 s: the answer always comes within it, so every call reads it itself.
        async with apool(busy_poll_us=5_000_000) as p:
            for i in range(50):
                assert await p.call("add_inline", {"a": i, "b": 1}) == {"sum": i + 1}
            assert reads_in_task[0] >= 50
            m = p.metrics()
            assert m["calls"] == m["completed"] == 50

    asyncio.run(main())


def test_busy_poll_off_leaves_reading_to_the_loop(reads_in_task: list[int]) -> None:
    async def main() -> None:
        async with apool(busy_poll_us=0) as p:
            for i in range(20):
                assert await p.call("add_inline", {"a": i, "b": 2}) == {"sum": i + 2}
        assert reads_in_task[0] == 0

    asyncio.run(main())


def test_concurrent_calls_do_not_hold_the_loop(reads_in_task: list[int]) -> None:
    async def main() -> None:
        async with apool(workers=2, busy_poll_us=5_000_000) as p:
            # gather starts both tasks in one loop pass: when the first one has sent its
            # request, the second is ready to run, so the first must not hold the loop.
            results = await asyncio.gather(*(p.call("sleep", {"seconds": 0.05})
                                              for _ in range(2)))
            assert results == [{"slept": 0.05}] * 2
            assert reads_in_task[0] == 0
            # Then each alone again: read in the task.
            assert await p.call("sleep", {"seconds": 0.01}) == {"slept": 0.01}
            assert reads_in_task[0] >= 1

    asyncio.run(main())


@pytest.mark.parametrize("budget_us", [5_000_000, 0])
def test_errors_and_deaths_read_in_the_task_end_the_call_once(budget_us: int) -> None:
    """The same outcomes and counters whether the task or the loop reads them."""
    async def main() -> None:
        async with apool(busy_poll_us=budget_us, max_restarts=5) as p:
            with pytest.raises(wirepool.WorkerError) as err:
                await p.call("fail", {"thing": "x"})
            assert err.value.code == 1042
            with pytest.raises(wirepool.WorkerExited):
                await p.call("die", {"status": 3})
            # The pool restarts the worker; the next lone call is served as usual.
            assert await p.call("add_inline", {"a": 1, "b": 1}) == {"sum": 2}
            m = p.metrics()
            assert (m["calls"], m["completed"], m["errors"], m["restarts"]) == (3, 2, 2, 1), m

    asyncio.run(main())


def test_a_handler_slower_than_the_budget_is_finished_by_the_loop(
        reads_in_task: list[int]) -> None:
    async def main() -> None:
        async with apool(busy_poll_us=1000) as p:
            t0 = time.monotonic()
            assert await p.call("sleep", {"seconds": 0.2}) == {"slept": 0.2}
            assert time.monotonic() - t0 >= 0.2

    asyncio.run(main())


def test_negative_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="busy_poll_us"):
        apool(busy_poll_us=-1)


def test_the_environment_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WIREPOOL_BUSY_POLL_US", "0")
    assert apool().busy_poll_s == 0
    monkeypatch.setenv("WIREPOOL_BUSY_POLL_US", "250")
    assert apool().busy_poll_s == pytest.approx(250e-6)
    assert apool(busy_poll_us=7).busy_poll_s == pytest.approx(7e-6)


# -- the worker's selector ---------------------------------------------------------------------

@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_selector_catches_input_that_arrives_during_its_poll(pair) -> None:
    a, b = pair
    sel = _BusyPollSelector(b.fileno(), 30.0)
    sel.register(b.fileno(), 1)  # EVENT_READ
    sel.idle = lambda: True
    a.send(b"x")
    t0 = time.monotonic()
    ready = sel.select(None)
    assert [key.fd for key, _ in ready] == [b.fileno()]
    assert time.monotonic() - t0 < 10  # returned with the input, not after the 30 s budget
    sel.close()


def test_selector_never_delays_a_timer_or_a_busy_worker(pair) -> None:
    a, b = pair
    sel = _BusyPollSelector(b.fileno(), 30.0)
    sel.register(b.fileno(), 1)
    polls = [0]
    real_poll = sel.poll

    def counting(ms: int) -> list:
        polls[0] += 1
        return real_poll(ms)

    sel.poll = counting
    sel.idle = lambda: True
    t0 = time.monotonic()
    assert sel.select(0.05) == []  # a timer due in 50 ms bounds the poll, not the budget
    assert time.monotonic() - t0 < 10
    assert polls[0] >= 1
    sel.busy_poll.caught(float("inf"))  # that wait missed; forget its back-off
    polls[0] = 0
    assert sel.select(0) == []  # the loop has work ready: no poll at all
    sel.idle = lambda: False
    assert sel.select(0.01) == []  # requests in flight: the loop sleeps at once
    assert polls[0] == 0
    sel.close()


def test_worker_refuses_a_negative_budget() -> None:
    with pytest.raises(ValueError, match="busy_poll_us"):
        wirepool.serve(busy_poll_us=-1)


def test_busy_poll_backs_off_after_misses_and_resets_when_it_catches(pair) -> None:
    a, b = pair
    watch = BusyPoll(0.001)
    poller = select.poll()
    poller.register(b.fileno(), select.POLLIN)

    def skipped_waits() -> int:
        """Waits that sleep at once before the next one polls again."""
        n = 0
        while not watch.deadline():
            n += 1
        return n

    assert skipped_waits() == 0
    watch.wait(poller.poll)  # nothing comes: a miss
    assert skipped_waits() == 1
    watch.missed()
    watch.missed()
    assert skipped_waits() == 4
    for _ in range(10):
        watch.missed()
    assert skipped_waits() == 64  # the back-off is bounded
    a.send(b"x")
    watch.wait(poller.poll)  # input ready at once: caught, the back-off ends
    assert skipped_waits() == 0
    watch.caught(0.0)  # input that came past the deadline counts as a miss
    assert skipped_waits() == 1


def test_selector_answers_while_idle_and_returns_when_the_loop_has_work(pair) -> None:
    a, b = pair
    sel = _BusyPollSelector(b.fileno(), 30.0)
    sel.register(b.fileno(), 1)
    ready: collections.deque = collections.deque()
    reads: list[bytes] = []
    in_flight = [False]

    def read_now() -> None:  # stands in for the transport's read
        data = b.recv(100)
        reads.append(data)
        if data == b"later":
            ready.append("a callback the answer scheduled")
        elif data == b"thread":
            in_flight[0] = True  # a request handed to a handler thread: not idle any more

    sel.read_now, sel.ready = read_now, ready
    sel.idle = lambda: not in_flight[0]
    a.send(b"later")
    t0 = time.monotonic()
    assert sel.select(None) == []  # read here; a callback is ready: back to the loop at once
    assert reads == [b"later"] and time.monotonic() - t0 < 10
    ready.clear()
    a.send(b"thread")
    assert sel.select(None) == []
    assert reads == [b"later", b"thread"]  # the worker is busy now: the loop takes over
    in_flight[0] = False
    sel.busy_poll.caught(float("inf"))
    t0 = time.monotonic()
    assert sel.select(0.05) == []  # nothing comes: returns by the loop's next timer
    assert time.monotonic() - t0 < 10 and reads == [b"later", b"thread"]
    sel.close()
