"""Launchers: where a pool's worker processes run (PROTOCOL.md 21.8).

The pool does not care where its workers run; a launcher does. Restarts and recycling stay the
pool's: a launcher only places a worker process, and stops it when the pool lets it go.

- local (``launcher=None``, the default): each worker is a child process with an inherited
  socketpair (PROTOCOL.md 1).
- :class:`External`: workers are started by anything else (a Kubernetes Job, a systemd unit, a
  shell) with the pool's ticket in ``WIREPOOL_TICKET``, and connect back over TLS.
- :class:`Subprocess`: children of this process that join over TCP+TLS like remote workers
  (the remote path on one machine: tests, benchmarks).
- :class:`RayLauncher`: one Ray actor per worker, which runs the worker command (any language)
  with a ticket of its own; the worker connects back. Needs ``pip install 'wirepool[ray]'``.

Example (the worker program is unchanged: ``wirepool.serve()`` joins when given a ticket)::

    import sys, wirepool
    from wirepool.launchers import External

    launcher = External(host="0.0.0.0", advertise="10.0.0.5", port=7700,
                        on_ticket=lambda t: open("/run/wirepool/ticket", "w").write(t.encode()))
    with wirepool.Pool(["python", "worker.py"], workers=4, launcher=launcher) as pool:
        print(pool.call("add", {"a": 1, "b": 2}))

and on each worker machine: ``WIREPOOL_TICKET_FILE=/run/wirepool/ticket python worker.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import sys
from typing import Any, Callable, Mapping, Sequence

from . import remote
from .errors import ErrorCode, LocalError, StartupTimeout, WorkerExited

__all__ = ["Launcher", "External", "Subprocess", "RayLauncher"]

log = logging.getLogger("wirepool.launchers")

_STOP_GRACE = 1.0  # PROTOCOL.md 17, goodbye_grace


class _ConnectionLost(LocalError):
    """WORKER_EXITED for a remote worker whose connection dropped: its exit status is unknown,
    so the pool reports this message and these details instead (PROTOCOL.md 21.6)."""


class _RemoteConnection(asyncio.BufferedProtocol):
    """Sits between a remote worker's transport and the pool's worker protocol: a dropped
    connection is that worker's end (there is no process to wait for), and its launcher is told
    so it can stop the process where it runs."""

    def __init__(self, worker: Any, launcher: "Launcher", handle: Any) -> None:
        self.worker = worker
        self.launcher = launcher
        self.handle = handle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.worker.connection_made(transport)

    def get_buffer(self, sizehint: int) -> Any:
        return self.worker.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.worker.buffer_updated(nbytes)

    def data_received(self, data: bytes) -> None:
        self.worker.data_received(data)

    def eof_received(self) -> bool | None:
        self.worker.eof_received()
        return False

    def pause_writing(self) -> None:
        self.worker.pause_writing()

    def resume_writing(self) -> None:
        self.worker.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        w = self.worker
        if w.failure is None:
            where = getattr(w, "where", "a remote worker")
            w.failure = _ConnectionLost(
                ErrorCode.WORKER_EXITED, f"{where} lost its connection" +
                (f" ({exc})" if exc else ""),
                details={"connection": "lost", "host": getattr(w, "host", None), "pid": w.pid})
        if not w.exited.done():
            w.exited.set_result(None)
        # The process where it runs gets the goodbye grace to exit by itself (after GOODBYE,
        # or on end of file: PROTOCOL.md 8.4), then its launcher stops it.
        asyncio.get_running_loop().call_later(_STOP_GRACE, self._stop)
        w.connection_lost(exc)

    def _stop(self) -> None:
        with contextlib.suppress(Exception):
            self.launcher.stop(self.handle)


def _hello_pid(conn: Any) -> int:
    hello = getattr(conn, "hello", None)
    if callable(hello):
        hello = hello()
    return int(getattr(hello, "pid", 0) or 0)


class Launcher:
    """Places remote workers: the base of :class:`External` and :class:`RayLauncher`.

    It owns the pool's :class:`wirepool.remote.Listener` (``host``, ``port``, ``advertise``,
    ``tls`` as there; plain TCP on loopback only) and its pool ticket (:attr:`ticket`, valid
    ``ticket_ttl`` seconds). ``join_wait`` bounds how long a slot waits for its worker to
    connect (default: the pool's ``startup_timeout``). Subclasses implement :meth:`launch` and
    :meth:`stop`."""

    #: A launcher that knows each worker it starts gives each its own single-use ticket.
    per_worker_tickets = False

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, advertise: str | None = None,
                 tls: bool = True, join_wait: float | None = None,
                 ticket_ttl: float = remote.DEFAULT_POOL_TICKET_TTL,
                 listener: remote.Listener | None = None) -> None:
        self.listener = listener or remote.Listener(host, port, advertise=advertise, tls=tls)
        self.join_wait = join_wait
        self.ticket_ttl = ticket_ttl
        self.ticket: remote.Ticket | None = None
        self._started = False

    async def open(self, pool: Any) -> None:
        """Called once by the pool before it starts workers: listen, issue the pool ticket."""
        if not self._started:
            self._started = True
            if self.listener._server is None:
                await self.listener.start()
            self.ticket = self.listener.issue(self.ticket_ttl)

    async def close(self) -> None:
        """Called by the pool once its workers are gone."""
        await self.listener.close()

    async def launch(self, argv: Sequence[str], env: Mapping[str, str] | None,
                     ticket: remote.Ticket) -> Any:
        """Start one worker process with ``ticket``; returns a handle for :meth:`stop`."""
        return None

    def stop(self, handle: Any) -> None:
        """Stop the process behind ``handle`` (the pool let its worker go); idempotent."""

    async def start_worker(self, w: Any) -> None:
        """The pool's side of one remote worker's start: launch, accept its join, hand the
        connection to the pool's worker protocol, wait for its HELLO."""
        pool = w.pool
        loop = asyncio.get_running_loop()
        assert self.ticket is not None, "open() first"
        ticket = (self.listener.issue(pool.startup_timeout + 60, single_use=True)
                  if self.per_worker_tickets else self.ticket)
        handle = await self.launch(pool.argv, pool.env, ticket)
        wait = self.join_wait if self.join_wait is not None else pool.startup_timeout
        try:
            joined = await self.listener.accept(ticket if self.per_worker_tickets else None,
                                                timeout=wait)
        except asyncio.TimeoutError:
            self.stop(handle)
            if self.per_worker_tickets:
                self.listener.revoke(ticket)
            raise StartupTimeout(ErrorCode.STARTUP_TIMEOUT,
                                 f"no worker joined {self.listener.advertise}:"
                                 f"{self.listener.port} within {wait:g}s") from None
        except BaseException:
            self.stop(handle)
            raise
        w.host = joined.host
        w.where = f"worker {joined.host}"
        joined.attach(_RemoteConnection(w, self, handle))
        remaining = max(0.0, min(pool.startup_timeout, joined.hello_deadline - loop.time()))
        try:
            await asyncio.wait_for(asyncio.shield(w.ready), remaining)
        except asyncio.TimeoutError:
            err = StartupTimeout(ErrorCode.STARTUP_TIMEOUT,
                                 f"worker {joined.host} sent no valid HELLO within "
                                 f"{remaining:.1f}s of joining")
            w.kill(err)
            raise err from None
        except WorkerExited:
            raise WorkerExited(ErrorCode.WORKER_EXITED,
                               f"worker {joined.host} closed its connection before its "
                               f"HELLO") from None
        except BaseException:
            w.kill(WorkerExited(ErrorCode.WORKER_EXITED, "start-up interrupted"))
            raise
        w.pid = _hello_pid(w.conn)
        w.where = f"worker {joined.host} pid {w.pid}"
        if w.heartbeat_ms:  # the WELCOME's: never 0 on a remote connection (21.5, negotiate)
            w.heartbeat_task = loop.create_task(w._heartbeat())


class External(Launcher):
    """Workers started by anything else join with the pool's ticket (PROTOCOL.md 21.8).

    ``on_ticket(ticket)`` is called once the listener is up (before the pool waits for its
    workers): write the ticket where your workers read it (``ticket.encode()`` into
    ``WIREPOOL_TICKET`` or a file named by ``WIREPOOL_TICKET_FILE``), or start them from there.
    A plain function runs in a thread of the pool's event loop's default executor
    (``asyncio.to_thread``), never on the loop itself, so it may block (write to a slow disk,
    ``ssh`` a worker up and wait for it) while the listener goes on accepting and
    authenticating the workers that join meanwhile; the pool waits for it to return before its
    slots wait for workers. A coroutine function (``async def``) is awaited on the loop (it
    must not block). It is called once per launcher; what it raises, the pool's start raises.
    Each of the pool's ``workers`` slots waits ``join_wait`` seconds (default: the pool's
    ``startup_timeout``) for a worker to join; a worker that dies is replaced by the next one
    that joins."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 on_ticket: Callable[[remote.Ticket], Any] | None = None, **kw: Any) -> None:
        super().__init__(host, port, **kw)
        self.on_ticket = on_ticket

    async def open(self, pool: Any) -> None:
        first = not self._started
        await super().open(pool)
        if first and self.on_ticket is not None:
            assert self.ticket is not None
            if inspect.iscoroutinefunction(self.on_ticket):
                result = self.on_ticket(self.ticket)
            else:
                # Off the loop: a blocking callback must not stall the listener, whose TLS
                # handshakes (bounded by join_timeout, and by the worker's own 5 s) run on it.
                result = await asyncio.to_thread(self.on_ticket, self.ticket)
            if inspect.isawaitable(result):
                await result


class Subprocess(Launcher):
    """Children of this process that join over TCP (TLS by default) with a ticket of their own,
    exactly as remote workers do: the remote path on one machine, for tests, benchmarks, and
    trying a deployment out. ``stop`` kills the child and reaps it."""

    per_worker_tickets = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **kw: Any) -> None:
        super().__init__(host, port, **kw)
        self.children: dict[int, asyncio.subprocess.Process] = {}
        self._reapers: set[asyncio.Task[None]] = set()

    def worker_ticket(self, ticket: remote.Ticket) -> remote.Ticket:
        """The ticket handed to a child (a test may point it at a proxy)."""
        return ticket

    async def launch(self, argv: Sequence[str], env: Mapping[str, str] | None,
                     ticket: remote.Ticket) -> Any:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=remote.environment_with_ticket(self.worker_ticket(ticket), env),
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        self.children[proc.pid] = proc
        reaper = asyncio.get_running_loop().create_task(self._reap(proc))
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)
        return proc

    async def _reap(self, proc: asyncio.subprocess.Process) -> None:
        await proc.wait()
        self.children.pop(proc.pid, None)

    def stop(self, handle: Any) -> None:
        if handle is not None and handle.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                handle.kill()

    async def close(self) -> None:
        # Children leave by themselves after GOODBYE or end of file; stragglers are killed.
        procs = list(self.children.values())
        if procs:
            _done, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs],
                                                timeout=2.0)
            for p in procs:
                self.stop(p)
            if pending:
                await asyncio.wait(pending, timeout=5.0)
        await super().close()


# ---------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------


def _die_with_actor() -> None:  # pragma: no cover - runs in the forked child
    # The worker dies with the actor that started it (ray.kill, node loss), so a killed actor
    # never leaves a worker connected to the pool.
    import ctypes
    import signal
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


class _WorkerProcess:
    """The body of the Ray actor: runs one worker command and waits for it."""

    def __init__(self) -> None:
        self.proc: Any = None

    def start(self, argv: list[str], env: dict[str, str]) -> tuple[str, int]:
        import socket
        import subprocess
        full = dict(os.environ)
        full.pop("WIREPOOL_FD", None)
        full.update(env)
        self.proc = subprocess.Popen(argv, env=full, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_actor if sys.platform.startswith(
                                         "linux") else None)
        return socket.gethostname(), self.proc.pid

    def wait(self) -> int:
        return int(self.proc.wait()) if self.proc is not None else 0


class RayLauncher(Launcher):
    """One Ray actor per worker (PROTOCOL.md 21.8): the actor runs the pool's worker command
    with a single-use ticket of its own, and the worker connects back over TLS.

    ``num_cpus``, ``resources`` and ``scheduling_strategy`` (e.g. a
    ``PlacementGroupSchedulingStrategy``) are the actor's Ray options; ``options`` takes any
    other. Ray only places the process: the actor is never restarted by Ray (``max_restarts``
    0), the pool replaces a lost worker by its own policy, and the actor is killed when its
    worker leaves the pool. Connect to Ray (``ray.init``) before starting the pool.

    ``host`` defaults to all interfaces and ``advertise`` to this node's IP, so that workers on
    other nodes can reach the listener; both may be set as for :class:`Launcher`.

    Example::

        ray.init()
        with wirepool.Pool([sys.executable, "worker.py"], workers=8,
                           launcher=RayLauncher(num_cpus=1)) as pool:
            pool.map("work", items)
    """

    per_worker_tickets = True

    def __init__(self, *, num_cpus: float = 1, resources: Mapping[str, float] | None = None,
                 scheduling_strategy: Any = None, options: Mapping[str, Any] | None = None,
                 host: str | None = None, advertise: str | None = None, **kw: Any) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError("the Ray launcher needs Ray: pip install 'wirepool[ray]'") from None
        if advertise is None:
            advertise = ray.util.get_node_ip_address() if host is None else host
        super().__init__("0.0.0.0" if host is None else host, advertise=advertise, **kw)
        self._ray = ray
        self._options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0,
                                         **({"resources": dict(resources)} if resources else {}),
                                         **({"scheduling_strategy": scheduling_strategy}
                                            if scheduling_strategy is not None else {}),
                                         **dict(options or {})}
        self._actor_class: Any = None
        self.actors: dict[int, Any] = {}  # id(handle) -> actor, while its worker is in the pool

    async def launch(self, argv: Sequence[str], env: Mapping[str, str] | None,
                     ticket: remote.Ticket) -> Any:
        ray = self._ray
        if not ray.is_initialized():
            raise RuntimeError("call ray.init() before starting a pool with RayLauncher")
        if self._actor_class is None:
            self._actor_class = ray.remote(_WorkerProcess)
        actor = self._actor_class.options(**self._options).remote()
        extra = {} if env is None else {k: v for k, v in env.items()
                                        if os.environ.get(k) != v}
        extra["WIREPOOL_TICKET"] = ticket.encode()
        # Started, not awaited: the join (accepted by the caller) is the sign of life, and an
        # actor that cannot be placed shows as a join that does not come in time.
        actor.start.remote(list(argv), extra)
        self.actors[id(actor)] = actor
        return actor

    def stop(self, handle: Any) -> None:
        if handle is None or self.actors.pop(id(handle), None) is None:
            return
        with contextlib.suppress(Exception):
            self._ray.kill(handle, no_restart=True)

    async def close(self) -> None:
        for actor in list(self.actors.values()):
            self.stop(actor)
        await super().close()
