"""Pool metrics served for Prometheus over HTTP: python examples/python/metrics.py [--port 9464]

Needs the ``prometheus`` extra (``pip install 'wirepool[prometheus]'``). Makes ``--calls`` calls and
one stream, prints the address to scrape, and serves until interrupted (Ctrl-C)::

    curl -s localhost:9464/metrics | grep wirepool_
"""

import argparse
import signal
import sys
import threading
from pathlib import Path

import prometheus_client

import wirepool
from wirepool.prometheus import PoolCollector

WORKER = [sys.executable, str(Path(__file__).with_name("worker.py"))]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--port", type=int, default=9464, help="0 picks a free port")
parser.add_argument("--calls", type=int, default=100)
args = parser.parse_args()

stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())

with wirepool.Pool(WORKER, workers=2) as pool:
    registry = prometheus_client.CollectorRegistry()  # or the default REGISTRY
    registry.register(PoolCollector(pool, name="example"))
    server, _thread = prometheus_client.start_http_server(args.port, addr="127.0.0.1",
                                                          registry=registry)
    for i in range(args.calls):
        pool.call("add", {"a": i, "b": 1})
    rows = sum(1 for _ in pool.stream("decls", {"n": 1000}))
    print(f"{args.calls} calls and a stream of {rows} rows done; metrics at "
          f"http://127.0.0.1:{server.server_port}/metrics (Ctrl-C stops)", flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
print("stopped")
