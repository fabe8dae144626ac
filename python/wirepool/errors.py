"""Error codes (PROTOCOL.md section 3) and the exceptions that carry them.

Every failure in wirepool is a :class:`WirepoolError` with a stable numeric ``code``, its ``name``,
the request ``id`` it concerns (0 for the connection) and a human ``message``. Catch a subclass to
handle one kind of failure, or :class:`WirepoolError` for all of them::

    try:
        pool.call("add", {"a": 1})
    except wirepool.WorkerExited as e:
        print(e.code, e.exit_status, e.signal, e.stderr_tail)
"""

from __future__ import annotations

from typing import Any

from ._constants import QUOTED_MAX_CHARS  # PROTOCOL.md 22.4
from ._constants import ErrorCode as ErrorCode  # PROTOCOL.md 3 and 20.6, generated from spec/constants.json


def code_name(code: int) -> str:
    """The stable name of ``code``; unknown codes are named by their range (section 3)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        pass
    if 100 <= code < 200:
        return "PROTOCOL"
    if 200 <= code < 300:
        return "REQUEST_ERROR"
    if 300 <= code < 400:
        return "LOCAL_ERROR"
    if code >= 1000:
        return "APPLICATION"
    return "UNKNOWN"


class WirepoolError(Exception):
    """Base of every wirepool error: ``code``, ``name``, ``id``, ``message``, ``details``.

    ``details`` is the decoded JSON ``details`` of an ERROR frame (or None).
    """

    code: int
    name: str
    id: int
    message: str
    details: Any

    def __init__(self, code: int, message: str = "", *, id: int = 0, details: Any = None) -> None:
        self.code = int(code)
        self.name = code_name(self.code)
        self.id = id
        self.message = message
        self.details = details
        super().__init__(self.code, message)

    def __str__(self) -> str:
        where = f" (request {self.id})" if self.id else ""
        return f"{self.name} [{self.code}]{where}: {self.message}"

    def __reduce__(self) -> Any:  # keep pickling (e.g. across threads/processes) faithful
        return (_rebuild, (type(self), self.code, self.message, self.id, self.details, self.__dict__))


def _rebuild(cls: type, code: int, message: str, id: int, details: Any, state: dict) -> Any:
    obj: Any = WirepoolError.__new__(cls)
    WirepoolError.__init__(obj, code, message, id=id, details=details)
    obj.__dict__.update(state)
    return obj


class ProtocolError(WirepoolError):
    """A protocol error from the core, with a section 3 code. Raised while receiving
    (``next_event``, ``end_of_input``) it is a violation and the connection is dead; raised by a
    ``send_*`` it is a refusal: nothing was written and the connection lives (PROTOCOL.md 14.3)."""


class RequestError(WirepoolError):
    """An error the worker sent for one request; the worker keeps serving. A 2xx code has its
    own subclass; a code of no other class on a request id (unassigned, 1xx, or a 3xx the
    worker put on the wire) is a plain RequestError carrying it (PROTOCOL.md 3)."""


class UnknownMethod(RequestError):
    pass


class CodecUnsupported(RequestError):
    pass


class BadRequest(RequestError):
    pass


class HandlerError(RequestError):
    pass


class HandlerPanic(RequestError):
    pass


class Cancelled(RequestError):
    pass


class DeadlineExceeded(RequestError):
    pass


class Overloaded(RequestError):
    pass


class Draining(RequestError):
    pass


class RowTooLarge(RequestError):
    pass


class LocalError(WirepoolError):
    """A 3xx outcome decided by the local SDK (never on the wire: a 3xx code a worker sends is
    a :class:`RequestError`, see :func:`error_from_wire`)."""


class WorkerExited(LocalError):
    """The worker died or closed its connection while the request was in flight.

    ``exit_status`` is the exit code (None if killed by a signal or unknown), ``signal`` the signal
    number that killed it (or None), ``stderr_tail`` the last lines it wrote to stderr.
    """

    exit_status: int | None = None
    signal: int | None = None
    stderr_tail: str = ""


class WorkerHung(LocalError):
    pass


class StartupTimeout(LocalError):
    pass


class SpawnFailed(LocalError):
    pass


class PoolClosed(LocalError):
    pass


class LeaseLost(LocalError):
    """A call through a lease whose worker had already died (the call that was in flight when it
    died raised :class:`WorkerExited`). ``exit_status``, ``signal`` and ``stderr_tail`` say how
    it died, as on :class:`WorkerExited` (None/"" while the exit is not yet known).
    """

    exit_status: int | None = None
    signal: int | None = None
    stderr_tail: str = ""


class DecodeFailed(LocalError):
    pass


class ProtocolViolation(LocalError):
    """The connection broke with a 1xx code; ``details["protocol_code"]`` holds it."""


class InvalidArgument(LocalError, ValueError):
    """A caller's option or argument is out of range, of the wrong type, NaN or infinite
    (PROTOCOL.md 22.2): raised at once, by the pool's constructor for a pool option and by the
    call for a call option, before anything is spawned or sent. A ``ValueError`` too, so
    ``except ValueError`` keeps working; a value of the wrong type raises it as well."""


class InvalidArgumentType(InvalidArgument, TypeError):
    """An :class:`InvalidArgument` for an object of the wrong kind where ``TypeError`` was
    raised before (e.g. ``retry`` that is no RetryPolicy): both ``except`` clauses catch it."""


def quote(value: object) -> str:
    """``value`` for an error message: a string's repr (anything else's repr) cut to
    ``QUOTED_MAX_CHARS`` characters, saying how long it was when cut (PROTOCOL.md 22.4)."""
    if isinstance(value, str):
        if len(value) <= QUOTED_MAX_CHARS:
            return repr(value)
        return f"{value[:QUOTED_MAX_CHARS]!r}... ({len(value)} characters)"
    try:
        text = repr(value)
    except Exception:  # a caller's object whose repr fails
        text = f"<{type(value).__name__} object>"
    if len(text) <= QUOTED_MAX_CHARS:
        return text
    return f"{text[:QUOTED_MAX_CHARS]}... ({len(text)} characters)"


class WorkerError(WirepoolError):
    """An application error (code >= 1000).

    Raise it in a handler to end the request with your own code; the parent raises it with the
    same code, message and details::

        raise wirepool.WorkerError(1001, "no such user", {"user": 42})
    """

    def __init__(self, code: int, message: str = "", details: Any = None, *, id: int = 0) -> None:
        super().__init__(code, message, id=id, details=details)


_BY_CODE: dict[int, type[WirepoolError]] = {
    ErrorCode.UNKNOWN_METHOD: UnknownMethod,
    ErrorCode.CODEC_UNSUPPORTED: CodecUnsupported,
    ErrorCode.BAD_REQUEST: BadRequest,
    ErrorCode.HANDLER_ERROR: HandlerError,
    ErrorCode.HANDLER_PANIC: HandlerPanic,
    ErrorCode.CANCELLED: Cancelled,
    ErrorCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    ErrorCode.OVERLOADED: Overloaded,
    ErrorCode.DRAINING: Draining,
    ErrorCode.ROW_TOO_LARGE: RowTooLarge,
    ErrorCode.WORKER_EXITED: WorkerExited,
    ErrorCode.WORKER_HUNG: WorkerHung,
    ErrorCode.STARTUP_TIMEOUT: StartupTimeout,
    ErrorCode.SPAWN_FAILED: SpawnFailed,
    ErrorCode.POOL_CLOSED: PoolClosed,
    ErrorCode.LEASE_LOST: LeaseLost,
    ErrorCode.DECODE_FAILED: DecodeFailed,
    ErrorCode.PROTOCOL_VIOLATION: ProtocolViolation,
    ErrorCode.INVALID_ARGUMENT: InvalidArgument,
}


def error_from_code(code: int, message: str = "", *, id: int = 0, details: Any = None) -> WirepoolError:
    """Build the most specific exception for ``code`` (unknown codes are classified by range),
    for an outcome decided locally; an ERROR a worker sent is :func:`error_from_wire`'s."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(code, message, id=id, details=details)
    if code >= 1000:
        return WorkerError(code, message, details, id=id)
    if 100 <= code < 200:
        return ProtocolError(code, message, id=id, details=details)
    if 200 <= code < 300:
        return RequestError(code, message, id=id, details=details)
    if 300 <= code < 400:
        return LocalError(code, message, id=id, details=details)
    return WirepoolError(code, message, id=id, details=details)


def error_from_wire(code: int, message: str = "", *, id: int, details: Any = None) -> WirepoolError:
    """The exception for an ERROR a worker sent for request ``id``: its id decides its fate,
    never its code (PROTOCOL.md 3). A 2xx code gets its :class:`RequestError` subclass, 1000 and
    above a :class:`WorkerError`; any other code (unassigned 0-99 and 400-999, a 1xx, a 3xx) is a
    :class:`RequestError` carrying it, named by its range or its name, never a local outcome
    (a wire 300 is no :class:`WorkerExited`: no death, nothing killed, never retried)."""
    if 200 <= code < 300 or code >= 1000:
        return error_from_code(code, message, id=id, details=details)
    return RequestError(code, message, id=id, details=details)
