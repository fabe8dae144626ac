"""The shared-memory primitives (wirepool._shm, PROTOCOL.md section 20) and their faults.

No descriptor or mapping leaks over many cycles, hostile descriptors are refused with a typed
error (never SIGBUS), and a peer SIGKILLed while it holds or owns a region leaves this process's
descriptors and mappings flat. Counts are of wirepool's memory files only (``/memfd:wirepool-shm``
in ``/proc``), so nothing else the test process does can move them.
"""

from __future__ import annotations

import array
import fcntl
import gc
import os
import signal
import socket
import subprocess
import sys
import textwrap
from typing import Iterator

import pytest

from wirepool import _shm
from wirepool._shm import OwnedRegion, Region, recv_into_with_fds, send_with_fds
from wirepool.errors import ErrorCode, ProtocolError

pytestmark = pytest.mark.skipif(not _shm.AVAILABLE, reason="Linux memfd and seals only")

NAME = "/memfd:wirepool-shm"
TIMEOUT = 20.0


def counts(pid: int | str = "self") -> tuple[int, int]:
    """(descriptors, mappings) of wirepool memory files in process ``pid``."""
    fds = 0
    for entry in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{entry}").startswith(NAME):
                fds += 1
        except OSError:
            pass  # the descriptor listing itself, closed meanwhile
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(NAME in line for line in f)
    return fds, maps


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    for s in (a, b):
        s.settimeout(TIMEOUT)
    yield a, b
    a.close()
    b.close()


def passed(a: socket.socket, b: socket.socket, fds: list[int]) -> list[int]:
    assert send_with_fds(a, [b"r"], fds) == 1
    n, got = recv_into_with_fds(b, bytearray(16))
    assert n == 1
    return got


def test_cycles_leave_no_descriptor_or_mapping(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    gc.collect()
    base = counts()
    released: list[int] = []
    for cycle in range(300):
        size = 4096 * (1 + cycle % 16)
        owned = OwnedRegion(size)
        owned.buffer[size - 8:] = cycle.to_bytes(8, "little")
        [fd] = passed(a, b, [owned.fileno()])
        region = Region.map_received(fd, size)
        view = region.lend(size - 8, 8, on_release=lambda c=cycle: released.append(c))
        part = view[:4]
        if cycle == 0:
            # The counts see what they count: owner fd (+ mmap's dup), region fd, view's dup;
            # the owner's mapping and the view's.
            fds, maps = counts()
            assert fds > base[0] and maps == base[1] + 2
        if cycle % 2:
            region.close()
            owned.close()
        else:
            owned.close()
            region.close()
        assert int.from_bytes(view, "little") == cycle
        del view
        assert released == list(range(cycle)), "released while a slice of the view lives"
        assert bytes(part) == cycle.to_bytes(8, "little")[:4]
        part.release()
        assert released == list(range(cycle + 1)), "not released exactly once"
    assert counts() == base, "descriptors or mappings leaked"


def test_regions_dropped_without_close_leak_nothing(pair: tuple[socket.socket, socket.socket]
                                                     ) -> None:
    a, b = pair
    gc.collect()
    base = counts()
    for _ in range(50):
        owned = OwnedRegion(8192)
        [fd] = passed(a, b, [owned.fileno()])
        region = Region.map_received(fd, 8192)
        view = region.lend(4096, 10)
        del owned, region  # never closed
        assert bytes(view) == bytes(10)
        del view
    gc.collect()
    assert counts() == base


def raw_memfd(size: int, seals: int = 0, sealable: bool = True) -> int:
    flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealable else 0)
    fd = os.memfd_create("wirepool-shm", flags)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def refused(fd: int, size: int) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        Region.map_received(fd, size)
    return e.value


def test_hostile_descriptors_are_refused() -> None:
    base = counts()
    both = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
    bad = ErrorCode.SHM_BAD_DESCRIPTOR
    # Unsealed: its owner could truncate it under the mapping (SIGBUS on the next read).
    e = refused(raw_memfd(4096), 4096)
    assert e.code == bad and "not sealed" in e.message
    assert refused(raw_memfd(4096, fcntl.F_SEAL_SHRINK), 4096).code == bad
    assert refused(raw_memfd(4096, fcntl.F_SEAL_GROW), 4096).code == bad
    assert refused(raw_memfd(4096, sealable=False), 4096).code == bad
    # Sealed, but not the size its SHM_REGION says.
    e = refused(raw_memfd(4096, both), 8192)
    assert e.code == bad and "4096 bytes" in e.message
    assert refused(raw_memfd(8192, both), 4096).code == bad
    # Not a memory file.
    r, w = os.pipe()
    assert refused(r, 4096).code == bad
    os.close(w)
    s, t = socket.socketpair()
    assert refused(s.detach(), 4096).code == bad
    t.close()
    assert refused(raw_memfd(4096, both), 0).code == ErrorCode.SHM_BAD_REGION
    assert counts() == base, "a refused descriptor was not closed"
    # A well-sealed one is taken; a range past it is SHM_BOUNDS.
    with Region.map_received(raw_memfd(4096, both), 4096) as region:
        assert bytes(region.lend(0, 4096)) == bytes(4096)
        for offset, length in [(0, 0), (0, 4097), (4096, 1), (-1, 2)]:
            with pytest.raises(ProtocolError) as exc:
                region.lend(offset, length)
            assert exc.value.code == ErrorCode.SHM_BOUNDS
    assert counts() == base


