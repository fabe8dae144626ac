"""Rows/s a Python worker produces, against a fast fake parent (no Python work per row).

    python bench/bench_worker_rows.py [--rows N] [--repeat R]

Stands in for a Rust parent (rust/wirepool) until a Python worker is measured under one: this
parent does the handshake with ``wirepool.proto``, then reads ROWS frames by their headers and
counts (rows are not sliced or decoded), and grants credit in large steps. Methods measured:
``rows_raw`` (a generator yielding one 20-byte ``bytes`` row at a time, raw codec) and ``rows``
(small dicts, JSON). Prints rows/s (wall) and the worker's CPU seconds per million rows.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from wirepool import codecs, proto  # noqa: E402

WORKER = [sys.executable, os.path.join(HERE, "bench_worker.py")]
HEADER = struct.Struct("<IBBHQ")
WINDOW = 8 << 20


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FakeParent:
    def __init__(self, max_frame_size: int = 1 << 20) -> None:
        self.sock, child = socket.socketpair()
        for s in (self.sock, child):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        env = dict(os.environ, WIREPOOL_FD=str(child.fileno()))
        self.proc = subprocess.Popen(WORKER, env=env, pass_fds=(child.fileno(),))
        child.close()
        self.conn = proto.Connection("parent")
        self.buf = bytearray(4 << 20)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0
        hello = self._event()
        self.methods = {m.name: i for i, m in enumerate(hello.methods)}
        self.sock.sendall(b"".join(self.conn.send(proto.Welcome(
            worker_id=1, max_frame_size=max_frame_size, initial_credit=WINDOW, heartbeat_ms=0,
            max_in_flight=4, max_message_size=1 << 30))))
        self.next_id = 1

    def _event(self) -> proto.Frame:
        while True:
            ev = self.conn.next_event()
            if ev is not None:
                return ev
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.conn.receive(data)

    def _fill(self) -> None:
        if self.start:
            left = self.end - self.start
            self.view[:left] = self.view[self.start:self.end]
            self.start, self.end = 0, left
        n = self.sock.recv_into(self.view[self.end:])
        if not n:
            raise EOFError
        self.end += n

    def stream(self, method: str, codec: codecs.Codec, request: object) -> int:
        """Run one stream to its END; returns the rows received (checked against END)."""
        id = self.next_id
        self.next_id += 1
        body = codec.encode(request)
        self.sock.sendall(HEADER.pack(12 + len(body), proto.FrameType.REQUEST, 0, 0, id)
                          + struct.pack("<HBBQ", self.methods[method], codec.id, 0, 0) + body)
        rows = 0
        unacked = 0
        while True:
            while self.end - self.start < 16:
                self._fill()
            length, ftype, flags, _, fid = HEADER.unpack_from(self.buf, self.start)
            while self.end - self.start < 16 + length:
                self._fill()
            p = self.start + 16
            self.start += 16 + length
            if ftype == proto.FrameType.ROWS:
                rows += struct.unpack_from("<I", self.buf, p)[0]
                unacked += length
                if unacked >= WINDOW // 2:
                    self.sock.sendall(HEADER.pack(4, proto.FrameType.CREDIT, 0, 0, id)
                                      + struct.pack("<I", unacked))
                    unacked = 0
            elif ftype == proto.FrameType.END:
                (row_count,) = struct.unpack_from("<Q", self.buf, p)
                assert row_count == rows, (row_count, rows)
                return rows
            elif ftype == proto.FrameType.ERROR:
                raise RuntimeError(bytes(self.buf[p:p + length]))
            # EVENT and others: ignored

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    parent = FakeParent()
    try:
        for method, codec in (("rows_raw", "raw"), ("rows", "json"), ("rows", "msgpack")):
            c = codecs.get(codec)
            parent.stream(method, c, {"n": 1000} if codec != "raw" else b"1000")
            rates, cpus = [], []
            for _ in range(args.repeat):
                req = {"n": args.rows} if codec != "raw" else str(args.rows).encode()
                c0 = cpu_seconds(parent.proc.pid)
                t0 = time.perf_counter()
                n = parent.stream(method, c, req)
                dt = time.perf_counter() - t0
                rates.append(n / dt)
                cpus.append((cpu_seconds(parent.proc.pid) - c0) / n * 1e6)
            print(f"python worker -> fake parent, {method:<8} ({codec:<4}): rows/s "
                  f"min {min(rates):>11,.0f}  median {statistics.median(rates):>11,.0f}  "
                  f"max {max(rates):>11,.0f}   worker CPU s per M rows: median "
                  f"{statistics.median(cpus):.2f}")
    finally:
        parent.close()


if __name__ == "__main__":
    main()
