"""The shared-memory extension's sans-IO state (wirepool._shm_proto, PROTOCOL.md section 20):
every case of spec/vectors/shm.json, the spec's example bytes, and a lender and a borrower that
agree over many lends."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wirepool._shm_proto import (
    MAX_LIVE_REGIONS, SHM_BODY, SHM_RELEASE, TAG_SHM, Borrower, Lender, ShmAccept, ShmFrame,
    ShmOffer, ShmRange, encode_extension, parse_extensions,
)
from wirepool.errors import ErrorCode, ProtocolError

SPEC = Path(__file__).resolve().parents[2] / "spec"
CASES = json.loads((SPEC / "vectors" / "shm.json").read_text(encoding="utf-8"))["cases"]


def outcome(run: Callable[[], Any]) -> str | None:
    try:
        run()
    except ProtocolError as e:
        return e.name
    return None


def run_block(case: dict) -> None:
    entries = parse_extensions(bytes.fromhex(case["hex"]))
    assert [(t, d.hex()) for t, d in entries] == [(e["tag"], e["data"]) for e in case["entries"]]
    shm = next((d for t, d in entries if t == TAG_SHM), None)
    want = case["shm"]
    if case["side"] == "hello":
        offer = ShmOffer.decode(shm) if shm is not None else None
        assert offer == (ShmOffer(**want) if want else None)
    else:
        accept = ShmAccept.decode(shm) if shm is not None else None
        assert accept == (ShmAccept(**want) if want else None)


def run_welcome(case: dict) -> None:
    if case["welcome"] is not None:
        offer = ShmOffer(**case["hello"]) if case["hello"] is not None else None
        ShmAccept(**case["welcome"]).check(offer)


def run_frame(case: dict) -> None:
    data = bytes.fromhex(case["hex"])
    frame = ShmFrame.decode(data[4], int.from_bytes(data[8:16], "little"), data[16:])
    f = case["frame"]
    assert f is not None
    fields = {k: v for k, v in f.items() if k not in ("type", "id")}
    assert frame.id == f["id"] and frame == frame._replace(**fields)
    assert frame.encode() == data


def run_borrower(case: dict) -> None:
    b = Borrower(case["window"])
    for i, s in enumerate(case["steps"]):
        op = s["op"]

        def step() -> None:
            if op == "descriptors":
                b.descriptors_received(s["n"])
            elif op == "region":
                b.region(s["region"], s["size"])
            elif op == "retire":
                b.retire(s["region"])
            else:
                r = ShmRange(s["region"], s["offset"], s["length"])
                b.body(1, r) if op == "body" else b.release(r)
        if i + 1 < len(case["steps"]):
            assert outcome(step) is None, f"step {i}"
        else:
            step()


RUN = {"block": run_block, "welcome_check": run_welcome, "frame": run_frame,
       "borrower": run_borrower}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_spec_vectors(case: dict) -> None:
    want = case["error"]["name"] if case["error"] else None
    assert outcome(lambda: RUN[case["kind"]](case)) == want


def test_the_spec_example_bytes() -> None:
    doc = (SPEC / "PROTOCOL.md").read_text(encoding="utf-8")
    block = doc.split("### 20.3 Frames")[1].split("```")[1]
    example = bytes.fromhex("".join(re.sub(r"#.*", "", line) for line in block.splitlines()))
    r = ShmRange(1, 0, 256 << 20)
    ours = bytes.fromhex("00000000 12010000 0500000000000000") \
        + ShmFrame(SHM_BODY, 5, 1, offset=0, length=256 << 20).encode() \
        + ShmFrame(SHM_RELEASE, 0, 1, offset=0, length=256 << 20).encode()
    assert ours == example
    assert ShmFrame.decode(SHM_BODY, 5, example[32:56]).range == r


def test_blocks_round_trip_and_anything_else_is_ignored() -> None:
    block = ShmOffer(7).encode() + encode_extension(0x8001, b"x")
    assert parse_extensions(block) == [(TAG_SHM, (7).to_bytes(8, "little")), (0x8001, b"x")]
    for cut in range(1, len(block)):
        assert parse_extensions(block[:cut]) == ([(TAG_SHM, (7).to_bytes(8, "little"))]
                                                 if cut == 12 else [])
    assert parse_extensions(block + ShmOffer(1).encode()) == []  # a tag twice
    assert ShmOffer.decode(bytes(7)) is None and ShmAccept.decode(bytes(15)) is None


def test_a_lender_and_a_borrower_agree_over_many_lends() -> None:
    rng = random.Random(13)
    window = 64 << 20
    owner, receiver = Lender(window), Borrower(window)
    regions: list[tuple[int, int]] = []
    held: list[ShmRange] = []
    for step in range(2000):
        if len(regions) < 4:
            size = rng.randrange(4 << 20, 9 << 20)
            region = owner.announce(size)
            receiver.descriptors_received(1)
            receiver.region(region, size)
            regions.append((region, size))
        region, size = rng.choice(regions)
        offset = rng.randrange(1000)
        r = ShmRange(region, offset, rng.randrange(1, size - offset))
        if outcome(lambda: owner.lend(r)) is None:
            receiver.body(step + 1, r)
            held.append(r)
        if held and rng.random() < 0.4:
            back = held.pop(rng.randrange(len(held)))
            receiver.release(back)
            owner.released(back)
        if rng.random() < 0.02:
            idle = [x for x in regions if not owner.is_lent(x[0])]
            if idle:
                regions.remove(idle[0])
                owner.retire(idle[0][0])
                receiver.retire(idle[0][0])
        assert owner.lent_bytes == receiver.held_bytes <= window
        assert owner.live_bytes == receiver.live_bytes <= window
    assert len(regions) <= MAX_LIVE_REGIONS


def test_the_lender_refuses_what_it_must_not_send() -> None:
    owner = Lender(1000)
    with pytest.raises(ProtocolError) as e:
        owner.announce(1001)
    assert e.value.code == ErrorCode.SHM_BAD_REGION
    a = owner.announce(1000)
    owner.lend(ShmRange(a, 0, 1000))
    for bad, code in ((lambda: owner.lend(ShmRange(a, 0, 1))), ErrorCode.SHM_BOUNDS), \
                     ((lambda: owner.retire(a)), ErrorCode.SHM_BAD_RELEASE), \
                     ((lambda: owner.released(ShmRange(a, 1, 1))), ErrorCode.SHM_BAD_RELEASE):
        with pytest.raises(ProtocolError) as e:
            bad()
        assert e.value.code == code
    owner.released(ShmRange(a, 0, 1000))
    assert owner.retire(a) == 1000 and owner.announce(1) == 2


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_trailing_bytes_are_a_block_or_ignored(data: bytes) -> None:
    entries = parse_extensions(data)
    if entries:
        assert b"".join(encode_extension(t, d) for t, d in entries) == data
    for tag, d in entries:
        if tag == TAG_SHM:
            assert (ShmOffer.decode(d) is None) == (len(d) < 8)
            assert (ShmAccept.decode(d) is None) == (len(d) < 16)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([0x50, 0x51, 0x52, 0x7E]), st.binary(max_size=32))
def test_any_payload_decodes_and_round_trips_or_is_refused(frame_type: int, payload: bytes) -> None:
    try:
        frame = ShmFrame.decode(frame_type, 3, payload)
    except ProtocolError as e:
        assert e.code in (ErrorCode.BAD_PAYLOAD, ErrorCode.RESERVED_NONZERO)
        return
    assert frame.encode()[16:] == payload
