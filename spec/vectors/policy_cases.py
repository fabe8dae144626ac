"""The policies of PROTOCOL.md 14.5 as a reference and as cases: what `generate.py` writes to
policies.json. Stdlib only, written from the text, independent of every SDK.

Each policy is a pure function of numbers (and, for fit_error, strings), so a case is its
inputs and its answer; an SDK's core exposes the same function (named as in 14.5) and its
connection operations use it.
"""

from __future__ import annotations

import json

MIN_FRAME = 65_536
MAX_FRAME = 16_777_216
MAX_CREDIT = 2**31 - 1
MAX_U32 = 2**32 - 1
MAX_SIZE = 2**53 - 1
MAX_TIMEOUT_MS = 2**31 - 1
DEFAULT_HEARTBEAT_MS = 1_000
PROTOCOL_VERSION = 1
ERROR_PREFIX = 6  # code u32, message length u16
NOTE = '{{"truncated": true, "details_bytes": {}}}'
GROW_WITHIN_RTTS = 2  # section 6's adaptive window (constants.json adaptive_credit)
SHRINK_AFTER_RTTS = 8
MAX_STREAM_WINDOW = 16_777_216
MAX_CONNECTION_WINDOW = 67_108_864

OFFER_CHECKS = (  # 14.5: in this order, each against its range of 22.2
    ("max_frame_size", MIN_FRAME, MAX_FRAME),
    ("initial_credit", 1, MAX_CREDIT),
    ("heartbeat_ms", 0, MAX_TIMEOUT_MS),
    ("max_in_flight", 1, MAX_U32),
    ("max_message_size", None, MAX_SIZE),  # at least max_frame_size
)


class Refused(Exception):
    def __init__(self, code: int, name: str, field: str | None = None) -> None:
        super().__init__(code, name, field)
        self.error = {"code": code, "name": name, **({"field": field} if field else {})}


def negotiate(hello: dict, offer: dict) -> dict:
    for field, lo, hi in OFFER_CHECKS:
        value = offer[field]
        low = offer["max_frame_size"] if lo is None else lo
        if not isinstance(value, int) or not low <= value <= hi:
            raise Refused(308, "INVALID_ARGUMENT", field)
    if not hello["min_version"] <= PROTOCOL_VERSION <= hello["max_version"]:
        raise Refused(118, "VERSION_MISMATCH")
    heartbeat = offer["heartbeat_ms"]
    if heartbeat == 0 and offer["remote"]:
        heartbeat = DEFAULT_HEARTBEAT_MS
    in_flight = min(offer["max_in_flight"], hello["max_concurrency"])
    return {"welcome": {"version": PROTOCOL_VERSION, "worker_id": offer["worker_id"],
                        "max_frame_size": min(offer["max_frame_size"], hello["max_frame_size"]),
                        "initial_credit": offer["initial_credit"], "heartbeat_ms": heartbeat,
                        "max_in_flight": in_flight,
                        "max_message_size": offer["max_message_size"]},
            "clamped": in_flight < offer["max_in_flight"]}


