"""The wirepool runner with the Python parent (python/wirepool ``AsyncPool``).

Usage: wirepool_python.py [--worker python|rust|node] [--sync] '<scenario json>'

Workers: ``wirepool_python_worker.py`` (Python SDK, this interpreter), the Rust bench worker
``rust/target/release/wirepool-bench-worker`` (built by ``wirepool_rust.sh --prepare``) or the
Node one, ``wirepool_node_worker.mjs`` (on ``node/dist``, built by ``wirepool_node.mjs
--prepare``); all serve the same methods. The SDK is used the fast way a user would: ``AsyncPool`` on one asyncio
loop in the calling thread (no thread hand-off between caller and pool), 16 MiB frames (the
largest the protocol allows, offered by both worker SDKs: 1 MiB payloads travel in one frame),
the raw codec for payloads, ``inflight`` tasks each keeping one call outstanding for pipelined
echo, ``stream.batches()`` (a ROWS frame of rows decoded in one loop, with the scenario's codec:
orjson, ormsgpack or cbor2 into dicts; raw rows stay memoryview slices) for rows, and a pool of
``workers`` with two tasks in flight each for W5. ``--sync`` (runner ``wirepool_python_sync``)
measures the blocking ``Pool.call`` instead, one call at a time (W1 only): the call a user moving
from ``multiprocessing`` writes first. ``WIREPOOL_BENCH_PY_SDK`` names another folder holding a
``wirepool`` package for the parent and a Python worker (an old copy, to alternate old and new
in one session).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import time

from common import (echo_figures, figure, load_scenario, ok, payload_bytes, peak_rss_kib,
                    unsupported)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The SDK of the parent and of a Python worker alike.
SDK = os.environ.get("WIREPOOL_BENCH_PY_SDK") or os.path.join(REPO, "python")
sys.path.insert(0, SDK)

import wirepool  # noqa: E402

WORKER_LANG = sys.argv[sys.argv.index("--worker") + 1] if "--worker" in sys.argv else "python"
SYNC = "--sync" in sys.argv
RUNNER = "wirepool_python_sync" if SYNC else {
    "rust": "wirepool_python_rsworker", "node": "wirepool_python_nodeworker"}.get(
    WORKER_LANG, "wirepool_python")
RUST_WORKER = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "rust", "target")),
                           "release", "wirepool-bench-worker")
# The founding workload's Rust worker (wirepool-bench's, built by wirepool_rust.sh --prepare).
FOUNDING_WORKER = os.path.join(os.path.dirname(RUST_WORKER), "founding-worker")
NODE_DIST = os.path.join(REPO, "node", "dist", "index.js")
MAX_FRAME = 16 << 20


def is_founding(sc: dict | None) -> bool:
    return bool(sc and sc.get("founding"))


def worker_argv(sc: dict | None = None) -> list[str]:
    if WORKER_LANG == "rust":
        return [FOUNDING_WORKER if is_founding(sc) else RUST_WORKER]
    if WORKER_LANG == "node":
        return [os.environ.get("WIREPOOL_BENCH_NODE", "node"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "wirepool_node_worker.mjs")]
    return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         "wirepool_python_worker.py")]


def pool_options(workers: int, max_in_flight: int, max_frame: int) -> dict:
    return dict(workers=workers, max_in_flight=max_in_flight, max_frame_size=max_frame,
                startup_timeout=20.0, env=dict(os.environ, PYTHONPATH=SDK))


def make_pool(workers: int, max_in_flight: int, max_frame: int = MAX_FRAME,
              sc: dict | None = None) -> wirepool.AsyncPool:
    return wirepool.AsyncPool(worker_argv(sc), **pool_options(workers, max_in_flight, max_frame))


def children_peak_kib(pool: wirepool.AsyncPool) -> int | None:
    peaks = [peak_rss_kib(w["pid"]) for w in pool.metrics()["workers"] if w["alive"]]
    peaks = [p for p in peaks if p is not None]
    return max(peaks) if peaks else None


async def echo_window(pool, method: str, body: bytes, inflight: int, window: float,
                      min_calls: int, latency: bool, expect: int) -> tuple[int, float, list[int]]:
    def check(reply) -> None:
        got = int.from_bytes(reply, "little") if method == "oneway" else len(reply)
        if got != expect:
            raise RuntimeError(f"{method} answered {got} bytes, expected {expect}")

    clock = time.perf_counter_ns
    start = clock()
    deadline = start + int(window * 1e9)
    call = pool.call
    if inflight == 1:
        lat: list[int] = []
        calls = 0
        now = start
        while now < deadline or calls < min_calls:
            t0 = now
            check(await call(method, body, codec="raw"))
            now = clock()
            if latency:
                lat.append(now - t0)
            calls += 1
        return calls, (now - start) / 1e9, lat
    done = [0]
    stop = [False]

    async def one_slot() -> None:
        while not stop[0]:
            check(await call(method, body, codec="raw"))
            done[0] += 1
            if done[0] >= min_calls and clock() >= deadline:
                stop[0] = True

    await asyncio.gather(*(one_slot() for _ in range(inflight)))
    return done[0], (clock() - start) / 1e9, []


def sync_echo_window(pool: wirepool.Pool, body: bytes, window: float, min_calls: int,
                     latency: bool, expect: int) -> tuple[int, float, list[int]]:
    clock = time.perf_counter_ns
    call = pool.call
    lat: list[int] = []
    calls = 0
    now = start = clock()
    deadline = start + int(window * 1e9)
    while now < deadline or calls < min_calls:
        t0 = now
        if len(call("echo", body, codec="raw")) != expect:
            raise RuntimeError(f"echo answered a different length than {expect}")
        now = clock()
        if latency:
            lat.append(now - t0)
        calls += 1
    return calls, (now - start) / 1e9, lat


def run_sync_echo(sc: dict) -> tuple[list[dict], int | None, str]:
    body = payload_bytes(sc["payload"])
    with wirepool.Pool(worker_argv(), **pool_options(1, 1, MAX_FRAME)) as pool:
        sync_echo_window(pool, body, sc["warmup_s"], 1, False, sc["payload"])
        results = [sync_echo_window(pool, body, sc["duration_s"], sc["min_calls"], True,
                                    sc["payload"]) for _ in range(sc["repeats"])]
        peaks = [peak_rss_kib(pid) for pid in pool.pids]
        children = max((p for p in peaks if p is not None), default=None)
    it = iter(results)
    return (echo_figures(sc, lambda: next(it)), children,
            f"Pool.call(codec='raw') from the main thread, {MAX_FRAME >> 10} KiB frames; "
            "one call at a time")


async def run_echo(sc: dict) -> tuple[list[dict], int | None, str]:
    kind = sc["kind"]
    inflight = sc.get("inflight", 1)
    method = "oneway" if kind == "oneway" else "echo"
    body = payload_bytes(sc["payload"])
    latency = kind == "echo" and inflight == 1
    # Scenarios around the frame size set their own (the large-message variants).
    max_frame = sc.get("max_frame_size", MAX_FRAME)
    async with make_pool(1, max(inflight, 1), max_frame) as pool:
        await echo_window(pool, method, body, inflight, sc["warmup_s"], 1, False, sc["payload"])
        results = []
        for _ in range(sc["repeats"]):
            results.append(await echo_window(pool, method, body, inflight, sc["duration_s"],
                                             sc["min_calls"], latency, sc["payload"]))
        children = children_peak_kib(pool)
    it = iter(results)
    figs = echo_figures(sc, lambda: next(it))
    how = f"{inflight} tasks each keeping one call outstanding" if inflight > 1 else "one call at a time"
    return figs, children, f"AsyncPool.call(codec='raw'), {max_frame >> 10} KiB frames; {how}"


async def read_founding_rows(pool, sc: dict, n: int) -> int:
    """The founding workload: every row's index checked, as a consumer reads each row."""
    count = 0
    stream = pool.stream("rows", {"shape": sc["shape"], "n": n}, codec=sc.get("codec", "json"))
    async for batch in stream.batches():
        for row in batch:
            if row["id"] != count:
                raise RuntimeError(f"row {count} carried index {row['id']}")
            count += 1
    return count


