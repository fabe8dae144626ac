"""The core's policies (PROTOCOL.md 14.5), pure functions pinned by spec/vectors/policies.json:
re-exported by :mod:`wirepool.proto`, whose Connection applies them."""

from __future__ import annotations

from typing import Any, NamedTuple

from ._constants import (DEFAULT_HEARTBEAT_MS, DEFAULT_INITIAL_CREDIT, DEFAULT_MAX_FRAME_SIZE,
                         DEFAULT_MAX_MESSAGE_SIZE, ERROR_MESSAGE_MAX_BYTES, MAX_CREDIT,
                         MAX_MAX_FRAME_SIZE, MAX_SIZE, MAX_TIMEOUT_MS, MAX_COUNT,
                         MIN_MAX_FRAME_SIZE, PROTOCOL_VERSION, GROW_WITHIN_RTTS,
                         SHRINK_AFTER_RTTS)
from ._frames import Hello, Welcome, _ERROR_PREFIX
from .errors import ErrorCode, InvalidArgument, ProtocolError, quote

# ---------------------------------------------------------------------------------------------
# Policies (PROTOCOL.md 14.5): every number a driver would otherwise derive from the handshake
# or a stream's state, as pure functions pinned by spec/vectors/policies.json. The drivers call
# these and use their answers; Connection.consumed and send_error apply grant and fit_error.
# ---------------------------------------------------------------------------------------------

_ROWS_BATCH_FLOOR = 4096  # 14.5: frames never shrink to a few rows
_ROWS_BATCH_ROOM = 8  # the row count and one row's length field
_TRUNCATED_NOTE = '{{"truncated": true, "details_bytes": {}}}'


class Offer(NamedTuple):
    """What the parent offers a worker in its WELCOME (14.5's ``negotiate``); ``remote``: the
    connection is a remote worker's (21), whose heartbeat is never off."""

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    initial_credit: int = DEFAULT_INITIAL_CREDIT
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    max_in_flight: int = 64
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    worker_id: int = 0
    remote: bool = False


