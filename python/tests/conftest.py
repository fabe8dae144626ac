from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import os
import signal
from typing import Iterator

import pytest

WORKERS = HERE / "workers"


def child_pids() -> list[int]:
    """Live (non-zombie) processes whose parent is this test process."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(entry))
    return out


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Every test must leave no worker behind; kill stragglers so one failure does not cascade."""
    before = set(child_pids())
    yield
    left = [p for p in child_pids() if p not in before]
    for p in left:
        try:
            os.killpg(p, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"test left worker processes behind: {left}"


@pytest.fixture
def worker_argv() -> list[str]:
    return [sys.executable, str(WORKERS / "basic.py")]
