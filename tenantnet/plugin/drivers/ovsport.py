"""The OVS port of an attachment, shared by the modes that make one (`ovs`: the host end of
a veth; `ovs-offload`: a VF's representor): its part of the plan, the one transaction that
adds it with VLAN/trunks, MTU and ownership, its CHECK, and finding unrecorded ports for GC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from cni.errors import CniError, Code
from tenantnet.plugin import faults
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import AttachmentRecord, Plan, PodRef
from tenantnet.plugin.system import netlink, ovsdb
from tenantnet.plugin.tnconf import TenantnetConf

if TYPE_CHECKING:
    from cni.env import CniEnv
    from tenantnet.plugin.drivers.base import Pending

EXT_NETWORK = "tenantnet-network"
EXT_CONTAINER = ovsdb.OWNER_CONTAINER
EXT_IFNAME = ovsdb.OWNER_IFNAME
EXT_NETNS = "tenantnet-netns"
EXT_POD_NS = "tenantnet-pod-namespace"
EXT_POD_NAME = "tenantnet-pod-name"
EXT_POD_UID = "tenantnet-pod-uid"
STEP_PORT = "port"
IFACE_ID = "iface-id"


PREWARM_PENDING = "pending"  # the network pre-warms; this ADD has not got to it (yet)
# Pre-warm pairs ports of one bridge by OpenFlow number; an overlay's peers are behind its
# tunnels, so an overlay attachment is not warmed (its tunnel flows neither): said per pod.
PREWARM_NOT_ON_OVERLAY = "not warmed: overlay"


@dataclass
class PortPlan(Plan):
    """Where the port goes and how it is set (from the network config at ADD)."""

    bridge: str | None = None
    ovsdb: str | None = None  # the endpoint; None: the node's
    vlan: int | None = None
    trunks: list[int] = field(default_factory=list)
    mtu: int | None = None
    ofport_request: int | None = None
    # Pre-warm (drivers/prewarm.py): "" when the network does not pre-warm, else its state
    # (PREWARM_PENDING until the ADD gets to it); and how many OpenFlow rules its ADD wrote.
    prewarm: str = ""
    prewarm_rules: int = 0
    # An overlay network (drivers/ovnport.py): the logical switch and its port (bound by the
    # OVS port's iface-id), the NB endpoint and its time-out, the network's segment, the pod
    # MAC port security names (fixed here, before anything exists), and whether the pod end
    # must compute its TX checksums (a userspace datapath).
    overlay_switch: str = ""
    overlay_port: str = ""
    overlay_nb: str = ""
    overlay_timeout: float = 5.0
    overlay_segment: int | None = None
    overlay_install_timeout: float = 0.0  # s an ADD waits for ovn-controller's flows (0: not)
    pod_mac: str = ""
    tx_checksum_off: bool = False
    # Why the network's pre-warm did not run for this attachment ("" when it was not asked).
    prewarm_note: str = ""
    _SPARSE: ClassVar[frozenset[str]] = frozenset({
        "overlay_switch", "overlay_port", "overlay_nb", "overlay_timeout", "overlay_segment", "pod_mac",
        "tx_checksum_off", "prewarm_note", "overlay_install_timeout"})

    def on_overlay(self) -> bool:
        return bool(self.overlay_port)

    def prewarms(self) -> bool:
        """The network pre-warms: drivers/prewarm.py (and its imports) is needed only then."""
        return bool(self.prewarm)

    def port_name(self) -> str | None:
        """The attachment's OVS port (each mode's plan says which of its links it is)."""
        return None


def ovsdb_for(node: NodeConfig, endpoint: str | None = None) -> ovsdb.Ovsdb:
    """The process-wide OVSDB handle for `endpoint` (default: the node's), with the node's
    time-out and vswitchd wait."""
    return ovsdb.connect(endpoint or node.ovsdb, node.ovsdb_timeout, node.ovs_wait)


def add_owned_port(db: ovsdb.Ovsdb, record: AttachmentRecord, plan: PortPlan, port: str) -> None:
    """The attachment's OVS port: VLAN, MTU and ownership in one transaction. A bridge that
    does not exist is the network config's error (code 7)."""
    pod = record.pod
    faults.step("ovs.port-adding")
    spec = (
        ovsdb.PortSpec(
            bridge=plan.bridge or "",
            name=port,
            tag=plan.vlan,
            trunks=list(plan.trunks),
            mtu=plan.mtu,
            ofport_request=plan.ofport_request,
            external_ids={
                EXT_NETWORK: record.network,
                EXT_CONTAINER: record.container_id,
                EXT_IFNAME: record.ifname,
                EXT_NETNS: record.netns,
                EXT_POD_NS: pod.namespace,
                EXT_POD_NAME: pod.name,
                EXT_POD_UID: pod.uid,
                # ovn-controller binds the logical port of this name to this chassis.
                **({IFACE_ID: plan.overlay_port} if plan.overlay_port else {}),
            },
        )
    )
    try:
        db.add_port(spec)
    except ovsdb.BridgeNotFound:
        raise CniError(Code.INVALID_CONFIG, f"invalid network config: bridge={plan.bridge!r}: no such "
                                            f"bridge in OVSDB at {db.endpoint}") from None
    faults.step("ovs.port-added")


def check_owned_port(db: ovsdb.Ovsdb, record: AttachmentRecord, plan: PortPlan, name: str) -> list[str]:
    """Differences between the attachment's OVS port and its record."""
    port = db.port(name)
    if port is None:
        return [f"OVS port {name} is missing"]
    drift = []
    if port.bridge != plan.bridge:
        drift.append(f"OVS port {name} is on bridge {port.bridge!r}, expected {plan.bridge!r}")
    if port.tag != plan.vlan:
        drift.append(f"OVS port {name} has tag {port.tag!r}, expected {plan.vlan!r}")
    if port.trunks != list(plan.trunks):
        drift.append(f"OVS port {name} has trunks {port.trunks}, expected {plan.trunks}")
    if not port.owned:
        drift.append(f"OVS port {name} lost its ownership tag {ovsdb.OWNER_KEY}")
    ids = port.external_ids
    for key, want in ((EXT_CONTAINER, record.container_id), (EXT_IFNAME, record.ifname),
                      (EXT_NETWORK, record.network)):
        if ids.get(key) != want:
            drift.append(f"OVS port {name} external_ids:{key}={ids.get(key)!r}, expected {want!r}")
    if port.error:
        drift.append(f"OVS interface {name} reports error: {port.error}")
    return drift


def link_drift(name: str, what: str) -> list[str]:
    """A host-side link of the attachment that is missing or down."""
    link = netlink.host_link(name)
    if link is None:
        return [f"{what} {name} is missing"]
    return [] if link.up else [f"{what} {name} is down"]


def unrecorded_ports(db: ovsdb.Ovsdb, network: str, mode: str, known: set[tuple[str, str]],
                     plan_of: Callable[[ovsdb.PortState], Plan]) -> list[AttachmentRecord]:
    """Synthetic records for our ports on `network` whose (container id, ifname) is not in
    `known`, rebuilt from the identity their external_ids carry; `plan_of` gives the plan."""
    found = []
    for port in db.owned_ports():
        ids = port.external_ids
        ident = (ids.get(EXT_CONTAINER, ""), ids.get(EXT_IFNAME, ""))
        if ids.get(EXT_NETWORK) != network or ident in known:
            continue
        found.append(AttachmentRecord(
            network=network, container_id=ident[0], ifname=ident[1], mode=mode,
            netns=ids.get(EXT_NETNS, ""),
            pod=PodRef(ids.get(EXT_POD_NS, ""), ids.get(EXT_POD_NAME, ""), ids.get(EXT_POD_UID, "")),
            plan=plan_of(port)))
    return found


# STATUS is a health check: it answers within this even where the node gives its OVSDB
# requests longer (ovsdbTimeout).
STATUS_OVSDB_BOUND = 2.0


def probe(node: NodeConfig, endpoint: str, database: str = ovsdb.DB) -> None:
    """STATUS of a mode with OVS ports: is this OVSDB answering (and, for an overlay, the
    OVN northbound database)? CniError 50 if not."""
    if node.ovsdb_timeout <= STATUS_OVSDB_BOUND:
        timeout, source = node.ovsdb_timeout, "ovsdbTimeout"
    else:
        # A time-out message names the bound that ran out, not a setting of another value.
        timeout, source = STATUS_OVSDB_BOUND, f"STATUS's bound; ovsdbTimeout is {node.ovsdb_timeout:g}s"
    try:
        ovsdb.probe(endpoint, timeout=timeout, timeout_source=source, database=database)
    except ovsdb.OvsdbUnavailable as exc:
        raise CniError(Code.NOT_AVAILABLE, f"tenantnet is not available: {exc}") from None


def port_of(plan: Plan) -> str | None:
    """The OVS port name of an attachment's plan (None for a mode without one)."""
    return plan.port_name() if isinstance(plan, PortPlan) else None


def offload_drift(node: NodeConfig, plan: PortPlan, conf: TenantnetConf) -> list[str]:
    """`"offloadCheck": "require"`: the attachment's port carries traffic and none of its
    active flows is in hardware."""
    if not conf.offload_check:
        return []
    from tenantnet.plugin.drivers import offloadstate

    summary = offloadstate.port_offload(node, plan.port_name())
    if not summary.require_failed():
        return []
    return ["offloadCheck require: the attachment carries traffic and none of its active flows is in "
            f"hardware ({summary.message()})"]


# ---- overlay networks (drivers/ovnport.py has the OVN side) ------------------------------------
def plan_overlay(plan: PortPlan, node: NodeConfig, conf: TenantnetConf, env: CniEnv) -> None:
    """Fill the overlay part of a port plan: names only, all derived from the attachment, so
    a DEL without a record or GC names the same logical port."""
    ov = conf.ovs.overlay if conf.ovs is not None else None
    if ov is None:
        return
    from tenantnet.plugin.drivers import ovnport

    plan.overlay_switch = ov.switch
    plan.overlay_segment = ov.segment
    plan.overlay_nb = ov.northbound
    plan.overlay_timeout = ov.timeout
    plan.overlay_install_timeout = ov.install_timeout
    plan.overlay_port = ovnport.port_name(ovnport.node_name(node), env.container_id, env.ifname)
    plan.pod_mac = conf.mac or ovnport.pod_mac(conf.name, env.container_id, env.ifname)
    plan.tx_checksum_off = ov.rail.userspace_datapath
    if conf.ovs is not None and conf.ovs.prewarm_declined:
        plan.prewarm_note = PREWARM_NOT_ON_OVERLAY


def bind_overlay(node: NodeConfig, record: AttachmentRecord, plan: PortPlan,
                 ips: list[str]) -> Pending | None:
    """Start writing the attachment's logical port (once IPAM has answered)."""
    if not plan.on_overlay():
        return None
    from tenantnet.plugin.drivers import ovnport
    from tenantnet.plugin.drivers.base import in_background

    record.mark(ovnport.STEP_LSP)  # before: the transaction may commit and still report failure
    installed = ovnport.Installed(ovsdb_for(node, plan.ovsdb), plan.port_name() or "", plan.bridge or "",
                                  plan.overlay_install_timeout)
    return in_background(ovnport.bind, node, record, record.network, plan.overlay_segment,
                         plan.overlay_switch, plan.overlay_nb, plan.overlay_timeout, plan.overlay_port,
                         plan.pod_mac, ips, installed)


def unbind_overlay(node: NodeConfig, record: AttachmentRecord, plan: PortPlan) -> Pending | None:
    """Start removing the attachment's logical port (DEL, rollback, GC), if it may exist."""
    if not plan.on_overlay():
        return None
    from tenantnet.plugin.drivers import ovnport
    from tenantnet.plugin.drivers.base import in_background

    if record.progress is not None and ovnport.STEP_LSP not in record.progress:
        return None
    return in_background(ovnport.unbind, node, record, plan.overlay_nb, plan.overlay_timeout,
                         plan.overlay_port)


def overlay_drift(node: NodeConfig, record: AttachmentRecord, plan: PortPlan) -> list[str]:
    if not plan.on_overlay():
        return []
    from tenantnet.plugin.drivers import ovnport

    ips = [ip.get("address", "") for ip in (record.result or {}).get("ips", []) if isinstance(ip, dict)]
    return ovnport.drift(node, plan.overlay_nb, plan.overlay_timeout, plan.overlay_port, plan.pod_mac, ips)


def unrecorded_logical_ports(node: NodeConfig, hint: PortPlan, found: list[AttachmentRecord], network: str,
                             mode: str, known: set[tuple[str, str]],
                             new_plan: Callable[[], PortPlan]) -> list[AttachmentRecord]:
    """GC on an overlay network: the unrecorded OVS ports and links already `found` get their
    logical port named in their plans (so detach removes it too), and this node's logical
    ports that nothing holds become synthetic records of their own."""
    from tenantnet.plugin.drivers import ovnport

    def overlay(plan: Plan, lsp: str) -> None:
        assert isinstance(plan, PortPlan)
        plan.overlay_port, plan.overlay_nb, plan.overlay_timeout = lsp, hint.overlay_nb, hint.overlay_timeout

    here = ovnport.node_name(node)
    for record in found:
        overlay(record.plan, ovnport.port_name(here, record.container_id, record.ifname))
    seen = known | {(r.container_id, r.ifname) for r in found}
    extra = []
    for lsp, cid, ifname in ovnport.unrecorded(node, hint.overlay_nb, hint.overlay_timeout, network, seen):
        plan = new_plan()
        overlay(plan, lsp)
        extra.append(AttachmentRecord(network=network, container_id=cid, ifname=ifname, mode=mode, plan=plan))
    return extra


def probe_overlay(node: NodeConfig, raw: dict[str, Any], mode: str) -> None:
    """STATUS of an overlay network: its rail's OVSDB and the OVN northbound database answer
    (a config that names no overlay: nothing to add). CniError 50 if not."""
    from tenantnet.plugin import overlay

    if raw.get("overlay") in (None, "", False):
        return
    try:
        ov = overlay.parse(raw, node, mode, None, ())
    except CniError as err:
        raise CniError(Code.NOT_AVAILABLE, f"tenantnet is not available: {err.msg}") from None
    assert ov is not None
    probe(node, ov.rail.ovsdb or node.ovsdb)
    probe(node, ov.northbound, database="OVN_Northbound")
