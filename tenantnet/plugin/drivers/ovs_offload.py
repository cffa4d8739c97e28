"""Mode `ovs-offload`: OVS hardware offload (switchdev). The VF goes into the pod exactly as
in mode `sriov` (recorded first, fully restored on DEL); its **representor** joins an OVS
bridge in one transaction with VLAN/trunks, MTU and ownership, so OVS flows can be pushed
into the NIC with tc-flower.

In switchdev mode the VF's VLAN, spoof checking, trust and rates belong to the representor's
OVS port, not to the PF: only an admin MAC is set through the PF. The preconditions for
flows to be offloaded at all — eswitch in switchdev mode, `hw-tc-offload` on PF and
representor, OVS `other_config:hw-offload=true` — are checked on ADD and STATUS; the node
config says per precondition whether a miss warns (default) or refuses.
"""

from __future__ import annotations

from typing import Any

from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.result import Interface
from tenantnet.plugin import faults
from tenantnet.plugin import nodeconfig as config
from tenantnet.plugin.drivers.base import Attached
from tenantnet.plugin.drivers.ovs import add_owned_port, check_owned_port, link_drift, unrecorded_ports
from tenantnet.plugin.drivers.sriov import SriovDriver
from tenantnet.plugin.records import AttachmentRecord
from tenantnet.plugin.system import netlink, ovsdb
from tenantnet.plugin.system.sysfs import (
    VirtualFunction,
    find_representor,
    representor_from_devlink,
    vf_of_representor,
)
from tenantnet.plugin.system.vfcontrol import VfState
from tenantnet.plugin.tnconf import TenantnetConf

STEP_PORT = "port"


