"""The Python parent's end of the shared-memory lane (PROTOCOL.md section 20).

Against the Python test worker (``workers/shm_worker.py``) and the Rust conformance worker: a
16 MiB body crosses in each direction through sealed memory files (the socket carries only
frames of a few bytes), a ``raw`` result arrives as a read-only ``memoryview`` of the worker's
region, and nothing the lane mapped or received stays in the parent once it is unused: after 30
calls, after the worker is SIGKILLed holding the parent's region, and after close. A worker
with the lane off, or a parent with ``shm_lane=False``, still echoes over the socket.
"""

from __future__ import annotations

import gc
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import wirepool
from wirepool import _pooled_worker as _pool

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the lane is Linux only (memfd, seals)"),
              pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
PY_WORKER = [sys.executable, str(Path(__file__).parent / "workers" / "shm_worker.py")]
BUILD_TIMEOUT_S = 1500  # a cold cargo build on a busy 2-vCPU machine
MIB = 1 << 20
PAYLOAD = os.urandom(16 * MIB)


@pytest.fixture(scope="module")
def rust_worker() -> str:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "rust" / "target"))
    done = subprocess.run(["cargo", "build", "-q", "-p", "wirepool-conformance", "--bin",
                           "conformance_worker"], cwd=REPO / "rust", capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, f"building the Rust conformance worker failed:\n{done.stderr}"
    binary = target / "debug" / "conformance_worker"
    assert binary.exists(), binary
    return str(binary)


def shm_maps() -> int:
    """Mappings of lane regions in this process (memfds are named wirepool-shm)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "wirepool-shm" in line)


def shm_fds() -> int:
    """Descriptors of lane regions this process holds."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "wirepool-shm" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, gone already
            pass
    return n


def eventually(check: Callable[[], bool], bound: float = 10.0) -> bool:
    """Polls ``check`` (a released view's SHM_RELEASE, an idle region's retirement, a dead
    worker's clean-up happen on the pool's loop thread) until it holds or ``bound`` passes."""
    give_up = time.monotonic() + bound
    while not check():
        if time.monotonic() > give_up:
            return False
        gc.collect()
        time.sleep(0.02)
    return True


def only_worker(pool: wirepool.Pool) -> Any:
    (w,) = pool._apool.workers
    return w


def echo_through_lane(pool: wirepool.Pool, method: str) -> None:
    w = only_worker(pool)
    sent, received = w.bytes_sent, w.bytes_received
    result = pool.call(method, PAYLOAD, codec="raw")
    # The result is a read-only view of the worker's region, not a copy off the socket.
    assert isinstance(result, memoryview) and isinstance(result.obj, mmap.mmap)
    assert result.readonly and result == PAYLOAD
    del result
    # Both bodies crossed in regions: the socket carried frames of a few dozen bytes each.
    assert w.bytes_sent - sent < 64 * 1024, w.bytes_sent - sent
    assert w.bytes_received - received < 64 * 1024, w.bytes_received - received


def test_python_worker_echoes_16_mib_through_the_lane() -> None:
    with wirepool.Pool(PY_WORKER, workers=1, max_in_flight=4) as pool:
        echo_through_lane(pool, "echo_raw")
        echo_through_lane(pool, "echo_thread_raw")
        # The worker saw both requests' bodies as views of the parent's region.
        assert pool.call("lane_bodies") == {"lane": 2, "socket": 0}


def test_rust_worker_echoes_16_mib_through_the_lane(rust_worker: str) -> None:
    with wirepool.Pool([rust_worker], workers=1) as pool:
        echo_through_lane(pool, "echo")


def test_the_async_pool_takes_the_lane_too() -> None:
    import asyncio

    async def main() -> None:
        async with wirepool.AsyncPool(PY_WORKER, workers=1, max_in_flight=4) as pool:
            results = await asyncio.gather(*(pool.call("echo_raw", PAYLOAD, codec="raw")
                                             for _ in range(3)))
            for r in results:
                assert isinstance(r.obj, mmap.mmap) and r == PAYLOAD
            assert (w := pool.workers[0]).bytes_received < 64 * 1024, w.bytes_received

    asyncio.run(asyncio.wait_for(main(), 60))


def test_nothing_stays_mapped_after_30_calls_and_after_close() -> None:
    gc.collect()  # earlier tests' pools, closed, unreferenced
    maps0, fds0 = shm_maps(), shm_fds()
    with wirepool.Pool(PY_WORKER, workers=1) as pool:
        for _ in range(30):
            r = pool.call("echo_raw", PAYLOAD, codec="raw")
            assert r == PAYLOAD
            del r
        # Regions are reused, not piled up: ours (one mapping; its descriptor, and the
        # mapping's own duplicate before Python 3.13) and the worker's (its descriptor; a view
        # maps one range at a time, and none is alive now).
        assert eventually(lambda: shm_maps() - maps0 <= 1 and shm_fds() - fds0 <= 3), \
            (shm_maps(), shm_fds())
        # Ours, unused for a second, is retired (20.4).
        assert eventually(lambda: shm_maps() == maps0 and not only_worker(pool).shm_regions)
        assert pool.call("lane_bodies") == {"lane": 30, "socket": 0}
    del pool
    assert eventually(lambda: (shm_maps(), shm_fds()) == (maps0, fds0)), (shm_maps(), shm_fds())


def test_a_worker_killed_holding_our_region_leaks_nothing() -> None:
    gc.collect()  # earlier tests' pools, closed, unreferenced
    maps0, fds0 = shm_maps(), shm_fds()
    with wirepool.Pool(PY_WORKER, workers=1, max_in_flight=4) as pool:
        r = pool.call("echo_raw", PAYLOAD, codec="raw")  # a view of the worker's region
        held = pool.submit("hold_raw", PAYLOAD, codec="raw")  # it keeps our region
        pid = pool.call("pid")
        assert eventually(lambda: shm_maps() - maps0 >= 2)  # ours, and r's range
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(wirepool.WorkerExited):
            held.result(30)
        # The dead worker's region stays readable through the view we still hold.
        assert r == PAYLOAD
        del r
        assert eventually(lambda: (shm_maps(), shm_fds()) == (maps0, fds0)), \
            (shm_maps(), shm_fds())
        # The replacement takes the lane afresh.
        assert eventually(lambda: len(pool._apool.workers) == 1, 30)
        echo_through_lane(pool, "echo_raw")
    assert eventually(lambda: (shm_maps(), shm_fds()) == (maps0, fds0))


def test_a_worker_with_the_lane_off_echoes_over_the_socket() -> None:
    env = dict(os.environ, WIREPOOL_SHM="0")
    with wirepool.Pool(PY_WORKER, workers=1, env=env) as pool:
        w = only_worker(pool)
        r = pool.call("echo_raw", PAYLOAD, codec="raw")
        assert r == PAYLOAD and not isinstance(r.obj, mmap.mmap)
        assert w.bytes_sent >= len(PAYLOAD) and w.bytes_received >= len(PAYLOAD)
        assert w.shm_threshold == _pool._NO_LANE and not w.conn.shm_is_on()


def test_a_parent_with_the_lane_off_echoes_over_the_socket() -> None:
    with wirepool.Pool(PY_WORKER, workers=1, shm_lane=False) as pool:
        w = only_worker(pool)
        r = pool.call("echo_raw", PAYLOAD, codec="raw")
        assert r == PAYLOAD and not isinstance(r.obj, mmap.mmap)
        assert w.bytes_received >= len(PAYLOAD)
        assert pool.call("lane_bodies") == {"lane": 0, "socket": 1}
