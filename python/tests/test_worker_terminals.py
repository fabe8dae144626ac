"""The Python worker's terminals for the cases PROTOCOL.md leaves to the worker (8.1, 8.3).

A result or summary above the connection's max_message_size cannot be sent: the request ends
HANDLER_ERROR and the connection survives (before, the worker sent it and the parent closed the
connection with MESSAGE_TOO_LARGE, failing the call as a protocol violation).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import wirepool
from wirepool.errors import ErrorCode, WirepoolError

WORKER = [sys.executable, str(Path(__file__).resolve().parent / "workers" / "terminals.py")]
LIMIT = 65_536  # max_frame_size and max_message_size: the smallest allowed


@pytest.mark.timeout(60)
def test_result_and_summary_above_max_message_size_end_handler_error() -> None:
    with wirepool.Pool(WORKER, workers=1, max_frame_size=LIMIT, max_message_size=LIMIT) as p:
        pid = p.call("whoami", None)
        # Fits: one byte under the limit, in continued frames.
        assert p.call("big_result", str(LIMIT - 1).encode(), codec="raw") == b"x" * (LIMIT - 1)
        with pytest.raises(WirepoolError) as info:
            p.call("big_result", str(LIMIT + 1).encode(), codec="raw")
        assert info.value.code == ErrorCode.HANDLER_ERROR, info.value
        assert f"{LIMIT + 1} bytes is above max_message_size {LIMIT}" in info.value.message
        with pytest.raises(WirepoolError) as info:
            with p.stream("big_summary", LIMIT) as rows:
                assert list(rows) == [0]
        assert info.value.code == ErrorCode.HANDLER_ERROR, info.value
        assert "summary" in info.value.message
        assert p.call("whoami", None) == pid, "the connection survived"
        # A request body above the limit is refused by the parent's core before anything is
        # sent (PROTOCOL.md 14.3): the caller gets MESSAGE_TOO_LARGE, the worker never sees it.
        with pytest.raises(WirepoolError) as info:
            p.call("whoami", b"x" * LIMIT, codec="raw")
        assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE, info.value
        assert p.call("whoami", None) == pid
