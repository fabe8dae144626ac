"""``map(..., return_exceptions=True)``: a failed call's error is yielded at its place, the map
goes on (issue 28; as ``asyncio.gather``). Without it the first error raises at its place."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest

import wirepool

BASIC = os.path.join(os.path.dirname(__file__), "workers", "basic.py")
# Every 7th request lacks "b": its handler raises KeyError (HANDLER_ERROR); one is unencodable.
REQUESTS = [{"a": i} if i % 7 == 3 else {"a": i, "b": 1} for i in range(200)]
UNENCODABLE = 150
REQUESTS[UNENCODABLE] = {"a": object()}


def check(results: list) -> None:
    assert len(results) == len(REQUESTS)
    for i, r in enumerate(results):
        if i == UNENCODABLE:
            assert isinstance(r, wirepool.WirepoolError) and r.code == 202, (i, r)  # BAD_REQUEST
        elif i % 7 == 3:
            assert isinstance(r, wirepool.HandlerError), (i, r)
        else:
            assert r == {"sum": i + 1}, (i, r)


@pytest.mark.timeout(60)
def test_pool_map_returns_exceptions_in_place() -> None:
    with wirepool.Pool([sys.executable, BASIC], workers=2) as pool:
        check(list(pool.map("add", REQUESTS, return_exceptions=True, window=16)))
        with pytest.raises(wirepool.HandlerError):  # the default: the first error raises
            list(pool.map("add", REQUESTS))
        assert pool.call("add", {"a": 1, "b": 2}) == {"sum": 3}  # the pool is unharmed


@pytest.mark.timeout(60)
def test_async_pool_map_returns_exceptions_in_place() -> None:
    async def main() -> list:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=2) as pool:
            return [r async for r in pool.map("add", REQUESTS, return_exceptions=True)]
    check(asyncio.run(main()))


@pytest.mark.parametrize("value", [1, "yes", None])
def test_return_exceptions_takes_a_bool_only(value: object) -> None:
    with wirepool.Pool([sys.executable, BASIC]) as pool:
        with pytest.raises(wirepool.InvalidArgument, match="return_exceptions must be True or False"):
            pool.map("add", [], return_exceptions=value)  # type: ignore[arg-type]
