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


@pytest.mark.parametrize("option", ["ordered", "return_exceptions"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_the_map_flags_take_a_bool_only(option: str, value: object) -> None:
    with wirepool.Pool([sys.executable, BASIC]) as pool:
        with pytest.raises(wirepool.InvalidArgument, match=f"{option} must be True or False"):
            pool.map("add", [], **{option: value})


SLOW_FIRST = [{"seconds": 0.5}] + [{"seconds": 0} for _ in range(50)]


@pytest.mark.timeout(60)
def test_pool_map_unordered_yields_results_as_they_finish() -> None:
    with wirepool.Pool([sys.executable, BASIC], workers=2) as pool:
        ordered = list(pool.map("sleep", SLOW_FIRST))
        assert ordered[0] == {"slept": 0.5}
        unordered = list(pool.map("sleep", SLOW_FIRST, ordered=False, window=8))
        # The slow call holds nothing back: 50 fast results are in long before it.
        assert unordered[0] == {"slept": 0} and unordered[-1] == {"slept": 0.5}, unordered[:3]
        assert sorted(map(str, unordered)) == sorted(map(str, ordered))
        # With errors as values, unordered, and more requests than the unread bound.
        check_unordered(list(pool.map("add", REQUESTS, ordered=False, return_exceptions=True,
                                      window=4)))


def check_unordered(results: list) -> None:
    assert len(results) == len(REQUESTS)
    sums = sorted(r["sum"] for r in results if isinstance(r, dict))
    assert sums == [i + 1 for i in range(len(REQUESTS)) if i % 7 != 3 and i != UNENCODABLE]
    assert sum(isinstance(r, wirepool.HandlerError) for r in results) == len(
        [i for i in range(len(REQUESTS)) if i % 7 == 3 and i != UNENCODABLE])
    assert sum(isinstance(r, wirepool.BadRequest) or getattr(r, "code", 0) == 202
               for r in results) == 1


@pytest.mark.timeout(60)
def test_async_pool_map_unordered() -> None:
    async def main() -> list:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=2) as pool:
            return [r async for r in pool.map("sleep", SLOW_FIRST, ordered=False)]
    results = asyncio.run(main())
    assert results[-1] == {"slept": 0.5} and len(results) == len(SLOW_FIRST)
