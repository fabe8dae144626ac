"""docs/grafana/wirepool.json, the Grafana dashboard, uses only the metrics contract's series.

Every PromQL expression of every panel (and of the template variables) is parsed by the small
PromQL parser below, and every series it reads is checked against spec/metrics.json: the name
exists (a histogram read through its ``_bucket``, ``_sum`` or ``_count`` samples), the function
fits the type (``rate``/``irate``/``increase`` only on a counter or a histogram's samples,
``histogram_quantile`` only on a histogram's ``_bucket``, a counter never shown raw), every label
in a matcher, a ``by (...)``/``without (...)``, an ``on (...)`` or a legend exists on the series
at that point of the expression, and no optional series is relied on. Every panel has a title and
a unit, and the dashboard shows every required series. The mutation tests at the end check that
the check fails on a renamed series, a series removed from the contract, and the other mistakes.

    python3 -m pytest spec/tests/test_dashboard.py -q
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Union

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_PATH = ROOT / "docs" / "grafana" / "wirepool.json"
CONTRACT_PATH = ROOT / "spec" / "metrics.json"

# Grafana unit ids a panel may use (a typo would render as a bare number).
KNOWN_UNITS = {"reqps", "cps", "ops", "Bps", "binBps", "s", "ms", "bytes", "short", "none",
               "percentunit"}
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")
RATE_FUNCTIONS = {"rate", "irate", "increase"}
GAUGE_RANGE_FUNCTIONS = {"avg_over_time", "min_over_time", "max_over_time", "last_over_time"}
AGGREGATIONS = {"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk",
                "bottomk", "quantile"}
PARAMETER_AGGREGATIONS = {"topk", "bottomk", "quantile"}
RANGE = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$|^\$__(rate_interval|interval|range)$")


# ---------------------------------------------------------------------------------------------
# A PromQL parser: the subset a dashboard uses, refusing anything else with a PromQLError
# ---------------------------------------------------------------------------------------------


class PromQLError(ValueError):
    """An expression this parser cannot read (a syntax error, or PromQL it does not know)."""


@dataclass
class Num:
    value: float


@dataclass
class Selector:
    name: str
    matchers: list[tuple[str, str, str]]  # (label, op, value)
    range: str | None = None


@dataclass
class Call:
    func: str
    args: list[Node]


@dataclass
class Agg:
    op: str
    grouping: str | None  # "by", "without" or None
    labels: list[str]
    args: list[Node]


@dataclass
class Binary:
    op: str
    lhs: Node
    rhs: Node
    matching: str | None = None  # "on", "ignoring" or None
    labels: list[str] = field(default_factory=list)


@dataclass
class Neg:
    expr: Node


Node = Union[Num, Selector, Call, Agg, Binary, Neg]

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<range>\[[^\]]*\])
  | (?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=(){},])
""", re.VERBOSE)
_PRECEDENCE = [{"or"}, {"and", "unless"}, {"==", "!=", "<=", ">=", "<", ">"}, {"+", "-"},
               {"*", "/", "%"}, {"^"}]
