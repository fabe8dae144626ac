"""The Python parent's soak driver (``wirepool.AsyncPool``): mixed load on a pool of conformance
workers while their processes are killed and stopped at random, then a pool whose replacements
keep failing. It measures and prints one JSON line (the summary); ``conformance/test_soak.py``
holds the invariants and asserts them on the summary. The Rust parent's driver
(``rust/wirepool-conformance/src/bin/soak_parent.rs``) does the same, step for step.

    soak.py --seed N [--api async|threads] [--seconds S] [--workers W]
                   [--max-restarts R] [--fail-fast-seconds F] -- WORKER COMMAND...

``--api threads`` drives the blocking ``wirepool.Pool`` instead: each operation runs in a thread
of its own (``Pool.call``, ``submit`` bursts, ``Pool.map``, ``SyncStream``); it has no leases,
so the final check asks ``whoami`` of 8 x ``workers`` calls at once (every answer must come from
a live worker) instead.

Part 1, the soak (``seconds``): ``LOAD_TASKS`` tasks each run random operations back to back:
``add`` calls (result checked), ``decls`` streams (row i must be row number i, the summary the
row count; some closed early), bursts of ``BURST`` calls at once, ``map`` runs, ``sleep`` calls
past their deadline, ``fail`` calls. Meanwhile a chaos task picks one of our child processes
(the workers, starting or serving) every 50-400 ms and SIGKILLs it, or SIGSTOPs it and SIGCONTs
it 50-600 ms later, or SIGSTOPs it for good (the heartbeat must find it, or the start-up
timeout if it had not sent its HELLO yet). Every operation's outcome is counted once by kind
(``ok`` or the error code's name); an operation with no outcome within ``OP_BOUND_S`` counts as
``no_outcome``. When the time is up, the chaos stops, the load
finishes, and within ``SETTLE_S`` the pool must have exactly ``workers`` live processes (our
children, zombies excluded), the pool's own list of pids must be the same set, ``workers``
leases held at once must answer ``whoami`` with those distinct pids, and the pool must serve.
After ``close()``: no child left, file descriptors back to their count before the pool.

Part 2, the restart limit: a pool of one worker started through ``fail_after.py`` (only the
first process is a real worker; every replacement exits before its HELLO) with ``max_restarts``
R. Its worker is killed; the pool must try exactly R replacements (R + 1 deaths: the kill and R
failed starts) and give up; calls then fail at once (for ``fail_fast_seconds``) with one typed
error and no memory growth.

The seed fixes every random choice (the schedule still depends on timing); it is in the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import wirepool

HERE = Path(__file__).resolve().parent
LOAD_TASKS = 6
BURST = 48  # calls at once in a burst (the pool's max_in_flight is 32 per worker)
MAP_ITEMS = 64
OP_BOUND_S = 30.0  # an operation without an outcome by then is a hang
SETTLE_S = 15.0  # after the chaos: the pool back to `workers` live workers (> STARTUP_TIMEOUT_S)
LIVE_HOLD_S = 0.5  # the live count must hold this long (a late extra replacement shows up)
HEARTBEAT_MS = 250
# A worker stopped before its HELLO is found by the start-up timeout, not the heartbeat: short
# enough to settle soon after the chaos, long enough for a Python worker on a busy machine.
STARTUP_TIMEOUT_S = 4.0
CHAOS_CODES = {"WORKER_EXITED", "WORKER_HUNG"}  # what a killed or stopped worker's requests get
TRIP_BOUND_S = 20.0  # from the kill to the pool giving up
GAVE_UP = "restart intensity exceeded"  # what a pool that gave up says (both parents)
SAMPLES = 8  # unexpected outcomes kept verbatim in the summary


def log(msg: str) -> None:
    print(f"soak.py: {msg}", file=sys.stderr, flush=True)


def status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def children() -> dict[int, str]:
    """Our child processes that have not exited (zombies excluded), with their state letter
    (``T`` for a stopped one)."""
    me, found = os.getpid(), {}
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
            found[int(entry)] = fields[0]
    return found


def _cmdline(pid: int | str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


SELF_CMDLINE = _cmdline("self")


def execd(pid: int) -> bool:
    """The child has run exec (its argv is no longer ours). Between fork and exec a child is
    this process's own copy (with vfork, sharing its memory while the forking thread waits):
    stopping it there stops the parent's spawn, not a worker, so the chaos leaves it alone."""
    cmdline = _cmdline(pid)
    return cmdline is not None and cmdline != SELF_CMDLINE


