"""The shared-memory extension's vectors (PROTOCOL.md section 20): spec/vectors/shm.json.

Written straight from section 20, stdlib only, sharing no code with any SDK (like generate.py,
which imports this module and writes and checks shm.json with the other files). It holds a
reference parser of the extension block, a reference decoder of the four frames' payloads, and a
reference borrower (the receiver's checks of 20.5, in order); every case states its outcome by
hand and the generator refuses a case they do not reproduce.
"""

from __future__ import annotations

import struct

TAG_SHM = 1
MAX_LIVE_REGIONS = 64
MAX_QUEUED_DESCRIPTORS = 8
TYPES = {"SHM_REGION": 0x50, "SHM_RELEASE": 0x51, "SHM_RETIRE": 0x52, "SHM_BODY": 0x7E}
SIZES = {"SHM_REGION": 16, "SHM_RELEASE": 24, "SHM_RETIRE": 8, "SHM_BODY": 24}
CODES = {"BAD_PAYLOAD": 106, "RESERVED_NONZERO": 105, "BAD_HANDSHAKE": 119,
         "SHM_BAD_REGION": 123, "SHM_BAD_DESCRIPTOR": 124, "SHM_BOUNDS": 125,
         "SHM_BAD_RELEASE": 126}


class Refused(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def error(name: str | None) -> dict | None:
    return None if name is None else {"code": CODES[name], "name": name}


# --- reference: the extension block (20.1) and the shm entries (20.2)

def parse_block(data: bytes) -> list[dict]:
    """The entries, or none when the bytes are not an extension block (ignored as a whole)."""
    entries: list[dict] = []
    at = 0
    while at < len(data):
        if len(data) - at < 4:
            return []
        tag, length = struct.unpack_from("<HH", data, at)
        if at + 4 + length > len(data) or any(e["tag"] == tag for e in entries):
            return []
        entries.append({"tag": tag, "data": data[at + 4:at + 4 + length].hex()})
        at += 4 + length
    return entries


def shm_fields(entries: list[dict], side: str) -> dict | None:
    """The shm entry's fields in a HELLO or WELCOME block, or None without one (or with one
    too short for its fields, which is ignored)."""
    entry = next((e for e in entries if e["tag"] == TAG_SHM), None)
    if entry is None:
        return None
    data = bytes.fromhex(entry["data"])
    need = 8 if side == "hello" else 16
    if len(data) < need:
        return None
    if side == "hello":
        return {"window": struct.unpack_from("<Q", data)[0]}
    worker, parent = struct.unpack_from("<QQ", data)
    return {"to_worker_window": worker, "to_parent_window": parent}


def check_welcome(hello: dict | None, welcome: dict | None) -> None:
    if welcome is None:
        return
    if hello is None or welcome["to_worker_window"] > hello["window"]:
        raise Refused("BAD_HANDSHAKE")


# --- reference: the frames (20.3)

def encode_frame(f: dict) -> bytes:
    t = f["type"]
    if t == "SHM_REGION":
        payload = struct.pack("<IIQ", f["region"], 0, f["size"])
    elif t == "SHM_RETIRE":
        payload = struct.pack("<II", f["region"], 0)
    else:
        payload = struct.pack("<IIQQ", f["region"], 0, f["offset"], f["length"])
    return struct.pack("<IBBHQ", len(payload), TYPES[t], 0, 0, f["id"]) + payload


def decode_payload(type_name: str, ident: int, payload: bytes) -> dict:
    if len(payload) != SIZES[type_name]:
        raise Refused("BAD_PAYLOAD")
    region, reserved = struct.unpack_from("<II", payload)
    if reserved:
        raise Refused("RESERVED_NONZERO")
    f: dict = {"type": type_name, "id": ident, "region": region}
    if type_name == "SHM_REGION":
        f["size"] = struct.unpack_from("<Q", payload, 8)[0]
    elif type_name in ("SHM_RELEASE", "SHM_BODY"):
        f["offset"], f["length"] = struct.unpack_from("<QQ", payload, 8)
    return f


# --- reference: the borrower of one direction (20.4, 20.5)

class Borrower:
    def __init__(self, window: int) -> None:
        self.window = window
        self.last = 0
        self.sizes: dict[int, int] = {}
        self.held: list[tuple[int, int, int]] = []
        self.queued = 0

    def step(self, s: dict) -> None:
        op = s["op"]
        if op == "descriptors":
            if self.queued + s["n"] > MAX_QUEUED_DESCRIPTORS:
                raise Refused("SHM_BAD_DESCRIPTOR")
            self.queued += s["n"]
        elif op == "region":
            region, size = s["region"], s["size"]
            if (region <= self.last or size == 0 or len(self.sizes) >= MAX_LIVE_REGIONS
                    or sum(self.sizes.values()) + size > self.window):
                raise Refused("SHM_BAD_REGION")
            if self.queued == 0:
                raise Refused("SHM_BAD_DESCRIPTOR")
            self.queued -= 1
            self.last = region
            self.sizes[region] = size
        elif op == "body":
            r = (s["region"], s["offset"], s["length"])
            size = self.sizes.get(r[0])
            if (size is None or r[2] == 0 or r[1] + r[2] > size
                    or sum(h[2] for h in self.held) + r[2] > self.window):
                raise Refused("SHM_BOUNDS")
            self.held.append(r)
        elif op == "release":
            r = (s["region"], s["offset"], s["length"])
            if r not in self.held:
                raise Refused("SHM_BAD_RELEASE")
            self.held.remove(r)
        elif op == "retire":
            if s["region"] not in self.sizes or any(h[0] == s["region"] for h in self.held):
                raise Refused("SHM_BAD_RELEASE")
            del self.sizes[s["region"]]
        else:
            raise AssertionError(op)


# --- the cases

CASES: list[dict] = []


def block_case(name: str, doc: str, side: str, data: bytes, *, entries: list[dict],
               shm: dict | None = None) -> None:
    """A block is never refused (20.1): what is not an extension block is ignored."""
    got_entries = parse_block(data)
    got_shm = shm_fields(got_entries, side)
    if (got_entries, got_shm) != (entries, shm):
        raise SystemExit(f"shm case {name}: the reference gives {got_entries} {got_shm}")
    CASES.append({"name": name, "doc": doc, "kind": "block", "side": side, "hex": data.hex(),
                  "entries": entries, "shm": shm, "error": None})


def welcome_case(name: str, doc: str, hello: dict | None, welcome: dict | None,
                 err: str | None) -> None:
    try:
        check_welcome(hello, welcome)
        got = None
    except Refused as e:
        got = e.name
    if got != err:
        raise SystemExit(f"shm case {name}: the reference gives {got}")
    CASES.append({"name": name, "doc": doc, "kind": "welcome_check", "hello": hello,
                  "welcome": welcome, "error": error(err)})


def frame_case(name: str, doc: str, data: bytes, frame: dict | None, err: str | None) -> None:
    length, type_byte, _flags, _reserved, ident = struct.unpack_from("<IBBHQ", data)
    type_name = next(n for n, b in TYPES.items() if b == type_byte)
    try:
        got, got_err = decode_payload(type_name, ident, data[16:16 + length]), None
    except Refused as e:
        got, got_err = None, e.name
    if (got, got_err) != (frame, err):
        raise SystemExit(f"shm case {name}: the reference gives {got_err} {got}")
    if frame is not None and encode_frame(frame) != data:
        raise SystemExit(f"shm case {name}: re-encoding differs")
    CASES.append({"name": name, "doc": doc, "kind": "frame", "hex": data.hex(), "frame": frame,
                  "error": error(err)})


def borrower_case(name: str, doc: str, window: int, steps: list[dict], err: str | None) -> None:
    """Steps all succeed but the last, which fails with `err` (or succeeds when err is None)."""
    b = Borrower(window)
    for i, s in enumerate(steps):
        last = i == len(steps) - 1
        try:
            b.step(s)
            got = None
        except Refused as e:
            got = e.name
        if got != (err if last else None):
            raise SystemExit(f"shm case {name}: step {i} gives {got}")
    CASES.append({"name": name, "doc": doc, "kind": "borrower", "window": window,
                  "steps": steps, "error": error(err)})


def entry(tag: int, data: bytes) -> bytes:
    return struct.pack("<HH", tag, len(data)) + data


def build() -> list[dict]:
    CASES.clear()
    w30 = struct.pack("<Q", 1 << 30)
    block_case("block_empty", "no trailing bytes: no extension", "hello", b"", entries=[])
    block_case("block_hello_shm", "a worker's shm offer: window 1 GiB", "hello",
               entry(1, w30), entries=[{"tag": 1, "data": w30.hex()}], shm={"window": 1 << 30})
    both = struct.pack("<QQ", 1 << 30, 1 << 28)
    block_case("block_welcome_shm_and_private",
               "a parent's acceptance beside a private-use entry, which is skipped", "welcome",
               entry(1, both) + entry(0x8001, b"xyz"),
               entries=[{"tag": 1, "data": both.hex()}, {"tag": 0x8001, "data": b"xyz".hex()}],
               shm={"to_worker_window": 1 << 30, "to_parent_window": 1 << 28})
    longer = w30 + b"\xaa\xbb"
    block_case("block_shm_entry_grows_at_its_end",
               "bytes after the fields a reader knows are ignored (an extension may grow)",
               "hello", entry(1, longer), entries=[{"tag": 1, "data": longer.hex()}],
               shm={"window": 1 << 30})
    block_case("block_unknown_tag_only", "an unknown tag is skipped: no shm", "hello",
               entry(77, b"\x01"), entries=[{"tag": 77, "data": "01"}])
    block_case("block_welcome_unknown_tag_only", "a WELCOME entry whose tag the worker does not "
               "know is skipped, not refused (20.1): no shm, the WELCOME stands", "welcome",
               entry(77, b"\x01\x02"), entries=[{"tag": 77, "data": "0102"}])
    block_case("block_entry_past_the_end", "an entry's length runs past the end: not an "
               "extension block, ignored as a whole (no shm)", "hello", entry(1, w30)[:-1],
               entries=[])
    block_case("block_header_cut", "three bytes left after an entry: not an extension block, "
               "ignored as a whole", "welcome", entry(1, both) + b"\x01\x00\x08", entries=[])
    block_case("block_tag_twice", "a tag twice: not an extension block, ignored as a whole",
               "hello", entry(1, w30) + entry(1, w30), entries=[])
    block_case("block_v1_trailing_bytes", "frames.json's hello_trailing_bytes_ignored: a v1 "
               "peer's trailing bytes, ignored", "hello", b"\x09future", entries=[])
    block_case("block_hello_shm_too_short", "HELLO's shm data shorter than 8 bytes: the entry is "
               "ignored (not offered)", "hello", entry(1, b"\x00" * 7),
               entries=[{"tag": 1, "data": "00" * 7}])
    block_case("block_welcome_shm_too_short", "WELCOME's shm data shorter than 16 bytes: the "
               "entry is ignored (not accepted)", "welcome", entry(1, w30),
               entries=[{"tag": 1, "data": w30.hex()}])

    acc = {"to_worker_window": 1000, "to_parent_window": 5}
    welcome_case("welcome_within_offer", "to_worker_window up to the offer", {"window": 1000},
                 acc, None)
    welcome_case("welcome_direction_off", "0 turns the parent -> worker direction off",
                 {"window": 1000}, {"to_worker_window": 0, "to_parent_window": 0}, None)
    welcome_case("welcome_above_offer", "to_worker_window above the worker's window",
                 {"window": 999}, acc, "BAD_HANDSHAKE")
    welcome_case("welcome_not_offered", "the HELLO offered no shm", None, acc, "BAD_HANDSHAKE")
    welcome_case("welcome_without_shm", "no entry: the lane is off, nothing to check",
                 {"window": 1000}, None, None)

    region = {"type": "SHM_REGION", "id": 0, "region": 1, "size": 1 << 20}
    body = {"type": "SHM_BODY", "id": 5, "region": 1, "offset": 0, "length": 256 << 20}
    release = {"type": "SHM_RELEASE", "id": 0, "region": 1, "offset": 0, "length": 256 << 20}
    retire = {"type": "SHM_RETIRE", "id": 0, "region": 7}
    for f, doc in ((region, "a 1 MiB region; its descriptor travels beside the bytes"),
                   (body, "request 5's body: 256 MiB at offset 0 of region 1 (20.3's example)"),
                   (release, "the parent gives the range back (20.3's example)"),
                   (retire, "region 7 withdrawn")):
        frame_case(f["type"].lower(), doc, encode_frame(f), f, None)
    big = {"type": "SHM_BODY", "id": 2**40, "region": 2**32 - 1, "offset": 2**64 - 1,
           "length": 2**64 - 1}
    frame_case("shm_body_extremes", "every field at its largest: bounds are state (20.5), not "
               "layout", encode_frame(big), big, None)
    wire = encode_frame(body)
    short = struct.pack("<I", 23) + wire[4:16] + wire[16:39]
    frame_case("shm_body_short", "23 payload bytes", short, None, "BAD_PAYLOAD")
    long = struct.pack("<I", 25) + wire[4:] + b"\x00"
    frame_case("shm_body_long", "25 payload bytes", long, None, "BAD_PAYLOAD")
    reserved = bytearray(encode_frame(region))
    reserved[16 + 5] = 1
    frame_case("shm_region_reserved_nonzero", "the reserved field is 0", bytes(reserved), None,
               "RESERVED_NONZERO")

    one = [{"op": "descriptors", "n": 1}, {"op": "region", "region": 1, "size": 8000}]
    borrower_case("lend_and_release", "a region, a body, its release, then the retire",
                  10_000, one + [{"op": "body", "region": 1, "offset": 0, "length": 8000},
                                 {"op": "release", "region": 1, "offset": 0, "length": 8000},
                                 {"op": "retire", "region": 1}], None)
    borrower_case("region_without_descriptor", "the frame's checks pass, no descriptor arrived",
                  10_000, [{"op": "region", "region": 1, "size": 100}], "SHM_BAD_DESCRIPTOR")
    borrower_case("region_checks_before_descriptor",
                  "size 0 is the frame's fault even when no descriptor arrived", 10_000,
                  [{"op": "region", "region": 1, "size": 0}], "SHM_BAD_REGION")
    borrower_case("region_id_zero", "0 is never a region: the first id is above 0 (20.3)",
                  10_000, [{"op": "descriptors", "n": 1}, {"op": "region", "region": 0,
                                                          "size": 100}], "SHM_BAD_REGION")
    borrower_case("region_id_not_above", "region ids strictly increase", 10_000,
                  one + [{"op": "descriptors", "n": 1},
                         {"op": "region", "region": 1, "size": 10}], "SHM_BAD_REGION")
    borrower_case("region_above_window", "live regions sum to at most the window", 10_000,
                  one + [{"op": "descriptors", "n": 1},
                         {"op": "region", "region": 2, "size": 2001}], "SHM_BAD_REGION")
    many = [{"op": "descriptors", "n": 1} if i % 2 == 0 else
            {"op": "region", "region": i // 2 + 1, "size": 1} for i in range(2 * MAX_LIVE_REGIONS)]
    borrower_case("region_65th_live", "at most 64 live regions", 2**40,
                  many + [{"op": "descriptors", "n": 1},
                          {"op": "region", "region": 100, "size": 1}], "SHM_BAD_REGION")
    borrower_case("descriptors_queued_9", "at most 8 descriptors waiting", 10_000,
                  [{"op": "descriptors", "n": 8}, {"op": "descriptors", "n": 1}],
                  "SHM_BAD_DESCRIPTOR")
    for name, rng, doc in (
            ("body_past_the_end", (1, 1, 8000), "offset + length above the size"),
            ("body_empty", (1, 0, 0), "length 0"),
            ("body_unknown_region", (2, 0, 1), "a region never announced"),
            ("body_offset_overflows", (1, 2**64 - 1, 2), "offset + length overflows a u64")):
        borrower_case(name, doc, 10_000, one + [{"op": "body", "region": rng[0],
                                                 "offset": rng[1], "length": rng[2]}],
                      "SHM_BOUNDS")
    borrower_case("body_above_window", "held bytes sum to at most the window (the same range "
                  "held twice counts twice)", 10_000,
                  one + [{"op": "body", "region": 1, "offset": 0, "length": 8000},
                         {"op": "body", "region": 1, "offset": 0, "length": 2001}], "SHM_BOUNDS")
    borrower_case("body_after_retire", "a retired region is not live", 10_000,
                  one + [{"op": "retire", "region": 1},
                         {"op": "body", "region": 1, "offset": 0, "length": 1}], "SHM_BOUNDS")
    borrower_case("retire_while_held", "the owner may not retire a region with a lent range",
                  10_000, one + [{"op": "body", "region": 1, "offset": 0, "length": 1},
                                 {"op": "retire", "region": 1}], "SHM_BAD_RELEASE")
    borrower_case("retire_unknown", "a region never announced", 10_000,
                  [{"op": "retire", "region": 3}], "SHM_BAD_RELEASE")
    return list(CASES)
