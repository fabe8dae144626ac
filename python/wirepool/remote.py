"""Remote workers: join tickets, the parent's TLS listener, and the worker's connection back.

A worker on another machine connects to its parent over TCP with TLS 1.3 and joins with a
**ticket** (PROTOCOL.md section 21): the listener's address, the SHA-256 fingerprint of the
parent's certificate (the worker pins it) and a secret the worker presents before its HELLO.
From HELLO on, the connection is the ordinary protocol.

Parent side (usually through a launcher, :mod:`wirepool.launchers`)::

    listener = await wirepool.remote.Listener(host="0.0.0.0", advertise="10.0.0.5").start()
    ticket = listener.issue(ttl=3600)
    print(ticket.encode())          # hand it to workers: WIREPOOL_TICKET=... python worker.py
    joined = await listener.accept()  # an authenticated connection, ready for a worker protocol

Worker side: nothing to write. ``wirepool.serve()`` started with ``WIREPOOL_TICKET`` (or
``WIREPOOL_TICKET_FILE``) instead of ``WIREPOOL_FD`` connects with :func:`connect`, watches its
parent with heartbeats (:class:`ParentWatchdog`) and exits when the parent goes silent.

Certificates are generated with the ``cryptography`` package (``pip install 'wirepool[remote]'``);
plain TCP without TLS is allowed on loopback addresses only, and only when asked for with
``tls=False``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import secrets
import ssl
import struct
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, MutableMapping

from . import _constants as _c
from . import proto
from .errors import ErrorCode

__all__ = [
    "Ticket", "TicketError", "Certificate", "Listener", "Joined", "JoinRefused", "ParentWatchdog",
    "connect", "ticket_from_env", "is_loopback",
    "TICKET_PREFIX", "JOIN_MAGIC", "JOIN_SIZE", "ALPN",
]

log = logging.getLogger("wirepool.remote")

# PROTOCOL.md 21 (and spec/constants.json "remote").
# Generated from spec/constants.json into _constants.py; durations here are seconds.
TICKET_PREFIX = _c.REMOTE_TICKET_PREFIX
TICKET_MAX_CHARS = _c.REMOTE_TICKET_MAX_CHARS
JOIN_MAGIC = _c.REMOTE_JOIN_MAGIC.encode()
JOIN_VERSION = _c.REMOTE_JOIN_VERSION
JOIN_SIZE = _c.REMOTE_JOIN_BYTES
ALPN = _c.REMOTE_ALPN
DEFAULT_JOIN_TIMEOUT = _c.REMOTE_DEFAULT_JOIN_TIMEOUT_MS / 1000
DEFAULT_HELLO_TIMEOUT = _c.REMOTE_DEFAULT_HELLO_TIMEOUT_MS / 1000
DEFAULT_WELCOME_TIMEOUT = _c.REMOTE_DEFAULT_WELCOME_TIMEOUT_MS / 1000
DEFAULT_MAX_PENDING_JOINS = _c.REMOTE_DEFAULT_MAX_PENDING_JOINS
DEFAULT_REFUSAL_LOG_PER_SECOND = _c.REMOTE_DEFAULT_REFUSAL_LOG_PER_SECOND
DEFAULT_REMOTE_HEARTBEAT_MS = _c.REMOTE_DEFAULT_REMOTE_HEARTBEAT_MS
DEFAULT_POOL_TICKET_TTL = float(_c.REMOTE_DEFAULT_POOL_TICKET_TTL_S)
HEARTBEAT_MISSES = _c.HEARTBEAT_MISSES

_JOIN = struct.Struct("<8sH6s16s32s")
_ID_BYTES = 16
_SECRET_BYTES = 32
# The generic refusal: it must not tell a stranger which check failed (21.3).
_REFUSED = "join refused"


class TicketError(ValueError):
    """A ticket that cannot be used: malformed, of another version, or unsafe (a plain ticket
    for a non-loopback address)."""


class JoinRefused(ConnectionError):
    """The worker side could not join: unreachable, wrong fingerprint, or refused by the parent."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` (loopback, RFC 6761) and loopback IP literals (127.0.0.0/8,
    ``::1``, also in brackets)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(_unbracket(host)).is_loopback
    except ValueError:
        return False


def _unbracket(host: str) -> str:
    """An IPv6 literal in brackets (``[::1]``) without them; any other host as it is."""
    if len(host) > 2 and host[0] == "[" and host[-1] == "]":
        return host[1:-1]
    return host


# A host name's labels (letters, digits, hyphens; underscores seen in the wild), dot-separated.
_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?")
# The body of a ticket: base64url, '=' padding accepted (a writer omits it).
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_TRIMMED = " \t\r\n"  # the whitespace trimmed around a ticket's text (21.2)


