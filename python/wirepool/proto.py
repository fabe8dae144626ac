"""Sans-IO core of the wirepool protocol v1 (spec/PROTOCOL.md, the API of section 14).

No sockets, no clocks, no threads, no handlers: bytes go in, typed frames and events come out,
and every send is checked, recorded and encoded here. The worker (``worker.py``) and the parent
(``pool.py``) are drivers over this module; they never re-decide ids, states, credit, framing
or limits.

Decoding, frame by frame::

    dec = FrameDecoder(max_frame_size=65536)
    dec.receive(chunk)                   # any chunking
    while (frame := dec.next_frame()) is not None:
        ...                              # Hello, Request, Rows, ... (validated)
    dec.end_of_input()                   # raises ProtocolError(TRUNCATED) if mid-frame

A connection (handshake, ids, credit, continuation, drain), here the parent's::

    conn = Connection("parent")
    conn.receive(data)                   # or read_buffer() + received(n)
    while (event := conn.next_event()) is not None:
        ...                              # Hello, Result, Rows, End, Notification, ...
    write(conn.send_welcome(Welcome(...)))
    id, parts = conn.send_request(method, codec, timeout_us, body)

A violation raises :class:`ProtocolError` with its stable code (the driver then sends
``send_fatal`` and closes); a send the core refuses raises it too, and changes nothing.
"""

from __future__ import annotations

import collections
import functools
import itertools
import sys
import struct
from typing import Any, Callable, Sequence

from . import _shm_proto
from ._shm_proto import Borrower, Lender, ShmAccept, ShmOffer, ShmRange
from .errors import ErrorCode, ProtocolError, WirepoolError
from ._constants import (DEFAULT_HEARTBEAT_MS, DEFAULT_INITIAL_CREDIT, DEFAULT_MAX_FRAME_SIZE,
                         DEFAULT_MAX_MESSAGE_SIZE, FLAG_MORE, HANDSHAKE_MAX_FRAME_SIZE,
                         HEADER_SIZE, MAX_CREDIT, PROTOCOL_VERSION, MAX_STREAM_WINDOW,
                         MAX_CONNECTION_WINDOW)

__all__ = [
    "PROTOCOL_VERSION", "HEADER_SIZE", "DEFAULT_MAX_FRAME_SIZE", "HANDSHAKE_MAX_FRAME_SIZE",
    "MIN_FRAME_SIZE_LIMIT", "MAX_FRAME_SIZE_LIMIT", "DEFAULT_INITIAL_CREDIT", "DEFAULT_HEARTBEAT_MS",
    "DEFAULT_MAX_MESSAGE_SIZE", "MAX_CREDIT", "FLAG_MORE", "FrameType", "CodecId", "MethodKind",
    "MethodInfo", "Frame", "Hello", "Welcome", "Request", "Cancel", "Result", "ErrorFrame", "Rows",
    "End", "Credit", "Event", "Notification", "Ping", "Pong", "Drain", "Goodbye", "Continuation", "Late", "Reject",
    "RowsBuilder", "ROW_PREFIXES", "framed_row", "FrameDecoder", "Connection", "MessageCursor",
    "encode_frame",
    "encode_frame_parts", "split_message",
    "Offer", "negotiate", "rows_batch_bytes", "grant", "fit_error", "stream_window",
]

# The frames, their encoding and decoder: part of this module's API (re-exported), and what the
# connection below is built on.
from ._frames import (Buffer, Cancel, CodecId, Continuation, Credit, decode_all, Drain,
                      encode_frame, encode_frame_parts, End, ErrorFrame, Event, Frame, framed_row,
                      FrameDecoder, FrameType, Goodbye, Hello, Late, MAGIC, MAX_FRAME_SIZE_LIMIT,
                      MessageCursor, MethodInfo, MethodKind, MIN_FRAME_SIZE_LIMIT, Notification,
                      parse_payload, Ping, Pong, Reject, Request, Result, ROW_PREFIXES, Rows,
                      RowsBuilder, ShmBody, ShmFrame, ShmRegion, ShmRelease, ShmRetire,
                      split_message, Welcome, _ERROR_PREFIX, _fail, _hdr_pack, _HEADER, _ID_RULE,
                      _MORE_ALLOWED, _PARENT_RECEIVES, _PREFIX_SIZE, _REQUEST_HEAD_pack,
                      _SHM_ID_RULE, _TYPE_NAMES, _u32_pack, _WORKER_RECEIVES)


# ---------------------------------------------------------------------------------------------
# Connection state machine
# ---------------------------------------------------------------------------------------------


class _Stream:
    """Per-request state both sides keep: kind, stream credit, rows seen, and (parent) the row
    bytes the consumer has read since the last grant."""

    __slots__ = ("kind", "credit", "rows", "consumed", "window", "clock")

    def __init__(self, kind: int, credit: int) -> None:
        self.kind = kind
        self.credit = credit
        self.rows = 0
        self.consumed = 0
        self.window = credit  # parent: the adaptive window (section 6), initial_credit at first
        self.clock = -1  # parent: the driver's time of the last grant (-1: no read yet)


class _Assembly:
    """An incoming message split by MORE, being reassembled into one buffer: each chunk is
    copied in as it arrives (so the frame's own buffer is free for the next frame at once) and
    the message is a view of that buffer, never a join of the chunks."""

    __slots__ = ("first", "buf", "fill", "size", "continued")

    def __init__(self, first: Frame, buf: bytearray, size: int) -> None:
        self.first = first
        self.buf = buf
        self.fill = 0  # bytes of the body in ``buf`` (which may be longer: a reused buffer)
        self.size = size
        self.continued = False  # a CONTINUATION arrived: no SHM_BODY may complete it (20.3)

    def append(self, chunk: Buffer) -> None:
        end = self.fill + len(chunk)
        # Assigning past the end grows the bytearray (amortised, realloc in place when it can);
        # within it, the bytes of an earlier message are overwritten.
        self.buf[self.fill:end if end <= len(self.buf) else len(self.buf)] = chunk
        self.fill = end


_START, _HELLO_DONE, _OPEN = 0, 1, 2
_RESULT = FrameType.RESULT
# Endless arguments of send_results' map calls.
_NONES = itertools.repeat(None)
_ZEROS = itertools.repeat(0)
_RESULTS = itertools.repeat(int(FrameType.RESULT))
_NO_PARTS: list[Buffer] = []
# take_requests' view of a header and a REQUEST prefix: length, then type | flags << 8 |
# reserved << 16 as one number, id, method, codec, the zero byte, timeout_us.
_REQUEST_HEAD_unpack_from = struct.Struct("<IIQHBBQ").unpack_from
_REQUEST_TFR = int(FrameType.REQUEST)
_HEAD_unpack_from = struct.Struct("<IIQ").unpack_from  # the same for take_results
_RESULT_TFR = int(FrameType.RESULT)
_UNARY, _STREAM = MethodKind.UNARY, MethodKind.STREAM


def _refused(code: ErrorCode, message: str, id: int = 0) -> ProtocolError:
    return ProtocolError(code, message, id=id)


_SHM_RANGE = struct.Struct("<IIQQ")
_SHM_REGION = struct.Struct("<IIQ")


def _shm_entry(extensions: bytes) -> bytes | None:
    for tag, data in _shm_proto.parse_extensions(extensions):
        if tag == _shm_proto.TAG_SHM:
            return data
    return None


def _shm_offer_in(hello: Hello) -> ShmOffer | None:
    """The HELLO's shm offer (section 20.2), None when absent or too short (ignored)."""
    data = _shm_entry(hello.extensions)
    return None if data is None else ShmOffer.decode(data)


def _shm_accept_in(welcome: Welcome) -> ShmAccept | None:
    """The WELCOME's shm acceptance, None when absent or too short (the lane is off)."""
    data = _shm_entry(welcome.extensions)
    return None if data is None else ShmAccept.decode(data)


# The policies (PROTOCOL.md 14.5) are in _policies.py, re-exported here.
from ._policies import (Offer, fit_error, grant, negotiate,  # noqa: E402
                        rows_batch_bytes, stream_window)


