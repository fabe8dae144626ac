"""wirepool.prometheus against the shared metrics contract (spec/metrics.json): a real pool's
collector is scraped and every family, help text, type, label set and bucket bound is compared
with the contract, and every required series must be there (a renamed series fails here); then
the values after calls, a map, a stream, errors, a retry and two restarts; a closed pool exports
no samples. The example serves them over HTTP in a form Prometheus' own parser reads."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import wirepool
from wirepool.prometheus import PoolCollector

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "python" / "metrics.py"
CONFORMANCE_WORKER = [sys.executable, str(REPO / "python" / "conformance" / "worker.py")]
CONTRACT_FILE = REPO / "spec" / "metrics.json"
CONSTANTS_FILE = REPO / "spec" / "constants.json"
# The names PROTOCOL.md section 3 gives a code the table does not list, by its range (a
# handler's own code >= 1000 is APPLICATION): error_name() of every SDK.
FALLBACK_CODE_NAMES = {"PROTOCOL", "REQUEST_ERROR", "LOCAL_ERROR", "APPLICATION", "UNKNOWN"}

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


def contract() -> dict[str, Any]:
    if not CONTRACT_FILE.exists():
        pytest.skip("no spec/metrics.json in this tree")
    return json.loads(CONTRACT_FILE.read_text())


class Family:
    def __init__(self) -> None:
        self.help: str | None = None
        self.type: str | None = None
        self.samples: list[tuple[str, dict[str, str], float]] = []


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def families(text: str) -> dict[str, Family]:
    """The text format 0.0.4 as written (HELP and TYPE names exactly as exported), each sample
    under its family; Prometheus' own parser must read it too."""
    list(text_string_to_metric_families(text))
    out: dict[str, Family] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            out.setdefault(name, Family()).help = doc.replace("\\n", "\n").replace("\\\\", "\\")
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            out.setdefault(name, Family()).type = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f"an unparsable line: {line!r}"
        labels = dict(_LABEL.findall(m.group(2) or ""))
        base = re.sub(r"_(bucket|sum|count)$", "", m.group(1))
        family = m.group(1) if m.group(1) in out else base
        out.setdefault(family, Family()).samples.append((m.group(1), labels, float(m.group(3))))
    return out


def check_against_contract(c: dict[str, Any], scraped: dict[str, Family], pool: str) -> None:
    """Every exported family is the contract's (help, type, labels, label values, buckets);
    every required one is exported."""
    known = {s["name"]: s for s in c["series"]}
    codes = {e["name"] for e in json.loads(CONSTANTS_FILE.read_text())["error_codes"]}
    for name in scraped:
        assert name in known or not name.startswith(c["prefix"]), f"{name} is not in the contract"
    for s in c["series"]:
        f = scraped.get(s["name"])
        if f is None:
            assert not s["required"], f"{s['name']} is missing"
            continue
        assert f.help == s["help"], f"{s['name']}'s HELP"
        assert f.type == s["type"], f"{s['name']}'s TYPE"
        groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
        for sample, labels, value in f.samples:
            want = set(s["labels"]) | ({"le"} if sample.endswith("_bucket") else set())
            assert set(labels) == want, f"{sample}'s labels {labels}"
            assert labels["pool"] == pool
            assert math.isfinite(value), (sample, labels, value)
            for k, v in labels.items():
                rule = c["labels"].get(k, {})
                if "values" in rule:
                    assert v in rule["values"], f"{sample}: {k}={v!r} is not one of the contract's"
                if "pattern" in rule:
                    assert re.match(rule["pattern"], v), f"{sample}: {k}={v!r}"
                if k == "code":
                    assert v in codes | FALLBACK_CODE_NAMES, f"{sample}: code={v!r}"
            if s["type"] == "histogram":
                assert re.fullmatch(re.escape(s["name"]) + "_(bucket|sum|count)", sample), sample
                if sample.endswith("_bucket"):
                    key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                    groups.setdefault(key, []).append(labels["le"])
            else:
                assert sample == s["name"], sample
        if s["type"] == "histogram":
            bounds = [float(b) for b in c["buckets"][s["buckets"]]] + [math.inf]
            for key, les in groups.items():
                assert [float(le) for le in les] == bounds, f"{s['name']}{key}'s buckets"


