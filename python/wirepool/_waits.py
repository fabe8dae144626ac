"""Waits of a blocking caller that a Ctrl-C interrupts promptly (the blocking :class:`Pool`'s
and its map's)."""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

# A Ctrl-C is process-directed: the kernel may hand it to the loop thread or a child-watcher
# thread, whose C handler only sets Python's flag. The main thread, asleep in a lock, would raise
# KeyboardInterrupt only once its wait ended (a Ctrl-C during a 5 s worker start-up took 5 s), so
# the main thread waits in slices and runs its pending handlers between them. Other threads never
# run handlers: they wait whole.
SIGNAL_SLICE_S = 0.1


def wait_slice() -> float | None:
    """How long the calling thread sleeps in one wait: a slice in the main thread, else whole."""
    return SIGNAL_SLICE_S if threading.current_thread() is threading.main_thread() else None


def acquire_lock(lock: threading.Lock) -> None:
    """``lock.acquire()``, in slices in the main thread (see ``SIGNAL_SLICE_S``)."""
    slice_s = wait_slice()
    if slice_s is None:
        lock.acquire()
        return
    while not lock.acquire(timeout=slice_s):
        pass  # back in Python between slices: a pending KeyboardInterrupt is raised here


def result_of(future: "concurrent.futures.Future[Any]") -> Any:
    """``future.result()``, in slices in the main thread (see ``SIGNAL_SLICE_S``)."""
    slice_s = wait_slice()
    if slice_s is not None:
        while not future.done():
            concurrent.futures.wait((future,), timeout=slice_s)
    return future.result()
