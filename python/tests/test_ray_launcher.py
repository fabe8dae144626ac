"""The Ray launcher (PROTOCOL.md 21.8) against a local Ray cluster: each worker runs in a Ray
actor and joins the pool over TLS with a ticket of its own; a killed actor is a lost worker
(WORKER_EXITED for its requests) that the pool replaces by its own policy.

Skipped when Ray is not installed (``pip install 'wirepool[ray]'``); CI installs it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import wirepool

ray = pytest.importorskip("ray")
pytest.importorskip("cryptography")

from wirepool.launchers import RayLauncher  # noqa: E402

WORKER = str(Path(__file__).parent / "workers" / "basic.py")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.timeout(180)
def test_ray_workers_serve_and_a_killed_actor_is_replaced(ray_cluster: None) -> None:
    async def main() -> None:
        launcher = RayLauncher(num_cpus=0.5, host="127.0.0.1")
        async with wirepool.AsyncPool([sys.executable, WORKER], workers=2, launcher=launcher,
                                      heartbeat_ms=500, startup_timeout=60,
                                      worker_output="discard") as pool:
            assert await pool.call("add", {"a": 1, "b": 2}) == {"sum": 3}
            assert len(launcher.actors) == 2
            call = asyncio.ensure_future(pool.call("sleep", {"seconds": 60}))
            while not any(w.requests for w in pool.workers):
                await asyncio.sleep(0.01)
            victim = next(w for w in pool.workers if w.requests)
            doomed = _actor_of(victim)
            ray.kill(doomed, no_restart=True)
            with pytest.raises(wirepool.WorkerExited) as e:
                await asyncio.wait_for(call, 30)
            assert e.value.details["connection"] == "lost"
            deadline = time.monotonic() + 60
            while len(pool.workers) < 2 or victim in pool.workers:
                assert time.monotonic() < deadline, "the pool did not get back to 2 workers"
                await asyncio.sleep(0.05)
            assert pool.metrics()["restarts"] == 1
            assert await pool.call("add", {"a": 2, "b": 2}) == {"sum": 4}
            # The lost worker's actor gets the goodbye grace to end by itself before the launcher
            # stops it; the replacement usually comes sooner (10 ms backoff).
            while id(doomed) in launcher.actors:
                assert time.monotonic() < deadline, "the lost worker's actor was never stopped"
                await asyncio.sleep(0.05)
            assert len(launcher.actors) == 2
        assert not launcher.actors  # every actor killed with its worker
    asyncio.run(asyncio.wait_for(main(), 170))


def _actor_of(worker: Any) -> Any:
    """The actor a worker runs in: its launch handle, kept by its connection's protocol."""
    return worker.transport.get_protocol().handle
