"""Mode `sriov`: an SR-IOV VF (legacy eswitch mode) moved into the pod, configured through its
PF, and restored exactly when the pod goes.

Everything the VF was before we touched it — netdev name, MAC, MTU, admin state, and the
PF-side attributes (admin MAC, VLAN/QoS/proto, spoofchk, trust, link state, rates) — is read
in `plan`, i.e. before the intent record is written and before anything changes. DEL puts
all of it back: from the pod, from the host after the kernel returned the VF (netns gone),
or, with no record at all, to safe defaults (spoofchk on, trust off, no VLAN, no MAC).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cni.env import CniEnv
from cni.errors import CniError, Code
from tenantnet.plugin import faults
from tenantnet.plugin.drivers.base import Attached, Driver, owner_mark
from tenantnet.plugin.records import AttachmentRecord, CorruptRecord
from tenantnet.plugin.system import netlink, vfcontrol
from tenantnet.plugin.system.netns import netns_exists
from tenantnet.plugin.system.sysfs import Sysfs, SysfsError, VirtualFunction
from tenantnet.plugin.system.vfcontrol import VfAttributeRefused, VfControl, VfState
from tenantnet.plugin.tnconf import TenantnetConf

VF_MODES = ("sriov", "ovs-offload")
# The VF state a record-less DEL restores: the fail-safe one.
SAFE_VF_STATE = VfState(mac="00:00:00:00:00:00", vlan=0, qos=0, proto="802.1q", spoofchk=True,
                        trust=False, link_state="auto", min_tx_rate=0, max_tx_rate=0)
_FIELDS = ("mac", "vlan", "spoofchk", "trust", "link_state", "rate")
STEP_VF = "vf"
STEP_NETDEV = "netdev"


def _differs(field: str, a: VfState, b: VfState) -> bool:
    if field == "vlan":
        return (a.vlan, a.qos, a.proto) != (b.vlan, b.qos, b.proto)
    if field == "rate":
        return (a.min_tx_rate, a.max_tx_rate) != (b.min_tx_rate, b.max_tx_rate)
    return getattr(a, field) != getattr(b, field)


class SriovDriver(Driver):
    mode = "sriov"
    # The VF attributes this mode manages through the PF (and so restores on DEL).
    pf_fields: tuple[str, ...] = _FIELDS

    def __init__(self, node: Any) -> None:
        super().__init__(node)
        self.sysfs = Sysfs(node.sysfs_root)
        self._control: VfControl | None = None

    @property
    def control(self) -> VfControl:
        if self._control is None:
            self._control = vfcontrol.control_for(self.node.vf_control, self.node.vf_control_modules)
        return self._control

    # ---- choosing the VF ------------------------------------------------------------
    @contextmanager
    def reserve(self) -> Iterator[None]:
        # One node-wide lock, held only while a VF is chosen and the intent record written:
        # two ADDs racing for the last free VF cannot both get it.
        lock_dir = os.path.join(self.node.state_dir, "locks")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(lock_dir, "vf-allocation.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _holders(self, records: Any) -> dict[str, AttachmentRecord]:
        held: dict[str, AttachmentRecord] = {}
        if records is None:
            return held
        for rec in records.list():
            if isinstance(rec, CorruptRecord) or rec.mode not in VF_MODES:
                continue
            if rec.plan.get("deviceID"):
                held[rec.plan["deviceID"]] = rec
        return held

    def _vf(self, address: str, field: str = "deviceID") -> VirtualFunction:
        try:
            return self.sysfs.vf(address)
        except SysfsError as exc:
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid network config: {field}={address!r}: {exc}") from None

    def _on_allowed_pf(self, conf: TenantnetConf, vf: VirtualFunction) -> None:
        """Under a tenancy policy a named VF must be one of the network's declared PFs'."""
        assert conf.vf is not None
        allowed = conf.vf.allowed_pfs
        if allowed and vf.pf_netdev not in allowed and vf.pf_address not in allowed:
            field = conf.vf.device_id_field
            raise CniError(Code.TENANT_DENIED,
                           f"tenant isolation: {field}={vf.address!r}: the VF belongs to PF "
                           f"{vf.pf_netdev or vf.pf_address}, and network {conf.name} is declared by the "
                           f"admin on PFs {', '.join(allowed)}")

    def _choose(self, conf: TenantnetConf, env: CniEnv, records: Any) -> VirtualFunction:
        assert conf.vf is not None
        held = self._holders(records)
        if conf.vf.device_id:
            vf = self._vf(conf.vf.device_id, conf.vf.device_id_field)
            self._on_allowed_pf(conf, vf)
            holder = held.get(vf.address)
            if holder is not None and \
                    (holder.container_id, holder.ifname) != (env.container_id, env.ifname):
                raise CniError(
                    Code.INVALID_CONFIG,
                    f"invalid network config: deviceID={vf.address!r}: VF is already attached to pod "
                    f"{holder.pod.namespace}/{holder.pod.name} (container {holder.container_id[:12]}, "
                    f"{holder.ifname}, network {holder.network})",
                )
            return vf
        candidates = []
        for pf in conf.vf.pfs:
            try:
                pf_address = self.sysfs.pf_address(pf)
                candidates.extend(self.sysfs.vfs_of_pf(pf_address))
            except SysfsError as exc:
                field = "pf" if conf.base.raw.get("pf") == pf else "pfs"
                raise CniError(Code.INVALID_CONFIG,
                               f"invalid network config: {field}={pf!r}: {exc}") from None
        for vf in candidates:
            if vf.address in held or vf.userspace or not vf.netdev:
                continue
            if netlink.host_link(vf.netdev) is None:
                continue  # its netdev is in use elsewhere (another pod, another plugin)
            return vf
        raise CniError(
            Code.TRY_AGAIN_LATER,
            f"no free VF on {', '.join(conf.vf.pfs)}: all {len(candidates)} VFs are attached, bound "
            "to a userspace driver, or their netdev is not in the host namespace",
        )

    def pf_settings(self, conf: TenantnetConf) -> tuple[VfState, list[str]]:
        """What ADD sets at the PF for this VF, and which fields."""
        return wanted_state(conf)

    # ---- Driver interface -----------------------------------------------------------
    def plan(self, conf: TenantnetConf, env: CniEnv, records: Any = None) -> dict[str, Any]:
        vf = self._choose(conf, env, records)
        if not vf.pf_netdev:
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid network config: deviceID={vf.address!r}: its PF {vf.pf_address} "
                           "has no netdev to configure VFs through")
        original_vf = self.control.read(vf.pf_netdev, vf.index)
        netdev: dict[str, Any] | None = None
        if not vf.userspace:
            if not vf.netdev:
                raise CniError(Code.INVALID_CONFIG,
                               f"invalid network config: deviceID={vf.address!r}: the VF has no "
                               f"netdev (driver {vf.driver or 'none'})")
            link = netlink.host_link(vf.netdev)
            if link is None:
                raise CniError(Code.INVALID_CONFIG,
                               f"invalid network config: deviceID={vf.address!r}: its netdev "
                               f"{vf.netdev} is not in the host namespace (in use?)")
            netdev = {"name": link.name, "mac": link.mac, "mtu": link.mtu, "up": link.up, "alias": link.alias}
        return {
            "deviceID": vf.address, "pfAddress": vf.pf_address, "pf": vf.pf_netdev,
            "vfIndex": vf.index, "driver": vf.driver, "dpdk": vf.userspace,
            "numaNode": vf.numa_node, "rdma": vf.rdma_device,
            "original": {"vf": original_vf.to_dict(), "netdev": netdev},
        }

    def plan_without_record(self, conf: TenantnetConf, env: CniEnv,
                            records: Any = None) -> dict[str, Any] | None:
        """Without a record a VF is touched only if its netdev carries this attachment's
        mark — in the pod's namespace as `ifname`, or back on the host (its namespace gone)
        — and no other record holds it. A VF at home and unmarked, one another pod holds, or
        a DPDK VF (no netdev to carry a mark) is left exactly as it is."""
        assert conf.vf is not None
        if not conf.vf.device_id:
            raise CniError(Code.INVALID_CONFIG, "no record and no deviceID: cannot tell which VF to reset")
        vf = self._vf(conf.vf.device_id)
        holder = self._holders(records).get(vf.address)
        if holder is not None and (holder.container_id, holder.ifname) != (env.container_id, env.ifname):
            return None
        mark = owner_mark(conf.name, env.container_id, env.ifname)
        in_pod = False
        if env.netns and netns_exists(env.netns):
            try:
                link = netlink.pod_link(env.netns, env.ifname)
            except netlink.NetlinkProblem:
                link = None
            in_pod = link is not None and link.alias == mark
        on_host = any(getattr(netlink.host_link(n), "alias", None) == mark
                      for n in self.sysfs.netdevs_of(vf.address))
        if not in_pod and not on_host:
            on_host = any(li.alias == mark for li in netlink.host_links())
        if not (in_pod or on_host):
            return None
        return self.vf_plan_without_record(vf)

    @staticmethod
    def vf_plan_without_record(vf: VirtualFunction) -> dict[str, Any]:
        """The plan that undoes an attachment of `vf` whose record is lost."""
        return {
            "deviceID": vf.address, "pfAddress": vf.pf_address, "pf": vf.pf_netdev,
            "vfIndex": vf.index, "driver": vf.driver, "dpdk": vf.userspace,
            # Unknown original: reset to the fail-safe state; the netdev comes home under the
            # name sysfs knows for it (if any), down.
            "original": {"vf": SAFE_VF_STATE.to_dict(),
                         "netdev": {"name": vf.netdev, "mac": "", "mtu": 0, "up": False} if vf.netdev
                         else None},
        }

    def attach(self, record: AttachmentRecord, conf: TenantnetConf) -> Attached:
        plan = record.plan
        wanted, fields = self.pf_settings(conf)
        record.mark(STEP_VF)
        try:
            self.control.apply(plan["pf"], plan["vfIndex"], wanted, fields)
        except VfAttributeRefused as exc:
            raise CniError(Code.UNSUPPORTED_FIELD,
                           f"unsupported field: {exc.attribute}: the NIC refused it: {exc}") from None
        faults.step("sriov.vf-configured")
        info = {"pci-address": plan["deviceID"], "pf-pci-address": plan["pfAddress"]}
        if plan.get("rdma"):
            info["rdma-device"] = plan["rdma"]
        if plan["dpdk"]:
            return Attached(host=None, pod_ifname=record.ifname, pci_id=plan["deviceID"], has_netdev=False,
                            device_info=info)
        name = plan["original"]["netdev"]["name"]
        record.mark(STEP_NETDEV)
        netlink.move_to_netns(name, record.netns)
        faults.step("sriov.netdev-moved")
        try:
            netlink.set_pod_link(record.netns, name, new_name=record.ifname, mac=conf.mac,
                                 mtu=conf.vf.mtu if conf.vf else None,
                                 alias=owner_mark(record.network, record.container_id, record.ifname))
        except netlink.LinkExists:
            raise CniError(Code.INVALID_ENV,
                           f"invalid CNI_IFNAME={record.ifname!r}: an interface of that name already "
                           f"exists in {record.netns}") from None
        return Attached(host=None, pod_ifname=record.ifname, pci_id=plan["deviceID"], device_info=info)

    def detach(self, record: AttachmentRecord) -> None:
        plan = record.plan
        done = record.progress
        original = plan.get("original") or {}
        if not plan.get("dpdk") and (done is None or STEP_NETDEV in done):
            self._return_netdev(record, original.get("netdev"))
            faults.step("sriov.netdev-returned")
        if done is None or STEP_VF in done:
            self._restore_vf(plan, VfState.from_dict(original.get("vf") or SAFE_VF_STATE.to_dict()))

    def _return_netdev(self, record: AttachmentRecord, netdev: dict[str, Any] | None) -> None:
        plan = record.plan
        vf_address = plan["deviceID"]
        host_name = netdev["name"] if netdev else None
        in_pod = record.netns and netns_exists(record.netns)
        if in_pod and netlink.return_to_host(record.netns, record.ifname, host_name or record.ifname):
            self._restore_netdev(host_name or record.ifname, netdev)
            return
        # Not in the pod: the netns is gone (the kernel returned the VF), or the move never
        # happened. Find the VF's netdev by its PCI address.
        names = self.sysfs.netdevs_of(vf_address)
        current = next((n for n in names if netlink.host_link(n) is not None), None)
        if current is None:
            mark = owner_mark(record.network, record.container_id, record.ifname)
            current = next((li.name for li in netlink.host_links() if li.alias == mark), None)
        if current is None:
            current = self.control.recover_netdev(plan["pf"], plan["vfIndex"], vf_address)
        if current is None:
            raise netlink.LinkNotFound(f"the netdev of VF {vf_address} is in no namespace we can see")
        if host_name and current != host_name:
            netlink.set_host_link(current, new_name=host_name)
            current = host_name
        self._restore_netdev(current, netdev)

    def _restore_netdev(self, name: str, netdev: dict[str, Any] | None) -> None:
        if not netdev:
            netlink.set_host_link(name, up=False, alias="")
            return
        netlink.set_host_link(name, mac=netdev["mac"] or None, mtu=netdev["mtu"] or None, up=netdev["up"],
                              alias=netdev.get("alias") or "")

    def _restore_vf(self, plan: dict[str, Any], original: VfState) -> None:
        live = self.control.read(plan["pf"], plan["vfIndex"])
        # A driver that does not report spoofchk/trust gives None: nothing known to restore.
        fields = [f for f in self.pf_fields if _differs(f, live, original)
                  and not (f in ("spoofchk", "trust") and getattr(original, f) is None)]
        if fields:
            self.control.apply(plan["pf"], plan["vfIndex"], original, fields)

    def check(self, record: AttachmentRecord, conf: TenantnetConf) -> list[str]:
        plan = record.plan
        drift: list[str] = []
        live = self.control.read(plan["pf"], plan["vfIndex"])
        want = self.pf_settings(conf)
        for field, label in (("vlan", "VLAN/QoS/proto"), ("spoofchk", "spoofchk"), ("trust", "trust"),
                             ("link_state", "link_state"), ("rate", "tx rates"), ("mac", "admin MAC")):
            if field not in want[1]:
                continue
            if _differs(field, live, want[0]):
                drift.append(f"VF {plan['deviceID']} {label} is {_show(field, live)}, "
                             f"expected {_show(field, want[0])}")
        return drift

    def describe(self, record: AttachmentRecord) -> dict[str, Any]:
        plan = record.plan
        live = self.control.read(plan["pf"], plan["vfIndex"])
        return {"deviceID": plan["deviceID"], "pf": plan["pf"], "vfIndex": plan["vfIndex"],
                "dpdk": plan["dpdk"], "vf": live.to_dict()}


def _show(field: str, s: VfState) -> str:
    if field == "vlan":
        return f"{s.vlan}/{s.qos}/{s.proto}"
    if field == "rate":
        return f"min {s.min_tx_rate} max {s.max_tx_rate} Mbps"
    value = getattr(s, field)
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def wanted_state(conf: TenantnetConf) -> tuple[VfState, list[str]]:
    """The PF-side VF settings ADD applies, and which fields it sets."""
    v = conf.vf
    assert v is not None
    wanted = VfState(vlan=v.vlan, qos=v.vlan_qos, proto=v.vlan_proto, spoofchk=v.spoofchk, trust=v.trust)
    fields = ["vlan", "spoofchk", "trust"]
    if conf.mac:
        wanted.mac = conf.mac
        fields.insert(0, "mac")
    if v.link_state:
        wanted.link_state = v.link_state
        fields.append("link_state")
    if v.min_tx_rate is not None or v.max_tx_rate is not None:
        wanted.min_tx_rate = v.min_tx_rate or 0
        wanted.max_tx_rate = v.max_tx_rate or 0
        fields.append("rate")
    return wanted, fields
