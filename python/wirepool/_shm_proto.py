"""The shared-memory extension's protocol state (PROTOCOL.md section 20), sans-IO.

The Python twin of ``wirepool_proto::shm``: the extension block of HELLO/WELCOME, the payloads
of the four frames, and the bookkeeping of each side of one direction, the :class:`Lender` (the
owner of regions: what it announced and lent) and the :class:`Borrower` (the receiver: regions it
may map, ranges it holds, descriptors waiting), with every check of 20.5 in the spec's order and
its typed code. Memory files, descriptors and mappings are :mod:`wirepool._shm`'s::

    owner, receiver = Lender(1 << 30), Borrower(1 << 30)
    region = owner.announce(1 << 20)          # the driver sends SHM_REGION + its descriptor
    receiver.descriptors_received(1)          # recvmsg returned the descriptor
    receiver.region(region, 1 << 20)          # the SHM_REGION frame arrived: map it
    r = ShmRange(region, 0, 4096)
    owner.lend(r)                             # the driver sends SHM_BODY
    receiver.body(5, r)                       # request 5's body: a view of it
    receiver.release(r)                       # the view was dropped: send SHM_RELEASE
    owner.released(r)                         # the owner may write there again
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from ._constants import SHM_MAX_LIVE_REGIONS, SHM_MAX_QUEUED_DESCRIPTORS, SHM_TAG
from .errors import ErrorCode, ProtocolError

__all__ = [
    "MAX_LIVE_REGIONS", "MAX_QUEUED_DESCRIPTORS", "SHM_BODY", "SHM_REGION", "SHM_RELEASE",
    "SHM_RETIRE", "TAG_SHM", "Borrower", "Lender", "ShmAccept", "ShmFrame", "ShmOffer", "ShmRange",
    "encode_extension", "parse_extensions",
]

TAG_SHM = SHM_TAG
MAX_LIVE_REGIONS = SHM_MAX_LIVE_REGIONS
MAX_QUEUED_DESCRIPTORS = SHM_MAX_QUEUED_DESCRIPTORS
SHM_REGION, SHM_RELEASE, SHM_RETIRE, SHM_BODY = 0x50, 0x51, 0x52, 0x7E
_PAYLOAD = {SHM_REGION: 16, SHM_RELEASE: 24, SHM_RETIRE: 8, SHM_BODY: 24}
_HEADER = struct.Struct("<IBBHQ")


def _fail(code: ErrorCode, message: str, id: int = 0) -> ProtocolError:
    return ProtocolError(code, message, id=id)


def parse_extensions(trailing: bytes | memoryview) -> list[tuple[int, bytes]]:
    """The entries ``(tag, data)`` of the trailing bytes of a HELLO or WELCOME (20.1).

    Never an error: a reader that knows extensions stays a version 1 reader, so bytes that are
    not an extension block (an entry running past the end, a tag twice) give no entries.
    """
    data = bytes(trailing)
    out: list[tuple[int, bytes]] = []
    at = 0
    while at < len(data):
        if len(data) - at < 4:
            return []
        tag, length = struct.unpack_from("<HH", data, at)
        if at + 4 + length > len(data) or any(t == tag for t, _ in out):
            return []
        out.append((tag, data[at + 4:at + 4 + length]))
        at += 4 + length
    return out


def encode_extension(tag: int, data: bytes) -> bytes:
    """One extension entry: ``tag u16, length u16, data``."""
    return struct.pack("<HH", tag, len(data)) + data


@dataclass(frozen=True)
class ShmOffer:
    """The worker's offer in HELLO: bytes of the parent's regions it accepts at once (0: none)."""

    window: int

    @classmethod
    def decode(cls, data: bytes) -> ShmOffer | None:
        """None when shorter than 8 bytes: the entry is ignored (20.1)."""
        return cls(struct.unpack_from("<Q", data)[0]) if len(data) >= 8 else None

    def encode(self) -> bytes:
        return encode_extension(TAG_SHM, struct.pack("<Q", self.window))


@dataclass(frozen=True)
class ShmAccept:
    """The parent's acceptance in WELCOME: the window of each direction (0: that one is off)."""

    to_worker_window: int
    to_parent_window: int

    @classmethod
    def decode(cls, data: bytes) -> ShmAccept | None:
        """None when shorter than 16 bytes: the entry is ignored (20.1)."""
        return cls(*struct.unpack_from("<QQ", data)) if len(data) >= 16 else None

    def check(self, offer: ShmOffer | None) -> None:
        """The worker's check against its HELLO: not offered, or above the offer: BAD_HANDSHAKE."""
        if offer is None:
            raise _fail(ErrorCode.BAD_HANDSHAKE,
                        "WELCOME accepts shm, which the HELLO did not offer")
        if self.to_worker_window > offer.window:
            raise _fail(ErrorCode.BAD_HANDSHAKE, f"WELCOME's to_worker_window "
                        f"{self.to_worker_window} is above the HELLO's window {offer.window}")

    def encode(self) -> bytes:
        return encode_extension(TAG_SHM, struct.pack("<QQ", self.to_worker_window,
                                                     self.to_parent_window))


