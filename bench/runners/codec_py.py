"""The codec alone on the founding rows, Python (runner ``codec_python``): per repeat every row of
the scenario encoded and decoded back into a dict with python/wirepool's own codec functions
(``wirepool.codecs.get(name).encode/decode``: orjson, ormsgpack or msgpack, cbor2), one row at a
time, in one process; passes repeat until the scenario's window has passed. Figures:
``rows_per_s`` (encode + decode), ``encode_rows_per_s``, ``decode_rows_per_s``.

Usage: codec_py.py '<scenario json>'
"""

from __future__ import annotations

import os
import sys
import time

from common import figure, load_scenario, ok, peak_rss_kib, unsupported
from founding import SHAPES, index_field, row_factory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.environ.get("WIREPOOL_BENCH_PY_SDK") or os.path.join(REPO, "python"))

import wirepool  # noqa: E402

RUNNER = "codec_python"


def measure(rows: list, encode, decode, key: str, window: float) -> tuple[float, float, float]:
    both = enc = dec = 0.0
    n_both = n_enc = n_dec = 0
    start = time.perf_counter()
    while n_both == 0 or time.perf_counter() - start < window:
        t = time.perf_counter()
        for row in rows:
            if decode(encode(row))[key] != row[key]:
                raise RuntimeError("round trip changed the row")
        both += time.perf_counter() - t
        n_both += len(rows)
        t = time.perf_counter()
        encoded = [encode(row) for row in rows]
        enc += time.perf_counter() - t
        n_enc += len(rows)
        t = time.perf_counter()
        for row, data in zip(rows, encoded):
            if decode(data)[key] != row[key]:
                raise RuntimeError("decode changed the row")
        dec += time.perf_counter() - t
        n_dec += len(rows)
    return n_both / both, n_enc / enc, n_dec / dec


def main() -> None:
    sc = load_scenario()
    if sc.get("shape") not in SHAPES:
        unsupported(RUNNER, sc, "the codec alone is measured on the founding shapes only")
        return
    name = sc.get("codec", "json")
    try:
        codec = wirepool.codecs.get(name)
    except wirepool.codecs.CodecUnavailable as e:
        unsupported(RUNNER, sc, str(e))
        return
    make = row_factory(sc["shape"])
    rows = [make(i) for i in range(sc["n"])]
    key = index_field(sc["shape"])
    out: list[list[float]] = [[], [], []]
    for _ in range(sc["repeats"]):
        for k, v in enumerate(measure(rows, codec.encode, codec.decode, key,
                                      sc.get("duration_s", 0.1))):
            out[k].append(v)
    lib = type(codec.encode).__module__ or "?"
    ok(RUNNER, sc, [figure("rows_per_s", "rows/s", out[0]),
                    figure("encode_rows_per_s", "rows/s", out[1]),
                    figure("decode_rows_per_s", "rows/s", out[2])], peak_rss_kib(), None,
       f"wirepool.codecs.get({name!r}) encode + decode into a dict, one row at a time, one "
       f"process ({lib}); encode and decode alone beside")


if __name__ == "__main__":
    main()
