"""wirepool: run work in child worker processes behind a fast, typed binary protocol."""

from .errors import *  # noqa: F401,F403
from .errors import ErrorCode, WirepoolError, WorkerError

__version__ = "0.1.0"
