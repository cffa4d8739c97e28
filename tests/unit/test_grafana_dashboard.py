"""packaging/grafana/tenantnet.json: the dashboard's structure (a JSON schema of the part of
Grafana's dashboard model it uses, plus what a schema cannot say: unique ids and refIds,
panels inside the 24-column grid and not overlapping) and its PromQL (every metric and
label it names is one the agent really exports).

The exported set comes from a real `AgentMetrics` — the CNI histogram and error counter with
one observation each, the admission figures, attachment records with a pre-warm state and a
tenantnet-ipam pool in tmp_path — with the offload report's `ReportCollector` registered
over the same report the offload unit tests use (tests/unit/test_offload.py `tc_report`),
scraped with `generate_latest` and parsed back with prometheus-client's own parser.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ipam.sqlite_store import SqliteStore
from ipam.store import Allocation
from tenantnet.entry.metrics import AgentMetrics
from tenantnet.ops.flowreport.collector import ReportCollector
from tenantnet.plugin import modes
from tenantnet.plugin.drivers.ovs import OvsPlan
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import AttachmentRecord, PodRef, RecordStore
from tests.unit.test_offload import tc_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "offload"
DASHBOARD = Path(__file__).resolve().parents[2] / "packaging" / "grafana" / "tenantnet.json"

# Exported by the agent once wired; checked like every other metric (no exemption).
FAILURES = "tenantnet_offload_failures_total"

# Labels Prometheus adds to every series of a target when it scrapes the agent.
TARGET_LABELS = frozenset({"instance", "job"})
# Grafana's built-in variables the queries may use.
GRAFANA_BUILTINS = frozenset({"__rate_interval", "__interval", "__range", "__range_s", "__range_ms"})
PANEL_TYPES = ("timeseries", "stat", "table", "bargauge")
GRID_COLUMNS = 24

# ---- the exported metrics ------------------------------------------------------------------


@dataclass
class Family:
    name: str
    type: str
    samples: dict[str, set[str]] = field(default_factory=dict)  # sample name -> its label names


SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"), "gaugehistogram": ("_bucket", "_gsum", "_gcount")}


class Exported:
    """What one scrape of the agent says: families by name, and each sample name's family."""

    def __init__(self, text: str) -> None:
        self.families: dict[str, Family] = {}
        for f in text_string_to_metric_families(text):
            fam = self.families.setdefault(f.name, Family(f.name, f.type))
            for s in f.samples:
                fam.samples.setdefault(s.name, set()).update(s.labels)

    def resolve(self, name: str) -> tuple[Family, str] | None:
        """(family, sample name) of a name a query uses, or None if nothing exported has it.

        A name is a sample name as exposed; a family that is declared but has no samples in
        this scrape still resolves through the suffixes its type allows (counter `_total`,
        histogram `_bucket`/`_sum`/`_count`), so only its labels are then unknown."""
        for fam in self.families.values():
            if name in fam.samples:
                return fam, name
        for fam in self.families.values():
            for suffix in SUFFIXES.get(fam.type, ()):
                if name == fam.name + suffix:
                    return fam, name
            if fam.type in ("gauge", "untyped") and name == fam.name:
                return fam, name
        return None

    def labels(self, name: str) -> set[str] | None:
        hit = self.resolve(name)
        if hit is None or hit[1] not in hit[0].samples:
            return None
        return hit[0].samples[hit[1]] | TARGET_LABELS


TENANCY = {"networks": {"rail-1": {"bridge": "br-rail1"}},
           "tenants": {"a": {"namespaces": ["team-a"], "networks": {"rail-1": {"vlans": [100]}}}}}
STATUS = {"inflight": 2, "busyWorkers": 2, "maxInflight": 64, "oldestRunningS": 0.25, "rssKb": 40960,
          "served": 10, "rejected": 1, "expired": 0, "protocolErrors": 0}


