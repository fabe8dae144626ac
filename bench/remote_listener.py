"""The remote listener under a hostile crowd (PROTOCOL.md 21.4): its bad-input figures.

    .venv/bin/python bench/remote_listener.py [--connections 1000] [--at-once 100]

Opens ``--connections`` connections to one TLS listener, ``--at-once`` at a time, in equal
parts: garbage before TLS, a stalled TLS record (slow handshake), TLS then a partial JOIN block,
forged tickets, silent peers. Reports how long each kind took to be refused (from connect to
the listener's close; max and median), the listener's peak of pending connections, and its
file descriptors and traced Python memory before and after (the crowd runs in this process,
so its own sockets are closed before "after" is read).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import statistics
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python", "tests"))

from wirepool import remote  # noqa: E402
from test_remote_listener import (_bad_ticket, _garbage, _no_ticket, _no_tls_client,  # noqa: E402
                                  _slow, _timed)


async def main(n: int, at_once: int, join_timeout: float, rounds: int) -> None:
    logging.getLogger("wirepool.remote").setLevel(logging.ERROR)  # the log is not measured
    async with remote.Listener(join_timeout=join_timeout) as listener:
        ticket = listener.issue()
        port = listener.port
        kinds = {"garbage before TLS": _garbage(port), "slow TLS handshake": _slow(port),
                 "TLS, partial JOIN": _no_ticket(port), "forged ticket": _bad_ticket(ticket),
                 "silent": _no_tls_client(port)}
        for p in kinds.values():  # warm-up
            await _timed(p)
        gc.collect()
        fds0 = len(os.listdir("/proc/self/fd"))
        tracemalloc.start()
        mem0 = tracemalloc.get_traced_memory()[0]
        peak = [0]
        gate = asyncio.Semaphore(at_once)
        times: dict[str, list[float]] = {k: [] for k in kinds}

        async def one(kind: str) -> None:
            async with gate:
                elapsed, _ = await _timed(kinds[kind])
                times[kind].append(elapsed)
                peak[0] = max(peak[0], listener.pending)
        names = [k for _ in range(n // len(kinds)) for k in kinds]
        after = []
        walls = []
        for _round in range(rounds):  # flat across rounds: nothing is kept per connection
            start = time.monotonic()
            await asyncio.gather(*(one(k) for k in names))
            walls.append(time.monotonic() - start)
            while listener.pending:
                await asyncio.sleep(0.01)
            await asyncio.sleep(1.2)  # answered refusals are aborted within 1 s at the latest
            gc.collect()
            after.append((len(os.listdir("/proc/self/fd")),
                          tracemalloc.get_traced_memory()[0] - mem0))
        tracemalloc.stop()
        print(f"# {rounds} x {len(names)} hostile connections, {at_once} at once, join_timeout "
              f"{join_timeout:g} s, max_pending {listener.max_pending}: "
              f"{', '.join(f'{w:.1f}' for w in walls)} s")
        print(f"{'kind':22} {'count':>6} {'median s':>9} {'max s':>7}")
        for k, v in times.items():
            print(f"{k:22} {len(v):6} {statistics.median(v):9.3f} {max(v):7.3f}")
        print(f"refused {listener.counters['refused']}, joined {listener.counters['joined']}, "
              f"peak pending {peak[0]}; fds before {fds0}, after each round "
              f"{[f for f, _m in after]}; traced memory held after each round "
              f"{[f'{m / 1024:.0f} KiB' for _f, m in after]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--at-once", type=int, default=100)
    ap.add_argument("--join-timeout", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.connections, a.at_once, a.join_timeout, a.rounds))
