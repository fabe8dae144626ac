"""The Python parent runner of the conformance matrix.

Runs ``conformance/scenarios.json`` against a ``wirepool.AsyncPool`` of any language's conformance
worker and prints one JSON line per scenario: ``{"scenario", "ok", "detail", "elapsed"}``::

    python python/conformance/parent.py --scenarios conformance/scenarios.json \
        [--only NAME ...] [--transport socketpair|tls|tcp] -- WORKER COMMAND...

Each scenario gets a fresh pool and is bounded by its ``timeout_s``. Besides the scenario's own
expectation, every scenario that starts a pool checks that every request ended at the pool
(nothing left in flight within ``settle_s``), whether the worker was replaced (``restarted``), and
that the pool still serves the suite's health-check call. The procedure of each scenario kind is
described in ``conformance/README.md``; the Rust runner implements the same one.

``--transport tls`` runs every pool's workers as children that join over TCP + TLS 1.3 with a
ticket of their own (``WIREPOOL_TICKET`` instead of ``WIREPOOL_FD``, through
``wirepool.launchers.Subprocess``: PROTOCOL.md 21), so the same scenarios exercise the remote
path; ``conformance/test_remote.py`` runs it (``--transport tcp``: the same join over plain
loopback TCP). A remote worker's end is a lost connection
(PROTOCOL.md 21.6): every ``WORKER_EXITED`` must then say ``"connection": "lost"`` in its
details, with no exit status or signal. The workers' stdout goes to the runner's stderr (the
runner's stdout is its report channel, and a remote worker's output is not the pool's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import wirepool
from wirepool import WirepoolError, launchers

# "socketpair" (inherited, the default), "tls" or "tcp" (children that join with a ticket over
# TCP, with or without TLS): --transport.
TRANSPORT = "socketpair"


class ScenarioFailed(Exception):
    """The scenario's expectation does not hold; the message says how."""


class Suite:
    def __init__(self, doc: dict) -> None:
        self.codes: dict[str, int] = doc["error_codes"]
        self.defaults: dict = doc["defaults"]
        self.health: dict = doc["health_check"]

    def setting(self, sc: dict, key: str) -> Any:
        return sc.get(key, self.defaults.get(key))

    def pool_config(self, sc: dict) -> dict:
        return {**self.defaults["pool"], **sc.get("pool", {})}

    def expected_code(self, code: Any) -> int:
        if isinstance(code, int):
            return code
        if code not in self.codes:
            raise ScenarioFailed(f"unknown error code name {code!r}")
        return self.codes[code]


def pool_options(cfg: dict) -> dict:
    return {
        "workers": int(cfg["workers"]),
        "max_in_flight": int(cfg["max_in_flight"]),
        "startup_timeout": float(cfg["startup_timeout_s"]),
        "heartbeat_ms": int(cfg["heartbeat_ms"]),
        "cancel_grace": float(cfg["cancel_grace_s"]),
        "deadline_grace": float(cfg["deadline_grace_s"]),
        "max_frame_size": int(cfg["max_frame_size"]),
        "initial_credit": int(cfg["window"]),
        "max_requests": cfg.get("max_requests"),
        # Optional (the SDK's default when a scenario file does not set it).
        **({"max_message_size": int(cfg["max_message_size"])}
           if cfg.get("max_message_size") is not None else {}),
        "env": cfg.get("env"),
        # A listener and certificate per pool, as a pool of remote workers has (21.1).
        **({"launcher": launchers.Subprocess(tls=TRANSPORT == "tls")}
           if TRANSPORT != "socketpair" else {}),
    }


# ---------------------------------------------------------------------------------------------
# Hostile-worker settings: the worker's environment, the runner's memory and its children
# ---------------------------------------------------------------------------------------------


def worker_env(sc: dict, tmp: str) -> dict[str, str] | None:
    """The pool's worker environment: ours plus the scenario's ``worker_env`` ("{tmp}" in a
    value is a fresh directory of this scenario)."""
    extra = sc.get("worker_env")
    if not extra:
        return None
    return {**os.environ, **{k: str(v).replace("{tmp}", tmp) for k, v in extra.items()}}


def reset_peak_rss() -> None:
    """Restarts VmHWM at the current RSS, so each scenario's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def check_rss_after(suite: Suite, sc: dict, limit: float) -> None:
    """``max_rss_after_mb``: while the caller still holds the outcome (an error must not pin
    the dead worker's buffers), the runner's RSS comes back under ``limit`` within
    ``settle_s``."""
    settle = float(suite.setting(sc, "settle_s"))
    deadline = time.monotonic() + settle
    while True:
        gc.collect()  # garbage does not count, only what the outcome keeps alive
        if rss_mb() <= limit:
            return
        if time.monotonic() >= deadline:
            raise ScenarioFailed(f"the runner still holds {rss_mb():.0f} MB {settle}s after the "
                                 f"outcome (bound {limit} MB): the outcome keeps buffers alive")
        await asyncio.sleep(0.05)


def live_children() -> list[int]:
    """Our child processes that have not exited (zombies excluded): the pool's workers."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after the command name
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry))
    return found