def scrape_agent(tmp: Path) -> str:
    """One scrape of a real AgentMetrics with every family populated."""
    ipam_dir = str(tmp / "ipam")
    node = NodeConfig(state_dir=str(tmp / "state"), ipam_data_dirs=(ipam_dir,), ipam_data_dir=ipam_dir,
                      tenancy=TENANCY, vswitchd_log=str(tmp / "ovs-vswitchd.log"))
    (tmp / "ovs-vswitchd.log").write_text("")
    ipam = {"type": "tenantnet-ipam", "dataDir": ipam_dir, "ranges": [[{"subnet": "10.1.0.0/24"}]]}
    cid = "c" * 64
    record = AttachmentRecord(network="rail-1", container_id=cid, ifname="net1", mode="ovs", phase="ready",
                              pod=PodRef("team-a", "p1"),
                              plan=OvsPlan(host_ifname="eth9", bridge="br0", prewarm="warm", prewarm_rules=2),
                              conf={"cniVersion": "1.1.0", "name": "rail-1", "type": "tenantnet", "ipam": ipam})
    RecordStore(node.state_dir, modes.plan_type).save(record)
    store = SqliteStore(ipam_dir)
    with store.transaction() as txn:
        txn.insert(Allocation("rail-1", ipaddress.ip_address("10.1.0.5"), cid, "net1", "team-a", "p1"))
    store.close()

    report = tc_report({"hw-offload": "true", "tc-policy": "none"})
    # Refusals as ovs-vswitchd logs them: the failures counter gets samples to check.
    report.snapshot.vswitchd_log = (FIXTURES / "vswitchd-tc-refusals.log").read_text().splitlines()
    metrics = AgentMetrics(lambda: dict(STATUS), lambda: node, [ReportCollector(report)])
    metrics.observe("tenantnet", "ADD", 0.012, 0, None)
    metrics.observe("tenantnet", "ADD", 0.3, 1, 7)
    return generate_latest(metrics.registry).decode()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    ex = Exported(scrape_agent(tmp_path_factory.mktemp("agent")))
    # The fixture itself: every family the dashboard's panels draw on has samples here.
    for name in ("tenantnet_cni_request_duration_seconds_bucket", "tenantnet_cni_errors_total",
                 "tenantnet_attachments", "tenantnet_prewarm_attachments", "tenantnet_prewarm_rules",
                 "tenantnet_ipam_pool_used_addresses", "tenantnet_offload_tenant_packets",
                 "tenantnet_offload_attachment_hw_packet_share", "tenantnet_offload_findings"):
        assert ex.labels(name), f"the test's agent exports no {name} samples"
    return ex


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


# ---- the JSON schema -----------------------------------------------------------------------

DATASOURCE_REF = {"type": "object", "required": ["type", "uid"], "additionalProperties": False,
                  "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}}}
NONNEG_INT = {"type": "integer", "minimum": 0}
TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "additionalProperties": False,
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "datasource": DATASOURCE_REF,
        "format": {"enum": ["time_series", "table", "heatmap"]},
        "instant": {"type": "boolean"},
        "range": {"type": "boolean"},
        "interval": {"type": "string"},
        "editorMode": {"enum": ["code", "builder"]},
    },
}
PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "description", "gridPos", "datasource", "targets"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": list(PANEL_TYPES)},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string", "minLength": 40},
        "gridPos": {"type": "object", "required": ["x", "y", "w", "h"], "additionalProperties": False,
                    "properties": {"x": {**NONNEG_INT, "maximum": GRID_COLUMNS - 1}, "y": NONNEG_INT,
                                   "w": {"type": "integer", "minimum": 1, "maximum": GRID_COLUMNS},
                                   "h": {"type": "integer", "minimum": 1}}},
        "datasource": DATASOURCE_REF,
        "targets": {"type": "array", "minItems": 1, "items": TARGET},
        "fieldConfig": {"type": "object", "required": ["defaults", "overrides"],
                        "properties": {"defaults": {"type": "object"},
                                       "overrides": {"type": "array", "items": {
                                           "type": "object", "required": ["matcher", "properties"]}}}},
        "options": {"type": "object"},
        "transformations": {"type": "array", "items": {"type": "object", "required": ["id"]}},
        "pluginVersion": {"type": "string"},
    },
}
VARIABLE = {
    "type": "object",
    "required": ["name", "type", "label"],
    "properties": {"name": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                   "label": {"type": "string"}},
    "oneOf": [
        {"properties": {"type": {"const": "datasource"}, "query": {"const": "prometheus"}},
         "required": ["query"]},
        {"properties": {"type": {"const": "query"}, "datasource": DATASOURCE_REF,
                        "definition": {"type": "string", "pattern": r"^label_values\("},
                        "query": {"type": "object", "required": ["query"],
                                  "properties": {"query": {"type": "string"}}},
                        "refresh": {"enum": [1, 2]}},
         "required": ["datasource", "definition", "query", "refresh"]},
    ],
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time", "annotations"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,40}$"},
        "description": {"type": "string"},
        "schemaVersion": {"const": 39},
        "version": NONNEG_INT,
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "refresh": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "time": {"type": "object", "required": ["from", "to"]},
        "timepicker": {"type": "object"},
        "timezone": {"type": "string"},
        "links": {"type": "array"},
        "annotations": {"type": "object", "required": ["list"], "properties": {"list": {"type": "array"}}},
        "templating": {"type": "object", "required": ["list"], "additionalProperties": False,
                       "properties": {"list": {"type": "array", "items": VARIABLE}}},
        "panels": {"type": "array", "minItems": 1, "items": PANEL},
        "id": {"type": ["integer", "null"]},
    },
    "additionalProperties": False,
}


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


