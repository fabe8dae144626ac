"""A slow link between a pool and a worker, for the heartbeat tests of every SDK
(rust/wirepool/tests/heartbeat_large.rs, python/tests/test_heartbeat_large.py,
node/test/heartbeat-large.test.ts): started by the pool in the worker's place, it relays the
pool's socket (WIREPOOL_FD) to a worker it starts on a socketpair of its own, the worker's output
at argv[1] bytes a second and the pool's at argv[2] (0: as fast as it comes; a token bucket:
after an idle spell one read goes at once). argv[3:] is the worker's command. Exits with the
worker's status; when the pool kills the relay, the worker sees end of file and exits too.

    python3 slow_relay.py DOWN_RATE UP_RATE worker-command...
"""
import os
import socket
import subprocess
import sys
import threading
import time

up = socket.socket(fileno=int(os.environ.pop("WIREPOOL_FD")))
mine, theirs = socket.socketpair()
child = subprocess.Popen(sys.argv[3:], env=dict(os.environ, WIREPOOL_FD=str(theirs.fileno())),
                         pass_fds=[theirs.fileno()])
theirs.close()


def relay(src: socket.socket, dst: socket.socket, rate: float) -> None:
    due = time.monotonic()
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
            if rate:
                now = time.monotonic()
                due = max(due, now) + len(data) / rate
                if due > now:
                    time.sleep(due - now)  # the link's pace, not a synchronisation
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


for src, dst, r in ((mine, up, float(sys.argv[1])), (up, mine, float(sys.argv[2]))):
    threading.Thread(target=relay, args=(src, dst, r), daemon=True).start()
sys.exit(child.wait())