LIVE_HOLD_S = 0.5  # live_workers: the count must hold this long (replacements come and go)


async def check_live_workers(suite: Suite, sc: dict, want: int) -> None:
    """With ``live_workers`` (true, or an explicit count that overrides ``want``): within
    ``settle_s``, our live child processes number exactly ``want`` and keep that number for
    LIVE_HOLD_S (an over-spawning pool is caught after its failed replacements stop coming and
    going)."""
    setting = suite.setting(sc, "live_workers")
    if not setting:
        return
    if setting is not True:  # an explicit count
        want = int(setting)
    settle = float(suite.setting(sc, "settle_s"))
    since: list[float] = []

    def held() -> bool:
        now = time.monotonic()
        if len(live_children()) != want:
            since.clear()
        elif not since:
            since.append(now)
        return bool(since) and now - since[0] >= LIVE_HOLD_S

    deadline = time.monotonic() + settle + LIVE_HOLD_S
    while not held() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # polling /proc, bounded by the deadline
    if not held():
        live = sorted(live_children())
        raise ScenarioFailed(f"{len(live)} live worker processes {live} {settle}s after the "
                             f"outcome, expected {want} (for {LIVE_HOLD_S}s)")


# One period of each pattern, repeated: building a 10 MB body byte by byte held the event loop
# for seconds, long enough for a remote worker to find its parent silent (21.5).
_PATTERN = bytes((i * 31 + 17) % 251 for i in range(251))
_PATTERN_STRING = "".join(chr(97 + (i * 31 + 17) % 26) for i in range(26))


