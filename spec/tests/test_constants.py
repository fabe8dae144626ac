"""spec/constants.json agrees with PROTOCOL.md's own tables and text.

constants.json is the protocol's constants as data (PROTOCOL.md section 18): every SDK checks its
constants against it, so here every value of it is checked against the document, from the
tables and sentences a reader would use. A change to either that the other does not follow fails.

    python3 -m pytest spec/tests -q
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parents[1]
REPO = SPEC.parent
PROTOCOL = (SPEC / "PROTOCOL.md").read_text(encoding="utf-8")
FLAT = re.sub(r"\s+", " ", PROTOCOL)  # sentences, whatever their line breaks
CONSTANTS = json.loads((SPEC / "constants.json").read_text(encoding="utf-8"))
SIZES = {"u8": 1, "u16": 2, "u32": 4, "u64": 8}


def _section(number: str) -> str:
    """The text of `## number.` up to the next `## ` heading."""
    m = re.search(rf"^## {re.escape(number)}\. .*?(?=^## )", PROTOCOL + "\n## end", re.S | re.M)
    assert m, f"section {number} not found"
    return m.group(0)


def _rows(text: str, first_cell: str) -> list[list[str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if re.fullmatch(first_cell, cells[0]):
                out.append(cells)
    return out


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _doc_mentions(pattern: str) -> re.Match:
    m = re.search(pattern, FLAT)
    assert m, f"PROTOCOL.md no longer says {pattern!r}"
    return m


def test_frame_types_match_the_section_2_table():
    doc = {}
    for code, name, direction, ident, _payload in _rows(_section("2"), r"0x[0-9A-F]{2}"):
        doc[name] = (int(code, 16), direction, ident)
    direction = {"worker -> parent": "worker_to_parent", "parent -> worker": "parent_to_worker",
                 "both": "both"}
    ident = {"0": "zero", "request": "request", "request or 0": "any"}
    ours = {t["name"]: (t["code"], t["direction"], t["id"]) for t in CONSTANTS["frame_types"]}
    assert len(doc) == 15
    assert ours == {n: (c, direction[d], ident[i]) for n, (c, d, i) in doc.items()}


def test_more_flag_and_continued_prefixes():
    names = _doc_mentions(r"`MORE` is allowed only on ((?:`\w+`(?:, | and )?)+)").group(1)
    allowed = set(re.findall(r"`(\w+)`", names))
    assert {t["name"] for t in CONSTANTS["frame_types"] if t["more_allowed"]} == allowed
    assert CONSTANTS["flags"]["MORE"] == 1 << int(_doc_mentions(r"bit (\d) is `MORE`").group(1))
    assert CONSTANTS["flags"]["reserved_mask"] == 0xFF & ~CONSTANTS["flags"]["MORE"]
    # The fixed prefix of a continued first frame: the fixed fields of the payload column.
    payloads = {r[1]: r[4] for r in _rows(_section("2"), r"0x[0-9A-F]{2}")}
    for t in CONSTANTS["frame_types"]:
        if t["more_allowed"]:
            fields = re.findall(r"\b(u8|u16|u32|u64)\b", payloads[t["name"]])
            assert t["continued_prefix"] == sum(SIZES[f] for f in fields), t["name"]
        else:
            assert "continued_prefix" not in t


def test_fixed_payload_sizes():
    text = _doc_mentions(r"Types with a\s+fixed size \(([^)]*)\)").group(1)
    doc = {}
    for names, size in re.findall(r"([A-Z/]+) (\d+)", text):
        for name in names.split("/"):
            doc[name] = int(size)
    assert {t["name"]: t["payload_size"] for t in CONSTANTS["frame_types"]
            if "payload_size" in t} == doc


def test_header():
    assert CONSTANTS["header"]["size"] == int(_doc_mentions(r"a (\d+)-byte header").group(1))
    assert sum(SIZES[f] for _n, f in CONSTANTS["header"]["fields"]) == CONSTANTS["header"]["size"]
    assert [n for n, _f in CONSTANTS["header"]["fields"]] == ["length", "type", "flags",
                                                              "reserved", "id"]
    assert CONSTANTS["magic"] == _doc_mentions(r"ASCII `(\w+)`").group(1)


def test_error_codes_match_the_section_3_tables():
    doc = {name: int(code) for code, name, *_ in _rows(_section("3"), r"\d{3}")}
    ours = {e["name"]: e["code"] for e in CONSTANTS["error_codes"]}
    assert len(doc) >= 40 and ours == doc


def test_error_classes_match_the_section_3_headings():
    sec = _section("3")
    heads = re.findall(r"^### (\d+)(?:-(\d+)|( and above)): (.*)$", sec, re.M)
    assert len(heads) == 4
    classes = {c["from"]: c for c in CONSTANTS["error_classes"]}
    words = {"protocol": "protocol violations", "request": "request errors",
             "local": "local outcomes", "application": "application codes"}
    for lo, hi, above, title in heads:
        c = classes[int(lo)]
        assert c["to"] == (2**32 - 1 if above else int(hi))
        assert words[c["class"]] in title
        assert c["sent"] == ("never sent" not in title)
    # every code's class is the class of its range
    for e in CONSTANTS["error_codes"]:
        rng = next(c for c in CONSTANTS["error_classes"] if c["from"] <= e["code"] <= c["to"])
        assert (e["class"], e["fate"]) == (rng["class"], rng["fate"]), e
    # the ranges cover every u32 once
    spans = sorted((c["from"], c["to"]) for c in CONSTANTS["error_classes"])
    assert spans[0][0] == 0 and spans[-1][1] == 2**32 - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))


def test_fates_match_the_section_13_table():
    by_name = {e["name"]: e for e in CONSTANTS["error_codes"]}
    seen = set()
    for _bad, code, fate in _rows(_section("13"), r"[^-].*")[1:]:
        m = re.fullmatch(r"(\d{3}) (\w+)(?: \(local\))?", code)
        if not m:
            continue
        e = by_name[m.group(2)]
        assert e["code"] == int(m.group(1))
        seen.add(e["name"])
        if fate.startswith("closed"):
            assert e["fate"] == "connection_closed", e
        else:
            assert fate.startswith("survives") and e["fate"] in ("request_ends", "local_only"), e
        assert e.get("at_startup", False) == ("at start-up" in fate), e
    assert {e["name"] for e in CONSTANTS["error_codes"] if e["class"] == "protocol"} - {"PROTOCOL"} \
        <= seen


def test_codecs_kinds_and_goodbye_reasons():
    doc = {int(i): name for i, name in _rows(_section("7"), r"\d+")}
    names = {"raw bytes": "raw", "JSON (UTF-8)": "json", "MessagePack": "msgpack", "CBOR": "cbor",
             "Arrow IPC stream": "arrow_ipc", "Protocol Buffers": "protobuf"}
    assert {c["id"]: c["name"] for c in CONSTANTS["codecs"]} == {i: names[n] for i, n in doc.items()}
    ranges = {r[1]: [int(x) for x in r[0].split("-")] for r in _rows(_section("7"), r"\d+-\d+")}
    assert CONSTANTS["codec_ranges"] == {"reserved": ranges["reserved for later versions"],
                                         "private": ranges[next(k for k in ranges
                                                                if k.startswith("private"))]}
    kinds = _doc_mentions(r"`kind u8` \((\d) unary, (\d) stream")
    assert CONSTANTS["method_kinds"] == {"unary": int(kinds.group(1)), "stream": int(kinds.group(2))}
    reasons = _doc_mentions(r"GOODBYE `reason`: (\d) drained, (\d) parent gone .*?, (\d) the "
                            r"worker is leaving.*?, (\d) fatal error")
    assert list(CONSTANTS["goodbye_reasons"].values()) == [int(g) for g in reasons.groups()]


def test_limits():
    lim = CONSTANTS["limits"]
    m = _doc_mentions(r"`max_frame_size` is ([\d,]+) until the handshake completes.*?\(between "
                      r"([\d,]+) and ([\d,]+); default ([\d,]+)\)")
    assert [lim["handshake_max_frame_size"], lim["min_max_frame_size"], lim["max_max_frame_size"],
            CONSTANTS["protocol_defaults"]["max_frame_size"]] == [_number(g) for g in m.groups()]
    assert lim["max_credit"] == 2**31 - 1 and "2^31 - 1" in FLAT
    hello = dict((r[2], r[3]) for r in _rows(_section("4"), r"\d+|\.\."))
    assert hello["method_count"] == f"0 - {lim['max_methods']:,}"
    assert hello["sdk_name"] == f"str16, {lim['sdk_name_bytes'][0]}-{lim['sdk_name_bytes'][1]} bytes"
    assert hello["sdk_version"] == \
        f"str16, {lim['sdk_version_bytes'][0]}-{lim['sdk_version_bytes'][1]} bytes"
    assert f"`codec_count u8` (1-{lim['max_codecs_per_method']})" in FLAT
    lo, hi = lim["method_name_bytes"]
    assert f"`name str16` ({lo}-{hi} bytes" in FLAT
    lo, hi = lim["event_topic_bytes"]
    assert f"EVENT `topic`: {lo}-{hi} bytes" in FLAT
    assert f"`message` is at most {lim['error_message_max_bytes']:,} bytes" in FLAT
    assert f"`nonce` (exactly {lim['nonce_bytes']} bytes)" in FLAT
    assert f"the {lim['hello_fixed_bytes']}-byte fixed part" in FLAT
    assert f"WELCOME: {lim['welcome_bytes']} bytes" in FLAT
    assert f"REQUEST: {lim['request_prefix_bytes']} bytes" in FLAT


def test_protocol_defaults_and_timing():
    d = CONSTANTS["protocol_defaults"]
    m = _doc_mentions(r"Defaults a parent SHOULD use: max_frame_size ([\d,]+); initial_credit "
                      r"([\d,]+); heartbeat_ms ([\d,]+); max_message_size ([\d,]+)")
    assert [d["max_frame_size"], d["initial_credit"], d["heartbeat_ms"],
            d["max_message_size"]] == [_number(g) for g in m.groups()]
    m = _doc_mentions(r"A worker SHOULD advertise ([\d,]+)\s+as its max_frame_size")
    assert d["worker_max_frame_size"] == _number(m.group(1))
    t = CONSTANTS["timing"]
    assert f"at most **{t['rows_flush_bound_ms']} ms** (the flush bound)" in FLAT
    assert f"give cancelled handlers up to {t['drain_cancel_wait_max_ms']} ms" in FLAT
    assert f"passes {t['heartbeat_misses']} x `heartbeat_ms`" in FLAT


def test_driver_handed_ahead_bound():
    """8.5's bound on what a driver hands its transport ahead of the socket, in the text, the
    checklist and section 18, as constants.json's `driver.max_handed_ahead_bytes`."""
    bound = CONSTANTS["driver"]["max_handed_ahead_bytes"]
    sec = re.sub(r"\s+", " ", _section("8"))
    assert f"only while the transport holds fewer than **{bound:,} bytes**" in sec
    assert "(the handed-ahead bound, `driver.max_handed_ahead_bytes` in `spec/constants.json`)" \
        in sec
    assert f"waits behind at most {bound:,} bytes and one frame in the transport" in sec
    assert f"nor behind more than {bound:,} bytes handed to it ahead of the socket" in FLAT
    assert "under `driver` the handed-ahead bound of 8.5" in FLAT
    assert bound >= CONSTANTS["limits"]["min_max_frame_size"]