# ---- a small PromQL tokenizer -----------------------------------------------------------------

FUNCTIONS = frozenset({
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time",
    "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "day_of_month",
    "day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv", "double_exponential_smoothing",
    "exp", "floor", "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile",
    "histogram_stddev", "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase",
    "info", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
    "mad_over_time", "max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear",
    "present_over_time", "quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn", "sin",
    "sinh", "sort", "sort_by_label", "sort_by_label_desc", "sort_desc", "sqrt", "stddev_over_time",
    "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year"
})
AGGREGATIONS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio"
})
GROUPING = frozenset({"by", "without"})
MATCHING = frozenset({"on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"bool", "offset", "and", "or", "unless", "atan2", "inf", "nan", "start", "end"})
# Functions that read a range of a counter, and those meant for gauges.
COUNTER_FUNCTIONS = frozenset({"rate", "irate", "increase", "resets"})
GAUGE_FUNCTIONS = frozenset({"deriv", "delta", "idelta", "predict_linear"})

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<var>\$\{[a-zA-Z_][a-zA-Z0-9_]*(?::[a-z]+)?\}|\$[a-zA-Z_][a-zA-Z0-9_]*)
  | (?P<number>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?:ms|[smhdwy])*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|==|!=|<=|>=|[-+*/%^<>=(){},@])
""", re.VERBOSE)
_DURATION = re.compile(r"^\[\s*(?:(?:\d+(?:ms|[smhdwy]))+|\$\{?__[a-z_]+\}?)\s*(?::\s*(?:(?:\d+(?:ms|[smhdwy]))+)?\s*)?\]$")


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str


def tokenize(expr: str) -> list[Tok]:
    out: list[Tok] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot tokenize {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "space":
            out.append(Tok(kind, m.group()))
    return out


def _close(toks: list[Tok], i: int, open_: str = "(", close: str = ")") -> int:
    """Index of the token closing the bracket at `i`."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].kind == "op" and toks[j].text == open_:
            depth += 1
        elif toks[j].kind == "op" and toks[j].text == close:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced brackets")


def _is(toks: list[Tok], i: int, text: str) -> bool:
    return i < len(toks) and toks[i].kind == "op" and toks[i].text == text


def _label_list(toks: list[Tok], i: int) -> tuple[list[str], int]:
    """Labels of the `( a, b )` starting at `i`; the index after its `)`."""
    if not _is(toks, i, "("):
        raise ValueError(f"expected a label list after {toks[i - 1].text!r}")
    end = _close(toks, i)
    labels = [t.text for t in toks[i + 1:end] if t.kind == "ident"]
    if any(t.kind not in ("ident", "op") or (t.kind == "op" and t.text != ",") for t in toks[i + 1:end]):
        raise ValueError(f"not a label list: {' '.join(t.text for t in toks[i:end + 1])}")
    return labels, end + 1


