"""A Python worker whose parent closes the connection just after the TLS handshake, while the
worker's ``remote.connect`` has not resumed yet, ends as after end of file (PROTOCOL.md 21.6),
at once: not 15 s later at its welcome timeout (21.5).

The race is made certain with a ``sitecustomize`` in the worker that holds ``connect`` back
after the handshake until the TLS layer has lost its connection, and delays the TLS layer's
queued ``connection_lost`` (a ``call_soon``) by 0.3 s, so that the loss is on its way to the
placeholder protocol of the handshake when ``connect`` hands the connection over. Found by
conformance/test_remote.py's parent-kill test on a loaded machine: a worker outlived its
SIGKILLed parent by 20 s, connectionless, in epoll_wait.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wirepool import remote

pytest.importorskip("cryptography")

WORKER = str(Path(__file__).parent / "workers" / "basic.py")
PYTHON_DIR = str(Path(__file__).resolve().parents[1])
DELAY_CONNECT = """
import asyncio, asyncio.base_events as be, asyncio.sslproto as sp

# The TLS layer queues the app protocol's connection_lost with call_soon: here it is queued for
# 0.3 s later, so that it is surely still on its way when connect hands the connection over.
_lost = sp.SSLProtocol.connection_lost
def connection_lost(self, exc):
    loop = self._loop
    soon = loop.call_soon
    loop.call_soon = lambda cb, *a, **kw: loop.call_later(0.3, cb, *a)
    try:
        _lost(self, exc)
    finally:
        del loop.call_soon
sp.SSLProtocol.connection_lost = connection_lost

# connect resumes only once the TLS layer has lost its connection (its private state: a test
# of a race).
_create = be.BaseEventLoop.create_connection
async def create_connection(self, *a, **kw):
    transport, protocol = await _create(self, *a, **kw)
    if kw.get("ssl") is not None:
        deadline = self.time() + 5
        while transport._ssl_protocol._transport is not None and self.time() < deadline:
            await asyncio.sleep(0.01)
    return transport, protocol
be.BaseEventLoop.create_connection = create_connection
"""


@pytest.mark.timeout(60)
def test_a_close_right_after_the_handshake_ends_the_worker_at_once(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(DELAY_CONNECT, encoding="utf-8")

    async def main() -> tuple[int, float, str]:
        cert = remote.Certificate.generate(("127.0.0.1",))

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.transport.abort()  # the parent goes, right after the handshake

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=cert.server_context())
        try:
            port = server.sockets[0].getsockname()[1]
            ticket = remote.Ticket(host="127.0.0.1", port=port, id=secrets.token_bytes(16),
                                   secret=secrets.token_bytes(32), expires=int(time.time()) + 600,
                                   fingerprint=cert.fingerprint)
            env = remote.environment_with_ticket(
                ticket, {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PYTHON_DIR}"})
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, WORKER, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                _, err = await asyncio.wait_for(proc.communicate(), 40)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode is not None
            return proc.returncode, time.monotonic() - started, err.decode(errors="replace")
        finally:
            server.close()

    status, elapsed, err = asyncio.run(main())
    assert status == 0, err
    assert "no WELCOME" not in err, err
    # Start-up, the handshake and the exit; the welcome timeout is 15 s.
    assert elapsed < 10, (elapsed, err)