def test_sdk_defaults_match_the_section_17_table():
    doc = []
    for side, name, lang, default, reason in _rows(_section("17"), r"parent|worker"):
        m = re.fullmatch(r"(\d+|cpus)(?: (ms|bytes))?", default)
        assert m, f"{name}: default {default!r} is not VALUE [UNIT]"
        cpus = m.group(1) == "cpus"
        doc.append({"side": side, "name": name.strip("`"), "language": lang,
                    "value": None if cpus else int(m.group(1)),
                    "unit": "cpus" if cpus else (m.group(2) or "count"), "reason": reason})
    assert len(doc) >= 20
    assert CONSTANTS["sdk_defaults"] == doc
    # The protocol's own defaults (4.2) are the SDKs' defaults.
    parent = {d["name"]: d["value"] for d in doc if d["side"] == "parent"}
    for key in ("max_frame_size", "initial_credit", "max_message_size"):
        assert parent[key] == CONSTANTS["protocol_defaults"][key], key
    assert parent["heartbeat_ms"] == CONSTANTS["protocol_defaults"]["heartbeat_ms"]
    worker = {d["name"]: d["value"] for d in doc if d["side"] == "worker"}
    assert worker["max_frame_size"] == CONSTANTS["protocol_defaults"]["worker_max_frame_size"]
    assert worker["max_concurrency"] == parent["max_in_flight"], "a default pair never clamps"
    for d in doc:
        if d["name"] == "rows_flush_interval":
            assert d["value"] < CONSTANTS["timing"]["rows_flush_bound_ms"], d


