"""A slow link between a pool and a worker: started by the pool in the worker's place, it starts
``argv[1:-1]`` on a socket pair of its own and relays the two sockets, the pool's bytes to the
worker at ``argv[-1]`` bytes a second (a token bucket), the worker's as fast as they come. It
exits with the worker (which asks for a parent-death signal, so it goes with the relay)."""

import os
import socket
import subprocess
import sys
import threading
import time

up = socket.socket(fileno=int(os.environ.pop("WIREPOOL_FD")))
mine, theirs = socket.socketpair()
child = subprocess.Popen(sys.argv[1:-1], env=dict(os.environ, WIREPOOL_FD=str(theirs.fileno())),
                         pass_fds=[theirs.fileno()])
theirs.close()
rate = float(sys.argv[-1])


def relay(src: socket.socket, dst: socket.socket, rate: float) -> None:
    due = time.monotonic()
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
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


for src, dst, r in ((up, mine, rate), (mine, up, 0.0)):
    threading.Thread(target=relay, args=(src, dst, r), daemon=True).start()
sys.exit(child.wait())
