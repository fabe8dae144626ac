#!/usr/bin/env python3
"""Generate the wirepool protocol test vectors: spec/vectors/frames.json and sessions.json
(and shm.json, the shared-memory extension's cases, from shm_cases.py).

Standalone and stdlib-only on purpose: it shares no code with any SDK, so a bug in an SDK cannot
hide in the vectors. It holds three small pieces written straight from spec/PROTOCOL.md:

- an encoder (frame objects -> bytes), used to build every input;
- a reference decoder (bytes -> frame objects or an error), and
- a reference connection core (the state machine of PROTOCOL.md section 10),

and the list of cases. Every case states its expected outcome by hand; the generator refuses to
write a case the reference decoder/core disagrees with, so each expectation is checked twice.

    python3 spec/vectors/generate.py            # rewrite the JSON files
    python3 spec/vectors/generate.py --check    # exit 1 if the committed files (or a ```hex
                                                # example in PROTOCOL.md) differ from the generator
    python3 spec/vectors/generate.py --annotate CASE [--compact]  # annotated hex of a frames case
    python3 spec/vectors/generate.py --refresh-doc      # rewrite PROTOCOL.md's ```hex blocks
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOCOL_MD = HERE.parent / "PROTOCOL.md"
PROTOCOL_VERSION = 1

# ---------------------------------------------------------------------------------------------
# Constants (PROTOCOL.md sections 2-4). --check also verifies ERROR_CODES against the doc tables.

MAGIC = b"WIREPOOL"
HANDSHAKE_FRAME_LIMIT = 65_536
MIN_FRAME_LIMIT = 65_536
MAX_FRAME_LIMIT = 16_777_216
DEFAULT_FRAME_LIMIT = 1_048_576
MAX_CREDIT = 2**31 - 1
MAX_METHODS = 4096
HEADER = struct.Struct("<IBBHQ")  # length, type, flags, reserved, id
FLAG_MORE = 0x01

TYPES = {
    "HELLO": 0x01, "WELCOME": 0x02,
    "REQUEST": 0x10, "CANCEL": 0x11, "RESULT": 0x12, "ERROR": 0x13,
    "ROWS": 0x20, "END": 0x21, "CREDIT": 0x22,
    "EVENT": 0x30, "PING": 0x31, "PONG": 0x32,
    "DRAIN": 0x40, "GOODBYE": 0x41,
    "CONTINUATION": 0x7F,
}
TYPE_NAMES = {v: k for k, v in TYPES.items()}
CONNECTION_LEVEL = {"HELLO", "WELCOME", "PING", "PONG", "DRAIN", "GOODBYE"}  # id must be 0
ANY_ID = {"ERROR", "EVENT"}  # id 0 or a request id
MORE_ALLOWED = {"REQUEST", "RESULT", "END", "CONTINUATION"}

ERROR_CODES = {
    "PROTOCOL": 100, "TRUNCATED": 101, "FRAME_TOO_LARGE": 102, "UNKNOWN_FRAME_TYPE": 103,
    "BAD_FLAGS": 104, "RESERVED_NONZERO": 105, "BAD_PAYLOAD": 106, "BAD_UTF8": 107,
    "ROW_BOUNDS": 108, "UNEXPECTED_FRAME": 109, "BAD_ID": 110, "DUPLICATE_ID": 111,
    "UNKNOWN_ID": 112, "CREDIT_OVERFLOW": 113, "FLOW_CONTROL": 114, "MESSAGE_TOO_LARGE": 115,
    "CONTINUATION": 116, "BAD_MAGIC": 117, "VERSION_MISMATCH": 118, "BAD_HANDSHAKE": 119,
    "CODEC_MISMATCH": 120, "ROW_COUNT_MISMATCH": 121, "KIND_MISMATCH": 122,
    "UNKNOWN_METHOD": 200, "CODEC_UNSUPPORTED": 201, "BAD_REQUEST": 202, "HANDLER_ERROR": 203,
    "HANDLER_PANIC": 204, "CANCELLED": 205, "DEADLINE_EXCEEDED": 206, "OVERLOADED": 207,
    "DRAINING": 208, "ROW_TOO_LARGE": 209,
    "WORKER_EXITED": 300, "WORKER_HUNG": 301, "STARTUP_TIMEOUT": 302, "SPAWN_FAILED": 303,
    "POOL_CLOSED": 304, "LEASE_LOST": 305, "DECODE_FAILED": 306, "PROTOCOL_VIOLATION": 307,
    "INVALID_ARGUMENT": 308,
}
KINDS = {"unary": 1, "stream": 2}
CODEC_NAMES = {0: "raw", 1: "JSON", 2: "MessagePack", 3: "CBOR", 4: "Arrow IPC", 5: "Protobuf"}
KIND_NAMES = {v: k for k, v in KINDS.items()}

# Field order of each frame object (vectors README); also the JSON key order.
FIELDS = {
    "HELLO": ["min_version", "max_version", "pid", "max_concurrency", "max_frame_size",
              "sdk_name", "sdk_version", "methods"],
    "WELCOME": ["version", "worker_id", "max_frame_size", "initial_credit", "heartbeat_ms",
                "max_in_flight", "max_message_size"],
    "REQUEST": ["method", "codec", "timeout_us", "body"],
    "CANCEL": [],
    "RESULT": ["body"],
    "ERROR": ["code", "message", "details"],
    "ROWS": ["rows"],
    "END": ["row_count", "summary"],
    "CREDIT": ["bytes"],
    "EVENT": ["topic", "data"],
    "PING": ["nonce"], "PONG": ["nonce"],
    "DRAIN": ["grace_ms"],
    "GOODBYE": ["reason"],
    "CONTINUATION": ["body"],
}


def err(name: str) -> dict:
    return {"code": ERROR_CODES[name], "name": name}


class ProtoError(Exception):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


# ---------------------------------------------------------------------------------------------
# Encoder


def F(ftype: str, id: int = 0, more: bool = False, **fields) -> dict:
    """A frame object in canonical key order; missing fields get their neutral default."""
    defaults = {"body": "", "summary": "", "details": "", "data": "", "rows": [],
                "methods": [], "sdk_version": "", "timeout_us": 0}
    obj = {"type": ftype, "id": id, "more": more}
    for key in FIELDS[ftype]:
        if key in fields:
            obj[key] = fields.pop(key)
        elif key in defaults:
            obj[key] = defaults[key]
        else:
            raise KeyError(f"{ftype} needs field {key}")
    if fields:
        raise KeyError(f"{ftype} has no fields {sorted(fields)}")
    return obj


def method(name: str, kind: str, codecs: list[int]) -> dict:
    return {"name": name, "kind": kind, "codecs": list(codecs)}


def str16(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<H", len(raw)) + raw


def encode_payload(fr: dict) -> bytes:
    t = fr["type"]
    h = bytes.fromhex
    if t == "HELLO":
        out = MAGIC + struct.pack("<HHIII", fr["min_version"], fr["max_version"], fr["pid"],
                                  fr["max_concurrency"], fr["max_frame_size"])
        out += str16(fr["sdk_name"]) + str16(fr["sdk_version"])
        out += struct.pack("<H", len(fr["methods"]))
        for m in fr["methods"]:
            out += struct.pack("<BB", KINDS[m["kind"]], len(m["codecs"])) + bytes(m["codecs"])
            out += str16(m["name"])
        return out
    if t == "WELCOME":
        return struct.pack("<HHIIIIIQ", fr["version"], 0, fr["worker_id"], fr["max_frame_size"],
                           fr["initial_credit"], fr["heartbeat_ms"], fr["max_in_flight"],
                           fr["max_message_size"])
    if t == "REQUEST":
        return struct.pack("<HBBQ", fr["method"], fr["codec"], 0, fr["timeout_us"]) + h(fr["body"])
    if t == "CANCEL":
        return b""
    if t in ("RESULT", "CONTINUATION"):
        return h(fr["body"])
    if t == "ERROR":
        return struct.pack("<I", fr["code"]) + str16(fr["message"]) + fr["details"].encode()
    if t == "ROWS":
        rows = [h(r) for r in fr["rows"]]
        return struct.pack("<I", len(rows)) + b"".join(struct.pack("<I", len(r)) + r for r in rows)
    if t == "END":
        return struct.pack("<Q", fr["row_count"]) + h(fr["summary"])
    if t == "CREDIT":
        return struct.pack("<I", fr["bytes"])
    if t == "EVENT":
        return str16(fr["topic"]) + fr["data"].encode()
    if t in ("PING", "PONG"):
        return h(fr["nonce"])
    if t == "DRAIN":
        return struct.pack("<I", fr["grace_ms"])
    if t == "GOODBYE":
        return struct.pack("<I", fr["reason"])
    raise ValueError(t)


def header(length: int, type_byte: int, flags: int, ident: int, reserved: int = 0) -> bytes:
    return HEADER.pack(length, type_byte, flags, reserved, ident)


def encode(fr: dict) -> bytes:
    payload = encode_payload(fr)
    flags = FLAG_MORE if fr["more"] else 0
    return header(len(payload), TYPES[fr["type"]], flags, fr["id"]) + payload


def raw(type_byte: int | str, ident: int, payload: bytes = b"", *, flags: int = 0,
        reserved: int = 0, length: int | None = None) -> bytes:
    """A frame built byte by byte, to break exactly one rule."""
    if isinstance(type_byte, str):
        type_byte = TYPES[type_byte]
    return header(len(payload) if length is None else length, type_byte, flags, ident,
                  reserved) + payload


def encode_all(frames: list[dict]) -> bytes:
    return b"".join(encode(f) for f in frames)


# ---------------------------------------------------------------------------------------------
# Reference decoder (PROTOCOL.md section 10.1: header checks, then payload checks)


def check_header(length: int, type_byte: int, flags: int, reserved: int, ident: int,
                 limit: int) -> str:
    if length > limit:
        raise ProtoError("FRAME_TOO_LARGE")
    name = TYPE_NAMES.get(type_byte)
    if name is None:
        raise ProtoError("UNKNOWN_FRAME_TYPE")
    if flags & ~FLAG_MORE or (flags & FLAG_MORE and name not in MORE_ALLOWED):
        raise ProtoError("BAD_FLAGS")
    if reserved != 0:
        raise ProtoError("RESERVED_NONZERO")
    if name in CONNECTION_LEVEL and ident != 0:
        raise ProtoError("BAD_ID")
    if name not in CONNECTION_LEVEL and name not in ANY_ID and ident == 0:
        raise ProtoError("BAD_ID")
    return name


class Reader:
    def __init__(self, data: bytes, short: str = "BAD_PAYLOAD"):
        self.data, self.pos, self.short = data, 0, short

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ProtoError(self.short)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def rest(self) -> bytes:
        out = self.data[self.pos:]
        self.pos = len(self.data)
        return out

    def str16(self, lo: int, hi: int, range_error: str) -> str:
        raw_text = self.take(self.u16())  # fits?  then range, then UTF-8
        if not lo <= len(raw_text) <= hi:
            raise ProtoError(range_error)
        return utf8(raw_text)


def utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtoError("BAD_UTF8") from None


def need(payload: bytes, n: int, exact: bool = False) -> None:
    if len(payload) < n or (exact and len(payload) != n):
        raise ProtoError("BAD_PAYLOAD")


def decode_payload(name: str, ident: int, more: bool, p: bytes) -> dict:
    r = Reader(p)
    if name == "HELLO":
        if p[:8] != MAGIC:  # also a HELLO shorter than the magic
            raise ProtoError("BAD_MAGIC")
        need(p, 24)
        r.take(8)
        minv, maxv, pid, conc, limit = r.u16(), r.u16(), r.u32(), r.u32(), r.u32()
        if not 1 <= minv <= maxv or conc < 1 or not MIN_FRAME_LIMIT <= limit <= MAX_FRAME_LIMIT:
            raise ProtoError("BAD_HANDSHAKE")
        sdk_name = r.str16(1, 64, "BAD_HANDSHAKE")
        sdk_version = r.str16(0, 64, "BAD_HANDSHAKE")
        count = r.u16()
        if count > MAX_METHODS:
            raise ProtoError("BAD_HANDSHAKE")
        methods, names = [], set()
        for _ in range(count):
            kind = r.u8()
            if kind not in KIND_NAMES:
                raise ProtoError("BAD_HANDSHAKE")
            ncodecs = r.u8()
            if not 1 <= ncodecs <= 16:
                raise ProtoError("BAD_HANDSHAKE")
            codecs = list(r.take(ncodecs))
            if len(set(codecs)) != len(codecs):
                raise ProtoError("BAD_HANDSHAKE")
            mname = r.str16(1, 255, "BAD_HANDSHAKE")
            if mname in names:
                raise ProtoError("BAD_HANDSHAKE")
            names.add(mname)
            methods.append(method(mname, KIND_NAMES[kind], codecs))
        r.rest()  # trailing bytes: room for later versions
        return F(name, ident, more, min_version=minv, max_version=maxv, pid=pid,
                 max_concurrency=conc, max_frame_size=limit, sdk_name=sdk_name,
                 sdk_version=sdk_version, methods=methods)
    if name == "WELCOME":
        need(p, 32)
        version, reserved, worker_id, limit, credit, hb, inflight, msg = struct.unpack_from(
            "<HHIIIIIQ", p)
        if reserved:
            raise ProtoError("RESERVED_NONZERO")
        if (not MIN_FRAME_LIMIT <= limit <= MAX_FRAME_LIMIT or not 1 <= credit <= MAX_CREDIT
                or inflight < 1 or msg < limit):
            raise ProtoError("BAD_HANDSHAKE")
        return F(name, ident, more, version=version, worker_id=worker_id, max_frame_size=limit,
                 initial_credit=credit, heartbeat_ms=hb, max_in_flight=inflight,
                 max_message_size=msg)
    if name == "REQUEST":
        need(p, 12)
        meth, codec, reserved, timeout = struct.unpack_from("<HBBQ", p)
        if reserved:
            raise ProtoError("RESERVED_NONZERO")
        return F(name, ident, more, method=meth, codec=codec, timeout_us=timeout,
                 body=p[12:].hex())
    if name == "CANCEL":
        need(p, 0, exact=True)
        return F(name, ident, more)
    if name in ("RESULT", "CONTINUATION"):
        return F(name, ident, more, body=p.hex())
    if name == "ERROR":
        need(p, 6)
        code = r.u32()
        message = r.str16(0, 65535, "BAD_PAYLOAD")
        details = utf8(r.rest())
        return F(name, ident, more, code=code, message=message, details=details)
    if name == "ROWS":
        need(p, 4)
        rr = Reader(p, short="ROW_BOUNDS")
        count = rr.u32()
        # Bound the count before reserving anything per row.
        if count == 0 or count > (len(p) - 4) // 4:
            raise ProtoError("ROW_BOUNDS")
        rows = [rr.take(rr.u32()).hex() for _ in range(count)]
        if rr.pos != len(p):
            raise ProtoError("ROW_BOUNDS")
        return F(name, ident, more, rows=rows)
    if name == "END":
        need(p, 8)
        return F(name, ident, more, row_count=r.u64(), summary=r.rest().hex())
    if name == "CREDIT":
        need(p, 4, exact=True)
        grant = r.u32()
        if grant < 1:
            raise ProtoError("BAD_PAYLOAD")
        return F(name, ident, more, bytes=grant)
    if name == "EVENT":
        topic = r.str16(1, 255, "BAD_PAYLOAD")
        return F(name, ident, more, topic=topic, data=utf8(r.rest()))
    if name in ("PING", "PONG"):
        need(p, 8, exact=True)
        return F(name, ident, more, nonce=p.hex())
    if name in ("DRAIN", "GOODBYE"):
        need(p, 4, exact=True)
        key = "grace_ms" if name == "DRAIN" else "reason"
        return F(name, ident, more, **{key: r.u32()})
    raise AssertionError(name)


class Decoder:
    """Incremental: feed bytes, collect frames; header checked as soon as 16 bytes are in."""

    def __init__(self, limit: int = HANDSHAKE_FRAME_LIMIT):
        self.buf = b""
        self.limit = limit
        self.pending: tuple[str, int, bool, int] | None = None  # a checked header

    def next_frame(self) -> tuple[dict, int] | None:
        if self.pending is None:
            if len(self.buf) < 16:
                return None
            length, tb, flags, reserved, ident = HEADER.unpack_from(self.buf)
            name = check_header(length, tb, flags, reserved, ident, self.limit)
            self.pending = (name, ident, bool(flags & FLAG_MORE), length)
        name, ident, more, length = self.pending
        if len(self.buf) < 16 + length:
            return None
        payload, self.buf = self.buf[16:16 + length], self.buf[16 + length:]
        self.pending = None
        return decode_payload(name, ident, more, payload), length

    def eof(self) -> None:
        if self.buf:
            raise ProtoError("TRUNCATED")


def decode_stream(data: bytes | list[bytes], limit: int) -> tuple[list[dict], str | None]:
    """Decode `data` (or a list of chunks fed one after another), then signal end of input."""
    dec, frames = Decoder(limit), []
    try:
        for chunk in [data] if isinstance(data, bytes) else data:
            dec.buf += chunk
            while (got := dec.next_frame()) is not None:
                frames.append(got[0])
        dec.eof()
    except ProtoError as e:
        return frames, e.name
    return frames, None


def chunkings(data: bytes) -> list[list[bytes]]:
    """The split rule of PROTOCOL.md section 16: two chunks at every position (sampled for large
    inputs) and one byte at a time (small inputs only: it is quadratic here)."""
    if len(data) <= 4096:
        cuts = range(1, len(data))
        out = [[data[i:i + 1] for i in range(len(data))]]
    else:
        cuts = sorted({i for b in frame_boundaries(data) for i in range(b - 32, b + 33)
                       if 0 < i < len(data)} | set(range(1, len(data), 997)))
        out = []
    return out + [[data[:i], data[i:]] for i in cuts]


def frame_boundaries(data: bytes) -> list[int]:
    pos, out = 0, [0]
    while pos + 16 <= len(data):
        pos += 16 + HEADER.unpack_from(data, pos)[0]
        out.append(min(pos, len(data)))
    return out


# ---------------------------------------------------------------------------------------------
# Reference connection core (PROTOCOL.md section 10.2)

PARENT_RECEIVES = {"HELLO", "RESULT", "ERROR", "ROWS", "END", "EVENT", "PING", "PONG", "GOODBYE",
                   "CONTINUATION"}
WORKER_RECEIVES = {"WELCOME", "REQUEST", "CANCEL", "ERROR", "PING", "PONG", "DRAIN", "CREDIT",
                   "CONTINUATION"}


def as_event(fr: dict) -> dict:
    return {k: v for k, v in fr.items() if k != "more"}


class Request:
    def __init__(self, kind: str, credit: int):
        self.kind, self.credit, self.rows, self.ended = kind, credit, 0, False


class Core:
    def __init__(self, role: str):
        assert role in ("parent", "worker")
        self.role = role
        self.decoder = Decoder(HANDSHAKE_FRAME_LIMIT)
        self.hello: dict | None = None
        self.welcome: dict | None = None
        self.open = False
        self.highest = 0
        self.requests: dict[int, Request] = {}
        self.partial: dict[int, dict] = {}  # id -> inbound message being reassembled
        self.out_partial: dict[int, str] = {}  # id -> type of an outbound message in progress
        self.draining = False
        self.goodbye = False
        self.events: list[dict] = []

    # -- sends: record state; the vectors never list a send the core must refuse
    def send(self, fr: dict) -> None:
        t, ident = fr["type"], fr["id"]
        if self.role == "worker":
            if t == "HELLO":
                self.hello = fr
            elif t in ("RESULT", "END", "ERROR") and ident:
                if fr["more"]:
                    self.out_partial[ident] = t
                else:
                    self.out_partial.pop(ident, None)  # an ERROR abandons a partial result
                    self._end(ident)
            elif t == "CONTINUATION" and not fr["more"]:
                self.out_partial.pop(ident)
                self._end(ident)
            elif t == "ROWS":
                req = self.requests[ident]
                assert req.credit > 0 and not req.ended, "core must refuse ROWS without credit"
                req.credit -= len(encode_payload(fr))
                req.rows += len(fr["rows"])
            return
        if t == "WELCOME":
            self.welcome, self.open = fr, True
            self.decoder.limit = fr["max_frame_size"]
        elif t == "REQUEST":
            assert ident > self.highest and not self.draining
            self.highest = ident
            kind = self.hello["methods"][fr["method"]]["kind"]
            credit = self.welcome["initial_credit"] if kind == "stream" else 0
            self.requests[ident] = Request(kind, credit)
        elif t == "CREDIT":
            req = self.requests[ident]
            assert req.credit + fr["bytes"] <= MAX_CREDIT
            req.credit += fr["bytes"]
        elif t == "DRAIN":
            self.draining = True

    def _end(self, ident: int) -> None:
        if ident in self.requests:
            self.requests[ident].ended = True

    def recv(self, data: bytes) -> None:
        self.decoder.buf += data
        while (got := self.decoder.next_frame()) is not None:
            self.on_frame(*got)

    def eof(self) -> None:
        self.decoder.eof()

    def emit(self, fr: dict) -> None:
        self.events.append(as_event(fr))

    def on_frame(self, fr: dict, size: int) -> None:
        t, ident = fr["type"], fr["id"]
        # 1. handshake phase and direction
        if t == "ERROR" and ident == 0:
            self.emit(fr)  # a refusal or a fatal report: allowed at any time
            return
        if self.role == "parent":
            if self.hello is None:
                if t != "HELLO":
                    raise ProtoError("UNEXPECTED_FRAME")
                if not fr["min_version"] <= PROTOCOL_VERSION <= fr["max_version"]:
                    raise ProtoError("VERSION_MISMATCH")
                self.hello = fr
                self.emit(fr)
                return
            if not self.open or t not in PARENT_RECEIVES or t == "HELLO" or self.goodbye:
                raise ProtoError("UNEXPECTED_FRAME")
        else:
            if self.welcome is None:
                if self.hello is None or t != "WELCOME":
                    raise ProtoError("UNEXPECTED_FRAME")
                if not self.hello["min_version"] <= fr["version"] <= self.hello["max_version"]:
                    raise ProtoError("VERSION_MISMATCH")
                if (fr["max_frame_size"] > self.hello["max_frame_size"]
                        or fr["max_in_flight"] > self.hello["max_concurrency"]):
                    raise ProtoError("BAD_HANDSHAKE")
                self.welcome, self.open = fr, True
                self.decoder.limit = fr["max_frame_size"]
                self.emit(fr)
                return
            if t not in WORKER_RECEIVES or t == "WELCOME" or t == "ERROR":
                raise ProtoError("UNEXPECTED_FRAME")  # parent->worker ERROR carries id 0 only
        # connection-level frames
        if t in CONNECTION_LEVEL or (t == "EVENT" and ident == 0):
            if t == "DRAIN":
                self.draining = True
            if t == "GOODBYE":
                self.goodbye = True
            self.emit(fr)
            return
        # 2. id
        if t == "REQUEST":
            if ident <= self.highest:
                raise ProtoError("DUPLICATE_ID")
            self.highest = ident
            if fr["more"]:
                self._start_partial(ident, fr, size)
            else:
                self.accept(fr)
            return
        if ident > self.highest:
            raise ProtoError("UNKNOWN_ID")
        # 3. continuation
        partial = self.partial.get(ident)
        if partial is not None:
            if t == "CONTINUATION":
                partial["_size"] += size
                if partial["_size"] > self.welcome["max_message_size"]:
                    raise ProtoError("MESSAGE_TOO_LARGE")
                self._check_in_progress()
                key = "summary" if partial["type"] == "END" else "body"
                partial[key] += fr["body"]
                if not fr["more"]:
                    del self.partial[ident]
                    done = {k: v for k, v in partial.items() if k != "_size"}
                    done["more"] = False
                    if done["type"] == "REQUEST":
                        self.accept(done)
                    else:
                        self._end(ident)
                        self.emit(done)
                return
            if self.role == "worker" and t == "CANCEL":
                del self.partial[ident]
                self.reject(ident, "CANCELLED")
                return
            if self.role == "parent" and t == "ERROR":
                del self.partial[ident]
                self._end(ident)
                self.emit(fr)
                return
            raise ProtoError("CONTINUATION")
        if t == "CONTINUATION":
            raise ProtoError("CONTINUATION")
        # 4. late
        req = self.requests.get(ident)
        if req is None or req.ended:
            self.events.append({"type": "LATE", "id": ident, "frame": t})
            return
        # 5. kind, 6. counters
        if self.role == "worker":
            if t == "CANCEL":
                self.emit(fr)
            elif t == "CREDIT":
                if req.kind != "stream":
                    raise ProtoError("KIND_MISMATCH")
                if req.credit + fr["bytes"] > MAX_CREDIT:
                    raise ProtoError("CREDIT_OVERFLOW")
                req.credit += fr["bytes"]
                self.emit(fr)
            return
        if t in ("ROWS", "END") and req.kind != "stream":
            raise ProtoError("KIND_MISMATCH")
        if t == "RESULT" and req.kind != "unary":
            raise ProtoError("KIND_MISMATCH")
        if t == "ROWS":
            if req.credit <= 0:
                raise ProtoError("FLOW_CONTROL")
            req.credit -= size
            req.rows += len(fr["rows"])
            self.emit(fr)
            return
        if t == "END" and fr["row_count"] != req.rows:
            raise ProtoError("ROW_COUNT_MISMATCH")
        if t in ("RESULT", "END") and fr["more"]:
            self._start_partial(ident, fr, size)
            return
        if t in ("RESULT", "END", "ERROR"):
            req.ended = True
        self.emit(fr)

    def _start_partial(self, ident: int, fr: dict, size: int) -> None:
        self.partial[ident] = dict(fr, _size=size)
        self._check_in_progress()

    def _check_in_progress(self) -> None:
        # Memory held for the peer is bounded per connection (section 5), not only per message.
        if sum(p["_size"] for p in self.partial.values()) > self.welcome["max_message_size"]:
            raise ProtoError("MESSAGE_TOO_LARGE")

    def accept(self, fr: dict) -> None:
        ident = fr["id"]
        methods = self.hello["methods"]
        in_flight = sum(1 for r in self.requests.values() if not r.ended)
        if self.draining:
            return self.reject(ident, "DRAINING")
        if fr["method"] >= len(methods):
            return self.reject(ident, "UNKNOWN_METHOD")
        m = methods[fr["method"]]
        if fr["codec"] not in m["codecs"]:
            return self.reject(ident, "CODEC_UNSUPPORTED")
        if in_flight >= self.welcome["max_in_flight"]:
            return self.reject(ident, "OVERLOADED")
        credit = self.welcome["initial_credit"] if m["kind"] == "stream" else 0
        self.requests[ident] = Request(m["kind"], credit)
        self.emit(fr)

    def reject(self, ident: int, name: str) -> None:
        req = Request("unary", 0)
        req.ended = True  # the driver answers with ERROR; the request counts as ended
        self.requests[ident] = req
        self.events.append({"type": "REJECT", "id": ident, "code": ERROR_CODES[name],
                            "name": name})


# ---------------------------------------------------------------------------------------------
# Case building helpers

FRAME_CASES: list[dict] = []
SESSION_CASES: list[dict] = []


def frame_case(name: str, doc: str, data: bytes, frames: list[dict], error: str | None = None,
               max_frame_size: int = DEFAULT_FRAME_LIMIT, decode_only: bool = False) -> None:
    got_frames, got_error = decode_stream(data, max_frame_size)
    if got_frames != frames or got_error != error:
        raise SystemExit(f"frames case {name}: reference decoder gives {got_error} after "
                         f"{len(got_frames)} frames, case says {error} after {len(frames)}")
    if error is None and not decode_only and encode_all(frames) != data:
        raise SystemExit(f"frames case {name}: re-encoding differs")
    for chunks in chunkings(data):
        if decode_stream(chunks, max_frame_size) != (got_frames, got_error):
            raise SystemExit(f"frames case {name}: outcome depends on chunking "
                             f"{[len(c) for c in chunks][:4]}")
    FRAME_CASES.append({"name": name, "doc": doc, "max_frame_size": max_frame_size,
                        "decode_only": decode_only, "hex": data.hex(), "frames": frames,
                        "error": err(error) if error else None})


def valid(name: str, doc: str, *frames: dict, **kw) -> None:
    frame_case(name, doc, encode_all(list(frames)), list(frames), None, **kw)


def bad(name: str, doc: str, data: bytes, error: str, frames: tuple[dict, ...] = (), **kw) -> None:
    frame_case(name, doc, data, list(frames), error, **kw)


AUTO = object()


def send(fr: dict) -> dict:
    return {"send": fr}


def recv(data: bytes | dict | list, events=AUTO, error: str | None = None) -> dict:
    """Bytes arrive. `events` defaults to the given frames as events (the common, valid case)."""
    frames = data if isinstance(data, list) else [data] if isinstance(data, dict) else None
    if frames is not None:
        data = encode_all(frames)
        if events is AUTO:
            events = [as_event(f) for f in frames]
    assert events is not AUTO, "raw bytes need explicit events"
    return {"recv": data.hex(), "events": events, "error": err(error) if error else None}


def eof(events=(), error: str | None = None) -> dict:
    return {"eof": True, "events": list(events), "error": err(error) if error else None}


def late(ident: int, frame: str) -> dict:
    return {"type": "LATE", "id": ident, "frame": frame}


def reject(ident: int, name: str) -> dict:
    return {"type": "REJECT", "id": ident, "code": ERROR_CODES[name], "name": name}


def session(name: str, doc: str, role: str, steps: list[dict]) -> None:
    for mode in ("whole", "halves", "bytes"):
        run_session(name, role, steps, mode)
    SESSION_CASES.append({"name": name, "doc": doc, "role": role, "steps": steps})


def run_session(name: str, role: str, steps: list[dict], mode: str) -> None:
    """Replay a session on the reference core: each recv step whole, cut in two halves, or
    byte by byte (the latter for steps up to 4096 bytes)."""
    core = Core(role)
    for i, step in enumerate(steps):
        if "send" in step:
            core.send(step["send"])
            continue
        core.events = []
        got_error = None
        try:
            if "recv" in step:
                data = bytes.fromhex(step["recv"])
                if mode == "halves":
                    chunks = [data[:len(data) // 2], data[len(data) // 2:]]
                elif mode == "bytes" and len(data) <= 4096:
                    chunks = [data[j:j + 1] for j in range(len(data))]
                else:
                    chunks = [data]
                for chunk in chunks:
                    core.recv(chunk)
            else:
                core.eof()
        except ProtoError as e:
            got_error = e.name
        want_error = step["error"]["name"] if step["error"] else None
        if core.events != step["events"] or got_error != want_error:
            raise SystemExit(f"session {name} step {i} ({mode}): reference core gives "
                             f"{got_error} and {json.dumps(core.events)}; case says "
                             f"{want_error} and {json.dumps(step['events'])}")
        if got_error:
            assert i == len(steps) - 1, f"session {name}: steps after an error"


# Standard handshake used by most sessions.
METHODS = [method("echo", "unary", [0, 1]), method("count", "stream", [1, 2]),
           method("fail", "unary", [1])]
ECHO, COUNT, FAIL = 0, 1, 2


def hello(**kw) -> dict:
    base = dict(min_version=1, max_version=1, pid=4242, max_concurrency=4,
                max_frame_size=DEFAULT_FRAME_LIMIT, sdk_name="wirepool-py", sdk_version="0.1.0",
                methods=METHODS)
    base.update(kw)
    return F("HELLO", 0, **base)


def welcome(**kw) -> dict:
    base = dict(version=1, worker_id=1, max_frame_size=DEFAULT_FRAME_LIMIT,
                initial_credit=1_048_576, heartbeat_ms=1000, max_in_flight=4,
                max_message_size=1_073_741_824)
    base.update(kw)
    return F("WELCOME", 0, **base)


def parent_open(h: dict | None = None, w: dict | None = None) -> list[dict]:
    return [recv(h or hello()), send(w or welcome())]


def worker_open(h: dict | None = None, w: dict | None = None) -> list[dict]:
    return [send(h or hello()), recv(w or welcome())]


def req(ident: int, meth: int = ECHO, codec: int = 1, body: bytes = b"", more: bool = False,
        timeout_us: int = 0) -> dict:
    return F("REQUEST", ident, more, method=meth, codec=codec, timeout_us=timeout_us,
             body=body.hex())


def result(ident: int, body: bytes = b"", more: bool = False) -> dict:
    return F("RESULT", ident, more, body=body.hex())


def cont(ident: int, body: bytes, more: bool = False) -> dict:
    return F("CONTINUATION", ident, more, body=body.hex())


def rows(ident: int, *items: bytes) -> dict:
    return F("ROWS", ident, rows=[i.hex() for i in items])


def end(ident: int, row_count: int, summary: bytes = b"", more: bool = False) -> dict:
    return F("END", ident, more, row_count=row_count, summary=summary.hex())


def error(ident: int, name_or_code, message: str = "", details: str = "") -> dict:
    code = ERROR_CODES[name_or_code] if isinstance(name_or_code, str) else name_or_code
    return F("ERROR", ident, code=code, message=message, details=details)


def event(ident: int, topic: str, data: str = "") -> dict:
    return F("EVENT", ident, topic=topic, data=data)


def credit(ident: int, n: int) -> dict:
    return F("CREDIT", ident, bytes=n)


def cancel(ident: int) -> dict:
    return F("CANCEL", ident)


def ping(nonce: str = "0102030405060708") -> dict:
    return F("PING", 0, nonce=nonce)


def pong(nonce: str = "0102030405060708") -> dict:
    return F("PONG", 0, nonce=nonce)


def hello_payload(**kw) -> bytes:
    return encode_payload(hello(**kw))


def hello_bytes_with(methods_raw: bytes, count: int) -> bytes:
    """A HELLO payload with a hand-made method list."""
    fixed = MAGIC + struct.pack("<HHIII", 1, 1, 4242, 4, DEFAULT_FRAME_LIMIT)
    return fixed + str16("wirepool-py") + str16("0.1.0") + struct.pack("<H", count) + methods_raw


def method_raw(kind: int, codecs: list[int], name: bytes | str) -> bytes:
    return struct.pack("<BB", kind, len(codecs)) + bytes(codecs) + str16(name)


def welcome_payload(**kw) -> bytearray:
    return bytearray(encode_payload(welcome(**kw)))


# ---------------------------------------------------------------------------------------------
# frames.json cases


def build_frame_cases() -> None:
    J = b'{"n":1}'
    # --- every frame type, valid
    valid("hello_minimal", "HELLO with no methods: the smallest valid handshake offer",
          hello(methods=[], sdk_name="w", sdk_version=""))
    valid("hello_several_methods", "HELLO with a unary and a stream method, several codecs each",
          hello(methods=[method("echo", "unary", [0, 1, 2]), method("count", "stream", [1, 2]),
                         method("parse.csv", "stream", [4])]))
    valid("hello_unknown_codec_ids_accepted",
          "codec ids 77 (reserved) and 200 (private use) are carried, not rejected (section 7)",
          hello(methods=[method("x", "unary", [77, 200, 1])]))
    valid("hello_version_range", "a worker offering versions 1 to 3",
          hello(min_version=1, max_version=3, max_concurrency=64, max_frame_size=MAX_FRAME_LIMIT,
                methods=[method("m", "unary", [1])]))
    trailing = hello(methods=[method("echo", "unary", [1])])
    with_trailing = encode_payload(trailing) + b"\x09future"
    frame_case("hello_trailing_bytes_ignored",
               "bytes after the method list are ignored by a v1 reader (room for later versions); "
               "decode only: the re-encoding has no trailing bytes",
               raw("HELLO", 0, with_trailing), [trailing], decode_only=True)
    valid("welcome_defaults", "WELCOME with the defaults a parent SHOULD use", welcome(max_frame_size=4_194_304))
    valid("welcome_small_limits", "WELCOME at the lowest legal limits",
          welcome(worker_id=0, max_frame_size=65536, initial_credit=1, heartbeat_ms=0,
                  max_in_flight=1, max_message_size=65536))
    w = welcome(worker_id=3)
    frame_case("welcome_trailing_bytes_ignored",
               "bytes after offset 32 are ignored by a v1 reader; decode only",
               raw("WELCOME", 0, encode_payload(w) + b"\x00\x01\x02\x03"), [w], decode_only=True)
    valid("request_json_small", "a unary call to method 0 with a JSON body, no deadline",
          req(1, ECHO, 1, J))
    valid("request_empty_body", "an empty body is legal", req(2, ECHO, 0, b""))
    valid("request_timeout_and_big_id", "timeout_us of 2.5 s and an id above 2^32",
          req(2**40 + 5, 3, 2, b"\x91\x01", timeout_us=2_500_000))
    valid("request_largest_timeout", "timeout_us may be any u64 (section 2): the largest is a "
          "budget too long for any clock, never an error", req(3, ECHO, 1, J, timeout_us=2**64 - 1))
    valid("request_more_first_frame",
          "first frame of a continued request: the whole 12-byte fixed prefix plus a first chunk",
          req(9, ECHO, 0, b"abc", more=True))
    valid("cancel", "CANCEL has an empty payload", cancel(1))
    valid("result_small", "a result body", result(1, b'{"ok":true}'))
    valid("result_empty", "an empty result body", result(1))
    valid("result_more_first_frame", "first chunk of a continued result", result(4, b"xy", True))
    valid("error_request", "a request error with a message and JSON details",
          error(1, "HANDLER_ERROR", "division by zero", '{"line":3}'))
    valid("error_connection_level", "an ERROR with id 0 reports a protocol violation",
          error(0, "FRAME_TOO_LARGE", "length 2000000 above 1048576"))
    valid("error_unknown_code_accepted",
          "unknown codes (here an application code) are accepted and classified by range",
          error(3, 4242, "", ""))
    valid("error_utf8_message", "multi-byte UTF-8 in message and details",
          error(5, "BAD_REQUEST", "champ « prénom » manquant ✗", '{"champ":"prénom"}'))
    valid("rows_one", "one row", rows(1, b"hello"))
    valid("rows_several_with_empty_row", "three rows, the middle one empty",
          rows(1, b"\x01", b"", b"abc"))
    valid("end_with_summary", "END of a stream that sent 3 rows, with a summary",
          end(1, 3, b'{"total":3}'))
    valid("end_empty_summary", "END with no summary and zero rows", end(1, 0))
    valid("end_more_first_frame", "first frame of a continued END: row_count + first chunk",
          end(1, 2, b"{", more=True))
    valid("credit", "a 64 KiB grant", credit(1, 65536))
    valid("credit_max", "the largest grant a u32 can carry (state decides if it overflows)",
          credit(1, 2**32 - 1))
    valid("event_request", "an EVENT tied to a request", event(7, "progress", '{"done":0.5}'))
    valid("event_connection_empty_data", "an EVENT with id 0 and empty data", event(0, "ready"))
    valid("event_topic_255", "a topic of exactly 255 bytes", event(1, "t" * 255))
    valid("ping", "PING with its 8-byte nonce", ping("0011223344556677"))
    valid("pong", "PONG copies the nonce", pong("0011223344556677"))
    valid("drain", "DRAIN with a 5 s grace", F("DRAIN", 0, grace_ms=5000))
    valid("goodbye", "GOODBYE after a drain", F("GOODBYE", 0, reason=0))
    valid("goodbye_unknown_reason", "unknown reasons are accepted", F("GOODBYE", 0, reason=99))
    valid("continuation_last", "a last CONTINUATION (MORE clear)", cont(1, b"tail"))
    valid("continuation_more_empty", "a CONTINUATION with MORE and an empty chunk is legal",
          F("CONTINUATION", 1, True, body=""))
    valid("multi_frame_sequence", "several frames back to back in one buffer",
          req(1, ECHO, 1, J), ping(), req(2, COUNT, 1, b"[]"), credit(2, 100), cancel(1))
    valid("multi_frame_continued_interleaved",
          "a continued request interleaved with another id's frames (stateless view)",
          req(3, ECHO, 0, b"AAAA", more=True), req(4, ECHO, 1, J), cont(3, b"BBBB", more=True),
          cancel(4), cont(3, b"CC"))
    big = bytes(65536)
    valid("payload_exactly_max_frame_size",
          "a payload of exactly max_frame_size (65536) is accepted",
          result(1, big), max_frame_size=65536)
    valid("empty_payload_result_then_ping", "empty payloads are legal frames", result(2), ping())

    # --- header rules, in check order
    bad("truncated_header", "10 bytes: the stream ended inside a header",
        encode(ping())[:10], "TRUNCATED")
    bad("truncated_header_after_frame", "a whole PING, then 5 bytes of the next header",
        encode(ping()) + encode(ping())[:5], "TRUNCATED", (ping(),))
    bad("truncated_payload", "the header promises 11 bytes of body, 4 arrive, then EOF",
        encode(result(1, b"hello world"))[:20], "TRUNCATED")
    bad("frame_too_large_one_over", "length = 65537 with max_frame_size 65536: refused from the "
        "header alone, before any payload arrives", raw("RESULT", 1, length=65537),
        "FRAME_TOO_LARGE", max_frame_size=65536)
    bad("frame_too_large_default_limit", "length 1048577 against the default limit",
        raw("RESULT", 1, length=DEFAULT_FRAME_LIMIT + 1), "FRAME_TOO_LARGE")
    bad("frame_too_large_u32_max", "length 0xffffffff: nothing may be allocated",
        raw("RESULT", 1, length=0xFFFFFFFF), "FRAME_TOO_LARGE")
    bad("frame_too_large_checked_before_type", "check order: the length limit comes first",
        raw(0x55, 1, length=0xFFFFFFFF, flags=0xFF, reserved=1), "FRAME_TOO_LARGE")
    bad("unknown_type_0x00", "type 0 is not a frame type", raw(0x00, 0), "UNKNOWN_FRAME_TYPE")
    bad("unknown_type_0x50", "type 0x50 is not a frame type", raw(0x50, 1, b"x"),
        "UNKNOWN_FRAME_TYPE")
    bad("unknown_type_checked_before_flags", "check order: type before flags and reserved",
        raw(0x14, 0, flags=0x80, reserved=7), "UNKNOWN_FRAME_TYPE")
    bad("unknown_type_before_payload_arrives",
        "header checks happen as soon as 16 bytes are in: an unknown type with a missing "
        "payload is UNKNOWN_FRAME_TYPE, not TRUNCATED", raw(0x50, 1, length=100),
        "UNKNOWN_FRAME_TYPE")
    bad("bad_flags_reserved_bit", "flag bit 1 set on a RESULT", raw("RESULT", 1, b"", flags=0x02),
        "BAD_FLAGS")
    bad("bad_flags_high_bit", "flag bit 7 set together with MORE on a REQUEST",
        raw("REQUEST", 1, bytes(12), flags=0x81), "BAD_FLAGS")
    bad("bad_flags_more_on_ping", "MORE is not allowed on PING",
        raw("PING", 0, bytes(8), flags=FLAG_MORE), "BAD_FLAGS")
    bad("bad_flags_more_on_rows", "MORE is not allowed on ROWS (a row never spans frames)",
        raw("ROWS", 1, encode_payload(rows(1, b"a")), flags=FLAG_MORE), "BAD_FLAGS")
    bad("bad_flags_more_on_error", "MORE is not allowed on ERROR",
        raw("ERROR", 1, encode_payload(error(1, 203)), flags=FLAG_MORE), "BAD_FLAGS")
    bad("bad_flags_checked_before_reserved", "check order: flags before reserved",
        raw("PING", 0, bytes(8), flags=0x04, reserved=1), "BAD_FLAGS")
    bad("reserved_header_nonzero", "header bytes 6-7 must be zero",
        raw("PING", 0, bytes(8), reserved=0x0100), "RESERVED_NONZERO")
    bad("reserved_checked_before_id", "check order: reserved before id",
        raw("REQUEST", 0, bytes(12), reserved=1), "RESERVED_NONZERO")
    bad("bad_id_request_zero", "a request-level frame with id 0",
        raw("REQUEST", 0, encode_payload(req(1))), "BAD_ID")
    bad("bad_id_continuation_zero", "CONTINUATION with id 0", raw("CONTINUATION", 0, b"x"),
        "BAD_ID")
    bad("bad_id_ping_nonzero", "a connection-level frame with a non-zero id",
        raw("PING", 1, bytes(8)), "BAD_ID")
    bad("bad_id_hello_nonzero", "HELLO must carry id 0", raw("HELLO", 2, hello_payload()),
        "BAD_ID")
    bad("header_error_after_valid_frames", "frames before the bad one are still delivered",
        encode(ping()) + encode(cancel(3)) + raw("CANCEL", 0), "BAD_ID", (ping(), cancel(3)))

    # --- payload layouts
    bad("request_reserved_byte_nonzero", "REQUEST payload byte 3 must be zero",
        raw("REQUEST", 1, struct.pack("<HBBQ", 0, 1, 1, 0)), "RESERVED_NONZERO")
    bad("request_too_short", "11 bytes cannot hold the 12-byte fixed prefix",
        raw("REQUEST", 1, bytes(11)), "BAD_PAYLOAD")
    bad("request_more_first_frame_too_short",
        "a continued REQUEST's first frame must still carry the whole fixed prefix",
        raw("REQUEST", 1, bytes(5), flags=FLAG_MORE), "BAD_PAYLOAD")
    bad("ping_7_bytes", "PING nonce must be exactly 8 bytes", raw("PING", 0, bytes(7)),
        "BAD_PAYLOAD")
    bad("pong_9_bytes", "PONG nonce must be exactly 8 bytes", raw("PONG", 0, bytes(9)),
        "BAD_PAYLOAD")
    bad("cancel_with_payload", "CANCEL must be empty", raw("CANCEL", 1, b"\x00"), "BAD_PAYLOAD")
    bad("credit_zero", "a grant of 0 bytes", raw("CREDIT", 1, struct.pack("<I", 0)),
        "BAD_PAYLOAD")
    bad("credit_5_bytes", "CREDIT payload must be exactly 4 bytes", raw("CREDIT", 1, bytes(5)),
        "BAD_PAYLOAD")
    bad("drain_3_bytes", "DRAIN payload must be exactly 4 bytes", raw("DRAIN", 0, bytes(3)),
        "BAD_PAYLOAD")
    bad("goodbye_empty", "GOODBYE payload must be exactly 4 bytes", raw("GOODBYE", 0),
        "BAD_PAYLOAD")
    bad("end_too_short", "END needs its 8-byte row_count", raw("END", 1, bytes(7)),
        "BAD_PAYLOAD")
    bad("end_more_first_frame_too_short", "a continued END's first frame still carries row_count",
        raw("END", 1, bytes(3), flags=FLAG_MORE), "BAD_PAYLOAD")
    bad("error_too_short", "ERROR needs code and the message length (6 bytes)",
        raw("ERROR", 1, bytes(5)), "BAD_PAYLOAD")
    bad("error_str16_past_end", "message length 10, only 3 bytes follow",
        raw("ERROR", 1, struct.pack("<IH", 203, 10) + b"abc"), "BAD_PAYLOAD")
    bad("error_bad_utf8_message", "0xff is never valid UTF-8",
        raw("ERROR", 1, struct.pack("<I", 203) + str16(b"ab\xff")), "BAD_UTF8")
    bad("error_bad_utf8_details", "details are UTF-8 JSON text; an overlong encoding is invalid",
        raw("ERROR", 1, struct.pack("<I", 203) + str16("m") + b"\xc0\xaf"), "BAD_UTF8")
    bad("event_bad_utf8_topic", "a lone continuation byte in the topic",
        raw("EVENT", 1, str16(b"pro\x80gress")), "BAD_UTF8")
    bad("event_bad_utf8_data", "a truncated 3-byte sequence in data",
        raw("EVENT", 1, str16("t") + b"\xe2\x82"), "BAD_UTF8")
    bad("event_topic_empty", "topic must be 1-255 bytes", raw("EVENT", 1, str16("")),
        "BAD_PAYLOAD")
    bad("event_topic_256", "topic must be 1-255 bytes", raw("EVENT", 0, str16("t" * 256)),
        "BAD_PAYLOAD")
    bad("rows_too_short", "3 bytes cannot hold the count", raw("ROWS", 1, bytes(3)),
        "BAD_PAYLOAD")
    bad("rows_count_zero", "count 0", raw("ROWS", 1, struct.pack("<I", 0)), "ROW_BOUNDS")
    bad("rows_row_past_end", "row length 10 with 5 bytes left",
        raw("ROWS", 1, struct.pack("<II", 1, 10) + b"hello"), "ROW_BOUNDS")
    bad("rows_leftover_bytes", "one 2-byte row, then 3 bytes nobody owns",
        raw("ROWS", 1, struct.pack("<II", 1, 2) + b"ab" + b"xyz"), "ROW_BOUNDS")
    bad("rows_count_larger_than_possible",
        "count 3 in an 8-byte payload: (8 - 4) / 4 = 1 row at most; refused before any "
        "per-row allocation", raw("ROWS", 1, struct.pack("<II", 3, 0)), "ROW_BOUNDS")
    bad("rows_count_huge", "count 0xffffffff must not reserve anything",
        raw("ROWS", 1, struct.pack("<II", 0xFFFFFFFF, 0)), "ROW_BOUNDS")
    bad("rows_second_row_header_past_end", "count 2 fits the bound but the second row's length "
        "field runs past the end", raw("ROWS", 1, struct.pack("<II", 2, 2) + b"ab\x00\x00"),
        "ROW_BOUNDS")

    # --- HELLO / WELCOME
    hp = bytearray(hello_payload())
    hp[0:8] = b"WIREPOOX"
    bad("hello_bad_magic", "HELLO must start with WIREPOOL", raw("HELLO", 0, bytes(hp)),
        "BAD_MAGIC")
    bad("hello_shorter_than_magic", "a HELLO of 4 bytes does not start with the magic",
        raw("HELLO", 0, b"WIRE"), "BAD_MAGIC")
    bad("hello_http_request", "another protocol entirely (bytes of an HTTP request line)",
        raw("HELLO", 0, b"GET / HTTP/1.1\r\n"), "BAD_MAGIC")
    bad("hello_too_short", "magic, then 5 bytes: too short for the 24-byte fixed part",
        raw("HELLO", 0, MAGIC + bytes(5)), "BAD_PAYLOAD")
    bad("hello_min_gt_max", "min_version 2 > max_version 1",
        raw("HELLO", 0, hello_payload(min_version=2, max_version=1)), "BAD_HANDSHAKE")
    bad("hello_min_version_zero", "version 0 does not exist",
        raw("HELLO", 0, hello_payload(min_version=0, max_version=1)), "BAD_HANDSHAKE")
    bad("hello_max_concurrency_zero", "a worker must run at least one request",
        raw("HELLO", 0, hello_payload(max_concurrency=0)), "BAD_HANDSHAKE")
    bad("hello_max_frame_size_below", "max_frame_size 65535",
        raw("HELLO", 0, hello_payload(max_frame_size=65535)), "BAD_HANDSHAKE")
    bad("hello_max_frame_size_above", "max_frame_size 16777217",
        raw("HELLO", 0, hello_payload(max_frame_size=MAX_FRAME_LIMIT + 1)), "BAD_HANDSHAKE")
    bad("hello_sdk_name_empty", "sdk_name must be 1-64 bytes",
        raw("HELLO", 0, hello_payload(sdk_name="")), "BAD_HANDSHAKE")
    bad("hello_sdk_name_65", "sdk_name must be 1-64 bytes",
        raw("HELLO", 0, hello_payload(sdk_name="n" * 65)), "BAD_HANDSHAKE")
    bad("hello_sdk_version_65", "sdk_version must be 0-64 bytes",
        raw("HELLO", 0, hello_payload(sdk_version="v" * 65)), "BAD_HANDSHAKE")
    bad("hello_method_name_256", "method names are 1-255 bytes",
        raw("HELLO", 0, hello_bytes_with(method_raw(1, [1], "m" * 256), 1)), "BAD_HANDSHAKE")
    fixed = MAGIC + struct.pack("<HHIII", 1, 1, 4242, 4, DEFAULT_FRAME_LIMIT)
    bad("hello_sdk_name_bad_utf8", "sdk_name is not UTF-8",
        raw("HELLO", 0, fixed + str16(b"py\xfe") + str16("") + struct.pack("<H", 0)), "BAD_UTF8")
    bad("hello_sdk_version_past_end", "sdk_version length runs past the payload",
        raw("HELLO", 0, fixed + str16("py") + struct.pack("<H", 9) + b"0.1"), "BAD_PAYLOAD")
    bad("hello_method_count_4097", "at most 4096 methods; refused before reading any entry",
        raw("HELLO", 0, hello_bytes_with(b"", 4097)), "BAD_HANDSHAKE")
    bad("hello_method_list_truncated", "method_count 2, only one entry present",
        raw("HELLO", 0, hello_bytes_with(method_raw(1, [1], "a"), 2)), "BAD_PAYLOAD")
    bad("hello_method_kind_3", "kind must be 1 (unary) or 2 (stream)",
        raw("HELLO", 0, hello_bytes_with(method_raw(3, [1], "a"), 1)), "BAD_HANDSHAKE")
    bad("hello_method_kind_0", "kind must be 1 (unary) or 2 (stream)",
        raw("HELLO", 0, hello_bytes_with(method_raw(0, [1], "a"), 1)), "BAD_HANDSHAKE")
    bad("hello_codec_count_0", "a method accepts 1-16 codecs",
        raw("HELLO", 0, hello_bytes_with(method_raw(1, [], "a"), 1)), "BAD_HANDSHAKE")
    bad("hello_codec_count_17", "a method accepts 1-16 codecs",
        raw("HELLO", 0, hello_bytes_with(method_raw(1, list(range(17)), "a"), 1)),
        "BAD_HANDSHAKE")
    bad("hello_duplicate_codec", "codec ids in one method are unique",
        raw("HELLO", 0, hello_bytes_with(method_raw(1, [1, 2, 1], "a"), 1)), "BAD_HANDSHAKE")
    bad("hello_method_name_empty", "method names are 1-255 bytes",
        raw("HELLO", 0, hello_bytes_with(method_raw(1, [1], ""), 1)), "BAD_HANDSHAKE")
    bad("hello_duplicate_method_name", "method names are unique in the list",
        raw("HELLO", 0, hello_bytes_with(method_raw(1, [1], "echo") + method_raw(2, [1], "echo"),
                                         2)), "BAD_HANDSHAKE")
    bad("hello_method_name_bad_utf8", "method name is not UTF-8",
        raw("HELLO", 0, hello_bytes_with(method_raw(1, [1], b"\xed\xa0\x80"), 1)), "BAD_UTF8")
    bad("welcome_too_short", "WELCOME needs 32 bytes", raw("WELCOME", 0, bytes(31)),
        "BAD_PAYLOAD")
    wp = welcome_payload()
    wp[2] = 1
    bad("welcome_reserved_nonzero", "WELCOME bytes 2-3 must be zero", raw("WELCOME", 0, bytes(wp)),
        "RESERVED_NONZERO")
    bad("welcome_max_frame_size_below_65536", "max_frame_size 65535",
        raw("WELCOME", 0, bytes(welcome_payload(max_frame_size=65535))), "BAD_HANDSHAKE")
    bad("welcome_max_frame_size_above", "max_frame_size 16777217",
        raw("WELCOME", 0, bytes(welcome_payload(max_frame_size=MAX_FRAME_LIMIT + 1))),
        "BAD_HANDSHAKE")
    bad("welcome_initial_credit_zero", "initial_credit must be at least 1",
        raw("WELCOME", 0, bytes(welcome_payload(initial_credit=0))), "BAD_HANDSHAKE")
    bad("welcome_initial_credit_above_2_31", "initial_credit must fit the credit counter "
        "(at most 2^31 - 1)", raw("WELCOME", 0, bytes(welcome_payload(initial_credit=2**31))),
        "BAD_HANDSHAKE")
    bad("welcome_max_in_flight_zero", "max_in_flight must be at least 1",
        raw("WELCOME", 0, bytes(welcome_payload(max_in_flight=0))), "BAD_HANDSHAKE")
    bad("welcome_message_size_below_frame_size", "max_message_size must be >= max_frame_size",
        raw("WELCOME", 0, bytes(welcome_payload(max_frame_size=131072, max_message_size=131071))),
        "BAD_HANDSHAKE")


# ---------------------------------------------------------------------------------------------
# sessions.json cases


def build_session_cases() -> None:
    J = b'{"n":1}'
    P, W = "parent", "worker"
    # --- handshake
    session("parent_handshake_then_clean_eof", "HELLO in, WELCOME out, then the worker closes "
            "between frames: no error (the driver ends in-flight requests with WORKER_EXITED)",
            P, parent_open() + [eof()])
    session("worker_handshake_then_clean_eof", "the worker's view of a clean start and close", W,
            worker_open() + [eof()])
    session("parent_hello_unknown_codec_accepted",
            "unknown codec ids in HELLO are carried up, not refused", P,
            parent_open(hello(methods=[method("m", "unary", [99, 1])])) + [eof()])
    session("parent_refused_by_worker_error_before_hello",
            "ERROR with id 0 is allowed at any time: a worker that cannot start says why", P,
            [recv(error(0, "BAD_HANDSHAKE", "no such config")), eof()])
    session("worker_refused_by_parent", "the parent answers HELLO with ERROR id 0 instead of "
            "WELCOME (here CODEC_MISMATCH), then closes", W,
            [send(hello()), recv(error(0, "CODEC_MISMATCH", "method 'parse' missing")), eof()])
    session("parent_frame_before_handshake", "a RESULT before any HELLO", P,
            [recv(result(1, J), [], "UNEXPECTED_FRAME")])
    session("parent_ping_before_hello", "even a PING may not precede HELLO", P,
            [recv(ping(), [], "UNEXPECTED_FRAME")])
    session("parent_frame_before_welcome_sent",
            "after HELLO the worker waits for WELCOME; an EVENT in between is refused", P,
            [recv(hello()), recv(event(0, "ready"), [], "UNEXPECTED_FRAME")])
    session("worker_frame_before_welcome", "a REQUEST before WELCOME", W,
            [send(hello()), recv(req(1, ECHO, 1, J), [], "UNEXPECTED_FRAME")])
    session("worker_frame_before_own_hello", "the parent may not speak first", W,
            [recv(welcome(), [], "UNEXPECTED_FRAME")])
    session("worker_request_largest_timeout_accepted",
            "a REQUEST with timeout_us 2^64-1 is accepted and reported with that budget (section "
            "2: any u64 is valid; the driver treats a deadline it cannot represent as none)", W,
            worker_open() + [recv(req(1, ECHO, 1, J, timeout_us=2**64 - 1)), eof()])
    session("parent_second_hello", "a second HELLO after the handshake", P,
            parent_open() + [recv(hello(), [], "UNEXPECTED_FRAME")])
    session("worker_second_welcome", "a second WELCOME", W,
            worker_open() + [recv(welcome(), [], "UNEXPECTED_FRAME")])
    session("parent_version_mismatch", "the worker offers versions 2-3; this parent speaks 1", P,
            [recv(hello(min_version=2, max_version=3), [], "VERSION_MISMATCH")])
    session("worker_version_mismatch", "WELCOME picks version 2; the worker offered 1-1", W,
            [send(hello()), recv(welcome(version=2), [], "VERSION_MISMATCH")])
    session("worker_welcome_frame_size_above_offer",
            "WELCOME max_frame_size larger than the worker's HELLO offer", W,
            [send(hello(max_frame_size=65536)),
             recv(welcome(max_frame_size=131072), [], "BAD_HANDSHAKE")])
    session("worker_welcome_in_flight_above_concurrency",
            "WELCOME max_in_flight larger than the worker's max_concurrency", W,
            [send(hello(max_concurrency=2)), recv(welcome(max_in_flight=3), [], "BAD_HANDSHAKE")])
    session("parent_stateless_error_in_session",
            "a frame the stateless decoder refuses ends the session too", P,
            parent_open() + [recv(raw("RESULT", 1, flags=0x02), [], "BAD_FLAGS")])

    # --- direction
    session("parent_receives_request", "REQUEST flows parent -> worker only", P,
            parent_open() + [recv(req(1, ECHO, 1, J), [], "UNEXPECTED_FRAME")])
    session("parent_receives_credit", "CREDIT flows parent -> worker only", P,
            parent_open() + [send(req(1, COUNT, 1, J)), recv(credit(1, 10), [],
                                                             "UNEXPECTED_FRAME")])
    session("worker_receives_result", "RESULT flows worker -> parent only", W,
            worker_open() + [recv(result(1, J), [], "UNEXPECTED_FRAME")])
    session("worker_receives_event", "EVENT flows worker -> parent only", W,
            worker_open() + [recv(event(0, "x"), [], "UNEXPECTED_FRAME")])
    session("worker_receives_error_with_request_id",
            "the parent sends ERROR only with id 0 (a request is stopped with CANCEL)", W,
            worker_open() + [recv(req(1, ECHO, 1, J)),
                             recv(error(1, "CANCELLED"), [], "UNEXPECTED_FRAME")])

    # --- unary
    session("parent_unary_happy", "REQUEST, an EVENT, then RESULT", P, parent_open() + [
        send(req(1, ECHO, 1, J)),
        recv([event(1, "progress", '{"done":0.5}'), result(1, J)]),
        eof()])
    session("worker_unary_happy", "the worker's side of the same call", W, worker_open() + [
        recv(req(1, ECHO, 1, J, timeout_us=1_000_000)),
        send(event(1, "progress", '{"done":0.5}')),
        send(result(1, J)),
        eof()])
    session("parent_unary_error_terminal", "a request ends with ERROR HANDLER_ERROR", P,
            parent_open() + [send(req(1, FAIL, 1, J)),
                             recv(error(1, "HANDLER_ERROR", "boom", '{"trace":"x"}'))])
    session("parent_error_fate_by_id_not_code",
            "request ERRORs with an unassigned code (50), a local code (300) and a 1xx code "
            "(150): each ends its request only; the connection survives (section 3)", P,
            parent_open() + [send(req(1, ECHO, 1, J)), send(req(2, ECHO, 1, J)),
                             send(req(3, ECHO, 1, J)),
                             recv([error(1, 50, "unassigned"), error(2, 300, "local, on the wire"),
                                   error(3, 150, "a 1xx code on a request id")]),
                             send(req(4, ECHO, 1, J)), recv(result(4, J))])
    session("parent_two_calls_interleaved", "two requests in flight, answered out of order", P,
            parent_open() + [send(req(1, ECHO, 1, b"1")), send(req(2, ECHO, 1, b"2")),
                             recv([result(2, b"2"), result(1, b"1")])])
    session("parent_bytes_split_across_recv", "one frame arrives in two pieces", P,
            parent_open() + [send(req(1, ECHO, 1, J)),
                             recv(encode(result(1, J))[:9], []),
                             recv(encode(result(1, J))[9:], [as_event(result(1, J))])])

    # --- ids
    session("worker_duplicate_id", "request id 5 after 7: ids must strictly increase", W,
            worker_open() + [recv(req(7, ECHO, 1, J)), recv(req(5, ECHO, 1, J), [],
                                                             "DUPLICATE_ID")])
    session("worker_duplicate_id_equal", "the same id twice", W,
            worker_open() + [recv(req(3, ECHO, 1, J)), send(result(3, J)),
                             recv(req(3, ECHO, 1, J), [], "DUPLICATE_ID")])
    session("parent_unknown_id", "a RESULT for id 9; the parent has sent ids up to 1", P,
            parent_open() + [send(req(1, ECHO, 1, J)), recv(result(9, J), [], "UNKNOWN_ID")])
    session("parent_unknown_id_event", "an EVENT for an id never sent", P,
            parent_open() + [recv(event(4, "x"), [], "UNKNOWN_ID")])
    session("worker_unknown_id_cancel", "CANCEL for an id above every request received", W,
            worker_open() + [recv(req(1, ECHO, 1, J)), recv(cancel(2), [], "UNKNOWN_ID")])
    session("parent_late_frames_after_terminal",
            "frames for a finished request are reported as LATE and ignored", P,
            parent_open() + [send(req(1, ECHO, 1, J)), recv(result(1, J)),
                             recv([event(1, "progress"), result(1, J), error(1, "CANCELLED")],
                                  [late(1, "EVENT"), late(1, "RESULT"), late(1, "ERROR")]),
                             eof()])
    session("worker_late_cancel_after_result",
            "the normal race: CANCEL arrives after the worker already sent RESULT", W,
            worker_open() + [recv(req(1, ECHO, 1, J)), send(result(1, J)),
                             recv(cancel(1), [late(1, "CANCEL")]), eof()])
    session("worker_late_credit_after_end", "CREDIT for a finished stream is LATE", W,
            worker_open() + [recv(req(1, COUNT, 1, J)), send(end(1, 0)),
                             recv(credit(1, 4096), [late(1, "CREDIT")])])
    session("parent_late_rows_after_error_no_kind_check",
            "LATE is decided before kind: ROWS for a finished unary request are LATE", P,
            parent_open() + [send(req(1, ECHO, 1, J)), recv(error(1, "HANDLER_ERROR", "x")),
                             recv(rows(1, b"a"), [late(1, "ROWS")])])

    # --- cancel
    session("worker_cancel_in_flight", "CANCEL for a running request is reported; the driver "
            "sets the handler's flag and answers ERROR CANCELLED", W,
            worker_open() + [recv(req(1, ECHO, 1, J)), recv(cancel(1)),
                             send(error(1, "CANCELLED", "cancelled")),
                             recv(cancel(1), [late(1, "CANCEL")])])
    session("parent_cancel_then_terminal", "after CANCEL the request stays in flight until its "
            "terminal: the ERROR CANCELLED is reported, not LATE", P,
            parent_open() + [send(req(1, ECHO, 1, J)), send(cancel(1)),
                             recv(error(1, "CANCELLED", "cancelled"))])

    # --- rejects (worker)
    session("worker_reject_unknown_method", "method index 3 is not in the HELLO list", W,
            worker_open() + [recv(req(1, 3, 1, J), [reject(1, "UNKNOWN_METHOD")]),
                             send(error(1, "UNKNOWN_METHOD", "no method 3"))])
    session("worker_reject_codec_unsupported", "method 2 accepts codec 1 only", W,
            worker_open() + [recv(req(1, FAIL, 2, b"\x80"), [reject(1, "CODEC_UNSUPPORTED")]),
                             send(error(1, "CODEC_UNSUPPORTED"))])
    session("worker_reject_overloaded", "max_in_flight 1: a second concurrent request is "
            "refused; once the first ends a third is accepted", W,
            worker_open(w=welcome(max_in_flight=1)) + [
                recv(req(1, ECHO, 1, J)),
                recv(req(2, ECHO, 1, J), [reject(2, "OVERLOADED")]),
                send(error(2, "OVERLOADED")),
                send(result(1, J)),
                recv(req(3, ECHO, 1, J))])
    session("worker_reject_draining", "a REQUEST after DRAIN ends with DRAINING", W,
            worker_open() + [recv(req(1, ECHO, 1, J)), recv(F("DRAIN", 0, grace_ms=1000)),
                             recv(req(2, ECHO, 1, J), [reject(2, "DRAINING")]),
                             send(error(2, "DRAINING")), send(result(1, J)),
                             send(F("GOODBYE", 0, reason=0))])
    session("worker_reject_precedence", "several rejects apply: DRAINING, then UNKNOWN_METHOD, "
            "then CODEC_UNSUPPORTED, then OVERLOADED", W,
            worker_open(w=welcome(max_in_flight=1)) + [
                recv(req(1, ECHO, 1, J)),
                recv(req(2, 9, 7, J), [reject(2, "UNKNOWN_METHOD")]),
                recv(req(3, ECHO, 7, J), [reject(3, "CODEC_UNSUPPORTED")]),
                recv(F("DRAIN", 0, grace_ms=0)),
                recv(req(4, 9, 7, J), [reject(4, "DRAINING")])])

    # --- drain / goodbye
    session("parent_drain_goodbye", "DRAIN, in-flight request finishes, GOODBYE, EOF", P,
            parent_open() + [send(req(1, ECHO, 1, J)), send(F("DRAIN", 0, grace_ms=5000)),
                             recv([result(1, J), F("GOODBYE", 0, reason=0)]), eof()])
    session("parent_frame_after_goodbye", "the worker sends nothing after GOODBYE", P,
            parent_open() + [recv(F("GOODBYE", 0, reason=2)),
                             recv(ping(), [], "UNEXPECTED_FRAME")])

    # --- heartbeat
    session("parent_ping_answered", "the worker pings; the parent core reports PING and the "
            "driver answers PONG with the same nonce", P,
            parent_open() + [recv(ping("a1a2a3a4a5a6a7a8")), send(pong("a1a2a3a4a5a6a7a8")),
                             recv(pong("0000000000000001"))])
    session("worker_ping_answered", "heartbeat from the parent, answered while a request runs", W,
            worker_open() + [recv(req(1, ECHO, 1, J)), recv(ping("0000000000000007")),
                             send(pong("0000000000000007")), send(result(1, J))])
    session("worker_unsolicited_pong", "an unsolicited PONG is reported (and ignored)", W,
            worker_open() + [recv(pong("ffffffffffffffff"))])

    # --- streams and flow control
    session("parent_stream_happy", "a stream: rows, a credit grant, an EVENT, END with summary",
            P, parent_open(w=welcome(initial_credit=64)) + [
                send(req(1, COUNT, 1, b'{"to":5}')),
                recv([rows(1, b"1", b"2"), event(1, "progress", '{"rows":2}')]),
                send(credit(1, 64)),
                recv([rows(1, b"3", b"4", b"5"), end(1, 5, b'{"sum":15}')]),
                eof()])
    session("worker_stream_happy", "the worker's side: credit reported so a waiting stream "
            "wakes", W, worker_open(w=welcome(initial_credit=16)) + [
                recv(req(1, COUNT, 1, b'{"to":3}')),
                send(rows(1, b"1", b"2", b"3")),  # 4 + 3*5 = 19 bytes: credit 16 -> -3
                recv(credit(1, 32)),
                send(end(1, 3, b'{"sum":6}'))])
    session("parent_flow_control", "initial_credit 10: a 13-byte ROWS takes it to -3; another "
            "ROWS before any CREDIT is FLOW_CONTROL", P,
            parent_open(w=welcome(initial_credit=10)) + [
                send(req(1, COUNT, 1, J)),
                recv(rows(1, b"abcde")),
                recv(rows(1, b"f"), [], "FLOW_CONTROL")])
    session("parent_flow_control_zero_is_not_positive",
            "credit exactly 0 is not positive either", P,
            parent_open(w=welcome(initial_credit=9)) + [
                send(req(1, COUNT, 1, J)),
                recv(rows(1, b"a")),
                recv(rows(1, b"b"), [], "FLOW_CONTROL")])
    session("parent_credit_counted_from_send",
            "a grant counts when the parent sends it, so rows that the worker sent on the "
            "strength of it are accepted", P,
            parent_open(w=welcome(initial_credit=9)) + [
                send(req(1, COUNT, 1, J)),
                recv(rows(1, b"a")),
                send(credit(1, 9)),
                recv(rows(1, b"b")),
                recv(rows(1, b"c"), [], "FLOW_CONTROL")])
    session("worker_credit_overflow", "initial 1048576 + grant 2^31 - 1 exceeds 2^31 - 1", W,
            worker_open() + [recv(req(1, COUNT, 1, J)),
                             recv(credit(1, MAX_CREDIT), [], "CREDIT_OVERFLOW")])
    session("worker_credit_to_exact_max", "a grant reaching exactly 2^31 - 1 is fine", W,
            worker_open() + [recv(req(1, COUNT, 1, J)),
                             recv(credit(1, MAX_CREDIT - 1_048_576)),
                             recv(credit(1, 1), [], "CREDIT_OVERFLOW")])
    session("parent_row_count_mismatch", "3 rows received, END says 4", P, parent_open() + [
        send(req(1, COUNT, 1, J)), recv(rows(1, b"a", b"b", b"c")),
        recv(end(1, 4), [], "ROW_COUNT_MISMATCH")])
    session("parent_kind_rows_for_unary", "ROWS for a unary request", P, parent_open() + [
        send(req(1, ECHO, 1, J)), recv(rows(1, b"a"), [], "KIND_MISMATCH")])
    session("parent_kind_end_for_unary", "END for a unary request", P, parent_open() + [
        send(req(1, ECHO, 1, J)), recv(end(1, 0), [], "KIND_MISMATCH")])
    session("parent_kind_result_for_stream", "RESULT for a stream", P, parent_open() + [
        send(req(1, COUNT, 1, J)), recv(result(1, J), [], "KIND_MISMATCH")])
    session("worker_kind_credit_for_unary", "CREDIT for a unary request", W, worker_open() + [
        recv(req(1, ECHO, 1, J)), recv(credit(1, 100), [], "KIND_MISMATCH")])

    # --- continuation
    session("worker_continued_request_interleaved",
            "REQUEST with MORE + 2 CONTINUATIONs, interleaved with request 2 and a PING; one "
            "REQUEST event with the whole body when the last chunk arrives", W, worker_open() + [
                recv(req(1, ECHO, 0, b"part1-", more=True), []),
                recv(req(2, ECHO, 1, J)),
                recv(cont(1, b"part2-", more=True), []),
                recv(ping()),
                recv([cont(1, b"part3"), cancel(2)],
                     [as_event(req(1, ECHO, 0, b"part1-part2-part3")), as_event(cancel(2))])])
    session("parent_continued_result_interleaved",
            "RESULT with MORE + 2 CONTINUATIONs interleaved with a stream's rows", P,
            parent_open() + [
                send(req(1, ECHO, 0, b"x")), send(req(2, COUNT, 1, J)),
                recv([result(1, b"aaa", more=True), rows(2, b"r1"),
                      cont(1, b"bbb", more=True), event(2, "e"), cont(1, b"ccc")],
                     [as_event(rows(2, b"r1")), as_event(event(2, "e")),
                      as_event(result(1, b"aaabbbccc"))]),
                recv(end(2, 1))])
    session("parent_continued_end_summary", "END with MORE: the summary is reassembled", P,
            parent_open() + [send(req(1, COUNT, 2, J)), recv(rows(1, b"a")),
                             recv([end(1, 1, b"\x81", more=True), cont(1, b"\xa1k\x01")],
                                  [as_event(end(1, 1, b"\x81\xa1k\x01"))])])
    session("parent_sends_continued_request", "the parent's own continued REQUEST; the "
            "RESULT is reported normally", P, parent_open() + [
                send(req(1, ECHO, 0, b"ab", more=True)), send(cont(1, b"cd", more=True)),
                send(cont(1, b"ef")), recv(result(1, b"abcdef"))])
    session("parent_continuation_without_start", "CONTINUATION with no message in progress", P,
            parent_open() + [send(req(1, ECHO, 0, b"x")),
                             recv(cont(1, b"zz"), [], "CONTINUATION")])
    session("worker_continuation_without_start", "CONTINUATION after the request completed", W,
            worker_open() + [recv(req(1, ECHO, 0, b"x")), recv(cont(1, b"zz"), [],
                                                               "CONTINUATION")])
    session("worker_continuation_unknown_id_first",
            "id rule before continuation rule: CONTINUATION for an id never seen", W,
            worker_open() + [recv(cont(4, b"zz"), [], "UNKNOWN_ID")])
    session("parent_other_frame_mid_message",
            "an EVENT for an id whose RESULT is half received", P, parent_open() + [
                send(req(1, ECHO, 0, b"x")), recv(result(1, b"aa", more=True), []),
                recv(event(1, "x"), [], "CONTINUATION")])
    session("worker_credit_mid_request", "CREDIT for a request still being received", W,
            worker_open() + [recv(req(1, COUNT, 1, b"[", more=True), []),
                             recv(credit(1, 10), [], "CONTINUATION")])
    session("worker_cancel_abandons_partial_request",
            "CANCEL drops a half-received request; the core reports REJECT CANCELLED so the "
            "driver answers ERROR CANCELLED (every request gets a terminal)", W, worker_open() + [
                recv(req(1, ECHO, 0, b"aaaa", more=True), []),
                recv(cancel(1), [reject(1, "CANCELLED")]),
                send(error(1, "CANCELLED")),
                recv(req(2, ECHO, 1, J))])
    session("parent_error_abandons_partial_result",
            "ERROR from the worker abandons a half-sent RESULT; it is the terminal", P,
            parent_open() + [send(req(1, ECHO, 0, b"x")), recv(result(1, b"aa", more=True), []),
                             recv(error(1, "HANDLER_PANIC", "oops")),
                             recv(cont(1, b"bb"), [], "CONTINUATION")])
    session("worker_message_too_large", "max_message_size 65536: a 40012-byte first frame plus "
            "a 30000-byte CONTINUATION exceeds it, detected on arrival", W,
            worker_open(w=welcome(max_frame_size=65536, max_message_size=65536)) + [
                recv(req(1, ECHO, 0, bytes(40000), more=True), []),
                recv(cont(1, bytes(30000)), [], "MESSAGE_TOO_LARGE")])
    session("parent_message_too_large", "a continued RESULT past max_message_size", P,
            parent_open(w=welcome(max_frame_size=65536, max_message_size=65536)) + [
                send(req(1, ECHO, 0, b"x")),
                recv(result(1, bytes(65536), more=True), []),
                recv(cont(1, b"!", more=True), [], "MESSAGE_TOO_LARGE")])

    session("worker_messages_in_progress_too_large",
            "max_message_size 65536: two half-received requests of 40012 bytes each, each within "
            "the limit, sum above it: memory per connection is bounded, not only per message", W,
            worker_open(w=welcome(max_frame_size=65536, max_message_size=65536)) + [
                recv(req(1, ECHO, 0, bytes(40000), more=True), []),
                recv(req(2, ECHO, 0, bytes(40000), more=True), [], "MESSAGE_TOO_LARGE")])
    session("parent_messages_in_progress_too_large",
            "two continued RESULTs in progress whose sizes sum above max_message_size; the "
            "second's CONTINUATION crosses it", P,
            parent_open(w=welcome(max_frame_size=65536, max_message_size=65536)) + [
                send(req(1, ECHO, 0, b"x")), send(req(2, ECHO, 0, b"x")),
                recv(result(1, bytes(30000), more=True), []),
                recv(result(2, bytes(30000), more=True), []),
                recv(cont(2, bytes(5000), more=True), []),
                recv(cont(1, bytes(1000), more=True), [], "MESSAGE_TOO_LARGE")])
    session("parent_message_finished_frees_its_share",
            "a finished continued message no longer counts toward the per-connection sum", P,
            parent_open(w=welcome(max_frame_size=65536, max_message_size=65536)) + [
                send(req(1, ECHO, 0, b"x")), send(req(2, ECHO, 0, b"x")),
                recv(result(1, bytes(40000), more=True), []),
                recv(cont(1, bytes(20000)), [as_event(result(1, bytes(60000)))]),
                recv(result(2, bytes(40000), more=True), []),
                recv(cont(2, bytes(20000)), [as_event(result(2, bytes(60000)))])])

    session("parent_stream_ends_with_error", "a stream may end with ERROR after some rows", P,
            parent_open() + [send(req(1, COUNT, 1, J)), recv(rows(1, b"a")),
                             recv(error(1, "HANDLER_ERROR", "disk full")),
                             recv(rows(1, b"b"), [late(1, "ROWS")])])
    session("parent_connection_event_and_fatal_report",
            "an EVENT with id 0, then the worker reports a fatal error with ERROR id 0", P,
            parent_open() + [recv([event(0, "log", '{"level":"warn"}'),
                                   error(0, "PROTOCOL", "worker state corrupted")]), eof()])
    session("worker_parent_reports_fatal_error", "ERROR id 0 from the parent after the handshake "
            "is reported (the parent closes next)", W,
            worker_open() + [recv(error(0, "BAD_UTF8", "event topic")), eof()])
    session("parent_row_count_checked_on_first_end_frame",
            "END with MORE is checked against the rows received when its first frame arrives", P,
            parent_open() + [send(req(1, COUNT, 1, J)), recv(rows(1, b"a")),
                             recv(end(1, 2, b"{", more=True), [], "ROW_COUNT_MISMATCH")])
    session("worker_partial_request_not_in_flight",
            "max_in_flight 1: a half-received request does not count; it is checked when "
            "complete, by which time request 2 is running, so it is OVERLOADED", W,
            worker_open(w=welcome(max_in_flight=1)) + [
                recv(req(1, ECHO, 1, b"[1,", more=True), []),
                recv(req(2, ECHO, 1, J)),
                recv(cont(1, b"2]"), [reject(1, "OVERLOADED")])])
    session("worker_duplicate_id_of_partial_request", "a REQUEST reusing the id of a request "
            "still being received", W,
            worker_open() + [recv(req(4, ECHO, 1, b"[", more=True), []),
                             recv(req(4, ECHO, 1, J), [], "DUPLICATE_ID")])
    session("worker_ids_may_skip", "ids only need to increase, not to be consecutive", W,
            worker_open() + [recv(req(1, ECHO, 1, J)), recv(req(1000, ECHO, 1, J)),
                             recv(cancel(999), [late(999, "CANCEL")])])

    # --- frame size and EOF
    session("parent_frame_too_large_before_handshake",
            "before WELCOME the limit is 65536, whatever HELLO will offer", P,
            [recv(raw("HELLO", 0, length=65537), [], "FRAME_TOO_LARGE")])
    session("parent_frame_too_large_negotiated", "WELCOME chose 65536; a 65537 header is refused "
            "before its payload arrives", P,
            parent_open(w=welcome(max_frame_size=65536, max_message_size=65536)) + [
                send(req(1, ECHO, 0, b"x")),
                recv(raw("RESULT", 1, length=65537), [], "FRAME_TOO_LARGE")])
    session("worker_frame_too_large_negotiated", "the negotiated limit applies to the worker's "
            "receive side too", W, worker_open(w=welcome(max_frame_size=100_000)) + [
                recv(raw("REQUEST", 1, length=100_001), [], "FRAME_TOO_LARGE")])
    session("worker_negotiated_limit_allows_larger_frame", "after WELCOME chose 131072, a "
            "65537-byte frame is fine (it would not be before the handshake)", W,
            worker_open(w=welcome(max_frame_size=131072)) + [
                recv(req(1, ECHO, 0, bytes(65525)))])
    session("parent_eof_mid_frame", "EOF inside a RESULT's payload", P, parent_open() + [
        send(req(1, ECHO, 1, J)), recv(encode(result(1, J))[:20], []),
        eof([], "TRUNCATED")])
    session("worker_eof_mid_header", "EOF after 3 header bytes", W, worker_open() + [
        recv(encode(ping())[:3], []), eof([], "TRUNCATED")])
    session("parent_eof_mid_hello", "the worker dies while sending HELLO", P,
            [recv(encode(hello())[:30], []), eof([], "TRUNCATED")])


# ---------------------------------------------------------------------------------------------
# Output, --check, annotation


def dump(cases: list[dict]) -> str:
    return json.dumps({"protocol_version": PROTOCOL_VERSION, "cases": cases}, indent=1,
                      ensure_ascii=False) + "\n"


def doc_examples() -> list[tuple[str, str]]:
    """(case name, hex) of every ```hex name=CASE``` block in PROTOCOL.md; '#' starts a comment."""
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    out = []
    for m in re.finditer(r"^```hex name=(\S+)\n(.*?)^```", text, re.S | re.M):
        digits = "".join(line.split("#", 1)[0] for line in m.group(2).splitlines())
        out.append((m.group(1), re.sub(r"\s+", "", digits).lower()))
    return out


def doc_error_codes() -> dict[str, int]:
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    return {name: int(code) for code, name in
            re.findall(r"^\|\s*(\d{3})\s*\|\s*([A-Z_0-9]+)\s*\|", text, re.M)}


def constants_problems() -> list[str]:
    """The generator's own constants against spec/constants.json (PROTOCOL.md section 18)."""
    c = json.loads((HERE.parent / "constants.json").read_text(encoding="utf-8"))
    lim = c["limits"]
    types = {t["name"]: t for t in c["frame_types"]}
    theirs = {
        "frame types": {n: t["code"] for n, t in types.items()},
        "error codes": {e["name"]: e["code"] for e in c["error_codes"]},
        "MORE allowed": {n for n, t in types.items() if t["more_allowed"]},
        "id 0 types": {n for n, t in types.items() if t["id"] == "zero"},
        "id 0 or request types": {n for n, t in types.items() if t["id"] == "any"},
        "limits": [lim["handshake_max_frame_size"], lim["min_max_frame_size"],
                   lim["max_max_frame_size"], lim["max_credit"], lim["max_methods"],
                   c["header"]["size"], c["flags"]["MORE"], c["magic"].encode(),
                   c["protocol_version"], c["method_kinds"]],
    }
    ours = {
        "frame types": TYPES, "error codes": ERROR_CODES, "MORE allowed": MORE_ALLOWED,
        "id 0 types": CONNECTION_LEVEL, "id 0 or request types": ANY_ID,
        "limits": [HANDSHAKE_FRAME_LIMIT, MIN_FRAME_LIMIT, MAX_FRAME_LIMIT, MAX_CREDIT,
                   MAX_METHODS, HEADER.size, FLAG_MORE, MAGIC, PROTOCOL_VERSION, KINDS],
    }
    return [f"constants.json {what} differ from the generator's: {theirs[what]} != {ours[what]}"
            for what in ours if theirs[what] != ours[what]]


