"""Worker MUSTs that no parent scenario can see (PROTOCOL.md 8.4, 8.5; issue 23 part 4).

A parent SDK hides them: it reads the exit status only for reports, and a PONG that came late
but within 3 heartbeats passes. So a scripted parent of raw frames (stdlib only, no SDK) drives
each language's conformance worker (``languages.json``) and checks them directly:

- **PONG ahead of a large queued output** (8.5): after a 48 MiB echo's RESULT has begun, a PING
  is answered within a fixed number of bytes (the handed-ahead bound of ``spec/constants.json``,
  the socket buffers and one frame), not after the whole message.
- **Exit statuses** (8.4): 0 after DRAIN and GOODBYE 0; 0 after end of file; 1 after an ERROR id 0
  from the parent (refused handshake or fatal error) and after a violation the worker detects
  itself (an unknown frame type: it SHOULD say ERROR id 0 code 103 first).
- **The parent-death signal** (8.4): a worker busy in a handler dies when the process that
  started it dies while its connection stays open (someone else holds the parent's end: no
  end of file to notice). A runtime without the signal (Node) checks its parent's pid.

Each check is shown to fail on a mutant: the hostile worker (``hostile/hostile_worker.py``) with
one of its ``PROBE_MUTANTS`` modes breaks exactly that MUST, and passes every check without it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import test_matrix as matrix

HERE = Path(__file__).resolve().parent
CONSTANTS = json.loads((matrix.REPO / "spec" / "constants.json").read_text(encoding="utf-8"))
HANDED_AHEAD = CONSTANTS["driver"]["max_handed_ahead_bytes"]
HOSTILE = [sys.executable, str(HERE / "hostile" / "hostile_worker.py")]

HEADER = struct.Struct("<IBBHQ")
MORE = 1
HELLO, WELCOME, REQUEST, RESULT, ERROR, PING, PONG = 0x01, 0x02, 0x10, 0x12, 0x13, 0x31, 0x32
DRAIN, GOODBYE, CONTINUATION = 0x40, 0x41, 0x7F
RAW = 0

START_S = 60.0  # a cold interpreter on a loaded 2-vCPU machine
EXIT_S = 15.0  # the worker's exit after its cue; the SDKs take milliseconds
ECHO_BYTES = 48 << 20
FRAME = 1 << 20  # the max_frame_size the probe welcomes every worker with
SOCKET_BUFFER = 256 << 10  # asked for on both ends; the kernel doubles it (read back below)

pytestmark = pytest.mark.timeout(matrix.BUILD_TIMEOUT_S + 300)


@dataclass
class Frame:
    type: int
    flags: int
    id: int
    payload: bytes
    at: int  # the stream offset of its first byte


@dataclass
class Probe:
    """A scripted parent: one worker on a socketpair, raw frames both ways."""

    proc: subprocess.Popen
    sock: socket.socket
    stderr: object
    buf: bytearray = field(default_factory=bytearray)
    received: int = 0  # bytes read from the worker so far
    methods: dict[str, int] = field(default_factory=dict)

    def send(self, ftype: int, fid: int, payload: bytes = b"", flags: int = 0) -> None:
        self.sock.sendall(HEADER.pack(len(payload), ftype, flags, 0, fid) + payload)

    def fill(self, deadline: float, most: int = 1 << 20) -> bool:
        """Reads what arrives before ``deadline``; False at end of file."""
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.sock], [], [], left)[0]:
            raise AssertionError(f"the worker sent nothing within the bound{self.tail()}")
        data = self.sock.recv(most)
        if not data:
            return False
        self.buf += data
        self.received += len(data)
        return True

    def frame(self, timeout: float) -> Frame | None:
        """The next whole frame, or None at end of file."""
        deadline = time.monotonic() + timeout
        while len(self.buf) < 16 or len(self.buf) < 16 + HEADER.unpack_from(self.buf)[0]:
            if not self.fill(deadline):
                return None
        length, ftype, flags, _, fid = HEADER.unpack_from(self.buf)
        at = self.received - len(self.buf)
        payload = bytes(self.buf[16:16 + length])
        del self.buf[:16 + length]
        return Frame(ftype, flags, fid, payload, at)

    def handshake(self) -> None:
        hello = self.frame(START_S)
        assert hello is not None and hello.type == HELLO, f"no HELLO{self.tail()}"
        p = hello.payload
        _, _, _, concurrency, max_frame = struct.unpack_from("<HHIII", p, 8)
        at = 24
        for _ in range(2):  # sdk_name, sdk_version
            at += 2 + struct.unpack_from("<H", p, at)[0]
        (count,) = struct.unpack_from("<H", p, at)
        at += 2
        for number in range(count):
            codecs = p[at + 1]
            at += 2 + codecs
            (size,) = struct.unpack_from("<H", p, at)
            self.methods[p[at + 2:at + 2 + size].decode()] = number
            at += 2 + size
        self.send(WELCOME, 0, struct.pack("<HHIIIIIQ", 1, 0, 1, min(FRAME, max_frame),
                                          1 << 20, 0, min(8, concurrency), 1 << 30))

    def exit_status(self, timeout: float = EXIT_S) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")[-1500:]
        return f"; the worker's stderr: {text!r}" if text else ""


def worker_argv(lang: str) -> list[str]:
    if lang == "hostile":
        return HOSTILE
    error = matrix.build(lang)
    assert error is None, error
    return matrix.expand(matrix.BY_NAME[lang]["worker"])


def start(argv: list[str], env: dict[str, str], via_middle: bool = False):
    """Starts the worker with the child end of a socketpair in WIREPOOL_FD; ``via_middle``
    starts it from a short-lived middle process instead and returns that process too."""
    ours, theirs = socket.socketpair()
    for s, opt in ((theirs, socket.SO_SNDBUF), (ours, socket.SO_RCVBUF)):
        s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
    env = {**os.environ, **env, "WIREPOOL_FD": str(theirs.fileno())}
    stderr = tempfile.TemporaryFile()
    if via_middle:
        # The middle starts the worker, says its pid and waits to be killed: it is the
        # worker's parent, while this test keeps the parent's end of the socket open.
        code = ("import os, subprocess, sys, time\n"
                "p = subprocess.Popen(sys.argv[1:], pass_fds=[int(os.environ['WIREPOOL_FD'])],"
                " stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)\n"
                "print(p.pid, flush=True)\n"
                "time.sleep(3600)\n")
        proc = subprocess.Popen([sys.executable, "-c", code, *argv], env=env,
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
    else:
        proc = subprocess.Popen(argv, env=env, pass_fds=[theirs.fileno()],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=stderr, start_new_session=True)
    theirs.close()
    return Probe(proc, ours, stderr)


def stop(probe: Probe) -> None:
    probe.sock.close()
    try:
        os.killpg(probe.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    probe.proc.wait()
    probe.stderr.close()


def probe_of(lang: str, mutant: str | None, tmp_path: Path) -> Probe:
    env = {"HOSTILE_MODE": mutant, "HOSTILE_STATE": str(tmp_path)} if mutant else {}
    return start(worker_argv(lang), env)


# ---------------------------------------------------------------------------------------------
# The checks: each returns None when the MUST holds, else what broke it
# ---------------------------------------------------------------------------------------------


def pong_ahead_of_a_large_result(p: Probe) -> str | None:
    p.handshake()
    assert not p.buf, "the worker sent more than its HELLO before the echo"
    method = p.methods["echo"]
    body = bytes(range(256)) * (ECHO_BYTES // 256)
    first = FRAME - 12
    p.send(REQUEST, 1, struct.pack("<HBBQ", method, RAW, 0, 0) + body[:first], MORE)
    for at in range(first, len(body), FRAME):
        last = at + FRAME >= len(body)
        p.send(CONTINUATION, 1, body[at:at + FRAME], 0 if last else MORE)
    # Wait for the RESULT to begin (the whole answer is then queued at the worker), read no
    # further, then ping: the PONG may wait behind what is already in flight, not behind it all.
    deadline = time.monotonic() + START_S
    handshake_end = p.received
    while p.received == handshake_end:
        assert p.fill(deadline, most=16), f"end of file before the RESULT{p.tail()}"
    pinged_at = p.received
    p.send(PING, 0, b"probe-01")
    buffers = (p.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) + 2 * SOCKET_BUFFER)
    bound = HANDED_AHEAD + buffers + 2 * (16 + FRAME)
    got = 0
    pong_at = None
    while got < len(body):
        f = p.frame(START_S)
        assert f is not None, f"end of file inside the echo{p.tail()}"
        if f.type == PONG:
            assert f.payload == b"probe-01", f"PONG with another nonce: {f.payload!r}"
            pong_at = f.at
        elif f.type in (RESULT, CONTINUATION) and f.id == 1:
            got += len(f.payload)
        else:
            return f"unexpected frame type 0x{f.type:02x} id {f.id}"
    assert got == len(body)
    if pong_at is None:
        f = p.frame(START_S)
        assert f is not None and f.type == PONG, f"no PONG after the echo{p.tail()}"
        pong_at = f.at
    late = pong_at - pinged_at
    if late > bound:
        return (f"the PONG came {late:,} bytes after the PING, behind the queued output "
                f"(bound {bound:,}: {HANDED_AHEAD:,} handed ahead, {buffers:,} of socket "
                f"buffers, two frames)")
    return None


def drain_goodbye_exits_0(p: Probe) -> str | None:
    p.handshake()
    p.send(DRAIN, 0, struct.pack("<I", 0))
    while (f := p.frame(EXIT_S)) is not None:
        if f.type == GOODBYE:
            (reason,) = struct.unpack_from("<I", f.payload)
            if reason != 0:
                return f"GOODBYE {reason} after DRAIN, not 0"
    status = p.exit_status()
    return None if status == 0 else f"exit status {status} after GOODBYE 0, not 0"


def end_of_file_exits_0(p: Probe) -> str | None:
    p.handshake()
    p.sock.shutdown(socket.SHUT_RDWR)
    status = p.exit_status()
    return None if status == 0 else f"exit status {status} after end of file, not 0"


def error_0_from_the_parent_exits_1(p: Probe) -> str | None:
    p.handshake()
    p.send(ERROR, 0, struct.pack("<I", 100) + struct.pack("<H", 13) + b"probe: fatal!")
    status = p.exit_status()
    return None if status == 1 else f"exit status {status} after ERROR id 0, not 1"


def refused_handshake_exits_1(p: Probe) -> str | None:
    hello = p.frame(START_S)
    assert hello is not None and hello.type == HELLO, f"no HELLO{p.tail()}"
    p.send(ERROR, 0, struct.pack("<I", 118) + struct.pack("<H", 15) + b"probe: refused!")
    status = p.exit_status()
    return None if status == 1 else f"exit status {status} after a refused handshake, not 1"


def detected_violation_exits_1(p: Probe) -> str | None:
    p.handshake()
    p.send(0x55, 0, b"?")  # no such frame type (103 UNKNOWN_FRAME_TYPE)
    while (f := p.frame(EXIT_S)) is not None:
        if f.type == ERROR and f.id == 0:
            (code,) = struct.unpack_from("<I", f.payload)
            if code != 103:
                return f"ERROR id 0 code {code} for an unknown frame type, not 103"
        elif f.type != PONG:
            return f"frame type 0x{f.type:02x} after a violation, not ERROR id 0 or nothing"
    status = p.exit_status()
    return None if status == 1 else f"exit status {status} after a violation, not 1"


CHECKS = {
    "pong_ahead_of_a_large_result": (pong_ahead_of_a_large_result, "pong_behind_output"),
    "drain_goodbye_exits_0": (drain_goodbye_exits_0, "goodbye_exits_1"),
    "end_of_file_exits_0": (end_of_file_exits_0, "eof_exits_1"),
    "error_0_from_the_parent_exits_1": (error_0_from_the_parent_exits_1, "fatal_exits_0"),
    "refused_handshake_exits_1": (refused_handshake_exits_1, "fatal_exits_0"),
    "detected_violation_exits_1": (detected_violation_exits_1, "fatal_exits_0"),
}
LANGS = [*matrix.WORKERS, "hostile"]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("lang", LANGS)
def test_worker_keeps_the_must(lang: str, check: str, tmp_path: Path) -> None:
    p = probe_of(lang, None, tmp_path)
    try:
        broken = CHECKS[check][0](p)
        assert broken is None, f"{lang} worker: {broken}{p.tail()}"
    finally:
        stop(p)


@pytest.mark.parametrize("check", CHECKS)
def test_check_fails_on_its_mutant(check: str, tmp_path: Path) -> None:
    run, mutant = CHECKS[check]
    p = probe_of("hostile", mutant, tmp_path)
    try:
        assert run(p) is not None, f"the check passed the {mutant} mutant: it cannot fail"
    finally:
        stop(p)


# ---------------------------------------------------------------------------------------------
# The parent-death signal, with the connection still open
# ---------------------------------------------------------------------------------------------


def dies_with_its_parent(argv: list[str], env: dict[str, str]) -> str | None:
    p = start(argv, env, via_middle=True)
    pidfd = None
    try:
        line = p.proc.stdout.readline()
        assert line.strip().isdigit(), f"the middle process said {line!r}{p.tail()}"
        pidfd = os.pidfd_open(int(line))
        p.handshake()
        if "sleep" in p.methods:  # busy in a handler, not idle in its loop
            p.send(REQUEST, 1, struct.pack("<HBBQ", p.methods["sleep"], 1, 0, 0) + b"60000")
        p.proc.kill()  # the middle, the worker's parent; this test still holds the socket
        p.proc.wait()
        if not select.select([pidfd], [], [], EXIT_S)[0]:
            return (f"the worker lived {EXIT_S:.0f} s past its parent's death (its connection "
                    f"open): no parent-death signal, no check of its parent")
        return None
    finally:
        if pidfd is not None:
            if not select.select([pidfd], [], [], 0)[0]:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
        stop(p)


@pytest.mark.parametrize("lang", LANGS)
def test_worker_dies_with_its_parent_while_the_connection_lives(lang: str,
                                                                 tmp_path: Path) -> None:
    broken = dies_with_its_parent(worker_argv(lang), {})
    assert broken is None, f"{lang} worker: {broken}"


def test_parent_death_check_fails_on_its_mutant(tmp_path: Path) -> None:
    env = {"HOSTILE_MODE": "no_pdeathsig", "HOSTILE_STATE": str(tmp_path)}
    assert dies_with_its_parent(HOSTILE, env) is not None, "the no_pdeathsig mutant passed"