def describe(e: BaseException) -> str:
    """An error's text; for an untyped one, where it was raised too (the SDK's bug to find)."""
    if isinstance(e, wirepool.WirepoolError):
        return str(e)
    frames = traceback.extract_tb(e.__traceback__)[-4:]
    return f"{e!r} raised at " + " <- ".join(
        f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))


def outcome_of(e: BaseException) -> str:
    """An error's outcome name: its code's name if typed, else ``untyped:<class>``."""
    if isinstance(e, wirepool.WirepoolError):
        return e.name
    return f"untyped:{type(e).__name__}"


# The outcomes an operation may end in: its own, or what a killed or stopped worker gives.
OK = {"ok"} | CHAOS_CODES
DEADLINE = {"DEADLINE_EXCEEDED"} | CHAOS_CODES
FAILED = {"HANDLER_ERROR"} | CHAOS_CODES


class Soak:
    """The load and the chaos on one pool: an AsyncPool (``pool``), or a blocking Pool
    (``sync``) whose operations run in threads of ``executor``."""

    def __init__(self, pool: wirepool.AsyncPool | None, sync: wirepool.Pool | None,
                 rng: random.Random) -> None:
        self.pool: wirepool.AsyncPool = pool  # type: ignore[assignment]  # None with ``sync``
        self.sync: wirepool.Pool = sync  # type: ignore[assignment]
        self.executor = concurrent.futures.ThreadPoolExecutor(LOAD_TASKS + 2, "soak-load")
        self.rng = rng
        self.lock = threading.Lock()  # load threads record too
        self.outcomes: Counter[str] = Counter()
        self.started: Counter[str] = Counter()  # requests started, by operation
        self.by_op: dict[str, Counter[str]] = {}
        self.unexpected: list[str] = []
        self.rows: Counter[str] = Counter()  # streams, total (rows), complete, closed_early...
        self.actions: Counter[str] = Counter()  # kill, stop_cont, stop_left
        self.running = True

    # -- bookkeeping ------------------------------------------------------------------------

    def record(self, op: str, outcome: str, allowed: set[str], detail: str = "") -> None:
        """One operation's single outcome; an outcome outside ``allowed`` is unexpected."""
        with self.lock:
            self.outcomes[outcome] += 1
            self.by_op.setdefault(op, Counter())[outcome] += 1
            if outcome not in allowed:
                self.outcomes["unexpected"] += 1
                if len(self.unexpected) < SAMPLES:
                    self.unexpected.append(f"{op}: {outcome}: {detail}"[:400])

    def count_rows(self, what: str) -> None:
        with self.lock:
            self.rows[what] += 1

    async def bounded(self, op: str, coro: Any, allowed: set[str]) -> None:
        """Runs one operation, which records its own outcome, within OP_BOUND_S. A burst's
        calls are counted as requests each (``burst_call``), the burst itself not."""
        if op != "burst":
            self.started[op] += 1
        else:
            self.started["burst_call"] += BURST
        try:
            await asyncio.wait_for(coro, OP_BOUND_S)
        except asyncio.TimeoutError:
            self.record(op, "no_outcome", allowed, f"no outcome within {OP_BOUND_S}s")

    # -- operations (AsyncPool), each drawing nothing random: load() draws for them ----------

    def check_add(self, op: str, i: int, got: Any) -> None:
        self.record(op, "ok" if got == {"sum": 3 * i} else "wrong_result", OK,
                    f"add {i} answered {got!r}")

    async def op_add(self, i: int, op: str = "add") -> None:
        try:
            got = await self.pool.call("add", {"a": i, "b": 2 * i})
        except Exception as e:  # noqa: BLE001 - every outcome is counted, typed or not
            self.record(op, outcome_of(e), OK, describe(e))
            return
        self.check_add(op, i, got)

    async def op_burst(self, base: int) -> None:
        await asyncio.gather(*(self.op_add(base + k, "burst_call") for k in range(BURST)))

    async def op_map(self, base: int) -> None:
        """A map counts as one operation: every result in order, or the first error."""
        k = 0
        try:
            async for got in self.pool.map("add", ({"a": base + j, "b": 2 * (base + j)}
                                                   for j in range(MAP_ITEMS))):
                if got != {"sum": 3 * (base + k)}:
                    self.record("map", "wrong_result", OK, f"item {k} answered {got!r}")
                    return
                k += 1
        except Exception as e:  # noqa: BLE001
            self.record("map", outcome_of(e), OK, describe(e))
            return
        self.map_done(k)

    def map_done(self, k: int) -> None:
        self.record("map", "ok" if k == MAP_ITEMS else "wrong_result", OK,
                    f"{k} of {MAP_ITEMS} results")

    def stream_row(self, op: str, n: int, k: int, row: Any) -> bool:
        """Checks row number ``k``; False (recorded) if it is not the row of that number."""
        if row != {"i": k, "name": f"decl_{k}", "kind": "theorem"}:
            self.count_rows("seq_errors")
            self.record(op, "wrong_row", OK, f"row {k} of {n} was {row!r}")
            return False
        self.count_rows("total")
        return True

    def stream_end(self, op: str, n: int, k: int, summary: Any) -> None:
        if k != n or summary != {"rows": n}:
            self.count_rows("seq_errors")
            self.record(op, "wrong_rows", OK, f"{k} of {n} rows, summary {summary!r}")
            return
        self.count_rows("complete")
        self.record(op, "ok", OK)

    async def op_stream(self, n: int, close_after: int | None) -> None:
        """``decls``: row k must be row number k (nothing lost or repeated), then the summary;
        with ``close_after``, the stream is closed after that many rows."""
        op = "stream" if close_after is None else "stream_closed_early"
        stream = self.pool.stream("decls", {"n": n})
        self.count_rows("streams")
        k = 0
        try:
            async for row in stream:
                if not self.stream_row(op, n, k, row):
                    await stream.aclose()
                    return
                k += 1
                if close_after is not None and k >= close_after:
                    await stream.aclose()
                    self.count_rows("closed_early")
                    self.record(op, "ok", OK)
                    return
            async for row in stream:  # a second read of an ended stream yields nothing new
                self.record(op, "read_after_end", OK, f"got {row!r}")
                return
        except Exception as e:  # noqa: BLE001
            self.count_rows("broken")
            self.record(op, outcome_of(e), OK, f"after {k} of {n} rows: {describe(e)}")
            return
        self.stream_end(op, n, k, stream.summary)

    async def op_deadline(self, ms: int) -> None:
        try:
            got = await self.pool.call("sleep", ms, timeout=0.1)
        except Exception as e:  # noqa: BLE001
            self.record("deadline", outcome_of(e), DEADLINE, describe(e))
            return
        self.record("deadline", "ok", DEADLINE, f"sleep {ms} with a 100 ms deadline gave {got!r}")

    async def op_fail(self) -> None:
        try:
            got = await self.pool.call("fail", None)
        except Exception as e:  # noqa: BLE001
            self.record("fail", outcome_of(e), FAILED, describe(e))
            return
        self.record("fail", "ok", FAILED, f"fail answered {got!r}")

    # -- the same operations on the blocking Pool, run in a thread each -----------------------

    def sync_add(self, i: int, op: str = "add") -> None:
        try:
            got = self.sync.call("add", {"a": i, "b": 2 * i})
        except Exception as e:  # noqa: BLE001
            self.record(op, outcome_of(e), OK, describe(e))
            return
        self.check_add(op, i, got)

    def sync_burst(self, base: int) -> None:
        futures = [(base + k, self.sync.submit("add", {"a": base + k, "b": 2 * (base + k)}))
                   for k in range(BURST)]
        for i, fut in futures:
            try:
                got = fut.result(timeout=OP_BOUND_S)
            except concurrent.futures.TimeoutError:
                self.record("burst_call", "no_outcome", OK, f"no outcome within {OP_BOUND_S}s")
                continue
            except Exception as e:  # noqa: BLE001
                self.record("burst_call", outcome_of(e), OK, describe(e))
                continue
            self.check_add("burst_call", i, got)

    def sync_map(self, base: int) -> None:
        k = 0
        try:
            for got in self.sync.map("add", ({"a": base + j, "b": 2 * (base + j)}
                                             for j in range(MAP_ITEMS))):
                if got != {"sum": 3 * (base + k)}:
                    self.record("map", "wrong_result", OK, f"item {k} answered {got!r}")
                    return
                k += 1
        except Exception as e:  # noqa: BLE001
            self.record("map", outcome_of(e), OK, describe(e))
            return
        self.map_done(k)

    def sync_stream(self, n: int, close_after: int | None) -> None:
        op = "stream" if close_after is None else "stream_closed_early"
        stream = self.sync.stream("decls", {"n": n})
        self.count_rows("streams")
        k = 0
        try:
            for row in stream:
                if not self.stream_row(op, n, k, row):
                    stream.close()
                    return
                k += 1
                if close_after is not None and k >= close_after:
                    stream.close()
                    self.count_rows("closed_early")
                    self.record(op, "ok", OK)
                    return
            for row in stream:  # a second read of an ended stream yields nothing new
                self.record(op, "read_after_end", OK, f"got {row!r}")
                return
        except Exception as e:  # noqa: BLE001
            self.count_rows("broken")
            self.record(op, outcome_of(e), OK, f"after {k} of {n} rows: {describe(e)}")
            return
        self.stream_end(op, n, k, stream.summary)

    def sync_deadline(self, ms: int) -> None:
        try:
            got = self.sync.call("sleep", ms, timeout=0.1)
        except Exception as e:  # noqa: BLE001
            self.record("deadline", outcome_of(e), DEADLINE, describe(e))
            return
        self.record("deadline", "ok", DEADLINE, f"sleep {ms} with a 100 ms deadline gave {got!r}")

    def sync_fail(self) -> None:
        try:
            got = self.sync.call("fail", None)
        except Exception as e:  # noqa: BLE001
            self.record("fail", outcome_of(e), FAILED, describe(e))
            return
        self.record("fail", "ok", FAILED, f"fail answered {got!r}")

    async def load(self) -> None:
        """Random operations back to back; with the blocking Pool each runs in a thread of its
        own (an operation that never ends is then abandoned, counted ``no_outcome``)."""
        rng = self.rng
        threads = self.sync is not None
        loop = asyncio.get_running_loop()

        def run(sync_op: Callable[..., None], async_op: Callable[..., Any], *args: Any) -> Any:
            if threads:
                return loop.run_in_executor(self.executor, sync_op, *args)
            return async_op(*args)

        while self.running:
            r = rng.random()
            if r < 0.30:
                await self.bounded("add", run(self.sync_add, self.op_add, rng.randrange(1 << 30)),
                                   OK)
            elif r < 0.55:
                await self.bounded("stream", run(self.sync_stream, self.op_stream,
                                                 rng.randint(1, 3000), None), OK)
            elif r < 0.62:
                await self.bounded("stream_closed_early", run(
                    self.sync_stream, self.op_stream, rng.randint(1, 3000), rng.randint(1, 200)),
                    OK)
            elif r < 0.75:
                await self.bounded("burst", run(self.sync_burst, self.op_burst,
                                                rng.randrange(1 << 20)), OK)
            elif r < 0.85:
                await self.bounded("map", run(self.sync_map, self.op_map, rng.randrange(1 << 20)),
                                   OK)
            elif r < 0.95:
                await self.bounded("deadline", run(self.sync_deadline, self.op_deadline,
                                                   rng.randint(300, 600)), DEADLINE)
            else:
                await self.bounded("fail", run(self.sync_fail, self.op_fail), FAILED)

    # -- chaos ------------------------------------------------------------------------------

    def cont(self, pid: int) -> None:
        if pid in children():  # still ours (not reaped and reused)
            with_lookup(os.kill, pid, signal.SIGCONT)

    async def chaos(self) -> None:
        rng = self.rng
        loop = asyncio.get_running_loop()
        while self.running:
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            kids = [pid for pid in sorted(children()) if execd(pid)]
            if not kids or not self.running:
                continue
            pid = rng.choice(kids)
            r = rng.random()
            if r < 0.5:
                with_lookup(os.kill, pid, signal.SIGKILL)
                self.actions["kill"] += 1
            elif r < 0.8:
                with_lookup(os.kill, pid, signal.SIGSTOP)
                loop.call_later(rng.uniform(0.05, 0.6), self.cont, pid)
                self.actions["stop_cont"] += 1
            else:
                with_lookup(os.kill, pid, signal.SIGSTOP)
                self.actions["stop_left"] += 1