_MATCH_OPS = {"=", "!=", "=~", "!~"}


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise PromQLError(f"unexpected {text[pos:pos + 10]!r} at {pos} in {text!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "ws":
            tokens.append((kind, m.group()))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0

    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else ("eof", "")

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tk, tv = self.peek()
        if (value is not None and tv != value) or (kind is not None and tk != kind) or tk == "eof":
            want = value or kind
            raise PromQLError(f"expected {want!r}, got {tv or 'the end'!r} in {self.text!r}")
        self.i += 1
        return tv

    def parse(self) -> Node:
        node = self.binary(0)
        if self.peek()[0] != "eof":
            raise PromQLError(f"unexpected {self.peek()[1]!r} in {self.text!r}")
        return node

    def binary(self, level: int) -> Node:
        if level == len(_PRECEDENCE):
            return self.unary()
        lhs = self.binary(level + 1)
        while self.peek()[1] in _PRECEDENCE[level]:
            op = self.take()
            if self.peek()[1] == "bool":
                self.take()
            matching, labels = None, []
            if self.peek()[1] in ("on", "ignoring"):
                matching = self.take()
                labels = self.label_list()
            if self.peek()[1] in ("group_left", "group_right"):
                raise PromQLError(f"many-to-one matching is not checked by this test: {self.text!r}")
            # ^ is right-associative; the others are left-associative.
            rhs = self.binary(level if op == "^" else level + 1)
            lhs = Binary(op, lhs, rhs, matching, labels)
        return lhs

    def unary(self) -> Node:
        if self.peek()[1] in ("-", "+"):
            sign = self.take()
            inner = self.unary()
            return Neg(inner) if sign == "-" else inner
        return self.primary()

    def label_list(self) -> list[str]:
        self.take("(")
        labels: list[str] = []
        while self.peek()[1] != ")":
            labels.append(self.take(kind="ident"))
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        return labels

    def args(self) -> list[Node]:
        self.take("(")
        args: list[Node] = []
        while self.peek()[1] != ")":
            args.append(self.binary(0))
            if self.peek()[1] != ")":
                self.take(",")
        self.take(")")
        return args

    def primary(self) -> Node:
        kind, value = self.peek()
        if kind == "num":
            self.take()
            return Num(float(value))
        if value == "(":
            self.take("(")
            inner = self.binary(0)
            self.take(")")
            return inner
        if kind == "str":
            raise PromQLError(f"a string is not an expression here: {self.text!r}")
        if value == "{":
            raise PromQLError(f"a selector without a metric name: {self.text!r}")
        name = self.take(kind="ident")
        if name in AGGREGATIONS:
            grouping, labels = None, []
            if self.peek()[1] in ("by", "without"):
                grouping = self.take()
                labels = self.label_list()
            args = self.args()
            if grouping is None and self.peek()[1] in ("by", "without"):
                grouping = self.take()
                labels = self.label_list()
            return Agg(name, grouping, labels, args)
        if self.peek()[1] == "(":
            return Call(name, self.args())
        matchers: list[tuple[str, str, str]] = []
        if self.peek()[1] == "{":
            self.take("{")
            while self.peek()[1] != "}":
                label = self.take(kind="ident")
                op = self.take()
                if op not in _MATCH_OPS:
                    raise PromQLError(f"bad matcher operator {op!r} in {self.text!r}")
                matchers.append((label, op, json.loads(self._quoted(self.take(kind="str")))))
                if self.peek()[1] == ",":
                    self.take(",")
            self.take("}")
        selector = Selector(name, matchers)
        if self.peek()[0] == "range":
            text = self.take()[1:-1].strip()
            if not RANGE.match(text):
                raise PromQLError(f"bad range [{text}] in {self.text!r}")
            selector.range = text
        if self.peek()[1] == "offset":
            raise PromQLError(f"offset is not checked by this test: {self.text!r}")
        return selector

    @staticmethod
    def _quoted(s: str) -> str:
        return '"' + s[1:-1].replace('"', '\\"') + '"' if s[0] == "'" else s


def parse(text: str) -> Node:
    """Parse one PromQL expression (raises :class:`PromQLError`)."""
    return _Parser(text).parse()


# ---------------------------------------------------------------------------------------------
# The check: every selector, function and label against the contract
# ---------------------------------------------------------------------------------------------


@dataclass
class Checker:
    contract: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)  # contract series names read

    def series(self, name: str) -> tuple[dict[str, Any], str] | None:
        """The contract series a sample name reads, and which histogram part ("" if none)."""
        by_name = {s["name"]: s for s in self.contract["series"]}
        s = by_name.get(name)
        if s is not None and s["type"] != "histogram":
            return s, ""
        for part in HISTOGRAM_PARTS:
            base = name[: -len(part)]
            if name.endswith(part) and by_name.get(base, {}).get("type") == "histogram":
                return by_name[base], part
        return None

    def check(self, expr: str, where: str, *, panel: bool = True) -> set[str] | None:
        """Check one expression; returns its output labels (None for a scalar or on error)."""
        try:
            node = parse(expr)
        except PromQLError as e:
            self.problems.append(f"{where}: {e}")
            return None
        return self.visit(node, where, panel, None)

    def visit(self, node: Node, where: str, panel: bool, func: str | None) -> set[str] | None:
        if isinstance(node, Num):
            return None
        if isinstance(node, Neg):
            return self.visit(node.expr, where, panel, None)
        if isinstance(node, Selector):
            return self.selector(node, where, panel, func)
        if isinstance(node, Call):
            return self.call(node, where, panel)
        if isinstance(node, Agg):
            args = node.args
            if node.op in PARAMETER_AGGREGATIONS:
                if len(args) != 2 or not isinstance(args[0], Num):
                    self.problems.append(f"{where}: {node.op} takes a number and a vector")
                    return None
                args = args[1:]
            if len(args) != 1:
                self.problems.append(f"{where}: {node.op} takes one vector")
                return None
            inner = self.visit(args[0], where, panel, None)
            if inner is None:
                return None
            missing = [x for x in node.labels if x not in inner]
            if missing:
                self.problems.append(f"{where}: {node.op} {node.grouping} ({', '.join(missing)}):"
                                     f" not a label of its argument (it has {sorted(inner)})")
            if node.grouping == "by":
                return set(node.labels)
            if node.grouping == "without":
                return inner - set(node.labels)
            return set()
        # Binary
        lhs = self.visit(node.lhs, where, panel, None)
        rhs = self.visit(node.rhs, where, panel, None)
        if lhs is None or rhs is None:
            return lhs if rhs is None else rhs
        if node.matching == "on":
            missing = [x for x in node.labels if x not in lhs or x not in rhs]
            if missing:
                self.problems.append(f"{where}: on ({', '.join(missing)}): not on both sides")
        else:
            ignored = set(node.labels) if node.matching == "ignoring" else set()
            if node.op not in ("and", "or", "unless") and lhs - ignored != rhs - ignored:
                self.problems.append(f"{where}: {node.op} between vectors with labels "
                                     f"{sorted(lhs)} and {sorted(rhs)}: no sample would match")
        return lhs

    def call(self, node: Call, where: str, panel: bool) -> set[str] | None:
        if node.func in RATE_FUNCTIONS or node.func in GAUGE_RANGE_FUNCTIONS:
            arg = node.args[0] if len(node.args) == 1 else None
            if not isinstance(arg, Selector) or arg.range is None:
                self.problems.append(f"{where}: {node.func}() takes one range selector "
                                     "(metric{...}[range])")
                return None
            return self.visit(arg, where, panel, node.func)
        if node.func == "histogram_quantile":
            if len(node.args) != 2 or not isinstance(node.args[0], Num):
                self.problems.append(f"{where}: histogram_quantile takes a number and a vector")
                return None
            q = node.args[0].value
            if not 0 <= q <= 1:
                self.problems.append(f"{where}: histogram_quantile({q}): not in [0, 1]")
            for sel in _selectors(node.args[1]):
                found = self.series(sel.name)
                if found is not None and found[1] != "_bucket":
                    self.problems.append(f"{where}: histogram_quantile over {sel.name}: only the "
                                         "_bucket samples of a histogram have quantiles")
            inner = self.visit(node.args[1], where, panel, None)
            if inner is None:
                return None
            if "le" not in inner:
                self.problems.append(f"{where}: histogram_quantile over a vector without le "
                                     f"(labels {sorted(inner)}): keep le in the by (...)")
            return inner - {"le"}
        self.problems.append(f"{where}: function {node.func}() is not known to this test")
        return None

    def selector(self, sel: Selector, where: str, panel: bool, func: str | None) -> set[str] | None:
        found = self.series(sel.name)
        if found is None:
            self.problems.append(f"{where}: {sel.name} is not a series of spec/metrics.json")
            return None
        s, part = found
        self.used.add(s["name"])
        if not s["required"]:
            self.problems.append(f"{where}: {s['name']} is optional in the contract; a dashboard "
                                 "must not depend on it")
        labels = set(s["labels"]) | ({"le"} if part == "_bucket" else set())
        for label, _op, _value in sel.matchers:
            if label not in labels:
                self.problems.append(f"{where}: {sel.name} has no label {label!r} "
                                     f"(it has {sorted(labels)})")
        if panel:
            # Every panel follows the dashboard's pool and worker variables.
            for label, var in (("pool", "$pool"), ("worker", "$worker")):
                if label in s["labels"] and (label, "=~", var) not in sel.matchers:
                    self.problems.append(f"{where}: {sel.name} is not filtered by "
                                         f'{label}=~"{var}"')
        counter_like = s["type"] == "counter" or (s["type"] == "histogram" and part)
        if func in RATE_FUNCTIONS and not counter_like:
            self.problems.append(f"{where}: {func}() of {sel.name}, a {s['type']}: rate and "
                                 "increase apply to counters and histogram samples only")
        elif func in GAUGE_RANGE_FUNCTIONS and s["type"] != "gauge":
            self.problems.append(f"{where}: {func}() of {sel.name}, a {s['type']}")
        elif func is None and counter_like:
            self.problems.append(f"{where}: {sel.name} is a counter: show its rate() or "
                                 "increase(), not its raw value")
        if func is None and sel.range is not None:
            self.problems.append(f"{where}: a range selector {sel.name}[{sel.range}] outside "
                                 "a range function")
        return labels