def annotate_payload(tname: str, field, s16) -> None:
    if tname == "HELLO":
        field(8, 'magic "WIREPOOL"')
        field(2, "min_version = {}", "H")
        field(2, "max_version = {}", "H")
        field(4, "pid = {}", "I")
        field(4, "max_concurrency = {}", "I")
        field(4, "max_frame_size = {}", "I")
        s16("sdk_name")
        s16("sdk_version")
        for _ in range(field(2, "method_count = {}", "H")):
            field(1, "kind = {} (1 unary, 2 stream)", "B")
            n = field(1, "codec_count = {}", "B")
            field(n, lambda b: "codec ids: " + ", ".join(CODEC_NAMES.get(c, str(c)) for c in b))
            s16("name")
    elif tname == "WELCOME":
        for n, label, fmt in [(2, "version", "H"), (2, "reserved", "H"),
                              (4, "worker_id", "I"), (4, "max_frame_size", "I"),
                              (4, "initial_credit", "I"), (4, "heartbeat_ms", "I"),
                              (4, "max_in_flight", "I"), (8, "max_message_size", "Q")]:
            field(n, label + " = {}", fmt)
    elif tname == "REQUEST":
        field(2, "method = {}", "H")
        field(1, lambda b: f"codec = {b[0]} ({CODEC_NAMES.get(b[0], '?')})")
        field(1, "reserved = {}", "B")
        field(8, "timeout_us = {}", "Q")
    elif tname == "ERROR":
        field(4, "code = {}", "I")
        s16("message")
    elif tname == "ROWS":
        for i in range(field(4, "count = {}", "I")):
            n = field(4, f"row {i} length = {{}}", "I")
            if n:
                field(n, f"row {i}")
    elif tname == "END":
        field(8, "row_count = {}", "Q")
    elif tname == "CREDIT":
        field(4, "bytes = {}", "I")
    elif tname == "EVENT":
        s16("topic")
    elif tname in ("PING", "PONG"):
        field(8, "nonce")
    elif tname == "DRAIN":
        field(4, "grace_ms = {}", "I")
    elif tname == "GOODBYE":
        field(4, "reason = {}", "I")


