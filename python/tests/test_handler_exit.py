"""What ending the process from a handler does, as python/README.md ("Ending a worker") says:
sys.exit ends only its request (HANDLER_PANIC) in every handler kind and the worker serves on;
os._exit ends the worker (WORKER_EXITED with its status and stderr) and the pool replaces it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import wirepool
from wirepool.errors import ErrorCode

WORKER = [sys.executable, str(Path(__file__).resolve().parent / "workers" / "exits.py")]


@pytest.mark.timeout(60)
def test_sys_exit_in_a_handler_ends_only_its_request() -> None:
    with wirepool.Pool(WORKER, workers=1) as p:
        pid = p.call("pid", None)
        for method in ("exit_plain", "exit_inline", "exit_async"):
            with pytest.raises(wirepool.HandlerPanic) as info:
                p.call(method, 3)
            assert info.value.code == ErrorCode.HANDLER_PANIC, method
            assert info.value.message == "SystemExit: 3", method
        with pytest.raises(wirepool.HandlerPanic) as info:
            with p.stream("exit_stream", 4) as rows:
                assert list(rows) == [1]
        assert info.value.message == "SystemExit: 4"
        assert p.call("pid", None) == pid, "the same worker serves on"
        assert p.metrics()["spawned"] == 1, "no replacement was started"


@pytest.mark.timeout(60)
def test_os_exit_in_a_handler_ends_the_worker_which_is_replaced() -> None:
    with wirepool.Pool(WORKER, workers=1) as p:
        pid = p.call("pid", None)
        with pytest.raises(wirepool.WorkerExited) as info:
            p.call("hard_exit", 7)
        assert info.value.exit_status == 7
        assert "leaving with status 7" in info.value.stderr_tail
        assert p.call("pid", None) != pid, "a replacement serves"