def _selectors(node: Node) -> Iterator[Selector]:
    if isinstance(node, Selector):
        yield node
    elif isinstance(node, Neg):
        yield from _selectors(node.expr)
    elif isinstance(node, (Call, Agg)):
        for a in node.args:
            yield from _selectors(a)
    elif isinstance(node, Binary):
        yield from _selectors(node.lhs)
        yield from _selectors(node.rhs)


_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<sel>.+),\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*$")
_LEGEND = re.compile(r"\{\{\s*([^}\s]+)\s*\}\}")


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])  # a collapsed row keeps its panels inside


def problems(dashboard: dict[str, Any], contract: dict[str, Any]) -> list[str]:
    """Everything wrong with ``dashboard`` against ``contract`` (empty when it is right)."""
    c = Checker(contract)
    out = c.problems
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        out.append("templating: no Prometheus datasource variable named datasource")
    for name in ("pool", "worker"):
        v = variables.get(name)
        if not v or v.get("type") != "query":
            out.append(f"templating: no query variable {name}")
            continue
        q = v.get("query")
        text = q.get("query", "") if isinstance(q, dict) else str(q)
        m = _LABEL_VALUES.match(text)
        if m is None or m["label"] != name:
            out.append(f"templating: variable {name} is not label_values(<series>, {name}): "
                       f"{text!r}")
            continue
        labels = c.check(m["sel"], f"variable {name}", panel=False)
        if labels is not None and name not in labels:
            out.append(f"variable {name}: {m['sel']} has no label {name}")
    ids = [p.get("id") for p in _panels(dashboard)]
    if len(ids) != len(set(ids)):
        out.append(f"panel ids are not unique: {ids}")
    for p in _panels(dashboard):
        title = p.get("title", "")
        where = f"panel {title or p.get('id')!r}"
        if not isinstance(title, str) or not title.strip():
            out.append(f"panel id {p.get('id')}: no title")
        if p.get("type") == "row":
            if p.get("targets"):
                out.append(f"{where}: a row has no queries")
            continue
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in KNOWN_UNITS:
            out.append(f"{where}: unit {unit!r} is not one of {sorted(KNOWN_UNITS)}")
        targets = p.get("targets") or []
        if not targets:
            out.append(f"{where}: no queries")
        for t in [p] + targets:
            if t.get("datasource", {}).get("uid") != "${datasource}":
                out.append(f"{where}: datasource is not the ${{datasource}} variable")
        for t in targets:
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                out.append(f"{where} {t.get('refId')}: no expression")
                continue
            labels = c.check(expr, f"{where} {t.get('refId')}")
            for label in _LEGEND.findall(t.get("legendFormat", "")):
                if labels is not None and label not in labels:
                    out.append(f"{where} {t.get('refId')}: legend {{{{{label}}}}} is not a label "
                               f"of the result (it has {sorted(labels)})")
    unshown = [s["name"] for s in contract["series"] if s["required"] and s["name"] not in c.used]
    if unshown:
        out.append(f"required series not shown by any panel: {unshown}")
    return out


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


