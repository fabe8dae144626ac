"""A worker whose ``freeze_then_answer`` stops its own process (SIGSTOP) and, once resumed,
answers: the hostile case of a worker resumed while its parent replaces it as hung."""

import os
import signal

import wirepool


@wirepool.method
def whoami(_req: object) -> int:
    return os.getpid()


@wirepool.method
def freeze_then_answer(_req: object) -> str:
    os.kill(os.getpid(), signal.SIGSTOP)
    return "late"


if __name__ == "__main__":
    wirepool.serve()
