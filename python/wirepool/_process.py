"""How a local worker process starts: the connection its parent handed it (``WIREPOOL_FD``)
and the parent-death signal (PROTOCOL.md 8.4)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys


def _take_fd() -> int:
    raw = os.environ.pop("WIREPOOL_FD", None)
    if raw is None:
        raise RuntimeError("WIREPOOL_FD is not set: this program must be started by a wirepool "
                           "parent (e.g. wirepool.Pool([sys.executable, 'worker.py']))")
    try:
        fd = int(raw)
    except ValueError:
        raise RuntimeError(f"WIREPOOL_FD={raw!r} is not a file descriptor number") from None
    os.set_inheritable(fd, False)  # our own children must not hold the connection
    return fd


def _die_with_parent() -> None:
    """Linux: ask for SIGKILL when the parent dies, so a worker never outlives it.

    SIGKILL, not SIGTERM (spec 8.4): a stopped (SIGSTOP) process never acts on SIGTERM, so a
    worker stopped while its parent was killed would live on; there is nothing to clean up that
    the parent's death has not already made moot."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