def with_lookup(kill: Any, pid: int, sig: int) -> None:
    try:
        kill(pid, sig)
    except ProcessLookupError:
        pass


async def settle_live(want: int, pool_pids: Any) -> dict[str, Any]:
    """Waits (bounded) for exactly ``want`` live, running children held for LIVE_HOLD_S, which
    must be the pool's own pids; returns what it saw."""
    started = time.monotonic()
    deadline = started + SETTLE_S
    seen: dict[int, str] = {}
    while True:
        seen = children()
        running = sorted(p for p, st in seen.items() if st != "T")
        if len(seen) == want and len(running) == want and sorted(pool_pids()) == running:
            held_until = time.monotonic() + LIVE_HOLD_S
            while time.monotonic() < held_until and children() == seen:
                await asyncio.sleep(0.05)  # polling /proc: nothing to wait on
            if children() == seen:
                return {"settled": True, "after_s": round(time.monotonic() - started, 3),
                        "live_pids": sorted(seen), "pool_pids": sorted(pool_pids())}
        if time.monotonic() >= deadline:
            return {"settled": False, "after_s": round(time.monotonic() - started, 3),
                    "live_pids": sorted(seen), "stopped_pids": sorted(
                        p for p, st in seen.items() if st == "T"),
                    "pool_pids": sorted(pool_pids())}
        await asyncio.sleep(0.05)  # polling /proc, bounded by the deadline


