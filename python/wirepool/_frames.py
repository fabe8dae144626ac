"""Frames of the wirepool protocol v1 (spec/PROTOCOL.md sections 2-11): their types, their
encoding (:func:`encode_frame_parts`, :class:`RowsBuilder`, :func:`split_message`) and their
validating decoder (:class:`FrameDecoder`). Part of the sans-IO core: :mod:`wirepool.proto`
re-exports all of it beside the connection state machine and the policies built on it.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import sys
import struct
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, Union

from . import _shm_proto
from ._shm_proto import ShmRange
from .errors import ErrorCode, ProtocolError
from ._constants import (DEFAULT_HEARTBEAT_MS, DEFAULT_INITIAL_CREDIT, DEFAULT_MAX_FRAME_SIZE,
                         DEFAULT_MAX_MESSAGE_SIZE, FLAG_MORE, HANDSHAKE_MAX_FRAME_SIZE,
                         HEADER_SIZE, MAX_CREDIT, MAX_MAX_FRAME_SIZE, MAX_METHODS,
                         MIN_MAX_FRAME_SIZE)

if TYPE_CHECKING:
    from .proto import Connection

Buffer = Union[bytes, bytearray, memoryview]

# The protocol's constants come from spec/constants.json through the generated _constants.py
# (PROTOCOL.md 18); the names below are this module's public aliases of them.
MIN_FRAME_SIZE_LIMIT = MIN_MAX_FRAME_SIZE
MAX_FRAME_SIZE_LIMIT = MAX_MAX_FRAME_SIZE
MAGIC = b"WIREPOOL"
# Large-frame receive buffers a decoder keeps for reuse (see FrameDecoder._gather_buffer): room
# for two frames of the largest size the protocol allows (16 MiB), so that 16 MiB frames are
# reused too (fresh ones cost a zeroing pass and page faults: 3x slower 16 MiB echo).
_SPARES = 2
_SPARE_MAX_BYTES = 32 << 20
_SPARE_GRAIN = 64 << 10  # their sizes are multiples of this
# Reads land in a reused buffer of this size (read_buffer), or straight in a large frame's own
# buffer when at least _READ_INTO_FRAME of its payload is still missing.
_READ_BUFFER = 256 * 1024
_READ_INTO_FRAME = 65536

_HEADER = struct.Struct("<IBBHQ")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HELLO_FIXED = struct.Struct("<8sHHIII")
_WELCOME = struct.Struct("<HHIIIIIQ")
_REQUEST_PREFIX = struct.Struct("<HBBQ")
_first = operator.itemgetter(0)
_ROWS_PER_UNPACK = 32


@functools.lru_cache(maxsize=256)
def _row_structs(size: int) -> tuple[struct.Struct, struct.Struct]:
    """Rows of ``size`` bytes after their length fields, as bytes: one, or _ROWS_PER_UNPACK."""
    return struct.Struct(f"<4x{size}s"), struct.Struct("<" + f"4x{size}s" * _ROWS_PER_UNPACK)
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
# The shm extension's frames (section 20.3): known only on a connection whose lane is on.
_SHM_ID_RULE = {0x50: 0, 0x51: 0, 0x52: 0, 0x7E: 1}
_HEADER_NAMES = {**_TYPE_NAMES,
                 0x50: "SHM_REGION", 0x51: "SHM_RELEASE", 0x52: "SHM_RETIRE", 0x7E: "SHM_BODY"}
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
        # A HELLO's or WELCOME's extension block is trailing bytes a v1 reader ignores: not part
        # of the frame's value (section 20.1).
        return {s: getattr(self, s) for cls in type(self).__mro__
                for s in getattr(cls, "__slots__", ()) if s != "extensions"}

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
                 "sdk_name", "sdk_version", "methods", "extensions")
    TYPE = FrameType.HELLO
    NAME = "HELLO"

    def __init__(self, *, min_version: int = 1, max_version: int = 1, pid: int = 0,
                 max_concurrency: int = 1, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 sdk_name: str = "wirepool-python", sdk_version: str = "",
                 methods: Sequence[MethodInfo] = (), id: int = 0, more: bool = False,
                 extensions: bytes = b"") -> None:
        self.id = id
        self.more = more
        #: The extension block after the last method entry (section 20.1), e.g.
        #: ``ShmOffer(window).encode()``; the trailing bytes as received.
        self.extensions = extensions
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
        out += self.extensions
        return [out]


class Welcome(Frame):
    __slots__ = ("version", "worker_id", "max_frame_size", "initial_credit", "heartbeat_ms",
                 "max_in_flight", "max_message_size", "extensions")
    TYPE = FrameType.WELCOME
    NAME = "WELCOME"

    def __init__(self, *, version: int = 1, worker_id: int = 0,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 initial_credit: int = DEFAULT_INITIAL_CREDIT, heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
                 max_in_flight: int = 1, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 id: int = 0, more: bool = False, extensions: bytes = b"") -> None:
        self.id = id
        self.more = more
        #: The extension block from offset 32 (section 20.1), e.g. ``ShmAccept(...).encode()``.
        self.extensions = extensions
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
                              self.max_message_size) + self.extensions]


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

    __slots__ = ("_payload", "count", "_rows", "_pieces")
    TYPE = FrameType.ROWS
    NAME = "ROWS"

    def __init__(self, id: int, rows: Sequence[Buffer] = (), more: bool = False) -> None:
        self.id = id
        self.more = more
        self._rows: list | None = list(rows)
        self.count = len(self._rows)
        self._payload: Buffer | None = None
        self._pieces: list[tuple[int, int, Any]] = []

    @classmethod
    def _from_payload(cls, id: int, payload: memoryview, count: int,
                      pieces: list[tuple[int, int, Any]]) -> "Rows":
        self = cls.__new__(cls)
        self.id = id
        self.more = False
        self._payload = payload
        self.count = count
        self._rows = None
        # The layout found while validating, in order: (offset of a row's length field, the
        # row size, how many rows of that size follow) for runs of one size, sliced without a
        # loop; (offset, -1, where each row ends) for rows of other sizes.
        self._pieces = pieces
        return self

    def _slices(self, copy: bool = False) -> Iterator[Any]:
        """The rows as memoryview slices (or, with ``copy``, bytes), from C iterators (no
        bytecode per row)."""
        p: Any = self._payload
        if copy:
            # Slicing bytes costs about half of slicing a memoryview: one copy of the frame.
            p = bytes(p)  # type: ignore[arg-type]
        pieces = self._pieces
        if len(pieces) == 1:
            return self._piece_slices(p, *pieces[0])
        return itertools.chain.from_iterable(itertools.starmap(
            self._piece_slices, zip(itertools.repeat(p), *zip(*pieces))))

    @staticmethod
    def _piece_slices(p: Any, at: int, size: int, rows: Any) -> Iterator[Any]:
        if size >= 0:
            stride = size + 4
            span = rows * stride
            return map(p.__getitem__, map(slice, range(at + 4, at + 4 + span, stride),
                                          range(at + 4 + size, at + 4 + size + span, stride)))
        # row i starts 4 bytes (its length field) after row i - 1 ends; the first at ``at + 4``
        starts = map(operator.add, itertools.chain((at,), rows), itertools.repeat(4))
        return map(p.__getitem__, map(slice, starts, rows))

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
        if not copy_rows:
            return list(map(fn, self._slices()))
        p: Any = self._payload
        out: list[Any] = []
        whole = None
        for at, size, rows in self._pieces:
            if size < 0:
                if whole is None:
                    whole = bytes(p)  # slicing bytes costs about half of slicing a memoryview
                out.extend(map(fn, self._piece_slices(whole, at, -1, rows)))
                continue
            # C iterators unpack every row of a run as bytes: _ROWS_PER_UNPACK rows per tuple
            # (a tuple and a call less per row), then the rest one per tuple.
            one, many = _row_structs(size)
            stride = size + 4
            split = at + rows // _ROWS_PER_UNPACK * _ROWS_PER_UNPACK * stride
            it = many.iter_unpack(p[at:split])
            try:
                out.extend(map(fn, itertools.chain.from_iterable(it)))
                if split < at + rows * stride:
                    it = one.iter_unpack(p[split:at + rows * stride])
                    out.extend(map(fn, map(_first, it)))
            except BaseException:
                # The iterator holds a buffer export on the payload; a traceback keeping
                # this frame alive would keep it too, and a garbage cycle holding an
                # exported memoryview crashes CPython's collector. Let go of it now.
                del it
                raise
        return out

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


# PROTOCOL.md 14.2 calls the event of an EVENT frame a Notification: the same class.
Notification = Event


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


class ShmFrame(Frame):
    """A frame of the shared-memory extension (section 20.3), known only on a connection whose
    lane is on: ``size`` for SHM_REGION, ``offset``/``length`` for SHM_RELEASE and SHM_BODY."""

    __slots__ = ("region", "size", "offset", "length")

    def __init__(self, id: int, region: int, size: int = 0, offset: int = 0,
                 length: int = 0) -> None:
        self.id = id
        self.more = False
        self.region = region
        self.size = size
        self.offset = offset
        self.length = length

    @property
    def range(self) -> ShmRange:
        return ShmRange(self.region, self.offset, self.length)

    def _payload_parts(self) -> list[Buffer]:
        wire = _shm_proto.ShmFrame(self.TYPE, self.id, self.region, self.size, self.offset,
                                   self.length)
        return [wire.encode()[HEADER_SIZE:]]


class ShmRegion(ShmFrame):
    __slots__ = ()
    TYPE = _shm_proto.SHM_REGION
    NAME = "SHM_REGION"


class ShmRelease(ShmFrame):
    __slots__ = ()
    TYPE = _shm_proto.SHM_RELEASE
    NAME = "SHM_RELEASE"


class ShmRetire(ShmFrame):
    __slots__ = ()
    TYPE = _shm_proto.SHM_RETIRE
    NAME = "SHM_RETIRE"


class ShmBody(ShmFrame):
    __slots__ = ()
    TYPE = _shm_proto.SHM_BODY
    NAME = "SHM_BODY"


_SHM_CLASSES: dict[int, type[ShmFrame]] = {
    c.TYPE: c for c in (ShmRegion, ShmRelease, ShmRetire, ShmBody)}


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


# A row's length field by the row's length, for rows up to 4 KiB (the common case): one lookup
# instead of a struct call per row. Read-only; a list, not a tuple, because map() over
# list.__getitem__ is a direct call and over tuple.__getitem__ a slot wrapper (+180
# instructions per raw row).
ROW_PREFIXES: list[bytes] = [_u32_pack(n) for n in range(4096)]
_ROWS_HEAD = struct.Struct("<IBBHQI")  # a ROWS header plus the row count
_ROWS_HEAD_SIZE = HEADER_SIZE + 4


def framed_row(row: Buffer) -> bytes:
    """``row`` with its ROWS length field in front (a copy): what :meth:`RowsBuilder.extend`
    takes with ``framed=True``, for a producer that copies each row anyway."""
    n = len(row)
    return (ROW_PREFIXES[n] if n < 4096 else _u32_pack(n)) + row


class RowsBuilder:
    """One ROWS frame of stream ``id``, from :meth:`Connection.rows`.

    Filled anywhere (a handler thread may fill it while the core's thread does other work) with
    :meth:`append` (one row) or :meth:`extend` (many, without bytecode per row); the frame's
    header and row count are written by :meth:`finish`, on the thread that owns the core, which
    charges the stream's credit and counts the rows (PROTOCOL.md 14.3)::

        b = conn.rows(id)
        while rows and b.append(rows[0]):
            rows.pop(0)
        parts = b.finish()              # raises ProtocolError FLOW_CONTROL without credit

    The payload stays within ``target`` bytes when it can (a row alone may exceed it up to the
    frame limit); a row that cannot fit in any frame raises ``ProtocolError`` ``ROW_TOO_LARGE``.
    """

    __slots__ = ("_conn", "id", "target", "_limit", "_parts", "_headed", "size", "count",
                 "widest")

    def __init__(self, conn: "Connection", id: int, target: int, limit: int) -> None:
        self._conn = conn
        self.id = id
        self.target = min(target, limit)
        self._limit = limit  # the largest payload: max_frame_size
        # The frame's bytes after its header, in pieces (one per extend: written as they are,
        # never joined again). A frame filled by one extend() is built whole, header included
        # (``_headed``): one join and nothing to patch.
        self._parts: list[Buffer] = []
        self._headed = False
        self.size = 4  # payload bytes so far (the count field included)
        self.count = 0
        self.widest = 0  # the longest row's length

    def _too_large(self, n: int) -> ProtocolError:
        return _fail(ErrorCode.ROW_TOO_LARGE,
                     f"a row of {n} bytes does not fit in one frame (max_frame_size "
                     f"{self._limit})", self.id)

    def append(self, row: Buffer) -> bool:
        """Add one row (copied); False (nothing added) when it would take the payload past
        ``target``: finish this frame and start another."""
        n = len(row)
        size = self.size + 4 + n
        if size > self.target and (self.count or size > self._limit):
            if not self.count:
                raise self._too_large(n)
            return False
        self._parts.append((ROW_PREFIXES[n] if n < 4096 else _u32_pack(n)) + bytes(row))
        self.size = size
        self.count += 1
        if n > self.widest:
            self.widest = n
        return True

    def extend(self, rows: list, framed: bool = False, full_only: bool = False,
               prefixes: Sequence[bytes] | None = None) -> int:
        """Add rows from the front of ``rows`` (``bytes``; not removed from the list) while
        they fit; returns how many were taken. ``framed``: each already carries its length
        field (:func:`framed_row`). ``full_only``: take nothing unless the rows fill the frame
        (more of them than fit), so a producer can wait for more. ``prefixes`` (unframed rows
        only): what goes before a row, by the row's length, for the lengths it covers: its
        length field, or for JSON rows a padded row's length field and leading spaces (the
        same JSON value, one row size for the parent); :data:`ROW_PREFIXES` by default.

        Without bytecode per row: lengths, fields and the frame are built by C iterators and
        one join."""
        room = self.target - self.size
        k = min(len(rows), room // 4 + 1)
        if k <= 0:
            return 0
        snap = rows[:k]  # a producer may append to ``rows`` meanwhile: the first k stay
        lens = list(map(len, snap))
        field = 0 if framed else 4
        nbytes = sum(lens) + field * k
        if nbytes <= room:
            if full_only and k == len(rows):
                return 0
        else:
            ends = list(itertools.accumulate(
                lens if framed else map(operator.add, lens, itertools.repeat(4))))
            k = bisect.bisect_right(ends, room)
            if not k:
                if self.count:
                    return 0
                k = 1  # one row alone may pass the target, not the frame limit
                if self.size + ends[0] > self._limit:
                    raise self._too_large(lens[0] - field)
            del snap[k:], lens[k:]
            nbytes = ends[k - 1]
        fresh = self.count == 0
        if framed:
            widest = max(lens) - 4
            head = _ROWS_HEAD.pack(4 + nbytes, FrameType.ROWS, 0, 0, self.id, k) if fresh else b""
            snap.insert(0, head)
            piece = b"".join(snap)
        else:
            widest = max(lens)
            first = lens[0]
            table = prefixes if prefixes is not None and widest < len(prefixes) else (
                ROW_PREFIXES if widest < 4096 else None)
            if lens.count(first) == k:
                # One row size: length, row, length, row, ... as one join (the join puts the
                # first row's length field right after the header).
                prefix = table[first] if table is not None else _u32_pack(first)
                nbytes = k * (len(prefix) + first)
                fields: Any = None
            else:
                fields = list(map(table.__getitem__, lens) if table is not None
                              else map(_u32_pack, lens))
                if table is not ROW_PREFIXES and table is not None:
                    # Padded: a field's size grows with its row's length up to the padded
                    # size, so the narrowest and the widest row tell whether all have one.
                    least = min(lens)
                    size = len(table[widest]) + widest
                    nbytes = (k * size if len(table[least]) + least == size
                              else sum(map(len, fields)) + nbytes - 4 * k)
            if self.size + nbytes > self._limit:  # padding would pass the frame limit
                return self.extend(snap, False, False, None)
            head = _ROWS_HEAD.pack(4 + nbytes, FrameType.ROWS, 0, 0, self.id, k) if fresh else b""
            if fields is None:
                snap.insert(0, head)
                parts: list[Any] = snap
            else:
                parts = [head] * (2 * k + 1)
                parts[1::2] = fields
                parts[2::2] = snap
            # With one row size the separator is the field: b"".join's first element is the
            # header (or nothing), so every row, the first included, follows its field.
            piece = (prefix if fields is None else b"").join(parts)
        self._parts.append(piece)
        if fresh:
            self._headed = True
        self._added(nbytes, k, widest)
        return k

    def _added(self, nbytes: int, k: int, widest: int) -> None:
        self.size += nbytes
        self.count += k
        if widest > self.widest:
            self.widest = widest

    def finish(self) -> list[Buffer]:
        """The frame, to write: charges the stream's credit and counts its rows (on the core's
        thread); the builder starts empty again. Refused (``ProtocolError``, nothing changed,
        the builder still usable) as a ROWS send would be: no credit, not a stream in flight,
        after GOODBYE."""
        if not self.count:
            raise _fail(ErrorCode.ROW_BOUNDS, "a ROWS frame needs at least one row", self.id)
        self._conn._rows_sent(self.id, self.size, self.count)
        parts = self._parts
        if not (self._headed and len(parts) == 1):  # else built whole by one extend()
            if self._headed:
                parts[0] = memoryview(parts[0])[_ROWS_HEAD_SIZE:]  # its rows, not its header
            parts.insert(0, _ROWS_HEAD.pack(self.size, FrameType.ROWS, 0, 0, self.id, self.count))
        self._parts = []  # the builder starts empty again
        self._headed = False
        self.size = 4
        self.count = self.widest = 0
        return parts


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def _check_header(length: int, ftype: int, flags: int, reserved: int, id: int,
                  max_frame_size: int, shm: bool = False) -> None:
    if length > max_frame_size:
        raise _fail(ErrorCode.FRAME_TOO_LARGE,
                    f"frame payload of {length} bytes exceeds max_frame_size {max_frame_size}", id)
    rule = _ID_RULE.get(ftype)
    if rule is None and shm:  # the lane's frames exist once it is on (section 20.1)
        rule = _SHM_ID_RULE.get(ftype)
    if rule is None:
        raise _fail(ErrorCode.UNKNOWN_FRAME_TYPE, f"unknown frame type 0x{ftype:02x}", id)
    if flags:
        if flags & ~FLAG_MORE:
            raise _fail(ErrorCode.BAD_FLAGS, f"reserved flag bits set: 0x{flags:02x}", id)
        if ftype not in _MORE_ALLOWED:
            raise _fail(ErrorCode.BAD_FLAGS, f"MORE is not allowed on {_HEADER_NAMES[ftype]}", id)
    if reserved:
        raise _fail(ErrorCode.RESERVED_NONZERO, "reserved header field is not zero", id)
    if rule == 0:
        if id:
            raise _fail(ErrorCode.BAD_ID, f"{_HEADER_NAMES[ftype]} must carry id 0, got {id}", id)
    elif rule == 1 and not id:
        raise _fail(ErrorCode.BAD_ID, f"{_HEADER_NAMES[ftype]} must carry a non-zero id")


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
    if count > MAX_METHODS:
        raise _fail(bad, f"method_count {count} above {MAX_METHODS}")
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
                 max_frame_size=mfs, sdk_name=name, sdk_version=version, methods=methods, id=id,
                 extensions=bytes(p[off:]))


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
                   heartbeat_ms=hb, max_in_flight=mif, max_message_size=mms, id=id,
                   extensions=bytes(p[_WELCOME.size:]))


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
    # checked with four strided reads: every length field equals the first.
    size = _u32_unpack_from(p, 4)[0]
    stride = size + 4
    if stride * count == length - 4:
        if count == 1:
            return Rows._from_payload(id, p, count, [(4, size, count)])
        b = _strided(p, stride)
        if _run_of(b, 4, stride, count) == count:
            return Rows._from_payload(id, p, count, [(4, size, count)])
    else:
        b = p  # copied when a run seems likely
    # Else runs of one size (rows whose size changes now and then) are found by the same
    # strided reads, and the rows between them are walked one length field at a time, keeping
    # where each ends; when runs are not found, attempts back off (rows of any size cost the
    # walk alone).
    pieces: list[tuple[int, int, Any]] = []
    unpack = _u32_unpack_from
    off = 4
    left = count
    backoff = _RUN_MIN
    while left:
        if left >= _RUN_MIN:
            if off > length - 4:
                raise _fail(ErrorCode.ROW_BOUNDS, "row length field runs past the payload", id)
            size = unpack(b, off)[0]
            stride = size + 4
            n = min(left, (length - off) // stride)
            # Only when the next row has this size too: a failed attempt costs little.
            if n >= _RUN_MIN and unpack(b, off + stride)[0] == size:
                if b is p:
                    b = _strided(p, stride)
                run = _run_of(b, off, stride, _RUN_MIN)
                if run == _RUN_MIN:
                    run = _run_of(b, off, stride, n)
                    pieces.append((off, size, run))
                    off += run * stride
                    left -= run
                    backoff = _RUN_MIN
                    continue
            walk = min(left, backoff)
            backoff = min(2 * backoff, 1024)
        else:
            walk = left
        ends: list[int] = []
        append = ends.append
        start = off
        last = length - 4
        for _ in range(walk):
            if off > last:
                raise _fail(ErrorCode.ROW_BOUNDS, "row length field runs past the payload", id)
            off += 4 + unpack(b, off)[0]
            append(off)
        if off > length:
            raise _fail(ErrorCode.ROW_BOUNDS, "a row runs past the payload", id)
        pieces.append((start, -1, ends))
        left -= walk
    if off != length:
        raise _fail(ErrorCode.ROW_BOUNDS,
                    "a row runs past the payload" if off > length else "bytes left over after rows", id)
    return Rows._from_payload(id, p, count, pieces)


_RUN_MIN = 16  # rows of one size taken as a run (fewer are walked)


def _strided(p: memoryview, stride: int) -> Buffer:
    """``p``, or for rows below 256 bytes a copy of it, whose strided slices are a loop of
    plain byte copies (a strided memoryview's go element by element through struct unpacking,
    several times slower; with larger rows there are few elements, and the copy would cost
    more)."""
    return bytes(p) if stride < 256 else p


def _run_of(p: Buffer, at: int, stride: int, n: int) -> int:
    """How many of the ``n`` rows from offset ``at`` have the first one's length field (the
    rows after a run of one size are at ``stride`` steps; ``n`` of them fit the payload): each
    byte of the length fields read by one strided slice of ``p`` (see _strided), compared
    whole, then halved until the run is found."""
    end = at + n * stride
    cols = [p[at + j:end:stride] for j in range(4)]
    heads = [bytes(c[:1]) * n for c in cols]  # type: ignore[index]
    if cols == heads:
        return n
    good, bad = 1, n  # the first row always has its own field
    while bad - good > 1:
        mid = (good + bad) // 2
        if all(c[:mid] == h[:mid] for c, h in zip(cols, heads)):  # type: ignore[index]
            good = mid
        else:
            bad = mid
    return good


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


def _parse_shm(id: int, more: bool, p: memoryview, ftype: int) -> ShmFrame:
    f = _shm_proto.ShmFrame.decode(ftype, id, p)
    return _SHM_CLASSES[ftype](id, f.region, f.size, f.offset, f.length)


# The decoder validates headers first: these parse only on a connection whose lane is on.
for _t in _SHM_ID_RULE:
    _PARSERS[_t] = lambda id, more, p, _t=_t: _parse_shm(id, more, p, _t)


def parse_payload(ftype: int, flags: int, id: int, payload: memoryview) -> Frame:
    """Validate one frame's payload (header already checked) into its typed frame."""
    return _PARSERS[ftype](id, bool(flags & FLAG_MORE), payload)


