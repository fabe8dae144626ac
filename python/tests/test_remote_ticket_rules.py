"""The ticket rules of PROTOCOL.md 21.1-21.2: strict base64url ('=' padding accepted),
whitespace trimmed (spaces, tabs, CR, LF) before the 4,096-character limit, ``expires`` in whole
seconds by the parent's clock and valid through that second with no skew allowance, the host's
syntax, an IPv6 host with or without brackets (stripped to connect), SNI for host names only."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import types
from typing import Any

import pytest

from wirepool import proto, remote

pytest.importorskip("cryptography")

HELLO = proto.encode_frame(proto.Hello(pid=os.getpid(), max_concurrency=1, sdk_name="fake"))


def _ticket(**kw: Any) -> remote.Ticket:
    base: dict[str, Any] = dict(host="127.0.0.1", port=4000, id=bytes(range(16)),
                                secret=bytes(range(32)), expires=2_000_000_000, tls=True,
                                fingerprint=bytes(32))
    base.update(kw)
    return remote.Ticket(**base)


def _body(t: remote.Ticket) -> str:
    return t.encode()[len(remote.TICKET_PREFIX):]


def _with_doc(**extra: Any) -> str:
    doc = json.loads(base64.urlsafe_b64decode(_body(_ticket()) + "=="))
    doc.update(extra)
    return remote.TICKET_PREFIX + base64.urlsafe_b64encode(
        json.dumps(doc, separators=(",", ":")).encode()).rstrip(b"=").decode()


@pytest.mark.parametrize("junk", ["!", " ", "\n", "\t", "*", "~~~~", "+", "/", ".", "=", "=="])
def test_a_character_outside_base64url_inside_the_body_makes_it_unusable(junk: str) -> None:
    body = _body(_ticket())
    text = remote.TICKET_PREFIX + body[:40] + junk + body[40:]  # at a 4-character boundary
    with pytest.raises(remote.TicketError, match="base64url"):
        remote.Ticket.parse(text)


def test_padding_is_accepted_and_must_be_right() -> None:
    t = _ticket()
    body = _body(t)
    pad = "=" * (-len(body) % 4)
    assert pad  # this ticket's body needs padding, so the test means something
    assert remote.Ticket.parse(remote.TICKET_PREFIX + body + pad) == t
    with pytest.raises(remote.TicketError, match="base64url"):
        remote.Ticket.parse(remote.TICKET_PREFIX + body + pad + "====")


@pytest.mark.parametrize("space", [" ", "\t", "\r\n", "\n", " \t\r\n "])
def test_spaces_tabs_crs_and_lfs_around_the_text_are_trimmed(space: str) -> None:
    t = _ticket()
    assert remote.Ticket.parse(space + t.encode() + space) == t


@pytest.mark.parametrize("space", ["\v", "\f", "\u00a0", "\u2003", "\x1c"])
def test_other_whitespace_is_not_trimmed(space: str) -> None:
    with pytest.raises(remote.TicketError):
        remote.Ticket.parse(_ticket().encode() + space)


def _of_length(n: int) -> str:
    """A valid ticket of exactly ``n`` characters (an unknown field fills it)."""
    base = len(_with_doc(pad=""))
    for k in range(max(0, (n - base) * 3 // 4 - 4), n):
        text = _with_doc(pad="x" * k)
        if len(text) == n:
            return text
    raise AssertionError(f"no ticket of {n} characters")


def test_trimmed_then_limited_to_4096_characters(tmp_path: Any) -> None:
    longest = _of_length(remote.TICKET_MAX_CHARS)
    assert remote.Ticket.parse(longest).id == bytes(range(16))
    assert remote.Ticket.parse("  \r\n" + longest + "\r\n\t ").id == bytes(range(16))
    with pytest.raises(remote.TicketError, match="at most 4096"):
        remote.Ticket.parse(_of_length(remote.TICKET_MAX_CHARS + 1))
    path = tmp_path / "ticket"
    path.write_bytes(b"\n" * 30 + longest.encode() + b"\r\n" * 17)  # 4,160 bytes in all
    found = remote.ticket_from_env({"WIREPOOL_TICKET_FILE": str(path)})
    assert found is not None and found.id == bytes(range(16))
    path.write_bytes(b"\xff\xfe" + longest.encode())
    with pytest.raises(remote.TicketError, match="not UTF-8"):
        remote.ticket_from_env({"WIREPOOL_TICKET_FILE": str(path)})


def test_expires_is_whole_seconds_valid_through_that_second() -> None:
    t = _ticket(expires=1_000)
    assert not t.expired(999.5) and not t.expired(1_000) and not t.expired(1_000.999)
    assert t.expired(1_001) and t.expired(1_001.2)


def _clock_at(monkeypatch: pytest.MonkeyPatch, now: float) -> None:
    # Both sides' wall clock (the worker's early check and the parent's at the join).
    monkeypatch.setattr(remote, "time", types.SimpleNamespace(time=lambda: now,
                                                              monotonic=time.monotonic))


class _FakeWorker(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        transport.write(HELLO)

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _Collector(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.got = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data
        if len(self.data) >= len(HELLO) and not self.got.done():
            self.got.set_result(None)


async def _joins(listener: remote.Listener, ticket: remote.Ticket) -> None:
    accepting = asyncio.ensure_future(listener.accept(timeout=10))
    worker = _FakeWorker()
    await remote.connect(ticket, worker, timeout=5)
    joined = await accepting
    collector = _Collector()
    joined.attach(collector)
    await asyncio.wait_for(collector.got, 5)
    assert bytes(collector.data) == HELLO
    joined.close()
    await asyncio.wait_for(worker.closed, 5)


@pytest.mark.timeout(30)
def test_a_join_during_second_expires_passes_and_after_it_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with remote.Listener() as listener:
            ticket = listener.issue()
            _clock_at(monkeypatch, ticket.expires + 0.9)
            await _joins(listener, ticket)  # the parent's check passes too
            _clock_at(monkeypatch, ticket.expires + 1)
            with pytest.raises(remote.JoinRefused, match="expired"):
                await remote.connect(ticket, _FakeWorker(), timeout=5)
    asyncio.run(asyncio.wait_for(main(), 20))


@pytest.mark.parametrize("host", ["::1", "[::1]", "localhost", "127.0.0.1", "example.com",
                                  "a-b.example.com.", "fe80::1%eth0", "[2001:db8::1]"])
def test_hosts_a_ticket_may_name(host: str) -> None:
    t = _ticket(host=host)
    assert remote.Ticket.parse(t.encode()) == t
    assert t.connect_host == host.strip("[]")


@pytest.mark.parametrize("host", ["[127.0.0.1]", "[::1", "::1]", "[]", "[example.com]",
                                  "exa mple.com", "-bad.example", "a..b", "", "x" * 254,
                                  "host:80", "\u00e9t\u00e9.example"])
def test_hosts_a_ticket_may_not_name(host: str) -> None:
    with pytest.raises(remote.TicketError, match="host"):
        _ticket(host=host)


def test_sni_is_the_host_name_and_none_for_an_ip_literal() -> None:
    assert _ticket(host="example.com").sni == "example.com"
    assert _ticket(host="127.0.0.1").sni is None
    assert _ticket(host="[::1]").sni is None and _ticket(host="::1").sni is None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("tls", [True, False])
def test_an_ipv6_host_in_brackets_is_connected_to_without_them(tls: bool) -> None:
    async def main() -> None:
        async with remote.Listener("::1", tls=tls) as listener:
            ticket = listener.issue()
            assert ticket.host == "::1"
            for host in ("::1", "[::1]"):
                await _joins(listener, remote.Ticket(
                    host=host, port=ticket.port, id=ticket.id, secret=ticket.secret,
                    expires=ticket.expires, tls=ticket.tls, fingerprint=ticket.fingerprint))
    asyncio.run(asyncio.wait_for(main(), 20))
