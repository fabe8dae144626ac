"""``wirepool top`` (wirepool._top): the scrape parser, the rates and quantiles, and the live view
read off a real tmux screen.

The parsing and the arithmetic are checked on text from a real exporter (the Python pool's
``PoolCollector``, which exports the metrics contract spec/metrics.json); the tmux tests start a
real pool with its exporter on a free port, run ``wirepool top URL`` in a detached tmux session,
read its screen until the worker rows show, and quit it with ``q`` or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import http.server
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wirepool
from wirepool import _top
from wirepool._top import Scrape, ScrapeError, build_views, parse_text, quantile, render
from wirepool.cli import main

prometheus_client = pytest.importorskip("prometheus_client")
from wirepool.prometheus import PoolCollector  # noqa: E402  (needs prometheus_client)

PYTHON_DIR = Path(__file__).resolve().parents[1]
WORKER = [sys.executable, str(Path(__file__).resolve().parent / "workers" / "basic.py")]
BOUNDS = [0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
          0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]  # spec/metrics.json
PARSERS = ["builtin", "prometheus_client"]
SCREEN_TIMEOUT_S = 60.0


@pytest.fixture
def exported() -> Iterator[tuple[Any, Any]]:
    """A real two-worker pool and a registry holding its collector (pool name "t")."""
    registry = prometheus_client.CollectorRegistry()
    with wirepool.Pool(WORKER, workers=2, max_in_flight=16) as pool:
        registry.register(PoolCollector(pool, name="t"))
        yield pool, registry


def text_of(registry: Any) -> str:
    return str(prometheus_client.generate_latest(registry).decode())


def snapshot(registry: Any, at: float, parser: str = "auto") -> Scrape:
    return Scrape(at, parse_text(text_of(registry), parser))


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------


def test_both_parsers_read_a_real_exporter_alike(exported: tuple[Any, Any]) -> None:
    pool, registry = exported
    for i in range(7):
        pool.call("add", {"a": i, "b": 1})
    assert sum(1 for _ in pool.stream("rows", {"n": 30})) == 30
    text = text_of(registry)
    builtin, reference = parse_text(text, "builtin"), parse_text(text, "prometheus_client")
    # prometheus_client names no extra sample; both see every sample with the same value.
    assert builtin == reference
    s = Scrape(0.0, builtin)
    assert s.total("wirepool_calls_total", pool="t") == 7
    assert s.total("wirepool_worker_rows_total", pool="t") == 30
    assert s.total("wirepool_method_duration_seconds_count", pool="t", method="add") == 7
    pids = {d["worker"]: int(v) for d, v in s.series("wirepool_worker_pid", pool="t")}
    assert pids == {str(w["slot"]): w["pid"] for w in pool.metrics()["slots"]}


def test_builtin_parser_reads_the_format_edges() -> None:
    text = ('# HELP x_total A help with "quotes" and \\\\ in it.\n'
            "# TYPE x_total counter\n"
            'x_total{a="q\\"uote",b="back\\\\slash",c="new\\nline"} 3 1700000000000\n'
            "x_total{a=\"2\",} +Inf\n"
            "y NaN\n"
            "z{} -1.5e3\n"
            "\n   # a comment\n")
    parsed = parse_text(text, "builtin")
    assert parsed["x_total"][(("a", 'q"uote'), ("b", "back\\slash"), ("c", "new\nline"))] == 3
    assert parsed["x_total"][(("a", "2"),)] == math.inf
    assert math.isnan(parsed["y"][()])
    assert parsed["z"][()] == -1500


@pytest.mark.parametrize("line", ['x{a="b" 1', "x{a=b} 1", 'x{a="b"} one', "x 1 2 3",
                                  '9x 1', 'x{a="b",a="c"} 1', 'x{a="\\q"} 1', "x", 'x{"a"="b"} 1',
                                  'x{a="b"}} 1'])
def test_builtin_parser_refuses_bad_lines_with_a_typed_error(line: str) -> None:
    with pytest.raises(ScrapeError) as e:
        parse_text(f"ok 1\n{line}\n", "builtin")
    assert e.value.code == "SCRAPE_PARSE" and "line 2" in e.value.message


def test_reference_parser_errors_are_typed_too() -> None:
    with pytest.raises(ScrapeError) as e:
        parse_text('x{a="b" 1\n', "prometheus_client")
    assert e.value.code == "SCRAPE_PARSE"


@pytest.mark.parametrize("parser", PARSERS)
def test_parser_bounds(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ScrapeError) as e:
        parse_text("x" * (_top.MAX_LINE_BYTES + 1) + " 1\n", parser)
    assert e.value.code == "SCRAPE_TOO_LARGE" and "line 1" in e.value.message
    monkeypatch.setattr(_top, "MAX_SAMPLES", 3)
    with pytest.raises(ScrapeError) as e:
        parse_text("".join(f'x{{i="{i}"}} 1\n' for i in range(4)), parser)
    assert e.value.code == "SCRAPE_TOO_LARGE"
    assert len(parse_text("".join(f'x{{i="{i}"}} 1\n' for i in range(3)), parser)["x"]) == 3
    monkeypatch.setattr(_top, "MAX_BODY_BYTES", 100)
    with pytest.raises(ScrapeError) as e:
        parse_text("x 1\n" * 30, parser)
    assert e.value.code == "SCRAPE_TOO_LARGE"


# ---------------------------------------------------------------------------------------------
# Rates and quantiles
# ---------------------------------------------------------------------------------------------


def test_quantile_interpolates_within_the_bucket() -> None:
    # 10 observations in (1, 2]: p50 is halfway, as Prometheus' histogram_quantile says.
    assert quantile(0.5, [(1.0, 0), (2.0, 10), (math.inf, 10)]) == 1.5
    assert quantile(0.5, [(1.0, 4), (2.0, 8), (math.inf, 8)]) == 1.0
    assert quantile(0.99, [(1.0, 4), (2.0, 8), (math.inf, 8)]) == pytest.approx(1.98)
    # Observations above the last bound: the highest finite bound, never infinity.
    assert quantile(0.99, [(1.0, 1), (2.0, 1), (math.inf, 100)]) == 2.0
    assert quantile(0.5, [(1.0, 0), (math.inf, 0)]) is None
    assert quantile(0.5, []) is None
    with pytest.raises(ValueError):
        quantile(1.5, [(1.0, 1)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=400, allow_nan=False), min_size=1,
                max_size=200),
       st.floats(min_value=0.0, max_value=1.0))
def test_quantile_stays_in_the_true_quantiles_bucket_and_below_the_max_edge(
        observations: list[float], q: float) -> None:
    buckets = [(le, float(sum(1 for x in observations if x <= le))) for le in BOUNDS]
    buckets.append((math.inf, float(len(observations))))
    got = quantile(q, buckets)
    assert got is not None
    ordered = sorted(observations)
    true = ordered[max(1, math.ceil(q * len(ordered))) - 1]  # nearest rank
    upper = next((le for le in BOUNDS if true <= le), BOUNDS[-1])
    lower = max([le for le in BOUNDS if le < true], default=0.0)
    assert lower <= got <= upper
    highest_edge = next((le for le in BOUNDS if ordered[-1] <= le), BOUNDS[-1])
    assert got <= highest_edge
    assert quantile(min(1.0, q + 0.01), buckets) >= got  # type: ignore[operator]


def test_rates_and_quantiles_between_two_scrapes_of_a_real_exporter(
        exported: tuple[Any, Any]) -> None:
    pool, registry = exported
    # Before the first scrape: slow calls (>= 50 ms). Between the scrapes: only fast ones.
    for _ in range(2):
        pool.call("sleep", {"seconds": 0.06})
    first = snapshot(registry, at=100.0)
    for i in range(40):
        pool.call("add", {"a": i, "b": 1})
    rows = sum(1 for _ in pool.stream("rows", {"n": 50}))
    second = snapshot(registry, at=102.0)  # "2 s later": the rates divide by it

    [view] = build_views(second, first)
    assert view.name == "t" and view.workers == 2 and view.alive == 2
    assert view.calls_per_s == 20.0 and view.streams_per_s == 0.5 and view.errors_per_s == 0
    assert view.restarts == 0 and view.recycles == 0 and view.retries == 0
    assert sum(r.requests_per_s or 0 for r in view.rows) == 20.5
    assert sum(r.rows_per_s or 0 for r in view.rows) == rows / 2
    pids = {str(w["slot"]): w["pid"] for w in pool.metrics()["slots"]}
    assert {r.slot: r.pid for r in view.rows} == pids
    assert {r.state for r in view.rows} <= {"ready", "leased"}
    assert all(r.rss_bytes and r.rss_bytes > 1_000_000 for r in view.rows)
    methods = {m.name: m for m in view.methods}
    assert methods["add"].per_s == 20.0 and methods["sleep"].per_s == 0
    assert methods["sleep"].p50_s is None  # nothing completed between the scrapes
    # The deltas hold only the fast calls: p99 below the 50 ms bucket the slow ones fill.
    assert view.p99_s is not None and view.p50_s is not None
    assert view.p50_s <= view.p99_s < 0.05
    # Never above the highest bucket edge the deltas hold.
    deltas = _top.bucket_deltas(second, first, "wirepool_method_duration_seconds", pool="t")
    edge = next(le for le, c in deltas if c == deltas[-1][1])
    assert view.p99_s <= edge
    # Since the process started (no previous scrape) the slow calls count: p99 is above 50 ms.
    since_start = quantile(0.99, _top.bucket_deltas(second, None,
                                                    "wirepool_method_duration_seconds", pool="t"))
    assert since_start is not None and since_start >= 0.05

    # No previous scrape: no rates, "-" on screen.
    [alone] = build_views(second, None)
    assert alone.calls_per_s is None and all(r.requests_per_s is None for r in alone.rows)
    text = "\n".join(render([view], title="T"))
    for pid in pids.values():
        assert re.search(rf"^  \d+\s+{pid}\s+(ready|leased)", text, re.M), text
    assert "calls/s 20 " in text


def test_a_counter_that_went_down_was_reset(exported: tuple[Any, Any]) -> None:
    pool, registry = exported
    for i in range(3):
        pool.call("add", {"a": i, "b": 1})
    second = snapshot(registry, at=11.0)
    samples = {name: dict(v) for name, v in second.samples.items()}
    for labels in samples["wirepool_calls_total"]:
        samples["wirepool_calls_total"][labels] = 1000.0  # "before the pool restarted"
    first = Scrape(10.0, samples)
    [view] = build_views(second, first)
    assert view.calls_per_s == 3.0  # counted from zero, never negative


# ---------------------------------------------------------------------------------------------
# Scraping over HTTP
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def served(exported: tuple[Any, Any]) -> Iterator[tuple[Any, str]]:
    pool, registry = exported
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield pool, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_once_prints_one_frame(served: tuple[Any, str], capsys: pytest.CaptureFixture[str]
                               ) -> None:
    pool, url = served
    stop = threading.Event()
    driver = threading.Thread(target=_drive, args=(pool, stop))
    driver.start()
    try:
        assert main(["top", url, "--once", "--interval", "0.5"]) == 0
    finally:
        stop.set()
        driver.join(30)
    out = capsys.readouterr().out
    assert out.startswith(f"wirepool top  {url}\n") and "\x1b" not in out
    header = re.search(r"^pool t: workers 2/2 alive  calls/s (\S+)", out, re.M)
    assert header and header.group(1) not in ("-", "0"), out
    for w in pool.metrics()["slots"]:
        assert re.search(rf"^  {w['slot']}\s+{w['pid']}\s", out, re.M), out


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 404
    body = b"not here"

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[tuple[type[_Answer], str]]:
    handler = type("Handler", (_Answer,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_scrape_failures_are_typed(answering: tuple[type[_Answer], str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    handler, url = answering
    with pytest.raises(ScrapeError) as e:
        _top.scrape(url)
    assert e.value.code == "SCRAPE_HTTP" and "404" in e.value.message
    handler.status, handler.body = 200, b'x{a="b" 1\n'
    with pytest.raises(ScrapeError) as e:
        _top.scrape(url)
    assert e.value.code == "SCRAPE_PARSE"
    handler.body = b"x 1\n" * 100
    monkeypatch.setattr(_top, "MAX_BODY_BYTES", 64)
    with pytest.raises(ScrapeError) as e:
        _top.scrape(url)
    assert e.value.code == "SCRAPE_TOO_LARGE"
    for bad in ("ftp://x/metrics", "127.0.0.1:9464/metrics", "http:///metrics"):
        with pytest.raises(ScrapeError) as e:
            _top.scrape(bad)
        assert e.value.code == "SCRAPE_URL"


def test_refused_and_silent_endpoints() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ScrapeError) as e:  # nobody listens there now
        _top.scrape(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert e.value.code == "SCRAPE_CONNECT"
    with socket.socket() as silent:  # accepts (the backlog does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        started = time.monotonic()
        with pytest.raises(ScrapeError) as e:
            _top.scrape(f"http://127.0.0.1:{silent.getsockname()[1]}/metrics", timeout=0.3)
        assert e.value.code == "SCRAPE_TIMEOUT"
        assert time.monotonic() - started < 5


def test_once_against_nothing_fails_without_a_traceback(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["top", f"http://127.0.0.1:{port}/metrics", "--once", "--interval", "0.1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("wirepool top: SCRAPE_CONNECT: ") and "Traceback" not in err


def test_a_bad_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for once in ([], ["--once"]):
        assert main(["top", "localhost:9464/metrics", *once]) == 2
        assert "SCRAPE_URL: not an http(s) URL" in capsys.readouterr().err


def test_a_pid_that_is_not_a_number_shows_as_unknown() -> None:
    text = ('wirepool_workers{pool="p"} 1\n'
            'wirepool_worker_state{pool="p",worker="0",state="ready"} 1\n'
            'wirepool_worker_pid{pool="p",worker="0"} NaN\n')
    [view] = build_views(Scrape(1.0, parse_text(text, "builtin")), None)
    assert [(r.slot, r.pid, r.state) for r in view.rows] == [("0", None, "ready")]


def test_live_view_needs_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "http://127.0.0.1:9/metrics"]) == 2  # pytest's stdout is no terminal
    assert "use --once" in capsys.readouterr().err


def test_usage_errors() -> None:
    for argv in (["top"], ["top", "http://x/metrics", "--interval", "0"],
                 ["top", "http://x/metrics", "--interval", "soon"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2


NODE_DIST = PYTHON_DIR.parent / "node" / "dist"
NODE_PARENT = """
import http from "node:http";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
const [dist, python, worker] = process.argv.slice(2);
const { Pool } = await import(pathToFileURL(`${dist}/index.js`).href);
const { exportPool } = await import(pathToFileURL(`${dist}/prometheus.js`).href);
const { Registry } = createRequire(`${dist}/prometheus.js`)("prom-client");
const pool = await Pool.start({ command: [python, worker], workers: 2 });
const registry = new Registry();
await exportPool(pool, { registry, name: "node" });
const server = http.createServer(async (_req, res) => {
  res.setHeader("Content-Type", registry.contentType);
  res.end(await registry.metrics());
});
server.listen(0, "127.0.0.1", () => console.log(`http://127.0.0.1:${server.address().port}/metrics`));
let stop = false;
process.stdin.on("end", () => { stop = true; }).resume();  // the test closes stdin: stop
while (!stop) await pool.call("add", { a: 1, b: 2 });
server.close();
await pool.close();
"""


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[1])


@pytest.mark.skipif(shutil.which("node") is None or not (NODE_DIST / "prometheus.js").exists(),
                    reason="needs node and the built Node SDK (node/dist: cd node && npm run build)")
def test_once_reads_the_node_exporter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Any SDK's endpoint: a Node parent (its wirepool/prometheus exporter) of Python workers."""
    script = tmp_path / "parent.mjs"
    script.write_text(NODE_PARENT)
    node = subprocess.Popen(["node", str(script), str(NODE_DIST), *WORKER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert node.stdout is not None and node.stdin is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(node.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(SCREEN_TIMEOUT_S)  # the parent prints its address once it listens
        assert got and got[0].startswith("http://"), (got, node.poll())
        url = got[0].strip()
        assert main(["top", url, "--once", "--interval", "0.5"]) == 0
        out = capsys.readouterr().out
        header = re.search(r"^pool node: workers 2/2 alive  calls/s (\S+)", out, re.M)
        assert header and header.group(1) not in ("-", "0"), out
        rows = _rows(out)
        assert set(rows) == {"0", "1"}, out
        for pid in rows.values():  # the pids shown are the Node parent's own workers
            assert _parent_of(pid) == node.pid, (pid, out)
        assert re.search(r"^  add\s+\d", out, re.M), out
    finally:
        if node.stdin is not None:
            node.stdin.close()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
        if node.stdout is not None:
            node.stdout.close()
        if node.stderr is not None:
            node.stderr.close()


# ---------------------------------------------------------------------------------------------
# The live view in tmux
# ---------------------------------------------------------------------------------------------


def _drive(pool: Any, stop: threading.Event) -> None:
    """Calls until told to stop (and a stream now and then), so the rates are not zero."""
    n = 0
    while not stop.is_set():
        pool.call("add", {"a": n, "b": 1})
        n += 1
        if n % 200 == 0:
            for _ in pool.stream("rows", {"n": 20}):
                pass


class Tmux:
    """A tmux server of our own (its own socket), so the test never touches anyone else's."""

    def __init__(self) -> None:
        self.socket = f"wirepool-top-test-{os.getpid()}-{time.monotonic_ns()}"
        self.path: str | None = None  # the server's socket file, removed by kill()

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=30, check=check)

    def screen(self, target: str) -> str:
        done = self("capture-pane", "-p", "-t", target, check=False)
        return done.stdout if done.returncode == 0 else ""

    def wait_for(self, target: str, ok: Any, what: str) -> str:
        deadline = time.monotonic() + SCREEN_TIMEOUT_S
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen(target)
            if ok(screen):
                return screen
            time.sleep(0.1)  # polling the screen: the event waited for is what it shows
        raise AssertionError(f"{what} not on screen within {SCREEN_TIMEOUT_S} s:\n{screen}")

    def has(self, target: str) -> bool:
        return self("has-session", "-t", target, check=False).returncode == 0

    def start(self, *args: str) -> None:
        """new-session with ``args``; remembers the server's socket file."""
        self("new-session", *args)
        self.path = self("display-message", "-p", "#{socket_path}", check=False).stdout.strip()

    def kill(self) -> None:
        self("kill-server", check=False)
        if self.path:  # tmux leaves the file of a killed server behind
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _rows(screen: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"^  (\d+)\s+(\d+)\s+(?:starting|ready|leased|draining|dead)\b",
                        screen, re.M)}


def _calls_per_s(screen: str) -> float:
    m = re.search(r"^pool demo: workers \d+/\d+ alive  calls/s (\d+(?:\.\d+)?)( [kMG])?",
                  screen, re.M)
    if m is None:
        return 0.0
    return float(m.group(1)) * {None: 1, " k": 1e3, " M": 1e6, " G": 1e9}[m.group(2)]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: the live "
                    "view is tested by reading a tmux pane")
