"""Output formats of the offload report: a table for people, JSON, Prometheus text.

This module owns presentation only. The Prometheus output follows the text exposition
format 0.0.4 (`# HELP`, `# TYPE`, `name{label="value"} number`, label values escaped
for backslash, double quote and newline). Every metric and label is documented in
docs/offload.md — keep the two in step.
"""

from __future__ import annotations

import json
import math

from tenantnet.ops.flowreport.report import AttachmentView, Report
from tenantnet.plugin.system.dpflows import CLASSES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "tenantnet_offload_"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _used(u: float | None) -> str:
    return "never" if u is None else f"{u:.1f}s"


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)


def render_table(report: Report) -> str:
    snap = report.snapshot
    lines = [f"offload report for node {report.hostname} (vswitchd: {snap.target.path})"]
    if snap.error:
        lines.append(f"ERROR: {snap.error}")
    hw = snap.ovs.other_config.get("hw-offload") or "unset"
    pol = snap.ovs.other_config.get("tc-policy") or "unset (none)"
    version = f" {snap.ovs.ovs_version}" if snap.ovs.ovs_version else ""
    lines.append(f"OVS{version}: hw-offload={hw}, tc-policy={pol}")
    for d in report.datapaths:
        lines.append(f"datapath {d.name}: {d.flows} flows — {d.note}")
    if report.software_only:
        lines.append("NOTE: this is the lab. Its flows run in OVS's userspace datapath, not in a NIC: "
                     "'software' below is the truth for the lab and says nothing about hardware.")
    lines.append("")
    if not report.attachments:
        lines.append("no attachments (matching the filters) on this node")
    for a in report.attachments:
        t = a.totals
        lines.append(
            f"{a.pod_ref}  tenant {a.tenant or '-'}  network {a.network}  {a.ifname}  mode {a.mode}  "
            f"port {a.port or '-'}" + (f"  representor {a.representor}" if a.representor else ""))
        if a.port is None:
            lines.append("    not on OVS: no datapath flows")
            lines.append("")
            continue
        unknown = f", unknown {t['unknown']['flows']}" if t["unknown"]["flows"] else ""
        lines.append(
            f"    flows {len(a.flows)}: offloaded {t['offloaded']['flows']}, "
            f"partial {t['partial']['flows']}, software {t['software']['flows']}{unknown}; in hardware: "
            f"{_pct(a.hw_flow_share)} of flows, {_pct(a.hw_packet_share)} of {a.packets} packets")
        if a.flows:
            lines.append(f"    {'dir':<4} {'class':<9} {'packets':>10} {'bytes':>12} {'used':>7}  "
                         f"{'dp':<5} {'in_port':<14} actions")
        for r in sorted(a.flows, key=lambda r: -r.flow.packets):
            f = r.flow
            lines.append(f"    {r.direction:<4} {f.classification:<9} {f.packets:>10} {f.bytes:>12} "
                         f"{_used(f.used):>7}  {f.dp or '-':<5} {f.in_port or '-':<14} {f.actions}")
        lines.append("")
    tenants = report.tenants()
    if report.attachments and any(k != "(none)" for k in tenants):
        lines.append("per tenant:")
        for name, t in sorted(tenants.items()):
            lines.append(f"    {name}: {t['attachments']} attachments, {t['flows']} flows, "
                         f"{t['packets']} packets; in hardware {_pct(t['hwFlowShare'])} of flows, "
                         f"{_pct(t['hwPacketShare'])} of packets")
        lines.append("")
    if report.findings:
        lines.append("findings:")
        for f in report.findings:
            lines.append(f"  [{f.severity}] {f.code}: {f.message}")
            lines.append(f"      fix: {f.fix}")
    return "\n".join(lines).rstrip() + "\n"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float) and not v.is_integer():
        return repr(v)
    return str(int(v))


class _Metrics:
    def __init__(self) -> None:
        self.order: list[str] = []
        self.meta: dict[str, tuple[str, str]] = {}
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}

    def declare(self, name: str, kind: str, help_text: str) -> None:
        full = PREFIX + name
        self.order.append(full)
        self.meta[full] = (kind, help_text)
        self.samples[full] = []

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        self.samples[PREFIX + name].append((labels, value))

    def text(self) -> str:
        out = []
        for name in self.order:
            kind, help_text = self.meta[name]
            out.append(f"# HELP {name} {_escape_help(help_text)}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in self.samples[name]:
                body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
                out.append(f"{name}{{{body}}} {_value(value)}" if body else f"{name} {_value(value)}")
        return "\n".join(out) + "\n"


def _attachment_labels(a: AttachmentView) -> dict[str, str]:
    return {"namespace": a.namespace, "pod": a.pod, "tenant": a.tenant or "", "network": a.network,
            "ifname": a.ifname, "port": a.port or "", "mode": a.mode}


def render_prometheus(report: Report) -> str:
    m = _Metrics()
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
    return m.text()
