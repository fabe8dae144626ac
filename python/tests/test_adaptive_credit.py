"""The adaptive stream window of PROTOCOL.md 6 in the Python parent (issue 29): a remote worker
behind ``conformance/tools/delay_relay.py`` at 50 ms each way (TLS end to end through it).

- A stream the window limits gets a window above ``initial_credit`` (and within the 16 MiB cap)
  once the parent has measured the round trip with its PING right after WELCOME.
- A slow consumer keeps the window at ``initial_credit`` and holds the producer to it: what the
  worker has produced stays within the rows read plus the window, a frame and the worker's own
  batch.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import wirepool
from wirepool import _constants
from wirepool.launchers import Subprocess

pytest.importorskip("cryptography")
pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
DELAY_MS = 50
ROW = 4096
MIB = 1 << 20


def _argv() -> list[str]:
    return [sys.executable, str(REPO / "conformance" / "tools" / "delay_relay.py"), "--worker",
            "--cap", str(64 * MIB), str(DELAY_MS), "--", sys.executable,
            str(REPO / "python" / "conformance" / "worker.py")]


def _pool() -> wirepool.Pool:
    return wirepool.Pool(_argv(), workers=1, launcher=Subprocess(), startup_timeout=30)


def test_a_window_limited_stream_gets_a_window_above_initial_credit() -> None:
    with _pool() as p:
        assert p.call("add", {"a": 1, "b": 2}) == {"sum": 3}
        w = p._apool.workers[0]
        n, widest, rows = 4000, 0, 0
        for row in p.stream("raw_rows", f"{n} {ROW}".encode(), codec="raw"):
            assert len(row) == ROW
            rows += 1
            if rows % 64 == 0:  # the loop thread owns the core; an int read is safe
                for id in w.conn.in_flight_ids():
                    widest = max(widest, w.conn.window(id))
        assert rows == n
        rtt = w.conn._min_rtt_us
    assert rtt >= 2 * DELAY_MS * 1000, f"the round trip {rtt} us did not go through the relay"
    initial = p._apool.initial_credit
    assert initial == _constants.PARENT_DEFAULT_INITIAL_CREDIT
    assert initial < widest <= _constants.MAX_STREAM_WINDOW, widest


def test_a_slow_consumer_keeps_the_window_and_holds_the_producer_to_it() -> None:
    with _pool() as p:
        w = p._apool.workers[0]
        produced_ahead, widest = [], 0
        stream = iter(p.stream("raw_rows", f"{100_000} {ROW}".encode(), codec="raw"))
        for rows in range(1, 641):
            next(stream)
            if rows % 128 == 0:  # half a window drains in over a second: a slow consumer
                for id in w.conn.in_flight_ids():
                    widest = max(widest, w.conn.window(id))
                produced_ahead.append(p.call("raw_rows_produced", None) - rows)
            # The consumer's pace, not a synchronisation: 128 rows (half a window) take >= 0.5 s,
            # more than 2 round trips, so the window must not grow.
            time.sleep(0.004)
        del stream
        initial, mfs = p._apool.initial_credit, p._apool.max_frame_size
    assert widest == initial, widest
    # Unread rows: at most the window and one frame in flight, plus the worker's batch being
    # filled and the rows its SDK holds for credit (one batch).
    bound = (initial + mfs + 2 * 262_144) // ROW
    assert max(produced_ahead) <= bound, (produced_ahead, bound)
