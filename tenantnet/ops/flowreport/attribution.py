"""Why a flow is not offloaded, per pod: OVS's refusals and software flows blamed on attachments.

Two sources (formats in `plugin/system/offloadlog.py` and `plugin/system/dpflows.py`):

- the ovs-vswitchd log: each refusal OVS logged (tc flower / the NIC / the userspace
  datapath's offload) is blamed on the attachment whose OVS port it names — the device in the
  message first (that is where OVS put the tc rule: the flow's ingress port), else the flow's
  in_port (a name, or a datapath port number resolved with `dpctl/show`, or found through
  the flow's ufid elsewhere in the log);
- the flows that run in software and carry packets (`dpctl/dump-flows type=non-offloaded`
  text, or the report's own `-m` dump, where "software" is the same set): blamed on the
  attachment of the flow's in_port — the tc rule of a flow lives on its ingress device, so
  that is the port whose offload failed — or, when the in_port is no attachment (the uplink),
  on the attachments it outputs to.

What no attachment owns stays, as subject "node". Failures are grouped per (attachment,
reason) with the counts summed: `PodFailure`. `count_key` gives the labels of the metric
`tenantnet_offload_failures_total`, `failure_findings` the report's findings (one per
PodFailure), and `offload_failure_findings` is registered as a finding source of every
report (log lines from `report.snapshot.vswitchd_log`, which `tenantnetctl offload
--vswitchd-log PATH` fills).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tenantnet.ops.flowreport.report import AttachmentView, Finding, Report, register_finding_source
from tenantnet.plugin.drivers.offloadstate import SOFTWARE_ONLY_DATAPATHS
from tenantnet.plugin.system import offloadlog
from tenantnet.plugin.system.dpflows import (
    OFFLOADED,
    PARTIAL,
    SOFTWARE,
    DpFlow,
    parse_dump_flows,
    resolve_ports,
)

NOT_OFFLOADED = "not-offloaded"
SOFTWARE_DATAPATH = "software-datapath"
VETH_PORT = "veth-port"
OFFLOAD_DISABLED = "offload-disabled"

FIXES: dict[str, str] = {
    **offloadlog.FIXES,
    NOT_OFFLOADED: ("this flow stayed in software with hw-offload on: find its refusal in the ovs-vswitchd "
                    "log (tenantnetctl offload --vswitchd-log PATH, after `ovs-appctl vlog/set "
                    "netdev_offload_tc:file:dbg dpif_netlink:file:dbg`) and `tc -s filter show dev PORT "
                    "ingress` (not_in_hw rules)"),
    SOFTWARE_DATAPATH: ("none in the lab: its userspace datapath ('dummy', ovs-vswitchd --enable-dummy) "
                        "has no NIC, every flow runs in software by design; offload needs a switchdev NIC, "
                        "mode ovs-offload and the kernel datapath"),
    VETH_PORT: ("mode ovs attaches a veth, which no NIC can offload: use mode ovs-offload (a VF whose "
                "representor is the OVS port) for traffic that must run in hardware"),
    OFFLOAD_DISABLED: ("OVS offloads nothing while other_config:hw-offload is not true: ovs-vsctl set "
                       "Open_vSwitch . other_config:hw-offload=true, then restart ovs-vswitchd"),
}

# One line each, for finding messages.
DESCRIPTIONS: dict[str, str] = {
    offloadlog.CT_STATE: "tc cannot match the flow's conntrack state",
    offloadlog.MATCH: "tc flower cannot match a field of the flow",
    offloadlog.ACTION: "tc cannot do an action of the flow",
    offloadlog.TUNNEL: "tc cannot express the flow's tunnel match or encap",
    offloadlog.RECIRC: "the flow recirculates and its earlier stage is not in tc",
    offloadlog.TABLE_FULL: "the NIC's flow table is full",
    offloadlog.TC_NOT_SUPPORTED: "tc or the NIC refused the rule as unsupported",
    offloadlog.INVALID: "the kernel or driver rejected the rule as invalid",
    offloadlog.DEVICE_MISSING: "the rule's device is gone",
    offloadlog.NO_FLOW_API: "OVS has no flow API for the port",
    offloadlog.TC_MISMATCH: "tc installed a different rule than OVS asked for",
    offloadlog.NETDEV_FAILED: "the userspace datapath's offload refused the flow",
    offloadlog.OTHER: "OVS logged an offload failure tenantnet does not classify",
    NOT_OFFLOADED: "flows run in software and carry packets",
    SOFTWARE_DATAPATH: "flows run in the lab's userspace datapath (no NIC)",
    VETH_PORT: "flows run in software through a veth (not offloadable)",
    OFFLOAD_DISABLED: "flows run in software because hw-offload is off",
}
REASONS = tuple(DESCRIPTIONS)
_INFO_REASONS = frozenset({SOFTWARE_DATAPATH, VETH_PORT, OFFLOAD_DISABLED})
_EXAMPLE_CHARS = 400


@dataclass
class PodFailure:
    """Offload failures of one reason on one attachment (or on the node: no attachment owns them)."""

    namespace: str | None
    pod: str | None
    tenant: str | None
    network: str | None
    ifname: str | None
    port: str | None          # the attachment's OVS port; for the node: the device OVS named, if any
    reason: str
    fix: str
    count: int = 0            # refusals (log) or flows (software flows)
    example: str = ""         # the first line that said so
    packets: int = 0          # software flows: packets they carried (a snapshot, see report.py)
    source: str = "log"       # "log" or "flows"
    mode: str | None = None

    @property
    def subject(self) -> str:
        return f"{self.namespace}/{self.pod}" if self.pod is not None else "node"

    def to_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "namespace": self.namespace, "pod": self.pod,
                "tenant": self.tenant, "network": self.network, "ifname": self.ifname,
                "port": self.port, "reason": self.reason, "fix": self.fix, "count": self.count,
                "packets": self.packets, "source": self.source, "example": self.example}


def count_key(failure: PodFailure) -> dict[str, str]:
    """Labels of `tenantnet_offload_failures_total` for this failure ("" on the node)."""
    return {"namespace": failure.namespace or "", "pod": failure.pod or "",
            "network": failure.network or "", "reason": failure.reason}


def _view_key(view: AttachmentView) -> tuple[str, str, str]:
    return (view.network, view.container_id, view.ifname)


def _port_index(views: Iterable[AttachmentView]) -> dict[str, AttachmentView]:
    index: dict[str, AttachmentView] = {}
    for view in views:
        for name in (view.port, view.representor):
            if name:
                index.setdefault(name, view)
    return index


def _port_numbers(report: Report) -> dict[str, str]:
    numbers: dict[str, str] = {}
    for dp, _flows in report.snapshot.datapaths:
        numbers.update(dp.ports)
    return numbers


class _Groups:
    def __init__(self, shown: set[tuple[str, str, str]] | None) -> None:
        self.shown = shown
        self.groups: dict[tuple[tuple[str, str, str] | None, str], PodFailure] = {}

    def add(self, view: AttachmentView | None, reason: str, port: str | None, example: str,
            source: str, packets: int = 0) -> None:
        key = _view_key(view) if view is not None else None
        if key is not None and self.shown is not None and key not in self.shown:
            return  # a pod the report leaves out (--pod/--tenant/--network): not node-level either
        group = self.groups.get((key, reason))
        if group is None:
            group = PodFailure(
                namespace=view.namespace if view else None, pod=view.pod if view else None,
                tenant=view.tenant if view else None, network=view.network if view else None,
                ifname=view.ifname if view else None, port=view.port if view else port,
                reason=reason, fix=FIXES[reason], example=example[:_EXAMPLE_CHARS], source=source,
                mode=view.mode if view else None)
            self.groups[(key, reason)] = group
        group.count += 1
        group.packets += packets

    def result(self, order: list[AttachmentView]) -> list[PodFailure]:
        """Attachments in the report's order, then the node; reasons in REASONS order."""
        rank = {_view_key(v): i for i, v in enumerate(order)}
        items = sorted(self.groups.items(), key=lambda kv: (
            kv[0][0] is None, rank.get(kv[0][0], len(rank)) if kv[0][0] else 0,
            REASONS.index(kv[0][1]) if kv[0][1] in REASONS else len(REASONS)))
        return [failure for _key, failure in items]


