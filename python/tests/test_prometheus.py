"""wirepool.prometheus: the collector's series move with the pool, and the example serves them
over HTTP in a form Prometheus' own parser reads."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import wirepool
from wirepool.prometheus import WORKER_STATES, PoolCollector

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "python" / "metrics.py"
CONFORMANCE_WORKER = [sys.executable, str(REPO / "python" / "conformance" / "worker.py")]

BUILD_TIMEOUT_S = 1800  # a cold cargo build on a busy 2-vCPU machine

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 120)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample by (name, sorted labels), through Prometheus' own text parser."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(registry: CollectorRegistry) -> Samples:
    return parse(generate_latest(registry).decode())


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def by_worker(samples: Samples, name: str) -> dict[str, float]:
    return {dict(labels)["worker_id"]: v for (n, labels), v in samples.items() if n == name}


def test_series_move_with_calls_streams_and_errors() -> None:
    registry = CollectorRegistry()
    with wirepool.Pool(CONFORMANCE_WORKER, workers=2) as pool:
        registry.register(PoolCollector(pool))
        before = scrape(registry)
        assert total(before, "wirepool_calls_total") == 0
        assert total(before, "wirepool_workers") == 2
        for i in range(7):
            assert pool.call("add", {"a": i, "b": 1}) == {"sum": i + 1}
        assert len(list(pool.stream("decls", {"n": 50}))) == 50
        with pytest.raises(wirepool.WorkerError):
            pool.call("fail_app", {})
        after = scrape(registry)
        pids = set(pool.pids)
    assert total(after, "wirepool_calls_total") == 8
    assert total(after, "wirepool_streams_total") == 1
    assert total(after, "wirepool_errors_total") == 1
    assert total(after, "wirepool_completed_total") == 9
    assert total(after, "wirepool_worker_requests_total") == 9
    assert total(after, "wirepool_workers_spawned_total") == 2
    assert {int(v) for v in by_worker(after, "wirepool_worker_pid").values()} == pids
    assert all(v == 0 for v in by_worker(after, "wirepool_worker_in_flight").values())
    assert all(v > 1 << 20 for v in by_worker(after, "wirepool_worker_rss_bytes").values())
    states = {(dict(lb)["worker_id"], dict(lb)["state"]): v
              for (n, lb), v in after.items() if n == "wirepool_worker_state"}
    assert len(states) == 2 * len(WORKER_STATES)
    assert {k for k, v in states.items() if v == 1} == {(w, "ready") for w, _ in states}
    assert all(dict(lb)["pool"] == "default" for (_, lb) in after)
    # Rows, bytes and per-method latency (the Rust pool's series, issue 15).
    assert total(after, "wirepool_worker_rows_total") == 50
    assert total(after, "wirepool_worker_received_bytes_total") > 50 * 16
    assert total(after, "wirepool_worker_sent_bytes_total") > 9 * 16
    counts = {dict(lb)["method"]: v for (n, lb), v in after.items()
              if n == "wirepool_method_duration_seconds_count"}
    assert counts == {"add": 7, "decls": 1, "fail_app": 1}, counts
    add_buckets = sorted((float(dict(lb)["le"]), v) for (n, lb), v in after.items()
                         if n == "wirepool_method_duration_seconds_bucket"
                         and dict(lb)["method"] == "add")
    assert add_buckets[-1] == (float("inf"), 7)
    assert all(a[1] <= b[1] for a, b in zip(add_buckets, add_buckets[1:]))  # cumulative
    assert 0 < total(after, "wirepool_method_duration_seconds_sum") < 60
    # A closed pool has no series left (and the scrape does not fail).
    assert scrape(registry) == {}


def test_a_crash_counts_a_restart_and_a_new_worker() -> None:
    registry = CollectorRegistry()
    with wirepool.Pool(CONFORMANCE_WORKER, workers=1, restart_backoff=0.01) as pool:
        registry.register(PoolCollector(pool, name="crashy"))
        first = set(by_worker(scrape(registry), "wirepool_worker_pid"))
        with pytest.raises(wirepool.WorkerExited):
            pool.call("crash", {})
        assert pool.call("add", {"a": 1, "b": 1}) == {"sum": 2}  # served by the replacement
        after = scrape(registry)
    assert total(after, "wirepool_restarts_total") == 1
    assert after[("wirepool_worker_restarts_total", (("cause", "crashed"), ("pool", "crashy")))] == 1
    assert total(after, "wirepool_workers_spawned_total") == 2
    ready = {dict(lb)["worker_id"] for (n, lb), v in after.items()
             if n == "wirepool_worker_state" and dict(lb)["state"] == "ready" and v == 1}
    assert ready and not ready & first


def test_async_pool_scraped_from_another_thread() -> None:
    async def main() -> Samples:
        registry = CollectorRegistry()
        async with wirepool.AsyncPool(CONFORMANCE_WORKER, workers=1) as pool:
            registry.register(PoolCollector(pool))
            await asyncio.gather(*(pool.call("add", {"a": i, "b": 0}) for i in range(5)))
            # The HTTP server scrapes on its own thread: the snapshot hops onto the pool's loop.
            return await asyncio.get_running_loop().run_in_executor(None, scrape, registry)
    samples = asyncio.run(main())
    assert total(samples, "wirepool_calls_total") == 5
    assert total(samples, "wirepool_worker_requests_total") == 5


def test_the_example_serves_metrics_over_http() -> None:
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--port", "0", "--calls", "25"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the example prints its address once it is serving
        found = re.search(r"http://\S+/metrics", line)
        assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
        with urllib.request.urlopen(found.group(0), timeout=30) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            samples = parse(resp.read().decode())
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped" in out
    assert total(samples, "wirepool_calls_total") == 25
    assert total(samples, "wirepool_streams_total") == 1
    assert total(samples, "wirepool_worker_requests_total") == 26
    assert total(samples, "wirepool_workers") == 2
    assert {dict(lb)["pool"] for (_, lb) in samples} == {"example"}


def test_the_rust_example_is_read_by_prometheus_own_parser() -> None:
    """The Rust encoder (wirepool::prometheus) checked by the reference parser, not only by the
    Rust test's own."""
    done = subprocess.run(["cargo", "build", "-q", "-p", "wirepool", "--example", "metrics"],
                          cwd=REPO / "rust", capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "rust" / "target"))
    proc = subprocess.Popen([str(target / "debug" / "examples" / "metrics"), "--port", "0",
                             "--calls", "25", "--scrapes", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://\S+/metrics", line)
        assert found, line
        with urllib.request.urlopen(found.group(0), timeout=30) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = resp.read().decode()
        out, err = proc.communicate(timeout=30)  # it exits after its one scrape
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["wirepool_method_duration_seconds"].type == "histogram"
    assert families["wirepool_worker_requests"].type == "counter"
    samples = parse(text)
    assert total(samples, "wirepool_worker_requests_total") == 26
    assert total(samples, "wirepool_worker_rows_total") == 1000
    add = {dict(lb).get("le"): v for (n, lb), v in samples.items()
           if n == "wirepool_method_duration_seconds_bucket" and dict(lb)["method"] == "add"}
    assert add["+Inf"] == 25
    bounds = sorted((float(le), v) for le, v in add.items())
    assert all(a[1] <= b[1] for a, b in zip(bounds, bounds[1:])), bounds
    assert total(samples, "wirepool_worker_state") == 2
