"""``wirepool top URL``: a live terminal view of a running pool, read from its metrics endpoint.

Any parent SDK's exporter serves the same series (spec/metrics.json, PROTOCOL.md section 23), so
one view reads a Rust, Python or Node pool alike. Every ``--interval`` seconds the endpoint is
scraped (Prometheus text format 0.0.4); rates and latency quantiles come from the difference
between the last two scrapes. Per pool: a header (workers alive/configured, calls/s, streams/s,
errors/s, restarts, recycles, retries, p50/p99 over all methods), one line per method (requests/s,
p50, p99) and one row per worker (slot, pid, state, in flight, requests/s, rows/s, RSS, heartbeat
round trip, restarts where the SDK counts them per slot).

The pieces are importable for tests and scripts: :func:`scrape` (fetch and parse, bounded, raising
:class:`ScrapeError`), :func:`parse_text`, :func:`build_views` and :func:`render`.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, TextIO

__all__ = ["ScrapeError", "Scrape", "PoolView", "WorkerView", "MethodView", "scrape",
           "parse_text", "check_url", "build_views", "render", "quantile", "add_parser", "run"]

MAX_BODY_BYTES = 16 * 1024 * 1024  # a pool of 1,000 workers and 100 methods is ~3 MB
MAX_LINE_BYTES = 64 * 1024
MAX_SAMPLES = 500_000
MAX_LABELS = 32
DEFAULT_TIMEOUT_S = 5.0

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

LabelSet = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


class ScrapeError(Exception):
    """A scrape that failed. ``code`` is stable: ``SCRAPE_URL`` (not an http(s) URL),
    ``SCRAPE_CONNECT`` (refused, unreachable, reset), ``SCRAPE_TIMEOUT``, ``SCRAPE_HTTP`` (a status
    other than 200), ``SCRAPE_TOO_LARGE`` (body or line above the bounds) or ``SCRAPE_PARSE``
    (not the Prometheus text format); ``message`` says what happened."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Scrape:
    """One parsed scrape: every sample's value by name and label set, and when it was taken
    (``time.monotonic()``)."""

    at: float
    samples: Mapping[str, Mapping[LabelSet, float]]

    def series(self, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        """The samples of ``name`` whose labels include ``match``, as (labels, value)."""
        out = []
        for labels, value in self.samples.get(name, {}).items():
            d = dict(labels)
            if all(d.get(k) == v for k, v in match.items()):
                out.append((d, value))
        return out

    def total(self, name: str, **match: str) -> float | None:
        """The sum of ``name``'s matching samples; None when there is none."""
        values = [v for _, v in self.series(name, **match)]
        return math.fsum(values) if values else None


# ---------------------------------------------------------------------------------------------
# Fetching and parsing
# ---------------------------------------------------------------------------------------------


def check_url(url: str) -> None:
    """Raise :class:`ScrapeError` ``SCRAPE_URL`` unless ``url`` is an http(s) URL with a host."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as e:
        raise ScrapeError("SCRAPE_URL", f"not a URL: {url!r} ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ScrapeError("SCRAPE_URL", f"not an http(s) URL: {url!r}")


def fetch(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """GET ``url``: its body as text, at most :data:`MAX_BODY_BYTES` (raises :class:`ScrapeError`)."""
    check_url(url)
    request = urllib.request.Request(url, headers={"Accept": "text/plain; version=0.0.4",
                                                   "User-Agent": "wirepool-top"})
    try:
        # Direct, as Prometheus scrapes: an http_proxy meant for the web must not carry it.
        with _OPENER.open(request, timeout=timeout) as resp:
            body = resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise ScrapeError("SCRAPE_HTTP", f"{url} answered {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError):
            raise ScrapeError("SCRAPE_TIMEOUT", f"{url}: no answer within {timeout} s") from None
        raise ScrapeError("SCRAPE_CONNECT", f"{url}: {getattr(reason, 'strerror', None) or reason}"
                          ) from None
    except TimeoutError:
        raise ScrapeError("SCRAPE_TIMEOUT", f"{url}: no answer within {timeout} s") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # a reset, a bad response
        raise ScrapeError("SCRAPE_CONNECT", f"{url}: {e}") from None
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError("SCRAPE_TOO_LARGE", f"{url}: body above {MAX_BODY_BYTES:,} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScrapeError("SCRAPE_PARSE", f"{url}: body is not UTF-8 ({e})") from None


def scrape(url: str, timeout: float = DEFAULT_TIMEOUT_S, parser: str = "auto") -> Scrape:
    """Fetch and parse ``url`` (see :func:`parse_text` for ``parser``)."""
    text = fetch(url, timeout)
    return Scrape(time.monotonic(), parse_text(text, parser))


def parse_text(text: str, parser: str = "auto") -> dict[str, dict[LabelSet, float]]:
    """Parse the Prometheus text format: ``{sample name: {sorted labels: value}}``.

    ``parser`` is ``"prometheus_client"`` (its reference parser), ``"builtin"`` (the bounded one
    below) or ``"auto"`` (the first when installed). Raises :class:`ScrapeError`
    (``SCRAPE_PARSE``, ``SCRAPE_TOO_LARGE``)."""
    if len(text) > MAX_BODY_BYTES:
        raise ScrapeError("SCRAPE_TOO_LARGE", f"body above {MAX_BODY_BYTES:,} bytes")
    for number, line in enumerate(text.split("\n"), 1):
        if len(line) > MAX_LINE_BYTES:
            raise ScrapeError("SCRAPE_TOO_LARGE", f"line {number} above {MAX_LINE_BYTES:,} bytes")
    if parser == "auto":
        try:
            import prometheus_client.parser  # noqa: F401
            parser = "prometheus_client"
        except ImportError:
            parser = "builtin"
    if parser == "builtin":
        return _parse_builtin(text)
    if parser != "prometheus_client":
        raise ValueError(f"parser must be auto, builtin or prometheus_client, not {parser!r}")
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, dict[LabelSet, float]] = {}
    count = 0
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                count += 1
                if count > MAX_SAMPLES:
                    raise ScrapeError("SCRAPE_TOO_LARGE", f"more than {MAX_SAMPLES:,} samples")
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = float(s.value)
    except ScrapeError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ScrapeError("SCRAPE_PARSE", f"not the Prometheus text format: {e}") from None
    return out


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_builtin(text: str) -> dict[str, dict[LabelSet, float]]:
    out: dict[str, dict[LabelSet, float]] = {}
    count = 0
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            name, labels, rest = _sample_line(line)
            fields = rest.split()
            if not 1 <= len(fields) <= 2:
                raise ValueError("expected a value and an optional timestamp")
            value = float(fields[0])  # accepts NaN, +Inf, -Inf as the format spells them
            if len(fields) == 2:
                int(fields[1])
        except ValueError as e:
            raise ScrapeError("SCRAPE_PARSE", f"line {number}: {e}: {line[:120]!r}") from None
        count += 1
        if count > MAX_SAMPLES:
            raise ScrapeError("SCRAPE_TOO_LARGE", f"more than {MAX_SAMPLES:,} samples")
        out.setdefault(name, {})[tuple(sorted(labels.items()))] = value
    return out


def _is_name(s: str, colon: bool) -> bool:
    if not s or not (s[0].isascii() and (s[0].isalpha() or s[0] == "_" or (colon and s[0] == ":"))):
        return False
    return all(c.isascii() and (c.isalnum() or c == "_" or (colon and c == ":")) for c in s)


def _sample_line(line: str) -> tuple[str, dict[str, str], str]:
    """``name{a="b",...} rest`` split into its name, labels and the rest (raises ValueError)."""
    end = 0
    while end < len(line) and line[end] not in "{ \t":
        end += 1
    name = line[:end]
    if not _is_name(name, colon=True):
        raise ValueError(f"bad metric name {name!r}")
    labels: dict[str, str] = {}
    i = end
    if i < len(line) and line[i] == "{":
        i += 1
        while True:
            while i < len(line) and line[i] in " \t":
                i += 1
            if i < len(line) and line[i] == "}":
                i += 1
                break
            eq = line.find("=", i)
            if eq < 0:
                raise ValueError("a label without =")
            label = line[i:eq].strip()
            if not _is_name(label, colon=False):
                raise ValueError(f"bad label name {label!r}")
            if eq + 1 >= len(line) or line[eq + 1] != '"':
                raise ValueError(f"label {label} has no quoted value")
            j, chars = eq + 2, []
            while True:
                if j >= len(line):
                    raise ValueError(f"label {label}'s value is not closed")
                c = line[j]
                if c == "\\":
                    if j + 1 >= len(line) or line[j + 1] not in _ESCAPES:
                        raise ValueError(f"bad escape in label {label}")
                    chars.append(_ESCAPES[line[j + 1]])
                    j += 2
                    continue
                if c == '"':
                    break
                chars.append(c)
                j += 1
            if label in labels:
                raise ValueError(f"label {label} twice")
            labels[label] = "".join(chars)
            if len(labels) > MAX_LABELS:
                raise ValueError(f"more than {MAX_LABELS} labels")
            i = j + 1
            while i < len(line) and line[i] in " \t":
                i += 1
            if i < len(line) and line[i] == ",":
                i += 1
            elif i < len(line) and line[i] == "}":
                i += 1
                break
            else:
                raise ValueError("expected , or } after a label")
    return name, labels, line[i:]


# ---------------------------------------------------------------------------------------------
# Rates and quantiles between two scrapes
# ---------------------------------------------------------------------------------------------


def _rate(cur: Scrape, prev: Scrape | None, name: str, **match: str) -> float | None:
    """A counter's increase per second between the scrapes (a family with no sample yet, such
    as errors by code before the first error, counts 0); None without a previous scrape. A
    counter that went down was reset (a restarted process): it counts from 0."""
    if prev is None or cur.at <= prev.at:
        return None
    now, before = cur.total(name, **match) or 0.0, prev.total(name, **match) or 0.0
    return (now - before if now >= before else now) / (cur.at - prev.at)


def _buckets(s: Scrape, name: str, **match: str) -> dict[float, float]:
    """Cumulative bucket counts by upper bound, summed over the matching label sets."""
    out: dict[float, float] = {}
    for labels, value in s.series(name + "_bucket", **match):
        try:
            le = float(labels["le"])
        except (KeyError, ValueError):
            continue
        out[le] = out.get(le, 0.0) + value
    return out


def bucket_deltas(cur: Scrape, prev: Scrape | None, name: str,
                  **match: str) -> list[tuple[float, float]]:
    """The histogram's cumulative (upper bound, count) observed between the two scrapes, sorted
    by bound (every bucket, +Inf last); since the process started when there is no ``prev``.
    A reset (any bucket went down) counts from zero."""
    now = _buckets(cur, name, **match)
    before = _buckets(prev, name, **match) if prev is not None else {}
    if any(now.get(le, 0.0) < v for le, v in before.items()):
        before = {}
    return sorted((le, v - before.get(le, 0.0)) for le, v in now.items())


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of cumulative ``(upper bound, count)`` buckets, interpolated linearly
    within the bucket where it falls (from its lower bound, 0 for the first), as Prometheus'
    ``histogram_quantile`` does. Never above the upper bound of the highest bucket holding an
    observation; in the ``+Inf`` bucket, the highest finite bound. None with no observation."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], not {q}")
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    total = bs[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in bs:
        count = max(count, below)  # cumulative counts never go down (a torn scrape might)
        if count >= rank and count > below:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / (count - below)
        below = count
        if not math.isinf(le):
            lower = le
    return lower


# ---------------------------------------------------------------------------------------------
# Views
# ---------------------------------------------------------------------------------------------


@dataclass
class WorkerView:
    slot: str
    pid: int | None
    state: str
    in_flight: float | None
    requests_per_s: float | None
    rows_per_s: float | None
    rss_bytes: float | None
    heartbeat_rtt_s: float | None
    restarts: float | None  # only where the SDK exports the optional per-slot counter


@dataclass
class MethodView:
    name: str
    per_s: float | None
    p50_s: float | None
    p99_s: float | None


@dataclass
class PoolView:
    name: str
    workers: float | None
    alive: float | None
    calls_per_s: float | None
    streams_per_s: float | None
    errors_per_s: float | None
    restarts: float | None
    recycles: float | None
    retries: float | None
    p50_s: float | None
    p99_s: float | None
    methods: list[MethodView] = field(default_factory=list)
    rows: list[WorkerView] = field(default_factory=list)


def _slot_key(slot: str) -> tuple[int, str]:
    return (int(slot), "") if slot.isdigit() else (1 << 62, slot)


def build_views(cur: Scrape, prev: Scrape | None) -> list[PoolView]:
    """Every pool of ``cur`` (rates from ``prev``, None where they cannot be known yet)."""
    pools = sorted({d.get("pool", "") for name in ("wirepool_workers", "wirepool_worker_state",
                                                   "wirepool_calls_total")
                    for d, _ in cur.series(name)})
    views = []
    for pool in pools:
        hist = "wirepool_method_duration_seconds"
        allb = bucket_deltas(cur, prev, hist, pool=pool) if prev is not None else []
        methods = []
        for m in sorted({d.get("method", "") for d, _ in cur.series(hist + "_count", pool=pool)}):
            b = bucket_deltas(cur, prev, hist, pool=pool, method=m) if prev is not None else []
            methods.append(MethodView(m, _rate(cur, prev, hist + "_count", pool=pool, method=m),
                                      quantile(0.5, b), quantile(0.99, b)))
        states: dict[str, str] = {}
        for d, v in cur.series("wirepool_worker_state", pool=pool):
            states.setdefault(d.get("worker", "?"), "?")
            if v == 1:
                states[d.get("worker", "?")] = d.get("state", "?")
        slots = set(states) | {d.get("worker", "?") for d, _ in
                               cur.series("wirepool_worker_pid", pool=pool)}
        rows = []
        for slot in sorted(slots, key=_slot_key):
            pid = cur.total("wirepool_worker_pid", pool=pool, worker=slot)
            rows.append(WorkerView(
                slot=slot, pid=int(pid) if pid is not None and math.isfinite(pid) else None,
                state=states.get(slot, "?"),
                in_flight=cur.total("wirepool_worker_in_flight", pool=pool, worker=slot),
                requests_per_s=_rate(cur, prev, "wirepool_worker_requests_total", pool=pool,
                                     worker=slot),
                rows_per_s=_rate(cur, prev, "wirepool_worker_rows_total", pool=pool, worker=slot),
                rss_bytes=cur.total("wirepool_worker_rss_bytes", pool=pool, worker=slot),
                heartbeat_rtt_s=cur.total("wirepool_worker_heartbeat_rtt_seconds", pool=pool,
                                          worker=slot),
                restarts=cur.total("wirepool_worker_restarts_total", pool=pool, worker=slot)))
        views.append(PoolView(
            name=pool, workers=cur.total("wirepool_workers", pool=pool),
            alive=cur.total("wirepool_workers_alive", pool=pool),
            calls_per_s=_rate(cur, prev, "wirepool_calls_total", pool=pool),
            streams_per_s=_rate(cur, prev, "wirepool_streams_total", pool=pool),
            errors_per_s=_rate(cur, prev, "wirepool_errors_total", pool=pool),
            restarts=cur.total("wirepool_restarts_total", pool=pool) or 0.0,
            recycles=cur.total("wirepool_recycles_total", pool=pool) or 0.0,
            retries=cur.total("wirepool_retries_total", pool=pool),
            p50_s=quantile(0.5, allb), p99_s=quantile(0.99, allb), methods=methods, rows=rows))
    return views


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def _num(v: float | None) -> str:
    """Three significant digits: 0, 12.3, 1.23 k, 45.6 M; "-" when unknown."""
    if v is None or math.isnan(v):
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return "0" if v == 0 else f"{v:.3g}"


def _seconds(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return "0" if v == 0 else f"{v * 1e6:.3g} us"


def _bytes(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"


_WORKER_COLUMNS = (("SLOT", 5), ("PID", 8), ("STATE", 9), ("IN FLIGHT", 10), ("REQ/S", 10),
                   ("ROWS/S", 10), ("RSS", 11), ("HB RTT", 10), ("RESTARTS", 8))


def render(views: Iterable[PoolView], *, title: str = "", error: str | None = None) -> list[str]:
    """The frame as lines of plain text (no colour, no escapes)."""
    lines = [title] if title else []
    if error:
        lines.append(f"scrape failed: {error} (retrying)")
    views = list(views)
    if not views and not error:
        lines.append("no wirepool pool in this scrape (no wirepool_workers series)")
    for v in views:
        alive = "-" if v.alive is None else f"{v.alive:.0f}"
        size = "-" if v.workers is None else f"{v.workers:.0f}"
        lines.append("")
        lines.append(f"pool {v.name}: workers {alive}/{size} alive  calls/s {_num(v.calls_per_s)}"
                     f"  streams/s {_num(v.streams_per_s)}  errors/s {_num(v.errors_per_s)}"
                     f"  restarts {_num(v.restarts)}  recycles {_num(v.recycles)}"
                     f"  retries {_num(v.retries)}  p50 {_seconds(v.p50_s)}"
                     f"  p99 {_seconds(v.p99_s)}")
        if v.methods:
            width = max(6, *(len(m.name) for m in v.methods))
            lines.append(f"  {'METHOD':<{width}}  {'REQ/S':>10}  {'P50':>10}  {'P99':>10}")
            for m in v.methods:
                lines.append(f"  {m.name:<{width}}  {_num(m.per_s):>10}  {_seconds(m.p50_s):>10}"
                             f"  {_seconds(m.p99_s):>10}")
        lines.append("  " + "  ".join(f"{h:<{w}}" if i < 3 else f"{h:>{w}}"
                                      for i, (h, w) in enumerate(_WORKER_COLUMNS)).rstrip())
        for r in v.rows:
            cells = (r.slot, "-" if r.pid is None else str(r.pid), r.state, _num(r.in_flight),
                     _num(r.requests_per_s), _num(r.rows_per_s), _bytes(r.rss_bytes),
                     _seconds(r.heartbeat_rtt_s), _num(r.restarts))
            lines.append("  " + "  ".join(f"{c:<{w}}" if i < 3 else f"{c:>{w}}"
                                          for i, (c, (_h, w)) in
                                          enumerate(zip(cells, _WORKER_COLUMNS))).rstrip())
    return lines


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``top`` to the CLI's subparsers."""
    t: argparse.ArgumentParser = sub.add_parser(
        "top", help="a live view of a running pool, from its Prometheus metrics endpoint",
        usage="wirepool top URL [--interval S] [--once]",
        description="A live view of a running pool (any SDK's exporter): per pool workers, "
                    "calls/s, errors/s, restarts, p50/p99 per method; per worker pid, state, in "
                    "flight, requests/s, rows/s, RSS. q or Ctrl-C quits.")
    t.add_argument("url", metavar="URL", help="the exporter, e.g. http://127.0.0.1:9464/metrics")
    t.add_argument("--interval", type=_positive_float, default=1.0, metavar="S",
                   help="seconds between scrapes (default 1)")
    t.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds a scrape may take (default {DEFAULT_TIMEOUT_S:g})")
    t.add_argument("--once", action="store_true",
                   help="print one frame as plain text (two scrapes --interval apart) and exit")
    return t


