"""Stream rows with a summary at the end: python examples/python/stream.py"""

import sys
from pathlib import Path

import wirepool

WORKER = [sys.executable, str(Path(__file__).with_name("worker.py"))]

with wirepool.Pool(WORKER, workers=1) as pool:
    stream = pool.stream("decls", {"n": 100_000})
    count = 0
    for row in stream:  # credit is granted as this loop reads: memory stays bounded
        count += 1
    print(f"{count} rows, last {row}, summary {stream.summary}")
