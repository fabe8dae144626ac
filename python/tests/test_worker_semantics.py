"""The Python worker against a fake parent on a socketpair: the answers of PROTOCOL.md 8.3-8.4
(which terminal, when; drain past its grace; exit statuses) and section 2 (any timeout_us).

The Rust worker has the same tests (rust/wirepool-worker/tests/worker.rs); the conformance
matrix covers the cross-language part (scenarios deadline_answered_for_a_deaf_handler,
shutdown_cancels_past_grace_deaf_handler, deadline_too_large_for_the_clock).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from wirepool import proto
from wirepool.errors import ErrorCode
from wirepool.proto import FrameType

WORKER = Path(__file__).resolve().parent / "workers" / "semantics.py"
JSON = proto.CodecId.JSON
TERMINALS = (FrameType.RESULT, FrameType.ERROR, FrameType.END)


class FakeParent:
    """Spawns the worker on a socketpair and speaks the protocol with a parent core."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        env = dict(os.environ, WIREPOOL_FD=str(theirs.fileno()))
        self.proc = subprocess.Popen([sys.executable, str(WORKER)], env=env,
                                     pass_fds=[theirs.fileno()], stderr=subprocess.PIPE)
        theirs.close()
        self.sock = mine
        self.sock.settimeout(10)
        self.conn = proto.Connection("parent")
        hello = self.next()
        assert hello.TYPE == FrameType.HELLO
        self.methods = {m.name: i for i, m in enumerate(hello.methods)}  # type: ignore[attr-defined]
        self.write(proto.Welcome(worker_id=1, max_frame_size=proto.HANDSHAKE_MAX_FRAME_SIZE,
                                 heartbeat_ms=0, max_in_flight=8))

    def write(self, frame: proto.Frame) -> None:
        # One write: a worker that exits on this frame (ERROR id 0) may be gone before a second
        # write of its parts, which then fails with EPIPE (seen beside another pytest worker).
        self.sock.sendall(b"".join(bytes(part) for part in self.conn.send(frame)))

    def next(self) -> Any:
        """The next event; EOFError when the worker closed the connection."""
        while True:
            ev = self.conn.next_event()
            if ev is not None:
                return ev
            data = self.sock.recv(1 << 16)
            if not data:
                self.conn.end_of_input()
                raise EOFError
            self.conn.receive(data)

    def request(self, method: str, value: Any, timeout_us: int = 0) -> int:
        id, parts = self.conn.send_request(self.methods[method], JSON, timeout_us,
                                           json.dumps(value).encode())
        for part in parts:
            self.sock.sendall(part)
        return id

    def until_terminal(self, id: int) -> list[Any]:
        """Events up to and including request ``id``'s terminal."""
        seen = []
        while True:
            ev = self.next()
            seen.append(ev)
            if ev.id == id and ev.TYPE in TERMINALS:
                return seen

    def exit_status(self) -> int:
        return self.proc.wait(10)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def parent() -> Iterator[FakeParent]:
    p = FakeParent()
    yield p
    p.close()


def code(ev: Any) -> int:
    assert ev.TYPE == FrameType.ERROR, ev
    return int(ev.code)


@pytest.mark.timeout(30)
def test_a_deaf_handler_is_answered_at_its_deadline(parent: FakeParent) -> None:
    started = time.monotonic()
    deaf = parent.request("deaf", 1500, timeout_us=50_000)
    assert code(parent.until_terminal(deaf)[-1]) == ErrorCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 1.2, "answered when the handler returned"
    # Outlive the deaf handler: its late result must not follow.
    later = parent.request("sleep", 2000)
    seen = parent.until_terminal(later)
    assert all(ev.id != deaf for ev in seen), seen
    assert json.loads(bytes(seen[-1].body)) == 2000


@pytest.mark.timeout(30)
def test_cancel_before_the_deadline_keeps_its_code(parent: FakeParent) -> None:
    id = parent.request("deaf", 2000, timeout_us=200_000)
    parent.write(proto.Cancel(id))
    started = time.monotonic()
    assert code(parent.until_terminal(id)[-1]) == ErrorCode.CANCELLED
    assert time.monotonic() - started < 1.5, "the timer, not the handler, ended it"


@pytest.mark.timeout(30)
def test_a_cancel_in_the_same_read_as_its_request_ends_it_cancelled(parent: FakeParent) -> None:
    # An async handler's task is created but has not started when the CANCEL behind its REQUEST
    # is handled: cancelling that task skips the whole coroutine, so no terminal was ever sent
    # (the parent's cancel grace had to kill the worker).
    id, parts = parent.conn.send_request(parent.methods["sleep"], JSON, 0, b"5000")
    parent.sock.sendall(b"".join([*parts, *parent.conn.send(proto.Cancel(id))]))
    started = time.monotonic()
    assert code(parent.until_terminal(id)[-1]) == ErrorCode.CANCELLED
    assert time.monotonic() - started < 2.5, "ended by the handler, not by the CANCEL"
    later = parent.request("sleep", 1)  # the worker still serves
    assert json.loads(bytes(parent.until_terminal(later)[-1].body)) == 1


