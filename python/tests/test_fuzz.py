"""Bounded fuzzing of the decoder and the connection core: arbitrary bytes in arbitrary
chunks may only ever produce frames/events or a ProtocolError, never another exception.

A longer coverage-guided run uses atheris: python fuzz/fuzz_proto.py fuzz/corpus -max_total_time=60
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from wirepool import proto
from wirepool.errors import ProtocolError

CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
SEEDS = sorted(p.read_bytes() for p in CORPUS.glob("*")) if CORPUS.exists() else []

HELLO = proto.encode_frame(proto.Hello(pid=1, max_concurrency=2, methods=[
    proto.MethodInfo("u", proto.MethodKind.UNARY, [0, 1]),
    proto.MethodInfo("s", proto.MethodKind.STREAM, [1])]))
WELCOME = proto.Welcome(max_frame_size=65536, initial_credit=300, max_in_flight=2,
                        max_message_size=100_000)

# Frames that are valid on their own, mutated and concatenated, reach deeper states than noise.
valid_frames = st.sampled_from([proto.encode_frame(f) for f in (
    proto.Request(1, 0, 1, b"{}"), proto.Request(2, 1, 1, b"x", more=True),
    proto.Continuation(2, b"yy"), proto.Continuation(2, b"z", more=True), proto.Cancel(1),
    proto.Cancel(2), proto.Credit(2, 100), proto.Result(1, b"r"), proto.Result(1, b"r", more=True),
    proto.Rows(2, [b"a", b"bb"]), proto.End(2, 2, b"s"), proto.End(2, 1, b"", more=True),
    proto.ErrorFrame(1, 203, "m", "{}"), proto.ErrorFrame(0, 100, "fatal"), proto.Event(1, "t", "{}"),
    proto.Ping(b"12345678"), proto.Pong(b"12345678"), proto.Drain(5), proto.Goodbye(0))])


@st.composite
def mutated_stream(draw: st.DrawFn) -> bytes:
    data = bytearray(b"".join(draw(st.lists(valid_frames, max_size=12))))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    return bytes(data)


def drive(role: str, data: bytes, cuts: list[int]) -> None:
    conn = proto.Connection(role)
    if role == "parent":
        conn.receive(HELLO)
        assert conn.next_event() is not None
        conn.send(WELCOME)
        conn.send(proto.Request(1, 0, 1, b"{}"))
        conn.send(proto.Request(2, 1, 1, b"{}"))
    else:
        conn.send(proto.decode_all(HELLO)[0])
        conn.receive(proto.encode_frame(WELCOME))
        assert conn.next_event() is not None
    pos = 0
    try:
        for c in cuts + [len(data)]:
            conn.receive(data[pos:pos + c])
            pos += c
            while conn.next_event() is not None:
                pass
            if pos >= len(data):
                break
        conn.end_of_input()
    except ProtocolError as e:
        assert 100 <= e.code < 200


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.lists(st.integers(1, 50), max_size=20))
def test_decoder_survives_noise(data: bytes, cuts: list[int]) -> None:
    dec = proto.FrameDecoder(65536)
    try:
        pos = 0
        for c in cuts + [len(data)]:
            dec.receive(data[pos:pos + c])
            pos += c
            while dec.next_frame() is not None:
                pass
            if pos >= len(data):
                break
        dec.end_of_input()
    except ProtocolError as e:
        assert 100 <= e.code < 200


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["parent", "worker"]), mutated_stream(),
       st.lists(st.integers(1, 40), max_size=20))
def test_connection_survives_mutated_streams(role: str, data: bytes, cuts: list[int]) -> None:
    drive(role, data, cuts)


def test_connection_survives_corpus() -> None:
    for seed in SEEDS:
        for role in ("parent", "worker"):
            drive(role, seed, [])
