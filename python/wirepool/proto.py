"""Sans-IO core of the wirepool protocol v1 (spec/PROTOCOL.md).

No sockets, no clocks: bytes go in, typed frames and events come out, and encoders turn frames into
bytes. The worker (``worker.py``) and the parent (``pool.py``) are drivers over this module; they
never re-decide sizes, ids or states.

Decoding, frame by frame::

    dec = FrameDecoder(max_frame_size=65536)
    dec.feed(chunk)                      # any chunking
    while (frame := dec.next_frame()) is not None:
        ...                              # Hello, Request, Rows, ... (validated)
    dec.eof()                            # raises ProtocolError(TRUNCATED) if mid-frame

Connection state (handshake, ids, credit, continuation, drain)::

    conn = Connection("parent")
    conn.feed(data)
    while (event := conn.next_event()) is not None:
        ...
    wire_bytes = conn.send(Welcome(...))

Every violation raises :class:`ProtocolError` with its stable code; the driver then sends
``ERROR`` id 0 with that code and closes.
"""

from __future__ import annotations

import itertools
import operator
import sys
import struct
from typing import Any, Callable, Iterator, Sequence, Union

from .errors import ErrorCode, ProtocolError

__all__ = [
    "PROTOCOL_VERSION", "HEADER_SIZE", "DEFAULT_MAX_FRAME_SIZE", "HANDSHAKE_MAX_FRAME_SIZE",
    "MIN_FRAME_SIZE_LIMIT", "MAX_FRAME_SIZE_LIMIT", "DEFAULT_INITIAL_CREDIT", "DEFAULT_HEARTBEAT_MS",
    "DEFAULT_MAX_MESSAGE_SIZE", "MAX_CREDIT", "FLAG_MORE", "FrameType", "CodecId", "MethodKind",
    "MethodInfo", "Frame", "Hello", "Welcome", "Request", "Cancel", "Result", "ErrorFrame", "Rows",
    "End", "Credit", "Event", "Ping", "Pong", "Drain", "Goodbye", "Continuation", "Late", "Reject",
    "RowsBuilder", "FrameDecoder", "Connection", "encode_frame", "encode_frame_parts",
    "split_message",
]

Buffer = Union[bytes, bytearray, memoryview]

PROTOCOL_VERSION = 1
HEADER_SIZE = 16
HANDSHAKE_MAX_FRAME_SIZE = 65_536
MIN_FRAME_SIZE_LIMIT = 65_536
MAX_FRAME_SIZE_LIMIT = 16_777_216
DEFAULT_MAX_FRAME_SIZE = 4_194_304  # PROTOCOL.md 4.2: the parent's default
DEFAULT_INITIAL_CREDIT = 1_048_576
DEFAULT_HEARTBEAT_MS = 1_000
DEFAULT_MAX_MESSAGE_SIZE = 1_073_741_824
MAX_CREDIT = 2**31 - 1
MAGIC = b"WIREPOOL"
# Large-frame receive buffers a decoder keeps for reuse (see FrameDecoder._gather_buffer): room
# for two frames of the largest size the protocol allows (16 MiB), so that 16 MiB frames are
# reused too (fresh ones cost a zeroing pass and page faults: 3x slower 16 MiB echo).
_SPARES = 2
_SPARE_MAX_BYTES = 32 << 20
FLAG_MORE = 0x01

_HEADER = struct.Struct("<IBBHQ")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HELLO_FIXED = struct.Struct("<8sHHIII")
_WELCOME = struct.Struct("<HHIIIIIQ")
_REQUEST_PREFIX = struct.Struct("<HBBQ")
_first = operator.itemgetter(0)
_REQUEST_HEAD_pack = struct.Struct("<IBBHQHBBQ").pack  # header + REQUEST prefix
_ERROR_PREFIX = struct.Struct("<IH")
_EVENT_PREFIX = struct.Struct("<H")

_hdr_unpack_from = _HEADER.unpack_from
_hdr_pack = _HEADER.pack
_u32_unpack_from = _U32.unpack_from
_u32_pack = _U32.pack


class FrameType:
    HELLO = 0x01
    WELCOME = 0x02
    REQUEST = 0x10
    CANCEL = 0x11
    RESULT = 0x12
    ERROR = 0x13
    ROWS = 0x20
    END = 0x21
    CREDIT = 0x22
    EVENT = 0x30
    PING = 0x31
    PONG = 0x32
    DRAIN = 0x40
    GOODBYE = 0x41
    CONTINUATION = 0x7F


class CodecId:
    """The codec ids of the wire (PROTOCOL.md 7); the codecs themselves are `wirepool.codecs`."""

    RAW = 0
    JSON = 1
    MSGPACK = 2
    CBOR = 3
    ARROW = 4
    PROTOBUF = 5


class MethodKind:
    UNARY = 1
    STREAM = 2


_TYPE_NAMES = {
    0x01: "HELLO", 0x02: "WELCOME", 0x10: "REQUEST", 0x11: "CANCEL", 0x12: "RESULT", 0x13: "ERROR",
    0x20: "ROWS", 0x21: "END", 0x22: "CREDIT", 0x30: "EVENT", 0x31: "PING", 0x32: "PONG",
    0x40: "DRAIN", 0x41: "GOODBYE", 0x7F: "CONTINUATION",
}
# 0: id must be 0, 1: id must be non-zero, 2: either.
_ID_RULE = {
    0x01: 0, 0x02: 0, 0x10: 1, 0x11: 1, 0x12: 1, 0x13: 2, 0x20: 1, 0x21: 1, 0x22: 1, 0x30: 2,
    0x31: 0, 0x32: 0, 0x40: 0, 0x41: 0, 0x7F: 1,
}
_MORE_ALLOWED = frozenset((0x10, 0x12, 0x21, 0x7F))
# Frame types each side may receive (section 2, "direction").
_PARENT_RECEIVES = frozenset((0x01, 0x12, 0x13, 0x20, 0x21, 0x30, 0x31, 0x32, 0x41, 0x7F))
_WORKER_RECEIVES = frozenset((0x02, 0x10, 0x11, 0x13, 0x22, 0x31, 0x32, 0x40, 0x7F))


def _fail(code: ErrorCode, message: str, id: int = 0) -> ProtocolError:
    return ProtocolError(code, message, id=id)


def _utf8(buf: Buffer, what: str) -> str:
    try:
        return str(buf, "utf-8")
    except UnicodeDecodeError:
        raise _fail(ErrorCode.BAD_UTF8, f"{what} is not valid UTF-8") from None


# ---------------------------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------------------------


class MethodInfo:
    """One entry of the HELLO method list."""

    __slots__ = ("name", "kind", "codecs")

    def __init__(self, name: str, kind: int, codecs: Sequence[int]) -> None:
        self.name = name
        self.kind = kind
        self.codecs = tuple(codecs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MethodInfo) and (self.name, self.kind, self.codecs) == (
            other.name, other.kind, other.codecs)

    def __repr__(self) -> str:
        return f"MethodInfo({self.name!r}, kind={self.kind}, codecs={list(self.codecs)})"


