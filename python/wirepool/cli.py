"""``wirepool``: the command line for any wirepool worker, what grpcurl is to gRPC.

Everything after ``--`` is the worker's command (run directly, never through a shell); for
``call``, ``stream`` and ``bench`` its last two words are the method and its request as JSON
(``-`` reads the JSON from standard input)::

    wirepool describe -- python worker.py           # its HELLO: methods, kinds, codecs, limits
    wirepool call -- python worker.py add '{"a": 1, "b": 2}'
    wirepool stream -- python worker.py decls '{"n": 1000}' > rows.ndjson
    wirepool bench --workers 4 --in-flight 64 -- ./my_worker add '{"a": 1, "b": 2}'
    wirepool top http://127.0.0.1:9464/metrics        # a live view of a running pool (no --)

Exit codes: 0 success; 1 the worker or the call failed (``CODE NAME: message`` on stderr, e.g.
``206 DEADLINE_EXCEEDED: ...``); 2 bad usage; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, TextIO

from . import _top
from . import codecs as _codecs
from . import proto
from .errors import ErrorCode, ProtocolError, SpawnFailed, StartupTimeout, WirepoolError, WorkerExited
from .pool import AsyncPool
from .sync_pool import Pool

__all__ = ["main", "describe_worker", "WorkerDescription"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_KIND_NAMES = {proto.MethodKind.UNARY: "unary", proto.MethodKind.STREAM: "stream"}
_CODEC_NAMES = {v: k.lower() for k, v in vars(proto.CodecId).items() if k.isupper()}
_EXIT_GRACE_S = 2.0  # how long a described worker gets to exit after we close its socket


class _Usage(Exception):
    """A command line that cannot run (exit 2)."""


# ---------------------------------------------------------------------------------------------
# describe: our own minimal spawn, since the pool keeps a worker's HELLO to itself
# ---------------------------------------------------------------------------------------------


@dataclass
class WorkerDescription:
    """What a worker says about itself in its HELLO (spec section 4.1)."""

    pid: int
    sdk_name: str
    sdk_version: str
    min_version: int
    max_version: int
    max_concurrency: int
    max_frame_size: int
    methods: list[dict[str, Any]]  # {"name", "kind": "unary"|"stream", "codecs": [names]}

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "sdk": {"name": self.sdk_name, "version": self.sdk_version},
                "protocol": {"min_version": self.min_version, "max_version": self.max_version},
                "limits": {"max_concurrency": self.max_concurrency,
                           "max_frame_size": self.max_frame_size},
                "methods": self.methods}


def describe_worker(argv: Sequence[str], timeout: float = 10.0) -> WorkerDescription:
    """Start ``argv`` as a worker, read its HELLO, and stop it (it is never sent a request).

    Raises :class:`~wirepool.SpawnFailed`, :class:`~wirepool.StartupTimeout`,
    :class:`~wirepool.WorkerExited` (with its stderr tail) or a :class:`~wirepool.ProtocolError`
    for a HELLO that breaks the spec.
    """
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stderr = tempfile.TemporaryFile()  # a file, not a pipe: a chatty worker never blocks on it
    try:
        env = dict(os.environ, WIREPOOL_FD=str(child.fileno()))
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                    pass_fds=(child.fileno(),), start_new_session=True)
        except OSError as e:
            raise SpawnFailed(ErrorCode.SPAWN_FAILED,
                              f"cannot start {argv[0]!r}: {e.strerror or e}") from e
        finally:
            child.close()  # the worker has its copy; ours would hide its EOF
        try:
            hello = _read_hello(parent, proc, timeout, stderr)
        finally:
            # Closing before WELCOME is a refusal the worker must answer by exiting (spec 4);
            # one that lingers is killed with its whole process group.
            parent.close()
            try:
                proc.wait(_EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        stderr.close()
    methods = [{"name": m.name, "kind": _KIND_NAMES.get(m.kind, str(m.kind)),
                "codecs": [_CODEC_NAMES.get(c, str(c)) for c in m.codecs]}
               for m in hello.methods]
    return WorkerDescription(pid=hello.pid, sdk_name=hello.sdk_name, sdk_version=hello.sdk_version,
                             min_version=hello.min_version, max_version=hello.max_version,
                             max_concurrency=hello.max_concurrency,
                             max_frame_size=hello.max_frame_size, methods=methods)


def _stderr_tail(stderr: Any, lines: int = 20) -> str:
    stderr.seek(0)
    text = stderr.read()[-65536:].decode(errors="replace")
    tail = "\n".join(text.splitlines()[-lines:])
    return f"; stderr tail:\n{tail}" if tail else ""


def _read_hello(sock: socket.socket, proc: subprocess.Popen, timeout: float,
                stderr: Any) -> proto.Hello:
    conn = proto.Connection("parent")
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StartupTimeout(ErrorCode.STARTUP_TIMEOUT,
                                 f"worker pid {proc.pid} sent no HELLO within {timeout}s"
                                 + _stderr_tail(stderr))
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        if not data:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(_EXIT_GRACE_S)
            how = ("closed its connection" if proc.returncode is None
                   else f"exited with status {proc.returncode}" if proc.returncode >= 0
                   else f"was killed by signal {-proc.returncode}")
            raise WorkerExited(ErrorCode.WORKER_EXITED,
                               f"worker pid {proc.pid} {how} before its HELLO"
                               + _stderr_tail(stderr))
        conn.receive(data)
        event = conn.next_event()  # raises ProtocolError for a bad HELLO
        if isinstance(event, proto.Hello):
            return event
        if event is not None:
            raise ProtocolError(ErrorCode.UNEXPECTED_FRAME,
                                f"worker sent {type(event).__name__} before its HELLO")


def _print_description(d: WorkerDescription, out: TextIO) -> None:
    out.write(f"worker pid {d.pid}: {d.sdk_name} {d.sdk_version}".rstrip() + "\n")
    out.write(f"protocol versions {d.min_version}-{d.max_version}; "
              f"max_concurrency {d.max_concurrency}; max_frame_size {d.max_frame_size:,}\n")
    out.write(f"{len(d.methods)} method{'s' if len(d.methods) != 1 else ''}\n")
    width = max((len(m["name"]) for m in d.methods), default=0)
    for m in sorted(d.methods, key=lambda m: m["name"]):
        out.write(f"  {m['name']:<{width}}  {m['kind']:<6}  {', '.join(m['codecs'])}\n")


# ---------------------------------------------------------------------------------------------
# call and stream
# ---------------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """Raw and binary results: UTF-8 text when they are, else {"base64": ...}."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        b = bytes(value)
        try:
            return b.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(b).decode()}
    if hasattr(value, "to_pylist"):  # an Arrow batch or table
        return value.to_pylist()
    raise TypeError(f"cannot print a {type(value).__name__} as JSON")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_jsonable)


