"""Arrow IPC record batches through the shared-memory lane (PROTOCOL.md 20, issue 13): a batch
from a Rust worker (arrow-rs writing its IPC stream into ``Context::body_buf``, the region the
parent maps) is read by pyarrow in the Python parent without a copy: every buffer of the table
points into the memoryview of the worker's region. The same batch over the socket reads the
same; a Python worker's batch (the ``arrow`` codec) arrives as a table over a lane region too.

pyarrow is an optional install (``wirepool[arrow]``): the module is skipped without it.
"""

from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import wirepool

pa = pytest.importorskip("pyarrow")

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the lane is Linux only (memfd, seals)"),
              pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
PY_WORKER = [sys.executable, str(Path(__file__).parent / "workers" / "shm_worker.py")]
BUILD_TIMEOUT_S = 1500  # a cold cargo build (arrow-rs included) on a busy 2-vCPU machine
ROWS = 1 << 18  # 8 MiB of IPC stream: well above the lane's 1 MiB threshold


@pytest.fixture(scope="module")
def bench_worker() -> str:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "rust" / "target"))
    done = subprocess.run(["cargo", "build", "-q", "-p", "wirepool-bench", "--bin",
                           "wirepool-bench-worker"], cwd=REPO / "rust", capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, f"building the Rust bench worker failed:\n{done.stderr}"
    binary = target / "debug" / "wirepool-bench-worker"
    assert binary.exists(), binary
    return str(binary)


def expected(n: int) -> Any:
    return pa.table({"i": pa.array(range(n), pa.int64()),
                     "x": pa.array([i / 2 for i in range(n)], pa.float64()),
                     "name": pa.array([f"decl_{i:07d}" for i in range(n)], pa.string())})


def buffer_addresses(table: Any) -> list[tuple[int, int]]:
    """(address, size) of every non-empty buffer of every column of ``table``."""
    return [(b.address, b.size) for col in table.columns for chunk in col.chunks
            for b in chunk.buffers() if b is not None and b.size]


def lane_mappings() -> list[tuple[int, int]]:
    """This process's mappings of lane regions (start, end)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "wirepool-shm" in line:
                a, b = line.split()[0].split("-")
                out.append((int(a, 16), int(b, 16)))
    return out


def test_rust_worker_batch_is_read_by_pyarrow_in_the_region(bench_worker: str) -> None:
    want = expected(ROWS)
    with wirepool.Pool([bench_worker], workers=1) as pool:
        for req in (f"{ROWS} zc", f"{ROWS}"):  # written into body_buf / copied into a region
            view = pool.call("arrow_batch", req.encode(), codec="raw")
            # The result is a read-only view of the worker's region, not a copy.
            assert isinstance(view, memoryview) and isinstance(view.obj, mmap.mmap), type(view)
            buf = pa.py_buffer(view)
            start, end = buf.address, buf.address + buf.size
            table = pa.ipc.open_stream(buf).read_all()
            assert table.equals(want)
            spans = buffer_addresses(table)
            assert len(spans) >= 4
            for address, size in spans:
                assert start <= address and address + size <= end, (address, size, start, end)
            # The arrow codec's decode is the same zero-copy read.
            decoded = wirepool.codecs.get("arrow").decode(view)
            assert all(start <= a < end for a, _ in buffer_addresses(decoded))
            del view, buf, table, decoded
            gc.collect()
    # Over the socket: the same table.
    with wirepool.Pool([bench_worker], workers=1, shm_lane=False) as pool:
        body = pool.call("arrow_batch", f"{ROWS} zc".encode(), codec="raw")
        assert not (isinstance(body, memoryview) and isinstance(body.obj, mmap.mmap))
        assert pa.ipc.open_stream(pa.py_buffer(body)).read_all().equals(want)


def test_python_worker_batch_arrives_as_a_table_over_the_region() -> None:
    want = expected(ROWS)
    with wirepool.Pool(PY_WORKER, workers=1) as pool:
        table = pool.call("arrow_batch", {"n": [ROWS]}, codec="arrow")
        assert table.equals(want)
        regions = lane_mappings()
        spans = buffer_addresses(table)
        assert spans and all(any(s <= a and a + n <= e for s, e in regions) for a, n in spans), \
            "every buffer of the table is in a mapping of the worker's region"
        del table
    with wirepool.Pool(PY_WORKER, workers=1, shm_lane=False) as pool:
        assert pool.call("arrow_batch", {"n": [ROWS]}, codec="arrow").equals(want)
