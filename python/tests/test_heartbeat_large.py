"""The parent's PING beside its own large request (PROTOCOL.md 8.5): the pool hands a large
request to its transport a frame at a time, so a PING goes at the next frame boundary instead
of behind the whole request, and a request of any size over a slow link never makes a healthy
worker look hung. The link is a relay passing the pool's bytes at 40 MB/s: a 48 MiB request
takes over a second, the heartbeat is 200 ms (hung after 600 ms without a PONG), frames are
1 MiB (25 ms each). Before, the PING waited behind the rest of the request and the call ended
WORKER_HUNG. (The kernel's socket buffers between pool and relay, a few MiB, still hold bytes
no queue order can get ahead of: ~0.2 s at this rate.)"""

from __future__ import annotations

import os
import sys
import time

import pytest

import wirepool
from wirepool._pooled_worker import _PARKED, _Worker

HERE = os.path.dirname(__file__)
# The relay every SDK's heartbeat test uses: DOWN_RATE UP_RATE worker-command...
RELAY = os.path.join(HERE, "..", "..", "conformance", "tools", "slow_relay.py")
BASIC = os.path.join(HERE, "workers", "basic.py")
RATE = 40_000_000
pytestmark = pytest.mark.serial  # 600 ms without a PONG is hung: not beside another test's load


def test_a_large_request_over_a_slow_link_keeps_its_worker_alive_with_a_short_heartbeat(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[int] = []  # sizes of the mid-frame pieces the caller left to the loop
    real = _Worker._send_rest

    def send_rest(self: _Worker, rest_of_frame: bytes, frames: memoryview) -> None:
        handed.append(len(rest_of_frame))
        real(self, rest_of_frame, frames)

    monkeypatch.setattr(_Worker, "_send_rest", send_rest)
    argv = [sys.executable, RELAY, "0", str(RATE), sys.executable, BASIC]
    # Over the socket (the relay passes no descriptors), as over a remote link; the blocking
    # pool, so that the call starts on the caller's direct path and its unsent end is handed to
    # the loop (the case that begins mid-frame).
    with wirepool.Pool(argv, workers=1, heartbeat_ms=200, shm_lane=False,
                       max_frame_size=1 << 20, startup_timeout=20) as pool:
        pid = pool.pids[0]
        body = bytes(range(256)) * (48 << 12)  # 48 MiB
        # The heartbeat takes a parked worker back to the loop for each PING until its PONG
        # is read, so a call made just after the worker was seen parked can still find it on
        # the loop (whole frames, nothing handed over): seen in CI under load. Each attempt
        # checks the heartbeat property; the direct path must be taken in one of them.
        for _attempt in range(6):
            deadline = time.monotonic() + 20
            while not any(w.direct == _PARKED for w in pool._apool.workers):
                assert time.monotonic() < deadline, "the worker was never parked"
                pool.call("add", {"a": 0, "b": 0})  # a call through the loop parks its worker
            handed.clear()
            started = time.monotonic()
            echoed = pool.call("echo", body, codec="raw", timeout=60)
            took = time.monotonic() - started
            assert bytes(echoed) == body, "the body came back changed"
            # The link was slow enough for the old order to fail: many heartbeats passed.
            assert took > 1.0, f"48 MiB at 40 MB/s took only {took:.2f} s"
            assert pool.pids == [pid], "the worker was replaced"
            m = pool.metrics()
            assert m.get("restarts", 0) == 0, m
            if handed:
                break
        # The caller wrote what the socket took, then left the rest (from inside a frame)
        # to the loop: at most one frame of it goes before the frame boundary.
        assert len(handed) == 1 and 0 < handed[0] <= (1 << 20) + 16, handed


def test_the_same_from_the_loop() -> None:
    """AsyncPool: the request leaves from the loop whole (no direct caller)."""
    import asyncio

    async def main() -> None:
        argv = [sys.executable, RELAY, "0", str(RATE), sys.executable, BASIC]
        async with wirepool.AsyncPool(argv, workers=1, heartbeat_ms=200, shm_lane=False,
                                      max_frame_size=1 << 20, startup_timeout=20) as pool:
            body = bytes(range(256)) * (48 << 12)
            started = time.monotonic()
            echoed = await pool.call("echo", body, codec="raw", timeout=60)
            assert bytes(echoed) == body
            assert time.monotonic() - started > 1.0
            assert pool.metrics().get("restarts", 0) == 0

    asyncio.run(main())
