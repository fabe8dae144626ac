"""The ``wirepool`` command line, end to end against the conformance workers of both languages
(conformance/README.md lists their methods): describe, call, stream, bench, exit codes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY_WORKER = [sys.executable, str(REPO / "python" / "conformance" / "worker.py")]
BUILD_TIMEOUT_S = 1800  # a cold cargo build on a busy 2-vCPU machine
RUN_TIMEOUT_S = 60

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 300)


def _cargo_target() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", REPO / "rust" / "target"))


@pytest.fixture(scope="session")
def rust_worker() -> list[str]:
    done = subprocess.run(["cargo", "build", "-q", "-p", "wirepool-conformance", "--bin",
                           "conformance_worker"], cwd=REPO / "rust", capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return [str(_cargo_target() / "debug" / "conformance_worker")]


@pytest.fixture(params=["python", "rust"])
def worker(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "python":
        return PY_WORKER
    return request.getfixturevalue("rust_worker")


def wirepool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wirepool.cli", *args], capture_output=True,
                          text=True, input=stdin, timeout=RUN_TIMEOUT_S, cwd=REPO)


# -- describe ---------------------------------------------------------------------------------


def test_describe_prints_the_hello(worker: list[str]) -> None:
    out = wirepool("describe", "--json", "--", *worker)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    methods = {m["name"]: m for m in d["methods"]}
    assert methods["add"] == {"name": "add", "kind": "unary", "codecs": ["json"]}
    assert methods["decls"]["kind"] == "stream"
    assert set(methods["echo"]["codecs"]) == {"raw", "json", "msgpack", "cbor"}
    assert d["limits"]["max_concurrency"] >= 1
    assert 65_536 <= d["limits"]["max_frame_size"] <= 16_777_216
    assert d["protocol"] == {"min_version": 1, "max_version": 1}
    assert d["sdk"]["name"].startswith("wirepool-")
    assert d["pid"] > 0
    text = wirepool("describe", "--", *worker)
    assert text.returncode == 0, text.stderr
    assert f"{len(methods)} methods" in text.stdout
    assert any(line.split() == ["decls", "stream", "json,", "msgpack,", "cbor"]
               for line in text.stdout.splitlines()), text.stdout


def test_describe_a_worker_that_dies_before_hello() -> None:
    out = wirepool("describe", "--", sys.executable, "-c",
                   "import sys; print('no luck here', file=sys.stderr); sys.exit(3)")
    assert out.returncode == 1
    assert out.stderr.startswith("300 WORKER_EXITED: "), out.stderr
    assert "exited with status 3" in out.stderr and "no luck here" in out.stderr


def test_describe_a_program_that_does_not_exist() -> None:
    out = wirepool("describe", "--", str(REPO / "no-such-worker"))
    assert out.returncode == 1
    assert out.stderr.startswith("303 SPAWN_FAILED: "), out.stderr


def test_describe_a_silent_worker_times_out() -> None:
    started = time.monotonic()
    out = wirepool("describe", "--startup-timeout", "0.5", "--", sys.executable, "-c",
                   "import time; time.sleep(30)")
    assert out.returncode == 1
    assert out.stderr.startswith("302 STARTUP_TIMEOUT: "), out.stderr
    assert time.monotonic() - started < 20  # the silent worker was killed, not waited for


# -- call -------------------------------------------------------------------------------------


def test_call_prints_the_result(worker: list[str]) -> None:
    out = wirepool("call", "--", *worker, "add", '{"a": 40, "b": 2}')
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"sum": 42}


def test_call_reads_the_request_from_stdin_and_takes_a_codec(worker: list[str]) -> None:
    out = wirepool("call", "--codec", "msgpack", "--", *worker, "echo", "-",
                   stdin='{"nested": [1, "two", null]}')
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"nested": [1, "two", None]}
    raw = wirepool("call", "--codec", "raw", "--", *worker, "echo", '"plain bytes"')
    assert raw.returncode == 0, raw.stderr
    assert json.loads(raw.stdout) == "plain bytes"


def test_a_failed_call_exits_1_with_code_name_message(worker: list[str]) -> None:
    out = wirepool("call", "--", *worker, "fail_app", "{}")
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.strip() == "1042 APPLICATION: application failure"
    missing = wirepool("call", "--", *worker, "no_such_method", "{}")
    assert missing.returncode == 1
    assert missing.stderr.startswith("200 UNKNOWN_METHOD: "), missing.stderr


def test_call_timeout_is_the_calls_deadline(worker: list[str]) -> None:
    out = wirepool("call", "--timeout", "0.2", "--", *worker, "sleep", "5000")
    assert out.returncode == 1
    assert out.stderr.startswith("206 DEADLINE_EXCEEDED: "), out.stderr


@pytest.mark.parametrize("args", [
    ["call", "add", "{}"],                                   # no --
    ["call", "--", sys.executable, "add"],                   # no JSON
    ["call", "--", sys.executable, "w.py", "add", "{bad"],   # JSON that does not parse
    ["describe", "--"],                                      # no command
    ["call", "--timeout", "-1", "--", "w", "add", "{}"],     # a negative deadline
    ["frobnicate", "--", "w"],                               # no such command
])
def test_usage_errors_exit_2(args: list[str]) -> None:
    out = wirepool(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "usage:" in out.stderr


def test_a_worker_command_without_the_dashes_gets_the_hint() -> None:
    """Issue 28: it said only "unrecognized arguments"."""
    out = wirepool("call", "add", "{}", sys.executable, "worker.py")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert ("the worker's command must follow -- (got 'add {} " in out.stderr
            and "usage: wirepool call [options] -- CMD [ARGS...] METHOD JSON" in out.stderr), out.stderr


# -- stream -----------------------------------------------------------------------------------


def test_stream_prints_rows_as_ndjson(worker: list[str]) -> None:
    out = wirepool("stream", "--", *worker, "decls", '{"n": 2500}')
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows == [{"i": i, "name": f"decl_{i}", "kind": "theorem"} for i in range(2500)]
    assert "\r" not in out.stderr  # no progress bar when stderr is not a terminal
    assert "2,500 rows" in out.stderr and '"rows": 2500' in out.stderr  # the summary


def test_stream_failure_after_rows_exits_1(worker: list[str]) -> None:
    out = wirepool("stream", "--", *worker, "fail_after", '{"n": 3}')
    assert out.returncode == 1
    # The rows read before the error are printed (an SDK may drop rows still batched with it).
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows == [{"i": i, "name": f"decl_{i}", "kind": "theorem"} for i in range(len(rows))]
    assert len(rows) <= 3
    assert out.stderr.startswith("203 HANDLER_ERROR: "), out.stderr


def test_stream_shows_progress_on_a_terminal() -> None:
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "wirepool.cli", "stream", "--",
                                 *PY_WORKER, "decls", '{"n": 30000}'],
                                stdout=subprocess.DEVNULL, stderr=slave, cwd=REPO)
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has gone
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(RUN_TIMEOUT_S) == 0, seen
    finally:
        os.close(master)
    text = seen.decode(errors="replace")
    assert "\r" in text and "rows/s" in text, text
    assert "30,000 rows in" in text


def test_interrupting_a_stream_is_prompt_and_quiet() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "wirepool.cli", "stream", "--", *PY_WORKER,
                             "forever", "{}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == 0  # streaming: the first row is out
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert time.monotonic() - started < 4.0, "Ctrl-C must not wait for the 5 s drain"
    assert proc.returncode == 130
    assert err == "", err


# -- bench ------------------------------------------------------------------------------------


def test_bench_unary_reports_rate_and_percentiles(worker: list[str]) -> None:
    out = wirepool("bench", "--json", "--count", "200", "--workers", "2", "--in-flight", "4",
                   "--", *worker, "add", '{"a": 1, "b": 2}')
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert (r["kind"], r["calls"], r["workers"], r["concurrency"]) == ("unary", 200, 2, 8)
    assert r["calls_per_s"] > 0
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    text = wirepool("bench", "--count", "50", "--", *worker, "add", '{"a": 1, "b": 2}')
    assert text.returncode == 0, text.stderr
    assert "50 calls in" in text.stdout and "calls/s" in text.stdout and "p99" in text.stdout


def test_bench_stream_counts_rows(worker: list[str]) -> None:
    out = wirepool("bench", "--json", "--count", "10", "--", *worker, "decls", '{"n": 300}')
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert (r["kind"], r["calls"], r["rows"]) == ("stream", 10, 3000)
    assert r["rows_per_s"] > 0


def test_bench_duration_bounds_a_stream_that_never_ends() -> None:
    # The warm-up reads one row, and --duration cuts the streams still going (their rows count).
    out = wirepool("bench", "--json", "--duration", "0.5", "--in-flight", "4", "--", *PY_WORKER,
                   "forever", "{}")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["calls"] == 0 and r["streams_cut"] == r["concurrency"] > 0, r
    assert r["rows"] > 0
    assert 0.5 <= r["seconds"] < 2.5, r["seconds"]


def test_bench_unknown_method_exits_1() -> None:
    out = wirepool("bench", "--count", "1", "--", *PY_WORKER, "nope", "{}")
    assert out.returncode == 1
    assert out.stderr.startswith("200 UNKNOWN_METHOD: "), out.stderr


# -- installed --------------------------------------------------------------------------------


def test_installed_as_a_console_script() -> None:
    (entry,) = metadata.entry_points(group="console_scripts", name="wirepool")
    assert entry.value == "wirepool.cli:main"
    script = Path(sys.executable).parent / "wirepool"
    assert script.exists(), f"{script} missing: reinstall the package (pip install -e python)"
    out = subprocess.run([str(script), "call", "--", *PY_WORKER, "add", '{"a": 1, "b": 1}'],
                         capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"sum": 2}
