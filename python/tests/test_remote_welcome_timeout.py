"""A remote worker's welcome timeout runs from its TCP connect (PROTOCOL.md 21.5, 21.6), not
from before it: a slow connect has its own bound (connect_timeout). The loop's clock is moved by
the test, so no test waits on time."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from wirepool import remote


def _ticket() -> remote.Ticket:
    return remote.Ticket(host="127.0.0.1", port=4000, id=bytes(range(16)),
                         secret=bytes(range(32)), expires=2_000_000_000, tls=True,
                         fingerprint=bytes(32))


class _ClockLoop(asyncio.SelectorEventLoop):
    """A loop whose clock the test moves: its timers fire when the test says time passed."""

    offset = 0.0

    def time(self) -> float:
        return super().time() + self.offset


async def _passes(n: int = 3) -> None:
    for _ in range(n):  # loop passes, so that due timers run (no waiting on time)
        await asyncio.sleep(0)


@pytest.mark.timeout(30)
def test_the_welcome_timeout_starts_at_the_tcp_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    from wirepool import worker as _worker
    loop = _ClockLoop()
    stops: list[int] = []
    seen: dict[str, bool] = {}
    runtime = types.SimpleNamespace(_write=lambda parts: None, _stop=stops.append,
                                    conn=types.SimpleNamespace(send_ping=lambda n: []),
                                    watchdog=None)
    timeout = remote.DEFAULT_WELCOME_TIMEOUT

    async def connect(ticket: Any, protocol: Any, *, timeout: float = 5.0,
                      on_connected: Any = None) -> Any:
        loop.offset += timeout + 20  # a TCP connect far longer than the welcome timeout...
        await _passes()
        seen["before"] = bool(stops)  # ...is no missing WELCOME: it has its own bound
        if on_connected is not None:
            on_connected()
        return None

    monkeypatch.setattr(remote, "connect", connect)

    async def main() -> None:
        assert await _worker._join(_ticket(), runtime)  # type: ignore[arg-type]
        loop.offset += timeout - 1
        await _passes()
        seen["within"] = bool(stops)
        loop.offset += 2
        await _passes()

    try:
        loop.run_until_complete(main())  # (no wait_for: its clock is the one moved)
    finally:
        loop.close()
    assert seen == {"before": False, "within": False}
    assert stops == [0]  # gone once the welcome timeout passed after the connect
