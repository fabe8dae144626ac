"""The Python worker's side of the shared-memory lane (PROTOCOL.md 20), against a parent core on
a socketpair: the offer in HELLO, a large request body handed to the handler as a view of the
parent's region and released once dropped, a large result sent through a region of the worker
(reused from call to call, retired once idle for IDLE_RETIRE), and a hostile parent's regions and ranges refused with the typed
error of 20.5-20.6 (ERROR id 0, exit status 1), never a SIGBUS. The Rust parent against this
worker: rust/wirepool/tests/shm_lane_pyworker.rs.
"""

from __future__ import annotations

import collections
import gc
import json
import mmap
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from wirepool import _shm, proto
from wirepool._shm import OwnedRegion
from wirepool._shm_proto import SHM_BODY, SHM_REGION, ShmAccept, ShmFrame, ShmOffer, ShmRange
from wirepool.errors import ErrorCode
from wirepool.proto import FrameType

pytestmark = pytest.mark.skipif(not _shm.AVAILABLE, reason="Linux memfd and seals only")

WORKER = Path(__file__).resolve().parent / "workers" / "shm_worker.py"
RAW = proto.CodecId.RAW
MIB = 1 << 20
GIB = 1 << 30


class LaneParent:
    """Spawns shm_worker.py on a socketpair and speaks to it with a parent core that reads
    descriptors (recvmsg) and maps the worker's regions."""

    def __init__(self, accept: ShmAccept | None = ShmAccept(GIB, GIB),
                 env: dict[str, str] | None = None, unchecked_welcome: bool = False) -> None:
        mine, theirs = socket.socketpair()
        environ = dict(os.environ, WIREPOOL_FD=str(theirs.fileno()), **(env or {}))
        self.proc = subprocess.Popen([sys.executable, str(WORKER)], env=environ,
                                     pass_fds=[theirs.fileno()], stderr=subprocess.PIPE)
        theirs.close()
        self.sock = mine
        self.sock.settimeout(10)
        self.conn = proto.Connection("parent")
        self.fds: collections.deque[int] = collections.deque()
        self.regions_received = 0
        self.retired = 0  # regions of the worker the core unmapped on its SHM_RETIRE
        self.conn.set_shm_mapper(self._map)
        self.buf = bytearray(1 << 16)
        self.hello = self.next()
        assert self.hello.TYPE == FrameType.HELLO
        self.methods = {m.name: i for i, m in enumerate(self.hello.methods)}
        welcome = proto.Welcome(worker_id=1, max_frame_size=proto.HANDSHAKE_MAX_FRAME_SIZE,
                                heartbeat_ms=0, max_in_flight=4,
                                extensions=b"" if accept is None else accept.encode())
        # unchecked: as a parent that ignores its own core's refusal would send it
        self.write([proto.encode_frame(welcome)] if unchecked_welcome
                   else self.conn.send_welcome(welcome))

    def _map(self, region: int, size: int) -> _shm.Region:
        self.regions_received += 1
        mapped = _shm.Region.map_received(self.fds.popleft(), size)
        close = mapped.close

        def retired() -> None:  # the core closes a region only on its SHM_RETIRE here
            self.retired += 1
            close()
        mapped.close = retired  # type: ignore[method-assign]
        return mapped

    def wait_retired(self, n: int, within: float) -> None:
        """Reads (and handles) what the worker sends until ``n`` of its regions were retired;
        fails after ``within`` seconds."""
        deadline = time.monotonic() + within
        try:
            while self.retired < n:
                left = deadline - time.monotonic()
                assert left > 0, f"{self.retired} of {n} regions retired within {within} s"
                self.sock.settimeout(left)
                nbytes, fds = _shm.recv_into_with_fds(self.sock, self.buf)
                self.fds.extend(fds)
                self.conn.shm_descriptors_received(len(fds))
                assert nbytes, "the worker closed the connection"
                self.conn.receive(bytes(self.buf[:nbytes]))
                while self.conn.next_event() is not None:
                    pass
        except socket.timeout:
            raise AssertionError(f"{self.retired} of {n} regions retired within {within} s")
        finally:
            self.sock.settimeout(10)

    def write(self, parts: list[Any], fd: int = -1) -> None:
        data = b"".join(bytes(p) for p in parts)
        if fd >= 0:
            sent = _shm.send_with_fds(self.sock, [data], [fd])
            data = data[sent:]
        if data:  # (sendall of nothing still fails once the worker has refused and closed)
            self.sock.sendall(data)

    def next(self) -> Any:
        """The next event; EOFError when the worker closed the connection."""
        while True:
            ev = self.conn.next_event()
            if ev is not None:
                return ev
            n, fds = _shm.recv_into_with_fds(self.sock, self.buf)
            self.fds.extend(fds)
            self.conn.shm_descriptors_received(len(fds))
            if not n:
                self.conn.end_of_input()
                raise EOFError
            self.conn.receive(bytes(self.buf[:n]))

    def call(self, method: str, body: bytes, region: OwnedRegion | None = None) -> Any:
        """Request ``method`` (raw); its body through ``region`` when given. The terminal."""
        if region is None:
            id, parts = self.conn.send_request(self.methods[method], RAW, 0, body)
        else:
            region.buffer[:len(body)] = body
            id, parts = self.conn.send_request_shm(self.methods[method], RAW, 0,
                                                   ShmRange(self.region_id, 0, len(body)))
        self.write(parts)
        while True:
            ev = self.next()
            if ev.id == id and ev.TYPE in (FrameType.RESULT, FrameType.ERROR):
                self.conn.next_events([])  # what came in the same read (a SHM_RELEASE)
                return ev

    def announce(self, region: OwnedRegion) -> None:
        self.region_id, parts = self.conn.send_shm_region(region.size)
        self.write(parts, region.fileno())

    def fatal(self) -> Any:
        """The worker's fatal ERROR (id 0), then its end of file and exit status."""
        ev = self.next()
        while not (ev.TYPE == FrameType.ERROR and ev.id == 0):
            ev = self.next()
        with pytest.raises(EOFError):
            while True:
                self.next()
        return ev

    def exit_status(self) -> int:
        return self.proc.wait(10)

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        while self.fds:
            os.close(self.fds.popleft())


