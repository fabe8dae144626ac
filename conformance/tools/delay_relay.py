"""A WAN-like TCP relay for tests (issue 29): it listens on a port and relays every connection to
a target host:port, delivering each chunk D ms after it arrived, in order, each way (a round trip
through it takes at least 2 D), optionally at most RATE bytes a second per direction (a token
bucket, as ``slow_relay.py`` paces). It holds at most CAP bytes per direction: while that much is
in flight it stops reading from the sender, so TCP's own flow control pushes back on it and the
relay is never an unbounded queue. End of file is relayed (after the delay) as a half close.

In a test::

    with DelayRelay(("127.0.0.1", port), delay_ms=50) as relay:
        connect(relay.address)          # 127.0.0.1 and an ephemeral port
    # leaving stops it: listener and connections closed, every thread joined

As a command::

    python3 delay_relay.py [--port P] [--rate BYTES_S] [--cap BYTES] DELAY_MS HOST:PORT

In a remote worker's place (``--worker``, as ``slow_relay.py`` stands in for a local worker): a
pool's launcher starts it with the worker's join ticket in ``WIREPOOL_TICKET`` (PROTOCOL.md
21.2); it starts a relay to the ticket's host:port, gives the worker command a copy of the ticket
that names the relay's port instead (the certificate pin and the secret unchanged: TLS runs end
to end through the relay), and exits with the worker's status::

    python3 delay_relay.py --worker [--rate BYTES_S] [--cap BYTES] DELAY_MS -- worker-command...
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

DEFAULT_CAP = 256 * 1024
CHUNK = 65536
TICKET_PREFIX = "wirepool-ticket-1."  # REMOTE_TICKET_PREFIX of spec/constants.json


class _Pipe:
    """One direction of one connection: a reader thread takes chunks from src while fewer than
    cap bytes are held, a writer thread hands each to dst at its arrival + delay."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay: float, rate: float,
                 cap: int, done: "_Conn") -> None:
        self.src, self.dst, self.delay, self.rate, self.cap = src, dst, delay, rate, cap
        self.conn = done
        self.cond = threading.Condition()
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()  # b"": EOF
        self.held = 0
        self.peak = 0
        self.stopped = False
        self.threads = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._write, daemon=True)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def _read(self) -> None:
        try:
            while True:
                with self.cond:
                    while self.held >= self.cap and not self.stopped:
                        self.cond.wait()  # full: read nothing more until the writer drains
                    if self.stopped:
                        return
                    room = self.cap - self.held
                data = self.src.recv(min(CHUNK, room))
                with self.cond:
                    self.queue.append((time.monotonic() + self.delay, data))
                    self.held += len(data)
                    self.peak = max(self.peak, self.held)
                    self.cond.notify_all()
                if not data:
                    return
        except OSError:
            self.conn.broken()

    def _write(self) -> None:
        paced = time.monotonic()
        try:
            while True:
                with self.cond:
                    while not self.stopped and (
                            not self.queue or self.queue[0][0] > time.monotonic()):
                        # The link's delay: woken early by a new chunk or a stop, never later
                        # than the head chunk's due time.
                        self.cond.wait(self.queue[0][0] - time.monotonic() if self.queue
                                       else None)
                    if self.stopped:
                        return
                    _, data = self.queue[0]
                if not data:
                    self.dst.shutdown(socket.SHUT_WR)
                    self.conn.half_done()
                    return
                self.dst.sendall(data)
                with self.cond:
                    self.queue.popleft()
                    self.held -= len(data)
                    self.cond.notify_all()
                if self.rate:
                    now = time.monotonic()
                    paced = max(paced, now) + len(data) / self.rate
                    with self.cond:  # the link's rate, cut short by a stop
                        while not self.stopped and paced > time.monotonic():
                            self.cond.wait(paced - time.monotonic())
        except OSError:
            self.conn.broken()


class _Conn:
    def __init__(self, client: socket.socket, server: socket.socket, relay: "DelayRelay") -> None:
        self.socks = (client, server)
        self.lock = threading.Lock()
        self.halves = 0
        self.closed = False
        self.pipes = (_Pipe(client, server, relay.delay, relay.rate, relay.cap, self),
                      _Pipe(server, client, relay.delay, relay.rate, relay.cap, self))

    def start(self) -> None:
        for p in self.pipes:
            p.start()

    def half_done(self) -> None:
        with self.lock:
            self.halves += 1
            last = self.halves == 2
        if last:
            self.close()

    def broken(self) -> None:
        self.close()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for p in self.pipes:
            p.stop()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
            except OSError:
                pass

    def join(self) -> None:
        for p in self.pipes:
            for t in p.threads:
                if t.ident is not None and t is not threading.current_thread():
                    t.join()
        for s in self.socks:
            s.close()


