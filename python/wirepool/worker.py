"""The worker side: expose Python functions as wirepool methods.

::

    import wirepool

    @wirepool.method
    def add(req: dict) -> dict:
        return {"sum": req["a"] + req["b"]}

    @wirepool.stream
    def rows(req: dict, ctx: wirepool.Context):
        for i in range(req["n"]):
            if ctx.cancelled:
                break
            yield {"i": i}

    wirepool.serve()

Handlers may be plain functions (run in handler threads, at most the concurrency limit), coroutines,
generators or async generators. The I/O loop (asyncio) answers PING while handlers run, batches rows
into ROWS frames (flushed on size, every few milliseconds, and at the end) and honours stream
credit: a generator producing faster than the parent reads simply waits.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import inspect
import json
import operator
import os
import select
import selectors
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, Sized

from . import _constants as _c
from . import _shm
from . import codecs as _codecs
from . import proto
from ._methods import (Context, _Method, _registry, _returning, _returns_none_only, method,
                       registered_methods, stream)
from ._process import _die_with_parent, _take_fd
from ._shm_proto import ShmOffer
from ._transport import BusyPoll, LaneProtocol, LaneTransport, OwnRegion
from .errors import ErrorCode, ProtocolError, WorkerError
from .proto import FrameType, MethodKind

if TYPE_CHECKING:  # imported when a ticket is used: a local worker does not pay for TLS's imports
    from . import remote as _remote

__all__ = ["method", "stream", "serve", "Context", "registered_methods"]


SDK_NAME = "wirepool-python"
SDK_VERSION = "0.1.0"
ROWS_FLUSH_BYTES = _c.WORKER_DEFAULT_ROWS_BATCH_BYTES  # a ROWS frame is sent once this full (or max_frame_size)
ROWS_FLUSH_INTERVAL = _c.WORKER_DEFAULT_ROWS_FLUSH_INTERVAL_MS / 1000  # ... or, from a slow generator, within about this interval
MAX_BUILT_FRAMES = 2  # frames built and waiting for credit before a stream's producer waits
# ROWS frames are handed to the transport only while it holds at most this many unwritten bytes
# (and nothing waits in the backlog); the rest wait in their streams (MAX_BUILT_FRAMES each, their
# producers wait) until it drains to half of it. Without this, every stream's credit window
# (1 MiB each) queued ahead of anything else written: a terminal, e.g. a cancelled stream's
# ERROR, reached the parent after 16 busy streams' 12 MB of rows (3 s). With it, a terminal waits
# for at most this plus one frame, and the kernel's socket buffer.
ROWS_HANDED_AHEAD = 131_072
# A sync stream's producer thread, between its passes, waits for the loop to catch up (to have
# nothing ready: it is about to sleep in its selector), LOOP_GIVE_WAY_MAX at most, when the loop
# has not come back to its selector for LOOP_STALE (twice the flush timers' interval, which wake
# it while a stream runs): the loop is starved of the GIL. With 16 busy producer threads it held
# the GIL ~3% of the time and its passes came up to 1.5 s apart, so a CANCEL (CREDIT, PING) was
# read that late and a finished producer's outcome taken that late; the producers, which only
# produce what the loop sends, now give way to it.
LOOP_STALE = 2 * ROWS_FLUSH_INTERVAL
# ... and only once the producer has made this many passes without a turn of the loop (under
# valgrind, where time runs ~50 times slower, the loop's turns come on time in passes).
GIVE_WAY_PASSES = 8
LOOP_GIVE_WAY_MAX = 0.1  # seconds: the loop may be busy (an inline handler), not starved
# A sync generator's rows are taken and encoded by C iterators, at most this many per pass
# (fewer for larger rows: a pass holds about half a frame), so a row costs no bytecode of ours.
ROWS_PER_PASS = 256
EVENT_INTERVAL = _c.WORKER_DEFAULT_EVENT_INTERVAL_MS / 1000  # progress events are coalesced to at most one per topic per 10 ms
# Requests in flight per connection: a pipeline deep enough that small calls travel in bursts
# (64 per read and write; 16 cost ~30% of the small-call throughput). Threads for plain handlers
# start only as concurrent slow handlers need them, so the depth costs nothing when idle.
DEFAULT_MAX_CONCURRENCY = _c.WORKER_DEFAULT_MAX_CONCURRENCY
# The shared-memory lane (PROTOCOL.md 20.2's SDK defaults): the window offered for the parent's
# regions, and the result size from which a result travels through a region of this worker.
SHM_WINDOW = proto.DEFAULT_MAX_MESSAGE_SIZE
# How long an idle worker's loop polls its socket for the next request before it sleeps (see
# serve's ``busy_poll_us``): a parent making one call at a time sends the next within tens of
# microseconds, less than waking a sleeping process costs here (issue 17).
DEFAULT_BUSY_POLL_US = 50
SHM_THRESHOLD = 1 << 20
_NO_LANE = 1 << 62  # the threshold while the lane is off


class _Cancelled(Exception):
    pass


def _held(call: "_Call") -> int:
    """The row bytes (length fields included) in the stream's frame being filled: a producer
    counts them with the rows it queues next, so the frame being filled and the queue together
    stay within one frame's worth (the flow-control bound of the conformance slow_consumer
    scenario: two frames held by the worker SDK)."""
    b = call.building
    return b.size - 4 if b is not None else 0


class _Call:
    """One running request at the worker."""

    __slots__ = ("id", "method", "ctx", "task", "credit_changed", "rows", "pad", "timer",
                 "deadline_handle", "event_handle", "last_event", "frames",
                 "pack_lock", "space", "packs", "packs_seen", "pump_scheduled", "prefixes",
                 "slot", "bare", "stop", "building", "passes", "passes_seen", "turns_seen",
                 "unseen")

    def __init__(self, id: int, method: _Method, ctx: Context) -> None:
        self.id = id
        self.method = method
        self.ctx = ctx
        self.task: asyncio.Task | None = None
        self.credit_changed: asyncio.Event | None = None  # streams only
        # Streams: encoded rows not yet in a frame (a list: the producer only appends, the
        # packer, under pack_lock, deletes from the front), the frame being filled (the core's
        # builder: it adds the rows' length fields, and JSON padding, as it takes them), then
        # full ROWS frames waiting for credit to be finished and sent (at most
        # MAX_BUILT_FRAMES before the producer waits on ``space``).
        self.rows: list[bytes] | None = None
        self.building: proto.RowsBuilder | None = None
        # A sync producer's pass limit (see _produce_sync): a list of Nones, one taken per row;
        # emptied to end a pass at the next row (a cancellation, the flush timer).
        self.stop: list[None] | None = None
        self.passes = 0  # a sync producer's passes so far (the flush timer ends a long one)
        self.passes_seen = 0
        self.turns_seen = 0  # the loop's turns (_LoopSelector.turns) at the producer's last look
        self.unseen = 0  # the producer's passes since the loop's last turn
        self.frames: collections.deque[proto.RowsBuilder] | None = None
        self.pack_lock: threading.Lock | None = None
        self.space: threading.Event | None = None
        self.packs = 0  # frames filled so far (the flush timer leaves an active producer alone)
        self.packs_seen = 0
        self.pump_scheduled = False
        self.pad = ctx.codec.id == proto.CodecId.JSON  # rows may be padded with spaces
        self.bare = ctx.codec.id == proto.CodecId.RAW  # raw rows: queued without length fields
        # a row's length field (and padding) by its length: the core's table, or the stream's
        # own padded copy
        self.prefixes: Sequence[bytes] = _PREFIXES
        self.slot = 0  # JSON rows of nearly this size are padded to it (0: none)
        self.timer: asyncio.TimerHandle | None = None
        self.deadline_handle: asyncio.TimerHandle | None = None
        self.event_handle: asyncio.Handle | None = None
        self.last_event = 0.0


class _HandlerThreads:
    """The threads that run plain (sync) unary handlers.

    Requests are queued in a deque and a thread, once awake, takes one after another until the
    queue is empty: a read's worth of microsecond handlers costs one thread wake-up, not one
    per request (a ThreadPoolExecutor wakes a thread and makes a Future for each). So that a
    slow handler does not hold up the requests queued behind it, the loop checks every
    ``_STRAGGLER_CHECK`` seconds while requests wait: when no thread took a request since the
    previous check, it wakes one more thread for each waiting request (up to ``size``). New
    requests wake a thread when every awake one is running a handler; a request queued behind
    slow handlers in the same read starts within about two checks (~2 ms).
    """

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop,
                 done: Callable[[list[Any]], None]) -> None:
        self.size = size
        self.loop = loop
        self.done = done
        self.jobs: collections.deque[tuple[_Call, Any, tuple, Any]] = collections.deque()
        self.cond = threading.Condition(threading.Lock())
        self.threads = 0
        self.idle = 0
        self.taken = 0  # jobs taken by threads so far (read by the loop's check)
        # busy[i]: thread i runs a handler (each flag written by its thread only).
        self.busy = [False] * size
        self.check: asyncio.TimerHandle | None = None
        self.closed = False

    def submit(self, jobs: list[tuple[_Call, Any, tuple, Any]]) -> None:
        """On the loop: queue ``(call, fn, args, encode)`` jobs; wake a thread if none is up."""
        self.jobs.extend(jobs)
        self._wake(1)
        if self.check is None:
            self.check = self.loop.call_later(_STRAGGLER_CHECK, self._check, self.taken)

    def _wake(self, n: int) -> None:
        """Make sure ``n`` threads are awake and not held by a handler (as far as possible)."""
        with self.cond:
            free = self.threads - self.idle - sum(self.busy)
            if free >= n:
                return
            n -= max(free, 0)
            if self.idle:
                k = min(n, self.idle)
                self.cond.notify(k)
                n -= k
            start = []
            while n > 0 and self.threads < self.size:
                start.append(self.threads)
                self.threads += 1
                n -= 1
        for i in start:
            threading.Thread(target=self._run, args=(i,), name="wirepool-handler",
                             daemon=True).start()

    def _check(self, taken_before: int) -> None:
        self.check = None
        waiting = len(self.jobs)
        if not waiting or self.closed:
            return
        if self.taken == taken_before:
            # Requests wait and no thread took one since the last check: every awake thread
            # is held by a slow handler.
            self._wake(waiting)
        self.check = self.loop.call_later(_STRAGGLER_CHECK, self._check, self.taken)

    def _run(self, index: int) -> None:
        jobs = self.jobs
        done = self.done
        busy = self.busy
        while True:
            try:
                call, fn, args, encode = jobs.popleft()
            except IndexError:
                with self.cond:
                    if jobs:
                        continue
                    if self.closed:
                        self.threads -= 1
                        return
                    self.idle += 1
                    self.cond.wait()
                    self.idle -= 1
                continue
            self.taken += 1
            busy[index] = True
            try:
                outcome: list[Any] = [call, None, encode(fn(*args))]
            except BaseException as e:  # noqa: B036 - it becomes this request's terminal
                outcome = [call, e, None]
            busy[index] = False
            # The body and the result may be views of the parent's memory (PROTOCOL.md 20.4):
            # once handed over, only the loop holds them (it empties ``outcome``), so their
            # release goes with the result instead of waiting for this thread's next job.
            del call, fn, args, encode
            done(outcome)

    def close(self) -> None:
        self.closed = True
        if self.check is not None:
            self.check.cancel()
        with self.cond:
            self.cond.notify_all()


_STRAGGLER_CHECK = 0.001


class _Runtime(LaneProtocol):
    def __init__(self, methods: list[_Method], max_concurrency: int, max_frame_size: int,
                 loop: asyncio.AbstractEventLoop, shm_window: int | None = None) -> None:
        super().__init__(proto.Connection("worker"), loop)
        self.methods = methods
        self.loop = loop
        self.hello = proto.Hello(pid=os.getpid(), max_concurrency=max_concurrency,
                                 max_frame_size=max_frame_size, sdk_name=SDK_NAME,
                                 sdk_version=SDK_VERSION, methods=[m.info() for m in methods],
                                 extensions=b"" if shm_window is None
                                 else ShmOffer(shm_window).encode())
        # The shm lane (PROTOCOL.md 20.7): descriptors read and not yet taken by a SHM_REGION,
        # this worker's own regions (reused once the parent released them), the size from
        # which a result takes the lane (_NO_LANE until the WELCOME turns it on). The retire
        # timer exists only while a region does, so an idle worker without one arms nothing.
        self.shm_fds: collections.deque[int] = collections.deque()
        self.shm_regions: list[OwnRegion] = []
        self._retire_timer: asyncio.TimerHandle | None = None
        self.shm_threshold = _NO_LANE
        self._releases_scheduled = False
        if shm_window is not None:
            self.conn.set_shm_mapper(self._map_region)
            self.conn.set_shm_release_waker(self._releases_due)
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.handlers: _HandlerThreads | None = None
        self._jobs: list[tuple[_Call, Any, tuple, Any]] = []  # sync unary calls of this read
        self.calls: dict[int, _Call] = {}
        self.worker_id = 0
        self.done: asyncio.Future[int] = loop.create_future()
        self.watchdog: _remote.ParentWatchdog | None = None  # a remote worker's (21.5)
        self.lost: asyncio.Future[None] = loop.create_future()
        self.draining = False
        self.flush_bytes = ROWS_FLUSH_BYTES
        # Finished sync handlers, appended by handler threads (deque appends are atomic).
        self._done: collections.deque[list[Any]] = collections.deque()
        self._done_wakeup = False
        # method index -> {codec id: (fn, decode, encode)} for inline methods without a
        # Context (answered in _run_requests as they arrive), None for the others.
        self._inline: list[dict[int, tuple[Any, Any, Any]] | None] = [
            {cid: (m.fn, c.decode, c.encode) for cid, c in m.codecs.items()}
            if m.inline and not m.wants_ctx else None for m in methods]
        self._taken: list[Any] = []  # Connection.take_requests' output, reused
        self.closed = False  # end of input, or a fatal error: nothing more is sent
        # Streams with frames they may send (credit) that wait for the transport to drain
        # (ROWS_HANDED_AHEAD), in order: one entry per stream, so bounded by max_in_flight.
        self._rows_waiting: dict[int, _Call] = {}
        # The loop's selector, which tells producer threads when the loop last came back to it
        # and when it caught up (LOOP_STALE); None: producers never wait for the loop.
        self.beat: _LoopSelector | None = None

    def idle(self) -> bool:
        """No request in flight and the connection open (the loop may watch for the next)."""
        return not self.calls and not self.closed

    # -- transport ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # pause_writing above ROWS_HANDED_AHEAD, resume_writing (streams waiting: _pump) at half
        # of it; the backlog's feed (FrameProtocol) is resumed at the same point.
        self._limits_set = True
        transport.set_write_buffer_limits(  # type: ignore[attr-defined]
            high=ROWS_HANDED_AHEAD, low=ROWS_HANDED_AHEAD // 2)
        self._write(self.conn.send_hello(self.hello))

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        taken = self._taken
        try:
            if data:
                conn.receive(data)
            while True:
                # The single-frame requests of this read, taken in one tight loop by the core
                # and run here; the first other frame goes through next_event.
                all_taken = conn.take_requests(taken)
                if taken:
                    self._run_requests(taken)
                    taken.clear()
                if all_taken:
                    break
                ev = conn.next_event()
                if ev is None:
                    break
                self._on_event(ev)
                # A request whose body is a view of the parent's region (the lane) is let go
                # now, so the release of a body answered inline leaves with its result.
                ev = None
        except ProtocolError as e:
            self._fatal(e)
            return
        finally:
            if self._jobs:  # the sync handlers' requests of this read, handed over together
                jobs, self._jobs = self._jobs, []
                if self.handlers is not None:
                    self.handlers.submit(jobs)
        # The waker's flag, not a call into the core: this runs once per read.
        if self._releases_scheduled:
            self._out += conn.send_shm_releases()
        if self._out:
            # Everything answered while handling this read (inline handlers, PONGs) leaves in
            # one write now, not a loop pass later.
            self._flush_out()

    def resume_writing(self) -> None:
        super().resume_writing()  # the backlog first, in order
        waiting = self._rows_waiting
        if waiting and not self._backlog:
            calls = list(waiting.values())
            waiting.clear()
            for call in calls:  # in the order they waited; one that finds no room waits again
                self._pump(call)
                if call.credit_changed is not None:
                    call.credit_changed.set()  # an async producer or a stream's end waits

    def eof_received(self) -> bool:
        self.closed = True
        try:
            self.conn.end_of_input()
        except ProtocolError as e:
            self._fatal(e)
            return False
        self._stop(0)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._stop(0)
        if not self.lost.done():
            self.lost.set_result(None)

    def _fatal(self, e: ProtocolError) -> None:
        print(f"wirepool worker: protocol violation: {e}", file=sys.stderr)
        self.closed = True
        try:
            self._write(self.conn.send_fatal(e))
            self._flush_out()
        except Exception:  # best effort (e.g. after GOODBYE nothing can be sent)
            pass
        self._stop(1)

    def _stop(self, status: int) -> None:
        # The status first: closing a TLS transport below may call eof_received (and so
        # _stop(0)) at once, which lost the 1 of a refused join (issue 24).
        if not self.done.done():
            self.done.set_result(status)
        if self.watchdog is not None:
            self.watchdog.close()
        while self.shm_fds:  # received, never taken by a SHM_REGION
            os.close(self.shm_fds.popleft())
        if self._retire_timer is not None:
            self._retire_timer.cancel()
            self._retire_timer = None
        for call in list(self.calls.values()):
            self._cancel(call, ErrorCode.CANCELLED)
        if self.transport is not None:
            self._flush_out()
            self.transport.close()

    # -- the shared-memory lane (PROTOCOL.md 20) -----------------------------------------

    def fds_received(self, fds: list[int]) -> None:
        """The transport read descriptors (with the bytes it hands over next): queue them for
        the SHM_REGIONs they belong to; where the core refuses them, close them and fail."""
        self.shm_fds.extend(fds)
        try:
            self.conn.shm_descriptors_received(len(fds))
        except ProtocolError as e:
            self._fatal(e)

    def lane_failed(self, e: ProtocolError) -> None:
        """The transport's read broke a rule of 20.5 (more than 8 descriptors: MSG_CTRUNC)."""
        self._fatal(e)

    def _map_region(self, region: int, size: int) -> _shm.Region:
        """The core's mapper: the oldest descriptor, checked (seals, tmpfs, size) before any
        mapping; views of it are mapped one lent range at a time."""
        if not self.shm_fds:
            raise ProtocolError(ErrorCode.SHM_BAD_DESCRIPTOR,
                                f"no descriptor arrived with SHM_REGION {region}")
        return _shm.Region.map_received(self.shm_fds.popleft(), size)

    def _releases_due(self) -> None:
        # Any thread: the last view of a lent range was dropped (a handler thread, the GC).
        if self._releases_scheduled:
            return
        self._releases_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._send_releases)
        except RuntimeError:  # the loop is gone: the worker is exiting
            pass

    def _send_releases(self) -> None:
        self._releases_scheduled = False  # before taking them: a later drop schedules again
        parts = self.conn.send_shm_releases()
        if parts and self.transport is not None and not self.closed:
            self._write(parts)

    def _result_parts(self, id: int, body: Any) -> list[Any]:
        """Request ``id``'s RESULT: a large body through a region of this worker (copied into
        it once), else (or when no region can take it) over the socket."""
        if len(body) >= self.shm_threshold:
            placed = self._place(body)
            if placed is not None:
                return self.conn.send_result_shm(id, placed)
        return self.conn.send_result(id, body)

    def _lane_refused(self, n: int, e: Exception) -> None:
        print(f"wirepool worker: the shm lane cannot take {n} bytes: {e}", file=sys.stderr)

    def _retire_idle(self) -> None:
        """On the loop: regions with nothing lent that no body went into for IDLE_RETIRE are
        retired (20.4); the timer is armed again for the next region to come due, if any."""
        self._retire_timer = None
        lender = self.conn.shm_lender()
        if lender is None or self.closed or self.transport is None:
            return
        now = time.monotonic()
        try:
            for k in list(self.shm_regions):
                if lender.is_lent(k.id):
                    k.used = now  # a range the parent still holds: kept for the next body
                elif now - k.used >= _shm.IDLE_RETIRE:
                    self._retire(k)
        except ProtocolError:  # the connection can send nothing more (GOODBYE, a failure)
            return
        if self._out:
            self._flush_out()
        if self.shm_regions:
            due = min(k.used for k in self.shm_regions) + _shm.IDLE_RETIRE
            self._retire_timer = self.loop.call_later(max(0.0, due - now), self._retire_idle)

    # -- events ---------------------------------------------------------------------------

    def _on_event(self, ev: proto.Frame) -> None:
        t = ev.TYPE
        if t == FrameType.REQUEST:
            r: proto.Request = ev  # type: ignore[assignment]
            self._start(r.id, r.method, r.codec, r.timeout_us, r.body)
        elif t == FrameType.CREDIT:
            call = self.calls.get(ev.id)
            if call is not None and call.credit_changed is not None:
                if call.frames:
                    self._pump(call)
                call.credit_changed.set()
        elif t == FrameType.PING:
            if not self.conn.is_goodbye():  # a PING already on its way when GOODBYE left (8.4)
                self._write(self.conn.send_pong(ev.nonce))  # type: ignore[attr-defined]
        elif t == FrameType.CANCEL:
            call = self.calls.get(ev.id)
            if call is not None:
                self._cancel(call, ErrorCode.CANCELLED)
        elif isinstance(ev, proto.Reject):
            self._reject(ev)
        elif t == FrameType.WELCOME:
            w: proto.Welcome = ev  # type: ignore[assignment]
            self.worker_id = w.worker_id
            # The core's policy (PROTOCOL.md 14.5): a quarter of the window at most, so grants
            # arrive before the worker runs dry; within max_frame_size - 8, so a row too large
            # for any frame always reaches the producer's flush check.
            self.flush_bytes = proto.rows_batch_bytes(ROWS_FLUSH_BYTES, w.initial_credit,
                                                      w.max_frame_size)
            self.executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=w.max_in_flight, thread_name_prefix="wirepool-handler")
            self.handlers = _HandlerThreads(w.max_in_flight, self.loop, self._handler_done)
            lender = self.conn.shm_lender()
            if lender is not None and lender.can_announce(SHM_THRESHOLD):
                self.shm_threshold = SHM_THRESHOLD
            if self.watchdog is not None:
                self.watchdog.welcome(w.heartbeat_ms)
        elif t == FrameType.PONG:
            if self.watchdog is not None:
                self.watchdog.pong(ev.nonce)  # type: ignore[attr-defined]
        elif t == FrameType.DRAIN:
            self._drain(ev.grace_ms)  # type: ignore[attr-defined]
        elif t == FrameType.ERROR:  # id 0: the parent refused us or hit a fatal error
            print(f"wirepool worker: parent closed the connection: "
                  f"{ev.code} {ev.message}", file=sys.stderr)  # type: ignore[attr-defined]
            self._stop(1)
        # LATE needs nothing.

    def _drain(self, grace_ms: int) -> None:
        self.draining = True
        if grace_ms == 0:
            self._drain_expired()
        else:
            self.loop.call_later(grace_ms / 1000, self._drain_expired)
        self._maybe_goodbye()

    def _drain_expired(self) -> None:
        """The drain's grace is over: every request still in flight ends CANCELLED now (spec
        8.4), without waiting for handlers that ignore their flag; GOODBYE follows."""
        for call in list(self.calls.values()):
            self._cancel(call, ErrorCode.CANCELLED)
            self._end_cancelled(call)

    def _deadline_passed(self, call: _Call) -> None:
        """The request's budget ran out: it ends at once with the flag's code (spec 8.3:
        DEADLINE_EXCEEDED, or CANCELLED if a CANCEL came first), whether or not its handler
        notices; whatever the handler returns later is dropped."""
        call.deadline_handle = None
        self._cancel(call, ErrorCode.DEADLINE_EXCEEDED)
        self._end_cancelled(call)

    def _end_cancelled(self, call: _Call) -> None:
        code = call.ctx._cancel_code
        self._finish(call, proto.ErrorFrame(call.id, code or ErrorCode.CANCELLED,
                                            _cancel_message(code)))

    def _reject(self, ev: proto.Reject) -> None:
        self._write(self.conn.send_error(ev.id, ev.code, _REJECT_MESSAGES.get(ev.code, ev.name)))

    def _maybe_goodbye(self) -> None:
        if self.draining and not self.calls and not self.conn.is_goodbye() and not self.closed:
            self._write(self.conn.send_goodbye(0))
            self._flush_out()
            if self.transport is not None:
                self.transport.close()
            if not self.done.done():
                self.done.set_result(0)

    def _cancel(self, call: _Call, code: int) -> None:
        if call.ctx._cancel_code is not None:
            return
        call.ctx._cancel_code = code
        if call.stop is not None:
            call.stop.clear()  # a producer's pass ends before the generator's next row
        if call.credit_changed is not None:
            call.credit_changed.set()
        if call.space is not None:
            call.space.set()  # a producer waiting for space sees the cancellation
        m = call.method
        if (m.is_async or m.is_asyncgen) and call.task is not None:
            call.task.cancel()

    # -- running a request ----------------------------------------------------------------

    def _run_requests(self, taken: list[Any]) -> None:
        """The requests Connection.take_requests accepted (``(id, method, codec, timeout_us,
        body)``) and its REJECTs, in order. Inline handlers without a Context run here, at once,
        and their results leave as one batch (send_results); the others start as usual."""
        inline = self._inline
        done: list[Any] = []  # id, result, id, result, ...
        add = done.append
        for item in taken:
            if item.__class__ is not tuple:
                self._reject(item)
                continue
            id, index, codec_id, timeout_us, body = item
            entry = inline[index]
            if entry is None or timeout_us:
                self._start(id, index, codec_id, timeout_us, body)
                continue
            fn, decode, encode = entry[codec_id]
            try:
                arg = decode(body)
            except Exception:
                self._start(id, index, codec_id, timeout_us, body)  # answers BAD_REQUEST
                continue
            try:
                result = encode(fn(arg))
            except BaseException as e:  # noqa: B036 - it becomes this request's terminal
                self._inline_failed(id, index, codec_id, e)
                continue
            add(id)
            add(result)
        if not done:
            return
        threshold = self.shm_threshold
        if len(done) == 2:  # one request per read (a lone caller): less to set up
            id, result = done
            if len(result) >= threshold:
                self._inline_result(id, result)
                return
            try:
                self._out += self.conn.send_result(id, result)
            except ProtocolError:  # e.g. a result above max_message_size
                self._inline_result(id, result)
            return
        ids, results = done[::2], done[1::2]
        if threshold != _NO_LANE and max(map(len, results)) >= threshold:
            # Results for the lane go one at a time (through a region), the others as a batch.
            lane = [i for i, r in enumerate(results) if len(r) >= threshold]
            for i in lane:
                self._inline_result(ids[i], results[i])
            for i in reversed(lane):
                del ids[i], results[i]
            if not ids:
                return
        try:
            self._out += self.conn.send_results(ids, results)
        except ProtocolError:  # e.g. a result above max_message_size: one at a time
            for id, result in zip(ids, results):
                self._inline_result(id, result)

    def _inline_call(self, id: int, index: int, codec_id: int) -> _Call:
        m = self.methods[index]
        call = _Call(id, m, Context(id, m.name, m.codecs[codec_id], None, self.worker_id,
                                    self._event_requested))
        self.calls[id] = call
        return call

    def _inline_failed(self, id: int, index: int, codec_id: int, e: BaseException) -> None:
        call = self._inline_call(id, index, codec_id)
        self._finish(call, self._terminal_for(call, e))

    def _inline_result(self, id: int, result: Any) -> None:
        """An inline handler's result: the RESULT, or the ERROR the core's refusal calls for."""
        try:
            parts = self._result_parts(id, result)
        except ProtocolError as e:
            self._write(self._refused_terminal(id, e))
            return
        self._write(parts)

    def _start(self, id: int, index: int, codec_id: int, timeout_us: int, body: Any) -> None:
        m = self.methods[index]
        codec = m.codecs[codec_id]
        if m.inline and not m.wants_ctx and not timeout_us:
            # The hot path for microsecond handlers: no Context, no bookkeeping, the RESULT
            # queued at once (data_received writes every answer of one read together).
            try:
                arg = codec.decode(body)
            except Exception:
                pass  # the full path below decodes again and answers BAD_REQUEST
            else:
                try:
                    result = codec.encode(m.fn(arg))
                except BaseException as e:  # noqa: B036 - it becomes this request's terminal
                    self._inline_failed(id, index, codec_id, e)
                    return
                self._inline_result(id, result)
                return
        deadline = None
        if timeout_us:
            deadline = time.monotonic() + timeout_us / 1e6
        ctx = Context(id, m.name, codec, deadline, self.worker_id, self._event_requested)
        call = _Call(id, m, ctx)
        self.calls[id] = call
        if timeout_us:
            call.deadline_handle = self.loop.call_later(
                timeout_us / 1e6, self._deadline_passed, call)
        if m.kind == MethodKind.UNARY and not m.is_async:
            self._start_sync_unary(call, body)
        else:
            call.task = task = self.loop.create_task(self._run(call, body))
            task.add_done_callback(functools.partial(self._task_ended, call))

    def _task_ended(self, call: _Call, task: asyncio.Task) -> None:
        """A task cancelled before its first step never enters ``_run`` (a CANCEL in the same
        read as its REQUEST): its terminal is sent here. Otherwise ``_run`` already finished it
        and this does nothing."""
        if task.cancelled():
            self._finish(call, self._terminal_for(call, _Cancelled()))

    def _start_sync_unary(self, call: _Call, body: Any) -> None:
        """The common case without an asyncio Task: decode, hand to a thread, answer when the
        thread's future completes (fewer loop passes and allocations per request)."""
        ctx = call.ctx
        m = call.method
        try:
            arg = ctx.codec.decode(body)
        except Exception as e:
            self._finish(call, proto.ErrorFrame(
                call.id, ErrorCode.BAD_REQUEST,
                f"cannot decode the request body as {ctx.codec.name}: {e}"))
            return
        args = (arg, ctx) if m.wants_ctx else (arg,)
        if m.inline:
            try:
                body = ctx.codec.encode(m.fn(*args))
            except BaseException as e:  # noqa: B036 - it becomes this request's terminal
                body = e
            if ctx.deadline is not None and time.monotonic() >= ctx.deadline:
                # It ran on the loop, so the deadline timer could not fire meanwhile (spec 8.3).
                self._deadline_passed(call)
            elif isinstance(body, BaseException):
                self._finish(call, self._terminal_for(call, body))
            else:
                self._finish(call, proto.Result(call.id, body))
            return
        self._jobs.append((call, m.fn, args, ctx.codec.encode))  # submitted after this read

    def _handler_done(self, outcome: list[Any]) -> None:
        """In a handler thread: queue the outcome (``[call, exception or None, result]``, which
        the loop empties); only the first outcome since the loop last looked wakes it (one
        wake-up, and one write, for many results)."""
        self._done.append(outcome)
        if not self._done_wakeup:
            self._done_wakeup = True
            try:
                self.loop.call_soon_threadsafe(self._drain_done)
            except RuntimeError:  # the loop is gone: the worker is exiting
                pass

    def _drain_done(self) -> None:
        self._done_wakeup = False  # before popping: a later append wakes us again
        done = self._done
        calls = self.calls
        conn = self.conn
        out = self._out
        live = self.transport is not None and not self.closed
        while done:
            outcome = done.popleft()
            call, exc, body = outcome
            outcome.clear()
            if exc is not None:
                self._finish(call, self._terminal_for(call, exc))
            elif call.ctx._cancel_code is not None:
                self._finish(call, self._terminal_for(call, _Cancelled()))
            elif (live and call.deadline_handle is None and call.event_handle is None
                    and not call.ctx._events and calls.pop(call.id, None) is not None):
                # The common case, as _finish would do it: the RESULT, written below with the
                # others of this batch (or the ERROR the core's refusal calls for).
                try:
                    if len(body) < self.shm_threshold:
                        out += conn.send_result(call.id, body)
                    else:
                        parts = self._result_parts(call.id, body)
                        out = self._out  # placing a new region wrote what was queued
                        out += parts
                except ProtocolError as e:
                    out += self._refused_terminal(call.id, e)
            else:
                self._finish(call, proto.Result(call.id, body))
        # The request bodies and results just written are dropped now: when they were views
        # of the parent's regions, their releases leave with the results, so the parent has
        # its regions back for its next call.
        call = exc = body = None
        if self._releases_scheduled:
            self._out += conn.send_shm_releases()
            out = self._out
        if out:
            self._flush_out()
        if self.draining:
            self._maybe_goodbye()

    def _terminal_for(self, call: _Call, e: BaseException) -> proto.Frame:
        """The ERROR frame that ends ``call`` after its handler raised ``e``. A cancelled
        request ends with its flag's code whatever the handler raised (spec 8.3)."""
        if call.ctx._cancel_code is not None or isinstance(e, (asyncio.CancelledError,
                                                                _Cancelled)):
            code = call.ctx._cancel_code
            return proto.ErrorFrame(call.id, code or ErrorCode.CANCELLED, _cancel_message(code))
        if isinstance(e, WorkerError):
            if e.code >= 1000:
                return proto.ErrorFrame(call.id, e.code, e.message, _json_details(e.details))
            # Codes below 1000 belong to the protocol; an application must not forge them.
            return proto.ErrorFrame(call.id, ErrorCode.HANDLER_ERROR,
                                    f"WorkerError with reserved code {e.code}: {e.message}",
                                    _json_details(e.details))
        if isinstance(e, ProtocolError) and e.code == ErrorCode.ROW_TOO_LARGE:
            return proto.ErrorFrame(call.id, ErrorCode.ROW_TOO_LARGE, e.message)
        if isinstance(e, Exception):
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=20))
            return proto.ErrorFrame(call.id, ErrorCode.HANDLER_ERROR, f"{type(e).__name__}: {e}",
                                    _json_details({"type": type(e).__name__, "traceback": tb}))
        # SystemExit, KeyboardInterrupt raised inside a handler
        return proto.ErrorFrame(call.id, ErrorCode.HANDLER_PANIC, f"{type(e).__name__}: {e}")

    async def _run(self, call: _Call, body: Any) -> None:
        m = call.method
        ctx = call.ctx
        terminal: proto.Frame
        try:
            try:
                arg = ctx.codec.decode(body)
            except Exception as e:
                terminal = proto.ErrorFrame(call.id, ErrorCode.BAD_REQUEST,
                                            f"cannot decode the request body as {ctx.codec.name}: {e}")
            else:
                if m.kind == MethodKind.UNARY:
                    terminal = await self._run_unary(call, arg)
                else:
                    terminal = await self._run_stream(call, arg)
        except BaseException as e:  # noqa: B036 - every outcome becomes this request's terminal
            terminal = self._terminal_for(call, e)
        self._finish(call, terminal)

    def _finish(self, call: _Call, terminal: proto.Frame) -> None:
        if self.calls.pop(call.id, None) is None:
            return
        if self._rows_waiting:
            self._rows_waiting.pop(call.id, None)
        for h in (call.timer, call.deadline_handle, call.event_handle):
            if h is not None:
                h.cancel()
        if call.ctx._events:  # unlocked peek: the handler has finished adding events
            self._flush_events(call, force=True)
        if self.transport is not None and not self.closed:
            self._write(self._terminal_parts(call.id, terminal))
            if not self.calls:
                # Nothing else will finish in this loop pass: write now, not a pass later.
                self._flush_out()
        self._maybe_goodbye()

    def _terminal_parts(self, id: int, terminal: proto.Frame) -> list[Any]:
        """The frames of request ``id``'s terminal (END with the core's row count)."""
        conn = self.conn
        t = terminal.TYPE
        try:
            if t == FrameType.RESULT:
                return self._result_parts(id, terminal.body)  # type: ignore[attr-defined]
            if t == FrameType.END:
                return conn.send_end(id, terminal.summary)  # type: ignore[attr-defined]
            e: proto.ErrorFrame = terminal  # type: ignore[assignment]
            return conn.send_error(id, e.code, e.message, e.details)
        except ProtocolError as refused:
            return self._refused_terminal(id, refused)

    def _refused_terminal(self, id: int, e: ProtocolError) -> list[Any]:
        """The core refused a terminal: a result or summary above max_message_size ends the
        request HANDLER_ERROR (spec 8.1); any other refusal is a driver bug, reported as
        HANDLER_PANIC."""
        code = ErrorCode.HANDLER_ERROR if e.code == ErrorCode.MESSAGE_TOO_LARGE else \
            ErrorCode.HANDLER_PANIC
        try:
            return self.conn.send_error(id, code, e.message)
        except ProtocolError as again:
            print(f"wirepool worker: cannot end request {id}: {e}; {again}", file=sys.stderr)
            return []

    async def _run_unary(self, call: _Call, arg: Any) -> proto.Frame:
        m = call.method
        ctx = call.ctx
        args = (arg, ctx) if m.wants_ctx else (arg,)
        if m.is_async:
            body = ctx.codec.encode(await m.fn(*args))
        else:
            body = await self.loop.run_in_executor(self.executor, _call_and_encode, m.fn, args,
                                                   ctx.codec.encode)
        if ctx._cancel_code is not None:
            raise _Cancelled()
        return proto.Result(call.id, body)

    async def _run_stream(self, call: _Call, arg: Any) -> proto.Frame:
        m = call.method
        ctx = call.ctx
        args = (arg, ctx) if m.wants_ctx else (arg,)
        call.credit_changed = asyncio.Event()
        call.rows = []
        call.stop = []  # filled by a sync producer's first pass
        call.frames = collections.deque()
        call.pack_lock = threading.Lock()
        call.space = threading.Event()
        if call.pad:
            call.prefixes = list(_PREFIXES)  # this stream's own: _pack sets its padding
        call.timer = self.loop.call_later(ROWS_FLUSH_INTERVAL, self._tick, call)
        returned: Any = None
        if m.is_asyncgen or m.is_async:
            it = m.fn(*args)
            if m.is_async:
                it = await it
            if hasattr(it, "__aiter__"):
                encode = _row_encoder(ctx.codec)
                raw = call.bare
                append = call.rows.append
                frames = call.frames
                flush = self.flush_bytes
                nbytes = 0
                async for item in it:
                    if ctx._cancel_code is not None:
                        break
                    row = item if raw and type(item) is bytes else encode(item)
                    append(row)
                    nbytes += len(row) + 4
                    if nbytes >= flush:
                        # A row too large for a frame always gets here (flush_bytes is below
                        # the largest row): the core's builder refuses it ROW_TOO_LARGE.
                        self._pack(call, full_only=True)
                        nbytes = _held(call)
                        self._pump(call)
                        while len(frames) >= MAX_BUILT_FRAMES:
                            if not await self._wait_credit(call):
                                break
                            self._pump(call)
            else:
                returned = await self.loop.run_in_executor(self.executor, self._produce_sync, call,
                                                           it)
        else:
            returned = await self.loop.run_in_executor(self.executor, self._produce_sync, call,
                                                       m.fn, args)
        if ctx._cancel_code is not None:
            raise _Cancelled()
        # Every row produced (the generator has finished): send the rest, credit permitting.
        self._pack(call, full_only=False)
        while call.frames:
            self._pump(call)
            if call.frames and not await self._wait_credit(call):
                break
        if ctx._cancel_code is not None:
            raise _Cancelled()
        summary = ctx._summary if ctx._has_summary else returned
        body = b"" if summary is None else ctx.codec.encode(summary)
        return proto.End(call.id, 0, body)  # the core fills in the row count (send_end)

    def _produce_sync(self, call: _Call, fn: Any, args: tuple = ()) -> Any:
        """Runs in a handler thread: iterate the generator, encode its rows and build them into
        ROWS frames; the loop only writes the frames (as credit permits).

        This loop is the worker's row throughput, so no bytecode of ours runs per row: each
        pass takes up to ``len(call.stop)`` rows from the generator and encodes them with C
        iterators straight onto the stream's queue (``list.extend`` publishes each row as it
        is encoded, so the loop's flush timer sends what a slow generator has queued; the
        generator is resumed only after its last row is encoded, so it may reuse the object;
        an exception keeps the rows before it). Between passes: the cancellation flag, the
        bytes queued, and frames built by the core's builder in this thread (handing rows to
        the loop thread cost ~40% more). A pass is cut short at the next row by emptying
        ``call.stop``: a cancellation, or the flush timer when a pass runs longer than its
        interval (a generator that slows down, rows that grow), so the rows a pass holds stay
        bounded. With MAX_BUILT_FRAMES frames built and unsent (no credit), the thread waits:
        this is where a fast generator waits for a slow parent. Raw rows run a plain loop (a
        bytearray or memoryview is copied as it is yielded; other types are refused).
        """
        ctx = call.ctx
        it: Iterable[Any] = fn(*args) if args else fn
        flush = self.flush_bytes
        box: list[Any] = []
        if inspect.isgenerator(it) and not _returns_none_only(it.gi_code):
            iterator: Iterator[Any] = _returning(it, box)
        else:
            iterator = iter(it)
        try:
            if call.bare:
                encode = _row_encoder(ctx.codec)
                append = call.rows.append  # type: ignore[union-attr]
                nbytes = 0
                for row in iterator:
                    if ctx._cancel_code is not None:
                        break
                    if type(row) is not bytes:
                        row = encode(row)
                    append(row)  # the caller's own bytes: exact size, no copy needed
                    nbytes += len(row) + 4
                    if nbytes >= flush:
                        self._frame_produced(call)
                        nbytes = _held(call)
            else:
                self._produce_passes(call, iterator)
        except RuntimeError:
            if not self.loop.is_closed():
                raise
            # the worker is exiting: nothing will be sent
        finally:
            if ctx._cancel_code is not None:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
        return box[0] if box else None

    def _produce_passes(self, call: _Call, iterator: Iterator[Any]) -> None:
        """_produce_sync's passes over an encoded codec's rows."""
        ctx = call.ctx
        q = call.rows
        stop = call.stop
        assert q is not None and stop is not None
        each = ctx.codec.encode_each
        half = self.flush_bytes // 2
        want = 16  # the first pass, until a row size is known
        while True:
            if len(stop) != want:
                stop[:] = _NONES[:want]
                if ctx._cancel_code is not None:
                    return  # (a cancellation emptied the old list just before)
            taken = iter(stop)
            # The list first: the generator is resumed only while the pass has room.
            q.extend(each(map(_pick, taken, iterator)))  # type: ignore[arg-type]
            call.passes += 1
            if ctx._cancel_code is not None:
                return
            # Taken up to here only if the generator ended (a full or cut pass takes them all).
            ended = operator.length_hint(taken) > 0
            if q:
                # Into the frame being filled; a row too large for a frame is refused
                # ROW_TOO_LARGE by the core's builder.
                size = self._frame_produced(call, full_only=True)
                # (At least 2: a pass that took its only None cannot tell whether the
                # generator ended; with 2, the next pass takes one and finds out.)
                want = min(ROWS_PER_PASS, max(2, half // size)) if size else ROWS_PER_PASS
            if ended:
                return

    def _frame_produced(self, call: _Call, full_only: bool = True) -> int:
        """In the producer's thread: the queued rows into frames (full ones only, with
        ``full_only``); once one is full, have the loop send it, and wait while
        MAX_BUILT_FRAMES wait for credit. Returns the average size of the rows in the frame
        being filled (length fields included; 0 when it is empty). A row too large for any
        frame raises ROW_TOO_LARGE here (the core's builder)."""
        beat = self.beat
        if beat is not None:
            if beat.turns != call.turns_seen:
                call.turns_seen = beat.turns
                call.unseen = 0
            else:
                call.unseen += 1
                if call.unseen >= GIVE_WAY_PASSES and time.monotonic() - beat.seen > LOOP_STALE:
                    self._give_way(call, beat)
        packs = call.packs
        size = self._pack(call, full_only)
        if call.packs == packs:
            return size
        if not call.pump_scheduled:
            call.pump_scheduled = True
            self.loop.call_soon_threadsafe(self._pump, call)
        frames, space, ctx = call.frames, call.space, call.ctx
        assert frames is not None and space is not None
        while len(frames) >= MAX_BUILT_FRAMES and ctx._cancel_code is None:
            space.clear()
            if len(frames) >= MAX_BUILT_FRAMES and ctx._cancel_code is None:
                # woken by the loop once a frame is sent, or by a cancellation; the timeout
                # only guards against a loop that has gone away
                space.wait(1.0)
        return size

    @staticmethod
    def _give_way(call: _Call, beat: _LoopSelector) -> None:
        """In a producer's thread: the loop has not come back to its selector for LOOP_STALE
        (other threads hold the GIL); wait until it has caught up (LOOP_GIVE_WAY_MAX at most:
        it may be busy, not starved), so that it reads and writes before this thread produces
        more."""
        caught_up = beat.caught_up
        caught_up.clear()
        beat.waited = True
        if time.monotonic() - beat.seen > LOOP_STALE and call.ctx._cancel_code is None:
            caught_up.wait(LOOP_GIVE_WAY_MAX)

    async def _wait_credit(self, call: _Call) -> bool:
        """Wait for the parent's next CREDIT and room in the transport (or a cancellation);
        False if the stream is over."""
        event = call.credit_changed
        assert event is not None
        while call.ctx._cancel_code is None and call.id in self.calls:
            if self.conn.credit(call.id) > 0 and call.id not in self._rows_waiting:
                return True
            event.clear()
            await event.wait()
        return False

    def _pack(self, call: _Call, full_only: bool, blocking: bool = True) -> int:
        """Move queued rows into the frame being filled (the core's builder, which adds their
        length fields and JSON padding), and filled frames onto ``call.frames`` (any thread;
        ``call.packs`` counts them). ``full_only`` keeps a frame that is not full for more
        rows; else it goes too (the flush timer, the end of the stream). Returns the average
        row size of the frame kept (0: none).

        JSON rows padded to one size let a parent validate and slice the whole frame without a
        loop per row. A row too large for any frame raises ROW_TOO_LARGE in the producer
        (``blocking``); the loop's flush (not blocking) leaves it queued for the producer to
        find.
        """
        lock = call.pack_lock
        assert lock is not None
        if not lock.acquire(blocking):
            return 0
        try:
            q = call.rows
            frames = call.frames
            assert q is not None and frames is not None
            b = call.building
            if b is None:
                b = call.building = self.conn.rows(call.id, self.flush_bytes)
            target = b.target
            while True:
                if q:
                    try:
                        # The producer only appends at the end: q[:k] stays the first k rows.
                        k = b.extend(q, False, False, call.prefixes if call.pad else None)
                    except ProtocolError:
                        if blocking:
                            raise
                        return 0
                    del q[:k]
                if not b.count or (not q and b.size < target and full_only):
                    break
                if call.pad and b.widest != call.slot:
                    self._set_slot(call, b.widest)
                frames.append(b)
                call.packs += 1
                b = call.building = self.conn.rows(call.id, self.flush_bytes)
                if not q:
                    break
            return b.size // b.count if b.count else 0
        finally:
            lock.release()

    @staticmethod
    def _set_slot(call: _Call, slot: int) -> None:
        """Pad later JSON rows of nearly ``slot`` bytes to it (leading spaces: the same JSON
        value), so that rows of slightly varying size still make frames of one row size."""
        p = call.prefixes
        assert isinstance(p, list)
        cap = len(p)
        for n in range(min(call.slot, cap) - 1, -1, -1):  # the old slot's rows: unpadded again
            if p[n] is _PREFIXES[n]:
                break
            p[n] = _PREFIXES[n]
        if slot < cap:
            head = _PREFIXES[slot]
            for n in range(slot - 1, -1, -1):
                if slot - n > 16 + n // 8:
                    break
                p[n] = head + b" " * (slot - n)
        call.slot = slot

    def _pump(self, call: _Call) -> None:
        """Write the built frames the stream's credit allows, in order (on the loop)."""
        call.pump_scheduled = False
        frames = call.frames
        if not frames or call.id not in self.calls:
            return
        conn = self.conn
        id = call.id
        sent = False
        t = self.transport
        while frames and call.ctx._cancel_code is None and conn.can_send_rows(id):
            if t is None or self._backlog or t.get_write_buffer_size() > ROWS_HANDED_AHEAD:
                # Nothing more ahead of other frames (a terminal): resume_writing pumps it.
                # (The transport paused when it went above the bound, so that comes.)
                self._rows_waiting[id] = call
                break
            # Handed now, not at the end of the loop pass: the transport's size is then what
            # the next check (this stream's next frame, another stream's) needs.
            self._write_now(frames.popleft().finish())
            sent = True
        if sent:
            call.space.set()  # type: ignore[union-attr]

    def _tick(self, call: _Call) -> None:
        """Every few ms: send what a slow generator has queued, so its rows are not held back
        (a generator that filled a frame since the last tick is left to build its own)."""
        if call.id not in self.calls:
            return
        if ((call.rows or (call.building is not None and call.building.count))
                and call.ctx._cancel_code is None and call.packs == call.packs_seen):
            self._pack(call, full_only=False, blocking=False)
        call.packs_seen = call.packs
        if call.passes == call.passes_seen and call.stop:
            call.stop.clear()  # a pass longer than the interval ends at its next row
        call.passes_seen = call.passes
        if call.frames:
            self._pump(call)
        call.timer = self.loop.call_later(ROWS_FLUSH_INTERVAL, self._tick, call)

    # -- progress events ------------------------------------------------------------------

    def _event_requested(self, ctx: Context) -> None:
        # May run in a handler thread.
        try:
            self.loop.call_soon_threadsafe(self._schedule_events, ctx.id)
        except RuntimeError:  # loop closed: the worker is exiting
            pass

    def _schedule_events(self, id: int) -> None:
        call = self.calls.get(id)
        if call is None or call.event_handle is not None:
            return
        wait = call.last_event + EVENT_INTERVAL - time.monotonic()
        if wait <= 0:
            self._flush_events(call)
        else:
            call.event_handle = self.loop.call_later(wait, self._flush_events, call)

    def _flush_events(self, call: _Call, force: bool = False) -> None:
        call.event_handle = None
        events = call.ctx._take_events()
        if not events:
            return
        if self.transport is None or self.closed:
            return
        for topic, data in events.items():
            self._write(self.conn.send_event(call.id, topic[:255] or "progress", data))
        call.last_event = time.monotonic()


def _raw_row(item: Any) -> bytes:
    """A raw row as immutable bytes: a generator may reuse its bytearray for the next row."""
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, bytes):
        return item
    raise TypeError(f"the raw codec carries bytes-like objects, not {type(item).__name__}")


def _row_encoder(codec: _codecs.Codec) -> Callable[[Any], bytes]:
    """The function that turns a yielded item into its row (every other codec returns bytes)."""
    return _raw_row if codec.id == proto.CodecId.RAW else codec.encode  # type: ignore[return-value]


_u32_pack = proto._u32_pack
_PREFIXES = proto.ROW_PREFIXES  # a row's length field, by the row's length (up to 4 KiB)


_REJECT_MESSAGES: dict[int, str] = {
    ErrorCode.UNKNOWN_METHOD: "method index not in this worker's HELLO",
    ErrorCode.CODEC_UNSUPPORTED: "the method does not accept this codec",
    ErrorCode.OVERLOADED: "more requests in flight than max_in_flight",
    ErrorCode.DRAINING: "the worker is draining",
    ErrorCode.CANCELLED: "cancelled while the request was being sent",
}


def _cancel_message(code: int | None) -> str:
    if code == ErrorCode.DEADLINE_EXCEEDED:
        return "the request's time budget ran out"
    return "the request was cancelled"


_pick: Callable[[Any, Any], Any] = {}.get  # _pick(None, row) is row: map(_pick, pass_limit, rows) checks the limit first
_NONES: list[None] = [None] * ROWS_PER_PASS
def _call_and_encode(fn: Callable[..., Any], args: tuple, encode: Callable[[Any], Any]) -> Any:
    return encode(fn(*args))


def _json_details(details: Any) -> str:
    if details is None:
        return ""
    try:
        return json.dumps(details, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        return json.dumps({"repr": repr(details)})


async def _join(ticket: _remote.Ticket, runtime: _Runtime) -> bool:
    """Connect to the parent named by the ticket (PROTOCOL.md 21) and watch it: a parent that
    stops answering PINGs is gone, and the worker exits as after end of file (21.5)."""
    from . import remote as _remote

    def gone(why: str) -> None:
        print(f"wirepool worker: the parent is gone: {why}; exiting", file=sys.stderr)
        runtime._stop(0)

    # The welcome timeout runs from the TCP connect (21.5, 21.6), not from before it: a slow
    # connect has its own bound (connect_timeout).
    runtime.watchdog = _remote.ParentWatchdog(
        lambda nonce: runtime._write(runtime.conn.send_ping(nonce)), gone, start=False)
    try:
        await _remote.connect(ticket, runtime, on_connected=runtime.watchdog.connected)
    except _remote.JoinRefused as e:
        runtime.watchdog.close()
        print(f"wirepool worker: {e}", file=sys.stderr)
        return False
    return True


class _LoopSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The loop's selector, which notes when the loop last came to it (``seen``) and sets
    ``caught_up`` when the loop is about to sleep (nothing ready): stream producer threads give
    way to a loop starved of the GIL (LOOP_STALE)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = time.monotonic()
        self.turns = 0
        self.caught_up = threading.Event()
        self.waited = False  # a producer cleared caught_up since the loop last set it

    def select(self, timeout: float | None = None) -> list[Any]:
        self.seen = time.monotonic()
        self.turns += 1
        if self.waited and (timeout is None or timeout > 0):
            self.waited = False
            self.caught_up.set()
        return super().select(timeout)


class _BusyPollSelector(_LoopSelector):
    """The loop's selector, which first watches the parent's socket (:class:`BusyPoll`) before
    the loop sleeps, while ``idle()`` (no request in flight): the next request of a parent
    calling one at a time is then read without a wake-up. With ``read_now`` (the transport's
    read) and ``ready`` (the loop's queue of ready callbacks) set, it also answers here the
    requests that leave the worker idle again (inline handlers) while nothing else is ready:
    a loop pass per request (timers, the event list, the callback's handle) costs more than a
    small handler. The loop's timers are never late: the watch ends by the time the loop
    would have woken for them."""

    def __init__(self, fd: int, budget: float) -> None:
        super().__init__()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        self.poll = poller.poll
        self.busy_poll = BusyPoll(budget)
        self.idle: Callable[[], bool] = lambda: False
        self.read_now: Callable[[], None] | None = None
        self.ready: Sized | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        if (timeout is None or timeout > 0) and self.idle() and self._serve_while_idle(timeout):
            timeout = 0  # answered requests: back to the loop for whatever they scheduled
        return super().select(timeout)

    def _serve_while_idle(self, timeout: float | None) -> bool:
        """Watch the socket; read and answer what comes while the worker stays idle, nothing
        is ready on the loop and ``timeout`` has not passed. True when it read anything."""
        read, ready, idle, poll = self.read_now, self.ready, self.idle, self.poll
        clock = time.perf_counter
        # The loop's other descriptors (its self-pipe: threads, signals) are looked at again
        # within _SERVE_AT_MOST at the latest, however fast requests keep coming.
        end = clock() + (_SERVE_AT_MOST if timeout is None else min(timeout, _SERVE_AT_MOST))
        served = False
        while True:
            left = end - clock()
            if left <= 0:
                return served
            if not self.busy_poll.wait(poll, left) or read is None or ready is None:
                return served
            read()
            served = True
            if ready or not idle():
                return True


_SERVE_AT_MOST = 0.01  # seconds


def _run_loop(main: Any, selector: selectors.BaseSelector | None) -> int:
    """``asyncio.run(main)``, on a loop with ``selector`` when one is given."""
    if selector is None:
        return asyncio.run(main)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
            return runner.run(main)
    loop = asyncio.SelectorEventLoop(selector)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()


def serve(*, max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
          max_frame_size: int = _c.WORKER_DEFAULT_MAX_FRAME_SIZE, shm_lane: bool = True,
          busy_poll_us: int | None = None) -> None:
    """Serve the registered methods on the connection in ``WIREPOOL_FD`` until the parent drains,
    closes, or dies; then exit the process. Without ``WIREPOOL_FD``, join the remote parent
    named by the ticket in ``WIREPOOL_TICKET`` (or the file in ``WIREPOOL_TICKET_FILE``) over
    TLS (:mod:`wirepool.remote`): the same program runs locally or remotely.

    ``max_concurrency`` bounds the requests in flight (HELLO's ``max_concurrency``): handlers
    run at once, and the handler threads (started as slow handlers need them).

    The process exits with status 0 after GOODBYE or end of file, 1 after a protocol violation
    or the parent's ERROR (PROTOCOL.md 8.4), without waiting for handlers still running. A
    request's deadline ends it when it passes, even if its handler ignores it (8.3).

    ``shm_lane`` offers the shared-memory lane (PROTOCOL.md 20; Linux, local workers only):
    when the parent accepts it, a request body of 1 MiB or more arrives as a read-only
    ``memoryview`` of the parent's memory (zero-copy; holding it holds that memory, so copy
    what you keep), and a result of 1 MiB or more leaves through a region of this worker
    instead of the socket. ``WIREPOOL_SHM=0`` in the environment turns it off too.

    ``busy_poll_us``: while no request is in flight, the worker polls its socket this long for
    the next one before it sleeps (a local worker; 0 sleeps at once; default
    ``WIREPOOL_BUSY_POLL_US`` from the environment, else 50). A parent making one call at a
    time then reaches a worker that is awake, for that much CPU per call.
    """
    if busy_poll_us is None:
        busy_poll_us = int(os.environ.get("WIREPOOL_BUSY_POLL_US", DEFAULT_BUSY_POLL_US))
    if max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1")
    if busy_poll_us < 0:
        raise ValueError("busy_poll_us must be >= 0")
    ticket = None
    if "WIREPOOL_FD" not in os.environ:  # a remote worker joins with a ticket (PROTOCOL.md 21.2)
        from . import remote as _remote

        try:
            ticket = _remote.ticket_from_env()
        except _remote.TicketError as e:
            print(f"wirepool worker: {e}", file=sys.stderr)
            sys.exit(1)
    if ticket is None:
        fd = _take_fd()
        _die_with_parent()
    else:
        fd = -1
    methods = list(_registry.values())
    lane = (shm_lane and ticket is None and _shm.AVAILABLE
            and os.environ.get("WIREPOOL_SHM", "1") not in ("0", "off", "false"))
    selector = (_BusyPollSelector(fd, busy_poll_us / 1e6) if busy_poll_us and fd >= 0
                else _LoopSelector())
    status = _run_loop(_serve_async(fd, methods, max_concurrency, max_frame_size, ticket,
                                    SHM_WINDOW if lane else None, selector), selector)
    sys.stdout.flush()
    sys.stderr.flush()
    # Handler threads cannot be interrupted; do not let a stuck one keep the process alive.
    os._exit(status)


async def _serve_async(fd: int, methods: list[_Method], max_concurrency: int,
                       max_frame_size: int, ticket: _remote.Ticket | None = None,
                       shm_window: int | None = None,
                       selector: _LoopSelector | None = None) -> int:
    loop = asyncio.get_running_loop()
    if hasattr(asyncio, "eager_task_factory"):  # 3.12+: a handler starts in the same loop pass
        loop.set_task_factory(asyncio.eager_task_factory)
    runtime = _Runtime(methods, max_concurrency, max_frame_size, loop, shm_window)
    runtime.beat = selector
    if isinstance(selector, _BusyPollSelector):
        selector.idle = runtime.idle
        selector.ready = getattr(loop, "_ready", None)  # CPython's loops; else no serving there
    if ticket is not None:
        if not await _join(ticket, runtime):
            return 1
    else:
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        if shm_window is not None and sock.family == socket.AF_UNIX:
            transport = LaneTransport(loop, sock, runtime)  # recvmsg from the HELLO on (20.5)
            if isinstance(selector, _BusyPollSelector):
                selector.read_now = transport.read_now
        else:
            if shm_window is not None:  # not a Unix socket: no descriptors, no lane
                runtime.hello.extensions = b""
            await loop.create_unix_connection(lambda: runtime, sock=sock)
    status = await runtime.done
    try:  # let the transport write what is buffered (GOODBYE, a last ERROR) before exiting
        await asyncio.wait_for(asyncio.shield(runtime.lost), 2.0)
    except asyncio.TimeoutError:
        pass
    if runtime.executor is not None:
        runtime.executor.shutdown(wait=False, cancel_futures=True)
    if runtime.handlers is not None:
        runtime.handlers.close()
    return status
