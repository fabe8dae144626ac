"""Codecs: every installed codec round-trips, raw is zero-copy, stdlib json is the fallback."""

from __future__ import annotations

import sys

import pytest

from wirepool import codecs

VALUE = {"a": [1, 2.5, "three", None, True], "b": {"c": "d"}}


@pytest.mark.parametrize("name", [n for n in codecs.available() if n not in ("raw", "arrow")])
def test_round_trip_from_memoryview(name: str) -> None:
    c = codecs.get(name)
    data = bytes(c.encode(VALUE))
    assert c.decode(memoryview(data)) == VALUE
    assert codecs.by_id(c.id) is c


def test_raw_is_zero_copy() -> None:
    c = codecs.get("raw")
    view = memoryview(b"abc")
    assert c.decode(view) is view
    assert c.encode(view) is view
    with pytest.raises(TypeError):
        c.encode({"not": "bytes"})


def test_stdlib_json_fallback_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "orjson", None)  # import orjson -> ImportError
    c = codecs._make_json()
    assert c.encode(VALUE) == b'{"a":[1,2.5,"three",null,true],"b":{"c":"d"}}'
    assert c.decode(memoryview(c.encode(VALUE))) == VALUE


def test_unavailable_codec_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codecs._cache, "arrow", None)
    with pytest.raises(codecs.CodecUnavailable, match=r"wirepool\[arrow\]"):
        codecs.get("arrow")
    with pytest.raises(codecs.CodecUnavailable):
        codecs.get("yaml")


def test_arrow_round_trip() -> None:
    pa = pytest.importorskip("pyarrow")
    c = codecs.get("arrow")
    table = pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    assert c.decode(memoryview(c.encode(table))).equals(table)
    assert c.decode(c.encode({"a": [1]})).to_pydict() == {"a": [1]}