def _check_host(host: str) -> None:
    """A ticket's ``host`` (21.2): a host name or an IP literal, 1-253 bytes; an IPv6 literal
    without brackets, or in brackets (stripped to connect)."""
    if not 1 <= len(host.encode()) <= 253:
        raise TicketError("ticket host must be 1-253 bytes")
    if host.startswith("["):
        inner = _unbracket(host)
        try:
            if inner == host or ipaddress.ip_address(inner).version != 6:
                raise ValueError
        except ValueError:
            raise TicketError(f"ticket host {host!r}: only an IPv6 literal goes in "
                              "brackets") from None
        return
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(host):
        raise TicketError(f"ticket host {host!r} is neither a host name nor an IP literal")


def _hex(value: Any, nbytes: int, field: str) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * nbytes or value != value.lower():
        raise TicketError(f"ticket field {field!r} must be {2 * nbytes} lowercase hex digits")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise TicketError(f"ticket field {field!r} is not hex") from None


@dataclasses.dataclass(frozen=True)
class Ticket:
    """A join ticket (PROTOCOL.md 21.2): where to connect, whom to trust, what to prove.

    ``encode()`` gives the text form for ``WIREPOOL_TICKET``; ``Ticket.parse`` reads it back.
    The secret never appears in ``repr`` or logs: a ticket is named by its ``id``."""

    host: str
    port: int
    id: bytes
    secret: bytes = dataclasses.field(repr=False)
    expires: int
    tls: bool = True
    fingerprint: bytes | None = None  # SHA-256 of the parent certificate's DER

    def __post_init__(self) -> None:
        _check_host(self.host)
        if not 1 <= self.port <= 65535:
            raise TicketError("ticket port must be 1-65535")
        if len(self.id) != _ID_BYTES or len(self.secret) != _SECRET_BYTES:
            raise TicketError("ticket id must be 16 bytes and its secret 32")
        if self.tls and (self.fingerprint is None or len(self.fingerprint) != 32):
            raise TicketError("a TLS ticket needs the certificate's 32-byte SHA-256 fingerprint")
        if not self.tls and not is_loopback(self.host):
            raise TicketError(f"plain TCP (tls false) is allowed on loopback only, not "
                              f"{self.host!r}")

    @property
    def name(self) -> str:
        """The ticket's id in hex: how logs and errors name it."""
        return self.id.hex()

    @property
    def connect_host(self) -> str:
        """The host to connect to: ``host`` without the brackets of an IPv6 literal."""
        return _unbracket(self.host)

    @property
    def sni(self) -> str | None:
        """The TLS server name to send: the host when it is a DNS name, None (no SNI) for an
        IP literal (21.1)."""
        try:
            ipaddress.ip_address(self.connect_host)
        except ValueError:
            return self.host
        return None

    def expired(self, now: float | None = None) -> bool:
        """Whether the Unix time ``now`` (default: this clock's) is past ``expires``, in whole
        seconds: valid through second ``expires``, no allowance for clock skew (21.2)."""
        return math.floor(time.time() if now is None else now) > self.expires

    def encode(self) -> str:
        doc: dict[str, Any] = {"v": 1, "host": self.host, "port": self.port, "tls": self.tls,
                               "id": self.id.hex(), "secret": self.secret.hex(),
                               "expires": self.expires}
        if self.fingerprint is not None:
            doc["fingerprint"] = "sha256:" + self.fingerprint.hex()
        raw = json.dumps(doc, separators=(",", ":")).encode()
        return TICKET_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    @classmethod
    def parse(cls, text: str) -> "Ticket":
        """Read a ticket's text form; :class:`TicketError` says what is wrong with it.

        The spaces, tabs, CRs and LFs around it are trimmed, then the 4,096-character limit
        applies; whitespace inside, or any character of the body outside the base64url
        alphabet, makes it unusable ('=' padding is accepted) (21.2)."""
        text = text.strip(_TRIMMED)
        if len(text) > TICKET_MAX_CHARS:
            raise TicketError(f"a ticket is at most {TICKET_MAX_CHARS} characters")
        if not text.startswith(TICKET_PREFIX):
            raise TicketError(f"not a wirepool ticket (it must start with {TICKET_PREFIX!r})")
        body = text[len(TICKET_PREFIX):]
        unpadded = body.rstrip("=")
        try:
            if (not _BASE64URL.fullmatch(unpadded) or len(unpadded) % 4 == 1
                    or len(body) - len(unpadded) not in (0, -len(unpadded) % 4)):
                raise ValueError
            raw = base64.urlsafe_b64decode(unpadded + "=" * (-len(unpadded) % 4))
            doc = json.loads(raw.decode("utf-8"))
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise TicketError("the ticket's body is not base64url JSON") from None
        if not isinstance(doc, dict):
            raise TicketError("the ticket's body is not a JSON object")
        if doc.get("v") != 1:
            raise TicketError(f"ticket version {doc.get('v')!r} is not supported (1)")
        host, port, tls, expires = doc.get("host"), doc.get("port"), doc.get("tls"), \
            doc.get("expires")
        if not isinstance(host, str):
            raise TicketError("ticket field 'host' must be a string")
        if not isinstance(port, int) or isinstance(port, bool):
            raise TicketError("ticket field 'port' must be an integer")
        if not isinstance(tls, bool):
            raise TicketError("ticket field 'tls' must be true or false")
        if not isinstance(expires, int) or isinstance(expires, bool):
            raise TicketError("ticket field 'expires' must be an integer (Unix seconds)")
        fingerprint = None
        if tls:
            fp = doc.get("fingerprint")
            if not isinstance(fp, str) or not fp.startswith("sha256:"):
                raise TicketError("ticket field 'fingerprint' must be 'sha256:' and 64 hex digits")
            fingerprint = _hex(fp[len("sha256:"):], 32, "fingerprint")
        return cls(host=host, port=port, tls=tls, fingerprint=fingerprint,
                   id=_hex(doc.get("id"), _ID_BYTES, "id"),
                   secret=_hex(doc.get("secret"), _SECRET_BYTES, "secret"), expires=expires)

    def join_block(self) -> bytes:
        """The 64 bytes a worker sends before its HELLO (PROTOCOL.md 21.3)."""
        return _JOIN.pack(JOIN_MAGIC, JOIN_VERSION, bytes(6), self.id, self.secret)


