"""conformance/bad_input.json replayed against the Python parent (PROTOCOL.md section 22).

Every row of the table (read here, at test time) runs through the blocking :class:`Pool` and
the :class:`AsyncPool` against the Python conformance worker; a row is skipped only for a
reason the row itself gives (``inexpressible`` naming Python, or ``only`` not listing it).
Python takes durations in seconds: the table's milliseconds are divided by 1,000, except
``heartbeat_ms``, which Python takes in milliseconds too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wirepool
from wirepool import ErrorCode, WirepoolError
from wirepool import _validate

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "conformance" / "bad_input.json").read_text())
ROWS: list[dict[str, Any]] = TABLE["rows"]
WORKER = [sys.executable, str(ROOT / "python" / "conformance" / "worker.py")]
ADD = ("add", {"a": 1, "b": 2}, {"sum": 3})
LANG = "python"
WAIT = 60.0  # seconds any one step of a row may take before the test fails

# The table's option names -> (the Python keyword, the divisor from the table's milliseconds).
OPTIONS: dict[str, tuple[str, int]] = {
    "workers": ("workers", 1), "max_in_flight": ("max_in_flight", 1),
    "startup_timeout_ms": ("startup_timeout", 1000), "heartbeat_ms": ("heartbeat_ms", 1),
    "cancel_grace_ms": ("cancel_grace", 1000), "deadline_grace_ms": ("deadline_grace", 1000),
    "drain_grace_ms": ("drain_grace", 1000), "goodbye_grace_ms": ("goodbye_grace", 1000),
    "restart_backoff_ms": ("restart_backoff", 1000),
    "restart_backoff_max_ms": ("restart_backoff_max", 1000),
    "max_restarts": ("max_restarts", 1), "restart_window_ms": ("restart_window", 1000),
    "max_frame_size": ("max_frame_size", 1), "initial_credit": ("initial_credit", 1),
    "max_message_size": ("max_message_size", 1), "stderr_tail_lines": ("stderr_tail_lines", 1),
    "max_requests": ("max_requests", 1), "max_rss_bytes": ("max_rss_bytes", 1),
    "max_idle_ms": ("idle_timeout", 1000), "codec": ("codec", 1), "timeout_ms": ("timeout", 1000),
}


class _Opaque:
    """An object of no codec type."""


def special(value: Any) -> Any:
    """The Python value of a table value ({"$": NAME} for what JSON cannot hold)."""
    if not (isinstance(value, dict) and "$" in value):
        return value
    name = value["$"]
    if name in ("nan", "inf", "-inf"):
        return float(name)
    if name == "cyclic":
        cyclic: dict[str, Any] = {}
        cyclic["self"] = cyclic
        return cyclic
    makers: dict[str, Callable[[], Any]] = {
        "bigint": lambda: 2 ** 64, "opaque_object": _Opaque, "non_string_key": lambda: {(1, 2): 3},
        "bytes": lambda: b"abc", "repeat": lambda: value["s"] * value["n"],
        "string_of_bytes": lambda: b"x" * value["n"], "function": lambda: (lambda: None),
    }
    return makers[name]()


def converted(option: str, value: Any) -> tuple[str, Any]:
    keyword, divisor = OPTIONS[option]
    value = special(value)
    if divisor != 1 and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = value / divisor
    return keyword, value


def pool_kwargs(row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    argv, kw = list(WORKER), {"workers": 1}
    value = row.get("value")
    pairs = ([(k, v) for k, v in value.items() if k != "$"]
             if isinstance(value, dict) and value.get("$") == "options"
             else [(row["option"], value)])
    for option, v in pairs:
        if option == "command":
            argv = v
        elif option == "retry_attempts":  # a RetryPolicy's field: checked as it is built
            kw["retry"] = wirepool.RetryPolicy(methods={"echo"}, attempts=v)
        else:
            keyword, v = converted(option, v)
            kw[keyword] = v
    return argv, kw


def skip_reason(row: dict[str, Any]) -> str | None:
    if LANG in row.get("inexpressible", {}):
        return f"inexpressible in Python: {row['inexpressible'][LANG]}"
    if "only" in row and LANG not in row["only"]:
        return f"only for {', '.join(row['only'])}"
    return None


def check_error(row: dict[str, Any], e: BaseException) -> None:
    assert isinstance(e, WirepoolError), f"{row['id']}: untyped {type(e).__name__}: {e}"
    assert e.code == row["code"], f"{row['id']}: code {e.code}, want {row['code']}: {e}"
    want = type(wirepool.error_from_code(row["code"]))
    assert isinstance(e, want), f"{row['id']}: {type(e).__name__}, want {want.__name__}"
    limit = row.get("message_max_chars")
    if limit is not None:
        assert len(e.message) <= limit and len(str(e)) <= limit + 40, \
            f"{row['id']}: message of {len(e.message)} characters"


# -- the call rows, through both APIs ---------------------------------------------------------


def call_args(row: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    kw: dict[str, Any] = {}
    if "codec" in row:
        kw["codec"] = row["codec"]
    if row.get("option"):
        keyword, value = converted(row["option"], row["value"])
        kw[keyword] = value
    return special(row["method"]), special(row.get("request")), kw


class Sync:
    """The blocking API: one row on one started Pool."""

    name = "sync"

    def __init__(self, pool: wirepool.Pool) -> None:
        self.pool = pool

    def call(self, method: str, request: Any, **kw: Any) -> Any:
        return self.pool.call(method, request, **kw)

    def stream(self, method: str, request: Any, **kw: Any) -> list[Any]:
        s = self.pool.stream(method, request, **kw)
        try:
            return list(s)
        finally:
            s.close()

    def close(self) -> None:
        self.pool.close()


class Async:
    """The asyncio API: one AsyncPool on a loop in its own thread."""

    name = "async"

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: wirepool.AsyncPool) -> None:
        self.loop = loop
        self.pool = pool

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def call(self, method: str, request: Any, **kw: Any) -> Any:
        return self.run(self.pool.call(method, request, **kw))

    def stream(self, method: str, request: Any, **kw: Any) -> list[Any]:
        async def read() -> list[Any]:
            async with self.pool.stream(method, request, **kw) as s:
                return [row async for row in s]
        return self.run(read())

    def close(self) -> None:
        self.run(self.pool.close())


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(WAIT)
    lp.close()


def open_api(api: str, loop: asyncio.AbstractEventLoop, argv: list[str] | None = None,
             **kw: Any) -> Sync | Async:
    argv = WORKER if argv is None else argv
    kw.setdefault("workers", 1)
    if api == "sync":
        return Sync(wirepool.Pool(argv, **kw))
    pool = wirepool.AsyncPool(argv, **kw)
    a = Async(loop, pool)
    a.run(pool.start())
    return a


@pytest.fixture(scope="module")
def shared(loop: asyncio.AbstractEventLoop) -> Iterator[dict[str, Sync | Async]]:
    """One pool per API for every call row: a refusal must leave it serving (pool.survives)."""
    apis = {api: open_api(api, loop) for api in ("sync", "async")}
    yield apis
    for a in apis.values():
        a.close()


def run_call_row(row: dict[str, Any], a: Sync | Async) -> None:
    method, request, kw = call_args(row)
    go = a.stream if row.get("stream") else a.call
    if row["at"] == "ok":
        assert go(method, request, **kw) == row.get("result"), row["id"]
        return
    with pytest.raises(BaseException) as info:
        go(method, request, **kw)
    check_error(row, info.value)


CALL_KINDS = ("call_option", "method", "request")


def call_rows() -> list[Any]:
    return [pytest.param(row, api, id=f"{row['id']}-{api}")
            for row in ROWS if row["kind"] in CALL_KINDS for api in ("sync", "async")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("row,api", call_rows())
def test_call_row(row: dict[str, Any], api: str, shared: dict[str, Any],
                  loop: asyncio.AbstractEventLoop) -> None:
    reason = skip_reason(row)
    if reason:
        pytest.skip(reason)
    if "pool" in row:  # its own pool with these options, which must answer after the refusal
        kw = dict(converted(k, v) for k, v in row["pool"].items())
        a = open_api(api, loop, **kw)
        try:
            run_call_row(row, a)
            assert a.call(*ADD[:2]) == ADD[2]
        finally:
            a.close()
        return
    run_call_row(row, shared[api])
    assert shared[api].call(*ADD[:2]) == ADD[2], f"the pool did not survive {row['id']}"


# -- the pool option rows ---------------------------------------------------------------------


def pool_rows() -> list[Any]:
    return [pytest.param(row, api, id=f"{row['id']}-{api}")
            for row in ROWS if row["kind"] == "pool_option" for api in ("sync", "async")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("row,api", pool_rows())
def test_pool_option_row(row: dict[str, Any], api: str, loop: asyncio.AbstractEventLoop) -> None:
    reason = skip_reason(row)
    if reason:
        pytest.skip(reason)
    threads = threading.active_count()
    if row["at"] == "construction" and row["code"] == ErrorCode.INVALID_ARGUMENT:
        # Refused by the constructor itself (or by the RetryPolicy given to it): no loop, no
        # thread, no worker was started.
        cls = wirepool.Pool if api == "sync" else wirepool.AsyncPool
        with pytest.raises(BaseException) as info:
            argv, kw = pool_kwargs(row)
            cls(argv, **kw)
        check_error(row, info.value)
        assert threading.active_count() == threads, "the refused pool left a thread behind"
        return
    argv, kw = pool_kwargs(row)
    if row["at"] == "construction":  # e.g. SPAWN_FAILED: raised by starting the pool
        with pytest.raises(BaseException) as info:
            open_api(api, loop, argv, **kw)
        check_error(row, info.value)
        return
    a = open_api(api, loop, argv, **kw)
    try:
        assert a.call(*ADD[:2]) == ADD[2]
    finally:
        a.close()


# -- the lifecycle rows -----------------------------------------------------------------------


def lifecycle_sync(action: str, pool: wirepool.Pool) -> Any:
    if action == "call_after_close":
        pool.close()
        return pool.call(*ADD[:2])
    if action == "stream_after_close":
        pool.close()
        return list(pool.stream("decls", {"n": 1}))
    if action == "close_twice":
        pool.close()
        return pool.close()
    if action == "close_concurrently":
        threads = [threading.Thread(target=pool.close) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        return None
    if action == "stream_read_after_end":
        s = pool.stream("decls", {"n": 2})
        assert len(list(s)) == 2
        assert list(s) == [] and next(iter(s), "end") == "end"
        return None
    if action == "cancel_after_end":
        fut = pool.submit(*ADD[:2])
        assert fut.result(WAIT) == ADD[2]
        assert fut.cancel() is False and fut.result() == ADD[2]
        assert pool.call(*ADD[:2]) == ADD[2]
        return None
    raise NotImplementedError(action)


async def lifecycle_async(action: str, pool: wirepool.AsyncPool) -> Any:
    if action == "call_after_close":
        await pool.close()
        return await pool.call(*ADD[:2])
    if action == "stream_after_close":
        await pool.close()
        return [row async for row in pool.stream("decls", {"n": 1})]
    if action == "lease_after_close":
        await pool.close()
        async with pool.lease():
            return None
    if action == "close_twice":
        await pool.close()
        return await pool.close()
    if action == "close_concurrently":
        await asyncio.gather(pool.close(), pool.close())
        return None
    if action == "lease_call_after_release":
        async with pool.lease() as lease:
            assert await lease.call(*ADD[:2]) == ADD[2]
        return await lease.call(*ADD[:2])
    if action == "stream_read_after_end":
        s = pool.stream("decls", {"n": 2})
        assert len([r async for r in s]) == 2
        assert [r async for r in s] == []
        return None
    if action == "cancel_after_end":
        task = asyncio.ensure_future(pool.call(*ADD[:2]))
        assert await task == ADD[2]
        task.cancel()
        assert task.result() == ADD[2] and await pool.call(*ADD[:2]) == ADD[2]
        return None
    raise NotImplementedError(action)


SYNC_ACTIONS = {"call_after_close", "stream_after_close", "close_twice", "close_concurrently",
                "stream_read_after_end", "cancel_after_end"}


def lifecycle_rows() -> list[Any]:
    out = []
    for row in ROWS:
        if row["kind"] != "lifecycle" or row["action"] == "every_refusal_then_call":
            continue
        apis = ("sync", "async") if row["action"] in SYNC_ACTIONS else ("async",)
        out += [pytest.param(row, api, id=f"{row['id']}-{api}") for api in apis]
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("row,api", lifecycle_rows())
def test_lifecycle_row(row: dict[str, Any], api: str, loop: asyncio.AbstractEventLoop) -> None:
    reason = skip_reason(row)
    if reason:
        pytest.skip(reason)
    a = open_api(api, loop)
    try:
        def act() -> Any:
            if isinstance(a, Sync):
                return lifecycle_sync(row["action"], a.pool)
            return a.run(lifecycle_async(row["action"], a.pool))
        if row["at"] == "ok":
            act()
        else:
            with pytest.raises(BaseException) as info:
                act()
            check_error(row, info.value)
    finally:
        a.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("api", ["sync", "async"])
def test_pool_survives(api: str, loop: asyncio.AbstractEventLoop) -> None:
    """pool.survives: one pool takes every call-time row in turn, then still adds."""
    row = next(r for r in ROWS if r["id"] == "pool.survives")
    assert skip_reason(row) is None
    a = open_api(api, loop)
    try:
        for r in ROWS:
            if r["kind"] in CALL_KINDS and "pool" not in r and skip_reason(r) is None:
                run_call_row(r, a)
        assert a.call(*ADD[:2]) == ADD[2]
    finally:
        a.close()


def test_every_row_is_run() -> None:
    """No row of the table falls through the runner's kinds."""
    kinds = {"pool_option", "call_option", "method", "request", "lifecycle"}
    assert {row["kind"] for row in ROWS} <= kinds
    for row in ROWS:
        if row["kind"] == "pool_option" and row.get("value") != "max_duration" \
                and not skip_reason(row):
            with contextlib.suppress(wirepool.InvalidArgument):
                pool_kwargs(row)  # every option has its Python name (or raises 308 itself)


