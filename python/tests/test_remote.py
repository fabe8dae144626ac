"""Join tickets and the TLS join (PROTOCOL.md 21.2, 21.3), against a fake worker on loopback.

The fake worker is wirepool.remote.connect plus a protocol that sends a HELLO and records what
the parent answers: a joined connection delivers the HELLO to the parent's protocol; a refused
one gets ERROR id 0 and end of file, and the parent logs why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Any

import pytest

from wirepool import proto, remote
from wirepool.errors import ErrorCode

pytest.importorskip("cryptography")

HELLO = proto.encode_frame(proto.Hello(pid=os.getpid(), max_concurrency=1, sdk_name="fake"))


class FakeWorker(asyncio.Protocol):
    """Sends HELLO on connect, collects the parent's bytes until end of file."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        transport.write(HELLO)

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def frames(self) -> list[proto.Frame]:
        return proto.decode_all(bytes(self.data))


class Collector(asyncio.Protocol):
    """The parent's side after the join: collects what the worker sends."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.got = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data
        if len(self.data) >= len(HELLO) and not self.got.done():
            self.got.set_result(None)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


# -- tickets ------------------------------------------------------------------------------------


def _ticket(**kw: Any) -> remote.Ticket:
    base: dict[str, Any] = dict(host="127.0.0.1", port=4000, id=bytes(range(16)),
                                secret=bytes(range(32)), expires=2_000_000_000, tls=True,
                                fingerprint=bytes(32))
    base.update(kw)
    return remote.Ticket(**base)


def test_ticket_round_trips_and_hides_its_secret() -> None:
    t = _ticket()
    text = t.encode()
    assert text.startswith(remote.TICKET_PREFIX) and len(text) < remote.TICKET_MAX_CHARS
    assert remote.Ticket.parse(text) == t
    assert remote.Ticket.parse("  " + text + "\n") == t  # a file's newline is fine
    assert t.secret.hex() not in repr(t)
    assert t.join_block()[:8] == b"WIREJOIN" and len(t.join_block()) == remote.JOIN_SIZE


@pytest.mark.parametrize("text, problem", [
    ("nope", "not a wirepool ticket"),
    (remote.TICKET_PREFIX + "!!!", "base64url JSON"),
    (remote.TICKET_PREFIX + "W10", "JSON object"),  # []
    (remote.TICKET_PREFIX + "x" * 5000, "at most 4096"),
])
def test_malformed_tickets_are_refused_with_a_reason(text: str, problem: str) -> None:
    with pytest.raises(remote.TicketError, match=problem):
        remote.Ticket.parse(text)


@pytest.mark.parametrize("change, problem", [
    ({"v": 2}, "version 2"),
    ({"port": "80"}, "port"),
    ({"port": 0}, "port"),
    ({"secret": "ab"}, "secret"),
    ({"id": "G" * 32}, "id"),
    ({"fingerprint": "md5:00"}, "fingerprint"),
    ({"tls": False, "host": "10.0.0.1"}, "loopback only"),
    ({"expires": 1.5}, "expires"),
])
def test_ticket_fields_are_checked(change: dict[str, Any], problem: str) -> None:
    import base64
    import json
    doc = json.loads(base64.urlsafe_b64decode(_ticket().encode()[len(remote.TICKET_PREFIX):]
                                              + "=="))
    doc.update(change)
    body = base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()
    with pytest.raises(remote.TicketError, match=problem):
        remote.Ticket.parse(remote.TICKET_PREFIX + body)


def test_ticket_from_env_reads_the_variable_or_the_file_and_removes_both(tmp_path: Any) -> None:
    t = _ticket()
    env = {"WIREPOOL_TICKET": t.encode(), "OTHER": "1"}
    assert remote.ticket_from_env(env) == t and env == {"OTHER": "1"}
    path = tmp_path / "ticket"
    path.write_text(t.encode() + "\n")
    env = {"WIREPOOL_TICKET_FILE": str(path)}
    assert remote.ticket_from_env(env) == t and env == {}
    assert remote.ticket_from_env({}) is None
    with pytest.raises(remote.TicketError, match="cannot read"):
        remote.ticket_from_env({"WIREPOOL_TICKET_FILE": str(tmp_path / "missing")})


def test_plain_tcp_only_on_loopback() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        remote.Listener("0.0.0.0", tls=False)
    assert remote.is_loopback("127.0.0.2") and remote.is_loopback("::1")
    assert not remote.is_loopback("10.0.0.1") and not remote.is_loopback("example.com")


# -- the join over TLS ----------------------------------------------------------------------------


async def _join(ticket: remote.Ticket) -> FakeWorker:
    worker = FakeWorker()
    await remote.connect(ticket, worker, timeout=5)
    return worker


def test_good_ticket_joins_and_the_hello_reaches_the_parent() -> None:
    async def main() -> None:
        async with remote.Listener() as listener:
            ticket = listener.issue()
            accepting = asyncio.ensure_future(listener.accept(timeout=10))
            worker = await _join(ticket)
            joined = await accepting
            assert joined.ticket.id == ticket.id and joined.host == "127.0.0.1"
            sslobj = joined.transport.get_extra_info("ssl_object")
            assert sslobj.version() == "TLSv1.3" and sslobj.selected_alpn_protocol() == "wirepool/1"
            collector = Collector()
            joined.attach(collector)
            await asyncio.wait_for(collector.got, 5)
            assert bytes(collector.data) == HELLO  # the JOIN block is not passed on
            assert listener.pending == 0 and listener.counters["joined"] == 1
            joined.close()
            await asyncio.wait_for(worker.closed, 5)
    run(main())


def test_a_worker_that_joins_before_the_pool_asks_waits_for_a_slot() -> None:
    async def main() -> None:
        async with remote.Listener() as listener:
            ticket = listener.issue()
            worker = await _join(ticket)
            joined = await listener.accept(timeout=10)  # parked until now
            collector = Collector()
            joined.attach(collector)
            await asyncio.wait_for(collector.got, 5)
            assert bytes(collector.data) == HELLO
            joined.close()
            await asyncio.wait_for(worker.closed, 5)
    run(main())


async def _refused(listener: remote.Listener, ticket: remote.Ticket) -> FakeWorker:
    """A join that must be refused: the worker gets ERROR 0 'join refused' and EOF."""
    worker = await _join(ticket)
    await asyncio.wait_for(worker.closed, 5)
    frames = worker.frames()
    assert len(frames) == 1 and isinstance(frames[0], proto.ErrorFrame), frames
    assert frames[0].id == 0 and frames[0].code == ErrorCode.BAD_HANDSHAKE
    assert frames[0].message.startswith("join refused")
    return worker


def _refusal_logged(caplog: Any, cause: str) -> None:
    lines = [r.getMessage() for r in caplog.records if r.name == "wirepool.remote"]
    assert any(cause in line and "127.0.0.1:" in line for line in lines), lines


def test_wrong_secret_is_refused(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, "wirepool.remote")

    async def main() -> None:
        async with remote.Listener() as listener:
            ticket = listener.issue()
            forged = dataclasses.replace(ticket, secret=os.urandom(32))
            secrets.extend((ticket.secret.hex(), forged.secret.hex()))
            await _refused(listener, forged)
            assert listener.counters["refused"] == 1 and listener.pending == 0
            with pytest.raises(asyncio.TimeoutError):  # nothing reached a slot
                await listener.accept(timeout=0.05)
    secrets: list[str] = []
    run(main())
    _refusal_logged(caplog, "wrong secret")
    assert not any(s in r.getMessage() for r in caplog.records for s in secrets)


def test_wrong_fingerprint_sends_no_secret(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, "wirepool.remote")

    async def main() -> None:
        async with remote.Listener() as listener:
            ticket = listener.issue()
            other = dataclasses.replace(ticket, fingerprint=bytes(32))
            with pytest.raises(remote.JoinRefused, match="fingerprint"):
                await remote.connect(other, FakeWorker(), timeout=5)
            # The parent saw a TLS client leave without a JOIN block: refused, logged.
            for _ in range(200):
                if listener.counters["refused"]:
                    break
                await asyncio.sleep(0.01)
            assert listener.counters["refused"] == 1 and listener.counters["joined"] == 0
    run(main())
    _refusal_logged(caplog, "closed before joining")


def test_expired_ticket_is_refused_by_both_sides(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, "wirepool.remote")

    async def main() -> None:
        async with remote.Listener() as listener:
            ticket = listener.issue(ttl=-1)
            with pytest.raises(remote.JoinRefused, match="expired"):  # the worker checks first
                await remote.connect(ticket, FakeWorker(), timeout=5)
            # A worker whose clock is behind still meets the parent's check.
            await _refused(listener, dataclasses.replace(ticket, expires=int(time.time()) + 60))
    run(main())
    _refusal_logged(caplog, "expired ticket")


def test_revoked_ticket_is_refused_and_can_drop_its_workers(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, "wirepool.remote")

    async def main() -> None:
        async with remote.Listener() as listener:
            ticket = listener.issue()
            accepting = asyncio.ensure_future(listener.accept(timeout=10))
            first = await _join(ticket)
            joined = await accepting
            joined.attach(Collector())
            listener.revoke(ticket, drop_workers=True)
            await asyncio.wait_for(first.closed, 5)  # dropped
            await _refused(listener, ticket)
    run(main())
    _refusal_logged(caplog, "unknown or revoked ticket")


def test_single_use_ticket_goes_to_its_own_slot_once() -> None:
    async def main() -> None:
        async with remote.Listener() as listener:
            pool_ticket = listener.issue()
            mine = listener.issue(ttl=30, single_use=True)
            anyone = asyncio.ensure_future(listener.accept(timeout=10))
            for_mine = asyncio.ensure_future(listener.accept(mine, timeout=10))
            await _join(mine)
            joined = await for_mine
            assert joined.ticket.id == mine.id and not anyone.done()
            await _refused(listener, mine)  # used up
            await _join(pool_ticket)
            assert (await anyone).ticket.id == pool_ticket.id
    run(main())


def test_plain_loopback_join_when_asked() -> None:
    async def main() -> None:
        async with remote.Listener(tls=False) as listener:
            ticket = listener.issue()
            assert not ticket.tls and ticket.fingerprint is None
            assert remote.Ticket.parse(ticket.encode()) == ticket
            accepting = asyncio.ensure_future(listener.accept(timeout=10))
            worker = await _join(ticket)
            joined = await accepting
            collector = Collector()
            joined.attach(collector)
            await asyncio.wait_for(collector.got, 5)
            assert bytes(collector.data) == HELLO
            joined.close()
            await asyncio.wait_for(worker.closed, 5)
    run(main())


def test_constants_match_the_spec() -> None:
    import json
    from pathlib import Path
    spec = json.loads((Path(__file__).resolve().parents[2] / "spec" / "constants.json")
                      .read_text(encoding="utf-8"))["remote"]
    assert remote.TICKET_PREFIX == spec["ticket_prefix"]
    assert remote.TICKET_MAX_CHARS == spec["ticket_max_chars"]
    assert remote.ALPN == spec["alpn"]
    assert remote.JOIN_MAGIC == spec["join_magic"].encode() and remote.JOIN_SIZE == spec["join_bytes"]
    assert remote.JOIN_VERSION == spec["join_version"]
    assert set(json.loads(__import__("base64").urlsafe_b64decode(
        _ticket().encode()[len(remote.TICKET_PREFIX):] + "==="))) == set(spec["ticket_fields"])
    d = spec["sdk_defaults"]
    assert (remote.DEFAULT_JOIN_TIMEOUT, remote.DEFAULT_HELLO_TIMEOUT,
            remote.DEFAULT_WELCOME_TIMEOUT) == (d["join_timeout_ms"] / 1000,
                                                d["hello_timeout_ms"] / 1000,
                                                d["welcome_timeout_ms"] / 1000)
    assert remote.DEFAULT_MAX_PENDING_JOINS == d["max_pending_joins"]
    assert remote.DEFAULT_REFUSAL_LOG_PER_SECOND == d["refusal_log_per_second"]
    assert remote.DEFAULT_REMOTE_HEARTBEAT_MS == d["remote_heartbeat_ms"]
    assert remote.DEFAULT_POOL_TICKET_TTL == d["pool_ticket_ttl_s"]


# -- a real worker refused ----------------------------------------------------------------------


def test_a_python_worker_refused_for_a_forged_secret_exits_1_saying_why() -> None:
    """issue 24: the worker printed "119 join refused" and exited 0 (closing the TLS transport
    called eof_received at once, whose _stop(0) came before the refusal's status 1)."""
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).resolve().parents[1] / "conformance" / "worker.py"

    async def main() -> tuple[int, str]:
        async with remote.Listener() as listener:
            forged = dataclasses.replace(listener.issue(), secret=os.urandom(32))
            env = {k: v for k, v in os.environ.items()
                   if k not in ("WIREPOOL_FD", "WIREPOOL_TICKET", "WIREPOOL_TICKET_FILE")}
            env["WIREPOOL_TICKET"] = forged.encode()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(worker), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                _, err = await asyncio.wait_for(proc.communicate(), 15)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert listener.counters.get("joined", 0) == 0
            return proc.returncode or 0, err.decode(errors="replace")

    status, err = run(main())
    assert status == 1, err
    assert "join refused" in err and "Traceback" not in err and len(err) < 2000, err