DASHBOARD = load(DASHBOARD_PATH)
CONTRACT = load(CONTRACT_PATH)


# ---------------------------------------------------------------------------------------------
# The dashboard as committed
# ---------------------------------------------------------------------------------------------


def test_dashboard_fits_the_contract() -> None:
    assert problems(DASHBOARD, CONTRACT) == []


def test_dashboard_is_a_current_grafana_model() -> None:
    assert DASHBOARD["schemaVersion"] >= 36
    assert DASHBOARD["uid"] == "wirepool" and DASHBOARD["title"]
    assert DASHBOARD.get("id") is None  # importable: Grafana assigns the id
    assert "__inputs" not in DASHBOARD  # the datasource is a variable, chosen after import
    for p in _panels(DASHBOARD):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]


def test_every_expression_is_parsed_and_reads_series() -> None:
    exprs = [t["expr"] for p in _panels(DASHBOARD) for t in p.get("targets", [])]
    assert len(exprs) >= 20
    for e in exprs:
        assert list(_selectors(parse(e))), e


@pytest.mark.parametrize("title", ["Calls / s", "Streams / s", "Rows / s", "Bytes / s",
                                   "Latency p50 by method", "Latency p99 by method",
                                   "Queue wait", "Errors / s by code", "Restarts by cause",
                                   "Recycles by reason", "Retries / s",
                                   "Workers alive vs configured", "In flight per worker",
                                   "RSS per worker", "Heartbeat RTT per worker", "Workers now"])
