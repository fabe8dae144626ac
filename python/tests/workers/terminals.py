"""Workers for test_worker_terminals.py: a result and a summary larger than the connection's
max_message_size (PROTOCOL.md 8.1)."""

import os

import wirepool


@wirepool.method
def whoami(_req: object) -> int:
    return os.getpid()


@wirepool.method(codecs=["raw"])
def big_result(size: bytes) -> bytes:
    return b"x" * int(bytes(size))


@wirepool.stream(codecs=["json"])
def big_summary(size: int):  # type: ignore[no-untyped-def]
    yield 0
    return "x" * size


if __name__ == "__main__":
    wirepool.serve()
