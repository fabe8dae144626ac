"""A PING or PONG written while a large message is on its way goes at the next frame boundary,
not behind the whole message (PROTOCOL.md 8.5): the transport is handed a large output a frame
at a time as it drains (``_transport._FEED_LIMIT``), and the PONG goes between two frames."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from pathlib import Path
from typing import Any, cast

from wirepool import _transport, proto

FRAME = 1 << 20
TOTAL = 64 << 20


class _Writer(_transport.FrameProtocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        pass


def _message(id: int) -> list[Any]:
    body = memoryview(bytearray(TOTAL))
    parts: list[Any] = []
    for at in range(0, TOTAL, FRAME):
        ty = 0x12 if at == 0 else 0x7F
        more = 1 if at + FRAME < TOTAL else 0
        parts.append(struct.pack("<IBBHQ", FRAME, ty, more, 0, id))
        parts.append(body[at:at + FRAME])
    return parts


def _frames(wire: bytes) -> list[tuple[int, int]]:
    """(type, first byte) of each frame."""
    out = []
    at = 0
    while at < len(wire):
        length, ty = struct.unpack_from("<IB", wire, at)
        out.append((ty, at))
        at += 16 + length
    assert at == len(wire)
    return out


async def _run() -> None:
    loop = asyncio.get_running_loop()
    mine, peer = socket.socketpair()
    peer.setblocking(False)
    writer = _Writer(cast(proto.Connection, None), loop)
    await loop.connect_accepted_socket(lambda: writer, mine)
    pong = bytes(struct.pack("<IBBHQ", 8, 0x32, 0, 0, 0)) + b"nonce-01"
    writer._write(_message(3))
    writer._flush_out()
    wire = bytearray()
    while len(wire) < 8 << 20:
        wire += await loop.sock_recv(peer, 1 << 20)
    queued_at = len(wire)
    writer._write([pong])
    while len(wire) < TOTAL + TOTAL // FRAME * 16 + len(pong):
        wire += await asyncio.wait_for(loop.sock_recv(peer, 1 << 20), 30)
    frames = _frames(bytes(wire))
    pongs = [at for ty, at in frames if ty == 0x32]
    assert len(pongs) == 1
    # Ahead of it: what the transport and the socket already held, at most the feed's limit,
    # the frame under way and the socket's buffers; never the rest of the 64 MiB.
    sndbuf = mine.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    rcvbuf = peer.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    ahead = pongs[0] - queued_at
    assert ahead <= _transport._FEED_LIMIT + 2 * (FRAME + 16) + sndbuf + rcvbuf, ahead
    # The message's frames are whole and in order around it.
    ids = [ty for ty, _ in frames if ty != 0x32]
    assert ids == [0x12] + [0x7F] * (TOTAL // FRAME - 1)
    writer.transport.close()  # type: ignore[union-attr]
    peer.close()


def test_a_pong_written_during_a_large_message_goes_at_the_next_frame_boundary() -> None:
    asyncio.run(asyncio.wait_for(_run(), 60))


def test_frame_end_and_split_frames_walk_whole_frames() -> None:
    parts = _message(7)[:8]  # four 1 MiB frames of a message, header and body apart
    data = b"".join(bytes(p) for p in parts)
    size = 16 + FRAME
    assert [_transport.frame_end(data, pos) for pos in (0, 15, 16, size - 1, size, 3 * size + 5)] \
        == [size, size, size, size, 2 * size, 4 * size]
    frames = _transport.split_frames(memoryview(data)[size:])
    assert [len(f) for f in frames] == [size] * 3
    assert [bytes(f[:16]) for f in frames] == [bytes(parts[k]) for k in (2, 4, 6)]


BOUND = json.loads((Path(__file__).resolve().parents[2] / "spec" / "constants.json")
                   .read_text())["driver"]["max_handed_ahead_bytes"]


def test_the_handed_ahead_bound_is_the_spec_s() -> None:
    assert _transport.MAX_HANDED_AHEAD_BYTES == BOUND
    assert _transport._FEED_LIMIT == _transport.MAX_HANDED_AHEAD_BYTES


SMALL = 60 << 10  # each result below the 64 KiB that used to go uncounted


def _result(id: int) -> list[Any]:
    return [struct.pack("<IBBHQ", SMALL, 0x11, 0, 0, id), memoryview(bytearray(SMALL))]


async def _run_small() -> None:
    loop = asyncio.get_running_loop()
    mine, peer = socket.socketpair()
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    peer.setblocking(False)
    writer = _Writer(cast(proto.Connection, None), loop)
    transport, _ = await loop.connect_accepted_socket(lambda: writer, mine)
    bound = BOUND
    count = 3 * bound // SMALL  # 12 MiB of results nobody reads yet
    most = 0
    # Queued as a busy worker does, a few results per flush, the loop never running meanwhile
    # (so the transport writes nothing more to the socket).
    for id in range(1, count + 1):
        writer._write(_result(id))
        if id % 8 == 0:
            writer._flush_out()
            most = max(most, transport.get_write_buffer_size())
    writer._flush_out()
    most = max(most, transport.get_write_buffer_size())
    # Whole frames only while under the bound: at most the bound and one frame.
    assert most < bound + 16 + SMALL, most
    pong = bytes(struct.pack("<IBBHQ", 8, 0x32, 0, 0, 0)) + b"nonce-01"
    writer._write([pong])
    total = count * (16 + SMALL) + len(pong)
    wire = bytearray()
    while len(wire) < total:
        wire += await asyncio.wait_for(loop.sock_recv(peer, 1 << 20), 30)
        most = max(most, transport.get_write_buffer_size())
    assert most < bound + 16 + SMALL, most
    frames = _frames(bytes(wire))
    at = [i for i, (ty, _) in enumerate(frames) if ty == 0x32]
    assert len(at) == 1
    # The PONG went ahead of what waited in the backlog: behind at most the bound, one frame
    # and the socket buffers, never behind all 12 MiB.
    assert at[0] * (16 + SMALL) <= bound + 16 + SMALL + (1 << 20), at[0]
    assert [ty for ty, _ in frames if ty != 0x32] == [0x11] * count
    transport.close()
    peer.close()


def test_many_small_results_behind_a_slow_reader_stay_bounded_at_the_transport() -> None:
    asyncio.run(asyncio.wait_for(_run_small(), 60))