def _software_flows(report: Report, nonoffloaded_text: str | None,
                    numbers: dict[str, str]) -> list[tuple[DpFlow, bool]]:
    """(flow, on a software-only datapath) for every flow in software that carries packets."""
    out: list[tuple[DpFlow, bool]] = []
    if nonoffloaded_text is not None:
        dump = parse_dump_flows(nonoffloaded_text)
        resolve_ports(dump.flows, numbers)
        lab = report.software_only
        # `type=non-offloaded` already left out flows in hardware; a -m line that says
        # offloaded:yes/partial (a full dump passed by mistake) is not counted.
        out.extend((f, lab) for f in dump.flows
                   if f.packets > 0 and f.classification not in (OFFLOADED, PARTIAL))
        return out
    for dp, flows in report.snapshot.datapaths:
        lab = dp.type in SOFTWARE_ONLY_DATAPATHS
        out.extend((f, lab) for f in flows if f.packets > 0 and f.classification == SOFTWARE)
    return out


def _flow_reason(report: Report, view: AttachmentView | None, lab: bool) -> str:
    if lab:
        return SOFTWARE_DATAPATH
    ovs = report.snapshot.ovs
    if not ovs.error and ovs.other_config.get("hw-offload") != "true":
        return OFFLOAD_DISABLED
    if view is not None and view.mode == "ovs":
        return VETH_PORT
    return NOT_OFFLOADED


