"""A worker whose handlers die on purpose, for the retry policy's tests (test_retry.py).

A request names a ``marker`` file: a handler that "dies first" creates it and ends the process
when it does not exist yet, so the first try dies and the next one (on any worker) serves.
``log`` names a file each try appends its pid to, so a test counts the tries the worker saw.
"""

import os
import signal
import time

import wirepool


def _tried(req: dict) -> None:
    if req.get("log"):
        with open(req["log"], "a") as f:
            f.write(f"{os.getpid()}\n")


def _first(req: dict) -> bool:
    """True for the first try of ``req`` (its marker did not exist: it does now)."""
    try:
        fd = os.open(req["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _wait_for(path: str, within: float = 30.0) -> None:
    """Until the test creates ``path`` (bounded: a test that never does fails, not hangs)."""
    give_up = time.monotonic() + within
    while not os.path.exists(path) and time.monotonic() < give_up:
        time.sleep(0.005)


@wirepool.method
def pid(req):
    return os.getpid()


@wirepool.method
def dies_first(req):
    """Dies on the first try (after ``delay`` seconds); later tries return the pid."""
    _tried(req)
    if _first(req):
        time.sleep(req.get("delay", 0))
        os._exit(1)
    return {"pid": os.getpid()}


@wirepool.method
def freezes_first(req):
    """Stops the whole process (SIGSTOP: no PONG, so the parent finds it hung) on the first
    try; later tries return the pid."""
    _tried(req)
    if _first(req):
        os.kill(os.getpid(), signal.SIGSTOP)
    return {"pid": os.getpid()}


@wirepool.method
def always_dies(req):
    _tried(req)
    os._exit(3)


@wirepool.method
def fails(req):
    _tried(req)
    raise ValueError("no")


@wirepool.method
def dies_first_then_waits(req, ctx: wirepool.Context):
    """Dies on the first try after ``delay`` s; a later try waits until cancelled (its
    deadline) and returns how long it had."""
    _tried(req)
    if _first(req):
        time.sleep(req["delay"])
        os._exit(1)
    began = time.monotonic()
    give_up = began + 30
    while not ctx.cancelled and time.monotonic() < give_up:
        time.sleep(0.005)
    return {"waited": time.monotonic() - began}


@wirepool.method
def waits_until_cancelled(req, ctx: wirepool.Context):
    _tried(req)
    give_up = time.monotonic() + 30
    while not ctx.cancelled and time.monotonic() < give_up:
        time.sleep(0.005)
    return None


@wirepool.method
def hangs_first(req):
    """The first try blocks (until the test creates ``release``, at most 30 s); later tries
    return the pid. For a connection cut while the first try is in flight."""
    _tried(req)
    if _first(req):
        _wait_for(req["release"])
    return {"pid": os.getpid()}


@wirepool.stream
def rows_die_first(req):
    """Dies before its first row on the first try; later tries yield ``n`` rows."""
    _tried(req)
    if _first(req):
        os._exit(1)
    for i in range(req["n"]):
        yield {"i": i, "pid": os.getpid()}


@wirepool.stream
def row_then_dies(req):
    """Yields one row, waits until the test (which read it) creates ``go``, then dies."""
    _tried(req)
    yield {"i": 0, "pid": os.getpid()}
    _wait_for(req["go"])
    os._exit(1)


wirepool.serve()