# -- the numeric option space -----------------------------------------------------------------

numbers = st.one_of(st.integers(min_value=-2 ** 64, max_value=2 ** 64),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 0.5, 65536, 16777216, 2 ** 31 - 1, 2 ** 32,
                                     2147483647, 2147483648, 2 ** 53, True, "1", None]))


MS = 1000  # the table's milliseconds per Python second
INT, REAL = "int", "real"
# The ranges of 22.2 in the table's units: (kind, low, high, low included, None allowed).
RANGES: dict[str, tuple[str, float, float, bool, bool]] = {
    "workers": (INT, 1, 4096, True, True),  # None: one per CPU (section 17)
    "max_in_flight": (INT, 1, 2 ** 32 - 1, True, False),
    "startup_timeout_ms": (REAL, 0, 2 ** 31 - 1, False, False),
    "restart_window_ms": (REAL, 0, 2 ** 31 - 1, False, False),
    "heartbeat_ms": (INT, 0, 2 ** 31 - 1, True, False),
    "cancel_grace_ms": (REAL, 0, 2 ** 31 - 1, True, False),
    "deadline_grace_ms": (REAL, 0, 2 ** 31 - 1, True, False),
    "drain_grace_ms": (REAL, 0, 2 ** 31 - 1, True, False),
    "goodbye_grace_ms": (REAL, 0, 2 ** 31 - 1, True, False),
    "restart_backoff_ms": (REAL, 0, 5000, True, False),  # <= restart_backoff_max (5 s)
    "restart_backoff_max_ms": (REAL, 10, 2 ** 31 - 1, True, False),  # >= restart_backoff
    "max_restarts": (INT, 0, 2 ** 32 - 1, True, False),
    "stderr_tail_lines": (INT, 0, 2 ** 32 - 1, True, False),
    "max_frame_size": (INT, 65536, 16777216, True, False),
    "initial_credit": (INT, 1, 2 ** 31 - 1, True, False),
    "max_message_size": (INT, 4194304, 2 ** 53 - 1, True, False),  # >= the default frame size
    "max_requests": (INT, 1, 2 ** 53 - 1, True, True),
    "max_rss_bytes": (INT, 1, 2 ** 53 - 1, True, True),
    "max_idle_ms": (REAL, 0, 2 ** 31 - 1, False, True),
}


