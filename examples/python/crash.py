"""A worker that dies on purpose: one typed error, then a replacement. python examples/python/crash.py"""

import sys
from pathlib import Path

import wirepool

WORKER = [sys.executable, str(Path(__file__).with_name("worker.py"))]

with wirepool.Pool(WORKER, workers=1) as pool:
    try:
        pool.call("crash", {})
    except wirepool.WorkerExited as e:
        print(f"{e.name} ({e.code}): {e.message}")
        print("details:", e.details)
    print("the pool replaced the worker:", pool.call("add", {"a": 40, "b": 2}))
