"""spec/metrics.json, the metrics contract (PROTOCOL.md section 23), is consistent in itself.

Every parent SDK's exporter is checked against the file by its own test (Python
python/tests/test_metrics_contract.py, Rust rust/wirepool/tests/metrics_contract.rs, Go
go/pool/prometheus_test.go); here the file itself: Prometheus naming conventions, units that
match their suffixes, labels that are defined, bucket bounds that increase, label values that
exist in constants.json.

    python3 -m pytest spec/tests/test_metrics_contract.py -q
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parents[1]
CONTRACT = json.loads((SPEC / "metrics.json").read_text(encoding="utf-8"))
CONSTANTS = json.loads((SPEC / "constants.json").read_text(encoding="utf-8"))
PROTOCOL = (SPEC / "PROTOCOL.md").read_text(encoding="utf-8")
SERIES = CONTRACT["series"]
NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
TYPES = {"counter", "gauge", "histogram"}
# Words that, as the last part of a name, would claim a unit the contract does not list.
NON_BASE_UNITS = ("_milliseconds", "_microseconds", "_nanoseconds", "_ms", "_us", "_kb", "_mb",
                  "_kilobytes", "_megabytes", "_minutes", "_hours", "_percent")


def ids(s: dict) -> str:
    return str(s["name"])


def test_top_level_keys() -> None:
    assert set(CONTRACT) == {"about", "version", "prefix", "conventions", "labels", "buckets",
                             "series"}
    assert CONTRACT["prefix"] == "wirepool_"
    assert isinstance(CONTRACT["version"], int) and CONTRACT["version"] >= 1


def test_names_are_unique() -> None:
    names = [s["name"] for s in SERIES]
    assert len(names) == len(set(names))
    # No family's samples collide with another family (a histogram's _bucket/_sum/_count).
    samples = []
    for s in SERIES:
        if s["type"] == "histogram":
            samples += [s["name"] + x for x in CONTRACT["conventions"]["histogram_samples"]]
        else:
            samples.append(s["name"])
    assert len(samples) == len(set(samples)) and not set(samples) & (set(names) - {
        s["name"] for s in SERIES if s["type"] != "histogram"})


@pytest.mark.parametrize("s", SERIES, ids=ids)
def test_series_fields(s: dict) -> None:
    allowed = {"name", "type", "labels", "unit", "required", "help", "buckets", "optional_reason"}
    assert set(s) <= allowed, set(s) - allowed
    assert {"name", "type", "labels", "unit", "required", "help"} <= set(s)
    assert s["type"] in TYPES
    assert isinstance(s["required"], bool)
    assert isinstance(s["help"], str) and s["help"].strip() == s["help"] and s["help"]
    assert s["help"].endswith(".") and "\n" not in s["help"] and "\\" not in s["help"]
    if not s["required"]:
        assert s.get("optional_reason"), f"{s['name']}: an optional series says why"
    else:
        assert "optional_reason" not in s


@pytest.mark.parametrize("s", SERIES, ids=ids)
def test_names_follow_prometheus_conventions(s: dict) -> None:
    name = s["name"]
    assert NAME.match(name), name
    assert name.startswith(CONTRACT["prefix"])
    assert "__" not in name and not name.endswith("_")
    if s["type"] == "counter":
        assert name.endswith("_total"), f"a counter ends in _total: {name}"
    else:
        assert not name.endswith("_total"), f"only counters end in _total: {name}"
    for suffix in ("_bucket", "_sum", "_count", "_created", "_info"):
        assert not name.endswith(suffix), f"{name}: a reserved suffix"
    for bad in NON_BASE_UNITS:
        assert not name.removesuffix("_total").endswith(bad), f"{name}: not a base unit"


@pytest.mark.parametrize("s", SERIES, ids=ids)
def test_units_match_suffixes(s: dict) -> None:
    units = CONTRACT["conventions"]["units"]
    stem = s["name"].removesuffix("_total")
    if s["unit"]:
        assert s["unit"] in units, s["unit"]
        assert stem.endswith(units[s["unit"]]), f"{s['name']} has unit {s['unit']}"
    else:
        for unit, suffix in units.items():
            assert not stem.endswith(suffix), f"{s['name']} ends in {suffix}: unit {unit!r}"
    if s["type"] == "histogram":
        assert s["unit"] == "seconds" or s["unit"] == "bytes", "a histogram measures something"


@pytest.mark.parametrize("s", SERIES, ids=ids)
def test_labels_are_known(s: dict) -> None:
    labels = s["labels"]
    assert labels and labels[0] == "pool", "every series is labelled by pool, first"
    assert len(labels) == len(set(labels))
    for label in labels:
        assert label in CONTRACT["labels"], f"{s['name']}: label {label} is not defined"
        assert NAME.match(label) and not label.startswith("__")
        assert label != CONTRACT["conventions"]["histogram_bucket_label"]
    per_worker = s["name"].startswith("wirepool_worker_")
    assert ("worker" in labels) == per_worker, f"{s['name']}: per-worker means label worker"


def test_every_label_is_used_and_described() -> None:
    used = {label for s in SERIES for label in s["labels"]}
    assert used == set(CONTRACT["labels"])
    for name, label in CONTRACT["labels"].items():
        assert label["help"], name
        assert set(label) <= {"help", "values", "values_from", "pattern"}
        if "values" in label:
            values = label["values"]
            assert values and len(values) == len(set(values))
            assert all(NAME.match(v) for v in values), values


def test_code_values_are_the_spec_error_code_names() -> None:
    assert CONTRACT["labels"]["code"]["values_from"] == "constants.json:error_codes[].name"
    names = [e["name"] for e in CONSTANTS["error_codes"]]
    assert "HANDLER_ERROR" in names and "WORKER_EXITED" in names
    assert all(re.match(r"^[A-Z][A-Z0-9_]*$", n) for n in names)


def test_state_values_are_the_worker_states() -> None:
    assert CONTRACT["labels"]["state"]["values"] == ["starting", "ready", "leased", "draining",
                                                     "dead"]


@pytest.mark.parametrize("name", sorted(CONTRACT["buckets"]))
def test_bucket_bounds_increase(name: str) -> None:
    bounds = CONTRACT["buckets"][name]
    assert len(bounds) >= 5
    assert all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
    assert bounds[0] > 0
    assert all(a < b for a, b in zip(bounds, bounds[1:])), bounds
    assert name.endswith("_" + "seconds") or name.endswith("_bytes")


@pytest.mark.parametrize("s", SERIES, ids=ids)
def test_histograms_name_their_buckets(s: dict) -> None:
    if s["type"] == "histogram":
        assert s["buckets"] in CONTRACT["buckets"], s["buckets"]
        assert s["buckets"].endswith("_" + s["unit"]), "bounds in the series' unit"
    else:
        assert "buckets" not in s


def test_every_bucket_set_is_used() -> None:
    assert {s["buckets"] for s in SERIES if "buckets" in s} == set(CONTRACT["buckets"])


def test_the_issue_28_coverage_is_required() -> None:
    required = {s["name"] for s in SERIES if s["required"]}
    for name in ("wirepool_calls_total", "wirepool_streams_total", "wirepool_worker_rows_total",
                 "wirepool_worker_sent_bytes_total", "wirepool_worker_received_bytes_total",
                 "wirepool_errors_total", "wirepool_restarts_total", "wirepool_recycles_total",
                 "wirepool_retries_total", "wirepool_worker_in_flight",
                 "wirepool_queue_wait_seconds", "wirepool_method_duration_seconds",
                 "wirepool_worker_heartbeat_rtt_seconds", "wirepool_worker_rss_bytes",
                 "wirepool_workers_alive", "wirepool_worker_state", "wirepool_worker_pid"):
        assert name in required, name
    by_name = {s["name"]: s for s in SERIES}
    assert "code" in by_name["wirepool_errors_total"]["labels"]
    assert "cause" in by_name["wirepool_restarts_total"]["labels"]
    assert "method" in by_name["wirepool_method_duration_seconds"]["labels"]


def test_protocol_md_points_at_the_contract() -> None:
    m = re.search(r"^## (\d+)\. Metrics\b.*?(?=^## |\Z)", PROTOCOL, re.S | re.M)
    assert m, "PROTOCOL.md has a Metrics section"
    assert "spec/metrics.json" in m.group(0)
    assert f"section {m.group(1)}" in CONTRACT["about"]


# Every parent of conformance/languages.json has an exporter on the contract and a test that
# scrapes it against this file, or is named here with the issue that owes one (parity: the
# capability's test says plainly which SDK lacks it).
EXPORTER_TESTS = {
    "python": "python/tests/test_prometheus.py",
    "rust": "rust/wirepool/tests/prometheus.rs",
    "node": "node/test/prometheus.test.ts",
    "go": "go/pool/prometheus_test.go",
}
EXPORTER_PENDING: dict[str, str] = {}


def test_every_parent_exports_the_contract_or_is_named_pending() -> None:
    languages = json.loads((SPEC.parent / "conformance" / "languages.json").read_text("utf-8"))
    parents = {lang["name"] for lang in languages["languages"] if "parent" in lang}
    assert not set(EXPORTER_TESTS) & set(EXPORTER_PENDING)
    assert parents == set(EXPORTER_TESTS) | set(EXPORTER_PENDING), (
        f"parents {sorted(parents)}: each needs an exporter test or a pending entry")
    for lang, path in EXPORTER_TESTS.items():
        text = (SPEC.parent / path).read_text(encoding="utf-8")
        assert "metrics.json" in text, f"{path} ({lang}) does not read the contract"
    for lang, why in EXPORTER_PENDING.items():
        print(f"NOTICE: the {lang} parent exports no metrics: {why}")
