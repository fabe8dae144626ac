"""The parent side: a supervised pool of worker processes.

Asyncio::

    async with wirepool.AsyncPool([sys.executable, "worker.py"], workers=4) as pool:
        print(await pool.call("add", {"a": 1, "b": 2}, timeout=5))
        async for row in pool.stream("rows", {"n": 10}):
            ...

Blocking (runs the same pool on a background event-loop thread)::

    with wirepool.Pool([sys.executable, "worker.py"], workers=4) as pool:
        pool.call("add", {"a": 1, "b": 2})
        for row in pool.stream("rows", {"n": 10}):
            ...

Each worker gets one end of a Unix socketpair as ``WIREPOOL_FD``; it runs in its own process group,
never through a shell; its stdout and stderr are read continuously into ``logging`` (logger
``wirepool.worker``, WARNING, so a worker's ``print`` shows by default; ``worker_output``
changes that). Every request ends with exactly one outcome: its result, or one typed
exception (:class:`~wirepool.WorkerExited`, :class:`~wirepool.WorkerHung`,
:class:`~wirepool.DeadlineExceeded`, a :class:`~wirepool.WorkerError` from the handler, ...).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import time
from typing import AbstractSet, Any, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence

from . import _shm, _validate
from . import _constants as _c
from ._constants import MAX_WORKERS
from . import codecs as _codecs
from . import proto
from ._map import _MapRun, _encode_failed, _map_window
from ._pooled_worker import (_CALLER, _GOODBYE_GRACE, _LOOP, _STDERR_TAIL_LINES, _WORKER_OUTPUTS,
                             DEFAULT_BUSY_POLL_US, DEFAULT_MAX_FRAME_SIZE, SHM_THRESHOLD,
                             EventCallback, LatencyHistogram, RequestHooks, _Request, _Worker,
                             log)
from .errors import (ErrorCode, InvalidArgument, InvalidArgumentType, LeaseLost, PoolClosed,
                     ProtocolError, SpawnFailed, StartupTimeout, WirepoolError, WorkerExited,
                     WorkerHung, error_from_code, quote)
from .proto import MethodKind

__all__ = ["AsyncPool", "Stream", "Lease", "PoolMetrics", "RetryPolicy"]



class PoolMetrics(dict):
    """A snapshot: ``workers`` (per process), ``slots`` (per slot, kept across replacements:
    what :mod:`wirepool.prometheus` exports per ``worker``) and pool-wide counters."""


# ---------------------------------------------------------------------------------------------
# Retries (PROTOCOL.md 21.7)
# ---------------------------------------------------------------------------------------------

_MAX_ATTEMPTS = 100
_RETRYABLE = frozenset({ErrorCode.WORKER_EXITED, ErrorCode.WORKER_HUNG})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Opt-in retries for methods that are safe to run twice (PROTOCOL.md 21.7); without one
    (the default) a pool never sends a request again.

    A call or stream of one of ``methods`` (or made with ``idempotent=True``) that ends with
    :class:`~wirepool.WorkerExited` or :class:`~wirepool.WorkerHung`, and nothing else, is
    sent again as a new request to another worker, up to ``attempts`` tries in all (the first
    included), within what is left of its original ``timeout``; a stream only while none of
    its rows has reached the caller. The caller sees the last attempt's outcome; an error's
    ``details`` then hold ``"attempts"`` (when they are a JSON object or empty), and the pool's
    ``metrics()["retries"]`` counts the requests sent again::

        policy = wirepool.RetryPolicy(methods={"add", "lookup"}, attempts=3)
        with wirepool.Pool([sys.executable, "worker.py"], retry=policy) as pool:
            pool.call("add", {"a": 1, "b": 2})           # up to 3 tries
            pool.call("charge", {"cents": 5})            # never retried
            pool.call("get", {"k": 1}, idempotent=True)  # this call only

    ``idempotent=False`` on a call opts a listed method out. Calls through a lease (one worker)
    and ``map`` are not retried.
    """

    methods: AbstractSet[str] = frozenset()
    attempts: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.methods, str):
            raise InvalidArgumentType(ErrorCode.INVALID_ARGUMENT, "RetryPolicy.methods is a set "
                                      "of method names, not one string")
        object.__setattr__(self, "methods", frozenset(self.methods))
        attempts = self.attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) \
                or not 1 <= attempts <= _MAX_ATTEMPTS:  # PROTOCOL.md 22.2: retry_attempts
            raise InvalidArgument(ErrorCode.INVALID_ARGUMENT,
                                  f"RetryPolicy.attempts must be an integer 1 - {_MAX_ATTEMPTS} "
                                  f"(tries in all, the first included), got {quote(repr(attempts))}")


class _Attempts:
    """One retried call or stream: the tries made, the last retryable error, the deadline."""

    __slots__ = ("limit", "made", "timeout", "deadline", "last")

    def __init__(self, limit: int, timeout: float | None) -> None:
        self.limit = limit
        self.made = 0
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.last: WirepoolError | None = None

    def budget(self) -> float | None:
        """Counts one more try; its timeout: what is left of the original one."""
        self.made += 1
        if self.deadline is None or self.made == 1:
            return self.timeout
        return max(self.deadline - time.monotonic(), 1e-6)

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def again(self, e: BaseException) -> bool:
        """Whether the try that ended with ``e`` is tried again (remembered as ``last``)."""
        # The local outcomes only: a worker's ERROR with code 300 or 301 is a RequestError,
        # never retried (spec 3, 21.7).
        if (self.made >= self.limit or not isinstance(e, (WorkerExited, WorkerHung))
                or e.code not in _RETRYABLE):
            return False
        left = self.left()
        if left is not None and left <= 0:
            return False
        self.last = e
        return True

    def final(self, e: BaseException) -> None:
        """``e`` is the caller's outcome: its details gain the number of attempts."""
        if isinstance(e, WirepoolError):
            if e.details is None:
                e.details = {"attempts": self.made}
            elif isinstance(e.details, dict):
                e.details = {**e.details, "attempts": self.made}




# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------