@dataclass
class Use:
    """What one expression names."""

    metrics: list[tuple[str, list[str]]] = field(default_factory=list)  # (metric, labels of its {...})
    grouped: list[tuple[str, list[str], list[str]]] = field(default_factory=list)  # (by, labels, metrics)
    matching: list[str] = field(default_factory=list)  # on / ignoring / group_* labels
    functions: list[tuple[str, list[str]]] = field(default_factory=list)  # (function, metrics inside)
    variables: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def analyse(expr: str) -> Use:
    """The metric names, labels, functions and variables a PromQL expression uses."""
    use = Use()
    try:
        toks = tokenize(expr)
    except ValueError as exc:
        use.problems.append(str(exc))
        return use
    metric_at: dict[int, str] = {}
    for t in toks:  # Grafana interpolates variables in strings (label values) as well
        if t.kind == "string":
            use.variables += re.findall(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)", t.text)
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "var":
            use.variables.append(t.text.strip("${}").split(":")[0])
        elif t.kind == "range":
            if not _DURATION.match(t.text):
                use.problems.append(f"not a range duration: {t.text}")
            for v in re.findall(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)", t.text):
                use.variables.append(v)
        elif t.kind == "op" and t.text == "{":
            use.problems.append("a selector without a metric name")
            i = _close(toks, i, "{", "}")
        elif t.kind == "ident":
            word = t.text
            nxt_paren = _is(toks, i + 1, "(")
            if word in GROUPING or word in MATCHING:
                if word in ("group_left", "group_right") and not nxt_paren:
                    i += 1
                    continue
                try:
                    labels, after = _label_list(toks, i + 1)
                except ValueError as exc:
                    use.problems.append(str(exc))
                    return use
                if word in MATCHING:
                    use.matching.extend(labels)
                i = after
                continue
            if word in AGGREGATIONS and (nxt_paren or (i + 1 < len(toks) and toks[i + 1].text in GROUPING)):
                pass  # its grouping is read below, over the whole expression
            elif word in FUNCTIONS and nxt_paren:
                pass
            elif word.lower() in KEYWORDS:
                pass
            elif nxt_paren:
                use.problems.append(f"unknown function {word}()")
            elif word in FUNCTIONS or word in AGGREGATIONS:
                use.problems.append(f"{word} used without arguments")
            else:
                labels: list[str] = []
                if _is(toks, i + 1, "{"):
                    end = _close(toks, i + 1, "{", "}")
                    body = toks[i + 2:end]
                    j = 0
                    while j < len(body):
                        if (j + 2 < len(body) and body[j].kind == "ident" and body[j + 1].kind == "op"
                                and body[j + 1].text in ("=", "!=", "=~", "!~") and body[j + 2].kind == "string"):
                            labels.append(body[j].text)
                            j += 3
                            if j < len(body) and not _is(body, j, ","):
                                use.problems.append(f"bad matcher list in {word}{{...}}")
                                break
                            j += 1
                        else:
                            use.problems.append(f"bad matcher list in {word}{{...}}")
                            break
                    metric_at[i] = word
                    use.metrics.append((word, labels))
                    i = end + 1
                    continue
                metric_at[i] = word
                use.metrics.append((word, labels))
        i += 1

    def metrics_in(lo: int, hi: int) -> list[str]:
        return [m for k, m in metric_at.items() if lo <= k <= hi]

    # Aggregations' grouping and functions' arguments, each against the metrics it covers.
    for i, t in enumerate(toks):
        if t.kind != "ident":
            continue
        if t.text in AGGREGATIONS:
            j = i + 1
            groups: list[tuple[str, list[str]]] = []
            if j < len(toks) and toks[j].text in GROUPING:
                labels, j = _label_list(toks, j + 1)
                groups.append((toks[i + 1].text, labels))
            if not _is(toks, j, "("):
                continue
            end = _close(toks, j)
            if end + 1 < len(toks) and toks[end + 1].text in GROUPING:
                labels, _ = _label_list(toks, end + 2)
                groups.append((toks[end + 1].text, labels))
            for how, labels in groups:
                use.grouped.append((how, labels, metrics_in(j, end)))
        elif t.text in FUNCTIONS and _is(toks, i + 1, "("):
            use.functions.append((t.text, metrics_in(i + 1, _close(toks, i + 1))))
    return use


