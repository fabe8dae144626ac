"""A stream of 4 KiB rows from a remote Python worker behind conformance/tools/delay_relay.py, at
D ms each way (issue 29: the adaptive credit window of PROTOCOL.md 6). Python parent, TLS, the
Subprocess launcher; the relay holds up to --cap bytes per direction (default 64 MiB, so that
the relay, not a real link's capacity, is never what limits the stream).

    .venv/bin/python bench/remote_window.py --delays 0 50 --repeats 3 --rows 8000

Prints MB/s per delay (min / median / max of the repeats) and the ratio to the 0 ms median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import wirepool
from wirepool.launchers import Subprocess

REPO = Path(__file__).resolve().parents[1]


def run(delay_ms: int, rows: int, size: int, cap: int, pool_kw: dict) -> float:
    argv = [sys.executable, str(REPO / "conformance" / "tools" / "delay_relay.py"), "--worker",
            "--cap", str(cap), str(delay_ms), "--", sys.executable,
            str(REPO / "python" / "conformance" / "worker.py")]
    with wirepool.Pool(argv, workers=1, launcher=Subprocess(), startup_timeout=30,
                       **pool_kw) as pool:
        pool.call("add", {"a": 1, "b": 2})  # joined, and a round trip or more measured
        t0 = time.perf_counter()
        got = 0
        for row in pool.stream("raw_rows", f"{rows} {size}".encode(), codec="raw"):
            got += len(row)
        took = time.perf_counter() - t0
    assert got == rows * size, got
    return got / took / 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delays", type=int, nargs="+", default=[0, 50])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=8000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--cap", type=int, default=64 << 20)
    args = ap.parse_args()
    results: dict[int, list[float]] = {d: [] for d in args.delays}
    for _ in range(args.repeats):  # alternated, so that load drifts hit every delay alike
        for d in args.delays:
            results[d].append(run(d, args.rows, args.size, args.cap, {}))
    base = statistics.median(results[args.delays[0]])
    for d, r in results.items():
        med = statistics.median(r)
        print(f"{d:4d} ms each way: {min(r):7.1f} / {med:7.1f} / {max(r):7.1f} MB/s "
              f"(min/median/max of {len(r)}), {med / base:.2f}x the {args.delays[0]} ms median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
