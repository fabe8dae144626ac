"""Every case of spec/vectors/frames.json and sessions.json, fed at once, split at every
position into two chunks, and one byte at a time."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from vectors import VECTORS, frame_from_json, load, to_json
from wirepool import proto
from wirepool.errors import ProtocolError

FRAMES = VECTORS / "frames.json"
SESSIONS = VECTORS / "sessions.json"

if not FRAMES.exists() or not SESSIONS.exists():  # pragma: no cover - only before vectors land
    pytest.skip("spec/vectors/*.json not generated yet", allow_module_level=True)

FRAME_CASES = load("frames.json")
SESSION_CASES = load("sessions.json")


def chunkings(data: bytes) -> Iterator[tuple[str, list[bytes]]]:
    yield "whole", [data]
    for i in range(1, len(data)):
        yield f"split@{i}", [data[:i], data[i:]]
    if len(data) > 1:
        yield "bytewise", [data[i:i + 1] for i in range(len(data))]


def decode_frames(case: dict, chunks: list[bytes]) -> tuple[list[dict], ProtocolError | None]:
    dec = proto.FrameDecoder(case.get("max_frame_size", proto.DEFAULT_MAX_FRAME_SIZE))
    out: list[dict] = []
    try:
        for c in chunks:
            dec.receive(c)
            while (f := dec.next_frame()) is not None:
                out.append(to_json(f))
        dec.end_of_input()
    except ProtocolError as e:
        return out, e
    return out, None


def check_error(err: ProtocolError | None, expected: dict | None, where: str) -> None:
    if expected is None:
        assert err is None, f"{where}: unexpected {err}"
    else:
        assert err is not None, f"{where}: expected {expected['name']}, got no error"
        assert (err.code, err.name) == (expected["code"], expected["name"]), f"{where}: {err}"


@pytest.mark.parametrize("case", FRAME_CASES, ids=[c["name"] for c in FRAME_CASES])
def test_frame_vector(case: dict) -> None:
    data = bytes.fromhex(case["hex"])
    for label, chunks in chunkings(data):
        frames, err = decode_frames(case, chunks)
        assert frames == case["frames"], label
        check_error(err, case["error"], label)
    if case["error"] is None:
        encoded = b"".join(proto.encode_frame(frame_from_json(f)) for f in case["frames"])
        if not case.get("decode_only"):
            assert encoded.hex() == case["hex"]


def run_session(case: dict, feed: Callable[[bytes], list[bytes]]) -> None:
    conn = proto.Connection(case["role"])
    steps = case["steps"]
    for n, step in enumerate(steps):
        where = f"step {n}"
        if "send" in step:
            wire = b"".join(bytes(p) for p in conn.send(frame_from_json(step["send"])))
            assert wire == proto.encode_frame(frame_from_json(step["send"])), where
            continue
        events: list[dict] = []
        err: ProtocolError | None = None
        try:
            if step.get("eof"):
                conn.end_of_input()
            else:
                for chunk in feed(bytes.fromhex(step["recv"])):
                    conn.receive(chunk)
                    while (ev := conn.next_event()) is not None:
                        events.append(to_json(ev, with_more=False))
        except ProtocolError as e:
            err = e
        assert events == step["events"], where
        check_error(err, step.get("error"), where)
        if err is not None:
            assert n == len(steps) - 1, "no step may follow an error"


@pytest.mark.parametrize("case", SESSION_CASES, ids=[c["name"] for c in SESSION_CASES])
def test_session_whole(case: dict) -> None:
    run_session(case, lambda b: [b])


@pytest.mark.parametrize("case", SESSION_CASES, ids=[c["name"] for c in SESSION_CASES])
def test_session_bytewise(case: dict) -> None:
    run_session(case, lambda b: [b[i:i + 1] for i in range(len(b))])


def _split_points(data: bytes) -> set[int]:
    """spec/vectors/README.md's split rule: every position up to 4096 bytes; above, every
    position within 32 bytes of a frame boundary and every 997th (a split at each of 64 K
    positions replays the session 64 K times: minutes on a loaded machine, nothing more found)."""
    if len(data) <= 4096:
        return set(range(1, len(data)))
    points = set(range(1, len(data), 997))
    at = 0
    while at + 4 <= len(data):  # the frame boundaries, by the headers' length fields
        for i in range(at - 32, at + 33):
            if 0 < i < len(data):
                points.add(i)
        at += proto.HEADER_SIZE + int.from_bytes(data[at:at + 4], "little")
    points.update(i for i in range(at - 32, at + 33) if 0 < i < len(data))  # the last one
    return points


@pytest.mark.parametrize("case", SESSION_CASES, ids=[c["name"] for c in SESSION_CASES])
def test_session_split_everywhere(case: dict) -> None:
    # Split each received step at every position the README asks for (one split point per run,
    # the same point in every step; a step shorter than it is fed whole).
    points: set[int] = set()
    for step in case["steps"]:
        points |= _split_points(bytes.fromhex(step.get("recv", "")))
    for i in sorted(points):
        run_session(case, lambda b, i=i: [b[:i], b[i:]] if 0 < i < len(b) else [b])
