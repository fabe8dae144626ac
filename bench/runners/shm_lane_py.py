"""Runner for the shared-memory lane's transport (PROTOCOL.md section 20) with a Python parent
and the Rust worker of the wirepool-io example `shm_lane` (see shm_lane.py, which builds it):
wirepool._shm (sealed memfd regions, SCM_RIGHTS, memoryview views each their own mapping) and
wirepool._shm_proto (Lender/Borrower). Not yet the pool. W3 only: one-way (the parent's payload
copied into its region once, lent to the worker) and echo (the worker lends its copy back, and
the parent receives it as a memoryview).

Usage: shm_lane_py.py '<scenario json>'
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from common import figure, load_scenario, ok, peak_rss_kib, unsupported

RUNNER = "wirepool_shm_lane_pyparent"
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "rust" / "target"))
BINARY = TARGET / "release" / "examples" / "shm_lane"
HEADER = struct.Struct("<IBBHQ")
REQUEST, RESULT = 0x10, 0x12


class Parent:
    """The parent side of the example's exchange (see rust/wirepool-io/examples/shm_lane.rs)."""

    def __init__(self, sock: socket.socket, payload: int) -> None:
        from wirepool import _shm, _shm_proto as sp

        self.shm, self.sp = _shm, sp
        self.sock = sock
        self.own = _shm.OwnedRegion(payload)
        self.lender, self.borrower = sp.Lender(1 << 40), sp.Borrower(1 << 40)
        self.own_id = self.lender.announce(payload)
        self.peer: _shm.Region | None = None
        self.fds: list[int] = []
        self.released: list[sp.ShmRange] = []
        self.out = bytearray()
        frame = sp.ShmFrame(sp.SHM_REGION, 0, self.own_id, size=payload).encode()
        sent = _shm.send_with_fds(sock, [frame], [self.own.fileno()])
        sock.sendall(frame[sent:])

    def read_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k, fds = self.shm.recv_into_with_fds(self.sock, view[got:])
            if k == 0:
                raise EOFError("the worker closed")
            self.borrower.descriptors_received(len(fds))
            self.fds.extend(fds)
            got += k
        return bytes(buf)

    def read_frame(self) -> tuple[int, int, bytes]:
        sp = self.sp
        while True:
            length, ftype, _flags, _res, ident = HEADER.unpack(self.read_exact(16))
            payload = self.read_exact(length)
            if ftype == sp.SHM_REGION:
                f = sp.ShmFrame.decode(ftype, ident, payload)
                self.borrower.region(f.region, f.size)
                self.peer = self.shm.Region.map_received(self.fds.pop(0), f.size)
            elif ftype == sp.SHM_RELEASE:
                self.lender.released(sp.ShmFrame.decode(ftype, ident, payload).range)
            else:
                return ftype, ident, payload

    def call(self, ident: int, source: memoryview, echo: bool) -> None:
        sp = self.sp
        n = len(source)
        self.own.buffer[:n] = source
        for r in self.released:
            self.borrower.release(r)
            self.out += sp.ShmFrame(sp.SHM_RELEASE, 0, r.region, offset=r.offset,
                                    length=r.length).encode()
        self.released.clear()
        r = sp.ShmRange(self.own_id, 0, n)
        self.lender.lend(r)
        self.out += HEADER.pack(12, REQUEST, 1, 0, ident) + bytes(12)  # MORE, prefix only
        self.out += sp.ShmFrame(sp.SHM_BODY, ident, r.region, offset=0, length=n).encode()
        self.sock.sendall(self.out)
        self.out.clear()
        ftype, rid, body = self.read_frame()
        assert (ftype, rid) == (RESULT, ident)
        if not echo:
            assert body == struct.pack("<I", n)
            return
        ftype, rid, body = self.read_frame()
        assert ftype == sp.SHM_BODY
        got = sp.ShmFrame.decode(ftype, rid, body).range
        self.borrower.body(rid, got)
        assert self.peer is not None
        view = self.peer.lend(got.offset, got.length,
                              on_release=lambda: self.released.append(got))
        assert len(view) == n and view[n // 2] == source[n // 2]
        view.release()


def main() -> None:
    sc = load_scenario()
    if sc["kind"] not in ("oneway", "echo_large"):
        unsupported(RUNNER, sc, "the lane is measured for large payloads (W3) only")
        return
    if not sys.platform.startswith("linux") or not BINARY.exists():
        unsupported(RUNNER, sc, f"needs Linux and {BINARY} (shm_lane.py --prepare builds it)")
        return
    echo = sc["kind"] == "echo_large"
    payload = sc["payload"]
    mine, theirs = socket.socketpair()
    env = dict(os.environ, WIREPOOL_SHM_LANE_CHILD=f"{'echo' if echo else 'oneway'} {payload}",
               WIREPOOL_SHM_LANE_FD=str(theirs.fileno()))
    child = subprocess.Popen([str(BINARY)], env=env, pass_fds=[theirs.fileno()])
    theirs.close()
    try:
        parent = Parent(mine, payload)
        source = memoryview(bytes(i % 251 for i in range(251)) * (payload // 251 + 1))[:payload]
        ident = 1
        parent.call(ident, source, echo)  # warm up: pages faulted, the worker's region mapped
        values = []
        for _ in range(sc["repeats"]):
            start, calls = time.perf_counter(), 0
            while calls < sc["min_calls"] or time.perf_counter() - start < sc["duration_s"]:
                ident += 1
                parent.call(ident, source, echo)
                calls += 1
            secs = time.perf_counter() - start
            values.append(payload * calls * (2 if echo else 1) / secs / 1e6)
        child_rss = peak_rss_kib(child.pid)
    finally:
        mine.close()
        child.wait(timeout=30)
    ok(RUNNER, sc, [figure("mb_per_s", "MB/s", values)], peak_rss_kib(), child_rss,
       "shared-memory lane transport, Python parent (wirepool._shm, _shm_proto) + Rust worker "
       "(the shm_lane example), not yet the pool: the parent copies its payload into its sealed "
       "region once; echo comes back as a memoryview of the worker's region")


if __name__ == "__main__":
    main()