# ---- the checks ------------------------------------------------------------------------------


def check_expr(expr: str, exported: Exported, variables: set[str], where: str) -> list[str]:
    use = analyse(expr)
    problems = [f"{where}: {p}" for p in use.problems]
    if not use.metrics and not use.problems:
        problems.append(f"{where}: names no metric")
    for metric, labels in use.metrics:
        if exported.resolve(metric) is None:
            problems.append(f"{where}: {metric} is not exported by the agent")
            continue
        have = exported.labels(metric)
        if have is None:
            problems.append(f"{where}: {metric} is declared but has no samples: its labels cannot be checked")
            continue
        problems += [f"{where}: {metric} has no label {label!r}" for label in labels if label not in have]
    for how, labels, metrics in use.grouped:
        for metric in metrics:
            have = exported.labels(metric)
            if have is not None:
                problems += [f"{where}: {how} ({label}) but {metric} has no label {label!r}"
                             for label in labels if label not in have]
    for label in use.matching:
        for metric, _ in use.metrics:
            have = exported.labels(metric)
            if have is not None and label not in have:
                problems.append(f"{where}: on/ignoring ({label}) but {metric} has no label {label!r}")
    for function, metrics in use.functions:
        for metric in metrics:
            hit = exported.resolve(metric)
            if hit is None:
                continue
            fam, sample = hit
            counterish = fam.type == "counter" or (fam.type in ("histogram", "summary") and sample != fam.name)
            if function in COUNTER_FUNCTIONS and not counterish:
                problems.append(f"{where}: {function}() over {metric}, a {fam.type}: use deriv/delta for gauges")
            if function in GAUGE_FUNCTIONS and counterish:
                problems.append(f"{where}: {function}() over {metric}, a counter: use rate/increase")
    problems += [f"{where}: unknown variable ${v}" for v in use.variables
                 if v not in variables and v not in GRAFANA_BUILTINS]
    return problems


_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")


def check_variable(var: dict[str, Any], exported: Exported, variables: set[str]) -> list[str]:
    if var.get("type") != "query":
        return []
    where = f"variable {var.get('name')}"
    query = var.get("query", {}).get("query") if isinstance(var.get("query"), dict) else None
    if query != var.get("definition"):
        return [f"{where}: definition and query differ"]
    m = _LABEL_VALUES.match(query or "")
    if not m or not m.group("selector"):
        return [f"{where}: not label_values(<metric selector>, <label>): {query!r}"]
    problems = check_expr(m.group("selector"), exported, variables, where)
    for metric, _ in analyse(m.group("selector")).metrics:
        have = exported.labels(metric)
        if have is not None and m.group("label") not in have:
            problems.append(f"{where}: {metric} has no label {m.group('label')!r}")
    return problems


def _overlap(a: dict[str, int], b: dict[str, int]) -> bool:
    return a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] \
        and b["y"] < a["y"] + a["h"]


