"""The asyncio side of one connection, shared by the pool's workers and the worker runtime.

The sans-IO core (`proto.Connection`) decides every byte; this base only moves them: frames
queued during one loop pass leave in one write, and reads land where the core says
(`read_buffer`: a reused buffer, or straight in a large frame's own buffer). Subclasses implement
`data_received`, called with the bytes of a plain ``data_received`` or with ``b""`` after a read
the core already has.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import time
from typing import Any, Callable

from . import _shm, proto
from ._shm_proto import ShmRange
from .errors import ProtocolError

# Regions are whole MiBs, so one serves bodies of slightly other sizes.
_REGION_GRAIN = 1 << 20

# Frames below this size are joined into one buffer before the write; larger ones go as they are.
_JOIN_BELOW = 65536

# The handed-ahead bound (PROTOCOL.md 8.5, ``driver.max_handed_ahead_bytes`` in
# spec/constants.json, which tests/test_transport_feed.py compares it with): whole frames are
# handed to the transport only while it holds fewer than this many bytes it has not written,
# counting everything it holds; the frame that reaches it is handed whole, the rest waits in
# this side's own backlog, where a PING or PONG still goes ahead of it.
MAX_HANDED_AHEAD_BYTES = 4_194_304
_FEED_LIMIT = MAX_HANDED_AHEAD_BYTES

class BusyPoll:
    """Watching a socket for input for up to ``budget`` seconds before sleeping (issue 17): a
    peer that answers within microseconds is then read without the wake-up of a sleeping
    thread, which costs more here. It learns from its waits: after one whose input came later
    than the budget (a slow handler, a sparse caller, or a loaded machine, where the poll only
    takes CPU from the peer), the next 1, 2, 4 ... 64 waits sleep at once; a wait it caught
    ends the back-off."""

    __slots__ = ("budget", "_skip", "_backoff")

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self._skip = 0
        self._backoff = 0

    def deadline(self, limit: float | None = None) -> float:
        """When this wait stops polling (``time.perf_counter``), at most ``limit`` seconds from
        now; 0.0 when it should sleep at once (no budget, or backing off)."""
        if not self.budget:
            return 0.0
        if self._skip:
            self._skip -= 1
            return 0.0
        budget = self.budget if limit is None or limit > self.budget else limit
        return time.perf_counter() + budget

    def wait(self, poll: Callable[[int], list[Any]], limit: float | None = None) -> bool:
        """Call ``poll(0)`` (a ``select.poll`` of the socket) until input is ready (True) or
        the deadline passes (False: the caller sleeps as usual)."""
        end = self.deadline(limit)
        if not end:
            return False
        clock = time.perf_counter
        while not poll(0):
            if clock() >= end:
                self.missed()
                return False
        self.caught(end)
        return True

    def caught(self, end: float) -> None:
        """Input came while polling: the next wait polls too (unless it came past ``end``)."""
        if time.perf_counter() > end:
            self.missed()  # e.g. this thread was preempted meanwhile
        else:
            self._backoff = 0

    def missed(self) -> None:
        self._backoff = min(self._backoff * 2 or 1, 64)
        self._skip = self._backoff


def frame_end(data: Any, pos: int) -> int:
    """The offset at which the frame holding byte ``pos`` of ``data`` ends (``data`` holds whole
    frames from its first byte, e.g. one message's frames)."""
    at = 0
    while at <= pos:
        at += 16 + int.from_bytes(data[at:at + 4], "little")
    return at


def split_frames(data: memoryview) -> list[memoryview]:
    """``data`` (whole frames from its first byte) as one view per frame, for a feed that hands
    the transport a frame at a time."""
    out = []
    at = 0
    while at < len(data):
        end = at + 16 + int.from_bytes(data[at:at + 4], "little")
        out.append(data[at:end])
        at = end
    return out


def _is_ping_or_pong(parts: list[Any]) -> bool:
    return len(parts) == 1 and len(parts[0]) == 24 and parts[0][4] in (0x31, 0x32)


class FrameProtocol(asyncio.BufferedProtocol):
    """Writes frames to its transport: small ones of one loop pass together, whole frames only
    while the transport holds fewer than ``_FEED_LIMIT`` bytes (the rest fed a frame at a time
    as it drains), a PING or PONG at the next frame boundary. Every output
    handed to ``_send`` starts at a frame boundary (its walk of frame headers needs it)."""

    def __init__(self, conn: proto.Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self._loop = loop
        self._out: list[Any] = []
        self._out_scheduled = False
        # A large output not yet handed to the transport (see _FEED_LIMIT), and the bytes of
        # the frame under way at the end of what was handed (0: at a frame boundary).
        self._backlog: collections.deque[Any] = collections.deque()
        self._frame_left = 0
        self._urgent = 0  # PINGs and PONGs at the head of the backlog
        self._limits_set = False
        self.bytes_sent = 0  # for metrics
        self.bytes_received = 0

    def _write(self, parts: list[Any]) -> None:
        if _is_ping_or_pong(parts) and (self._backlog or self._held() >= _FEED_LIMIT):
            self._send_urgent(parts[0])
            return
        self._out.extend(parts)
        if not self._out_scheduled:
            self._out_scheduled = True
            self._loop.call_soon(self._flush_out)

    def _held(self) -> int:
        """The bytes the transport holds and has not written (0 without a transport)."""
        t = self.transport
        return 0 if t is None else t.get_write_buffer_size()

    def _send_urgent(self, frame: Any) -> None:
        """A PING or PONG: to the transport now if it holds fewer than _FEED_LIMIT bytes and
        nothing waits, else at the head of the backlog, after the PINGs and PONGs already
        there (the backlog's head is always at a frame boundary)."""
        t = self.transport
        if t is None or t.is_closing():
            return
        if not self._backlog and t.get_write_buffer_size() < _FEED_LIMIT:
            self.bytes_sent += len(frame)
            t.write(frame)
            return
        self._backlog.insert(self._urgent, frame)
        self._urgent += 1
        self._start_feeding(t)

    def _write_now(self, parts: list[Any]) -> None:
        """Write ``parts`` now, after anything queued: a lone request leaves at once (latency),
        with no flush scheduled for a later loop pass (that pass would cost a whole loop
        iteration per call with one request in flight)."""
        if self._out:
            self._out.extend(parts)
            self._flush_out()
        else:
            self._send(parts)

    def _flush_out(self) -> None:
        # Small frames queued during one loop pass go out in one write (one syscall).
        self._out_scheduled = False
        out, self._out = self._out, []
        self._send(out)

    def _send_frame_rest(self, rest: Any) -> None:
        """The end of a frame whose start is already on the wire (a direct caller wrote it to
        the socket): handed whole at once, as the frame under way (8.5)."""
        t = self.transport
        if t is None or t.is_closing():
            return
        self.bytes_sent += len(rest)
        t.write(rest)

    def _send(self, out: list[Any]) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if self._backlog:
            self._backlog.extend(out)  # behind what waits already, in order
            return
        held = t.get_write_buffer_size()
        if len(out) == 1 and type(out[0]) is bytes:  # one frame: no joining copy
            n = len(out[0])
            if held + n <= _FEED_LIMIT:
                self.bytes_sent += n
                t.write(out[0])
                return
        elif held + sum(map(len, out)) <= _FEED_LIMIT:
            # Within the bound as a whole (each frame starts below it): no walk of headers.
            small = bytearray()
            for p in out:
                n = len(p)
                self.bytes_sent += n
                if n < _JOIN_BELOW:
                    small += p
                else:
                    if small:
                        t.write(small)
                        small = bytearray()
                    t.write(p)
            if small:
                t.write(small)
            return
        # Past the bound: fed a frame at a time as the transport drains.
        self._backlog.extend(out)
        self._frame_left = 0
        self._start_feeding(t)

    def _start_feeding(self, t: Any) -> None:
        if not self._limits_set:
            # Paused at _FEED_LIMIT bytes held (above high), resumed (``_feed``) at a quarter.
            self._limits_set = True
            t.set_write_buffer_limits(high=_FEED_LIMIT - 1, low=_FEED_LIMIT // 4)
        self._feed()

    def _feed(self) -> None:
        """Hands the backlog to the transport, whole frames only while it holds fewer than
        _FEED_LIMIT bytes (the frame that reaches them whole, a part of several frames cut at
        a frame boundary); ``resume_writing`` calls it again."""
        t = self.transport
        backlog = self._backlog
        if t is None or t.is_closing():
            backlog.clear()
            self._urgent = 0
            return
        left = self._frame_left
        held = t.get_write_buffer_size()
        small = bytearray()
        while backlog:
            room = _FEED_LIMIT - held - len(small)
            if not left and room <= 0:
                break  # at a frame boundary, the bound reached: the rest waits
            p = backlog[0]
            n = len(p)
            pos = left  # the end of the frame under way; frames that start below room go
            while pos < n and pos < room:
                pos += 16 + int.from_bytes(p[pos:pos + 4], "little")
            if pos < n:  # cut at the frame boundary ``pos``
                head: Any = memoryview(p)[:pos]
                backlog[0] = memoryview(p)[pos:]
                left = 0
            else:
                head = p
                backlog.popleft()
                if self._urgent:
                    self._urgent -= 1
                left = pos - n
            k = len(head)
            self.bytes_sent += k
            if k < _JOIN_BELOW:
                small += head
            else:
                if small:
                    t.write(small)
                    small = bytearray()
                t.write(head)
                held = t.get_write_buffer_size()
        if small:
            t.write(small)
        self._frame_left = left

    def pause_writing(self) -> None:
        pass  # the backlog waits for resume_writing

    def resume_writing(self) -> None:
        if self._backlog:
            self._feed()

    # Receiving: into the core's read buffer (a reused one instead of a fresh 256 KiB bytes
    # object per read, whose mmap/munmap churn cost more than the copy; a large payload straight
    # into its frame's buffer).
    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.bytes_received += nbytes
        self.conn.received(nbytes)
        self.data_received(b"")

    def data_received(self, data: bytes) -> None:
        raise NotImplementedError


class OwnRegion:
    """One region this side created: its id, its memory, and when it was last seen in use (a
    body placed in it, or a range of it found lent), for the idle rule of PROTOCOL.md 20.4."""

    __slots__ = ("id", "region", "used")

    def __init__(self, id: int, region: _shm.OwnedRegion, used: float) -> None:
        self.id = id
        self.region = region
        self.used = used


class LaneProtocol(FrameProtocol):
    """A :class:`FrameProtocol` that a :class:`LaneTransport` reports descriptors to, and the
    owner's side of the lane both ends share: placing a large body in a region of its own and
    withdrawing regions. Subclasses set ``shm_regions`` and ``_retire_timer`` and implement
    ``_retire_idle`` (when to withdraw) and ``_lane_refused`` (how to say a body stayed off
    the lane)."""

    shm_regions: list[OwnRegion]
    _retire_timer: asyncio.TimerHandle | None

    def _place(self, body: Any) -> ShmRange | None:
        """Copies ``body`` into a region the peer does not hold (a new one, announced with its
        descriptor, when none is large enough); None when the window cannot take it."""
        lender = self.conn.shm_lender()
        transport = self.transport
        if lender is None or not isinstance(transport, LaneTransport):
            return None
        view = memoryview(body).cast("B")
        n = view.nbytes
        found = next((k for k in self.shm_regions
                      if k.region.size >= n and not lender.is_lent(k.id)), None)
        if found is None:
            try:
                # Free regions too small for this body make room for the one it needs.
                for k in [k for k in self.shm_regions
                          if k.region.size < n and not lender.is_lent(k.id)]:
                    self._retire(k)
                size = -(-n // _REGION_GRAIN) * _REGION_GRAIN
                if not lender.can_announce(size):
                    return None
                owned = _shm.OwnedRegion(size)
                region_id, parts = self.conn.send_shm_region(size)
            except (OSError, ProtocolError) as e:
                self._lane_refused(n, e)
                return None
            found = OwnRegion(region_id, owned, 0.0)
            self.shm_regions.append(found)
            # Everything queued before goes first; the descriptor rides with the SHM_REGION's
            # first byte (20.5).
            self._flush_out()
            transport.write_with_fd(b"".join(parts), owned.fileno())
        found.region.buffer[:n] = view
        found.used = time.monotonic()
        if self._retire_timer is None:
            self._retire_timer = self._loop.call_later(_shm.IDLE_RETIRE, self._retire_idle)
        return ShmRange(found.id, 0, n)

    def _retire(self, kept: OwnRegion) -> None:
        """Withdraws one of our regions (the core refuses it while a range of it is lent). It
        is unmapped and closed before the SHM_RETIRE can leave, so a peer that read it sees
        this side hold neither."""
        parts = self.conn.send_shm_retire(kept.id)
        self.shm_regions.remove(kept)
        kept.region.close()
        self._write(parts)

    def _retire_idle(self) -> None:
        raise NotImplementedError

    def _lane_refused(self, n: int, e: Exception) -> None:
        raise NotImplementedError

    def fds_received(self, fds: list[int]) -> None:
        raise NotImplementedError

    def lane_failed(self, e: ProtocolError) -> None:
        raise NotImplementedError


class LaneTransport(asyncio.Transport):
    """One end of a Unix socket that may carry the shm lane: asyncio's own transport reads with
    ``recv_into``, which loses descriptors, so this one reads with ``recvmsg`` and room for 8
    descriptors (PROTOCOL.md 20.5) and can attach a descriptor to a write (a SHM_REGION's).
    Writes go out at once when nothing is queued, the rest when the socket is writable, in
    order. The protocol gets the descriptors of a read (``fds_received``) before its bytes, and
    ``lane_failed`` when a read breaks 20.5 (``MSG_CTRUNC``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 protocol: LaneProtocol) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        # [bytes left to write, descriptor to attach to their first byte or -1]
        self._queue: collections.deque[list[Any]] = collections.deque()
        self._queued = 0
        # Flow control as asyncio's transports: pause_writing above high, resume at low.
        self._high = 65536
        self._low = 16384
        self._writing_paused = False
        self._closing = False
        self._lost = False
        self._reading = True
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._read)

    # -- reading ------------------------------------------------------------------------------

    def _read(self) -> None:
        protocol = self._protocol
        try:
            n, fds = _shm.recv_into_with_fds(self._sock, protocol.get_buffer(-1))
        except (BlockingIOError, InterruptedError):
            return
        except ProtocolError as e:
            protocol.lane_failed(e)
            return
        except OSError as e:
            self._abort(e)
            return
        if fds:
            protocol.fds_received(fds)  # before the bytes that came with them (20.7)
            if self._closing:
                return
        if n == 0:
            self._loop.remove_reader(self._fd)
            self._reading = False
            if not protocol.eof_received():
                self.close()
            return
        protocol.buffer_updated(n)

    def read_now(self) -> None:
        """Read what the socket holds now, as the loop does when it is readable: for a task on
        the loop's thread waiting for an answer (AsyncPool's busy poll). Nothing while reading
        is paused or the transport closes."""
        if self._reading and not self._closing:
            self._read()

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._read)

    def is_reading(self) -> bool:
        return self._reading

    # -- writing ------------------------------------------------------------------------------

    def write(self, data: Any) -> None:
        if not self._queue and not self._closing:  # the common case: all of it now
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._abort(e)
                return
            if n == len(data):
                return
            data = memoryview(data).cast("B")[n:]
        self._send(memoryview(data).cast("B"), -1)

    def write_with_fd(self, data: bytes, fd: int) -> None:
        """Writes ``data`` with (a duplicate of) ``fd`` attached to its first byte."""
        self._send(memoryview(data), os.dup(fd))

    def _send(self, view: memoryview, fd: int) -> None:
        if self._closing:
            if fd >= 0:
                os.close(fd)
            return
        if not self._queue:
            try:
                n = self._send_now(view, fd)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                if fd >= 0:
                    os.close(fd)
                self._abort(e)
                return
            if n:
                fd = -1  # it travelled with the first byte
            if n == len(view):
                return
            view = view[n:]
            self._loop.add_writer(self._fd, self._writable)
        self._queue.append([view, fd])
        self._queued += len(view)
        if self._queued > self._high and not self._writing_paused:
            self._writing_paused = True
            self._protocol.pause_writing()

    def _send_now(self, view: memoryview, fd: int) -> int:
        if fd < 0:
            return self._sock.send(view)
        n = _shm.send_with_fds(self._sock, [view], [fd])
        os.close(fd)  # the kernel holds its own reference now
        return n

    def _writable(self) -> None:
        queue = self._queue
        while queue:
            entry = queue[0]
            view, fd = entry
            try:
                n = self._send_now(view, fd)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._abort(e)
                return
            entry[1] = -1
            self._queued -= n
            if n < len(view):
                entry[0] = view[n:]
                return
            queue.popleft()
            if self._writing_paused and self._queued <= self._low:
                self._writing_paused = False
                self._protocol.resume_writing()
                if not queue:
                    break
        if queue:
            return  # resume_writing queued more: still watching for write space
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._connection_lost(None)

    def get_write_buffer_size(self) -> int:
        return self._queued

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = 65536 if high is None else high
        self._low = self._high // 4 if low is None else low

    def can_write_eof(self) -> bool:
        return False

    # -- closing ------------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Stops reading; the connection closes once what is queued was written."""
        if self._closing:
            return
        self._closing = True
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False
        if not self._queue:
            self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self._abort(None)

    def _abort(self, exc: Exception | None) -> None:
        self._closing = True
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False
        self._loop.remove_writer(self._fd)
        for _view, fd in self._queue:
            if fd >= 0:
                os.close(fd)
        self._queue.clear()
        self._queued = 0
        self._loop.call_soon(self._connection_lost, exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sock if name == "socket" else default