class Stream:
    """An async iterator over a stream's rows (decoded with the call's codec).

    After the iteration ends, ``summary`` holds the decoded END summary (or None) and
    ``row_count`` the number of rows. Leaving early (``break``, ``aclose()``) cancels the request.
    """

    def __init__(self, pool: "AsyncPool", req_factory: Callable[[], Any],
                 retry: _Attempts | None = None) -> None:
        self._pool = pool
        self._factory = req_factory
        self._retry = retry  # the tries of a stream its pool's RetryPolicy covers
        self._req: _Request | None = None
        self._rows: Iterator[Any] = iter(())
        self._decode: Callable[[Any], Any] | None = None
        self._copy_rows = False  # raw rows stay memoryview slices; decoded rows may be copies
        self.summary: Any = None
        self.row_count = 0
        self._done = False
        self._undecodable = False

    def __aiter__(self) -> "Stream":
        return self

    async def _ensure(self) -> _Request:
        if self._req is None:
            self._req = await self._factory()
            self._decode = self._req.codec.decode
            self._copy_rows = self._req.codec.id != proto.CodecId.RAW
        return self._req

    async def __anext__(self) -> Any:
        for row in self._rows:
            return row
        while True:
            batch = await self.next_batch()
            if batch is None:
                raise StopAsyncIteration
            self._rows = iter(self._decode_rows(batch))
            for row in self._rows:
                return row

    async def batches(self) -> AsyncIterator[list[Any]]:
        """Rows a frame at a time (lists of decoded rows): less per-row overhead than
        ``async for row in stream``."""
        while True:
            batch = await self.next_batch()
            if batch is None:
                return
            yield self._decode_rows(batch)

    def _decode_rows(self, batch: proto.Rows) -> list[Any]:
        """The rows of ``batch``, decoded; a row the codec cannot decode ends the stream with
        DECODE_FAILED (the request is cancelled: the rest is not wanted; the worker stays)."""
        try:
            return batch.decode(self._decode, self._copy_rows)  # type: ignore[arg-type]
        except Exception as e:
            # Only its text is kept: the codec's exception would pin the frame's buffers.
            problem = str(e)
        req = self._req
        assert req is not None
        self._undecodable = True
        # May run in a SyncStream caller's thread: the cancel goes through the loop.
        self._pool.loop.call_soon_threadsafe(self._abandon)
        raise error_from_code(ErrorCode.DECODE_FAILED,
                              f"cannot decode a row as {req.codec.name}: {problem}", id=req.id)

    async def next_batch(self) -> proto.Rows | None:
        """The next ROWS frame (undecoded rows), or None at the end. Raises the request's error."""
        req = await self._ensure()
        if self._undecodable:
            return None  # it already raised DECODE_FAILED: the stream is over
        while True:
            if req.frames:
                frame = req.frames.popleft()
                self.row_count += frame.count
                req.worker.consumed(req.id, frame.payload_size)
                return frame
            if req.outcome is not None:
                error = req.error
                if error is not None:
                    tries = self._retry
                    if tries is not None:
                        # Sent again only while no row has reached the caller (21.7).
                        if not self.row_count and tries.again(error):
                            self._req = None
                            try:
                                req = await self._ensure()
                            except WirepoolError as e:  # no worker within the deadline...
                                self._done = True
                                tries.final(e)
                                raise
                            continue
                        tries.final(error)
                    self._done = True
                    raise error
                end = req.end
                self._done = True
                if end is not None and len(end.summary):
                    problem = None
                    try:
                        self.summary = req.codec.decode(end.summary)
                    except Exception as e:
                        problem = str(e)  # its text only: the exception would pin the buffer
                    if problem is not None:
                        self._undecodable = True  # raised once; the stream is over
                        raise error_from_code(ErrorCode.DECODE_FAILED,
                                              f"cannot decode the summary: {problem}", id=req.id)
                return None
            req.waiter = self._pool.loop.create_future()
            try:
                await req.waiter
            except asyncio.CancelledError:
                self._abandon()
                raise
            finally:
                req.waiter = None

    def _abandon(self) -> None:
        req = self._req
        if req is not None and not self._done:
            self._done = True
            if req.outcome is None or req.id in req.worker.requests:
                req.worker.cancel(req, error_from_code(ErrorCode.CANCELLED,
                                                       "the stream was closed early", id=req.id))
                req.worker.drop_rows(req)

    async def aclose(self) -> None:
        """Stop reading: cancels the request if it has not ended."""
        self._abandon()

    def __del__(self) -> None:
        # ``break`` out of ``async for`` does not close a plain async iterator: cancel the
        # request when the stream is dropped, or its worker would wait for credit forever.
        if self._req is not None and not self._done:
            with contextlib.suppress(Exception):
                self._pool.loop.call_soon_threadsafe(self._abandon)

    async def __aenter__(self) -> "Stream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


# ---------------------------------------------------------------------------------------------
# The pool
# ---------------------------------------------------------------------------------------------


class Lease:
    """Exclusive use of one worker (``async with pool.lease() as w``); nothing else is sent to it.

    If the worker dies, the call in flight raises :class:`~wirepool.WorkerExited` (as any call
    would) and every later call through the lease raises :class:`~wirepool.LeaseLost`; both
    carry ``exit_status``, ``signal`` and ``stderr_tail``. This matches the Rust parent."""

    def __init__(self, pool: "AsyncPool", worker: _Worker) -> None:
        self._pool = pool
        self._worker = worker
        self.pid = worker.pid
        self.released = False  # set as the ``async with`` ends: later calls are LEASE_LOST

    def _check(self) -> _Worker:
        w = self._worker
        if self.released:
            raise LeaseLost(ErrorCode.LEASE_LOST, f"the lease on worker pid {w.pid} was released "
                            "(a call through a lease is made inside its ``async with``)")
        if not w.alive:
            what = (f"was killed by signal {w.exit_signal}" if w.exit_signal is not None
                    else f"exited with status {w.exit_status}" if w.exit_status is not None
                    else "is gone")
            lost = LeaseLost(ErrorCode.LEASE_LOST,
                             f"the leased worker pid {w.pid} {what}" + w._tail_suffix())
            lost.exit_status, lost.signal = w.exit_status, w.exit_signal
            lost.stderr_tail = "\n".join(w.stderr_tail)
            raise lost
        return w

    async def call(self, method: str, request: Any = None, *, codec: str | None = None,
                   timeout: float | None = None, on_event: EventCallback | None = None) -> Any:
        timeout = _validate.timeout(timeout, method)
        return await self._pool._call_on(self._check(), method, request, codec, timeout,
                                         on_event)

    def stream(self, method: str, request: Any = None, *, codec: str | None = None,
               timeout: float | None = None, on_event: EventCallback | None = None) -> Stream:
        timeout = _validate.timeout(timeout, method)
        self._pool._codec_for(codec)
        w = self._check()
        return self._pool._stream_on(w, method, request, codec, timeout, on_event)