class _Progress:
    """A one-line progress report on a terminal's stderr, redrawn at most 10 times a second."""

    def __init__(self, out: TextIO, enabled: bool) -> None:
        self.out = out
        self.enabled = enabled
        self.started = time.monotonic()
        self.drawn = 0.0

    def update(self, rows: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.drawn < 0.1:
            return
        self.drawn = now
        elapsed = max(now - self.started, 1e-9)
        self.out.write(f"\r{rows:,} rows  {elapsed:.1f} s  {_rate(rows / elapsed)} rows/s\x1b[K")
        self.out.flush()

    def finish(self) -> None:
        if self.enabled:
            self.out.write("\r\x1b[K")
            self.out.flush()


def _rate(per_s: float) -> str:
    """A rate with three significant digits: 123, 12.3 k, 1.23 M."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.3g} {unit}"
    return f"{per_s:.3g}"


@contextlib.contextmanager
def _pool(args: argparse.Namespace, argv: list[str]) -> Iterator[Pool]:
    """A one-worker pool; closed at once (no drain) when the user interrupts or stops reading."""
    pool = Pool(argv, workers=1, codec=args.codec, startup_timeout=args.startup_timeout)
    grace = 5.0
    try:
        yield pool
    except (KeyboardInterrupt, BrokenPipeError):
        grace = 0.0
        raise
    finally:
        pool.close(grace)


def _run_call(args: argparse.Namespace, argv: list[str], method: str, request: Any) -> int:
    with _pool(args, argv) as pool:
        result = pool.call(method, request, timeout=args.timeout)
    sys.stdout.write(_dumps(result) + "\n")
    return EXIT_OK


def _run_stream(args: argparse.Namespace, argv: list[str], method: str, request: Any) -> int:
    out = sys.stdout
    progress = _Progress(sys.stderr, enabled=not args.no_progress and sys.stderr.isatty())
    started = time.monotonic()
    with _pool(args, argv) as pool:
        with pool.stream(method, request, timeout=args.timeout) as rows:
            n = 0
            try:
                for row in rows:
                    out.write(_dumps(row) + "\n")
                    n += 1
                    if not n & 1023:
                        progress.update(n)
            finally:
                progress.finish()
            summary = rows.summary
    out.flush()
    elapsed = time.monotonic() - started
    tail = "" if summary is None else f"; summary {_dumps(summary)}"
    sys.stderr.write(f"{n:,} rows in {elapsed:.2f} s ({_rate(n / max(elapsed, 1e-9))} rows/s)"
                     f"{tail}\n")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


async def _bench(args: argparse.Namespace, argv: list[str], method: str, request: Any,
                 is_stream: bool) -> dict[str, Any]:
    latencies: list[float] = []
    rows = 0
    async with AsyncPool(argv, workers=args.workers, codec=args.codec,
                         max_in_flight=args.in_flight,
                         startup_timeout=args.startup_timeout) as pool:
        # Warm-up: every worker answers once before the clock starts (a stream's first row).
        for _ in range(args.workers):
            if is_stream:
                async with pool.stream(method, request, timeout=args.timeout) as s:
                    async for _row in s:
                        break
            else:
                await pool.call(method, request, timeout=args.timeout)
        started = time.perf_counter()
        stop_at = started + args.duration
        remaining = [args.count] if args.count else None
        cut = 0

        async def one_caller() -> None:
            nonlocal rows, cut
            while True:
                if remaining is not None:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                elif time.perf_counter() >= stop_at:
                    return
                t0 = time.perf_counter()
                if is_stream:
                    async with pool.stream(method, request, timeout=args.timeout) as s:
                        async for _batch in s.batches():
                            rows += len(_batch)
                            # --duration bounds the run: a stream still going is cut there
                            # (cancelled on leaving the block), its rows counted, not its time.
                            if remaining is None and time.perf_counter() >= stop_at:
                                cut += 1
                                return
                else:
                    await pool.call(method, request, timeout=args.timeout)
                latencies.append(time.perf_counter() - t0)

        concurrency = args.concurrency or args.workers * args.in_flight
        await asyncio.gather(*(one_caller() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    report: dict[str, Any] = {
        "method": method, "kind": "stream" if is_stream else "unary", "workers": args.workers,
        "in_flight": args.in_flight, "concurrency": concurrency, "codec": args.codec,
        "calls": len(latencies), "seconds": elapsed,
        "calls_per_s": len(latencies) / elapsed if elapsed > 0 else 0.0,
        "p50_ms": _percentile(latencies, 0.50) * 1e3, "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "max_ms": (latencies[-1] * 1e3) if latencies else math.nan,
    }
    if is_stream:
        report["rows"] = rows
        report["rows_per_s"] = rows / elapsed if elapsed > 0 else 0.0
        report["streams_cut"] = cut
    return report


def _run_bench(args: argparse.Namespace, argv: list[str], method: str, request: Any) -> int:
    # The method's kind decides what to run; the HELLO says it (one extra short-lived worker).
    kinds = {m["name"]: m["kind"] for m in describe_worker(argv, args.startup_timeout).methods}
    if method not in kinds:
        raise WirepoolError(ErrorCode.UNKNOWN_METHOD, f"the worker offers no method {method!r} "
                            f"(it offers: {', '.join(sorted(kinds)) or 'none'})")
    r = asyncio.run(_bench(args, argv, method, request, kinds[method] == "stream"))
    if args.json:
        sys.stdout.write(json.dumps(r) + "\n")
        return EXIT_OK
    what = (f"{r['calls']:,} streams (+{r['streams_cut']:,} cut at --duration), {r['rows']:,} rows"
            if r["kind"] == "stream" else f"{r['calls']:,} calls")
    rate = (f"{_rate(r['rows_per_s'])} rows/s, {_rate(r['calls_per_s'])} streams/s"
            if r["kind"] == "stream" else f"{_rate(r['calls_per_s'])} calls/s")
    sys.stdout.write(f"{method}: {what} in {r['seconds']:.2f} s: {rate}\n"
                     f"latency p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
                     f"max {r['max_ms']:.3f} ms ({r['workers']} worker(s), "
                     f"{r['concurrency']} concurrent, codec {r['codec']})\n")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {text}")
    return value


_USAGES = {
    "describe": "wirepool describe [--json] -- CMD [ARGS...]",
    "call": "wirepool call [options] -- CMD [ARGS...] METHOD JSON",
    "stream": "wirepool stream [options] -- CMD [ARGS...] METHOD JSON",
    "bench": "wirepool bench [options] -- CMD [ARGS...] METHOD JSON",
    "top": "wirepool top URL [--interval S] [--once]",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wirepool", description="Talk to any wirepool worker from the command line.",
        epilog="The worker's command follows --; call, stream and bench end it with METHOD "
               "and JSON (- reads the JSON from stdin). Exit codes: 0 ok, 1 the call failed "
               "(CODE NAME: message on stderr), 2 usage.")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also show the worker's stdout and the pool's INFO logs on stderr")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--startup-timeout", type=_positive_float, default=10.0, metavar="S",
                        help="seconds the worker has to send its HELLO (default 10)")

    def calling(sp: argparse.ArgumentParser) -> None:
        common(sp)
        sp.add_argument("--codec", default="json", choices=sorted(_codecs.available()),
                        help="codec of the request and result (default json)")
        sp.add_argument("--timeout", type=_positive_float, default=None, metavar="S",
                        help="deadline of each call, sent to the worker (default none)")

    d = sub.add_parser("describe", help="print the worker's HELLO: methods, kinds, codecs, limits",
                       usage=_USAGES["describe"])
    common(d)
    d.add_argument("--json", action="store_true", help="print one JSON object")
    c = sub.add_parser("call", help="call a unary method, print its result as JSON",
                       usage=_USAGES["call"])
    calling(c)
    s = sub.add_parser("stream", help="run a stream method, print its rows as NDJSON",
                       usage=_USAGES["stream"])
    calling(s)
    s.add_argument("--no-progress", action="store_true",
                   help="no progress line (shown only when stderr is a terminal)")
    b = sub.add_parser("bench", help="call a method repeatedly: calls/s or rows/s, p50/p99",
                       usage=_USAGES["bench"])
    calling(b)
    b.add_argument("--workers", type=_positive_int, default=1, help="worker processes (default 1)")
    b.add_argument("--in-flight", type=_positive_int, default=16, metavar="N",
                   help="requests in flight per worker (default 16)")
    b.add_argument("--concurrency", type=_positive_int, default=None, metavar="N",
                   help="concurrent callers (default workers x in-flight)")
    b.add_argument("--duration", type=_positive_float, default=3.0, metavar="S",
                   help="seconds to run (default 3)")
    b.add_argument("--count", type=_positive_int, default=None, metavar="N",
                   help="run exactly N calls or streams instead of --duration")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    _top.add_parser(sub)
    return p


def _split(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace,
                                                                       list[str]]:
    """Options before ``--``, the worker's command (and METHOD JSON) after it."""
    if "--" not in argv:
        args, unmarked = parser.parse_known_args(argv)
        if args.command == "top":  # reads a metrics endpoint: no worker command
            return parser.parse_args(argv), []
        # --help, or an error naming what is missing; then the hint, with what came unmarked.
        came = f" (got {' '.join(unmarked)!r} without it)" if unmarked else ""
        parser.error(f"the worker's command must follow --{came}; usage: "
                     f"{_USAGES[args.command]}")
    cut = argv.index("--")
    return parser.parse_args(argv[:cut]), argv[cut + 1:]


def _request(text: str) -> Any:
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _Usage(f"the request is not JSON ({e}): {text[:80]!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = _parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args, rest = _split(parser, raw)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        stream=sys.stderr, format="%(name)s: %(message)s")
    try:
        if args.command == "top":
            return _top.run(args)
        if args.command == "describe":
            if not rest:
                raise _Usage("describe needs the worker's command after --")
            d = describe_worker(rest, args.startup_timeout)
            if args.json:
                sys.stdout.write(json.dumps(d.as_json()) + "\n")
            else:
                _print_description(d, sys.stdout)
            return EXIT_OK
        if len(rest) < 3:
            raise _Usage(f"{args.command} needs: -- CMD [ARGS...] METHOD JSON")
        worker, method, request = rest[:-2], rest[-2], _request(rest[-1])
        if args.codec == "raw" and isinstance(request, str):
            request = request.encode()  # raw carries bytes: a JSON string is sent as its UTF-8
        run = {"call": _run_call, "stream": _run_stream, "bench": _run_bench}[args.command]
        return run(args, worker, method, request)
    except _Usage as e:
        parser.error(str(e))
    except WirepoolError as e:
        sys.stdout.flush()
        sys.stderr.write(f"{e.code} {e.name}: {e.message}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly; the stream was cancelled on the way out.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    return EXIT_OK  # not reached: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