def _title(url: str, interval: float) -> str:
    return (f"wirepool top  {url}  every {interval:g} s  {time.strftime('%H:%M:%S')}"
            "  (q quits)")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``wirepool top`` with parsed ``args``; returns the exit code (0, 1 a failed --once,
    2 a bad URL or no terminal, 130 interrupted)."""
    out = sys.stdout if out is None else out
    try:
        check_url(args.url)
    except ScrapeError as e:
        sys.stderr.write(f"wirepool top: {e}\n")
        return 2
    if args.once:
        try:
            first = scrape(args.url, args.timeout)
            time.sleep(args.interval)  # the rates' window, not a synchronisation
            second = scrape(args.url, args.timeout)
        except ScrapeError as e:
            sys.stderr.write(f"wirepool top: {e}\n")
            return 1
        except KeyboardInterrupt:
            return 130
        lines = render(build_views(second, first), title=f"wirepool top  {args.url}")
        out.write("\n".join(lines) + "\n")
        return 0
    if not (out.isatty() and sys.stdin.isatty()):
        sys.stderr.write("wirepool top: not a terminal; use --once for one frame as text\n")
        return 2
    import curses
    # The terminal's own size (ncurses asks it), not a LINES/COLUMNS some parent exported.
    os.environ.pop("LINES", None)
    os.environ.pop("COLUMNS", None)
    try:
        curses.wrapper(_live, args)
    except KeyboardInterrupt:
        pass  # curses.wrapper restored the terminal on the way out
    return 0


def _live(stdscr: Any, args: argparse.Namespace) -> None:
    import curses
    with contextlib.suppress(curses.error):
        curses.curs_set(0)
    prev: Scrape | None = None
    views: list[PoolView] = []
    error: str | None = None
    next_at = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= next_at:
            try:
                cur = scrape(args.url, args.timeout)
                views, error, prev = build_views(cur, prev), None, cur
            except ScrapeError as e:
                error = str(e)
            next_at = max(next_at + args.interval, time.monotonic())
            _draw(stdscr, render(views, title=_title(args.url, args.interval), error=error))
        # Wait for a key until the next scrape is due: getch returns at once on a key press.
        stdscr.timeout(max(1, int((next_at - time.monotonic()) * 1000)))
        key = stdscr.getch()
        if key in (ord("q"), ord("Q"), 27):
            return
        if key == curses.KEY_RESIZE:
            _draw(stdscr, render(views, title=_title(args.url, args.interval), error=error))


def _draw(stdscr: Any, lines: list[str]) -> None:
    import curses
    stdscr.erase()
    height, width = stdscr.getmaxyx()
    for y, line in enumerate(lines[:height]):
        with contextlib.suppress(curses.error):  # the bottom-right cell raises after writing
            stdscr.addnstr(y, 0, line, max(0, width - 1))
    stdscr.refresh()
