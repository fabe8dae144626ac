"""Convert between the JSON objects of spec/vectors and wirepool.proto frames/events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wirepool import proto

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"

_KIND = {"unary": proto.MethodKind.UNARY, "stream": proto.MethodKind.STREAM}
_KIND_NAME = {v: k for k, v in _KIND.items()}


def load(name: str) -> list[dict]:
    return json.loads((VECTORS / name).read_text())["cases"]


def frame_from_json(o: dict) -> proto.Frame:
    t, id, more = o["type"], o["id"], o.get("more", False)
    h = bytes.fromhex
    if t == "HELLO":
        return proto.Hello(min_version=o["min_version"], max_version=o["max_version"], pid=o["pid"],
                           max_concurrency=o["max_concurrency"], max_frame_size=o["max_frame_size"],
                           sdk_name=o["sdk_name"], sdk_version=o["sdk_version"], id=id, more=more,
                           methods=[proto.MethodInfo(m["name"], _KIND[m["kind"]], m["codecs"])
                                    for m in o["methods"]])
    if t == "WELCOME":
        return proto.Welcome(version=o["version"], worker_id=o["worker_id"],
                             max_frame_size=o["max_frame_size"], initial_credit=o["initial_credit"],
                             heartbeat_ms=o["heartbeat_ms"], max_in_flight=o["max_in_flight"],
                             max_message_size=o["max_message_size"], id=id, more=more)
    if t == "REQUEST":
        return proto.Request(id, o["method"], o["codec"], h(o["body"]), o["timeout_us"], more)
    if t == "CANCEL":
        return proto.Cancel(id, more)
    if t == "RESULT":
        return proto.Result(id, h(o["body"]), more)
    if t == "ERROR":
        return proto.ErrorFrame(id, o["code"], o["message"], o["details"], more)
    if t == "ROWS":
        return proto.Rows(id, [h(r) for r in o["rows"]], more)
    if t == "END":
        return proto.End(id, o["row_count"], h(o["summary"]), more)
    if t == "CREDIT":
        return proto.Credit(id, o["bytes"], more)
    if t == "EVENT":
        return proto.Event(id, o["topic"], o["data"], more)
    if t == "PING":
        return proto.Ping(h(o["nonce"]), id, more)
    if t == "PONG":
        return proto.Pong(h(o["nonce"]), id, more)
    if t == "DRAIN":
        return proto.Drain(o["grace_ms"], id, more)
    if t == "GOODBYE":
        return proto.Goodbye(o["reason"], id, more)
    if t == "CONTINUATION":
        return proto.Continuation(id, h(o["body"]), more)
    raise ValueError(f"unknown frame type {t}")


def to_json(f: proto.Frame, with_more: bool = True) -> dict[str, Any]:
    """A frame (or event) as the JSON object of the vectors."""
    o: dict[str, Any] = {"type": f.NAME, "id": f.id}
    if with_more and not isinstance(f, (proto.Late, proto.Reject)):
        o["more"] = f.more
    hx = lambda b: bytes(b).hex()  # noqa: E731
    if isinstance(f, proto.Hello):
        o.update(min_version=f.min_version, max_version=f.max_version, pid=f.pid,
                 max_concurrency=f.max_concurrency, max_frame_size=f.max_frame_size,
                 sdk_name=f.sdk_name, sdk_version=f.sdk_version,
                 methods=[{"name": m.name, "kind": _KIND_NAME[m.kind], "codecs": list(m.codecs)}
                          for m in f.methods])
    elif isinstance(f, proto.Welcome):
        o.update(version=f.version, worker_id=f.worker_id, max_frame_size=f.max_frame_size,
                 initial_credit=f.initial_credit, heartbeat_ms=f.heartbeat_ms,
                 max_in_flight=f.max_in_flight, max_message_size=f.max_message_size)
    elif isinstance(f, proto.Request):
        o.update(method=f.method, codec=f.codec, timeout_us=f.timeout_us, body=hx(f.body))
    elif isinstance(f, (proto.Result, proto.Continuation)):
        o.update(body=hx(f.body))
    elif isinstance(f, proto.ErrorFrame):
        o.update(code=f.code, message=f.message, details=f.details)
    elif isinstance(f, proto.Rows):
        o.update(rows=[hx(r) for r in f.rows])
    elif isinstance(f, proto.End):
        o.update(row_count=f.row_count, summary=hx(f.summary))
    elif isinstance(f, proto.Credit):
        o.update(bytes=f.bytes)
    elif isinstance(f, proto.Event):
        o.update(topic=f.topic, data=f.data)
    elif isinstance(f, proto.Ping):  # PONG too
        o.update(nonce=hx(f.nonce))
    elif isinstance(f, proto.Drain):
        o.update(grace_ms=f.grace_ms)
    elif isinstance(f, proto.Goodbye):
        o.update(reason=f.reason)
    elif isinstance(f, proto.Late):
        o.update(frame=f.frame)
    elif isinstance(f, proto.Reject):
        o.update(code=f.code, name=f.name)
    return o
