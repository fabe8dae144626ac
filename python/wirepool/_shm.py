"""The shared-memory lane's primitives (PROTOCOL.md section 20), Linux only.

Sealed memory files (``os.memfd_create``), their descriptors passed over the connection
(``SCM_RIGHTS``), and zero-copy ``memoryview`` views of a received region. The owner of a region
creates it with :class:`OwnedRegion` (sealed against shrinking and growing before anyone else
sees it), writes payloads into it and sends its descriptor once with :func:`send_with_fds`. The
receiver takes the descriptor from :func:`recv_into_with_fds`, checks it with
:meth:`Region.map_received`, and hands out :meth:`Region.lend` views::

    owned = OwnedRegion(4096)
    owned.buffer[:5] = b"hello"
    region = Region.map_received(os.dup(owned.fileno()), 4096)  # normally from recv_into_with_fds
    view = region.lend(0, 5, on_release=lambda: print("SHM_RELEASE"))
    region.close()          # the view keeps its own mapping
    assert view == b"hello"
    del view                # unmapped now; the release runs

Each lent view is its own read-only mapping of the range (Python before 3.12 cannot run code
when a memoryview of a shared mapping is released, but it finalizes an ``mmap`` object): it is
unmapped, and ``on_release`` runs, when the last memoryview of it is released or collected.
Before Python 3.13 an ``mmap`` object also holds a duplicate of the descriptor, so a live view
costs one descriptor until then.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import mmap
import os
import socket
import weakref
from typing import Callable, Sequence

from ._constants import SHM_MAX_DESCRIPTORS_PER_WRITE
from .errors import ErrorCode, ProtocolError

__all__ = [
    "AVAILABLE", "IDLE_RETIRE", "MAX_FDS_PER_WRITE", "REQUIRED_SEALS", "OwnedRegion", "Region",
    "recv_into_with_fds", "send_with_fds",
]

#: True where the lane can work: memfd_create and file seals (Linux).
AVAILABLE = hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")

#: The seals a received region must carry (20.5): without F_SEAL_SHRINK its owner could truncate
#: it later, and every read of a view past the new end would kill this process with SIGBUS.
REQUIRED_SEALS = (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) if AVAILABLE else 0

#: Seconds after which an owner retires a region with nothing lent that no body went into
#: (20.4, ``shm_idle_retire_ms`` of spec/constants.json): a connection that stops sending large
#: bodies holds no shared memory a moment later, while back-to-back calls reuse warm pages.
IDLE_RETIRE = 1.0

#: Descriptors a sender attaches to one sendmsg, and a receiver makes room for in one recvmsg.
MAX_FDS_PER_WRITE = SHM_MAX_DESCRIPTORS_PER_WRITE

_NAME = "wirepool-shm"
_TMPFS_MAGIC = 0x01021994
_INT_SIZE = array.array("i").itemsize
_CONTROL_SPACE = socket.CMSG_SPACE(MAX_FDS_PER_WRITE * _INT_SIZE)
# Plain ints: the socket module's flags are enums, whose operators run Python code on every read.
_RECV_FLAGS = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
_MSG_CTRUNC = int(socket.MSG_CTRUNC)
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_RIGHTS = int(getattr(socket, "SCM_RIGHTS", 1))


def _error(code: ErrorCode, message: str) -> ProtocolError:
    return ProtocolError(code, message)


class OwnedRegion:
    """A region this process owns: a sealed memory file of ``size`` bytes, mapped read-write.

    ``buffer`` is the writable memoryview to build payloads in; ``fileno()`` the descriptor to
    send once. The owner must not write into a range it has lent and not had back (20.4).
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a region of {size} bytes")
        fd = os.memfd_create(_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.size = size
        self.buffer = memoryview(self._map)
        # A region dropped without close() still gives its descriptor back (never a leak).
        self._closer = weakref.finalize(self, os.close, fd)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        """Unmaps the region and closes its descriptor; the peer's mappings stay valid."""
        if self._fd >= 0:
            self.buffer.release()
            self._map.close()
            self._closer()
            self._fd = -1

    def __enter__(self) -> OwnedRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fs_type(fd: int) -> int:
    # Python has no fstatfs; struct statfs starts with f_type, a C long on Linux.
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(512)  # larger than struct statfs on every Linux ABI
    if libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value


class Region:
    """A region received from the peer, checked; views of it are mapped read-only.

    Build it with :meth:`map_received`. It keeps the descriptor until :meth:`close` (views need
    it to map their range); views outlive ``close``.
    """

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self.size = size
        # A region dropped without close() still gives its descriptor back (never a leak).
        self._closer = weakref.finalize(self, os.close, fd)

    @classmethod
    def map_received(cls, fd: int, size: int) -> Region:
        """Checks the descriptor of a SHM_REGION announcing ``size`` bytes and takes it.

        Raises :class:`ProtocolError` ``SHM_BAD_DESCRIPTOR`` (and closes ``fd``) for a file that
        is not a sealable memory file, lacks :data:`REQUIRED_SEALS`, is not on tmpfs (a hugetlbfs
        file can SIGBUS when its pool runs dry) or whose size is not ``size``; ``SHM_BAD_REGION``
        for a size of 0. The seals are checked before anything is mapped.
        """
        try:
            if size < 1:
                raise _error(ErrorCode.SHM_BAD_REGION, f"a region of {size} bytes")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError as e:
                raise _error(ErrorCode.SHM_BAD_DESCRIPTOR,
                             f"not a sealable memory file (F_GET_SEALS: {e})") from None
            if seals & REQUIRED_SEALS != REQUIRED_SEALS:
                raise _error(ErrorCode.SHM_BAD_DESCRIPTOR, "the memory file is not sealed against "
                             f"shrinking and growing (seals {seals:#x})")
            try:
                fs_type = _fs_type(fd)
            except OSError as e:
                raise _error(ErrorCode.SHM_BAD_DESCRIPTOR, f"fstatfs: {e}") from None
            if fs_type != _TMPFS_MAGIC:
                raise _error(ErrorCode.SHM_BAD_DESCRIPTOR,
                             f"the memory file is not on tmpfs (filesystem {fs_type:#x})")
            actual = os.fstat(fd).st_size
            if actual != size:
                raise _error(ErrorCode.SHM_BAD_DESCRIPTOR, f"the memory file has {actual} bytes, "
                             f"its SHM_REGION announced {size}")
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size)

    def lend(self, offset: int, length: int,
             on_release: Callable[[], None] | None = None) -> memoryview:
        """A read-only view of ``length`` bytes at ``offset``, its own mapping of the range.

        ``on_release`` runs once, when the view and every memoryview made from it are released
        or collected (the driver sends SHM_RELEASE then). An empty range or one past the region
        is ``SHM_BOUNDS``.
        """
        if length < 1 or offset < 0 or offset + length > self.size:
            raise _error(ErrorCode.SHM_BOUNDS,
                         f"bytes {offset} + {length} of a region of {self.size} bytes")
        if self._fd < 0:
            raise ValueError("the region is closed")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapped = mmap.mmap(self._fd, offset - start + length, flags=mmap.MAP_SHARED,
                               prot=mmap.PROT_READ, offset=start)
        except OSError as e:
            raise _error(ErrorCode.SHM_BAD_DESCRIPTOR, f"mmap of {length} bytes: {e}") from None
        if on_release is not None:
            weakref.finalize(mapped, on_release)
        return memoryview(mapped)[offset - start:]

    def close(self) -> None:
        """Closes the descriptor; views already lent stay valid."""
        if self._fd >= 0:
            self._closer()
            self._fd = -1

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def send_with_fds(sock: socket.socket, buffers: Sequence[bytes | bytearray | memoryview],
                  fds: Sequence[int]) -> int:
    """Writes ``buffers`` with ``fds`` attached (``SCM_RIGHTS``, at most 8); returns the bytes sent.

    The kernel delivers the descriptors with the first byte of this write, so they travel even
    when the write is partial: the caller writes the rest without them.
    """
    if len(fds) > MAX_FDS_PER_WRITE:
        raise ValueError(f"{len(fds)} descriptors in one write")
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    return sock.sendmsg(buffers, ancillary)


def recv_into_with_fds(sock: socket.socket, buf: memoryview | bytearray) -> tuple[int, list[int]]:
    """Reads once into ``buf``: ``(bytes read, descriptors that came with them)``, in order.

    The descriptors are close-on-exec and the caller's to close. More than 8 in one read
    (``MSG_CTRUNC``) raises ``SHM_BAD_DESCRIPTOR``; the ones that did arrive are closed first.
    """
    n, ancillary, flags, _addr = sock.recvmsg_into([buf], _CONTROL_SPACE, _RECV_FLAGS)
    fds: list[int] = []
    if not ancillary and not flags & _MSG_CTRUNC:  # every read but a region's: nothing more
        return n, fds
    for level, kind, data in ancillary:
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(data[:len(data) - len(data) % _INT_SIZE])
            fds.extend(got)
    if flags & _MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        raise _error(ErrorCode.SHM_BAD_DESCRIPTOR,
                     f"more than {MAX_FDS_PER_WRITE} descriptors in one read (MSG_CTRUNC)")
    return n, fds
