"""The core's policies (PROTOCOL.md 14.5) against every case of spec/vectors/policies.json,
read at test time, and a few properties beyond the cases (hypothesis).

negotiate, rows_batch_bytes, grant, fit_error and stream_window are pure functions of proto; the connection
operations that apply them (Connection.consumed, send_error) are checked here too, on a live
core, so that a driver's answer is the function's answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wirepool import proto
from wirepool.errors import ErrorCode, InvalidArgument, ProtocolError
from wirepool.proto import MethodInfo, MethodKind

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "spec" / "vectors" / "policies.json")
                     .read_text(encoding="utf-8"))
MAX_CREDIT = 2**31 - 1


def _cases(name: str) -> list[Any]:
    return [pytest.param(c, id=c["name"]) for c in VECTORS[name]]


def _hello(h: dict) -> proto.Hello:
    return proto.Hello(min_version=h["min_version"], max_version=h["max_version"],
                       max_concurrency=h["max_concurrency"], max_frame_size=h["max_frame_size"])


def _runs(runs: list[list]) -> str:
    return "".join(text * count for text, count in runs)


def test_every_list_is_replayed() -> None:
    assert VECTORS["protocol_version"] == proto.PROTOCOL_VERSION
    assert {k for k in VECTORS if k != "protocol_version"} == \
        {"negotiate", "rows_batch_bytes", "grant", "fit_error", "stream_window"}
    assert all(len(VECTORS[k]) > 0 for k in ("negotiate", "rows_batch_bytes", "grant",
                                              "fit_error", "stream_window"))


@pytest.mark.parametrize("case", _cases("negotiate"))
def test_negotiate(case: dict) -> None:
    offer = proto.Offer(**case["offer"])
    expect = case["expect"]
    if "error" in expect:
        with pytest.raises((InvalidArgument, ProtocolError)) as info:
            proto.negotiate(_hello(case["hello"]), offer)
        err = info.value
        assert err.code == expect["error"]["code"]
        assert err.name == expect["error"]["name"]
        if "field" in expect["error"]:
            assert isinstance(err, InvalidArgument)
            assert err.details == {"field": expect["error"]["field"]}
            assert expect["error"]["field"] in err.message
        return
    welcome, clamped = proto.negotiate(_hello(case["hello"]), offer)
    assert isinstance(welcome, proto.Welcome)
    assert {k: getattr(welcome, k) for k in expect["welcome"]} == expect["welcome"]
    assert clamped is expect["clamped"]
    assert welcome.extensions == b""
    # ... and it is a WELCOME a parent core accepts:
    conn = proto.Connection("parent")
    conn.receive(proto.encode_frame(proto.Hello(
        min_version=case["hello"]["min_version"], max_version=case["hello"]["max_version"],
        max_concurrency=case["hello"]["max_concurrency"],
        max_frame_size=case["hello"]["max_frame_size"],
        methods=[MethodInfo("m", MethodKind.UNARY, [0])])))
    assert isinstance(conn.next_event(), proto.Hello)
    conn.send_welcome(welcome)
    assert conn.is_open() and conn.max_frame_size() == expect["welcome"]["max_frame_size"]


@pytest.mark.parametrize("case", _cases("rows_batch_bytes"))
def test_rows_batch_bytes(case: dict) -> None:
    assert proto.rows_batch_bytes(case["preferred"], case["initial_credit"],
                                  case["max_frame_size"]) == case["expect"]


@pytest.mark.parametrize("case", _cases("stream_window"))
def test_stream_window(case: dict) -> None:
    got = proto.stream_window(case["window"], case["initial_credit"], case["drained_us"],
                              case["rtt_us"], case["max_stream_window"], case["connection_room"])
    assert got == case["expect"], case["doc"] if "doc" in case else case["name"]


@pytest.mark.parametrize("case", _cases("grant"))
def test_grant(case: dict) -> None:
    assert proto.grant(case["initial_credit"], case["credit"], case["consumed"]) == case["expect"]


@pytest.mark.parametrize("case", _cases("fit_error"))
def test_fit_error(case: dict) -> None:
    message, details = _runs(case["message"]), _runs(case["details"])
    m, d = proto.fit_error(message, details, case["max_frame_size"])
    assert m.encode() == message.encode()[:case["expect"]["message_bytes"]]
    assert d == (details if case["expect"]["details"] is None else case["expect"]["details"])


@pytest.mark.parametrize("case", _cases("fit_error"))
def test_send_error_sends_what_fit_error_says(case: dict) -> None:
    """The worker core's send_error is fit_error on the negotiated frame size (when a frame of
    that size can be negotiated)."""
    mfs = case["max_frame_size"]
    if not proto.MIN_FRAME_SIZE_LIMIT <= mfs <= proto.MAX_FRAME_SIZE_LIMIT:
        pytest.skip("not a negotiable max_frame_size")
    worker, parent = _pair(mfs)
    rid, parts = parent.send_request(0, 0, 0, b"")
    worker.receive(b"".join(parts))
    assert isinstance(worker.next_event(), proto.Request)
    message, details = _runs(case["message"]), _runs(case["details"])
    parent.receive(b"".join(worker.send_error(rid, 1000, message, details)))
    got = parent.next_event()
    assert isinstance(got, proto.ErrorFrame)
    assert (got.message, got.details) == proto.fit_error(message, details, mfs)


def _pair(mfs: int = proto.DEFAULT_MAX_FRAME_SIZE, initial_credit: int = 1 << 20,
          kind: int = MethodKind.UNARY) -> tuple[proto.Connection, proto.Connection]:
    worker, parent = proto.Connection("worker"), proto.Connection("parent")
    parent.receive(b"".join(worker.send_hello(proto.Hello(
        max_concurrency=4, max_frame_size=proto.MAX_FRAME_SIZE_LIMIT,
        methods=[MethodInfo("m", kind, [0])]))))
    hello = parent.next_event()
    assert isinstance(hello, proto.Hello)
    welcome, _ = proto.negotiate(hello, proto.Offer(max_frame_size=mfs,
                                                    initial_credit=initial_credit,
                                                    max_in_flight=4, worker_id=1))
    worker.receive(b"".join(parent.send_welcome(welcome)))
    assert isinstance(worker.next_event(), proto.Welcome)
    return worker, parent


@pytest.mark.parametrize("window", [1, 2, 5, 1_000_003, 1 << 20])
def test_consumed_grants_at_half_the_window_rounded_up(window: int) -> None:
    """14.5's rule change: a grant once 2 x consumed >= initial_credit (odd windows round up)."""
    _, parent = _pair(initial_credit=window, kind=MethodKind.STREAM)
    rid, _ = parent.send_request(0, 0, 0, b"")
    below = (window - 1) // 2  # 2 * below < window
    assert parent.consumed(rid, below)[0] == (below if 2 * below >= window else 0)
    granted, parts = parent.consumed(rid, window - below if below else window)
    assert granted == proto.grant(window, window, window) == window
    assert parts


