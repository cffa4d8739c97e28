"""The lab's simulated RDMA subsystem — a simulation, labelled as one.

This kernel has no RDMA hardware and no ib_core (no NETLINK_RDMA), so nothing here moves a
real RDMA device. The simulated NIC's VFs have simulated RDMA devices: the `infiniband/<dev>`
entries `tenantnet.lab.nicsysfs` writes under each mlx5 VF's PCI directory in the lab's fake
sysfs. `LabRdmaControl` implements the same `RdmaControl` interface as the netlink one and
records, in a JSON state file, the subsystem's netns mode and which network namespace holds
each device — by the identity (st_dev, st_ino) of the namespace the device was moved into.
It enforces what the kernel enforces in exclusive mode:

- shared mode refuses every move with EOPNOTSUPP, as ib_device_set_netns_put does;
- a device can only be moved from the namespace that holds it: `move` from the host when the
  host holds it, `return_to_host` from the namespace it is in (ENODEV otherwise, as the
  kernel's "not in this namespace");
- a namespace that no longer exists holds nothing: its devices are back on the host, as the
  kernel's rdma_dev_exit_net returns them to init_net.

Where it differs from the kernel (what a state file cannot see): a namespace counts as gone
as soon as the path it was moved to no longer names it (`ip netns delete`, the pid gone),
even if some process still holds it open (the kernel would return the device only when the
last reference goes); a new namespace created at the same path that happens to get the
same inode number would be taken for the old one; the fake sysfs keeps showing a moved
device's `infiniband/` entry on the host (a real kernel hides it: the class is
namespace-tagged); a mode change is refused only while a device sits in a namespace (the
kernel refuses it while any namespace but init_net exists). The mode starts as `exclusive`
(the kernel's default is `shared`) so the lab shows isolation; `set_netns_mode` changes it.

The state lives in `<lab dir>/rdma/state.json` under an flock on `<lab dir>/rdma/state.lock`
(several plugin processes and the agent share it); the devices are read from
`<lab dir>/sys`, the simulated NIC's sysfs root. A node config selects it with
`rdmaControl: lab-rdma:<lab dir>` and `rdmaControlModules: [tenantnet.lab.rdma]`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tenantnet.lab import statefile
from tenantnet.plugin.system import rdmacontrol
from tenantnet.plugin.system.netns import NamespaceNotFound
from tenantnet.plugin.system.rdmacontrol import (
    EXCLUSIVE,
    SHARED,
    SHARED_MODE_FIX,
    NetnsId,
    RdmaControl,
    RdmaDeviceNotFound,
    RdmaProblem,
    RdmaSharedMode,
    netns_identity,
)

SCHEME = "lab-rdma"
LABEL = "lab RDMA simulation"
DEFAULT_MODE = EXCLUSIVE


def _initial() -> dict[str, Any]:
    return {"simulated": True, "mode": DEFAULT_MODE, "holders": {}}


class LabRdma:
    """The simulated RDMA subsystem of one lab directory: its devices and its state file."""

    def __init__(self, lab_root: str, sysfs_root: str | None = None) -> None:
        self.root = Path(lab_root)
        self.state_path = self.root / "rdma" / "state.json"
        self.sysfs_root = Path(sysfs_root) if sysfs_root else self.root / "sys"

    def devices(self) -> dict[str, str]:
        """RDMA device → its PCI address, from the simulated NIC's sysfs."""
        out: dict[str, str] = {}
        pci = self.sysfs_root / "bus" / "pci" / "devices"
        for address in _names(pci):
            for device in _names(pci / address / "infiniband"):
                if device in out:  # the kernel's RDMA device names are unique on the node
                    raise RdmaProblem(f"{LABEL}: RDMA device {device} appears under two PCI devices "
                                      f"({out[device]}, {address}) in {self.sysfs_root}", errno.EEXIST)
                out[device] = address
        return out

    @contextmanager
    def locked_state(self) -> Iterator[dict[str, Any]]:
        with statefile.locked(self.state_path, _initial) as state:
            yield state

    def read_state(self) -> dict[str, Any]:
        return statefile.read(self.state_path, _initial)


