"""Coverage-guided fuzzing of wirepool.proto with atheris (pip install atheris).

    python fuzz/fuzz_proto.py fuzz/corpus -max_total_time=60

The first byte picks the role and a chunk size; the rest is fed to a Connection after a valid
handshake. Anything but a ProtocolError (code 100-199) is a bug. Interesting inputs are kept in
the corpus directory, which tests/test_fuzz.py replays.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from wirepool import proto
    from wirepool.errors import ProtocolError

HELLO = proto.Hello(pid=1, max_concurrency=2, methods=[
    proto.MethodInfo("u", proto.MethodKind.UNARY, [0, 1]),
    proto.MethodInfo("s", proto.MethodKind.STREAM, [1])])
WELCOME = proto.Welcome(max_frame_size=65536, initial_credit=300, max_in_flight=2,
                        max_message_size=100_000)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    role = "parent" if data[0] & 1 else "worker"
    chunk = (data[0] >> 1) + 1
    body = data[1:]
    conn = proto.Connection(role)
    if role == "parent":
        conn.receive(proto.encode_frame(HELLO))
        conn.next_event()
        conn.send(WELCOME)
        conn.send(proto.Request(1, 0, 1, b"{}"))
        conn.send(proto.Request(2, 1, 1, b"{}"))
    else:
        conn.send(HELLO)
        conn.receive(proto.encode_frame(WELCOME))
        conn.next_event()
    try:
        for i in range(0, len(body), chunk):
            conn.receive(body[i:i + chunk])
            while conn.next_event() is not None:
                pass
        conn.end_of_input()
    except ProtocolError as e:
        if not 100 <= e.code < 200:
            raise


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
