"""wirepool.otel: one OpenTelemetry span per request, child of the caller's span, with the
request id and the worker's pid; errors mark the span (issue 15)."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import wirepool
import wirepool.otel

BASIC = os.path.join(os.path.dirname(__file__), "workers", "basic.py")


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_blocking_calls_streams_and_maps_each_get_one_span_under_the_callers() -> None:
    provider, exporter = tracing()
    tracer = provider.get_tracer("test")
    with wirepool.Pool([sys.executable, BASIC], workers=1) as pool:
        wirepool.otel.instrument(pool, provider)
        with tracer.start_as_current_span("job") as job:
            for i in range(20):  # direct calls (the caller reads its answer) and looped ones
                assert pool.call("add", {"a": i, "b": 1}) == {"sum": i + 1}
            assert len(list(pool.stream("rows", {"n": 10}))) == 10
            assert len(list(pool.map("add", [{"a": 1, "b": 1}] * 5))) == 5
            with pytest.raises(wirepool.WorkerError):
                pool.call("fail", {"thing": "x"})
        pid = pool.pids[0]
        wirepool.otel.uninstrument(pool)
        pool.call("add", {"a": 1, "b": 1})  # not traced any more
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("wirepool")]
    names = [s.name for s in spans]
    assert names.count("wirepool add") == 25 and names.count("wirepool rows") == 1
    assert names.count("wirepool fail") == 1 and len(spans) == 27, names
    for s in spans:
        assert s.kind == SpanKind.CLIENT
        assert s.attributes["wirepool.worker_pid"] == pid
        assert s.attributes["wirepool.worker"] == 0  # the slot, as the metrics' worker label
        assert s.attributes["rpc.system"] == "wirepool"
        # The blocking call ran on the pool's loop or in the caller's thread: either way the
        # span is the caller's child.
        assert s.parent is not None and s.parent.span_id == job.get_span_context().span_id
    ids = [s.attributes["wirepool.request_id"] for s in spans]
    assert len(set(ids)) == len(ids)
    failed = [s for s in spans if s.name == "wirepool fail"][0]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["wirepool.error_code"] == 1042
    assert [s.attributes["wirepool.kind"] for s in spans if s.name == "wirepool rows"] == ["stream"]


def test_async_calls_are_children_of_their_tasks_span_and_cancel_ends_the_span() -> None:
    provider, exporter = tracing()
    tracer = provider.get_tracer("test")

    async def main() -> tuple[int, int]:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=1) as pool:
            wirepool.otel.instrument(pool, provider)

            async def one(i: int) -> tuple[int, int]:
                with tracer.start_as_current_span(f"task{i}") as span:
                    await pool.call("add", {"a": i, "b": 0})
                    return i, span.get_span_context().span_id

            parents = dict(await asyncio.gather(*(one(i) for i in range(4))))
            task = asyncio.ensure_future(pool.call("sleep", {"seconds": 30}))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return len(parents), len({v for v in parents.values()})

    n, distinct = asyncio.run(main())
    assert (n, distinct) == (4, 4)
    spans = exporter.get_finished_spans()
    adds = [s for s in spans if s.name == "wirepool add"]
    tasks = {x.context.span_id for x in spans if x.name.startswith("task")}
    assert len(adds) == 4 and all(s.parent.span_id in tasks for s in adds)  # type: ignore[union-attr]
    sleeps = [s for s in spans if s.name == "wirepool sleep"]
    assert len(sleeps) == 1 and sleeps[0].status.status_code == StatusCode.ERROR
