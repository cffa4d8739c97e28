"""The offload report: attachments on this node, their datapath flows, shares, findings.

This module owns the *meaning*: which flows belong to which attachment (in_port or an
output is the attachment's OVS port), per-attachment and per-tenant totals, node-level
findings with a fix each, the hook through which other checks add findings, and
`attachment_offload` (what CHECK with `"offloadCheck": "require"` sees). Text formats are
in `plugin/system/dpflows.py`, process calls in `plugin/system/dpctl.py`, output formats in
`render.py`.

One module on purpose (≈ 470 lines): the report's model, the attribution of flows to
attachments and the findings all read the same objects, and each part alone would import
the other two. The OVS port of an attachment is the one its plan names (drivers/ovsport.py: the
representor for ovs-offload, the veth's host end for ovs). Datapath flows exist only while
traffic hits them (OVS expires them after ~10 s idle), so the counters here are those of
the flows present now — a snapshot, not a running total.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tenantnet.plugin import modes
from tenantnet.plugin.drivers import offloadstate, ovsport
from tenantnet.plugin.drivers.offloadstate import SOFTWARE_ONLY_DATAPATHS, OffloadSummary
from tenantnet.plugin.system import dpctl as source
from tenantnet.plugin.system.dpflows import (
    CLASSES,
    OFFLOADED,
    PARTIAL,
    SOFTWARE,
    DpFlow,
    SkippedLine,
    parse_dump_flows,
    resolve_ports,
)

# What each datapath type means for offload, said plainly in every report.
DATAPATH_NOTES = {
    "dummy": ("the lab's userspace datapath (dpif-netdev, registered as 'dummy' by "
              "ovs-vswitchd --enable-dummy): every flow runs in software inside ovs-vswitchd; "
              "there is no NIC, so nothing here can be offloaded"),
    "netdev": ("userspace datapath (OVS-DPDK / AF_XDP): dp:ovs flows run on the PMD cores; "
               "with hw-offload=true the NIC can take them fully (rte_flow) or partially"),
    "system": ("Linux kernel datapath: with hw-offload=true OVS puts flows into tc flower, "
               "and the NIC's eswitch takes those it can (offloaded:yes, dp:tc)"),
}


@dataclass
class Finding:
    code: str        # stable identifier, also a Prometheus label value
    severity: str    # "info", "warning" or "error"
    message: str
    fix: str
    subject: str = "node"  # "node", or the attachment / port it is about

    def to_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass
class FlowRef:
    flow: DpFlow
    datapath: str
    direction: str  # "in" (from the pod), "out" (to the pod), "both"
    tunnel: str | None = None  # "geneve encap", "geneve decap" (tunnel_role): an overlay's flow


ENCAP, DECAP = "encap", "decap"


def _tunnel_kind(text: str) -> str:
    if "geneve" in text or "genev_sys" in text or "6081" in text:
        return "geneve"
    if "vxlan" in text or "4789" in text:
        return "vxlan"
    return "tunnel"


def tunnel_role(flow: DpFlow) -> str | None:
    """An overlay attachment's flow that encapsulates (the kernel datapath's
    `set(tunnel(...))` before the tunnel port, the userspace one's `tnl_push(...)`) or that
    delivers a decapsulated packet (its match has `tunnel(...)`, or it comes in on the
    tunnel port): "geneve encap" / "geneve decap"; None for any other flow."""
    if "tnl_push(" in flow.actions or "set(tunnel(" in flow.actions:
        return f"{_tunnel_kind(flow.actions)} {ENCAP}"
    came = flow.in_port or ""
    if "tunnel(" in flow.match_text or came.startswith(("genev_sys", "vxlan_sys")):
        return f"{_tunnel_kind(flow.match_text + ' ' + came)} {DECAP}"
    return None


def _totals(flows: Iterable[DpFlow]) -> dict[str, dict[str, int]]:
    t = {c: {"flows": 0, "packets": 0, "bytes": 0} for c in CLASSES}
    for f in flows:
        t[f.classification]["flows"] += 1
        t[f.classification]["packets"] += f.packets
        t[f.classification]["bytes"] += f.bytes
    return t


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass
class AttachmentView:
    network: str
    container_id: str
    ifname: str
    mode: str
    phase: str
    namespace: str
    pod: str
    tenant: str | None
    port: str | None          # the OVS port (representor or veth host end); None: not on OVS
    representor: str | None
    bridge: str | None
    record: Any = field(default=None, repr=False)  # the AttachmentRecord, for finding hooks
    flows: list[FlowRef] = field(default_factory=list)

    @property
    def pod_ref(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def totals(self) -> dict[str, dict[str, int]]:
        return _totals(r.flow for r in self.flows)

    @property
    def packets(self) -> int:
        return sum(r.flow.packets for r in self.flows)

    @property
    def hw_packet_share(self) -> float | None:
        return _share(self.totals[OFFLOADED]["packets"], self.packets)

    @property
    def hw_flow_share(self) -> float | None:
        return _share(self.totals[OFFLOADED]["flows"], len(self.flows))

    @property
    def tunnel_totals(self) -> dict[str, dict[str, int]]:
        """The overlay's flows of this attachment: encap (pod → tunnel) and decap (tunnel →
        pod), each with its flows, packets and those of them in hardware."""
        out = {k: {"flows": 0, "packets": 0, "hwFlows": 0} for k in (ENCAP, DECAP)}
        for r in self.flows:
            if r.tunnel:
                t = out[r.tunnel.rsplit(" ", 1)[1]]
                t["flows"] += 1
                t["packets"] += r.flow.packets
                t["hwFlows"] += r.flow.classification == OFFLOADED
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod_ref, "namespace": self.namespace, "name": self.pod, "tenant": self.tenant,
            "network": self.network, "containerID": self.container_id, "ifname": self.ifname,
            "mode": self.mode, "phase": self.phase, "port": self.port, "representor": self.representor,
            "bridge": self.bridge, "totals": self.totals, "packets": self.packets,
            "hwPacketShare": self.hw_packet_share, "hwFlowShare": self.hw_flow_share,
            "tunnel": self.tunnel_totals,
            "flows": [{**r.flow.to_dict(), "datapath": r.datapath, "direction": r.direction,
                       "tunnel": r.tunnel} for r in self.flows],
        }


@dataclass
class DatapathInfo:
    name: str
    type: str
    note: str
    flows: int = 0
    totals: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class Snapshot:
    """What was read from OVS, before any attachment is looked at."""

    target: source.Target
    datapaths: list[tuple[source.Datapath, list[DpFlow]]] = field(default_factory=list)
    skipped: list[SkippedLine] = field(default_factory=list)
    ovs: source.OvsState = field(default_factory=source.OvsState)
    error: str | None = None
    duration: float = 0.0
    # ovs-vswitchd log lines read with it (tenantnetctl offload --vswitchd-log), for the
    # per-pod offload failures of attribution.py
    vswitchd_log: list[str] = field(default_factory=list)


@dataclass
class Report:
    hostname: str
    generated: float
    snapshot: Snapshot
    datapaths: list[DatapathInfo]
    attachments: list[AttachmentView]
    findings: list[Finding] = field(default_factory=list)
    node: Any = field(default=None, repr=False)
    # Every attachment of the node is in `attachments` (no filter): finding sources that need
    # the whole node need not read the records again.
    complete: bool = False

    @property
    def ok(self) -> bool:
        return self.snapshot.error is None

    @property
    def software_only(self) -> bool:
        """True when every datapath is one that cannot offload (the lab)."""
        return bool(self.datapaths) and all(d.type in SOFTWARE_ONLY_DATAPATHS for d in self.datapaths)

    @property
    def simulation(self) -> bool:
        """The lab: a datapath that cannot offload, or the lab's simulated NIC (node config
        `vfControl: lab:...`, tenantnet/lab/nic.py) — as on an overlay lab node, whose OVS
        is a netdev datapath without a NIC."""
        lab_nic = str(getattr(self.node, "vf_control", "") or "").startswith("lab:")
        return self.software_only or lab_nic

    def tenants(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for a in self.attachments:
            key = a.tenant or "(none)"
            t = out.setdefault(key, {"attachments": 0, "flows": 0, "packets": 0,
                                     "hwFlows": 0, "hwPackets": 0})
            t["attachments"] += 1
            t["flows"] += len(a.flows)
            t["packets"] += a.packets
            t["hwFlows"] += a.totals[OFFLOADED]["flows"]
            t["hwPackets"] += a.totals[OFFLOADED]["packets"]
        for t in out.values():
            t["hwPacketShare"] = _share(t["hwPackets"], t["packets"])
            t["hwFlowShare"] = _share(t["hwFlows"], t["flows"])
        return out

    def to_dict(self) -> dict[str, Any]:
        snap = self.snapshot
        return {
            "node": self.hostname, "generated": self.generated, "ok": self.ok, "error": snap.error,
            "appctlTarget": {"path": snap.target.path, "how": snap.target.how},
            "softwareOnly": self.software_only, "simulation": self.simulation,
            "ovs": {"version": snap.ovs.ovs_version, "hwOffload": snap.ovs.other_config.get("hw-offload"),
                    "tcPolicy": snap.ovs.other_config.get("tc-policy"), "error": snap.ovs.error},
            "datapaths": [d.__dict__ for d in self.datapaths],
            "skippedLines": [s.__dict__ for s in snap.skipped],
            "attachments": [a.to_dict() for a in self.attachments],
            "tenants": self.tenants(),
            "findings": [f.to_dict() for f in self.findings],
        }


# ---- reading -------------------------------------------------------------------------------

def collect(node: Any, appctl_target: str | None = None, timeout: float | None = None,
            settings: bool = True) -> Snapshot:
    """Read every datapath's flows (and, with `settings`, OVSDB's other_config); errors end up
    in `error` / `ovs.error`, not raised."""
    started = time.monotonic()
    timeout = timeout or getattr(node, "ovsdb_timeout", source.DEFAULT_TIMEOUT)
    snap = Snapshot(target=source.find_target(node.ovsdb, appctl_target))
    try:
        for dp in source.read_datapaths(snap.target.path, timeout):
            dump = parse_dump_flows(dp.text)
            resolve_ports(dump.flows, dp.ports)
            snap.datapaths.append((dp, dump.flows))
            snap.skipped.extend(dump.skipped)
    except source.OffloadError as exc:
        snap.error = str(exc)
    if settings:
        snap.ovs = source.read_ovs_state(node.ovsdb, timeout)
    snap.duration = time.monotonic() - started
    return snap


def snapshot_from_text(text: str, dp_type: str = "system", dp_name: str = "system@ovs-system",
                       ports: dict[str, str] | None = None, other_config: dict[str, str] | None = None,
                       assume_offloaded: bool = False) -> Snapshot:
    """A snapshot from saved dump text (tests, and reports on a dump an operator sent us)."""
    dump = parse_dump_flows(text, assume_offloaded)
    resolve_ports(dump.flows, ports or {})
    dp = source.Datapath(dp_type, dp_name, text, ports or {})
    return Snapshot(target=source.Target("(text)", "given as text"), datapaths=[(dp, dump.flows)],
                    skipped=dump.skipped, ovs=source.OvsState(other_config=dict(other_config or {})))


# ---- attachments ---------------------------------------------------------------------------

def attachment_port(record: Any) -> tuple[str | None, str | None]:
    """(OVS port, representor) of a record: the representor for ovs-offload, else the veth."""
    rep = getattr(record.plan, "representor", None)
    return ovsport.port_of(record.plan), rep


def _tenant_of(policy: Any, namespace: str) -> str | None:
    if policy is None or not namespace:
        return None
    tenant = policy.tenant_of(namespace)
    return tenant.name if tenant else None


def view_of(record: Any, policy: Any = None) -> AttachmentView:
    port, rep = attachment_port(record)
    return AttachmentView(
        network=record.network, container_id=record.container_id, ifname=record.ifname,
        mode=record.mode, phase=record.phase, namespace=record.pod.namespace, pod=record.pod.name,
        tenant=_tenant_of(policy, record.pod.namespace), port=port, representor=rep,
        bridge=record.plan.bridge if isinstance(record.plan, ovsport.PortPlan) else None, record=record,
    )


def attach_flows(views: list[AttachmentView], snap: Snapshot) -> None:
    """Give each view the flows whose in_port or an output is its port, in dump order.

    Through an index of ports to flows, built once: a flood flow on a node with a thousand
    ports names a hundred outputs, and asking every view of every flow (`DpFlow.touches`)
    cost seconds per report there."""
    by_port: dict[str, list[tuple[str, DpFlow]]] = {}  # each list in dump order
    for dp, flows in snap.datapaths:
        for flow in flows:
            for port in {flow.in_port, *flow.outputs} - {None}:
                by_port.setdefault(str(port), []).append((dp.name, flow))
    for view in views:
        view.flows = []
        if view.port:
            for dp_name, flow in by_port.get(view.port, ()):
                direction = flow.touches(view.port)
                if direction:
                    view.flows.append(FlowRef(flow, dp_name, direction, tunnel_role(flow)))


@dataclass
class Filters:
    pod: str | None = None      # NS/NAME
    tenant: str | None = None
    network: str | None = None

    def keep(self, v: AttachmentView) -> bool:
        return ((self.pod is None or v.pod_ref == self.pod)
                and (self.tenant is None or v.tenant == self.tenant)
                and (self.network is None or v.network == self.network))


def load_views(node: Any, filters: Filters | None = None) -> tuple[list[AttachmentView], list[str]]:
    """Views of every attachment record on the node (plus warnings about unreadable ones)."""
    from tenantnet.plugin import tenancy
    from tenantnet.plugin.records import CorruptRecord, RecordStore

    policy = tenancy.load(node)
    views, warnings = [], []
    for rec in RecordStore(node.state_dir, modes.plan_type).list(filters.network if filters else None):
        if isinstance(rec, CorruptRecord):
            warnings.append(str(rec))
            continue
        view = view_of(rec, policy)
        if filters is None or filters.keep(view):
            views.append(view)
    return views, warnings


# ---- findings ------------------------------------------------------------------------------

FindingSource = Callable[[Report], Iterable[Finding]]
# Checks other modules add (eswitch mode, hw-tc-offload from sysfs): each gets the whole
# report (attachments carry their records, `report.node` the node config) and returns findings.
FINDING_SOURCES: list[FindingSource] = []


def register_finding_source(fn: FindingSource) -> FindingSource:
    """Add a check to every report; usable as a decorator. Idempotent."""
    if fn not in FINDING_SOURCES:
        FINDING_SOURCES.append(fn)
    return fn


def _db_flag(node: Any) -> str:
    return f"--db={node.ovsdb} " if node is not None and getattr(node, "ovsdb", None) else ""


def node_findings(report: Report) -> list[Finding]:
    snap, out = report.snapshot, []
    db = _db_flag(report.node)
    if snap.error:
        out.append(Finding("flows-unreadable", "error", f"could not read datapath flows: {snap.error}",
                           "start ovs-vswitchd, or point at its control socket with --appctl-target PATH"))
    if snap.ovs.error:
        out.append(Finding("ovsdb-unreadable", "warning", f"could not read OVS settings: {snap.ovs.error}",
                           "check the node config's ovsdb endpoint and that ovsdb-server runs"))
    if report.software_only:
        names = ", ".join(d.name for d in report.datapaths)
        out.append(Finding("lab-datapath", "info",
                           f"datapath {names} is {DATAPATH_NOTES['dummy']}. Flows shown as software "
                           "here say nothing about a real NIC.",
                           "none in the lab; on a node with a switchdev NIC use mode ovs-offload on the "
                           "kernel (system) datapath"))
    offload_attachments = [a for a in report.attachments if a.mode == "ovs-offload"]
    hw = snap.ovs.other_config.get("hw-offload")
    policy = snap.ovs.other_config.get("tc-policy")
    if not snap.ovs.error and hw != "true":
        lab = " (expected in the lab: there is no NIC to offload to)" if report.software_only else ""
        out.append(Finding(
            "hw-offload-off", "warning" if offload_attachments else "info",
            f"OVS other_config:hw-offload is {hw or 'unset (default false)'}: OVS offloads no flow, every "
            f"datapath flow runs in software{lab}",
            f"ovs-vsctl {db}set Open_vSwitch . other_config:hw-offload=true, then restart ovs-vswitchd "
            "(it reads the setting once at start)"))
        if policy and policy != "none":
            out.append(Finding("tc-policy-ignored", "info",
                               f"other_config:tc-policy={policy} has no effect while hw-offload is off",
                               "enable hw-offload first (see hw-offload-off)"))
    elif hw == "true" and policy == "skip_hw":
        out.append(Finding(
            "tc-policy-skip-hw", "warning",
            "other_config:tc-policy=skip_hw: OVS adds tc rules in software only — nothing reaches the NIC",
            f"ovs-vsctl {db}set Open_vSwitch . other_config:tc-policy=none (the default: software and "
            "hardware rule), then restart ovs-vswitchd"))
    elif hw == "true" and policy == "skip_sw":
        out.append(Finding(
            "tc-policy-skip-sw", "info",
            "other_config:tc-policy=skip_sw: rules go to the NIC only; a rule the NIC refuses gets no tc "
            "rule, and its flow stays in the OVS datapath (dp:ovs)",
            "fine for a NIC that takes every rule; use tc-policy=none to keep a tc software copy "
            "(rules show as dp:tc, not_in_hw when the NIC refuses them)"))
    if hw == "true":
        for a in offload_attachments:
            t = a.totals
            stuck = t[SOFTWARE]
            if stuck["flows"] and stuck["packets"]:
                out.append(Finding(
                    "flows-not-offloaded", "warning",
                    f"{stuck['flows']} flow(s) through {a.port} ({a.pod_ref} on {a.network}) run in software "
                    f"with hw-offload on, carrying {stuck['packets']} packets",
                    f"ovs-appctl dpctl/dump-flows -m type=non-offloaded shows them; `tc -s filter show dev "
                    f"{a.port} ingress` shows not_in_hw rules; look in the ovs-vswitchd log for offload "
                    "errors: actions or matches the NIC cannot do (e.g. unsupported ct states, encaps) "
                    "keep a flow in software"))
    partial = sum(len([r for r in a.flows if r.flow.classification == PARTIAL]) for a in report.attachments)
    if partial:
        out.append(Finding("partial-offload", "info",
                           f"{partial} flow(s) are partially offloaded: the NIC classifies (marks) the "
                           "packets, the actions still run on the CPU",
                           "full offload needs a datapath/NIC combination that supports the flow's actions "
                           "(e.g. OVS-DOCA, or the kernel datapath with tc)"))
    if snap.skipped:
        first = snap.skipped[0]
        out.append(Finding("unparsed-lines", "warning",
                           f"{len(snap.skipped)} line(s) of dump-flows output could not be read "
                           f"(first: line {first.number}: {first.why})",
                           "report the line (tenantnetctl offload --json lists them) so the parser "
                           "learns it"))
    return out


def _run_sources(report: Report, sources: Iterable[FindingSource]) -> list[Finding]:
    out: list[Finding] = []
    for fn in sources:
        try:
            out.extend(fn(report))
        except Exception as exc:  # a broken check must not hide the rest of the report
            out.append(Finding("check-failed", "warning",
                               f"finding source {getattr(fn, '__name__', fn)!r} failed: {exc}",
                               "fix or remove that check"))
    return out


def build_report(node: Any, snap: Snapshot, views: list[AttachmentView],
                 extra_findings: Iterable[FindingSource] = (), *, complete: bool = False) -> Report:
    """`complete`: `views` are all of the node's attachments (not a filtered selection)."""
    attach_flows(views, snap)
    dps = []
    for dp, flows in snap.datapaths:
        dps.append(DatapathInfo(dp.name, dp.type, DATAPATH_NOTES.get(dp.type, f"datapath type {dp.type}"),
                                len(flows), _totals(flows)))
    report = Report(hostname=socket.gethostname(), generated=time.time(), snapshot=snap,
                    datapaths=dps, attachments=views, node=node, complete=complete)
    report.findings = node_findings(report) + _run_sources(report, [*FINDING_SOURCES, *extra_findings])
    return report


