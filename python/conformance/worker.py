"""The Python conformance worker: the method set of conformance/README.md, on the Python SDK.

Every conformance worker (one per language) offers exactly these methods, with the same kinds,
codecs and behaviour, so every parent runner can drive every worker with one scenario list:

| method | kind | codecs | request -> answer |
|---|---|---|---|
| echo | unary | raw, json, msgpack, cbor | any body -> the same value |
| add | unary | json | {"a": int, "b": int} -> {"sum": a + b} |
| decls | stream | json, msgpack, cbor | {"n": N} -> rows {"i", "name": "decl_i", "kind": "theorem"}, summary {"rows": N} |
| raw_rows | stream | raw | "N SIZE" -> N rows of SIZE bytes (first 8 = i LE, rest 0xAB), no summary |
| raw_rows_produced | unary | json | any -> rows handed to the SDK by the latest raw_rows stream |
| forever | stream | json | any -> rows 0, 1, 2, ... until cancelled |
| one_row_then_wait | stream | json | any -> row 0, then waits until cancelled (the flush rule) |
| sleep | unary | json | ms -> ms after sleeping; stops at cancellation or deadline |
| hang | unary | json | ms -> ms after blocking ms, ignoring cancellation and deadline |
| fail | unary | json | any -> HANDLER_ERROR "the fail method was called" |
| fail_app | unary | json | any -> code 1042 "application failure", details {"request": <it>} |
| crash | unary | json | writes a line to stderr, then aborts (SIGABRT) |
| crash_stream | stream | json | {"n": N} -> decl rows 0..N, then a stderr line and abort |
| fail_long | unary | json | {"n": N} -> code 1042, message "long failure: " then N x "é" (2N bytes of UTF-8) |
| big_summary | stream | json | {"size": N} -> one row 0, then the summary: the pattern string of N characters |
| fail_after | stream | json | {"n": N} -> decl rows 0..N, then HANDLER_ERROR "failed after the rows" |
| gather | unary | json | n -> n, once n gather calls have arrived at this worker (blocks until then; stops if cancelled) |
| spin | unary | json | ms -> ms, after busy-looping ms on a handler thread (stops if cancelled) |
| whoami | unary | json | any -> this worker's process id |
| exit | unary | json | {"status": N} -> the process exits with status N at once |
| freeze | unary | json | any -> stops the whole process (SIGSTOP): it answers nothing, not even PING, and never answers once resumed |
| print | unary | json | {"stream": "stdout"|"stderr", "n": N} -> writes N bytes "x" there, returns N |

It is started by a parent (``WIREPOOL_FD``); it is not meant to be run by hand.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time

import wirepool

CRASH_LINE = "conformance worker: crash requested"
APP_ERROR_CODE = 1042

_gathered = threading.Condition()
_gathered_count = 0  # gather calls arrived so far (each scenario runs on fresh worker processes)
_produced_lock = threading.Lock()
_produced = 0


@wirepool.method(codecs=["raw", "json", "msgpack", "cbor"])
def echo(body):
    # Raw bodies arrive as a memoryview of the frame: copy out before the buffer is reused.
    return bytes(body) if isinstance(body, memoryview) else body


@wirepool.method(codecs=["json"])
def add(req):
    return {"sum": req["a"] + req["b"]}


def _decl(i: int) -> dict:
    return {"i": i, "name": f"decl_{i}", "kind": "theorem"}


@wirepool.stream(codecs=["json", "msgpack", "cbor"])
def decls(req, ctx):
    n = req["n"]
    for i in range(n):
        if ctx.cancelled:
            return None
        yield _decl(i)
    return {"rows": n}


@wirepool.stream(codecs=["raw"])
def raw_rows(req, ctx):
    global _produced
    n_text, size_text = bytes(req).decode().split()
    n, size = int(n_text), int(size_text)
    with _produced_lock:
        _produced = 0
    row = bytearray(b"\xab" * size)
    prefix = min(size, 8)
    for i in range(n):
        if ctx.cancelled:
            return None
        row[:prefix] = i.to_bytes(8, "little")[:prefix]
        with _produced_lock:
            _produced = i + 1
        yield bytes(row)
    return None


@wirepool.method(codecs=["json"])
def raw_rows_produced(_req):
    with _produced_lock:
        return _produced


@wirepool.stream(codecs=["json"])
def forever(_req, ctx):
    i = 0
    while not ctx.cancelled:
        yield i
        i += 1


@wirepool.stream(codecs=["json"])
def one_row_then_wait(_req, ctx):
    yield 0
    while not ctx.cancelled:
        time.sleep(0.005)  # a handler blocked after one row: the SDK must still send it


@wirepool.method(codecs=["json"])
async def sleep(ms):
    # Cancellation and the deadline cancel this coroutine at its await.
    await asyncio.sleep(ms / 1000)
    return ms


@wirepool.method(codecs=["json"])
def hang(ms):
    time.sleep(ms / 1000)  # deliberately deaf to cancellation: the parent must enforce deadlines
    return ms


@wirepool.method(codecs=["json"])
def fail(_req):
    raise RuntimeError("the fail method was called")


@wirepool.method(codecs=["json"])
def fail_app(req):
    raise wirepool.WorkerError(APP_ERROR_CODE, "application failure", {"request": req})


@wirepool.method(codecs=["json"])
def fail_long(req):
    raise wirepool.WorkerError(APP_ERROR_CODE, "long failure: " + "\u00e9" * req["n"])


def _pattern_string(size: int) -> str:
    """The scenarios' {"string": {"size": N}}: character i is 'a' + (31 i + 17) mod 26."""
    return "".join(chr(97 + (i * 31 + 17) % 26) for i in range(size))