async def read_rows(pool, sc: dict) -> int:
    if is_founding(sc):
        return await read_founding_rows(pool, sc, sc["n"])
    every = sc.get("every", 0)
    pause = sc.get("pause_ms", 0) / 1000.0
    count = 0
    stream = pool.stream("rows", {"shape": sc["shape"], "n": sc["n"]},
                         codec=sc.get("codec", "json"))
    async for batch in stream.batches():
        if batch[0]["i"] != count:
            raise RuntimeError(f"row {count} carried index {batch[0]['i']}")
        if not every:
            count += len(batch)
            continue
        for _ in batch:
            count += 1
            if count % every == 0:
                await asyncio.sleep(pause)
    return count


async def read_raw_rows(pool, n: int) -> int:
    count = 0
    stream = pool.stream("raw_rows", str(n).encode(), codec="raw")
    async for batch in stream.batches():
        count += len(batch)
    return count


# The library each codec of python/wirepool/codecs.py decodes with (it prefers the fast ones).
ROW_DECODERS = {"json": "orjson" if importlib.util.find_spec("orjson") else "json",
                "msgpack": "ormsgpack" if importlib.util.find_spec("ormsgpack") else "msgpack",
                "cbor": "cbor2"}


async def run_rows(sc: dict) -> tuple[list[dict], int | None, str]:
    n, codec = sc["n"], sc.get("codec", "json")
    rates = []
    async with make_pool(1, 4, sc=sc) as pool:
        if is_founding(sc):
            # One untimed stream first: the worker's first call pays for its imports; then a
            # repeat is as many whole streams as fit in the scenario's window.
            await read_founding_rows(pool, sc, min(n, 256))
            window = sc.get("duration_s", 0.25)
            for _ in range(sc["repeats"]):
                start, rows = time.perf_counter(), 0
                while rows == 0 or time.perf_counter() - start < window:
                    if await read_founding_rows(pool, sc, n) != n:
                        raise RuntimeError(f"expected {n} rows")
                    rows += n
                rates.append(rows / (time.perf_counter() - start))
        for _ in range(0 if is_founding(sc) else sc["repeats"]):
            start = time.perf_counter()
            got = await (read_raw_rows(pool, n) if codec == "raw" else read_rows(pool, sc))
            if got != n:
                raise RuntimeError(f"got {got} rows, expected {n}")
            rates.append(n / (time.perf_counter() - start))
        children = children_peak_kib(pool)
    if codec == "raw":
        notes = ("stream(codec='raw').batches(): the small row's JSON text as bytes, memoryview "
                 "slices a ROWS frame at a time, not decoded")
    else:
        notes = (f"stream(codec={codec!r}).batches(): rows decoded into dicts a ROWS frame at a "
                 f"time ({ROW_DECODERS[codec]})")
    return [figure("rows_per_s", "rows/s", rates)], children, notes


