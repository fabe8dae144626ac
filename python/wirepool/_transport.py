"""The asyncio side of one connection, shared by the pool's workers and the worker runtime.

The sans-IO core (`proto.Connection`) decides every byte; this base only moves them: frames
queued during one loop pass leave in one write, and reads land where the core says
(`read_buffer`: a reused buffer, or straight in a large frame's own buffer). Subclasses implement
`data_received`, called with the bytes of a plain ``data_received`` or with ``b""`` after a read
the core already has.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import proto

# Frames below this size are joined into one buffer before the write; larger ones go as they are.
_JOIN_BELOW = 65536


class FrameProtocol(asyncio.BufferedProtocol):
    def __init__(self, conn: proto.Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self._loop = loop
        self._out: list[Any] = []
        self._out_scheduled = False
        self.bytes_sent = 0  # for metrics
        self.bytes_received = 0

    def _write(self, parts: list[Any]) -> None:
        self._out.extend(parts)
        if not self._out_scheduled:
            self._out_scheduled = True
            self._loop.call_soon(self._flush_out)

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

    def _send(self, out: list[Any]) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if len(out) == 1 and type(out[0]) is bytes:  # one frame: no joining copy
            self.bytes_sent += len(out[0])
            t.write(out[0])
            return
        small = bytearray()
        for p in out:
            self.bytes_sent += len(p)
            if len(p) < _JOIN_BELOW:
                small += p
            else:
                if small:
                    t.write(small)
                    small = bytearray()
                t.write(p)
        if small:
            t.write(small)

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