class Frame:
    """Base class: every frame has ``id`` and ``more`` (the MORE flag)."""

    __slots__ = ("id", "more")
    id: int
    more: bool
    TYPE: int = 0
    NAME: str = ""

    def _payload_parts(self) -> list[Buffer]:
        raise NotImplementedError

    def _fields(self) -> dict:
        return {s: getattr(self, s) for cls in type(self).__mro__ for s in getattr(cls, "__slots__", ())}

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        a, b = self._fields(), other._fields()  # type: ignore[attr-defined]
        for k in a:
            x, y = a[k], b[k]
            if isinstance(x, memoryview):
                x = bytes(x)
            if isinstance(y, memoryview):
                y = bytes(y)
            if isinstance(x, list) and x and isinstance(x[0], memoryview):
                x = [bytes(r) for r in x]
            if isinstance(y, list) and y and isinstance(y[0], memoryview):
                y = [bytes(r) for r in y]
            if x != y:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = []
        for k, v in self._fields().items():
            if isinstance(v, (bytes, bytearray, memoryview)):
                b = bytes(v)
                v = b if len(b) <= 32 else b[:32] + b"..."
            parts.append(f"{k}={v!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


class Hello(Frame):
    __slots__ = ("min_version", "max_version", "pid", "max_concurrency", "max_frame_size",
                 "sdk_name", "sdk_version", "methods")
    TYPE = FrameType.HELLO
    NAME = "HELLO"

    def __init__(self, *, min_version: int = 1, max_version: int = 1, pid: int = 0,
                 max_concurrency: int = 1, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 sdk_name: str = "wirepool-python", sdk_version: str = "",
                 methods: Sequence[MethodInfo] = (), id: int = 0, more: bool = False) -> None:
        self.id = id
        self.more = more
        self.min_version = min_version
        self.max_version = max_version
        self.pid = pid
        self.max_concurrency = max_concurrency
        self.max_frame_size = max_frame_size
        self.sdk_name = sdk_name
        self.sdk_version = sdk_version
        self.methods = list(methods)

    def _payload_parts(self) -> list[Buffer]:
        out = bytearray(_HELLO_FIXED.pack(MAGIC, self.min_version, self.max_version, self.pid,
                                          self.max_concurrency, self.max_frame_size))
        for s in (self.sdk_name, self.sdk_version):
            b = s.encode()
            out += _U16.pack(len(b)) + b
        out += _U16.pack(len(self.methods))
        for m in self.methods:
            out += bytes((m.kind, len(m.codecs))) + bytes(m.codecs)
            b = m.name.encode()
            out += _U16.pack(len(b)) + b
        return [out]


class Welcome(Frame):
    __slots__ = ("version", "worker_id", "max_frame_size", "initial_credit", "heartbeat_ms",
                 "max_in_flight", "max_message_size")
    TYPE = FrameType.WELCOME
    NAME = "WELCOME"

    def __init__(self, *, version: int = 1, worker_id: int = 0,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 initial_credit: int = DEFAULT_INITIAL_CREDIT, heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
                 max_in_flight: int = 1, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 id: int = 0, more: bool = False) -> None:
        self.id = id
        self.more = more
        self.version = version
        self.worker_id = worker_id
        self.max_frame_size = max_frame_size
        self.initial_credit = initial_credit
        self.heartbeat_ms = heartbeat_ms
        self.max_in_flight = max_in_flight
        self.max_message_size = max_message_size

    def _payload_parts(self) -> list[Buffer]:
        return [_WELCOME.pack(self.version, 0, self.worker_id, self.max_frame_size,
                              self.initial_credit, self.heartbeat_ms, self.max_in_flight,
                              self.max_message_size)]


class Request(Frame):
    __slots__ = ("method", "codec", "timeout_us", "body")
    TYPE = FrameType.REQUEST
    NAME = "REQUEST"

    def __init__(self, id: int, method: int, codec: int, body: Buffer = b"", timeout_us: int = 0,
                 more: bool = False) -> None:
        self.id = id
        self.more = more
        self.method = method
        self.codec = codec
        self.timeout_us = timeout_us
        self.body = body

    def _payload_parts(self) -> list[Buffer]:
        return [_REQUEST_PREFIX.pack(self.method, self.codec, 0, self.timeout_us), self.body]


class Cancel(Frame):
    __slots__ = ()
    TYPE = FrameType.CANCEL
    NAME = "CANCEL"

    def __init__(self, id: int, more: bool = False) -> None:
        self.id = id
        self.more = more

    def _payload_parts(self) -> list[Buffer]:
        return []


class Result(Frame):
    __slots__ = ("body",)
    TYPE = FrameType.RESULT
    NAME = "RESULT"

    def __init__(self, id: int, body: Buffer = b"", more: bool = False) -> None:
        self.id = id
        self.more = more
        self.body = body

    def _payload_parts(self) -> list[Buffer]:
        return [self.body]


class ErrorFrame(Frame):
    """ERROR: ``code``, ``message`` and ``details`` (JSON text, "" for none)."""

    __slots__ = ("code", "message", "details")
    TYPE = FrameType.ERROR
    NAME = "ERROR"

    def __init__(self, id: int, code: int, message: str = "", details: str = "",
                 more: bool = False) -> None:
        self.id = id
        self.more = more
        self.code = code
        self.message = message
        self.details = details

    def _payload_parts(self) -> list[Buffer]:
        m = self.message.encode()
        if len(m) > 0xFFFF:  # the spec caps messages at 65,535 bytes; cut on a UTF-8 boundary
            m = m[:0xFFFF].decode("utf-8", "ignore").encode()
        return [_ERROR_PREFIX.pack(self.code, len(m)), m, self.details.encode()]


class Rows(Frame):
    """ROWS: a batch of rows. ``rows`` are zero-copy memoryview slices of the frame payload."""

    __slots__ = ("_payload", "count", "_rows", "_row_size", "_ends")
    TYPE = FrameType.ROWS
    NAME = "ROWS"

    def __init__(self, id: int, rows: Sequence[Buffer] = (), more: bool = False) -> None:
        self.id = id
        self.more = more
        self._rows: list | None = list(rows)
        self.count = len(self._rows)
        self._payload: Buffer | None = None
        self._row_size = -1
        self._ends: list[int] | None = None

    @classmethod
    def _from_payload(cls, id: int, payload: memoryview, count: int,
                      row_size: int = -1, ends: list[int] | None = None) -> "Rows":
        self = cls.__new__(cls)
        self.id = id
        self.more = False
        self._payload = payload
        self.count = count
        self._rows = None
        self._row_size = row_size  # >= 0: every row has this size (sliced without a loop)
        self._ends = ends  # else where each row ends in the payload (found while validating)
        return self

    def _slices(self, copy: bool = False) -> Iterator[Any]:
        """The rows as memoryview slices (or, with ``copy``, bytes), from C iterators (no
        bytecode per row)."""
        if self._row_size >= 0 and not copy:
            return self._fixed_slices()
        ends = self._ends
        assert ends is not None
        # row i starts 4 bytes (its length field) after row i - 1 ends; row 0 at byte 8
        starts = map(operator.add, itertools.chain((4,), ends), itertools.repeat(4))
        # Slicing bytes costs about half of slicing a memoryview: one copy of the frame first.
        p: Any = bytes(self._payload) if copy else self._payload  # type: ignore[arg-type]
        return map(p.__getitem__, map(slice, starts, ends))

    def _fixed_slices(self) -> Iterator[memoryview]:
        # All rows the same size: the slices come from C iterators, no bytecode per row.
        p: memoryview = self._payload  # type: ignore[assignment]
        size = self._row_size
        stride = size + 4
        span = self.count * stride
        return map(p.__getitem__, map(slice, range(8, 8 + span, stride),  # type: ignore[arg-type]
                                      range(8 + size, 8 + size + span, stride)))

    @property
    def payload_size(self) -> int:
        if self._payload is not None:
            return len(self._payload)
        return 4 + sum(4 + len(r) for r in self._rows or ())

    @property
    def rows(self) -> list:
        """The rows as a list of memoryview slices of the payload (built on first access)."""
        if self._rows is None:
            self._rows = list(self._slices())
        return self._rows

    def __iter__(self) -> Iterator:
        return iter(self.rows)

    def __len__(self) -> int:
        return self.count

    def decode(self, fn: Callable[[Any], Any], copy_rows: bool = False) -> list[Any]:
        """``[fn(row) for row in self]`` in one tight loop (the parent's row hot path).

        ``copy_rows=True`` gives ``fn`` each row as ``bytes`` (a copy) instead of a memoryview
        slice: cheaper to make, for codecs that decode the row anyway.
        """
        if self._rows is not None:
            return [fn(r) for r in self._rows]
        if self._row_size >= 0:
            if copy_rows:
                # One C call unpacks every row of the frame as bytes.
                rows = struct.Struct(f"<4x{self._row_size}s").iter_unpack(
                    self._payload[4:])  # type: ignore[index]
                try:
                    return list(map(fn, map(_first, rows)))
                except BaseException:
                    # The iterator holds a buffer export on the payload; a traceback keeping
                    # this frame alive would keep it too, and a garbage cycle holding an
                    # exported memoryview crashes CPython's collector. Let go of it now.
                    del rows
                    raise
        return list(map(fn, self._slices(copy_rows)))

    def _fields(self) -> dict:
        return {"id": self.id, "more": self.more, "rows": self.rows}

    def _payload_parts(self) -> list[Buffer]:
        if self._payload is not None:
            return [self._payload]
        parts: list[Buffer] = [_u32_pack(len(self._rows))]  # type: ignore[arg-type]
        for r in self._rows:  # type: ignore[union-attr]
            parts.append(_u32_pack(len(r)))
            parts.append(r)
        return [b"".join(parts)]


class End(Frame):
    __slots__ = ("row_count", "summary")
    TYPE = FrameType.END
    NAME = "END"

    def __init__(self, id: int, row_count: int, summary: Buffer = b"", more: bool = False) -> None:
        self.id = id
        self.more = more
        self.row_count = row_count
        self.summary = summary

    def _payload_parts(self) -> list[Buffer]:
        return [_U64.pack(self.row_count), self.summary]


class Credit(Frame):
    __slots__ = ("bytes",)
    TYPE = FrameType.CREDIT
    NAME = "CREDIT"

    def __init__(self, id: int, bytes: int, more: bool = False) -> None:  # noqa: A002
        self.id = id
        self.more = more
        self.bytes = bytes

    def _payload_parts(self) -> list[Buffer]:
        return [_u32_pack(self.bytes)]


class Event(Frame):
    __slots__ = ("topic", "data")
    TYPE = FrameType.EVENT
    NAME = "EVENT"

    def __init__(self, id: int, topic: str, data: str = "", more: bool = False) -> None:
        self.id = id
        self.more = more
        self.topic = topic
        self.data = data

    def _payload_parts(self) -> list[Buffer]:
        t = self.topic.encode()
        return [_EVENT_PREFIX.pack(len(t)), t, self.data.encode()]


class Ping(Frame):
    __slots__ = ("nonce",)
    TYPE = FrameType.PING
    NAME = "PING"

    def __init__(self, nonce: Buffer = b"\0" * 8, id: int = 0, more: bool = False) -> None:
        self.id = id
        self.more = more
        self.nonce = nonce

    def _payload_parts(self) -> list[Buffer]:
        return [self.nonce]


class Pong(Ping):
    __slots__ = ()
    TYPE = FrameType.PONG
    NAME = "PONG"


class Drain(Frame):
    __slots__ = ("grace_ms",)
    TYPE = FrameType.DRAIN
    NAME = "DRAIN"

    def __init__(self, grace_ms: int = 0, id: int = 0, more: bool = False) -> None:
        self.id = id
        self.more = more
        self.grace_ms = grace_ms

    def _payload_parts(self) -> list[Buffer]:
        return [_u32_pack(self.grace_ms)]


class Goodbye(Frame):
    __slots__ = ("reason",)
    TYPE = FrameType.GOODBYE
    NAME = "GOODBYE"

    def __init__(self, reason: int = 0, id: int = 0, more: bool = False) -> None:
        self.id = id
        self.more = more
        self.reason = reason

    def _payload_parts(self) -> list[Buffer]:
        return [_u32_pack(self.reason)]


class Continuation(Frame):
    __slots__ = ("body",)
    TYPE = FrameType.CONTINUATION
    NAME = "CONTINUATION"

    def __init__(self, id: int, body: Buffer = b"", more: bool = False) -> None:
        self.id = id
        self.more = more
        self.body = body

    def _payload_parts(self) -> list[Buffer]:
        return [self.body]


class Late(Frame):
    """Event: a frame for a request that already finished; the core ignored it."""

    __slots__ = ("frame",)
    NAME = "LATE"

    def __init__(self, id: int, frame: str) -> None:
        self.id = id
        self.more = False
        self.frame = frame


class Reject(Frame):
    """Event (worker side): a REQUEST refused without running it; answer it with ERROR ``code``."""

    __slots__ = ("code",)
    NAME = "REJECT"

    def __init__(self, id: int, code: int) -> None:
        self.id = id
        self.more = False
        self.code = code

    @property
    def name(self) -> str:
        return ErrorCode(self.code).name


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def encode_frame_parts(frame: Frame) -> list[Buffer]:
    """Header plus payload pieces, ready for a vectored write; bodies are not copied."""
    parts = frame._payload_parts()
    length = 0
    for p in parts:
        length += len(p)
    header = _hdr_pack(length, frame.TYPE, FLAG_MORE if frame.more else 0, 0, frame.id)
    if parts and len(parts[0]) < 4096:
        # Small fixed prefixes ride in the header's buffer: one fewer piece to write.
        return [header + parts[0], *parts[1:]]
    return [header, *parts]


def encode_frame(frame: Frame) -> bytes:
    """One frame as bytes (copies; use :func:`encode_frame_parts` for large bodies)."""
    return b"".join(encode_frame_parts(frame))


_PREFIX_SIZE = {FrameType.REQUEST: 12, FrameType.RESULT: 0, FrameType.END: 8}


def split_message(frame: Frame, max_frame_size: int) -> list[Frame]:
    """Split a REQUEST, RESULT or END whose payload exceeds ``max_frame_size`` (section 5).

    The first frame keeps the type and the whole fixed prefix with MORE set; CONTINUATION frames
    carry the rest. Chunks are memoryview slices of the original body (no copy).
    """
    if frame.TYPE == FrameType.REQUEST:
        body = frame.body  # type: ignore[attr-defined]
    elif frame.TYPE == FrameType.RESULT:
        body = frame.body  # type: ignore[attr-defined]
    elif frame.TYPE == FrameType.END:
        body = frame.summary  # type: ignore[attr-defined]
    else:
        return [frame]
    prefix = _PREFIX_SIZE[frame.TYPE]
    if prefix + len(body) <= max_frame_size:
        return [frame]
    mv = memoryview(body)
    first_len = max_frame_size - prefix
    if frame.TYPE == FrameType.REQUEST:
        first: Frame = Request(frame.id, frame.method, frame.codec, mv[:first_len],  # type: ignore[attr-defined]
                               frame.timeout_us, more=True)  # type: ignore[attr-defined]
    elif frame.TYPE == FrameType.RESULT:
        first = Result(frame.id, mv[:first_len], more=True)
    else:
        first = End(frame.id, frame.row_count, mv[:first_len], more=True)  # type: ignore[attr-defined]
    out = [first]
    pos = first_len
    total = len(mv)
    while pos < total:
        end = min(pos + max_frame_size, total)
        out.append(Continuation(frame.id, mv[pos:end], more=end < total))
        pos = end
    return out


class RowsBuilder:
    """Builds one ROWS frame by appending encoded rows into a single bytearray.

    ``append`` returns False (and appends nothing) when the row would push the payload past
    ``max_payload``; flush with :meth:`take` and append again. A row that does not fit even in
    an empty frame is the caller's ROW_TOO_LARGE.
    """

    __slots__ = ("_buf", "count", "max_payload")

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self._buf = bytearray(HEADER_SIZE + 4)
        self.count = 0

    @property
    def payload_size(self) -> int:
        return len(self._buf) - HEADER_SIZE

    def fits(self, row_len: int) -> bool:
        return len(self._buf) - HEADER_SIZE + 4 + row_len <= self.max_payload

    def append(self, row: Buffer) -> bool:
        buf = self._buf
        n = len(row)
        if len(buf) - HEADER_SIZE + 4 + n > self.max_payload:
            return False
        buf += _u32_pack(n)
        buf += row
        self.count += 1
        return True

    def take(self, id: int) -> bytearray:
        """The finished frame (header included); the builder starts empty again."""
        buf = self._buf
        _HEADER.pack_into(buf, 0, len(buf) - HEADER_SIZE, FrameType.ROWS, 0, 0, id)
        _U32.pack_into(buf, HEADER_SIZE, self.count)
        self._buf = bytearray(HEADER_SIZE + 4)
        self.count = 0
        return buf


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def _check_header(length: int, ftype: int, flags: int, reserved: int, id: int,
                  max_frame_size: int) -> None:
    if length > max_frame_size:
        raise _fail(ErrorCode.FRAME_TOO_LARGE,
                    f"frame payload of {length} bytes exceeds max_frame_size {max_frame_size}", id)
    rule = _ID_RULE.get(ftype)
    if rule is None:
        raise _fail(ErrorCode.UNKNOWN_FRAME_TYPE, f"unknown frame type 0x{ftype:02x}", id)
    if flags:
        if flags & ~FLAG_MORE:
            raise _fail(ErrorCode.BAD_FLAGS, f"reserved flag bits set: 0x{flags:02x}", id)
        if ftype not in _MORE_ALLOWED:
            raise _fail(ErrorCode.BAD_FLAGS, f"MORE is not allowed on {_TYPE_NAMES[ftype]}", id)
    if reserved:
        raise _fail(ErrorCode.RESERVED_NONZERO, "reserved header field is not zero", id)
    if rule == 0:
        if id:
            raise _fail(ErrorCode.BAD_ID, f"{_TYPE_NAMES[ftype]} must carry id 0, got {id}", id)
    elif rule == 1 and not id:
        raise _fail(ErrorCode.BAD_ID, f"{_TYPE_NAMES[ftype]} must carry a non-zero id")


def _str16(p: memoryview, off: int, lo: int, hi: int, range_code: ErrorCode,
           what: str) -> tuple[str, int]:
    """str16 at ``off``: does it fit, then is its length in range, then is it UTF-8."""
    if off + 2 > len(p):
        raise _fail(ErrorCode.BAD_PAYLOAD, f"payload too short for {what}")
    (n,) = _U16.unpack_from(p, off)
    off += 2
    if off + n > len(p):
        raise _fail(ErrorCode.BAD_PAYLOAD, f"{what} runs past the payload")
    if not lo <= n <= hi:
        raise _fail(range_code, f"{what} must be {lo}-{hi} bytes, got {n}")
    return _utf8(p[off:off + n], what), off + n


def _parse_hello(id: int, more: bool, p: memoryview) -> Hello:
    if bytes(p[:8]) != MAGIC:  # a HELLO shorter than the magic is BAD_MAGIC too
        raise _fail(ErrorCode.BAD_MAGIC, "HELLO does not start with WIREPOOL")
    if len(p) < _HELLO_FIXED.size:
        raise _fail(ErrorCode.BAD_PAYLOAD, "HELLO too short for its fixed fields")
    _, vmin, vmax, pid, conc, mfs = _HELLO_FIXED.unpack_from(p, 0)
    bad = ErrorCode.BAD_HANDSHAKE
    if not 1 <= vmin <= vmax:
        raise _fail(bad, f"bad version range {vmin}..{vmax}")
    if conc < 1:
        raise _fail(bad, "max_concurrency must be >= 1")
    if not MIN_FRAME_SIZE_LIMIT <= mfs <= MAX_FRAME_SIZE_LIMIT:
        raise _fail(bad, f"max_frame_size {mfs} out of range")
    off = _HELLO_FIXED.size
    name, off = _str16(p, off, 1, 64, bad, "sdk_name")
    version, off = _str16(p, off, 0, 64, bad, "sdk_version")
    if off + 2 > len(p):
        raise _fail(ErrorCode.BAD_PAYLOAD, "HELLO too short for method_count")
    (count,) = _U16.unpack_from(p, off)
    off += 2
    if count > 4096:
        raise _fail(bad, f"method_count {count} above 4096")
    methods: list[MethodInfo] = []
    seen: set[str] = set()
    for _ in range(count):
        if off + 1 > len(p):
            raise _fail(ErrorCode.BAD_PAYLOAD, "method entry runs past the payload")
        kind = p[off]
        if kind not in (1, 2):
            raise _fail(bad, f"method kind {kind} is neither unary nor stream")
        if off + 2 > len(p):
            raise _fail(ErrorCode.BAD_PAYLOAD, "method entry runs past the payload")
        ncodecs = p[off + 1]
        off += 2
        if not 1 <= ncodecs <= 16:
            raise _fail(bad, f"codec_count {ncodecs} out of 1-16")
        if off + ncodecs > len(p):
            raise _fail(ErrorCode.BAD_PAYLOAD, "codec list runs past the payload")
        codecs = tuple(p[off:off + ncodecs])
        off += ncodecs
        if len(set(codecs)) != ncodecs:
            raise _fail(bad, "duplicate codec id in a method entry")
        mname, off = _str16(p, off, 1, 255, bad, "method name")
        if mname in seen:
            raise _fail(bad, f"duplicate method name {mname!r}")
        seen.add(mname)
        methods.append(MethodInfo(mname, kind, codecs))
    return Hello(min_version=vmin, max_version=vmax, pid=pid, max_concurrency=conc,
                 max_frame_size=mfs, sdk_name=name, sdk_version=version, methods=methods, id=id)


def _parse_welcome(id: int, more: bool, p: memoryview) -> Welcome:
    if len(p) < _WELCOME.size:
        raise _fail(ErrorCode.BAD_PAYLOAD, "WELCOME too short")
    ver, reserved, wid, mfs, credit, hb, mif, mms = _WELCOME.unpack_from(p, 0)
    if reserved:
        raise _fail(ErrorCode.RESERVED_NONZERO, "WELCOME reserved field is not zero")
    bad = ErrorCode.BAD_HANDSHAKE
    if not MIN_FRAME_SIZE_LIMIT <= mfs <= MAX_FRAME_SIZE_LIMIT:
        raise _fail(bad, f"max_frame_size {mfs} out of range")
    if not 1 <= credit <= MAX_CREDIT:
        raise _fail(bad, "initial_credit must be 1..2^31-1")
    if mif < 1:
        raise _fail(bad, "max_in_flight must be >= 1")
    if mms < mfs:
        raise _fail(bad, "max_message_size below max_frame_size")
    return Welcome(version=ver, worker_id=wid, max_frame_size=mfs, initial_credit=credit,
                   heartbeat_ms=hb, max_in_flight=mif, max_message_size=mms, id=id)


def _parse_request(id: int, more: bool, p: memoryview) -> Request:
    if len(p) < 12:
        raise _fail(ErrorCode.BAD_PAYLOAD, "REQUEST too short", id)
    method, codec, reserved, timeout = _REQUEST_PREFIX.unpack_from(p, 0)
    if reserved:
        raise _fail(ErrorCode.RESERVED_NONZERO, "REQUEST reserved byte is not zero", id)
    return Request(id, method, codec, p[12:], timeout, more)


def _parse_cancel(id: int, more: bool, p: memoryview) -> Cancel:
    if len(p):
        raise _fail(ErrorCode.BAD_PAYLOAD, "CANCEL carries a payload", id)
    return Cancel(id)


def _parse_result(id: int, more: bool, p: memoryview) -> Result:
    return Result(id, p, more)


def _parse_error(id: int, more: bool, p: memoryview) -> ErrorFrame:
    if len(p) < 6:
        raise _fail(ErrorCode.BAD_PAYLOAD, "ERROR too short", id)
    code, n = _ERROR_PREFIX.unpack_from(p, 0)
    if 6 + n > len(p):
        raise _fail(ErrorCode.BAD_PAYLOAD, "ERROR message runs past the payload", id)
    message = _utf8(p[6:6 + n], "ERROR message")
    details = _utf8(p[6 + n:], "ERROR details") if len(p) > 6 + n else ""
    return ErrorFrame(id, code, message, details)


def _parse_rows(id: int, more: bool, p: memoryview) -> Rows:
    length = len(p)
    if length < 4:
        raise _fail(ErrorCode.BAD_PAYLOAD, "ROWS too short for its count", id)
    (count,) = _u32_unpack_from(p, 0)
    if count == 0 or count > (length - 4) >> 2:
        raise _fail(ErrorCode.ROW_BOUNDS, f"ROWS count {count} impossible for {length} bytes", id)
    # Rows all of one size (a worker SDK pads JSON rows of a frame to one size for this) are
    # checked with four strided compares: every length field equals the first.
    size = _u32_unpack_from(p, 4)[0]
    stride = size + 4
    if stride * count == length - 4:
        first = bytes(p[4:8])
        if count == 1 or (p[4::stride] == first[0:1] * count and p[5::stride] == first[1:2] * count
                          and p[6::stride] == first[2:3] * count
                          and p[7::stride] == first[3:4] * count):
            return Rows._from_payload(id, p, count, size)
    # Else walk the lengths once to prove the rows tile the payload, keeping where each row
    # ends: slicing (lazily) then needs no loop of its own.
    unpack = _u32_unpack_from
    ends: list[int] = []
    append = ends.append
    off = 4
    last = length - 4
    for _ in range(count):
        if off > last:
            raise _fail(ErrorCode.ROW_BOUNDS, "row length field runs past the payload", id)
        off += 4 + unpack(p, off)[0]
        append(off)
    if off != length:
        raise _fail(ErrorCode.ROW_BOUNDS,
                    "a row runs past the payload" if off > length else "bytes left over after rows", id)
    return Rows._from_payload(id, p, count, ends=ends)


def _parse_end(id: int, more: bool, p: memoryview) -> End:
    if len(p) < 8:
        raise _fail(ErrorCode.BAD_PAYLOAD, "END too short", id)
    return End(id, _U64.unpack_from(p, 0)[0], p[8:], more)


def _parse_credit(id: int, more: bool, p: memoryview) -> Credit:
    if len(p) != 4:
        raise _fail(ErrorCode.BAD_PAYLOAD, "CREDIT payload must be 4 bytes", id)
    (n,) = _u32_unpack_from(p, 0)
    if n < 1:
        raise _fail(ErrorCode.BAD_PAYLOAD, "CREDIT of 0 bytes", id)
    return Credit(id, n)


def _parse_event(id: int, more: bool, p: memoryview) -> Event:
    if len(p) < 2:
        raise _fail(ErrorCode.BAD_PAYLOAD, "EVENT too short", id)
    (n,) = _EVENT_PREFIX.unpack_from(p, 0)
    if 2 + n > len(p):
        raise _fail(ErrorCode.BAD_PAYLOAD, "EVENT topic runs past the payload", id)
    if not 1 <= n <= 255:
        raise _fail(ErrorCode.BAD_PAYLOAD, "EVENT topic must be 1-255 bytes", id)
    topic = _utf8(p[2:2 + n], "EVENT topic")
    return Event(id, topic, _utf8(p[2 + n:], "EVENT data"))


def _parse_ping(id: int, more: bool, p: memoryview) -> Ping:
    if len(p) != 8:
        raise _fail(ErrorCode.BAD_PAYLOAD, "PING nonce must be 8 bytes")
    return Ping(bytes(p))


def _parse_pong(id: int, more: bool, p: memoryview) -> Pong:
    if len(p) != 8:
        raise _fail(ErrorCode.BAD_PAYLOAD, "PONG nonce must be 8 bytes")
    return Pong(bytes(p))


def _parse_u32_only(cls: type, what: str):  # type: ignore[no-untyped-def]
    def parse(id: int, more: bool, p: memoryview):  # type: ignore[no-untyped-def]
        if len(p) != 4:
            raise _fail(ErrorCode.BAD_PAYLOAD, f"{what} payload must be 4 bytes")
        return cls(_u32_unpack_from(p, 0)[0])
    return parse


def _parse_continuation(id: int, more: bool, p: memoryview) -> Continuation:
    return Continuation(id, p, more)


_PARSERS = {
    FrameType.HELLO: _parse_hello, FrameType.WELCOME: _parse_welcome,
    FrameType.REQUEST: _parse_request, FrameType.CANCEL: _parse_cancel,
    FrameType.RESULT: _parse_result, FrameType.ERROR: _parse_error, FrameType.ROWS: _parse_rows,
    FrameType.END: _parse_end, FrameType.CREDIT: _parse_credit, FrameType.EVENT: _parse_event,
    FrameType.PING: _parse_ping, FrameType.PONG: _parse_pong,
    FrameType.DRAIN: _parse_u32_only(Drain, "DRAIN"),
    FrameType.GOODBYE: _parse_u32_only(Goodbye, "GOODBYE"),
    FrameType.CONTINUATION: _parse_continuation,
}


def parse_payload(ftype: int, flags: int, id: int, payload: memoryview) -> Frame:
    """Validate one frame's payload (header already checked) into its typed frame."""
    return _PARSERS[ftype](id, bool(flags & FLAG_MORE), payload)


class FrameDecoder:
    """Incremental, validating frame decoder.

    Feed bytes in any chunking with :meth:`feed`; pull frames with :meth:`next_frame` until it
    returns None. Each header is checked (size limit first) as soon as its 16 bytes are in, before
    any payload is awaited or allocated. A frame that lies inside one fed ``bytes`` chunk is
    sliced out of it without copying; a frame spanning chunks is gathered into one buffer of
    exactly its size. After an error the decoder is dead and re-raises the same error.
    """

    __slots__ = ("max_frame_size", "_buf", "_pos", "_hdr", "_big", "_big_len", "_big_fill",
                 "_big_hdr", "_error", "_frames", "_spares")

    def __init__(self, max_frame_size: int = HANDSHAKE_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf: memoryview = memoryview(b"")
        self._pos = 0
        self._hdr = bytearray()
        self._big: bytearray | None = None
        self._big_len = 0  # the gathered frame's payload size (``_big`` may be a larger spare)
        self._big_fill = 0
        self._big_hdr: tuple = ()
        self._error: ProtocolError | None = None
        # Buffers of earlier large frames, reused once nothing refers to them any more: a fresh
        # bytearray per frame costs a zeroing pass and a page fault per 4 KiB (often more than
        # receiving the bytes). At most _SPARES of them, _SPARE_MAX_BYTES in all.
        self._spares: list[bytearray] = []

    def _gather_buffer(self, length: int) -> bytearray:
        """A buffer of at least ``length`` bytes (already checked against the frame limit) for
        one large frame: a spare that no frame, view or caller still refers to, else a new one."""
        spares = self._spares
        for i in range(len(spares)):
            spare = spares[i]
            # 3 = the list's reference, ``spare`` and getrefcount's argument: any memoryview
            # of it (a payload still held by a caller) holds one more.
            if length <= len(spare) <= 2 * length and sys.getrefcount(spare) == 3:
                del spares[i]
                spares.append(spare)  # most recently used last
                return spare
        big = bytearray(length)
        if length * 2 <= _SPARE_MAX_BYTES:
            while spares and (len(spares) >= _SPARES
                              or sum(map(len, spares)) + length > _SPARE_MAX_BYTES):
                del spares[0]
            spares.append(big)
        return big

    def feed(self, data: Buffer) -> None:
        """Add received bytes. ``bytes`` are referenced, not copied; other buffers are copied."""
        if self._error is not None:
            self._raise_dead()
        if not isinstance(data, bytes):
            data = bytes(data)
        if self._pos < len(self._buf):
            data = bytes(self._buf[self._pos:]) + data
        self._buf = memoryview(data)
        self._pos = 0

    def writable(self, min_size: int = 65536) -> memoryview | None:
        """Where to receive the next bytes directly, if a large payload is being gathered.

        When a frame's payload is partly in and at least ``min_size`` bytes are still missing,
        returns a writable view of exactly the missing part, so a driver can ``recv_into`` it
        (no intermediate copy); report the bytes written with :meth:`wrote`. Else None.
        """
        big = self._big
        if big is None or self._pos < len(self._buf) or self._error is not None:
            return None
        if self._big_len - self._big_fill < min_size:
            return None
        return memoryview(big)[self._big_fill:self._big_len]

    def wrote(self, n: int) -> None:
        """``n`` bytes were received into the view returned by :meth:`writable`."""
        self._big_fill += n

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos + len(self._hdr) + self._big_fill

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None when more bytes are needed."""
        if self._error is not None:
            self._raise_dead()
        try:
            return self._next()
        except ProtocolError as e:
            self.die(e)
            raise

    def _next(self) -> Frame | None:
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        big = self._big
        if big is not None:
            length = self._big_len
            need = length - self._big_fill
            take = need if need < avail else avail
            big[self._big_fill:self._big_fill + take] = buf[pos:pos + take]
            self._big_fill += take
            self._pos = pos + take
            if take < need:
                return None
            ftype, flags, id = self._big_hdr
            self._big = None
            self._big_fill = 0
            view = memoryview(big)
            return _PARSERS[ftype](id, bool(flags & 1),
                                   view if len(big) == length else view[:length])
        hdr = self._hdr
        if not hdr and avail >= HEADER_SIZE:
            length, ftype, flags, reserved, id = _hdr_unpack_from(buf, pos)
            pos += HEADER_SIZE
            avail -= HEADER_SIZE
        else:
            take = HEADER_SIZE - len(hdr)
            if take > avail:
                take = avail
            hdr += buf[pos:pos + take]
            pos += take
            avail -= take
            self._pos = pos
            if len(hdr) < HEADER_SIZE:
                return None
            length, ftype, flags, reserved, id = _hdr_unpack_from(hdr, 0)
            hdr.clear()
        self._pos = pos
        rule = _ID_RULE.get(ftype)
        if (length > self.max_frame_size or flags or reserved or rule is None
                or (rule == 0 and id) or (rule == 1 and not id)):
            _check_header(length, ftype, flags, reserved, id, self.max_frame_size)
        if avail >= length:
            self._pos = pos + length
            return _PARSERS[ftype](id, bool(flags & 1), buf[pos:pos + length])
        big = self._gather_buffer(length)
        big[:avail] = buf[pos:pos + avail]
        self._pos = pos + avail
        self._big = big
        self._big_len = length
        self._big_fill = avail
        self._big_hdr = (ftype, flags, id)
        return None

    def eof(self) -> None:
        """The stream ended: raises TRUNCATED if it ended inside a frame."""
        if self._error is not None:
            self._raise_dead()
        if self._hdr or self._big is not None or self._pos < len(self._buf):
            self.die(_fail(ErrorCode.TRUNCATED, "end of stream inside a frame"))
            self._raise_dead()

    def die(self, e: ProtocolError) -> None:
        """A fatal error: the decoder is dead and lets go of every buffer it held. It keeps the
        error's code, message and id only, not ``e`` itself, whose traceback would hold the
        frames (and through them the buffers) that raised it, in a cycle with this decoder."""
        self._error = ProtocolError(e.code, e.message, id=e.id)
        self._buf = memoryview(b"")
        self._pos = 0
        self._hdr.clear()
        self._big = None
        self._big_fill = 0
        self._spares.clear()

    def _raise_dead(self) -> None:
        """Raise the fatal error again, as a fresh exception (a stored one would collect one
        more traceback entry per raise)."""
        e = self._error
        assert e is not None
        raise ProtocolError(e.code, e.message, id=e.id)


def decode_all(data: Buffer, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> list[Frame]:
    """Decode a complete byte string into frames (raises on any error, including TRUNCATED)."""
    dec = FrameDecoder(max_frame_size)
    dec.feed(data)
    out = []
    while (f := dec.next_frame()) is not None:
        out.append(f)
    dec.eof()
    return out


# ---------------------------------------------------------------------------------------------
# Connection state machine
# ---------------------------------------------------------------------------------------------


class _Stream:
    """Per-request state both sides keep: kind, stream credit, rows seen."""

    __slots__ = ("kind", "credit", "rows")

    def __init__(self, kind: int, credit: int) -> None:
        self.kind = kind
        self.credit = credit
        self.rows = 0


class _Assembly:
    """An incoming message split by MORE, being reassembled into one buffer: each chunk is
    copied in as it arrives (so the frame's own buffer is free for the next frame at once) and
    the message is a view of that buffer, never a join of the chunks."""

    __slots__ = ("first", "buf", "fill", "size")

    def __init__(self, first: Frame, buf: bytearray, size: int) -> None:
        self.first = first
        self.buf = buf
        self.fill = 0  # bytes of the body in ``buf`` (which may be longer: a reused buffer)
        self.size = size

    def append(self, chunk: Buffer) -> None:
        end = self.fill + len(chunk)
        # Assigning past the end grows the bytearray (amortised, realloc in place when it can);
        # within it, the bytes of an earlier message are overwritten.
        self.buf[self.fill:end if end <= len(self.buf) else len(self.buf)] = chunk
        self.fill = end


_START, _HELLO_DONE, _OPEN = 0, 1, 2


class Connection:
    """The state of one connection, seen from ``role`` ("parent" or "worker").

    ``feed`` bytes and pull events with ``next_event``; events are the frame objects (continued
    messages reassembled into one), plus :class:`Late` and :class:`Reject`. ``send`` validates
    a frame the local side wants to send, records its effect and returns the bytes to write.
    Fatal violations raise :class:`ProtocolError`; the connection is then dead.

    Decisions the spec leaves to the reader, made here:
    - A request is in flight from its first REQUEST frame to the first frame of its terminal.
    - The worker decides REJECT when a REQUEST is complete (after reassembly), as the reference
      model in spec/vectors/generate.py does; CANCEL of a half-received request is REJECT
      CANCELLED, so the driver still answers it with a terminal.
    """

    def __init__(self, role: str, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if role not in ("parent", "worker"):
            raise ValueError("role must be 'parent' or 'worker'")
        self.role = role
        self.is_parent = role == "parent"
        self._receives = _PARENT_RECEIVES if self.is_parent else _WORKER_RECEIVES
        self.decoder = FrameDecoder(HANDSHAKE_MAX_FRAME_SIZE)
        self.state = _START
        self.hello: Hello | None = None
        self.welcome: Welcome | None = None
        self.max_frame_size = HANDSHAKE_MAX_FRAME_SIZE
        self.max_message_size = DEFAULT_MAX_MESSAGE_SIZE
        self.initial_credit = DEFAULT_INITIAL_CREDIT
        self.max_in_flight = 1
        self.last_id = 0
        self.in_flight: dict[int, _Stream] = {}
        self._incoming: dict[int, _Assembly] = {}
        self._incoming_bytes = 0  # all messages in progress: bounded per connection (section 5)
        self._spare: bytearray | None = None  # the last reassembled message's buffer
        self._outgoing: set[int] = set()
        self.draining = False
        self.goodbye_sent = False
        self.goodbye_received = False
        self.closed = False

    @property
    def is_open(self) -> bool:
        """True once the handshake completed (WELCOME sent or received)."""
        return self.state == _OPEN

    # -- receiving ------------------------------------------------------------------------

    def feed(self, data: Buffer) -> None:
        self.decoder.feed(data)

    def eof(self) -> None:
        """The peer closed: raises TRUNCATED if it closed inside a frame."""
        self.closed = True
        self.decoder.eof()

    def next_event(self) -> Frame | None:
        """The next event, or None when more bytes are needed."""
        dec = self.decoder
        handle = self._on_parent_frame if self.is_parent else self._on_worker_frame
        while True:
            frame = dec.next_frame()
            if frame is None:
                return None
            try:
                event = handle(frame)
            except ProtocolError as e:
                # The connection is dead: every later call re-raises, and the messages in
                # progress (up to max_message_size of them) are let go at once.
                dec.die(e)
                self._incoming.clear()
                self._incoming_bytes = 0
                raise
            if event is not None:
                return event

    def _continue(self, f: Frame, asm: _Assembly) -> Frame | None:
        """A CONTINUATION for an id with a message in progress."""
        body = f.body  # type: ignore[attr-defined]
        asm.size += len(body)
        if asm.size > self.max_message_size:
            raise _fail(ErrorCode.MESSAGE_TOO_LARGE,
                        f"message for request {f.id} exceeds max_message_size "
                        f"{self.max_message_size}", f.id)
        self._incoming_bytes += len(body)
        self._check_incoming_bytes(f.id)
        asm.append(body)
        # Let go of the frame's buffer now: the decoder reuses it for the next large frame.
        f.body = b""  # type: ignore[attr-defined]
        del body
        if f.more:
            return None
        self._drop_assembly(f.id)
        whole = memoryview(asm.buf)[:asm.fill]
        self._spare = asm.buf
        first = asm.first
        if first.TYPE == FrameType.REQUEST:
            return Request(first.id, first.method, first.codec, whole, first.timeout_us)  # type: ignore[attr-defined]
        if first.TYPE == FrameType.RESULT:
            return Result(first.id, whole)
        return End(first.id, first.row_count, whole)  # type: ignore[attr-defined]

    def _start_assembly(self, f: Frame, chunk: Buffer) -> None:
        size = len(chunk) + _PREFIX_SIZE[f.TYPE]
        self._incoming_bytes += size
        self._check_incoming_bytes(f.id)
        # The last message's buffer, if nothing refers to it any more (2 = the attribute and
        # getrefcount's argument; a view of it held by a reader adds one): large messages then
        # land in memory already mapped instead of fresh pages each time. It is never longer
        # than a message this connection accepted (bounded by max_message_size).
        buf = self._spare
        self._spare = None
        if buf is None or sys.getrefcount(buf) != 2:
            buf = bytearray()
        asm = self._incoming[f.id] = _Assembly(f, buf, size)
        asm.append(chunk)
        if f.TYPE == FrameType.END:
            f.summary = b""  # type: ignore[attr-defined]
        else:
            f.body = b""  # type: ignore[attr-defined]

    def _drop_assembly(self, id: int) -> None:
        self._incoming_bytes -= self._incoming.pop(id).size

    def _check_incoming_bytes(self, id: int) -> None:
        if self._incoming_bytes > self.max_message_size:
            raise _fail(ErrorCode.MESSAGE_TOO_LARGE,
                        f"messages in progress hold {self._incoming_bytes} bytes, above "
                        f"max_message_size {self.max_message_size} for the whole connection", id)

    def _unexpected(self, f: Frame, why: str) -> ProtocolError:
        return _fail(ErrorCode.UNEXPECTED_FRAME, f"{f.NAME} {why}", f.id)

    # The checks run in the order of PROTOCOL.md section 10.2 (and spec/vectors/generate.py):
    # handshake and direction, id, continuation, late, kind, counters.

    def _on_parent_frame(self, f: Frame) -> Frame | None:
        t = f.TYPE
        id = f.id
        if t == FrameType.ERROR and id == 0:
            return f  # a refusal or a fatal report: allowed at any time
        if self.hello is None:
            if t != FrameType.HELLO:
                raise self._unexpected(f, "before HELLO")
            if not f.min_version <= PROTOCOL_VERSION <= f.max_version:  # type: ignore[attr-defined]
                raise _fail(ErrorCode.VERSION_MISMATCH,
                            f"worker speaks versions {f.min_version}..{f.max_version}, "  # type: ignore[attr-defined]
                            f"this parent speaks {PROTOCOL_VERSION}")
            self.hello = f  # type: ignore[assignment]
            self.state = _HELLO_DONE
            return f
        if self.state != _OPEN:
            raise self._unexpected(f, "before WELCOME was sent")
        if t not in _PARENT_RECEIVES:
            raise self._unexpected(f, "cannot be sent to the parent")
        if t == FrameType.HELLO:
            raise self._unexpected(f, "a second time")
        if self.goodbye_received:
            raise self._unexpected(f, "after GOODBYE")
        if id == 0:  # PING, PONG, GOODBYE, EVENT for the connection
            if t == FrameType.GOODBYE:
                self.goodbye_received = True
            return f
        if id > self.last_id:
            raise _fail(ErrorCode.UNKNOWN_ID, f"{f.NAME} for request {id}, never sent", id)
        asm = self._incoming.get(id)
        if asm is not None:
            if t == FrameType.CONTINUATION:
                event = self._continue(f, asm)
                if event is not None:
                    self.in_flight.pop(id, None)
                return event
            if t == FrameType.ERROR:  # the worker abandons the result/summary it was sending
                self._drop_assembly(id)
                self.in_flight.pop(id, None)
                return f
            raise _fail(ErrorCode.CONTINUATION,
                        f"{f.NAME} for request {id} while its message is still arriving", id)
        if t == FrameType.CONTINUATION:
            raise _fail(ErrorCode.CONTINUATION, f"CONTINUATION for request {id} with no message", id)
        req = self.in_flight.get(id)
        if req is None:
            return Late(id, f.NAME)
        if t == FrameType.ROWS:
            if req.kind != MethodKind.STREAM:
                raise _fail(ErrorCode.KIND_MISMATCH, f"ROWS on unary request {id}", id)
            if req.credit <= 0:
                raise _fail(ErrorCode.FLOW_CONTROL, f"ROWS on request {id} without credit", id)
            req.credit -= len(f._payload)  # type: ignore[attr-defined,arg-type]
            req.rows += f.count  # type: ignore[attr-defined]
            return f
        if t == FrameType.RESULT:
            if req.kind != MethodKind.UNARY:
                raise _fail(ErrorCode.KIND_MISMATCH, f"RESULT on stream request {id}", id)
            if f.more:
                self._start_assembly(f, f.body)  # type: ignore[attr-defined]
                return None
            del self.in_flight[id]
            return f
        if t == FrameType.END:
            if req.kind != MethodKind.STREAM:
                raise _fail(ErrorCode.KIND_MISMATCH, f"END on unary request {id}", id)
            if f.row_count != req.rows:  # type: ignore[attr-defined]
                raise _fail(ErrorCode.ROW_COUNT_MISMATCH,
                            f"END says {f.row_count} rows, {req.rows} arrived", id)  # type: ignore[attr-defined]
            if f.more:
                self._start_assembly(f, f.summary)  # type: ignore[attr-defined]
                return None
            del self.in_flight[id]
            return f
        if t == FrameType.ERROR:
            del self.in_flight[id]
        return f  # ERROR, EVENT

    def _on_worker_frame(self, f: Frame) -> Frame | None:
        t = f.TYPE
        id = f.id
        if t == FrameType.ERROR and id == 0:
            return f  # a refusal or a fatal report: allowed at any time
        if self.state != _OPEN:
            if self.state != _HELLO_DONE or t != FrameType.WELCOME:
                raise self._unexpected(f, "before the handshake completed")
            self._accept_welcome(f)  # type: ignore[arg-type]
            return f
        if t not in _WORKER_RECEIVES or t == FrameType.WELCOME or t == FrameType.ERROR:
            # The parent sends ERROR with id 0 only; a request is stopped with CANCEL.
            raise self._unexpected(f, "cannot be sent to the worker now")
        if id == 0:  # PING, PONG, DRAIN
            if t == FrameType.DRAIN:
                self.draining = True
            return f
        if t == FrameType.REQUEST:
            if id <= self.last_id:
                raise _fail(ErrorCode.DUPLICATE_ID,
                            f"REQUEST id {id} not above the last id {self.last_id}", id)
            self.last_id = id
            if f.more:
                self._start_assembly(f, f.body)  # type: ignore[attr-defined]
                return None
            return self._admit(f)  # type: ignore[arg-type]
        if id > self.last_id:
            raise _fail(ErrorCode.UNKNOWN_ID, f"{f.NAME} for request {id}, never received", id)
        asm = self._incoming.get(id)
        if asm is not None:
            if t == FrameType.CONTINUATION:
                event = self._continue(f, asm)
                return None if event is None else self._admit(event)  # type: ignore[arg-type]
            if t == FrameType.CANCEL:  # the parent abandons the request it was sending
                self._drop_assembly(id)
                return Reject(id, ErrorCode.CANCELLED)
            raise _fail(ErrorCode.CONTINUATION,
                        f"{f.NAME} for request {id} while its message is still arriving", id)
        if t == FrameType.CONTINUATION:
            raise _fail(ErrorCode.CONTINUATION, f"CONTINUATION for request {id} with no message", id)
        req = self.in_flight.get(id)
        if req is None:
            return Late(id, f.NAME)
        if t == FrameType.CREDIT:
            if req.kind != MethodKind.STREAM:
                raise _fail(ErrorCode.KIND_MISMATCH, f"CREDIT on unary request {id}", id)
            credit = req.credit + f.bytes  # type: ignore[attr-defined]
            if credit > MAX_CREDIT:
                raise _fail(ErrorCode.CREDIT_OVERFLOW, f"credit of request {id} above 2^31-1", id)
            req.credit = credit
        return f  # CANCEL, CREDIT

    def _admit(self, f: Request) -> Frame:
        """A complete REQUEST: accept it (in flight) or REJECT it (counts as ended)."""
        code = self._reject_code(f)
        if code is not None:
            return Reject(f.id, code)
        kind = self.hello.methods[f.method].kind  # type: ignore[union-attr]
        self.in_flight[f.id] = self._new_stream(kind)
        return f

    def _reject_code(self, f: Request) -> int | None:
        if self.draining:
            return ErrorCode.DRAINING
        methods = self.hello.methods  # type: ignore[union-attr]
        if f.method >= len(methods):
            return ErrorCode.UNKNOWN_METHOD
        if f.codec not in methods[f.method].codecs:
            return ErrorCode.CODEC_UNSUPPORTED
        if len(self.in_flight) >= self.max_in_flight:
            return ErrorCode.OVERLOADED
        return None

    def _accept_welcome(self, w: Welcome) -> None:
        h = self.hello
        assert h is not None
        if not h.min_version <= w.version <= h.max_version:
            raise _fail(ErrorCode.VERSION_MISMATCH,
                        f"WELCOME version {w.version} outside {h.min_version}..{h.max_version}")
        if w.max_frame_size > h.max_frame_size:
            raise _fail(ErrorCode.BAD_HANDSHAKE, "WELCOME max_frame_size above the worker's")
        if w.max_in_flight > h.max_concurrency:
            raise _fail(ErrorCode.BAD_HANDSHAKE, "WELCOME max_in_flight above max_concurrency")
        self._open(w)

    def _open(self, w: Welcome) -> None:
        self.welcome = w
        self.state = _OPEN
        self.max_frame_size = w.max_frame_size
        self.decoder.max_frame_size = w.max_frame_size
        self.max_message_size = w.max_message_size
        self.initial_credit = w.initial_credit
        self.max_in_flight = w.max_in_flight
        # A unary request's state never changes (credit and rows belong to streams, and every
        # path that would touch them checks the kind first): all unary requests share one.
        self._unary = _Stream(MethodKind.UNARY, w.initial_credit)

    def _new_stream(self, kind: int) -> _Stream:
        return self._unary if kind == MethodKind.UNARY else _Stream(kind, self.initial_credit)

    # -- sending --------------------------------------------------------------------------

    def send_request(self, id: int, method: int, codec: int, body: Buffer,
                     timeout_us: int = 0) -> list[Buffer] | None:
        """Parent fast path: the same checks and effects as ``send(Request(...))`` for a
        request that fits one frame, without building frame objects. Returns None when the
        general path is needed (a body larger than one frame)."""
        size = 12 + len(body)
        if size > self.max_frame_size:
            return None
        if (not self.is_parent or self.state != _OPEN or self.draining or id <= self.last_id
                or self.goodbye_sent):
            return self.send(Request(id, method, codec, body, timeout_us))  # raises the error
        methods = self.hello.methods  # type: ignore[union-attr]
        if method >= len(methods):
            raise ValueError(f"method index {method} not in HELLO")
        self.last_id = id
        self.in_flight[id] = self._new_stream(methods[method].kind)
        head = _REQUEST_HEAD_pack(size, FrameType.REQUEST, 0, 0, id, method, codec, 0, timeout_us)
        if len(body) < 4096:
            return [head + body]
        return [head, body]

    def send_result(self, id: int, body: Buffer) -> list[Buffer] | None:
        """Worker fast path: ``send(Result(id, body))`` for a result that fits one frame and
        ends a unary request in flight. Returns None when the general path is needed."""
        if len(body) > self.max_frame_size or self.goodbye_sent or id in self._outgoing:
            return None
        req = self.in_flight.get(id)
        if req is None or req.kind != MethodKind.UNARY or self.is_parent:
            return None
        del self.in_flight[id]
        head = _hdr_pack(len(body), FrameType.RESULT, 0, 0, id)
        if len(body) < 4096:
            return [head + body]
        return [head, body]

    # -- batched fast paths (same checks and effects as the frame-by-frame path) --------------

    def _fast_ready(self) -> bool:
        """True when the received bytes may be scanned frame by frame without the general
        decoder: the connection is open and no frame or message is half-received."""
        dec = self.decoder
        return (self.state == _OPEN and dec._error is None and not dec._hdr and dec._big is None
                and not self._incoming)

    def take_results(self, out: list[Any]) -> None:
        """Parent fast path: consume the single-frame RESULT frames of unary requests in flight
        at the front of the received bytes, appending ``id, body`` (flat) to ``out`` for each.

        Stops at the first frame the general path must see (any other type, a MORE flag, an
        id that is late or unknown, a frame not complete yet): :meth:`next_event` takes it
        from there, with its checks and errors.
        """
        if not self._fast_ready() or self.goodbye_received:
            return
        dec = self.decoder
        buf = dec._buf
        pos = dec._pos
        end = len(buf)
        limit = dec.max_frame_size
        last = self.last_id
        in_flight = self.in_flight
        unary = MethodKind.UNARY
        append = out.append
        while end - pos >= HEADER_SIZE:
            length, ftype, flags, reserved, id = _hdr_unpack_from(buf, pos)
            if (ftype != FrameType.RESULT or flags or reserved or length > limit or not 0 < id <= last
                    or end - pos - HEADER_SIZE < length):
                break
            st = in_flight.get(id)
            if st is None or st.kind != unary:
                break
            del in_flight[id]
            start = pos + HEADER_SIZE
            pos = start + length
            append(id)
            append(buf[start:pos])
        dec._pos = pos

    def answer_inline(self, table: Sequence[Any], out: list[Buffer],
                      started: list[tuple[int, int, int, Any]] | None = None) -> tuple | None:
        """Worker fast path: answer the REQUEST frames at the front of the received bytes whose
        method has an inline entry, appending each RESULT frame's pieces to ``out``.

        ``table[method_index]`` is None or a dict ``codec id -> (fn, decode, encode)``; a request
        is taken here when it is one frame, carries no timeout, its codec has an entry, the
        body decodes and it would be admitted (not draining, below max_in_flight). With a
        ``fn``, its RESULT is ``encode(fn(decode(body)))``; with ``fn`` None (a handler that
        runs elsewhere) it is admitted (in flight) and ``(id, method, codec, decoded body)`` is
        appended to ``started``. Anything else stops the scan for :meth:`next_event`.

        Returns None, or ``(id, method, codec, value, failed)`` for a request now in flight
        whose terminal the caller must send: ``fn`` or ``encode`` raised ``value`` (failed), or
        the encoded ``value`` needs more than one frame.
        """
        if (not self._fast_ready() or self.is_parent or self.draining or self.goodbye_sent
                or len(self.in_flight) >= self.max_in_flight):
            return None
        dec = self.decoder
        buf = dec._buf
        pos = dec._pos
        end = len(buf)
        limit = dec.max_frame_size
        last = self.last_id
        n_methods = len(table)
        append = out.append
        prefix = _REQUEST_PREFIX.unpack_from
        in_flight = self.in_flight
        room = self.max_in_flight
        failed: tuple | None = None
        try:
            while end - pos >= 28:
                length, ftype, flags, reserved, id = _hdr_unpack_from(buf, pos)
                if (ftype != FrameType.REQUEST or flags or reserved or length > limit or length < 12
                        or id <= last or end - pos - HEADER_SIZE < length):
                    break
                method, codec, zero, timeout = prefix(buf, pos + HEADER_SIZE)
                if zero or timeout or method >= n_methods:
                    break
                entry = table[method]
                if entry is None:
                    break
                handler = entry.get(codec)
                if handler is None:
                    break
                fn, decode, encode = handler
                if fn is None and (started is None or len(in_flight) >= room):
                    break  # the general path REJECTs it OVERLOADED
                start = pos + 28
                stop = pos + HEADER_SIZE + length
                try:
                    arg = decode(buf[start:stop])
                except Exception:
                    break  # the general path answers BAD_REQUEST
                last = id
                pos = stop
                if fn is None:
                    in_flight[id] = self._unary
                    started.append((id, method, codec, arg))  # type: ignore[union-attr]
                    continue
                try:
                    body = encode(fn(arg))
                except BaseException as e:  # noqa: B036 - it becomes this request's terminal
                    failed = (id, method, codec, e, True)
                    break
                if len(body) > limit:
                    failed = (id, method, codec, body, False)
                    break
                append(_hdr_pack(len(body), FrameType.RESULT, 0, 0, id))
                append(body)
        finally:
            dec._pos = pos
            self.last_id = last
        if failed is not None:
            self.in_flight[failed[0]] = self._unary
        return failed

    def send_requests(self, first_id: int, method: int, codec: int,
                      bodies: Sequence[Buffer]) -> bytes | None:
        """Parent fast path: REQUEST frames (no timeout) with ids ``first_id, first_id + 1, ...``
        for ``bodies``, as one buffer; the same checks and effects as one :meth:`send_request`
        each. Returns None when the general path is needed (a body larger than one frame)."""
        limit = self.max_frame_size - 12
        for b in bodies:
            if len(b) > limit:
                return None
        if (not self.is_parent or self.state != _OPEN or self.draining or first_id <= self.last_id
                or self.goodbye_sent):
            self.send(Request(first_id, method, codec, b""))  # raises the error
        methods = self.hello.methods  # type: ignore[union-attr]
        if method >= len(methods):
            raise ValueError(f"method index {method} not in HELLO")
        ids = range(first_id, first_id + len(bodies))
        self.last_id = ids[-1] if bodies else self.last_id
        self.in_flight.update(dict.fromkeys(ids, self._new_stream(methods[method].kind)))
        pack = _REQUEST_HEAD_pack
        return b"".join([pack(12 + len(b), FrameType.REQUEST, 0, 0, id, method, codec, 0, 0) + b
                         for id, b in zip(ids, bodies)])

    def send(self, f: Frame) -> list[Buffer]:
        """Record that the local side sends ``f``; returns its encoded pieces.

        Raises ValueError for a frame this side may not send now (a driver bug, never the
        peer's fault). Large REQUEST/RESULT/END bodies must be split first: use
        :meth:`send_message`.
        """
        if self.goodbye_sent:
            raise ValueError("nothing may be sent after GOODBYE")
        t = f.TYPE
        parts = encode_frame_parts(f)
        size = -HEADER_SIZE
        for p in parts:
            size += len(p)
        if size > self.max_frame_size:
            raise ValueError(f"{f.NAME} payload of {size} bytes exceeds max_frame_size "
                             f"{self.max_frame_size}: split it (send_message)")
        if self.is_parent:
            self._record_parent_send(f)
        else:
            self._record_worker_send(f)
        if t == FrameType.ERROR and f.id == 0:
            self.closed = True
        return parts

    def send_message(self, f: Frame) -> list[Buffer]:
        """Send a whole message, split into MORE + CONTINUATION frames when it is too large."""
        out: list[Buffer] = []
        for part in split_message(f, self.max_frame_size):
            out.extend(self.send(part))
        return out

    def _record_parent_send(self, f: Frame) -> None:
        t = f.TYPE
        id = f.id
        if t == FrameType.WELCOME:
            if self.state != _HELLO_DONE:
                raise ValueError("WELCOME needs a HELLO first, and only once")
            h = self.hello
            assert h is not None
            if not h.min_version <= f.version <= h.max_version:  # type: ignore[attr-defined]
                raise ValueError("WELCOME version outside the worker's range")
            if f.max_frame_size > h.max_frame_size or f.max_in_flight > h.max_concurrency:  # type: ignore[attr-defined]
                raise ValueError("WELCOME limits above the worker's")
            self._open(f)  # type: ignore[arg-type]
            return
        if t == FrameType.ERROR and id == 0:
            return
        if self.state != _OPEN:
            raise ValueError(f"{f.NAME} before the handshake completed")
        if t in (FrameType.PING, FrameType.PONG):
            return
        if t == FrameType.DRAIN:
            self.draining = True
            return
        if t == FrameType.REQUEST:
            if self.draining:
                raise ValueError("no REQUEST after DRAIN")
            if id <= self.last_id:
                raise ValueError(f"request id {id} not above {self.last_id}")
            methods = self.hello.methods  # type: ignore[union-attr]
            if f.method >= len(methods):  # type: ignore[attr-defined]
                raise ValueError(f"method index {f.method} not in HELLO")  # type: ignore[attr-defined]
            self.last_id = id
            self.in_flight[id] = self._new_stream(methods[f.method].kind)  # type: ignore[attr-defined]
            if f.more:
                self._outgoing.add(id)
            return
        if t == FrameType.CONTINUATION:
            if id not in self._outgoing:
                raise ValueError(f"no message in progress for request {id}")
            if not f.more:
                self._outgoing.discard(id)
            return
        if id in self._outgoing and t != FrameType.CANCEL:
            raise ValueError(f"request {id} is still being sent")
        if t == FrameType.CANCEL:
            self._outgoing.discard(id)
            if id not in self.in_flight:
                raise ValueError(f"request {id} is not in flight")
            return
        if t == FrameType.CREDIT:
            req = self.in_flight.get(id)
            if req is None or req.kind != MethodKind.STREAM:
                raise ValueError(f"request {id} is not a stream in flight")
            if req.credit + f.bytes > MAX_CREDIT:  # type: ignore[attr-defined]
                raise ValueError("credit grant would overflow")
            req.credit += f.bytes  # type: ignore[attr-defined]
            return
        raise ValueError(f"the parent cannot send {f.NAME}")

    def _record_worker_send(self, f: Frame) -> None:
        t = f.TYPE
        id = f.id
        if t == FrameType.HELLO:
            if self.state != _START:
                raise ValueError("HELLO is sent once, first")
            self.hello = f  # type: ignore[assignment]
            self.state = _HELLO_DONE
            return
        if t == FrameType.ERROR and id == 0:
            return
        if self.state != _OPEN:
            raise ValueError(f"{f.NAME} before the handshake completed")
        if id == 0:
            if t == FrameType.GOODBYE:
                self.goodbye_sent = True
            elif t not in (FrameType.PING, FrameType.PONG, FrameType.EVENT):
                raise ValueError(f"{f.NAME} needs a request id")
            return
        if t == FrameType.CONTINUATION:
            if id not in self._outgoing:
                raise ValueError(f"no message in progress for request {id}")
            if not f.more:
                self._outgoing.discard(id)
                self.in_flight.pop(id, None)
            return
        if id in self._outgoing and t != FrameType.ERROR:
            raise ValueError(f"request {id} result is still being sent")
        if t == FrameType.ERROR:
            self._outgoing.discard(id)
            if id > self.last_id:
                raise ValueError(f"request {id} never arrived")
            self.in_flight.pop(id, None)  # rejected requests are already gone
            return
        req = self.in_flight.get(id)
        if req is None:
            raise ValueError(f"request {id} is not in flight")
        if t == FrameType.EVENT:
            return
        if t == FrameType.ROWS:
            if req.kind != MethodKind.STREAM:
                raise ValueError("ROWS on a unary request")
            if req.credit <= 0:
                raise ValueError("ROWS without credit")
            req.credit -= f.payload_size  # type: ignore[attr-defined]
            req.rows += f.count  # type: ignore[attr-defined]
            return
        if t == FrameType.END and f.row_count != req.rows:  # type: ignore[attr-defined]
            raise ValueError(f"END row_count {f.row_count} but {req.rows} rows were sent")  # type: ignore[attr-defined]
        if t == FrameType.RESULT or t == FrameType.END:
            if f.more:  # still in flight (and counted) until its last CONTINUATION
                self._outgoing.add(id)
            else:
                del self.in_flight[id]
            return
        raise ValueError(f"the worker cannot send {f.NAME}")

    def credit(self, id: int) -> int:
        """Current stream credit of request ``id`` (0 if not in flight)."""
        req = self.in_flight.get(id)
        return req.credit if req is not None else 0

    def record_rows_sent(self, id: int, payload_size: int, count: int) -> None:
        """Worker fast path: account a ROWS frame built by :class:`RowsBuilder`."""
        req = self.in_flight.get(id)
        if req is None or req.kind != MethodKind.STREAM:
            raise ValueError(f"request {id} is not a stream in flight")
        if req.credit <= 0:
            raise ValueError("ROWS without credit")
        req.credit -= payload_size
        req.rows += count