def pattern(size: int) -> bytes:
    """The bytes of ``{"bytes": {"size": N}}``: byte i is (31 i + 17) mod 251."""
    return (_PATTERN * (size // 251 + 1))[:size]


def pattern_string(size: int) -> str:
    """The text of ``{"string": {"size": N}}``: character i is 'a' + (31 i + 17) mod 26."""
    return (_PATTERN_STRING * (size // 26 + 1))[:size]


def request(form: dict) -> Any:
    if "value" in form:
        return form["value"]
    if "bytes" in form:
        return pattern(int(form["bytes"]["size"]))
    if "string" in form:
        return pattern_string(int(form["string"]["size"]))
    if "text" in form:
        return form["text"].encode()
    raise ScenarioFailed(f"unknown request form {form!r}")


def as_plain(value: Any) -> Any:
    """Raw results and rows arrive as memoryviews: compare them as bytes."""
    return bytes(value) if isinstance(value, (memoryview, bytearray)) else value


def describe(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{len(value)} bytes"
    if isinstance(value, str) and len(value) > 64:
        return f"a string of {len(value)} characters"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 200 else text[:200] + "..."


def same_body(want: Any, got: Any) -> None:
    got = as_plain(got)
    if isinstance(want, bytes) and isinstance(got, bytes):
        if want != got:
            first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b),
                         min(len(want), len(got)))
            raise ScenarioFailed(f"expected {len(want)} bytes, got {len(got)} bytes differing "
                                 f"from offset {first}")
        return
    # JSON equality, as in the Rust runner: 1 == 1.0 but True != 1.
    if json.dumps(want, sort_keys=True) != json.dumps(got, sort_keys=True):
        raise ScenarioFailed(f"expected {describe(want)}, got {describe(got)}")


def error_details(e: WirepoolError) -> Any:
    details = e.details
    if isinstance(details, str):
        if not details:
            return None
        try:
            return json.loads(details)
        except ValueError:
            return details
    return details


def check_error(suite: Suite, want: dict, e: BaseException) -> None:
    if not isinstance(e, WirepoolError):
        raise ScenarioFailed(f"expected error {want['code']}, got a non-wirepool exception "
                             f"{type(e).__name__}: {e}")
    code = suite.expected_code(want["code"])
    if e.code != code:
        raise ScenarioFailed(f"expected error {want['code']} ({code}), got code {e.code}: {e}")
    if TRANSPORT != "socketpair" and code == suite.codes["WORKER_EXITED"]:
        # PROTOCOL.md 21.6: a remote worker's end is its connection's, named in the details.
        details = error_details(e)
        lost = details.get("connection") if isinstance(details, dict) else None
        if lost != "lost":
            raise ScenarioFailed(f"a remote worker's WORKER_EXITED must say \"connection\": "
                                 f"\"lost\" in its details, got {details!r} ({e})")
    if "protocol_code" in want:
        details = error_details(e)
        got = details.get("protocol_code") if isinstance(details, dict) else None
        if got != want["protocol_code"]:
            raise ScenarioFailed(f"expected protocol code {want['protocol_code']} in the "
                                 f"details, got {got!r} ({e})")
    part = want.get("message_contains")
    if part is not None and part not in e.message:
        raise ScenarioFailed(f"error message {e.message!r} does not contain {part!r}")
    if "details" in want:
        got = error_details(e)
        if json.dumps(got, sort_keys=True) != json.dumps(want["details"], sort_keys=True):
            raise ScenarioFailed(f"error details {got!r} differ from the expected "
                                 f"{want['details']!r}")
    if "signal" in want:
        sig = getattr(e, "signal", None)
        if sig != want["signal"]:
            raise ScenarioFailed(f"expected the worker to die by signal {want['signal']}, got "
                                 f"{sig!r} ({e})")
    if "exit_status" in want:
        status = getattr(e, "exit_status", None)
        if status != want["exit_status"]:
            raise ScenarioFailed(f"expected the worker to exit with status {want['exit_status']}, "
                                 f"got {status!r} ({e})")
    part = want.get("stderr_contains")
    if part is not None:
        tail = getattr(e, "stderr_tail", "") or ""
        if part not in tail:
            raise ScenarioFailed(f"the stderr tail {tail!r} does not contain {part!r}")


def check_elapsed(expect: dict, elapsed: float) -> None:
    low = expect.get("min_elapsed_s")
    # The worker counts its budget from receipt, so the outcome cannot come earlier.
    if low is not None and elapsed + 0.001 < low:
        raise ScenarioFailed(f"the outcome came after {elapsed:.3f}s, before the {low}s deadline")
    high = expect.get("max_elapsed_s")
    if high is not None and elapsed > high:
        raise ScenarioFailed(f"the outcome took {elapsed:.3f}s, more than {high}s")


def check_call(suite: Suite, expect: dict, sent: Any, result: Any,
               error: BaseException | None) -> None:
    if expect.get("any"):  # any result or typed error (the call returned: one outcome)
        return
    if "error" in expect:
        if error is None:
            raise ScenarioFailed(f"expected error {expect['error']['code']}, got the result "
                                 f"{describe(as_plain(result))}")
        check_error(suite, expect["error"], error)
        return
    if "result" not in expect:
        raise ScenarioFailed("the expectation has neither result nor error")
    if error is not None:
        raise ScenarioFailed(f"expected a result, got error {getattr(error, 'code', '?')}: "
                             f"{error}")
    want = expect["result"]
    same_body(sent if want == "echo" else request(want), result)


async def call(pool: Any, method: str, codec: str, body: Any,
               timeout: float | None) -> tuple[Any, WirepoolError | None]:
    try:
        return await pool.call(method, body, codec=codec, timeout=timeout), None
    except WirepoolError as e:
        return None, e


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------


class RowShape:
    """How row k must look; ``check`` returns the index it carries (summed into the checksum)."""

    def __init__(self, expect: dict) -> None:
        rows = expect.get("rows", {})
        self.shape = rows.get("shape", "any")
        self.size = int(rows.get("size", 0))

    def check(self, k: int, row: Any) -> int:
        if self.shape == "decl":
            want: Any = {"i": k, "name": f"decl_{k}", "kind": "theorem"}
        elif self.shape == "int_index":
            want = k
        elif self.shape == "unchecked":  # any_outcome: rows of any form
            return 0
        elif self.shape == "raw_index":
            row = as_plain(row)
            prefix = min(self.size, 8)
            if not (isinstance(row, bytes) and len(row) == self.size
                    and row[:prefix] == k.to_bytes(8, "little")[:prefix]
                    and row[prefix:] == b"\xab" * (self.size - prefix)):
                raise ScenarioFailed(f"raw row {k} ({describe(row)}) is not {self.size} bytes "
                                     f"of index {k} then 0xAB")
            return k
        else:
            raise ScenarioFailed(f"unknown row shape {self.shape!r}")
        if row != want or type(row) is not type(want):
            raise ScenarioFailed(f"row {k} is {row!r}, expected {want!r}")
        return k


_NOT_ENDED = object()


class Reader:
    """A stream being read: rows checked one by one, counted and summed."""

    def __init__(self, stream: wirepool.Stream, shape: RowShape) -> None:
        self.stream = stream
        self.shape = shape
        self.count = 0
        self.checksum = 0
        self.terminal: Any = _NOT_ENDED  # ("end", summary) or ("error", exception)

    @property
    def ended(self) -> bool:
        return self.terminal is not _NOT_ENDED

    async def read(self, until: int | None = None) -> None:
        while not self.ended and (until is None or self.count < until):
            try:
                row = await self.stream.__anext__()
            except StopAsyncIteration:
                self.terminal = ("end", self.stream.summary)
                break
            except WirepoolError as e:
                self.terminal = ("error", e)
                break
            self.checksum += self.shape.check(self.count, row)
            self.count += 1
        if self.ended:
            await self.after_terminal()

    async def after_terminal(self) -> None:
        """Exactly one terminal: once a stream has ended, reading again yields nothing new (the
        same error may be raised again: it is the same outcome, not a second one)."""
        try:
            row = await self.stream.__anext__()
        except StopAsyncIteration:
            return
        except WirepoolError as e:
            if self.terminal[0] == "error" and e is self.terminal[1]:
                return
            raise ScenarioFailed(f"a second outcome ({e}) after the stream's terminal") from e
        raise ScenarioFailed(f"a row ({describe(as_plain(row))}) arrived after the stream's "
                             f"terminal")

    def terminal_text(self) -> str:
        if not self.ended:
            return "not ended"
        kind, value = self.terminal
        return "ended normally" if kind == "end" else f"then error {value.code}: {value}"


def check_stream(suite: Suite, expect: dict, reader: Reader) -> str:
    rows = expect.get("rows", {})
    n = reader.count
    if "count" in rows and n != rows["count"]:
        raise ScenarioFailed(f"expected {rows['count']} rows, got {n} ({reader.terminal_text()})")
    if "min" in rows and n < rows["min"]:
        raise ScenarioFailed(f"expected at least {rows['min']} rows, got {n}")
    if "max" in rows and n > rows["max"]:
        raise ScenarioFailed(f"expected at most {rows['max']} rows, got {n}")
    if "checksum" in rows and reader.checksum != rows["checksum"]:
        raise ScenarioFailed(f"row checksum {reader.checksum} differs from {rows['checksum']}")
    if not reader.ended:
        raise ScenarioFailed("the stream has not ended")
    kind, value = reader.terminal
    if expect.get("any"):
        return f"{n} rows, then {reader.terminal_text()}"
    if "error" in expect:
        if kind == "end":
            raise ScenarioFailed(f"expected error {expect['error']['code']} after the rows, the "
                                 f"stream ended normally after {n} rows")
        check_error(suite, expect["error"], value)
        return f"{n} rows, then error {value.code}"
    if kind == "error":
        raise ScenarioFailed(f"after {n} rows the stream failed with {value.code}: {value}")
    want = expect.get("summary")
    if want == "none":
        if value is not None:
            raise ScenarioFailed(f"expected no summary, got {describe(as_plain(value))}")
    elif want is not None:
        expected = request(want)
        if value is None or json.dumps(value, sort_keys=True) != json.dumps(expected,
                                                                            sort_keys=True):
            raise ScenarioFailed(f"expected the summary {describe(expected)}, got "
                                 f"{describe(value)}")
    return f"{n} rows, checksum {reader.checksum}"


# ---------------------------------------------------------------------------------------------
# The procedures
# ---------------------------------------------------------------------------------------------


def snapshot(pool: wirepool.AsyncPool) -> tuple[set[int], int]:
    m = pool.metrics()
    return {w["pid"] for w in m["workers"] if w["alive"]}, int(m.get("restarts", 0))


def in_flight(pool: wirepool.AsyncPool) -> int:
    return sum(w["in_flight"] for w in pool.metrics()["workers"])


async def wait_for(bound: float, done: Any) -> bool:
    """Polls the pool's own accounting until ``done()`` holds, up to ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not done():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.002)
    return True


def method_of(sc: dict) -> tuple[str, str, Any]:
    return sc["method"], sc.get("codec", "json"), request(sc["request"])


async def after(suite: Suite, sc: dict, pool: wirepool.AsyncPool,
                before: tuple[set[int], int]) -> None:
    """What every scenario checks once its outcome is in."""
    settle = float(suite.setting(sc, "settle_s"))
    if not await wait_for(settle, lambda: in_flight(pool) == 0):
        raise ScenarioFailed(f"{in_flight(pool)} request(s) still in flight at the pool {settle}s "
                             f"after the outcome: no terminal from the worker")
    h = suite.health
    body = request(h["request"])
    # After any_outcome (a fuzzing worker), a health check routed to the broken worker before
    # the pool saw it break may fail like any request on it: the pool must serve within settle_s.
    retry_until = time.monotonic() + (settle if sc["kind"] == "any_outcome" else 0.0)
    while True:
        result, error = await call(pool, h["method"], h["codec"], body, None)
        try:
            check_call(suite, h["expect"], body, result, error)
            break
        except ScenarioFailed as e:
            if time.monotonic() >= retry_until:
                raise ScenarioFailed(f"the pool no longer serves: {h['method']}: {e}") from None
        await asyncio.sleep(0.05)
    pids, restarts = snapshot(pool)
    want = suite.setting(sc, "restarted")
    if want is False and (pids != before[0] or restarts != before[1]):
        raise ScenarioFailed(f"the worker was replaced (pids {sorted(before[0])} -> "
                             f"{sorted(pids)}, restarts {before[1]} -> {restarts})")
    if want is True and not pids.isdisjoint(before[0]):
        raise ScenarioFailed(f"expected the worker to be replaced, pids {sorted(before[0])} -> "
                             f"{sorted(pids)}")
    await check_live_workers(suite, sc, int(suite.pool_config(sc)["workers"]))


async def call_scenario(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    method, codec, body = method_of(sc)
    expect = sc["expect"]
    started = time.monotonic()
    result, error = await call(pool, method, codec, body, sc.get("call_timeout_s"))
    elapsed = time.monotonic() - started
    check_call(suite, expect, body, result, error)
    check_elapsed(expect, elapsed)
    if "max_rss_after_mb" in expect:  # the outcome is still held here, as a caller would
        await check_rss_after(suite, sc, float(expect["max_rss_after_mb"]))
    if error is not None:
        return f"error {error.code} in {elapsed:.3f}s"
    return f"result {describe(as_plain(result))} in {elapsed:.3f}s"


async def stream_scenario(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    method, codec, body = method_of(sc)
    expect = sc["expect"]
    started = time.monotonic()
    reader = Reader(pool.stream(method, body, codec=codec, timeout=sc.get("call_timeout_s")),
                    RowShape(expect))
    if "pause" in sc:  # a consumer that stops reading for a while
        until, pause = sc["pause"]
        await reader.read(int(until))
        await asyncio.sleep(float(pause))
    await reader.read()
    elapsed = time.monotonic() - started
    detail = check_stream(suite, expect, reader)
    check_elapsed(expect, elapsed)
    return f"{detail} in {elapsed:.3f}s"


async def cancel_stream(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    method, codec, body = method_of(sc)
    want = int(sc["read_rows"])
    stream = pool.stream(method, body, codec=codec)
    reader = Reader(stream, RowShape(sc["expect"]))
    await reader.read(want)
    if reader.ended:
        raise ScenarioFailed(f"the endless stream ended after {reader.count} rows "
                             f"({reader.terminal_text()})")
    # Not reading for a while lets the worker use up its credit and wait for more.
    await asyncio.sleep(float(sc.get("pause_s", 0)))
    await stream.aclose()  # how a Python caller cancels a stream
    return f"cancelled after {want} rows"


async def cancel_call(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    method, codec, body = method_of(sc)
    settle = float(suite.setting(sc, "settle_s"))
    task = asyncio.ensure_future(pool.call(method, body, codec=codec))
    if not await wait_for(settle, lambda: in_flight(pool) >= 1 or task.done()):
        task.cancel()
        raise ScenarioFailed(f"the call was not in flight within {settle}s")
    task.cancel()  # how a Python caller cancels a call
    try:
        result = await task
    except asyncio.CancelledError:
        return "cancelled while in flight"
    except WirepoolError as e:
        raise ScenarioFailed(f"the call ended with {e.code} before it was cancelled: {e}") from e
    raise ScenarioFailed(f"the call returned {describe(as_plain(result))} instead of being "
                         f"cancelled")


async def slow_consumer(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    method, codec, body = method_of(sc)
    expect = sc["expect"]
    bound = int(sc["max_ahead_rows"])
    reader = Reader(pool.stream(method, body, codec=codec), RowShape(expect))
    worst = 0
    for until, pause in sc["checkpoints"]:
        await reader.read(int(until))
        if reader.ended:
            raise ScenarioFailed(f"the stream ended after {reader.count} rows, before checkpoint "
                                 f"{until} ({reader.terminal_text()})")
        # The consumer is slow: it stops reading for a while, and the producer must stall.
        await asyncio.sleep(float(pause))
        produced = await pool.call("raw_rows_produced", None)
        ahead = max(0, int(produced) - reader.count)
        worst = max(worst, ahead)
        if ahead > bound:
            raise ScenarioFailed(f"the worker produced {produced} rows while the consumer had "
                                 f"read {reader.count}: {ahead} ahead, more than the {bound} "
                                 f"flow control allows")
    await reader.read()
    detail = check_stream(suite, expect, reader)
    return f"{detail}; producer at most {worst} rows ahead (bound {bound})"


async def concurrent(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    calls, streams, stream_rows = int(sc["calls"]), int(sc["streams"]), int(sc["stream_rows"])

    async def one_call(i: int) -> None:
        got = await pool.call("add", {"a": i, "b": 2 * i})
        if got != {"sum": 3 * i}:
            raise ScenarioFailed(f"add #{i} returned {got!r}")

    async def one_stream(s: int) -> None:
        n = stream_rows + s
        reader = Reader(pool.stream("decls", {"n": n}, codec="json"),
                        RowShape({"rows": {"shape": "decl"}}))
        await reader.read()
        if not (reader.count == n and reader.terminal[0] == "end"
                and reader.terminal[1] == {"rows": n}):
            raise ScenarioFailed(f"stream #{s}: {reader.count} of {n} rows, "
                                 f"{reader.terminal_text()}")

    outcomes = await asyncio.gather(*(one_call(i) for i in range(calls)),
                                    *(one_stream(s) for s in range(streams)),
                                    return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise ScenarioFailed(f"{len(errors)} of {len(outcomes)} failed; first: "
                             f"{type(errors[0]).__name__}: {errors[0]}")
    return f"{calls} calls and {streams} streams at once, all correct"


async def startup(suite: Suite, sc: dict, worker: list[str], cfg: dict) -> str:
    require = sc.get("require", [])
    codecs = {r["codec"] for r in require} or {"json"}
    if len(codecs) != 1:
        raise ScenarioFailed("the Python pool checks every required method with one codec: a "
                             "start-up scenario must use one")
    pool = wirepool.AsyncPool(worker, codec=codecs.pop(),
                              require={r["method"]: r["kind"] for r in require},
                              **pool_options(cfg))
    expect = sc["expect"]
    started = time.monotonic()
    try:
        await pool.start()
    except WirepoolError as e:
        elapsed = time.monotonic() - started
        await pool.close(grace=0)
        if "error" not in expect:
            raise ScenarioFailed(f"the pool did not start: {e.code} {e}") from e
        check_error(suite, expect["error"], e)
        check_elapsed(expect, elapsed)
        await check_live_workers(suite, sc, 0)  # the failed worker was reaped
        if sc.get("then_start"):  # a fresh pool (the next worker behaves) must serve
            again = wirepool.AsyncPool(worker, codec="json", **pool_options(cfg))
            try:
                await again.start()
                await after(suite, sc, again, snapshot(again))
            except WirepoolError as e2:
                raise ScenarioFailed(f"refused at start-up as expected ({e.code}), but the "
                                     f"next pool failed: {e2.code} {e2}") from e2
            finally:
                await asyncio.wait_for(again.close(grace=1.0), 15.0)
            return f"refused at start-up in {elapsed:.3f}s: {e}; the next pool served"
        return f"refused at start-up in {elapsed:.3f}s: {e}"
    try:
        if "error" in expect:
            raise ScenarioFailed(f"expected start-up to fail with {expect['error']['code']}, "
                                 f"the pool started")
        await after(suite, sc, pool, snapshot(pool))
        return "started and served"
    finally:
        await pool.close(grace=1.0)


async def shutdown_in_flight(suite: Suite, sc: dict, worker: list[str], cfg: dict) -> str:
    """Shuts the pool down while a call is in flight: the call ends as expected (finished within
    the drain grace, or cancelled by the worker when the grace runs out), and the closed pool
    refuses new calls with POOL_CLOSED."""
    method, codec, body = method_of(sc)
    expect = sc["expect"]
    settle = float(suite.setting(sc, "settle_s"))
    pool = wirepool.AsyncPool(worker, codec="json", **pool_options(cfg))
    try:
        await pool.start()
    except WirepoolError as e:
        await pool.close(grace=0)
        raise ScenarioFailed(f"the pool did not start: {e.code} {e}") from e
    try:
        task = asyncio.ensure_future(call(pool, method, codec, body, None))
        if not await wait_for(settle, lambda: in_flight(pool) >= 1 or task.done()):
            task.cancel()
            raise ScenarioFailed(f"the call was not in flight within {settle}s")
        started = time.monotonic()
        await pool.close(grace=float(cfg["drain_grace_s"]))
        shut = time.monotonic() - started
        result, error = await task
        check_call(suite, expect, body, result, error)
        check_elapsed(expect, shut)
        _, late = await call(pool, "add", "json", {"a": 1, "b": 2}, None)
        if late is None or late.code != suite.codes["POOL_CLOSED"]:
            raise ScenarioFailed(f"a call after shutdown ended with {late!r} instead of "
                                 f"POOL_CLOSED")
    finally:
        await asyncio.wait_for(pool.close(grace=0), 15.0)
    ended = f"error {error.code}" if error is not None else describe(as_plain(result))
    return f"shut down in {shut:.3f}s; the call ended with {ended}"


async def parallel_calls(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    """``count`` identical calls at once, each checked against the expectation."""
    method, codec, body = method_of(sc)
    outcomes = await asyncio.gather(*(call(pool, method, codec, body, None)
                                      for _ in range(int(sc["count"]))))
    for k, (result, error) in enumerate(outcomes):
        try:
            check_call(suite, sc["expect"], body, result, error)
        except ScenarioFailed as e:
            raise ScenarioFailed(f"call #{k}: {e}") from None
    return f"{len(outcomes)} calls at once, all as expected"


async def lease(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    """A leased worker serves only its holder; once it dies, the lease's calls fail LEASE_LOST."""
    calls = int(sc["calls"])
    allowed = [suite.expected_code(c) for c in sc["crash_codes"]]
    async with pool.lease() as held:
        pid = held.pid
        for k in range(calls):
            got = await held.call("whoami", None)
            if got != pid:
                raise ScenarioFailed(f"call #{k} on the lease of pid {pid} was served by pid {got}")
        other = await pool.call("whoami", None)
        if other == pid:
            raise ScenarioFailed(f"a pool call was served by the leased worker {pid}")
        _, crashed = await call(held, "crash", "json", None, None)
        if crashed is None or crashed.code not in allowed:
            raise ScenarioFailed(f"crash on the lease ended with {crashed!r}, expected one of "
                                 f"{sc['crash_codes']}")
        try:
            value = await held.call("add", {"a": 1, "b": 2})
        except WirepoolError as e:
            if e.code != suite.codes["LEASE_LOST"]:
                raise ScenarioFailed(f"a call on the lost lease failed with {e.code} ({e}), "
                                     f"expected LEASE_LOST") from e
            # The lost lease still says how its worker died.
            for attr in ("signal", "exit_status", "stderr_tail"):
                if getattr(e, attr, None) != getattr(crashed, attr, None):
                    raise ScenarioFailed(f"LEASE_LOST {attr} {getattr(e, attr, None)!r} differs "
                                         f"from the crash's {getattr(crashed, attr, None)!r}")
        else:
            raise ScenarioFailed(f"a call on the lost lease returned {value!r}")
    return f"{calls} calls on pid {pid}; crash -> {crashed.code}; then LEASE_LOST"


async def any_outcome(suite: Suite, sc: dict, pool: wirepool.AsyncPool) -> str:
    """``calls`` unary calls and ``streams`` streams at once, each ending in exactly one outcome
    of any kind (a fuzzing worker's answers are unpredictable), within ``max_elapsed_s``."""
    method, codec, body = method_of(sc)
    timeout = sc.get("call_timeout_s")
    started = time.monotonic()

    async def one_stream() -> str:
        reader = Reader(pool.stream(sc["stream_method"], body, codec=codec, timeout=timeout),
                        RowShape({"rows": {"shape": "unchecked"}}))
        await reader.read()
        return f"{reader.count} rows, {reader.terminal_text()[:80]}"

    async def one_call() -> str:
        result, error = await call(pool, method, codec, body, timeout)
        return f"error {error.code}" if isinstance(error, WirepoolError) else "a result"

    outcomes = await asyncio.gather(*(one_call() for _ in range(int(sc.get("calls", 0)))),
                                    *(one_stream() for _ in range(int(sc.get("streams", 0)))))
    check_elapsed(sc["expect"], time.monotonic() - started)
    return "; ".join(outcomes)


PROCEDURES = {
    "call": call_scenario,
    "stream": stream_scenario,
    "cancel_stream": cancel_stream,
    "cancel_call": cancel_call,
    "slow_consumer": slow_consumer,
    "concurrent": concurrent,
    "parallel_calls": parallel_calls,
    "lease": lease,
    "any_outcome": any_outcome,
}


async def run_scenario(suite: Suite, sc: dict, worker: list[str]) -> str:
    tmp = tempfile.mkdtemp(prefix="wirepool-scenario-")
    try:
        return await run_in(suite, sc, worker, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ClampNotices(logging.Handler):
    """Counts the pool's clamp notices (PROTOCOL.md 4.2: max_in_flight above the worker's
    max_concurrency is said once per pool) logged since the last reset."""

    TEXT = "is above the worker's max_concurrency"

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.TEXT in record.getMessage():
            self.count += 1


CLAMP_NOTICES = ClampNotices()


def check_clamp_notices(sc: dict) -> None:
    want = sc.get("expect", {}).get("clamp_notices")
    if want is not None and CLAMP_NOTICES.count != int(want):
        raise ScenarioFailed(f"the pool logged {CLAMP_NOTICES.count} clamp notice(s) "
                             f"(max_in_flight above the worker's max_concurrency), expected {want}")


async def run_in(suite: Suite, sc: dict, worker: list[str], tmp: str) -> str:
    cfg = {**suite.pool_config(sc), "env": worker_env(sc, tmp)}
    if sc["kind"] == "startup":
        return await startup(suite, sc, worker, cfg)
    if sc["kind"] == "shutdown_in_flight":
        return await shutdown_in_flight(suite, sc, worker, cfg)
    procedure = PROCEDURES.get(sc["kind"])
    if procedure is None:
        raise ScenarioFailed(f"unknown scenario kind {sc['kind']!r}")
    CLAMP_NOTICES.count = 0
    pool = wirepool.AsyncPool(worker, codec="json", **pool_options(cfg))
    try:
        await pool.start()
    except WirepoolError as e:
        await pool.close(grace=0)
        raise ScenarioFailed(f"the pool did not start: {e.code} {e}") from e
    try:
        before = snapshot(pool)
        detail = await procedure(suite, sc, pool)
        await after(suite, sc, pool, before)
        check_clamp_notices(sc)
        return detail
    finally:
        await asyncio.wait_for(pool.close(grace=1.0), 15.0)


async def main_async(suite: Suite, scenarios: list[dict], worker: list[str],
                     report: Any = None) -> None:
    for sc in scenarios:
        bound = float(suite.setting(sc, "timeout_s"))
        started = time.monotonic()
        # An earlier scenario's reference cycles (exceptions, tracebacks) would count towards
        # this one's peak until the cyclic collector happens to run.
        gc.collect()
        reset_peak_rss()
        try:
            detail = await asyncio.wait_for(run_scenario(suite, sc, worker), bound)
            ok = True
        except asyncio.TimeoutError:
            ok, detail = False, f"did not finish within its timeout_s of {bound}s"
        except ScenarioFailed as e:
            ok, detail = False, str(e)
        except Exception as e:  # an SDK exception the scenario did not expect: report it
            ok, detail = False, f"unexpected {type(e).__name__}: {e}"
        limit = suite.setting(sc, "max_parent_rss_mb")
        if limit is not None:
            peak = peak_rss_mb()
            detail += f"; parent peak RSS {peak:.0f} MB"
            if ok and peak > float(limit):
                ok, detail = False, f"{detail}, above the bound of {limit} MB"
        line = {"scenario": sc["name"], "ok": ok, "detail": detail,
                "elapsed": time.monotonic() - started}
        print(json.dumps(line, ensure_ascii=False), file=report or sys.stdout, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", required=True)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--transport", choices=["socketpair", "tls", "tcp"],
                        default="socketpair",
                        help="socketpair: inherited sockets; tls: children joining over TCP + "
                             "TLS 1.3 with tickets (PROTOCOL.md 21); tcp: the same join over "
                             "plain loopback TCP")
    parser.add_argument("worker", nargs="+", help="the worker command, after --")
    args = parser.parse_args()
    global TRANSPORT
    TRANSPORT = args.transport
    report = None
    if TRANSPORT != "socketpair":
        # Joining workers are plain children whose stdout is ours: reports keep a descriptor
        # of their own, and what the workers print goes to stderr.
        report = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
    # Worker output goes to the log at WARNING by default; scenarios flood it (200 MB), and
    # the runner's stderr is its report channel: the lines are logged, then dropped here.
    worker_log = logging.getLogger("wirepool.worker")
    worker_log.addHandler(logging.NullHandler())
    worker_log.propagate = False
    # The pool's own warnings: counted (clamp notices) and still printed, as without a handler.
    pool_log = logging.getLogger("wirepool.pool")
    pool_log.addHandler(CLAMP_NOTICES)
    pool_log.addHandler(logging.StreamHandler(sys.stderr))
    with open(args.scenarios, encoding="utf-8") as f:
        doc = json.load(f)
    suite = Suite(doc)
    scenarios = [sc for sc in doc["scenarios"] if not args.only or sc["name"] in args.only]
    asyncio.run(main_async(suite, scenarios, args.worker, report))


if __name__ == "__main__":
    main()
