"""The Python parent of the instruction-count gate (bench/harness/icount.py).

Usage: count_python.py [--worker python|rust] OP=N [OP=N ...]

Starts an ``AsyncPool`` of one worker, then runs one phase per argument (operation ``OP``, ``N``
times), with a mark before every phase and after the last: the parent calls ``os.getpgrp()``
and then the worker's ``mark`` method, which calls it in the worker. It measures nothing itself:
the gate runs it under ``valgrind --tool=callgrind --trace-children=yes --dump-before=getpgrp``,
so every process writes its instructions per phase, and divides the difference between two
phases of one operation (parent and worker together) by the difference in their counts.
The operations are those of rust/wirepool-bench/src/bin/wirepool-bench-count.rs:

- ``unary``: ``call("echo", 64 B, codec="raw")``, one round trip
- ``rows_json``: one small row of one ``rows`` stream, decoded from JSON into a dict
  (``stream.batches()``, as the wall-clock runner reads rows)
- ``rows_raw``: one small row of one ``raw_rows`` stream, left undecoded
- ``echo_1mib``: ``call("echo", 1 MiB, codec="raw")``
- ``handshake``: a second pool of one worker started (spawn, HELLO), marked and closed

Heartbeats are off (``heartbeat_ms=0``): a PING per second would add instructions that depend
on how long the run took. ``WIREPOOL_ICOUNT_PLANT=op:iters`` spins ``iters`` loop turns after
every operation ``op`` (per row for the row operations): the planted regression of
bench/tests/test_icount.py.
"""

from __future__ import annotations

import asyncio
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# The gate imports a snapshot of python/wirepool (edits made while it counts change nothing).
SRC = os.environ.get("WIREPOOL_PYTHON_SRC") or os.path.join(REPO, "python")
sys.path.insert(0, SRC)

import wirepool  # noqa: E402

OPS = ("unary", "rows_json", "rows_raw", "echo_1mib", "handshake")
WORKER_LANG = sys.argv[sys.argv.index("--worker") + 1] if "--worker" in sys.argv else "python"
RUST_WORKER = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "rust", "target")),
                           "release", "wirepool-bench-worker")


def worker_argv() -> list[str]:
    if WORKER_LANG == "rust":
        return [RUST_WORKER]
    return [sys.executable, os.path.join(REPO, "bench", "runners", "wirepool_python_worker.py")]


def make_pool() -> wirepool.AsyncPool:
    env = dict(os.environ, PYTHONPATH=SRC)
    # valgrind runs a Python worker ~50x slower than usual: a generous start-up time.
    return wirepool.AsyncPool(worker_argv(), workers=1, max_in_flight=4, max_frame_size=16 << 20,
                              startup_timeout=120.0, heartbeat_ms=0, env=env)


def plant(iters: int) -> None:
    x = 0
    for i in range(iters):
        x += i


async def mark(pool: wirepool.AsyncPool) -> None:
    """A phase boundary, here and then in the worker (valgrind dumps on entering getpgrp)."""
    os.getpgrp()
    await pool.call("mark", b"", codec="raw")


async def run(counts: list[tuple[str, int]], planted: tuple[str, int] | None) -> None:
    small = b"wirepool" * 8
    big = b"wirepool" * (1 << 17)
    async with make_pool() as pool:
        for op, n in counts:
            await mark(pool)
            spin = planted[1] if planted and planted[0] == op else 0
            if op in ("unary", "echo_1mib"):
                body = small if op == "unary" else big
                for _ in range(n):
                    reply = await pool.call("echo", body, codec="raw")
                    assert len(reply) == len(body), "echo length"
                    plant(spin)
            elif op in ("rows_json", "rows_raw"):
                if op == "rows_json":
                    stream = pool.stream("rows", {"shape": "small_rows", "n": n}, codec="json")
                else:
                    stream = pool.stream("raw_rows", str(n).encode(), codec="raw")
                got = 0
                async for batch in stream.batches():
                    for _ in batch:
                        got += 1
                        plant(spin)
                assert got == n, f"got {got} rows, expected {n}"
            elif op == "handshake":
                for _ in range(n):
                    # The mark ends the new worker's first part of its count: its start-up,
                    # HELLO and one call. What follows (its exit) is timed by the SDK's grace
                    # periods, which valgrind's slowness can exceed, so the gate leaves it out.
                    async with make_pool() as extra:
                        await extra.call("mark", b"", codec="raw")
                    plant(spin)
        await mark(pool)


def main() -> None:
    counts = []
    for arg in sys.argv[1:]:
        if "=" in arg:
            op, n = arg.split("=", 1)
            if op not in OPS:
                sys.exit(f"unknown operation {op!r} (one of {', '.join(OPS)})")
            counts.append((op, int(n)))
    planted = None
    if os.environ.get("WIREPOOL_ICOUNT_PLANT"):
        op, iters = os.environ["WIREPOOL_ICOUNT_PLANT"].split(":")
        planted = (op, int(iters))
    asyncio.run(run(counts, planted))


if __name__ == "__main__":
    main()
