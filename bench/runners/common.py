"""Helpers shared by the Python runners (see bench/README.md, "Runner contract").

A runner reads one scenario (JSON on argv[-1], or on stdin when argv has none), measures it
`repeats` times and prints exactly one JSON result line on stdout. Everything else goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

# A large row's 4 KiB field is its index as 8 digits then 4088 "x": distinct in every row, because
# an encoder that memoizes repeated objects (pickle does) would otherwise send it only once.
LARGE_TAIL = "x" * 4088


def load_scenario() -> dict[str, Any]:
    """The scenario from argv[-1] if it looks like JSON, else from stdin."""
    if len(sys.argv) > 1 and sys.argv[-1].lstrip().startswith("{"):
        return json.loads(sys.argv[-1])
    return json.loads(sys.stdin.read())


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def unsupported(runner: str, scenario: dict[str, Any], reason: str) -> None:
    emit({"runner": runner, "scenario": scenario["id"], "status": "unsupported", "reason": reason})


def ok(runner: str, scenario: dict[str, Any], figures: list[dict[str, Any]],
       parent_kib: int | None, children_kib: int | None, notes: str = "") -> None:
    emit({"runner": runner, "scenario": scenario["id"], "status": "ok", "figures": figures,
          "rss_kib": {"parent": parent_kib, "children": children_kib}, "notes": notes})


def figure(name: str, unit: str, values: list[float], better: str = "higher") -> dict[str, Any]:
    return {"name": name, "unit": unit, "better": better, "values": values}


def peak_rss_kib(pid: int | str = "self") -> int | None:
    """VmHWM (peak resident set) of a live process, in KiB; None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def max_peak_rss_kib(pids: list[int]) -> int | None:
    peaks = [p for p in (peak_rss_kib(pid) for pid in pids) if p is not None]
    return max(peaks) if peaks else None


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100.0 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def make_row(i: int, shape: str) -> dict[str, Any]:
    if shape == "small_rows":
        return {"i": i, "name": f"decl_{i}", "kind": "theorem"}
    return {"i": i, "name": f"decl_{i}", "kind": "theorem", "blob": f"{i:08d}" + LARGE_TAIL}


def spin_cpu(task_us: int) -> int:
    """Burn `task_us` of this thread's CPU time (not wall time, so a preempted task still costs
    the same work whatever the number of workers sharing the cores)."""
    deadline = time.thread_time_ns() + task_us * 1000
    spins = 0
    while time.thread_time_ns() < deadline:
        spins += 1
    return spins


def timed_loop(call_once: Callable[[], None], duration_s: float, min_calls: int,
               record_latency: bool) -> tuple[int, float, list[int]]:
    """Call `call_once` until both `duration_s` and `min_calls` are reached.
    Returns (calls, elapsed seconds, per-call latencies in ns if asked)."""
    latencies: list[int] = []
    calls = 0
    clock = time.perf_counter_ns
    start = clock()
    deadline = start + int(duration_s * 1e9)
    now = start
    while now < deadline or calls < min_calls:
        t0 = now
        call_once()
        now = clock()
        if record_latency:
            latencies.append(now - t0)
        calls += 1
    return calls, (now - start) / 1e9, latencies


def echo_figures(scenario: dict[str, Any], run_repeat: Callable[[], tuple[int, float, list[int]]]
                 ) -> list[dict[str, Any]]:
    """Run `repeats` measurements of an echo/oneway scenario and build its figures."""
    repeats = scenario["repeats"]
    kind = scenario["kind"]
    rates, p50s, p99s, mbs = [], [], [], []
    for _ in range(repeats):
        calls, elapsed, lat = run_repeat()
        rates.append(calls / elapsed)
        if kind in ("oneway", "echo_large"):
            directions = 2 if kind == "echo_large" else 1
            mbs.append(calls * scenario["payload"] * directions / elapsed / 1e6)
        if lat:
            lat.sort()
            p50s.append(percentile(lat, 50) / 1000.0)
            p99s.append(percentile(lat, 99) / 1000.0)
    if kind in ("oneway", "echo_large"):
        return [figure("mb_per_s", "MB/s", mbs)]
    figs = [figure("calls_per_s", "calls/s", rates)]
    if p50s:
        figs.append(figure("p50_us", "us", p50s, "lower"))
        figs.append(figure("p99_us", "us", p99s, "lower"))
    return figs


def payload_bytes(size: int) -> bytes:
    # Not all zeros, so no layer can take a shortcut on a constant page.
    return (b"wirepool" * (size // 8 + 1))[:size]


def payload_text(size: int) -> str:
    return ("wirepool" * (size // 8 + 1))[:size]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def pipelined_repeat(send: Callable[[], None], recv: Callable[[], None], inflight: int,
                     duration_s: float) -> tuple[int, float, list[int]]:
    """Keep `inflight` requests outstanding for `duration_s`, then drain.

    A writer thread sends while it holds credit and the calling thread receives, which is how a
    blocking-pipe client pipelines without deadlocking when both pipe buffers fill. The receiver
    only blocks in recv() when a fully sent request is still unanswered.
    """
    import threading

    credit = threading.Semaphore(inflight)
    stop = threading.Event()
    progress = threading.Condition()
    sent = [0]
    done = [False]
    failure: list[BaseException] = []

    def writer() -> None:
        try:
            while True:
                credit.acquire()
                if stop.is_set():
                    return
                send()
                with progress:
                    sent[0] += 1
                    progress.notify()
        except BaseException as exc:  # surfaced by the receiving side below
            failure.append(exc)
        finally:
            with progress:
                done[0] = True
                progress.notify()

    thread = threading.Thread(target=writer, daemon=True)
    clock = time.perf_counter_ns
    start = clock()
    deadline = start + int(duration_s * 1e9)
    thread.start()
    received = 0
    while True:
        with progress:
            while received >= sent[0] and not done[0]:
                progress.wait()
            if received >= sent[0]:
                break
        recv()
        received += 1
        if not stop.is_set() and clock() >= deadline:
            stop.set()
        credit.release()
    thread.join()
    if failure:
        raise failure[0]
    elapsed = (clock() - start) / 1e9
    return received, elapsed, []
