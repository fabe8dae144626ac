"""Pool metrics for Prometheus (the ``prometheus`` extra: ``pip install 'wirepool[prometheus]'``).

A collector reads :meth:`Pool.metrics` when scraped, so nothing is counted twice and the pool's
hot path is untouched::

    import prometheus_client
    from wirepool.prometheus import PoolCollector

    pool = wirepool.Pool([sys.executable, "worker.py"], workers=4)
    prometheus_client.REGISTRY.register(PoolCollector(pool))
    prometheus_client.start_http_server(9464)  # GET http://localhost:9464/metrics

Series (every one labelled ``pool``, the name given to the collector, "default" unless named):

| metric | type | labels | meaning |
|---|---|---|---|
| ``wirepool_workers`` | gauge | | workers the pool keeps alive |
| ``wirepool_worker_state`` | gauge | worker_id, state | 1 for the worker's state (starting, ready, leased, draining, dead), 0 for the others |
| ``wirepool_worker_pid`` | gauge | worker_id | its process id |
| ``wirepool_worker_in_flight`` | gauge | worker_id | requests in flight on it now |
| ``wirepool_worker_requests_total`` | counter | worker_id | requests it completed |
| ``wirepool_worker_rss_bytes`` | gauge | worker_id | its resident set size (Linux /proc) |
| ``wirepool_worker_rows_total`` | counter | worker_id | stream rows received from it |
| ``wirepool_worker_received_bytes_total`` | counter | worker_id | bytes received from it |
| ``wirepool_worker_sent_bytes_total`` | counter | worker_id | bytes sent to it |
| ``wirepool_method_duration_seconds`` | histogram | method | latency of completed calls and streams since the collector was made, from sending to the outcome (power-of-two buckets from 1 us) |
| ``wirepool_worker_restarts_total`` | counter | cause | replacements by why the worker died (``crashed``, ``hung``, ``protocol_violation``, ``start_failed``) |
| ``wirepool_calls_total`` | counter | | unary calls started |
| ``wirepool_streams_total`` | counter | | streams started |
| ``wirepool_completed_total`` | counter | | requests completed, whatever their outcome |
| ``wirepool_errors_total`` | counter | | calls and streams that ended in an error |
| ``wirepool_workers_spawned_total`` | counter | | workers started (first ones and replacements) |
| ``wirepool_restarts_total`` | counter | | workers replaced after an unexpected death |
| ``wirepool_recycled_total`` | counter | | workers retired by a recycling limit |
| ``wirepool_retries_total`` | counter | | requests sent again under the pool's ``RetryPolicy`` |

A ``worker_id`` is one process: a replacement gets a new id, so its counters start a new series
(the Rust pool labels by slot instead, and its restart counter by slot and cause).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Iterable, Mapping, Union

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                   HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector

from .errors import WirepoolError
from .pool import AsyncPool, PoolMetrics
from .sync_pool import Pool

__all__ = ["PoolCollector", "WORKER_STATES"]

AnyPool = Union[Pool, AsyncPool]

#: The values of the ``state`` label, as in the Rust pool's ``WorkerState``.
WORKER_STATES = ("starting", "ready", "leased", "draining", "dead")

_POOL_COUNTERS = (
    ("calls", "wirepool_calls", "Unary calls started."),
    ("streams", "wirepool_streams", "Streams started."),
    ("completed", "wirepool_completed", "Requests completed, whatever their outcome."),
    ("errors", "wirepool_errors", "Calls and streams that ended in an error."),
    ("spawned", "wirepool_workers_spawned", "Workers started (first ones and replacements)."),
    ("restarts", "wirepool_restarts", "Workers replaced after an unexpected death."),
    ("recycled", "wirepool_recycled", "Workers retired by a recycling limit."),
    ("retries", "wirepool_retries", "Requests sent again under the pool's RetryPolicy."),
)
_SNAPSHOT_TIMEOUT_S = 5.0


def _state(w: Mapping) -> str:
    if not w["alive"]:
        return "dead"
    if w["retiring"]:
        return "draining"
    if w["leased"]:
        return "leased"
    return "ready" if w["accepting"] else "starting"


async def _async_snapshot(pool: AsyncPool) -> PoolMetrics:
    return pool.metrics()


def _snapshot(pool: AnyPool) -> PoolMetrics:
    """The pool's metrics, read on its own event loop when the scrape runs on another thread
    (an :class:`AsyncPool` is not thread-safe; :meth:`Pool.metrics` already hops)."""
    if isinstance(pool, AsyncPool):
        loop = pool.loop
        if loop is not None and loop.is_running():
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is not loop:
                fut = asyncio.run_coroutine_threadsafe(_async_snapshot(pool), loop)
                return fut.result(_SNAPSHOT_TIMEOUT_S)
    return pool.metrics()


class PoolCollector(Collector):
    """A Prometheus collector of one pool's metrics, or several pools' (a mapping from the name
    each gets in the ``pool`` label). Register it once per registry; a closed pool's series
    disappear."""

    def __init__(self, pools: AnyPool | Mapping[str, AnyPool], *, name: str = "default") -> None:
        self._pools: dict[str, AnyPool] = (dict(pools) if isinstance(pools, Mapping)
                                           else {name: pools})
        for pool in self._pools.values():
            # Per-method latency costs the pool a little per request: recorded once collected.
            (pool._apool if isinstance(pool, Pool) else pool).latency_histograms = True

    def describe(self) -> Iterable[Metric]:
        # Registering must not scrape a pool (it may not be started yet): the families, empty.
        return _Families().all()

    def collect(self) -> Iterable[Metric]:
        f = _Families()
        for pool_name, pool in self._pools.items():
            try:
                m = _snapshot(pool)
            # (concurrent.futures.TimeoutError is not the builtin TimeoutError before 3.11.)
            except (WirepoolError, concurrent.futures.TimeoutError, TimeoutError, RuntimeError):
                continue  # closed or stopping: no series rather than a failed scrape
            if m.get("closed"):
                continue
            f.add(pool_name, m)
        return f.all()


class _Families:
    """One scrape's metric families."""

    def __init__(self) -> None:
        w = ["pool", "worker_id"]
        self.size = GaugeMetricFamily("wirepool_workers", "Workers the pool keeps alive.",
                                      labels=["pool"])
        self.state = GaugeMetricFamily("wirepool_worker_state",
                                       "1 for the worker's current state, 0 for the others.",
                                       labels=w + ["state"])
        self.pid = GaugeMetricFamily("wirepool_worker_pid", "The worker's process id.", labels=w)
        self.in_flight = GaugeMetricFamily("wirepool_worker_in_flight",
                                           "Requests in flight on the worker now.", labels=w)
        self.served = CounterMetricFamily("wirepool_worker_requests",
                                          "Requests the worker completed.", labels=w)
        self.rss = GaugeMetricFamily("wirepool_worker_rss_bytes",
                                     "The worker's resident set size in bytes.", labels=w)
        self.rows = CounterMetricFamily("wirepool_worker_rows", "Stream rows received from "
                                        "the worker.", labels=w)
        self.received = CounterMetricFamily("wirepool_worker_received_bytes",
                                            "Bytes received from the worker.", labels=w)
        self.sent = CounterMetricFamily("wirepool_worker_sent_bytes", "Bytes sent to the worker.",
                                        labels=w)
        self.duration = HistogramMetricFamily(
            "wirepool_method_duration_seconds",
            "Latency of completed calls and streams, by method.", labels=["pool", "method"])
        self.restarts = CounterMetricFamily("wirepool_worker_restarts",
                                            "Replacements by why the worker died.",
                                            labels=["pool", "cause"])
        self.counters = {key: CounterMetricFamily(metric, doc, labels=["pool"])
                         for key, metric, doc in _POOL_COUNTERS}

    def all(self) -> list[Metric]:
        return [self.size, *self.counters.values(), self.state, self.pid, self.in_flight,
                self.served, self.rss, self.rows, self.received, self.sent, self.duration,
                self.restarts]

    def add(self, pool_name: str, m: PoolMetrics) -> None:
        self.size.add_metric([pool_name], m["size"])
        for key, family in self.counters.items():
            family.add_metric([pool_name], m.get(key, 0))
        for w in m["workers"]:
            labels = [pool_name, str(w["worker_id"])]
            state = _state(w)
            for s in WORKER_STATES:
                self.state.add_metric(labels + [s], 1 if s == state else 0)
            self.pid.add_metric(labels, w["pid"])
            self.in_flight.add_metric(labels, w["in_flight"])
            self.served.add_metric(labels, w["served"])
            if w["rss_bytes"] is not None:
                self.rss.add_metric(labels, w["rss_bytes"])
            self.rows.add_metric(labels, w.get("rows", 0))
            self.received.add_metric(labels, w.get("bytes_received", 0))
            self.sent.add_metric(labels, w.get("bytes_sent", 0))
        for method, h in m.get("methods", {}).items():
            cumulative, buckets = 0, []
            for bound, n in h["buckets"]:
                cumulative += n
                buckets.append((repr(float(bound)), cumulative))
            buckets.append(("+Inf", h["count"]))
            self.duration.add_metric([pool_name, method], buckets, h["sum"])
        for cause, n in sorted(m.get("restart_causes", {}).items()):
            self.restarts.add_metric([pool_name, cause], n)
