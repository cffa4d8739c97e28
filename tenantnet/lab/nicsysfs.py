"""Fake sysfs trees shaped like real SR-IOV NICs (NVIDIA ConnectX, Intel E810).

This module owns the *layout* of a simulated NIC in sysfs — it only writes files, directories
and relative symlinks under a root directory; it creates no netdevs and needs no privileges.
`tenantnet.plugin.system.sysfs.Sysfs(root)` reads the result exactly as it reads the real `/sys`,
the unit tests use it on `tmp_path`, and the lab turns it into a simulated NIC by creating
veth netdevs named as the tree says.

What is mirrored from the kernel (drivers/pci/iov.c, drivers/base, net/core/net-sysfs.c):

    devices/pci<dom>:<pb>/<dom>:<pb>:00.0/<addr>/     the device (VFs are siblings of their PF);
                                                    under `SimPf.parent` when one is given
        physfn -> ../<pf addr>                          VF only
        virtfn<N> -> ../<vf addr>, sriov_totalvfs, sriov_numvfs        PF only
        driver -> ../../../../bus/pci/drivers/<name>    (relative, depth as in the tree)
        net/<ifname>/device -> ../../../<addr>          absent for vfio-pci-bound VFs
        net/<ifname>/phys_switch_id                     PF only, when a switch id is given
        infiniband/<dev>/                               mlx5 VFs with RDMA
        numa_node                                       "-1" when the platform reports none
    bus/pci/devices/<addr> -> ../../../devices/…/<addr>
    bus/pci/drivers/<name>/<addr> -> ../../../../devices/…/<addr>
    class/net/<ifname> -> ../../devices/…/<addr>/net/<ifname>

Every symlink is relative, so a tree keeps working when its directory is moved or bind-mounted.
`write_tree` is idempotent and reconciling for the PFs it is given: writing a changed
description (a VF rebound to vfio-pci, fewer VFs) removes what no longer belongs to them, so
the lab can rewrite it at any time.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tenantnet.plugin.pci import normalise_pci_address

# Drivers that present no netdev and no RDMA device: the VF belongs to a userspace process.
_DPDK_DRIVER = "vfio-pci"


@dataclass
class SimVf:
    address: str
    netdev: str | None
    driver: str
    rdma_device: str | None = None
    numa_node: int = 0


@dataclass
class SimPf:
    address: str
    netdev: str
    driver: str
    vfs: list[SimVf] = field(default_factory=list)
    numa_node: int = 0
    totalvfs: int = 8
    switch_id: str = ""
    # The directory of the PF's upstream bridge, relative to the root, e.g.
    # "devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0" (a switch's downstream port,
    # as `tenantnet.lab.pcitree` builds it); "" puts the PF behind a root port of its own on
    # the bus before its own, as before. The PF and its VFs keep it for their lifetime: a
    # rewrite with another parent does not move them.
    parent: str = ""


def connectx_pf(
    pf_netdev: str = "lpf0", vfs: int = 4, dpdk_vfs: Iterable[int] = (), bus: str = "3b", rdma: bool = True,
    parent: str = "",
) -> SimPf:
    """An NVIDIA ConnectX-like PF: mlx5_core, VFs from <bus>:00.2 on, RDMA devices mlx5_<i+2>.

    mlx5 numbers VF functions right after the two PF ports (00.0, 00.1), so VF i is PCI
    function 2 + i counted across devices (00.2 … 00.7, 01.0 …), and its RDMA device follows
    the PFs' mlx5_0 / mlx5_1. `parent`: see `SimPf.parent`.
    """
    dpdk = _dpdk_set(dpdk_vfs, vfs)
    bus = _bus(bus)
    sim_vfs = []
    for i in range(vfs):
        address = _address(bus, 2 + i)
        if i in dpdk:
            sim_vfs.append(SimVf(address=address, netdev=None, driver=_DPDK_DRIVER))
        else:
            sim_vfs.append(SimVf(address=address, netdev=f"{pf_netdev}v{i}", driver="mlx5_core",
                                 rdma_device=f"mlx5_{i + 2}" if rdma else None))
    return SimPf(address=_address(bus, 0), netdev=pf_netdev, driver="mlx5_core", vfs=sim_vfs,
                 totalvfs=max(8, vfs), parent=parent)


def e810_pf(pf_netdev: str = "lpf1", vfs: int = 4, dpdk_vfs: Iterable[int] = (), bus: str = "5e") -> SimPf:
    """An Intel E810-like PF: ice, VFs from <bus>:01.0 on with iavf, no RDMA."""
    dpdk = _dpdk_set(dpdk_vfs, vfs)
    bus = _bus(bus)
    sim_vfs = []
    for i in range(vfs):
        address = _address(bus, 8 + i)
        if i in dpdk:
            sim_vfs.append(SimVf(address=address, netdev=None, driver=_DPDK_DRIVER))
        else:
            sim_vfs.append(SimVf(address=address, netdev=f"{pf_netdev}v{i}", driver="iavf"))
    # E810 firmware exposes 256 VFs per device; only the described ones are enabled.
    return SimPf(address=_address(bus, 0), netdev=pf_netdev, driver="ice", vfs=sim_vfs, totalvfs=256)


def write_tree(root: str | Path, pfs: list[SimPf]) -> None:
    """Lay out (or bring up to date) the sysfs tree for `pfs` under `root`."""
    root = Path(root)
    _check(pfs)
    for pf in pfs:
        parent = _parent_dir(root, pf)
        pf_dir = parent / pf.address
        pf_dir.mkdir(parents=True, exist_ok=True)
        wanted_vfs = {vf.address for vf in pf.vfs}
        # VFs that were in an earlier description of this PF but are no longer: gone entirely,
        # as after lowering sriov_numvfs.
        for name in _names(pf_dir):
            if name.startswith("virtfn"):
                old = _readlink_name(pf_dir / name)
                if old not in wanted_vfs or not name[6:].isdigit() or int(name[6:]) >= len(pf.vfs):
                    (pf_dir / name).unlink()
                if old and old not in wanted_vfs:
                    _remove_device(root, parent, old)
        _write_device(root, parent, pf.address, pf.driver, [pf.netdev], None, pf.numa_node)
        write_attribute(pf_dir / "sriov_totalvfs", str(pf.totalvfs))
        write_attribute(pf_dir / "sriov_numvfs", str(len(pf.vfs)))
        if pf.switch_id:
            write_attribute(pf_dir / "net" / pf.netdev / "phys_switch_id", pf.switch_id)
        else:
            _unlink(pf_dir / "net" / pf.netdev / "phys_switch_id")
        for index, vf in enumerate(pf.vfs):
            _write_device(root, parent, vf.address, vf.driver, [vf.netdev] if vf.netdev else [],
                          vf.rdma_device, vf.numa_node)
            relink(parent / vf.address / "physfn", f"../{pf.address}")
            relink(pf_dir / f"virtfn{index}", f"../{vf.address}")
    _prune_class_net(root)


# -- layout helpers ------------------------------------------------------------------------


def _parent_dir(root: Path, pf: SimPf) -> Path:
    # Without a parent, a PF sits behind a root port on the bus before its own, as on a
    # typical server (pci0000:3a/0000:3a:00.0/0000:3b:00.0); its VFs are created next to it.
    if pf.parent:
        return root / pf.parent
    domain, bus, _ = pf.address.split(":")
    upstream = f"{max(int(bus, 16) - 1, 0):02x}"
    return root / "devices" / f"pci{domain}:{upstream}" / f"{domain}:{upstream}:00.0"


def _write_device(root: Path, parent: Path, address: str, driver: str, netdevs: list[str],
                  rdma_device: str | None, numa_node: int) -> None:
    dev = parent / address
    dev.mkdir(parents=True, exist_ok=True)
    bus_devices = root / "bus" / "pci" / "devices"
    relink(bus_devices / address, os.path.relpath(dev, bus_devices))
    write_attribute(dev / "numa_node", str(numa_node))

    drivers = root / "bus" / "pci" / "drivers"
    for other in _names(drivers):  # a rebind (e.g. mlx5_core → vfio-pci) leaves no stale back-link
        if other != driver:
            _unlink(drivers / other / address)
    if driver:
        (drivers / driver).mkdir(parents=True, exist_ok=True)
        relink(dev / "driver", os.path.relpath(drivers / driver, dev))
        relink(drivers / driver / address, os.path.relpath(dev, drivers / driver))
    else:
        _unlink(dev / "driver")

    _sync_dir(dev / "net", netdevs)
    for name in netdevs:
        (dev / "net" / name).mkdir(parents=True, exist_ok=True)
        relink(dev / "net" / name / "device", f"../../../{address}")
        (root / "class" / "net").mkdir(parents=True, exist_ok=True)
        relink(root / "class" / "net" / name, os.path.relpath(dev / "net" / name, root / "class" / "net"))
    _sync_dir(dev / "infiniband", [rdma_device] if rdma_device else [])
    if rdma_device:
        (dev / "infiniband" / rdma_device).mkdir(parents=True, exist_ok=True)


def _remove_device(root: Path, parent: Path, address: str) -> None:
    shutil.rmtree(parent / address, ignore_errors=True)
    _unlink(root / "bus" / "pci" / "devices" / address)
    for driver in _names(root / "bus" / "pci" / "drivers"):
        _unlink(root / "bus" / "pci" / "drivers" / driver / address)


def _sync_dir(directory: Path, keep: list[str]) -> None:
    """Remove entries of `directory` not in `keep`; drop the directory itself if nothing is kept."""
    for name in _names(directory):
        if name not in keep:
            shutil.rmtree(directory / name, ignore_errors=True)
    if not keep and directory.is_dir():
        directory.rmdir()


def _prune_class_net(root: Path) -> None:
    # class/net links whose netdev directory was removed above now dangle: the netdev is gone.
    class_net = root / "class" / "net"
    for name in _names(class_net):
        link = class_net / name
        if link.is_symlink() and not link.exists():
            link.unlink()


def relink(path: Path, target: str) -> None:
    """`path` a symlink to `target` (relative), whatever was there before."""
    if path.is_symlink():
        if os.readlink(path) == target:
            return
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def write_attribute(path: Path, text: str) -> None:
    """A fake sysfs attribute (rewritten only when it changes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    content = text + "\n"  # sysfs attributes end in a newline
    if not path.is_file() or path.read_text() != content:
        path.write_text(content)


def _unlink(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()


def _names(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _readlink_name(path: Path) -> str:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return ""


# -- description helpers --------------------------------------------------------------------


def _bus(bus: str) -> str:
    if normalise_pci_address(f"{bus}:00.0") is None:
        raise ValueError(f"bus {bus!r} is not a two-digit hex PCI bus number")
    return bus.lower()


def _address(bus: str, n: int) -> str:
    """PCI address of the n-th function on `bus` (8 functions per device, 32 devices)."""
    if n >= 32 * 8:
        raise ValueError(f"function number {n} does not fit on bus {bus} (at most 256 functions)")
    return f"0000:{bus}:{n // 8:02x}.{n % 8}"


def _dpdk_set(dpdk_vfs: Iterable[int], vfs: int) -> set[int]:
    dpdk = set(dpdk_vfs)
    bad = sorted(i for i in dpdk if not 0 <= i < vfs)
    if bad:
        raise ValueError(f"dpdk_vfs {bad} out of range: VF indexes are 0..{vfs - 1}")
    return dpdk


def _check(pfs: list[SimPf]) -> None:
    """Refuse descriptions the kernel could never produce, before anything is written."""
    seen_addresses: set[str] = set()
    seen_netdevs: set[str] = set()
    for pf in pfs:
        for address in [pf.address, *(vf.address for vf in pf.vfs)]:
            if normalise_pci_address(address) != address:
                raise ValueError(f"{address!r} is not a normalised PCI address (DDDD:BB:DD.F, lowercase)")
            if address in seen_addresses:
                raise ValueError(f"PCI address {address} appears twice")
            seen_addresses.add(address)
        for name in [pf.netdev, *(vf.netdev for vf in pf.vfs if vf.netdev)]:
            if not name or len(name) > 15 or any(c in name for c in "/: ") or name in (".", ".."):
                raise ValueError(f"{name!r} is not a valid network device name")
            if name in seen_netdevs:
                raise ValueError(f"network device {name} appears twice")
            seen_netdevs.add(name)
        if len(pf.vfs) > pf.totalvfs:
            raise ValueError(f"PF {pf.address} has {len(pf.vfs)} VFs but sriov_totalvfs is {pf.totalvfs}")
        if pf.parent:
            parts = pf.parent.split("/")
            if (os.path.isabs(pf.parent) or len(parts) < 2 or parts[0] != "devices"
                    or any(p in ("", ".", "..") for p in parts)):
                raise ValueError(f"PF {pf.address}: parent {pf.parent!r} is not a path inside the tree's "
                                 "devices/ directory (relative, no '.' or '..', "
                                 "e.g. devices/pci0000:10/0000:10:01.0)")


def write_representors(root: str | Path, pf: SimPf, representors: dict[int, str], pf_number: int = 0) -> None:
    """Switchdev mode: VF representor netdevs under the PF, as mlx5 lays them out.

    Each representor is a netdev of the PF's PCI device with the PF's `phys_switch_id` and a
    `phys_port_name` of `pf<N>vf<index>`; the PF itself becomes the uplink `p<N>`. Call after
    `write_tree` (which would drop these netdevs again when rewriting the PF).
    """
    if not pf.switch_id:
        raise ValueError(f"PF {pf.address}: switchdev representors need a switch_id")
    root = Path(root)
    pf_dir = _parent_dir(root, pf) / pf.address
    write_attribute(pf_dir / "net" / pf.netdev / "phys_port_name", f"p{pf_number}")
    class_net = root / "class" / "net"
    class_net.mkdir(parents=True, exist_ok=True)
    for index, name in representors.items():
        rep = pf_dir / "net" / name
        rep.mkdir(parents=True, exist_ok=True)
        relink(rep / "device", f"../../../{pf.address}")
        write_attribute(rep / "phys_switch_id", pf.switch_id)
        write_attribute(rep / "phys_port_name", f"pf{pf_number}vf{index}")
        relink(class_net / name, os.path.relpath(rep, class_net))
