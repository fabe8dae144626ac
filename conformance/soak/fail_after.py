"""A worker launcher for the soak's restart-limit part: the first N processes started with it
become the real worker (exec, same pid); every later one exits with status 3 before its HELLO,
so every replacement a pool starts fails.

    fail_after.py STATE_DIR N -- WORKER COMMAND...

Each process takes the next incarnation number by creating ``STATE_DIR/<k>`` exclusively, so
the files left in STATE_DIR count exactly how many processes the pool started.
"""

from __future__ import annotations

import os
import sys

FAILED_START_STATUS = 3


def main() -> None:
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit("usage: fail_after.py STATE_DIR N -- WORKER COMMAND...")
    state, good, argv = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
    k = 1
    while True:
        try:
            os.close(os.open(os.path.join(state, str(k)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            k += 1
    if k <= good:
        os.execvp(argv[0], argv)
    sys.stderr.write(f"soak: incarnation {k} fails to start on purpose\n")
    sys.stderr.flush()
    os._exit(FAILED_START_STATUS)


if __name__ == "__main__":
    main()
