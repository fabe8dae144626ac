"""Handlers for test_worker_semantics.py: the cases PROTOCOL.md 8.3-8.4 decide for the worker."""

import asyncio
import time

import wirepool


@wirepool.method(codecs=["json"])
def deaf(ms: int) -> int:
    time.sleep(ms / 1000)  # ignores its cancellation flag and its deadline
    return ms


@wirepool.method(codecs=["json"])
def fail_when_cancelled(_req: object, ctx: wirepool.Context) -> None:
    while not ctx.cancelled:
        time.sleep(0.001)
    raise RuntimeError("noticed the cancellation")


@wirepool.method(codecs=["json"], inline=True)
def inline_busy(ms: int) -> int:
    time.sleep(ms / 1000)  # on the I/O loop: no timer can fire meanwhile
    return ms


@wirepool.method(codecs=["json"])
async def sleep(ms: int) -> int:
    await asyncio.sleep(ms / 1000)
    return ms


if __name__ == "__main__":
    wirepool.serve()