@pytest.mark.parametrize("path", ["conformance/scenarios.json", "conformance/hostile/scenarios.json"])
def test_conformance_error_code_tables_agree(path):
    """The scenario files name codes by their stable names; their tables must be the spec's."""
    table = json.loads((REPO / path).read_text(encoding="utf-8"))["error_codes"]
    ours = {e["name"]: e["code"] for e in CONSTANTS["error_codes"]}
    assert table and all(ours.get(name) == code for name, code in table.items()), \
        {n: c for n, c in table.items() if ours.get(n) != c}


def test_shm_extension_matches_section_20():
    """The shm extension (section 20): its frames, codes, tag, fields, limits and defaults."""
    sec = _section("20")
    flat = re.sub(r"\s+", " ", sec)
    shm = CONSTANTS["extensions"]["shm"]
    frames = {}
    for code, name, direction, ident, payload in _rows(sec, r"0x[0-9A-F]{2}"):
        size = re.search(r"exactly (\d+) bytes", payload)
        frames[name] = {"code": int(code, 16), "name": name,
                        "direction": {"both": "both"}[direction],
                        "id": {"0": "zero", "request": "request"}[ident],
                        "more_allowed": False, "payload_size": int(size.group(1))}
    assert len(frames) == 4 and shm["frame_types"] == list(frames.values())
    assert "None of them may carry `MORE` (`BAD_FLAGS`)" in flat
    # The frame sizes are the sums of their fields.
    for _c, name, _d, _i, payload in _rows(sec, r"0x[0-9A-F]{2}"):
        fields = re.findall(r"\b(u8|u16|u32|u64)\b", payload.split("`, ")[0])
        assert sum(SIZES[f] for f in fields) == frames[name]["payload_size"], name
    # Extension frame types and codes never collide with version 1's.
    base_types = {t["code"] for t in CONSTANTS["frame_types"]}
    assert not base_types & {t["code"] for t in shm["frame_types"]}
    base_codes = {e["code"] for e in CONSTANTS["error_codes"]}
    doc_codes = [{"code": int(c), "name": n, "class": "protocol", "fate": "connection_closed"}
                 for c, n, _meaning in _rows(sec, r"\d{3}")]
    assert shm["error_codes"] == doc_codes and len(doc_codes) == 4
    assert not base_codes & {e["code"] for e in doc_codes}
    assert "All four are protocol violations (section 3): the connection is closed." in flat
    for e in doc_codes:
        rng = next(c for c in CONSTANTS["error_classes"] if c["from"] <= e["code"] <= c["to"])
        assert (e["class"], e["fate"]) == (rng["class"], rng["fate"])
    # Negotiation: the tag, the entries' fields, the block layout.
    assert f"Tags: `{shm['tag']}` shm" in flat
    block = CONSTANTS["extensions"]["block"]
    assert "`tag u16, length u16, data (length bytes)`" in flat
    assert block["entry_fields"] == [["tag", "u16"], ["length", "u16"]]
    lo, hi = block["private_tags"]
    assert f"`{lo:#06X}`-`{hi:#06X}` private use".replace("0X", "0x") in flat
    neg = {r[0]: r[1] for r in _rows(sec, r"HELLO .*|WELCOME .*")}
    hello = next(v for k, v in neg.items() if k.startswith("HELLO"))
    welcome = next(v for k, v in neg.items() if k.startswith("WELCOME"))
    assert [list(f) for f in re.findall(r"(\w+) (u\d+)", hello)] == shm["hello_fields"]
    assert [list(f) for f in re.findall(r"(\w+) (u\d+)", welcome)] == shm["welcome_fields"]
    assert f"length >= {sum(SIZES[t] for _n, t in shm['hello_fields'])} in HELLO, >= " \
        f"{sum(SIZES[t] for _n, t in shm['welcome_fields'])} in WELCOME" in flat
    # Limits, seals, the messages a body can belong to, and the SDK defaults.
    lim = shm["limits"]
    assert f"at most {lim['max_live_regions']} regions are live" in flat
    assert f"at most {lim['max_descriptors_per_write']} per call" in flat
    assert f"more than {lim['max_queued_descriptors']} received and not yet taken" in flat
    assert all(f"`{s}`" in flat for s in shm["required_seals"])
    assert f"lacks `{shm['required_seals'][0]}` or `{shm['required_seals'][1]}`" in flat
    assert "first frame (REQUEST, RESULT or END)" in flat and shm["body_of"] == \
        ["REQUEST", "RESULT", "END"]
    d = shm["sdk_defaults"]
    assert d["to_worker_window"] == d["to_parent_window"] == d["window"] == \
        _number(re.search(r"both windows ([\d,]+) bytes", flat).group(1))
    assert d["window"] == CONSTANTS["protocol_defaults"]["max_message_size"]
    assert d["shm_threshold"] == \
        _number(re.search(r"message bodies of at least ([\d,]+) bytes", flat).group(1))
    assert d["shm_idle_retire_ms"] == \
        _number(re.search(r"`shm_idle_retire` \(([\d,]+) ms in the SDKs", flat).group(1))