class OvsOffloadDriver(SriovDriver):
    mode = "ovs-offload"
    # In switchdev mode the PF sets only the admin MAC; the rest is the representor's port.
    pf_fields = ("mac",)

    def _db(self, endpoint: str | None) -> ovsdb.Ovsdb:
        return config.ovsdb_handle(self.node, endpoint)

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
                      db: ovsdb.Ovsdb) -> list[tuple[str, str]]:
        """(precondition, what is wrong and how to fix it) for every precondition not met."""
        misses = []
        mode = self.control.eswitch_mode(vf.pf_netdev or "", vf.pf_address)
        if mode is not None and mode != "switchdev":
            misses.append(("eswitchSwitchdev",
                           f"the eswitch of PF {vf.pf_address} is in {mode} mode; fix: devlink dev "
                           f"eswitch set pci/{vf.pf_address} mode switchdev"))
        for name in filter(None, (vf.pf_netdev, representor)):
            if self.control.hw_tc_offload(name) is False:
                misses.append(("hwTcOffload", f"hw-tc-offload is off on {name}; fix: ethtool -K {name} "
                                              "hw-tc-offload on"))
        if db.other_config().get("hw-offload") != "true":
            misses.append(("ovsHwOffload", "OVS other_config:hw-offload is not true, so no flow is "
                                           "offloaded; fix: ovs-vsctl set Open_vSwitch . "
                                           "other_config:hw-offload=true, then restart ovs-vswitchd"))
        return misses

    def _enforce(self, misses: list[tuple[str, str]]) -> list[str]:
        refused = [why for key, why in misses if self.node.offload_preconditions.get(key) == "refuse"]
        if refused:
            raise CniError(Code.OFFLOAD_PRECONDITION, "offload precondition not met: " + "; ".join(refused))
        if misses:
            from tenantnet.plugin.log import get

            log = get("tenantnet.ops.flowreport")
        for key, why in misses:
            # The log's warnings reach stderr too (cni.log), so the runtime's log shows them.
            log.warning("offload.precondition", precondition=key, problem=why)
        return [why for _, why in misses]

    def plan(self, conf: TenantnetConf, env: CniEnv, records: Any = None) -> dict[str, Any]:
        assert conf.ovs is not None
        plan = super().plan(conf, env, records)
        vf = self.sysfs.vf(plan["deviceID"])
        rep = self._representor(vf)
        db = self._db(conf.ovs.ovsdb)
        link = netlink.host_link(rep)
        plan.update({
            # What ADD changes on the representor (MTU, up), put back on DEL.
            "representorOriginal": {"mtu": link.mtu, "up": link.up} if link is not None else None,
            "representor": rep, "bridge": self._bridge(conf, db, vf), "ovsdb": conf.ovs.ovsdb,
            "vlan": conf.ovs.vlan, "trunks": list(conf.ovs.trunks), "mtu": conf.mtu,
            "ofportRequest": conf.ovs.ofport_request,
        })
        plan["preconditionWarnings"] = self._enforce(self.preconditions(vf, rep, db))
        return plan

    def plan_without_record(self, conf: TenantnetConf, env: CniEnv,
                            records: Any = None) -> dict[str, Any] | None:
        """The VF as in mode sriov (only if it carries our mark); the representor's port is
        deleted only if its external_ids name this (container id, ifname)."""
        assert conf.ovs is not None and conf.vf is not None
        if not conf.vf.device_id:
            raise CniError(Code.INVALID_CONFIG, "no record and no deviceID: cannot tell which VF to reset")
        vf = self._vf(conf.vf.device_id)
        plan = super().plan_without_record(conf, env, records)
        port_only = plan is None
        if port_only:
            plan = {}
        plan.update({"representor": find_representor(self.sysfs, vf), "bridge": conf.ovs.bridge,
                     "ovsdb": conf.ovs.ovsdb})
        if port_only:
            port = self._db(conf.ovs.ovsdb).port(plan["representor"]) if plan["representor"] else None
            ids = port.external_ids if port is not None else {}
            owner = (ids.get(ovsdb.OWNER_CONTAINER), ids.get(ovsdb.OWNER_IFNAME))
            if owner != (env.container_id, env.ifname):
                return None
        return plan

    def attach(self, record: AttachmentRecord, conf: TenantnetConf) -> Attached:
        attached = super().attach(record, conf)
        plan = record.plan
        rep = plan["representor"]
        netlink.set_host_link(rep, mtu=plan.get("mtu"), up=True)
        faults.step("offload.representor-up")
        record.mark(STEP_PORT)  # before the transaction: it may commit and still report failure
        add_owned_port(self._db(plan.get("ovsdb")), record, rep)
        link = netlink.host_link(rep)
        attached.host = Interface(name=rep, mac=link.mac if link else "")
        if attached.device_info is not None:
            attached.device_info["representor-device"] = rep
        return attached

    def detach(self, record: AttachmentRecord) -> None:
        plan = record.plan
        rep = plan.get("representor")
        done = record.progress
        owner = (record.container_id, record.ifname)
        # Waiting for vswitchd: until it has dropped the port it may still set the
        # representor's flags back as it found them when it took it (seen: up again after
        # our restore, 3 DELs in 30).
        deleted = rep and (done is None or STEP_PORT in done) and \
            self._db(plan.get("ovsdb")).delete_port(rep, owner=owner, wait=True)
        faults.step("offload.port-deleted")
        original = plan.get("representorOriginal")
        if rep and (deleted or original) and netlink.host_link(rep) is not None:
            if original:  # the representor as it was before ADD
                netlink.set_host_link(rep, mtu=original["mtu"] or None, up=original["up"])
            else:
                netlink.set_host_link(rep, up=False)
        if "deviceID" in plan:  # an orphan port whose VF could not be found has only the port
            super().detach(record)

    def orphans(self, network: str, keep: set[tuple[str, str]], recorded: set[tuple[str, str]],
                plan_hint: dict[str, Any]) -> list[AttachmentRecord]:
        """Representor ports of ours on `network` without a record (an ADD killed before its
        record was written, a record lost with a disk): the VF is found again from the
        representor and reset to the fail-safe state, as DEL without a record does."""
        db = self._db(plan_hint.get("ovsdb"))

        def plan_of(port: ovsdb.PortState) -> dict[str, Any]:
            plan: dict[str, Any] = {"representor": port.name, "bridge": port.bridge, "ovsdb": db.endpoint}
            vf = vf_of_representor(self.sysfs, port.name)
            if vf is not None:
                plan.update(self.vf_plan_without_record(vf))
            return plan

        return unrecorded_ports(db, network, self.mode, keep | recorded, plan_of)

    def check(self, record: AttachmentRecord, conf: TenantnetConf) -> list[str]:
        drift = super().check(record, conf)
        rep = record.plan["representor"]
        drift += check_owned_port(self._db(record.plan.get("ovsdb")), record, rep)
        return drift + link_drift(rep, "representor")

    def describe(self, record: AttachmentRecord) -> dict[str, Any]:
        out = super().describe(record)
        out.update({"representor": record.plan["representor"], "bridge": record.plan["bridge"],
                    "vlan": record.plan.get("vlan")})
        return out
