"""The loop side of ``map`` (:meth:`AsyncPool.map` and the blocking :meth:`Pool.map`): requests
in, results out, within the window of calls in flight and the bound of unread results."""
from __future__ import annotations

import asyncio
import collections
import threading
from typing import TYPE_CHECKING, Any

from . import _validate
from . import codecs as _codecs
from ._constants import MAX_COUNT
from ._waits import wait_slice
from .errors import BadRequest, ErrorCode, PoolClosed, WirepoolError, quote
from .proto import MethodKind

if TYPE_CHECKING:
    from .pool import AsyncPool, _Request, _Worker


class _Failed:
    """A map item that never became a request (its body did not encode, the pool closed)."""

    __slots__ = ("outcome",)

    def __init__(self, error: BaseException) -> None:
        self.outcome = (False, error)


class _MapRun:
    """The loop side of :meth:`Pool.map` and :meth:`AsyncPool.map`: requests in, results out
    in order (or, ``ordered=False``, as they finish).

    ``results`` holds the submitted requests in order (unordered: the finished ones, in the
    order they finished); the map thread pops finished ones from the front (deque appends and pops are atomic, and ``outcome`` is set once). The loop keeps
    at most ``window`` calls in flight and at most two windows of results unread: past that it
    stalls until the reader catches up.

    The map thread wakes the loop only when the loop has parked: for want of items
    (``starved``) or because results are unread (``stalled``). Both flags are set by the loop
    and cleared by the reader, each under ``cond``'s lock, so a wake-up is neither lost nor
    sent twice; otherwise the loop refills by itself as results come in.
    """

    def __init__(self, pool: "AsyncPool", method: str, codec: _codecs.Codec,
                 timeout: float | None, window: int, ordered: bool = True) -> None:
        self.pool = pool
        self.ordered = ordered
        self.method = method
        self.codec = codec
        self.timeout = timeout
        self.window = window
        self.items: collections.deque[Any] = collections.deque()
        self.results: collections.deque[Any] = collections.deque()
        self.in_flight = 0
        self.stopped = False
        self.stalled = False  # the reader must call pump() once it has read some results
        self.starved = True  # the reader must call pump() once it has added items
        self.waiting_slot = False
        self.pump_scheduled = False
        self.notify_scheduled = False
        self.settling = False  # _settle() is due (after this read, or this loop pass)
        self.async_waiter: asyncio.Future[None] | None = None  # AsyncPool.map's reader
        self.cond = threading.Condition(threading.Lock())
        self.reader_waiting = False

    # -- loop thread ----------------------------------------------------------------------

    def add(self, chunk: list[Any]) -> None:
        """Loop thread (AsyncPool.map): more requests."""
        self.items.extend(chunk)
        self.starved = False
        self.pump()

    def feed(self, chunk: list[Any]) -> bool:
        """Map thread (Pool.map): more requests; True if the loop must be woken (pump)."""
        with self.cond:
            self.items.extend(chunk)
            wake, self.starved = self.starved, False
        return wake

    def read_some(self) -> bool:
        """Map thread: results were read; True if the loop must be woken (pump)."""
        with self.cond:
            wake = self.stalled and len(self.results) <= self.window
            if wake:
                self.stalled = False
        return wake

    def pump(self) -> None:
        self.pump_scheduled = False
        pool = self.pool
        items = self.items
        results = self.results
        encode = self.codec.encode
        cap = 2 * self.window
        while items and not self.stopped:
            free = min(self.window - self.in_flight, cap - len(results))
            if free <= 0:
                break
            w = None
            if not pool._closed and not (pool._slot_waiters
                                         and not pool._slot_waiters[0].done()):
                w = pool._pick()
            if w is None:
                if pool._closed or pool._gave_up is not None:
                    while items:  # each item its own exception: none shares a traceback
                        items.popleft()
                        results.append(_Failed(pool._broken() or PoolClosed(
                            ErrorCode.POOL_CLOSED, "the pool is closed")))
                    break
                if not self.waiting_slot:
                    self.waiting_slot = True
                    pool._wait_for_slot(self._slot_free)
                self._notify()
                return
            # As many as this worker has room for, in one burst (their frames share a write).
            k = min(free, w.max_in_flight - len(w.requests), len(items))
            if self.timeout is None:
                bodies: list[Any] = []
                for _ in range(k):
                    item = items.popleft()
                    try:
                        bodies.append(encode(item))
                    except Exception as e:  # the request does not encode: its own outcome
                        self._submit(w, bodies)
                        bodies = []
                        results.append(_Failed(_encode_failed(self.codec, e)))
                self._submit(w, bodies)
                continue
            for _ in range(k):
                item = items.popleft()
                try:
                    body = encode(item)
                except Exception as e:  # the request does not encode: its own outcome
                    results.append(_Failed(_encode_failed(self.codec, e)))
                    continue
                pool._counters["calls"] += 1
                req = w.submit(self.method, body, self.codec, self.timeout, None,
                               MethodKind.UNARY)
                if req.outcome is None:
                    self.in_flight += 1
                    req.sink = self._finished
                    if self.ordered:
                        results.append(req)
                else:
                    results.append(req)
        if not self.stopped:
            with self.cond:  # park, under the lock the reader takes to add items or unstall
                if len(results) >= cap:
                    self.stalled = True
                elif not items:
                    self.starved = True
                elif self.in_flight < self.window and not self.pump_scheduled:
                    self.pump_scheduled = True  # items came in meanwhile: go on
                    pool.loop.call_soon(self.pump)
        self._notify()

    def _submit(self, w: _Worker, bodies: list[Any]) -> None:
        if not bodies:
            return
        reqs = w.submit_batch(self.method, bodies, self.codec, self._finished)
        self.pool._counters["calls"] += len(reqs)
        # (a request that finished inside submit, e.g. an unknown method, has no sink)
        if self.ordered:
            self.results.extend(reqs)
        else:  # the others join the results as they finish (_finished)
            self.results.extend(req for req in reqs if req.outcome is not None)
        self.in_flight += sum(1 for req in reqs if req.outcome is None)


    def _slot_free(self) -> None:
        self.waiting_slot = False
        if self.stopped or not self.items:
            self.pool._capacity_changed(1)  # not ours to use: pass the wake-up on
        else:
            self.pump()

    def _finished(self, req: _Request) -> None:
        self.in_flight -= 1
        if not self.ordered:
            self.results.append(req)
        if not req.outcome[0] and isinstance(req.outcome[1], WirepoolError):  # type: ignore[index]
            self.pool._counters["errors"] += 1
        if not self.settling:
            # Results arrive many per read: refill and wake the reader once after them (at the
            # end of the read, or of this loop pass), not once per result.
            self.settling = True
            pool = self.pool
            if pool._reading:
                pool._after_read.append(self)
            else:
                pool.loop.call_soon(self._settle)

    def _settle(self) -> None:
        self.settling = False
        if self.items and not self.waiting_slot and not self.pump_scheduled and not self.stopped:
            self.pump()
        else:
            self._notify()

    def _notify(self) -> None:
        if self.reader_waiting and not self.notify_scheduled:
            results = self.results
            if results and results[0].outcome is not None:
                # Wake the reader once, after every result of this loop pass is in.
                self.notify_scheduled = True
                self.pool.loop.call_soon(self._notify_now)

    def _notify_now(self) -> None:
        self.notify_scheduled = False
        waiter = self.async_waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
            return
        with self.cond:
            self.cond.notify()

    async def wait_head_async(self) -> None:
        """AsyncPool.map: wait (on the loop) until the first result is in."""
        results = self.results
        while not results or results[0].outcome is None:
            self.async_waiter = self.pool.loop.create_future()
            self.reader_waiting = True
            try:
                await self.async_waiter
            finally:
                self.reader_waiting = False
                self.async_waiter = None

    def stop(self) -> None:
        self.stopped = True
        self.items.clear()

    # -- map thread -----------------------------------------------------------------------

    def wait_head(self) -> None:
        # (No wake-up for a stall here: a stalled loop has the head in flight, and its outcome
        # notifies us.)
        results = self.results
        with self.cond:
            self.reader_waiting = True
            try:
                slice_s = wait_slice()  # see _waits.SIGNAL_SLICE_S
                while not results or results[0].outcome is None:
                    self.cond.wait(slice_s)
            finally:
                self.reader_waiting = False


def _map_window(window: Any, default: int) -> int:
    """A map's ``window``: None for ``default`` (workers x max_in_flight), else 1 - 2^32-1."""
    if window is None:
        return max(1, default)
    return _validate.integer("window", window, 1, MAX_COUNT)


def _encode_failed(codec: _codecs.Codec, e: Exception) -> BadRequest:
    """The typed error for a request the codec cannot encode (code 202, as in Rust); it keeps
    the codec's message, not its exception (whose traceback would pin the request)."""
    return BadRequest(ErrorCode.BAD_REQUEST,
                      f"cannot encode the request as {codec.name}: {type(e).__name__}: "
                      f"{quote(str(e))}")
