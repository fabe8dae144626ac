"""The one check of what a caller hands the pools (PROTOCOL.md section 22).

:func:`pool_options` checks every option of :class:`~wirepool.AsyncPool` (and so of the
blocking :class:`~wirepool.Pool`, which builds one) before anything is started; :func:`timeout`
checks a call's timeout for every call, stream, map and lease call; :func:`codec` resolves a
codec name. Each raises :class:`~wirepool.InvalidArgument` (308) naming the option, its range
and the value (quoted as in 22.4). Durations are seconds here: the spec's milliseconds / 1,000.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Sequence

from . import codecs as _codecs
from ._constants import MAX_COUNT, MAX_CREDIT, MAX_MAX_FRAME_SIZE, MAX_SIZE, MAX_TIMEOUT_MS
from ._constants import MAX_WORKERS, MIN_MAX_FRAME_SIZE
from .errors import DeadlineExceeded, ErrorCode, InvalidArgument, quote

MAX_TIMEOUT_S = MAX_TIMEOUT_MS / 1000  # 2,147,483.647 s, about 24.8 days

__all__ = ["pool_options", "timeout", "timeout_us", "codec", "MAX_TIMEOUT_S"]


def invalid(name: str, valid: str, value: Any, cls: type = InvalidArgument) -> InvalidArgument:
    """The error for option ``name``, which must be ``valid``, given ``value``."""
    error: InvalidArgument = cls(ErrorCode.INVALID_ARGUMENT,
                                 f"{name} must be {valid}, not {quote(value)} (PROTOCOL.md 22.2)")
    return error


def integer(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in ``low..high`` (bools and fractions refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or not low <= int(value) <= high:
        raise invalid(name, f"an integer, {low:,} - {high:,}", value)
    return int(value)


def seconds(name: str, value: Any, *, positive: bool) -> float:
    """``value`` as a finite number of seconds in 0 (or above 0) - ``MAX_TIMEOUT_S``."""
    t = _as_float(value)
    if not (math.isfinite(t) and (t > 0 if positive else t >= 0) and t <= MAX_TIMEOUT_S):
        low = "above 0" if positive else "0"
        raise invalid(name, f"a number of seconds, {low} - {MAX_TIMEOUT_S}", value)
    return t


def _as_float(value: Any) -> float:
    """A real number as a float (NaN for anything else, inf for an int too large for one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.inf


def flag(name: str, value: Any) -> bool:
    """A bool option: True or False only (1, "yes" or None are caller mistakes)."""
    if not isinstance(value, bool):
        raise invalid(name, "True or False", value)
    return value


def optional(check: Any, name: str, value: Any, *args: Any, **kw: Any) -> Any:
    """None (the option is off), or ``check(name, value, ...)``."""
    return None if value is None else check(name, value, *args, **kw)


def codec(name: Any) -> _codecs.Codec:
    """The codec called ``name`` (a codec name or a Codec); InvalidArgument for any other."""
    if not isinstance(name, (str, _codecs.Codec)):
        raise invalid("codec", f"a codec name ({', '.join(_codecs.available())})", name)
    return _codecs.get(name)


def argv(value: Any) -> list[str]:
    """The worker's command: a non-empty list of strings (or paths)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value \
            or not all(isinstance(a, (str, os.PathLike)) for a in value):
        raise invalid("argv", "a non-empty list of strings (the program and its arguments)", value)
    return [os.fspath(a) for a in value]


def pool_options(*, workers: Any = 1, max_in_flight: Any = 1, startup_timeout: Any = 1.0,
                 heartbeat_ms: Any = 0, cancel_grace: Any = 0.0, deadline_grace: Any = 0.0,
                 drain_grace: Any = 0.0, goodbye_grace: Any = 0.0, restart_backoff: Any = 0.0,
                 restart_backoff_max: Any = 0.0, max_restarts: Any = 0,
                 restart_window: Any = 1.0, stderr_tail_lines: Any = 0,
                 max_frame_size: Any = MIN_MAX_FRAME_SIZE, initial_credit: Any = 1,
                 max_message_size: Any = MAX_SIZE, max_requests: Any = None,
                 max_rss_bytes: Any = None, idle_timeout: Any = None, shm_threshold: Any = 1,
                 busy_poll_us: Any = 0) -> dict[str, Any]:
    """Every numeric option of a pool checked against its range (22.2), in this order; returns
    them as ints and floats. The defaults here only make each check callable alone."""
    out: dict[str, Any] = {
        "workers": integer("workers", workers, 1, MAX_WORKERS),
        "max_in_flight": integer("max_in_flight", max_in_flight, 1, MAX_COUNT),
        "startup_timeout": seconds("startup_timeout", startup_timeout, positive=True),
        "heartbeat_ms": integer("heartbeat_ms", heartbeat_ms, 0, MAX_TIMEOUT_MS),
        "restart_window": seconds("restart_window", restart_window, positive=True),
    }
    for name, value in (("cancel_grace", cancel_grace), ("deadline_grace", deadline_grace),
                        ("drain_grace", drain_grace), ("goodbye_grace", goodbye_grace),
                        ("restart_backoff", restart_backoff),
                        ("restart_backoff_max", restart_backoff_max)):
        out[name] = seconds(name, value, positive=False)
    if out["restart_backoff"] > out["restart_backoff_max"]:
        raise invalid("restart_backoff", f"at most restart_backoff_max "
                      f"({out['restart_backoff_max']} s)", restart_backoff)
    for name, value in (("max_restarts", max_restarts), ("stderr_tail_lines", stderr_tail_lines)):
        out[name] = integer(name, value, 0, MAX_COUNT)
    out["max_frame_size"] = integer("max_frame_size", max_frame_size, MIN_MAX_FRAME_SIZE,
                                    MAX_MAX_FRAME_SIZE)
    out["initial_credit"] = integer("initial_credit", initial_credit, 1, MAX_CREDIT)
    out["max_message_size"] = integer("max_message_size", max_message_size,
                                      out["max_frame_size"], MAX_SIZE)
    out["max_requests"] = optional(integer, "max_requests", max_requests, 1, MAX_SIZE)
    out["max_rss_bytes"] = optional(integer, "max_rss_bytes", max_rss_bytes, 1, MAX_SIZE)
    out["idle_timeout"] = optional(seconds, "idle_timeout", idle_timeout, positive=True)
    out["shm_threshold"] = integer("shm_threshold", shm_threshold, 1, MAX_SIZE)
    out["busy_poll_us"] = integer("busy_poll_us", busy_poll_us, 0, MAX_TIMEOUT_MS * 1000)
    return out


def timeout(value: Any, method: Any) -> float | None:
    """A call's ``timeout``: None (no deadline) or seconds, 0 - ``MAX_TIMEOUT_S`` (22.3). 0 has
    expired: DEADLINE_EXCEEDED, nothing is sent."""
    if value is None:
        return None
    t = seconds("timeout", value, positive=False)
    if t == 0:
        raise DeadlineExceeded(ErrorCode.DEADLINE_EXCEEDED,
                               f"{quote(method)} was called with a timeout of 0: it has expired")
    return t


def timeout_us(value: float | None) -> int:
    """A checked timeout as the wire's ``timeout_us``: 0 for none, else rounded up, at least 1
    (no positive timeout reaches the wire as 0, no deadline)."""
    return 0 if value is None else max(1, math.ceil(round(value * 1e6, 3)))