def report_for_node(node: Any, filters: Filters | None = None, appctl_target: str | None = None,
                    timeout: float | None = None,
                    extra_findings: Iterable[FindingSource] = ()) -> tuple[Report, list[str]]:
    views, warnings = load_views(node, filters)
    return build_report(node, collect(node, appctl_target, timeout), views, extra_findings,
                        complete=filters is None), warnings


# ---- CHECK ---------------------------------------------------------------------------------

def summarize(view: AttachmentView, snap: Snapshot) -> OffloadSummary:
    """The offload summary of one attachment in a snapshot (what CHECK computes live)."""
    return offloadstate.summarize(view.port, [r.flow for r in view.flows],
                                  [dp.type for dp, _ in snap.datapaths], snap.error)


def attachment_offload(record: Any, node: Any, appctl_target: str | None = None,
                       timeout: float | None = None) -> OffloadSummary:
    """The offload state of one attachment now (as CHECK with offloadCheck sees it). Never
    raises for OVS trouble: `error` says it."""
    return offloadstate.port_offload(node, attachment_port(record)[0], appctl_target, timeout)


@register_finding_source
def eswitch_findings(report: Report) -> list[Finding]:
    """For ovs-offload attachments: eswitch not in switchdev mode, hw-tc-offload off on the PF or
    the representor — the checks ADD makes (tenantnet/plugin/drivers/offloadstate.py)."""
    views = [a for a in report.attachments if a.mode == "ovs-offload" and getattr(a, "record", None)]
    if not views or report.node is None:
        return []
    from tenantnet.plugin.drivers.ovs_offload import OvsOffloadDriver
    from tenantnet.plugin.drivers.vf import VfPlan
    from tenantnet.plugin.system.sysfs import SysfsError

    driver = OvsOffloadDriver(report.node)
    codes = {"eswitchSwitchdev": "eswitch-legacy", "hwTcOffload": "hw-tc-offload-off"}
    found: dict[tuple[str, str], Finding] = {}
    for view in views:
        plan = view.record.plan
        if not isinstance(plan, VfPlan) or not plan.device_id:
            continue
        try:
            vf = driver.sysfs.vf(plan.device_id)
        except SysfsError:
            continue
        for miss in offloadstate.vf_preconditions(driver.control, vf, view.representor):
            found[(miss.key, miss.problem)] = Finding(codes[miss.key], "error", miss.problem + ": no flow of "
                                                      "this attachment can be offloaded", miss.fix,
                                                      view.port or "node")
    return list(found.values())
