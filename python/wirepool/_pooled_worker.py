"""One worker process of a pool, seen from its parent: the requests in flight on it
(:class:`_Request`) and its connection (:class:`_Worker`: spawn, handshake, frames in and out,
the direct-call hand-over, liveness, the shared-memory lane, its exit). :class:`AsyncPool`
(``pool.py``) owns the workers and routes requests to them.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Protocol

from . import _shm, _validate
from . import _constants as _c
from ._constants import HEARTBEAT_MISSES
from . import codecs as _codecs
from . import proto
from ._shm_proto import ShmAccept, ShmOffer, TAG_SHM, parse_extensions
from ._transport import BusyPoll, LaneProtocol, LaneTransport, OwnRegion, split_frames
from .errors import (DeadlineExceeded, ErrorCode, ProtocolError, SpawnFailed, StartupTimeout,
                     WirepoolError, WorkerExited, WorkerHung, error_from_code, error_from_wire,
                     quote)
from .proto import FrameType, MethodKind

if TYPE_CHECKING:
    from .pool import AsyncPool

# The shared-memory lane (PROTOCOL.md 20.2's SDK defaults): each direction's window, the body
# size from which a request takes the lane, and how long an unused region of ours is kept.
SHM_WINDOW = proto.DEFAULT_MAX_MESSAGE_SIZE
SHM_THRESHOLD = 1 << 20
SHM_IDLE_RETIRE = _shm.IDLE_RETIRE
_NO_LANE = 1 << 62  # the threshold while the lane is off

log = logging.getLogger("wirepool.pool")
worker_log = logging.getLogger("wirepool.worker")

EventCallback = Callable[[str, Any], None]


class RequestHooks(Protocol):
    """Told of every request a pool sends (``AsyncPool.request_hooks``): ``started`` returns a
    token (e.g. a tracing span) that ``ended`` gets back once, with the error if it failed.
    ``started`` runs in the caller's context (its task, or for ``Pool.call`` its thread), so
    context-based tracing links the request to the caller's span."""

    def started(self, method: str, kind: int, request_id: int, worker: Any) -> Any: ...

    def ended(self, token: Any, error: BaseException | None) -> None: ...

# PROTOCOL.md 17: 4 MiB, the parent's default in every SDK (a large frame holds the socket
# ahead of small requests for under a millisecond). Larger messages travel as MORE +
# CONTINUATION frames reassembled into one reused buffer: a 16 MiB echo ran at 0.87x of its
# rate with 16 MiB frames (1,865 vs 2,151 MiB/s medians, alternated), no longer a cliff.
DEFAULT_MAX_FRAME_SIZE = _c.PARENT_DEFAULT_MAX_FRAME_SIZE
# How long a lone caller polls the worker's socket for its answer before it sleeps (see
# AsyncPool's ``busy_poll_us``): about one round trip to an idle Python worker here. Waking a
# sleeping thread costs more than that wait on a 2-vCPU VM (issue 17).
DEFAULT_BUSY_POLL_US = 100
# Socket buffers that hold a whole 1 MiB message (the kernel caps them at net.core.wmem_max).
_SOCKET_BUFFER = 4 << 20
_STDERR_TAIL_LINES = _c.PARENT_DEFAULT_STDERR_TAIL_LINES
_LOG_LINE_MAX = 8192
_WORKER_OUTPUTS = ("log", "inherit", "discard")
# Who reads a worker's socket (direct calls, see _Worker.direct): the loop, nobody (parked: an
# idle worker a blocking caller may take), a blocking caller, or nobody ever again.
_LOOP, _PARKED, _CALLER, _DEAD = 0, 1, 2, 3
# A blocking caller that read its own answer waits this long for it before handing the reading
# back to the loop (which then runs heartbeats, deadlines and the rest as usual).
_DIRECT_WAIT_MS = 50
_UNARY = MethodKind.UNARY  # a module global: one lookup less per direct call
_GOODBYE_GRACE = _c.PARENT_DEFAULT_GOODBYE_GRACE_MS / 1000  # seconds a worker has to exit after GOODBYE or a fatal ERROR (spec 8.4)
# Start-up refusals raised with their own code; any other violation before HELLO is a
# PROTOCOL_VIOLATION like one after it.
_HANDSHAKE_CODES = frozenset({ErrorCode.BAD_MAGIC, ErrorCode.VERSION_MISMATCH,
                              ErrorCode.BAD_HANDSHAKE, ErrorCode.CODEC_MISMATCH})


# ---------------------------------------------------------------------------------------------
# Requests in flight
# ---------------------------------------------------------------------------------------------


_NO_FRAMES: collections.deque = collections.deque(maxlen=0)  # unary requests receive no ROWS


class LatencyHistogram:
    """Completed calls and streams of one method: ``buckets[k]`` counts the durations of fewer
    than 2**k microseconds and at least 2**(k-1) (so the upper bounds are 1 us, 2 us, 4 us ...
    and about 9 minutes at k = 29), ``sum`` their total in seconds. Powers of two make a
    request's bucket one ``bit_length``: recording costs a few hundred instructions, where a
    bisect over decimal bounds cost ~2,000 (measured with callgrind on Pool.map)."""

    __slots__ = ("sum", "buckets")

    def __init__(self) -> None:
        self.sum = 0.0
        self.buckets = [0] * 65  # int(us).bit_length() is at most 64

    def observe(self, seconds: float) -> None:
        self.buckets[int(seconds * 1e6).bit_length()] += 1
        self.sum += seconds

    def merge(self, other: "LatencyHistogram") -> None:
        self.sum += other.sum
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets)]

    def snapshot(self) -> dict[str, Any]:
        """``count``, ``sum`` (seconds) and ``buckets``: (upper bound in seconds, count in
        that bucket alone), up to the last non-empty one."""
        last = max((k for k, n in enumerate(self.buckets) if n), default=-1)
        return {"count": sum(self.buckets), "sum": self.sum,
                "buckets": [((1 << k) / 1e6, n) for k, n in enumerate(self.buckets[:last + 1])]}


