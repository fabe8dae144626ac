"""Codecs: how request bodies, results, rows and summaries become bytes (PROTOCOL.md section 7).

The protocol carries codec ids; this module maps them to encoders. Every codec is optional
except ``raw`` and ``json`` (orjson when installed, the standard library otherwise)::

    codec = wirepool.codecs.get("msgpack")     # CodecUnavailable if msgpack is not installed
    data = codec.encode({"a": 1})
    assert codec.decode(data) == {"a": 1}

``decode`` accepts any bytes-like object (memoryview slices of a frame included) so rows are
decoded straight from the received buffer. ``encode_each`` encodes the items of an iterable one
by one as it is consumed (a C iterator for the built-in codecs: no Python frame per item), which
is how a worker encodes a generator's rows.
"""

from __future__ import annotations

import json as _stdjson
from itertools import repeat
from typing import Any, Callable, Iterable, Iterator, Union

from .errors import ErrorCode, InvalidArgument, quote
from .proto import CodecId

Buffer = Union[bytes, bytearray, memoryview]

__all__ = ["Codec", "CodecUnavailable", "get", "by_id", "available", "default_names", "CodecId"]


class CodecUnavailable(InvalidArgument, LookupError):
    """The codec's library is not installed (install the matching extra, e.g. wirepool[msgpack]),
    or no codec has that name or id: INVALID_ARGUMENT (308, PROTOCOL.md 22.2), a LookupError
    too for the code that caught it as one."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARGUMENT, message)


class Codec:
    """A codec: ``id`` on the wire, ``name`` for humans, ``encode`` and ``decode`` functions."""

    __slots__ = ("id", "name", "encode", "decode", "_encode_each")

    def __init__(self, id: int, name: str, encode: Callable[[Any], Buffer],
                 decode: Callable[[Buffer], Any],
                 encode_each: Callable[[Iterable[Any]], Iterator[Buffer]] | None = None) -> None:
        self.id = id
        self.name = name
        self.encode = encode
        self.decode = decode
        self._encode_each = encode_each

    def encode_each(self, items: Iterable[Any]) -> Iterator[Buffer]:
        """``map(encode, items)``: each item is encoded as soon as it is taken from ``items`` (a
        generator is not resumed before its last item is encoded, so it may reuse that object).
        The built-in codecs return a C iterator here even where ``encode`` is a Python function
        (orjson's options), so a row costs no Python frame."""
        if self._encode_each is not None:
            return self._encode_each(items)
        return map(self.encode, items)

    def __repr__(self) -> str:
        return f"Codec({self.name!r}, id={self.id})"


def _raw_encode(obj: Any) -> Buffer:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return obj
    raise TypeError(f"the raw codec carries bytes-like objects, not {type(obj).__name__}")


def _raw_decode(buf: Buffer) -> Buffer:
    return buf  # zero copy: the caller gets the memoryview slice itself


def _make_json() -> Codec:
    try:
        import orjson

        loads = orjson.loads
        dumps = orjson.dumps
        opt = orjson.OPT_SERIALIZE_NUMPY if hasattr(orjson, "OPT_SERIALIZE_NUMPY") else 0

        def encode(obj: Any) -> bytes:
            # (A def is faster than functools.partial with a keyword: no dict per call.)
            return dumps(obj, option=opt)

        def encode_each(items: Iterable[Any]) -> Iterator[bytes]:
            # dumps(obj, default, option) with its options as positional arguments: map calls
            # orjson directly (~430 instructions a row less than through ``encode``).
            return map(dumps, items, repeat(None), repeat(opt))

        try:
            positional = dumps(0, None, opt) == b"0"
        except TypeError:
            positional = False
        # orjson.loads itself, no Python frame per row: it reads bytes, bytearray, memoryview.
        return Codec(CodecId.JSON, "json", encode, loads, encode_each if positional else None)
    except ImportError:
        encoder = _stdjson.JSONEncoder(separators=(",", ":"), ensure_ascii=False)

        def encode_std(obj: Any) -> bytes:
            return encoder.encode(obj).encode()

        def decode_std(buf: Buffer) -> Any:
            return _stdjson.loads(bytes(buf) if isinstance(buf, memoryview) else buf)

        return Codec(CodecId.JSON, "json", encode_std, decode_std)


def _make_msgpack() -> Codec | None:
    try:
        import ormsgpack

        return Codec(CodecId.MSGPACK, "msgpack", ormsgpack.packb, ormsgpack.unpackb)
    except ImportError:
        pass
    try:
        import msgpack
    except ImportError:
        return None
    import threading

    # msgpack.packb builds a Packer per call; reuse one per thread (handlers run in several).
    local = threading.local()
    Packer = msgpack.Packer

    def packb(obj: Any) -> bytes:
        try:
            return local.packer.pack(obj)
        except AttributeError:
            local.packer = Packer()
            return local.packer.pack(obj)

    return Codec(CodecId.MSGPACK, "msgpack", packb, msgpack.unpackb)


def _make_cbor() -> Codec | None:
    try:
        import cbor2
    except ImportError:
        return None

    def decode(buf: Buffer) -> Any:
        return cbor2.loads(bytes(buf) if isinstance(buf, memoryview) else buf)

    return Codec(CodecId.CBOR, "cbor", cbor2.dumps, decode)


def _make_arrow() -> Codec | None:
    try:
        import pyarrow as pa
    except ImportError:
        return None

    def encode(obj: Any) -> memoryview:
        # The stream pyarrow wrote, as it is (no copy into a bytes object); a large one is then
        # copied once into the worker's shm region, or written to the socket.
        table = obj if isinstance(obj, (pa.Table, pa.RecordBatch)) else pa.table(obj)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write(table)
        return memoryview(sink.getvalue()).cast("B")

    def decode(buf: Buffer) -> Any:
        # Zero-copy: the Table's buffers point into ``buf`` (a view of the worker's shm region
        # when the body came through the lane, which the Table keeps mapped while it lives).
        return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()

    return Codec(CodecId.ARROW, "arrow", encode, decode)


_FACTORIES: dict[str, Callable[[], Codec | None]] = {
    "json": _make_json, "msgpack": _make_msgpack, "cbor": _make_cbor, "arrow": _make_arrow,
}
_NAMES = {"raw": 0, "json": 1, "msgpack": 2, "cbor": 3, "arrow": 4}
_cache: dict[str, Codec | None] = {"raw": Codec(CodecId.RAW, "raw", _raw_encode, _raw_decode)}


def _load(name: str) -> Codec | None:
    if name not in _cache:
        factory = _FACTORIES.get(name)
        _cache[name] = factory() if factory else None
    return _cache[name]


def get(name: str | int | Codec) -> Codec:
    """The codec called ``name`` (or with that id); raises CodecUnavailable if not installed."""
    if isinstance(name, Codec):
        return name
    if isinstance(name, int):
        return by_id(name)
    if name not in _NAMES:
        raise CodecUnavailable(f"unknown codec {quote(name)}; known: {', '.join(sorted(_NAMES))}")
    codec = _load(name)
    if codec is None:
        raise CodecUnavailable(f"codec {quote(name)} needs its library: "
                               f"pip install 'wirepool[{name}]'")
    return codec


def by_id(codec_id: int) -> Codec:
    for name, cid in _NAMES.items():
        if cid == codec_id:
            return get(name)
    raise CodecUnavailable(f"no codec with id {quote(codec_id)} in this SDK")


def available() -> list[str]:
    """Names of the codecs usable in this environment."""
    return [n for n in _NAMES if _load(n) is not None]


def default_names() -> list[str]:
    """A method's codecs when it declares none: json, msgpack if installed, raw for bytes."""
    return [n for n in ("json", "msgpack", "raw") if _load(n) is not None]
