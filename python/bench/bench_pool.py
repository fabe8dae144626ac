"""End-to-end numbers: Python parent + Python workers, beside multiprocessing in the same run.

    python bench/bench_pool.py [--quick] [--repeat R] [--only NAME] [--max-in-flight N]

Each workload runs ``R`` times (default 3); every repeat measures wirepool and then its baseline
back to back, so both see the same machine. Printed per workload: min / median / max of each
side over the repeats, and the ratio of the medians with the range of the per-repeat ratios.
The machine is shared and noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import wirepool  # noqa: E402

WORKER = [sys.executable, os.path.join(HERE, "bench_worker.py")]
SMALL = {"id": 1, "name": "x" * 40}  # ~64 bytes of JSON
MIB = 1 << 20
POOL_OPTIONS: dict = {}  # e.g. max_in_flight from the command line


def mp_echo(x):  # noqa: ANN001
    return x


def mp_rows(args):  # noqa: ANN001
    start, n = args
    return [{"i": i, "name": f"decl_{i}", "kind": "theorem"} for i in range(start, start + n)]


def rate(n: float, fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def report(name: str, unit: str, ours: list[float], base: list[float], base_name: str) -> None:
    ratios = [a / b for a, b in zip(ours, base)]
    med = statistics.median(ours) / statistics.median(base)

    def span(xs: list[float]) -> str:
        return f"{min(xs):>11,.0f} {statistics.median(xs):>11,.0f} {max(xs):>11,.0f}"
    print(f"{name}\n    wirepool {span(ours)} {unit:<8}| {base_name:<26} {span(base)} {unit:<8}"
          f"| ratio {med:5.2f}x ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)


def repeat(r: int, ours: Callable[[], float], base: Callable[[], float]) -> tuple[list, list]:
    a, b = [], []
    for _ in range(r):
        a.append(ours())
        b.append(base())
    return a, b


def unary(k: float, r: int) -> None:
    n = int(20_000 * k)
    workers = 4
    with wirepool.Pool(WORKER, workers=workers, **POOL_OPTIONS) as pool, mp.Pool(workers) as mpool, \
            concurrent.futures.ProcessPoolExecutor(workers) as ex:
        list(pool.map("echo_inline", [SMALL] * 500))
        list(pool.map("echo", [SMALL] * 500))
        [mpool.apply_async(mp_echo, (SMALL,)).get() for _ in range(50)]
        list(ex.map(mp_echo, [SMALL] * 50))

        def apply_async() -> float:
            def go() -> None:
                for res in [mpool.apply_async(mp_echo, (SMALL,)) for _ in range(n)]:
                    res.get()
            return rate(n, go)

        def executor_submit() -> float:
            def go() -> None:
                for f in [ex.submit(mp_echo, SMALL) for _ in range(n)]:
                    f.result()
            return rate(n, go)

        head = f"unary echo ~64 B, {workers} workers, {n} calls"
        for method, label in (("echo_inline", "inline handler"), ("echo", "thread-pool handler")):
            ours = lambda m=method: rate(n, lambda: list(pool.map(m, [SMALL] * n)))  # noqa: E731
            report(f"{head}: Pool.map, {label}", "calls/s", *repeat(r, ours, apply_async),
                   "mp.Pool.apply_async loop")
        ours = lambda: rate(n, lambda: list(pool.map("echo_inline", [SMALL] * n)))  # noqa: E731
        report(f"{head}: Pool.map, inline handler", "calls/s", *repeat(r, ours, executor_submit),
               "ProcessPoolExecutor.submit")
        report(f"{head}: Pool.map, inline handler", "calls/s",
               *repeat(r, ours, lambda: rate(n, lambda: mpool.map(mp_echo, [SMALL] * n))),
               "mp.Pool.map (chunked)")

        async def gather(apool: wirepool.AsyncPool) -> None:
            await asyncio.gather(*(apool.call("echo_inline", SMALL) for _ in range(n)))

        async def amap(apool: wirepool.AsyncPool) -> None:
            assert len([x async for x in apool.map("echo_inline", [SMALL] * n)]) == n

        async def async_rates(how: Callable) -> list[float]:
            async with wirepool.AsyncPool(WORKER, workers=workers, **POOL_OPTIONS) as apool:
                await how(apool)
                out = []
                for _ in range(r):
                    t0 = time.perf_counter()
                    await how(apool)
                    out.append(n / (time.perf_counter() - t0))
                return out
        for how, label in ((amap, "AsyncPool.map"), (gather, "AsyncPool.call x gather")):
            ours_async = asyncio.run(async_rates(how))
            report(f"{head}: {label}, inline", "calls/s", ours_async,
                   [apply_async() for _ in range(r)], "mp.Pool.apply_async loop")

    n = int(3000 * k)
    with wirepool.Pool(WORKER, workers=1) as pool, mp.Pool(1) as mpool:
        for _ in range(100):
            pool.call("echo_inline", SMALL)
            mpool.apply(mp_echo, (SMALL,))

        def one_by_one(method: str) -> float:
            return rate(n, lambda: [pool.call(method, SMALL) for _ in range(n)])

        def mp_apply() -> float:
            return rate(n, lambda: [mpool.apply(mp_echo, (SMALL,)) for _ in range(n)])
        for method, label in (("echo_inline", "inline handler"), ("echo", "thread-pool handler")):
            report(f"unary echo ~64 B, 1 worker, 1 in flight: Pool.call, {label}", "calls/s",
                   *repeat(r, lambda m=method: one_by_one(m), mp_apply), "mp.Pool.apply")


def rows(k: float, r: int) -> None:
    n = int(1_000_000 * k)
    with mp.Pool(1) as mpool:
        def imap() -> float:
            def go() -> None:
                count = 0
                for batch in mpool.imap(mp_rows, ((s, min(256, n - s)) for s in range(0, n, 256))):
                    count += len(batch)
                assert count == n
            return rate(n, go)
        for codec in ("json", "msgpack"):
            with wirepool.Pool(WORKER, workers=1, codec=codec) as pool:
                list(pool.stream("rows", {"n": 1000}))

                def ours() -> float:
                    def go() -> None:
                        count = 0
                        for row in pool.stream("rows", {"n": n}):
                            count += 1
                        assert count == n and row["i"] == n - 1
                    return rate(n, go)
                report(f"stream {n} small rows -> dicts ({codec}), Pool.stream", "rows/s",
                       *repeat(r, ours, imap), "mp.Pool.imap of 256-row lists")


def payloads(k: float, r: int) -> None:
    n = int(200 * k)
    payload = os.urandom(MIB)
    with wirepool.Pool(WORKER, workers=1) as pool, mp.Pool(1) as mpool:
        mpool.apply(mp_echo, (payload,))

        def mp_apply() -> float:
            return rate(n * MIB / 1e6, lambda: [mpool.apply(mp_echo, (payload,)) for _ in range(n)])

        for method, label in (("echo_async", "async handler"), ("echo", "thread-pool handler")):
            pool.call(method, payload, codec="raw")

            def ours(m: str = method) -> float:
                def go() -> None:
                    for _ in range(n):
                        out = pool.call(m, payload, codec="raw")
                    assert len(out) == MIB
                return rate(n * MIB / 1e6, go)
            report(f"1 MiB raw echo, 1 worker, 1 in flight: Pool.call, {label} (16 MiB frames)",
                   "MB/s", *repeat(r, ours, mp_apply), "mp.Pool.apply")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a fifth of the work per measurement")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["unary", "rows", "payloads"])
    ap.add_argument("--max-in-flight", type=int, help="the pools' max_in_flight (default: theirs)")
    args = ap.parse_args()
    if args.max_in_flight:
        POOL_OPTIONS["max_in_flight"] = args.max_in_flight
    k = 0.2 if args.quick else 1.0
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; {args.repeat} repeats, each: min median max; MB/s counts "
          "the payload once per call (it travels both ways)", flush=True)
    for name, fn in (("unary", unary), ("rows", rows), ("payloads", payloads)):
        if args.only in (None, name):
            fn(k, args.repeat)


if __name__ == "__main__":
    main()