class PoolUnderTest:
    """The pool through one of the Python parent's two APIs: ``async`` (AsyncPool, on this
    loop) or ``threads`` (the blocking Pool, which runs its own loop; called from threads)."""

    def __init__(self, api: str, argv: list[str], **options: Any) -> None:
        self.api = api
        self.argv = argv
        self.options = options
        self.apool: wirepool.AsyncPool | None = None
        self.spool: wirepool.Pool | None = None
        # Blocking calls made from the loop go through here; a hung one is abandoned.
        self.executor = concurrent.futures.ThreadPoolExecutor(8, "soak-calls")

    def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def start(self) -> None:
        if self.api == "async":
            self.apool = wirepool.AsyncPool(self.argv, **self.options)
            await self.apool.start()
        else:
            self.spool = await self._in_thread(lambda: wirepool.Pool(self.argv, **self.options))

    async def call(self, method: str, request: Any, bound: float) -> Any:
        """One call with a hard bound (asyncio.TimeoutError past it)."""
        if self.apool is not None:
            return await asyncio.wait_for(self.apool.call(method, request), bound)
        assert self.spool is not None
        return await asyncio.wait_for(self._in_thread(self.spool.call, method, request), bound)

    async def call_here(self, method: str, request: Any) -> Any:
        """One call made directly, for fail-fast timing: the blocking Pool's from this thread
        (its own path; bounded only by the test's bound on the whole driver)."""
        if self.apool is not None:
            return await asyncio.wait_for(self.apool.call(method, request), 5.0)
        assert self.spool is not None
        return self.spool.call(method, request)

    def metrics(self) -> Any:
        if self.apool is not None:
            return self.apool.metrics()
        assert self.spool is not None
        return self.spool.metrics()

    def pids(self) -> list[int]:
        return [w["pid"] for w in self.metrics()["workers"] if w["alive"]]

    async def answer_pids(self, n: int) -> dict[str, Any]:
        """Pids answered by serving workers. AsyncPool: ``n`` leases held at once, each asked
        ``whoami`` (n distinct workers: ``lease_pids``). The blocking Pool has no leases: 8n
        ``whoami`` calls at once (``whoami_pids``: each must be a live worker's)."""
        if self.apool is not None:
            return {"lease_pids": await lease_pids(self.apool, n)}
        assert self.spool is not None
        futures = [self.spool.submit("whoami", None) for _ in range(8 * n)]
        got = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(f) for f in futures)),
                                     10.0)
        return {"whoami_pids": sorted(set(got))}

    async def close(self, grace: float) -> None:
        try:
            if self.apool is not None:
                await asyncio.wait_for(self.apool.close(grace=grace), 30.0)
            elif self.spool is not None:
                await asyncio.wait_for(self._in_thread(self.spool.close, grace), 30.0)
        finally:
            self.executor.shutdown(wait=False)