def problems_of(dash: dict[str, Any], exported: Exported) -> list[str]:
    """Everything wrong with a dashboard; [] when it is fine."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    problems = [f"schema: /{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in sorted(validator.iter_errors(dash), key=lambda e: list(map(str, e.absolute_path)))]
    if problems:
        return problems  # the checks below assume the structure
    names = [v["name"] for v in dash["templating"]["list"]]
    variables = set(names)
    if len(variables) != len(names):
        problems.append(f"duplicate template variable names: {names}")
    if "datasource" not in {v["name"] for v in dash["templating"]["list"] if v["type"] == "datasource"}:
        problems.append("no ${datasource} variable of type datasource")
    for var in dash["templating"]["list"]:
        problems += check_variable(var, exported, variables)
    ids = [p["id"] for p in dash["panels"]]
    problems += [f"duplicate panel id {i}" for i in sorted({i for i in ids if ids.count(i) > 1})]
    titles = [p["title"] for p in dash["panels"]]
    problems += [f"duplicate panel title {t!r}" for t in sorted({t for t in titles if titles.count(t) > 1})]
    for p in dash["panels"]:
        where = f"panel {p['id']} ({p['title']})"
        g = p["gridPos"]
        if g["x"] + g["w"] > GRID_COLUMNS:
            problems.append(f"{where}: x + w = {g['x'] + g['w']} is past the {GRID_COLUMNS} columns")
        refs = [t["refId"] for t in p["targets"]]
        problems += [f"{where}: duplicate refId {r}" for r in sorted({r for r in refs if refs.count(r) > 1})]
        for t in p["targets"]:
            problems += check_expr(t["expr"], exported, variables, f"{where} {t['refId']}")
    panels = dash["panels"]
    for n, a in enumerate(panels):
        for b in panels[n + 1:]:
            if _overlap(a["gridPos"], b["gridPos"]):
                problems.append(f"panels {a['id']} and {b['id']} overlap")
    return problems


# ---- the tests -------------------------------------------------------------------------------


def test_dashboard_is_valid_and_queries_only_what_the_agent_exports(dashboard, exported):
    assert problems_of(dashboard, exported) == []


def test_failures_counter_is_exported_with_its_labels(exported):
    """The dashboard's failure panels need it; strict, like every other metric."""
    assert exported.resolve(FAILURES) is not None, f"{FAILURES} is not exported by the agent"
    assert {"namespace", "pod", "network", "reason"} <= (exported.labels(FAILURES) or set())


def test_the_panels_the_dashboard_promises(dashboard):
    exprs = "\n".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for needle in ('tenantnet_offload_tenant_packets{class="offloaded"', "tenantnet_offload_attachment_hw_packet_share",
                   'tenantnet_offload_attachment_flows{class="software"',
                   'tenantnet_offload_attachment_packets{class="software"',
                   "histogram_quantile(0.5,", "histogram_quantile(0.99,",
                   "rate(tenantnet_cni_request_duration_seconds_bucket", "tenantnet_cni_errors_total",
                   "tenantnet_agent_inflight", "tenantnet_agent_rejected_total", "tenantnet_ipam_pool_used_addresses",
                   "tenantnet_ipam_pool_addresses", "tenantnet_prewarm_attachments", FAILURES):
        assert needle in exprs, needle
    assert {p["type"] for p in dashboard["panels"]} == set(PANEL_TYPES)
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"datasource", "instance", "tenant", "network"}


def test_class_values_in_queries_are_the_report_classes(dashboard):
    from tenantnet.plugin.system.dpflows import CLASSES

    for p in dashboard["panels"]:
        for t in p["targets"]:
            for value in re.findall(r'class=~?"([^"]*)"', t["expr"]):
                assert set(value.split("|")) <= set(CLASSES), (p["title"], value)


def test_gauge_panels_say_so(dashboard):
    """The offload packet and flow figures are gauges of the flows present now."""
    for p in dashboard["panels"]:
        exprs = " ".join(t["expr"] for t in p["targets"])
        if re.search(r"tenantnet_offload_(attachment|tenant)_(packets|flows)\b", exprs):
            assert "gauge" in p["description"] or "present" in p["description"], p["title"]


# ---- the checks catch a broken dashboard ---------------------------------------------------


def _panel(dash: dict[str, Any], type_: str = "timeseries") -> dict[str, Any]:
    return next(p for p in dash["panels"] if p["type"] == type_)


def _missing_grid_pos(d):
    del _panel(d)["gridPos"]


def _duplicate_id(d):
    d["panels"][1]["id"] = d["panels"][0]["id"]


def _unknown_metric(d):
    _panel(d)["targets"][0]["expr"] = 'rate(tenantnet_cni_requests_total{instance=~"$instance"}[5m])'


def _unknown_label(d):
    _panel(d)["targets"][0]["expr"] = 'tenantnet_agent_inflight{pod="x"}'


def _unknown_by_label(d):
    _panel(d)["targets"][0]["expr"] = "sum by (tenant) (tenantnet_ipam_pool_addresses)"


def _bare_histogram(d):
    _panel(d)["targets"][0]["expr"] = "rate(tenantnet_cni_request_duration_seconds[5m])"