async def run_pool(sc: dict) -> tuple[list[dict], int | None, str]:
    workers, task_us, tasks = sc["workers"], sc["task_us"], sc["tasks"]
    rates = []
    async with make_pool(workers, 2) as pool:
        await asyncio.gather(*(pool.call("spin", 1) for _ in range(workers * 2)))
        for _ in range(sc["repeats"]):
            left = [tasks]

            async def driver() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    if await pool.call("spin", task_us) != task_us:
                        raise RuntimeError("spin answered a different value")

            start = time.perf_counter()
            await asyncio.gather(*(driver() for _ in range(workers * 2)))
            rates.append(tasks / (time.perf_counter() - start))
        children = children_peak_kib(pool)
    return ([figure("tasks_per_s", "tasks/s", rates)], children,
            "AsyncPool.call('spin') from 2 x workers tasks, max_in_flight 2; the worker spins "
            "on thread CPU time, one task at a time")


def main() -> None:
    if "--prepare" in sys.argv:
        return  # nothing to build: python/wirepool is imported from the source tree
    sc = load_scenario()
    kind = sc["kind"]
    if kind == "frames":
        unsupported(RUNNER, sc, "floor-only scenario")
        return
    rust_worker = worker_argv(sc)[0]
    if WORKER_LANG == "rust" and not os.access(rust_worker, os.X_OK):
        unsupported(RUNNER, sc, f"{rust_worker} not built (bench/runners/wirepool_rust.sh --prepare)")
        return
    if WORKER_LANG == "node" and not os.path.exists(NODE_DIST):
        unsupported(RUNNER, sc, f"{NODE_DIST} not built (bench/runners/wirepool_node.mjs --prepare)")
        return
    if SYNC:
        if sc["workload"] != "W1":
            unsupported(RUNNER, sc, "the blocking Pool.call is measured one call at a time (W1) "
                                    "only; wirepool_python measures AsyncPool elsewhere")
            return
        figs, children, notes = run_sync_echo(sc)
        ok(RUNNER, sc, figs, peak_rss_kib(), children, notes)
        return
    codec = sc.get("codec", "json")
    if kind in ("rows", "slow_rows") and codec not in ("raw", *wirepool.codecs.available()):
        unsupported(RUNNER, sc, f"codec {codec!r}: its library is not installed in "
                                f"{sys.executable} (bench/requirements.txt)")
        return
    if kind in ("echo", "oneway", "echo_large"):
        coro = run_echo(sc)
    elif kind in ("rows", "slow_rows"):
        coro = run_rows(sc)
    elif kind == "pool":
        coro = run_pool(sc)
    else:
        unsupported(RUNNER, sc, f"unknown kind {kind}")
        return
    figs, children, notes = asyncio.run(coro)
    ok(RUNNER, sc, figs, peak_rss_kib(), children, notes)


if __name__ == "__main__":
    main()
