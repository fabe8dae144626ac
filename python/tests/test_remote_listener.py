"""The listener withstands hostile peers (PROTOCOL.md 21.4): bad or no tickets, slow handshakes,
garbage before TLS, crowds. Each connection is refused within its bound; what the listener
holds (pending connections, file descriptors, memory) comes back to where it was; every refusal
is logged once with the peer's address, at a bounded rate.

The peers are in this process (asyncio clients), so the bounds are measured from their side:
the time from connecting to seeing the listener close the connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import ssl
import time
import tracemalloc
from typing import Any, Awaitable, Callable

import pytest

from wirepool import proto, remote

pytest.importorskip("cryptography")

JOIN_TIMEOUT = 0.5
# A refusal's bound: the join timeout plus scheduling slack on a loaded 2-vCPU machine.
BOUND = JOIN_TIMEOUT + 3.0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _client_tls() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([remote.ALPN])
    return ctx


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while True:
        try:
            chunk = await reader.read(65536)
        except (ConnectionError, ssl.SSLError):
            return data
        if not chunk:
            return data
        data += chunk


async def _timed(peer: Callable[[], Awaitable[bytes]]) -> tuple[float, bytes]:
    start = time.monotonic()
    try:
        data = await asyncio.wait_for(peer(), BOUND + 5)
    except (ConnectionError, ssl.SSLError):  # closed at accept (too many pending)
        data = b""
    return time.monotonic() - start, data


def _garbage(port: int) -> Callable[[], Awaitable[bytes]]:
    async def peer() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(200))
        try:
            return await _until_closed(reader)
        finally:
            writer.close()
    return peer


def _slow(port: int) -> Callable[[], Awaitable[bytes]]:
    async def peer() -> bytes:  # the start of a TLS record header, then nothing
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x16\x03\x01")
        try:
            return await _until_closed(reader)
        finally:
            writer.close()
    return peer


def _no_ticket(port: int) -> Callable[[], Awaitable[bytes]]:
    async def peer() -> bytes:  # TLS is fine, then 10 bytes of a JOIN block and nothing
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=_client_tls(),
                                                       server_hostname="localhost")
        writer.write(b"WIREJOIN\x01\x00")
        try:
            return await _until_closed(reader)
        finally:
            writer.close()
    return peer


def _bad_ticket(ticket: remote.Ticket) -> Callable[[], Awaitable[bytes]]:
    async def peer() -> bytes:  # right address and fingerprint, an id the listener never issued
        forged = dataclasses.replace(ticket, id=os.urandom(16), secret=os.urandom(32))
        reader, writer = await asyncio.open_connection("127.0.0.1", ticket.port,
                                                       ssl=_client_tls(),
                                                       server_hostname="localhost")
        writer.write(forged.join_block())
        try:
            return await _until_closed(reader)
        finally:
            writer.close()
    return peer


def _no_tls_client(port: int) -> Callable[[], Awaitable[bytes]]:
    async def peer() -> bytes:  # connects and says nothing at all
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await _until_closed(reader)
        finally:
            writer.close()
    return peer


async def _crowd(peers: list[Callable[[], Awaitable[bytes]]], at_once: int
                 ) -> list[tuple[float, bytes]]:
    gate = asyncio.Semaphore(at_once)

    async def one(p: Callable[[], Awaitable[bytes]]) -> tuple[float, bytes]:
        async with gate:
            return await _timed(p)
    return await asyncio.gather(*(one(p) for p in peers))


def test_hostile_crowd_is_refused_within_bounds_and_leaves_nothing(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, "wirepool.remote")

    async def main() -> None:
        async with remote.Listener(join_timeout=JOIN_TIMEOUT, max_pending=64) as listener:
            ticket = listener.issue()
            port = listener.port
            kinds = {"garbage": _garbage(port), "slow": _slow(port),
                     "no ticket": _no_ticket(port), "bad ticket": _bad_ticket(ticket),
                     "silent": _no_tls_client(port)}
            # Warm up (first TLS handshakes, lazy imports), then measure what a crowd leaves.
            await _crowd(list(kinds.values()), 5)
            gc.collect()
            fds_before = _fds()
            tracemalloc.start()
            mem_before = tracemalloc.get_traced_memory()[0]
            per_kind = 40
            peers = [p for p in kinds.values() for _ in range(per_kind)]
            results = await _crowd(peers, 60)
            for (elapsed, data), name in zip(results, [k for k in kinds for _ in range(per_kind)]):
                assert elapsed < BOUND, (name, elapsed)
                if name == "bad ticket":  # the generic refusal, nothing else
                    frames = proto.decode_all(data)
                    assert [(f.code, f.message) for f in frames] == [(119, "join refused")], name
                else:
                    assert data == b"" or name == "garbage", (name, data[:50])
            for _ in range(300):  # the listener's side of the last closes
                if listener.pending == 0:
                    break
                await asyncio.sleep(0.01)
            assert listener.pending == 0
            assert listener.counters["joined"] == 0
            refused = listener.counters["refused"]
            assert refused == listener.counters["accepted"] == len(peers) + len(kinds), \
                listener.counters
            for _ in range(300):  # aborted refusals release their descriptors at once,
                gc.collect()      # answered ones within a second (21.4)
                if _fds() <= fds_before + 2:
                    break
                await asyncio.sleep(0.01)
            assert _fds() <= fds_before + 2
            for _ in range(300):  # (a TLS close may wait for the peer's close_notify)
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0] - mem_before
                if grown < 512 * 1024:
                    break
                await asyncio.sleep(0.01)
            tracemalloc.stop()
            assert grown < 512 * 1024, f"{grown} bytes held after {len(peers)} refusals"
            # Still serves an honest worker afterwards.
            accepting = asyncio.ensure_future(listener.accept(timeout=10))
            honest = await remote.connect(ticket, asyncio.Protocol(), timeout=5)
            joined = await accepting
            joined.close()
            honest.close()
    asyncio.run(asyncio.wait_for(main(), 120))
    causes = {"tls handshake failed", "join timeout", "unknown or revoked ticket"}
    lines = [r.getMessage() for r in caplog.records if r.name == "wirepool.remote"]
    for cause in causes:
        assert any(cause in line and "127.0.0.1:" in line for line in lines), (cause, lines[:5])


def test_pending_connections_are_capped() -> None:
    async def main() -> None:
        async with remote.Listener(join_timeout=2.0, max_pending=4) as listener:
            port = listener.port
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
            for _ in range(300):
                if listener.pending == 4:
                    break
                await asyncio.sleep(0.01)
            assert listener.pending == 4
            # The next ones are closed at accept, long before the join timeout.
            results = await _crowd([_no_tls_client(port) for _ in range(20)], 20)
            assert all(elapsed < 1.5 for elapsed, _ in results), results
            assert listener.counters["refused too many pending"] == 20
            assert listener.pending == 4
            for _r, w in held:
                w.close()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_refusals_are_logged_at_a_bounded_rate(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, "wirepool.remote")

    async def main() -> float:
        async with remote.Listener(refusal_log_per_second=3) as listener:
            start = time.monotonic()
            await _crowd([_garbage(listener.port) for _ in range(30)], 30)
            elapsed = time.monotonic() - start
            for _ in range(300):
                if listener.counters["refused"] == 30:
                    break
                await asyncio.sleep(0.01)
            assert listener.counters["refused"] == 30
            return elapsed
    elapsed = asyncio.run(asyncio.wait_for(main(), 60))
    lines = [r.getMessage() for r in caplog.records if r.name == "wirepool.remote"]
    one_by_one = [line for line in lines if line.startswith("join from")]
    windows = int(elapsed) + 2
    assert 3 <= len(one_by_one) <= 3 * windows, (elapsed, lines)
    assert len(one_by_one) < 30


def test_a_parked_join_is_refused_when_no_slot_comes() -> None:
    async def main() -> None:
        async with remote.Listener(hello_timeout=0.5) as listener:
            ticket = listener.issue()

            class Reader(asyncio.Protocol):
                def __init__(self) -> None:
                    self.data = bytearray()
                    self.closed = asyncio.get_running_loop().create_future()

                def data_received(self, data: bytes) -> None:
                    self.data += data

                def connection_lost(self, exc: Exception | None) -> None:
                    self.closed.set_result(None)

            r = Reader()
            start = time.monotonic()
            await remote.connect(ticket, r, timeout=5)
            await asyncio.wait_for(r.closed, 5)
            assert time.monotonic() - start < 0.5 + 3.0
            frames = proto.decode_all(bytes(r.data))
            assert [(f.code, f.message) for f in frames] == \
                [(119, "join refused: the pool is full")]
            assert listener.counters["refused pool full"] == 1 and listener.pending == 0
    asyncio.run(asyncio.wait_for(main(), 30))