class ShmRange(NamedTuple):
    """A range of a region: what SHM_BODY lends and SHM_RELEASE gives back."""

    region: int
    offset: int
    length: int


class ShmFrame(NamedTuple):
    """A decoded extension frame: ``size`` for SHM_REGION, ``offset``/``length`` for
    SHM_RELEASE and SHM_BODY; the other fields are 0."""

    type: int
    id: int
    region: int
    size: int = 0
    offset: int = 0
    length: int = 0

    @classmethod
    def decode(cls, frame_type: int, id: int, payload: bytes | memoryview) -> ShmFrame:
        """Decodes a payload whose header was checked: another size is BAD_PAYLOAD, the
        reserved field not 0 RESERVED_NONZERO."""
        want = _PAYLOAD.get(frame_type)
        if want is None:
            raise _fail(ErrorCode.UNKNOWN_FRAME_TYPE, f"frame type {frame_type:#04x}", id)
        if len(payload) != want:
            raise _fail(ErrorCode.BAD_PAYLOAD, f"frame type {frame_type:#04x} needs exactly "
                        f"{want} payload bytes, got {len(payload)}", id)
        region, reserved = struct.unpack_from("<II", payload)
        if reserved:
            raise _fail(ErrorCode.RESERVED_NONZERO, "the reserved field of an shm frame is not 0",
                        id)
        if frame_type == SHM_REGION:
            return cls(frame_type, id, region, size=struct.unpack_from("<Q", payload, 8)[0])
        if frame_type == SHM_RETIRE:
            return cls(frame_type, id, region)
        offset, length = struct.unpack_from("<QQ", payload, 8)
        return cls(frame_type, id, region, offset=offset, length=length)

    @property
    def range(self) -> ShmRange:
        return ShmRange(self.region, self.offset, self.length)

    def encode(self) -> bytes:
        """The whole frame, header and payload."""
        if self.type == SHM_REGION:
            payload = struct.pack("<IIQ", self.region, 0, self.size)
        elif self.type == SHM_RETIRE:
            payload = struct.pack("<II", self.region, 0)
        else:
            payload = struct.pack("<IIQQ", self.region, 0, self.offset, self.length)
        return _HEADER.pack(len(payload), self.type, 0, 0, self.id) + payload