def test_the_seal_check_is_what_prevents_sigbus() -> None:
    """Without the check: a mapping of an unsealed file, truncated by its owner, kills the reader."""
    code = textwrap.dedent("""
        import mmap, os
        fd = os.memfd_create("wirepool-shm", os.MFD_CLOEXEC)
        os.ftruncate(fd, 1 << 16)
        m = mmap.mmap(fd, 1 << 16, prot=mmap.PROT_READ)
        os.ftruncate(fd, 0)   # what a hostile owner of an unsealed region can do
        m[1 << 15]            # SIGBUS
    """)
    done = subprocess.run([sys.executable, "-c", code], timeout=TIMEOUT, capture_output=True)
    assert done.returncode == -signal.SIGBUS
    # Sealed against shrinking, the same truncation is refused by the kernel.
    fd = raw_memfd(1 << 16, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    os.close(fd)


def test_too_many_descriptors_are_closed(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    base = counts()
    files = [raw_memfd(4096) for _ in range(12)]
    with pytest.raises(ValueError):
        send_with_fds(a, [b"x"], files)
    # A hostile peer sends 12 in one sendmsg.
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", files))])
    for fd in files:
        os.close(fd)
    with pytest.raises(ProtocolError) as e:
        recv_into_with_fds(b, bytearray(4))
    assert e.value.code == ErrorCode.SHM_BAD_DESCRIPTOR
    assert counts() == base, "the truncated descriptors leaked"


CHILD = textwrap.dedent("""
    import os, socket, sys
    from wirepool._shm import OwnedRegion, Region, recv_into_with_fds, send_with_fds
    sock = socket.socket(fileno=int(sys.argv[2]))
    if sys.argv[1] == "holder":
        n, [fd] = recv_into_with_fds(sock, bytearray(4))
        region = Region.map_received(fd, 1 << 20)
        view = region.lend(0, 1 << 20)
        region.close()
        assert view[12345] == 7
        sock.sendall(b"m")
    else:
        owned = OwnedRegion(1 << 20)
        owned.buffer[:] = b"\\x09" * (1 << 20)
        send_with_fds(sock, [b"o"], [owned.fileno()])
    sock.recv(1)   # until killed
""")


class Peer:
    """This test's child process in ``role``, its socket passed as a descriptor; killed on exit."""

    def __init__(self, role: str) -> None:
        self.sock, theirs = socket.socketpair()
        self.sock.settimeout(TIMEOUT)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, role, str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=env)
        theirs.close()

    def kill(self) -> None:
        self.proc.kill()
        assert self.proc.wait(timeout=TIMEOUT) == -signal.SIGKILL

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT)
        self.sock.close()


def receiver_killed_while_holding() -> None:
    with OwnedRegion(1 << 20) as owned, Peer("holder") as peer:
        owned.buffer[:] = b"\x07" * (1 << 20)
        send_with_fds(peer.sock, [b"r"], [owned.fileno()])
        assert peer.sock.recv(1) == b"m"
        # The child holds the region: one mapping (its view), its region descriptor closed.
        assert counts(peer.proc.pid)[1] == 1
        peer.kill()
        owned.buffer[0] = 1  # still whole and writable


def owner_killed_while_lent() -> None:
    with Peer("owner") as peer:
        n, [fd] = recv_into_with_fds(peer.sock, bytearray(4))
        with Region.map_received(fd, 1 << 20) as region:
            view = region.lend(4096, 65536)
        peer.kill()
        # The dead owner's pages outlive it, and nothing can shrink them: no SIGBUS.
        assert view == b"\x09" * 65536
        view.release()


def test_a_peer_killed_while_holding_or_owning_a_region_leaves_counts_flat() -> None:
    gc.collect()
    base = counts()
    for cycle in range(10):
        receiver_killed_while_holding() if cycle % 2 == 0 else owner_killed_while_lent()
        assert counts() == base, f"cycle {cycle}"
