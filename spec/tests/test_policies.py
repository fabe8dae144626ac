"""spec/vectors/policies.json against section 14.5 and constants.json: one list per policy,
and the reference (policy_cases.py) reproduces every case the file holds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONSTANTS = json.loads((REPO / "spec" / "constants.json").read_text(encoding="utf-8"))
VECTORS = json.loads((REPO / "spec" / "vectors" / "policies.json").read_text(encoding="utf-8"))
sys.path.insert(0, str(REPO / "spec" / "vectors"))
import policy_cases  # noqa: E402


def test_policies_json_has_a_list_per_policy():
    """14.5's pure functions are core_api's `policies`, each with its cases in policies.json."""
    vectors = VECTORS
    lists = {k for k, v in vectors.items() if isinstance(v, list)}
    assert lists == set(CONSTANTS["core_api"]["policies"])
    assert all(len(vectors[k]) >= 8 for k in lists)


def test_the_limits_of_the_reference_are_the_constants():
    lim, ci = CONSTANTS["limits"], CONSTANTS["caller_input"]
    assert policy_cases.MIN_FRAME == lim["min_max_frame_size"]
    assert policy_cases.MAX_FRAME == lim["max_max_frame_size"]
    assert policy_cases.MAX_CREDIT == lim["max_credit"]
    assert policy_cases.MAX_TIMEOUT_MS == ci["max_timeout_ms"]
    assert policy_cases.MAX_U32 == ci["max_count"] and policy_cases.MAX_SIZE == ci["max_size"]
    assert policy_cases.DEFAULT_HEARTBEAT_MS == CONSTANTS["protocol_defaults"]["heartbeat_ms"]


def test_the_adaptive_window_constants_are_section_6s():
    """adaptive_credit in constants.json, the reference's constants and the text of section 6
    say the same numbers, each with its reason."""
    a = CONSTANTS["adaptive_credit"]
    assert (policy_cases.GROW_WITHIN_RTTS, policy_cases.SHRINK_AFTER_RTTS) == \
        (a["grow_within_rtts"], a["shrink_after_rtts"])
    assert (policy_cases.MAX_STREAM_WINDOW, policy_cases.MAX_CONNECTION_WINDOW) == \
        (a["max_stream_window"], a["max_connection_window"])
    assert set(a["reasons"]) == set(a) - {"about", "reasons"}
    text = (REPO / "spec" / "PROTOCOL.md").read_text(encoding="utf-8")
    flat = " ".join(text.split())
    assert f"Drained within **{a['grow_within_rtts']}** RTT (`grow_within_rtts`)" in flat
    assert f"Drained in more than **{a['shrink_after_rtts']}** RTT (`shrink_after_rtts`)" in flat
    assert f"`max_stream_window` (**{a['max_stream_window']:,}** bytes)" in flat
    assert f"`max_connection_window` (**{a['max_connection_window']:,}** bytes)" in flat
    assert a["max_stream_window"] <= a["max_connection_window"] <= policy_cases.MAX_CREDIT
    assert a["shrink_after_rtts"] >= 2 * a["grow_within_rtts"], "no hysteresis: it oscillates"


def test_the_adaptive_window_changes_no_bytes():
    """Every window the rule picks is a credit a CREDIT frame can carry (1 - 2^31 - 1), and a
    grant at half the window covers a halving (never a negative grant)."""
    for c in VECTORS["stream_window"]:
        new, old = c["expect"], c["window"]
        assert c["initial_credit"] <= new <= policy_cases.MAX_CREDIT, c["name"]
        assert old - new <= old // 2 + 1, c["name"]