def test_consumed_counts_while_the_request_is_sent_and_grants_after() -> None:
    _, parent = _pair(initial_credit=1 << 16, kind=MethodKind.STREAM)
    body = b"x" * (3 * parent.max_frame_size())
    cursor, _ = parent.begin_request(0, 0, 0, body)
    assert parent.consumed(cursor.id, 1 << 16) == (0, [])  # counted, nothing granted
    for _ in range(10):
        done, _ = parent.send_next_frame(cursor)
        if done:
            break
    granted, parts = parent.consumed(cursor.id, 0)
    assert granted == 1 << 16 and parts


def test_a_capped_remainder_stays_counted() -> None:
    """A grant capped at 2^31 - 1 leaves the rest counted for the next call (14.5)."""
    worker, parent = _pair(initial_credit=MAX_CREDIT, kind=MethodKind.STREAM)
    rid, parts = parent.send_request(0, 0, 0, b"")
    worker.receive(b"".join(parts))
    assert isinstance(worker.next_event(), proto.Request)
    builder = worker.rows(rid)
    builder.append(b"r" * 100)
    parent.receive(b"".join(builder.finish()))
    rows = parent.next_event()
    assert isinstance(rows, proto.Rows)
    assert parent.credit(rid) == MAX_CREDIT - rows.payload_size
    granted, _ = parent.consumed(rid, MAX_CREDIT)
    assert granted == rows.payload_size  # capped: the credit is back at 2^31 - 1
    assert parent.credit(rid) == MAX_CREDIT
    assert parent.consumed(rid, 0) == (0, [])  # nothing left below the cap


def test_consumed_after_a_failure_is_zero_never_an_error() -> None:
    _, parent = _pair(initial_credit=1 << 16, kind=MethodKind.STREAM)
    rid, _ = parent.send_request(0, 0, 0, b"")
    parent.receive(b"\xff" * 16)  # an unknown frame type: the core fails
    with pytest.raises(ProtocolError):
        parent.next_event()
    assert parent.consumed(rid, 1 << 16) == (0, [])


# -- properties beyond the cases --------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_CREDIT), st.integers(-(1 << 32), MAX_CREDIT),
       st.integers(0, 1 << 33))
def test_grant_never_overflows(window: int, credit: int, consumed: int) -> None:
    n = proto.grant(window, credit, consumed)
    assert 0 <= n <= max(consumed, 0)
    assert n == 0 or credit + n <= MAX_CREDIT
    if 2 * consumed < window:
        assert n == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1 << 30), st.integers(1, MAX_CREDIT),
       st.integers(proto.MIN_FRAME_SIZE_LIMIT, proto.MAX_FRAME_SIZE_LIMIT))
