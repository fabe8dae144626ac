"""The blocking face of :class:`~wirepool.AsyncPool`: :class:`Pool` runs the same pool on a
background event-loop thread (and calls an idle worker directly from the caller's thread);
:class:`SyncStream` reads a stream from any thread.

::

    with wirepool.Pool([sys.executable, "worker.py"], workers=4) as pool:
        pool.call("add", {"a": 1, "b": 2})
        for row in pool.stream("rows", {"n": 10}):
            ...
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import functools
import itertools
import os
import select
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence, cast

from . import _shm, _validate
from . import codecs as _codecs
from ._map import _MapRun, _encode_failed, _map_window
from ._transport import frame_end
from ._waits import acquire_lock, result_of
from .errors import ErrorCode, PoolClosed, ProtocolError, WirepoolError, error_from_code
from ._pooled_worker import (_DIRECT_WAIT_MS, _NO_LANE, _PARKED, _UNARY, EventCallback, _Request,
                             _Worker)
from .pool import AsyncPool, PoolMetrics, Stream, _Attempts
from .proto import MethodKind

__all__ = ["Pool", "SyncStream"]


class SyncStream:
    """A blocking iterator over a stream's rows; ``close()`` (or leaving a ``with``) cancels it.
    Rows are decoded in the calling thread, one frame fetched from the pool's loop at a time."""

    def __init__(self, pool: "Pool", stream: Stream) -> None:
        self._pool = pool
        self._stream = stream
        self._rows: Iterator[Any] = iter(())
        self._finished = False

    def __iter__(self) -> Iterator[Any]:
        # A generator: ``for row in stream`` then costs no Python-level call per row.
        return self._iterate()

    def _iterate(self) -> Iterator[Any]:
        while True:
            yield from self._rows
            if not self._next_frame():
                return

    def __next__(self) -> Any:
        for row in self._rows:
            return row
        while self._next_frame():
            for row in self._rows:
                return row
        raise StopIteration

    def _next_frame(self) -> bool:
        """Fetch and decode the next ROWS frame into ``_rows``; False at the end."""
        if self._finished:
            return False
        try:
            batch = self._pool._run(self._stream.next_batch)
        except BaseException:
            # An error, or Ctrl-C while waiting: the stream is over for this reader, so cancel
            # it now. A bare ``for`` keeps this iterator alive in the traceback, and the
            # pool's close would otherwise wait out its grace for a stream no one reads.
            self._finished = True
            self._abandon()
            raise
        if batch is None:
            self._finished = True
            return False
        # Decode the whole frame here, in the caller's thread, in one tight loop.
        self._rows = iter(self._stream._decode_rows(batch))
        return True

    @property
    def summary(self) -> Any:
        return self._stream.summary

    @property
    def row_count(self) -> int:
        return self._stream.row_count

    def close(self) -> None:
        if not self._finished:
            self._finished = True
            self._abandon()

    def _abandon(self) -> None:
        """Cancel the stream from any thread, without waiting and without a coroutine (one
        created while the loop is stopping would warn that it was never awaited)."""
        loop = self._pool._loop
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._stream._abandon)

    def __enter__(self) -> "SyncStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._finished:
            self._finished = True
            self._abandon()


class _Handoff:
    """A coroutine run on the pool's loop for a blocking caller. The coroutine is created on the
    loop, so a Ctrl-C that lands in the caller at any point leaves neither a coroutine that is
    never awaited nor a task that outlives the call."""

    __slots__ = ("fn", "args", "future", "task", "abandoned")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.task: asyncio.Future[Any] | None = None
        self.abandoned = False

    def start(self) -> None:  # on the loop
        if self.abandoned:
            return
        try:
            self.task = asyncio.ensure_future(self.fn(*self.args))
        except BaseException as e:
            self.future.set_exception(e)
            return
        self.task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[Any]) -> None:  # on the loop
        future = self.future
        if future.done():
            return
        if task.cancelled():
            future.cancel()
        elif task.exception() is not None:
            future.set_exception(task.exception())
        else:
            future.set_result(task.result())

    def abandon(self, loop: asyncio.AbstractEventLoop) -> None:
        """The caller stopped waiting: a task not yet started never starts, a started one is
        cancelled."""
        self.abandoned = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs there
            loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:  # on the loop
        if self.task is not None:
            self.task.cancel()


class _WriteStalled(Exception):
    """A direct call's request did not fit the socket within the direct wait: ``unsent`` is
    left for the loop to write."""

    def __init__(self, unsent: memoryview) -> None:
        super().__init__("write stalled")
        self.unsent = unsent


