"""The founding workload's row shapes (bench/shapes/founding.json), for every Python runner.

    founding.py digest SHAPE N     # sha256 of rows 0..N-1 as compact JSON, one per line
    founding.py sizes              # each shape's JSON bytes at its reference row

``row_factory(shape)`` turns the shape's field list into one function ``i -> dict`` (compiled
once from the data, so generating a row costs what a hand-written dict literal costs).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

SPEC_PATH = Path(__file__).resolve().parent.parent / "shapes" / "founding.json"
SPEC: dict[str, Any] = json.loads(SPEC_PATH.read_text())
SHAPES: dict[str, Any] = SPEC["shapes"]


def _field_expr(f: dict[str, Any]) -> str:
    kind = f["kind"]
    if kind == "index":
        return "i"
    if kind == "int":
        return f"{int(f['add'])} + i % {int(f['mod'])}"
    if kind == "str":
        return f"{f['prefix']!r} + str(i)" if f.get("index_suffix") else repr(f["prefix"])
    if kind == "payload":
        return "'%08d' % (i % 100000000) + _TAIL"
    raise ValueError(f"unknown field kind {kind!r}")


def payload_tail(f: dict[str, Any]) -> str:
    """The payload's text after its 8 digits: ``fill`` repeated to ``len - 8`` characters."""
    want = int(f["len"]) - 8
    fill = f["fill"]
    return (fill * (want // len(fill) + 1))[:want]


def row_factory(shape: str) -> Callable[[int], dict[str, Any]]:
    """``i -> row`` for a shape of founding.json (KeyError for an unknown shape)."""
    fields = SHAPES[shape]["fields"]
    tail = next((payload_tail(f) for f in fields if f["kind"] == "payload"), "")
    body = ", ".join(f"{f['name']!r}: {_field_expr(f)}" for f in fields)
    make: Callable[[int], dict[str, Any]] = eval(f"lambda i: {{{body}}}", {"_TAIL": tail})
    return make


def index_field(shape: str) -> str:
    return next(f["name"] for f in SHAPES[shape]["fields"] if f["kind"] == "index")


def row_json(row: dict[str, Any]) -> bytes:
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()


def digest(shape: str, n: int) -> str:
    make = row_factory(shape)
    h = hashlib.sha256()
    for i in range(n):
        h.update(row_json(make(i)) + b"\n")
    return h.hexdigest()


def sizes() -> dict[str, int]:
    return {name: len(row_json(row_factory(name)(s["json_bytes_at"])))
            for name, s in SHAPES.items()}


if __name__ == "__main__":
    if sys.argv[1:2] == ["digest"]:
        print(digest(sys.argv[2], int(sys.argv[3])))
    else:
        print(json.dumps(sizes()))
