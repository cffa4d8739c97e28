"""Mode `ovs`: a veth pair, pod end created inside the pod netns, host end on an OVS bridge.

The host end's name is derived from (container id, ifname) alone, so a repeated ADD, a DEL
without a record, or GC after a crash all find the same link and port again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.netconf import NetConf
from cni.result import Interface
from tenantnet.plugin import digest, faults, settings, tnconf
from tenantnet.plugin.drivers import ovsport
from tenantnet.plugin.drivers.base import (
    Attached,
    Driver,
    Pending,
    gc_env,
    in_background,
    mark_owner,
    owner_mark,
)
from tenantnet.plugin.drivers.ovsport import STEP_PORT, PortPlan
from tenantnet.plugin.records import AttachmentRecord, RecordStore
from tenantnet.plugin.system import netlink, ovsdb
from tenantnet.plugin.tnconf import TenantnetConf

STEP_VETH = "veth"


def host_ifname(container_id: str, ifname: str) -> str:
    """`tn` + 11 hex digits: deterministic, ≤ 15 characters, one per attachment."""
    hashed = digest.sha256_hex(f"{container_id}/{ifname}".encode())
    return "tn" + hashed[:11]


BRIDGE_SEEN_FOR = 2.0  # seconds a bridge found in OVSDB is taken as still there
_bridges_seen: dict[tuple[str, str], float] = {}  # (endpoint, bridge) → when it was found


def _bridge_seen(db: ovsdb.Ovsdb, bridge: str) -> bool:
    """The bridge exists: found within BRIDGE_SEEN_FOR, else asked of OVSDB now."""
    key, now = (db.endpoint, bridge), time.monotonic()
    if now - _bridges_seen.get(key, -BRIDGE_SEEN_FOR) < BRIDGE_SEEN_FOR:
        return True
    if not db.bridge_exists(bridge):
        _bridges_seen.pop(key, None)
        return False
    _bridges_seen[key] = now
    return True


@dataclass
class OvsPlan(PortPlan):
    """Mode `ovs`: the port plan plus the veth's host end, which is the OVS port."""

    host_ifname: str = ""  # the veth's host end, the OVS port

    def port_name(self) -> str | None:
        return self.host_ifname or None