def _counter_without_total(d):
    _panel(d)["targets"][0]["expr"] = "rate(tenantnet_cni_errors[5m])"


def _rate_of_gauge(d):
    _panel(d)["targets"][0]["expr"] = 'rate(tenantnet_offload_attachment_packets{class="software"}[5m])'


def _duplicate_ref_id(d):
    p = _panel(d)
    p["targets"].append({**p["targets"][0]})


def _overlap_panels(d):
    d["panels"][1]["gridPos"] = dict(d["panels"][0]["gridPos"])


def _past_the_grid(d):
    _panel(d)["gridPos"].update(x=20, w=12)


def _unknown_panel_type(d):
    d["panels"][0]["type"] = "graph"


def _no_description(d):
    del d["panels"][0]["description"]


def _wrong_datasource(d):
    d["panels"][0]["datasource"] = {"type": "prometheus", "uid": "prom-1"}


def _unknown_variable(d):
    _panel(d)["targets"][0]["expr"] = 'tenantnet_agent_inflight{instance=~"$node"}'


def _unknown_function(d):
    _panel(d)["targets"][0]["expr"] = "rates(tenantnet_agent_rejected_total[5m])"


def _variable_of_unknown_label(d):
    var = next(v for v in d["templating"]["list"] if v["name"] == "tenant")
    var["definition"] = var["query"]["query"] = "label_values(tenantnet_agent_inflight, tenant)"


def _schema_version(d):
    d["schemaVersion"] = 16


MUTATIONS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "missing gridPos": (_missing_grid_pos, "'gridPos' is a required property"),
    "duplicate id": (_duplicate_id, "duplicate panel id"),
    "unknown metric": (_unknown_metric, "tenantnet_cni_requests_total is not exported"),
    "unknown label": (_unknown_label, "has no label 'pod'"),
    "unknown by label": (_unknown_by_label, "by (tenant)"),
    "histogram without _bucket": (_bare_histogram, "tenantnet_cni_request_duration_seconds is not exported"),
    "counter without _total": (_counter_without_total, "tenantnet_cni_errors is not exported"),
    "rate of a gauge": (_rate_of_gauge, "rate() over tenantnet_offload_attachment_packets, a gauge"),
    "duplicate refId": (_duplicate_ref_id, "duplicate refId A"),
    "overlapping panels": (_overlap_panels, "overlap"),
    "past 24 columns": (_past_the_grid, "past the 24 columns"),
    "unknown panel type": (_unknown_panel_type, "'graph' is not one of"),
    "no description": (_no_description, "'description' is a required property"),
    "fixed datasource": (_wrong_datasource, "'${datasource}' was expected"),
    "unknown variable": (_unknown_variable, "unknown variable $node"),
    "unknown function": (_unknown_function, "unknown function rates()"),
    "variable of a missing label": (_variable_of_unknown_label, "tenantnet_agent_inflight has no label 'tenant'"),
    "schema version": (_schema_version, "39 was expected"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_broken_dashboard_fails(name, dashboard, exported):
    mutate, expected = MUTATIONS[name]
    assert not any(expected in p for p in problems_of(dashboard, exported))  # the mutation's, not already there
    broken = copy.deepcopy(dashboard)
    mutate(broken)
    problems = problems_of(broken, exported)
    assert any(expected in p for p in problems), problems


def test_tokenizer_reads_what_the_dashboard_writes():
    use = analyse('histogram_quantile(0.99, sum by (le, command) (rate(m_bucket{instance=~"$instance"}[5m]))) '
                  '/ on (command) group_left sum(x{a="b",c!~"d"}) without (e) > 0 and y offset 5m '
                  'or clamp_min(deriv(g[$__rate_interval]), 0)')
    assert [m for m, _ in use.metrics] == ["m_bucket", "x", "y", "g"]
    assert use.metrics[1] == ("x", ["a", "c"])
    assert ("by", ["le", "command"], ["m_bucket"]) in use.grouped
    assert ("without", ["e"], ["x"]) in use.grouped
    assert use.matching == ["command"]
    assert ("rate", ["m_bucket"]) in use.functions and ("deriv", ["g"]) in use.functions
    assert use.variables == ["instance", "__rate_interval"] and use.problems == []
