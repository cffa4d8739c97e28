"""The offload report as prometheus-client metric families: what `tenantnetctl offload
--prometheus` prints and what the agent's /metrics serves (docs/offload.md lists them).

`ReportCollector` exposes one report as it is. `NodeOffloadCollector` is the agent's: it
keeps the last report and builds a new one at most every `metricsOffloadInterval` seconds,
on the scrape's thread, one at a time — a second scraper meanwhile gets the last report
rather than a second round of `ovs-appctl` calls. Reading OVS never happens on a CNI call's
path, and no CNI call waits for it.

`tenantnet_offload_failures_total` counts the offload refusals ovs-vswitchd logs, per pod
and reason (attribution.py): the agent reads the log's new lines at each rebuild (a cursor
that starts at the log's end when the agent starts, and reads at most 1 MiB a time), so the
counter only grows; a one-shot report counts the refusals in the lines it was given.
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
                 build: Callable[[Any, list[str]], Report] | None = None) -> None:
        """`build(node, log_lines)`: the report (default: the node's, from OVS)."""
        self._node = node
        self._build = build or _build_report
        self._cursor: Any = None  # offloadlog.LogCursor of node.vswitchd_log
        self._failures: FailureCounts = {}
        self._refreshing = threading.Lock()
        self._families: list[Metric] = []
        self._built = float("-inf")

    def collect(self) -> Iterable[Metric]:
        node = self._node()
        stale = time.monotonic() - self._built >= node.metrics_offload_interval
        # Only one scrape rebuilds; one that finds a rebuild running serves the last report.
        if (stale or not self._families) and self._refreshing.acquire(blocking=not self._families):
            try:
                if time.monotonic() - self._built >= node.metrics_offload_interval or not self._families:
                    lines = self._new_log_lines(node)
                    report = self._build(node, lines)
                    count_failures(report, lines, self._failures)
                    self._families = [*report_metrics(report), failures_metric(self._failures)]
                    self._built = time.monotonic()
            finally:
                self._refreshing.release()
        return list(self._families)


    def _new_log_lines(self, node: Any) -> list[str]:
        from tenantnet.plugin.system import offloadlog

        if self._cursor is None or self._cursor.path != node.vswitchd_log:
            # From the end: refusals logged before this agent started were counted by the last one.
            self._cursor = offloadlog.LogCursor(node.vswitchd_log, start_at_end=True)
        try:
            return list(self._cursor.read_new(LOG_READ_BYTES))
        except OSError:  # no log (OVS logs elsewhere, or not yet): no refusals to count
            return []


def _build_report(node: Any, lines: list[str]) -> Report:
    from tenantnet.ops.flowreport.report import build_report, collect, load_views

    views, _ = load_views(node)  # the warnings name unreadable records; the report has no place for them
    snap = collect(node)
    snap.vswitchd_log = lines  # before the findings run: attribution's source reads them
    return build_report(node, snap, views)


def node_collector(node: Callable[[], Any]) -> Collector:
    """What `tenantnetctl agent run` hands the agent (tenantnet.entry.agent.Agent's `collectors`)."""
    return NodeOffloadCollector(node)
