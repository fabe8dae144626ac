"""Baseline: JSON lines over stdio, Python parent and Python child.

Usage: jsonl_py.py json|orjson [--child <executable>] '<scenario json>'

With --child, the child is that program (the Rust serde_json child in bench/jsonl-rust-child)
instead of jsonl_child.py; the wire is the same.

The parent writes one JSON object per line to the child's stdin and reads one per line from its
stdout, flushing after each request, as a subprocess-based tool would. Payloads are ASCII strings
(JSON has no bytes). Rows come back one line per row, decoded into dicts in the parent.
A "pool" is N children, each driven by one thread with one request in flight.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time

from common import (echo_figures, figure, load_scenario, max_peak_rss_kib, ok, payload_text,
                    peak_rss_kib, pipelined_repeat, timed_loop)

CODEC = sys.argv[1]
if "--child" in sys.argv:
    CHILD_ARGV = [sys.argv[sys.argv.index("--child") + 1]]
    RUNNER = "jsonl_rust_child"
else:
    CHILD_ARGV = [sys.executable,
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "jsonl_child.py"), CODEC]
    RUNNER = "jsonl_orjson" if CODEC == "orjson" else "jsonl_py"

if CODEC == "orjson":
    import orjson

    loads = orjson.loads
    dumps = orjson.dumps
else:
    import json

    loads = json.loads

    def dumps(obj):
        return json.dumps(obj).encode()


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(CHILD_ARGV, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.w = self.proc.stdin
        self.r = self.proc.stdout

    def send(self, msg: dict) -> None:
        self.w.write(dumps(msg) + b"\n")
        self.w.flush()

    def recv(self) -> dict:
        line = self.r.readline()
        if not line:
            raise RuntimeError("child closed its stdout")
        return loads(line)

    def call(self, msg: dict) -> dict:
        self.send(msg)
        return self.recv()

    def close(self) -> None:
        try:
            self.send({"op": "exit"})
            self.w.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_echo(sc: dict, child: Child) -> list[dict]:
    op = "echo" if sc["kind"] in ("echo", "echo_large") else "oneway"
    msg = {"op": op, "id": 0, "p": payload_text(sc["payload"])}
    expect = sc["payload"]

    def call_once() -> None:
        reply = child.call(msg)
        got = len(reply["p"]) if op == "echo" else reply["n"]
        if got != expect:
            raise RuntimeError(f"reply carried {got} bytes, expected {expect}")

    inflight = sc.get("inflight", 1)
    if inflight == 1:
        def repeat():
            return timed_loop(call_once, sc["duration_s"], sc["min_calls"], sc["kind"] == "echo")
    else:
        def repeat():
            return pipelined_repeat(lambda: child.send(msg), child.recv, inflight, sc["duration_s"])
    timed_loop(call_once, sc["warmup_s"], 1, False)
    return echo_figures(sc, repeat)


def run_rows(sc: dict, child: Child) -> list[dict]:
    n = sc["n"]
    every = sc.get("every", 0)
    pause = sc.get("pause_ms", 0) / 1000.0
    rates = []
    for _ in range(sc["repeats"]):
        start = time.perf_counter()
        child.send({"op": "rows", "shape": sc["shape"], "n": n})
        last = None
        for k in range(n):
            last = child.recv()
            if every and k % every == every - 1:
                time.sleep(pause)
        if last["i"] != n - 1 or "end" not in child.recv():
            raise RuntimeError("row stream out of order")
        rates.append(n / (time.perf_counter() - start))
    return [figure("rows_per_s", "rows/s", rates)]


def run_pool(sc: dict) -> tuple[list[dict], int | None]:
    children = [Child() for _ in range(sc["workers"])]
    try:
        for c in children:
            c.call({"op": "spin", "id": 0, "us": 1})
        rates = []
        for _ in range(sc["repeats"]):
            counter = itertools.count()
            tasks = sc["tasks"]

            def drive(c: Child) -> None:
                while next(counter) < tasks:
                    c.call({"op": "spin", "id": 0, "us": sc["task_us"]})

            threads = [threading.Thread(target=drive, args=(c,)) for c in children]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rates.append(tasks / (time.perf_counter() - start))
        return [figure("tasks_per_s", "tasks/s", rates)], max_peak_rss_kib(
            [c.proc.pid for c in children])
    finally:
        for c in children:
            c.close()


def main() -> None:
    sc = load_scenario()
    kind = sc["kind"]
    if kind == "pool":
        figs, child_kib = run_pool(sc)
        ok(RUNNER, sc, figs, peak_rss_kib(), child_kib, "one request in flight per child")
        return
    if kind == "frames":
        from common import unsupported
        unsupported(RUNNER, sc, "floor-only scenario")
        return
    child = Child()
    try:
        if kind in ("rows", "slow_rows"):
            figs = run_rows(sc, child)
        else:
            figs = run_echo(sc, child)
        child_kib = peak_rss_kib(child.proc.pid)
    finally:
        child.close()
    notes = "one line per row" if kind.endswith("rows") else "payload as a JSON string"
    ok(RUNNER, sc, figs, peak_rss_kib(), child_kib, notes)


if __name__ == "__main__":
    main()
