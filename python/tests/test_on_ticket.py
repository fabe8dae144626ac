"""``External(on_ticket=...)``'s threading (issue 28): a plain callback runs off the pool's event
loop, so one that blocks while its worker starts (as ``ssh host worker`` would) does not stall
the listener that worker connects to; a coroutine function is awaited on the loop; what either
raises is raised by the pool's start."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import wirepool
from wirepool import launchers, remote

pytest.importorskip("cryptography")

WORKER = str(Path(__file__).parent / "workers" / "basic.py")


def _parked(listener: remote.Listener) -> int:
    """Workers that joined (TLS and JOIN checked) and wait for a slot of the pool."""
    return sum(len(q) for q in listener._parked.values())


def test_a_blocking_on_ticket_does_not_stall_the_listener() -> None:
    """The callback starts its worker, then blocks (2 s, then until the listener has
    authenticated that worker). On the loop, nothing would be accepted while it blocks: it
    would give up after 30 s and the pool's start would raise its error."""
    children: list[subprocess.Popen[bytes]] = []
    seen: dict[str, Any] = {}

    def start_and_wait(ticket: remote.Ticket) -> None:
        seen["thread"] = threading.current_thread()
        env = dict(os.environ, WIREPOOL_TICKET=ticket.encode())
        env.pop("WIREPOOL_FD", None)
        children.append(subprocess.Popen([sys.executable, WORKER], env=env,
                                         stdin=subprocess.DEVNULL))
        time.sleep(2.0)  # the blocking under test: longer than a TLS handshake needs
        deadline = time.monotonic() + 30
        while _parked(launcher.listener) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not join while on_ticket blocked")
            time.sleep(0.02)
        seen["parked"] = _parked(launcher.listener)

    launcher = launchers.External(on_ticket=start_and_wait)

    async def main() -> None:
        loop_thread = threading.current_thread()
        async with wirepool.AsyncPool([sys.executable, WORKER], workers=1, launcher=launcher,
                                      worker_output="discard", drain_grace=2.0) as pool:
            assert seen["thread"] is not loop_thread
            assert seen["parked"] == 1
            assert await pool.call("add", {"a": 2, "b": 3}) == {"sum": 5}
    try:
        asyncio.run(asyncio.wait_for(main(), 90))
        assert children[0].wait(timeout=10) == 0  # GOODBYE at close, then exit 0
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
            c.wait(timeout=10)


def test_an_on_ticket_error_is_raised_by_the_pool_start() -> None:
    def broken(ticket: remote.Ticket) -> None:
        raise OSError(28, "No space left on device")

    async def main() -> None:
        pool = wirepool.AsyncPool([sys.executable, WORKER], workers=1,
                                  launcher=launchers.External(on_ticket=broken))
        with pytest.raises(OSError, match="No space left"):
            await pool.start()
        await pool.close(grace=0)
    asyncio.run(asyncio.wait_for(main(), 30))


def test_an_async_on_ticket_is_awaited_on_the_loop() -> None:
    seen: dict[str, Any] = {}

    async def publish(ticket: remote.Ticket) -> None:
        seen["loop"] = asyncio.get_running_loop()
        await asyncio.sleep(0)
        raise ValueError("published nowhere")

    async def main() -> None:
        pool = wirepool.AsyncPool([sys.executable, WORKER], workers=1,
                                  launcher=launchers.External(on_ticket=publish))
        with pytest.raises(ValueError, match="published nowhere"):
            await pool.start()
        assert seen["loop"] is asyncio.get_running_loop()
        await pool.close(grace=0)
    asyncio.run(asyncio.wait_for(main(), 30))
