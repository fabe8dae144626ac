"""The core API of PROTOCOL.md section 14 (names, ownership, typed refusal, batch operations),
on proto.Connection directly."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wirepool import proto
from wirepool.errors import ErrorCode, ProtocolError

UNARY, STREAM = 0, 1  # method indexes in HELLO
HELLO = proto.Hello(pid=42, max_concurrency=4, methods=[
    proto.MethodInfo("add", proto.MethodKind.UNARY, [1, 2]),
    proto.MethodInfo("rows", proto.MethodKind.STREAM, [1]),
])
WELCOME = proto.Welcome(worker_id=1, max_frame_size=65536, initial_credit=100, max_in_flight=2,
                        max_message_size=200_000)
NONCE = b"12345678"


def enc(*fs: proto.Frame) -> bytes:
    return b"".join(proto.encode_frame(f) for f in fs)


def wire(parts: list) -> bytes:
    return b"".join(bytes(p) for p in parts)


def frames_of(parts: list) -> list[proto.Frame]:
    return proto.decode_all(wire(parts))


def events(c: proto.Connection, data: bytes) -> list[proto.Frame]:
    c.receive(data)
    out: list = []
    c.next_events(out)
    return out


def parent() -> proto.Connection:
    c = proto.Connection("parent")
    assert [e.NAME for e in events(c, enc(HELLO))] == ["HELLO"]
    c.send_welcome(WELCOME)
    return c


def worker(*requests: proto.Request) -> proto.Connection:
    c = proto.Connection("worker")
    c.send_hello(HELLO)
    assert [e.NAME for e in events(c, enc(WELCOME, *requests))][0] == "WELCOME"
    return c


def snapshot(c: proto.Connection) -> tuple:
    """Everything a refusal must leave as it was."""
    ids = c.in_flight_ids()
    reqs = [(c._requests[i].credit, c._requests[i].rows, c._requests[i].consumed) for i in ids]
    return (c.is_open(), ids, reqs, c.is_draining(), c.is_goodbye(), c.can_send_request(),
            c.failure(), c._last_id, sorted(c._rejected), dict(c._outgoing), c._fatal_sent,
            c.incomplete_frame_len())


# -- ids, grants, names -------------------------------------------------------------------------

def test_the_parent_core_allocates_request_ids() -> None:
    c = parent()
    id, parts = c.send_request(UNARY, 1, 0, b"{}")
    assert id == 1 and frames_of(parts) == [proto.Request(1, UNARY, 1, b"{}")]
    id, parts = c.send_request(STREAM, 1, 5000, b"x" * 100_000)  # split: MORE + CONTINUATION
    assert id == 2
    assert [f.NAME for f in frames_of(parts)] == ["REQUEST", "CONTINUATION"]
    assert c.in_flight_ids() == [1, 2] and not c.can_send_request()
    events(c, enc(proto.Result(1, b"3")))
    first, parts = c.send_requests(UNARY, 1, [b"7"])
    assert first == 3 and frames_of(parts) == [proto.Request(3, UNARY, 1, b"7")]


def test_consumed_applies_the_half_window_grant_policy() -> None:
    c = parent()
    id, _ = c.send_request(STREAM, 1, 0, b"{}")
    rows = proto.Rows(id, [b"x" * 52])  # a 60-byte payload
    events(c, enc(rows))
    assert c.consumed(id, 30) == (0, [])  # below half the window (50)
    granted, parts = c.consumed(id, 30)
    assert granted == 60 and frames_of(parts) == [proto.Credit(id, 60)]
    assert c.credit(id) == 100 and c.consumed(id, 0) == (0, [])
    events(c, enc(proto.End(id, 1)))
    assert c.consumed(id, 1000) == (0, [])  # the stream has ended: nothing more is granted


def test_rows_nobody_reads_are_granted_after_a_cancel() -> None:
    c = parent()
    id, _ = c.send_request(STREAM, 1, 0, b"{}")
    events(c, enc(proto.Rows(id, [b"x" * 92])))  # the whole window: the worker must wait
    c.send_cancel(id)
    # The caller is gone; the driver still reports the rows, and the core still grants.
    granted, parts = c.consumed(id, 100)
    assert granted == 100 and frames_of(parts) == [proto.Credit(id, 100)]


def test_grants_never_take_the_counter_above_two_to_the_31() -> None:
    c = parent()
    id, _ = c.send_request(STREAM, 1, 0, b"{}")
    c.send_credit(id, proto.MAX_CREDIT - 200)
    granted, parts = c.consumed(id, 10_000)
    assert granted == 100 and c.credit(id) == proto.MAX_CREDIT


def test_read_buffer_lands_large_payloads_in_their_frame() -> None:
    c = parent()
    id, _ = c.send_request(UNARY, 1, 0, b"{}")
    data = enc(proto.Result(id, b"z" * 60_000), proto.Ping(NONCE))
    view = c.read_buffer()
    view[:1000] = data[:1000]
    c.received(1000)
    assert c.next_event() is None and c.incomplete_frame_len() == 1000
    pos = 1000
    while pos < len(data):
        view = c.read_buffer()
        n = min(len(view), len(data) - pos)
        view[:n] = data[pos:pos + n]
        c.received(n)
        pos += n
    out: list = []
    c.next_events(out)
    assert [e.NAME for e in out] == ["RESULT", "PING"] and bytes(out[0].body) == b"z" * 60_000
    assert c.incomplete_frame_len() == 0


def test_event_frames_are_notifications() -> None:
    c = parent()
    id, _ = c.send_request(STREAM, 1, 0, b"{}")
    (ev,) = events(c, enc(proto.Event(id, "progress", "1")))
    assert isinstance(ev, proto.Notification) and proto.Notification is proto.Event


def test_rows_builder_frames_rows_and_the_core_counts_them() -> None:
    c = worker(proto.Request(1, STREAM, 1))
    events(c, enc(proto.Credit(1, 1000)))
    rows = [b"a", b"bb", b"", b"ccc" * 10]
    b = c.rows(1)
    assert b.extend(rows) == 4
    (f,) = frames_of(b.finish())
    assert isinstance(f, proto.Rows) and [bytes(r) for r in f] == rows
    framed = c.rows(1)
    assert framed.extend([proto.framed_row(r) for r in rows], framed=True) == 4
    assert framed.append(b"d")
    (g,) = frames_of(framed.finish())
    assert [bytes(r) for r in g] == rows + [b"d"]
    same = c.rows(1, 20)  # a target of 20 payload bytes: 4 + 2 * 8
    assert same.extend([b"four"] * 5) == 2 and same.count == 2
    assert same.extend([b"four"] * 5, full_only=True) == 0
    (h,) = frames_of(same.finish())
    assert [bytes(r) for r in h] == [b"four"] * 2
    (end,) = frames_of(c.send_end(1, b"s"))
    assert end == proto.End(1, 4 + 5 + 2, b"s")  # the row count is the core's


@pytest.mark.parametrize("more", [[b"four"] * 3, [b"a", b"bb", b"ccc"]])
def test_rows_builder_extends_a_frame_that_already_has_rows(more: list) -> None:
    # A builder holding rows takes more, of one size or several, each after its own length
    # field (rows of one size once got theirs twice).
    c = worker(proto.Request(1, STREAM, 1))
    events(c, enc(proto.Credit(1, 1000)))
    b = c.rows(1)
    assert b.append(b"xyz")
    assert b.extend(list(more)) == len(more)
    assert b.extend(list(more)) == len(more)  # and once more
    (f,) = frames_of(b.finish())
    assert [bytes(r) for r in f] == [b"xyz"] + more + more
    # A frame begun by extend (built with its header) then extended: one header, all rows.
    b = c.rows(1)
    assert b.extend(list(more)) == len(more)
    assert b.extend([b"xyz"]) == 1
    assert b.append(b"w")
    (g,) = frames_of(b.finish())
    assert [bytes(r) for r in g] == more + [b"xyz", b"w"]
    assert b.count == 0 and b.extend(list(more)) == len(more)  # it starts empty again
    (h,) = frames_of(b.finish())
    assert [bytes(r) for r in h] == more


def test_rows_builder_pads_rows_with_a_table_of_prefixes() -> None:
    # What a JSON producer passes: rows of 1 and 2 bytes padded to 3 with leading spaces;
    # the frame's size counts the padding, and the frame has one row size.
    c = worker(proto.Request(1, STREAM, 1))
    events(c, enc(proto.Credit(1, 1000)))
    table = list(proto.ROW_PREFIXES)
    table[1] = proto.ROW_PREFIXES[3] + b"  "
    table[2] = proto.ROW_PREFIXES[3] + b" "
    b = c.rows(1)
    assert b.extend([b"1", b"22", b"333", b"4444"], prefixes=table) == 4
    assert b.size == 4 + 3 * 7 + 8
    (f,) = frames_of(b.finish())
    assert [bytes(r) for r in f] == [b"  1", b" 22", b"333", b"4444"]
    b = c.rows(1)
    assert b.extend([b"1", b"22", b"333"], prefixes=table) == 3
    (g,) = frames_of(b.finish())
    assert g._pieces == [(4, 3, 3)]  # one size: sliced without a loop
    # Padding that would pass the frame limit is left out.
    small = proto.RowsBuilder(c, 1, 17, 17)  # padded: 18 bytes
    assert small.extend([b"1", b"22"], prefixes=table) == 2 and small.size == 4 + 5 + 6


def test_a_builder_may_be_filled_elsewhere_and_finished_later() -> None:
    c = worker(proto.Request(1, STREAM, 1))
    built = []
    for _ in range(3):
        b = c.rows(1)
        b.append(b"x" * 60)  # payload 68: two frames take the 100-byte window below zero
        built.append(b)
    assert c.credit(1) == 100  # filling charges nothing
    built[0].finish()
    built[1].finish()
    assert c.credit(1) == -36 and not c.can_send_rows(1)
    with pytest.raises(ProtocolError) as e:
        built[2].finish()
    assert e.value.code == ErrorCode.FLOW_CONTROL
    events(c, enc(proto.Credit(1, 100)))
    (f,) = frames_of(built[2].finish())  # still usable after the refusal
    assert isinstance(f, proto.Rows) and c.credit(1) == -4


def test_send_results_is_send_result_for_each() -> None:
    reqs = [proto.Request(i, UNARY, 1, b"1") for i in (1, 2)]
    fast, slow = worker(*reqs), worker(*reqs)
    big = b"y" * 70_000  # two frames
    assert wire(fast.send_results([(1, b"a"), (2, big)])) == \
        wire(slow.send_result(1, b"a") + slow.send_result(2, big))
    assert fast.in_flight_ids() == slow.in_flight_ids() == []


WIDE = proto.Hello(pid=42, max_concurrency=16, methods=HELLO.methods)


def _wide_worker(kinds: list[int]) -> proto.Connection:
    c = proto.Connection("worker")
    c.send_hello(WIDE)
    welcome = proto.Welcome(worker_id=1, max_frame_size=65536, initial_credit=100,
                            max_in_flight=16, max_message_size=200_000)
    reqs = [proto.Request(i + 1, k, 1, b"1") for i, k in enumerate(kinds)]
    events(c, enc(welcome, *reqs))
    return c


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(st.sampled_from([UNARY, UNARY, UNARY, STREAM]), max_size=8),
       results=st.lists(st.tuples(st.integers(1, 10),
                                  st.sampled_from([0, 3, 4095, 4096, 70_000, 200_001])),
                        max_size=8),
       two_lists=st.booleans())
def test_send_results_is_send_result_for_each_or_refuses_as_it(
        kinds: list[int], results: list[tuple[int, int]], two_lists: bool) -> None:
    # Ids drawn past the requests sent are unknown, ids drawn twice a second terminal, stream
    # ids a kind mismatch, 70,000 bytes two frames, 200,001 above max_message_size.
    pairs = [(id, bytes([65 + id]) * size) for id, size in results]
    slow = _wide_worker(kinds)
    wired: list = []
    code = None
    for id, body in pairs:
        try:
            wired += slow.send_result(id, body)
        except ProtocolError as e:
            code = e.code
            break
    fast = _wide_worker(kinds)
    before = snapshot(fast)
    ids, bodies = [id for id, _ in pairs], [body for _, body in pairs]
    if code is None:
        sent = fast.send_results(ids, bodies) if two_lists else fast.send_results(pairs)
        assert wire(sent) == wire(wired)
        assert fast.in_flight_ids() == slow.in_flight_ids()
    else:
        with pytest.raises(ProtocolError) as e:
            fast.send_results(ids, bodies) if two_lists else fast.send_results(pairs)
        assert e.value.code == code
        assert snapshot(fast) == before  # a refusal sends none and changes nothing


def test_send_results_wants_as_many_ids_as_bodies() -> None:
    c = worker(proto.Request(1, UNARY, 1))
    with pytest.raises(ValueError):
        c.send_results([1], [])
    assert c.send_results([], []) == c.send_results([]) == [] and c.in_flight_ids() == [1]


def test_a_large_request_goes_one_frame_at_a_time_with_others_between() -> None:
    c = parent()
    big = bytes(range(256)) * 700  # 179,200 bytes: a REQUEST and two CONTINUATIONs
    cursor, parts = c.begin_request(UNARY, 1, 0, big)
    assert cursor.id == 1 and not cursor.is_done() and cursor.remaining() == len(big) - 65_524
    _, small = c.send_request(UNARY, 1, 0, b"s")  # not blocked by the message in progress
    wired = parts + small
    done = False
    while not done:
        done, parts = c.send_next_frame(cursor)
        wired += parts
    assert cursor.is_done() and cursor.remaining() == 0
    assert c.send_next_frame(cursor) == (True, [])  # a no-op once done
    w = worker()
    reqs = [(e.id, bytes(e.body)) for e in events(w, wire(wired))]
    assert reqs == [(2, b"s"), (1, big)]  # the small one arrived whole before the large one
    assert wire(wired) != wire(parent().send_request(UNARY, 1, 0, big)[1])  # interleaved


def test_a_cancel_abandons_a_request_being_sent() -> None:
    c = parent()
    cursor, _ = c.begin_request(UNARY, 1, 0, b"x" * 150_000)
    c.send_cancel(cursor.id)
    with pytest.raises(ProtocolError) as e:
        c.send_next_frame(cursor)
    assert e.value.code == ErrorCode.CONTINUATION
    assert c.is_in_flight(cursor.id)  # until its terminal arrives


def test_begin_result_and_begin_end_match_their_one_call_forms() -> None:
    reqs = [proto.Request(1, UNARY, 1, b"1"), proto.Request(2, STREAM, 1, b"1")]
    fast, slow = worker(*reqs), worker(*reqs)
    body = b"r" * 140_000
    cursor, parts = fast.begin_result(1, body)
    while not cursor.is_done():
        parts += fast.send_next_frame(cursor)[1]
    assert wire(parts) == wire(slow.send_result(1, body))
    slow_b = slow.rows(2)
    slow_b.append(b"row")
    slow_b.finish()
    b = fast.rows(2)
    b.append(b"row")
    b.finish()
    cursor, parts = fast.begin_end(2, b"s" * 70_000)
    while not cursor.is_done():
        parts += fast.send_next_frame(cursor)[1]
    assert wire(parts) == wire(slow.send_end(2, b"s" * 70_000))
    assert fast.in_flight_ids() == slow.in_flight_ids() == []


def test_begin_refuses_as_the_one_call_forms_do() -> None:
    c = parent()
    before = snapshot(c)
    with pytest.raises(ProtocolError) as e:
        c.begin_request(UNARY, 1, 0, b"x" * 200_000)  # above max_message_size
    assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE and snapshot(c) == before
    w = worker(proto.Request(1, UNARY, 1, b"1"))
    with pytest.raises(ProtocolError) as e:
        w.begin_end(1, b"x")
    assert e.value.code == ErrorCode.KIND_MISMATCH


def test_take_requests_hands_the_driver_requests_and_rejects_in_order() -> None:
    c = worker()
    c.receive(enc(proto.Request(1, UNARY, 1, b"a"), proto.Request(2, UNARY, 2, b"b", 7),
                  proto.Request(3, UNARY, 1, b"c"), proto.Request(4, 9, 1, b"d"),
                  proto.Ping(NONCE), proto.Request(5, UNARY, 1, b"e")))
    taken: list = []
    c.take_requests(taken)
    assert [t if isinstance(t, proto.Reject) else (t[0], t[1], t[2], t[3], bytes(t[4]))
            for t in taken] == [(1, UNARY, 1, 0, b"a"), (2, UNARY, 2, 7, b"b"),
                                proto.Reject(3, ErrorCode.OVERLOADED),
                                proto.Reject(4, ErrorCode.UNKNOWN_METHOD)]
    assert isinstance(c.next_event(), proto.Ping)  # the batch stopped at the PING
    assert frames_of(c.send_error(3, ErrorCode.OVERLOADED)) == [
        proto.ErrorFrame(3, ErrorCode.OVERLOADED)]
    c.send_result(1, b"A")
    taken.clear()
    c.take_requests(taken)
    assert [t[0] for t in taken] == [5]


def test_an_error_too_large_for_a_frame_keeps_its_code() -> None:
    c = worker(proto.Request(1, UNARY, 1))
    (f,) = frames_of(c.send_error(1, 203, "m" * 70_000, '{"d":"' + "d" * 70_000 + '"}'))
    assert isinstance(f, proto.ErrorFrame) and f.code == 203
    assert '"truncated": true' in f.details and len(f.message) < 65_536


# -- refusal: every row of the table of section 14.3 --------------------------------------------

Case = Callable[[], tuple[proto.Connection, Callable[[], Any]]]


def _stream_parent() -> proto.Connection:
    c = parent()
    c.send_request(STREAM, 1, 0, b"{}")
    return c


def _unary_parent() -> proto.Connection:
    c = parent()
    c.send_request(UNARY, 1, 0, b"{}")
    return c


def _after_goodbye() -> tuple[proto.Connection, Callable[[], Any]]:
    c = worker(proto.Request(1, UNARY, 1))
    c.send_goodbye()
    return c, lambda: c.send_result(1, b"")


def _after_fatal() -> tuple[proto.Connection, Callable[[], Any]]:
    c = parent()
    c.send_fatal(ProtocolError(ErrorCode.BAD_PAYLOAD, "x"))
    return c, lambda: c.send_ping(NONCE)


def _after_drain() -> tuple[proto.Connection, Callable[[], Any]]:
    c = parent()
    c.send_drain(100)
    return c, lambda: c.send_request(UNARY, 1, 0, b"")


def _overloaded() -> tuple[proto.Connection, Callable[[], Any]]:
    c = parent()
    c.send_request(UNARY, 1, 0, b"")
    c.send_request(UNARY, 1, 0, b"")
    return c, lambda: c.send_request(UNARY, 1, 0, b"")


def _duplicate() -> tuple[proto.Connection, Callable[[], Any]]:
    c = parent()
    c.send_request(UNARY, 1, 0, b"")
    return c, lambda: c.send(proto.Request(1, UNARY, 1, b""))


def _second_terminal() -> tuple[proto.Connection, Callable[[], Any]]:
    c = worker(proto.Request(1, UNARY, 1))
    c.send_result(1, b"")
    return c, lambda: c.send_error(1, 203)


def _no_credit() -> tuple[proto.Connection, Callable[[], Any]]:
    c = worker(proto.Request(1, STREAM, 1))
    b = c.rows(1)
    b.append(b"x" * 200)
    b.finish()  # 208 bytes against 100 of credit: allowed once
    nxt = c.rows(1)
    nxt.append(b"y")
    return c, nxt.finish


def _end_count() -> tuple[proto.Connection, Callable[[], Any]]:
    c = worker(proto.Request(1, STREAM, 1))
    return c, lambda: c.send(proto.End(1, 5))


def _mid_message() -> tuple[proto.Connection, Callable[[], Any]]:
    c = worker(proto.Request(1, UNARY, 1))
    c.send(proto.Result(1, b"a", more=True))
    return c, lambda: c.send_event(1, "t")


def _mid_request() -> tuple[proto.Connection, Callable[[], Any]]:
    c = parent()
    c.send(proto.Request(1, STREAM, 1, b"a", more=True))
    return c, lambda: c.send_credit(1, 10)


def _row(action: Callable[[proto.Connection], Any],
         make: Callable[[], proto.Connection]) -> Case:
    def case() -> tuple[proto.Connection, Callable[[], Any]]:
        c = make()
        return c, lambda: action(c)
    return case


def _unary_worker() -> proto.Connection:
    return worker(proto.Request(1, UNARY, 1))


def _stream_worker() -> proto.Connection:
    return worker(proto.Request(1, STREAM, 1))


def _fresh_parent() -> proto.Connection:
    return proto.Connection("parent")


def _rows_on(c: proto.Connection, id: int) -> Any:
    b = c.rows(id)
    b.append(b"r")
    return b.finish()


REFUSALS: list[tuple[str, Case, int]] = [
    ("before handshake", _row(lambda c: c.send_cancel(1), _fresh_parent),
     ErrorCode.UNEXPECTED_FRAME),
    ("request before handshake", _row(lambda c: c.send_request(UNARY, 1, 0, b""),
                                      _fresh_parent), ErrorCode.UNEXPECTED_FRAME),
    ("after GOODBYE", _after_goodbye, ErrorCode.UNEXPECTED_FRAME),
    ("after a fatal report", _after_fatal, ErrorCode.UNEXPECTED_FRAME),
    ("a type the parent cannot send", _row(lambda c: c.send(proto.Result(1, b"")), parent),
     ErrorCode.UNEXPECTED_FRAME),
    ("a request ERROR from the parent", _row(lambda c: c.send_error(1, 203), _stream_parent),
     ErrorCode.UNEXPECTED_FRAME),
    ("a type the worker cannot send", _row(lambda c: c.send_request(UNARY, 1, 0, b""),
                                           _unary_worker), ErrorCode.UNEXPECTED_FRAME),
    ("REQUEST after DRAIN", _after_drain, ErrorCode.DRAINING),
    ("method not in HELLO", _row(lambda c: c.send_request(7, 1, 0, b""), parent),
     ErrorCode.UNKNOWN_METHOD),
    ("max_in_flight reached", _overloaded, ErrorCode.OVERLOADED),
    ("REQUEST id not above the last", _duplicate, ErrorCode.DUPLICATE_ID),
    ("CANCEL unknown", _row(lambda c: c.send_cancel(5), parent), ErrorCode.UNKNOWN_ID),
    ("CREDIT unknown", _row(lambda c: c.send_credit(5, 10), parent), ErrorCode.UNKNOWN_ID),
    ("RESULT unknown", _row(lambda c: c.send_result(9, b""), _unary_worker), ErrorCode.UNKNOWN_ID),
    ("ROWS unknown", _row(lambda c: _rows_on(c, 9), _stream_worker), ErrorCode.UNKNOWN_ID),
    ("END unknown", _row(lambda c: c.send_end(9), _stream_worker), ErrorCode.UNKNOWN_ID),
    ("ERROR unknown", _row(lambda c: c.send_error(9, 203), _unary_worker), ErrorCode.UNKNOWN_ID),
    ("EVENT unknown", _row(lambda c: c.send_event(9, "t"), _unary_worker), ErrorCode.UNKNOWN_ID),
    ("a second terminal", _second_terminal, ErrorCode.UNKNOWN_ID),
    ("CREDIT overflow", _row(lambda c: c.send_credit(1, proto.MAX_CREDIT), _stream_parent),
     ErrorCode.CREDIT_OVERFLOW),
    ("ROWS without credit", _no_credit, ErrorCode.FLOW_CONTROL),
    ("ROWS on unary", _row(lambda c: _rows_on(c, 1), _unary_worker), ErrorCode.KIND_MISMATCH),
    ("END on unary", _row(lambda c: c.send_end(1), _unary_worker), ErrorCode.KIND_MISMATCH),
    ("RESULT on a stream", _row(lambda c: c.send_result(1, b""), _stream_worker),
     ErrorCode.KIND_MISMATCH),
    ("CREDIT on unary", _row(lambda c: c.send_credit(1, 5), _unary_parent),
     ErrorCode.KIND_MISMATCH),
    ("END row_count", _end_count, ErrorCode.ROW_COUNT_MISMATCH),
    ("frame above max_frame_size", _row(lambda c: c.send(proto.Result(1, b"x" * 70_000)),
                                        _unary_worker), ErrorCode.FRAME_TOO_LARGE),
    ("row too large", _row(lambda c: c.rows(1).append(b"x" * 65_529), _stream_worker),
     ErrorCode.ROW_TOO_LARGE),
    ("request body", _row(lambda c: c.send_request(UNARY, 1, 0, b"x" * 199_989), parent),
     ErrorCode.MESSAGE_TOO_LARGE),
    ("requests' bodies", _row(lambda c: c.send_requests(UNARY, 1, [b"", b"x" * 199_989]), parent),
     ErrorCode.MESSAGE_TOO_LARGE),
    ("result", _row(lambda c: c.send_result(1, b"x" * 200_001), _unary_worker),
     ErrorCode.MESSAGE_TOO_LARGE),
    ("results", _row(lambda c: c.send_results([(1, b""), (2, b"x" * 200_001)]),
                     lambda: worker(proto.Request(1, UNARY, 1), proto.Request(2, UNARY, 1))),
     ErrorCode.MESSAGE_TOO_LARGE),
    ("summary", _row(lambda c: c.send_end(1, b"x" * 199_993), _stream_worker),
     ErrorCode.MESSAGE_TOO_LARGE),
    ("CONTINUATION with nothing being sent", _row(lambda c: c.send(proto.Continuation(1, b"x")),
                                                  _unary_worker), ErrorCode.CONTINUATION),
    ("another frame mid-message", _mid_message, ErrorCode.CONTINUATION),
    ("CREDIT mid-request", _mid_request, ErrorCode.CONTINUATION),
]


@pytest.mark.parametrize("case,code", [(c, code) for _, c, code in REFUSALS],
                         ids=[name for name, _, _ in REFUSALS])
def test_a_refused_send_raises_its_code_and_changes_nothing(case: Case, code: int) -> None:
    c, send = case()
    before = snapshot(c)
    with pytest.raises(ProtocolError) as e:
        send()
    assert (e.value.code, e.value.name) == (code, ErrorCode(code).name), e.value
    assert e.value.message
    assert snapshot(c) == before
    assert c.failure() is None  # a refusal does not fail the connection
    if c.is_open() and not c.is_goodbye() and not c._fatal_sent:
        assert frames_of(c.send_ping(NONCE)) == [proto.Ping(NONCE)]  # and it still sends


def test_the_allowed_boundaries_are_not_refused() -> None:
    c = parent()
    c.send_request(UNARY, 1, 0, b"x" * 199_988)  # exactly max_message_size with its prefix
    w = worker(proto.Request(1, UNARY, 1), proto.Request(2, STREAM, 1))
    w.send_result(1, b"x" * 200_000)
    w.rows(2).append(b"x" * 65_528)  # the largest row of a 65,536-byte frame
    w.send_end(2, b"x" * 199_992)
