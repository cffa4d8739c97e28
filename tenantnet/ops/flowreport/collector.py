"""The offload report as prometheus-client metric families: what `tenantnetctl offload
--prometheus` prints and what the agent's /metrics serves (docs/offload.md lists them).

`ReportCollector` exposes one report as it is. `NodeOffloadCollector` is the agent's: it
keeps the last report and builds a new one at most every `metricsOffloadInterval` seconds,
on a thread of its own, one at a time, while scrapes get the last report (only the very
first scrape waits for one) — and puts a due rebuild off while CNI calls are in flight.
Reading OVS never happens on a CNI call's path, and no CNI call waits for it.

`tenantnet_offload_failures_total` counts the offload refusals ovs-vswitchd logs, per pod
and reason (attribution.py): the agent reads the log's new lines at each rebuild (a cursor
that starts at the log's end when the agent starts, and reads at most 1 MiB a time), so a
pod's counter only grows while the pod is attached; the series of a pod whose attachments
are gone are dropped at the next rebuild (Prometheus reads a series that ends as stale, and
pods come and go by the thousand: kept, they would grow the scrape without bound). A
one-shot report counts the refusals in the lines it was given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from tenantnet.ops.flowreport import attribution
from tenantnet.ops.flowreport.report import AttachmentView, Report
from tenantnet.plugin.system.dpflows import CLASSES

PREFIX = "tenantnet_offload_"
FAILURE_LABELS = ("namespace", "pod", "network", "reason")
# A due rebuild waits for a quiet moment at most this many intervals (2.5 min at the default
# 15 s): at a thousand attachments one costs 0.6-1.1 s of CPU, as much as a tenth of a burst's.
DEFERRAL_LIMIT = 10
LOG_READ_BYTES = 1 << 20  # per rebuild: a log flooded with refusals is caught up over rounds
FailureCounts = dict[tuple[str, ...], float]


class _Families:
    """Families in declaration order, samples added by short name."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def declare(self, name: str, kind: str, help_text: str) -> None:
        self.families[name] = Metric(PREFIX + name, help_text, kind)

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        family = self.families[name]
        family.add_sample(family.name, labels, value)


def _attachment_labels(a: AttachmentView) -> dict[str, str]:
    return {"namespace": a.namespace, "pod": a.pod, "tenant": a.tenant or "", "network": a.network,
            "ifname": a.ifname, "port": a.port or "", "mode": a.mode}


def count_failures(report: Report, lines: Iterable[str], into: FailureCounts) -> None:
    """Add the refusals in `lines` (log lines) to `into`, per pod and reason."""
    for failure in attribution.failures_for(report, lines):
        if failure.source == "log":
            key = tuple(attribution.count_key(failure)[k] for k in FAILURE_LABELS)
            into[key] = into.get(key, 0) + failure.count


def prune_failures(report: Report, counts: FailureCounts) -> None:
    """Drop the series of pods none of whose attachments are in `report` any more. Only a
    report of all the node's attachments can tell that (a filtered one cannot); the node's
    own series ("" pod) stay."""
    if not report.complete:
        return
    live = {(a.namespace, a.pod, a.network) for a in report.attachments}
    for key in [k for k in counts if k[1] and (k[0], k[1], k[2]) not in live]:
        del counts[key]


def failures_metric(counts: FailureCounts) -> Metric:
    family = CounterMetricFamily(PREFIX + "failures", "offload refusals ovs-vswitchd logged, blamed on the "
                                 "pod whose port the flow touches (\"\" labels: no pod), by reason "
                                 "(docs/offload.md)", labels=list(FAILURE_LABELS))
    for key, value in sorted(counts.items()):
        family.add_metric(list(key), value)
    return family


