"""Test worker: echo, add, streams, errors, cancellation, slowness, crashes."""

import asyncio
import os
import signal
import sys
import threading
import time

import wirepool


@wirepool.method(codecs=["json", "msgpack", "raw"])
def echo(req):
    return req


@wirepool.method
def add(req: dict) -> dict:
    return {"sum": req["a"] + req["b"]}


@wirepool.method(inline=True)
def add_inline(req: dict) -> dict:
    if req.get("fail"):
        raise wirepool.WorkerError(1001, "inline failure")
    return {"sum": req["a"] + req["b"]}


@wirepool.method(inline=True, codecs=["json"])
def item_inline(req):
    """Inline echo of ``req["v"]``; ``fail`` raises, ``exit`` ends the process mid-read,
    ``size`` answers a string of that many bytes (more than one frame when large)."""
    if req.get("fail"):
        raise wirepool.WorkerError(1003, f"item {req['v']} failed", {"v": req["v"]})
    if req.get("exit"):
        sys.stderr.write("exiting mid-map\n")
        sys.stderr.flush()
        os._exit(7)
    if req.get("size"):
        return "x" * req["size"]
    return req["v"]


@wirepool.method(codecs=["json"])
def item(req):
    """``item_inline`` on the handler thread pool."""
    return item_inline(req)


_barriers: dict = {}
_barriers_lock = threading.Lock()


@wirepool.method
def meet(req):
    """Returns once ``req["n"]`` calls of one ``req["name"]`` run at the same time (each in its
    own handler thread); fails after 10 s if they never do."""
    with _barriers_lock:
        barrier = _barriers.setdefault(req["name"], threading.Barrier(req["n"], timeout=10))
    barrier.wait()
    return req["name"]


@wirepool.method
async def add_async(req: dict) -> dict:
    await asyncio.sleep(0)
    return {"sum": req["a"] + req["b"]}


@wirepool.method
def pid(req):
    return os.getpid()


@wirepool.stream
def rows(req: dict, ctx: wirepool.Context):
    for i in range(req["n"]):
        if ctx.cancelled:
            break
        yield {"i": i, "name": f"decl_{i}", "kind": "theorem"}


@wirepool.stream
async def rows_async(req: dict, ctx: wirepool.Context):
    for i in range(req["n"]):
        yield {"i": i}
        if i % 100 == 0:
            await asyncio.sleep(0)


@wirepool.stream
def rows_with_summary(req: dict, ctx: wirepool.Context):
    total = 0
    for i in range(req["n"]):
        total += i
        ctx.progress("count", {"done": i + 1})
        yield {"i": i}
    return {"total": total}


@wirepool.method
def fail(req):
    raise wirepool.WorkerError(1042, "no such thing", {"thing": req.get("thing")})


@wirepool.method
def fail_reserved(req):
    raise wirepool.WorkerError(205, "pretending to be CANCELLED")


@wirepool.method
def boom(req):
    raise ValueError("bad value")


@wirepool.method
def sleep(req, ctx: wirepool.Context):
    """Sleeps cooperatively: returns early when cancelled or past its deadline."""
    end = time.monotonic() + req["seconds"]
    while time.monotonic() < end:
        if ctx.cancelled:
            return {"cancelled": True}
        time.sleep(0.005)
    return {"slept": req["seconds"]}


@wirepool.method
def sleep_stubborn(req):
    time.sleep(req["seconds"])  # ignores cancellation
    return {"slept": req["seconds"]}


@wirepool.stream
def echo_rows(req):
    """Yields each value of ``req["rows"]`` (``repeat`` times over)."""
    for _ in range(req.get("repeat", 1)):
        yield from req["rows"]


@wirepool.stream
async def echo_rows_async(req):
    for _ in range(req.get("repeat", 1)):
        for row in req["rows"]:
            yield row


@wirepool.stream(codecs=["raw"])
def raw_rows_reused(req):
    """Raw rows from one reused bytearray (each must be sent as it was when yielded), then
    memoryviews, one of them of 4-byte items."""
    import array
    buf = bytearray(8)
    for i in range(int(bytes(req))):
        buf[:] = i.to_bytes(8, "little")
        yield buf
    yield memoryview(b"view")
    yield memoryview(array.array("i", [1, 2, 3]))


