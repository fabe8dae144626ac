"""A lease holds one worker for a sequence of calls: python examples/python/lease.py"""

import asyncio
import sys
from pathlib import Path

import wirepool

WORKER = [sys.executable, str(Path(__file__).with_name("worker.py"))]


async def main() -> None:
    async with wirepool.AsyncPool(WORKER, workers=2) as pool:
        async with pool.lease() as worker:  # the pool keeps serving others meanwhile
            for item in ("a", "b", "c"):
                print(await worker.call("remember", {"item": item}))


asyncio.run(main())