def rows_batch_bytes(preferred: int, initial_credit: int, max_frame_size: int) -> int:
    return min(max(4096, min(preferred, initial_credit // 4)), max_frame_size - 8)


def grant(initial_credit: int, credit: int, consumed: int) -> int:
    """The bytes `consumed` grants now on a stream that may be granted (14.5), 0 for none."""
    if 2 * consumed < initial_credit:
        return 0
    return max(0, min(consumed, MAX_CREDIT - credit))


def stream_window(window: int, initial_credit: int, drained_us: int, rtt_us: int,
                  max_stream_window: int, connection_room: int) -> int:
    """Section 6's adaptive window at a grant: doubled when the last half window drained within
    2 round trips (to the caps), halved (never below initial_credit) after more than 8."""
    if rtt_us == 0:
        return window
    if drained_us <= GROW_WITHIN_RTTS * rtt_us:
        top = min(2 * window, max(initial_credit, max_stream_window), window + connection_room,
                  MAX_CREDIT)
        return max(window, top)
    if drained_us > SHRINK_AFTER_RTTS * rtt_us:
        return max(window // 2, initial_credit)
    return window


def _utf8_prefix(data: bytes, limit: int) -> bytes:
    if len(data) <= limit:
        return data
    cut = max(limit, 0)
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # not inside a character
        cut -= 1
    return data[:cut]


def fit_error(message: str, details: str, max_frame_size: int) -> tuple[str, str]:
    m = _utf8_prefix(message.encode(), 0xFFFF)
    d = details.encode()
    room = max_frame_size - ERROR_PREFIX
    if len(m) + len(d) > room:
        if len(d) > room // 2:  # details larger than half the room: the note of their size
            d = NOTE.format(len(d)).encode()
        m = _utf8_prefix(m, room - len(d))
    return m.decode(), d.decode()


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

HELLO = {"min_version": 1, "max_version": 1, "max_concurrency": 64, "max_frame_size": MAX_FRAME}
OFFER = {"max_frame_size": 4_194_304, "initial_credit": 1_048_576, "heartbeat_ms": 1_000,
         "max_in_flight": 64, "max_message_size": 1 << 30, "worker_id": 7, "remote": False}


def _negotiate_cases() -> list[dict]:
    raw = [
        ("defaults", "the SDK defaults on both sides: nothing clamps", {}, {}),
        ("worker_frame_smaller", "max_frame_size is the smaller offer", {},
         {"max_frame_size": MIN_FRAME}),
        ("parent_frame_smaller", "the parent's choice decides under the worker's",
         {"max_frame_size": MIN_FRAME}, {}),
        ("clamp_in_flight", "max_in_flight above the worker's max_concurrency: clamped, and said",
         {"max_in_flight": 100}, {"max_concurrency": 8}),
        ("in_flight_below_offer", "below the worker's offer nothing clamps",
         {"max_in_flight": 4}, {"max_concurrency": 8}),
        ("concurrency_one", "a worker that runs one request at a time", {},
         {"max_concurrency": 1}),
        ("heartbeat_off_local", "0 turns the heartbeat off on a local connection",
         {"heartbeat_ms": 0}, {}),
        ("heartbeat_off_remote", "a remote connection always has a heartbeat (21.5)",
         {"heartbeat_ms": 0, "remote": True}, {}),
        ("heartbeat_remote", "a chosen heartbeat stays on a remote connection",
         {"heartbeat_ms": 250, "remote": True}, {}),
        ("largest_values", "every field at the top of its range",
         {"max_frame_size": MAX_FRAME, "initial_credit": MAX_CREDIT,
          "heartbeat_ms": MAX_TIMEOUT_MS, "max_in_flight": MAX_U32, "max_message_size": MAX_SIZE},
         {"max_concurrency": MAX_U32}),
        ("message_equals_frame", "max_message_size may equal max_frame_size",
         {"max_frame_size": MIN_FRAME, "max_message_size": MIN_FRAME}, {}),
        ("newer_worker", "a worker speaking versions 1-3: version 1", {}, {"max_version": 3}),
        ("older_worker_only", "a worker of versions 2-3 only", {},
         {"min_version": 2, "max_version": 3}),
        ("frame_below_min", "max_frame_size under 65,536", {"max_frame_size": MIN_FRAME - 1}, {}),
        ("frame_above_max", "max_frame_size over 16 MiB", {"max_frame_size": MAX_FRAME + 1}, {}),
        ("credit_zero", "initial_credit 0", {"initial_credit": 0}, {}),
        ("credit_above_max", "initial_credit 2^31", {"initial_credit": MAX_CREDIT + 1}, {}),
        ("heartbeat_above_max", "heartbeat_ms above max_timeout_ms",
         {"heartbeat_ms": MAX_TIMEOUT_MS + 1}, {}),
        ("heartbeat_negative", "a negative heartbeat", {"heartbeat_ms": -5}, {}),
        ("in_flight_zero", "max_in_flight 0", {"max_in_flight": 0}, {}),
        ("in_flight_above_u32", "max_in_flight 2^32", {"max_in_flight": MAX_U32 + 1}, {}),
        ("message_below_frame", "max_message_size under max_frame_size",
         {"max_message_size": 4_194_303}, {}),
        ("message_above_max", "max_message_size above 2^53 - 1",
         {"max_message_size": MAX_SIZE + 1}, {}),
        ("first_bad_field_wins", "several bad fields: the first of the check order",
         {"initial_credit": 0, "max_in_flight": 0}, {}),
        ("bad_offer_before_version", "a bad offer is refused before the versions are compared",
         {"max_in_flight": 0}, {"min_version": 2, "max_version": 2}),
    ]
    cases = []
    for name, doc, offer, hello in raw:
        case = {"name": name, "doc": doc, "offer": {**OFFER, **offer},
                "hello": {**HELLO, **hello}}
        try:
            case["expect"] = negotiate(case["hello"], case["offer"])
        except Refused as e:
            case["expect"] = {"error": e.error}
        cases.append(case)
    return cases


def _batch_cases() -> list[dict]:
    raw = [
        ("rust_defaults", 65_536, 1_048_576, 4_194_304),
        ("python_defaults", 262_144, 1_048_576, 4_194_304),
        ("quarter_of_a_small_window", 262_144, 100_000, 4_194_304),
        ("odd_window", 262_144, 1_000_003, 4_194_304),
        ("floor_4096", 65_536, 1_000, 4_194_304),
        ("window_one", 65_536, 1, 4_194_304),
        ("frame_caps_the_batch", 1 << 24, MAX_CREDIT, MIN_FRAME),
        ("preferred_below_floor", 100, 1_048_576, 4_194_304),
        ("largest_window", 1 << 30, MAX_CREDIT, MAX_FRAME),
    ]
    return [{"name": n, "preferred": p, "initial_credit": c, "max_frame_size": f,
             "expect": rows_batch_bytes(p, c, f)} for n, p, c, f in raw]


def _grant_cases() -> list[dict]:
    raw = [
        ("below_half", 1_048_576, 0, 524_287),
        ("exactly_half", 1_048_576, 0, 524_288),
        ("all_consumed", 1_048_576, 0, 1_048_576),
        ("odd_window_below_half", 5, 0, 2),
        ("odd_window_half_rounded_up", 5, 2, 3),
        ("window_one", 1, 0, 1),
        ("capped_at_max_credit", MAX_CREDIT, MAX_CREDIT - 100, MAX_CREDIT),
        ("nothing_left_below_max", MAX_CREDIT, MAX_CREDIT, MAX_CREDIT),
        ("negative_credit", 1_048_576, -4_194_000, 600_000),
    ]
    return [{"name": n, "initial_credit": w, "credit": c, "consumed": k,
             "expect": grant(w, c, k)} for n, w, c, k in raw]


def _window_cases() -> list[dict]:
    mib = 1 << 20
    raw = [  # window, initial_credit, drained_us, rtt_us, max_stream_window, connection_room
        ("no_rtt_yet", mib, mib, 1_000, 0, 16 * mib, 64 * mib),
        ("window_limited_doubles", mib, mib, 50_000, 100_000, 16 * mib, 63 * mib),
        ("exactly_two_rtt_doubles", 2 * mib, mib, 200_000, 100_000, 16 * mib, 62 * mib),
        ("just_above_two_rtt_stays", 2 * mib, mib, 200_001, 100_000, 16 * mib, 62 * mib),
        ("exactly_eight_rtt_stays", 4 * mib, mib, 800_000, 100_000, 16 * mib, 60 * mib),
        ("above_eight_rtt_halves", 4 * mib, mib, 800_001, 100_000, 16 * mib, 60 * mib),
        ("halving_stops_at_initial", mib, mib, 10_000_000, 100_000, 16 * mib, 63 * mib),
        ("halving_odd_window_floor", 3 * mib + 1, mib, 10_000_000, 1_000, 16 * mib, 0),
        ("stream_cap", 12 * mib, mib, 1_000, 100_000, 16 * mib, 40 * mib),
        ("at_stream_cap_stays", 16 * mib, mib, 1_000, 100_000, 16 * mib, 40 * mib),
        ("connection_room_limits", 4 * mib, mib, 1_000, 100_000, 16 * mib, mib + 5),
        ("no_connection_room", 4 * mib, mib, 1_000, 100_000, 16 * mib, 0),
        ("initial_above_stream_cap", 32 * mib, 32 * mib, 1_000, 100_000, 16 * mib, 64 * mib),
        ("above_cap_grows_never_shrinks_on_growth", 20 * mib, mib, 1_000, 100_000, 16 * mib,
         64 * mib),
        ("largest_window", MAX_CREDIT // 2 + 1, mib, 1, 1, MAX_CREDIT, MAX_CREDIT),
        ("local_link_fast_consumer_stays", mib, mib, 4_400, 300, 16 * mib, 63 * mib),
    ]
    return [{"name": n, "window": w, "initial_credit": c, "drained_us": d, "rtt_us": r,
             "max_stream_window": s, "connection_room": k,
             "expect": stream_window(w, c, d, r, s, k)} for n, w, c, d, r, s, k in raw]


def _runs(text: list[list]) -> str:
    return "".join(part * count for part, count in text)


def _fit_cases() -> list[dict]:
    """Long strings as runs, [[text, count], ...] (an SDK's runner joins them); the answer as
    the kept message's length in bytes (always a prefix) and the details sent, or null when
    they are sent unchanged."""
    big = 65_536
    half = (big - ERROR_PREFIX) // 2
    raw = [
        ("fits", [["division by zero", 1]], [['{"line":3}', 1]], big),
        ("empty", [], [], big),
        ("details_too_large", [["failed", 1]], [['"', 1], ["x", 70_000], ['"', 1]], big),
        ("message_too_large_no_details", [["m", 70_000]], [], big),
        ("message_cut_at_65535", [["m", 65_535], ["tail", 1]], [], MAX_FRAME),
        ("both_too_large", [["m", 70_000]], [['"', 1], ["x", 70_000], ['"', 1]], big),
        ("cut_inside_a_character", [["\u00e9", 40_000]], [], big),
        ("exactly_full", [["m", big - ERROR_PREFIX - 2]], [["{}", 1]], big),
        ("one_byte_over", [["m", big - ERROR_PREFIX - 1]], [["{}", 1]], big),
        ("details_half_the_room", [["m", 70_000]], [['"', 1], ["x", half - 2], ['"', 1]], big),
        ("details_just_above_half", [["m", 70_000]], [['"', 1], ["x", half - 1], ['"', 1]],
         big),
        ("large_frame_keeps_details", [["failed", 1]], [['"', 1], ["x", 70_000], ['"', 1]],
         1 << 20),
    ]
    cases = []
    for name, message, details, mfs in raw:
        m, d = fit_error(_runs(message), _runs(details), mfs)
        cases.append({"name": name, "message": message, "details": details,
                      "max_frame_size": mfs,
                      "expect": {"message_bytes": len(m.encode()),
                                 "details": None if d == _runs(details) else d}})
    return cases


def build() -> dict:
    doc = {"protocol_version": 1,
           "negotiate": _negotiate_cases(),
           "rows_batch_bytes": _batch_cases(),
           "grant": _grant_cases(),
           "fit_error": _fit_cases(),
           "stream_window": _window_cases()}
    _self_check(doc)
    return doc


def _self_check(doc: dict) -> None:
    """The cases say what the text says (guards a slip in the tables above)."""
    by = {c["name"]: c["expect"] for c in doc["negotiate"]}
    assert by["clamp_in_flight"]["clamped"] and by["clamp_in_flight"]["welcome"]["max_in_flight"] == 8
    assert not by["in_flight_below_offer"]["clamped"]
    assert by["heartbeat_off_remote"]["welcome"]["heartbeat_ms"] == DEFAULT_HEARTBEAT_MS
    assert by["heartbeat_off_local"]["welcome"]["heartbeat_ms"] == 0
    assert by["older_worker_only"] == {"error": {"code": 118, "name": "VERSION_MISMATCH"}}
    assert by["first_bad_field_wins"]["error"]["field"] == "initial_credit"
    assert by["bad_offer_before_version"]["error"]["code"] == 308
    grants = {c["name"]: c["expect"] for c in doc["grant"]}
    assert grants["odd_window_below_half"] == 0 and grants["odd_window_half_rounded_up"] == 3
    assert grants["capped_at_max_credit"] == 100 and grants["nothing_left_below_max"] == 0
    w = {c["name"]: c["expect"] for c in doc["stream_window"]}
    mib = 1 << 20
    assert w["no_rtt_yet"] == mib and w["window_limited_doubles"] == 2 * mib
    assert w["exactly_two_rtt_doubles"] == 4 * mib and w["just_above_two_rtt_stays"] == 2 * mib
    assert w["exactly_eight_rtt_stays"] == 4 * mib and w["above_eight_rtt_halves"] == 2 * mib
    assert w["halving_stops_at_initial"] == mib and w["stream_cap"] == 16 * mib
    assert w["halving_odd_window_floor"] == (3 * mib + 1) // 2
    assert w["connection_room_limits"] == 5 * mib + 5 and w["no_connection_room"] == 4 * mib
    assert w["initial_above_stream_cap"] == 32 * mib
    assert w["above_cap_grows_never_shrinks_on_growth"] == 20 * mib
    assert w["largest_window"] == MAX_CREDIT
    for c in doc["fit_error"]:
        details = _runs(c["details"]).encode()
        sent = details if c["expect"]["details"] is None else c["expect"]["details"].encode()
        kept = c["expect"]["message_bytes"]
        assert ERROR_PREFIX + kept + len(sent) <= c["max_frame_size"] and kept <= 0xFFFF
        if sent != details:
            assert json.loads(sent) == {"truncated": True, "details_bytes": len(details)}
