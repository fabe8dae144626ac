"""The handler-facing half of the worker SDK: the ``@method`` and ``@stream`` decorators, the
registry they fill (read by ``serve``), and ``Context``, what a handler knows about its request.
The runtime that calls the handlers is ``worker.py``."""

from __future__ import annotations

import dis
import inspect
import json
import threading
import time
from typing import Any, Callable, Sequence, TypeVar, overload

from . import codecs as _codecs
from . import proto
from .proto import MethodKind

F = TypeVar("F", bound=Callable[..., Any])


class _Method:
    __slots__ = ("name", "kind", "fn", "codecs", "wants_ctx", "is_async", "is_asyncgen", "is_gen",
                 "inline")

    def __init__(self, fn: Callable[..., Any], kind: int, name: str | None,
                 codecs: Sequence[str] | None, inline: bool = False) -> None:
        self.fn = fn
        self.inline = inline
        self.kind = kind
        self.name = name or fn.__name__
        names = list(codecs) if codecs is not None else _codecs.default_names()
        self.codecs = {c.id: c for c in (_codecs.get(n) for n in names)}
        if not self.codecs:
            raise ValueError(f"method {self.name!r} declares no codec")
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
        self.wants_ctx = len(params) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.is_asyncgen = inspect.isasyncgenfunction(fn)
        self.is_gen = inspect.isgeneratorfunction(fn)

    def info(self) -> proto.MethodInfo:
        return proto.MethodInfo(self.name, self.kind, sorted(self.codecs))


_registry: dict[str, _Method] = {}


def _register(fn: Callable[..., Any], kind: int, name: str | None,
              codecs: Sequence[str] | None, inline: bool = False) -> None:
    m = _Method(fn, kind, name, codecs, inline)
    if inline and (kind != MethodKind.UNARY or m.is_async):
        raise ValueError("inline=True is for plain (non-async) unary methods")
    if m.name in _registry:
        raise ValueError(f"method {m.name!r} is registered twice")
    _registry[m.name] = m


@overload
def method(fn: F) -> F: ...
@overload
def method(*, name: str | None = None, codecs: Sequence[str] | None = None,
           inline: bool = False) -> Callable[[F], F]: ...


def method(fn: Any = None, *, name: str | None = None, codecs: Sequence[str] | None = None,
           inline: bool = False) -> Any:
    """Register a unary method: ``f(req)`` or ``f(req, ctx)``, sync or async, returns the result.

    ``codecs`` lists the codec names it accepts (default: json, msgpack if installed, raw).
    ``inline=True`` runs a plain function on the I/O loop itself instead of the handler thread
    pool: two thread hand-offs fewer per call, for handlers that take microseconds. Such a
    handler delays PONGs and other requests while it runs, so never use it for slow work.
    """
    def deco(f: F) -> F:
        _register(f, MethodKind.UNARY, name, codecs, inline)
        return f
    return deco(fn) if fn is not None else deco


@overload
def stream(fn: F) -> F: ...
@overload
def stream(*, name: str | None = None, codecs: Sequence[str] | None = None) -> Callable[[F], F]: ...


def stream(fn: Any = None, *, name: str | None = None, codecs: Sequence[str] | None = None) -> Any:
    """Register a streaming method: a (async) generator, or a function returning an iterable.

    Each yielded item is one row. A summary for END comes from ``ctx.set_summary(obj)`` or the
    generator's ``return`` value.
    """
    def deco(f: F) -> F:
        _register(f, MethodKind.STREAM, name, codecs)
        return f
    return deco(fn) if fn is not None else deco


def registered_methods() -> list[str]:
    return list(_registry)


class Context:
    """What a handler knows about its request: cancellation, deadline, progress, summary."""

    __slots__ = ("id", "method", "codec", "deadline", "worker_id", "_cancel_code", "_events",
                 "_events_lock", "_on_event", "_summary", "_has_summary")

    def __init__(self, id: int, method: str, codec: _codecs.Codec, deadline: float | None,
                 worker_id: int, on_event: Callable[[Context], None]) -> None:
        self.id = id
        self.method = method
        self.codec = codec
        #: ``time.monotonic()`` value at which the request's budget runs out, or None.
        self.deadline = deadline
        self.worker_id = worker_id
        self._cancel_code: int | None = None
        self._events: dict[str, str] = {}
        self._events_lock = threading.Lock()
        self._on_event = on_event
        self._summary: Any = None
        self._has_summary = False

    @property
    def cancelled(self) -> bool:
        """True once the parent cancelled the request, its deadline passed, or the worker drains."""
        return self._cancel_code is not None

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None without one)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def progress(self, topic: str, data: Any = None) -> None:
        """Report progress (an EVENT frame). Coalesced: only the latest data per topic is sent,
        at most once per ~10 ms. ``data`` must be JSON-serialisable."""
        text = "" if data is None else json.dumps(data, separators=(",", ":"))
        with self._events_lock:
            first = not self._events
            self._events[topic] = text
        if first:
            self._on_event(self)

    def set_summary(self, summary: Any) -> None:
        """The summary sent with END (encoded with the request's codec)."""
        self._summary = summary
        self._has_summary = True

    def _take_events(self) -> dict[str, str]:
        with self._events_lock:
            events, self._events = self._events, {}
        return events


def _returning(gen: Any, box: list[Any]) -> Any:
    """Iterate ``gen`` and keep its ``return`` value (a stream's summary) in ``box``."""
    box.append((yield from gen))


_RETURNS_NONE_ONLY: dict[Any, bool] = {}


def _returns_none_only(code: Any) -> bool:
    """Whether a generator of ``code`` can only return None (so its return value, a stream's
    summary, need not be caught through _returning, a frame more per row): every RETURN_VALUE
    follows a LOAD_CONST None and is no jump target, every RETURN_CONST returns None. When in
    doubt, False."""
    known = _RETURNS_NONE_ONLY.get(code)
    if known is None:
        known = True
        prev = None
        for ins in dis.get_instructions(code):
            if ins.opname == "RETURN_VALUE":
                if (ins.is_jump_target or prev is None or prev.opname != "LOAD_CONST"
                        or prev.argval is not None):
                    known = False
                    break
            elif ins.opname == "RETURN_CONST" and ins.argval is not None:
                known = False
                break
            prev = ins
        if len(_RETURNS_NONE_ONLY) < 4096:
            _RETURNS_NONE_ONLY[code] = known
    return known