def _offer_field(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(ErrorCode.INVALID_ARGUMENT,
                              f"{name} must be an integer, {low:,} - {high:,}, not {quote(value)} "
                              f"(PROTOCOL.md 14.5, 22.2)", details={"field": name})


def negotiate(hello: Hello, offer: Offer) -> tuple[Welcome, bool]:
    """Parent: the WELCOME answering ``hello`` for ``offer``, and whether ``max_in_flight`` was
    clamped to the worker's ``max_concurrency`` (the driver logs that once per pool, 4.2).

    Each offer field is checked first, in the order of 14.5: out of range is
    :class:`~wirepool.InvalidArgument` (308, ``details["field"]`` names it); then a HELLO whose
    versions exclude 1 is ``VERSION_MISMATCH`` (118). The WELCOME carries no extensions: those
    the driver accepts (20.2) it adds itself."""
    mfs = offer.max_frame_size
    _offer_field("max_frame_size", mfs, MIN_MAX_FRAME_SIZE, MAX_MAX_FRAME_SIZE)
    _offer_field("initial_credit", offer.initial_credit, 1, MAX_CREDIT)
    _offer_field("heartbeat_ms", offer.heartbeat_ms, 0, MAX_TIMEOUT_MS)
    _offer_field("max_in_flight", offer.max_in_flight, 1, MAX_COUNT)
    _offer_field("max_message_size", offer.max_message_size, mfs, MAX_SIZE)
    if not hello.min_version <= PROTOCOL_VERSION <= hello.max_version:
        raise ProtocolError(ErrorCode.VERSION_MISMATCH,
                            f"the worker speaks versions {hello.min_version}-{hello.max_version}, "
                            f"this parent {PROTOCOL_VERSION}")
    heartbeat = offer.heartbeat_ms
    if heartbeat == 0 and offer.remote:  # 21.5: a remote connection always has a heartbeat
        heartbeat = DEFAULT_HEARTBEAT_MS
    in_flight = min(offer.max_in_flight, hello.max_concurrency)
    welcome = Welcome(version=PROTOCOL_VERSION, worker_id=offer.worker_id,
                      max_frame_size=min(mfs, hello.max_frame_size),
                      initial_credit=offer.initial_credit, heartbeat_ms=heartbeat,
                      max_in_flight=in_flight, max_message_size=offer.max_message_size)
    return welcome, in_flight < offer.max_in_flight


def rows_batch_bytes(preferred: int, initial_credit: int, max_frame_size: int) -> int:
    """Worker: the ROWS payload size at which a batch is sent (14.5): a quarter of the window at
    most, so grants keep flowing, at least 4,096 bytes, and within one frame."""
    return min(max(_ROWS_BATCH_FLOOR, min(preferred, initial_credit // 4)),
               max_frame_size - _ROWS_BATCH_ROOM)


def grant(initial_credit: int, credit: int, consumed: int) -> int:
    """The bytes a stream with ``credit`` and ``consumed`` bytes read since its last grant is
    granted now (14.5): once 2 x consumed reaches the window, all of it up to 2^31 - 1; else 0."""
    if 2 * consumed < initial_credit:
        return 0
    room = MAX_CREDIT - credit
    if room < consumed:
        return room if room > 0 else 0
    return consumed


def stream_window(window: int, initial_credit: int, drained_us: int, rtt_us: int,
                  max_stream_window: int, connection_room: int) -> int:
    """Parent: a stream's adaptive window at a grant (sections 6 and 14.5), the credit kept
    outstanding. ``drained_us``: how long its last half window took to drain; ``rtt_us``: the
    connection's smallest PING round trip (0: none yet, the window stays); ``connection_room``:
    what the connection's cap leaves above the sum of its streams' windows. Drained within 2
    round trips (the window limits the stream): doubled, within max(initial_credit,
    max_stream_window), window + connection_room and 2^31 - 1; in more than 8: halved, never
    below initial_credit; otherwise unchanged::

        >>> stream_window(1 << 20, 1 << 20, 50_000, 100_000, 16 << 20, 63 << 20) == 2 << 20
        True
    """
    if rtt_us == 0:
        return window
    if drained_us <= GROW_WITHIN_RTTS * rtt_us:
        top = min(2 * window, max(initial_credit, max_stream_window), window + connection_room,
                  MAX_CREDIT)
        return top if top > window else window
    if drained_us > SHRINK_AFTER_RTTS * rtt_us:
        return max(window // 2, initial_credit)
    return window


def _fit_error_bytes(message: str, details: str, max_frame_size: int) -> tuple[bytes, bytes]:
    m = message.encode()
    if len(m) > ERROR_MESSAGE_MAX_BYTES:  # cut at a character boundary (valid UTF-8 in)
        m = m[:ERROR_MESSAGE_MAX_BYTES].decode("utf-8", "ignore").encode()
    d = details.encode()
    room = max_frame_size - _ERROR_PREFIX.size
    if len(m) + len(d) > room:
        if len(d) > room // 2:  # never dropped silently: the note of their size
            d = _TRUNCATED_NOTE.format(len(d)).encode()
        keep = max(room - len(d), 0)
        if len(m) > keep:
            m = m[:keep].decode("utf-8", "ignore").encode()
    return m, d


def fit_error(message: str, details: str, max_frame_size: int) -> tuple[str, str]:
    """What an ERROR carries in one frame of ``max_frame_size`` (14.5): the message cut to
    65,535 bytes; then, when message and details do not fit, details above half the room become
    ``{"truncated": true, "details_bytes": N}`` (smaller ones stay whole) and the message is cut
    to the bytes left. Every cut is at a UTF-8 character boundary."""
    m, d = _fit_error_bytes(message, details, max_frame_size)
    return m.decode(), d.decode()
