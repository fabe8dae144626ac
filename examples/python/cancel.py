"""Cancellation and deadlines: python examples/python/cancel.py"""

import asyncio
import sys
import time
from pathlib import Path

import wirepool

WORKER = [sys.executable, str(Path(__file__).with_name("worker.py"))]


async def main() -> None:
    async with wirepool.AsyncPool(WORKER, workers=1) as pool:
        # Cancelling the task sends CANCEL; the handler sees ctx.cancelled and stops.
        task = asyncio.create_task(pool.call("sleep", {"seconds": 60}))
        await asyncio.sleep(0.2)
        task.cancel()
        started = time.monotonic()
        try:
            await task
        except asyncio.CancelledError:
            print(f"cancelled; the worker stayed warm ({time.monotonic() - started:.3f}s)")
        # A deadline travels on the wire and is enforced locally too.
        try:
            await pool.call("sleep", {"seconds": 60}, timeout=0.3)
        except wirepool.DeadlineExceeded as e:
            print("deadline:", e.name, e.code)
        print("the same worker still answers:", await pool.call("add", {"a": 2, "b": 2}))


asyncio.run(main())
