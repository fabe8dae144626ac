"""W7 runner with the Python parent: one Arrow IPC stream of ``rows`` rows per call from the
worker's ``arrow_batch``, read by pyarrow (``pa.ipc.open_stream(pa.py_buffer(body))``, then
``read_all``; zero-copy: the table's buffers point into the body, a view of the worker's shm
region when the lane is on), one call at a time. MB/s of the stream's bytes and rows/s.

Workers: the Rust bench worker (``--worker rust``; asked for ``"<rows> zc"``: arrow-rs writes the
stream into ``Context::body_buf``, the region this parent maps) or the Python bench worker
(``--worker python``; pyarrow's buffer copied once into its region). ``--socket``: the pool's
lane off (the socket path). pyarrow is the ``arrow`` extra: without it, "unsupported".

Usage: arrow_py.py --worker rust|python [--socket] '<scenario json>'
"""

from __future__ import annotations

import os
import sys
import time

from common import figure, load_scenario, max_peak_rss_kib, ok, peak_rss_kib, unsupported

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.environ.get("WIREPOOL_BENCH_PY_SDK") or os.path.join(REPO, "python"))

import wirepool  # noqa: E402

WORKER = sys.argv[sys.argv.index("--worker") + 1] if "--worker" in sys.argv else "rust"
SOCKET = "--socket" in sys.argv
RUNNER = f"wirepool_arrow_py_{'rs' if WORKER == 'rust' else 'py'}worker" + ("_socket" if SOCKET else "")
RUST_WORKER = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "rust", "target")),
                           "release", "wirepool-bench-worker")


def main() -> None:
    sc = load_scenario()
    if sc["kind"] != "arrow":
        unsupported(RUNNER, sc, "W7 only")
        return
    try:
        import pyarrow as pa
    except ImportError:
        unsupported(RUNNER, sc, "pyarrow is not installed (the wirepool[arrow] extra)")
        return
    if WORKER == "rust" and not os.access(RUST_WORKER, os.X_OK):
        unsupported(RUNNER, sc, f"{RUST_WORKER} not built (bench/runners/wirepool_rust.sh --prepare)")
        return
    argv = [RUST_WORKER] if WORKER == "rust" else [
        sys.executable, os.path.join(REPO, "bench", "runners", "wirepool_python_worker.py")]
    rows = int(sc["rows"])
    req = f"{rows} zc".encode()
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    with wirepool.Pool(argv, workers=1, max_in_flight=1, startup_timeout=30.0, env=env,
                       shm_lane=not SOCKET) as pool:
        def call() -> int:
            body = pool.call("arrow_batch", req, codec="raw")
            table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
            if table.num_rows != rows:
                raise SystemExit(f"{RUNNER}: {table.num_rows} rows, expected {rows}")
            return len(body)

        stream_len = call()
        mbs, rates = [], []
        for _ in range(int(sc["repeats"])):
            calls, start = 0, time.perf_counter()
            while calls < int(sc["min_calls"]) or time.perf_counter() - start < sc["duration_s"]:
                call()
                calls += 1
            secs = time.perf_counter() - start
            mbs.append(calls * stream_len / secs / 1e6)
            rates.append(calls * rows / secs)
        children = max_peak_rss_kib(pool.pids)
    how = ("over the socket" if SOCKET else
           "through the shm lane (" + ("arrow-rs writes into Context::body_buf: no copy"
                                       if WORKER == "rust" else "pyarrow's buffer copied once into "
                                       "the worker's region") + ")")
    ok(RUNNER, sc, [figure("mb_per_s", "MB/s", mbs), figure("rows_per_s", "rows/s", rates)],
       peak_rss_kib(), children,
       f"Python parent, {WORKER} worker: one {rows}-row batch ({stream_len} IPC bytes) per call, "
       f"{how}; read with pa.ipc.open_stream(pa.py_buffer(body)).read_all() (zero-copy)")


if __name__ == "__main__":
    main()