class MessageCursor:
    """A message being sent one frame at a time: :meth:`Connection.begin_request`,
    ``begin_result`` or ``begin_end``, then :meth:`Connection.send_next_frame` until it says
    done. Its frames are views of the body (nothing is copied), so the body must stay unchanged
    until the last frame is written."""

    __slots__ = ("id", "_frames", "_next")

    def __init__(self, id: int, frames: list[Frame]) -> None:
        self.id = id
        self._frames = frames
        self._next = 1  # the first frame went out with begin_*

    def is_done(self) -> bool:
        """True once every frame is written."""
        return self._next == len(self._frames)

    def remaining(self) -> int:
        """Body bytes not yet written."""
        left = 0
        for f in self._frames[self._next:]:
            left += len(f.body)  # type: ignore[attr-defined]
        return left


class FrameDecoder:
    """Incremental, validating frame decoder.

    Add bytes in any chunking with :meth:`receive`; pull frames with :meth:`next_frame` until it
    returns None. Each header is checked (size limit first) as soon as its 16 bytes are in, before
    any payload is awaited or allocated. A frame that lies inside one fed ``bytes`` chunk is
    sliced out of it without copying; a frame spanning chunks is gathered into one buffer of
    exactly its size. After an error the decoder is dead and re-raises the same error.
    """

    __slots__ = ("max_frame_size", "_buf", "_pos", "_hdr", "_big", "_big_len", "_big_fill",
                 "_big_hdr", "_error", "_frames", "_spares", "_read_view", "_into_frame", "shm")

    def __init__(self, max_frame_size: int = HANDSHAKE_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        #: The shm extension's frame types are known (its lane is on: section 20.1).
        self.shm = False
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
        self._read_view: memoryview | None = None
        self._into_frame = False

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
        # Rounded up: the frames of a stream differ by a few bytes, and a spare a little too
        # small for the next one would make every frame a new buffer.
        big = bytearray(min(-(-length // _SPARE_GRAIN) * _SPARE_GRAIN, self.max_frame_size))
        if length * 2 <= _SPARE_MAX_BYTES:
            while spares and (len(spares) >= _SPARES
                              or sum(map(len, spares)) + length > _SPARE_MAX_BYTES):
                del spares[0]
            spares.append(big)
        return big

    def receive(self, data: Buffer) -> None:
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

    def read_buffer(self) -> memoryview:
        """Where to read the next bytes (then :meth:`received`): the missing part of a large
        frame's own buffer while at least 64 KiB of it are missing (no copy), else a reused
        256 KiB buffer."""
        if self._big is not None:
            view = self.writable(_READ_INTO_FRAME)
            if view is not None:
                self._into_frame = True
                return view
        self._into_frame = False
        if self._read_view is None:
            self._read_view = memoryview(bytearray(_READ_BUFFER))
        return self._read_view

    def received(self, n: int) -> None:
        """``n`` bytes were read into the view :meth:`read_buffer` returned."""
        if self._into_frame:
            self._big_fill += n
        elif n:
            view = self._read_view[:n]  # type: ignore[index]
            if not (n > HEADER_SIZE and self._pos == len(self._buf) and not self._hdr
                    and self._big is None and self._error is None and self._gather(view)):
                self.receive(bytes(view))

    def _gather(self, view: memoryview) -> bool:
        """A read that begins with a frame it does not hold whole (a large frame): its payload
        goes straight into the frame's buffer (one copy, not a copy of the read and then one of
        the frame). False (nothing done) for any other read, or a header to refuse (the
        general path refuses it)."""
        n = len(view)
        length, ftype, flags, reserved, id = _hdr_unpack_from(view, 0)
        if length <= n - HEADER_SIZE:
            return False
        rule = _ID_RULE.get(ftype)
        if (length > self.max_frame_size or flags or reserved or rule is None
                or (rule == 0 and id) or (rule == 1 and not id)):
            try:
                _check_header(length, ftype, flags, reserved, id, self.max_frame_size, self.shm)
            except ProtocolError:
                return False
        big = self._gather_buffer(length)
        big[:n - HEADER_SIZE] = view[HEADER_SIZE:]
        self._big = big
        self._big_len = length
        self._big_fill = n - HEADER_SIZE
        self._big_hdr = (ftype, flags, id)
        return True

    def front(self) -> tuple[memoryview, int] | None:
        """The received bytes and the offset of the next frame in them, when the decoder is
        between frames (no header or payload partly gathered) and alive: for a batch operation
        of the connection that takes whole frames from the front itself (then
        :meth:`skip_to`). Else None."""
        if self._error is not None or self._hdr or self._big is not None:
            return None
        return self._buf, self._pos

    def skip_to(self, pos: int) -> None:
        """The frames before offset ``pos`` of :meth:`front`'s bytes were taken."""
        self._pos = pos

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return (len(self._buf) - self._pos + len(self._hdr)
                + (HEADER_SIZE + self._big_fill if self._big is not None else 0))

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
            _check_header(length, ftype, flags, reserved, id, self.max_frame_size, self.shm)
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

    def end_of_input(self) -> None:
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
    dec.receive(data)
    out = []
    while (f := dec.next_frame()) is not None:
        out.append(f)
    dec.end_of_input()
    return out