def _busy_poll_from_env() -> Any:
    """``busy_poll_us`` when the caller gave none: ``WIREPOOL_BUSY_POLL_US``, else 100."""
    text = os.environ.get("WIREPOOL_BUSY_POLL_US")
    if text is None:
        return DEFAULT_BUSY_POLL_US
    try:
        return int(text)
    except ValueError:
        raise _validate.invalid("WIREPOOL_BUSY_POLL_US", "an integer", text) from None


class AsyncPool:
    """A pool of worker processes running ``argv``, driven by asyncio.

    Parameters (all optional but ``argv``; defaults as in PROTOCOL.md section 17):
    ``workers`` processes (default: the CPUs this process may use); ``codec`` default codec name; ``require`` method names (or a mapping
    name -> "unary"/"stream") every worker must offer with ``codec``, else start-up fails with
    CODEC_MISMATCH; ``max_in_flight`` per worker; ``startup_timeout`` seconds to HELLO;
    ``heartbeat_ms`` (0 disables); ``cancel_grace`` seconds a worker gets to honour CANCEL;
    ``deadline_grace`` seconds past a call's timeout before the parent gives up itself;
    ``max_requests``/``max_rss_bytes``/``idle_timeout`` recycle a worker (drained first);
    ``restart_backoff`` initial delay (doubles up to ``restart_backoff_max``);
    ``max_restarts`` within ``restart_window`` seconds before the pool stops restarting;
    ``drain_grace`` seconds in-flight requests get at close and when a worker is recycled;
    ``latency_histograms`` records per-method latency for :meth:`metrics` (``methods``); a
    :class:`wirepool.prometheus.PoolCollector` turns it on;
    ``worker_output`` what becomes of the workers' stdout and stderr: ``"log"`` (each line to
    the ``wirepool.worker`` logger at WARNING, with the worker's id and pid, so a worker's
    ``print`` shows by default), ``"inherit"`` (written straight to the parent's own stdout and
    stderr, unprefixed; errors then carry no stderr tail) or ``"discard"``;
    ``launcher`` where the workers run: None (the default) spawns them as local children, a
    :mod:`wirepool.launchers` launcher (``External``, ``RayLauncher``) has them connect back
    over TLS with a ticket (PROTOCOL.md 21);
    ``shm_lane`` accepts the shared-memory lane a local worker offers (PROTOCOL.md 20; Linux):
    request and result bodies of at least ``shm_threshold`` bytes (1 MiB) then travel through
    sealed memory files instead of the socket, and a ``raw`` result arrives as a read-only
    ``memoryview`` of the worker's region, which holds it until the view is released; False
    keeps every byte on the socket;
    ``retry`` a :class:`RetryPolicy`: the methods that are safe to send again after their
    worker died or hung, and how many tries they get (default: none, nothing is sent twice);
    ``busy_poll_us`` how long a call that is alone in flight polls its local worker's socket
    for the answer before sleeping (default ``WIREPOOL_BUSY_POLL_US`` from the environment,
    else 100; 0 sleeps at once): one call at a time then
    pays no wake-up of a sleeping thread, at the price of that much CPU per call. An
    ``AsyncPool`` holds its event loop for that long at most, only while no other call of the
    pool is in flight.

    ``require`` as a mapping names each method's kind (``"unary"`` / ``"stream"``), its codec
    (any codec name), or both as a pair: ``{"add": "unary", "rows": ("stream", "msgpack")}``.
    """

    def __init__(self, argv: Sequence[str], *, workers: int | None = None, codec: str = "json",
                 require: Iterable[str] | Mapping[str, str | tuple[str, str]] | None = None,
                 max_in_flight: int = _c.PARENT_DEFAULT_MAX_IN_FLIGHT,
                 startup_timeout: float = _c.PARENT_DEFAULT_STARTUP_TIMEOUT_MS / 1000,
                 heartbeat_ms: int = _c.PARENT_DEFAULT_HEARTBEAT_MS,
                 cancel_grace: float = _c.PARENT_DEFAULT_CANCEL_GRACE_MS / 1000,
                 deadline_grace: float = _c.PARENT_DEFAULT_DEADLINE_GRACE_MS / 1000,
                 max_requests: int | None = None,
                 max_rss_bytes: int | None = None, idle_timeout: float | None = None,
                 restart_backoff: float = _c.PARENT_DEFAULT_RESTART_BACKOFF_MS / 1000,
                 restart_backoff_max: float = _c.PARENT_DEFAULT_RESTART_BACKOFF_MAX_MS / 1000,
                 max_restarts: int = _c.PARENT_DEFAULT_MAX_RESTARTS,
                 restart_window: float = _c.PARENT_DEFAULT_RESTART_WINDOW_MS / 1000,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 initial_credit: int = _c.PARENT_DEFAULT_INITIAL_CREDIT,
                 max_message_size: int = _c.PARENT_DEFAULT_MAX_MESSAGE_SIZE,
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 on_event: EventCallback | None = None, worker_output: str = "log",
                 drain_grace: float = _c.PARENT_DEFAULT_DRAIN_GRACE_MS / 1000,
                 latency_histograms: bool = False,
                 launcher: Any = None, shm_lane: bool = True,
                 shm_threshold: int = SHM_THRESHOLD, retry: RetryPolicy | None = None,
                 busy_poll_us: int | None = None, goodbye_grace: float = _GOODBYE_GRACE,
                 stderr_tail_lines: int = _STDERR_TAIL_LINES) -> None:
        if workers is None:  # PROTOCOL.md 17: one worker per CPU this process may use
            workers = min(MAX_WORKERS, len(os.sched_getaffinity(0))
                          if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        if busy_poll_us is None:
            busy_poll_us = _busy_poll_from_env()
        # Every number checked at once, in one place (PROTOCOL.md 22.2): nothing is spawned yet.
        checked = _validate.pool_options(
            workers=workers, max_in_flight=max_in_flight, startup_timeout=startup_timeout,
            heartbeat_ms=heartbeat_ms, cancel_grace=cancel_grace, deadline_grace=deadline_grace,
            drain_grace=drain_grace, goodbye_grace=goodbye_grace,
            restart_backoff=restart_backoff, restart_backoff_max=restart_backoff_max,
            max_restarts=max_restarts, restart_window=restart_window,
            stderr_tail_lines=stderr_tail_lines, max_frame_size=max_frame_size,
            initial_credit=initial_credit, max_message_size=max_message_size,
            max_requests=max_requests, max_rss_bytes=max_rss_bytes, idle_timeout=idle_timeout,
            shm_threshold=shm_threshold, busy_poll_us=busy_poll_us)
        self.argv = _validate.argv(argv)
        self.codec = _validate.codec(codec)
        if worker_output not in _WORKER_OUTPUTS:
            raise _validate.invalid("worker_output", f"one of {', '.join(_WORKER_OUTPUTS)}",
                                    worker_output)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise _validate.invalid("retry", "a wirepool.RetryPolicy or None", retry,
                                    InvalidArgumentType)
        self.worker_output = worker_output
        # method -> (kind or None for either, codec the method must accept)
        self.require: dict[str, tuple[int | None, _codecs.Codec]] = {}
        if isinstance(require, Mapping):
            for name, spec in require.items():
                self.require[name] = self._required(name, spec)
        else:
            self.require = {name: (None, self.codec) for name in (require or ())}
        self.size: int = checked["workers"]
        self.max_in_flight: int = checked["max_in_flight"]
        self.startup_timeout: float = checked["startup_timeout"]
        self.heartbeat_ms: int = checked["heartbeat_ms"]
        self.cancel_grace: float = checked["cancel_grace"]
        self.deadline_grace: float = checked["deadline_grace"]
        self.goodbye_grace: float = checked["goodbye_grace"]
        self.stderr_tail_lines: int = checked["stderr_tail_lines"]
        self.max_requests: int | None = checked["max_requests"]
        self.max_rss_bytes: int | None = checked["max_rss_bytes"]
        self.idle_timeout: float | None = checked["idle_timeout"]
        self.restart_backoff: float = checked["restart_backoff"]
        self.restart_backoff_max: float = checked["restart_backoff_max"]
        self.max_restarts: int = checked["max_restarts"]
        self.restart_window: float = checked["restart_window"]
        self.max_frame_size: int = checked["max_frame_size"]
        self.initial_credit: int = checked["initial_credit"]
        self.max_message_size: int = checked["max_message_size"]
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.on_event = on_event
        self.drain_grace = drain_grace
        # Where workers run (wirepool.launchers): None spawns local children (PROTOCOL.md 1);
        # a launcher's workers connect back with a ticket (21).
        self.launcher = launcher
        # The shm lane for local workers that offer it, where the platform has memfd.
        self.shm_lane = shm_lane and launcher is None and _shm.AVAILABLE
        self.shm_threshold: int = checked["shm_threshold"]
        self.retry = retry
        self.busy_poll_s = checked["busy_poll_us"] / 1e6
        # Off by default: ~2,000 instructions a request (a tenth of a small Pool.map call);
        # wirepool.prometheus turns it on when it collects the pool.
        self.latency_histograms = latency_histograms
        # Called as each request starts and ends (wirepool.otel.instrument sets them).
        self.request_hooks: RequestHooks | None = None
        self._clamp_logged = False  # said once per pool that a worker's offer lowered max_in_flight
        self.workers: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._closed = False
        self._started = False
        self._death_times: collections.deque[float] = collections.deque()
        self._backoff = restart_backoff
        self._gave_up: str | None = None  # why the pool stopped restarting, once it has
        # Callers waiting for a free slot (one future each, woken one per freed slot: no herd)
        # and lease callers waiting for an idle worker (woken together).
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._rr = 0
        self._counters: collections.Counter[str] = collections.Counter()
        # Set by the blocking Pool: idle workers are parked for callers that read their own
        # answers (_Worker.direct).
        self.direct_calls = False
        # Direct-call counts of workers no longer in _all.
        self._direct_gone: collections.Counter[str] = collections.Counter()
        self._latency_gone: dict[str, LatencyHistogram] = {}
        # Replacements by why the worker died: crashed, hung, protocol_violation,
        # cancel_timeout, start_failed (spec/metrics.json labels.cause); and by slot.
        self._restart_causes: collections.Counter[str] = collections.Counter()
        self._slot_restarts: list[collections.Counter[str]] = [
            collections.Counter() for _ in range(self.size)]
        # Recycles by limit (requests, rss, idle) and failed requests by error code name.
        self._recycle_reasons: collections.Counter[str] = collections.Counter()
        self._errors_by_code: collections.Counter[str] = collections.Counter()
        # Per slot, the counts of its workers no longer in _all (requests, rows, bytes sent,
        # bytes received, streams): a slot's counters go on across its replacements.
        self._slot_gone: list[list[int]] = [[0, 0, 0, 0, 0] for _ in range(self.size)]
        # Waits for a worker with room (only the calls and streams that waited: the others
        # waited 0, counted from the calls and streams sent when a snapshot is taken).
        self._queue_wait = LatencyHistogram()
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        # Maps with results from the read being handled: settled (refilled) when it ends.
        self._reading = False
        self._read_at = 0.0  # the clock at the start of the read in progress
        self._after_read: list[_MapRun] = []

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> "AsyncPool":
        """Spawn every worker and complete their handshakes; raises the first start-up error."""
        if self._started:
            return self
        self._started = True
        self.loop = asyncio.get_running_loop()
        if self.launcher is not None:
            await self.launcher.open(self)
        results = await asyncio.gather(*(self._spawn(slot) for slot in range(self.size)),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close(grace=0)
            raise errors[0]
        return self

    async def __aenter__(self) -> "AsyncPool":
        return await self.start()

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        # Left by an exception (Ctrl-C included): no one will read the work in flight, so it
        # is cancelled at once instead of being given the drain grace.
        await self.close(grace=0 if exc_type is not None else None)

    async def _spawn(self, slot: int) -> _Worker:
        w = _Worker(self, slot)
        self._all.add(w)
        try:
            await w.start()
            if not w.alive:  # died between its HELLO and now: a failed start, not a worker
                raise w.failure or WorkerExited(
                    ErrorCode.WORKER_EXITED, f"worker pid {w.pid} died right after its HELLO")
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                w.kill(None)  # the start itself was given up (Ctrl-C): no grace to wait out
            await asyncio.shield(w.reap())
            self._all.discard(w)
            raise
        if self._closed:
            w.drain(0)
            return w
        self.workers.append(w)
        self._counters["spawned"] += 1
        self._capacity_changed()
        return w

    def _required(self, name: str, spec: str | tuple[str, str]) -> tuple[int | None, _codecs.Codec]:
        """One ``require`` entry: a kind, a codec name, or a (kind, codec) pair."""
        kind: int | None = None
        codec = self.codec
        for part in ((spec,) if isinstance(spec, str) else tuple(spec)):
            if part == "unary":
                kind = MethodKind.UNARY
            elif part == "stream":
                kind = MethodKind.STREAM
            elif part in _codecs._NAMES:
                codec = _codecs.get(part)  # CodecUnavailable if its library is not installed
            else:
                raise _validate.invalid(f"require[{quote(name)}]", "'unary', 'stream' or a codec "
                                        f"name ({', '.join(_codecs._NAMES)})", part)
        return kind, codec

    def _check_methods(self, methods: Mapping[str, tuple[int, int, tuple[int, ...]]]) -> str | None:
        for name, (kind, codec) in self.require.items():
            info = methods.get(name)
            if info is None:
                return f"method {quote(name)} is missing"
            if kind is not None and info[1] != kind:
                return f"method {quote(name)} has the other kind"
            if codec.id not in info[2]:
                return f"method {quote(name)} does not accept codec {codec.name!r}"
        return None

    async def _kill_all(self) -> None:
        """Kill every worker process now and wait (bounded) until each is reaped."""
        workers = list(self._all)
        for w in workers:
            w.kill(None)
        exits = [w.exited for w in workers if not w.exited.done()]
        if exits:
            await asyncio.wait(exits, timeout=2.0)
        await asyncio.sleep(0)  # their _forget_after_exit tasks finish

    async def close(self, grace: float | None = None) -> None:
        """Drain: no new requests; in-flight ones get ``grace`` seconds (default
        ``drain_grace``) to finish (then the workers cancel them), workers say GOODBYE and
        exit; stragglers are killed."""
        grace = self.drain_grace if grace is None else grace
        if self._closed and not self._all:
            return
        self._closed = True
        self._capacity_changed()
        workers = list(self._all)
        for w in workers:
            w.drain(int(grace * 1000))
        if workers:
            done, pending = await asyncio.wait([asyncio.ensure_future(w.exited) for w in workers],
                                               timeout=grace + 2.0)
            for w in workers:
                if not w.exited.done():
                    w.kill(WorkerExited(ErrorCode.WORKER_EXITED, "killed at pool shutdown"))
            await asyncio.wait([asyncio.ensure_future(w.exited) for w in workers], timeout=5.0)
            tasks: list[asyncio.Task] = []
            for w in workers:
                w._fail_all()
                tasks.extend(t for t in w._tasks if not t.done())
                if w.heartbeat_task is not None:
                    tasks.append(w.heartbeat_task)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._all.clear()
        self.workers.clear()
        if self.launcher is not None:
            await self.launcher.close()

    # -- dispatch -------------------------------------------------------------------------

    def _capacity_changed(self, slots: int | None = None) -> None:
        """Wake up to ``slots`` callers waiting for a worker (all of them if None)."""
        waiters = self._slot_waiters
        while waiters and (slots is None or slots > 0):
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                if slots is not None:
                    slots -= 1
        if self._idle_waiters:
            idle, self._idle_waiters = self._idle_waiters, []
            for fut in idle:
                if not fut.done():
                    fut.set_result(None)

    def _alone(self, w: _Worker) -> bool:
        """No worker but ``w`` has a request in flight."""
        for x in self.workers:
            if x.requests and x is not w:
                return False
        return True

    def _pick(self) -> _Worker | None:
        """The least-loaded accepting worker with room under its negotiated max_in_flight,
        taken from the blocking callers if it was parked for them: a caller thread that
        claimed it after the scan would otherwise hold requests the core counts and
        ``requests`` does not, and the next burst on it ran into OVERLOADED (issue 24)."""
        while True:
            best = self._least_loaded()
            if best is None or best.direct == _LOOP or best.reclaim():
                return best
            # A blocking caller took it meanwhile: busy_with_caller() now leaves it out.

    def _least_loaded(self) -> _Worker | None:
        best = None
        best_load = None
        workers = self.workers
        n = len(workers)
        # Start the scan at a rotating index so ties spread over the workers.
        self._rr = start = (self._rr + 1) % n if n else 0
        for k in range(n):
            w = workers[(start + k) % n]
            if w.accepting and not w.leased and not (w.direct == _CALLER and w.busy_with_caller()):
                load = len(w.requests)
                if load < w.max_in_flight and (best_load is None or load < best_load):
                    best, best_load = w, load
        return best

    async def _acquire(self, queued: bool = True) -> _Worker:
        """The least-loaded accepting worker with room; waits (in FIFO order) while all are full.
        A wait is observed in the queue-wait histogram when ``queued`` (a call or a stream, not
        a lease)."""
        since = 0.0
        while True:
            broken = self._broken()
            if broken is not None:
                raise broken
            if not self._slot_waiters or self._slot_waiters[0].done():
                best = self._pick()
                if best is not None:
                    if since and queued:
                        self._queue_wait.observe(time.monotonic() - since)
                    return best
            if not since:
                since = time.monotonic()
            fut = self.loop.create_future()
            self._slot_waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._capacity_changed(1)  # pass the wake-up on
                raise
            best = self._pick()
            if best is not None:
                if queued:
                    self._queue_wait.observe(time.monotonic() - since)
                return best

    def _request_ended(self, w: _Worker, req: _Request) -> None:
        self._requests_ended(w, 1)

    def _requests_ended(self, w: _Worker, n: int) -> None:
        self._counters["completed"] += n
        if self._slot_waiters or self._idle_waiters:
            self._capacity_changed(n)
        if self.max_requests is not None and w.served >= self.max_requests:
            self._recycle(w, "requests", "served max_requests")

    def _check_recycle(self, w: _Worker) -> None:
        if w.retiring or not w.accepting:
            return
        if self.max_rss_bytes is not None:
            rss = w.rss_bytes()
            if rss is not None and rss > self.max_rss_bytes:
                self._recycle(w, "rss", f"RSS {rss} above max_rss_bytes")
                return
        # A worker that never served anything is not recycled for idling: replacing it with
        # an identical fresh process would only churn.
        if (self.idle_timeout is not None and w.served and not w.requests
                and time.monotonic() - w.last_busy > self.idle_timeout):
            self._recycle(w, "idle", "idle")

    def _recycle(self, w: _Worker, reason: str, why: str) -> None:
        """Replace ``w`` without failing a request: stop dispatching to it, start its
        replacement, and drain it (its in-flight requests finish first). ``reason`` is the
        limit (requests, rss, idle), ``why`` what the log says."""
        if w.retiring or self._closed:
            return
        log.info("recycling worker %d (pid %d): %s", w.worker_id, w.pid, why)
        w.retiring = True
        w.accepting = False
        self._counters["recycled"] += 1
        self._recycle_reasons[reason] += 1
        if w in self.workers:
            self.workers.remove(w)
        self.loop.create_task(self._replace(0.0, w.slot))
        w.drain(int(self.drain_grace * 1000))

    def _worker_lost(self, w: _Worker) -> None:
        """A serving worker is gone. Only a worker in ``workers`` (it completed its handshake and
        was not retired) is replaced here, once: a replacement that fails to start is retried by
        its own :meth:`_replace`, so a slot never has two replacements and a death counts once."""
        serving = w in self.workers
        if serving:
            self.workers.remove(w)
        self.loop.create_task(self._forget_after_exit(w))
        if not serving or self._closed or w.retiring:
            return
        label = "cancel_timeout" if w.cancel_timeout else _death_cause(w.failure)
        if label == "crashed" and w.proc is not None:
            # Crashed or left by itself (exit status 0): told by its exit status, which
            # _forget_after_exit waits for.
            label, w.label_at_exit = "", True
        if self._count_death(w.failure, w.slot, label):
            self.loop.create_task(self._replace(self._next_backoff(), w.slot))

    def _count_death(self, cause: BaseException | None, slot: int,
                     label: str | None = None) -> bool:
        """Counts one unexpected death in ``slot`` against the restart-intensity limit (under
        ``label``, else the cause's; ``""``: labelled later by :meth:`_count_cause`); False when
        the limit is exceeded and the pool stops restarting."""
        now = time.monotonic()
        deaths = self._death_times
        deaths.append(now)
        while deaths and now - deaths[0] > self.restart_window:
            deaths.popleft()
        if len(deaths) <= self.max_restarts:
            self._counters["restarts"] += 1
            if label is None:
                label = _death_cause(cause)
            if label:
                self._count_cause(slot, label)
            return True
        # PROTOCOL.md 17 (max_restarts): the program cannot stay up, so the pool closes (its
        # healthy workers drain) rather than fail every call with WORKER_EXITED for ever.
        self._gave_up = (f"restart intensity exceeded: {len(deaths)} worker deaths within "
                         f"{self.restart_window:g}s (max_restarts {self.max_restarts}); the pool "
                         f"closed" + (f"; the last: {cause}" if cause else ""))
        log.error("%s", self._gave_up)
        if not self._closed:
            self.loop.create_task(self.close())
        self._capacity_changed()
        return False

    def _count_cause(self, slot: int, label: str) -> None:
        """A replacement of ``slot``'s worker under ``label`` (spec/metrics.json labels.cause)."""
        self._restart_causes[label] += 1
        self._slot_restarts[slot][label] += 1

    def _broken(self) -> WirepoolError | None:
        """The error for a call once the pool is closed (by the user, or by its restart limit,
        with why): a fresh exception per call, so a caller retrying in a loop does not grow one
        traceback."""
        if self._gave_up is not None:
            return PoolClosed(ErrorCode.POOL_CLOSED, self._gave_up)
        if self._closed:
            return PoolClosed(ErrorCode.POOL_CLOSED, "the pool is closed")
        return None

    def _next_backoff(self) -> float:
        delay = self._backoff
        self._backoff = min(self._backoff * 2, self.restart_backoff_max)
        return delay

    async def _forget_after_exit(self, w: _Worker) -> None:
        with contextlib.suppress(Exception):
            await w.exited
        if w.label_at_exit:
            w.label_at_exit = False
            self._count_cause(w.slot, "left_by_itself" if w.exit_status == 0 else "crashed")
        await asyncio.sleep(0)
        if w in self._all:
            self._all.discard(w)
            self._direct_gone.update(calls=w.direct_calls, completed=w.direct_completed,
                                     errors=w.direct_errors)
            gone = self._slot_gone[w.slot]
            gone[0] += w.sent_requests + w.direct_calls
            gone[1] += w.rows_received
            gone[2] += w.bytes_sent
            gone[3] += w.bytes_received
            gone[4] += w.sent_streams
            for method, hist in w.latency.items():
                self._latency_gone.setdefault(method, LatencyHistogram()).merge(hist)
            w.forgotten = True

    async def _replace(self, delay: float, slot: int) -> None:
        """Fill ``slot``: spawn until a worker serves, each failed start counted as a death."""
        while True:
            if delay:
                await asyncio.sleep(delay)
            if self._closed:
                return
            try:
                w = await self._spawn(slot)
            except WirepoolError as e:
                log.error("could not start a replacement worker: %s", e)
                if self._closed or not self._count_death(e, slot):
                    return
                delay = self._next_backoff()
                continue
            break
        # Healthy long enough: reset the backoff.
        await asyncio.sleep(min(self.restart_window, 10.0))
        if w.alive:
            self._backoff = self.restart_backoff

    # -- calls ----------------------------------------------------------------------------

    def _try_submit(self, method: str, request: Any, codec: _codecs.Codec, timeout: float | None,
                    on_event: EventCallback | None) -> _Request | None:
        """Submit a unary call now if a worker has room and nobody waits ahead (on the loop);
        else None. Encoding errors propagate to the caller."""
        if self._closed or (self._slot_waiters and not self._slot_waiters[0].done()):
            return None
        w = self._pick()
        if w is None:
            return None
        try:
            body = codec.encode(request)
        except Exception as e:
            raise _encode_failed(codec, e) from None
        self._counters["calls"] += 1
        return w.submit(method, body, codec, timeout, on_event, MethodKind.UNARY)

    def _wait_for_slot(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the loop) once a slot may be free, in FIFO order with
        :meth:`_acquire`."""
        fut = self.loop.create_future()
        fut.add_done_callback(lambda f: callback())
        self._slot_waiters.append(fut)

    async def call(self, method: str, request: Any = None, *, codec: str | None = None,
                   timeout: float | None = None, on_event: EventCallback | None = None,
                   idempotent: bool | None = None) -> Any:
        """Call a unary method on the least-loaded worker; returns the decoded result.

        ``timeout`` (seconds) is sent to the worker as the request's budget and enforced here
        too. Cancelling the awaiting task sends CANCEL. ``idempotent`` overrides the pool's
        :class:`RetryPolicy` for this call (True: retried as a listed method would be).
        """
        timeout = _validate.timeout(timeout, method)
        if self.retry is not None or idempotent:
            attempts = self._attempts_for(method, idempotent)
            if attempts > 1:
                return await self._call_retrying(method, request, codec, on_event,
                                                 _Attempts(attempts, timeout))
        w = None
        if not self._closed and self._gave_up is None and not self._slot_waiters:
            w = self._pick()  # room now: no coroutine for the wait
        if w is None:
            w = await self._acquire()
        return await self._call_on(w, method, request, codec, timeout, on_event)

    def _codec_for(self, codec: Any) -> _codecs.Codec:
        """A call's codec: the pool's when None; InvalidArgument for an unknown one (22.2)."""
        return self.codec if codec is None else _validate.codec(codec)

    def _attempts_for(self, method: str, idempotent: bool | None) -> int:
        """How many tries a call of ``method`` gets (1: it is never sent again)."""
        policy = self.retry
        if policy is None:
            if idempotent:
                raise ValueError("idempotent=True needs the pool's retry policy "
                                 "(retry=wirepool.RetryPolicy(attempts=...))")
            return 1
        if idempotent or (idempotent is None and method in policy.methods):
            return policy.attempts
        return 1

    async def _acquire_within(self, tries: _Attempts) -> _Worker:
        """A worker for the next try, waited for no longer than the deadline's rest; past it,
        the last try's error is the outcome."""
        left = tries.left()
        if left is None:
            return await self._acquire()
        try:
            return await asyncio.wait_for(self._acquire(), left)
        except asyncio.TimeoutError:
            assert tries.last is not None
            raise tries.last from None

    async def _call_retrying(self, method: str, request: Any, codec: str | None,
                             on_event: EventCallback | None, tries: _Attempts) -> Any:
        """A call its pool's RetryPolicy covers (PROTOCOL.md 21.7): tried again, as a new
        request, while it ends with WORKER_EXITED or WORKER_HUNG and tries and time are left.
        The worker that failed it is gone from ``workers`` by then, so another one serves."""
        while True:
            try:
                if tries.last is None:
                    w = await self._acquire()
                else:
                    w = await self._acquire_within(tries)
                    self._counters["retries"] += 1
                return await self._call_on(w, method, request, codec, tries.budget(), on_event)
            except WirepoolError as e:
                if not tries.again(e):
                    tries.final(e)
                    raise

    async def _call_on(self, w: _Worker, method: str, request: Any, codec: str | None,
                       timeout: float | None, on_event: EventCallback | None) -> Any:
        c = self._codec_for(codec)
        try:
            body = c.encode(request)
        except Exception as e:
            raise _encode_failed(c, e) from None
        req = w.submit(method, body, c, timeout, on_event, MethodKind.UNARY)
        self._counters["calls"] += 1
        if (w.loop_poll is not None and req.outcome is None and len(w.requests) == 1
                and self._alone(w)):
            w.read_lone_answer(req)
        if req.outcome is not None:  # ended at once (an unknown method, a dead worker), or read
            if req.outcome[0]:
                return req.outcome[1]
            if isinstance(req.outcome[1], WirepoolError):
                self._counters["errors"] += 1
            raise req.outcome[1]
        try:
            return await req.future
        except asyncio.CancelledError:
            # Our task was cancelled (which cancelled req.future too): tell the worker.
            if req.id in w.requests:
                w.cancel(req)
            raise
        except WirepoolError:
            self._counters["errors"] += 1
            raise

    def map(self, method: str, requests: Iterable[Any], *, codec: str | None = None,
            timeout: float | None = None, window: int | None = None,
            ordered: bool = True, return_exceptions: bool = False) -> AsyncIterator[Any]:
        """Call ``method`` for each request, keeping up to ``window`` calls in flight (default:
        workers x max_in_flight); yields results in order (``ordered=False``: as they finish),
        like :meth:`Pool.map` (and, with ``return_exceptions=True``, a failed call's error as
        its value)::

            async for result in pool.map("add", ({"a": i, "b": i} for i in range(1000))):
                ...
        """
        timeout = _validate.timeout(timeout, method)
        limit = _map_window(window, self.size * self.max_in_flight)
        _validate.flag("ordered", ordered)
        _validate.flag("return_exceptions", return_exceptions)
        return self._map(method, requests, self._codec_for(codec), timeout, limit, ordered,
                         return_exceptions)

    async def _map(self, method: str, requests: Iterable[Any], c: _codecs.Codec,
                   timeout: float | None, limit: int, ordered: bool,
                   return_exceptions: bool) -> AsyncIterator[Any]:
        run = _MapRun(self, method, c, timeout, limit, ordered)
        items = iter(requests)
        results = run.results
        fed = yielded = 0
        exhausted = False
        try:
            while True:
                if not exhausted and fed - yielded < 2 * limit:
                    chunk = list(itertools.islice(items, limit))
                    exhausted = len(chunk) < limit
                    if chunk:
                        fed += len(chunk)
                        run.add(chunk)
                    continue
                if yielded == fed:
                    return
                if not results or results[0].outcome is None:
                    await run.wait_head_async()
                ok, value = results.popleft().outcome  # type: ignore[union-attr,misc]
                yielded += 1
                if run.stalled and run.read_some():
                    run.pump()
                if not ok and not return_exceptions:
                    raise value
                yield value
        finally:
            if yielded < fed:
                run.stop()

    def stream(self, method: str, request: Any = None, *, codec: str | None = None,
               timeout: float | None = None, on_event: EventCallback | None = None,
               idempotent: bool | None = None) -> Stream:
        """Start a streaming method; iterate the returned :class:`Stream` for decoded rows.
        ``idempotent`` overrides the pool's :class:`RetryPolicy` for this stream."""
        timeout = _validate.timeout(timeout, method)
        self._codec_for(codec)  # an unknown codec is refused here, not at the first read
        if self.retry is not None or idempotent:
            attempts = self._attempts_for(method, idempotent)
            if attempts > 1:
                return self._stream_retrying(method, request, codec, on_event,
                                             _Attempts(attempts, timeout))

        async def factory() -> _Request:
            w = await self._acquire()
            return self._submit_stream(w, method, request, codec, timeout, on_event)
        return Stream(self, factory)

    def _stream_retrying(self, method: str, request: Any, codec: str | None,
                         on_event: EventCallback | None, tries: _Attempts) -> Stream:
        """A stream its pool's RetryPolicy covers: :meth:`Stream.next_batch` asks the factory
        for a new request after a retryable end that came before any row."""
        async def factory() -> _Request:
            if tries.last is None:
                w = await self._acquire()
            else:
                w = await self._acquire_within(tries)
                self._counters["retries"] += 1
            return self._submit_stream(w, method, request, codec, tries.budget(), on_event)
        return Stream(self, factory, tries)

    def _stream_on(self, w: _Worker, method: str, request: Any, codec: str | None,
                   timeout: float | None, on_event: EventCallback | None) -> Stream:
        async def factory() -> _Request:
            return self._submit_stream(w, method, request, codec, timeout, on_event)
        return Stream(self, factory)

    def _submit_stream(self, w: _Worker, method: str, request: Any, codec: str | None,
                       timeout: float | None, on_event: EventCallback | None) -> _Request:
        c = self._codec_for(codec)
        try:
            body = c.encode(request)
        except Exception as e:
            raise _encode_failed(c, e) from None
        self._counters["streams"] += 1
        req = w.submit(method, body, c, timeout, on_event, MethodKind.STREAM)
        if req.id:  # sent (a refused one has no id)
            w.sent_streams += 1
        return req

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Lease]:
        """Reserve one worker for a sequence of calls (e.g. to keep state between them)."""
        while True:
            w = await self._acquire(queued=False)
            if not w.requests:
                break
            # Wait for an idle worker so the lease is truly exclusive.
            fut = self.loop.create_future()
            self._idle_waiters.append(fut)
            await fut
        w.leased = True
        lease = Lease(self, w)
        try:
            yield lease
        finally:
            lease.released = True
            w.leased = False
            self._capacity_changed()

    def metrics(self) -> PoolMetrics:
        """A snapshot of the pool's state and counters."""
        workers = []
        for w in list(self._all):
            workers.append({"worker_id": w.worker_id, "slot": w.slot, "pid": w.pid,
                            "host": getattr(w, "host", None), "alive": w.alive,
                            "accepting": w.accepting, "in_flight": len(w.requests),
                            "served": w.served, "leased": w.leased, "retiring": w.retiring,
                            "rss_bytes": w.rss_bytes() if w.alive else None,
                            "rows": w.rows_received, "bytes_received": w.bytes_received,
                            "bytes_sent": w.bytes_sent})
        m = PoolMetrics(self._counters)
        # Calls a blocking caller made itself count like the others.
        for key, attr in (("calls", "direct_calls"), ("completed", "direct_completed"),
                          ("errors", "direct_errors")):
            n = sum(getattr(w, attr) for w in self._all) + self._direct_gone[key]
            if n:
                m[key] = m.get(key, 0) + n
        m["workers"] = workers
        latency: dict[str, LatencyHistogram] = {}
        for source in [self._latency_gone] + [w.latency for w in self._all]:
            for method, hist in list(source.items()):
                latency.setdefault(method, LatencyHistogram()).merge(hist)
        m["methods"] = {method: h.snapshot() for method, h in sorted(latency.items())}
        m["restart_causes"] = dict(self._restart_causes)
        m["recycle_reasons"] = dict(self._recycle_reasons)
        m["errors_by_code"] = dict(self._errors_by_code)
        m["slots"] = self._slot_metrics()
        # Every call and stream sent waited: the ones that found room at once waited 0.
        queue = self._queue_wait.snapshot()
        sent = sum(s["requests"] for s in m["slots"])
        if sent > queue["count"]:
            zeros = sent - queue["count"]
            first = queue["buckets"][0][1] if queue["buckets"] else 0
            queue["buckets"][:1] = [(1e-6, first + zeros)]
            queue["count"] = sent
        m["queue_wait"] = queue
        m["alive"] = sum(1 for s in m["slots"] if s["state"] in ("ready", "leased", "draining"))
        m["size"] = self.size
        m["closed"] = self._closed
        return m

    def _slot_metrics(self) -> list[dict[str, Any]]:
        """One dict per slot (spec/metrics.json's per-worker series): its newest worker's
        state, pid, in flight, RSS and heartbeat round trip; its counters summed over every
        worker that held it."""
        newest: dict[int, _Worker] = {}
        sums = [list(gone) for gone in self._slot_gone]
        for w in list(self._all):
            n = sums[w.slot]
            n[0] += w.sent_requests + w.direct_calls
            n[1] += w.rows_received
            n[2] += w.bytes_sent
            n[3] += w.bytes_received
            n[4] += w.sent_streams
            if w.slot not in newest or w.worker_id > newest[w.slot].worker_id:
                newest[w.slot] = w
        out = []
        for slot in range(self.size):
            x = newest.get(slot)
            running = x is not None and x.alive
            out.append({
                "slot": slot, "state": _slot_state(x),
                "pid": x.pid if x is not None and running and x.pid else None,
                "in_flight": len(x.requests) if x is not None else 0,
                "requests": sums[slot][0], "rows": sums[slot][1], "bytes_sent": sums[slot][2],
                "bytes_received": sums[slot][3], "streams": sums[slot][4],
                "rss_bytes": x.rss_bytes() if x is not None and running else None,
                "heartbeat_rtt": x.heartbeat_rtt if x is not None and running else None,
                "restart_causes": dict(self._slot_restarts[slot])})
        return out


def _slot_state(w: _Worker | None) -> str:
    """A slot's state label (spec/metrics.json labels.state) from its newest worker."""
    if w is None or not w.alive:
        return "dead"
    if not w.ready.done():
        return "starting"
    if w.retiring or not w.accepting:  # recycled, or it said GOODBYE
        return "draining"
    return "leased" if w.leased else "ready"


def _death_cause(failure: BaseException | None) -> str:
    """The ``cause`` label of a replacement (the Rust pool's ExitCause names)."""
    if isinstance(failure, WorkerHung):
        return "hung"
    if isinstance(failure, ProtocolError) or (
            isinstance(failure, WirepoolError) and failure.code == ErrorCode.PROTOCOL_VIOLATION):
        return "protocol_violation"
    if isinstance(failure, (StartupTimeout, SpawnFailed)):
        return "start_failed"
    return "crashed"
