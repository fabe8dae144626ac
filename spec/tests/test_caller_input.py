"""Section 22 (caller input) against spec/constants.json and conformance/bad_input.json: the
bounds the text states are the file's, every option of 22.2's table has rows in the table, and
every row is well formed, so that a parent runner replaying the table cannot pass on a typo."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "spec" / "PROTOCOL.md").read_text(encoding="utf-8")
CONSTANTS = json.loads((REPO / "spec" / "constants.json").read_text(encoding="utf-8"))
TABLE = json.loads((REPO / "conformance" / "bad_input.json").read_text(encoding="utf-8"))
SECTION = DOC[DOC.index("## 22. Caller input"):]
KINDS = {"pool_option", "call_option", "method", "request", "lifecycle"}
SPECIALS = {"nan", "inf", "-inf", "cyclic", "function", "symbol", "undefined",
            "undefined_in_object", "undefined_in_array", "bigint", "opaque_object", "non_string_key", "bytes",
            "repeat", "string_of_bytes", "options"}
LANGUAGES = {"rust", "python", "node", "go"}


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_bounds_in_the_text_are_the_constants():
    c = CONSTANTS["caller_input"]
    m = re.search(r"`max_timeout_ms`\s+is ([\d,]+)", SECTION)
    assert m and _number(m.group(1)) == c["max_timeout_ms"] == 2**31 - 1
    assert f"1 - `max_workers` ({c['max_workers']:,})" in SECTION
    assert f"`quoted_max_chars` ({c['quoted_max_chars']})" in SECTION
    assert c["max_count"] == 2**32 - 1 and f"{c['max_count']:,}" in SECTION
    assert c["max_size"] == 2**53 - 1 and "2^53 - 1" in SECTION


def test_invalid_argument_is_a_local_code():
    code = next(e for e in CONSTANTS["error_codes"] if e["name"] == "INVALID_ARGUMENT")
    assert (code["code"], code["class"], code["fate"]) == (308, "local", "local_only")
    assert "INVALID_ARGUMENT` (308, local, never sent)" in SECTION


def test_the_table_is_well_formed():
    rows = TABLE["rows"]
    assert len(rows) >= 60
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    codes = {e["code"]: e["name"] for e in CONSTANTS["error_codes"]}
    assert all(codes[v] == k for k, v in TABLE["codes"].items())
    for r in rows:
        assert r["kind"] in KINDS, r
        assert r["at"] in ("construction", "call", "ok"), r
        assert (r["code"] is None) == (r["at"] == "ok"), r
        if r["code"] is not None:
            assert r["code"] in TABLE["codes"].values(), r
        if r["kind"] == "pool_option":
            assert r["at"] in ("construction", "ok"), r
        else:
            assert r["at"] in ("call", "ok"), r
        for key in ("inexpressible",):
            assert set(r.get(key, {})) <= LANGUAGES, r
        assert set(r.get("only", [])) <= LANGUAGES, r
        for v in (r.get("value"), r.get("request"), r.get("method")):
            if isinstance(v, dict) and "$" in v:
                assert v["$"] in SPECIALS, r


def test_every_option_of_the_22_2_table_has_rows():
    names = set()
    for line in SECTION.split("### 22.3")[0].splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    names -= {"max_timeout_ms", "max_workers", "restart_backoff_max"} | {"timeout"}
    durations = {"startup_timeout", "restart_window", "cancel_grace", "deadline_grace",
                 "drain_grace", "goodbye_grace", "restart_backoff", "max_idle"}
    options = {r["option"] for r in TABLE["rows"] if r["kind"] == "pool_option"}
    for name in names:
        assert (f"{name}_ms" if name in durations else name) in options, name
    assert any(r["kind"] == "call_option" and r["option"] == "timeout_ms" for r in TABLE["rows"])

