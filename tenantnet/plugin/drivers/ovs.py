"""Mode `ovs`: a veth pair, pod end created inside the pod netns, host end on an OVS bridge.

The host end's name is derived from (container id, ifname) alone, so a repeated ADD, a DEL
without a record, or GC after a crash all find the same link and port again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.result import Interface
from tenantnet.plugin import faults
from tenantnet.plugin import nodeconfig as config
from tenantnet.plugin.drivers.base import Attached, Driver, in_background, mark_owner, owner_mark
from tenantnet.plugin.records import AttachmentRecord, PodRef
from tenantnet.plugin.system import netlink, ovsdb
from tenantnet.plugin.tnconf import TenantnetConf

EXT_NETWORK = "tenantnet-network"
EXT_CONTAINER = ovsdb.OWNER_CONTAINER
EXT_IFNAME = ovsdb.OWNER_IFNAME
EXT_NETNS = "tenantnet-netns"
EXT_POD_NS = "tenantnet-pod-namespace"
EXT_POD_NAME = "tenantnet-pod-name"
EXT_POD_UID = "tenantnet-pod-uid"
STEP_VETH = "veth"
STEP_PORT = "port"


def host_ifname(container_id: str, ifname: str) -> str:
    """`tn` + 11 hex digits: deterministic, ≤ 15 characters, one per attachment."""
    digest = hashlib.sha256(f"{container_id}/{ifname}".encode()).hexdigest()
    return "tn" + digest[:11]


class OvsDriver(Driver):
    mode = "ovs"

    def plan(self, conf: TenantnetConf, env: CniEnv, records: Any = None) -> dict[str, Any]:
        assert conf.ovs is not None
        return {
            "hostIfname": host_ifname(env.container_id, env.ifname),
            "bridge": conf.ovs.bridge,
            "ovsdb": conf.ovs.ovsdb,
            "vlan": conf.ovs.vlan,
            "trunks": list(conf.ovs.trunks),
            "mtu": conf.ovs.mtu,
            "ofportRequest": conf.ovs.ofport_request,
        }

    def _db(self, record: AttachmentRecord) -> ovsdb.Ovsdb:
        return config.ovsdb_handle(self.node, record.plan["ovsdb"])

    def attach(self, record: AttachmentRecord, conf: TenantnetConf) -> Attached:
        plan = record.plan
        db = self._db(record)
        if not db.bridge_exists(plan["bridge"]):
            raise CniError(
                Code.INVALID_CONFIG,
                f"invalid network config: bridge={plan['bridge']!r}: no such bridge in OVSDB "
                f"at {db.endpoint}",
            )
        host = plan["hostIfname"]
        # A link of this name can only be a leftover of a crashed ADD of this same attachment.
        netlink.delete_host_link(host)
        record.mark(STEP_VETH)
        try:
            netlink.create_veth_into_netns(
                host, record.ifname, record.netns, mtu=plan.get("mtu"), pod_mac=conf.mac,
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
        pending = in_background(add_owned_port, db, record, host)
        link = netlink.host_link(host)
        return Attached(host=Interface(name=host, mac=link.mac if link else ""), pod_ifname=record.ifname,
                        pending=pending)

    def detach(self, record: AttachmentRecord) -> None:
        host = record.plan.get("hostIfname") or host_ifname(record.container_id, record.ifname)
        done = record.progress
        # Deleting the host end removes the pod end too, wherever it is. The kernel takes
        # ≈ 20 ms for it (mostly waiting for RCU), so it runs beside the port's transaction.
        unlink = in_background(delete_own_link, record, host) if done is None or STEP_VETH in done else None
        try:
            if done is None or STEP_PORT in done:
                self._db(record).delete_port(host, owner=(record.container_id, record.ifname))
                faults.step("ovs.port-deleted")
        finally:
            if unlink is not None:
                unlink.result()

    def check(self, record: AttachmentRecord, conf: TenantnetConf) -> list[str]:
        host = record.plan["hostIfname"]
        return check_owned_port(self._db(record), record, host) + link_drift(host, "host link")

    def describe(self, record: AttachmentRecord) -> dict[str, Any]:
        port = self._db(record).port(record.plan["hostIfname"])
        return {
            "bridge": port.bridge if port else None,
            "port": record.plan["hostIfname"],
            "tag": port.tag if port else None,
            "trunks": port.trunks if port else [],
            "ofport": port.ofport if port else None,
        }

    def orphans(self, network: str, keep: set[tuple[str, str]], recorded: set[tuple[str, str]],
                plan_hint: dict[str, Any]) -> list[AttachmentRecord]:
        db = config.ovsdb_handle(self.node, plan_hint.get("ovsdb"))
        found = unrecorded_ports(db, network, self.mode, keep | recorded, lambda port: {
            "hostIfname": port.name, "bridge": port.bridge, "ovsdb": db.endpoint})
        # Host veths marked as ours whose OVS port never got written (or was lost).
        seen = keep | recorded | {(r.container_id, r.ifname) for r in found}
        for link in netlink.host_links():
            owner = mark_owner(link.alias, network)
            if owner is None or owner in seen or link.name != host_ifname(*owner):
                continue
            found.append(AttachmentRecord(network=network, container_id=owner[0], ifname=owner[1],
                                          mode=self.mode,
                                          plan={"hostIfname": link.name, "ovsdb": db.endpoint}))
        return found


def delete_own_link(record: AttachmentRecord, name: str) -> bool:
    """Delete the host link `name` unless its alias marks it as another attachment's."""
    link = netlink.host_link(name)
    if link is None:
        return False
    if link.alias and link.alias != owner_mark(record.network, record.container_id, record.ifname):
        return False
    return netlink.delete_host_link(name)


def unrecorded_ports(db: ovsdb.Ovsdb, network: str, mode: str, known: set[tuple[str, str]],
                     plan_of: Callable[[ovsdb.PortState], dict[str, Any]]) -> list[AttachmentRecord]:
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


def add_owned_port(db: ovsdb.Ovsdb, record: AttachmentRecord, port: str) -> None:
    """The attachment's OVS port: VLAN, MTU and ownership in one transaction."""
    plan, pod = record.plan, record.pod
    faults.step("ovs.port-adding")
    db.add_port(
        ovsdb.PortSpec(
            bridge=plan["bridge"],
            name=port,
            tag=plan.get("vlan"),
            trunks=list(plan.get("trunks") or []),
            mtu=plan.get("mtu"),
            ofport_request=plan.get("ofportRequest"),
            external_ids={
                EXT_NETWORK: record.network,
                EXT_CONTAINER: record.container_id,
                EXT_IFNAME: record.ifname,
                EXT_NETNS: record.netns,
                EXT_POD_NS: pod.namespace,
                EXT_POD_NAME: pod.name,
                EXT_POD_UID: pod.uid,
            },
        )
    )
    faults.step("ovs.port-added")


def check_owned_port(db: ovsdb.Ovsdb, record: AttachmentRecord, name: str) -> list[str]:
    """Differences between the attachment's OVS port and its record."""
    plan = record.plan
    port = db.port(name)
    if port is None:
        return [f"OVS port {name} is missing"]
    drift = []
    if port.bridge != plan["bridge"]:
        drift.append(f"OVS port {name} is on bridge {port.bridge!r}, expected {plan['bridge']!r}")
    if port.tag != plan.get("vlan"):
        drift.append(f"OVS port {name} has tag {port.tag!r}, expected {plan.get('vlan')!r}")
    if port.trunks != list(plan.get("trunks") or []):
        drift.append(f"OVS port {name} has trunks {port.trunks}, expected {plan.get('trunks') or []}")
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
