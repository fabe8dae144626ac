"""A worker written on the sans-IO core alone (no wirepool worker runtime): its stream sends
every row it was asked for, as credit permits, then END, whatever CANCEL says; as a worker
that has not seen the CANCEL yet behaves. For test_rows_nobody_reads.py (PROTOCOL.md 14.3)."""

from __future__ import annotations

import os
import socket
import sys

from wirepool import proto

RAW = proto.CodecId.RAW
ROW = b"r" * 1000


def main() -> None:
    sock = socket.socket(fileno=int(os.environ.pop("WIREPOOL_FD")))
    conn = proto.Connection("worker")

    def send(parts: list) -> None:
        sock.sendall(b"".join(bytes(p) for p in parts))

    def next_event() -> proto.Frame:
        while True:
            ev = conn.next_event()
            if ev is None:
                data = sock.recv(1 << 16)
                if not data:
                    conn.end_of_input()
                    sys.exit(0)
                conn.receive(data)
            elif isinstance(ev, proto.Ping):
                send(conn.send_pong(ev.nonce))
            elif isinstance(ev, proto.Drain):
                send(conn.send_goodbye(0))
                sys.exit(0)
            elif isinstance(ev, proto.ErrorFrame):
                sys.exit(1)
            else:
                return ev

    send(conn.send_hello(proto.Hello(
        pid=os.getpid(), max_concurrency=1, max_frame_size=65536, sdk_name="stubborn-test",
        methods=[proto.MethodInfo("rows", proto.MethodKind.STREAM, [RAW]),
                 proto.MethodInfo("whoami", proto.MethodKind.UNARY, [RAW])])))
    while True:
        ev = next_event()
        if isinstance(ev, proto.Reject):
            send(conn.send_error(ev.id, ev.code, ev.name))
        elif isinstance(ev, proto.Request) and ev.method == 1:
            send(conn.send_result(ev.id, str(os.getpid()).encode()))
        elif isinstance(ev, proto.Request):
            left = int(bytes(ev.body))
            while left:
                while not conn.can_send_rows(ev.id):
                    next_event()  # CREDIT, or a CANCEL this worker ignores
                b = conn.rows(ev.id, 8192)
                while left and b.append(ROW):
                    left -= 1
                send(b.finish())
            send(conn.send_end(ev.id))


if __name__ == "__main__":
    main()
