"""Literal-bytes and property tests of wirepool.proto (frames, decoder, connection)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vectors import to_json
from wirepool import proto
from wirepool.errors import ErrorCode, ProtocolError


def decode(data: bytes, max_frame_size: int = proto.DEFAULT_MAX_FRAME_SIZE) -> list[proto.Frame]:
    return proto.decode_all(data, max_frame_size)


def header(length: int, ftype: int, flags: int = 0, reserved: int = 0, id: int = 0) -> bytes:
    return struct.pack("<IBBHQ", length, ftype, flags, reserved, id)


def test_ping_literal_bytes() -> None:
    wire = bytes.fromhex("08000000" "31" "00" "0000" "0000000000000000" "0102030405060708")
    assert proto.encode_frame(proto.Ping(bytes(range(1, 9)))) == wire
    (f,) = decode(wire)
    assert isinstance(f, proto.Ping) and f.nonce == bytes(range(1, 9))


def test_rows_literal_bytes_and_zero_copy_slices() -> None:
    wire = bytes.fromhex("11000000" "20" "00" "0000" "0500000000000000"
                         "02000000" "03000000616263" "020000006465")
    (f,) = decode(wire)
    assert isinstance(f, proto.Rows) and f.id == 5 and len(f) == 2
    rows = f.rows
    assert [bytes(r) for r in rows] == [b"abc", b"de"]
    assert all(isinstance(r, memoryview) for r in rows)
    assert proto.encode_frame(proto.Rows(5, [b"abc", b"de"])) == wire


@pytest.mark.parametrize("payload,code", [
    (struct.pack("<I", 0), ErrorCode.ROW_BOUNDS),                       # count 0
    (struct.pack("<II", 1, 5) + b"abc", ErrorCode.ROW_BOUNDS),          # row past the end
    (struct.pack("<II", 1, 1) + b"ab", ErrorCode.ROW_BOUNDS),           # bytes left over
    (struct.pack("<I", 1000), ErrorCode.ROW_BOUNDS),                    # count above (len-4)/4
    (b"\x01\x00", ErrorCode.BAD_PAYLOAD),                               # too short for count
])
def test_rows_bounds(payload: bytes, code: int) -> None:
    with pytest.raises(ProtocolError) as e:
        decode(header(len(payload), 0x20, id=1) + payload)
    assert e.value.code == code


def test_frame_too_large_is_raised_on_the_header_alone() -> None:
    dec = proto.FrameDecoder(65536)
    dec.receive(header(65537, 0x12, id=1))  # no payload byte ever arrives
    with pytest.raises(ProtocolError) as e:
        dec.next_frame()
    assert e.value.code == ErrorCode.FRAME_TOO_LARGE
    with pytest.raises(ProtocolError):  # the decoder stays dead
        dec.next_frame()


@pytest.mark.parametrize("hdr,code", [
    (header(0, 0x55), ErrorCode.UNKNOWN_FRAME_TYPE),
    (header(0, 0x11, flags=0x02, id=1), ErrorCode.BAD_FLAGS),
    (header(8, 0x31, flags=0x01), ErrorCode.BAD_FLAGS),                # MORE on PING
    (header(0, 0x11, reserved=1, id=1), ErrorCode.RESERVED_NONZERO),
    (header(0, 0x11, id=0), ErrorCode.BAD_ID),                          # CANCEL id 0
    (header(8, 0x31, id=3), ErrorCode.BAD_ID),                          # PING id 3
])
def test_header_rules_checked_before_payload(hdr: bytes, code: int) -> None:
    dec = proto.FrameDecoder()
    dec.receive(hdr)
    with pytest.raises(ProtocolError) as e:
        dec.next_frame()
    assert e.value.code == code


def test_truncated_on_eof_mid_frame() -> None:
    wire = proto.encode_frame(proto.Result(1, b"hello"))
    for cut in range(1, len(wire)):
        dec = proto.FrameDecoder()
        dec.receive(wire[:cut])
        assert dec.next_frame() is None
        with pytest.raises(ProtocolError) as e:
            dec.end_of_input()
        assert e.value.code == ErrorCode.TRUNCATED


def test_bad_utf8_in_error_message() -> None:
    payload = struct.pack("<IH", 203, 2) + b"\xff\xfe"
    with pytest.raises(ProtocolError) as e:
        decode(header(len(payload), 0x13, id=1) + payload)
    assert e.value.code == ErrorCode.BAD_UTF8


def test_split_message_uses_more_and_continuations() -> None:
    body = bytes(range(256)) * 1000  # 256,000 bytes
    frames = proto.split_message(proto.Result(7, body), 65536)
    assert [type(f).__name__ for f in frames] == ["Result", "Continuation", "Continuation",
                                                  "Continuation"]
    assert [f.more for f in frames] == [True, True, True, False]
    wire = b"".join(proto.encode_frame(f) for f in frames)
    decoded = decode(wire, 65536)
    assert b"".join(bytes(f.body) for f in decoded) == body  # type: ignore[attr-defined]


def test_rows_builder_respects_the_target_size() -> None:
    c = open_worker()
    events(c, enc(proto.Request(9, 1, 1)))
    b = c.rows(9, 100)
    n = 0
    while b.append(b"x" * 10):
        n += 1
    assert n == 6  # 4 + 6 * 14 = 88; a 7th row would need 102 bytes
    (f,) = decode(b"".join(bytes(p) for p in b.finish()))
    assert isinstance(f, proto.Rows) and f.id == 9 and [bytes(r) for r in f] == [b"x" * 10] * 6
    assert c.credit(9) == 100 - 88


# -- property tests ----------------------------------------------------------------------------

ids = st.integers(min_value=1, max_value=2**64 - 1)
blobs = st.binary(max_size=300)
text = st.text(max_size=40)
frames = st.one_of(
    st.builds(proto.Request, ids, st.integers(0, 0xFFFF), st.integers(0, 255), blobs,
              st.integers(0, 2**64 - 1)),
    st.builds(proto.Cancel, ids),
    st.builds(proto.Result, ids, blobs),
    st.builds(proto.ErrorFrame, st.integers(0, 2**64 - 1).map(lambda _: 0) | ids,
              st.integers(0, 2**32 - 1), text, text),
    st.builds(proto.Rows, ids, st.lists(blobs, min_size=1, max_size=20)),
    st.builds(proto.End, ids, st.integers(0, 2**64 - 1), blobs),
    st.builds(proto.Credit, ids, st.integers(1, 2**32 - 1)),
    st.builds(proto.Event, ids, st.text(min_size=1, max_size=20).filter(
        lambda t: len(t.encode()) <= 255), text),
    st.builds(proto.Ping, st.binary(min_size=8, max_size=8)),
    st.builds(proto.Pong, st.binary(min_size=8, max_size=8)),
    st.builds(proto.Drain, st.integers(0, 2**32 - 1)),
    st.builds(proto.Goodbye, st.integers(0, 2**32 - 1)),
    st.builds(proto.Continuation, ids, blobs, st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames, min_size=1, max_size=8), st.lists(st.integers(1, 64), max_size=50))
def test_round_trip_any_chunking(fs: list[proto.Frame], cuts: list[int]) -> None:
    wire = b"".join(proto.encode_frame(f) for f in fs)
    dec = proto.FrameDecoder(proto.DEFAULT_MAX_FRAME_SIZE)
    out: list[proto.Frame] = []
    pos = 0
    for c in cuts + [len(wire)]:
        dec.receive(wire[pos:pos + c])
        pos += c
        while (f := dec.next_frame()) is not None:
            out.append(f)
        if pos >= len(wire):
            break
    dec.end_of_input()
    assert [to_json(f) for f in out] == [to_json(f) for f in fs]


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=0, max_size=200_000), st.integers(1, 70_000))
def test_split_message_round_trip(body: bytes, extra: int) -> None:
    mfs = 65536
    frames_ = proto.split_message(proto.End(3, 11, body), mfs)
    assert all(len(b"".join(bytes(p) for p in proto.encode_frame_parts(f))) - 16 <= mfs
               for f in frames_)
    decoded = decode(b"".join(proto.encode_frame(f) for f in frames_), mfs)
    got = bytes(decoded[0].summary) + b"".join(bytes(f.body) for f in decoded[1:])  # type: ignore[attr-defined]
    assert got == body


# -- connection ---------------------------------------------------------------------------------

HELLO = proto.Hello(pid=42, max_concurrency=4, methods=[
    proto.MethodInfo("add", proto.MethodKind.UNARY, [1, 2]),
    proto.MethodInfo("rows", proto.MethodKind.STREAM, [1]),
])
WELCOME = proto.Welcome(worker_id=1, max_frame_size=65536, initial_credit=100, max_in_flight=2,
                        max_message_size=200_000)


def enc(*fs: proto.Frame) -> bytes:
    return b"".join(proto.encode_frame(f) for f in fs)


def events(conn: proto.Connection, data: bytes) -> list[proto.Frame]:
    conn.receive(data)
    out = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


def open_parent() -> proto.Connection:
    c = proto.Connection("parent")
    assert [e.NAME for e in events(c, enc(HELLO))] == ["HELLO"]
    c.send(WELCOME)
    return c


def open_worker() -> proto.Connection:
    c = proto.Connection("worker")
    c.send(HELLO)
    assert [e.NAME for e in events(c, enc(WELCOME))] == ["WELCOME"]
    return c


def test_parent_stream_credit_and_row_count() -> None:
    c = open_parent()
    c.send(proto.Request(1, 1, 1, b"{}"))
    evs = events(c, enc(proto.Rows(1, [b"x" * 100])))  # payload 108 > credit 100: allowed once
    assert evs[0].NAME == "ROWS" and c.credit(1) == -8
    with pytest.raises(ProtocolError) as e:
        events(c, enc(proto.Rows(1, [b"y"])))
    assert e.value.code == ErrorCode.FLOW_CONTROL


def test_parent_late_vs_unknown_id() -> None:
    c = open_parent()
    c.send(proto.Request(1, 0, 1, b"{}"))
    assert [e.NAME for e in events(c, enc(proto.Result(1, b"3")))] == ["RESULT"]
    (late,) = events(c, enc(proto.Result(1, b"3")))
    assert isinstance(late, proto.Late) and late.frame == "RESULT"
    with pytest.raises(ProtocolError) as e:
        events(c, enc(proto.Result(2, b"3")))
    assert e.value.code == ErrorCode.UNKNOWN_ID


def test_parent_reassembles_and_limits_message_size() -> None:
    c = open_parent()
    c.send(proto.Request(1, 0, 1, b"{}"))
    body = b"z" * 150_000
    (ev,) = events(c, enc(*proto.split_message(proto.Result(1, body), 65536)))
    assert isinstance(ev, proto.Result) and bytes(ev.body) == body
    c.send(proto.Request(2, 0, 1, b"{}"))
    with pytest.raises(ProtocolError) as e:
        events(c, enc(*proto.split_message(proto.Result(2, b"q" * 250_000), 65536)))
    assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE


def _underlying(view: object) -> object:
    assert isinstance(view, memoryview)
    return view.obj


def test_continued_messages_land_in_one_buffer_reused_once_the_reader_lets_go() -> None:
    c = open_parent()
    results = []
    for rid, (fill, size) in enumerate([(1, 150_000), (2, 150_000), (3, 120_000), (4, 190_000)], 1):
        c.send(proto.Request(rid, 0, 1, b"{}"))
        (ev,) = events(c, enc(*proto.split_message(proto.Result(rid, bytes([fill]) * size), 65536)))
        assert isinstance(ev, proto.Result) and len(ev.body) == size
        results.append(ev.body)
    first, second, third, fourth = results
    # Each held while the next arrived: none was overwritten, none shares a buffer.
    assert bytes(first) == b"\x01" * 150_000 and bytes(second) == b"\x02" * 150_000
    assert len({id(_underlying(v)) for v in results}) == 4
    assert bytes(fourth) == b"\x04" * 190_000
    # Let go of the last one: the next message reuses its buffer (already mapped memory).
    reused = id(_underlying(fourth))  # the spare keeps it alive: this id cannot be recycled
    length = len(_underlying(fourth))  # type: ignore[arg-type]
    del results, first, second, third, fourth, ev
    c.send(proto.Request(5, 0, 1, b"{}"))
    (ev,) = events(c, enc(*proto.split_message(proto.Result(5, b"\x05" * 100_000), 65536)))
    assert id(_underlying(ev.body)) == reused
    assert bytes(ev.body) == b"\x05" * 100_000
    # Bounded: never longer than a message the connection accepted.
    assert length == len(_underlying(ev.body)) <= WELCOME.max_message_size  # type: ignore[arg-type,operator]


def test_continued_message_past_the_limit_is_refused_before_it_is_copied() -> None:
    c = open_parent()
    c.send(proto.Request(1, 0, 1, b"{}"))
    c.send(proto.Request(2, 0, 1, b"{}"))
    # Two messages in progress (120,000 bytes held), then a chunk taking the sum past 200,000.
    first = proto.split_message(proto.Result(1, b"a" * 190_000), 65536)
    second = proto.split_message(proto.Result(2, b"b" * 190_000), 65536)
    assert events(c, enc(first[0], second[0])) == []
    with pytest.raises(ProtocolError) as e:
        events(c, enc(first[1], first[2]))
    assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert c._incoming == {} and c._incoming_bytes == 0


def test_worker_rejects_overload_draining_unknown_codec() -> None:
    c = open_worker()
    evs = events(c, enc(proto.Request(1, 0, 1), proto.Request(2, 0, 1), proto.Request(3, 0, 1),
                        proto.Request(4, 9, 1), proto.Request(5, 1, 2)))
    assert [(e.NAME, getattr(e, "code", None)) for e in evs] == [
        ("REQUEST", None), ("REQUEST", None), ("REJECT", ErrorCode.OVERLOADED),
        ("REJECT", ErrorCode.UNKNOWN_METHOD), ("REJECT", ErrorCode.CODEC_UNSUPPORTED)]
    c.send(proto.Result(1, b"1"))
    evs = events(c, enc(proto.Drain(100), proto.Request(6, 0, 1)))
    assert [e.NAME for e in evs] == ["DRAIN", "REJECT"] and evs[1].code == ErrorCode.DRAINING
    with pytest.raises(ProtocolError) as e:
        events(c, enc(proto.Request(6, 0, 1)))
    assert e.value.code == ErrorCode.DUPLICATE_ID


def test_worker_credit_overflow_and_kind_mismatch() -> None:
    c = open_worker()
    events(c, enc(proto.Request(1, 1, 1), proto.Request(2, 0, 1)))
    with pytest.raises(ProtocolError) as e:
        events(c, enc(proto.Credit(2, 5)))
    assert e.value.code == ErrorCode.KIND_MISMATCH
    c = open_worker()
    events(c, enc(proto.Request(1, 1, 1)))
    with pytest.raises(ProtocolError) as e:
        events(c, enc(proto.Credit(1, 2**31 - 100)))
    assert e.value.code == ErrorCode.CREDIT_OVERFLOW


def test_frames_before_handshake_are_unexpected() -> None:
    c = proto.Connection("parent")
    with pytest.raises(ProtocolError) as e:
        events(c, enc(proto.Ping()))
    assert e.value.code == ErrorCode.UNEXPECTED_FRAME
    c = proto.Connection("worker")
    c.send(HELLO)
    with pytest.raises(ProtocolError) as e:
        events(c, enc(proto.Request(1, 0, 1)))
    assert e.value.code == ErrorCode.UNEXPECTED_FRAME


def test_wrong_direction_is_unexpected() -> None:
    c = open_parent()
    with pytest.raises(ProtocolError) as e:
        events(c, enc(proto.Request(1, 0, 1)))
    assert e.value.code == ErrorCode.UNEXPECTED_FRAME


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(1, 60), st.data())
def test_rows_of_one_size_take_the_fast_path_and_are_still_checked(size: int, count: int,
                                                                    data: st.DataObject) -> None:
    rows = [bytes([i % 251]) * size for i in range(count)]
    payload = struct.pack("<I", count) + b"".join(struct.pack("<I", size) + r for r in rows)
    f = proto.parse_payload(proto.FrameType.ROWS, 0, 7, memoryview(payload))
    assert [bytes(r) for r in f.rows] == rows
    for copy_rows in (False, True):
        f = proto.parse_payload(proto.FrameType.ROWS, 0, 7, memoryview(payload))
        assert f.decode(bytes, copy_rows) == rows
    if count < 2:
        return
    # One length field changed (total unchanged or not): never accepted as one-size rows.
    i = data.draw(st.integers(1, count - 1))
    delta = data.draw(st.sampled_from([1, -1, 256, 1 << 24]))
    bad = bytearray(payload)
    off = 4 + i * (size + 4)
    struct.pack_into("<I", bad, off, (size + delta) % (1 << 32))
    try:
        g = proto.parse_payload(proto.FrameType.ROWS, 0, 7, memoryview(bytes(bad)))
    except ProtocolError as e:
        assert e.code == ErrorCode.ROW_BOUNDS
    else:  # the lengths still tile the payload: then the rows are the lengths' rows
        total = sum(len(r) for r in g.rows)
        assert total + 4 * count + 4 == len(bad) and len(g.rows) == count
        assert bytes(g.rows[i - 1]) != rows[i - 1] or bytes(g.rows[i]) != rows[i]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 70), st.integers(1, 40)), min_size=1, max_size=12),
       st.data())
def test_rows_in_runs_of_one_size_are_sliced_by_run_and_still_checked(
        runs: list, data: st.DataObject) -> None:
    # Runs of one size (found by strided reads) between rows of other sizes (walked): the
    # same rows as a walk would give, decoded or sliced, and any length field changed is
    # either refused ROW_BOUNDS or gives the rows its lengths say.
    rows = [bytes([(i + k) % 251]) * size for k, (size, n) in enumerate(runs) for i in range(n)]
    payload = struct.pack("<I", len(rows)) + b"".join(struct.pack("<I", len(r)) + r for r in rows)
    f = proto.parse_payload(proto.FrameType.ROWS, 0, 7, memoryview(payload))
    assert [bytes(r) for r in f.rows] == rows
    for copy_rows in (False, True):
        f = proto.parse_payload(proto.FrameType.ROWS, 0, 7, memoryview(payload))
        assert f.decode(bytes, copy_rows) == rows
    i = data.draw(st.integers(0, len(rows) - 1))
    delta = data.draw(st.sampled_from([1, -1, 3, 256, 1 << 24, -(1 << 31)]))
    bad = bytearray(payload)
    off = 4 + sum(4 + len(r) for r in rows[:i])
    struct.pack_into("<I", bad, off, (len(rows[i]) + delta) % (1 << 32))
    try:
        g = proto.parse_payload(proto.FrameType.ROWS, 0, 7, memoryview(bytes(bad)))
    except ProtocolError as e:
        assert e.code == ErrorCode.ROW_BOUNDS
    else:  # the lengths still tile the payload: then the rows are the lengths' rows
        got = [bytes(r) for r in g.rows]
        assert len(got) == len(rows) and sum(map(len, got)) + 4 * len(rows) + 4 == len(bad)
        assert g.decode(bytes, True) == got


# -- batched fast paths: the same events, answers and errors as the frame-by-frame path ---------

def _worker_answer(c: proto.Connection, ev: proto.Frame, out: list) -> None:
    """A driver's answer to one event: method 0 with codec 1 and no timeout is answered at
    once (as inline handlers are), other requests stay in flight."""
    if isinstance(ev, proto.Request):
        if ev.method == 0 and ev.codec == 1 and not ev.timeout_us:
            try:
                arg = json.loads(bytes(ev.body))
            except ValueError:
                out += c.send_error(ev.id, ErrorCode.BAD_REQUEST, "bad body")
                return
            out += c.send_result(ev.id, json.dumps(arg).encode())
    elif isinstance(ev, proto.Reject):
        out += c.send_error(ev.id, ev.code, "rejected")
    elif isinstance(ev, proto.Ping):
        out += c.send_pong(ev.nonce)


def _run_worker(data: bytes, fast: bool) -> tuple[bytes, list, list, int | None]:
    """Both paths answer a run of REQUEST/REJECT events (taken by take_requests, or pulled by
    next_event) once the next other event is pulled, so their states can be compared."""
    c = open_worker()
    out: list = []
    seen: list = []
    run: list = []

    def answer_run() -> None:
        for ev in run:
            _worker_answer(c, ev, out)
        run.clear()

    try:
        c.receive(data)
        while True:
            if fast:
                taken: list = []
                c.take_requests(taken)
                for item in taken:
                    ev = item if isinstance(item, proto.Reject) else proto.Request(
                        item[0], item[1], item[2], item[4], item[3])
                    seen.append((ev.NAME, ev.id))
                    run.append(ev)
            ev = c.next_event()
            if ev is None:
                break
            seen.append((ev.NAME, ev.id))
            run.append(ev)
            if not isinstance(ev, (proto.Request, proto.Reject)):
                answer_run()
        answer_run()
    except ProtocolError as e:
        answer_run()
        return b"".join(bytes(p) for p in out), seen, c.in_flight_ids(), e.code
    return b"".join(bytes(p) for p in out), seen, c.in_flight_ids(), None


_request = st.builds(
    lambda id, m, codec, timeout, body: proto.Request(id, m, codec, body, timeout),
    st.integers(1, 40), st.sampled_from([0, 0, 0, 1, 9]), st.sampled_from([1, 1, 1, 2]),
    st.sampled_from([0, 0, 0, 5000]),
    st.sampled_from([b"1", b'{"a":1}', b'"fail"', b"not json", b"[1,2,3]"]))
_to_worker = st.one_of(_request, _request, _request, st.builds(proto.Ping),
                       st.builds(proto.Cancel, st.integers(1, 40)))


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(_to_worker, max_size=30))
def test_take_requests_matches_the_general_path(frames: list[proto.Frame]) -> None:
    # Most requests get the next id (runs of valid requests reach max_in_flight) and most
    # CANCELs an id already sent; ids drawn above 35 become 1-5 (duplicates, ids going
    # backwards, CANCEL of an id never sent).
    next_id = 0
    for i, f in enumerate(frames):
        raw = f.id - 35 if f.id > 35 else None
        if isinstance(f, proto.Request):
            if raw is None:
                next_id += 1
            frames[i] = proto.Request(raw or next_id, f.method, f.codec, f.body, f.timeout_us)
            next_id = max(next_id, raw or 0)
        elif isinstance(f, proto.Cancel):
            frames[i] = proto.Cancel(raw or max(1, min(f.id, next_id)))
    data = enc(*frames)
    assert _run_worker(data, True) == _run_worker(data, False)


WIDE_HELLO = proto.Hello(pid=42, max_concurrency=16, methods=HELLO.methods)


def _run_parent(n: int, data: bytes, fast: bool) -> tuple[list, int | None]:
    c = proto.Connection("parent")
    events(c, enc(WIDE_HELLO))
    c.send_welcome(proto.Welcome(max_frame_size=65536, initial_credit=100, max_in_flight=16))
    bodies = [b"%d" % i for i in range(n)]
    if fast:
        first, sent = c.send_requests(0, 1, bodies)
        assert first == 1
    else:
        sent = []
        for i, b in enumerate(bodies):
            id, parts = c.send_request(0, 1, 0, b)
            assert id == i + 1
            sent += parts
    id, parts = c.send_request(1, 1, 0, b"{}")  # a stream: RESULT on it is KIND_MISMATCH
    assert id == n + 1
    got: list = [b"".join(bytes(p) for p in sent + parts)]
    try:
        c.receive(data)
        while True:
            if fast:
                results: list = []
                c.take_results(results)
                it = iter(results)
                got += [("RESULT", id, bytes(body)) for id, body in zip(it, it)]
            ev = c.next_event()
            if ev is None:
                break
            got.append((ev.NAME, ev.id, bytes(getattr(ev, "body", b""))))
    except ProtocolError as e:
        return got, e.code
    return got, None


_to_parent = st.one_of(
    st.builds(proto.Result, st.integers(1, 12), st.sampled_from([b"1", b"[]"])),
    st.builds(proto.Result, st.integers(1, 12), st.just(b"x"), st.just(True)),  # MORE
    st.builds(proto.Continuation, st.integers(1, 12), st.just(b"y")),
    st.builds(proto.ErrorFrame, st.integers(1, 12), st.just(1001), st.just("e")),
    st.builds(proto.Rows, st.integers(1, 12), st.just([b"r"])),
    st.builds(proto.Ping))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10), st.lists(_to_parent, max_size=20))
def test_take_results_and_send_requests_match_the_general_path(
        n: int, frames: list[proto.Frame]) -> None:
    data = enc(*frames)
    fast = _run_parent(n, data, fast=True)
    assert fast == _run_parent(n, data, fast=False)


def _run_parent_reads(n: int, data: bytes, cuts: list[int], fused: bool) -> tuple[list, Any]:
    """A parent with ``n`` unary requests and a stream in flight reading ``data`` in reads that
    end at ``cuts``, through read_buffer: received_results, or received then take_results."""
    c = proto.Connection("parent")
    events(c, enc(WIDE_HELLO))
    c.send_welcome(proto.Welcome(max_frame_size=65536, initial_credit=100, max_in_flight=16))
    c.send_requests(0, 1, [b"%d" % i for i in range(n)])
    c.send_request(1, 1, 0, b"{}")
    got: list = []
    start = 0
    try:
        for stop in sorted(set(cuts)) + [len(data)]:
            if stop <= start:
                continue
            chunk = data[start:stop]
            start = stop
            buf = c.read_buffer()
            buf[:len(chunk)] = chunk
            results: list = []
            if fused:
                took = c.received_results(len(chunk), results)
            else:
                c.received(len(chunk))
                took = c.take_results(results)
            it = iter(results)
            got += [("RESULT", id, bytes(body)) for id, body in zip(it, it)]
            got.append(("took", took, c.incomplete_frame_len()))
            while (ev := c.next_event()) is not None:
                got.append((ev.NAME, ev.id, bytes(getattr(ev, "body", b""))))
    except ProtocolError as e:
        return got, e.code
    return got, sorted(c.in_flight_ids())


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10), st.lists(_to_parent, max_size=12),
       st.lists(st.integers(0, 300), max_size=6))
def test_received_results_matches_received_then_take_results(
        n: int, frames: list[proto.Frame], cuts: list[int]) -> None:
    data = enc(*frames)
    assert (_run_parent_reads(n, data, cuts, fused=True)
            == _run_parent_reads(n, data, cuts, fused=False))


def test_received_results_takes_one_whole_result_of_one_read() -> None:
    one = enc(proto.Result(1, b"42"))
    got, in_flight = _run_parent_reads(2, one, [], fused=True)
    assert got == [("RESULT", 1, b"42"), ("took", True, 0)] and in_flight == [2, 3]


@pytest.mark.parametrize("value", [0x01, 0x80])
@pytest.mark.parametrize("at", [4, 5, 6, 7, 19])  # type, flags, reserved, the prefix's zero byte
def test_take_requests_leaves_a_frame_with_a_flag_or_a_reserved_bit_to_the_general_path(
        at: int, value: int) -> None:
    # take_requests reads type, flags and reserved field as one number: any bit set in one of
    # them stops the batch there, and next_event decides (a continued request, a violation).
    data = bytearray(enc(*[proto.Request(i, 0, 1, b"%d" % i) for i in (1, 2, 3)]))
    data[29 + at] ^= value  # the second request (29 bytes each)
    c = open_worker()
    c.receive(bytes(data))
    taken: list = []
    assert not c.take_requests(taken) and [t[0] for t in taken] == [1]
    assert _run_worker(bytes(data), True) == _run_worker(bytes(data), False)


@pytest.mark.parametrize("value", [0x01, 0x80])
@pytest.mark.parametrize("at", [4, 5, 6, 7])
def test_take_results_leaves_a_frame_with_a_flag_or_a_reserved_bit_to_the_general_path(
        at: int, value: int) -> None:
    data = bytearray(enc(*[proto.Result(i, b"%d" % i) for i in (1, 2, 3)]))
    data[17 + at] ^= value  # the second result (17 bytes each)
    assert _run_parent(3, bytes(data), True) == _run_parent(3, bytes(data), False)
    c = proto.Connection("parent")
    events(c, enc(WIDE_HELLO))
    c.send_welcome(proto.Welcome(max_frame_size=65536, initial_credit=100, max_in_flight=16))
    c.send_requests(0, 1, [b"a", b"b", b"c"])
    c.receive(bytes(data))
    taken: list = []
    assert not c.take_results(taken) and taken[::2] == [1]


def test_fast_paths_leave_a_partial_frame_to_the_decoder() -> None:
    c = open_worker()
    data = enc(proto.Request(1, 0, 1, b"7"), proto.Request(2, 0, 1, b"8"))
    taken: list = []
    c.receive(data[:-3])
    c.take_requests(taken)
    assert [(t[0], bytes(t[4])) for t in taken] == [(1, b"7")]
    assert c.next_event() is None  # the second request is not complete yet
    assert c.incomplete_frame_len() == len(data) // 2 - 3
    c.receive(data[-3:])
    # The decoder holds the half-received frame: the general path completes it.
    taken.clear()
    c.take_requests(taken)
    assert taken == []
    ev = c.next_event()
    assert isinstance(ev, proto.Request) and ev.id == 2 and bytes(ev.body) == b"8"
    assert c.in_flight_ids() == [1, 2] and c.incomplete_frame_len() == 0


def _gather(dec: proto.FrameDecoder, wire: bytes, chunk: int) -> list[proto.Frame]:
    """Feed ``wire`` in ``chunk``-byte pieces, the large ones received through writable()."""
    out: list[proto.Frame] = []
    pos = 0
    while pos < len(wire):
        direct = dec.writable(1)
        if direct is not None:
            n = min(len(direct), chunk, len(wire) - pos)
            direct[:n] = wire[pos:pos + n]
            dec.wrote(n)
            dec.receive(b"")
        else:
            n = min(chunk, len(wire) - pos)
            dec.receive(wire[pos:pos + n])
        pos += n
        while (f := dec.next_frame()) is not None:
            out.append(f)
    dec.end_of_input()
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(65_536, 400_000), st.booleans()), min_size=1, max_size=8),
       st.integers(1000, 300_000))
def test_reused_large_frame_buffers_never_overwrite_a_held_payload(
        sizes: list[tuple[int, bool]], chunk: int) -> None:
    """Large frames are gathered in reused buffers: a payload someone still holds keeps its
    bytes, whatever frames come after it, and one released is the buffer reused."""
    dec = proto.FrameDecoder(proto.DEFAULT_MAX_FRAME_SIZE)
    held: list[tuple[memoryview, bytes]] = []
    for k, (size, keep) in enumerate(sizes):
        body = bytes([k % 251]) * size
        (f,) = _gather(dec, proto.encode_frame(proto.Result(k + 1, body)), chunk)
        assert bytes(f.body) == body  # type: ignore[attr-defined]
        if keep:
            held.append((f.body, body))  # type: ignore[attr-defined]
        del f
        for view, want in held:
            assert view == want


def test_released_large_frame_buffer_is_reused() -> None:
    dec = proto.FrameDecoder(proto.DEFAULT_MAX_FRAME_SIZE)
    wire = proto.encode_frame(proto.Result(1, b"x" * 500_000))
    first = _gather(dec, wire, 100_000)[0].body  # type: ignore[attr-defined]
    second = _gather(dec, wire, 100_000)[0].body  # type: ignore[attr-defined]
    assert second.obj is not first.obj  # the first payload is still held
    # (ids, not the buffers: a reference to a buffer is exactly what keeps it from reuse)
    earlier = {id(first.obj), id(second.obj)}
    del first, second
    third = _gather(dec, wire, 100_000)[0].body  # type: ignore[attr-defined]
    assert id(third.obj) in earlier and bytes(third) == b"x" * 500_000
