"""A hostile wirepool worker: raw protocol bytes, no SDK (stdlib only), one misbehaviour per run.

Configured by its environment (set per scenario through the runner's ``worker_env``):

- ``HOSTILE_MODE``: the misbehaviour (the ``MODES`` table below);
- ``HOSTILE_STATE``: a directory private to the scenario. Each process of the scenario takes the
  next incarnation number there (1, 2, ...), so only chosen incarnations misbehave and their
  replacements behave: the pool must go on serving after it replaced the hostile one;
- ``HOSTILE_ON``: the incarnations that misbehave (comma separated, default ``1``);
- ``HOSTILE_ARG``: the mode's number (an exit status, an interval in seconds, a count...).

Start-up modes misbehave before or instead of HELLO. Call modes send a correct HELLO and behave
until the ``hostile`` (unary) or ``hostile_stream`` (stream) method is called; they misbehave in
answer to that call. Otherwise (and in every incarnation not in ``HOSTILE_ON``) the worker is a
correct minimal worker offering ``echo`` (raw, json), ``add``, ``whoami`` (json), ``decls``
(stream, json), and ``hostile`` / ``hostile_stream`` that answer correctly, plus ``big_summary``
(stream, json) and ``hang`` (unary, json: ms -> ms after ms, deaf to its flag, its terminal
decided as spec 8.3 says: at the deadline timer or the return, the flag's code if set) as the
conformance workers have them.

Matrix mutants (``MATRIX_MUTANTS`` in ``test_hostile.py``) misbehave in answer to one of the
matrix's own methods instead: a scenario of ``scenarios.json`` that a correct worker passes must
fail against them (``oversized_summary``: ``big_summary``; ``late_result``: ``hang``).

Probe mutants (``PROBE_MUTANTS``) serve every call right and break one worker MUST that no parent
sees (an exit status, PONG order, the parent-death signal): ``test_worker_musts.py`` must catch
each of them.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import time
from typing import Callable

HEADER = struct.Struct("<IBBHQ")
MORE = 1

HELLO, WELCOME, REQUEST, CANCEL, RESULT, ERROR = 0x01, 0x02, 0x10, 0x11, 0x12, 0x13
ROWS, END, CREDIT, EVENT, PING, PONG = 0x20, 0x21, 0x22, 0x30, 0x31, 0x32
DRAIN, GOODBYE, CONTINUATION = 0x40, 0x41, 0x7F
KNOWN_TYPES = {HELLO, WELCOME, REQUEST, CANCEL, RESULT, ERROR, ROWS, END, CREDIT, EVENT, PING,
               PONG, DRAIN, GOODBYE, CONTINUATION}
RAW, JSON = 0, 1
UNARY, STREAM = 1, 2

# (name, kind, codecs): the index in this list is the method number in REQUEST.
METHODS = [("echo", UNARY, (RAW, JSON)), ("add", UNARY, (JSON,)), ("whoami", UNARY, (JSON,)),
           ("decls", STREAM, (JSON,)), ("hostile", UNARY, (JSON, RAW)),
           ("hostile_stream", STREAM, (JSON,)), ("big_summary", STREAM, (JSON,)),
           ("hang", UNARY, (JSON,))]


def frame(ftype: int, fid: int, payload: bytes = b"", flags: int = 0) -> bytes:
    return HEADER.pack(len(payload), ftype, flags, 0, fid) + payload


def str16(text: bytes) -> bytes:
    return struct.pack("<H", len(text)) + text


def hello_payload(methods: list = METHODS, max_frame_size: int = 16 << 20) -> bytes:
    out = [b"WIREPOOL", struct.pack("<HHIII", 1, 1, os.getpid(), 64, max_frame_size),
           str16(b"hostile-raw"), str16(b"0"), struct.pack("<H", len(methods))]
    for name, kind, codecs in methods:
        out.append(struct.pack("<BB", kind, len(codecs)) + bytes(codecs) + str16(name.encode()))
    return b"".join(out)


def big_summary(body: bytes) -> bytes:
    """``big_summary``'s summary for ``{"size": N}``: the JSON string of the scenarios'
    ``{"string": {"size": N}}`` form (character i = 'a' + (31 i + 17) mod 26)."""
    try:
        n = int(json.loads(body)["size"])
    except (ValueError, KeyError, TypeError):
        n = 0
    return b'"' + bytes(97 + (31 * i + 17) % 26 for i in range(n)) + b'"'


def error_payload(code: int, message: bytes, details: bytes = b"") -> bytes:
    return struct.pack("<I", code) + str16(message) + details


def rows_payload(rows: list[bytes]) -> bytes:
    return struct.pack("<I", len(rows)) + b"".join(struct.pack("<I", len(r)) + r for r in rows)


def end_payload(count: int, summary: bytes = b"") -> bytes:
    return struct.pack("<Q", count) + summary


class Conn:
    """The worker's end of the socket: frames in, frames out, PINGs answered between frames."""

    def __init__(self, sock: socket.socket, mode: str = "") -> None:
        self.sock = sock
        self.mode = mode  # the probe mutants (PROBE_MUTANTS below) bend the exits and PONGs
        self.buf = bytearray()
        self.welcome: dict = {}
        self.credit: dict[int, int] = {}
        self.partial: dict[int, tuple[int, int, int, bytearray]] = {}  # continued REQUESTs
        self.answer_pings = True
        self.pending: list[tuple[int, int, int, bytes]] = []  # frames read by pump()
        self.timeouts: dict[int, int] = {}  # timeout_us of the requests read
        # hang: (when, request id, "return" or "deadline", result body) and the flags (8.3)
        self.timers: list[tuple[float, int, str, bytes]] = []
        self.flags: dict[int, int] = {}
        self.ended: set[int] = set()

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            os._exit(0)  # the parent closed the connection: nothing left to misbehave at

    def fill(self, timeout: float | None) -> bool:
        """Reads what is available (waiting up to ``timeout``); False once nothing came."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:  # EOF: the parent is gone or gave up on us (8.4: status 0)
            os._exit(1 if self.mode == "eof_exits_1" else 0)
        self.buf += data
        return True

    def next_frame(self) -> tuple[int, int, int, bytes] | None:
        if len(self.buf) < 16:
            return None
        length, ftype, flags, _, fid = HEADER.unpack_from(self.buf)
        if len(self.buf) < 16 + length:
            return None
        payload = bytes(self.buf[16:16 + length])
        del self.buf[:16 + length]
        return ftype, flags, fid, payload

    def frames(self, timeout: float | None) -> list[tuple[int, int, int, bytes]]:
        """Frames that arrived within ``timeout``, connection housekeeping done (PING, CREDIT)."""
        if len(self.buf) < 16 or len(self.buf) < 16 + HEADER.unpack_from(self.buf)[0]:
            self.fill(timeout)  # else a frame read with the WELCOME waits for the next byte
        out = []
        while (f := self.next_frame()) is not None:
            ftype, flags, fid, payload = f
            if ftype == PING and self.answer_pings:
                self.send(frame(PONG, 0, payload))
            elif ftype == CREDIT:
                self.credit[fid] = self.credit.get(fid, 0) + struct.unpack_from("<I", payload)[0]
            elif ftype == DRAIN:
                self.send(frame(GOODBYE, 0, struct.pack("<I", 0)))
                os._exit(1 if self.mode == "goodbye_exits_1" else 0)
            elif ftype == ERROR and fid == 0:
                self.fatal_exit()  # the parent gave up on us
            elif ftype not in KNOWN_TYPES:
                self.send(frame(ERROR, 0, error_payload(103, b"unknown frame type")))
                self.fatal_exit()
            else:
                out.append(f)
        return out

    def pump(self) -> None:
        """Answers PINGs that arrived meanwhile (between two whole frames of ours)."""
        self.pending += self.frames(0)

    def requests(self, timeout: float | None) -> list[tuple[int, int, int, bytes]]:
        """(id, method, codec, body) of the whole REQUESTs that arrived within ``timeout``."""
        got, self.pending = self.pending, []
        got += self.frames(timeout)
        out = []
        for ftype, flags, fid, payload in got:
            if ftype == REQUEST:
                method, codec, _, timeout_us = struct.unpack_from("<HBBQ", payload)
                self.timeouts[fid] = timeout_us
                body = bytearray(payload[12:])
                if flags & MORE:
                    self.partial[fid] = (fid, method, codec, body)
                else:
                    out.append((fid, method, codec, bytes(body)))
            elif ftype == CONTINUATION and fid in self.partial:
                self.partial[fid][3].extend(payload)
                if not flags & MORE:
                    rid, method, codec, body = self.partial.pop(fid)
                    out.append((rid, method, codec, bytes(body)))
            elif ftype == CANCEL:
                self.partial.pop(fid, None)
                if any(t[1] == fid for t in self.timers):
                    self.flags.setdefault(fid, 205)  # CANCELLED, unless the deadline came first
        return out

    def hello(self) -> None:
        self.send(frame(HELLO, 0, hello_payload()))
        self.await_welcome()

    def await_welcome(self) -> None:
        while True:
            self.fill(None)
            f = self.next_frame()
            if f is not None and f[0] == WELCOME:
                (version, _, worker_id, mfs, credit, hb, mif,
                 mms) = struct.unpack_from("<HHIIIIIQ", f[3])
                self.welcome = {"max_frame_size": mfs, "initial_credit": credit,
                                "heartbeat_ms": hb, "max_message_size": mms}
                return
            if f is not None and f[0] == ERROR:
                self.fatal_exit()  # a refused handshake

    def fatal_exit(self) -> None:
        """After a fatal error, sent or received, a worker exits 1 (8.4)."""
        os._exit(0 if self.mode == "fatal_exits_0" else 1)

    @property
    def mfs(self) -> int:
        return int(self.welcome.get("max_frame_size", 65536))

    def send_message(self, ftype: int, fid: int, payload: bytes) -> None:
        """A whole message, continued over frames when it does not fit one."""
        mfs = self.mfs
        if len(payload) <= mfs:
            self.send(frame(ftype, fid, payload))
            return
        self.send(frame(ftype, fid, payload[:mfs], MORE))
        for at in range(mfs, len(payload), mfs):
            if self.mode != "pong_behind_output":
                self.pump()  # PINGs are answered at the next frame boundary (8.5)
            last = at + mfs >= len(payload)
            self.send(frame(CONTINUATION, fid, payload[at:at + mfs], 0 if last else MORE))

    # -- correct answers ---------------------------------------------------------------------

    def answer(self, rid: int, method: int, codec: int, body: bytes) -> None:
        name = METHODS[method][0] if method < len(METHODS) else None
        if name is None:
            self.send(frame(ERROR, rid, error_payload(200, b"unknown method")))
        elif name in ("echo", "hostile"):
            self.send_message(RESULT, rid, body)
        elif name == "add":
            try:
                req = json.loads(body)
                out = json.dumps({"sum": req["a"] + req["b"]}).encode()
            except (ValueError, KeyError, TypeError):
                self.send(frame(ERROR, rid, error_payload(202, b"bad add request")))
                return
            self.send(frame(RESULT, rid, out))
        elif name == "whoami":
            self.send(frame(RESULT, rid, str(os.getpid()).encode()))
        elif name == "hang":
            # Ignores its flag and returns after ms; the terminal is the flag's code if the
            # deadline timer or a CANCEL set it (spec 8.3), sent at the timer at the latest.
            now = time.monotonic()
            ms = json.loads(body) if body else 0
            self.timers.append((now + ms / 1000, rid, "return", body))
            timeout_us = self.timeouts.pop(rid, 0)
            if timeout_us:
                self.timers.append((now + timeout_us / 1e6, rid, "deadline", b""))
        elif name == "big_summary":
            # One row 0, then the summary {"string": {"size": N}}; one above max_message_size
            # cannot be sent: HANDLER_ERROR instead, the connection survives (spec 8.1).
            self.send(frame(ROWS, rid, rows_payload([b"0"])))
            summary = big_summary(body)
            limit = int(self.welcome.get("max_message_size", 1 << 30))
            if 8 + len(summary) > limit:
                self.send(frame(ERROR, rid, error_payload(203, b"the summary of %d bytes is "
                                                          b"above max_message_size %d"
                                                          % (8 + len(summary), limit))))
            else:
                self.send_message(END, rid, end_payload(1, summary))
        else:  # decls, hostile_stream: {"n": N} decl rows, summary {"rows": N}
            try:
                n = int(json.loads(body).get("n", 0)) if body else 0
            except (ValueError, AttributeError, TypeError):
                n = 0
            rows = [json.dumps({"i": i, "name": f"decl_{i}", "kind": "theorem"}).encode()
                    for i in range(n)]
            if rows:
                self.send(frame(ROWS, rid, rows_payload(rows)))
            self.send(frame(END, rid, end_payload(n, json.dumps({"rows": n}).encode())))

    def fire_timers(self) -> None:
        """hang's timers that are due: the first terminal of a request counts, later dropped."""
        now = time.monotonic()
        due = sorted(t for t in self.timers if t[0] <= now)
        self.timers = [t for t in self.timers if t[0] > now]
        for _, rid, what, body in due:
            if rid in self.ended:
                continue
            self.ended.add(rid)
            if what == "deadline":
                self.flags.setdefault(rid, 206)  # DEADLINE_EXCEEDED, unless CANCEL came first
            code = self.flags.pop(rid, None)
            self.send(frame(RESULT, rid, body) if code is None else
                      frame(ERROR, rid, error_payload(code, b"hang: flag set")))

    def serve(self, on_request: Callable[[int, int, int, bytes], bool] | None = None) -> None:
        """Serves forever; ``on_request`` may take a request over (returns True if it did)."""
        while True:
            wait = (max(0.0, min(t[0] for t in self.timers) - time.monotonic())
                    if self.timers else None)
            for rid, method, codec, body in self.requests(wait):
                if on_request is None or not on_request(rid, method, codec, body):
                    self.answer(rid, method, codec, body)
            self.fire_timers()


