"""The Python SDK's constants and defaults against spec/constants.json (PROTOCOL.md 17-18).

The spec's tests check constants.json against PROTOCOL.md; these check this SDK against
constants.json, so a code, a limit or a default copied by hand cannot drift from the spec.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import pytest

from wirepool import (_constants, _pooled_worker, _shm, _shm_proto, _validate, errors, pool, proto,
                      remote, worker)
from wirepool.errors import ErrorCode

CONSTANTS = json.loads((Path(__file__).resolve().parents[2] / "spec" / "constants.json")
                       .read_text(encoding="utf-8"))
TYPES = {t["name"]: t for t in CONSTANTS["frame_types"]}
LIMITS = CONSTANTS["limits"]


def test_frame_types() -> None:
    ours = {name: value for name, value in vars(proto.FrameType).items() if name.isupper()}
    assert ours == {n: t["code"] for n, t in TYPES.items()}
    assert proto._TYPE_NAMES == {t["code"]: n for n, t in TYPES.items()}


def test_frame_type_rules() -> None:
    rule = {"zero": 0, "request": 1, "any": 2}
    assert proto._ID_RULE == {t["code"]: rule[t["id"]] for t in TYPES.values()}
    assert proto._MORE_ALLOWED == {t["code"] for t in TYPES.values() if t["more_allowed"]}
    to_parent = {t["code"] for t in TYPES.values() if t["direction"] != "parent_to_worker"}
    to_worker = {t["code"] for t in TYPES.values() if t["direction"] != "worker_to_parent"}
    assert proto._PARENT_RECEIVES == to_parent
    assert proto._WORKER_RECEIVES == to_worker
    assert proto._PREFIX_SIZE == {t["code"]: t["continued_prefix"] for t in TYPES.values()
                                  if t.get("continued_prefix") and t["name"] != "CONTINUATION"} \
        | {proto.FrameType.RESULT: 0}


def test_error_codes_and_classes() -> None:
    shm = CONSTANTS["extensions"]["shm"]["error_codes"]
    assert {c.name: c.value for c in ErrorCode} == \
        {e["name"]: e["code"] for e in CONSTANTS["error_codes"] + shm}
    assert all(ErrorCode(e["code"]) >= 100 and ErrorCode(e["code"]) < 200 for e in shm)
    names = {"protocol": "PROTOCOL", "request": "REQUEST_ERROR", "local": "LOCAL_ERROR",
             "application": "APPLICATION", "unassigned": "UNKNOWN"}
    for c in CONSTANTS["error_classes"]:
        for code in (c["from"], c["to"]):
            if errors.code_name(code) not in {e.name for e in ErrorCode}:  # unknown: by range
                assert errors.code_name(code) == names[c["class"]], code


def test_codecs_kinds_and_limits() -> None:
    ours = {name: value for name, value in vars(proto.CodecId).items() if name.isupper()}
    assert sorted(ours.values()) == [c["id"] for c in CONSTANTS["codecs"]]
    assert {"unary": proto.MethodKind.UNARY, "stream": proto.MethodKind.STREAM} == \
        CONSTANTS["method_kinds"]
    assert proto.PROTOCOL_VERSION == CONSTANTS["protocol_version"]
    assert proto.HEADER_SIZE == CONSTANTS["header"]["size"] == proto._HEADER.size
    assert proto.MAGIC == CONSTANTS["magic"].encode()
    assert proto.FLAG_MORE == CONSTANTS["flags"]["MORE"]
    assert proto.HANDSHAKE_MAX_FRAME_SIZE == LIMITS["handshake_max_frame_size"]
    assert proto.MIN_FRAME_SIZE_LIMIT == LIMITS["min_max_frame_size"]
    assert proto.MAX_FRAME_SIZE_LIMIT == LIMITS["max_max_frame_size"]
    assert proto.MAX_CREDIT == LIMITS["max_credit"]


def test_error_code_is_the_generated_enum() -> None:
    assert errors.ErrorCode is _constants.ErrorCode is ErrorCode


# The SDK's names for the generated constants (spec/generate_constants.py): each must BE the
# generated value, so that none is typed by hand again. Seconds where the API takes seconds.
GENERATED = [
    (proto.PROTOCOL_VERSION, "PROTOCOL_VERSION"), (proto.HEADER_SIZE, "HEADER_SIZE"),
    (proto.FLAG_MORE, "FLAG_MORE"), (proto.HANDSHAKE_MAX_FRAME_SIZE, "HANDSHAKE_MAX_FRAME_SIZE"),
    (proto.MIN_FRAME_SIZE_LIMIT, "MIN_MAX_FRAME_SIZE"),
    (proto.MAX_FRAME_SIZE_LIMIT, "MAX_MAX_FRAME_SIZE"), (proto.MAX_CREDIT, "MAX_CREDIT"),
    (proto.DEFAULT_MAX_FRAME_SIZE, "DEFAULT_MAX_FRAME_SIZE"),
    (proto.DEFAULT_INITIAL_CREDIT, "DEFAULT_INITIAL_CREDIT"),
    (proto.DEFAULT_HEARTBEAT_MS, "DEFAULT_HEARTBEAT_MS"),
    (proto.DEFAULT_MAX_MESSAGE_SIZE, "DEFAULT_MAX_MESSAGE_SIZE"),
    (_shm_proto.TAG_SHM, "SHM_TAG"), (_shm_proto.MAX_LIVE_REGIONS, "SHM_MAX_LIVE_REGIONS"),
    (_shm_proto.MAX_QUEUED_DESCRIPTORS, "SHM_MAX_QUEUED_DESCRIPTORS"),
    (_shm.MAX_FDS_PER_WRITE, "SHM_MAX_DESCRIPTORS_PER_WRITE"),
    (remote.TICKET_PREFIX, "REMOTE_TICKET_PREFIX"),
    (remote.TICKET_MAX_CHARS, "REMOTE_TICKET_MAX_CHARS"),
    (remote.JOIN_MAGIC.decode(), "REMOTE_JOIN_MAGIC"), (remote.JOIN_VERSION, "REMOTE_JOIN_VERSION"),
    (remote.JOIN_SIZE, "REMOTE_JOIN_BYTES"), (remote.ALPN, "REMOTE_ALPN"),
    (remote.DEFAULT_JOIN_TIMEOUT * 1000, "REMOTE_DEFAULT_JOIN_TIMEOUT_MS"),
    (remote.DEFAULT_HELLO_TIMEOUT * 1000, "REMOTE_DEFAULT_HELLO_TIMEOUT_MS"),
    (remote.DEFAULT_WELCOME_TIMEOUT * 1000, "REMOTE_DEFAULT_WELCOME_TIMEOUT_MS"),
    (remote.DEFAULT_MAX_PENDING_JOINS, "REMOTE_DEFAULT_MAX_PENDING_JOINS"),
    (remote.DEFAULT_REFUSAL_LOG_PER_SECOND, "REMOTE_DEFAULT_REFUSAL_LOG_PER_SECOND"),
    (remote.DEFAULT_REMOTE_HEARTBEAT_MS, "REMOTE_DEFAULT_REMOTE_HEARTBEAT_MS"),
    (remote.DEFAULT_POOL_TICKET_TTL, "REMOTE_DEFAULT_POOL_TICKET_TTL_S"),
    (remote.HEARTBEAT_MISSES, "HEARTBEAT_MISSES"), (_pooled_worker.HEARTBEAT_MISSES, "HEARTBEAT_MISSES"),
    (_validate.MAX_TIMEOUT_S * 1000, "MAX_TIMEOUT_MS"),
    (errors.QUOTED_MAX_CHARS, "QUOTED_MAX_CHARS"),
]


@pytest.mark.parametrize("ours,name", GENERATED, ids=[n for _, n in GENERATED])
def test_the_sdk_takes_the_generated_constants(ours: Any, name: str) -> None:
    assert ours == getattr(_constants, name)


def test_the_validation_bounds_are_the_generated_ones() -> None:
    src = inspect.getsource(_validate)
    for name in ("MAX_TIMEOUT_MS", "MAX_WORKERS", "MAX_COUNT", "MAX_SIZE", "MAX_CREDIT",
                 "MIN_MAX_FRAME_SIZE", "MAX_MAX_FRAME_SIZE"):
        assert getattr(_validate, name) is getattr(_constants, name), name
    assert "2**31" not in src and "4096" not in src and "4_096" not in src


def test_no_heartbeat_miss_count_by_hand() -> None:
    """Every liveness limit is HEARTBEAT_MISSES periods (8.5, 21.5), never a literal 3."""
    for module in (pool, remote, worker):
        src = inspect.getsource(module)
        assert "3 * period" not in src and "3 * self._period" not in src, module.__name__


def test_protocol_defaults() -> None:
    d = CONSTANTS["protocol_defaults"]
    assert proto.DEFAULT_INITIAL_CREDIT == d["initial_credit"]
    assert proto.DEFAULT_HEARTBEAT_MS == d["heartbeat_ms"]
    assert proto.DEFAULT_MAX_MESSAGE_SIZE == d["max_message_size"]


# Pending: edits to pool.py/proto.py listed in /work/notes/issue10_python_defaults.md. Each is a
# strict xfail, so it fails (XPASS) the moment the edit lands: then delete its name here.
PENDING: set[str] = set()

S = {"ms": 1e-3}  # the SDK takes seconds where the table says ms


def _pool_default(name: str) -> Any:
    return inspect.signature(pool.AsyncPool.__init__).parameters[name].default


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _parent(name: str) -> Any:
    """This SDK's value of a parent default, in the table's unit."""
    seconds = {"startup_timeout", "cancel_grace", "deadline_grace", "restart_backoff",
               "restart_backoff_max", "restart_window"}
    if name == "workers":
        return pool.AsyncPool(["true"]).size
    if name in seconds:
        return round(_pool_default(name) * 1000)
    if name == "drain_grace":
        return round(_pool_default("drain_grace") * 1000)
    if name == "goodbye_grace":
        return round(_pooled_worker._GOODBYE_GRACE * 1000)
    if name == "stderr_tail_lines":
        return _pooled_worker._STDERR_TAIL_LINES
    return _pool_default(name)


def _worker(name: str) -> Any:
    serve = inspect.signature(worker.serve).parameters
    return {
        "max_concurrency": serve["max_concurrency"].default,
        "max_frame_size": serve["max_frame_size"].default,
        "rows_flush_interval": round(worker.ROWS_FLUSH_INTERVAL * 1000),
        "rows_batch_bytes": worker.ROWS_FLUSH_BYTES,
        "event_interval": round(worker.EVENT_INTERVAL * 1000),
    }[name]


DEFAULTS = [d for d in CONSTANTS["sdk_defaults"] if d["language"] in ("all", "python")]


def _param(d: dict) -> Any:
    key = f"{d['side']}.{d['name']}"
    marks = [pytest.mark.xfail(strict=True, reason="pending edit of pool.py")] \
        if key in PENDING else []
    return pytest.param(d, id=key, marks=marks)


@pytest.mark.parametrize("default", [_param(d) for d in DEFAULTS])
def test_sdk_default(default: dict) -> None:
    ours = _parent(default["name"]) if default["side"] == "parent" else _worker(default["name"])
    want = _cpus() if default["unit"] == "cpus" else default["value"]
    assert ours == want, f"{default['side']} {default['name']}: {ours} != {want}: " \
        f"{default['reason']}"
    if default["value"] is not None:  # and it is the generated constant, not a copy
        unit = {"ms": "_MS", "bytes": "_BYTES"}.get(default["unit"], "")
        name = f"{default['side'].upper()}_DEFAULT_{default['name'].upper()}"
        generated = getattr(_constants, name + unit, None)
        if generated is None:
            generated = getattr(_constants, name)
        assert ours == generated


def test_core_default_frame_size() -> None:
    assert proto.DEFAULT_MAX_FRAME_SIZE == CONSTANTS["protocol_defaults"]["max_frame_size"]


def test_every_default_is_checked() -> None:
    assert len(DEFAULTS) >= 20
    assert {d["name"] for d in DEFAULTS if d["language"] == "python"} == \
        {"rows_flush_interval", "rows_batch_bytes"}


def test_shm_lane_defaults() -> None:
    """PROTOCOL.md 20: the windows, the threshold and the idle retirement of both sides."""
    d = CONSTANTS["extensions"]["shm"]["sdk_defaults"]
    assert worker.SHM_WINDOW == d["window"]
    assert _pooled_worker.SHM_WINDOW == d["to_worker_window"] == d["to_parent_window"]
    assert worker.SHM_THRESHOLD == _pooled_worker.SHM_THRESHOLD == _pool_default("shm_threshold") \
        == d["shm_threshold"]
    assert _shm.IDLE_RETIRE == d["shm_idle_retire_ms"] * S["ms"]
    assert _pooled_worker.SHM_IDLE_RETIRE == _shm.IDLE_RETIRE


def test_the_core_offers_every_operation_of_section_14() -> None:
    api = CONSTANTS["core_api"]
    required = api["receiving"] + api["sending"] + api["queries"] + ["received"]
    missing = [n for n in required if not callable(getattr(proto.Connection, n, None))]
    assert missing == []
    builder = [n for n in api["rows_builder"] if not callable(getattr(proto.RowsBuilder, n, None))]
    assert builder == []
    # The Python core offers every batch operation of 14.4 (extend on the rows builder).
    batch = [n for n in api["batch"]
             if not callable(getattr(proto.RowsBuilder if n == "extend" else proto.Connection, n, None))]
    assert batch == []
    # The policies of 14.5 are module-level functions of the core.
    assert {"negotiate", "rows_batch_bytes", "grant", "fit_error", "stream_window"} <= \
        set(api["policies"])
    assert [n for n in api["policies"] if not callable(getattr(proto, n, None))] == []