@wirepool.stream(codecs=["raw"])
def raw_mixed(req):
    """``n`` distinct bytes rows, then (``how``) "type_error" raises TypeError, "int" yields 5
    (not a raw row), "big" yields a row larger than any frame, "summary" goes on: ``n`` rows
    from one reused bytearray, ``n`` bytes rows again, and returns b"done"."""
    spec = bytes(req).decode().split(",")
    n, how = int(spec[0]), spec[1]
    for i in range(n):
        yield b"a%d" % i
    if how == "type_error":
        raise TypeError("the generator's own type error")
    if how == "int":
        yield 5
    if how == "big":
        yield b"x" * (17 << 20)
    buf = bytearray(8)
    for i in range(n):
        buf[:] = i.to_bytes(8, "little")
        yield buf
    for i in range(n):
        yield b"c%d" % i
    return b"done"


@wirepool.stream(codecs=["raw"])
def raw_endless(req):
    """Yields forever, never looking at the cancellation flag: the worker must stop it."""
    while True:
        yield b"row"


@wirepool.stream(codecs=["raw"])
def raw_trickle(req):
    """100 bytes rows at once, then waits (up to 10 s) until ``release``, then one more."""
    _released.clear()
    for i in range(100):
        yield b"r%d" % i
    _released.wait(10)
    yield b"released" if _released.is_set() else b"timed out"


_released = threading.Event()


@wirepool.stream
def trickle(req, ctx: wirepool.Context):
    """One row, then waits (up to 10 s) until ``release`` is called, then a last row."""
    _released.clear()
    yield {"first": True}
    _released.wait(10)
    yield {"released": _released.is_set()}


@wirepool.stream
def burst_then_wait(req):
    """``n`` rows at once, then waits (up to 10 s) until ``release``, then one more row."""
    _released.clear()
    for i in range(req["n"]):
        yield {"i": i}
    _released.wait(10)
    yield {"released": _released.is_set()}


@wirepool.stream
def deaf_endless(req):
    """Yields forever, never looking at the cancellation flag: the worker must stop it."""
    i = 0
    while True:
        yield {"i": i}
        i += 1


@wirepool.stream
def rows_returning(req):
    """``n`` rows, then returns the summary from inside a try/finally (a return value the
    worker must not miss)."""
    try:
        for i in range(req["n"]):
            yield i
        total = req["n"]
        return {"rows": total}
    finally:
        pass


@wirepool.method
def release(req):
    _released.set()
    return True


@wirepool.stream
def endless(req, ctx: wirepool.Context):
    i = 0
    while not ctx.cancelled:
        yield {"i": i}
        i += 1


@wirepool.stream
def endless_counted(req, ctx: wirepool.Context):
    i = 0
    while not ctx.cancelled:
        yield {"i": i}
        i += 1
        if i % 100 == 0:
            ctx.progress("produced", i)


@wirepool.stream
async def endless_counted_async(req, ctx: wirepool.Context):
    i = 0
    while True:
        yield {"i": i}
        i += 1
        if i % 100 == 0:
            ctx.progress("produced", i)


@wirepool.stream
def crash_after(req, ctx: wirepool.Context):
    for i in range(req["n"]):
        yield {"i": i}
    sys.stderr.write("about to die\n")
    sys.stderr.flush()
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
    yield {"never": True}


@wirepool.stream
def big_row(req):
    yield "x"  # a valid row first
    yield "x" * req["size"]


@wirepool.method
def die(req):
    sys.stderr.write("dying on purpose\n")
    sys.stderr.flush()
    os._exit(req.get("status", 3))


@wirepool.method
def say(req):
    """Prints req['text'] on stdout and on stderr (a line each), then answers."""
    print(req["text"], flush=True)
    print(req["text"], file=sys.stderr, flush=True)
    return {"ok": True}


@wirepool.method
def chatter(req):
    """Writes req['mb'] megabytes to stdout and stderr, then answers."""
    line = "x" * 1023 + "\n"
    for _ in range(req["mb"] * 1024):
        sys.stdout.write(line)
        sys.stderr.write(line)
    sys.stdout.flush()
    return {"ok": True}


@wirepool.method
def progress(req, ctx: wirepool.Context):
    for i in range(req["n"]):
        ctx.progress("step", {"i": i})
        time.sleep(0.001)
    return {"done": req["n"]}


try:
    import pyarrow as pa
    import pyarrow.compute as pc

    @wirepool.method(codecs=["arrow"])
    def arrow_double(table):
        return pa.table({name: pc.multiply(col, 2) for name, col in
                         zip(table.column_names, table.columns)})
except ImportError:
    pass


if __name__ == "__main__":
    wirepool.serve(max_concurrency=int(os.environ.get("MAX_CONCURRENCY", "16")))
