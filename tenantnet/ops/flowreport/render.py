"""Output formats of the offload report: a table for people, JSON, Prometheus text.

This module owns presentation only. The Prometheus families are built in collector.py
(prometheus-client writes the text); every metric and label is documented in
docs/offload.md — keep the two in step.
"""

from __future__ import annotations

import json

from tenantnet.ops.flowreport.report import Report

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
    elif report.simulation:
        lines.append("NOTE: a simulation — the lab's NIC (tenantnet/lab/nic.py: veths stand in for VFs and "
                     "representors). Every flow below, the tunnel's encap/decap included, runs in OVS's "
                     "software datapath and says nothing about hardware.")
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
        tun = a.tunnel_totals
        if tun["encap"]["flows"] or tun["decap"]["flows"]:
            kinds = sorted({r.tunnel.split(" ")[0] for r in a.flows if r.tunnel})
            lines.append(
                f"    tunnel ({'/'.join(kinds)}): encap {tun['encap']['flows']} flows "
                f"({tun['encap']['packets']} packets, {tun['encap']['hwFlows']} in hardware), decap "
                f"{tun['decap']['flows']} flows ({tun['decap']['packets']} packets, "
                f"{tun['decap']['hwFlows']} in hardware)")
        if a.flows:
            lines.append(f"    {'dir':<4} {'class':<9} {'packets':>10} {'bytes':>12} {'used':>7}  "
                         f"{'dp':<5} {'in_port':<14} actions")
        for r in sorted(a.flows, key=lambda r: -r.flow.packets):
            f = r.flow
            label = f"[{r.tunnel}] " if r.tunnel else ""
            lines.append(f"    {r.direction:<4} {f.classification:<9} {f.packets:>10} {f.bytes:>12} "
                         f"{_used(f.used):>7}  {f.dp or '-':<5} {f.in_port or '-':<14} {label}{f.actions}")
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


def render_prometheus(report: Report) -> str:
    """The report in Prometheus' text format, as the agent's /metrics serves it (collector.py)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from tenantnet.ops.flowreport.collector import ReportCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(report))
    return generate_latest(registry).decode()
