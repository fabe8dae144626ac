"""The worker every Python example starts: a few lines to expose methods."""

import os
import sys
import time

import wirepool


@wirepool.method
def add(req: dict) -> dict:
    return {"sum": req["a"] + req["b"]}


@wirepool.method
def remember(req: dict) -> dict:
    # Worker-side session state: a lease keeps later calls on this same process.
    global _memory
    _memory = _memory + [req["item"]]
    return {"pid": os.getpid(), "items": _memory}


_memory: list = []


@wirepool.method
def sleep(req: dict, ctx: wirepool.Context) -> dict:
    deadline = time.monotonic() + req["seconds"]
    while time.monotonic() < deadline:
        if ctx.cancelled:  # set by CANCEL from the parent or by the call's deadline
            print("sleep: cancelled, stopping early", flush=True)
            return {"stopped": "cancelled"}
        time.sleep(0.005)
    return {"stopped": "done"}


@wirepool.method
def crash(req: dict) -> dict:
    print("crash: about to die on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@wirepool.stream
def decls(req: dict, ctx: wirepool.Context):
    for i in range(req["n"]):
        if ctx.cancelled:
            break
        yield {"i": i, "name": f"decl_{i}", "kind": "theorem"}
    return {"count": req["n"]}


if __name__ == "__main__":
    wirepool.serve()
