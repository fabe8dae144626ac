"""OpenTelemetry spans for a pool's requests (the ``otel`` extra:
``pip install 'wirepool[otel]'``).

One span per call or stream, from the moment it is sent to its outcome, a child of the span
current where the call was made::

    from opentelemetry import trace
    import wirepool, wirepool.otel

    pool = wirepool.Pool([sys.executable, "worker.py"], workers=4)
    wirepool.otel.instrument(pool)
    with trace.get_tracer(__name__).start_as_current_span("job"):
        pool.call("add", {"a": 1, "b": 2})   # a "wirepool add" span under "job"

Span attributes: ``rpc.system`` ("wirepool"), ``rpc.method``, ``wirepool.kind`` ("unary" or
"stream"), ``wirepool.request_id``, ``wirepool.worker_id`` (the process), ``wirepool.worker``
(its slot: the ``worker`` label of :mod:`wirepool.prometheus`'s series), ``wirepool.worker_pid``;
a failed request sets the span's status to ERROR and ``wirepool.error_code`` /
``wirepool.error_name`` (the ``code`` label of ``wirepool_errors_total``).
The span kind is CLIENT. (The Rust parent emits the same fields as a ``tracing`` span, target
``wirepool::call``.)
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider

from .errors import WirepoolError
from .pool import AsyncPool
from .sync_pool import Pool
from .proto import MethodKind

__all__ = ["instrument", "uninstrument"]


class _Spans:
    """The pool's request hooks (:class:`wirepool.pool.RequestHooks`): a span per request."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def started(self, method: str, kind: int, request_id: int, worker: Any) -> Any:
        return self._tracer.start_span(
            f"wirepool {method}", kind=SpanKind.CLIENT, attributes={
                "rpc.system": "wirepool", "rpc.method": method,
                "wirepool.kind": "stream" if kind == MethodKind.STREAM else "unary",
                "wirepool.request_id": request_id, "wirepool.worker_id": worker.worker_id,
                "wirepool.worker": worker.slot, "wirepool.worker_pid": worker.pid})

    def ended(self, span: Any, error: BaseException | None) -> None:
        if error is not None:
            if isinstance(error, WirepoolError):
                span.set_attribute("wirepool.error_code", int(error.code))
                span.set_attribute("wirepool.error_name", error.name)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()


def instrument(pool: Pool | AsyncPool, tracer_provider: TracerProvider | None = None) -> None:
    """Trace every request ``pool`` sends from now on (spans from ``tracer_provider``, else
    the global one)."""
    target = pool._apool if isinstance(pool, Pool) else pool
    target.request_hooks = _Spans(trace.get_tracer("wirepool", tracer_provider=tracer_provider))


def uninstrument(pool: Pool | AsyncPool) -> None:
    """Stop tracing ``pool``'s requests (spans already started still end)."""
    target = pool._apool if isinstance(pool, Pool) else pool
    target.request_hooks = None
