"""wirepool: run work in child worker processes behind a fast, typed binary protocol.

Worker (``worker.py``)::

    import wirepool

    @wirepool.method
    def add(req: dict) -> dict:
        return {"sum": req["a"] + req["b"]}

    wirepool.serve()

Parent::

    with wirepool.Pool([sys.executable, "worker.py"], workers=4) as pool:
        assert pool.call("add", {"a": 1, "b": 2}) == {"sum": 3}
"""

from . import codecs, proto
from .errors import (BadRequest, Cancelled, CodecUnsupported, DeadlineExceeded, DecodeFailed,
                     Draining, ErrorCode, HandlerError, HandlerPanic, InvalidArgument, LeaseLost,
                     LocalError,
                     Overloaded, PoolClosed, ProtocolError, ProtocolViolation, RequestError,
                     RowTooLarge, SpawnFailed, StartupTimeout, UnknownMethod, WirepoolError,
                     WorkerError, WorkerExited, WorkerHung, error_from_code)
from .pool import AsyncPool, Lease, PoolMetrics, RetryPolicy, Stream
from .sync_pool import Pool, SyncStream
from .worker import Context, method, serve, stream

__version__ = "0.1.0"

__all__ = [
    "AsyncPool", "Pool", "Stream", "SyncStream", "Lease", "PoolMetrics", "RetryPolicy",
    "method", "stream", "serve", "Context",
    "codecs", "proto",
    "ErrorCode", "WirepoolError", "ProtocolError", "RequestError", "LocalError", "WorkerError",
    "UnknownMethod", "CodecUnsupported", "BadRequest", "HandlerError", "HandlerPanic", "Cancelled",
    "DeadlineExceeded", "Overloaded", "Draining", "RowTooLarge", "WorkerExited", "WorkerHung",
    "StartupTimeout", "SpawnFailed", "PoolClosed", "LeaseLost", "DecodeFailed",
    "ProtocolViolation", "InvalidArgument", "error_from_code",
]