def failures_for(report: Report, log_lines: Iterable[str] = (), nonoffloaded_text: str | None = None,
                 all_views: list[AttachmentView] | None = None) -> list[PodFailure]:
    """Every offload failure of this report's node, per (attachment, reason).

    `log_lines`: ovs-vswitchd log lines (bounded by the caller). `nonoffloaded_text`: output of
    `dpctl/dump-flows [-m] type=non-offloaded`; None: the report's own flows. `all_views`: every
    attachment of the node when the report is filtered (so that another pod's refusal is not
    mistaken for a node-level one); failures on attachments outside the report are dropped."""
    views = all_views if all_views is not None else report.attachments
    index = _port_index(views)
    numbers = _port_numbers(report)
    shown = {_view_key(v) for v in report.attachments} if all_views is not None else None
    groups = _Groups(shown)

    parse = offloadlog.parse_vswitchd_log(log_lines)
    offloadlog.resolve_refusals(parse, numbers)
    for ref in parse.refusals:
        names = [n for n in (ref.port, ref.in_port) if n]
        view = next((index[n] for n in names if n in index), None)
        groups.add(view, ref.reason, names[0] if names else None, ref.example, "log")

    for flow, lab in _software_flows(report, nonoffloaded_text, numbers):
        owners = [index[flow.in_port]] if flow.in_port in index else []
        if not owners:
            owners = list({_view_key(index[o]): index[o] for o in flow.outputs if o in index}.values())
        if not owners:
            groups.add(None, _flow_reason(report, None, lab), flow.in_port, flow.line, "flows", flow.packets)
        for view in owners:
            groups.add(view, _flow_reason(report, view, lab), view.port, flow.line, "flows", flow.packets)
    return groups.result(list(views))


def failure_findings(failures: Iterable[PodFailure]) -> list[Finding]:
    """One finding per PodFailure: code `offload-REASON`, subject the pod (or "node")."""
    out = []
    for f in failures:
        what = "flow(s)" if f.source == "flows" else "refusal(s)"
        where = (f"{f.port} ({f.subject} on {f.network})" if f.pod is not None
                 else f"{f.port} (no attachment's port)" if f.port else "the node")
        carried = f", carrying {f.packets} packets" if f.source == "flows" else ""
        severity = ("info" if f.reason in _INFO_REASONS
                    else "error" if f.reason == offloadlog.TABLE_FULL else "warning")
        said = DESCRIPTIONS.get(f.reason, f.reason)
        out.append(Finding(f"offload-{f.reason}", severity,
                           f"{f.count} {what} through {where}{carried}: {said}; e.g. {f.example}",
                           f.fix, f.subject))
    return out


def _all_views(report: Report) -> list[AttachmentView] | None:
    if report.complete:
        return None  # the report's own views are all of them
    if report.node is None or not getattr(report.node, "state_dir", None):
        return None
    from tenantnet.ops.flowreport.report import load_views

    try:
        return load_views(report.node)[0]
    except Exception:  # unreadable records: attribute against the report's own views
        return None


@register_finding_source
def offload_failure_findings(report: Report) -> list[Finding]:
    """The report's per-pod offload failures (log lines: report.snapshot.vswitchd_log)."""
    return failure_findings(failures_for(report, report.snapshot.vswitchd_log, None, _all_views(report)))