def value(f: dict[str, Family], name: str, **labels: str) -> float:
    family = f.get(name) or f.get(re.sub(r"_(bucket|sum|count)$", "", name))
    return sum(v for n, lb, v in (family.samples if family else [])
               if n == name and all(lb.get(k) == x for k, x in labels.items()))


def by_worker(f: dict[str, Family], name: str) -> dict[str, float]:
    return {lb["worker"]: v for n, lb, v in f[name].samples if n == name}


def scrape_text(registry: CollectorRegistry) -> dict[str, Family]:
    return families(generate_latest(registry).decode())


def test_the_series_are_the_contracts_and_follow_the_pool() -> None:
    c = contract()
    registry = CollectorRegistry()
    policy = wirepool.RetryPolicy(methods={"crash"}, attempts=2)
    with wirepool.Pool(CONFORMANCE_WORKER, workers=2, heartbeat_ms=50, restart_backoff=0.01,
                       retry=policy, worker_output="discard") as pool:
        registry.register(PoolCollector(pool, name="test"))
        # Before any call: every required family, the per-worker ones for slots 0 and 1.
        m = scrape_text(registry)
        check_against_contract(c, m, "test")
        assert value(m, "wirepool_workers") == 2
        assert set(by_worker(m, "wirepool_worker_pid")) == {"0", "1"}
        first_pids = set(pool.pids)

        for i in range(3):
            assert pool.call("add", {"a": i, "b": 1}) == {"sum": i + 1}
        assert list(pool.map("add", [{"a": i, "b": 0} for i in range(3)])) == [
            {"sum": i} for i in range(3)]
        assert len(list(pool.stream("decls", {"n": 10}))) == 10
        with pytest.raises(wirepool.WirepoolError) as info:
            pool.call("fail", {})
        assert info.value.name == "HANDLER_ERROR"
        with pytest.raises(wirepool.WorkerError):
            pool.call("fail_app", {})  # code 1042: APPLICATION
        with pytest.raises(wirepool.WirepoolError) as info:
            pool.call("no_such_method", {})  # an error, but never sent
        assert info.value.name == "UNKNOWN_METHOD"
        with pytest.raises(wirepool.WorkerExited):
            pool.call("crash", {})  # two tries, two deaths, two replacements
        # The replacements start and each answers a heartbeat.
        deadline = time.monotonic() + 30
        while True:
            m = scrape_text(registry)
            if (value(m, "wirepool_workers_alive") == 2
                    and len(by_worker(m, "wirepool_worker_heartbeat_rtt_seconds")) == 2
                    and value(m, "wirepool_restarts_total") == 2):
                break
            assert time.monotonic() < deadline, "two workers alive and pinged"
            time.sleep(0.02)
        pids = set(pool.pids)
    check_against_contract(c, m, "test")
    assert value(m, "wirepool_calls_total") == 3 + 3 + 2 + 2
    assert value(m, "wirepool_streams_total") == 1
    assert value(m, "wirepool_retries_total") == 1
    assert value(m, "wirepool_errors_total", code="HANDLER_ERROR") == 1
    assert value(m, "wirepool_errors_total", code="APPLICATION") == 1
    assert value(m, "wirepool_errors_total", code="WORKER_EXITED") == 2
    assert value(m, "wirepool_errors_total", code="UNKNOWN_METHOD") == 1
    assert value(m, "wirepool_errors_total") == 5
    assert value(m, "wirepool_restarts_total", cause="crashed") == 2
    assert value(m, "wirepool_worker_restarts_total", cause="crashed") == 2
    assert value(m, "wirepool_recycles_total") == 0
    # The slots' counters, kept across the replacements (the dead workers' requests count).
    assert value(m, "wirepool_worker_requests_total") == 11
    assert value(m, "wirepool_worker_rows_total") == 10
    assert value(m, "wirepool_worker_sent_bytes_total") > 11 * 16
    assert value(m, "wirepool_worker_received_bytes_total") > 10 * 16
    assert value(m, "wirepool_worker_state", state="ready") == 2
    assert value(m, "wirepool_worker_state") == 2  # one state per slot
    assert {int(v) for v in by_worker(m, "wirepool_worker_pid").values()} == pids
    assert pids != first_pids
    assert all(v > 1 << 20 for v in by_worker(m, "wirepool_worker_rss_bytes").values())
    assert all(0 < v < 5 for v in by_worker(m, "wirepool_worker_heartbeat_rtt_seconds").values())
    assert all(v == 0 for v in by_worker(m, "wirepool_worker_in_flight").values())
    assert value(m, "wirepool_queue_wait_seconds_count") == 11
    assert value(m, "wirepool_method_duration_seconds_count", method="add") == 6
    assert value(m, "wirepool_method_duration_seconds_count", method="decls") == 1
    assert value(m, "wirepool_method_duration_seconds_count", method="crash") == 2
    add = [v for n, lb, v in m["wirepool_method_duration_seconds"].samples
           if n.endswith("_bucket") and lb["method"] == "add"]
    assert add == sorted(add) and add[-1] == 6  # cumulative, +Inf the count
    assert 0 < value(m, "wirepool_method_duration_seconds_sum", method="add") < 60
    # A closed pool: the families, no samples.
    closed = scrape_text(registry)
    for s in c["series"]:
        if s["required"]:
            assert s["name"] in closed and not closed[s["name"]].samples, s["name"]