def report_metrics(report: Report) -> list[Metric]:
    m = _Families()
    snap = report.snapshot
    m.declare("up", "gauge", "1 if the datapath flows could be read from ovs-vswitchd, else 0")
    m.add("up", {}, 0 if snap.error else 1)
    m.declare("scrape_duration_seconds", "gauge", "time spent reading flows and OVS settings")
    m.add("scrape_duration_seconds", {}, round(snap.duration, 6))
    m.declare("hw_offload_enabled", "gauge",
              "1 if OVS other_config:hw-offload is true, 0 if not (absent if OVSDB could not be read)")
    if not snap.ovs.error:
        m.add("hw_offload_enabled", {}, 1 if snap.ovs.other_config.get("hw-offload") == "true" else 0)
    m.declare("tc_policy_info", "gauge", "always 1; the policy label is OVS other_config:tc-policy")
    if not snap.ovs.error:
        m.add("tc_policy_info", {"policy": snap.ovs.other_config.get("tc-policy") or "none"}, 1)
    m.declare("datapath_info", "gauge",
              "always 1; software_only=\"true\" marks a datapath that cannot offload (the lab's)")
    for d in report.datapaths:
        m.add("datapath_info", {"datapath": d.name, "type": d.type,
                                "software_only": "true" if d.type == "dummy" else "false"}, 1)
    m.declare("datapath_flows", "gauge", "datapath flows present now, per datapath and class")
    for d in report.datapaths:
        for c in CLASSES:
            m.add("datapath_flows", {"datapath": d.name, "class": c}, d.totals[c]["flows"])
    m.declare("unparsed_lines", "gauge", "lines of dump-flows output the parser skipped")
    m.add("unparsed_lines", {}, len(snap.skipped))
    m.declare("attachment_flows", "gauge", "datapath flows whose in_port or output is the attachment's port")
    m.declare("attachment_packets", "gauge",
              "packets counted by those flows (flows expire when idle, so this can go down)")
    m.declare("attachment_bytes", "gauge", "bytes counted by those flows")
    m.declare("attachment_hw_packet_share", "gauge",
              "share (0-1) of the attachment's packets counted by offloaded flows; absent without packets")
    m.declare("attachment_hw_flow_share", "gauge",
              "share (0-1) of the attachment's flows that are offloaded; absent without flows")
    for a in report.attachments:
        base = _attachment_labels(a)
        t = a.totals
        for c in CLASSES:
            labels = {**base, "class": c}
            m.add("attachment_flows", labels, t[c]["flows"])
            m.add("attachment_packets", labels, t[c]["packets"])
            m.add("attachment_bytes", labels, t[c]["bytes"])
        if a.hw_packet_share is not None:
            m.add("attachment_hw_packet_share", base, round(a.hw_packet_share, 6))
        if a.hw_flow_share is not None:
            m.add("attachment_hw_flow_share", base, round(a.hw_flow_share, 6))
    m.declare("tenant_flows", "gauge", "datapath flows of the tenant's attachments, per class")
    m.declare("tenant_packets", "gauge", "packets of those flows, per class")
    tenants: dict[str, dict[str, dict[str, int]]] = {}
    for a in report.attachments:
        acc = tenants.setdefault(a.tenant or "", {c: {"flows": 0, "packets": 0} for c in CLASSES})
        for c, t in a.totals.items():
            acc[c]["flows"] += t["flows"]
            acc[c]["packets"] += t["packets"]
    for tenant, acc in sorted(tenants.items()):
        for c in CLASSES:
            m.add("tenant_flows", {"tenant": tenant, "class": c}, acc[c]["flows"])
            m.add("tenant_packets", {"tenant": tenant, "class": c}, acc[c]["packets"])
    m.declare("findings", "gauge", "node-level findings now, by code and severity (see docs/offload.md)")
    counts: dict[tuple[str, str], int] = {}
    for f in report.findings:
        counts[(f.code, f.severity)] = counts.get((f.code, f.severity), 0) + 1
    for (code, sev), n in sorted(counts.items()):
        m.add("findings", {"code": code, "severity": sev}, n)
    return list(m.families.values())


class ReportCollector(Collector):
    def __init__(self, report: Report) -> None:
        self.report = report

    def collect(self) -> Iterable[Metric]:
        counts: FailureCounts = {}
        count_failures(self.report, self.report.snapshot.vswitchd_log, counts)
        return [*report_metrics(self.report), failures_metric(counts)]