# ---------------------------------------------------------------------------------------------
# Misbehaviours
# ---------------------------------------------------------------------------------------------


def linger() -> None:
    """Stays alive, reading nothing: the parent must kill us."""
    while True:
        time.sleep(3600)


def drain_forever(conn: Conn) -> None:
    """Stays alive reading (and discarding) everything, answering nothing."""
    conn.answer_pings = False
    while True:
        conn.fill(None)
        conn.buf.clear()


def startup_mode(mode: str, arg: float, sock: socket.socket, conn: Conn) -> bool:
    """Start-up misbehaviours; returns False if ``mode`` is not one."""
    if mode == "exit_before_hello":
        os._exit(int(arg))
    elif mode == "close_before_hello":
        sock.close()
        linger()
    elif mode == "garbage_before_hello":
        # Reads as a frame header whose length (0x42524147) is far above 64 KiB.
        conn.send(b"GARBAGE!" * 4 + frame(HELLO, 0, hello_payload()))
        drain_forever(conn)
    elif mode == "length_4gib_before_hello":
        conn.send(HEADER.pack(0xFFFFFFFF, HELLO, 0, 0, 0) + b"WIREPOOL")
        drain_forever(conn)
    elif mode == "never_hello":
        drain_forever(conn)
    elif mode == "hello_byte_by_byte":  # legal, only slow: the pool must start
        data = frame(HELLO, 0, hello_payload())
        for i in range(len(data)):
            conn.send(data[i:i + 1])
            time.sleep(arg)
        conn.await_welcome()
        conn.serve()
    else:
        return False
    return True