class Connection:
    """The sans-IO core of one connection, seen from ``role`` ("parent" or "worker"): the API
    of PROTOCOL.md section 14, the same in every SDK of this repository.

    Receiving: :meth:`receive` bytes (or :meth:`read_buffer` + :meth:`received`), then
    :meth:`next_event` until None; events are the frame objects (continued messages
    reassembled into one), plus :class:`Late` and :class:`Reject`. A violation raises
    :class:`ProtocolError` and the core is failed from then on; the driver sends
    :meth:`send_fatal` and closes.

    Sending: every ``send_*`` operation checks, records the state change and returns the
    buffers to write, in order (large bodies as slices of themselves, not copies). A send the
    core refuses raises :class:`ProtocolError` with the code of section 14.3; it writes
    nothing, changes no state and does not fail the connection::

        conn = Connection("parent")
        conn.receive(hello_bytes)
        hello = conn.next_event()
        write(conn.send_welcome(Welcome(max_in_flight=4)))
        id, parts = conn.send_request(0, CodecId.JSON, 0, b"{}")
        write(parts)

    The core owns request ids (the parent allocates them: 1, 2, 3, ...), every state, credit
    and its grant policy (:meth:`consumed`), ROWS framing (:meth:`rows`), splitting and
    reassembling continued messages, and every limit; the driver owns I/O, clocks, handlers
    and codecs.
    """

    def __init__(self, role: str, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if role not in ("parent", "worker"):
            raise ValueError("role must be 'parent' or 'worker'")
        self._role = role
        self._is_parent = role == "parent"
        self._decoder = FrameDecoder(HANDSHAKE_MAX_FRAME_SIZE)
        self._state = _START
        self._hello: Hello | None = None
        self._welcome: Welcome | None = None
        self._mfs = HANDSHAKE_MAX_FRAME_SIZE
        self._mms = DEFAULT_MAX_MESSAGE_SIZE
        self._initial_credit = DEFAULT_INITIAL_CREDIT
        self._max_in_flight = 1
        self._last_id = 0
        self._requests: dict[int, _Stream] = {}
        self._min_rtt_us = 0  # the smallest PING round trip the driver observed (0: none)
        self._max_stream_window = MAX_STREAM_WINDOW  # section 6's caps
        self._max_connection_window = MAX_CONNECTION_WINDOW
        self._rejected: set[int] = set()  # worker: REJECTed requests awaiting their ERROR
        self._incoming: dict[int, _Assembly] = {}
        self._incoming_bytes = 0  # all messages in progress: bounded per connection (section 5)
        self._spare: bytearray | None = None  # the last reassembled message's buffer
        self._outgoing: dict[int, int] = {}  # id -> bytes of a message being sent with send()
        self._draining = False
        self._goodbye = False  # parent: received GOODBYE; worker: sent it
        self._fatal_sent = False
        self._failure: ProtocolError | None = None
        self._unary = _Stream(MethodKind.UNARY, 0)
        # The shm lane (section 20): the HELLO's offer, then, once the WELCOME accepted it, the
        # peer's regions this side maps (``_shm_in``) and this side's own (``_shm_out``).
        self._shm_offer: ShmOffer | None = None
        self._shm_in: Borrower | None = None
        self._shm_out: Lender | None = None
        self._shm_early_fds = 0  # descriptors read before the WELCOME was processed
        self._shm_mapper: Callable[[int, int], Any] | None = None
        self._shm_mapped: dict[int, Any] = {}
        # Ranges whose last view was dropped (on any thread: deque appends are atomic), to be
        # released by send_shm_releases on the driver's thread.
        self._shm_dropped: collections.deque[ShmRange] = collections.deque()
        self._shm_waker: Callable[[], None] | None = None
        self._accepts: list[frozenset[int]] = []
        self._kinds: list[int] = []
        # The receiving operations are the decoder's own methods (the same behaviour, one call
        # fewer on every read).
        dec = self._decoder
        self.receive = dec.receive  # type: ignore[method-assign]
        self.read_buffer = dec.read_buffer  # type: ignore[method-assign]
        self.received = dec.received  # type: ignore[method-assign]

    # -- queries ----------------------------------------------------------------------------

    def role(self) -> str:
        """"parent" or "worker"."""
        return self._role

    def is_open(self) -> bool:
        """True once the handshake completed (WELCOME sent or received)."""
        return self._state == _OPEN

    def hello(self) -> Hello | None:
        """The worker's HELLO (sent or received), once there is one."""
        return self._hello

    def welcome(self) -> Welcome | None:
        """The WELCOME (sent or received), once there is one: the connection's limits."""
        return self._welcome

    def max_frame_size(self) -> int:
        """The largest payload a frame may carry now (65,536 before the handshake)."""
        return self._mfs

    def in_flight(self) -> int:
        """Requests in flight (section 11.2, "Counting")."""
        return len(self._requests)

    def in_flight_ids(self) -> list[int]:
        """The ids of the requests in flight, oldest first: what a driver ends at end of input."""
        return list(self._requests)

    def is_in_flight(self, id: int) -> bool:
        return id in self._requests

    def can_send_request(self) -> bool:
        """Parent: a REQUEST would not be refused for the state, DRAIN or ``max_in_flight``."""
        return (self._is_parent and self._state == _OPEN and not self._draining
                and not self._goodbye and not self._fatal_sent
                and len(self._requests) < self._max_in_flight)

    def credit(self, id: int) -> int:
        """Stream ``id``'s credit counter (0 if it is not a stream in flight)."""
        req = self._requests.get(id)
        return req.credit if req is not None and req.kind == MethodKind.STREAM else 0

    def window(self, id: int) -> int:
        """Parent: stream ``id``'s window, the credit kept outstanding for it (``initial_credit``
        unless :meth:`consumed_at` adapted it, section 6); 0 if it is not a stream in flight."""
        req = self._requests.get(id)
        return req.window if req is not None and req.kind == MethodKind.STREAM else 0

    def can_send_rows(self, id: int) -> bool:
        """Worker: a ROWS frame for ``id`` would not be refused (a stream in flight with
        credit, no message of it being sent, the connection open)."""
        req = self._requests.get(id)
        return (req is not None and req.kind == MethodKind.STREAM and req.credit > 0
                and not self._is_parent and not self._goodbye and not self._fatal_sent
                and id not in self._outgoing)

    def is_draining(self) -> bool:
        """Parent: DRAIN sent; worker: DRAIN received."""
        return self._draining

    def is_goodbye(self) -> bool:
        """Parent: GOODBYE received; worker: GOODBYE sent. Nothing can be sent after it."""
        return self._goodbye

    def failure(self) -> ProtocolError | None:
        """The violation that failed the core (:meth:`next_event`, :meth:`end_of_input`)."""
        return self._failure

    def incomplete_frame_len(self) -> int:
        """Bytes received and not yet returned as events: once :meth:`next_event` has returned
        None, the part of a frame that has started and not finished (0 between frames). The
        driver's frame-progress clock (8.5) reads it."""
        return self._decoder.buffered

    # -- receiving --------------------------------------------------------------------------

    def receive(self, data: Buffer) -> None:
        """Received bytes (``bytes`` are referenced, other buffers copied)."""
        self._decoder.receive(data)

    def read_buffer(self) -> memoryview:
        """Where to read the next bytes (then call :meth:`received`): the missing part of a
        large frame's own buffer while one arrives (no copy), else a reused buffer."""
        return self._decoder.read_buffer()

    def received(self, n: int) -> None:
        """``n`` bytes were read into the view :meth:`read_buffer` returned."""
        self._decoder.received(n)

    def end_of_input(self) -> None:
        """The peer closed: raises TRUNCATED if it closed inside a frame (the core is then
        failed); otherwise fine. The driver ends what is in flight (:meth:`in_flight_ids`)."""
        try:
            self._decoder.end_of_input()
        except ProtocolError as e:
            if self._failure is None:
                self._failure = ProtocolError(e.code, e.message, id=e.id)
            raise

    def next_event(self) -> Frame | None:
        """The next event, or None when more bytes are needed."""
        dec = self._decoder
        handle = self._on_parent_frame if self._is_parent else self._on_worker_frame
        while True:
            try:
                frame = dec.next_frame()
                if frame is None:
                    return None
                event = handle(frame)
            except ProtocolError as e:
                self._fail(e)
                raise
            if event is not None:
                return event

    def next_events(self, out: list[Any]) -> None:
        """Append every event available now to ``out`` (a violation raises after the events
        before it were appended)."""
        next_event = self.next_event
        append = out.append
        while (ev := next_event()) is not None:
            append(ev)

    def _fail(self, e: ProtocolError) -> None:
        # The connection is dead: every later call re-raises, and the messages in progress
        # (up to max_message_size of them) are let go at once.
        self._decoder.die(e)
        if self._failure is None:
            self._failure = ProtocolError(e.code, e.message, id=e.id)
        self._incoming.clear()
        self._incoming_bytes = 0

    def _continue(self, f: Frame, asm: _Assembly) -> Frame | None:
        """A CONTINUATION for an id with a message in progress."""
        body = f.body  # type: ignore[attr-defined]
        asm.continued = True
        asm.size += len(body)
        if asm.size > self._mms:
            raise _fail(ErrorCode.MESSAGE_TOO_LARGE,
                        f"message for request {f.id} exceeds max_message_size "
                        f"{self._mms}", f.id)
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
        if self._incoming_bytes > self._mms:
            raise _fail(ErrorCode.MESSAGE_TOO_LARGE,
                        f"messages in progress hold {self._incoming_bytes} bytes, above "
                        f"max_message_size {self._mms} for the whole connection", id)

    def _unexpected(self, f: Frame, why: str) -> ProtocolError:
        return _fail(ErrorCode.UNEXPECTED_FRAME, f"{f.NAME} {why}", f.id)

    # The checks run in the order of PROTOCOL.md section 11.2 (and spec/vectors/generate.py):
    # handshake and direction, id, continuation, late, kind, counters.

    def _on_parent_frame(self, f: Frame) -> Frame | None:
        t = f.TYPE
        id = f.id
        if t == FrameType.ERROR and id == 0:
            return f  # a refusal or a fatal report: allowed at any time
        if self._hello is None:
            if t != FrameType.HELLO:
                raise self._unexpected(f, "before HELLO")
            if not f.min_version <= PROTOCOL_VERSION <= f.max_version:  # type: ignore[attr-defined]
                raise _fail(ErrorCode.VERSION_MISMATCH,
                            f"worker speaks versions {f.min_version}..{f.max_version}, "  # type: ignore[attr-defined]
                            f"this parent speaks {PROTOCOL_VERSION}")
            self._hello = f  # type: ignore[assignment]
            self._shm_offer = _shm_offer_in(f)  # type: ignore[arg-type]
            self._state = _HELLO_DONE
            return f
        if self._state != _OPEN:
            raise self._unexpected(f, "before WELCOME was sent")
        if t in _SHM_ID_RULE:  # decoded only once the lane is on
            if self._goodbye:
                raise self._unexpected(f, "after GOODBYE")
            return self._on_shm(f)  # type: ignore[arg-type]
        if t not in _PARENT_RECEIVES:
            raise self._unexpected(f, "cannot be sent to the parent")
        if t == FrameType.HELLO:
            raise self._unexpected(f, "a second time")
        if self._goodbye:
            raise self._unexpected(f, "after GOODBYE")
        if id == 0:  # PING, PONG, GOODBYE, EVENT for the connection
            if t == FrameType.GOODBYE:
                self._goodbye = True
            return f
        if id > self._last_id:
            raise _fail(ErrorCode.UNKNOWN_ID, f"{f.NAME} for request {id}, never sent", id)
        asm = self._incoming.get(id)
        if asm is not None:
            if t == FrameType.CONTINUATION:
                event = self._continue(f, asm)
                if event is not None:
                    self._requests.pop(id, None)
                return event
            if t == FrameType.ERROR:  # the worker abandons the result/summary it was sending
                self._drop_assembly(id)
                self._requests.pop(id, None)
                return f
            raise _fail(ErrorCode.CONTINUATION,
                        f"{f.NAME} for request {id} while its message is still arriving", id)
        if t == FrameType.CONTINUATION:
            raise _fail(ErrorCode.CONTINUATION, f"CONTINUATION for request {id} with no message", id)
        req = self._requests.get(id)
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
            del self._requests[id]
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
            del self._requests[id]
            return f
        if t == FrameType.ERROR:
            del self._requests[id]
        return f  # ERROR, EVENT

    def _on_worker_frame(self, f: Frame) -> Frame | None:
        t = f.TYPE
        id = f.id
        if t == FrameType.ERROR and id == 0:
            return f  # a refusal or a fatal report: allowed at any time
        if self._state != _OPEN:
            if self._state != _HELLO_DONE or t != FrameType.WELCOME:
                raise self._unexpected(f, "before the handshake completed")
            self._accept_welcome(f)  # type: ignore[arg-type]
            return f
        if t in _SHM_ID_RULE:  # decoded only once the lane is on
            return self._on_shm(f)  # type: ignore[arg-type]
        if t not in _WORKER_RECEIVES or t == FrameType.WELCOME or t == FrameType.ERROR:
            # The parent sends ERROR with id 0 only; a request is stopped with CANCEL.
            raise self._unexpected(f, "cannot be sent to the worker now")
        if id == 0:  # PING, PONG, DRAIN
            if t == FrameType.DRAIN:
                self._draining = True
            return f
        if t == FrameType.REQUEST:
            if id <= self._last_id:
                raise _fail(ErrorCode.DUPLICATE_ID,
                            f"REQUEST id {id} not above the last id {self._last_id}", id)
            self._last_id = id
            if f.more:
                self._start_assembly(f, f.body)  # type: ignore[attr-defined]
                return None
            return self._admit(f)  # type: ignore[arg-type]
        if id > self._last_id:
            raise _fail(ErrorCode.UNKNOWN_ID, f"{f.NAME} for request {id}, never received", id)
        asm = self._incoming.get(id)
        if asm is not None:
            if t == FrameType.CONTINUATION:
                event = self._continue(f, asm)
                return None if event is None else self._admit(event)  # type: ignore[arg-type]
            if t == FrameType.CANCEL:  # the parent abandons the request it was sending
                self._drop_assembly(id)
                self._rejected.add(id)
                return Reject(id, ErrorCode.CANCELLED)
            raise _fail(ErrorCode.CONTINUATION,
                        f"{f.NAME} for request {id} while its message is still arriving", id)
        if t == FrameType.CONTINUATION:
            raise _fail(ErrorCode.CONTINUATION, f"CONTINUATION for request {id} with no message", id)
        req = self._requests.get(id)
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
        code = self._reject_code(f.method, f.codec)
        if code is not None:
            self._rejected.add(f.id)
            return Reject(f.id, code)
        kind = self._hello.methods[f.method].kind  # type: ignore[union-attr]
        self._requests[f.id] = self._new_stream(kind)
        return f

    def _reject_code(self, method: int, codec: int) -> int | None:
        if self._draining:
            return ErrorCode.DRAINING
        methods = self._hello.methods  # type: ignore[union-attr]
        if method >= len(methods):
            return ErrorCode.UNKNOWN_METHOD
        if codec not in methods[method].codecs:
            return ErrorCode.CODEC_UNSUPPORTED
        if len(self._requests) >= self._max_in_flight:
            return ErrorCode.OVERLOADED
        return None

    def _accept_welcome(self, w: Welcome) -> None:
        h = self._hello
        assert h is not None
        if not h.min_version <= w.version <= h.max_version:
            raise _fail(ErrorCode.VERSION_MISMATCH,
                        f"WELCOME version {w.version} outside {h.min_version}..{h.max_version}")
        if w.max_frame_size > h.max_frame_size:
            raise _fail(ErrorCode.BAD_HANDSHAKE, "WELCOME max_frame_size above the worker's")
        if w.max_in_flight > h.max_concurrency:
            raise _fail(ErrorCode.BAD_HANDSHAKE, "WELCOME max_in_flight above max_concurrency")
        accept = _shm_accept_in(w)
        if accept is not None:
            accept.check(self._shm_offer)  # BAD_HANDSHAKE: not offered, or above the offer
        elif self._shm_early_fds:
            raise _fail(ErrorCode.SHM_BAD_DESCRIPTOR,
                        "a descriptor arrived, and the WELCOME turned the shm lane off")
        self._open(w)

    def _open(self, w: Welcome) -> None:
        self._welcome = w
        self._state = _OPEN
        self._mfs = w.max_frame_size
        self._decoder.max_frame_size = w.max_frame_size
        self._mms = w.max_message_size
        self._initial_credit = w.initial_credit
        self._max_in_flight = w.max_in_flight
        methods = self._hello.methods  # type: ignore[union-attr]
        # By method index: the codecs it accepts and its kind (take_requests' admission).
        self._accepts = [frozenset(m.codecs) for m in methods]
        self._kinds = [m.kind for m in methods]
        # A unary request's state never changes (credit and rows belong to streams, and every
        # path that would touch them checks the kind first): all unary requests share one.
        self._unary = _Stream(MethodKind.UNARY, w.initial_credit)
        accept = _shm_accept_in(w)
        if accept is not None and self._shm_offer is not None:
            to_me, to_peer = ((accept.to_parent_window, accept.to_worker_window) if self._is_parent
                              else (accept.to_worker_window, accept.to_parent_window))
            self._shm_in = Borrower(to_me)
            self._shm_out = Lender(to_peer)
            self._decoder.shm = True
            if self._shm_early_fds:
                self._shm_in.descriptors_received(self._shm_early_fds)
                self._shm_early_fds = 0

    def _new_stream(self, kind: int) -> _Stream:
        return self._unary if kind == MethodKind.UNARY else _Stream(kind, self._initial_credit)

    # -- the shared-memory lane (PROTOCOL.md 20.7) ----------------------------------------------

    def shm_is_on(self) -> bool:
        """The WELCOME accepted the shm lane (either direction may still have a window of 0)."""
        return self._shm_in is not None

    def shm_lender(self) -> Lender | None:
        """This side's regions and lent ranges (None while the lane is off): a driver reuses a
        region once ``is_lent(region)`` is False."""
        return self._shm_out

    def set_shm_mapper(self, mapper: Callable[[int, int], Any]) -> None:
        """The driver's mapper: for each SHM_REGION whose checks passed, the core calls
        ``mapper(region, size)``, which takes the oldest descriptor the driver queued, checks
        and maps it (``SHM_BAD_DESCRIPTOR`` fails the connection) and returns an object with
        ``lend(offset, length, on_release) -> memoryview`` and ``close()`` (e.g.
        :class:`wirepool._shm.Region`). The core keeps it until SHM_RETIRE."""
        self._shm_mapper = mapper

    def set_shm_release_waker(self, waker: Callable[[], None]) -> None:
        """Called (on any thread) when the last view of a lent range is dropped: the driver
        then writes :meth:`send_shm_releases` on its own thread."""
        self._shm_waker = waker

    def shm_descriptors_received(self, n: int) -> None:
        """Report the descriptors of one read (20.5), before its bytes. More than 8 waiting, or
        any where the lane is off (or was not offered), fails the connection
        (``SHM_BAD_DESCRIPTOR``); the driver closes them then."""
        if not n:
            return
        try:
            if self._shm_in is not None:
                self._shm_in.descriptors_received(n)
            elif (self._state != _OPEN and not self._is_parent and self._shm_offer is not None
                  and self._shm_early_fds + n <= _shm_proto.MAX_QUEUED_DESCRIPTORS):
                self._shm_early_fds += n  # the WELCOME in the same read decides
            else:
                raise _fail(ErrorCode.SHM_BAD_DESCRIPTOR,
                            f"{n} descriptors arrived where the shm lane is off")
        except ProtocolError as e:
            self._fail(e)
            raise

    def _on_shm(self, f: ShmFrame) -> Frame | None:
        t = f.TYPE
        if t == _shm_proto.SHM_BODY:
            return self._on_shm_body(f)
        borrower, lender = self._shm_in, self._shm_out
        assert borrower is not None and lender is not None  # the decoder knows them only then
        if t == _shm_proto.SHM_REGION:
            borrower.region(f.region, f.size)  # every frame check, then the descriptor's count
            if self._shm_mapper is None:
                raise _fail(ErrorCode.SHM_BAD_DESCRIPTOR,
                            f"SHM_REGION {f.region}: this side cannot map regions")
            self._shm_mapped[f.region] = self._shm_mapper(f.region, f.size)
        elif t == _shm_proto.SHM_RELEASE:
            lender.released(f.range)
        else:
            borrower.retire(f.region)
            mapped = self._shm_mapped.pop(f.region, None)
            if mapped is not None:
                mapped.close()  # views of it keep their own mappings
        return None

    def _on_shm_body(self, f: ShmFrame) -> Frame | None:
        """SHM_BODY: the last part of the message in progress for its id (20.3, 20.5)."""
        id = f.id
        if id > self._last_id:
            raise _fail(ErrorCode.UNKNOWN_ID, f"SHM_BODY for request {id}, above every id", id)
        asm = self._incoming.get(id)
        if asm is None:
            raise _fail(ErrorCode.CONTINUATION, f"SHM_BODY for request {id} with no message", id)
        if asm.continued or asm.fill:
            raise _fail(ErrorCode.CONTINUATION, f"SHM_BODY for request {id} after a body byte "
                        "or CONTINUATION of its message", id)
        r = f.range
        self._shm_in.body(id, r)  # type: ignore[union-attr]
        if asm.size + r.length > self._mms:
            raise _fail(ErrorCode.MESSAGE_TOO_LARGE, f"message for request {id} exceeds "
                        f"max_message_size {self._mms}", id)
        mapped = self._shm_mapped.get(r.region)
        if mapped is None:
            raise _fail(ErrorCode.SHM_BOUNDS, f"region {r.region} is not mapped", id)
        view = mapped.lend(r.offset, r.length, functools.partial(self._shm_view_dropped, r))
        self._drop_assembly(id)
        if asm.buf and self._spare is None:
            self._spare = asm.buf  # it held no body: still the reusable buffer
        first = asm.first
        if first.TYPE == FrameType.REQUEST:
            return self._admit(Request(id, first.method, first.codec, view,  # type: ignore[attr-defined]
                                       first.timeout_us))  # type: ignore[attr-defined]
        self._requests.pop(id, None)
        if first.TYPE == FrameType.RESULT:
            return Result(id, view)
        return End(id, first.row_count, view)  # type: ignore[attr-defined]

    def _shm_view_dropped(self, r: ShmRange) -> None:
        # Any thread (a view's finalizer): the release is sent by the driver's thread.
        self._shm_dropped.append(r)
        waker = self._shm_waker
        if waker is not None:
            waker()

    def has_shm_releases(self) -> bool:
        """Ranges whose views were dropped wait for :meth:`send_shm_releases`."""
        return bool(self._shm_dropped)

    def send_shm_releases(self) -> list[Buffer]:
        """The SHM_RELEASE of every range whose last view was dropped (each exactly once);
        nothing once the connection can send nothing more."""
        dropped = self._shm_dropped
        borrower = self._shm_in
        out = bytearray()
        sendable = not (self._fatal_sent or self._goodbye or self._failure is not None)
        while dropped:
            r = dropped.popleft()
            if borrower is None:
                continue
            borrower.release(r)
            if sendable:
                out += _hdr_pack(24, _shm_proto.SHM_RELEASE, 0, 0, 0)
                out += _SHM_RANGE.pack(r.region, 0, r.offset, r.length)
        return [bytes(out)] if out else []

    def _check_shm_send(self, what: str, id: int = 0) -> Lender:
        self._check_sendable(what, id)
        if self._shm_out is None:
            raise _refused(ErrorCode.UNEXPECTED_FRAME, f"{what}: the shm lane is off", id)
        return self._shm_out

    def send_shm_region(self, size: int) -> tuple[int, list[Buffer]]:
        """Announce a region of ``size`` bytes: returns its id and the SHM_REGION frame, whose
        first byte's write must carry the region's descriptor (20.5). Refused
        (``SHM_BAD_REGION``) when the peer's window or its 64 live regions cannot take it."""
        region = self._check_shm_send("SHM_REGION").announce(size)
        return region, [_hdr_pack(16, _shm_proto.SHM_REGION, 0, 0, 0)
                        + _SHM_REGION.pack(region, 0, size)]

    def send_shm_retire(self, region: int) -> list[Buffer]:
        """Withdraw a region none of whose ranges is lent; the driver may unmap it then."""
        self._check_shm_send("SHM_RETIRE").retire(region)
        return [_hdr_pack(8, _shm_proto.SHM_RETIRE, 0, 0, 0) + _SHM_REGION.pack(region, 0, 0)[:8]]

    def send_result_shm(self, id: int, r: ShmRange) -> list[Buffer]:
        """Worker: request ``id``'s RESULT whose body the driver wrote at ``r`` of one of its
        regions: RESULT with MORE and no body byte, then SHM_BODY. The checks of
        :meth:`send_result`, then the range (``SHM_BOUNDS``: not a live region of this side,
        or lent bytes above the window); a refusal changes nothing."""
        lender = self._check_shm_send("RESULT", id)
        self._check_terminal(FrameType.RESULT, id, 0, r.length)
        lender.lend(r)
        del self._requests[id]
        return [_hdr_pack(0, FrameType.RESULT, FLAG_MORE, 0, id)
                + _hdr_pack(24, _shm_proto.SHM_BODY, 0, 0, id)
                + _SHM_RANGE.pack(r.region, 0, r.offset, r.length)]

    def send_request_shm(self, method: int, codec: int, timeout_us: int,
                         r: ShmRange) -> tuple[int, list[Buffer]]:
        """Parent: a REQUEST whose body the driver wrote at ``r`` of one of its regions (the
        checks of :meth:`send_request`, then the range's); returns the id and the buffers."""
        self._check_request(method)
        lender = self._check_shm_send("REQUEST")
        if 12 + r.length > self._mms:
            raise _refused(ErrorCode.MESSAGE_TOO_LARGE, f"a request body of {r.length} bytes is "
                           f"above max_message_size {self._mms}")
        lender.lend(r)
        id = self._last_id = self._last_id + 1
        self._requests[id] = self._new_stream(self._hello.methods[method].kind)  # type: ignore[union-attr]
        return id, [_REQUEST_HEAD_pack(12, FrameType.REQUEST, FLAG_MORE, 0, id, method, codec, 0,
                                       timeout_us)
                    + _hdr_pack(24, _shm_proto.SHM_BODY, 0, 0, id)
                    + _SHM_RANGE.pack(r.region, 0, r.offset, r.length)]

    # -- batch operations (PROTOCOL.md 14.4: the same checks and effects as one at a time) ------

    def take_results(self, out: list[Any]) -> bool:
        """Parent: consume the complete single-frame RESULT frames of unary requests in flight
        at the front of the received bytes, appending ``id, body`` (flat) to ``out`` for each.

        Stops at the first frame :meth:`next_event` must see (any other type, a MORE flag, an
        id that is late or unknown, a frame not complete yet), which takes it from there.
        Returns True when it took every received byte (:meth:`next_event` would return None).
        """
        if (not self._is_parent or self._state != _OPEN or self._goodbye or self._incoming):
            return False
        front = self._decoder.front()
        if front is None:
            return False
        buf, pos = front
        end = len(buf)
        limit = self._mfs
        last = self._last_id
        in_flight = self._requests
        unary = self._unary
        append = out.append
        last_start = end - HEADER_SIZE
        while pos <= last_start:
            # Type, flags and reserved field as one number: a RESULT with no flag is _RESULT_TFR.
            length, tfr, id = _HEAD_unpack_from(buf, pos)
            start = pos + HEADER_SIZE
            stop = start + length
            if (tfr != _RESULT_TFR or length > limit or not 0 < id <= last or stop > end):
                break
            if in_flight.get(id) is not unary:  # late, or a stream (KIND_MISMATCH)
                break
            del in_flight[id]
            pos = stop
            append(id)
            append(buf[start:stop])
        self._decoder.skip_to(pos)
        return pos == end

    def received_results(self, n: int, out: list[Any]) -> bool:
        """Parent: :meth:`received` of ``n`` bytes, then :meth:`take_results` into ``out``, with
        the same checks and effects: the read of a caller waiting for one answer, whose
        common case (exactly one whole RESULT of a unary request in flight) takes no detour.
        Returns what :meth:`take_results` returns."""
        dec = self._decoder
        if (n > HEADER_SIZE and not dec._into_frame and dec._pos == len(dec._buf)
                and not dec._hdr and dec._big is None and dec._error is None
                and self._is_parent and self._state == _OPEN and not self._goodbye
                and not self._incoming):
            view = dec._read_view
            length, tfr, id = _HEAD_unpack_from(view, 0)  # type: ignore[arg-type]
            if (n == HEADER_SIZE + length and tfr == _RESULT_TFR and length <= self._mfs
                    and 0 < id <= self._last_id and self._requests.get(id) is self._unary):
                del self._requests[id]
                out.append(id)
                # A view, as take_results gives (the read buffer is reused: a copy).
                out.append(memoryview(bytes(view[HEADER_SIZE:n])))  # type: ignore[index]
                return True
        self.received(n)
        return self.take_results(out)

    def take_requests(self, out: list[Any]) -> bool:
        """Worker: consume the complete single-frame REQUEST frames at the front of the received
        bytes, appending for each accepted one ``(id, method, codec, timeout_us, body)`` (the
        driver runs it) and for each refused one its :class:`Reject` event, in order.

        Stops at the first frame :meth:`next_event` must see (any other type, a MORE flag, a
        frame not complete yet, anything it would report as a violation). Returns True when
        it took every received byte (:meth:`next_event` would return None now).
        """
        if self._is_parent or self._state != _OPEN or self._incoming:
            return False
        dec = self._decoder
        front = dec.front()
        if front is None:
            return False
        buf, pos = front
        end = len(buf)
        limit = self._mfs
        last = self._last_id
        accepts = self._accepts
        kinds = self._kinds
        unary = self._unary
        n_methods = len(accepts)
        in_flight = self._requests
        room = 0 if self._draining else self._max_in_flight
        append = out.append
        head = _REQUEST_HEAD_unpack_from
        last_start = end - 28  # a header and a REQUEST prefix from here on
        while pos <= last_start:
            # The header with its type, flags and reserved field read as one number (a REQUEST
            # with no flag and a zero reserved field is _REQUEST_TFR), then the prefix.
            length, tfr, id, method, codec, zero, timeout = head(buf, pos)
            stop = pos + HEADER_SIZE + length
            if (tfr != _REQUEST_TFR or zero or length > limit or length < 12 or id <= last
                    or stop > end):
                break
            if method < n_methods and len(in_flight) < room and codec in accepts[method]:
                in_flight[id] = unary if kinds[method] == _UNARY else \
                    _Stream(_STREAM, self._initial_credit)
                append((id, method, codec, timeout, buf[pos + 28:stop]))
            else:
                code = self._reject_code(method, codec)
                assert code is not None
                self._rejected.add(id)
                append(Reject(id, code))
            last = id
            pos = stop
        self._last_id = last
        dec.skip_to(pos)
        return pos == end

    def send_requests(self, method: int, codec: int,
                      bodies: Sequence[Buffer]) -> tuple[int, list[Buffer]]:
        """Parent: one REQUEST (no timeout) per body, ids consecutive; returns the first id and
        the buffers. The same checks as :meth:`send_request` for each, all made before any is
        sent (a refusal sends none)."""
        n = len(bodies)
        self._check_request(method, n)
        limit = self._mfs - 12
        mms = self._mms - 12
        small = True
        for b in bodies:
            size = len(b)
            if size > limit:
                small = False
                if size > mms:
                    raise _refused(ErrorCode.MESSAGE_TOO_LARGE,
                                   f"a request body of {size} bytes is above max_message_size "
                                   f"{self._mms}")
        first = self._last_id + 1
        if not small:
            parts: list[Buffer] = []
            for b in bodies:
                parts += self.send_request(method, codec, 0, b)[1]
            return first, parts
        ids = range(first, first + n)
        if n:
            self._last_id = ids[-1]
        self._requests.update(dict.fromkeys(ids, self._new_stream(
            self._hello.methods[method].kind)))  # type: ignore[union-attr]
        pack = _REQUEST_HEAD_pack
        return first, [b"".join([pack(12 + len(b), FrameType.REQUEST, 0, 0, id, method, codec, 0, 0)
                                 + b for id, b in zip(ids, bodies)])]

    def send_results(self, pairs: Sequence[Any],
                     bodies: Sequence[Buffer] | None = None) -> list[Buffer]:
        """Worker: one RESULT per ``(id, body)``; the same checks as :meth:`send_result` for
        each, all made before any is sent (a refusal sends none). ``send_results(ids, bodies)``
        is the same with the ids and the bodies in two sequences of one length (no pair built
        per result)."""
        ids: Sequence[Any]
        if bodies is None:
            if not pairs:
                return []
            ids, bodies = zip(*pairs)
        else:
            ids = pairs
            if len(ids) != len(bodies):
                raise ValueError("send_results: as many ids as bodies")
            if not ids:
                return []
        requests = self._requests
        if not (self._is_parent or self._goodbye or self._fatal_sent or self._outgoing):
            # The common case: unary requests in flight, one frame each. Each id is taken out
            # of the requests in flight in one pass (an id given twice is no longer in flight
            # the second time); when any was not a unary request in flight, they are put back
            # and the general path below refuses.
            unary = self._unary
            n = len(ids)
            popped = list(map(requests.pop, ids, _NONES))
            sizes = list(map(len, bodies))
            widest = max(sizes)
            if popped.count(unary) == n and widest <= self._mfs:
                if widest < 4096:
                    # Small results are joined into one buffer here (the driver writes it as
                    # it is: no loop over the results of a read in the driver's write).
                    pieces: list[Any] = [None] * (n + n)  # header, body, header, body, ...
                    pieces[::2] = map(_hdr_pack, sizes, _RESULTS, _ZEROS, _ZEROS, ids)
                    pieces[1::2] = bodies
                    return [b"".join(pieces)]
                out: list[Buffer] = []
                small: list[Buffer] = []
                add = small.append
                for id, body, size in zip(ids, bodies, sizes):
                    if size < 4096:
                        add(_hdr_pack(size, _RESULT, 0, 0, id))
                        add(body)
                    else:  # written as it is, not copied into a join
                        if small:
                            out.append(b"".join(small))
                            small.clear()
                        out.append(_hdr_pack(size, _RESULT, 0, 0, id))
                        out.append(body)
                if small:
                    out.append(b"".join(small))
                return out
            # Undo (ids in flight stay in order), and take the general path.
            if popped.count(None) != len(popped):
                for id, req in zip(ids, popped):
                    if req is not None:
                        requests[id] = req
                self._requests = requests = dict(sorted(requests.items()))
        pairs = list(zip(ids, bodies))
        out = []
        seen = set()
        for id, body in pairs:
            if id in seen:
                raise _refused(ErrorCode.UNKNOWN_ID, f"two results for request {id}", id)
            seen.add(id)
            self._check_terminal(FrameType.RESULT, id, 0, len(body))
        for id, body in pairs:
            out += self.send_result(id, body)
        return out

    # -- sending: checks shared by the typed operations ----------------------------------------

    def _check_sendable(self, what: str, id: int = 0) -> None:
        """The connection-level refusals: a fatal report or GOODBYE already, or no handshake."""
        if self._fatal_sent:
            raise _refused(ErrorCode.UNEXPECTED_FRAME, f"{what} after a fatal report", id)
        if self._goodbye:
            raise _refused(ErrorCode.UNEXPECTED_FRAME, f"{what} after GOODBYE", id)
        if self._state != _OPEN:
            raise _refused(ErrorCode.UNEXPECTED_FRAME, f"{what} before the handshake completed", id)

    def _check_side(self, parent: bool, what: str) -> None:
        if self._is_parent != parent:
            raise _refused(ErrorCode.UNEXPECTED_FRAME, f"the {self._role} cannot send {what}")

    def _check_request(self, method: int, n: int = 1) -> None:
        self._check_side(True, "REQUEST")
        self._check_sendable("REQUEST")
        if self._draining:
            raise _refused(ErrorCode.DRAINING, "no REQUEST after DRAIN")
        if method >= len(self._hello.methods):  # type: ignore[union-attr]
            raise _refused(ErrorCode.UNKNOWN_METHOD, f"method index {method} is not in HELLO")
        if len(self._requests) + n > self._max_in_flight:
            raise _refused(ErrorCode.OVERLOADED,
                           f"{len(self._requests)} requests in flight, max_in_flight "
                           f"{self._max_in_flight}")

    def _stream_in_flight(self, what: str, id: int) -> _Stream:
        """The request ``id`` a frame of this side concerns: in flight, no message of it being
        sent with :meth:`send` (CANCEL and ERROR may abandon one)."""
        req = self._requests.get(id)
        if req is None:
            raise _refused(ErrorCode.UNKNOWN_ID, f"{what} for request {id}, not in flight", id)
        if id in self._outgoing and what not in ("CANCEL", "ERROR"):
            raise _refused(ErrorCode.CONTINUATION,
                           f"{what} for request {id} while its message is being sent", id)
        return req

    def _check_terminal(self, ftype: int, id: int, row_count: int, body_len: int) -> _Stream:
        """RESULT or END for ``id``: every refusal of section 14.3, in its order."""
        self._check_side(False, _TYPE_NAMES[ftype])
        self._check_sendable(_TYPE_NAMES[ftype], id)
        req = self._stream_in_flight(_TYPE_NAMES[ftype], id)
        if ftype == FrameType.RESULT:
            if req.kind != MethodKind.UNARY:
                raise _refused(ErrorCode.KIND_MISMATCH, f"RESULT for stream request {id}", id)
            size = body_len
        else:
            if req.kind != MethodKind.STREAM:
                raise _refused(ErrorCode.KIND_MISMATCH, f"END for unary request {id}", id)
            size = body_len + 8
        if size > self._mms:
            what = "result" if ftype == FrameType.RESULT else "summary"
            raise _refused(ErrorCode.MESSAGE_TOO_LARGE,
                           f"the {what} of {size} bytes is above max_message_size {self._mms}", id)
        return req

    def _send_split(self, f: Frame) -> list[Buffer]:
        """A checked message, split into MORE + CONTINUATION frames when it is too large."""
        out: list[Buffer] = []
        for part in split_message(f, self._mfs):
            self._record_send(part)
            out += encode_frame_parts(part)
        return out

    # -- sending: the typed operations (PROTOCOL.md 14.3) ---------------------------------------

    def send_hello(self, hello: Hello) -> list[Buffer]:
        """Worker: the first frame."""
        return self.send(hello)

    def send_welcome(self, welcome: Welcome) -> list[Buffer]:
        """Parent: answer the HELLO; opens the connection with the WELCOME's limits."""
        return self.send(welcome)

    def refuse(self, code: int, message: str) -> list[Buffer]:
        """Parent: refuse the worker's HELLO (ERROR id 0, e.g. CODEC_MISMATCH); then close."""
        self._check_side(True, "a refusal")
        if self._state == _OPEN:
            raise _refused(ErrorCode.UNEXPECTED_FRAME, "refuse() after WELCOME: use send_fatal")
        return self.send_error(0, code, message)

    def send_fatal(self, error: WirepoolError) -> list[Buffer]:
        """Report a fatal error (ERROR id 0 with its code and message); nothing can be sent
        after it."""
        return self.send_error(0, error.code, error.message)

    def send_request(self, method: int, codec: int, timeout_us: int,
                     body: Buffer) -> tuple[int, list[Buffer]]:
        """Parent: a REQUEST with the next id (1, 2, 3, ...), split into CONTINUATION frames
        when the body is larger than one frame; returns the id and the buffers."""
        size = 12 + len(body)
        if (size <= self._mfs and self._state == _OPEN and self._is_parent and not self._draining
                and not self._goodbye and not self._fatal_sent
                and len(self._requests) < self._max_in_flight):
            methods = self._hello.methods  # type: ignore[union-attr]
            if method < len(methods):
                id = self._last_id = self._last_id + 1
                self._requests[id] = self._new_stream(methods[method].kind)
                head = _REQUEST_HEAD_pack(size, FrameType.REQUEST, 0, 0, id, method, codec, 0,
                                          timeout_us)
                if size < 4096:
                    return id, [head + body]
                return id, [head, body]
        self._check_request(method)
        if size > self._mms:
            raise _refused(ErrorCode.MESSAGE_TOO_LARGE,
                           f"a request body of {len(body)} bytes is above max_message_size "
                           f"{self._mms}")
        id = self._last_id + 1
        return id, self._send_split(Request(id, method, codec, body, timeout_us))

    def send_cancel(self, id: int) -> list[Buffer]:
        """Parent: stop request ``id``; it stays in flight until its terminal arrives."""
        return self.send(Cancel(id))

    def consumed(self, id: int, nbytes: int) -> tuple[int, list[Buffer]]:
        """Parent: the consumer has read (or dropped: section 14.3, rows nobody reads) ``nbytes``
        of stream ``id``'s ROWS payload. Applies the grant policy (a CREDIT once half the
        window is consumed since the last grant, never above 2^31-1: :func:`grant`, 14.5) and returns the bytes
        granted (0: none due, or the stream has ended) and the buffers to write."""
        req = self._requests.get(id)
        if (req is None or req.kind != MethodKind.STREAM or self._goodbye or self._fatal_sent
                or self._failure is not None):
            return 0, _NO_PARTS
        req.consumed += nbytes
        if id in self._outgoing:  # the REQUEST is still being sent: counted, nothing granted
            return 0, _NO_PARTS
        n = grant(req.window, req.credit, req.consumed)
        if n == 0:
            return 0, _NO_PARTS
        return n, self.send_credit(id, n)  # subtracts n from consumed; a capped rest waits

    def observe_rtt(self, rtt_us: int) -> None:
        """Parent: the driver measured a PING's round trip (``rtt_us`` microseconds, from its
        send to its PONG); :meth:`consumed_at` adapts windows to the smallest seen (section 6:
        a PONG that waited behind queued rows measures the queue, not the link)."""
        rtt = max(1, int(rtt_us))
        if self._min_rtt_us == 0 or rtt < self._min_rtt_us:
            self._min_rtt_us = rtt

    def set_window_caps(self, max_stream_window: int, max_connection_window: int) -> None:
        """Parent: section 6's caps on the adaptive windows (the defaults are
        ``adaptive_credit`` of ``spec/constants.json``); windows above them stay until they
        shrink."""
        self._max_stream_window = max_stream_window
        self._max_connection_window = max_connection_window

    def consumed_at(self, id: int, nbytes: int, now_us: int) -> tuple[int, list[Buffer]]:
        """Parent: :meth:`consumed` with the driver's clock (``now_us``, any monotonic origin),
        which adapts the stream's window at each grant (section 6, :func:`stream_window`): the
        grant is the consumed bytes plus the new window minus the old. Without a round trip
        observed (:meth:`observe_rtt`) the window stays ``initial_credit``."""
        req = self._requests.get(id)
        if (req is None or req.kind != MethodKind.STREAM or self._goodbye or self._fatal_sent
                or self._failure is not None):
            return 0, _NO_PARTS
        req.consumed += nbytes
        if req.clock < 0:
            req.clock = now_us  # the first read starts the stream's clock
        if id in self._outgoing:
            return 0, _NO_PARTS
        old = req.window
        if grant(old, req.credit, req.consumed) == 0:
            return 0, _NO_PARTS
        room = self._max_connection_window - sum(
            r.window for r in self._requests.values() if r.kind == MethodKind.STREAM)
        # Rows the consumer has not read yet (window - credit - consumed): a consumer behind on
        # what arrived drains a backlog, which says nothing of the window; it never grows then.
        behind = old - req.credit - req.consumed >= old // 4
        new = stream_window(old, self._initial_credit, now_us - req.clock, self._min_rtt_us,
                            self._max_stream_window, max(0, room))
        if behind and new > old:
            new = old
        want = req.consumed + new - old  # >= 0: a halving takes at most the half consumed
        n = max(0, min(want, MAX_CREDIT - req.credit))
        parts = self.send_credit(id, n) if n > 0 else _NO_PARTS  # a refusal changes nothing
        req.clock = now_us
        req.window = new
        req.consumed = want - n  # a capped rest waits for the next call
        return n, parts

    def send_credit(self, id: int, nbytes: int) -> list[Buffer]:
        """Parent: an explicit grant of ``nbytes`` to stream ``id`` (prefer :meth:`consumed`)."""
        return self.send(Credit(id, nbytes))

    def send_drain(self, grace_ms: int) -> list[Buffer]:
        """Parent: ask the worker to finish and say GOODBYE; no REQUEST can follow."""
        return self.send(Drain(grace_ms))

    def send_ping(self, nonce: Buffer) -> list[Buffer]:
        """A heartbeat (8 bytes of ``nonce``)."""
        return self.send(Ping(nonce))

    def send_pong(self, nonce: Buffer) -> list[Buffer]:
        """The answer to a PING, with its nonce."""
        return self.send(Pong(nonce))

    def send_result(self, id: int, body: Buffer) -> list[Buffer]:
        """Worker: the RESULT of unary request ``id`` (split when larger than one frame)."""
        req = self._requests.get(id)
        if (req is self._unary and len(body) <= self._mfs and not self._goodbye
                and not self._fatal_sent and id not in self._outgoing
                and not self._is_parent):
            del self._requests[id]
            head = _hdr_pack(len(body), FrameType.RESULT, 0, 0, id)
            if len(body) < 4096:
                return [head + body]
            return [head, body]
        self._check_terminal(FrameType.RESULT, id, 0, len(body))
        return self._send_split(Result(id, body))

    def send_end(self, id: int, summary: Buffer = b"") -> list[Buffer]:
        """Worker: the END of stream ``id``, with the row count the core kept."""
        req = self._check_terminal(FrameType.END, id, 0, len(summary))
        return self._send_split(End(id, req.rows, summary))

    def begin_request(self, method: int, codec: int, timeout_us: int,
                      body: Buffer) -> tuple[MessageCursor, list[Buffer]]:
        """Parent: like :meth:`send_request`, but only the first frame is returned; the rest
        follow one frame at a time from :meth:`send_next_frame`, so frames of other requests
        can go out between them (section 5). The request's id is ``cursor.id``."""
        self._check_request(method)
        if 12 + len(body) > self._mms:
            raise _refused(ErrorCode.MESSAGE_TOO_LARGE,
                           f"a request body of {len(body)} bytes is above max_message_size "
                           f"{self._mms}")
        return self._begin(Request(self._last_id + 1, method, codec, body, timeout_us))

    def begin_result(self, id: int, body: Buffer) -> tuple[MessageCursor, list[Buffer]]:
        """Worker: like :meth:`send_result`, one frame at a time (:meth:`send_next_frame`).
        The request ends with the last frame; an ERROR sent meanwhile abandons the result."""
        self._check_terminal(FrameType.RESULT, id, 0, len(body))
        return self._begin(Result(id, body))

    def begin_end(self, id: int, summary: Buffer = b"") -> tuple[MessageCursor, list[Buffer]]:
        """Worker: like :meth:`send_end`, one frame at a time (:meth:`send_next_frame`)."""
        req = self._check_terminal(FrameType.END, id, 0, len(summary))
        return self._begin(End(id, req.rows, summary))

    def _begin(self, f: Frame) -> tuple[MessageCursor, list[Buffer]]:
        frames = split_message(f, self._mfs)
        parts = self.send(frames[0])
        return MessageCursor(f.id, frames), parts

    def send_next_frame(self, cursor: MessageCursor) -> tuple[bool, list[Buffer]]:
        """The next CONTINUATION of a message started with ``begin_*``: returns whether it was
        the last (then the call is a no-op) and the buffers to write. Refused with
        ``CONTINUATION`` when the message was abandoned meanwhile (CANCEL sent by the parent,
        ERROR sent by the worker)."""
        frames = cursor._frames
        i = cursor._next
        if i == len(frames):
            return True, _NO_PARTS
        if cursor.id not in self._outgoing:
            raise _refused(ErrorCode.CONTINUATION,
                           f"the message of request {cursor.id} was abandoned", cursor.id)
        parts = self.send(frames[i])
        cursor._next = i + 1
        return cursor._next == len(frames), parts

    def rows(self, id: int, target: int | None = None) -> RowsBuilder:
        """Worker: a builder for one ROWS frame of stream ``id`` (see :class:`RowsBuilder`),
        its payload kept within ``target`` bytes when given (smaller frames than the limit keep
        a consumer's unread rows few). Nothing is checked until :meth:`RowsBuilder.finish`."""
        mfs = self._mfs
        return RowsBuilder(self, id, mfs if target is None else target, mfs)

    def _rows_sent(self, id: int, size: int, count: int) -> None:
        """A finished ROWS frame: the checks of a ROWS send, then the credit and row count."""
        self._check_side(False, "ROWS")
        self._check_sendable("ROWS", id)
        req = self._stream_in_flight("ROWS", id)
        if req.kind != MethodKind.STREAM:
            raise _refused(ErrorCode.KIND_MISMATCH, f"ROWS for unary request {id}", id)
        if req.credit <= 0:
            raise _refused(ErrorCode.FLOW_CONTROL, f"ROWS for request {id} without credit", id)
        if size > self._mfs:
            raise _refused(ErrorCode.FRAME_TOO_LARGE,
                           f"ROWS payload of {size} bytes above max_frame_size {self._mfs}", id)
        req.credit -= size
        req.rows += count

    def send_error(self, id: int, code: int, message: str = "", details: str = "") -> list[Buffer]:
        """Worker: the ERROR terminal of request ``id`` (also the answer to a :class:`Reject`);
        id 0 is a fatal report (either side). An ERROR cannot be continued: details too large
        for one frame are fitted by :func:`fit_error` (14.5)."""
        m, d = fit_error(message, details, self._mfs)
        return self.send(ErrorFrame(id, code, m, d))

    def send_event(self, id: int, topic: str, data: str = "") -> list[Buffer]:
        """Worker: progress or a notification (id 0: for the connection); ``topic`` 1-255
        bytes. Coalesce them (about one per 10 ms)."""
        return self.send(Event(id, topic, data))

    def send_goodbye(self, reason: int = 0) -> list[Buffer]:
        """Worker: the last frame."""
        return self.send(Goodbye(reason))

    def send(self, f: Frame) -> list[Buffer]:
        """Any single frame, with every check of the typed operations (tests, fuzzing, the
        vectors' ``send`` steps, which give REQUEST ids and END row counts explicitly).
        Returns its encoded pieces; a refusal raises :class:`ProtocolError`."""
        parts = encode_frame_parts(f)
        size = -HEADER_SIZE
        for p in parts:
            size += len(p)
        if size > self._mfs:
            raise _refused(ErrorCode.FRAME_TOO_LARGE,
                           f"{f.NAME} payload of {size} bytes exceeds max_frame_size "
                           f"{self._mfs}: split it", f.id)
        self._check_send(f, size)
        self._record_send(f, size)
        return parts

    def _check_send(self, f: Frame, size: int) -> None:
        """Every refusal of section 14.3 for the frame ``f`` (a payload of ``size`` bytes),
        without changing anything."""
        t = f.TYPE
        id = f.id
        name = f.NAME
        if t == FrameType.ERROR and id == 0:
            if self._fatal_sent:
                raise _refused(ErrorCode.UNEXPECTED_FRAME, "ERROR after a fatal report")
            if self._goodbye:
                raise _refused(ErrorCode.UNEXPECTED_FRAME, "ERROR after GOODBYE")
            return
        if t == FrameType.HELLO:
            self._check_side(False, name)
            if self._state != _START:
                raise _refused(ErrorCode.UNEXPECTED_FRAME, "HELLO is sent once, first")
            return
        if t == FrameType.WELCOME:
            self._check_side(True, name)
            if self._state != _HELLO_DONE or self._fatal_sent:
                raise _refused(ErrorCode.UNEXPECTED_FRAME, "WELCOME needs a HELLO first, and only once")
            h = self._hello
            assert h is not None
            if not h.min_version <= f.version <= h.max_version:  # type: ignore[attr-defined]
                raise _refused(ErrorCode.VERSION_MISMATCH, "WELCOME version outside the worker's range")
            if f.max_frame_size > h.max_frame_size or f.max_in_flight > h.max_concurrency:  # type: ignore[attr-defined]
                raise _refused(ErrorCode.BAD_HANDSHAKE, "WELCOME limits above the worker's")
            accept = _shm_accept_in(f)  # type: ignore[arg-type]
            if accept is not None:
                accept.check(self._shm_offer)
            return
        if t not in (_PARENT_SENDS if self._is_parent else _WORKER_SENDS) or (
                t == FrameType.ERROR and self._is_parent):
            raise _refused(ErrorCode.UNEXPECTED_FRAME, f"the {self._role} cannot send {name}", id)
        self._check_sendable(name, id)
        if id == 0:  # PING, PONG, DRAIN, GOODBYE, EVENT 0
            if t in (FrameType.PING, FrameType.PONG, FrameType.DRAIN, FrameType.GOODBYE,
                     FrameType.EVENT):
                return
            raise _refused(ErrorCode.UNEXPECTED_FRAME, f"{name} needs a request id")
        if t in (FrameType.PING, FrameType.PONG, FrameType.DRAIN, FrameType.GOODBYE):
            raise _refused(ErrorCode.UNEXPECTED_FRAME, f"{name} carries id 0")
        if t == FrameType.REQUEST:
            if id <= self._last_id:
                raise _refused(ErrorCode.DUPLICATE_ID,
                               f"request id {id} not above the last id {self._last_id}", id)
            self._check_request(f.method)  # type: ignore[attr-defined]
            if size > self._mms:
                raise _refused(ErrorCode.MESSAGE_TOO_LARGE,
                               f"a REQUEST of {size} bytes is above max_message_size {self._mms}", id)
            return
        if t == FrameType.CONTINUATION:
            sent = self._outgoing.get(id)
            if sent is None:
                raise _refused(ErrorCode.CONTINUATION,
                               f"CONTINUATION for request {id} with no message being sent", id)
            if sent + size > self._mms:
                raise _refused(ErrorCode.MESSAGE_TOO_LARGE,
                               f"the message of request {id} would exceed max_message_size "
                               f"{self._mms}", id)
            return
        if t == FrameType.ERROR and id in self._rejected:
            return  # the answer to a REJECT
        req = self._stream_in_flight(name, id)
        if t == FrameType.CANCEL or t == FrameType.EVENT or t == FrameType.ERROR:
            return
        if t == FrameType.CREDIT:
            if req.kind != MethodKind.STREAM:
                raise _refused(ErrorCode.KIND_MISMATCH, f"CREDIT for unary request {id}", id)
            if f.bytes < 1:  # type: ignore[attr-defined]
                raise _refused(ErrorCode.BAD_PAYLOAD, "CREDIT of 0 bytes", id)
            if req.credit + f.bytes > MAX_CREDIT:  # type: ignore[attr-defined]
                raise _refused(ErrorCode.CREDIT_OVERFLOW,
                               f"credit of request {id} would exceed 2^31-1", id)
            return
        if t == FrameType.ROWS:
            if req.kind != MethodKind.STREAM:
                raise _refused(ErrorCode.KIND_MISMATCH, f"ROWS for unary request {id}", id)
            if req.credit <= 0:
                raise _refused(ErrorCode.FLOW_CONTROL, f"ROWS for request {id} without credit", id)
            return
        body_len = size - 8 if t == FrameType.END else size
        self._check_terminal(t, id, 0, body_len)
        if t == FrameType.END and f.row_count != req.rows:  # type: ignore[attr-defined]
            raise _refused(ErrorCode.ROW_COUNT_MISMATCH,
                           f"END row_count {f.row_count} but {req.rows} rows were sent", id)  # type: ignore[attr-defined]

    def _record_send(self, f: Frame, size: int = -1) -> None:
        """The state change of sending the checked frame ``f``."""
        t = f.TYPE
        id = f.id
        if t == FrameType.ERROR:
            if id == 0:
                self._fatal_sent = True
                return
            self._outgoing.pop(id, None)
            if self._requests.pop(id, None) is None:
                self._rejected.discard(id)
            return
        if t == FrameType.HELLO:
            self._hello = f  # type: ignore[assignment]
            self._shm_offer = _shm_offer_in(f)  # type: ignore[arg-type]
            self._state = _HELLO_DONE
        elif t == FrameType.WELCOME:
            self._open(f)  # type: ignore[arg-type]
        elif t == FrameType.DRAIN:
            self._draining = True
        elif t == FrameType.GOODBYE:
            self._goodbye = True
        elif t == FrameType.REQUEST:
            self._last_id = id
            self._requests[id] = self._new_stream(self._hello.methods[f.method].kind)  # type: ignore[union-attr,attr-defined]
            if f.more:
                self._outgoing[id] = size if size >= 0 else 12 + len(f.body)  # type: ignore[attr-defined]
        elif t == FrameType.CANCEL:
            self._outgoing.pop(id, None)
        elif t == FrameType.CREDIT:
            req = self._requests[id]
            req.credit += f.bytes  # type: ignore[attr-defined]
            req.consumed = max(0, req.consumed - f.bytes)  # type: ignore[attr-defined]
        elif t == FrameType.ROWS:
            req = self._requests[id]
            req.credit -= f.payload_size  # type: ignore[attr-defined]
            req.rows += f.count  # type: ignore[attr-defined]
        elif t == FrameType.RESULT or t == FrameType.END:
            if f.more:  # still in flight (and counted) until its last CONTINUATION
                self._outgoing[id] = size if size >= 0 else len(_message_body(f)) + _PREFIX_SIZE[t]
            else:
                del self._requests[id]
        elif t == FrameType.CONTINUATION:
            if f.more:
                self._outgoing[id] += size if size >= 0 else len(f.body)  # type: ignore[attr-defined]
            else:
                del self._outgoing[id]
                if not self._is_parent:
                    self._requests.pop(id, None)


def _message_body(f: Frame) -> Buffer:
    return f.summary if f.TYPE == FrameType.END else f.body  # type: ignore[attr-defined]


# Frame types each side may send once the connection is open (section 12.1).
_PARENT_SENDS = frozenset((FrameType.REQUEST, FrameType.CANCEL, FrameType.CREDIT, FrameType.PING,
                           FrameType.PONG, FrameType.DRAIN, FrameType.CONTINUATION,
                           FrameType.ERROR))
_WORKER_SENDS = frozenset((FrameType.RESULT, FrameType.ERROR, FrameType.ROWS, FrameType.END,
                           FrameType.EVENT, FrameType.PING, FrameType.PONG,
                           FrameType.CONTINUATION, FrameType.GOODBYE))