@pytest.mark.timeout(30)
def test_a_cancelled_handler_that_raises_ends_cancelled(parent: FakeParent) -> None:
    id = parent.request("fail_when_cancelled", None)
    parent.write(proto.Cancel(id))
    assert code(parent.until_terminal(id)[-1]) == ErrorCode.CANCELLED


@pytest.mark.timeout(30)
def test_an_inline_handler_past_its_deadline_answers_deadline_exceeded(parent: FakeParent) -> None:
    id = parent.request("inline_busy", 300, timeout_us=50_000)
    assert code(parent.until_terminal(id)[-1]) == ErrorCode.DEADLINE_EXCEEDED
    id = parent.request("inline_busy", 1, timeout_us=10_000_000)
    assert json.loads(bytes(parent.until_terminal(id)[-1].body)) == 1


@pytest.mark.timeout(30)
def test_the_largest_timeout_is_no_deadline(parent: FakeParent) -> None:
    id = parent.request("sleep", 20, timeout_us=2**64 - 1)
    assert json.loads(bytes(parent.until_terminal(id)[-1].body)) == 20


@pytest.mark.timeout(30)
def test_drain_past_its_grace_answers_at_once_then_goodbye_and_status_0(parent: FakeParent) -> None:
    id = parent.request("deaf", 5000)
    parent.write(proto.Drain(200))
    started = time.monotonic()
    assert code(parent.until_terminal(id)[-1]) == ErrorCode.CANCELLED
    assert parent.next().TYPE == FrameType.GOODBYE
    assert time.monotonic() - started < 2.0, "waited for the deaf handler"
    assert parent.exit_status() == 0


@pytest.mark.timeout(30)
def test_exit_status_0_after_end_of_file(parent: FakeParent) -> None:
    parent.request("deaf", 5000)  # a handler still running does not hold the exit
    parent.sock.shutdown(socket.SHUT_WR)
    assert parent.exit_status() == 0


@pytest.mark.timeout(30)
def test_exit_status_1_after_the_parents_error(parent: FakeParent) -> None:
    parent.write(proto.ErrorFrame(0, ErrorCode.PROTOCOL, "the parent gives up"))
    assert parent.exit_status() == 1


@pytest.mark.timeout(30)
def test_exit_status_1_after_a_protocol_violation(parent: FakeParent) -> None:
    parent.sock.sendall(b"\x00" * 4 + b"\x99" + b"\x00" * 11)  # unknown frame type 0x99
    with pytest.raises(EOFError):
        while True:
            ev = parent.next()
            if ev.TYPE == FrameType.ERROR:
                assert ev.id == 0 and ev.code == ErrorCode.UNKNOWN_FRAME_TYPE
    assert parent.exit_status() == 1


@pytest.mark.timeout(30)
def test_a_ping_behind_the_drain_is_not_answered_after_goodbye(parent: FakeParent) -> None:
    """DRAIN with nothing in flight: GOODBYE goes out at once, and a PING that arrives in the
    same read must not be answered (nothing may follow GOODBYE), nor break the worker."""
    parent.sock.sendall(b"".join(bytes(b) for frame in (proto.Drain(0), proto.Ping(b"12345678"))
                                 for b in parent.conn.send(frame)))
    assert parent.next().TYPE == FrameType.GOODBYE
    with pytest.raises(EOFError):
        ev = parent.next()
        pytest.fail(f"{ev} after GOODBYE")
    assert parent.exit_status() == 0
    assert "Traceback" not in parent.stderr()


def _g_plain():
    yield 1


def _g_bare_return(n):
    for i in range(n):
        if i > 5:
            return
        yield i


def _g_none_explicit():
    yield 1
    return None


def _g_value():
    yield 1
    return 2


def _g_value_in_finally():
    try:
        yield 1
        return "summary"
    finally:
        pass


def _g_value_in_with():
    import contextlib
    with contextlib.nullcontext():
        yield 1
        return "summary"


def _g_conditional(x):
    yield 1
    if x:
        return x


@pytest.mark.parametrize("gen,none_only", [
    (_g_plain(), True), (_g_bare_return(9), True), (_g_none_explicit(), True),
    ((x for x in range(3)), True),
    (_g_value(), False), (_g_value_in_finally(), False), (_g_value_in_with(), False),
    (_g_conditional(1), False),
])
def test_generators_that_may_return_a_summary_are_told_apart(gen, none_only: bool) -> None:
    # A generator whose code can only return None is iterated without the wrapper that keeps
    # its return value; when in doubt the wrapper is kept.
    from wirepool import worker
    assert worker._returns_none_only(gen.gi_code) is none_only