def in_range(option: str, value: Any) -> bool:
    """The oracle: whether 22.2 allows ``value`` (in the table's units) for ``option``."""
    kind, low, high, low_ok, none_ok = RANGES[option]
    if value is None:
        return none_ok
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == INT and not isinstance(value, int):
        return False
    if not math.isfinite(value):
        return False
    if OPTIONS[option][1] == MS:  # compared in seconds, as the SDK does
        value, low, high = value / MS, low / MS, high / MS
    return (low <= value if low_ok else low < value) and value <= high


def python_value(option: str, value: Any) -> Any:
    if OPTIONS[option][1] == MS and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        return value / MS
    return value


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(option=st.sampled_from(sorted(RANGES)), value=numbers)
def test_numeric_options_are_valid_or_refused(option: str, value: Any) -> None:
    """Any value of a numeric option is accepted by the pool's constructor (which runs the one
    validation, _validate.pool_options, and spawns nothing) exactly when 22.2's range holds it,
    unchanged (never clamped); otherwise it raises INVALID_ARGUMENT, never anything else."""
    keyword = OPTIONS[option][0]
    try:
        pool = wirepool.AsyncPool(WORKER, **{keyword: python_value(option, value)})
    except wirepool.InvalidArgument as e:
        assert e.code == ErrorCode.INVALID_ARGUMENT and len(e.message) < 1000
        assert not in_range(option, value), f"{option}={value!r} refused: {e}"
        return
    assert in_range(option, value), f"{option}={value!r} accepted"
    stored = {"workers": "size"}.get(keyword, keyword)
    if value is None and option == "workers":
        assert pool.size >= 1  # the default: the CPUs this process may use
        return
    assert getattr(pool, stored) == python_value(option, value)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(option=st.sampled_from(["max_in_flight", "heartbeat_ms", "initial_credit", "max_requests",
                               "cancel_grace_ms", "max_frame_size"]),
       value=st.one_of(st.integers(min_value=-2, max_value=2 ** 33),
                       st.floats(allow_nan=True, allow_infinity=True)))
@pytest.mark.timeout(120)
def test_numeric_options_start_a_real_pool(option: str, value: Any) -> None:
    """A few values start real pools: valid ones answer, the others raise at once."""
    keyword, divisor = OPTIONS[option]
    if divisor != 1 and isinstance(value, (int, float)):
        value = value / divisor
    try:
        pool = wirepool.Pool(WORKER, workers=1, **{keyword: value})
    except wirepool.InvalidArgument:
        return
    try:
        assert pool.call(*ADD[:2]) == ADD[2]
    finally:
        pool.close()


def test_timeout_is_checked_in_one_place() -> None:
    assert _validate.timeout_us(None) == 0
    assert _validate.timeout_us(1e-9) == 1
    assert _validate.timeout_us(0.0000015) == 2
    assert _validate.timeout_us(2147483.647) == 2147483647000
    for bad in (-1, math.nan, math.inf, -math.inf, 1e300, 2147483.648, "1", True):
        with pytest.raises(wirepool.InvalidArgument):
            _validate.timeout(bad, "m")
    with pytest.raises(wirepool.DeadlineExceeded):
        _validate.timeout(0, "m")
