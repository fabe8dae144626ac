"""A worker whose handlers try to end the process: sys.exit in every handler kind, os._exit."""

import os
import sys

import wirepool


@wirepool.method
def pid(req):
    return os.getpid()


@wirepool.method
def exit_plain(status):
    sys.exit(status)


@wirepool.method(inline=True)
def exit_inline(status):
    sys.exit(status)


@wirepool.method
async def exit_async(status):
    sys.exit(status)


@wirepool.stream
def exit_stream(status):
    yield 1
    sys.exit(status)


@wirepool.method
def hard_exit(status):
    print(f"leaving with status {status}", file=sys.stderr, flush=True)
    os._exit(status)


wirepool.serve()
