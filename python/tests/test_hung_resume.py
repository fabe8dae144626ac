"""A worker frozen (SIGSTOP) past its heartbeat limit and resumed around the moment the parent
replaces it: its request ends exactly once, WORKER_HUNG whenever the parent judged it hung, and
a late answer sent after the resume is never delivered instead (PROTOCOL.md 8.5, 12.2).

The resume delay is the race being tested, not a synchronisation: each delay may land before
or after the parent's judgement, and the assertions hold either way.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import wirepool
from wirepool.errors import ErrorCode, WirepoolError

WORKER = [sys.executable, str(Path(__file__).resolve().parent / "workers" / "freeze_resume.py")]
HEARTBEAT_MS = 100  # hung after 3 x 100 ms without a PONG


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2:].split()[0]


def _resume_when_stopped(pid: int, delay: float, sent: list[float]) -> None:
    """SIGCONT ``pid`` ``delay`` seconds after it stopped itself (bounded: 10 s)."""
    end = time.monotonic() + 10
    while _state(pid) not in ("T", "t", "gone") and time.monotonic() < end:
        time.sleep(0.001)
    time.sleep(delay)
    try:
        os.kill(pid, signal.SIGCONT)
        sent.append(time.monotonic())
    except ProcessLookupError:
        pass  # already killed as hung: nothing left to resume


@pytest.mark.timeout(60)
@pytest.mark.parametrize("resume_after", [0.15, 0.25, 0.3, 0.31, 0.32, 0.33, 0.36, 0.4, 0.5, 0.8])
def test_frozen_worker_resumed_while_replaced_ends_once(resume_after: float,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="wirepool.pool")
    with wirepool.Pool(WORKER, workers=1, heartbeat_ms=HEARTBEAT_MS, restart_backoff=0.01) as p:
        pid = p.call("whoami", None)
        sent: list[float] = []
        resumer = threading.Thread(target=_resume_when_stopped, args=(pid, resume_after, sent))
        resumer.start()
        outcomes: list[object] = []
        try:
            outcomes.append(p.call("freeze_then_answer", None))
        except WirepoolError as e:
            outcomes.append(e.code)
        resumer.join(15)
        assert not resumer.is_alive()
        hung = [r.getMessage() for r in caplog.records
                if f"worker pid {pid} hung" in r.getMessage()]
        if hung:
            # Judged hung: the one outcome is WORKER_HUNG, never the answer sent after resuming.
            assert outcomes == [ErrorCode.WORKER_HUNG], (outcomes, hung)
            assert len(hung) == 1, hung
            assert p.call("whoami", None) != pid, "the hung worker was replaced"
        else:
            # Resumed before the judgement: it was never hung, and its answer is the outcome.
            assert outcomes == ["late"], outcomes
            assert p.call("whoami", None) == pid
        m = p.metrics()
        assert m.get("errors", 0) == (1 if hung else 0), m
        assert sum(w["in_flight"] for w in m["workers"]) == 0, m
        assert [w["alive"] for w in m["workers"] if w["pid"] != pid] in ([True], []), m