class NodeOffloadCollector(Collector):
    """The agent's offload families, from a report at most `metricsOffloadInterval` old."""

    def __init__(self, node: Callable[[], Any],
                 build: Callable[[Any, list[str]], Report] | None = None,
                 busy: Callable[[], bool] | None = None) -> None:
        """`build(node, log_lines)`: the report (default: the node's, from OVS). `busy()`: CNI
        calls are in flight — a due rebuild then waits, up to DEFERRAL_LIMIT intervals: at a
        thousand attachments one costs ≈ 0.5 s of the agent's CPU (and of its interpreter
        lock), which a burst of ADDs should not pay for figures nobody needs that second."""
        self._node = node
        self._build = build or _build_report
        self._busy = busy or (lambda: False)
        self._cursor: Any = None  # offloadlog.LogCursor of node.vswitchd_log
        self._failures: FailureCounts = {}
        self._refreshing = threading.Lock()
        self._families: list[Metric] = []
        self._text = b""
        self._built = float("-inf")
        self._cpu = 0.0  # of the rebuilds, on whichever thread ran them

    def collect(self) -> Iterable[Metric]:
        self._refresh()
        return list(self._families)

    def exposition(self) -> bytes:
        """The families as Prometheus text, rendered once per rebuild: at a thousand
        attachments they are ≈ 13,000 samples (2 MB), and rendering them at every scrape
        cost ≈ 0.1 s of the agent's CPU each time (entry/metrics.py serves this text)."""
        self._refresh()
        return self._text

    def _due(self, node: Any) -> bool:
        if not self._families:
            return True
        age = time.monotonic() - self._built
        if age < node.metrics_offload_interval:
            return False
        return not self._busy() or age >= DEFERRAL_LIMIT * node.metrics_offload_interval

    def _refresh(self) -> None:
        """Rebuild when due: the very first time on this scrape's thread (there is nothing to
        serve yet), after that on a thread of its own while scrapes get the last report — a
        scrape never waits for OVS, and never two rebuilds run at once."""
        node = self._node()
        if not self._due(node):
            return
        if not self._families:
            with self._refreshing:
                if not self._families:
                    self._rebuild(node, on_scrape=True)
            return
        if self._refreshing.acquire(blocking=False):
            def run() -> None:
                try:
                    if self._due(node):
                        self._rebuild(node)
                except Exception:  # the last report stays served; the next interval retries
                    self._built = time.monotonic()
                finally:
                    self._refreshing.release()

            threading.Thread(target=run, name="tenantnet-offload-report", daemon=True).start()

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait until no rebuild is running (tests, and a clean shutdown); False on time-out."""
        if not self._refreshing.acquire(timeout=timeout):
            return False
        self._refreshing.release()
        return True

    def cpu_seconds(self) -> float:
        """CPU the rebuilds have cost so far (the agent's /metrics reports it)."""
        return self._cpu

    def _rebuild(self, node: Any, on_scrape: bool = False) -> None:
        """`on_scrape`: on the scrape's own thread, whose CPU the endpoint counts already."""
        started = time.thread_time()
        lines = self._new_log_lines(node)
        report = self._build(node, lines)
        count_failures(report, lines, self._failures)
        prune_failures(report, self._failures)
        families = [*report_metrics(report), failures_metric(self._failures)]
        self._text = _render(families)
        self._families, self._built = families, time.monotonic()
        if not on_scrape:
            self._cpu += time.thread_time() - started

    def _new_log_lines(self, node: Any) -> list[str]:
        from tenantnet.plugin.system import offloadlog

        if self._cursor is None or self._cursor.path != node.vswitchd_log:
            # From the end: refusals logged before this agent started were counted by the last one.
            self._cursor = offloadlog.LogCursor(node.vswitchd_log, start_at_end=True)
        try:
            return list(self._cursor.read_new(LOG_READ_BYTES))
        except OSError:  # no log (OVS logs elsewhere, or not yet): no refusals to count
            return []


def _render(families: list[Metric]) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest

    class Fixed(Collector):
        def collect(self) -> Iterable[Metric]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    return generate_latest(registry)


def _build_report(node: Any, lines: list[str]) -> Report:
    from tenantnet.ops.flowreport.report import build_report, collect, load_views

    views, _ = load_views(node)  # the warnings name unreadable records; the report has no place for them
    snap = collect(node)
    snap.vswitchd_log = lines  # before the findings run: attribution's source reads them
    return build_report(node, snap, views, complete=True)


def node_collector(node: Callable[[], Any], busy: Callable[[], bool]) -> Collector:
    """What `tenantnetctl agent run` hands the agent (tenantnet.entry.agent.Agent's `collectors`)."""
    return NodeOffloadCollector(node, busy=busy)