def test_the_panels_issue_28_asks_for(title: str) -> None:
    assert title in {p["title"] for p in _panels(DASHBOARD)}


def test_latency_quantiles_are_per_method_over_buckets() -> None:
    [p50] = [p for p in _panels(DASHBOARD) if p["title"] == "Latency p50 by method"]
    node = parse(p50["targets"][0]["expr"])
    assert isinstance(node, Call) and node.func == "histogram_quantile"
    assert isinstance(node.args[0], Num) and node.args[0].value == 0.5
    agg = node.args[1]
    assert isinstance(agg, Agg) and {"method", "le"} <= set(agg.labels)
    [sel] = _selectors(agg)
    assert sel.name == "wirepool_method_duration_seconds_bucket"


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------


def test_parser_reads_the_shapes_used() -> None:
    node = parse('sum by (pool) (rate(a_total{pool=~"$pool", x!="y"}[$__rate_interval])) '
                 '/ on (pool) sum(b) without (le) ^ 2 == bool 1')
    assert isinstance(node, Binary) and node.op == "=="
    div = node.lhs
    assert isinstance(div, Binary) and div.op == "/" and div.matching == "on"
    assert isinstance(div.rhs, Binary) and div.rhs.op == "^"  # ^ binds tighter than /
    agg = div.lhs
    assert isinstance(agg, Agg) and agg.grouping == "by" and agg.labels == ["pool"]
    sel = agg.args[0].args[0]  # type: ignore[union-attr]
    assert sel == Selector("a_total", [("pool", "=~", "$pool"), ("x", "!=", "y")],
                           "$__rate_interval")
    assert parse("-x[5m]") == Neg(Selector("x", [], "5m"))


@pytest.mark.parametrize("bad", ["sum(rate(x[5m])", "x{a=}", "x{a~\"b\"}", "x[5 apples]",
                                 "rate(x[5m]) +", "{a=\"b\"}", "x offset 5m", "1 $ 2",
                                 "a * on (x) group_left b"])
def test_parser_refuses_what_it_cannot_read(bad: str) -> None:
    with pytest.raises(PromQLError):
        parse(bad)


# ---------------------------------------------------------------------------------------------
# The check fails on a modified copy
# ---------------------------------------------------------------------------------------------


def _edit_expr(title: str, old: str, new: str) -> Callable[[dict, dict], None]:
    def edit(d: dict, _c: dict) -> None:
        hits = 0
        for p in _panels(d):
            if p["title"] == title:
                for t in p["targets"]:
                    if old in t["expr"]:
                        t["expr"] = t["expr"].replace(old, new)
                        hits += 1
        assert hits, f"the mutation matched nothing: {title} {old}"
    return edit


def _drop_series(name: str) -> Callable[[dict, dict], None]:
    def edit(_d: dict, c: dict) -> None:
        before = len(c["series"])
        c["series"] = [s for s in c["series"] if s["name"] != name]
        assert len(c["series"]) == before - 1
    return edit


def _drop_label(name: str, label: str) -> Callable[[dict, dict], None]:
    def edit(_d: dict, c: dict) -> None:
        [s] = [s for s in c["series"] if s["name"] == name]
        s["labels"].remove(label)
    return edit


def _make_optional(name: str) -> Callable[[dict, dict], None]:
    def edit(_d: dict, c: dict) -> None:
        [s] = [s for s in c["series"] if s["name"] == name]
        s["required"] = False
    return edit


def _panel_field(title: str, edit_panel: Callable[[dict], None]) -> Callable[[dict, dict], None]:
    def edit(d: dict, _c: dict) -> None:
        [p] = [p for p in _panels(d) if p["title"] == title]
        edit_panel(p)
    return edit


def _no_unit(p: dict) -> None:
    del p["fieldConfig"]["defaults"]["unit"]


def _no_title(p: dict) -> None:
    p["title"] = ""


def _legend(p: dict) -> None:
    p["targets"][0]["legendFormat"] = "{{pool}} {{method}}"