def test_a_renamed_series_fails_the_check() -> None:
    """The check is not vacuous: a series under another name, or a missing one, fails it."""
    c = contract()
    registry = CollectorRegistry()
    with wirepool.Pool(CONFORMANCE_WORKER, workers=1) as pool:
        registry.register(PoolCollector(pool, name="test"))
        text = generate_latest(registry).decode()
    check_against_contract(c, families(text), "test")
    renamed = text.replace("wirepool_worker_rows_total", "wirepool_worker_rows_received_total")
    with pytest.raises(AssertionError, match="not in the contract"):
        check_against_contract(c, families(renamed), "test")
    dropped = "\n".join(line for line in text.splitlines() if "wirepool_retries_total" not in line)
    with pytest.raises(AssertionError, match="wirepool_retries_total is missing"):
        check_against_contract(c, families(dropped), "test")


def test_histogram_bounds_never_count_an_observation_early() -> None:
    """The pool's power-of-two buckets mapped onto the contract's bounds: the count at a bound
    never exceeds the observations at or below it."""
    from wirepool._pooled_worker import LatencyHistogram
    from wirepool.prometheus import LATENCY_BUCKETS, _buckets
    h = LatencyHistogram()
    seen = [0.0, 3e-6, 4.9e-6, 5e-6, 9.99e-6, 2.4e-5, 7e-4, 0.0011, 0.3, 2.0, 299.0, 1000.0]
    for s in seen:
        h.observe(s)
    snap = h.snapshot()
    out = _buckets(snap["buckets"], snap["count"])
    assert [le for le, _ in out][-1] == "+Inf" and out[-1][1] == len(seen)
    for (le, n), bound in zip(out, LATENCY_BUCKETS):
        assert float(le) == bound
        assert n <= sum(1 for s in seen if s <= bound), (le, n)
    assert out[0][1] == 2  # 0 and 3 us; 4.9 us shares the 4..8 us bucket and shows at 10 us
    assert [n for _, n in out] == sorted(n for _, n in out)