async def lease_pids(pool: wirepool.AsyncPool, n: int) -> list[int]:
    """``n`` leases held at once, each answering ``whoami``: the pids of n serving workers."""
    pids: list[int] = []
    release = asyncio.Event()
    held = 0
    all_held = asyncio.Event()

    async def one() -> None:
        nonlocal held
        async with pool.lease() as lease:
            pids.append(await lease.call("whoami", None))
            held += 1
            if held == n:
                all_held.set()
            await release.wait()

    tasks = [asyncio.ensure_future(one()) for _ in range(n)]
    try:
        await asyncio.wait_for(all_held.wait(), 10.0)
    finally:
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return sorted(pids)


class Phases:
    """How long each phase took (seconds), for the summary: where a run's time goes."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._last = time.monotonic()

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.times[name] = round(now - self._last, 2)
        self._last = now


async def soak(args: argparse.Namespace, worker: list[str], rng: random.Random,
               phases: Phases) -> dict[str, Any]:
    fds_before = open_fds()
    pool = PoolUnderTest(args.api, worker, workers=args.workers, codec="json", max_in_flight=32,
                         heartbeat_ms=HEARTBEAT_MS, startup_timeout=STARTUP_TIMEOUT_S,
                         max_restarts=100_000, restart_window=60.0,
                         restart_backoff=0.01, restart_backoff_max=0.2)
    out: dict[str, Any] = {}
    try:
        await pool.start()
        for i in range(200):  # warm up before the memory baseline
            await pool.call("add", {"a": i, "b": 2 * i}, 10.0)
        gc.collect()
        rss_before = status_mb("VmRSS")
        phases.mark("start")
        s = Soak(pool.apool, pool.spool, rng)
        started = time.monotonic()
        chaos = asyncio.ensure_future(s.chaos())
        loads = [asyncio.ensure_future(s.load()) for _ in range(LOAD_TASKS)]
        await asyncio.sleep(args.seconds)  # the soak's duration: load and chaos run meanwhile
        phases.mark("chaos")
        s.running = False
        await chaos
        await asyncio.gather(*loads)
        s.executor.shutdown(wait=False)  # a thread still running is a counted no_outcome
        load_s = time.monotonic() - started
        phases.mark("load_ends")
        log(f"load done after {load_s:.1f}s: {dict(s.outcomes)}; chaos {dict(s.actions)}")
        live = await settle_live(args.workers, pool.pids)
        phases.mark("settle")
        try:
            live.update(await pool.answer_pids(args.workers))
        except Exception as e:  # noqa: BLE001
            live["answer_error"] = f"{type(e).__name__}: {e}"
        health: Counter[str] = Counter()
        for i in range(50):
            try:
                ok = await pool.call("add", {"a": i, "b": 2 * i}, 10.0)
                health["ok" if ok == {"sum": 3 * i} else "wrong_result"] += 1
            except Exception as e:  # noqa: BLE001
                health[outcome_of(e)] += 1
        live["health"] = dict(health)
        live["in_flight"] = sum(w["in_flight"] for w in pool.metrics()["workers"])
        gc.collect()
        rss_after = status_mb("VmRSS")
        out.update({
            "load_s": round(load_s, 2),
            "requests": {"total": sum(v for k, v in s.outcomes.items() if k != "unexpected"),
                         "by_outcome": dict(s.outcomes),
                         "started_by_op": dict(sorted(s.started.items())),
                         "by_op": {k: dict(v) for k, v in sorted(s.by_op.items())},
                         "unexpected_samples": s.unexpected},
            "rows": {k: s.rows[k] for k in ("total", "streams", "complete", "closed_early",
                                            "broken", "seq_errors")},
            "chaos": {k: s.actions[k] for k in ("kill", "stop_cont", "stop_left")},
            "final": live,
            "memory_mb": {"before": round(rss_before, 1), "after": round(rss_after, 1)},
        })
        phases.mark("final_checks")
    finally:
        await pool.close(grace=2.0)
    out["children_after_close"] = await no_children()
    out["fds"] = {"before": fds_before, "after": open_fds()}
    phases.mark("close")
    return out


async def no_children() -> list[int]:
    """Our children left after the pool closed (bounded wait for them to be reaped)."""
    deadline = time.monotonic() + 5.0
    while children() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # polling /proc, bounded
    return sorted(children())


async def restart_limit(args: argparse.Namespace, worker: list[str]) -> dict[str, Any]:
    r = args.max_restarts
    with tempfile.TemporaryDirectory(prefix="wirepool-soak-") as state:
        argv = [sys.executable, str(HERE.parent.parent / "conformance" / "soak" / "fail_after.py"), state, "1", "--", *worker]
        pool = PoolUnderTest(args.api, argv, workers=1, codec="json", heartbeat_ms=HEARTBEAT_MS,
                             max_restarts=r, restart_window=60.0,
                             restart_backoff=0.01, restart_backoff_max=0.1)
        out: dict[str, Any] = {"max_restarts": r}
        try:
            await pool.start()
            first = await pool.call("whoami", None, 10.0)
            killed_at = time.monotonic()
            os.kill(first, signal.SIGKILL)
            # Calls wait while the slot is being refilled (one sent before the pool saw the
            # kill fails with it); once the pool gives up, they fail saying so.
            trip: BaseException | None = None
            before: Counter[str] = Counter()
            while time.monotonic() - killed_at < TRIP_BOUND_S:
                try:
                    await pool.call("add", {"a": 1, "b": 2}, TRIP_BOUND_S)
                    before["ok"] += 1
                except asyncio.TimeoutError:
                    before["no_outcome"] += 1
                except Exception as e:  # noqa: BLE001 - untyped errors are recorded as such
                    if GAVE_UP in str(e):
                        trip = e
                        break
                    before[outcome_of(e)] += 1
            out["trip_s"] = round(time.monotonic() - killed_at, 3)
            out["before_trip"] = dict(before)
            out["error"] = outcome_of(trip) if trip is not None else "none"
            out["message"] = str(trip)[:300] if trip is not None else ""
            del trip
            # Anything the pool would still start shows up within a few backoffs.
            await asyncio.sleep(1.0)  # the time a late spawn gets to appear, not a sync point
            out["spawns"] = len(os.listdir(state))
            out["live_after_trip"] = sorted(children())
            codes: Counter[str] = Counter()
            slowest = 0.0
            calls = 0

            async def fail_once() -> None:
                nonlocal slowest, calls
                t = time.monotonic()
                try:
                    await pool.call_here("add", {"a": 1, "b": 2})
                    codes["ok"] += 1
                except Exception as e:  # noqa: BLE001
                    codes[outcome_of(e)] += 1
                slowest = max(slowest, time.monotonic() - t)
                calls += 1

            for _ in range(500):  # warm up before the memory baseline
                await fail_once()
            gc.collect()
            rss_before = status_mb("VmRSS")
            started = time.monotonic()
            while time.monotonic() - started < args.fail_fast_seconds:
                for _ in range(100):
                    await fail_once()
            gc.collect()
            rss_after = status_mb("VmRSS")
            out.update({"fail_fast": {"calls": calls, "outcomes": dict(codes),
                                      "max_call_ms": round(slowest * 1000, 2),
                                      "calls_per_s": round(calls / (time.monotonic() - started
                                                                    + 1e-9)),
                                      "rss_before_mb": round(rss_before, 1),
                                      "rss_after_mb": round(rss_after, 1)},
                        "spawns_after_calls": len(os.listdir(state))})
        finally:
            await pool.close(grace=1.0)
        out["children_after_close"] = await no_children()
    return out


async def main_async(args: argparse.Namespace, worker: list[str]) -> dict[str, Any]:
    try:
        with open("/proc/self/clear_refs", "w") as f:  # VmHWM from here (the imports' peak
            f.write("5")                                # is not the soak's)
    except OSError:
        pass  # not allowed here: the peak then includes start-up, a bound still holds
    rng = random.Random(args.seed)
    summary: dict[str, Any] = {"parent": "python", "api": args.api, "worker": worker,
                               "seed": args.seed, "seconds": args.seconds,
                               "workers": args.workers}
    started = time.monotonic()
    phases = Phases()
    summary.update(await soak(args, worker, rng, phases))
    summary["restart_limit"] = await restart_limit(args, worker)
    phases.mark("restart_limit")
    summary["phases_s"] = phases.times
    # VmHWM is updated lazily by the kernel: never report a peak below an RSS we read.
    mem, ff = summary["memory_mb"], summary["restart_limit"].get("fail_fast", {})
    mem["peak"] = round(max(status_mb("VmHWM"), mem["before"], mem["after"],
                            ff.get("rss_before_mb", 0.0), ff.get("rss_after_mb", 0.0)), 1)
    summary["elapsed_s"] = round(time.monotonic() - started, 2)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--api", choices=("async", "threads"), default="async",
                    help="AsyncPool on this loop, or the blocking Pool called from threads")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--max-restarts", type=int, default=5)
    ap.add_argument("--fail-fast-seconds", type=float, default=2.0)
    ap.add_argument("worker", nargs="+", help="the worker command, after --")
    args = ap.parse_args()
    log(f"seed {args.seed}, api {args.api}")
    summary = asyncio.run(main_async(args, args.worker))
    print(json.dumps(summary, sort_keys=True), flush=True)
    # Both pools are closed and their processes reaped. A load thread stuck in a call that
    # never ended (already counted no_outcome) must not keep the driver alive at exit.
    os._exit(0)


if __name__ == "__main__":
    main()
