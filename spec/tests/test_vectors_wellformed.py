"""The vector files are well formed and agree with PROTOCOL.md's tables.

These tests read only the committed JSON and the Markdown, never the generator's internals, so a
generator bug that writes a nonsensical case is caught here rather than in six SDKs at once.

    python3 -m pytest spec/tests -q
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parents[1]
VECTORS = SPEC / "vectors"
PROTOCOL = (SPEC / "PROTOCOL.md").read_text(encoding="utf-8")
# The vectors cover version 1 without extensions: section 20's frames and codes are not theirs.
PROTOCOL_V1 = PROTOCOL.split("\n## 20. ")[0]
README = (VECTORS / "README.md").read_text(encoding="utf-8")
FRAMES = json.loads((VECTORS / "frames.json").read_text(encoding="utf-8"))
SESSIONS = json.loads((VECTORS / "sessions.json").read_text(encoding="utf-8"))


def _table_rows(text: str, first_cell: str) -> list[list[str]]:
    """Rows of every Markdown table whose first cell matches the regex `first_cell`."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if re.fullmatch(first_cell, cells[0]):
                rows.append(cells)
    return rows


# "| 102 | FRAME_TOO_LARGE | ..." in the section 3 tables
ERROR_CODES = {cells[1]: int(cells[0]) for cells in _table_rows(PROTOCOL_V1, r"\d{3}")}
# "| 0x10 | REQUEST | ..." in the section 2 frame type table
FRAME_TYPES = {cells[1] for cells in _table_rows(PROTOCOL_V1, r"0x[0-9A-F]{2}")}
# "| REQUEST | `method`, `codec`, ... |" in the vectors README FRAME table
FRAME_FIELDS: dict[str, list[str]] = {}
for cells in _table_rows(README, r"[A-Z, ]+"):
    if cells[0] in ("type", "LATE", "REJECT"):
        continue
    fields = re.findall(r"`(\w+)`", cells[1])
    for name in cells[0].split(","):
        FRAME_FIELDS[name.strip()] = fields

HEX = re.compile(r"(?:[0-9a-f]{2})*")
ALL_CASES = FRAMES["cases"] + SESSIONS["cases"]


def _is_malformed(case: dict) -> bool:
    if "steps" in case:
        return any(step.get("error") for step in case["steps"])
    return case["error"] is not None


def _check_error(error: dict | None) -> None:
    if error is None:
        return
    assert set(error) == {"code", "name"}
    assert ERROR_CODES.get(error["name"]) == error["code"], error
    assert 100 <= error["code"] <= 199, f"only protocol violations end a vector: {error}"


def _check_frame(obj: dict, *, event: bool) -> None:
    ftype = obj["type"]
    assert ftype in FRAME_TYPES, ftype
    assert isinstance(obj["id"], int) and 0 <= obj["id"] < 2**64
    expected = ["type", "id"] + ([] if event else ["more"]) + FRAME_FIELDS[ftype]
    assert list(obj) == expected, f"{ftype}: keys {list(obj)} != {expected}"
    for key in ("body", "summary", "nonce"):
        if key in obj:
            assert HEX.fullmatch(obj[key]), f"{key} is not lowercase hex"
    for row in obj.get("rows", []):
        assert HEX.fullmatch(row)
    if ftype in ("PING", "PONG"):
        assert len(obj["nonce"]) == 16
    if ftype == "CONTINUATION" and event:
        pytest.fail("CONTINUATION frames never appear as events")


def test_tables_were_parsed():
    # If the doc's table layout changes, the other tests would silently check nothing.
    assert ERROR_CODES["FRAME_TOO_LARGE"] == 102 and ERROR_CODES["PROTOCOL_VIOLATION"] == 307
    assert len(ERROR_CODES) >= 40
    assert {"HELLO", "WELCOME", "CONTINUATION", "ROWS"} <= FRAME_TYPES and len(FRAME_TYPES) == 15
    assert FRAME_FIELDS["PONG"] == ["nonce"] and FRAME_FIELDS["CANCEL"] == []
    assert set(FRAME_FIELDS) == FRAME_TYPES


def test_counts():
    assert FRAMES["protocol_version"] == 1 and SESSIONS["protocol_version"] == 1
    assert len(ALL_CASES) >= 60
    assert sum(map(_is_malformed, ALL_CASES)) >= 30
    assert sum(1 for c in ALL_CASES if not _is_malformed(c)) >= 20


def test_names_unique_and_documented():
    names = [c["name"] for c in ALL_CASES]
    assert len(names) == len(set(names))
    for case in ALL_CASES:
        assert re.fullmatch(r"[a-z0-9_]+", case["name"]), case["name"]
        assert case["doc"].strip(), case["name"]


