"""A VF moved into the pod, configured through its PF, and restored exactly when the pod
goes: the part that modes `sriov` (legacy eswitch, drivers/sriov.py) and `ovs-offload`
(switchdev, drivers/ovs_offload.py) share. Each of those subclasses `VfDriver`, names its
mode and says which PF-side attributes it manages (`pf_fields`, `pf_settings`).

Everything the VF was before we touched it — netdev name, MAC, MTU, admin state, and the
PF-side attributes (admin MAC, VLAN/QoS/proto, spoofchk, trust, link state, rates) — is read
in `plan`, i.e. before the intent record is written and before anything changes. DEL puts
all of it back: from the pod, from the host after the kernel returned the VF (netns gone),
or, with no record at all, to safe defaults (spoofchk on, trust off, no VLAN, no MAC).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from cni.env import CniEnv
from cni.errors import CniError, Code
from tenantnet.plugin import draclaims, faults, rails
from tenantnet.plugin.drivers import railfit
from tenantnet.plugin.drivers.base import Attached, Driver, owner_mark
from tenantnet.plugin.drivers.railfit import RailFit
from tenantnet.plugin.records import AttachmentRecord, CorruptRecord, Plan, RecordStore
from tenantnet.plugin.system import netlink, rdmacontrol, vfcontrol
from tenantnet.plugin.system.netns import netns_exists
from tenantnet.plugin.system.rdmacontrol import RdmaControl
from tenantnet.plugin.system.sysfs import Sysfs, SysfsError, VirtualFunction
from tenantnet.plugin.system.vfcontrol import VfAttributeRefused, VfControl
from tenantnet.plugin.system.vfstate import VfState
from tenantnet.plugin.tnconf import TenantnetConf

# The VF state a record-less DEL restores: the fail-safe one.
SAFE_VF_STATE = VfState(mac="00:00:00:00:00:00", vlan=0, qos=0, proto="802.1q", spoofchk=True,
                        trust=False, link_state="auto", min_tx_rate=0, max_tx_rate=0)
_FIELDS = ("mac", "vlan", "spoofchk", "trust", "link_state", "rate")
STEP_VF = "vf"
STEP_NETDEV = "netdev"
STEP_RDMA = "rdma"


@dataclass
class NetdevState:
    """A VF netdev as it was in the host before ADD (DEL puts it back so)."""

    name: str
    mac: str = ""
    mtu: int = 0
    up: bool = False
    alias: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mac": self.mac, "mtu": self.mtu, "up": self.up, "alias": self.alias}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NetdevState:
        return cls(name=d["name"], mac=d.get("mac") or "", mtu=d.get("mtu") or 0, up=bool(d.get("up")),
                   alias=d.get("alias") or "")


# How a VF netdev comes home when nothing says what it was: down and unmarked.
UNKNOWN_NETDEV_HOME = netlink.LinkChange(up=False, alias="")


def netdev_home(netdev: NetdevState | None) -> netlink.LinkChange:
    """What puts a VF netdev back as it was in the host (a MAC or MTU not read is left alone)."""
    if netdev is None:
        return UNKNOWN_NETDEV_HOME
    return netlink.LinkChange(mac=netdev.mac or None, mtu=netdev.mtu or None, up=netdev.up,
                              alias=netdev.alias)


@dataclass
class VfOriginal:
    """The VF before ADD: its PF-side state and (no DPDK) its netdev."""

    vf: VfState
    netdev: NetdevState | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"vf": self.vf.to_dict(), "netdev": self.netdev.to_dict() if self.netdev else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VfOriginal:
        netdev = d.get("netdev")
        return cls(vf=VfState.from_dict(d.get("vf") or SAFE_VF_STATE.to_dict()),
                   netdev=NetdevState.from_dict(netdev) if netdev else None)


@dataclass
class VfPlan(Plan):
    """Which VF, and what it was before ADD."""

    device_id: str = dataclasses.field(default="", metadata={"key": "deviceID"})
    pf_address: str = ""
    pf: str = ""  # the PF's netdev, through which the VF is configured
    vf_index: int = 0
    driver: str | None = None
    dpdk: bool = False  # bound to a userspace driver: no netdev in the pod
    numa_node: int | None = None
    rdma: str | None = None  # the VF's RDMA device, if any
    # Whether ADD moves the RDMA device into the pod (decided in `plan`: the subsystem is in
    # exclusive netns mode and the network's `rdma` is not off).
    rdma_isolated: bool = False
    # Rail alignment: the pod's GPU this VF is paired with, and their PCIe distance (PIX…SYS).
    gpu: str | None = None
    gpu_distance: str | None = None
    original: VfOriginal | None = None

    _decoders = {"original": VfOriginal.from_dict}


def _differs(field: str, a: VfState, b: VfState) -> bool:
    if field == "vlan":
        return (a.vlan, a.qos, a.proto) != (b.vlan, b.qos, b.proto)
    if field == "rate":
        return (a.min_tx_rate, a.max_tx_rate) != (b.min_tx_rate, b.max_tx_rate)
    before: object = getattr(a, field)
    after: object = getattr(b, field)
    return before != after


class VfDriver(Driver):
    plan_type: ClassVar[type[VfPlan]] = VfPlan
    # The VF attributes this mode manages through the PF (and so restores on DEL).
    pf_fields: tuple[str, ...] = _FIELDS

    def __init__(self, node: Any) -> None:
        super().__init__(node)
        self.sysfs = Sysfs(node.sysfs_root)
        self._control: VfControl | None = None
        self._rdma_control: RdmaControl | None = None

    @property
    def control(self) -> VfControl:
        if self._control is None:
            self._control = vfcontrol.control_for(self.node.vf_control, self.node.vf_control_modules)
        return self._control

    @property
    def rdma_control(self) -> RdmaControl:
        if self._rdma_control is None:
            node = self.node
            self._rdma_control = rdmacontrol.control_for(node.rdma_control, node.rdma_control_modules)
        return self._rdma_control

    def _rdma_isolated(self, conf: TenantnetConf, vf: VirtualFunction) -> bool:
        """Whether this VF's RDMA device goes into the pod. In shared netns mode every
        namespace sees every RDMA device and none can be moved: "auto" warns and attaches
        the netdev alone, "exclusive" (or a tenant's `rdmaIsolation: required`) refuses the
        ADD here, before anything is touched."""
        assert conf.vf is not None
        if not vf.rdma_device or conf.vf.rdma == "off":
            return False
        try:
            mode = self.rdma_control.netns_mode()
            why = (f"the node's RDMA subsystem is in {mode} netns mode (every namespace sees every RDMA "
                   "device)")
        except rdmacontrol.RdmaProblem as exc:
            mode, why = "unknown", f"the node's RDMA netns mode cannot be read ({exc})"
        if mode == rdmacontrol.EXCLUSIVE:
            return True
        problem = f"VF {vf.address}'s RDMA device {vf.rdma_device} cannot be isolated in the pod: {why}"
        if conf.vf.rdma == "exclusive":
            raise CniError(Code.RDMA_NOT_ISOLATED, f"RDMA isolation: {problem}; {conf.vf.rdma_required_by} "
                                                   "asks for exclusive", rdmacontrol.SHARED_MODE_FIX)
        from tenantnet.plugin.log import get

        # The log's warnings reach stderr too (entry/logsetup.py), so the runtime's log shows them.
        get("tenantnet.rdma").warning("rdma.shared_mode", network=conf.name, problem=problem,
                                      fix=rdmacontrol.SHARED_MODE_FIX)
        return False

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

    def _holders(self, records: RecordStore | None) -> dict[str, AttachmentRecord]:
        held: dict[str, AttachmentRecord] = {}
        if records is None:
            return held
        for rec in records.list():
            # Any mode's VF: a record of every VF mode carries a VfPlan.
            if not isinstance(rec, CorruptRecord) and isinstance(rec.plan, VfPlan) and rec.plan.device_id:
                held[rec.plan.device_id] = rec
        return held

    def _paired(self, records: RecordStore | None, env: CniEnv) -> list[rails.Pairing]:
        """What the pod's other rails on this node got: its other VF records (same container id)."""
        out: list[rails.Pairing] = []
        for rec in records.list() if records is not None else []:
            if isinstance(rec, CorruptRecord) or rec.container_id != env.container_id \
                    or rec.ifname == env.ifname:
                continue
            plan = rec.plan
            if isinstance(plan, VfPlan) and plan.device_id:
                distance = rails.parse_distance(plan.gpu_distance) if plan.gpu_distance else None
                out.append(rails.Pairing(rec.ifname, plan.pf_address, plan.device_id, plan.gpu, distance))
        return out

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

    def _choose(self, conf: TenantnetConf, env: CniEnv, records: RecordStore | None
                ) -> tuple[VirtualFunction, RailFit | None]:
        assert conf.vf is not None
        held = self._holders(records)
        # A VF a DRA claim holds (docs/dra.md) is that claim's pod's only: the scheduler gave it
        # to the claim, and a NAD or annotation naming it is nobody's way around that.
        claimed = draclaims.claimed_vfs(self.node.state_dir)
        if conf.vf.device_id:
            vf = self._vf(conf.vf.device_id, conf.vf.device_id_field)
            self._on_allowed_pf(conf, vf)
            claim = claimed.get(vf.address)
            why = draclaims.admits(claim, env.args.pod_namespace, env.args.pod_uid) if claim else None
            if why is not None:
                raise CniError(Code.TENANT_DENIED,
                               f"tenant isolation: {conf.vf.device_id_field}={vf.address!r}: {why}")
            holder = held.get(vf.address)
            if holder is not None and \
                    (holder.container_id, holder.ifname) != (env.container_id, env.ifname):
                raise CniError(
                    Code.INVALID_CONFIG,
                    f"invalid network config: deviceID={vf.address!r}: VF is already attached to pod "
                    f"{holder.pod.namespace}/{holder.pod.name} (container {holder.container_id[:12]}, "
                    f"{holder.ifname}, network {holder.network})",
                )
            if conf.vf.rail_within is None:
                return vf, None
            checked = railfit.decide(self.node, conf, env, [vf], self._paired(records, env), pool=False)
            return checked if checked is not None else (vf, None)
        candidates = []
        for pf in conf.vf.pfs:
            try:
                pf_address = self.sysfs.pf_address(pf)
                candidates.extend(self.sysfs.vfs_of_pf(pf_address))
            except SysfsError as exc:
                field = "pf" if conf.base.raw.get("pf") == pf else "pfs"
                raise CniError(Code.INVALID_CONFIG,
                               f"invalid network config: {field}={pf!r}: {exc}") from None
        free = []
        for vf in candidates:
            if vf.address in held or vf.address in claimed or vf.userspace or not vf.netdev:
                continue
            if netlink.host_link(vf.netdev) is None:
                continue  # its netdev is in use elsewhere (another pod, another plugin)
            if conf.vf.rail_within is None:
                return vf, None
            free.append(vf)  # rail alignment weighs every free VF
        chosen = railfit.decide(self.node, conf, env, free, self._paired(records, env)) if free else None
        if chosen is not None:
            return chosen
        raise CniError(
            Code.TRY_AGAIN_LATER,
            f"no free VF on {', '.join(conf.vf.pfs)}: all {len(candidates)} VFs are attached, bound "
            "to a userspace driver, or their netdev is not in the host namespace",
        )

    def pf_settings(self, conf: TenantnetConf) -> tuple[VfState, list[str]]:
        """What ADD sets at the PF for this VF, and which fields."""
        return wanted_state(conf)

    # ---- Driver interface -----------------------------------------------------------
    def plan(self, conf: TenantnetConf, env: CniEnv, records: RecordStore | None = None) -> VfPlan:
        vf, fit = self._choose(conf, env, records)
        if not vf.pf_netdev:
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid network config: deviceID={vf.address!r}: its PF {vf.pf_address} "
                           "has no netdev to configure VFs through")
        original_vf = self.control.read(vf.pf_netdev, vf.index)
        netdev: NetdevState | None = None
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
            netdev = NetdevState(link.name, link.mac, link.mtu, link.up, link.alias)
        return self.plan_type(device_id=vf.address, pf_address=vf.pf_address, pf=vf.pf_netdev,
                              vf_index=vf.index, driver=vf.driver, dpdk=vf.userspace,
                              numa_node=vf.numa_node, rdma=vf.rdma_device,
                              rdma_isolated=self._rdma_isolated(conf, vf),
                              gpu=fit.gpu if fit else None, gpu_distance=fit.distance if fit else None,
                              original=VfOriginal(original_vf, netdev))

    def plan_without_record(self, conf: TenantnetConf, env: CniEnv,
                            records: RecordStore | None = None) -> VfPlan | None:
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

    def vf_plan_without_record(self, vf: VirtualFunction) -> VfPlan:
        """The plan that undoes an attachment of `vf` whose record is lost."""
        # Unknown original: reset to the fail-safe state; the netdev comes home under the
        # name sysfs knows for it (if any), down.
        # Its RDMA device, if it has one, is returned to the host too (a no-op when it is there).
        return self.plan_type(device_id=vf.address, pf_address=vf.pf_address, pf=vf.pf_netdev or "",
                              vf_index=vf.index, driver=vf.driver, dpdk=vf.userspace,
                              rdma=vf.rdma_device, rdma_isolated=bool(vf.rdma_device),
                              original=VfOriginal(SAFE_VF_STATE,
                                                  NetdevState(vf.netdev) if vf.netdev else None))

    def attach(self, record: AttachmentRecord, conf: TenantnetConf) -> Attached:
        plan = vf_plan(record)
        wanted, fields = self.pf_settings(conf)
        record.mark(STEP_VF)
        try:
            self.control.apply(plan.pf, plan.vf_index, wanted, fields)
        except VfAttributeRefused as exc:
            raise CniError(Code.UNSUPPORTED_FIELD,
                           f"unsupported field: {exc.attribute}: the NIC refused it: {exc}") from None
        faults.step("sriov.vf-configured")
        info = {"pci-address": plan.device_id, "pf-pci-address": plan.pf_address}
        if plan.rdma:
            info["rdma-device"] = plan.rdma
        if plan.gpu:
            # Not NPWG device-info fields: tenantnet's rail pairing (docs/rails.md).
            info["gpu-pci-address"] = plan.gpu
            info["gpu-distance"] = plan.gpu_distance or ""
        if plan.dpdk:
            return Attached(host=None, pod_ifname=record.ifname, pci_id=plan.device_id, has_netdev=False,
                            device_info=info)
        assert plan.original is not None and plan.original.netdev is not None
        record.mark(STEP_NETDEV)
        try:
            netlink.move_into_pod(plan.original.netdev.name, record.netns, netlink.LinkChange(
                name=record.ifname, mac=conf.mac, mtu=conf.vf.mtu if conf.vf else None,
                alias=owner_mark(record.network, record.container_id, record.ifname)))
        except netlink.NameTakenInPod:
            # The VF stays in the pod under its host name, where the rollback finds it.
            raise CniError(Code.INVALID_ENV, f"invalid CNI_IFNAME={record.ifname!r}: an interface of that "
                                             f"name already exists in {record.netns}") from None
        faults.step("sriov.netdev-moved")
        if plan.rdma and plan.rdma_isolated:
            # After the netdev (the pod sees its interface first), recorded before it moves.
            record.mark(STEP_RDMA)
            self.rdma_control.move(plan.rdma, record.netns)
            faults.step("sriov.rdma-moved")
        return Attached(host=None, pod_ifname=record.ifname, pci_id=plan.device_id, device_info=info)

    def detach(self, record: AttachmentRecord) -> None:
        plan = vf_plan(record)
        done = record.progress
        original = plan.original or VfOriginal(SAFE_VF_STATE)
        if plan.rdma and plan.rdma_isolated and (done is None or STEP_RDMA in done):
            # Before the netdev leaves the pod; with the pod's namespace gone the kernel has
            # returned the device itself, and return_to_host checks it is home.
            in_pod = bool(record.netns) and netns_exists(record.netns)
            if not self.rdma_control.return_to_host(plan.rdma, record.netns if in_pod else None):
                raise rdmacontrol.RdmaProblem(f"the RDMA device {plan.rdma} of VF {plan.device_id} is not "
                                              "back on the host, and is in no namespace we can reach")
            faults.step("sriov.rdma-returned")
        if not plan.dpdk and (done is None or STEP_NETDEV in done):
            self._return_netdev(record, original.netdev)
            faults.step("sriov.netdev-returned")
        if done is None or STEP_VF in done:
            self._restore_vf(plan, original.vf)

    def status(self, raw: dict[str, Any]) -> None:
        """Code 50 when the network must isolate RDMA devices (`rdma: exclusive`, or a tenant
        granted it requires `rdmaIsolation`) and the node's RDMA subsystem cannot (shared
        netns mode): every ADD with an RDMA-capable VF would be refused."""
        from tenantnet.plugin import tenancy

        wanted = "the network's rdma: exclusive" if raw.get("rdma") == "exclusive" else None
        if wanted is None and raw.get("rdma", "auto") != "off":
            policy = tenancy.load(self.node)
            strict = [t.name for t in (policy.tenants if policy else ())
                      if t.rdma_isolation_required and raw.get("name") in t.networks]
            if strict:
                wanted = f"tenant {strict[0]}'s rdmaIsolation: required"
        if wanted is None:
            return
        try:
            mode = self.rdma_control.netns_mode()
        except rdmacontrol.RdmaProblem as exc:
            raise CniError(Code.NOT_AVAILABLE, f"not available: {wanted} asks for RDMA isolation, and the "
                                               f"node's RDMA netns mode cannot be read: {exc}") from None
        if mode != rdmacontrol.EXCLUSIVE:
            raise CniError(Code.NOT_AVAILABLE,
                           f"not available: the node's RDMA subsystem is in {mode} netns mode, so RDMA "
                           f"devices cannot be isolated in pods, and {wanted} asks for it",
                           rdmacontrol.SHARED_MODE_FIX)

    def pod_netdev(self, record: AttachmentRecord) -> bool:
        return not vf_plan(record).dpdk  # a DPDK VF has no netdev in the pod

    def _return_netdev(self, record: AttachmentRecord, netdev: NetdevState | None) -> None:
        plan = vf_plan(record)
        vf_address = plan.device_id
        host_name = netdev.name if netdev else None
        in_pod = record.netns and netns_exists(record.netns)
        mark = owner_mark(record.network, record.container_id, record.ifname)
        if in_pod and netlink.return_from_pod(record.netns, record.ifname, host_name or record.ifname,
                                              netdev_home(netdev), mark):
            return
        # Not in the pod: the netns is gone (the kernel returned the VF), or the move never
        # happened. Find the VF's netdev by its PCI address.
        names = self.sysfs.netdevs_of(vf_address)
        current = next((n for n in names if netlink.host_link(n) is not None), None)
        if current is None:
            current = next((li.name for li in netlink.host_links() if li.alias == mark), None)
        if current is None:
            current = self.control.recover_netdev(plan.pf, plan.vf_index, vf_address)
        if current is None:
            raise netlink.LinkNotFound(f"the netdev of VF {vf_address} is in no namespace we can see")
        if host_name and current != host_name:
            netlink.set_host_link(current, new_name=host_name)
            current = host_name
        self._restore_netdev(current, netdev)

    def _restore_netdev(self, name: str, netdev: NetdevState | None) -> None:
        home = netdev_home(netdev)
        netlink.set_host_link(name, mac=home.mac, mtu=home.mtu, up=home.up, alias=home.alias)

    def _restore_vf(self, plan: VfPlan, original: VfState) -> None:
        live = self.control.read(plan.pf, plan.vf_index)
        # A driver that does not report spoofchk/trust gives None: nothing known to restore.
        fields = [f for f in self.pf_fields if _differs(f, live, original)
                  and not (f in ("spoofchk", "trust") and getattr(original, f) is None)]
        if fields:
            self.control.apply(plan.pf, plan.vf_index, original, fields)

    def check(self, record: AttachmentRecord, conf: TenantnetConf) -> list[str]:
        plan = vf_plan(record)
        drift: list[str] = []
        live = self.control.read(plan.pf, plan.vf_index)
        want = self.pf_settings(conf)
        for field, label in (("vlan", "VLAN/QoS/proto"), ("spoofchk", "spoofchk"), ("trust", "trust"),
                             ("link_state", "link_state"), ("rate", "tx rates"), ("mac", "admin MAC")):
            if field not in want[1]:
                continue
            if _differs(field, live, want[0]):
                drift.append(f"VF {plan.device_id} {label} is {_show(field, live)}, "
                             f"expected {_show(field, want[0])}")
        return drift


def vf_plan(record: AttachmentRecord) -> VfPlan:
    assert isinstance(record.plan, VfPlan), f"a VF record with a {type(record.plan).__name__}"
    return record.plan


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
