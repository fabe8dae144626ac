"""Rows nobody will read still count as consumed (PROTOCOL.md 14.3): when a stream's caller
stops reading, the parent grants credit for the rows it had queued and for those still
arriving, so a worker that has not seen the CANCEL yet is not left waiting for credit (it
would hold its slot until the cancel grace killed it)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import wirepool

WORKER = [sys.executable, str(Path(__file__).resolve().parent / "workers" / "stubborn_stream.py")]


@pytest.mark.timeout(60)
def test_a_worker_still_sending_rows_after_the_caller_left_is_not_starved() -> None:
    async def main() -> None:
        # 400 rows of 1 KB against a 64 KiB window: the worker needs the parent's grants for
        # rows its caller will never read. The cancel grace is far above the wait below, so
        # only credit can end the stream in time.
        async with wirepool.AsyncPool(WORKER, workers=1, initial_credit=65536,
                                      cancel_grace=60.0) as pool:
            pid = await pool.call("whoami", b"", codec="raw")
            stream = pool.stream("rows", b"400", codec="raw")
            async for row in stream:
                assert bytes(row) == b"r" * 1000
                break
            await stream.aclose()
            # One request at a time (max_concurrency 1): this call waits for the stream's END.
            again = await asyncio.wait_for(pool.call("whoami", b"", codec="raw"), 20)
            assert again == pid, "the worker was replaced instead of finishing its stream"

    asyncio.run(main())