class _Ledger:
    """Live regions and lent ranges of one direction, with their byte sums."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.last_region = 0
        self.sizes: dict[int, int] = {}
        self.live_bytes = 0
        self.lent: Counter[ShmRange] = Counter()
        self.lent_bytes = 0

    def check_range(self, r: ShmRange, id: int) -> None:
        size = self.sizes.get(r.region)
        if size is None:
            raise _fail(ErrorCode.SHM_BOUNDS, f"region {r.region} is not live", id)
        if r.length == 0 or r.offset + r.length > size:
            raise _fail(ErrorCode.SHM_BOUNDS, f"bytes {r.offset} + {r.length} of region "
                        f"{r.region} of {size} bytes", id)
        if self.lent_bytes + r.length > self.window:
            raise _fail(ErrorCode.SHM_BOUNDS, f"{self.lent_bytes} bytes lent plus {r.length} "
                        f"above the window {self.window}", id)
        self.lent[r] += 1
        self.lent_bytes += r.length

    def give_back(self, r: ShmRange) -> bool:
        if self.lent[r] == 0:  # a Counter answers 0 for a range it never held
            return False
        self.lent[r] -= 1
        if not self.lent[r]:
            del self.lent[r]
        self.lent_bytes -= r.length
        return True

    def lent_in(self, region: int) -> bool:
        return any(r.region == region for r in self.lent)


class Lender:
    """The owner's side of one direction: regions it announced and ranges it lent, within the
    window. Its refusals are local: the driver must not send what it refuses."""

    def __init__(self, window: int) -> None:
        self._l = _Ledger(window)

    def can_announce(self, size: int) -> bool:
        return (size > 0 and len(self._l.sizes) < MAX_LIVE_REGIONS
                and self._l.live_bytes + size <= self._l.window
                and self._l.last_region < 2**32 - 1)

    def announce(self, size: int) -> int:
        """A new region's id (then send SHM_REGION and its descriptor); SHM_BAD_REGION when it
        would not fit."""
        if not self.can_announce(size):
            raise _fail(ErrorCode.SHM_BAD_REGION, f"a region of {size} bytes does not fit: "
                        f"{len(self._l.sizes)} live regions of {self._l.live_bytes} bytes, "
                        f"window {self._l.window}")
        self._l.last_region += 1
        self._l.sizes[self._l.last_region] = size
        self._l.live_bytes += size
        return self._l.last_region

    def lend(self, r: ShmRange) -> None:
        """Records a range lent by SHM_BODY; SHM_BOUNDS when it is not a range of a live region
        or would take the lent bytes above the window."""
        self._l.check_range(r, 0)

    def released(self, r: ShmRange) -> None:
        """A SHM_RELEASE arrived: SHM_BAD_RELEASE unless it names a lent range exactly."""
        if not self._l.give_back(r):
            raise _fail(ErrorCode.SHM_BAD_RELEASE, f"SHM_RELEASE of {r}, which is not lent")

    def retire(self, region: int) -> int:
        """Withdraws a region (then send SHM_RETIRE); refused while a range of it is lent."""
        if self._l.lent_in(region):
            raise _fail(ErrorCode.SHM_BAD_RELEASE, f"region {region} still has lent ranges")
        size = self._l.sizes.pop(region, None)
        if size is None:
            raise _fail(ErrorCode.SHM_BAD_RELEASE, f"region {region} is not live")
        self._l.live_bytes -= size
        return size

    def is_lent(self, region: int) -> bool:
        return self._l.lent_in(region)

    @property
    def lent_bytes(self) -> int:
        return self._l.lent_bytes

    @property
    def live_bytes(self) -> int:
        return self._l.live_bytes


class Borrower:
    """The receiver's side of one direction. Its errors are the peer's violations (fatal)."""

    def __init__(self, window: int) -> None:
        self._l = _Ledger(window)
        self.queued_descriptors = 0

    def descriptors_received(self, n: int) -> None:
        """``n`` descriptors came with one read; more than 8 waiting is SHM_BAD_DESCRIPTOR."""
        if self.queued_descriptors + n > MAX_QUEUED_DESCRIPTORS:
            raise _fail(ErrorCode.SHM_BAD_DESCRIPTOR, f"{self.queued_descriptors + n} "
                        f"descriptors waiting for a SHM_REGION (at most {MAX_QUEUED_DESCRIPTORS})")
        self.queued_descriptors += n

    def region(self, region: int, size: int) -> None:
        """A SHM_REGION arrived; then take the oldest descriptor and check and map it. In order:
        id order, size 0, 64 live, the window (SHM_BAD_REGION); no descriptor (SHM_BAD_DESCRIPTOR).
        """
        ledger = self._l
        if region <= ledger.last_region:
            raise _fail(ErrorCode.SHM_BAD_REGION,
                        f"region id {region} is not above the last, {ledger.last_region}")
        if size == 0:
            raise _fail(ErrorCode.SHM_BAD_REGION, f"region {region} has size 0")
        if len(ledger.sizes) >= MAX_LIVE_REGIONS:
            raise _fail(ErrorCode.SHM_BAD_REGION, f"{MAX_LIVE_REGIONS} regions are already live")
        if ledger.live_bytes + size > ledger.window:
            raise _fail(ErrorCode.SHM_BAD_REGION, f"region {region} of {size} bytes: live "
                        f"regions would exceed the window {ledger.window}")
        if self.queued_descriptors == 0:
            raise _fail(ErrorCode.SHM_BAD_DESCRIPTOR,
                        f"no descriptor arrived with SHM_REGION {region}")
        self.queued_descriptors -= 1
        ledger.last_region = region
        ledger.sizes[region] = size
        ledger.live_bytes += size

    def body(self, id: int, r: ShmRange) -> None:
        """A SHM_BODY for request ``id``: SHM_BOUNDS for a region not live, an empty range, one
        past the region, or held bytes above the window."""
        self._l.check_range(r, id)

    def release(self, r: ShmRange) -> None:
        """The last view of a held range was dropped: send SHM_RELEASE for it."""
        if not self._l.give_back(r):
            raise _fail(ErrorCode.SHM_BAD_RELEASE, f"{r} is not held")

    def retire(self, region: int) -> None:
        """A SHM_RETIRE arrived: SHM_BAD_RELEASE for a region not live or still held here."""
        if self._l.lent_in(region):
            raise _fail(ErrorCode.SHM_BAD_RELEASE,
                        f"SHM_RETIRE of region {region}, a range of which is still held")
        size = self._l.sizes.pop(region, None)
        if size is None:
            raise _fail(ErrorCode.SHM_BAD_RELEASE,
                        f"SHM_RETIRE of region {region}, which is not live")
        self._l.live_bytes -= size

    @property
    def held_bytes(self) -> int:
        return self._l.lent_bytes

    @property
    def live_bytes(self) -> int:
        return self._l.live_bytes