@pytest.fixture
def parent() -> Iterator[LaneParent]:
    p = LaneParent()
    yield p
    p.close()


def payload(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(256)) * (n // 256)


def test_the_hello_offers_the_lane_with_the_default_window(parent: LaneParent) -> None:
    assert proto._shm_offer_in(parent.hello) == ShmOffer(GIB)
    assert parent.conn.shm_is_on()


@pytest.mark.timeout(60)
def test_large_bodies_travel_through_regions_both_ways_and_come_back(
        parent: LaneParent) -> None:
    mine = OwnedRegion(4 * MIB)
    parent.announce(mine)
    for seed, method in ((1, "echo_raw"), (2, "echo_thread_raw"), (3, "echo_raw")):
        body = payload(2 * MIB, seed)
        result = parent.call(method, body, mine)
        assert result.TYPE == FrameType.RESULT, result
        # The result is a view of the worker's region, not bytes from the socket.
        assert isinstance(result.body, memoryview) and isinstance(result.body.obj, mmap.mmap)
        assert result.body == body
        del result
        # The worker released our range: with its RESULT, before the next call.
        assert not parent.conn.shm_lender().is_lent(parent.region_id)
        parent.write(parent.conn.send_shm_releases())
    # One region of the worker served all three results.
    assert parent.regions_received == 1
    assert json.loads(bytes(_json_call(parent, "lane_bodies"))) == {"lane": 3, "socket": 0}
    # A small body stays on the socket both ways.
    small = parent.call("echo_raw", b"small")
    assert bytes(small.body) == b"small"
    assert not isinstance(getattr(small.body, "obj", None), mmap.mmap)
    assert parent.regions_received == 1
    mine.close()


def _json_call(parent: LaneParent, method: str) -> Any:
    id, parts = parent.conn.send_request(parent.methods[method], proto.CodecId.JSON, 0, b"null")
    parent.write(parts)
    while True:
        ev = parent.next()
        if ev.id == id:
            assert ev.TYPE == FrameType.RESULT, ev
            return ev.body


@pytest.mark.timeout(60)
def test_a_worker_with_the_lane_off_offers_nothing_and_answers_over_the_socket() -> None:
    p = LaneParent(accept=None, env={"WIREPOOL_SHM": "0"})
    try:
        assert p.hello.extensions == b""
        body = payload(2 * MIB, 4)
        result = p.call("echo_raw", body)
        assert result.TYPE == FrameType.RESULT and result.body == body
        assert p.regions_received == 0
    finally:
        p.close()


@pytest.mark.timeout(60)
def test_a_welcome_without_the_lane_leaves_it_off() -> None:
    p = LaneParent(accept=None)
    try:
        assert not p.conn.shm_is_on()
        body = payload(2 * MIB, 5)
        result = p.call("echo_raw", body)
        assert result.TYPE == FrameType.RESULT and result.body == body
        assert p.regions_received == 0
    finally:
        p.close()


def _sealed_file(size: int, seals: int = _shm.REQUIRED_SEALS) -> int:
    fd = os.memfd_create("wirepool-shm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        import fcntl
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def _raw_region(p: LaneParent, region: int, size: int, fd: int) -> None:
    frame = ShmFrame(SHM_REGION, 0, region, size=size).encode()
    if fd >= 0:
        p.write([frame], fd)
        os.close(fd)
    else:
        p.write([frame])


def _raw_body_request(p: LaneParent, region: int, offset: int, length: int) -> None:
    # REQUEST 1 with MORE and its prefix only, then SHM_BODY: as a parent that ignores its
    # own core's checks would send them.
    head = struct.pack("<IBBHQHBBQ", 12, FrameType.REQUEST, proto.FLAG_MORE, 0, 1,
                       p.methods["echo_raw"], RAW, 0, 0)
    p.write([head, ShmFrame(SHM_BODY, 1, region, offset=offset, length=length).encode()])


def _hostile_file_larger_than_announced(p: LaneParent) -> None:
    _raw_region(p, 1, 2 * MIB, _sealed_file(MIB))


def _hostile_file_not_sealed(p: LaneParent) -> None:
    _raw_region(p, 1, MIB, _sealed_file(MIB, seals=0))


def _hostile_range_past_the_end(p: LaneParent) -> None:
    _raw_region(p, 1, MIB, _sealed_file(MIB))
    _raw_body_request(p, 1, MIB - 10, 100)


def _hostile_offset_overflows(p: LaneParent) -> None:
    _raw_region(p, 1, MIB, _sealed_file(MIB))
    _raw_body_request(p, 1, 2**64 - 1, 2)


def _hostile_region_above_the_window(p: LaneParent) -> None:
    _raw_region(p, 1, 2 * GIB, -1)  # refused before any descriptor is looked at


def _hostile_region_without_descriptor(p: LaneParent) -> None:
    _raw_region(p, 1, MIB, -1)


def _hostile_body_of_an_unknown_region(p: LaneParent) -> None:
    _raw_body_request(p, 7, 0, 10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attack, code", [
    (_hostile_file_larger_than_announced, ErrorCode.SHM_BAD_DESCRIPTOR),
    (_hostile_file_not_sealed, ErrorCode.SHM_BAD_DESCRIPTOR),
    (_hostile_range_past_the_end, ErrorCode.SHM_BOUNDS),
    (_hostile_offset_overflows, ErrorCode.SHM_BOUNDS),
    (_hostile_region_above_the_window, ErrorCode.SHM_BAD_REGION),
    (_hostile_region_without_descriptor, ErrorCode.SHM_BAD_DESCRIPTOR),
    (_hostile_body_of_an_unknown_region, ErrorCode.SHM_BOUNDS),
])
def test_a_hostile_parent_gets_a_typed_error_never_a_sigbus(attack: Any, code: int) -> None:
    p = LaneParent()
    try:
        attack(p)
        err = p.fatal()
        assert err.code == code, err
        assert p.exit_status() == 1  # a clean exit, not a signal (SIGBUS would be -7)
    finally:
        p.close()


@pytest.mark.timeout(60)
def test_a_descriptor_where_the_lane_is_off_fails_the_connection() -> None:
    p = LaneParent(accept=None)
    try:
        fd = _sealed_file(MIB)
        # A PING carrying a descriptor: the worker reads with recvmsg since its HELLO offered
        # the lane, and the WELCOME turned it off.
        ping = proto.encode_frame(proto.Ping(b"12345678"))
        _shm.send_with_fds(p.sock, [ping], [fd])
        os.close(fd)
        err = p.fatal()
        assert err.code == ErrorCode.SHM_BAD_DESCRIPTOR, err
        assert p.exit_status() == 1
    finally:
        p.close()


@pytest.mark.timeout(60)
def test_a_welcome_above_the_offer_is_refused() -> None:
    p = LaneParent(accept=ShmAccept(2 * GIB, GIB), unchecked_welcome=True)
    try:
        err = p.fatal()
        assert err.code == ErrorCode.BAD_HANDSHAKE, err
        assert p.exit_status() == 1
    finally:
        p.close()


def _memfds(pid: int) -> tuple[int, int]:
    """Memory files ``pid`` holds: (open descriptors, mappings)."""
    fds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:")
        except FileNotFoundError:  # closed while listing
            pass
    with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
        maps = sum("/memfd:" in line for line in f)
    return fds, maps


def _assert_holds_one(pid: int, placed: float) -> None:
    """The worker holds its one region (used at ``placed`` or later, so it cannot be idle yet
    when checked within IDLE_RETIRE of it; a slower check under load proves nothing)."""
    fds, maps = _memfds(pid)
    if time.monotonic() - placed < _shm.IDLE_RETIRE:
        # Before Python 3.13 the region's mmap holds a second descriptor.
        assert fds >= 1 and maps == 1, (fds, maps)


def _large_echo(parent: LaneParent, seed: int) -> None:
    """A 2 MiB echo whose request goes over the socket and whose result comes through a
    region of the worker; the result is dropped and its release sent at once."""
    body = payload(2 * MIB, seed)
    result = parent.call("echo_raw", body)
    assert result.TYPE == FrameType.RESULT and isinstance(result.body.obj, mmap.mmap)
    assert result.body == body
    del result
    parent.write(parent.conn.send_shm_releases())


@pytest.mark.timeout(60)
def test_an_idle_region_of_the_worker_is_retired_unmapped_and_closed(
        parent: LaneParent) -> None:
    # What this process held before (another test's pool in this pytest worker, not yet
    # collected), so the check below is about this test's region only.
    gc.collect()
    held_before = _memfds(os.getpid())
    placed = time.monotonic()
    _large_echo(parent, 6)
    assert parent.regions_received == 1
    _assert_holds_one(parent.proc.pid, placed)
    parent.wait_retired(1, within=5 * _shm.IDLE_RETIRE)
    # Nothing is left in the worker (it unmaps and closes before the SHM_RETIRE leaves), nor
    # in this parent, whose core closed its descriptor on the SHM_RETIRE.
    assert _memfds(parent.proc.pid) == (0, 0)
    assert _memfds(os.getpid()) == held_before
    # The lane goes on with a fresh region.
    _large_echo(parent, 7)
    assert parent.regions_received == 2 and parent.retired == 1


@pytest.mark.timeout(60)
def test_a_region_reused_within_the_idle_time_is_kept(parent: LaneParent) -> None:
    # Back-to-back calls for longer than IDLE_RETIRE: the idle time counts from a region's
    # last use, not its announcement, so the one region serves them all.
    start = placed = time.monotonic()
    seed = 0
    while placed - start < 1.5 * _shm.IDLE_RETIRE:
        placed = time.monotonic()
        seed += 1
        _large_echo(parent, seed)
    assert parent.regions_received == 1 and parent.retired == 0
    _assert_holds_one(parent.proc.pid, placed)
