"""Pool metrics for Prometheus (the ``prometheus`` extra: ``pip install 'wirepool[prometheus]'``).

A collector reads :meth:`AsyncPool.metrics` when scraped and exports exactly the shared metrics
contract, ``spec/metrics.json`` (PROTOCOL.md section 23): the same names, types, labels, help
texts and histogram buckets as the Rust, Node and Go parents, so one dashboard serves them all::

    import prometheus_client
    from wirepool.prometheus import PoolCollector

    pool = wirepool.Pool([sys.executable, "worker.py"], workers=4)
    prometheus_client.REGISTRY.register(PoolCollector(pool))
    prometheus_client.start_http_server(9464)  # GET http://localhost:9464/metrics

Every series is labelled ``pool`` (the name given to the collector, "default" unless named);
per-worker ones ``worker`` too, the worker's slot (``"0"`` to size-1), which a replacement
takes over, so a per-worker counter keeps counting across restarts. Errors are labelled by the
code's name (``code="HANDLER_ERROR"``), restarts by ``cause``, recycles by ``reason``. Pool-wide:
``wirepool_workers``, ``wirepool_workers_alive``, ``wirepool_calls_total``,
``wirepool_streams_total``, ``wirepool_errors_total``, ``wirepool_restarts_total``,
``wirepool_recycles_total``, ``wirepool_retries_total``, ``wirepool_queue_wait_seconds`` and
``wirepool_method_duration_seconds`` (histograms); per worker: ``wirepool_worker_state``,
``_pid``, ``_in_flight``, ``_requests_total``, ``_rows_total``, ``_sent_bytes_total``,
``_received_bytes_total``, ``_rss_bytes``, ``_heartbeat_rtt_seconds`` and the optional
``wirepool_worker_restarts_total``. A value the pool cannot know (the RSS of a remote worker,
the pid of a slot with no process, the round trip before the first PONG) is left out; a closed
pool exports no samples. The histograms count from the moment the collector is made (it turns
the pool's ``latency_histograms`` on).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Iterable, Mapping, Sequence, Union

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                   HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .errors import WirepoolError
from .pool import AsyncPool, PoolMetrics
from .sync_pool import Pool

__all__ = ["PoolCollector", "WORKER_STATES", "LATENCY_BUCKETS"]

AnyPool = Union[Pool, AsyncPool]

#: The values of the ``state`` label (spec/metrics.json labels.state).
WORKER_STATES = ("starting", "ready", "leased", "draining", "dead")

#: spec/metrics.json buckets.latency_seconds: the histograms' ``le`` bounds (then ``+Inf``).
LATENCY_BUCKETS = (0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                   0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)

_P, _W = ("pool",), ("pool", "worker")

#: The contract's series (spec/metrics.json, version 1): name, type, labels, help, word for word.
_SERIES: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("wirepool_workers", "gauge", _P, "Workers the pool keeps (its size)."),
    ("wirepool_workers_alive", "gauge", _P,
     "Workers whose process runs and finished its handshake (ready, leased or draining)."),
    ("wirepool_calls_total", "counter", _P, "Unary calls sent to a worker (a retry counts again)."),
    ("wirepool_streams_total", "counter", _P, "Streams sent to a worker (a retry counts again)."),
    ("wirepool_errors_total", "counter", _P + ("code",),
     "Calls and streams that ended in an error, by error code name."),
    ("wirepool_restarts_total", "counter", _P + ("cause",),
     "Workers replaced after an unexpected death, by cause."),
    ("wirepool_recycles_total", "counter", _P + ("reason",),
     "Healthy workers retired and replaced by a recycling limit, by limit."),
    ("wirepool_retries_total", "counter", _P,
     "Requests sent again under the pool's retry policy after their worker died."),
    ("wirepool_queue_wait_seconds", "histogram", _P,
     "Time a call or stream waited for a worker with room before it was sent (0 when one had "
     "room)."),
    ("wirepool_method_duration_seconds", "histogram", _P + ("method",),
     "Latency of completed calls and streams, from sending to the outcome, by method."),
    ("wirepool_worker_state", "gauge", _W + ("state",),
     "1 for the worker's current state, 0 for the others."),
    ("wirepool_worker_pid", "gauge", _W,
     "Process id of the worker (a remote worker's on its own machine); absent while none runs."),
    ("wirepool_worker_in_flight", "gauge", _W, "Requests in flight on the worker now."),
    ("wirepool_worker_requests_total", "counter", _W,
     "Requests (calls and streams) sent to the worker."),
    ("wirepool_worker_rows_total", "counter", _W, "Stream rows received from the worker."),
    ("wirepool_worker_sent_bytes_total", "counter", _W,
     "Bytes sent to the worker (frames, headers included)."),
    ("wirepool_worker_received_bytes_total", "counter", _W,
     "Bytes received from the worker (frames, headers included)."),
    ("wirepool_worker_rss_bytes", "gauge", _W,
     "Resident set size of the worker process; absent when it is not a child of this process "
     "or the OS does not say."),
    ("wirepool_worker_heartbeat_rtt_seconds", "gauge", _W,
     "Round trip of the worker's last answered heartbeat PING; absent before the first PONG."),
    # Optional in the contract: a per-slot breakdown of wirepool_restarts_total.
    ("wirepool_worker_restarts_total", "counter", _W + ("cause",),
     "Replacements of the worker in this slot after an unexpected death, by cause."),
)

#: Per-worker series read straight from a slot's snapshot (``AsyncPool.metrics()["slots"]``).
_SLOT_VALUES = (
    ("wirepool_worker_pid", "pid"),
    ("wirepool_worker_in_flight", "in_flight"),
    ("wirepool_worker_requests_total", "requests"),
    ("wirepool_worker_rows_total", "rows"),
    ("wirepool_worker_sent_bytes_total", "bytes_sent"),
    ("wirepool_worker_received_bytes_total", "bytes_received"),
    ("wirepool_worker_rss_bytes", "rss_bytes"),
    ("wirepool_worker_heartbeat_rtt_seconds", "heartbeat_rtt"),
)
_SNAPSHOT_TIMEOUT_S = 5.0
_LE = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]


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


def _buckets(buckets: Sequence[tuple[float, int]], count: int) -> list[tuple[str, float]]:
    """The contract's cumulative ``le`` buckets from the pool's power-of-two ones (``(upper
    bound in seconds, count in that bucket alone)``). An observation is counted at a bound only
    when its whole internal bucket lies below it: the count at a bound may miss observations
    just under it (they show at the next bound), never holds one above it."""
    out: list[tuple[str, float]] = []
    cumulative, k = 0, 0
    for le, bound in zip(_LE, LATENCY_BUCKETS):
        while k < len(buckets) and buckets[k][0] <= bound * (1 + 1e-9):
            cumulative += buckets[k][1]
            k += 1
        out.append((le, cumulative))
    out.append(("+Inf", count))
    return out


class PoolCollector(Collector):
    """A Prometheus collector of one pool's metrics, or several pools' (a mapping from the name
    each gets in the ``pool`` label). Register it once per registry; a closed pool exports no
    samples."""

    def __init__(self, pools: AnyPool | Mapping[str, AnyPool], *, name: str = "default") -> None:
        self._pools: dict[str, AnyPool] = (dict(pools) if isinstance(pools, Mapping)
                                           else {name: pools})
        for pool_name, pool in self._pools.items():
            if not isinstance(pool_name, str) or not pool_name:
                raise ValueError(f"a pool's name must be a non-empty string, not {pool_name!r}")
            # Per-method latency costs the pool a little per request: recorded once collected.
            (pool._apool if isinstance(pool, Pool) else pool).latency_histograms = True

    def describe(self) -> Iterable[Metric]:
        # Registering must not scrape a pool (it may not be started yet): the families, empty.
        return list(_families().values())

    def collect(self) -> Iterable[Metric]:
        f = _families()
        for pool_name, pool in self._pools.items():
            try:
                m = _snapshot(pool)
            # (concurrent.futures.TimeoutError is not the builtin TimeoutError before 3.11.)
            except (WirepoolError, concurrent.futures.TimeoutError, TimeoutError, RuntimeError):
                continue  # closed or stopping: no samples rather than a failed scrape
            if not m.get("closed"):
                _add(f, pool_name, m)
        return list(f.values())


def _families() -> dict[str, Any]:
    """One scrape's metric families, empty, in the contract's order."""
    kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
             "histogram": HistogramMetricFamily}
    return {name: kinds[kind](name, doc, labels=list(labels))
            for name, kind, labels, doc in _SERIES}


def _add(f: dict[str, Any], pool: str, m: PoolMetrics) -> None:
    """One open pool's samples."""
    f["wirepool_workers"].add_metric([pool], m["size"])
    f["wirepool_workers_alive"].add_metric([pool], m["alive"])
    # Sent to a worker: the slots' requests (a call refused before it left is not one).
    streams = sum(s["streams"] for s in m["slots"])
    f["wirepool_calls_total"].add_metric([pool], sum(s["requests"] for s in m["slots"]) - streams)
    f["wirepool_streams_total"].add_metric([pool], streams)
    f["wirepool_retries_total"].add_metric([pool], m.get("retries", 0))
    for name, key in (("wirepool_errors_total", "errors_by_code"),
                      ("wirepool_restarts_total", "restart_causes"),
                      ("wirepool_recycles_total", "recycle_reasons")):
        for label, n in sorted(m[key].items()):
            f[name].add_metric([pool, label], n)
    q = m["queue_wait"]
    f["wirepool_queue_wait_seconds"].add_metric([pool], _buckets(q["buckets"], q["count"]),
                                                q["sum"])
    for method, h in m["methods"].items():
        f["wirepool_method_duration_seconds"].add_metric(
            [pool, method], _buckets(h["buckets"], h["count"]), h["sum"])
    for s in m["slots"]:
        labels = [pool, str(s["slot"])]
        for state in WORKER_STATES:
            f["wirepool_worker_state"].add_metric(labels + [state], 1 if s["state"] == state else 0)
        for name, key in _SLOT_VALUES:
            if s[key] is not None:
                f[name].add_metric(labels, s[key])
        for cause, n in sorted(s["restart_causes"].items()):
            f["wirepool_worker_restarts_total"].add_metric(labels + [cause], n)