def annotate(name: str, compact: bool = False) -> str:
    """An annotated dump of a frames case (field by field), to paste into PROTOCOL.md."""
    case = next(c for c in FRAME_CASES if c["name"] == name)
    data = bytes.fromhex(case["hex"])
    lines: list[str] = []

    def put(chunk: bytes, note: str) -> None:
        for i in range(0, max(len(chunk), 1), 8):
            part = chunk[i:i + 8]
            if part or not chunk:
                lines.append(f"{part.hex(' '):<24}# {note if i == 0 else '  (cont.)'}")

    def text(b: bytes) -> str:
        return '"' + b.decode("utf-8", "replace") + '"'

    pos = 0
    while pos + 16 <= len(data):
        length, tb, flags, res, ident = HEADER.unpack_from(data, pos)
        tname = TYPE_NAMES.get(tb, "?")
        more = " (MORE)" if flags & 1 else ""
        if compact:
            lines.append(f"{data[pos:pos + 8].hex(' ')}  {data[pos + 8:pos + 16].hex(' ')}"
                         f"  # header: length {length}, {tname}, flags 0x{flags:02x}{more}, "
                         f"id {ident}")
        else:
            put(data[pos:pos + 4], f"length = {length}")
            put(data[pos + 4:pos + 5], f"type = 0x{tb:02x} {tname}")
            put(data[pos + 5:pos + 6], f"flags = 0x{flags:02x}{more}")
            put(data[pos + 6:pos + 8], f"reserved = {res}")
            put(data[pos + 8:pos + 16], f"id = {ident}")
        p = data[pos + 16:pos + 16 + length]
        q = 0

        def field(n: int, note: str, fmt: str | None = None) -> int | bytes:
            nonlocal q
            chunk = p[q:q + n]
            if len(chunk) < n:
                raise ProtoError("PROTOCOL")  # malformed: the rest is dumped raw
            q += n
            value = struct.unpack("<" + fmt, chunk)[0] if fmt else chunk
            put(chunk, note(chunk) if callable(note) else note.format(value))
            return value

        def s16(label: str) -> None:
            n = field(2, label + " length = {}", "H")
            field(n, label + " = " + text(p[q:q + n]).replace("{", "{{").replace("}", "}}"))

        try:
            annotate_payload(tname, field, s16)
        except ProtoError:
            pass
        rest = p[q:]
        if rest:
            label = {"ERROR": "details", "END": "summary", "EVENT": "data"}.get(tname, "body")
            if tname == "HELLO" or tname == "WELCOME":
                label = "trailing (ignored)"
            printable = rest.isascii() and rest.decode().isprintable()
            put(rest, f"{label} {rest.decode() if printable else ''}".rstrip())
        pos += 16 + length
    if pos < len(data):
        put(data[pos:], "(incomplete)")
    return f"```hex name={name}\n" + "\n".join(lines) + "\n```"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="verify the committed JSON and PROTOCOL.md examples; write nothing")
    ap.add_argument("--annotate", metavar="CASE", help="print an annotated hex block of a case")
    ap.add_argument("--compact", action="store_true", help="with --annotate: one-line headers")
    ap.add_argument("--refresh-doc", action="store_true",
                    help="rewrite every ```hex block of PROTOCOL.md from the generator")
    args = ap.parse_args()
    build_frame_cases()
    build_session_cases()
    for cases in (FRAME_CASES, SESSION_CASES):
        names = [c["name"] for c in cases]
        assert len(names) == len(set(names)), "duplicate case names"
    if args.annotate:
        print(annotate(args.annotate, args.compact))
        return 0
    if args.refresh_doc:
        def fresh(m: re.Match) -> str:
            return annotate(m.group(1), compact="# header:" in m.group(2))
        text = PROTOCOL_MD.read_text(encoding="utf-8")
        text = re.sub(r"^```hex name=(\S+)\n(.*?)^```", fresh, text, flags=re.S | re.M)
        PROTOCOL_MD.write_text(text, encoding="utf-8")
        print("refreshed the hex examples of PROTOCOL.md")
        return 0
    import policy_cases  # the core's policies (section 14.5), from this folder
    import shm_cases  # the shared-memory extension's cases (section 20), from this folder

    shm = shm_cases.build()
    outputs = {HERE / "frames.json": dump(FRAME_CASES), HERE / "sessions.json": dump(SESSION_CASES),
               HERE / "shm.json": dump(shm),
               HERE / "policies.json": json.dumps(policy_cases.build(), indent=1,
                                                  ensure_ascii=False) + "\n"}
    if not args.check:
        for path, text in outputs.items():
            path.write_text(text, encoding="utf-8")
        print(f"wrote {len(FRAME_CASES)} frame cases, {len(SESSION_CASES)} session cases, "
              f"{len(shm)} shm cases")
        return 0
    problems = []
    for path, text in outputs.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            problems.append(f"{path.name} is stale: run python3 spec/vectors/generate.py")
    by_name = {c["name"]: c["hex"] for c in FRAME_CASES}
    for name, digits in doc_examples():
        if name not in by_name:
            problems.append(f"PROTOCOL.md example {name}: no such frames case")
        elif digits != by_name[name]:
            problems.append(f"PROTOCOL.md example {name}: bytes differ from the generator")
    doc_codes = doc_error_codes()
    for name, code in ERROR_CODES.items():
        if doc_codes.get(name) != code:
            problems.append(f"error {name}={code} is not in PROTOCOL.md's tables as such")
    problems += constants_problems()
    for p in problems:
        print(p, file=sys.stderr)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