def test_remote_workers_match_section_21():
    """Remote workers (section 21): the ticket, the JOIN block, the ALPN name, the defaults."""
    sec = _section("21")
    flat = re.sub(r"\s+", " ", sec)
    r = CONSTANTS["remote"]
    assert f"`{r['ticket_prefix']}` followed by the base64url" in flat
    assert f"at most {r['ticket_max_chars']:,} characters in all" in flat
    assert [row[0].strip("`") for row in _rows(sec, r"`\w+`")] == r["ticket_fields"]
    assert f"the ALPN protocol `{r['alpn']}`" in flat
    join = [(int(off), int(size), field) for off, size, field, _rule in _rows(sec, r"\d+")]
    assert [[field, size] for _off, size, field in join] == r["join_fields"]
    assert all(a[0] + a[1] == b[0] for a, b in zip(join, join[1:])), "contiguous"
    assert join[-1][0] + join[-1][1] == r["join_bytes"]
    assert f"exactly {r['join_bytes']} bytes" in flat
    magic = r["join_magic"]
    assert f"ASCII `{magic}` (`{' '.join(f'{b:02x}' for b in magic.encode())}`)" in flat
    assert f"| version | {r['join_version']} (u16) |" in sec
    d = r["sdk_defaults"]
    for name, value in d.items():
        assert f"`{name}` {value:,}" in flat, name
    assert f"`join_timeout` of the TCP accept (SDK default {d['join_timeout_ms']:,} ms)" in flat
    assert f"(SDK default {d['hello_timeout_ms']:,} ms, the local `startup_timeout`)" in flat
    assert f"`max_pending_joins` connections (SDK default {d['max_pending_joins']})" in flat
    assert f"at most {d['refusal_log_per_second']} lines a second" in flat
    assert f"the default {d['remote_heartbeat_ms']:,} ms for its remote workers" in flat
    assert f"(SDK default {d['welcome_timeout_ms']:,} ms, above the parent's" in flat
    # The join adds no error code: refusals use version 1's.
    assert "The join adds no error code." in flat
    known = {e["name"] for e in CONSTANTS["error_codes"]} | \
        {t["name"] for t in CONSTANTS["frame_types"]} | \
        {magic, "WIREPOOL_FD", "WIREPOOL_TICKET", "WIREPOOL_TICKET_FILE"}
    assert set(re.findall(r"`([A-Z_]{6,})`", sec)) <= known


def test_core_api_names_are_section_14s():
    """core_api lists exactly the operations section 14 names: the first column of its
    `operation` tables and its Queries line (the constructor aside)."""
    sec = _section("14")
    doc: set[str] = set()
    in_ops = False
    for line in sec.splitlines():
        if not line.startswith("|"):
            in_ops = False
            continue
        first = line.strip().strip("|").split("|")[0].strip()
        if first == "operation":
            in_ops = True
        elif in_ops:
            doc.update(re.findall(r"`([a-z_]+)", first))
    queries = re.search(r"\*\*Queries:\*\*(.*?)\n\n", sec, re.S)
    assert queries, "section 14 lost its Queries line"
    doc.update(re.findall(r"`([a-z_]+)\(", queries.group(1)))
    api = CONSTANTS["core_api"]
    ours = [n for part in ("receiving", "sending", "queries", "rows_builder", "batch", "policies")
            for n in api[part]]
    assert len(ours) == len(set(ours)), "a name is listed twice in core_api"
    assert set(ours) == doc, (sorted(set(ours) - doc), sorted(doc - set(ours)))