class DelayRelay:
    """The relay: ``start()`` (or ``with``) binds ``host``:``port`` (0: ephemeral, see
    ``address``), ``stop()`` closes everything and joins every thread."""

    def __init__(self, target: tuple[str, int], delay_ms: float, *, rate: float = 0,
                 cap: int = DEFAULT_CAP, host: str = "127.0.0.1", port: int = 0) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1 byte")
        self.target, self.delay, self.rate, self.cap = target, delay_ms / 1000.0, rate, cap
        self.listener = socket.create_server((host, port))
        self.conns: list[_Conn] = []
        self.lock = threading.Lock()
        self.stopping = False
        self.acceptor = threading.Thread(target=self._accept, daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.listener.getsockname()[:2]
        return host, port

    def held(self) -> list[int]:
        """Bytes held now, per direction of every connection so far."""
        return [p.held for c in self.conns for p in c.pipes]

    def peak(self) -> int:
        """The most bytes any one direction held at once."""
        return max((p.peak for c in self.conns for p in c.pipes), default=0)

    def start(self) -> "DelayRelay":
        self.acceptor.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, server, self)
            with self.lock:
                if self.stopping:
                    client.close()
                    server.close()
                    return
                self.conns.append(conn)
            conn.start()

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux
        except OSError:
            pass
        self.listener.close()
        self.acceptor.join()
        for c in self.conns:
            c.close()
            c.join()

    def __enter__(self) -> "DelayRelay":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def retarget(ticket: str, host: str, port: int) -> tuple[str, tuple[str, int]]:
    """The ticket's text with ``host``:``port`` in its place, and where it pointed before."""
    if not ticket.strip().startswith(TICKET_PREFIX):
        raise ValueError("not a wirepool ticket")
    body = ticket.strip()[len(TICKET_PREFIX):].rstrip("=")
    doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    was = (str(doc["host"]).strip("[]"), int(doc["port"]))
    doc["host"], doc["port"] = host, port
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return TICKET_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii"), was


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when this process dies (Linux prctl
    PR_SET_PDEATHSIG)."""
    import ctypes
    import signal
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def stand_in(a: argparse.Namespace) -> int:
    """``--worker``: relay the worker's join, run it, exit with its status."""
    ticket = os.environ.get("WIREPOOL_TICKET")
    if ticket is None:
        print("delay_relay --worker: no WIREPOOL_TICKET", file=sys.stderr)
        return 2
    # The relay listens on the ticket's own host (loopback in the tests), a port of its own.
    _, target = retarget(ticket, "127.0.0.1", 1)
    relay = DelayRelay(target, a.delay_ms, rate=a.rate, cap=a.cap, host=target[0])
    with relay:
        new, _ = retarget(ticket, target[0], relay.address[1])
        # The pool stops a hung worker by killing its process, this one: the worker must go
        # with it even when it is too frozen to see its connection close.
        child = subprocess.Popen(a.command, env=dict(os.environ, WIREPOOL_TICKET=new),
                                 preexec_fn=_die_with_parent)
        try:
            return child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("delay_ms", type=float, help="delay each way, in ms")
    if "--worker" in sys.argv[1:sys.argv.index("--") if "--" in sys.argv else None]:
        ap.add_argument("--worker", action="store_true", help="stand in for a remote worker")
        ap.add_argument("command", nargs="+", help="the worker's command (after --)")
    else:
        ap.add_argument("target", help="HOST:PORT to relay to")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: ephemeral)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--rate", type=float, default=0, help="bytes/s per direction (0: no cap)")
    ap.add_argument("--cap", type=int, default=DEFAULT_CAP, help="bytes held per direction")
    a = ap.parse_args()
    if getattr(a, "worker", False):
        sys.exit(stand_in(a))
    host, _, port = a.target.rpartition(":")
    relay = DelayRelay((host.strip("[]"), int(port)), a.delay_ms, rate=a.rate, cap=a.cap,
                       host=a.host, port=a.port)
    with relay:
        print(f"{relay.address[0]}:{relay.address[1]}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
