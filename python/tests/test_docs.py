"""The code blocks of docs/ (REMOTE.md, metrics.md, MODEL.md) hold when copied (issue 28, as
test_readme.py for python/README.md). Every fenced block is accounted for: it is run here as
printed, or it is in NOT_RUN with the reason it cannot run alone, so a new block fails
``test_every_block_is_run_or_listed`` until it is one or the other.

- REMOTE.md's walk-through: ``# worker.py``, ``# parent.py`` and the ``sh`` line, run as a
  reader would in two shells: the parent in one folder, the shell line there once the parent
  says the ticket is written; both exit 0, nothing on stderr, the parent prints ``{'sum': 3}``.
- metrics.md's ``wirepool top ... --once`` runs against a live exporter
  (``examples/python/metrics.py --port 0``), its URL pointed at that exporter's port.
"""
from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "docs" / name for name in ("REMOTE.md", "metrics.md", "MODEL.md")]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
BIN = Path(sys.executable).parent  # python3 and wirepool as a reader's shell finds them

# (file, language, first line) -> why the block is not run here.
NOT_RUN = {
    ("MODEL.md", "", " parent process                                             worker "
     "processes (any language)"): "a diagram",
    ("REMOTE.md", "", " parent (pool + listener)                       worker machine(s)"):
        "a diagram",
    ("REMOTE.md", "rust,ignore", "use wirepool::remote::{Launcher, ListenerOptions};"):
        "a fragment (no fn main, `?` and `.await` at top level) binding 0.0.0.0:7700 and "
        "waiting for workers on other machines; the same builder calls compile in "
        "rust/wirepool/src/remote/launcher.rs's doc test and run in tests/remote.rs",
    ("REMOTE.md", "python", "import sys, ray, wirepool"):
        "needs a Ray cluster and defines no `items`; python/tests/test_ray_launcher.py "
        "(make test-ray) runs the launcher",
    ("REMOTE.md", "python", "from wirepool.launchers import External"):
        "a deployment sketch: 0.0.0.0:7700, /run/wirepool, 4 workers started elsewhere; the "
        "walk-through above it runs the same launcher on 127.0.0.1",
    ("REMOTE.md", "yaml", "apiVersion: batch/v1"): "a Kubernetes manifest",
    ("REMOTE.md", "ini", "[Unit]"): "a systemd unit",
    ("metrics.md", "yaml", "scrape_configs:"): "a Prometheus configuration",
}
# Lines of a run block that are not run, and why.
NOT_RUN_LINES = {
    "wirepool top http://127.0.0.1:9464/metrics            # q or Ctrl-C quits":
        "interactive: python/tests/test_top.py drives it in tmux",
}


def _blocks() -> list[tuple[str, str, str]]:
    return [(doc.name, lang.strip(), body) for doc in DOCS
            for lang, body in FENCE.findall(doc.read_text())]


def _block(doc: str, lang: str, starts: str) -> str:
    found = [body for d, la, body in _blocks() if d == doc and la == lang
             and body.startswith(starts)]
    assert len(found) == 1, f"{doc}: {len(found)} ```{lang} blocks start with {starts!r}"
    return found[0]


def _walkthrough() -> tuple[str, str, str]:
    return (_block("REMOTE.md", "python", "# worker.py\n"),
            _block("REMOTE.md", "python", "# parent.py\n"),
            _block("REMOTE.md", "sh", "WIREPOOL_TICKET_FILE="))


def _metrics_top() -> str:
    return _block("metrics.md", "sh", "wirepool top ")


def test_every_block_is_run_or_listed() -> None:
    run_bodies = set(_walkthrough()) | {_metrics_top()}
    unaccounted = [(d, la, body.splitlines()[0]) for d, la, body in _blocks()
                   if body not in run_bodies
                   and (d, la, body.splitlines()[0]) not in NOT_RUN]
    assert not unaccounted, ("blocks neither run by this test nor listed in NOT_RUN with a "
                             f"reason: {unaccounted}")
    listed = {(d, la, body.splitlines()[0]) for d, la, body in _blocks()}
    stale = [k for k in NOT_RUN if k not in listed]
    assert not stale, f"NOT_RUN names blocks the docs no longer have: {stale}"
    top_lines = [line for line in _metrics_top().splitlines() if line.strip()]
    assert all(line in NOT_RUN_LINES or "--once" in line for line in top_lines), top_lines


def _readline(proc: subprocess.Popen[str], within: float) -> str:
    """The next line of ``proc``'s stdout, or fail after ``within`` seconds."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(within):
            raise AssertionError(f"no output within {within} s")
        return proc.stdout.readline()
    finally:
        sel.close()


def _env() -> dict[str, str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    for name in ("WIREPOOL_FD", "WIREPOOL_TICKET", "WIREPOOL_TICKET_FILE"):
        env.pop(name, None)
    return env


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_the_remote_walkthrough_runs_as_printed(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    worker, parent, shell = _walkthrough()
    (tmp_path / "worker.py").write_text(worker)
    (tmp_path / "parent.py").write_text(parent)
    env = _env()
    pool = subprocess.Popen([sys.executable, "parent.py"], cwd=tmp_path, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert _readline(pool, 60) == "ticket written: start the worker\n"
        assert (tmp_path / "ticket").stat().st_mode & 0o077 == 0  # the secret is not shared
        # The other shell.
        done = subprocess.run(["sh", "-c", shell], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
        out, err = pool.communicate(timeout=30)
    finally:
        _stop(pool)
    assert done.returncode == 0, f"the worker's shell line:\n{shell}\nstderr:\n{done.stderr}"
    assert done.stderr == "", done.stderr
    assert pool.returncode == 0, f"parent.py:\n{err}"
    assert err == "", f"parent.py printed to stderr:\n{err}"
    assert out == "{'sum': 3}\n", out


def test_metrics_top_once_reads_a_live_exporter(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    exporter = subprocess.Popen([sys.executable, str(REPO / "examples/python/metrics.py"),
                                 "--port", "0", "--calls", "20"], env=_env(), text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    try:
        ready = _readline(exporter, 60)
        port = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", ready)
        assert port is not None, ready
        for line in _metrics_top().splitlines():
            if not line.strip() or line in NOT_RUN_LINES:
                continue
            command = line.replace("127.0.0.1:9464", f"127.0.0.1:{port[1]}")
            started = time.monotonic()
            done = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=_env(),
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{command}\nstderr:\n{done.stderr}"
            assert done.stderr == "", done.stderr
            assert "example" in done.stdout and "add" in done.stdout, done.stdout
            assert time.monotonic() - started < 30
    finally:
        if exporter.poll() is None:
            exporter.send_signal(signal.SIGTERM)  # the example's own way out
            try:
                exporter.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        _stop(exporter)
    assert exporter.returncode == 0, exporter.stderr.read() if exporter.stderr else ""
