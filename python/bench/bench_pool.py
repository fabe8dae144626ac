"""End-to-end numbers: Python parent + Python workers, against multiprocessing in the same run.

    python bench/bench_pool.py [--quick]

Prints, for each workload, wirepool's figure beside the baseline and the ratio. The machine is
shared and noisy: only ratios from one run mean much; run it a few times.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import wirepool  # noqa: E402

WORKER = [sys.executable, os.path.join(HERE, "bench_worker.py")]
SMALL = {"id": 1, "name": "x" * 40}  # ~64 bytes of JSON


def mp_echo(x):  # noqa: ANN001
    return x


def mp_rows(args):  # noqa: ANN001
    start, n = args
    return [{"i": i, "name": f"decl_{i}", "kind": "theorem"} for i in range(start, start + n)]


def line(name: str, ours: float, base: float, unit: str, base_name: str) -> None:
    print(f"{name:<44} wirepool {ours:>12,.0f} {unit:<7} {base_name} {base:>12,.0f} {unit:<7}"
          f" ratio {ours / base:5.2f}x")


async def unary_async(n: int, workers: int, method: str = "echo") -> float:
    async with wirepool.AsyncPool(WORKER, workers=workers, max_in_flight=16) as pool:
        await asyncio.gather(*(pool.call(method, SMALL) for _ in range(200)))  # warm up
        t0 = time.perf_counter()
        await asyncio.gather(*(pool.call(method, SMALL) for _ in range(n)))
        return n / (time.perf_counter() - t0)


def unary_mp(n: int, workers: int) -> float:
    with mp.Pool(workers) as pool:
        [pool.apply_async(mp_echo, (SMALL,)).get() for _ in range(50)]
        t0 = time.perf_counter()
        results = [pool.apply_async(mp_echo, (SMALL,)) for _ in range(n)]
        for r in results:
            r.get()
        return n / (time.perf_counter() - t0)


def unary_sync_one_in_flight(n: int, method: str = "echo") -> tuple[float, float]:
    with wirepool.Pool(WORKER, workers=1) as pool:
        for _ in range(100):
            pool.call(method, SMALL)
        t0 = time.perf_counter()
        for _ in range(n):
            pool.call(method, SMALL)
        ours = n / (time.perf_counter() - t0)
    with mp.Pool(1) as mpool:
        for _ in range(100):
            mpool.apply(mp_echo, (SMALL,))
        t0 = time.perf_counter()
        for _ in range(n):
            mpool.apply(mp_echo, (SMALL,))
        base = n / (time.perf_counter() - t0)
    return ours, base


def stream_rows(n: int, codec: str) -> float:
    with wirepool.Pool(WORKER, workers=1, codec=codec) as pool:
        list(pool.stream("rows", {"n": 1000}))
        t0 = time.perf_counter()
        count = 0
        for row in pool.stream("rows", {"n": n}):
            count += 1
        assert count == n and row["i"] == n - 1
        return n / (time.perf_counter() - t0)


def stream_rows_mp(n: int) -> float:
    # The usual hand-batched baseline: one task per 256 rows, pickled lists of dicts.
    with mp.Pool(1) as pool:
        t0 = time.perf_counter()
        count = 0
        for batch in pool.imap(mp_rows, ((s, 256) for s in range(0, n, 256))):
            count += len(batch)
        return count / (time.perf_counter() - t0)


def echo_1mib(n: int, max_frame_size: int = 1 << 20) -> tuple[float, float]:
    payload = os.urandom(1 << 20)
    with wirepool.Pool(WORKER, workers=1, max_frame_size=max_frame_size) as pool:
        pool.call("echo", payload, codec="raw")
        t0 = time.perf_counter()
        for _ in range(n):
            out = pool.call("echo", payload, codec="raw")
        assert len(out) == len(payload)
        ours = n / (time.perf_counter() - t0)
    with mp.Pool(1) as mpool:
        mpool.apply(mp_echo, (payload,))
        t0 = time.perf_counter()
        for _ in range(n):
            mpool.apply(mp_echo, (payload,))
        base = n / (time.perf_counter() - t0)
    return ours, base


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    k = 0.2 if args.quick else 1.0
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; payload MiB/s counts the "
          "payload once per call (it travels both ways)")
    n = int(20_000 * k)
    base = unary_mp(n, 4)
    line(f"unary echo ~64 B, 4 workers, {n} calls", asyncio.run(unary_async(n, 4)),
         base, "calls/s", "mp.Pool.apply_async")
    line("  same, inline=True handler", asyncio.run(unary_async(n, 4, "echo_inline")),
         base, "calls/s", "mp.Pool.apply_async")
    ours, base = unary_sync_one_in_flight(int(3000 * k))
    line("unary echo ~64 B, 1 worker, 1 in flight", ours, base, "calls/s", "mp.Pool.apply     ")
    ours, base = unary_sync_one_in_flight(int(3000 * k), "echo_inline")
    line("  same, inline=True handler", ours, base, "calls/s", "mp.Pool.apply     ")
    n = int(1_000_000 * k)
    for codec in ("json", "msgpack"):
        line(f"stream small rows -> dicts ({codec})", stream_rows(n, codec), stream_rows_mp(n),
             "rows/s", "mp.Pool.imap x256  ")
    ours, base = echo_1mib(int(200 * k))
    line("1 MiB raw echo, 1 worker (1 MiB frames)", ours, base, "MiB/s", "mp.Pool.apply     ")
    ours, base = echo_1mib(int(200 * k), 4 << 20)
    line("1 MiB raw echo, 1 worker (4 MiB frames)", ours, base, "MiB/s", "mp.Pool.apply     ")


if __name__ == "__main__":
    main()
