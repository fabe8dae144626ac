"""A worker never outlives its parent, even when it is stopped (SIGSTOP) as the parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "workers" / "basic.py"

# The parent: starts a pool of one worker, prints the worker's pid, then waits to be killed.
PARENT = """
import sys, wirepool
pool = wirepool.Pool([sys.executable, sys.argv[1]], workers=1)
print(pool.pids[0], flush=True)
sys.stdin.read()
"""


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_stopped_worker_dies_with_its_killed_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(WORKER)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    worker = 0
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        os.kill(worker, signal.SIGSTOP)
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling a condition with a deadline, not synchronising by sleep
        assert _gone(worker), f"worker {worker} outlived its SIGKILLed parent while stopped"
    finally:
        parent.kill()
        if worker and not _gone(worker):
            os.kill(worker, signal.SIGKILL)
