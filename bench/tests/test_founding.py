"""The founding workload (issue 26): the row shapes' sizes, the same bytes from every generator
(Python, Node, Rust: every runner uses one of the three), the scenarios, and the report's ratio
columns, on made-up results and on a tiny real run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "runners"))

import founding  # noqa: E402
from harness import founding as three_way  # noqa: E402
from harness import report, scenarios  # noqa: E402
from registry import LANGS, RUNNERS  # noqa: E402

# wirepool-bench's founding binaries (wirepool_rust.sh --prepare builds them).
RUST_RELEASE = Path(os.environ.get("CARGO_TARGET_DIR", BENCH.parent / "rust" / "target")) / "release"
RUST_LINES = RUST_RELEASE / "founding-codec"
# make test runs these tests before anything is built (bench/run.py builds on its first run):
# what is not built yet is skipped there; CI runs them again after `make bench` with this set,
# and then a missing build fails instead of skipping.
REQUIRE_BUILT = os.environ.get("WIREPOOL_BENCH_REQUIRE_BUILT") == "1"


def not_built(why: str) -> None:
    if REQUIRE_BUILT:
        pytest.fail(f"{why} (WIREPOOL_BENCH_REQUIRE_BUILT=1: bench/run.py should have built it)")
    pytest.skip(why)


def python_lines(shape: str, n: int) -> bytes:
    make = founding.row_factory(shape)
    return b"".join(founding.row_json(make(i)) + b"\n" for i in range(n))


def test_the_shapes_have_the_founding_documents_sizes():
    # lean-rs-worker's data_plane_size: value_json=97 (small_rows_8192), 4154 (large_rows_512).
    assert founding.sizes() == {"small_rows_8192": 97, "large_rows_512": 4154}
    small = [len(founding.row_json(founding.row_factory("small_rows_8192")(i)))
             for i in range(8192)]
    assert 94 <= sum(small) / len(small) <= 100 and max(small) == 97
    large = founding.row_factory("large_rows_512")
    assert all(len(large(i)["payload"]) == 4096 for i in (0, 7, 511, 10**9))
    assert {len(founding.row_json(large(i))) for i in range(100, 512)} == {4154}
    # Distinct rows: the index is in every row's text.
    assert len({founding.row_json(large(i)) for i in range(512)}) == 512


def test_an_unknown_field_kind_is_refused():
    with pytest.raises(ValueError, match="unknown field kind"):
        founding._field_expr({"name": "x", "kind": "float"})


@pytest.mark.parametrize("shape,n", [("small_rows_8192", 8192), ("large_rows_512", 512)])
def test_node_makes_the_same_bytes_as_python(shape, n):
    node = shutil.which("node")
    if node is None:
        not_built("node is not on PATH")
    out = subprocess.run([node, str(BENCH / "incumbents" / "node" / "founding.mjs"), "lines",
                          shape, str(n)], capture_output=True, check=True, timeout=60).stdout
    assert hashlib.sha256(out).hexdigest() == hashlib.sha256(python_lines(shape, n)).hexdigest()
    assert founding.digest(shape, n) == hashlib.sha256(out).hexdigest()


@pytest.mark.parametrize("shape,n", [("small_rows_8192", 8192), ("large_rows_512", 512)])
def test_rust_makes_the_same_bytes_as_python(shape, n):
    if not RUST_LINES.is_file():
        not_built(f"{RUST_LINES} is not built (bench/runners/wirepool_rust.sh --prepare)")
    out = subprocess.run([str(RUST_LINES), "--lines", shape, str(n)], capture_output=True,
                         check=True, timeout=60).stdout
    assert hashlib.sha256(out).hexdigest() == founding.digest(shape, n)


GO_WORKER = BENCH / ".build" / "go" / "wirepool-go-worker"


@pytest.mark.parametrize("shape,n", [("small_rows_8192", 8192), ("large_rows_512", 512)])
def test_go_makes_the_same_bytes_as_python(shape, n):
    if not GO_WORKER.is_file():
        not_built(f"{GO_WORKER} is not built (bench/runners/wirepool_go.sh --prepare)")
    out = subprocess.run([str(GO_WORKER), "--lines", shape, str(n)], capture_output=True,
                         check=True, timeout=60, env={**os.environ, "WIREPOOL_REPO": str(BENCH.parent)}).stdout
    assert hashlib.sha256(out).hexdigest() == founding.digest(shape, n)


def test_every_founding_scenario_names_registered_runners_with_languages():
    names = {r.name: r for r in RUNNERS}
    for mode in ("quick", "full"):
        found = [s for s in scenarios.build(mode) if s.get("founding")]
        assert {s["workload"] for s in found} == set(scenarios.FOUNDING_SHAPES)
        for s in found:
            assert s["shape"] == s["workload"] and s["kind"] == "rows"
            assert s["n"] == founding.SHAPES[s["shape"]]["n" if mode == "full" else "quick_n"]
            assert set(s["only"]) <= set(names) and set(s["only"]) <= set(LANGS)
            # The incumbents (their own codec) run in the JSON scenario, whose id is the shape's.
            has_incumbents = any(names[r].kind == "incumbent" for r in s["only"])
            assert has_incumbents == (s["codec"] == "json") == (s["id"] == s["shape"])
        codecs = {s["codec"] for s in found}
        assert codecs == ({"json", "msgpack", "cbor"} if mode == "full" else {"json"})


def _res(runner, scenario, **medians):
    figs = [{"name": k, "unit": "rows/s", "better": "higher", "values": [v],
             "min": v * 0.9, "median": v, "max": v * 1.1} for k, v in medians.items()]
    return {"runner": runner, "scenario": scenario, "status": "ok", "figures": figs}


def test_ratio_columns_on_made_up_results():
    kinds = {r.name: r.kind for r in RUNNERS}
    doc = {"runners": [{"name": n, "kind": k} for n, k in kinds.items()],
           "scenarios": [{"id": "small_rows_8192", "shape": "small_rows_8192", "codec": "json",
                          "founding": True, "workload": "small_rows_8192"},
                         {"id": "small_rows_8192.msgpack", "shape": "small_rows_8192",
                          "codec": "msgpack", "founding": True, "workload": "small_rows_8192"}],
           "results": [
               _res("codec_rust", "small_rows_8192", rows_per_s=1000.0, encode_rows_per_s=3000.0,
                    decode_rows_per_s=1500.0),
               _res("codec_python", "small_rows_8192", rows_per_s=400.0,
                    encode_rows_per_s=1200.0, decode_rows_per_s=600.0),
               _res("wirepool_rust", "small_rows_8192", rows_per_s=800.0),
               _res("wirepool_python_rsworker", "small_rows_8192", rows_per_s=300.0),
               _res("ipc_channel", "small_rows_8192", rows_per_s=500.0),
               _res("ipc_channel_unbatched", "small_rows_8192", rows_per_s=200.0),
               _res("mp_pipe", "small_rows_8192", rows_per_s=250.0),
               _res("wirepool_rust", "small_rows_8192.msgpack", rows_per_s=1000.0),
               {"runner": "wirepool_python", "scenario": "small_rows_8192", "status": "error"},
           ]}
    tabs = three_way.tables(doc, LANGS)["small_rows_8192"]
    by = {(r["runner"], r["scenario"]): r for r in tabs}
    rr = by[("wirepool_rust", "small_rows_8192")]
    assert rr["codec_alone"] == 1000.0 and rr["vs_codec"] == pytest.approx(0.8)
    assert rr["best_incumbent"]["runner"] == "ipc_channel"
    assert rr["vs_incumbent"] == pytest.approx(1.6)
    # A mixed pair: the Rust worker's encode plus the Python parent's decode, per row.
    py_rs = by[("wirepool_python_rsworker", "small_rows_8192")]
    assert py_rs["codec_alone"] == pytest.approx(1 / (1 / 3000 + 1 / 600))
    assert py_rs["best_incumbent"]["runner"] == "mp_pipe"
    assert py_rs["vs_incumbent"] == pytest.approx(1.2)
    # A codec variant borrows the JSON scenario's incumbents; without a codec-alone figure of
    # its own it has no e2e / codec ratio.
    msg = by[("wirepool_rust", "small_rows_8192.msgpack")]
    assert msg["vs_incumbent"] == pytest.approx(2.0) and msg["vs_codec"] is None
    assert ("wirepool_python", "small_rows_8192") not in by
    text = "\n".join(report.founding_section({**doc, "founding_langs": LANGS}, LANGS))
    assert "| Rust parent x Rust worker | wirepool_rust | json | 800 | 720 - 880 | 1.0k | 0.80x" \
        " | ipc_channel 500 | 1.60x |" in text


def test_a_tiny_real_run_reports_the_ratios(tmp_path):
    if not (BENCH / ".venv" / "bin" / "python").exists():
        not_built("bench/.venv is made by bench/run.py")
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    subprocess.run([sys.executable, str(BENCH / "run.py"), "--only", "small_rows_8192",
                    "--runners", "wirepool_python,codec_python,mp_pipe,mp_pipe_unbatched",
                    "--out", str(out), "--no-history"], check=True, timeout=240, env=env,
                   stdout=subprocess.DEVNULL)
    doc = json.loads((out / "results.json").read_text())
    rows = {r["runner"]: r for r in three_way.tables(doc, LANGS)["small_rows_8192"]}
    assert set(rows) == {"wirepool_python", "codec_python", "mp_pipe", "mp_pipe_unbatched"}
    wp = rows["wirepool_python"]
    best = max(rows["mp_pipe"]["median"], rows["mp_pipe_unbatched"]["median"])
    assert wp["vs_incumbent"] == pytest.approx(wp["median"] / best)
    assert wp["vs_codec"] == pytest.approx(wp["median"] / rows["codec_python"]["median"])
    assert wp["min"] <= wp["median"] <= wp["max"]
    text = (out / "report.md").read_text()
    assert "## small_rows_8192" in text and "e2e / codec" in text
    assert f"{wp['vs_incumbent']:.2f}x |" in text
    assert (out / "founding_small_rows_8192.png").is_file()


REPO = BENCH.parent
WORKERS = {
    "python": [sys.executable, str(BENCH / "runners" / "wirepool_python_worker.py")],
    "node": ["node", str(BENCH / "runners" / "wirepool_node_worker.mjs")],
    "rust": [str(RUST_RELEASE / "founding-worker")],
}


@pytest.mark.parametrize("lang", sorted(WORKERS))
def test_every_wirepool_worker_streams_the_generators_rows(lang):
    """The rows a worker really sends (read by a Python parent, JSON) are the shape's rows."""
    argv = WORKERS[lang]
    if lang == "rust" and not Path(argv[0]).is_file():
        not_built(f"{argv[0]} is not built (bench/runners/wirepool_rust.sh --prepare)")
    if lang == "node" and (shutil.which("node") is None
                           or not (REPO / "node" / "dist" / "index.js").is_file()):
        not_built("node or node/dist (bench/runners/wirepool_node.mjs --prepare) is missing")
    sys.path.insert(0, str(REPO / "python"))
    import asyncio

    import wirepool

    async def hashes() -> dict[str, str]:
        out = {}
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        async with wirepool.AsyncPool(argv, workers=1, startup_timeout=20.0, env=env) as pool:
            for shape, n in (("small_rows_8192", 1500), ("large_rows_512", 130)):
                h = hashlib.sha256()
                stream = pool.stream("rows", {"shape": shape, "n": n}, codec="json")
                async for batch in stream.batches():
                    for row in batch:
                        h.update(founding.row_json(row) + b"\n")
                out[shape] = h.hexdigest()
        return out

    got = asyncio.run(asyncio.wait_for(hashes(), 60))
    assert got == {"small_rows_8192": founding.digest("small_rows_8192", 1500),
                   "large_rows_512": founding.digest("large_rows_512", 130)}
