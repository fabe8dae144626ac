"""Test worker for the shared-memory lane (PROTOCOL.md 20) with a Rust or Python parent.

``echo_raw`` (inline) and ``echo_thread_raw`` (a handler thread) return the body they got;
``hold_raw`` keeps its body (a view of the parent's region when it came through the lane) until
the process is killed; ``lane_bodies`` says how many request bodies arrived as views of a
region (``memoryview.obj`` is the region's ``mmap``) and how many over the socket; ``pid``;
``arrow_batch`` (codec arrow, when pyarrow is installed): a table ``{"n": [n]}`` -> the W7
batch of ``n`` rows (bench/runners/arrow_py.py's), as a pyarrow Table.
``WIREPOOL_SHM=0`` in the environment runs it with the lane off.
"""

import mmap
import os
import threading

import wirepool

_counts = {"lane": 0, "socket": 0}
_held: list = []


def _count(body: memoryview) -> None:
    if len(body) >= 1 << 20:
        _counts["lane" if isinstance(body.obj, mmap.mmap) else "socket"] += 1


@wirepool.method(codecs=["raw"], inline=True)
def echo_raw(body: memoryview) -> memoryview:
    _count(body)
    return body


@wirepool.method(codecs=["raw"])
def echo_thread_raw(body: memoryview) -> memoryview:
    _count(body)
    return body


@wirepool.method(codecs=["raw"])
def hold_raw(body: memoryview) -> bytes:
    _count(body)
    _held.append(body)
    threading.Event().wait()  # until the test kills this process
    return b""


@wirepool.method(codecs=["json"], inline=True)
def lane_bodies(_req: object) -> dict:
    return dict(_counts)


@wirepool.method(codecs=["json"], inline=True)
def pid(_req: object) -> int:
    return os.getpid()


if "arrow" in wirepool.codecs.available():
    import pyarrow as pa

    @wirepool.method(codecs=["arrow"])
    def arrow_batch(req: "pa.Table") -> "pa.Table":
        n = req["n"][0].as_py()
        return pa.table({"i": pa.array(range(n), pa.int64()),
                         "x": pa.array([i / 2 for i in range(n)], pa.float64()),
                         "name": pa.array([f"decl_{i:07d}" for i in range(n)], pa.string())})


if __name__ == "__main__":
    wirepool.serve(max_concurrency=4)
