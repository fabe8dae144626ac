"""A pool of remote workers end to end (PROTOCOL.md 21.5, 21.6): real worker processes join
over TLS on loopback, through a test proxy that can cut or blackhole their connections.

- a cut connection ends each request in flight with exactly one WORKER_EXITED (connection
  lost), and the pool replaces the worker;
- a blackholed one is found by the parent's heartbeat (WORKER_HUNG) within its bound, and the
  worker, whose PINGs go unanswered too, exits by itself;
- a worker whose parent vanishes exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import wirepool
from wirepool import launchers, remote

pytest.importorskip("cryptography")

WORKER = str(Path(__file__).parent / "workers" / "basic.py")
HEARTBEAT_MS = 200


class Proxy:
    """A TCP relay between workers and the pool's listener: ``cut()`` aborts every relayed
    connection (both ends); ``blackhole()`` stops relaying bytes but keeps them open."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.holes = False
        self.pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> "Proxy":
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _relay(self, r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
        r2, w2 = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.pairs.append((w1, w2))

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while True:
                    data = await r.read(65536)
                    if not data:
                        break
                    if not self.holes:
                        w.write(data)
                        await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()
        for r, w in ((r1, w2), (r2, w1)):
            t = asyncio.get_running_loop().create_task(pump(r, w))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    def cut(self) -> None:
        for a, b in self.pairs:
            a.transport.abort()
            b.transport.abort()
        self.pairs.clear()

    def blackhole(self) -> None:
        self.holes = True

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class ProxiedChildren(launchers.Subprocess):
    """Worker processes that join through the proxy (started once the listener is up)."""

    proxy: Proxy | None = None
    stops_children = True  # False: a lost worker is left to leave by itself

    def stop(self, handle: Any) -> None:
        if self.stops_children:
            super().stop(handle)

    async def open(self, pool: Any) -> None:
        await super().open(pool)
        if self.proxy is None:
            self.proxy = await Proxy(self.listener.port).start()

    def worker_ticket(self, ticket: remote.Ticket) -> remote.Ticket:
        assert self.proxy is not None
        return dataclasses.replace(ticket, port=self.proxy.port)

    async def close(self) -> None:
        self.stops_children = True
        await super().close()
        if self.proxy is not None:
            await self.proxy.close()


def _pool(launcher: launchers.Launcher, workers: int = 2) -> wirepool.AsyncPool:
    return wirepool.AsyncPool([sys.executable, WORKER], workers=workers, launcher=launcher,
                              heartbeat_ms=HEARTBEAT_MS, restart_backoff=0.01,
                              worker_output="discard", drain_grace=2.0)


async def _full(pool: wirepool.AsyncPool, size: int, within: float) -> None:
    deadline = time.monotonic() + within
    while len(pool.workers) < size:
        assert time.monotonic() < deadline, f"{len(pool.workers)} of {size} workers"
        await asyncio.sleep(0.01)


def test_heartbeat_off_still_pings_a_remote_worker_at_the_default() -> None:
    """21.5 through proto.negotiate's ``remote``: a pool configured with heartbeat_ms 0 sends
    its remote workers 1,000 ms in the WELCOME and pings them at that period (it used to
    refuse to open)."""
    async def main() -> None:
        pool = wirepool.AsyncPool([sys.executable, WORKER], workers=1,
                                  launcher=launchers.Subprocess(), heartbeat_ms=0,
                                  worker_output="discard", drain_grace=2.0)
        async with pool:
            assert await pool.call("add", {"a": 2, "b": 3}) == {"sum": 5}
            (w,) = pool.workers
            welcome = w.conn.welcome()
            assert welcome is not None and welcome.heartbeat_ms == 1000
            assert w.heartbeat_ms == 1000 and w.heartbeat_task is not None
    asyncio.run(asyncio.wait_for(main(), 60))


def test_remote_workers_serve_calls_and_streams_and_leave_at_close() -> None:
    async def main() -> None:
        launcher = launchers.Subprocess()
        async with _pool(launcher) as pool:
            assert await pool.call("add", {"a": 2, "b": 3}) == {"sum": 5}
            rows = [r async for r in pool.stream("rows", {"n": 1000})]
            assert len(rows) == 1000
            big = "x" * (6 << 20)  # continued messages over TLS
            assert await pool.call("echo", big) == big
            pids = {await pool.call("pid") for _ in range(20)}
            children = set(launcher.children)
            assert pids <= children and len(children) == 2
            for w in pool.workers:
                assert w.where.startswith("worker 127.0.0.1 pid ") and w.pid in children
        # Closed: every child said GOODBYE and exited with status 0.
        assert not launcher.children
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_cut_connection_ends_each_request_once_and_the_worker_is_replaced() -> None:
    async def main() -> None:
        launcher = ProxiedChildren()
        async with _pool(launcher) as pool:
            assert launcher.proxy is not None
            calls = [asyncio.ensure_future(pool.call("sleep", {"seconds": 30}))
                     for _ in range(6)]
            while sum(len(w.requests) for w in pool.workers) < 6:
                await asyncio.sleep(0.01)
            old = set(launcher.children)
            started = time.monotonic()
            launcher.proxy.cut()
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert time.monotonic() - started < 5
            for o in outcomes:
                assert isinstance(o, wirepool.WorkerExited), o
                assert o.details["connection"] == "lost" and o.details["host"] == "127.0.0.1"
                assert "lost its connection" in o.message and o.exit_status is None
            await _full(pool, 2, within=20)
            assert await pool.call("add", {"a": 1, "b": 1}) == {"sum": 2}
            assert not old & {w.pid for w in pool.workers}
            assert pool.metrics()["restarts"] == 2
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_blackholed_connection_is_found_by_heartbeats_on_both_sides() -> None:
    async def main() -> None:
        launcher = ProxiedChildren()
        async with _pool(launcher, workers=1) as pool:
            assert launcher.proxy is not None
            call = asyncio.ensure_future(pool.call("sleep", {"seconds": 30}))
            while not pool.workers[0].requests:
                await asyncio.sleep(0.01)
            child = next(iter(launcher.children.values()))
            launcher.stops_children = False
            started = time.monotonic()
            launcher.proxy.blackhole()
            with pytest.raises(wirepool.WorkerHung):
                await call
            # 3 heartbeats and a quarter (the check's tick), plus a loaded machine's slack.
            assert time.monotonic() - started < 3.25 * HEARTBEAT_MS / 1000 + 2.0
            # The worker saw no PONG either and left by itself (status 0, as after EOF),
            # though the proxy still holds its connection open.
            status = await asyncio.wait_for(child.wait(), 3 * HEARTBEAT_MS / 1000 + 5)
            assert status == 0
    asyncio.run(asyncio.wait_for(main(), 60))


PARENT = """
import asyncio, os, sys, wirepool
from wirepool import launchers

async def main():
    launcher = launchers.External(on_ticket=lambda t: print(t.encode(), flush=True))
    async with wirepool.AsyncPool([sys.executable], workers=1, launcher=launcher,
                                  heartbeat_ms=200) as pool:
        print("ready", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_remote_worker_whose_parent_vanishes_exits(how: str) -> None:
    """Killed: the kernel closes the parent's end (end of file). Stopped: the connection stays
    up but nothing answers, and only the worker's own heartbeat can tell."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    worker = None
    try:
        assert parent.stdout is not None
        ticket = parent.stdout.readline().strip()
        env = dict(os.environ, WIREPOOL_TICKET=ticket)
        worker = subprocess.Popen([sys.executable, WORKER], env=env, stdin=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        assert parent.stdout.readline().strip() == "ready"
        started = time.monotonic()
        os.kill(parent.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        status = worker.wait(timeout=10)
        assert status == 0
        elapsed = time.monotonic() - started
        assert worker.stderr is not None
        err = worker.stderr.read()
        if how == "stopped":
            assert "the parent is gone: no PONG" in err, err
            assert 3 * 0.2 <= elapsed < 3.25 * 0.2 + 5
        else:
            assert elapsed < 5
    finally:
        for p in (parent, worker):  # SIGKILL ends a stopped process too
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait(timeout=10)


def test_a_worker_with_a_bad_ticket_exits_1_saying_why() -> None:
    env = dict(os.environ, WIREPOOL_TICKET="not a ticket")
    env.pop("WIREPOOL_FD", None)
    r = subprocess.run([sys.executable, WORKER], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "not a wirepool ticket" in r.stderr
