"""Baselines from Python's standard library: multiprocessing.Pool, ProcessPoolExecutor, and a
multiprocessing Process + Pipe pair.

Usage: mp_py.py pool|ppe|pipe|pipe1 '<scenario json>'

Each is driven the way its documentation shows: Pool.apply_async and Pool.imap(chunksize=...),
Executor.submit and Executor.map(chunksize=...), Connection.send_bytes/recv_bytes for bytes and
Connection.send/recv (pickle) for objects. Start method: the platform default (fork on Linux with
Python 3.11). Payloads are bytes. Rows are produced in the child and unpickled into dicts in the
parent; the Pipe variant batches 256 rows per message by hand, Pool/Executor use chunksize=256.
``pipe1`` (runner ``mp_pipe_unbatched``) is the Pipe with one row per message, the founding
workload's rows only (bench/shapes/founding.json), where every row's index is checked.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from common import (echo_figures, figure, load_scenario, make_row, max_peak_rss_kib, ok,
                    payload_bytes, peak_rss_kib, pipelined_repeat, spin_cpu, timed_loop,
                    unsupported)

VARIANT = sys.argv[1]
RUNNER = {"pool": "mp_pool", "ppe": "process_pool_executor", "pipe": "mp_pipe",
          "pipe1": "mp_pipe_unbatched"}[VARIANT]
ROW_BATCH = 256
PIPE_BATCH = 1 if VARIANT == "pipe1" else ROW_BATCH


def echo(payload: bytes) -> bytes:
    return payload


def length(payload: bytes) -> int:
    return len(payload)


def shaped_row(shape: str, i: int) -> dict:
    return make_row(i, shape)


def children_pids() -> list[int]:
    return [p.pid for p in mp.active_children()]


# ---------------------------------------------------------------- Pool and ProcessPoolExecutor

class Executor:
    """apply/submit in one vocabulary so the scenarios below are written once."""

    def __init__(self, workers: int) -> None:
        if VARIANT == "pool":
            self.impl = mp.Pool(workers)
        else:
            self.impl = ProcessPoolExecutor(max_workers=workers)

    def submit(self, fn, *args, callback=None):
        if VARIANT == "pool":
            return self.impl.apply_async(fn, args, callback=callback)
        fut = self.impl.submit(fn, *args)
        if callback is not None:
            fut.add_done_callback(lambda f: callback(f.result()))
        return fut

    @staticmethod
    def result(handle):
        return handle.get() if VARIANT == "pool" else handle.result()

    def map_rows(self, shape: str, n: int):
        import functools
        fn = functools.partial(shaped_row, shape)
        if VARIANT == "pool":
            return self.impl.imap(fn, range(n), chunksize=ROW_BATCH)
        return self.impl.map(fn, range(n), chunksize=ROW_BATCH)

    def close(self) -> None:
        if VARIANT == "pool":
            self.impl.close()
            self.impl.join()
        else:
            self.impl.shutdown(wait=True)


def executor_echo(sc: dict, ex: Executor) -> list[dict]:
    fn = echo if sc["kind"] in ("echo", "echo_large") else length
    payload = payload_bytes(sc["payload"])
    expect = payload if fn is echo else len(payload)

    def call_once() -> None:
        if ex.result(ex.submit(fn, payload)) != expect:
            raise RuntimeError("wrong reply")

    inflight = sc.get("inflight", 1)
    timed_loop(call_once, sc["warmup_s"], 1, False)
    if inflight == 1:
        return echo_figures(sc, lambda: timed_loop(call_once, sc["duration_s"], sc["min_calls"],
                                                   sc["kind"] == "echo"))

    def repeat():
        # Callbacks run on the pool's result thread; a semaphore keeps `inflight` outstanding.
        credit = threading.Semaphore(inflight)
        finished = threading.Semaphore(0)
        count = [0, 0]

        def on_done(_result) -> None:
            credit.release()
            finished.release()

        start = time.perf_counter()
        deadline = start + sc["duration_s"]
        while time.perf_counter() < deadline:
            credit.acquire()
            ex.submit(fn, payload, callback=on_done)
            count[0] += 1
        for _ in range(count[0]):
            finished.acquire()
        return count[0], time.perf_counter() - start, []

    return echo_figures(sc, repeat)


def executor_rows(sc: dict, ex: Executor) -> list[dict]:
    n, every, pause = sc["n"], sc.get("every", 0), sc.get("pause_ms", 0) / 1000.0
    rates = []
    for _ in range(sc["repeats"]):
        start = time.perf_counter()
        k = -1
        row = None
        for k, row in enumerate(ex.map_rows(sc["shape"], n)):
            if every and k % every == every - 1:
                time.sleep(pause)
        if row["i"] != n - 1 or k != n - 1:
            raise RuntimeError("row stream out of order")
        rates.append(n / (time.perf_counter() - start))
    return [figure("rows_per_s", "rows/s", rates)]


def executor_pool(sc: dict, ex: Executor) -> list[dict]:
    for h in [ex.submit(spin_cpu, 1) for _ in range(sc["workers"] * 2)]:
        ex.result(h)
    rates = []
    for _ in range(sc["repeats"]):
        start = time.perf_counter()
        handles = [ex.submit(spin_cpu, sc["task_us"]) for _ in range(sc["tasks"])]
        for h in handles:
            ex.result(h)
        rates.append(sc["tasks"] / (time.perf_counter() - start))
    return [figure("tasks_per_s", "tasks/s", rates)]


def run_executor(sc: dict) -> None:
    kind = sc["kind"]
    ex = Executor(sc["workers"] if kind == "pool" else 1)
    try:
        if kind == "pool":
            figs = executor_pool(sc, ex)
        elif kind in ("rows", "slow_rows"):
            figs = executor_rows(sc, ex)
        else:
            figs = executor_echo(sc, ex)
        child_kib = max_peak_rss_kib(children_pids())
    finally:
        ex.close()
    verb = "apply_async" if VARIANT == "pool" else "submit"
    notes = {"pool": f"{verb} per task", "rows": f"{'imap' if VARIANT == 'pool' else 'map'}"
             f"(chunksize={ROW_BATCH})"}.get(kind.replace("slow_", ""), f"{verb} per call, bytes")
    ok(RUNNER, sc, figs, peak_rss_kib(), child_kib, notes)


# ---------------------------------------------------------------- Process + Pipe

def pipe_child(conn) -> None:
    while True:
        msg = conn.recv()
        op = msg[0]
        if op == "echo":
            n = msg[1]
            for _ in range(n):
                conn.send_bytes(conn.recv_bytes())
        elif op == "oneway":
            for _ in range(msg[1]):
                conn.send(len(conn.recv_bytes()))
        elif op == "founding_rows":
            # One row made at a time, sent alone or `batch` rows per message.
            from founding import row_factory

            _, shape, n, batch = msg
            make = row_factory(shape)
            if batch == 1:
                for i in range(n):
                    conn.send(make(i))
                continue
            rows = []
            for i in range(n):
                rows.append(make(i))
                if len(rows) == batch:
                    conn.send(rows)
                    rows = []
            if rows:
                conn.send(rows)
        elif op == "rows":
            _, shape, n = msg
            for base in range(0, n, ROW_BATCH):
                conn.send([make_row(i, shape) for i in range(base, min(n, base + ROW_BATCH))])
        elif op == "spin":
            conn.send(spin_cpu(msg[1]))
        elif op == "exit":
            return


def pipe_echo(sc: dict, conn) -> list[dict]:
    payload = payload_bytes(sc["payload"])
    echoing = sc["kind"] in ("echo", "echo_large")
    # The child is told how many messages to expect so its loop stays a plain recv/send.
    huge = 1 << 62
    conn.send(("echo" if echoing else "oneway", huge))

    def call_once() -> None:
        conn.send_bytes(payload)
        got = len(conn.recv_bytes()) if echoing else conn.recv()
        if got != len(payload):
            raise RuntimeError("wrong reply")

    timed_loop(call_once, sc["warmup_s"], 1, False)
    inflight = sc.get("inflight", 1)
    if inflight == 1:
        return echo_figures(sc, lambda: timed_loop(call_once, sc["duration_s"], sc["min_calls"],
                                                   sc["kind"] == "echo"))
    return echo_figures(sc, lambda: pipelined_repeat(lambda: conn.send_bytes(payload),
                                                     conn.recv_bytes, inflight,
                                                     sc["duration_s"]))


def pipe_founding_rows(sc: dict, conn) -> list[dict]:
    """The founding workload: rows of a founding shape, each index checked."""

    def read(n: int) -> None:
        conn.send(("founding_rows", sc["shape"], n, PIPE_BATCH))
        seen = 0
        if PIPE_BATCH == 1:
            while seen < n:
                if conn.recv()["id"] != seen:
                    raise RuntimeError("row stream out of order")
                seen += 1
            return
        while seen < n:
            for row in conn.recv():
                if row["id"] != seen:
                    raise RuntimeError("row stream out of order")
                seen += 1

    read(min(sc["n"], 256))
    rates = []
    window = sc.get("duration_s", 0.25)
    for _ in range(sc["repeats"]):  # a repeat: whole streams for the scenario's window
        start, rows = time.perf_counter(), 0
        while rows == 0 or time.perf_counter() - start < window:
            read(sc["n"])
            rows += sc["n"]
        rates.append(rows / (time.perf_counter() - start))
    return [figure("rows_per_s", "rows/s", rates)]


def pipe_rows(sc: dict, conn) -> list[dict]:
    if sc.get("founding"):
        return pipe_founding_rows(sc, conn)
    n, every, pause = sc["n"], sc.get("every", 0), sc.get("pause_ms", 0) / 1000.0
    rates = []
    for _ in range(sc["repeats"]):
        start = time.perf_counter()
        conn.send(("rows", sc["shape"], n))
        seen = 0
        row = None
        while seen < n:
            for row in conn.recv():
                seen += 1
                if every and seen % every == 0:
                    time.sleep(pause)
        if row["i"] != n - 1:
            raise RuntimeError("row stream out of order")
        rates.append(n / (time.perf_counter() - start))
    return [figure("rows_per_s", "rows/s", rates)]


def pipe_pool(sc: dict) -> tuple[list[dict], int | None]:
    """A hand-rolled pool: N Process+Pipe pairs, two tasks in flight per worker, dispatched with
    multiprocessing.connection.wait (what a user without Pool would write)."""
    from multiprocessing.connection import wait

    pairs = []
    for _ in range(sc["workers"]):
        parent, child = mp.Pipe()
        proc = mp.Process(target=pipe_child, args=(child,), daemon=True)
        proc.start()
        pairs.append((parent, proc))
    try:
        rates = []
        for _ in range(sc["repeats"]):
            tasks = sc["tasks"]
            sent = done = 0
            outstanding = {conn: 0 for conn, _ in pairs}
            start = time.perf_counter()
            for conn in outstanding:
                for _ in range(2):
                    if sent < tasks:
                        conn.send(("spin", sc["task_us"]))
                        outstanding[conn] += 1
                        sent += 1
            while done < tasks:
                for conn in wait([c for c, k in outstanding.items() if k]):
                    conn.recv()
                    done += 1
                    outstanding[conn] -= 1
                    if sent < tasks:
                        conn.send(("spin", sc["task_us"]))
                        outstanding[conn] += 1
                        sent += 1
            rates.append(tasks / (time.perf_counter() - start))
        return [figure("tasks_per_s", "tasks/s", rates)], max_peak_rss_kib(
            [p.pid for _, p in pairs])
    finally:
        for conn, proc in pairs:
            conn.send(("exit",))
        for conn, proc in pairs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


def run_pipe(sc: dict) -> None:
    kind = sc["kind"]
    if kind == "pool":
        figs, child_kib = pipe_pool(sc)
        ok(RUNNER, sc, figs, peak_rss_kib(), child_kib, "hand-rolled: 2 tasks in flight per worker")
        return
    parent, child = mp.Pipe()
    proc = mp.Process(target=pipe_child, args=(child,), daemon=True)
    proc.start()
    try:
        if kind in ("rows", "slow_rows"):
            figs = pipe_rows(sc, parent)
            child_kib = peak_rss_kib(proc.pid)
            parent.send(("exit",))
        else:
            figs = pipe_echo(sc, parent)
            child_kib = peak_rss_kib(proc.pid)
    finally:
        proc.kill()
        proc.join()
    notes = ("one row per message (send/recv, pickle)" if PIPE_BATCH == 1 else
             "rows batched 256 per message by hand") if kind.endswith("rows") else "send_bytes/recv_bytes"
    ok(RUNNER, sc, figs, peak_rss_kib(), child_kib, notes)


def main() -> None:
    sc = load_scenario()
    if sc["kind"] == "frames":
        unsupported(RUNNER, sc, "floor-only scenario")
    elif VARIANT == "pipe1" and not sc.get("founding"):
        unsupported(RUNNER, sc, "one row per message: the founding workload's rows only")
    elif VARIANT in ("pipe", "pipe1"):
        run_pipe(sc)
    else:
        run_executor(sc)


if __name__ == "__main__":
    main()
