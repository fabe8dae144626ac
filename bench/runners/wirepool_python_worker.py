"""The Python worker of the wirepool benchmark runners (python/wirepool's worker SDK).

Same methods as the Rust bench worker (rust/wirepool-bench/src/bin/wirepool-bench-worker.rs):
``echo`` and ``oneway`` (raw), ``rows`` (json, msgpack or cbor, whichever this interpreter has:
``{"shape", "n"}`` -> the rows of bench/README.md, or of a founding shape of
bench/shapes/founding.json, in the request's codec),
``raw_rows`` (raw: ``b"N"`` -> the small rows' JSON text as bytes) and ``spin`` (JSON: burn ``us``
of thread CPU time), and ``mark`` (raw: calls ``os.getpgrp()``, a phase boundary of the
instruction-count gate, bench/harness/icount.py); ``arrow_batch`` (raw, with pyarrow: ``b"N"`` -> the
W7 Arrow IPC stream of N rows). ``echo``, ``oneway`` and ``spin`` run inline on the I/O loop: a worker
serves one task at a time (like every baseline's child) with no thread hand-off.

Started by a wirepool parent (it needs ``WIREPOOL_FD``); ``PYTHONPATH`` must reach python/.
"""

from __future__ import annotations

import os
import time

import wirepool

LARGE_TAIL = "x" * 4088


@wirepool.method(codecs=["raw"], inline=True)
def echo(body: memoryview) -> memoryview:
    return body


@wirepool.method(codecs=["raw"], inline=True)
def oneway(body: memoryview) -> bytes:
    return len(body).to_bytes(8, "little")


# Only the codecs whose library is installed: a missing one is then refused by the parent
# with a typed error naming it, instead of failing the worker's start.
def _installed(name: str) -> bool:
    # codecs.get loads that codec's library only (available() would import pyarrow, and with
    # it numpy and its BLAS threads, into every bench worker).
    try:
        wirepool.codecs.get(name)
    except wirepool.codecs.CodecUnavailable:
        return False
    return True


ROW_CODECS = [c for c in ("json", "msgpack", "cbor") if _installed(c)]


@wirepool.stream(codecs=ROW_CODECS)
def rows(req: dict):
    n = req["n"]
    if req["shape"] not in ("small_rows", "large_rows"):
        # The founding workload (bench/shapes/founding.json): one row made and yielded at a time.
        # Imported here: the gate's handshake counts never pay for it.
        from founding import row_factory

        make = row_factory(req["shape"])
        for i in range(n):
            yield make(i)
    elif req["shape"] == "large_rows":
        for i in range(n):
            yield {"i": i, "name": f"decl_{i}", "kind": "theorem", "blob": f"{i:08d}" + LARGE_TAIL}
    else:
        for i in range(n):
            yield {"i": i, "name": f"decl_{i}", "kind": "theorem"}


@wirepool.stream(codecs=["raw"])
def raw_rows(req: memoryview):
    for i in range(int(bytes(req))):
        yield b'{"i":%d,"name":"decl_%d","kind":"theorem"}' % (i, i)


@wirepool.method(codecs=["json"], inline=True)
def spin(us: int) -> int:
    deadline = time.thread_time_ns() + us * 1000
    while time.thread_time_ns() < deadline:
        pass
    return us


@wirepool.method(codecs=["raw"], inline=True)
def mark(body: memoryview) -> bytes:
    # valgrind --dump-before=getpgrp writes this process's counts so far: the gate's phases.
    os.getpgrp()
    return b""


_BATCHES: dict = {}


def _w7_batch(n: int):
    """The W7 batch of ``n`` rows, as rust/wirepool-bench's ``arrow_batch`` builds it."""
    import pyarrow as pa

    if n not in _BATCHES:
        _BATCHES[n] = pa.table({"i": pa.array(range(n), pa.int64()),
                                "x": pa.array([i / 2 for i in range(n)], pa.float64()),
                                "name": pa.array([f"decl_{i:07d}" for i in range(n)], pa.string())})
    return _BATCHES[n]


@wirepool.method(codecs=["raw"])
def arrow_batch(req: memoryview) -> memoryview:
    """``b"<rows>"`` -> the W7 Arrow IPC stream of that many rows (pyarrow's buffer as it is:
    the worker copies it once into its shm region, or writes it to the socket). pyarrow is
    imported on the first call only (the `arrow` extra; start-up stays what the gate counts)."""
    import pyarrow as pa

    table = _w7_batch(int(bytes(req).split()[0]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write(table)
    return memoryview(sink.getvalue()).cast("B")


if __name__ == "__main__":
    wirepool.serve(max_concurrency=256)