def _swap_datasource(p: dict) -> None:
    p["datasource"] = {"type": "prometheus", "uid": "prometheus"}


MUTATIONS: dict[str, tuple[Callable[[dict, dict], None], str]] = {
    "series renamed in the dashboard": (
        _edit_expr("RSS per worker", "wirepool_worker_rss_bytes", "wirepool_worker_rss"),
        "wirepool_worker_rss is not a series"),
    "counter renamed without _total": (
        _edit_expr("Calls / s", "wirepool_calls_total", "wirepool_calls"),
        "wirepool_calls is not a series"),
    "series removed from the contract": (
        _drop_series("wirepool_worker_heartbeat_rtt_seconds"),
        "wirepool_worker_heartbeat_rtt_seconds is not a series"),
    "histogram removed from the contract": (
        _drop_series("wirepool_method_duration_seconds"),
        "wirepool_method_duration_seconds_bucket is not a series"),
    "label removed from the contract": (
        _drop_label("wirepool_errors_total", "code"), "by (code): not a label"),
    "series made optional": (
        _make_optional("wirepool_worker_in_flight"), "must not depend on it"),
    "rate of a gauge": (
        _edit_expr("RSS per worker", "wirepool_worker_rss_bytes{pool=~\"$pool\", "
                   "worker=~\"$worker\"}", "rate(wirepool_worker_rss_bytes{pool=~\"$pool\", "
                   "worker=~\"$worker\"}[5m])"), "rate() of wirepool_worker_rss_bytes, a gauge"),
    "quantile of _count": (
        _edit_expr("Latency p99 by method", "seconds_bucket", "seconds_count"),
        "only the _bucket samples"),
    "quantile without le": (
        _edit_expr("Latency p99 by method", "method, le", "method"), "without le"),
    "by a label the series lacks": (
        _edit_expr("Queue wait", "sum by (pool, le)", "sum by (pool, method, le)"),
        "by (method): not a label"),
    "matcher on a label the series lacks": (
        _edit_expr("Calls / s", 'pool=~"$pool"', 'pool=~"$pool", worker="0"'),
        "has no label 'worker'"),
    "raw counter": (
        _edit_expr("Retries / s", "rate(wirepool_retries_total{pool=~\"$pool\"}"
                   "[$__rate_interval])", "wirepool_retries_total{pool=~\"$pool\"}"),
        "is a counter"),
    "not filtered by $worker": (
        _edit_expr("In flight per worker", ', worker=~"$worker"', ""),
        'not filtered by worker=~"$worker"'),
    "division without matching labels": (
        _edit_expr("Queue wait", "sum by (pool) (rate(wirepool_queue_wait_seconds_count",
                   "sum(rate(wirepool_queue_wait_seconds_count"), "no sample would match"),
    "a syntax error": (_edit_expr("Calls / s", "))", ")"), "got 'the end'"),
    "unknown function": (_edit_expr("Calls / s", "rate(", "deriv("), "deriv() is not known"),
    "panel without unit": (_panel_field("Bytes / s", _no_unit), "unit None"),
    "panel without title": (_panel_field("Bytes / s", _no_title), "no title"),
    "legend of a dropped label": (_panel_field("Queue wait", _legend), "legend {{method}}"),
    "fixed datasource": (_panel_field("Rows / s", _swap_datasource), "${datasource}"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_the_check_fails_on_a_modified_copy(name: str) -> None:
    mutate, expected = MUTATIONS[name]
    dashboard, contract = copy.deepcopy(DASHBOARD), copy.deepcopy(CONTRACT)
    mutate(dashboard, contract)
    found = problems(dashboard, contract)
    assert any(expected in p for p in found), found
    assert problems(DASHBOARD, CONTRACT) == []  # the originals are untouched


def test_a_renamed_series_in_a_copied_file_fails(tmp_path: Path) -> None:
    text = DASHBOARD_PATH.read_text(encoding="utf-8")
    assert text.count("wirepool_worker_pid") == 1
    copied = tmp_path / "wirepool.json"
    copied.write_text(text.replace("wirepool_worker_pid", "wirepool_worker_process_id"),
                      encoding="utf-8")
    found = problems(load(copied), CONTRACT)
    assert any("wirepool_worker_process_id is not a series" in p for p in found), found
    assert any("not shown by any panel: ['wirepool_worker_pid']" in p for p in found), found