class OvsDriver(Driver):
    mode = "ovs"
    plan_type: ClassVar[type[OvsPlan]] = OvsPlan

    def plan(self, conf: TenantnetConf, env: CniEnv, records: RecordStore | None = None) -> OvsPlan:
        assert conf.ovs is not None
        plan = OvsPlan(host_ifname=host_ifname(env.container_id, env.ifname), bridge=conf.ovs.bridge,
                       ovsdb=conf.ovs.ovsdb, vlan=conf.ovs.vlan, trunks=list(conf.ovs.trunks),
                       mtu=conf.ovs.mtu, ofport_request=conf.ovs.ofport_request,
                       prewarm=ovsport.PREWARM_PENDING if conf.ovs.prewarm else "")
        ovsport.plan_overlay(plan, self.node, conf, env)
        return plan

    def _db(self, plan: OvsPlan) -> ovsdb.Ovsdb:
        return ovsport.ovsdb_for(self.node, plan.ovsdb)

    def attach(self, record: AttachmentRecord, conf: TenantnetConf) -> Attached:
        plan = _plan(record)
        db = self._db(plan)
        # Asked before anything exists: a missing bridge (code 7) or an OVSDB that does not
        # answer (code 11) then leaves nothing to undo — a rollback could not remove a port
        # from an OVSDB it cannot reach, and would have to keep the record. The port's own
        # transaction checks the bridge again, so the question is not repeated for a bridge
        # this process saw moments ago (the agent's 2nd…Nth ADD of a burst: one OVSDB round
        # trip less on each); one that vanished since fails that transaction, and the
        # rollback removes the veth.
        if not _bridge_seen(db, plan.bridge or ""):
            raise CniError(
                Code.INVALID_CONFIG,
                f"invalid network config: bridge={plan.bridge!r}: no such bridge in OVSDB "
                f"at {db.endpoint}",
            )
        host = plan.host_ifname
        # A link of this name can only be a leftover of a crashed ADD of this same attachment.
        netlink.delete_host_link(host)
        record.mark(STEP_VETH)
        try:
            link = netlink.create_veth_into_netns(
                host, record.ifname, record.netns, mtu=plan.mtu, pod_mac=plan.pod_mac or conf.mac,
                host_alias=owner_mark(record.network, record.container_id, record.ifname),
            )
        except netlink.LinkExists:
            raise CniError(
                Code.INVALID_ENV,
                f"invalid CNI_IFNAME={record.ifname!r}: an interface of that name already exists "
                f"in {record.netns}",
            ) from None
        faults.step("ovs.veth-created")
        record.mark(STEP_PORT)  # before the transaction: it may commit and still report failure
        # The transaction (a round trip to ovsdb-server) runs while the core allocates
        # addresses and configures the pod; the core waits for it before answering.
        pending = in_background(ovsport.add_owned_port, db, record, plan, host)
        return Attached(host=Interface(name=host, mac=link.mac), pod_ifname=record.ifname, pending=pending,
                        tx_checksum_off=plan.tx_checksum_off)

    def addressed(self, record: AttachmentRecord, conf: TenantnetConf, ips: list[str]) -> Pending | None:
        return ovsport.bind_overlay(self.node, record, _plan(record), ips)

    def ready(self, record: AttachmentRecord, conf: TenantnetConf) -> bool:
        if not _plan(record).prewarms():
            return False
        from tenantnet.plugin.drivers import prewarm

        return prewarm.warm(self.node, self._db(_plan(record)), record)

    def detach(self, record: AttachmentRecord) -> None:
        plan = _plan(record)
        host = plan.host_ifname or host_ifname(record.container_id, record.ifname)
        if plan.prewarms():  # before the port: its OpenFlow number must not outlive it
            from tenantnet.plugin.drivers import prewarm

            prewarm.unwarm(self.node, self._db(plan), record)
        done = record.progress
        # Deleting the host end removes the pod end too, wherever it is. The kernel takes
        # ≈ 20 ms for it (mostly waiting for RCU), so it runs beside the port's transaction.
        unlink = in_background(delete_own_link, record, host) if done is None or STEP_VETH in done else None
        unbind = ovsport.unbind_overlay(self.node, record, plan)
        try:
            if done is None or STEP_PORT in done:
                self._db(plan).delete_port(host, owner=(record.container_id, record.ifname))
                faults.step("ovs.port-deleted")
        finally:
            for step in (unlink, unbind):
                if step is not None:
                    step.result()

    def check(self, record: AttachmentRecord, conf: TenantnetConf) -> list[str]:
        plan = _plan(record)
        host = plan.host_ifname
        return ovsport.check_owned_port(self._db(plan), record, plan, host) + \
            ovsport.link_drift(host, "host link") + ovsport.offload_drift(self.node, plan, conf) + \
            ovsport.overlay_drift(self.node, record, plan)

    def status(self, raw: dict[str, Any]) -> None:
        if raw.get("overlay") not in (None, "", False):
            ovsport.probe_overlay(self.node, raw, self.mode)
            return
        try:
            endpoint = settings.ovsdb_endpoint(raw, self.node)
        except CniError as err:
            raise CniError(Code.NOT_AVAILABLE, f"tenantnet is not available: {err.msg}") from None
        ovsport.probe(self.node, endpoint)

    def orphans(self, conf: NetConf, env: CniEnv, keep: set[tuple[str, str]],
                recorded: set[tuple[str, str]]) -> list[AttachmentRecord]:
        hint = self.plan(tnconf.parse(conf, gc_env(env), self.node), gc_env(env), None)
        db = self._db(hint)
        if hint.prewarms():
            from tenantnet.plugin.drivers import prewarm

            prewarm.collect_garbage(self.node, db.endpoint, conf.name, {hint.bridge or ""}, OvsPlan)
        found = ovsport.unrecorded_ports(db, conf.name, self.mode, keep | recorded, lambda port: OvsPlan(
            host_ifname=port.name, bridge=port.bridge, ovsdb=db.endpoint))
        if hint.on_overlay():  # and the logical ports of this node that no record holds
            found += ovsport.unrecorded_logical_ports(self.node, hint, found, conf.name, self.mode,
                                                      keep | recorded, lambda: OvsPlan(ovsdb=db.endpoint))
        # Host veths marked as ours whose OVS port never got written (or was lost).
        seen = keep | recorded | {(r.container_id, r.ifname) for r in found}
        for link in netlink.host_links():
            owner = mark_owner(link.alias, conf.name)
            if owner is None or owner in seen or link.name != host_ifname(*owner):
                continue
            found.append(AttachmentRecord(network=conf.name, container_id=owner[0], ifname=owner[1],
                                          mode=self.mode,
                                          plan=OvsPlan(host_ifname=link.name, ovsdb=db.endpoint)))
        return found


def _plan(record: AttachmentRecord) -> OvsPlan:
    assert isinstance(record.plan, OvsPlan), f"a mode ovs record with a {type(record.plan).__name__}"
    return record.plan


def delete_own_link(record: AttachmentRecord, name: str) -> bool:
    """Delete the host link `name` unless its alias marks it as another attachment's."""
    link = netlink.host_link(name)
    if link is None:
        return False
    if link.alias and link.alias != owner_mark(record.network, record.container_id, record.ifname):
        return False
    return netlink.delete_host_link(name)