def _names(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _live_holder(state: dict[str, Any], device: str) -> NetnsId | None:
    """The namespace holding `device`, None for the host. An entry whose namespace is gone is
    dropped: the (simulated) kernel has returned the device to the host."""
    entry = state["holders"].get(device)
    if entry is None:
        return None
    holder = NetnsId.from_dict(entry)
    if netns_identity(entry.get("path", "")) != holder:
        del state["holders"][device]
        return None
    return holder


class LabRdmaControl(RdmaControl):
    """RDMA control over the lab's simulated RDMA devices (see the module docstring)."""

    def __init__(self, lab_root: str) -> None:
        self.rdma = LabRdma(lab_root)

    def _known(self, device: str) -> None:
        if device not in self.rdma.devices():
            raise RdmaDeviceNotFound(f"{LABEL}: no RDMA device {device} on the simulated NIC "
                                     f"({self.rdma.sysfs_root})", errno.ENODEV)

    def netns_mode(self) -> str:
        return str(self.rdma.read_state().get("mode", DEFAULT_MODE))

    def set_netns_mode(self, mode: str) -> None:
        """`rdma system set netns shared|exclusive`, simulated."""
        if mode not in (SHARED, EXCLUSIVE):
            raise ValueError(f"RDMA netns mode {mode!r}: allowed are {SHARED}, {EXCLUSIVE}")
        with self.rdma.locked_state() as state:
            if state.get("mode") == mode:
                return
            held = sorted(d for d in list(state["holders"]) if _live_holder(state, d) is not None)
            if held:
                raise RdmaProblem(f"{LABEL}: cannot switch to {mode} netns mode while RDMA devices are in "
                                  f"other network namespaces ({', '.join(held)})", errno.EBUSY)
            state["mode"] = mode

    def where(self, device: str, candidates: Sequence[str] = ()) -> NetnsId | None:
        self._known(device)
        with self.rdma.locked_state() as state:
            return _live_holder(state, device)

    def move(self, device: str, netns_path: str) -> None:
        self._known(device)
        target = netns_identity(netns_path)
        if target is None:
            if not os.path.exists(netns_path):
                raise NamespaceNotFound(f"network namespace {netns_path} does not exist")
            raise RdmaProblem(f"{LABEL}: {netns_path} is not a network namespace", errno.EINVAL)
        host = netns_identity(rdmacontrol.THREAD_NETNS)
        with self.rdma.locked_state() as state:
            if state.get("mode", DEFAULT_MODE) == SHARED:
                raise RdmaSharedMode(f"{LABEL}: cannot move RDMA device {device} into {netns_path}: the "
                                     f"RDMA subsystem is in shared netns mode; {SHARED_MODE_FIX}",
                                     errno.EOPNOTSUPP)
            holder = _live_holder(state, device)
            if holder == target:
                return  # there already
            if holder is not None:
                raise RdmaDeviceNotFound(f"{LABEL}: RDMA device {device} is not in the host network "
                                         f"namespace (it is in {holder})", errno.ENODEV)
            if target == host:
                return
            state["holders"][device] = {**target.to_dict(), "path": netns_path}

    def return_to_host(self, device: str, from_netns_path: str | None) -> bool:
        self._known(device)
        source = netns_identity(from_netns_path) if from_netns_path else None
        with self.rdma.locked_state() as state:
            holder = _live_holder(state, device)
            if holder is None:
                return True
            if source != holder:
                return False  # held by a namespace the caller did not name
            del state["holders"][device]
            return True

    def describe(self) -> list[dict[str, Any]]:
        """Every simulated RDMA device and where it is (for `tenantnetctl lab status`)."""
        devices = self.rdma.devices()
        with self.rdma.locked_state() as state:
            holders = {device: _live_holder(state, device) for device in devices}
            mode = state.get("mode", DEFAULT_MODE)
            paths = {d: e.get("path") for d, e in state["holders"].items()}
        return [{"device": device, "pciAddress": address, "simulated": True, "netnsMode": mode,
                 "netns": str(holders[device]) if holders[device] else None,
                 "netnsPath": paths.get(device)}
                for device, address in sorted(devices.items())]


# The lab's node config says `rdmaControl: lab-rdma:<lab dir>` and `rdmaControlModules:
# [tenantnet.lab.rdma]`: importing this module is what serves it.
rdmacontrol.register(SCHEME, LabRdmaControl)
