"""W2, W3 and W4 over the remote transport on loopback, beside the socketpair path, same run.

    .venv/bin/python bench/remote_tls.py [--repeats 5] [--window 0.5] [--worker python|rust]

Four transports for the same Python parent (``AsyncPool``) and bench worker (the Python one,
bench/runners/wirepool_python_worker.py, or with ``--worker rust`` the Rust one,
rust/target/release/wirepool-bench-worker, built by ``bench/runners/wirepool_rust.sh
--prepare``; both serve the same methods), 16 MiB frames as in the bench runners:
``socketpair`` (the local path with the shared-memory lane off: every byte through the socket,
the baseline of the ratios), ``socketpair+shm`` (the local default as it is: bodies of 1 MiB and
more go through the lane of PROTOCOL.md 20, which both bench workers offer), ``tls`` (TCP + TLS
1.3 on 127.0.0.1: the remote path of PROTOCOL.md 21 through ``launchers.Subprocess``) and
``tcp`` (plain loopback TCP, the same join without TLS); the same four as the Rust parent's
``remote_tls`` (rust/wirepool-bench). Each repeat runs every transport once, in turn
(alternated, so drift hits all of them alike); the report gives min / median / max, each
median's ratio to socketpair's, and the ratio repeat by repeat (min / median / max of the
per-repeat ratios: each against the socketpair run next to it).

Targets (issue 14): W3 over TLS >= 1 GB/s; W4 rows over TLS >= 0.8x the socketpair path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any, Awaitable, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

import wirepool  # noqa: E402
from wirepool import launchers  # noqa: E402

WORKERS = {
    "python": [sys.executable, os.path.join(HERE, "runners", "wirepool_python_worker.py")],
    "rust": [os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "rust", "target")),
                          "release", "wirepool-bench-worker")],
}
WORKER = WORKERS["python"]
ENV = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
MAX_FRAME = 16 << 20


def payload(size: int) -> bytes:
    return (b"wirepool" * (size // 8 + 1))[:size]


TRANSPORTS = ["socketpair", "socketpair+shm", "tls", "tcp"]


def make_pool(transport: str, max_in_flight: int) -> wirepool.AsyncPool:
    launcher = {"socketpair": None, "socketpair+shm": None, "tls": launchers.Subprocess(),
                "tcp": launchers.Subprocess(tls=False)}[transport]
    return wirepool.AsyncPool(WORKER, workers=1, max_in_flight=max_in_flight,
                              max_frame_size=MAX_FRAME, env=ENV, launcher=launcher,
                              worker_output="discard", shm_lane=transport != "socketpair")


async def echo_rate(pool: wirepool.AsyncPool, method: str, body: bytes, inflight: int,
                    window: float) -> float:
    """Calls per second with ``inflight`` calls outstanding, over at least ``window`` s."""
    done = [0]
    deadline = time.perf_counter() + window

    async def slot() -> None:
        while time.perf_counter() < deadline:
            await pool.call(method, body, codec="raw")
            done[0] += 1
    start = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(inflight)))
    return done[0] / (time.perf_counter() - start)


async def rows_rate(pool: wirepool.AsyncPool, n: int) -> float:
    start = time.perf_counter()
    got = 0
    async for batch in pool.stream("rows", {"shape": "small_rows", "n": n}).batches():
        got += len(batch)
    assert got == n
    return n / (time.perf_counter() - start)


# name -> (unit, max_in_flight, measure(pool, window) -> value)
SCENARIOS: dict[str, tuple[str, int, Callable[[wirepool.AsyncPool, float], Awaitable[float]]]] = {
    "W2.echo.64B.x64": ("calls/s", 64,
                        lambda p, w: echo_rate(p, "echo", payload(64), 64, w)),
    "W2.echo.64B.x256": ("calls/s", 256,
                         lambda p, w: echo_rate(p, "echo", payload(64), 256, w)),
    "W3.oneway.1MiB": ("MB/s", 1,
                       lambda p, w: _mbps(echo_rate(p, "oneway", payload(1 << 20), 1, w),
                                          1 << 20)),
    "W3.echo.16MiB": ("MB/s", 1,
                      lambda p, w: _mbps(echo_rate(p, "echo", payload(16 << 20), 1, w),
                                         2 * (16 << 20))),
    "W4.small_rows.65536": ("rows/s", 4, lambda p, w: rows_rate(p, 65536)),
}


async def _mbps(rate: Awaitable[float], nbytes: int) -> float:
    return await rate * nbytes / 1e6


async def measure(name: str, transport: str, window: float) -> float:
    _unit, inflight, fn = SCENARIOS[name]
    async with make_pool(transport, inflight) as pool:
        await fn(pool, window / 4)  # warm-up: first frames, buffers, TLS session
        return await fn(pool, window)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--window", type=float, default=0.5)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--worker", choices=sorted(WORKERS), default="python")
    args = ap.parse_args()
    global WORKER
    WORKER = WORKERS[args.worker]
    if not os.access(WORKER[0], os.X_OK):
        sys.exit(f"{WORKER[0]} is not built (bench/runners/wirepool_rust.sh --prepare)")
    names = [n for n in SCENARIOS if not args.only or n in args.only.split(",")]
    transports = TRANSPORTS
    results: dict[tuple[str, str], list[float]] = {}
    for name in names:
        for _ in range(args.repeats):
            for t in transports:
                results.setdefault((name, t), []).append(
                    asyncio.run(measure(name, t, args.window)))
    print(f"# remote transport on loopback vs socketpair ({args.repeats} repeats, "
          f"{args.window:g} s windows, alternated); Python parent, {args.worker} worker")
    print(f"{'scenario':22} {'transport':14} {'unit':8} {'min':>12} {'median':>12} "
          f"{'max':>12} {'vs socketpair':>14} {'per repeat vs socketpair':>26}")
    for name in names:
        unit = SCENARIOS[name][0]
        pair = results[(name, "socketpair")]
        base = statistics.median(pair)
        for t in transports:
            v = results[(name, t)]
            med = statistics.median(v)
            r = [a / b for a, b in zip(v, pair)]
            print(f"{name:22} {t:14} {unit:8} {min(v):12,.0f} {med:12,.0f} {max(v):12,.0f} "
                  f"{med / base:13.2f}x "
                  f"{min(r):7.2f} / {statistics.median(r):.2f} / {max(r):.2f}")


if __name__ == "__main__":
    main()