def test_a_crash_keeps_the_slot_and_its_counters() -> None:
    registry = CollectorRegistry()
    with wirepool.Pool(CONFORMANCE_WORKER, workers=1, restart_backoff=0.01,
                       worker_output="discard") as pool:
        registry.register(PoolCollector(pool, name="crashy"))
        first = by_worker(scrape_text(registry), "wirepool_worker_pid")
        for i in range(3):
            pool.call("add", {"a": i, "b": 1})
        with pytest.raises(wirepool.WorkerExited):
            pool.call("crash", {})
        assert pool.call("add", {"a": 1, "b": 1}) == {"sum": 2}  # served by the replacement
        after = scrape_text(registry)
    assert set(first) == set(by_worker(after, "wirepool_worker_pid")) == {"0"}
    assert first["0"] != by_worker(after, "wirepool_worker_pid")["0"]
    assert value(after, "wirepool_restarts_total", cause="crashed") == 1
    assert value(after, "wirepool_worker_restarts_total", worker="0", cause="crashed") == 1
    assert value(after, "wirepool_worker_requests_total", worker="0") == 5  # monotonic
    assert value(after, "wirepool_worker_state", worker="0", state="ready") == 1


def test_a_worker_that_exits_by_itself_is_told_from_a_crash() -> None:
    """Exit status 0 unasked: ``left_by_itself`` (as the Rust and Node pools say), by slot too."""
    registry = CollectorRegistry()
    with wirepool.Pool(CONFORMANCE_WORKER, workers=1, restart_backoff=0.01,
                       worker_output="discard") as pool:
        registry.register(PoolCollector(pool, name="quits"))
        with pytest.raises(wirepool.WorkerExited):
            pool.call("exit", {"status": 0})
        deadline = time.monotonic() + 20
        while value(m := scrape_text(registry), "wirepool_restarts_total") < 1:
            assert time.monotonic() < deadline, "the restart counted"
            time.sleep(0.01)
    check_against_contract(contract(), m, "quits")
    assert value(m, "wirepool_restarts_total", cause="left_by_itself") == 1
    assert value(m, "wirepool_restarts_total", cause="crashed") == 0
    assert value(m, "wirepool_worker_restarts_total", worker="0", cause="left_by_itself") == 1


def test_a_recycle_is_a_recycle_not_a_restart() -> None:
    registry = CollectorRegistry()
    with wirepool.Pool(CONFORMANCE_WORKER, workers=1, max_requests=3) as pool:
        registry.register(PoolCollector(pool, name="r"))
        for i in range(3):
            pool.call("add", {"a": i, "b": 1})
        deadline = time.monotonic() + 20
        while True:
            m = scrape_text(registry)
            if (value(m, "wirepool_recycles_total") == 1
                    and value(m, "wirepool_worker_state", state="ready") == 1):
                break
            assert time.monotonic() < deadline, "the recycle"
            time.sleep(0.01)
    check_against_contract(contract(), m, "r")
    assert value(m, "wirepool_recycles_total", reason="requests") == 1
    assert not m["wirepool_restarts_total"].samples
    assert value(m, "wirepool_worker_requests_total", worker="0") == 3


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
    """The Rust encoder (wirepool::prometheus) checked by the reference parser and against
    spec/metrics.json by this test's check, not only by the Rust test's own."""
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
    # The same contract check as the Python exporter's: one dashboard reads both.
    check_against_contract(contract(), families(text), "example")
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert parsed["wirepool_method_duration_seconds"].type == "histogram"
    assert parsed["wirepool_worker_requests"].type == "counter"
    samples = parse(text)
    assert total(samples, "wirepool_worker_requests_total") == 26
    assert total(samples, "wirepool_worker_rows_total") == 1000
    add = {dict(lb).get("le"): v for (n, lb), v in samples.items()
           if n == "wirepool_method_duration_seconds_bucket" and dict(lb)["method"] == "add"}
    assert add["+Inf"] == 25
    bounds = sorted((float(le), v) for le, v in add.items())
    assert all(a[1] <= b[1] for a, b in zip(bounds, bounds[1:])), bounds
    assert total(samples, "wirepool_worker_state") == 2