class _SyncCall:
    """One blocking call in flight: the caller waits on ``done`` (a plain lock, released once
    ``outcome`` is set by the loop)."""

    __slots__ = ("done", "outcome", "req", "task", "abandoned")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.outcome: tuple[bool, Any] | None = None
        self.req: _Request | None = None
        self.task: asyncio.Task | None = None
        self.abandoned = False

    def finish(self, outcome: tuple[bool, Any]) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.done.release()

    def task_done(self, task: asyncio.Task) -> None:
        if task.cancelled():
            self.finish((False, error_from_code(ErrorCode.CANCELLED, "the call was cancelled")))
        elif task.exception() is not None:
            self.finish((False, task.exception()))
        else:
            self.finish((True, task.result()))


class Pool:
    """The blocking face of :class:`AsyncPool` (same parameters); safe to use from many threads.

    ::

        with wirepool.Pool([sys.executable, "worker.py"], workers=4) as pool:
            print(pool.call("add", {"a": 1, "b": 2}))
    """

    def __init__(self, argv: Sequence[str], **options: Any) -> None:
        self._apool = AsyncPool(argv, **options)  # checks every option: no thread before that
        self._close_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wirepool-pool",
                                        daemon=True)
        self._thread.start()
        self._apool.direct_calls = True
        self._retry = self._apool.retry
        self._codecs: dict[str, _codecs.Codec] = {}  # by name, for direct calls
        try:
            self._run(self._apool.start)
        except BaseException:
            self._stop_loop()
            raise
        _open_pools.add(self)

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run the coroutine ``fn(*args)`` on the pool's loop and wait for its outcome."""
        if self._loop.is_closed():
            raise PoolClosed(ErrorCode.POOL_CLOSED, "the pool is closed")
        handoff = _Handoff(fn, args)
        try:
            self._loop.call_soon_threadsafe(handoff.start)
            return result_of(handoff.future)
        except BaseException:
            handoff.abandon(self._loop)  # e.g. KeyboardInterrupt: the task sends CANCEL
            raise

    def call(self, method: str, request: Any = None, *, codec: str | None = None,
             timeout: float | None = None, on_event: EventCallback | None = None,
             idempotent: bool | None = None) -> Any:
        """Call a unary method and wait for its result (see :meth:`AsyncPool.call`)."""
        timeout = _validate.timeout(timeout, method)
        if self._retry is not None or idempotent:
            attempts = self._apool._attempts_for(method, idempotent)
            if attempts > 1:
                return self._call_retrying(method, request, codec, timeout, on_event, attempts)
        if on_event is None:
            w = self._direct_worker()
            if w is not None:
                return self._call_direct(w, method, request, codec, timeout)
        return self._call_looped(method, request, codec, timeout, on_event)

    def _call_retrying(self, method: str, request: Any, codec: str | None,
                       timeout: float | None, on_event: EventCallback | None,
                       attempts: int) -> Any:
        """The first try as any call (directly when a worker is parked); the tries after a
        retryable end on the loop (:meth:`AsyncPool._call_retrying`)."""
        tries = _Attempts(attempts, timeout)
        try:
            return self.call(method, request, codec=codec, timeout=tries.budget(),
                             on_event=on_event, idempotent=False)
        except WirepoolError as e:
            if not tries.again(e):
                tries.final(e)
                raise
        return self._run(self._apool._call_retrying, method, request, codec, on_event, tries)

    def _direct_worker(self) -> _Worker | None:
        """A parked (idle) worker this thread may call directly, taken; None when there is
        none or callers queue for slots (they keep their FIFO order on the loop)."""
        ap = self._apool
        if ap._closed or ap._slot_waiters or ap._gave_up is not None:
            return None
        for w in tuple(ap.workers):
            if w.direct == _PARKED and w.claim_for_caller():
                return w
        return None

    def _call_direct(self, w: _Worker, method: str, request: Any, codec: str | None,
                     timeout: float | None) -> Any:
        """One call on a parked worker from the caller's thread: write the request, read the
        answer, no hop through the loop (issue 17). Anything unusual (an error frame, an
        event, a slow or dead worker, a large body) hands the connection and the request back
        to the loop, which ends it the usual way."""
        ap = self._apool
        parts = None
        try:
            c = ap.codec if codec is None else self._codec(codec)
            info = w.methods.get(method)
            if info is not None and info[1] == _UNARY:
                try:
                    body = c.encode(request)
                except Exception as e:
                    raise _encode_failed(c, e) from None
                timeout_us = _validate.timeout_us(timeout)
                if len(body) < w.shm_threshold:  # else the loop sends it through the lane
                    try:
                        id, parts = w.conn.send_request(info[0], c.id, timeout_us, body)
                    except ProtocolError:
                        pass  # refused (too large, ...): the loop path raises it
        except BaseException:
            w.release_from_caller()
            raise
        if parts is None:  # no such unary method, a refusal
            w.release_from_caller()
            return self._call_looped(method, request, codec, timeout)
        w.direct_calls += 1
        hooks = ap.request_hooks
        trace = None if hooks is None else (hooks, hooks.started(method, MethodKind.UNARY, id, w))
        started = time.monotonic()
        fd = w.direct_fd
        busy_poll = w.direct_busy_poll
        lane_sock = w.direct_sock if w.shm_threshold != _NO_LANE else None
        conn = w.conn
        results: list[Any] = []
        all_read = False  # the core took every byte read (take_results' answer)
        try:
            try:
                # One write (writev: no join) unless the socket is full.
                size = len(parts[0]) if len(parts) == 1 else sum(len(p) for p in parts)
                try:
                    sent = os.write(fd, parts[0]) if len(parts) == 1 else os.writev(fd, parts)
                except BlockingIOError:
                    sent = 0
                w.bytes_sent += size
                if sent < size:
                    # The socket is full (a large body): write on for at most the direct wait,
                    # then leave the rest to the loop, which also watches the worker meanwhile
                    # (a worker that stopped reading must not hold this caller forever).
                    unsent = memoryview(b"".join(parts))[sent:]
                    give_up = time.monotonic() + _DIRECT_WAIT_MS / 1000
                    while unsent:
                        left = give_up - time.monotonic()
                        if left <= 0:
                            break
                        select.select([], [fd], [], left)
                        with contextlib.suppress(BlockingIOError):
                            unsent = unsent[os.write(fd, unsent):]
                    if unsent:
                        raise _WriteStalled(unsent)
                poll = w.direct_poll.poll
                # Watch for the answer before sleeping; caught: it is there, read it.
                caught = busy_poll.wait(poll)
                while True:
                    if caught:
                        caught = False
                    elif not poll(_DIRECT_WAIT_MS):
                        break  # slow: the loop takes over (heartbeats, deadline, cancel grace)
                    # Into the core's read buffer (no 256 KiB bytes object per read).
                    if lane_sock is None:
                        n = os.readv(fd, (conn.read_buffer(),))
                    else:  # a SHM_REGION's descriptor may come with these bytes (20.5)
                        n, fds = _shm.recv_into_with_fds(lane_sock, conn.read_buffer())
                        if fds:
                            w.fds_received(fds)
                    if not n:
                        break  # end of file: the loop sees it and ends the call WORKER_EXITED
                    w.bytes_received += n
                    all_read = conn.received_results(n, results)
                    if results or not all_read:
                        break  # our answer, or a frame the loop must see (ERROR, EVENT...)
            except OSError:
                pass  # the connection broke (reset, a dying worker): the loop ends the call
        except _WriteStalled as stalled:
            call = _SyncCall()
            self._hand_back(w, id, c, method, timeout, started, results, call, trace,
                            stalled.unsent)
            return self._wait_call(call)
        except BaseException as e:  # Ctrl-C, or the core refused what it read
            call = _SyncCall()
            self._hand_back(w, id, c, method, timeout, started, results, call, trace)
            if isinstance(e, ProtocolError):
                # The loop reads the same bytes again and handles the violation the usual way.
                return self._wait_call(call)
            self._loop.call_soon_threadsafe(self._abandon_call, call)
            raise
        if len(results) == 2 and results[0] == id and all_read:
            body = results[1]
            w.direct_completed += 1
            w.served += 1
            w.last_busy = now = time.monotonic()
            if ap.latency_histograms:
                w.observe(method, now - started)
            w.release_from_caller(
                recheck=ap.max_requests is not None and w.served >= ap.max_requests,
                all_read=True)
            try:
                value = c.decode(body)
            except Exception as e:
                w.direct_errors += 1
                ap._errors_by_code["DECODE_FAILED"] += 1
                err = error_from_code(ErrorCode.DECODE_FAILED, f"cannot decode the result as "
                                      f"{c.name}: {e}", id=id)
                if trace is not None:
                    trace[0].ended(trace[1], err)
                raise err from None
            if trace is not None:
                trace[0].ended(trace[1], None)
            return value
        call = _SyncCall()
        self._hand_back(w, id, c, method, timeout, started, results, call, trace)
        return self._wait_call(call)

    def _codec(self, name: Any) -> _codecs.Codec:
        """The codec called ``name``, remembered for the next direct call (a dict lookup;
        only the names ``_validate.codec`` accepted, a few known ones)."""
        if not isinstance(name, str):
            return _validate.codec(name)
        c = self._codecs.get(name)
        if c is None:
            c = self._codecs[name] = _validate.codec(name)
        return c

    def _hand_back(self, w: _Worker, id: int, codec: _codecs.Codec, method: str,
                   timeout: float | None, started: float, results: list[Any],
                   call: "_SyncCall", trace: Any, unsent: memoryview | None = None) -> None:
        """In the caller's thread: make the direct call an ordinary request of ``w`` (the loop
        finishes it, with its deadline as it would have had) and give the reading back, with
        the ``unsent`` end of its request for the loop to write first."""
        req = _Request(id, w, MethodKind.UNARY, codec, method, None, None,
                       started if self._apool.latency_histograms else 0.0)
        req.trace = trace  # its span, if any, ends with it on the loop
        call.req = req
        req.sink = functools.partial(self._call_finished, call=call)
        w.requests[id] = req
        if unsent:
            # Written first thing once the loop has the connection back (the loop leaves the
            # connection alone while a caller holds it): the rest of the frame under way, then
            # the request's whole frames, fed like any large output so that a PING goes at a
            # frame boundary (PROTOCOL.md 8.5), not behind the whole request.
            whole = cast(bytes, unsent.obj)
            end = frame_end(whole, len(whole) - len(unsent)) - (len(whole) - len(unsent))
            w.bytes_sent -= len(unsent)  # counted again as the loop writes it
            w.after_caller.insert(0, functools.partial(
                w._send_rest, bytes(unsent[:end]), unsent[end:]))
        if timeout is not None:
            w.after_caller.append(functools.partial(
                w.arm_deadline, req, timeout, started + timeout + self._apool.deadline_grace))
        w.release_from_caller(results, recheck=True)

    def _wait_call(self, call: "_SyncCall") -> Any:
        """Wait for ``call``'s outcome; an interrupted wait (Ctrl-C) cancels the request."""
        try:
            acquire_lock(call.done)
        except BaseException:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._abandon_call, call)
            raise
        ok, value = call.outcome  # type: ignore[misc]
        if ok:
            return value
        raise value

    def _call_looped(self, method: str, request: Any, codec: str | None,
                     timeout: float | None, on_event: EventCallback | None = None) -> Any:
        """The call through the pool's loop: one hand-off each way and no Task (the loop
        submits it in a plain callback and releases our lock when it finishes)."""
        call = _SyncCall()
        self._post(self._start_call, call, method, request, codec, timeout, on_event)
        return self._wait_call(call)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the pool's loop; PoolClosed once the pool is closed. With
        request hooks it runs in a copy of the caller's context (tracing spans link up)."""
        try:
            if self._apool.request_hooks is not None:
                self._loop.call_soon_threadsafe(fn, *args, context=contextvars.copy_context())
            else:
                self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed
            raise PoolClosed(ErrorCode.POOL_CLOSED, "the pool is closed") from None

    def _start_call(self, call: "_SyncCall", method: str, request: Any, codec: str | None,
                    timeout: float | None, on_event: EventCallback | None) -> None:
        """On the loop: submit now if a worker has room, else take the full (queueing) path."""
        ap = self._apool
        if call.abandoned:
            return
        try:
            c = ap._codec_for(codec)
            req = ap._try_submit(method, request, c, timeout, on_event)
        except BaseException as e:  # noqa: B036 - e.g. the request does not encode: the caller's
            call.finish((False, e))
            return
        if req is None:
            task = self._loop.create_task(ap.call(method, request, codec=codec, timeout=timeout,
                                                  on_event=on_event))
            call.task = task
            task.add_done_callback(call.task_done)
            return
        call.req = req
        if req.outcome is not None:
            self._call_finished(req, call)
        else:
            req.sink = functools.partial(self._call_finished, call=call)

    def _call_finished(self, req: _Request, call: "_SyncCall") -> None:
        outcome = req.outcome
        assert outcome is not None
        if not outcome[0] and isinstance(outcome[1], WirepoolError):
            self._apool._counters["errors"] += 1
        call.finish(outcome)

    def _abandon_call(self, call: "_SyncCall") -> None:
        call.abandoned = True
        if call.task is not None:
            call.task.cancel()
        elif call.req is not None and call.req.id in call.req.worker.requests:
            call.req.worker.cancel(call.req)

    def submit(self, method: str, request: Any = None, *, codec: str | None = None,
               timeout: float | None = None,
               idempotent: bool | None = None) -> concurrent.futures.Future:
        """Start a call without waiting; returns a ``concurrent.futures.Future``."""
        timeout = _validate.timeout(timeout, method)
        self._apool._codec_for(codec)
        return asyncio.run_coroutine_threadsafe(
            self._apool.call(method, request, codec=codec, timeout=timeout,
                             idempotent=idempotent), self._loop)

    def map(self, method: str, requests: Iterable[Any], *, codec: str | None = None,
            timeout: float | None = None, window: int | None = None,
            ordered: bool = True, return_exceptions: bool = False) -> Iterator[Any]:
        """Call ``method`` for each request, keeping up to ``window`` calls in flight (default:
        workers x max_in_flight); yields results in order, or with ``ordered=False`` as they
        finish (as ``multiprocessing``'s ``imap_unordered``: a slow call holds back no other
        result). The first failed call raises its
        error at its place in the order (the calls after it still run to their end); with
        ``return_exceptions=True`` (as :func:`asyncio.gather`) every failed call's error is
        yielded as its value instead, and the map goes on.

        The pool's loop submits calls as slots free up and completes them in bulk; this thread
        reads ``requests`` a chunk at a time and sleeps only when the next result is not in yet.
        """
        ap = self._apool
        timeout = _validate.timeout(timeout, method)
        limit = _map_window(window, ap.size * ap.max_in_flight)
        _validate.flag("ordered", ordered)
        _validate.flag("return_exceptions", return_exceptions)
        return self._map(method, requests, ap._codec_for(codec), timeout, limit, ordered,
                         return_exceptions)

    def _map(self, method: str, requests: Iterable[Any], c: _codecs.Codec,
             timeout: float | None, limit: int, ordered: bool,
             return_exceptions: bool) -> Iterator[Any]:
        ap = self._apool
        run = _MapRun(ap, method, c, timeout, limit, ordered)
        items = iter(requests)
        results = run.results
        fed = yielded = 0
        exhausted = False
        wake = functools.partial(self._post, run.pump)
        try:
            while True:
                # Keep the loop up to four windows of requests beyond what we have yielded.
                if not exhausted and fed - yielded < 4 * limit:
                    chunk = list(itertools.islice(items, 2 * limit))
                    exhausted = len(chunk) < 2 * limit
                    if chunk:
                        fed += len(chunk)
                        if run.feed(chunk):
                            wake()
                    continue
                if yielded == fed:
                    return
                if not results or results[0].outcome is None:
                    run.wait_head()
                ok, value = results.popleft().outcome  # type: ignore[union-attr,misc]
                yielded += 1
                if run.stalled and run.read_some():
                    wake()
                if not ok and not return_exceptions:
                    raise value
                yield value
        finally:
            if yielded < fed:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(run.stop)

    def stream(self, method: str, request: Any = None, *, codec: str | None = None,
               timeout: float | None = None, on_event: EventCallback | None = None,
               idempotent: bool | None = None) -> SyncStream:
        """Start a streaming method; iterate the result for decoded rows."""
        return SyncStream(self, self._apool.stream(method, request, codec=codec, timeout=timeout,
                                                   on_event=on_event, idempotent=idempotent))

    def metrics(self) -> PoolMetrics:
        return self._run(self._metrics)

    async def _metrics(self) -> PoolMetrics:
        return self._apool.metrics()

    @property
    def pids(self) -> list[int]:
        return [w["pid"] for w in self.metrics()["workers"] if w["alive"]]

    def close(self, grace: float | None = None) -> None:
        """Drain and stop every worker (see :meth:`AsyncPool.close`). Closing again, or from
        two threads at once, waits for the first close and is no error (PROTOCOL.md 22.4)."""
        _open_pools.discard(self)
        with self._close_lock:
            if self._loop.is_closed():
                return
            try:
                self._run(self._apool.close, grace)
            finally:
                self._stop_loop()

    def _stop_loop(self) -> None:
        with contextlib.suppress(Exception):
            # Workers still there (a start that was interrupted or failed) are killed and
            # reaped first: cancelling their exit watchers would leave their reaping to wait
            # out its timeouts (a Ctrl-C during start-up took 6 s).
            self._run(self._apool._kill_all)
        with contextlib.suppress(Exception):
            self._run(_cancel_other_tasks)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        # Left by an exception (Ctrl-C included): no one will read the work in flight, so it
        # is cancelled at once instead of being given the drain grace.
        self.close(grace=0 if exc_type is not None else None)


# Pools the program never closed are closed at exit, without grace: their loop thread is a
# daemon, and dying with it would leave pending tasks to complain and work unfinished.
_open_pools: "weakref.WeakSet[Pool]" = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_open_pools):
        with contextlib.suppress(Exception):
            pool.close(grace=0)


async def _cancel_other_tasks() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