@wirepool.stream(codecs=["json"])
def big_summary(req, _ctx):
    yield 0
    return _pattern_string(req["size"])


@wirepool.stream(codecs=["json"])
def fail_after(req, _ctx):
    for i in range(req["n"]):
        yield _decl(i)
    raise RuntimeError("failed after the rows")


@wirepool.method(codecs=["json"])
def gather(n, ctx):
    global _gathered_count
    with _gathered:
        _gathered_count += 1
        _gathered.notify_all()
        while _gathered_count < n:
            if ctx.cancelled:
                raise RuntimeError("cancelled while gathering")
            # Timed wait: cancellation sets a flag, it does not notify this condition.
            _gathered.wait(0.005)
    return n


def _abort() -> None:
    sys.stderr.write(CRASH_LINE + "\n")
    sys.stderr.flush()
    os.abort()


@wirepool.method(codecs=["json"])
def crash(_req):
    _abort()


@wirepool.stream(codecs=["json"])
def crash_stream(req, _ctx):
    for i in range(req["n"]):
        yield _decl(i)
    _abort()


@wirepool.method(codecs=["json"])
def spin(ms, ctx):
    end = time.monotonic() + ms / 1000
    turns = 0
    while time.monotonic() < end and not ctx.cancelled:
        turns += 1
    return ms


@wirepool.method(codecs=["json"])
def whoami(_req):
    return os.getpid()


@wirepool.method(name="exit", codecs=["json"])
def exit_(req):
    sys.stderr.flush()
    os._exit(req["status"])


@wirepool.method(codecs=["json"])
def freeze(_req):
    os.kill(os.getpid(), signal.SIGSTOP)
    # Resumed (e.g. while the parent replaces it): never answer, so the outcome cannot depend on
    # when the resume came; the parent's WORKER_HUNG is the request's one terminal.
    threading.Event().wait()


@wirepool.method(name="print", codecs=["json"])
def print_(req):
    out = {"stdout": sys.stdout, "stderr": sys.stderr}.get(req["stream"])
    if out is None:
        raise ValueError(f"no stream named {req['stream']!r}")
    out.write("x" * req["n"])
    out.flush()
    return req["n"]


if __name__ == "__main__":
    wirepool.serve(max_concurrency=64)