def test_rows_batch_bytes_fits_a_frame(preferred: int, window: int, mfs: int) -> None:
    n = proto.rows_batch_bytes(preferred, window, mfs)
    assert 4096 <= n <= mfs - 8
    assert n <= max(4096, window // 4)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300),
       st.integers(proto.MIN_FRAME_SIZE_LIMIT, proto.MIN_FRAME_SIZE_LIMIT + 64),
       st.integers(0, 70_000), st.integers(0, 70_000))
def test_fit_error_always_fits(message: str, details: str, mfs: int, pad_m: int,
                               pad_d: int) -> None:
    message, details = message + "\u00e9" * pad_m, details + "\U0001f600" * (pad_d // 4)
    m, d = proto.fit_error(message, details, mfs)
    mb, db = m.encode(), d.encode()
    assert 6 + len(mb) + len(db) <= mfs and len(mb) <= 65_535
    assert message.encode().startswith(mb)
    if d != details:
        assert json.loads(d) == {"truncated": True, "details_bytes": len(details.encode())}


def test_negotiate_refuses_bools_and_fractions() -> None:
    hello = proto.Hello(max_concurrency=4, max_frame_size=proto.MAX_FRAME_SIZE_LIMIT)
    for field, value in (("max_in_flight", True), ("initial_credit", 1.5)):
        with pytest.raises(InvalidArgument) as info:
            proto.negotiate(hello, proto.Offer()._replace(**{field: value}))
        assert info.value.code == ErrorCode.INVALID_ARGUMENT
        assert info.value.details == {"field": field}


MIB = 1 << 20


def _stream(initial_credit: int = MIB) -> tuple[proto.Connection, int]:
    _, parent = _pair(initial_credit=initial_credit, kind=MethodKind.STREAM)
    rid, _ = parent.send_request(0, 0, 0, b"")
    return parent, rid


def test_consumed_at_grows_a_window_limited_stream_to_the_cap_and_back() -> None:
    """Section 6 on a live core: half windows drained in half a round trip double the window
    (the grant is the consumed bytes plus the growth) up to 16 MiB; a slow consumer halves it
    back to initial_credit, the halving taken out of the grants."""
    parent, rid = _stream()
    parent.observe_rtt(150_000)
    parent.observe_rtt(100_000)  # the smallest round trip counts
    parent.observe_rtt(400_000)
    assert parent.consumed_at(rid, 0, 1_000) == (0, [])  # the first read starts the clock
    now, windows = 1_000, []
    for _ in range(8):
        half = parent.window(rid) // 2
        assert parent.consumed_at(rid, half - 1, now)[0] == 0  # not due yet
        now += 50_000
        old = parent.window(rid)
        granted, parts = parent.consumed_at(rid, 1, now)
        windows.append(parent.window(rid))
        assert granted == half + parent.window(rid) - old and parts
    assert windows == [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 16 * MIB, 16 * MIB, 16 * MIB,
                       16 * MIB]
    credit = parent.credit(rid)
    shrinking = []
    while parent.window(rid) > MIB:
        now += 10_000_000  # 10 s for half a window: more than 8 round trips
        old = parent.window(rid)
        granted, _ = parent.consumed_at(rid, old // 2, now)
        assert granted == old // 2 + parent.window(rid) - old >= 0
        shrinking.append(parent.window(rid))
    assert shrinking == [8 * MIB, 4 * MIB, 2 * MIB, MIB]
    assert parent.credit(rid) == credit + sum(o // 2 + n - o for o, n in
                                              zip([16 * MIB] + shrinking, shrinking))
    now += 10_000_000
    parent.consumed_at(rid, MIB // 2, now)
    assert parent.window(rid) == MIB  # never below initial_credit


def test_consumed_at_without_a_round_trip_and_consumed_never_adapt() -> None:
    parent, rid = _stream()
    assert parent.consumed_at(rid, 0, 0)[0] == 0
    assert parent.consumed_at(rid, MIB // 2, 10)[0] == MIB // 2  # no RTT: a plain grant
    assert parent.window(rid) == MIB
    parent.observe_rtt(100_000)
    assert parent.consumed(rid, MIB // 2)[0] == MIB // 2  # no clock: a plain grant
    assert parent.window(rid) == MIB and parent.window(rid + 1) == 0


def test_the_connection_cap_bounds_the_sum_of_windows() -> None:
    _, parent = _pair(initial_credit=MIB, kind=MethodKind.STREAM)
    a, _ = parent.send_request(0, 0, 0, b"")
    b, _ = parent.send_request(0, 0, 0, b"")
    parent.set_window_caps(16 * MIB, 3 * MIB)
    parent.observe_rtt(100_000)
    for rid in (a, b):
        parent.consumed_at(rid, 0, 0)
    for now in range(1, 6):
        for rid in (a, b):
            parent.consumed_at(rid, parent.window(rid) // 2, now * 1_000)
        assert parent.window(a) + parent.window(b) <= 3 * MIB
    assert (parent.window(a), parent.window(b)) == (2 * MIB, MIB)