def call_mode(mode: str, arg: float, conn: Conn) -> Callable[[int, int, int, bytes], bool]:
    """The misbehaviour in answer to a ``hostile`` / ``hostile_stream`` call."""
    waiting: list[int] = []  # many_in_progress: the ids collected so far

    def misbehave(rid: int, method: int, codec: int, body: bytes) -> bool:
        name = METHODS[method][0] if method < len(METHODS) else ""
        send = conn.send
        if name == "hang" and mode == "late_result":
            # Matrix mutant: the deadline timer and the flag are ignored; the handler's result
            # goes out when it returns (a correct worker sends DEADLINE_EXCEEDED at its timer).
            conn.timeouts.pop(rid, None)
            ms = json.loads(body) if body else 0
            conn.timers.append((time.monotonic() + ms / 1000, rid, "return", body))
            return True
        if name == "big_summary":
            if mode != "oversized_summary":
                return False
            # Matrix mutant: the summary goes out whatever the connection's max_message_size
            # (a correct worker sends HANDLER_ERROR instead, spec 8.1).
            send(frame(ROWS, rid, rows_payload([b"0"])))
            conn.send_message(END, rid, end_payload(1, big_summary(body)))
            return True
        if not name.startswith("hostile"):
            return False
        if mode == "exit_on_call":
            os._exit(int(arg))
        elif mode == "exit_mid_frame":
            # Dies while writing a large RESULT (a crash mid-write): half a frame, then the
            # exit. A frame cut short by the peer's end is that peer's end (PROTOCOL.md 13):
            # WORKER_EXITED with this status, not a protocol violation.
            conn.answer_pings = False  # a PONG cannot cut into our frame
            data = frame(RESULT, rid, b"x" * 4096)
            send(data[:len(data) // 2])
            os._exit(int(arg))
        elif mode == "goodbye_and_stay":
            send(frame(GOODBYE, 0, struct.pack("<I", 2)))
            drain_forever(conn)
        elif mode == "trickle_frame":
            data = frame(RESULT, rid, b"x" * 4096)
            conn.answer_pings = False  # a PONG cannot cut into our frame
            for i in range(len(data)):
                send(data[i:i + 1])
                time.sleep(arg)
            drain_forever(conn)
        elif mode == "events_no_pong":
            # Whole, valid frames (connection-level EVENTs) every ``arg`` s, but no PONG: bytes
            # are not progress, the PONG clock must call it hung.
            conn.answer_pings = False
            while True:
                send(frame(EVENT, 0, str16(b"tick") + b"{}"))
                conn.fill(arg)
                conn.buf.clear()
        elif mode == "huge_message":
            # One RESULT continued far past max_message_size (up to arg GiB), PINGs answered
            # between frames: only the size check can stop it.
            mfs = conn.mfs
            chunk = b"h" * mfs
            send(frame(RESULT, rid, chunk, MORE))
            for _ in range(int(arg * (1 << 30)) // mfs):
                send(frame(CONTINUATION, rid, chunk, MORE))
                conn.pump()
            drain_forever(conn)
        elif mode == "many_in_progress":
            # ``arg`` RESULTs in progress at once, each below max_message_size, together above
            # it: only a per-connection bound stops them.
            waiting.append(rid)
            if len(waiting) < int(arg):
                return True
            mfs = conn.mfs
            each = conn.welcome["max_message_size"] * 2 // 5  # 0.4 of the limit each
            chunk = b"m" * mfs
            for r in waiting:
                send(frame(RESULT, r, chunk, MORE))
            for _ in range(each // mfs):
                for r in waiting:
                    send(frame(CONTINUATION, r, chunk, MORE))
                conn.pump()
            for r in waiting:  # finish them: a parent without the bound now holds them all
                send(frame(CONTINUATION, r, b"", 0))
            drain_forever(conn)
        elif mode == "error0_then_talk":
            send(frame(ERROR, 0, error_payload(100, b"hostile worker: fatal")))
            send(frame(RESULT, rid, body))  # keeps talking: must not be delivered
            conn.serve()
        elif mode == "unknown_frame_type":
            send(frame(0x55, rid, b"?"))
            drain_forever(conn)
        elif mode == "length_4gib":
            send(HEADER.pack(0xFFFFFFFF, RESULT, 0, 0, rid) + b"x" * 64)
            drain_forever(conn)
        elif mode == "id_never_issued":
            send(frame(RESULT, rid + 1000, body))
            drain_forever(conn)
        elif mode == "id_zero":
            send(frame(RESULT, 0, body))
            drain_forever(conn)
        elif mode == "duplicate_terminal":  # the second is a late frame: ignored, no harm
            send(frame(RESULT, rid, body) + frame(RESULT, rid, b'"second terminal"'))
            return True
        elif mode == "bad_utf8":
            send(frame(ERROR, rid, error_payload(1042, b"bad \xff\xfe utf-8")))
            drain_forever(conn)
        elif mode == "rows_beyond_credit":
            # Rows of the whole window, then more while the credit is not positive.
            # One write, so both are read before the consumer can take a row and grant more.
            size = conn.welcome["initial_credit"] - 8
            send(frame(ROWS, rid, rows_payload([b'"' + b"r" * (size - 2) + b'"']))
                 + frame(ROWS, rid, rows_payload([b"1"])))
            drain_forever(conn)
        elif mode == "impossible_row_count":
            send(frame(ROWS, rid, struct.pack("<I", 0xFFFFFFFF) + struct.pack("<I", 1) + b"1"))
            drain_forever(conn)
        elif mode == "wrong_end_count":
            rows = [b'{"i": %d, "name": "decl_%d", "kind": "theorem"}' % (i, i) for i in range(3)]
            send(frame(ROWS, rid, rows_payload(rows)))
            send(frame(END, rid, end_payload(5, b'{"rows": 5}')))
            drain_forever(conn)
        elif mode == "undecodable_row":  # no protocol fault: the row is not JSON
            send(frame(ROWS, rid, rows_payload([b"{not json"])))
            send(frame(END, rid, end_payload(1)))
            return True
        elif mode == "kind_mismatch":  # ROWS on a unary request
            send(frame(ROWS, rid, rows_payload([b"1"])))
            drain_forever(conn)
        elif mode == "close_and_linger":
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.sock.close()
            linger()
        elif mode == "flood_output":
            # ``arg`` MB on stdout and as much on stderr, then the right answer: a parent that
            # stops reading blocks us, one that keeps it all grows by the whole flood.
            line = (b"o" * 4095 + b"\n") * 256  # 1 MiB of 4 KiB lines
            for _ in range(int(arg)):
                _write_all(1, line)
                _write_all(2, line.replace(b"o", b"e"))
                conn.pump()
            conn.answer(rid, method, codec, body)
            return True
        else:
            sys.stderr.write(f"hostile worker: unknown mode {mode!r}\n")
            os._exit(64)
        return True

    return misbehave


# Worker MUSTs no parent scenario sees, each broken by one mode (conformance/test_worker_musts.py
# drives the conformance workers and these with a scripted parent).
PROBE_MUTANTS = {
    "pong_behind_output": "a large message's frames written back to back, PINGs read after (8.5)",
    "goodbye_exits_1": "exit status 1 after DRAIN and GOODBYE 0 (8.4: 0)",
    "eof_exits_1": "exit status 1 after end of file (8.4: 0)",
    "fatal_exits_0": "exit status 0 after a fatal error, sent or received (8.4: 1)",
    "no_pdeathsig": "no parent-death signal: outlives a parent that dies while the socket lives",
}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def incarnation(state: str) -> int:
    """The number of this process in its scenario: 1 for the first, 2 for its replacement..."""
    n = 1
    while True:
        try:
            os.close(os.open(os.path.join(state, f"incarnation.{n}"),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


def die_with_parent() -> None:
    """SIGKILL when the parent dies (Linux), as the spec asks: a lingering hostile process must
    not outlive its runner."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(0)


def main() -> None:
    mode = os.environ.get("HOSTILE_MODE", "")
    if mode != "no_pdeathsig":
        die_with_parent()
    fd = int(os.environ.pop("WIREPOOL_FD"))
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    arg = float(os.environ.get("HOSTILE_ARG", "0") or 0)
    state = os.environ.get("HOSTILE_STATE")
    on = {int(x) for x in os.environ.get("HOSTILE_ON", "1").split(",") if x}
    n = incarnation(state) if state is not None else 0
    if mode == "replacements_die":
        # The incarnations before the first of HOSTILE_ON serve until ``hostile`` makes them exit
        # with status ``arg``; those in HOSTILE_ON (replacements) exit 5 before their HELLO; the
        # later ones behave.
        if n < min(on):
            mode, on = "exit_on_call", {n}
        else:
            mode, arg = "exit_before_hello", 5
    if n not in on:
        mode = ""
    conn = Conn(sock, mode)
    if mode in PROBE_MUTANTS:  # they bend Conn's rules only: every call is answered right
        conn.hello()
        conn.serve()
        return
    if mode and startup_mode(mode, arg, sock, conn):
        return
    conn.hello()
    conn.serve(call_mode(mode, arg, conn) if mode else None)


if __name__ == "__main__":
    main()