def ticket_from_env(environ: MutableMapping[str, str] | None = None) -> Ticket | None:
    """The ticket in ``WIREPOOL_TICKET`` or the file named by ``WIREPOOL_TICKET_FILE``, or None
    when neither is set. Both variables are removed, so the worker's children do not inherit
    the secret. Raises :class:`TicketError` for an unusable ticket."""
    env = os.environ if environ is None else environ
    text = env.pop("WIREPOOL_TICKET", None)
    path = env.pop("WIREPOOL_TICKET_FILE", None)
    if text is None and path is not None:
        try:
            with open(path, "rb") as f:
                data = f.read(TICKET_MAX_CHARS + 64)  # at most 4,160 bytes (21.2)
        except OSError as e:
            raise TicketError(f"cannot read WIREPOOL_TICKET_FILE {path!r}: {e}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise TicketError(f"WIREPOOL_TICKET_FILE {path!r} is not a ticket (not UTF-8 "
                              "text)") from None
    return None if text is None else Ticket.parse(text)


# ---------------------------------------------------------------------------------------------
# Certificates and TLS contexts
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Certificate:
    """A parent's certificate and key (PEM), and the fingerprint workers pin."""

    cert_pem: bytes
    key_pem: bytes = dataclasses.field(repr=False)

    @property
    def fingerprint(self) -> bytes:
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.cert_pem.decode("ascii"))).digest()

    @classmethod
    def generate(cls, hosts: tuple[str, ...] = ("localhost",), days: int = 365) -> "Certificate":
        """A fresh self-signed ECDSA P-256 certificate (one per pool). Needs ``cryptography``
        (``pip install 'wirepool[remote]'``): the standard library cannot make certificates."""
        try:
            from cryptography import x509
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec
            from cryptography.x509.oid import NameOID
        except ImportError:
            raise RuntimeError("remote workers need the 'cryptography' package for the pool's "
                               "certificate: pip install 'wirepool[remote]'") from None
        import datetime

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "wirepool pool")])
        alt: list[x509.GeneralName] = []
        for h in hosts:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                alt.append(x509.DNSName(h))
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=days)))
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(key, hashes.SHA256())
        return cls(cert.public_bytes(serialization.Encoding.PEM),
                   key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.set_alpn_protocols([ALPN])
        # The ssl module loads keys from files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="wirepool-") as d:
            path = os.path.join(d, "pool.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self.key_pem + self.cert_pem)
            ctx.load_cert_chain(path)
        return ctx


def _client_context() -> ssl.SSLContext:
    # Trust comes from the pinned fingerprint, checked after the handshake and before anything
    # is sent: no CA, no host name (PROTOCOL.md 21.1).
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols([ALPN])
    return ctx


# ---------------------------------------------------------------------------------------------
# The parent's listener
# ---------------------------------------------------------------------------------------------


class _RefusalLog:
    """Each refusal logged once with the peer's address, at most ``per_second`` lines a second;
    the rest counted and summed up once the second is over (PROTOCOL.md 21.4)."""

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self.window = 0.0
        self.lines = 0
        self.suppressed = 0

    def refused(self, peer: str, cause: str, now: float) -> None:
        if now - self.window >= 1.0:
            if self.suppressed:
                log.warning("%d more joins refused in the last second (not logged one by one)",
                            self.suppressed)
            self.window, self.lines, self.suppressed = now, 0, 0
        if self.lines < self.per_second:
            self.lines += 1
            log.warning("join from %s refused: %s", peer, cause)
        else:
            self.suppressed += 1


def _peer_name(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"[{peer[0]}]:{peer[1]}" if ":" in str(peer[0]) else f"{peer[0]}:{peer[1]}"
    return str(peer)


@dataclasses.dataclass
class _Issued:
    ticket: Ticket
    single_use: bool


class Joined:
    """An authenticated connection, not yet attached to a worker protocol.

    ``attach(protocol)`` hands the transport to the pool's worker protocol: its
    ``connection_made`` runs, the bytes already received after the JOIN block (the start of
    the HELLO) are delivered, and reading resumes."""

    def __init__(self, transport: asyncio.Transport, reader: "_JoinReader", peer: str,
                 ticket: Ticket, hello_deadline: float) -> None:
        self.transport = transport
        self._reader = reader
        self.peer = peer
        self.ticket = ticket
        self.hello_deadline = hello_deadline  # loop time by which a complete HELLO is due
        self.taken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.host = peer.rsplit(":", 1)[0].strip("[]")

    def attach(self, protocol: asyncio.BaseProtocol) -> None:
        reader = self._reader
        t = self.transport
        t.set_protocol(protocol)
        protocol.connection_made(t)
        if reader.buf:
            data, reader.buf = bytes(reader.buf), bytearray()
            if isinstance(protocol, asyncio.BufferedProtocol) and \
                    not hasattr(protocol, "data_received"):
                view = memoryview(protocol.get_buffer(len(data)))
                view[:len(data)] = data
                protocol.buffer_updated(len(data))
            else:
                protocol.data_received(data)  # type: ignore[attr-defined]
        if reader.eof:
            protocol.eof_received()  # type: ignore[attr-defined]
        if not t.is_closing():
            t.resume_reading()

    def close(self) -> None:
        self.transport.abort()


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _JoinReader(asyncio.Protocol):
    """Reads the 64 JOIN bytes of one connection, and nothing beyond what arrives with them."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.on_lost: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) >= JOIN_SIZE:
            # Bounded: one read's worth past the block, then nothing until authenticated.
            if self.transport is not None:
                self.transport.pause_reading()
            if not self.ready.done():
                self.ready.set_result(None)

    def _failed(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(why))
            self.ready.exception()  # retrieved: whoever awaits it gets it, nobody else cares

    def eof_received(self) -> bool | None:
        self.eof = True
        self._failed("end of file before the JOIN block")
        return False  # no JOIN block will follow: nothing to answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._failed("connection lost before the JOIN block")
        if self.on_lost is not None:
            self.on_lost()


def _repause(transport: asyncio.Transport) -> None:
    if not transport.is_closing():
        transport.resume_reading()
        transport.pause_reading()


class _Accepted(asyncio.Protocol):
    """The raw TCP connection, from accept until TLS takes it over."""

    def __init__(self, listener: "Listener") -> None:
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.listener._accepted(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:  # reading is paused at once; never called
        pass


class Listener:
    """The parent's listener for remote workers (PROTOCOL.md 21), one per pool.

    ``host``/``port`` where to listen (port 0: any free port); ``advertise`` the host name
    workers use to reach it (written into tickets; default ``host``); ``tls=False`` plain TCP,
    allowed on loopback only; ``certificate`` the pool's (default: a fresh self-signed one).
    ``join_timeout`` seconds from accept to the JOIN block (TLS handshake included),
    ``hello_timeout`` from accept to the worker's complete HELLO; ``max_pending`` connections
    between accept and HELLO at once (more are closed at accept); ``refusal_log_per_second``
    bounds the refusal log lines.

    Example::

        async with Listener() as listener:
            ticket = listener.issue()
            ...                               # start a worker with ticket.encode()
            joined = await listener.accept(timeout=10)
            joined.attach(my_protocol)        # its HELLO arrives there
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, advertise: str | None = None,
                 tls: bool = True, certificate: Certificate | None = None,
                 join_timeout: float = DEFAULT_JOIN_TIMEOUT,
                 hello_timeout: float = DEFAULT_HELLO_TIMEOUT,
                 max_pending: int = DEFAULT_MAX_PENDING_JOINS,
                 refusal_log_per_second: int = DEFAULT_REFUSAL_LOG_PER_SECOND) -> None:
        if not tls and not is_loopback(host):
            raise ValueError(f"plain TCP (tls=False) is allowed on loopback only, not {host!r}")
        if max_pending < 1 or join_timeout <= 0 or hello_timeout <= 0:
            raise ValueError("max_pending, join_timeout and hello_timeout must be positive")
        self.host = host
        self.port = port
        self.advertise = advertise or host
        self.tls = tls
        self.certificate = certificate
        self.join_timeout = join_timeout
        self.hello_timeout = hello_timeout
        self.max_pending = max_pending
        self._log = _RefusalLog(refusal_log_per_second)
        self._ssl: ssl.SSLContext | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tickets: dict[bytes, _Issued] = {}
        self._pending = 0
        self._tasks: set[asyncio.Task[None]] = set()
        # Slots waiting for a worker, by ticket id (None: any pool ticket), and authenticated
        # connections waiting for a slot.
        self._waiters: dict[bytes | None, collections.deque[asyncio.Future[Joined]]] = {}
        self._parked: dict[bytes, collections.deque[Joined]] = {}
        self._joined_by_ticket: dict[bytes, list[asyncio.Transport]] = {}
        self.counters: collections.Counter[str] = collections.Counter()

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> "Listener":
        loop = asyncio.get_running_loop()
        if self.tls:
            if self.certificate is None:
                self.certificate = Certificate.generate(
                    tuple(dict.fromkeys((self.advertise, "localhost", "127.0.0.1"))))
            self._ssl = self.certificate.server_context()
        self._server = await loop.create_server(lambda: _Accepted(self), self.host, self.port,
                                                backlog=max(self.max_pending, 128))
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        return self

    async def __aenter__(self) -> "Listener":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop listening; connections not yet attached to a worker are closed."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for parked in self._parked.values():
            for j in parked:
                j.close()
        self._parked.clear()
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.cancel()
        self._waiters.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    @property
    def address(self) -> tuple[str, int]:
        """Where workers connect: (advertised host, port)."""
        return self.advertise, self.port

    @property
    def pending(self) -> int:
        """Connections between accept and attach (unauthenticated or waiting for a slot)."""
        return self._pending

    # -- tickets ------------------------------------------------------------------------------

    def issue(self, ttl: float = DEFAULT_POOL_TICKET_TTL, *, single_use: bool = False) -> Ticket:
        """A new ticket, valid for ``ttl`` seconds. A pool ticket (the default) admits any
        number of workers; a ``single_use`` one (a launcher's, per worker) is forgotten after
        its first join and is only handed to ``accept(ticket)`` for it."""
        if self._server is None:
            raise RuntimeError("start the listener before issuing tickets")
        fp = self.certificate.fingerprint if self.tls and self.certificate is not None else None
        t = Ticket(host=self.advertise, port=self.port, tls=self.tls, fingerprint=fp,
                   id=secrets.token_bytes(_ID_BYTES), secret=secrets.token_bytes(_SECRET_BYTES),
                   expires=int(time.time() + ttl))
        self._tickets[t.id] = _Issued(t, single_use)
        return t

    def revoke(self, ticket: Ticket | bytes, *, drop_workers: bool = False) -> None:
        """Refuse later joins with this ticket; ``drop_workers`` also closes the connections of
        the workers that joined with it (the pool replaces them like any lost worker)."""
        tid = ticket.id if isinstance(ticket, Ticket) else ticket
        self._tickets.pop(tid, None)
        for j in self._parked.pop(tid, ()):
            j.close()
        joined = self._joined_by_ticket.pop(tid, [])
        if drop_workers:
            for t in joined:
                t.abort()

    # -- accepting ----------------------------------------------------------------------------

    async def accept(self, ticket: Ticket | None = None, timeout: float | None = None) -> Joined:
        """The next connection that joined with ``ticket`` (None: with any pool ticket),
        authenticated and ready for ``attach``. Raises ``asyncio.TimeoutError`` after
        ``timeout`` seconds."""
        key = None if ticket is None else ticket.id
        for tid in ([key] if key is not None else
                    [k for k, v in self._tickets.items() if not v.single_use]):
            parked = self._parked.get(tid)
            while parked:
                j = parked.popleft()
                if not j.transport.is_closing():
                    return self._hand_over(j)
        fut: asyncio.Future[Joined] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(key, collections.deque())
        waiters.append(fut)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            with contextlib.suppress(ValueError):
                waiters.remove(fut)
            if not waiters:
                self._waiters.pop(key, None)

    def _hand_over(self, j: Joined) -> Joined:
        self._pending -= 1
        if not j.taken.done():
            j.taken.set_result(None)
        self.counters["joined"] += 1
        # For revoke(drop_workers=True); closed ones are pruned so the list stays as long as
        # the pool.
        live = [t for t in self._joined_by_ticket.get(j.ticket.id, ()) if not t.is_closing()]
        live.append(j.transport)
        self._joined_by_ticket[j.ticket.id] = live
        return j

    def _refuse(self, peer: str, cause: str, transport: asyncio.Transport | None,
                answer: tuple[int, str] | None = None,
                reader: _JoinReader | None = None) -> None:
        self.counters["refused"] += 1
        self.counters["refused " + cause] += 1
        self._log.refused(peer, cause, time.monotonic())
        if transport is None:
            return
        if answer is not None and not transport.is_closing():
            transport.write(proto.encode_frame(proto.ErrorFrame(0, answer[0], answer[1])))
            transport.close()  # after the answer is written...
            # ...but a peer that does not read it (or a TLS close waiting for the peer's
            # close_notify) holds the connection one second at most.
            timer = asyncio.get_running_loop().call_later(1.0, transport.abort)
            if reader is not None:  # closed sooner: its buffers go now, not in a second
                reader.on_lost = timer.cancel
        else:
            transport.abort()

    def _accepted(self, raw: asyncio.Transport) -> None:
        peer = _peer_name(raw)
        self.counters["accepted"] += 1
        if self._pending >= self.max_pending:
            self._refuse(peer, "too many pending", raw)
            return
        raw.pause_reading()  # TLS (or the JOIN reader) takes over from the first byte
        if sys.version_info < (3, 11):
            # 3.10's transport registers its reader in a callback after connection_made,
            # paused or not: pause again once it has, or the ClientHello goes to _Accepted.
            asyncio.get_running_loop().call_soon(_repause, raw)
        self._pending += 1
        task = asyncio.get_running_loop().create_task(self._join(raw, peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _join(self, raw: asyncio.Transport, peer: str) -> None:
        loop = asyncio.get_running_loop()
        accepted_at = loop.time()
        reader = _JoinReader()
        transport: asyncio.Transport = raw
        handed = False
        try:
            try:
                transport = await asyncio.wait_for(self._read_join(raw, reader),
                                                   self.join_timeout)
            except asyncio.TimeoutError:
                self._refuse(peer, "join timeout", transport)
                return
            except ssl.SSLError as e:
                self._refuse(peer, f"tls handshake failed ({e.reason or e})", raw)
                return
            except (ConnectionError, OSError) as e:
                self._refuse(peer, f"closed before joining ({e})", reader.transport or raw)
                return
            cause, answer, issued = self._check(bytes(reader.buf[:JOIN_SIZE]), transport)
            if issued is None:
                self._refuse(peer, cause, transport, answer, reader)
                return
            del reader.buf[:JOIN_SIZE]
            if issued.single_use:
                self._tickets.pop(issued.ticket.id, None)
            j = Joined(transport, reader, peer, issued.ticket,
                       accepted_at + self.hello_timeout)
            handed = self._route(j, issued.single_use)
            if not handed:  # park until a slot asks or the HELLO bound passes (21.4)
                parked = self._parked.setdefault(issued.ticket.id, collections.deque())
                parked.append(j)
                lost: asyncio.Future[None] = loop.create_future()
                reader.on_lost = functools.partial(_settle, lost)
                await asyncio.wait((lost, j.taken), timeout=max(0.0, j.hello_deadline
                                                                 - loop.time()))
                reader.on_lost = None
                if not j.taken.done():  # no slot took it
                    with contextlib.suppress(ValueError):
                        parked.remove(j)
                    if not parked:
                        self._parked.pop(issued.ticket.id, None)
                    self._refuse(peer, "pool full" if not lost.done() else "closed while waiting",
                                 transport, (ErrorCode.BAD_HANDSHAKE,
                                             _REFUSED + ": the pool is full"), reader)
                else:
                    handed = True
        except asyncio.CancelledError:
            transport.abort()
            raise
        finally:
            if not handed:
                self._pending -= 1

    async def _read_join(self, raw: asyncio.Transport, reader: _JoinReader) -> asyncio.Transport:
        loop = asyncio.get_running_loop()
        if self._ssl is not None:
            try:
                transport = await loop.start_tls(raw, reader, self._ssl, server_side=True,
                                                 ssl_handshake_timeout=self.join_timeout)
            except asyncio.CancelledError:
                raw.abort()
                raise
            if transport is None:
                raise ConnectionError("closed during the TLS handshake")
            # start_tls does not call connection_made; bytes that came with the handshake's
            # end are in the buffer already.
            reader.connection_made(transport)
            if len(reader.buf) >= JOIN_SIZE:
                transport.pause_reading()
            sslobj = transport.get_extra_info("ssl_object")
            if sslobj is None or sslobj.selected_alpn_protocol() != ALPN:
                reader.transport = transport
                raise ConnectionError(f"the client did not offer ALPN {ALPN!r}")
        else:
            transport = raw
            raw.set_protocol(reader)
            reader.connection_made(raw)
            raw.resume_reading()
        await reader.ready
        return transport

    def _check(self, block: bytes, transport: asyncio.BaseTransport
               ) -> tuple[str, tuple[int, str] | None, _Issued | None]:
        """PROTOCOL.md 21.3's checks, in order: (cause, answer, the ticket if they pass)."""
        magic, version, reserved, tid, secret = _JOIN.unpack(block)
        if magic != JOIN_MAGIC:
            return "bad magic", None, None
        if version != JOIN_VERSION:
            return (f"join version {version}",
                    (ErrorCode.VERSION_MISMATCH, f"join version {version} is not supported "
                     f"(1)"), None)
        refused = (ErrorCode.BAD_HANDSHAKE, _REFUSED)
        if reserved != bytes(6):
            return "reserved bytes not zero", refused, None
        issued = self._tickets.get(tid)
        if issued is None:
            return "unknown or revoked ticket", refused, None
        if not hmac.compare_digest(issued.ticket.secret, secret):
            return f"wrong secret for ticket {tid.hex()}", refused, None
        if issued.ticket.expired():
            return f"expired ticket {tid.hex()}", refused, None
        return "", None, issued

    def _route(self, j: Joined, single_use: bool) -> bool:
        keys: list[bytes | None] = [j.ticket.id] + ([] if single_use else [None])
        for key in keys:
            waiters = self._waiters.get(key)
            while waiters:
                fut = waiters.popleft()
                if not fut.done():
                    fut.set_result(self._hand_over(j))
                    return True
        return False


# ---------------------------------------------------------------------------------------------
# The worker's side
# ---------------------------------------------------------------------------------------------


class _Connecting(asyncio.Protocol):
    """The protocol during the handshake. A loss the TLS layer sent its way (it queues
    connection_lost with call_soon, so one can still be on its way when ``connect`` hands the
    connection over) goes on to the protocol that took the connection over."""

    def __init__(self) -> None:
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.then: asyncio.BaseProtocol | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
            if self.then is not None:
                self.then.connection_lost(exc)


async def connect(ticket: Ticket, protocol: asyncio.BaseProtocol, *,
                  timeout: float = DEFAULT_JOIN_TIMEOUT,
                  on_connected: Callable[[], None] | None = None) -> asyncio.Transport:
    """Connect to the parent named by ``ticket`` and join: TCP, TLS 1.3 with the parent's
    certificate pinned, the JOIN block; then ``protocol`` takes the connection over (its
    ``connection_made`` sends the HELLO). Returns the transport.

    The TCP connect and then the TLS handshake each take at most ``timeout`` seconds, in one
    attempt (21.5); ``on_connected`` is called once the TCP connection is made (where the
    worker's welcome timeout starts). An IPv6 host in brackets is connected to without them;
    SNI is the host name, none for an IP literal (21.1).

    The secret is sent only after the fingerprint matched; :class:`JoinRefused` says why a
    join could not be made. Whether the parent accepted the ticket shows in what it answers
    the HELLO (WELCOME, or ERROR id 0 ``join refused``)."""
    if ticket.expired():
        raise JoinRefused(f"ticket {ticket.name} expired at {ticket.expires} (Unix time)")
    loop = asyncio.get_running_loop()
    placeholder = _Connecting()
    host = ticket.connect_host
    try:
        transport, _ = await asyncio.wait_for(loop.create_connection(
            lambda: placeholder, host, ticket.port), timeout)
    except asyncio.TimeoutError:
        raise JoinRefused(f"could not connect to {ticket.host}:{ticket.port} within "
                          f"{timeout:g}s") from None
    except OSError as e:
        raise JoinRefused(f"could not connect to {ticket.host}:{ticket.port}: {e}") from None
    if on_connected is not None:
        on_connected()
    if ticket.tls:
        try:
            tls = await asyncio.wait_for(loop.start_tls(
                transport, placeholder, _client_context(), server_hostname=ticket.sni,
                ssl_handshake_timeout=timeout), timeout)
        except asyncio.TimeoutError:
            transport.abort()
            raise JoinRefused(f"the TLS handshake with {ticket.host}:{ticket.port} took over "
                              f"{timeout:g}s") from None
        except (OSError, ssl.SSLError, RuntimeError) as e:
            transport.abort()
            raise JoinRefused(f"could not connect to {ticket.host}:{ticket.port}: TLS: "
                              f"{e}") from None
        if tls is None:  # the connection closed during the handshake
            transport.abort()
            raise JoinRefused(f"could not connect to {ticket.host}:{ticket.port}: the "
                              "connection closed during the TLS handshake")
        transport = tls
    if ticket.tls:
        sslobj = transport.get_extra_info("ssl_object")
        der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
        seen = hashlib.sha256(der).digest() if der else b""
        assert ticket.fingerprint is not None
        if not hmac.compare_digest(seen, ticket.fingerprint):
            transport.abort()
            raise JoinRefused(f"the parent at {ticket.host}:{ticket.port} presented a "
                              f"certificate with fingerprint sha256:{seen.hex()}, not the "
                              f"ticket's sha256:{ticket.fingerprint.hex()}: not joining")
    sock = transport.get_extra_info("socket")
    if sock is not None:  # small frames (PONGs, results) go out at once
        with contextlib.suppress(OSError):
            import socket as _socket
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    transport.write(ticket.join_block())
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    # The parent may have closed the connection after the handshake, before this coroutine
    # resumed: the loss went to the placeholder. It is handed on, or the worker would wait for a
    # WELCOME until its welcome timeout.
    placeholder.then = protocol
    if placeholder.lost.done():
        protocol.connection_lost(None)
    return transport  # type: ignore[return-value]


class ParentWatchdog:
    """A remote worker's watch on its parent (PROTOCOL.md 21.5): WELCOME must come within
    ``welcome_timeout`` seconds of the TCP connect (``connected()``, called at construction
    unless ``start`` is False); then a PING every ``heartbeat_ms`` (1,000 when
    the WELCOME says 0), and when the oldest unanswered PING is 3 periods old the parent is
    gone: ``gone(why)`` is called once.

    The worker driver calls ``welcome(heartbeat_ms)`` and ``pong(nonce)`` on those events;
    ``send_ping(nonce)`` is how the watchdog sends (through the worker's core)."""

    def __init__(self, send_ping: Callable[[bytes], None], gone: Callable[[str], None], *,
                 welcome_timeout: float = DEFAULT_WELCOME_TIMEOUT, start: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self._send_ping = send_ping
        self._gone = gone
        self._pings: collections.deque[tuple[int, float]] = collections.deque()
        self._nonce = 0
        self._period = 0.0
        self._next_ping = 0.0
        self._closed = False
        self._welcome_timeout = welcome_timeout
        self._timer: asyncio.TimerHandle | None = None
        if start:
            self.connected()

    def connected(self) -> None:
        """The TCP connection is made: the welcome timeout starts now (21.5), once."""
        if self._closed or self._timer is not None or self._period:
            return
        t = self._welcome_timeout
        self._timer = self._loop.call_later(
            t, self._fire, f"no WELCOME within {t:g}s of connecting")

    def welcome(self, heartbeat_ms: int) -> None:
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._period = (heartbeat_ms or DEFAULT_REMOTE_HEARTBEAT_MS) / 1000
        self._next_ping = self._loop.time()
        self._tick()

    def pong(self, nonce: bytes) -> None:
        # A PONG answers its PING and every earlier one (the parent answers in order, 8.5).
        n = int.from_bytes(nonce, "little")
        pings = self._pings
        if pings and pings[0][0] <= n <= self._nonce:
            while pings and pings[0][0] <= n:
                pings.popleft()

    def _tick(self) -> None:
        if self._closed:
            return
        now = self._loop.time()
        limit = HEARTBEAT_MISSES * self._period
        if self._pings and now - self._pings[0][1] > limit:
            self._fire(f"no PONG from the parent for {now - self._pings[0][1]:.1f}s "
                       f"(heartbeat {self._period * 1000:.0f} ms)")
            return
        if now >= self._next_ping:
            self._nonce += 1
            self._pings.append((self._nonce, now))
            self._next_ping = now + self._period
            self._send_ping(self._nonce.to_bytes(8, "little"))
        self._timer = self._loop.call_later(self._period / 4, self._tick)

    def _fire(self, why: str) -> None:
        if not self._closed:
            self.close()
            self._gone(why)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def environment_with_ticket(ticket: Ticket, base: Mapping[str, str] | None = None
                            ) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``WIREPOOL_TICKET`` set and
    ``WIREPOOL_FD`` removed: the environment for a worker that should join remotely."""
    env = dict(os.environ if base is None else base)
    env.pop("WIREPOOL_FD", None)
    env.pop("WIREPOOL_TICKET_FILE", None)
    env["WIREPOOL_TICKET"] = ticket.encode()
    return env