class _Request:
    __slots__ = ("id", "worker", "kind", "codec", "_future", "frames", "waiter", "end", "error",
                 "deadline_handle", "cancel_handle", "on_event", "method", "abandoned",
                 "rows", "outcome", "sink", "started", "trace")

    def __init__(self, id: int, worker: "_Worker", kind: int, codec: _codecs.Codec, method: str,
                 on_event: EventCallback | None,
                 sink: "Callable[[_Request], None] | None" = None,
                 started: float = 0.0) -> None:
        self.id = id
        self.worker = worker
        self.kind = kind
        self.codec = codec
        self.method = method
        self.on_event = on_event
        # Created only for a caller that awaits it (AsyncPool.call): map and Pool.call read
        # ``outcome`` through ``sink`` instead, and an asyncio Future per call costs ~1 us.
        self._future: asyncio.Future[Any] | None = None
        # Streams: ROWS frames received and not yet read (bounded by credit).
        self.frames: collections.deque[proto.Rows] = (
            collections.deque() if kind == MethodKind.STREAM else _NO_FRAMES)
        self.waiter: asyncio.Future[None] | None = None
        self.end: proto.End | None = None
        self.error: BaseException | None = None
        self.deadline_handle: asyncio.TimerHandle | None = None
        self.cancel_handle: asyncio.TimerHandle | None = None
        self.abandoned = False  # the caller has its outcome already (deadline, cancel)
        self.rows = 0
        # (ok, value or exception) once finished: readable from any thread, unlike the future.
        self.outcome: tuple[bool, Any] | None = None
        self.sink = sink  # called once, when finished
        # For the method's latency histogram, when the pool records them (0.0 when it does
        # not; a burst of requests shares one clock read).
        self.started = started
        # (the pool's request_hooks, their token, e.g. an OpenTelemetry span), or None.
        self.trace: tuple[RequestHooks, Any] | None = None

    @property
    def future(self) -> asyncio.Future[Any]:
        """The outcome as an asyncio Future (unary result / stream end), made on first use."""
        fut = self._future
        if fut is None:
            fut = self._future = self.worker.pool.loop.create_future()
            outcome = self.outcome
            if outcome is not None:
                if outcome[0]:
                    fut.set_result(outcome[1])
                else:
                    fut.set_exception(outcome[1])
                    fut.exception()
        return fut

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _observe(self) -> None:
        """Into the method's latency histogram (one clock read per socket read serves every
        request the read ends)."""
        pool = self.worker.pool
        now = pool._read_at if pool._reading else time.monotonic()
        self.worker.observe(self.method, now - self.started)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Deliver the terminal outcome exactly once."""
        if self.deadline_handle is not None:
            self.deadline_handle.cancel()
        if self.cancel_handle is not None:
            self.cancel_handle.cancel()
        if self.outcome is not None:
            return
        fut = self._future
        if fut is not None and fut.done():  # its awaiting task was cancelled
            if self.trace is not None:
                (hooks, token), self.trace = self.trace, None
                hooks.ended(token, error_from_code(ErrorCode.CANCELLED, "the call was cancelled"))
            return
        if error is not None:
            self.error = error
            self.outcome = (False, error)
            if isinstance(error, WirepoolError):  # wirepool_errors_total{code}
                self.worker.pool._errors_by_code[error.name] += 1
            if fut is not None:
                fut.set_exception(error)
                fut.exception()  # mark retrieved: an abandoned request must not warn
        else:
            self.outcome = (True, result)
            if fut is not None:
                fut.set_result(result)
        if self.started:
            self._observe()
        if self.trace is not None:
            (hooks, token), self.trace = self.trace, None
            hooks.ended(token, error)
        if self.waiter is not None:
            self._wake()
        sink = self.sink
        if sink is not None:
            # Dropped once used: a sink refers to its caller's state (a blocking call's
            # _SyncCall refers back to this request), and that cycle would keep the outcome
            # (a 1 MiB payload...) alive until the cyclic GC ran.
            self.sink = None
            sink(self)


# ---------------------------------------------------------------------------------------------
# One worker process
# ---------------------------------------------------------------------------------------------


class _Worker(LaneProtocol):
    _ids = itertools.count(1)

    def __init__(self, pool: "AsyncPool", slot: int = 0) -> None:
        super().__init__(proto.Connection("parent"), pool.loop)
        self.pool = pool
        self.worker_id = next(self._ids)
        # Its place in the pool, 0 to size-1, taken over by its replacement (spec/metrics.json
        # labels.worker): the per-worker metrics count by slot across restarts.
        self.slot = slot
        self.proc: asyncio.subprocess.Process | None = None
        self.pid = 0
        self.requests: dict[int, _Request] = {}
        self.methods: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        self.ready: asyncio.Future[None] = pool.loop.create_future()
        self.exited: asyncio.Future[None] = pool.loop.create_future()
        self.alive = True  # false once it is dying or dead: nothing new is sent
        self.accepting = False  # true while the dispatcher may choose it
        self.leased = False
        self.retiring = False
        self.served = 0
        self.sent_requests = 0  # calls and streams sent to it (loop and blocking callers)
        self.sent_streams = 0  # the streams among them
        self.heartbeat_rtt: float | None = None  # seconds, of the last answered PING
        self.cancel_timeout = False  # killed for ignoring a CANCEL past the cancel grace
        self.forgotten = False  # the pool merged its counts into those of gone workers
        self.label_at_exit = False  # its restart's cause waits for its exit status
        self.last_busy = time.monotonic()
        # Direct calls (Pool.call on an idle worker): the loop stops reading an idle worker
        # ("parks" it) and a blocking caller then writes its request and reads the answer itself,
        # with no thread hop. Whoever reads (``direct``) alone touches ``conn`` and the socket;
        # changes of hands happen under ``direct_lock``. ``direct_fd`` is the caller's own dup
        # of the socket, so an abort on the loop never closes the descriptor under its feet.
        self.direct = _LOOP
        self.direct_lock = threading.Lock()
        self.direct_fd = -1
        self.direct_poll: Any = None
        # The loop's own poll of the socket, for a lone AsyncPool.call (busy_poll_us); None
        # when the transport is asyncio's (no lane, a remote worker): only ours reads on demand.
        self.loop_poll: Callable[[int], list[Any]] | None = None
        self.loop_busy_poll = BusyPoll(pool.busy_poll_s)
        self.direct_busy_poll = BusyPoll(pool.busy_poll_s)  # the blocking caller's, on direct_fd
        self.direct_calls = 0  # calls a blocking caller sent itself (counted in the metrics)
        self.direct_completed = 0  # ... and ended itself (the others ended on the loop)
        self.direct_errors = 0
        self.want_back = False
        # Metrics, written only by whoever holds the connection (the loop, or a direct caller).
        self.latency: dict[str, LatencyHistogram] = {}
        self.rows_received = 0  # (bytes sent and received: FrameProtocol counts them)  # the loop waits for a caller to give the connection back
        self.after_caller: list[Callable[[], None]] = []
        # Liveness (spec 8.5): the PINGs no PONG has answered yet, oldest first, as
        # (nonce, sent at); and since when an incomplete frame has been held (None: none is).
        self.pings: collections.deque[tuple[int, float]] = collections.deque()
        self.partial_since: float | None = None
        self.fatal_received = False  # it sent ERROR id 0: nothing more from it is read
        self.exit_grace: asyncio.TimerHandle | None = None
        self.max_in_flight = 1
        self.heartbeat_ms = pool.heartbeat_ms  # then the WELCOME's (proto.negotiate)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=pool.stderr_tail_lines)
        self.failure: WirepoolError | None = None  # why it died, for requests in flight
        self.exit_status: int | None = None
        self.exit_signal: int | None = None
        self._tasks: list[asyncio.Task] = []
        self.heartbeat_task: asyncio.Task | None = None
        # The shm lane (PROTOCOL.md 20.7): descriptors read and not yet taken by a SHM_REGION;
        # our own regions as [id, region, last lent at] (reused once the worker released
        # them, retired after SHM_IDLE_RETIRE unused); the body size from which a request
        # takes the lane (_NO_LANE until our WELCOME turned it on).
        self.shm_fds: collections.deque[int] = collections.deque()
        # The worker's regions we mapped (the core keeps them until SHM_RETIRE): their
        # descriptors are closed when the connection goes, whoever still holds this worker.
        self.shm_mapped: weakref.WeakSet[_shm.Region] = weakref.WeakSet()
        self.shm_regions: list[OwnRegion] = []
        self.shm_threshold = _NO_LANE
        self.direct_sock: socket.socket | None = None  # the direct caller's recvmsg (lane on)
        self._releases_scheduled = False
        self._retire_timer: asyncio.TimerHandle | None = None
        if pool.shm_lane:
            self.conn.set_shm_mapper(self._map_region)
            self.conn.set_shm_release_waker(self._releases_due)

    # -- start ----------------------------------------------------------------------------

    async def start(self) -> None:
        pool = self.pool
        loop = pool.loop
        if pool.launcher is not None:  # placed by its launcher, connects back (PROTOCOL.md 21)
            await pool.launcher.start_worker(self)
            return
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for s in (parent_sock, child_sock):  # room for whole frames in flight
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
            env = dict(os.environ if pool.env is None else pool.env)
            env["WIREPOOL_FD"] = str(child_sock.fileno())
            try:
                piped = None if pool.worker_output == "inherit" else subprocess.PIPE
                self.proc = await asyncio.create_subprocess_exec(
                    *pool.argv, stdin=subprocess.DEVNULL, stdout=piped,
                    stderr=piped, env=env, cwd=pool.cwd,
                    pass_fds=(child_sock.fileno(),), start_new_session=True)
            except OSError as e:
                raise SpawnFailed(ErrorCode.SPAWN_FAILED,
                                  f"cannot start {quote(pool.argv[0])}: {e.strerror or e}") from e
        finally:
            child_sock.close()  # the child has its copy; holding ours would hide its EOF
        self.pid = self.proc.pid
        self._tasks.append(loop.create_task(self._pump(self.proc.stdout, "stdout")))
        self._tasks.append(loop.create_task(self._pump(self.proc.stderr, "stderr")))
        self._tasks.append(loop.create_task(self._wait_exit()))
        parent_sock.setblocking(False)
        if pool.shm_lane:
            LaneTransport(loop, parent_sock, self)  # recvmsg: descriptors survive (20.5)
        else:
            await loop.create_unix_connection(lambda: self, sock=parent_sock)
        try:
            await asyncio.wait_for(asyncio.shield(self.ready), pool.startup_timeout)
        except asyncio.TimeoutError:
            err = StartupTimeout(ErrorCode.STARTUP_TIMEOUT,
                                 f"worker pid {self.pid} sent no valid HELLO within "
                                 f"{pool.startup_timeout}s" + self._tail_suffix())
            self.kill(err)
            raise err from None
        except WorkerExited:
            # It died or closed its connection before its HELLO (an import error, a bad
            # argv...): reap it, bounded (one that closed but lingers is killed), and say how,
            # with its stderr, which is usually the whole story.
            lingered = False
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), self.pool.goodbye_grace)
            except asyncio.TimeoutError:
                lingered = True
                self.kill(None)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.exited), 5.0)
            if self.exit_signal is not None:
                what = (f"closed its connection and did not exit, so was killed (signal "
                        f"{self.exit_signal})" if lingered
                        else f"was killed by signal {self.exit_signal}")
            elif self.exit_status is not None:
                what = f"exited with status {self.exit_status}"
            else:
                what = "closed its connection and could not be reaped"
            # Status 0 and silence: a program that ended without serving (issue 28).
            hint = (" (did the worker program call its SDK's serve, e.g. wirepool.serve()?)"
                    if self.exit_status == 0 and not self.stderr_tail else "")
            died = WorkerExited(ErrorCode.WORKER_EXITED,
                               f"worker pid {self.pid} {what} before its HELLO{hint}"
                               + self._tail_suffix())
            died.exit_status, died.signal = self.exit_status, self.exit_signal
            died.stderr_tail = "\n".join(self.stderr_tail)
            raise died from None
        except BaseException:
            self.kill(WorkerExited(ErrorCode.WORKER_EXITED, "start-up interrupted"))
            raise
        if self.heartbeat_ms:  # the WELCOME's (negotiate: never 0 on a remote connection)
            self.heartbeat_task = loop.create_task(self._heartbeat())

    def _tail_suffix(self) -> str:
        return ("; stderr tail:\n" + "\n".join(self.stderr_tail)) if self.stderr_tail else ""

    def _on_hello(self, hello: proto.Hello) -> None:
        pool = self.pool
        for m in hello.methods:
            self.methods[m.name] = (len(self.methods), m.kind, m.codecs)
        problem = pool._check_methods(self.methods)
        if problem is not None:
            self._refuse(ErrorCode.CODEC_MISMATCH, problem)
            return
        # The limits are the core's policy (PROTOCOL.md 14.5); only the log and the extensions
        # are the driver's.
        welcome, clamped = proto.negotiate(hello, proto.Offer(
            max_frame_size=pool.max_frame_size, initial_credit=pool.initial_credit,
            heartbeat_ms=pool.heartbeat_ms, max_in_flight=pool.max_in_flight,
            max_message_size=pool.max_message_size, worker_id=self.worker_id,
            remote=pool.launcher is not None))
        self.max_in_flight = welcome.max_in_flight
        self.heartbeat_ms = welcome.heartbeat_ms
        if clamped and not pool._clamp_logged:
            pool._clamp_logged = True  # once per pool, not at every worker start (spec 4.2)
            log.warning("max_in_flight %d is above the worker's max_concurrency %d: using %d",
                        pool.max_in_flight, hello.max_concurrency, self.max_in_flight)
        extensions = b""
        if pool.shm_lane and isinstance(self.transport, LaneTransport):
            offer = next((ShmOffer.decode(data) for tag, data in
                          parse_extensions(hello.extensions) if tag == TAG_SHM), None)
            if offer is not None:  # accepted: our regions within its window, its within ours
                extensions = ShmAccept(min(offer.window, SHM_WINDOW), SHM_WINDOW).encode()
        welcome.extensions = extensions
        self._write(self.conn.send_welcome(welcome))
        lender = self.conn.shm_lender()
        if lender is not None and lender.can_announce(SHM_THRESHOLD):
            self.shm_threshold = pool.shm_threshold
        self.accepting = True
        if not self.ready.done():
            self.ready.set_result(None)

    def _stop_routing_then_kill(self) -> None:
        """GOODBYE or a fatal ERROR: nothing new goes to the worker; it must exit within the
        goodbye grace or be killed, so its requests end (WORKER_EXITED / the violation) and the
        pool replaces it, never a hang (spec 8.4)."""
        self.accepting = False
        self.alive = False
        if self.heartbeat_task is not None:
            self.heartbeat_task.cancel()
        if self.exit_grace is None:
            self.exit_grace = self.pool.loop.call_later(self.pool.goodbye_grace,
                                                        self._goodbye_grace_passed)

    def _goodbye_grace_passed(self) -> None:
        if not self.exited.done():
            log.warning("worker %d (pid %d) did not exit within %.1fs of its GOODBYE or fatal "
                        "error: killing it", self.worker_id, self.pid, self.pool.goodbye_grace)
            self.kill(None)

    def _refuse(self, code: int, message: str) -> None:
        err = ProtocolError(code, f"worker pid {self.pid} refused: {message}")
        self._write(self.conn.refuse(code, message))
        self._flush_out()
        if not self.ready.done():
            self.ready.set_exception(err)
        self.kill(err, signal.SIGTERM)

    # -- I/O ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.pool.direct_calls and self.proc is not None:
            sock = transport.get_extra_info("socket")
            self.direct_fd = os.dup(sock.fileno())
            os.set_inheritable(self.direct_fd, False)
            if self.pool.shm_lane:  # the caller reads with recvmsg too (descriptors)
                self.direct_sock = socket.socket(fileno=self.direct_fd)
            self.direct_poll = select.poll()
            self.direct_poll.register(self.direct_fd, select.POLLIN)
        if self.pool.busy_poll_s and self.proc is not None and isinstance(transport, LaneTransport):
            poll = select.poll()
            poll.register(transport.get_extra_info("socket").fileno(), select.POLLIN)
            self.loop_poll = poll.poll

    def read_lone_answer(self, req: _Request) -> None:
        """Wait a while (:class:`BusyPoll`) for a lone request's answer polling the socket, and read
        it here in the caller's task (the transport's own read: every frame is handled as on
        any read): no sleep and wake-up of the loop's thread and no loop pass before the caller
        resumes. The loop is held that long at most; the pool calls this only while this is the
        one request in flight."""
        poll = self.loop_poll
        transport = self.transport
        # asyncio's queue of callbacks ready to run (CPython's loops): while it holds any, other
        # tasks have work and the loop is not held. Without it (another loop), no busy poll.
        ready = getattr(self.pool.loop, "_ready", None)
        if poll is None or not isinstance(transport, LaneTransport) or ready is None:
            return
        watch = self.loop_busy_poll
        end = watch.deadline()
        if not end:
            return  # backing off
        clock = time.perf_counter
        while not ready:
            if poll(0):
                transport.read_now()
                if req.outcome is not None:
                    watch.caught(end)
                    return
                if not transport.is_reading():
                    return  # end of input, or closing: the loop ends the request
            if clock() >= end:
                watch.missed()
                return

    # -- direct calls (see ``direct``) -----------------------------------------------------

    def observe(self, method: str, seconds: float) -> None:
        # Requests failed after the pool forgot this worker (its exit status came first) go
        # straight into the pool's histograms of gone workers.
        latency = self.pool._latency_gone if self.forgotten else self.latency
        hist = latency.get(method)
        if hist is None:
            hist = latency[method] = LatencyHistogram()
        hist.observe(seconds)

    def _park_if_idle(self) -> None:
        """On the loop, after a read: stop reading an idle worker so a blocking caller can."""
        t = self.transport
        if (self.direct == _LOOP and self.direct_fd >= 0 and not self.requests and self.accepting
                and not self.leased and not self.pings and not self._out and t is not None
                and not t.get_write_buffer_size() and not self.conn.incomplete_frame_len()):
            with self.direct_lock:
                t.pause_reading()
                self.direct = _PARKED

    def reclaim(self) -> bool:
        """On the loop: take the reading back from a parked worker. False while a blocking
        caller holds it (the loop must not touch the connection then)."""
        if self.direct == _LOOP:
            return True
        with self.direct_lock:
            if self.direct == _PARKED:
                self.direct = _LOOP
                if self.transport is not None:
                    self.transport.resume_reading()
                return True
            if self.direct == _CALLER:
                self.want_back = True
            return self.direct != _CALLER

    def busy_with_caller(self) -> bool:
        """On the loop: True while a blocking caller holds the worker; it then gives the
        connection back to the loop when done, so whoever waits for a slot is woken."""
        with self.direct_lock:
            if self.direct == _CALLER:
                self.want_back = True
                return True
            return False

    def arm_deadline(self, req: _Request, timeout: float, give_up_at: float) -> None:
        """On the loop: the parent's own deadline for a call a blocking caller handed over."""
        if req.outcome is None:
            req.deadline_handle = self.pool.loop.call_later(
                max(0.0, give_up_at - time.monotonic()), self._deadline_passed, req, timeout)

    def claim_for_caller(self) -> bool:
        """In a blocking caller's thread: take a parked worker; False if it is not parked."""
        with self.direct_lock:
            if self.direct == _PARKED and self.accepting and not self.leased:
                self.direct = _CALLER
                return True
            return False

    def release_from_caller(self, results: list[Any] | None = None, recheck: bool = False,
                            all_read: bool = False) -> None:
        """In the caller's thread: give the connection back, parked if it is still idle and
        nothing waits for it, else to the loop (with any ``results`` for it to finish;
        ``recheck``: it must look at this worker's requests, e.g. recycling by count;
        ``all_read``: the core holds no byte the loop must see, known to the caller)."""
        pool = self.pool
        back = (bool(results) or recheck or (not all_read and self.conn.incomplete_frame_len() > 0)
                or bool(self.requests) or bool(self.after_caller))
        with self.direct_lock:
            if self.direct == _DEAD:  # the connection went while we held it: we close it
                self._close_direct_fd()
            elif not back and not self.want_back and self.alive and self.accepting:
                self.direct = _PARKED
                return
            else:
                self.direct = _LOOP
                self.want_back = False
        try:
            pool.loop.call_soon_threadsafe(self._resume_after_caller, results or [], recheck)
        except RuntimeError:  # the loop is closed: nobody reads again
            pass

    def _send_rest(self, rest_of_frame: bytes, frames: memoryview) -> None:
        """On the loop: the end of a request a direct caller could not write (see
        ``_hand_back``)."""
        self._send_frame_rest(rest_of_frame)
        if frames:
            self._send(split_frames(frames))  # parts of a frame each: fed a frame at a time

    def _resume_after_caller(self, results: list[Any], recheck: bool) -> None:
        """On the loop: reading is ours again after a caller: finish what it handed over, run
        what waited for it, and handle whatever it left unread."""
        if self.transport is not None and self.direct == _LOOP:
            self.transport.resume_reading()
        if results:
            self._results(results)
        waiting, self.after_caller = self.after_caller, []
        for fn in waiting:
            fn()
        pool = self.pool
        if recheck:
            pool._requests_ended(self, 0)
        if pool._slot_waiters or pool._idle_waiters:
            pool._capacity_changed()  # callers that found this worker busy with the caller
        if not self.alive:
            if self.exited.done():
                self._fail_all()  # it died while the caller read: nothing else will end them
            return
        if self.conn.incomplete_frame_len():
            self.data_received(b"")  # frames the caller read but left for us
        else:
            self._park_if_idle()

    def _close_direct(self) -> None:
        """The connection is gone: no caller may take it again; the caller that holds it closes
        its descriptor itself when it lets go."""
        with self.direct_lock:
            holder = self.direct == _CALLER
            self.direct = _DEAD
        if not holder and self.direct_fd >= 0:
            self._close_direct_fd()

    def _close_direct_fd(self) -> None:
        if self.direct_sock is not None:
            self.direct_sock.close()  # it owns direct_fd
            self.direct_sock = None
        else:
            os.close(self.direct_fd)
        self.direct_fd = -1

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if self.fatal_received:
            return  # after ERROR id 0 nothing it sends counts (spec 8.4)
        results: list[Any] = []
        pool = self.pool
        pool._reading = True
        if pool.latency_histograms:
            pool._read_at = time.monotonic()
        held = conn.incomplete_frame_len() + len(data)
        try:
            if data:
                conn.receive(data)
            while True:
                # The RESULT frames of one read, in one tight loop; the first other frame goes
                # through the general path below.
                all_taken = conn.take_results(results)
                if results:
                    self._results(results)
                    results.clear()
                if all_taken:
                    break
                ev = conn.next_event()
                if ev is None:
                    break
                self._on_event(ev)
                # Let go of the event (a result's payload) at once: its caller, in another
                # thread, may already check that nothing else holds it.
                ev = None
                if self.fatal_received:
                    break
        except ProtocolError as e:
            self._violated(e)
        finally:
            # The frame clock (spec 8.5): runs from the first byte of a frame still incomplete;
            # a read that completed a frame restarts it, bytes of the same frame do not.
            left = conn.incomplete_frame_len()
            if not left:
                self.partial_since = None
            elif left < held or self.partial_since is None:
                self.partial_since = time.monotonic()
            pool._reading = False
            if pool._after_read:
                runs, pool._after_read = pool._after_read, []
                for run in runs:
                    run._settle()
            if self.direct_fd >= 0 and not self.requests:
                self._park_if_idle()

    def _violated(self, e: ProtocolError) -> None:
        log.error("worker %d (pid %d): protocol violation %s", self.worker_id, self.pid, e)
        with contextlib.suppress(ProtocolError):  # best effort: e.g. nothing after GOODBYE
            self._write(self.conn.send_fatal(e))
            self._flush_out()
        violation = error_from_code(ErrorCode.PROTOCOL_VIOLATION,
                                    f"worker pid {self.pid} broke the protocol: {e}",
                                    details={"protocol_code": e.code, "name": e.name})
        if not self.ready.done():
            # A handshake refusal (VERSION_MISMATCH, BAD_HANDSHAKE...) fails the start with
            # its own code; any other violation (garbage, a 4 GiB length) is one.
            self.ready.set_exception(e if e.code in _HANDSHAKE_CODES else violation)
            self.ready.exception()
        self.kill(violation)

    # -- the shared-memory lane (PROTOCOL.md 20) -------------------------------------------

    def fds_received(self, fds: list[int]) -> None:
        """The transport read descriptors (with the bytes it hands over next): queue them for
        their SHM_REGIONs; where the core refuses them (lane off, more than 8 waiting), fail.
        Runs on whoever reads (the loop, or a direct caller)."""
        self.shm_fds.extend(fds)
        try:
            self.conn.shm_descriptors_received(len(fds))
        except ProtocolError as e:
            self._close_shm_fds()
            if self.direct == _CALLER:
                raise  # the caller hands the call back; the loop sees the failure
            self._violated(e)

    def lane_failed(self, e: ProtocolError) -> None:
        """The transport's read broke a rule of 20.5 (more than 8 descriptors: MSG_CTRUNC)."""
        self._violated(e)

    def _close_shm_fds(self) -> None:
        while self.shm_fds:
            os.close(self.shm_fds.popleft())

    def _map_region(self, region: int, size: int) -> _shm.Region:
        """The core's mapper: the oldest descriptor, checked (seals, tmpfs, size) before any
        mapping; views of it are mapped one lent range at a time."""
        if not self.shm_fds:
            raise ProtocolError(ErrorCode.SHM_BAD_DESCRIPTOR,
                                f"no descriptor arrived with SHM_REGION {region}")
        mapped = _shm.Region.map_received(self.shm_fds.popleft(), size)
        self.shm_mapped.add(mapped)
        return mapped

    def _releases_due(self) -> None:
        # Any thread: the last view of a lent range was dropped (the caller's, the GC).
        if self._releases_scheduled:
            return
        self._releases_scheduled = True
        try:
            self.pool.loop.call_soon_threadsafe(self._send_releases)
        except RuntimeError:  # the loop is gone: the pool is closed
            pass

    def _with_connection(self, fn: Callable[[], None]) -> bool:
        """On the loop: True when the loop may touch the connection now (a parked worker is
        taken back); else ``fn`` runs once a direct caller gives it back."""
        if self.reclaim():
            return True
        self.after_caller.append(fn)
        return False

    def _send_releases(self) -> None:
        self._releases_scheduled = False  # before taking them: a later drop schedules again
        if self.transport is None or not self._with_connection(self._send_releases):
            return
        parts = self.conn.send_shm_releases()
        if parts:
            self._write_now(parts)
        if self.direct_fd >= 0 and not self.requests:
            self._park_if_idle()

    def _request_parts(self, method: int, codec: int, timeout_us: int,
                       body: Any) -> tuple[int, list[Any]]:
        """A REQUEST: a large body through a region of ours (copied into it once), else (or
        when no region can take it) over the socket. On the loop."""
        if len(body) >= self.shm_threshold:
            placed = self._place(body)
            if placed is not None:
                return self.conn.send_request_shm(method, codec, timeout_us, placed)
        return self.conn.send_request(method, codec, timeout_us, body)

    def _lane_refused(self, n: int, e: Exception) -> None:
        log.warning("worker %d: the shm lane cannot take %d bytes: %s", self.worker_id, n, e)

    def _retire_idle(self) -> None:
        """On the loop: regions of ours unused for SHM_IDLE_RETIRE are withdrawn (20.4)."""
        self._retire_timer = None
        if not self.shm_regions or self.transport is None or not self.alive:
            return
        if not self._with_connection(self._retire_idle):
            return
        lender = self.conn.shm_lender()
        now = time.monotonic()
        with contextlib.suppress(ProtocolError):  # the connection can send nothing more
            for k in list(self.shm_regions):
                if lender is not None and not lender.is_lent(k.id) \
                        and now - k.used >= SHM_IDLE_RETIRE:
                    self._retire(k)
        if self._out:
            self._flush_out()
        if self.shm_regions:
            self._retire_timer = self.pool.loop.call_later(SHM_IDLE_RETIRE, self._retire_idle)
        elif self.direct_fd >= 0 and not self.requests:
            self._park_if_idle()

    def _drop_shm(self) -> None:
        """The connection is gone: our regions and unclaimed descriptors go (the worker's
        regions stay mapped for as long as views of them exist)."""
        self._close_shm_fds()
        for region in list(self.shm_mapped):
            region.close()  # views of it keep their own mappings
        for k in self.shm_regions:
            k.region.close()
        self.shm_regions.clear()
        if self._retire_timer is not None:
            self._retire_timer.cancel()
            self._retire_timer = None

    def eof_received(self) -> bool:
        try:
            self.conn.end_of_input()
        except ProtocolError as e:
            if e.code == ErrorCode.TRUNCATED:
                # A frame cut short by the worker's end is that end (PROTOCOL.md 13): a worker
                # that died mid-write. Its requests end with WORKER_EXITED once its exit status
                # is known (_fail_after_exit), or, remote, with the lost connection of 21.6 set
                # by launchers._RemoteConnection.connection_lost.
                return False
            self.failure = self.failure or error_from_code(
                ErrorCode.PROTOCOL_VIOLATION, f"worker pid {self.pid}: {e}",
                details={"protocol_code": e.code, "name": e.name})
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.direct_fd >= 0:
            self._close_direct()
        self._drop_shm()
        self.alive = False
        self.accepting = False
        if not self.ready.done():
            self.ready.set_exception(WorkerExited(ErrorCode.WORKER_EXITED,
                                                  f"worker pid {self.pid} closed before HELLO"))
            self.ready.exception()
        # Requests in flight end once the exit status is known (it goes into their error).
        self.pool.loop.create_task(self._fail_after_exit())
        self.pool._worker_lost(self)

    async def _fail_after_exit(self) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), 2.0)
        except asyncio.TimeoutError:
            self.kill(None)  # closed its socket but does not exit: do not wait forever
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exited), 2.0)
        self._fail_all()

    def _fail_all(self) -> None:
        requests = list(self.requests.values())
        self.requests.clear()
        for req in requests:
            req.finish(error=self._failure_for(req))
        if requests:
            self.pool._capacity_changed()

    def _failure_for(self, req: _Request) -> WirepoolError:
        f = self.failure
        if isinstance(f, (WorkerHung, WirepoolError)) and not isinstance(f, WorkerExited):
            err = error_from_code(f.code, f.message, id=req.id, details=f.details)
        else:
            what = (f"killed by signal {self.exit_signal}" if self.exit_signal is not None
                    else f"exited with status {self.exit_status}")
            err = WorkerExited(ErrorCode.WORKER_EXITED,
                               f"worker pid {self.pid} {what} while {quote(req.method)} was "
                               "in flight"
                               + self._tail_suffix(), id=req.id)
        if isinstance(err, WorkerExited):
            err.exit_status = self.exit_status
            err.signal = self.exit_signal
            err.stderr_tail = "\n".join(self.stderr_tail)
        return err

    async def _wait_exit(self) -> None:
        assert self.proc is not None
        # Drain the pipes first so the exit status comes with the complete stderr tail.
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks[:2])
        rc = await self.proc.wait()
        # The pipes are drained and the process reaped: release the subprocess transport now
        # rather than in a finaliser that may run after the loop is closed.
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            transport.close()
        if rc < 0:
            self.exit_signal = -rc
        else:
            self.exit_status = rc
        self.alive = False
        self.accepting = False
        if not self.exited.done():
            self.exited.set_result(None)
        if self.transport is not None:
            self.transport.close()

    async def _pump(self, stream: asyncio.StreamReader | None, name: str) -> None:
        """Read a child's output continuously into logging: a chatty worker never blocks."""
        if stream is None:
            return
        partial = b""
        is_err = name == "stderr"
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                break
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            if len(partial) > _LOG_LINE_MAX:  # a line with no end: log it in pieces
                lines.append(partial)
                partial = b""
            for raw in lines:
                self._log_line(raw, is_err)
        if partial:
            self._log_line(partial, is_err)

    def _log_line(self, raw: bytes, is_err: bool) -> None:
        line = raw[:_LOG_LINE_MAX].decode("utf-8", "replace").rstrip("\r")
        if is_err:
            self.stderr_tail.append(line[:1000])
        # WARNING, not INFO: with Python's default logging a worker's print must show.
        if self.pool.worker_output == "log" and worker_log.isEnabledFor(logging.WARNING):
            worker_log.warning("[worker %d pid %d %s] %s", self.worker_id, self.pid,
                               "stderr" if is_err else "stdout", line)

    # -- events ---------------------------------------------------------------------------

    def _on_event(self, ev: proto.Frame) -> None:
        t = ev.TYPE
        if t == FrameType.ROWS:
            req = self.requests.get(ev.id)
            self.rows_received += ev.count  # type: ignore[attr-defined]
            if req is not None and not req.abandoned:
                req.frames.append(ev)  # type: ignore[arg-type]
                req._wake()
            else:
                # Rows after a cancel are dropped; nobody will read them, so they count as
                # consumed (spec 14.3): a worker that has not seen the CANCEL yet is not left
                # waiting for credit.
                self.consumed(ev.id, ev.payload_size)  # type: ignore[attr-defined]
            return
        if t == FrameType.RESULT:
            req = self.requests.pop(ev.id, None)
            if req is not None:
                self._ended(req)
                try:
                    value = req.codec.decode(ev.body)  # type: ignore[attr-defined]
                except Exception as e:
                    req.finish(error=error_from_code(
                        ErrorCode.DECODE_FAILED, f"cannot decode the result as {req.codec.name}: "
                        f"{e}", id=req.id))
                else:
                    req.finish(value)
            return
        if t == FrameType.END:
            req = self.requests.pop(ev.id, None)
            if req is not None:
                self._ended(req)
                req.end = ev  # type: ignore[assignment]
                req.finish(ev)
            return
        if t == FrameType.ERROR:
            if ev.id == 0:
                # Fatal for the connection (spec 8.4): nothing more is routed to it or read
                # from it; it exits within the grace or is killed, and its requests end with
                # this PROTOCOL_VIOLATION.
                log.error("worker %d (pid %d) reports a fatal error: %s %s", self.worker_id,
                          self.pid, ev.code, ev.message)  # type: ignore[attr-defined]
                self.failure = self.failure or error_from_code(
                    ErrorCode.PROTOCOL_VIOLATION, f"worker pid {self.pid} closed the connection: "
                    f"{ev.code} {ev.message}",  # type: ignore[attr-defined]
                    details={"protocol_code": ev.code, "message": ev.message})  # type: ignore[attr-defined]
                self.fatal_received = True
                if not self.ready.done():
                    self.ready.set_exception(error_from_code(ev.code, ev.message))  # type: ignore[attr-defined]
                    self.ready.exception()
                self._stop_routing_then_kill()
                return
            req = self.requests.pop(ev.id, None)
            if req is not None:
                self._ended(req)
                details: Any = None
                if ev.details:  # type: ignore[attr-defined]
                    try:
                        details = json.loads(ev.details)  # type: ignore[attr-defined]
                    except ValueError:
                        details = ev.details  # type: ignore[attr-defined]
                # Its id decides its fate, never its code (spec 3): this request ends, and a
                # 3xx code is the worker's error, not our own outcome of that name.
                req.finish(error=error_from_wire(ev.code, ev.message, id=req.id,  # type: ignore[attr-defined]
                                                 details=details))
            return
        if t == FrameType.EVENT:
            req = self.requests.get(ev.id)
            cb = req.on_event if req is not None else self.pool.on_event
            if cb is not None:
                try:
                    data = json.loads(ev.data) if ev.data else None  # type: ignore[attr-defined]
                except ValueError:
                    data = ev.data  # type: ignore[attr-defined]
                try:
                    cb(ev.topic, data)  # type: ignore[attr-defined]
                except Exception:
                    log.exception("on_event callback failed")
            return
        if t == FrameType.PING:
            self._write(self.conn.send_pong(ev.nonce))  # type: ignore[attr-defined]
            return
        if t == FrameType.HELLO:
            self._on_hello(ev)  # type: ignore[arg-type]
            return
        if t == FrameType.PONG:
            # Answers its PING and every earlier one (a worker answers in order).
            nonce = int.from_bytes(ev.nonce, "little")  # type: ignore[attr-defined]
            pings = self.pings
            while pings and pings[0][0] <= nonce:
                sent, at = pings.popleft()
                if sent == nonce:
                    self.heartbeat_rtt = time.monotonic() - at
            return
        if t == FrameType.GOODBYE:
            self._stop_routing_then_kill()
            return
        # LATE: nothing to do.

    def _results(self, results: list[Any]) -> None:
        """Finish the requests of ``results`` (``id, body`` flat, from take_results)."""
        requests = self.requests
        ended = 0
        it = iter(results)
        for id, body in zip(it, it):
            req = requests.pop(id, None)
            if req is None:
                continue  # already failed here (e.g. its worker was declared hung)
            ended += 1
            try:
                value = req.codec.decode(body)
            except Exception as e:
                req.finish(error=error_from_code(
                    ErrorCode.DECODE_FAILED, f"cannot decode the result as {req.codec.name}: "
                    f"{e}", id=req.id))
            else:
                req.finish(value)
        if ended:
            self.served += ended
            self.last_busy = time.monotonic()
            self.pool._requests_ended(self, ended)

    def _ended(self, req: _Request) -> None:
        self.served += 1
        self.last_busy = time.monotonic()
        self.pool._request_ended(self, req)

    # -- requests -------------------------------------------------------------------------

    def submit(self, method: str, body: Any, codec: _codecs.Codec, timeout: float | None,
               on_event: EventCallback | None, expect_kind: int) -> _Request:
        info = self.methods.get(method)
        if self.direct != _LOOP:
            self.reclaim()  # parked: chosen by _pick, which never picks a caller's worker
        problem: WirepoolError | None = None
        id = 0  # the core allocates the id of a request it sends; a refused one has none
        parts: list[Any] = []
        if info is None:
            kind = expect_kind
            problem = error_from_code(ErrorCode.UNKNOWN_METHOD,
                                      f"the worker has no method {quote(method)}")
        elif info[1] != expect_kind:
            kind = info[1]
            right, wrong = ("stream", "call") if kind == MethodKind.STREAM else ("call", "stream")
            problem = error_from_code(
                ErrorCode.UNKNOWN_METHOD,
                f"{quote(method)} is a "
                f"{'stream' if kind == MethodKind.STREAM else 'unary'} method: "
                f"use pool.{right}(), not pool.{wrong}()")
        else:
            kind = expect_kind
            if self.alive and self.transport is not None:
                timeout_us = _validate.timeout_us(timeout)
                try:
                    id, parts = self._request_parts(info[0], codec.id, timeout_us, body)
                except ProtocolError as e:
                    # e.g. OVERLOADED through a lease, a body above max_message_size
                    problem = error_from_code(e.code, e.message)
        req = _Request(id, self, kind, codec, method, on_event, None,
                       time.monotonic() if self.pool.latency_histograms else 0.0)
        hooks = self.pool.request_hooks
        if hooks is not None:
            req.trace = (hooks, hooks.started(method, expect_kind, id, self))
        if problem is not None:
            req.finish(error=problem)
            return req
        if not id:  # the worker is dying or dead
            req.finish(error=self._failure_for(req))
            return req
        self.sent_requests += 1
        if timeout is not None:
            req.deadline_handle = self.pool.loop.call_later(
                timeout + self.pool.deadline_grace, self._deadline_passed, req, timeout)
        self.requests[id] = req
        if len(self.requests) == 1:
            # A lone request: write it now rather than a loop pass later (latency); with more
            # in flight, requests submitted in the same pass share one write.
            self._write_now(parts)
        else:
            self._write(parts)
        return req

    def submit_batch(self, method: str, bodies: list[Any], codec: _codecs.Codec,
                     sink: Callable[[_Request], None]) -> list[_Request]:
        """Submit unary calls without timeouts for ``bodies`` (the caller checked there is room):
        their REQUEST frames are built as one buffer and leave in one write."""
        if self.direct != _LOOP:
            self.reclaim()
        info = self.methods.get(method)
        parts = None
        if info is not None and info[1] == MethodKind.UNARY and self.alive \
                and self.transport is not None:
            with contextlib.suppress(ProtocolError):
                first, parts = self.conn.send_requests(info[0], codec.id, bodies)
        if parts is None:  # the general path, one by one, with its errors
            out = []
            for body in bodies:
                req = self.submit(method, body, codec, None, None, MethodKind.UNARY)
                if req.outcome is None:
                    req.sink = sink
                out.append(req)
            return out
        ids = range(first, first + len(bodies))
        unary = MethodKind.UNARY
        now = time.monotonic() if self.pool.latency_histograms else 0.0
        reqs = [_Request(id, self, unary, codec, method, None, sink, now) for id in ids]
        self.requests.update(zip(ids, reqs))
        self.sent_requests += len(reqs)
        hooks = self.pool.request_hooks
        if hooks is not None:
            for req in reqs:
                req.trace = (hooks, hooks.started(method, unary, req.id, self))
        # A burst leaves now, in one write (a map submits one burst per worker and pump).
        self._out += parts
        self._flush_out()
        return reqs

    def cancel(self, req: _Request, outcome: WirepoolError | None = None) -> None:
        """The caller gave up (cancelled, deadline, closed iterator): send CANCEL, and kill the
        worker if the terminal does not come within the cancel grace."""
        req.abandoned = True
        if outcome is not None:
            req.finish(error=outcome)
        if req.id not in self.requests or not self.alive or self.transport is None:
            return
        if req.cancel_handle is None:
            try:
                self._write(self.conn.send_cancel(req.id))
            except ProtocolError:  # its terminal is in already (a caller handed it back)
                return
            req.cancel_handle = self.pool.loop.call_later(self.pool.cancel_grace,
                                                          self._cancel_grace_passed, req)

    def _deadline_passed(self, req: _Request, timeout: float) -> None:
        if req.outcome is not None and req.kind == MethodKind.UNARY:
            return
        self.cancel(req, DeadlineExceeded(ErrorCode.DEADLINE_EXCEEDED,
                                          f"{quote(req.method)} did not finish within {timeout}s",
                                          id=req.id))

    def _cancel_grace_passed(self, req: _Request) -> None:
        if req.id in self.requests:
            log.warning("worker %d (pid %d) ignored CANCEL of request %d for %.1fs: killing it",
                        self.worker_id, self.pid, req.id, self.pool.cancel_grace)
            self.cancel_timeout = True  # its restart's cause (spec/metrics.json labels.cause)
            self.kill(WorkerExited(ErrorCode.WORKER_EXITED,
                                   f"worker pid {self.pid} killed: request {req.id} ignored "
                                   f"CANCEL for {self.pool.cancel_grace}s"))

    def consumed(self, id: int, nbytes: int) -> None:
        """The consumer read (or will never read) ``nbytes`` of stream ``id``'s rows: the core
        grants credit back when its policy says so."""
        if self.alive and self.transport is not None:
            granted, parts = self.conn.consumed(id, nbytes)
            if granted:
                self._write(parts)

    def drop_rows(self, req: _Request) -> None:
        """The caller of stream ``req`` is gone: the rows it left unread count as consumed."""
        frames = req.frames
        if frames:
            nbytes = sum(f.payload_size for f in frames)
            frames.clear()
            self.consumed(req.id, nbytes)

    # -- supervision ----------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """PING every period and judge liveness by progress (spec 8.5): hung when the oldest
        unanswered PING or an incomplete frame is older than 3 periods, whatever else arrives.
        Judged four times a period, so a hang is seen within about 3.25 periods."""
        pool = self.pool
        period = self.heartbeat_ms / 1000
        limit = HEARTBEAT_MISSES * period
        tick = period / 4
        nonce = 0
        now = time.monotonic()
        next_ping = now
        while self.alive:
            await asyncio.sleep(tick)
            if not self.alive:
                return
            if self.direct == _CALLER:
                # A blocking caller reads now and bounds its own wait (_DIRECT_WAIT_MS) before
                # handing the reading back: nothing to judge or send meanwhile.
                now = time.monotonic()
                continue
            before, now = now, time.monotonic()
            if now - before > period:
                # This loop itself ran late (the parent was starved), so the reads were too:
                # the worker is given a fresh start rather than blamed.
                self.pings = collections.deque((n, now) for n, _ in self.pings)
                if self.partial_since is not None:
                    self.partial_since = now
            why = None
            if self.pings and now - self.pings[0][1] > limit:
                why = f"no PONG for {now - self.pings[0][1]:.1f}s"
            elif self.partial_since is not None and now - self.partial_since > limit:
                why = f"a frame left incomplete for {now - self.partial_since:.1f}s"
            if why is not None:
                err = WorkerHung(ErrorCode.WORKER_HUNG,
                                 f"worker pid {self.pid} hung: {why} (heartbeat "
                                 f"{self.heartbeat_ms} ms): killed")
                log.error("%s", err)
                self.kill(err)
                return
            if now >= next_ping and self.reclaim():
                next_ping = now + period
                nonce += 1
                self.pings.append((nonce, now))
                with contextlib.suppress(ProtocolError):  # e.g. after GOODBYE: it exits anyway
                    self._write(self.conn.send_ping(nonce.to_bytes(8, "little")))
                pool._check_recycle(self)

    def kill(self, reason: WirepoolError | None, sig: int = signal.SIGKILL) -> None:
        """Stop the worker now (its whole process group); requests fail with ``reason``."""
        if reason is not None and self.failure is None:
            self.failure = reason
        self.alive = False
        self.accepting = False
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
        if self.transport is not None:
            self.transport.abort()
        if self.heartbeat_task is not None:
            self.heartbeat_task.cancel()

    async def reap(self) -> None:
        """Make sure the process is gone and its helper tasks are finished (start-up failure)."""
        if self.proc is None:
            return
        if not self.exited.done():
            try:  # a refused worker exits by itself on the ERROR; give it a moment
                await asyncio.wait_for(asyncio.shield(self.exited), 1.0)
            except asyncio.TimeoutError:
                self.kill(None)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.exited), 5.0)
        tasks = [t for t in self._tasks if not t.done()]
        if self.heartbeat_task is not None:
            tasks.append(self.heartbeat_task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def drain(self, grace_ms: int) -> None:
        self.accepting = False
        if not self.reclaim():  # a blocking caller reads: drain once it lets go
            self.after_caller.append(functools.partial(self.drain, grace_ms))
            return
        if not self.conn.is_open():  # still in its handshake: nothing to finish, stop it
            self.kill(None)
        elif self.alive and self.transport is not None and not self.conn.is_draining():
            with contextlib.suppress(ProtocolError):  # after its GOODBYE: it exits anyway
                self._write(self.conn.send_drain(grace_ms))

    def rss_bytes(self) -> int | None:
        if self.proc is None:  # a remote worker: its pid is not on this machine
            return None
        try:
            with open(f"/proc/{self.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None
