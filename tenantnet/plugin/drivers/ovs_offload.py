"""Mode `ovs-offload`: OVS hardware offload (switchdev). The VF goes into the pod exactly as
in mode `sriov` (drivers/vf.py: recorded first, fully restored on DEL); its **representor**
joins an OVS bridge in one transaction with VLAN/trunks, MTU and ownership
(drivers/ovsport.py), so OVS flows can be pushed into the NIC with tc-flower.

In switchdev mode the VF's VLAN, spoof checking, trust and rates belong to the representor's
OVS port, not to the PF: only an admin MAC is set through the PF. The preconditions for
flows to be offloaded at all (drivers/offloadstate.py) are checked on ADD and STATUS; the
node config says per precondition whether a miss warns (default) or refuses.

On an overlay network (`overlay: geneve`, docs/overlay.md) the representor goes on the
integration bridge of the rail the VF belongs to — the rail whose `underlayBridge` has the
VF's PF as its uplink — with `iface-id` = the attachment's logical switch port, so its tunnel
leaves through the PF's own NIC; the pod gets the VF netdev with the MAC port security names
and the rail's pod MTU (underlay - 58). The logical port is written as in mode ovs
(drivers/ovsport.py: plan_overlay, bind_overlay, unbind_overlay, overlay_drift).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.netconf import NetConf, parse_netconf
from cni.result import Interface
from tenantnet.plugin import faults, overlay, settings, tnconf
from tenantnet.plugin.drivers import offloadstate, ovsport
from tenantnet.plugin.drivers.base import Attached, Pending, gc_env
from tenantnet.plugin.drivers.ovsport import STEP_PORT, PortPlan
from tenantnet.plugin.drivers.vf import VfDriver, VfPlan
from tenantnet.plugin.overlay import OvnRail
from tenantnet.plugin.records import AttachmentRecord, RecordStore
from tenantnet.plugin.system import netlink, ovsdb
from tenantnet.plugin.system.sysfs import (
    SysfsError,
    VirtualFunction,
    find_representor,
    representor_from_devlink,
    vf_of_representor,
)
from tenantnet.plugin.system.vfstate import VfState
from tenantnet.plugin.tnconf import TenantnetConf


@dataclass
class LinkOriginal:
    """The representor as it was before ADD (DEL puts its MTU and admin state back)."""

    mtu: int = 0
    up: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"mtu": self.mtu, "up": self.up}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinkOriginal:
        return cls(mtu=d.get("mtu") or 0, up=bool(d.get("up")))


@dataclass
class OffloadPlan(VfPlan, PortPlan):
    """The VF (as in mode sriov) and its representor's OVS port. An orphan port whose VF
    could not be found has only the port part (no device_id)."""

    representor: str | None = None
    representor_original: LinkOriginal | None = None
    precondition_warnings: list[str] = field(default_factory=list)

    _decoders = {**VfPlan._decoders, "representor_original": LinkOriginal.from_dict}

    def port_name(self) -> str | None:
        return self.representor


class OvsOffloadDriver(VfDriver):
    mode = "ovs-offload"
    plan_type: ClassVar[type[OffloadPlan]] = OffloadPlan
    # In switchdev mode the PF sets only the admin MAC; the rest is the representor's port.
    pf_fields = ("mac",)

    def _db(self, endpoint: str | None) -> ovsdb.Ovsdb:
        return ovsport.ovsdb_for(self.node, endpoint)

    def pf_settings(self, conf: TenantnetConf) -> tuple[VfState, list[str]]:
        return (VfState(mac=conf.mac), ["mac"]) if conf.mac else (VfState(), [])

    def _representor(self, vf: VirtualFunction) -> str:
        # sysfs first (every switchdev driver exposes it), devlink's port dump as a fallback.
        rep = find_representor(self.sysfs, vf) or representor_from_devlink(vf.pf_address, vf.index)
        if rep is None:
            raise CniError(
                Code.INVALID_CONFIG,
                f"invalid network config: deviceID={vf.address!r}: VF {vf.index} of PF "
                f"{vf.pf_netdev or vf.pf_address} has no representor: is the eswitch in legacy mode? "
                f"(devlink dev eswitch set pci/{vf.pf_address} mode switchdev)",
            )
        return rep

    def _bridge(self, conf: TenantnetConf, db: ovsdb.Ovsdb, vf: VirtualFunction) -> str:
        assert conf.ovs is not None
        if conf.ovs.bridge:
            return conf.ovs.bridge
        bridge = db.bridge_of_interface(vf.pf_netdev) if vf.pf_netdev else None
        if bridge is None:
            raise CniError(
                Code.INVALID_CONFIG,
                f"invalid network config: bridge is not set and no OVS bridge has the VF's PF "
                f"{vf.pf_netdev} (or a bond holding it) as a port; set \"bridge\"",
            )
        return bridge

    def preconditions(self, vf: VirtualFunction, representor: str | None,
                      db: ovsdb.Ovsdb) -> list[offloadstate.Miss]:
        """Every offload precondition not met, with what is wrong and how to fix it."""
        return offloadstate.vf_preconditions(self.control, vf, representor) + \
            offloadstate.ovs_preconditions(db.other_config())

    def _enforce(self, misses: list[offloadstate.Miss]) -> list[str]:
        refused = [m.text() for m in misses if self.node.offload_preconditions.get(m.key) == "refuse"]
        if refused:
            raise CniError(Code.OFFLOAD_PRECONDITION, "offload precondition not met: " + "; ".join(refused))
        if misses:
            from tenantnet.plugin.log import get

            log = get("tenantnet.offload")
            for miss in misses:
                # The log's warnings reach stderr too (entry/logsetup.py), so the runtime's log shows them.
                log.warning("offload.precondition", precondition=miss.key, problem=miss.text())
        return [m.text() for m in misses]

    def plan(self, conf: TenantnetConf, env: CniEnv, records: RecordStore | None = None) -> OffloadPlan:
        assert conf.ovs is not None
        plan = super().plan(conf, env, records)
        assert isinstance(plan, OffloadPlan)
        vf = self.sysfs.vf(plan.device_id)
        rep = self._representor(vf)
        conf = self.on_rail_of(conf, vf)
        assert conf.ovs is not None
        db = self._db(conf.ovs.ovsdb)
        link = netlink.host_link(rep)
        # What ADD changes on the representor (MTU, up), put back on DEL.
        plan.representor_original = LinkOriginal(link.mtu, link.up) if link is not None else None
        plan.representor, plan.bridge, plan.ovsdb = rep, self._bridge(conf, db, vf), conf.ovs.ovsdb
        plan.vlan, plan.trunks, plan.mtu = conf.ovs.vlan, list(conf.ovs.trunks), conf.mtu
        plan.ofport_request = conf.ovs.ofport_request
        plan.prewarm = ovsport.PREWARM_PENDING if conf.ovs.prewarm else ""
        ovsport.plan_overlay(plan, self.node, conf, env)
        plan.precondition_warnings = self._enforce(self.preconditions(vf, rep, db))
        return plan

    # ---- overlay: the VF's rail ---------------------------------------------------------------
    def _carries(self, rail: OvnRail, pf: str) -> bool:
        """Rail `rail`'s underlay bridge has `pf` (or a bond holding it) as a port."""
        if not rail.underlay_bridge or not pf:
            return False
        return self._db(rail.ovsdb or self.node.ovsdb).bridge_of_interface(pf) == rail.underlay_bridge

    def rail_of(self, conf: TenantnetConf, vf: VirtualFunction) -> OvnRail:
        """The rail an overlay attachment of `vf` goes on: its tunnel must leave through the
        VF's own NIC, so the rail is the one whose underlay bridge has the VF's PF as uplink.
        A rail the network names (or the node's only / default one when no rail carries the
        PF) is taken as long as its underlay bridge, if declared, carries the PF; refused
        (code 7) otherwise, naming VF, PF and rail."""
        assert conf.ovs is not None and conf.ovs.overlay is not None and self.node.ovn is not None
        ovn, given = self.node.ovn, conf.ovs.overlay.rail
        pf = vf.pf_netdev or ""
        named = conf.base.raw.get("rail") or None
        which = f"VF {vf.address} (VF {vf.index} of PF {pf or vf.pf_address})"
        if named is None:
            carrying = [r for r in ovn.rails.values() if self._carries(r, pf)]
            if carrying:
                return carrying[0]
            chosen = ovn.rail(None)  # the only rail, or defaultRail
            if chosen is None:
                bridges = ", ".join(f"{r.name}: {r.underlay_bridge or 'no underlayBridge'}"
                                    for r in ovn.rails.values())
                raise CniError(Code.INVALID_CONFIG,
                               f"invalid network config: overlay: {which} belongs to no OVN rail of this "
                               f"node: no rail's underlayBridge has PF {pf} as a port ({bridges}); name "
                               "the rail (\"rail\") or set the rail's underlayBridge in the node config")
            given = chosen
        if given.underlay_bridge and not self._carries(given, pf):
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid network config: rail={given.name!r}: {which} is not on that rail: rail "
                           f"{given.name}'s underlayBridge {given.underlay_bridge} has no port {pf}, so the "
                           "tunnel would leave through another NIC; use a VF of that rail's PF or name "
                           "the PF's rail")
        return given

    def on_rail_of(self, conf: TenantnetConf, vf: VirtualFunction, strict: bool = True) -> TenantnetConf:
        """`conf` with its overlay on the VF's rail (bridge, OVSDB, pod MTU of that rail); a
        network without overlay as it is. Not `strict` (DEL, GC): a refusal keeps `conf`."""
        if conf.ovs is None or conf.ovs.overlay is None or self.node.ovn is None:
            return conf
        try:
            rail = self.rail_of(conf, vf)
        except CniError:
            if strict:
                raise
            return conf
        if rail == conf.ovs.overlay.rail:
            return conf
        moved = replace(conf.ovs.overlay, rail=rail)
        mtu = overlay.check_mtu(moved, conf.vf.mtu if conf.vf is not None else None)
        return replace(conf, ovs=replace(conf.ovs, bridge=rail.integration_bridge,
                                         ovsdb=rail.ovsdb or self.node.ovsdb, mtu=mtu, overlay=moved))

    @staticmethod
    def _pod_side(conf: TenantnetConf, plan: OffloadPlan) -> TenantnetConf:
        """On an overlay the pod's VF netdev (and its admin MAC at the PF) takes the MAC port
        security names and the plan's MTU (the rail's underlay - 58 unless asked lower)."""
        if not plan.on_overlay() or conf.vf is None:
            return conf
        return replace(conf, mac=plan.pod_mac, vf=replace(conf.vf, mtu=plan.mtu))

    def plan_without_record(self, conf: TenantnetConf, env: CniEnv,
                            records: RecordStore | None = None) -> OffloadPlan | None:
        """The VF as in mode sriov (only if it carries our mark); the representor's port is
        deleted only if its external_ids name this (container id, ifname)."""
        assert conf.ovs is not None and conf.vf is not None
        if not conf.vf.device_id:
            raise CniError(Code.INVALID_CONFIG, "no record and no deviceID: cannot tell which VF to reset")
        vf = self._vf(conf.vf.device_id)
        found = super().plan_without_record(conf, env, records)
        assert found is None or isinstance(found, OffloadPlan)
        plan = found or OffloadPlan()
        conf = self.on_rail_of(conf, vf, strict=False)
        assert conf.ovs is not None
        plan.representor, plan.bridge, plan.ovsdb = find_representor(self.sysfs, vf), conf.ovs.bridge, \
            conf.ovs.ovsdb
        ovsport.plan_overlay(plan, self.node, conf, env)  # names only: the logical port goes too
        if found is None:  # the port only
            port = self._db(plan.ovsdb).port(plan.representor) if plan.representor else None
            ids = port.external_ids if port is not None else {}
            owner = (ids.get(ovsdb.OWNER_CONTAINER), ids.get(ovsdb.OWNER_IFNAME))
            if owner != (env.container_id, env.ifname):
                return None
        return plan

    def attach(self, record: AttachmentRecord, conf: TenantnetConf) -> Attached:
        plan = _plan(record)
        attached = super().attach(record, self._pod_side(conf, plan))
        # The lab: the representor is on a userspace datapath, which passes a packet's
        # checksum on unfilled (CNI-FACTS §7), as for mode ovs's veth: the core switches the
        # pod end's offload off while it configures it.
        attached.tx_checksum_off = plan.tx_checksum_off and attached.has_netdev
        rep = plan.representor or ""
        netlink.set_host_link(rep, mtu=plan.mtu, up=True)
        faults.step("offload.representor-up")
        record.mark(STEP_PORT)  # before the transaction: it may commit and still report failure
        ovsport.add_owned_port(self._db(plan.ovsdb), record, plan, rep)
        link = netlink.host_link(rep)
        attached.host = Interface(name=rep, mac=link.mac if link else "")
        if attached.device_info is not None:
            attached.device_info["representor-device"] = rep
        return attached

    def addressed(self, record: AttachmentRecord, conf: TenantnetConf, ips: list[str]) -> Pending | None:
        return ovsport.bind_overlay(self.node, record, _plan(record), ips)

    def ready(self, record: AttachmentRecord, conf: TenantnetConf) -> bool:
        if not _plan(record).prewarms():
            return False
        from tenantnet.plugin.drivers import prewarm

        return prewarm.warm(self.node, self._db(_plan(record).ovsdb), record)

    def detach(self, record: AttachmentRecord) -> None:
        plan = _plan(record)
        if plan.prewarms():  # before the port: its OpenFlow number must not outlive it
            from tenantnet.plugin.drivers import prewarm

            prewarm.unwarm(self.node, self._db(plan.ovsdb), record)
        rep = plan.representor
        done = record.progress
        owner = (record.container_id, record.ifname)
        unbind = ovsport.unbind_overlay(self.node, record, plan)  # beside the port's transaction
        try:
            # Waiting for vswitchd: until it has dropped the port it may still set the
            # representor's flags back as it found them when it took it (seen: up again after
            # our restore, 3 DELs in 30).
            deleted = rep and (done is None or STEP_PORT in done) and \
                self._db(plan.ovsdb).delete_port(rep, owner=owner, wait=True)
            faults.step("offload.port-deleted")
        finally:
            if unbind is not None:
                unbind.result()
        original = plan.representor_original
        if rep and (deleted or original) and netlink.host_link(rep) is not None:
            if original:  # the representor as it was before ADD
                netlink.set_host_link(rep, mtu=original.mtu or None, up=original.up)
            else:
                netlink.set_host_link(rep, up=False)
        if plan.device_id:  # an orphan port whose VF could not be found has only the port
            super().detach(record)

    def orphans(self, conf: NetConf, env: CniEnv, keep: set[tuple[str, str]],
                recorded: set[tuple[str, str]]) -> list[AttachmentRecord]:
        """Representor ports of ours on `network` without a record (an ADD killed before its
        record was written, a record lost with a disk): the VF is found again from the
        representor and reset to the fail-safe state, as DEL without a record does."""
        # Only where its ports are: a NAD without deviceID (the device plugin gives one per
        # pod) would not parse as a whole here.
        endpoints = [settings.ovsdb_endpoint(conf.raw, self.node)]
        ovn = self.node.ovn
        on_overlay = bool(conf.raw.get("overlay")) and ovn is not None
        if on_overlay:  # each rail's integration bridge may have its own OVSDB
            assert ovn is not None
            endpoints += [r.ovsdb for r in ovn.rails.values() if r.ovsdb and r.ovsdb not in endpoints]
        found: list[AttachmentRecord] = []
        for endpoint in endpoints:
            db = self._db(endpoint)

            def plan_of(port: ovsdb.PortState, db: ovsdb.Ovsdb = db) -> OffloadPlan:
                vf = vf_of_representor(self.sysfs, port.name)
                plan = self.vf_plan_without_record(vf) if vf is not None else OffloadPlan()
                assert isinstance(plan, OffloadPlan)
                plan.representor, plan.bridge, plan.ovsdb = port.name, port.bridge, db.endpoint
                return plan

            found += ovsport.unrecorded_ports(db, conf.name, self.mode, keep | recorded | {
                (r.container_id, r.ifname) for r in found}, plan_of)
        if on_overlay:  # and this node's logical ports that no record holds
            assert ovn is not None
            hint = PortPlan(overlay_nb=ovn.northbound, overlay_timeout=ovn.timeout)
            found += ovsport.unrecorded_logical_ports(
                self.node, hint, found, conf.name, self.mode, keep | recorded,
                lambda: OffloadPlan(ovsdb=endpoints[0]))
        return found

    def check(self, record: AttachmentRecord, conf: TenantnetConf) -> list[str]:
        plan = _plan(record)
        drift = super().check(record, self._pod_side(conf, plan))
        rep = plan.representor or ""
        drift += ovsport.check_owned_port(self._db(plan.ovsdb), record, plan, rep)
        return drift + ovsport.link_drift(rep, "representor") + \
            ovsport.offload_drift(self.node, plan, conf) + ovsport.overlay_drift(self.node, record, plan)

    def status(self, raw: dict[str, Any]) -> None:
        """The network's OVSDB answers, and its PF meets the offload preconditions: 'refuse'
        ones make STATUS code 50, the others are logged; and RDMA isolation as in mode sriov."""
        super().status(raw)
        try:
            endpoint = settings.ovsdb_endpoint(raw, self.node)
        except CniError as err:
            raise CniError(Code.NOT_AVAILABLE, f"tenantnet is not available: {err.msg}") from None
        ovsport.probe(self.node, endpoint)
        try:
            env = gc_env(CniEnv(command="STATUS", netns="/"))
            tconf = tnconf.parse(parse_netconf(raw), env, self.node)
            assert tconf.vf is not None and tconf.ovs is not None
            if tconf.vf.device_id:
                vf = self.sysfs.vf(tconf.vf.device_id)
            else:
                vf = self.sysfs.vfs_of_pf(self.sysfs.pf_address(tconf.vf.pfs[0]))[0]
            misses = self.preconditions(vf, find_representor(self.sysfs, vf), self._db(tconf.ovs.ovsdb))
        except (CniError, SysfsError, IndexError, ovsdb.OvsdbUnavailable, ovsdb.OvsdbFailure) as exc:
            raise CniError(Code.NOT_AVAILABLE, f"tenantnet is not available: cannot check offload "
                                               f"preconditions: {getattr(exc, 'msg', exc)}") from None
        from tenantnet.plugin.log import get

        log = get("tenantnet.plugin.core")
        refused = [m.text() for m in misses if self.node.offload_preconditions.get(m.key) == "refuse"]
        for miss in misses:
            log.warning("status.offload_precondition", precondition=miss.key, problem=miss.text())
        if refused:
            raise CniError(Code.NOT_AVAILABLE, "tenantnet is not available: offload precondition not "
                                               "met: " + "; ".join(refused))


def _plan(record: AttachmentRecord) -> OffloadPlan:
    assert isinstance(record.plan, OffloadPlan), f"an ovs-offload record with a {type(record.plan).__name__}"
    return record.plan