@pytest.mark.parametrize("case", FRAMES["cases"], ids=lambda c: c["name"])
def test_frame_case(case):
    assert list(case) == ["name", "doc", "max_frame_size", "decode_only", "hex", "frames", "error"]
    assert HEX.fullmatch(case["hex"]) and case["hex"]
    assert 65536 <= case["max_frame_size"] <= 16_777_216
    assert isinstance(case["decode_only"], bool)
    assert not (case["decode_only"] and case["error"])
    _check_error(case["error"])
    if case["error"] is None:
        assert case["frames"], "a valid case decodes to at least one frame"
    for frame in case["frames"]:
        _check_frame(frame, event=False)


def test_every_frame_type_has_a_valid_case():
    seen = {f["type"] for c in FRAMES["cases"] if c["error"] is None for f in c["frames"]}
    assert seen == FRAME_TYPES


@pytest.mark.parametrize("case", SESSIONS["cases"], ids=lambda c: c["name"])
def test_session_case(case):
    assert list(case) == ["name", "doc", "role", "steps"]
    assert case["role"] in ("parent", "worker")
    steps = case["steps"]
    assert steps
    for i, step in enumerate(steps):
        if "send" in step:
            assert list(step) == ["send"]
            _check_frame(step["send"], event=False)
            continue
        if "recv" in step:
            assert list(step) == ["recv", "events", "error"]
            assert HEX.fullmatch(step["recv"]) and step["recv"]
        else:
            assert list(step) == ["eof", "events", "error"] and step["eof"] is True
        _check_error(step["error"])
        if step["error"]:
            assert i == len(steps) - 1, "no step may follow an error"
        for ev in step["events"]:
            if ev["type"] == "LATE":
                assert list(ev) == ["type", "id", "frame"] and ev["frame"] in FRAME_TYPES
            elif ev["type"] == "REJECT":
                assert list(ev) == ["type", "id", "code", "name"]
                assert ev["name"] in {"UNKNOWN_METHOD", "CODEC_UNSUPPORTED", "OVERLOADED",
                                      "DRAINING", "CANCELLED"}
                assert ERROR_CODES[ev["name"]] == ev["code"]
            else:
                _check_frame(ev, event=True)


def test_sessions_cover_both_roles_and_every_state_error():
    roles = {c["role"] for c in SESSIONS["cases"]}
    assert roles == {"parent", "worker"}
    codes = {s["error"]["name"] for c in SESSIONS["cases"] for s in c["steps"] if s.get("error")}
    stateful = {"UNEXPECTED_FRAME", "DUPLICATE_ID", "UNKNOWN_ID", "CREDIT_OVERFLOW",
                "FLOW_CONTROL", "MESSAGE_TOO_LARGE", "CONTINUATION", "VERSION_MISMATCH",
                "ROW_COUNT_MISMATCH", "KIND_MISMATCH", "FRAME_TOO_LARGE", "TRUNCATED"}
    assert stateful <= codes, stateful - codes


def test_generator_check_passes():
    """The committed JSON and PROTOCOL.md's hex examples are exactly what generate.py produces."""
    proc = subprocess.run([sys.executable, str(VECTORS / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_protocol_has_a_checked_hex_example_of_every_frame_type():
    by_name = {c["name"]: c for c in FRAMES["cases"]}
    names = re.findall(r"^```hex name=(\S+)$", PROTOCOL, re.M)
    assert names and all(n in by_name for n in names), set(names) - set(by_name)
    shown = {f["type"] for n in names for f in by_name[n]["frames"]}
    assert shown == FRAME_TYPES, FRAME_TYPES - shown


def test_shm_vectors_name_the_extension_codes():
    """shm.json (section 20): every error is a code of constants.json, by name and number."""
    shm = json.loads((VECTORS / "shm.json").read_text(encoding="utf-8"))
    constants = json.loads((SPEC / "constants.json").read_text(encoding="utf-8"))
    codes = {e["name"]: e["code"] for e in constants["error_codes"]
             + constants["extensions"]["shm"]["error_codes"]}
    kinds = {c["kind"] for c in shm["cases"]}
    assert kinds == {"block", "welcome_check", "frame", "borrower"}
    names = [c["name"] for c in shm["cases"]]
    assert len(names) == len(set(names))
    errors = [c["error"] for c in shm["cases"] if c["error"]]
    assert errors and all(codes[e["name"]] == e["code"] for e in errors)
    # Every code of the extension that a receiver raises from bytes is exercised.
    assert {e["name"] for e in errors} >= {"SHM_BAD_REGION", "SHM_BAD_DESCRIPTOR", "SHM_BOUNDS",
                                           "SHM_BAD_RELEASE", "BAD_PAYLOAD", "BAD_HANDSHAKE",
                                           "RESERVED_NONZERO"}
    for c in shm["cases"]:
        if c["kind"] == "frame" and c["frame"]:
            t = next(t for t in constants["extensions"]["shm"]["frame_types"]
                     if t["name"] == c["frame"]["type"])
            assert int(c["hex"][8:10], 16) == t["code"]
            assert len(c["hex"]) // 2 == 16 + t["payload_size"]
