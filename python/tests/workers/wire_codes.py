"""A worker written against the core alone, so it can put on the wire what no SDK worker sends
(PROTOCOL.md 3): method ``fail`` answers ERROR with the code its JSON request names (``{"code":
300}``), ``pid`` answers its pid. It answers PINGs, says GOODBYE on DRAIN, and exits at EOF."""

from __future__ import annotations

import json
import os
import socket
import sys

from wirepool import proto
from wirepool.proto import FrameType, MethodInfo, MethodKind

sock = socket.socket(fileno=int(os.environ["WIREPOOL_FD"]))
conn = proto.Connection("worker")


def write(parts: list) -> None:
    sock.sendall(b"".join(bytes(p) for p in parts))


write(conn.send_hello(proto.Hello(pid=os.getpid(), max_concurrency=8, sdk_name="wire-codes",
                                  methods=[MethodInfo("fail", MethodKind.UNARY, [1]),
                                           MethodInfo("pid", MethodKind.UNARY, [1])])))
while True:
    data = sock.recv(1 << 16)
    if not data:
        sys.exit(0)
    conn.receive(data)
    while (ev := conn.next_event()) is not None:
        t = ev.TYPE
        if t == FrameType.REQUEST:
            if ev.method == 0:  # type: ignore[attr-defined]
                code = json.loads(bytes(ev.body))["code"]  # type: ignore[attr-defined]
                write(conn.send_error(ev.id, code, f"code {code}, sent by the worker"))
            else:
                write(conn.send_result(ev.id, json.dumps({"pid": os.getpid()}).encode()))
        elif t == FrameType.PING:
            write(conn.send_pong(ev.nonce))  # type: ignore[attr-defined]
        elif t == FrameType.DRAIN:
            write(conn.send_goodbye())
            sock.close()
            sys.exit(0)
