"""The Python pool driving Python workers, end to end (real processes, real sockets)."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import signal
import subprocess
import sys
import traceback
from typing import Any
import time

import pytest

import wirepool

pytestmark = pytest.mark.timeout(60)

BASIC = os.path.join(os.path.dirname(__file__), "workers", "basic.py")


def wait_until(condition, timeout: float = 10.0) -> None:
    """Poll ``condition`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def in_flight(p: wirepool.Pool) -> int:
    """Requests the pool has sent and not yet seen end, over all workers."""
    return sum(w["in_flight"] for w in p.metrics()["workers"])


def pool(workers: int = 1, **kw) -> wirepool.Pool:
    return wirepool.Pool([sys.executable, BASIC], workers=workers, **kw)


@pytest.mark.parametrize("codec", ["json", "msgpack"])
def test_echo_round_trips_values(codec: str) -> None:
    value = {"a": [1, 2.5, "three", None, True], "nested": {"k": "v" * 100}}
    with pool(codec=codec) as p:
        assert p.call("echo", value) == value
        assert p.call("add", {"a": 2, "b": 40}) == {"sum": 42}
        assert p.call("add_async", {"a": 2, "b": 40}) == {"sum": 42}
        assert p.call("add_inline", {"a": 2, "b": 40}) == {"sum": 42}
        with pytest.raises(wirepool.WorkerError):
            p.call("add_inline", {"fail": True})


def test_arrow_tables_travel_as_ipc_streams() -> None:
    pa = pytest.importorskip("pyarrow")
    with pool() as p:
        out = p.call("arrow_double", pa.table({"x": [1, 2, 3]}), codec="arrow")
        assert out.to_pydict() == {"x": [2, 4, 6]}


def test_raw_echo_returns_bytes_unchanged() -> None:
    data = os.urandom(4096)
    with pool() as p:
        assert bytes(p.call("echo", data, codec="raw")) == data


def test_payload_larger_than_one_frame() -> None:
    data = os.urandom(5 * 1024 * 1024 + 17)  # 5 frames of 1 MiB, plus a tail
    with pool(max_frame_size=1 << 20) as p:
        assert bytes(p.call("echo", data, codec="raw")) == data


def test_stream_100k_rows_in_order() -> None:
    with pool() as p:
        s = p.stream("rows", {"n": 100_000})
        got = [r["i"] for r in s]
        assert got == list(range(100_000))
        assert s.row_count == 100_000 and s.summary is None


def test_async_generator_stream() -> None:
    with pool() as p:
        assert [r["i"] for r in p.stream("rows_async", {"n": 1000})] == list(range(1000))


def test_stream_with_summary_and_progress_events() -> None:
    events: list[tuple[str, object]] = []
    with pool() as p:
        s = p.stream("rows_with_summary", {"n": 50}, on_event=lambda t, d: events.append((t, d)))
        assert [r["i"] for r in s] == list(range(50))
        assert s.summary == {"total": sum(range(50))}
    assert events, "progress events must arrive"
    assert all(t == "count" for t, _ in events)
    # Coalesced, but the last one is always delivered before END.
    assert events[-1][1] == {"done": 50}
    assert len(events) <= 50


def _json_rows(seed: int) -> list:
    """Rows of mixed sizes: runs of nearly one size (padded to one size), jumps up and down,
    empty-ish values, and rows past the worker's 4 KiB length-prefix table."""
    import random
    rnd = random.Random(seed)
    rows: list = []
    for _ in range(40):
        base = rnd.choice([0, 1, 5, 40, 200, 1000, 4090, 5000, 70_000])
        jitter = rnd.choice([0, 3, 20])
        mixed = rnd.random() < 0.3
        for _ in range(rnd.randint(1, 3000 if base < 1000 else 300)):
            size = max(0, base + rnd.randint(-jitter, jitter))
            if mixed:
                rows.append(rnd.choice([
                    "x" * size, {"k": "y" * size, "n": rnd.randint(-10**12, 10**12)},
                    [rnd.random()] * (size // 20), None, True, 0, ""]))
            else:
                rows.append({"k": "y" * size})
    return rows


@pytest.mark.parametrize("method", ["echo_rows", "echo_rows_async"])
@pytest.mark.parametrize("codec", ["json", "msgpack"])
def test_stream_rows_of_every_size_arrive_as_yielded(method: str, codec: str) -> None:
    with pool(codec=codec, max_frame_size=1 << 20, initial_credit=1 << 20) as p:
        for seed in range(2):
            rows = _json_rows(seed)
            s = p.stream(method, {"rows": rows, "repeat": 2})
            assert list(s) == rows + rows
            assert s.row_count == 2 * len(rows)


def test_json_rows_of_nearly_one_size_make_frames_of_one_row_size() -> None:
    # The worker pads them (leading spaces) so a parent slices a frame without a loop per row.
    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=1, initial_credit=1 << 20) as p:
            s = p.stream("rows", {"n": 200_000})
            sizes = []
            while (batch := await s.next_batch()) is not None:
                sizes.append({len(r) for r in batch.rows})
            assert len(sizes) > 10
            assert sum(len(x) == 1 for x in sizes) >= len(sizes) - 6  # one per digit change
    asyncio.run(main())


def test_raw_rows_are_copied_when_yielded() -> None:
    with pool() as p:
        got = [bytes(r) for r in p.stream("raw_rows_reused", b"5000", codec="raw")]
    assert got[:-2] == [i.to_bytes(8, "little") for i in range(5000)]
    assert got[-2:] == [b"view", bytes(memoryview(__import__("array").array("i", [1, 2, 3])))]


def test_raw_rows_of_mixed_types_arrive_as_yielded() -> None:
    # bytes rows are queued as they are; a reused bytearray mid-stream must still arrive as it
    # was at each yield; errors after the first rows end the stream typed; the generator's
    # return value is the summary.
    n = 20_000
    want = ([b"a%d" % i for i in range(n)] + [i.to_bytes(8, "little") for i in range(n)]
            + [b"c%d" % i for i in range(n)])
    with pool() as p:
        s = p.stream("raw_mixed", b"%d,summary" % n, codec="raw")
        assert [bytes(r) for r in s] == want
        assert bytes(s.summary) == b"done"
        with pytest.raises(wirepool.HandlerError, match="the generator's own type error"):
            list(p.stream("raw_mixed", b"%d,type_error" % n, codec="raw"))
        with pytest.raises(wirepool.HandlerError, match="raw codec carries bytes-like objects"):
            list(p.stream("raw_mixed", b"%d,int" % n, codec="raw"))
        with pytest.raises(wirepool.RowTooLarge):
            list(p.stream("raw_mixed", b"%d,big" % n, codec="raw"))
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}


def test_raw_generator_that_ignores_cancellation_is_stopped() -> None:
    with pool(initial_credit=65536) as p:
        s = p.stream("raw_endless", b"", codec="raw")
        for n, _ in enumerate(s):
            if n == 50_000:
                break
        s.close()
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}
        wait_until(lambda: in_flight(p) == 0)


def test_a_blocked_raw_generator_rows_already_yielded_arrive() -> None:
    with pool(workers=1) as p:
        it = iter(p.stream("raw_trickle", b"", codec="raw"))
        assert [bytes(next(it)) for _ in range(100)] == [b"r%d" % i for i in range(100)]
        assert p.call("release", {}) is True
        assert [bytes(r) for r in it] == [b"released"]


def test_a_generator_that_blocks_after_a_burst_has_the_burst_delivered() -> None:
    # The rows of a burst (a whole pass of the producer and part of the next, which then
    # waits inside the generator) arrive before the generator yields again.
    with pool(workers=1) as p:
        it = iter(p.stream("burst_then_wait", {"n": 300}))
        assert [next(it) for _ in range(300)] == [{"i": i} for i in range(300)]
        assert p.call("release", {}) is True
        assert list(it) == [{"released": True}]


def test_a_generator_that_ignores_cancellation_is_stopped() -> None:
    with pool(initial_credit=65536) as p:
        s = p.stream("deaf_endless", {})
        for n, _ in enumerate(s):
            if n == 50_000:
                break
        s.close()
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}
        wait_until(lambda: in_flight(p) == 0)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 255, 256, 257, 5000])
def test_a_generator_return_value_is_the_summary_whatever_the_row_count(n: int) -> None:
    # Row counts around the producer's passes (16 rows, then up to 256).
    with pool(workers=1) as p:
        s = p.stream("rows_returning", {"n": n})
        assert list(s) == list(range(n))
        assert s.summary == {"rows": n} and s.row_count == n


def test_a_blocked_generator_rows_already_yielded_arrive() -> None:
    # The generator waits after its first row: that row must reach the caller anyway (the
    # worker's flush timer), not wait for the next row or the end.
    with pool(workers=1) as p:
        s = p.stream("trickle", {})
        it = iter(s)
        assert next(it) == {"first": True}
        assert p.call("release", {}) is True
        assert list(it) == [{"released": True}]


def test_error_with_code_and_details() -> None:
    with pool() as p:
        with pytest.raises(wirepool.WorkerError) as e:
            p.call("fail", {"thing": "x"})
        assert (e.value.code, e.value.message, e.value.details) == (1042, "no such thing",
                                                                    {"thing": "x"})
        with pytest.raises(wirepool.HandlerError) as h:
            p.call("boom", {})
        assert h.value.code == 203 and "ValueError: bad value" in h.value.message
        assert "Traceback" in h.value.details["traceback"]
        with pytest.raises(wirepool.HandlerError, match="reserved code 205"):
            p.call("fail_reserved", {})  # codes < 1000 are the protocol's, not the handler's
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}  # the worker survives


def test_unknown_method_and_wrong_kind() -> None:
    with pool() as p:
        with pytest.raises(wirepool.UnknownMethod):
            p.call("no_such_method", {})
        with pytest.raises(wirepool.UnknownMethod):
            p.call("rows", {"n": 1})
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}


def test_codec_unsupported_by_method() -> None:
    with pool() as p:
        with pytest.raises(wirepool.CodecUnsupported):
            p.call("add", {"a": 1, "b": 1}, codec="cbor")


def test_a_request_the_codec_cannot_encode_is_a_typed_error() -> None:
    """Issue 15: BadRequest (202, as Rust's Error::Encode), not the codec's bare TypeError, in
    every way of calling; the pool goes on serving."""
    unencodable = {"a": object(), "b": 1}
    with pool() as p:
        attempts = {
            "call": lambda: p.call("add", unencodable),
            "call raw": lambda: p.call("echo", "not bytes", codec="raw"),
            "stream": lambda: list(p.stream("rows", unencodable)),
            "map": lambda: list(p.map("add", [{"a": 1, "b": 1}, unencodable])),
        }
        for how, attempt in attempts.items():
            with pytest.raises(wirepool.BadRequest) as e:
                attempt()
            assert e.value.code == wirepool.ErrorCode.BAD_REQUEST, how
            assert "cannot encode the request as" in e.value.message, (how, e.value.message)
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}

    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=1) as ap:
            with pytest.raises(wirepool.BadRequest):
                await ap.call("add", unencodable)
            with pytest.raises(wirepool.BadRequest):
                async for _ in ap.stream("rows", unencodable):
                    pass
    asyncio.run(main())


def test_bad_request_body() -> None:
    with pool() as p:
        with pytest.raises(wirepool.BadRequest):
            p._run(_raw_request, p, "add", b"{not json")


async def _raw_request(p: wirepool.Pool, method: str, body: bytes) -> object:
    ap = p._apool
    w = await ap._acquire()
    req = w.submit(method, body, wirepool.codecs.get("json"), None, None,
                   wirepool.proto.MethodKind.UNARY)
    return await req.future


def test_cancel_mid_stream_by_closing_the_iterator() -> None:
    with pool() as p:
        s = p.stream("endless", {})
        for n, row in enumerate(s):
            if n == 1000:
                break
        s.close()
        # The worker ended the stream (CANCELLED) and still serves.
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}
        # The stream's terminal (ERROR CANCELLED) arrives; the worker was not replaced.
        wait_until(lambda: p.metrics()["workers"][0]["in_flight"] == 0)
        assert p.metrics().get("restarts", 0) == 0


def test_cancel_by_cancelling_the_task() -> None:
    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=1) as p:
            t = asyncio.ensure_future(p.call("sleep", {"seconds": 30}))
            await asyncio.sleep(0.2)  # let the request reach the worker
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert await p.call("add", {"a": 1, "b": 2}) == {"sum": 3}
            assert p.metrics().get("restarts", 0) == 0
    asyncio.run(main())


def test_deadline_honoured_by_the_worker() -> None:
    with pool() as p:
        t0 = time.monotonic()
        with pytest.raises(wirepool.DeadlineExceeded) as e:
            p.call("sleep", {"seconds": 30}, timeout=0.2)
        assert e.value.code == 206
        assert time.monotonic() - t0 < 5
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}


def test_deadline_enforced_by_the_parent_when_the_worker_ignores_it() -> None:
    with pool(cancel_grace=0.5) as p:
        t0 = time.monotonic()
        with pytest.raises(wirepool.DeadlineExceeded):
            p.call("sleep_stubborn", {"seconds": 30}, timeout=0.2)
        assert time.monotonic() - t0 < 5
        # The worker ignored CANCEL: it was killed and replaced; the pool still answers.
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}


def test_crash_mid_stream_is_worker_exited_with_signal_and_stderr() -> None:
    with pool() as p:
        s = p.stream("crash_after", {"n": 10})
        got = []
        with pytest.raises(wirepool.WorkerExited) as e:
            for r in s:
                got.append(r["i"])
        assert got == list(range(10))
        assert e.value.signal == signal.SIGKILL and e.value.exit_status is None
        assert "about to die" in e.value.stderr_tail
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}  # replaced


def test_worker_exit_status_reported() -> None:
    with pool() as p:
        with pytest.raises(wirepool.WorkerExited) as e:
            p.call("die", {"status": 7})
        assert e.value.exit_status == 7 and e.value.signal is None
        assert "dying on purpose" in e.value.stderr_tail


def test_hung_worker_detected_by_heartbeat_and_replaced() -> None:
    with pool(heartbeat_ms=100) as p:
        (victim,) = p.pids
        fut = p.submit("sleep", {"seconds": 30})
        wait_until(lambda: in_flight(p) == 1)  # in flight before the worker freezes
        os.kill(victim, signal.SIGSTOP)
        try:
            with pytest.raises(wirepool.WorkerHung):
                fut.result(timeout=10)
        finally:
            try:
                os.kill(victim, signal.SIGCONT)
            except ProcessLookupError:
                pass
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}
        assert victim not in p.pids


def test_codec_mismatch_fails_at_start_up() -> None:
    with pytest.raises(wirepool.ProtocolError) as e:
        pool(codec="cbor", require=["add"])
    assert e.value.code == wirepool.ErrorCode.CODEC_MISMATCH
    with pytest.raises(wirepool.ProtocolError) as e:
        pool(require={"rows": "unary"})
    assert e.value.code == wirepool.ErrorCode.CODEC_MISMATCH


@pytest.mark.parametrize("method", ["endless_counted", "endless_counted_async"])
def test_slow_consumer_bounds_what_the_worker_produces(method: str) -> None:
    credit = 65536
    produced: list[int] = []
    with pool(initial_credit=credit) as p:
        s = p.stream(method, {}, on_event=lambda t, d: produced.append(d))
        consumed = 0
        for row in s:
            consumed += 1
            if consumed % 200 == 0:
                time.sleep(0.002)  # a slow consumer (pacing, not synchronisation)
            if consumed == 20_000:
                break
        s.close()
    # Rows are >= 12 bytes + 4 of framing. Unread bytes are bounded by the credit plus one frame
    # (the protocol), plus the worker's batch being filled and one batch awaiting credit, plus
    # the frame the consumer is reading (the SDK's buffers): frames are credit/4 bytes here.
    frame = credit // 4
    window_rows = (credit + 4 * frame) // 16
    assert produced and max(produced) <= 20_000 + window_rows + 100  # progress every 100 rows


def test_recycle_by_request_count_fails_nothing() -> None:
    with pool(workers=2, max_requests=5) as p:
        served_by = [p.call("pid", {}) for _ in range(30)]
        m = p.metrics()
    per_pid = collections.Counter(served_by)
    assert max(per_pid.values()) <= 5  # no worker life serves more than max_requests
    assert len(per_pid) >= 6  # 30 requests, 5 per life: at least 6 lives
    assert m["recycled"] >= 5
    assert m.get("errors", 0) == 0


def test_shutdown_with_work_in_flight_lets_it_finish() -> None:
    p = pool(workers=2)
    futs = [p.submit("sleep", {"seconds": 0.3}) for _ in range(4)]
    wait_until(lambda: in_flight(p) == 4)
    p.close(grace=10)
    assert [f.result(timeout=1) for f in futs] == [{"slept": 0.3}] * 4


def test_shutdown_now_cancels_work_in_flight() -> None:
    p = pool()
    futs = [p.submit("sleep", {"seconds": 30}) for _ in range(2)]
    wait_until(lambda: in_flight(p) == 2)
    p.close(grace=0)
    for f in futs:
        with pytest.raises((wirepool.Cancelled, wirepool.WorkerExited)):
            f.result(timeout=1)
    with pytest.raises(wirepool.PoolClosed):
        p.call("add", {"a": 1, "b": 1})


def test_startup_timeout() -> None:
    t0 = time.monotonic()
    with pytest.raises(wirepool.StartupTimeout):
        wirepool.Pool([sys.executable, "-c", "import time; time.sleep(60)"],
                      startup_timeout=0.5)
    assert time.monotonic() - t0 < 10


def test_missing_executable_is_spawn_failed() -> None:
    with pytest.raises(wirepool.SpawnFailed) as e:
        wirepool.Pool(["/nonexistent/wirepool-worker"])
    assert e.value.code == 303


def test_worker_dying_before_hello_reports_status_and_stderr() -> None:
    # A worker that fails at import: start-up fails at once with its exit status and stderr.
    with pytest.raises(wirepool.WorkerExited) as e:
        wirepool.Pool([sys.executable, "-c", "import no_such_module_xyz"], startup_timeout=10)
    assert e.value.exit_status == 1
    assert "No module named 'no_such_module_xyz'" in e.value.stderr_tail


def test_a_program_that_never_serves_gets_the_hint() -> None:
    """Issue 28: "exited with status 0 before its HELLO" said nothing of the likely cause."""
    with pytest.raises(wirepool.WorkerExited) as e:
        wirepool.Pool([sys.executable, "-c", "pass"], startup_timeout=10)
    assert e.value.exit_status == 0
    assert "did the worker program call its SDK's serve, e.g. wirepool.serve()?" in str(e.value)
    with pytest.raises(wirepool.WorkerExited) as e:  # it said why: no guess added
        wirepool.Pool([sys.executable, "-c", "import sys; sys.stderr.write('bye\\n')"])
    assert "serve" not in e.value.message and "bye" in e.value.stderr_tail


def test_version_mismatch_fails_at_start_up() -> None:
    hello = wirepool.proto.encode_frame(wirepool.proto.Hello(
        min_version=2, max_version=3, pid=1, max_concurrency=1, methods=[]))
    script = ("import os, socket, time\n"
              "s = socket.socket(fileno=int(os.environ['WIREPOOL_FD']))\n"
              f"s.sendall({hello!r})\n"
              "s.recv(100); time.sleep(5)\n")
    with pytest.raises(wirepool.ProtocolError) as e:
        wirepool.Pool([sys.executable, "-c", script], startup_timeout=10)
    assert e.value.code == wirepool.ErrorCode.VERSION_MISMATCH


def test_chatty_worker_never_blocks_and_every_line_is_logged() -> None:
    class Count(logging.Handler):
        lines = {"stdout": 0, "stderr": 0}

        def emit(self, record: logging.LogRecord) -> None:
            self.lines[record.args[2]] += 1  # type: ignore[index]

    handler = Count()
    log = logging.getLogger("wirepool.worker")
    log.addHandler(handler)
    log.propagate = False  # 200 MB of lines: not into pytest's log capture
    try:
        with pool() as p:  # 100 MB on stdout and 100 MB on stderr, 1 KiB lines
            assert p.call("chatter", {"mb": 100}, timeout=50) == {"ok": True}
    finally:
        log.removeHandler(handler)
        log.propagate = True
    assert Count.lines == {"stdout": 100 * 1024, "stderr": 100 * 1024}


WORKER_OUTPUT_PROGRAM = """
import sys, wirepool
with wirepool.Pool([sys.executable, sys.argv[1]], workers=1, worker_output=sys.argv[2]) as pool:
    pool.call("say", {"text": "hello from the worker"})
    try:
        pool.call("die", {"status": 3})
    except wirepool.WorkerExited as e:
        print("tail:", repr(e.stderr_tail), flush=True)
"""


@pytest.mark.parametrize("mode", ["log", "inherit", "discard"])
def test_worker_output_modes_with_default_logging(mode: str) -> None:
    """Issue 15: by default a worker's prints show (the parent logs them at WARNING with the
    worker's id, which Python's default logging prints); ``inherit`` passes them through
    unprefixed; ``discard`` drops them. A program with no logging set up, as a user's."""
    done = subprocess.run([sys.executable, "-c", WORKER_OUTPUT_PROGRAM, BASIC, mode],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    err = done.stderr
    out = "\n".join(line for line in done.stdout.splitlines() if not line.startswith("tail:"))
    said = "hello from the worker"
    if mode == "log":
        assert re.search(r"\[worker \d+ pid \d+ stdout\] hello from the worker", err), err
        assert re.search(r"\[worker \d+ pid \d+ stderr\] hello from the worker", err), err
        assert said not in out
    elif mode == "inherit":
        assert out.splitlines() == [said] and said in err.splitlines(), (out, err)
        assert "[worker" not in err
    else:
        assert said not in out and said not in err, (out, err)
    # The stderr tail that errors carry is kept unless the output is inherited.
    tail_kept = "dying on purpose" in done.stdout
    assert tail_kept == (mode != "inherit"), out


def test_max_in_flight_above_the_workers_offer_is_clamped_and_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """PROTOCOL.md 4.2 / issue 10: the parent clamps to the worker's max_concurrency and says
    so once per pool, not at every worker start (a replacement included)."""
    env = dict(os.environ, MAX_CONCURRENCY="4")
    with caplog.at_level(logging.WARNING, logger="wirepool.pool"):
        with wirepool.Pool([sys.executable, BASIC], workers=2, max_in_flight=64, env=env,
                           restart_backoff=0.01) as p:
            assert {w["worker_id"] for w in p.metrics()["workers"]}
            with pytest.raises(wirepool.WorkerExited):
                p.call("die", {"status": 1})
            wait_until(lambda: len(p.pids) == 2)
            assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}
    said = [r for r in caplog.records if "above the worker's max_concurrency" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "max_in_flight 64 is above the worker's max_concurrency 4: using 4" in said[0].getMessage()


def test_require_names_a_codec_per_method() -> None:
    """Issue 15: ``require`` can name each method's codec (Rust's require_method_with_codec)."""
    with pool(require={"add": ("unary", "msgpack"), "rows": "stream"}) as p:
        assert p.call("add", {"a": 1, "b": 1}, codec="msgpack") == {"sum": 2}
    with pytest.raises(wirepool.ProtocolError) as e:
        pool(require={"add": ("unary", "cbor")})
    assert e.value.code == wirepool.ErrorCode.CODEC_MISMATCH
    assert "does not accept codec 'cbor'" in e.value.message
    with pytest.raises(ValueError):
        pool(require={"add": "sideways"})
    with pytest.raises(ValueError):
        pool(worker_output="tee")


def test_blocking_call_result_is_freed_without_the_cyclic_gc() -> None:
    """A result dropped by the caller is freed at once (no reference cycle through the call's
    bookkeeping), so a large payload's buffer can be reused by the next frame."""
    import gc
    import weakref
    with pool() as p:
        gc.disable()
        try:
            for _ in range(2):
                result = p.call("echo", b"z" * 300_000, codec="raw")
                assert bytes(result) == b"z" * 300_000
                gone = weakref.ref(result)
                del result
                assert gone() is None
        finally:
            gc.enable()


def test_lease_is_exclusive_and_sticky() -> None:
    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=2) as p:
            async with p.lease() as w:
                pids = {await w.call("pid", {}) for _ in range(5)}
                assert pids == {w.pid}
                others = {await p.call("pid", {}) for _ in range(5)}
                assert w.pid not in others
    asyncio.run(main())


def test_lease_worker_death_in_flight_is_worker_exited_then_lease_lost() -> None:
    """As the Rust parent: the call in flight when the leased worker dies ends WORKER_EXITED,
    later calls through the lease LEASE_LOST; both say how it died."""
    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=2) as p:
            async with p.lease() as w:
                with pytest.raises(wirepool.WorkerExited) as died:
                    await w.call("die", {"status": 9})
                assert type(died.value) is wirepool.WorkerExited
                assert died.value.code == wirepool.ErrorCode.WORKER_EXITED
                for _ in range(2):  # every later call, not just the first
                    with pytest.raises(wirepool.LeaseLost) as lost:
                        await w.call("add", {"a": 1, "b": 2})
                    assert lost.value.code == wirepool.ErrorCode.LEASE_LOST
                    for err in (died.value, lost.value):
                        assert err.exit_status == 9 and err.signal is None
                        assert "dying on purpose" in err.stderr_tail
                    assert "status 9" in str(lost.value)
                with pytest.raises(wirepool.LeaseLost):
                    w.stream("rows", {"n": 3})
            assert await p.call("add", {"a": 1, "b": 2}) == {"sum": 3}  # the pool serves on
    asyncio.run(main())


def test_many_concurrent_calls_async() -> None:
    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=2, max_in_flight=8) as p:
            results = await asyncio.gather(*(p.call("add", {"a": i, "b": i}) for i in range(500)))
            assert results == [{"sum": 2 * i} for i in range(500)]
    asyncio.run(main())


def test_worker_dies_with_its_parent(tmp_path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time, wirepool\n"
        f"p = wirepool.Pool([sys.executable, {BASIC!r}], workers=2)\n"
        "print(' '.join(map(str, p.pids)), flush=True)\n"
        "time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(wirepool.__file__)))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert len(pids) == 2
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.02)
        assert not any(_alive(p) for p in pids), "workers outlived their parent"
    finally:
        parent.kill()
        parent.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_recycle_by_rss_fails_nothing() -> None:
    with pool(max_rss_bytes=1, heartbeat_ms=50) as p:  # every worker is "too big" at once
        first = p.call("pid", {})
        wait_until(lambda: p.metrics().get("recycled", 0) >= 1)
        for _ in range(5):
            assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}
        assert p.metrics().get("errors", 0) == 0
        wait_until(lambda: first not in p.pids)


def test_recycle_when_idle() -> None:
    with pool(idle_timeout=0.1, heartbeat_ms=50) as p:
        first = p.call("pid", {})
        wait_until(lambda: p.metrics().get("recycled", 0) >= 1)
        assert p.call("pid", {}) != first


def test_restart_intensity_limit_stops_restarting() -> None:
    with pool(max_restarts=2, restart_window=60, restart_backoff=0.01) as p:
        for _ in range(3):
            with pytest.raises(wirepool.WorkerExited):
                p.call("die", {"status": 1})
        # PROTOCOL.md 17: past its restart limit the pool closes, and says why.
        with pytest.raises(wirepool.PoolClosed) as e:
            p.call("add", {"a": 1, "b": 1}, timeout=10)
        assert "restart intensity" in e.value.message


def test_a_pool_that_gave_up_fails_fast_without_growing() -> None:
    """Issue 12.2: once the restart limit trips, each call gets a fresh exception (a saved one
    re-raised grew its traceback on every raise: 28 -> 846 MB in 30 s) that names the limit."""
    with pool(max_restarts=2, restart_window=60, restart_backoff=0.01) as p:
        for _ in range(3):
            with pytest.raises(wirepool.WorkerExited):
                p.call("die", {"status": 1})
        seen: list[BaseException] = []
        for _ in range(200):
            with pytest.raises(wirepool.PoolClosed) as e:
                p.call("add", {"a": 1, "b": 1}, timeout=10)
            seen.append(e.value)
        assert len({id(err) for err in seen}) == len(seen)  # never the same object twice
        depths = [len(traceback.extract_tb(err.__traceback__)) for err in seen]
        assert max(depths) == min(depths), depths[:5] + depths[-5:]
        message = seen[-1].message  # type: ignore[attr-defined]
        assert "restart intensity exceeded: 3 worker deaths within 60s" in message, message
        assert "max_restarts 2" in message, message


def test_row_too_large_ends_only_that_stream() -> None:
    with pool(max_frame_size=65536) as p:
        with pytest.raises(wirepool.RowTooLarge):
            list(p.stream("big_row", {"size": 70_000}))
        assert p.call("add", {"a": 1, "b": 1}) == {"sum": 2}


def test_progress_events_on_unary_call() -> None:
    seen: list[object] = []
    with pool() as p:
        assert p.call("progress", {"n": 30}, on_event=lambda t, d: seen.append(d)) == {"done": 30}
    assert seen and seen[-1] == {"i": 29} and len(seen) <= 30


def test_dropping_an_async_stream_cancels_it() -> None:
    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=1, initial_credit=65536) as p:
            async for row in p.stream("endless", {}):
                if row["i"] == 100:
                    break  # the Stream object is dropped here, never closed explicitly
            for _ in range(500):
                if not p.metrics()["workers"][0]["in_flight"]:
                    break
                await asyncio.sleep(0.01)
            assert p.metrics()["workers"][0]["in_flight"] == 0
            assert await p.call("add", {"a": 1, "b": 1}) == {"sum": 2}
    asyncio.run(main())


def test_map_yields_every_result_in_order() -> None:
    with pool(workers=2, max_in_flight=4) as p:
        for method in ("add_inline", "add", "add_async"):
            got = list(p.map(method, ({"a": i, "b": 1} for i in range(3000)), window=7))
            assert got == [{"sum": i + 1} for i in range(3000)]
        assert list(p.map("add", [])) == []
        assert all(w["in_flight"] == 0 for w in p.metrics()["workers"])


def test_map_raises_each_error_at_its_place() -> None:
    with pool(workers=2) as p:
        reqs = [{"a": 1, "b": 1}, {"a": 2, "b": 2}, {"fail": True}, {"a": 3, "b": 3}]
        it = p.map("add_inline", reqs)
        assert next(it) == {"sum": 2} and next(it) == {"sum": 4}
        with pytest.raises(wirepool.WorkerError) as e:
            next(it)
        assert e.value.code == 1001
        it = p.map("echo", [1, object(), 3])
        assert next(it) == 1
        with pytest.raises(wirepool.BadRequest):  # does not encode as JSON
            next(it)
        # Leaving a map early stops it; the pool keeps serving.
        for i, r in enumerate(p.map("echo", range(100_000), window=4)):
            if i == 10:
                break
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}
        wait_until(lambda: all(w["in_flight"] == 0 for w in p.metrics()["workers"]))


def test_map_queues_behind_busy_workers_and_fails_after_close() -> None:
    p = pool(workers=1, max_in_flight=1)
    try:
        busy = p.submit("sleep", {"seconds": 0.3})
        assert list(p.map("add", [{"a": i, "b": i} for i in range(5)])) == [
            {"sum": 2 * i} for i in range(5)]
        assert busy.result(timeout=10) == {"slept": 0.3}
        assert p.call("add_inline", {"a": 1, "b": 1}) == {"sum": 2}  # the direct path again
    finally:
        p.close()
    with pytest.raises(wirepool.PoolClosed):
        list(p.map("add", [{"a": 1, "b": 1}]))
    with pytest.raises(wirepool.PoolClosed):
        p.call("add", {"a": 1, "b": 1})


def test_async_map_yields_in_order_and_raises_in_place() -> None:
    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=2, max_in_flight=4) as p:
            got = [r async for r in p.map("add_inline", ({"a": i, "b": 2} for i in range(2000)),
                                           window=5)]
            assert got == [{"sum": i + 2} for i in range(2000)]
            seen = []
            with pytest.raises(wirepool.WorkerError):
                async for r in p.map("add_inline", [{"a": 1, "b": 1}, {"fail": True},
                                                    {"a": 2, "b": 2}]):
                    seen.append(r)
            assert seen == [{"sum": 2}]
            assert await p.call("add", {"a": 1, "b": 2}) == {"sum": 3}
    asyncio.run(asyncio.wait_for(main(), 30))


def test_error_details_larger_than_a_frame_keep_the_code_and_message() -> None:
    with pool(max_frame_size=65536) as p:
        with pytest.raises(wirepool.WorkerError) as e:
            p.call("fail", {"thing": "x" * 100_000})
        assert e.value.code == 1042 and e.value.message == "no such thing"
        assert e.value.details["truncated"] is True
        assert e.value.details["details_bytes"] > 100_000
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}


# -- the batched fast paths (Pool.map / AsyncPool.map, inline handlers, one read at a time) -----


@pytest.mark.parametrize("method", ["item_inline", "item"])
def test_map_keeps_order_with_many_in_flight(method: str) -> None:
    with pool(workers=3, max_in_flight=32) as p:
        n = 20_000
        got = list(p.map(method, ({"v": i} for i in range(n)), window=96))
        assert got == list(range(n))
        # A window wider than the pool's room: the rest queue in the map, still in order.
        got = list(p.map(method, ({"v": i} for i in range(3000)), window=500))
        assert got == list(range(3000))
        assert in_flight(p) == 0
        m = p.metrics()
        assert m["calls"] == m["completed"] == n + 3000


@pytest.mark.parametrize("method", ["item_inline", "item"])
def test_map_errors_mixed_with_results_each_typed_at_its_place(method: str) -> None:
    with pool(workers=2, max_in_flight=8) as p:
        reqs = [{"v": i, "fail": i % 7 == 3} for i in range(500)]
        got: list = []
        errors: list = []
        start = 0
        # map raises the first failed call's error at its place; resume after it each time.
        while start < len(reqs):
            try:
                for r in p.map(method, reqs[start:]):
                    got.append(r)
                    start += 1
            except wirepool.WorkerError as e:
                errors.append(e)
                got.append(None)
                start += 1
        assert got == [None if i % 7 == 3 else i for i in range(500)]
        assert [e.details["v"] for e in errors] == [i for i in range(500) if i % 7 == 3]
        assert all(e.code == 1003 for e in errors)


def test_inline_result_larger_than_a_frame_and_handler_errors_take_the_general_path() -> None:
    with pool(max_frame_size=65536) as p:
        big = [{"v": 0}, {"v": 1, "size": 200_000}, {"v": 2}]
        got = list(p.map("item_inline", big))
        assert got[0] == 0 and got[2] == 2 and got[1] == "x" * 200_000
        it = p.map("add_inline", [b"raw bytes have no .get", b"x"], codec="raw")
        with pytest.raises(wirepool.WirepoolError) as e:  # raised inside the fast loop
            next(it)
        assert e.value.code == wirepool.ErrorCode.HANDLER_ERROR
        assert "AttributeError" in e.value.message
        assert list(p.map("item_inline", [{"v": 5}] * 10)) == [5] * 10


@pytest.mark.parametrize("method", ["item_inline", "item"])
def test_crash_during_a_fast_map_is_one_worker_exited_per_outstanding_call(method: str) -> None:
    with pool(workers=1, max_in_flight=64, restart_backoff=0.01) as p:
        reqs = [{"v": i, "exit": i == 300} for i in range(2000)]
        it = p.map(method, reqs, window=64)
        got = []
        with pytest.raises(wirepool.WorkerExited) as e:
            for r in it:
                got.append(r)
        # In order up to the crash; answers the worker had not written yet when it died (the
        # inline loop writes a read's answers together) end as WorkerExited too.
        assert got == list(range(len(got))) and len(got) <= 300
        assert e.value.exit_status == 7
        # Every call sent ended exactly once: with its result, or (sent to the dead worker and
        # unanswered) with its own WorkerExited; none hangs.
        def ended() -> bool:
            m = p.metrics()
            return m["completed"] + m["errors"] == m["calls"]
        wait_until(ended)
        m = p.metrics()
        assert m["errors"] >= 1 and len(got) <= m["completed"] and m["calls"] <= 2000
        # The replacement serves a fast map again.
        assert list(p.map(method, ({"v": i} for i in range(500)))) == list(range(500))


def test_crash_during_an_async_fast_map() -> None:
    async def main() -> None:
        async with wirepool.AsyncPool([sys.executable, BASIC], workers=2, max_in_flight=32,
                                      restart_backoff=0.01) as p:
            got = []
            with pytest.raises(wirepool.WorkerExited):
                async for r in p.map("item_inline", ({"v": i, "exit": i == 700}
                                                     for i in range(3000))):
                    got.append(r)
            assert got == list(range(len(got))) and len(got) <= 700
            for _ in range(1000):
                if not any(w["in_flight"] for w in p.metrics()["workers"]):
                    break
                await asyncio.sleep(0.01)
            assert not any(w["in_flight"] for w in p.metrics()["workers"])
            assert [r async for r in p.map("item_inline", ({"v": i} for i in range(100)))] \
                == list(range(100))
    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("method", ["item_inline", "item"])
def test_closing_a_fast_map_stops_sending_the_rest(method: str) -> None:
    with pool(workers=2, max_in_flight=16) as p:
        n = 1_000_000
        it = p.map(method, ({"v": i} for i in range(n)), window=32)
        for i, r in enumerate(it):
            assert r == i
            if i == 2000:
                break
        it.close()
        wait_until(lambda: in_flight(p) == 0)
        calls = p.metrics()["calls"]
        assert calls < 2000 + 4 * 32 + 1  # at most the window and the lookahead beyond it
        assert p.metrics()["calls"] == calls  # nothing more is sent after close
        assert list(p.map(method, [{"v": 1}, {"v": 2}])) == [1, 2]


def test_map_with_timeout_keeps_deadlines() -> None:
    with pool(workers=1, max_in_flight=4) as p:
        got = list(p.map("item_inline", ({"v": i} for i in range(200)), timeout=5))
        assert got == list(range(200))
        it = p.map("sleep_stubborn", [{"seconds": 5}], timeout=0.1)
        t0 = time.monotonic()
        with pytest.raises(wirepool.DeadlineExceeded):
            next(it)
        assert time.monotonic() - t0 < 4


def test_plain_handlers_of_one_read_still_run_concurrently() -> None:
    with pool(workers=1, max_in_flight=8) as p:
        # Eight calls that can only finish together: each needs its own handler thread.
        assert list(p.map("meet", [{"name": "a", "n": 8}] * 8)) == ["a"] * 8
        # A slow handler does not hold up the fast ones queued behind it in the same read.
        slow = p.submit("sleep_stubborn", {"seconds": 3})
        assert list(p.map("add", ({"a": i, "b": 0} for i in range(50)))) == [
            {"sum": i} for i in range(50)]
        assert not slow.done()
        assert slow.result(timeout=10) == {"slept": 3}


def test_a_picked_worker_is_taken_from_blocking_callers(worker_argv: list[str]) -> None:
    """issue 24: a map once failed an item with OVERLOADED from the parent's own core. The loop
    picked a parked worker, a blocking caller's thread claimed it before the loop reclaimed it
    (the core then counted the caller's request, ``requests`` did not), and the burst sized by
    ``requests`` overran max_in_flight. Here the caller's claim lands exactly in that gap."""
    from wirepool._pooled_worker import _LOOP, _PARKED

    with wirepool.Pool(worker_argv, workers=1) as p:
        ap = p._apool
        w = ap.workers[0]
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}

        async def pick() -> Any:
            w._park_if_idle()
            assert w.direct == _PARKED
            return ap._pick()
        assert p._run(pick) is w
        assert w.direct == _LOOP and not w.claim_for_caller()  # picked: no caller may take it

        async def race() -> Any:
            w._park_if_idle()
            assert w.direct == _PARKED
            scan = ap._least_loaded

            def claimed_after_scan() -> Any:
                ap._least_loaded = scan  # type: ignore[method-assign]  # once
                best = scan()
                assert best is w and w.claim_for_caller()  # the caller's thread, right now
                return best
            ap._least_loaded = claimed_after_scan  # type: ignore[method-assign]
            try:
                return ap._pick()
            finally:
                ap._least_loaded = scan  # type: ignore[method-assign]
                w.release_from_caller()
        assert p._run(race) is None  # the caller holds the only worker: none has room
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}
