"""Typed unary calls, one and many: python examples/python/unary.py"""

import sys
from pathlib import Path

import wirepool

WORKER = [sys.executable, str(Path(__file__).with_name("worker.py"))]

with wirepool.Pool(WORKER, workers=2) as pool:
    print("1 + 2 =", pool.call("add", {"a": 1, "b": 2})["sum"])
    # Many small calls: map keeps many in flight across both workers.
    total = sum(r["sum"] for r in pool.map("add", ({"a": i, "b": 1} for i in range(10_000))))
    print("sum of 10,000 calls:", total)
