"""A remote worker's connection that ends inside a frame is a lost connection (PROTOCOL.md
21.6), not a protocol violation: over a network the parent cannot tell a frame cut short from a
dropped link. The fake worker here (in this process, on the core alone) joins over TLS (or plain
TCP on loopback), sends the first half of a RESULT frame and closes its connection cleanly (TLS
close_notify, then FIN), which is what the parent reads as end of input inside a frame."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Sequence

import pytest

import wirepool
from wirepool import launchers, proto, remote
from wirepool.proto import FrameType, MethodInfo, MethodKind

pytest.importorskip("cryptography")


class HalfResultWorker(asyncio.Protocol):
    """Method ``half`` gets the first half of its RESULT frame and then the connection closes;
    method ``ok`` gets its whole RESULT."""

    def __init__(self) -> None:
        self.conn = proto.Connection("worker")
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _write(self, parts: Any) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(bytes(p) for p in parts))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._write(self.conn.send_hello(proto.Hello(
            pid=os.getpid(), max_concurrency=4, sdk_name="half-result",
            methods=[MethodInfo("half", MethodKind.UNARY, [1]),
                     MethodInfo("ok", MethodKind.UNARY, [1])])))

    def data_received(self, data: bytes) -> None:
        self.conn.receive(data)
        while self.transport is not None and (ev := self.conn.next_event()) is not None:
            if ev.TYPE == FrameType.REQUEST:
                body = json.dumps({"pad": "x" * 1000}).encode()
                frame = b"".join(bytes(p) for p in self.conn.send_result(ev.id, body))
                if ev.method == 0:  # type: ignore[attr-defined]
                    # Past the header, inside the payload: then a clean close.
                    self.transport.write(frame[:len(frame) // 2])
                    self.transport.close()
                    self.transport = None
                else:
                    self.transport.write(frame)
            elif ev.TYPE == FrameType.PING:
                self._write(self.conn.send_pong(ev.nonce))  # type: ignore[attr-defined]
            elif ev.TYPE == FrameType.DRAIN:
                self._write(self.conn.send_goodbye())
                self.transport.close()
                self.transport = None

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.closed.done():
            self.closed.set_result(None)


class InProcess(launchers.Launcher):
    """Each "worker" is a HalfResultWorker in this process, joined with the pool's ticket."""

    def __init__(self, tls: bool) -> None:
        super().__init__(tls=tls)
        self.fakes: list[HalfResultWorker] = []
        self.tasks: set[asyncio.Task[Any]] = set()

    async def launch(self, argv: Sequence[str], env: Any, ticket: remote.Ticket) -> Any:
        fake = HalfResultWorker()
        self.fakes.append(fake)
        task = asyncio.get_running_loop().create_task(remote.connect(ticket, fake, timeout=5))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return fake

    def stop(self, handle: Any) -> None:
        if handle is not None and handle.transport is not None:
            handle.transport.abort()

    async def close(self) -> None:
        for f in self.fakes:
            self.stop(f)
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await super().close()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
def test_end_of_input_inside_a_frame_is_a_lost_connection(tls: bool) -> None:
    async def main() -> None:
        launcher = InProcess(tls=tls)
        pool = wirepool.AsyncPool(["unused"], workers=1, launcher=launcher, heartbeat_ms=200,
                                  restart_backoff=0.01, worker_output="discard",
                                  drain_grace=1.0)
        async with pool:
            assert (await pool.call("ok", {}))["pad"] == "x" * 1000
            with pytest.raises(wirepool.WorkerExited) as info:
                await pool.call("half", {})
            e = info.value
            assert e.code == wirepool.ErrorCode.WORKER_EXITED, e
            assert e.details is not None and e.details["connection"] == "lost", e.details
            assert e.details["host"] == "127.0.0.1"
            assert e.exit_status is None and e.signal is None
            assert "lost its connection" in e.message
            # Replaced; the next call is served by the new worker.
            assert (await pool.call("ok", {}))["pad"] == "x" * 1000
            assert len(launcher.fakes) == 2
            assert pool.metrics()["restarts"] == 1
            await asyncio.wait_for(launcher.fakes[0].closed, 5)
    asyncio.run(asyncio.wait_for(main(), 30))
