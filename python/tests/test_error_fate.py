"""An ERROR's fate is decided by its id, never by its code (PROTOCOL.md 3): on a request id it
ends that request only, whatever the code; a 3xx code on the wire is the worker's error, never
the parent's own WORKER_EXITED or WORKER_HUNG: no death counted, nothing killed, never retried
(21.7). The worker (workers/wire_codes.py) sends the code each request names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import wirepool
from wirepool import ErrorCode

WORKER = [sys.executable, str(Path(__file__).resolve().parent / "workers" / "wire_codes.py")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [ErrorCode.WORKER_EXITED, ErrorCode.WORKER_HUNG,
                                  ErrorCode.POOL_CLOSED, 399])
def test_a_3xx_code_on_the_wire_is_the_workers_error_not_retried(code: int) -> None:
    policy = wirepool.RetryPolicy(methods={"fail"}, attempts=3)
    with wirepool.Pool(WORKER, workers=1, retry=policy, restart_backoff=0.01,
                       worker_output="discard") as pool:
        pid = pool.call("pid")["pid"]
        with pytest.raises(wirepool.WirepoolError) as info:
            pool.call("fail", {"code": code})
        e = info.value
        assert e.code == code and e.message == f"code {code}, sent by the worker"
        assert pool.metrics().get("retries", 0) == 0
        assert isinstance(e, wirepool.RequestError)
        assert not isinstance(e, wirepool.LocalError)
        assert pool.call("pid")["pid"] == pid  # the same worker: nothing killed
        assert pool.metrics().get("restarts", 0) == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code,name", [(0, "UNKNOWN"), (50, "UNKNOWN"), (99, "UNKNOWN"),
                                       (400, "UNKNOWN"), (999, "UNKNOWN"), (150, "PROTOCOL"),
                                       (199, "PROTOCOL")])
def test_unassigned_and_1xx_codes_on_a_request_id_end_that_request_only(code: int,
                                                                        name: str) -> None:
    # The vector parent_error_fate_by_id_not_code, end to end: 50, 300 and 150.
    with wirepool.Pool(WORKER, workers=1, worker_output="discard") as pool:
        pid = pool.call("pid")["pid"]
        with pytest.raises(wirepool.WirepoolError) as info:
            pool.call("fail", {"code": code})
        e = info.value
        assert (e.code, e.name) == (code, name)
        assert isinstance(e, wirepool.RequestError)
        assert not isinstance(e, (wirepool.LocalError, wirepool.ProtocolError))
        assert pool.call("pid")["pid"] == pid
        assert pool.metrics().get("restarts", 0) == 0


@pytest.mark.timeout(60)
def test_2xx_and_application_codes_keep_their_classes() -> None:
    with wirepool.Pool(WORKER, workers=1, worker_output="discard") as pool:
        with pytest.raises(wirepool.BadRequest):
            pool.call("fail", {"code": ErrorCode.BAD_REQUEST})
        with pytest.raises(wirepool.WorkerError) as info:
            pool.call("fail", {"code": 1001})
        assert info.value.code == 1001


def test_error_from_wire_against_error_from_code() -> None:
    # The local constructor keeps the local classes, for outcomes the SDK decides itself.
    assert type(wirepool.error_from_code(ErrorCode.WORKER_EXITED)) is wirepool.WorkerExited
    assert type(wirepool.errors.error_from_wire(ErrorCode.WORKER_EXITED, id=1)) \
        is wirepool.RequestError
