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