@pytest.mark.parametrize("quit_key", ["q", "C-c"])
def test_top_in_tmux_shows_the_pools_workers_and_quits(quit_key: str) -> None:
    registry = prometheus_client.CollectorRegistry()
    tmux = Tmux()
    session = "top"
    stop = threading.Event()
    pool = wirepool.Pool(WORKER, workers=3, max_in_flight=16)
    server = None
    driver = threading.Thread(target=_drive, args=(pool, stop))
    try:
        registry.register(PoolCollector(pool, name="demo"))
        server, _thread = prometheus_client.start_http_server(0, addr="127.0.0.1",
                                                              registry=registry)
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        driver.start()
        top = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "wirepool.cli", "top", url,
                                                "--interval", "0.5"])
        # bash waits for top through a Ctrl-C (top exits 0 on it), then says how it exited.
        script = (f"cd {shlex.quote(str(PYTHON_DIR))} && {top}; "
                  "echo \"top exited with $?\"; read _")
        tmux.start("-d", "-s", session, "-x", "160", "-y", "40", "bash", "-c", script)

        pids = {str(w["slot"]): w["pid"] for w in pool.metrics()["slots"]}
        assert len(pids) == 3 and all(pids.values())
        screen = tmux.wait_for(session, lambda s: _rows(s) == pids and _calls_per_s(s) > 0,
                               f"the rows of workers {pids} and a nonzero calls/s")
        assert f"wirepool top  {url}" in screen
        assert "pool demo: workers 3/3 alive" in screen
        assert re.search(r"^  add\s+\d", screen, re.M), screen  # the method line

        tmux("send-keys", "-t", session, quit_key)
        screen = tmux.wait_for(session, lambda s: "top exited with" in s, "top's exit")
        assert "top exited with 0" in screen, screen
        assert "pool demo" not in screen, screen  # curses gave the screen back as it was
        assert "Traceback" not in screen, screen
        tmux("send-keys", "-t", session, "Enter")  # bash reads its line and ends: so does the session
        deadline = time.monotonic() + 30
        while tmux.has(session) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not tmux.has(session)
    finally:
        tmux.kill()
        stop.set()
        if driver.is_alive():
            driver.join(30)
        if server is not None:
            server.shutdown()
            server.server_close()
        pool.close()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: the live "
                    "view is tested by reading a tmux pane")
def test_top_in_tmux_shows_a_failed_scrape_and_retries() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmux = Tmux()
    try:
        top = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "wirepool.cli", "top",
                                                f"http://127.0.0.1:{port}/metrics",
                                                "--interval", "0.2"])
        tmux.start("-d", "-s", "top", "-x", "160", "-y", "40", "bash", "-c",
             f"cd {shlex.quote(str(PYTHON_DIR))} && {top}; echo \"top exited with $?\"; read _")
        first = tmux.wait_for("top", lambda s: "scrape failed: SCRAPE_CONNECT" in s,
                              "the scrape failure")
        assert "(retrying)" in first and "Traceback" not in first
        stamp = re.search(r"every 0.2 s  (\d\d:\d\d:\d\d)", first)
        assert stamp, first
        # It keeps trying: the frame is redrawn with a later time, the error still shown.
        later = tmux.wait_for("top", lambda s: stamp.group(1) not in s and "every 0.2 s" in s,
                              "a later frame")
        assert "scrape failed: SCRAPE_CONNECT" in later
        tmux("send-keys", "-t", "top", "q")
        assert "top exited with 0" in tmux.wait_for("top", lambda s: "top exited" in s,
                                                    "top's exit")
    finally:
        tmux.kill()
