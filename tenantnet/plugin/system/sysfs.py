"""PCI and SR-IOV discovery from sysfs: PF ↔ VF, VF index, netdev, driver, NUMA node, RDMA.

This module owns reading the sysfs tree and nothing else — it never writes. The tree lives
under a configurable root (the node's `sysfsRoot`, `/sys` by default, or a fake tree built by
`tenantnet.lab.nicsysfs` in tests and in the lab), so every path is joined to that root and every
symlink is read with `os.readlink` + basename: targets are relative in real sysfs and the
fake tree may live anywhere, so no absolute path may be assumed.

Every failure becomes a `SysfsError` (or one of its subclasses) whose message names the
address or path and what is wrong; no bare `OSError` escapes.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

from tenantnet.plugin.pci import normalise_pci_address

USERSPACE_DRIVERS = frozenset({"vfio-pci", "uio_pci_generic", "igb_uio"})

_VIRTFN = re.compile(r"virtfn(\d+)")


class SysfsError(Exception):
    """Something in sysfs is missing or not what it should be; the message says what."""


class DeviceNotFound(SysfsError):
    """No such PCI device or network device under the sysfs root."""


class NotAVirtualFunction(SysfsError):
    """The address is a PF or a plain PCI device where a VF was expected."""


@dataclass(frozen=True)
class VirtualFunction:
    """One VF as sysfs shows it at the time of reading."""

    address: str
    pf_address: str
    pf_netdev: str | None
    index: int
    driver: str | None
    netdev: str | None
    numa_node: int | None
    rdma_device: str | None

    @property
    def userspace(self) -> bool:
        """Bound to a userspace (DPDK) driver: there is no netdev to move, only the device."""
        return self.driver in USERSPACE_DRIVERS


def _valid_ifname(name: str) -> bool:
    # The kernel's dev_valid_name(): at most 15 bytes, not "." or "..", no '/', ':' or
    # whitespace. Checking it here also keeps a hostile name from walking out of class/net.
    return (
        isinstance(name, str)
        and 0 < len(name.encode()) <= 15
        and name not in (".", "..")
        and not any(c in name for c in "/:") and not any(c.isspace() for c in name)
    )


class Sysfs:
    """Read-only view of the PCI and net class parts of a sysfs tree rooted at `root`."""

    def __init__(self, root: str = "/sys") -> None:
        self.root = os.fspath(root)

    # -- public API -------------------------------------------------------------------------

    def vf(self, address: str) -> VirtualFunction:
        """The VF at `address`; DeviceNotFound if absent, NotAVirtualFunction if not a VF."""
        addr = self._address(address)
        dev = self._device_dir(addr)
        pf = self._link_name(os.path.join(dev, "physfn"))
        if pf is None:
            if self._is_pf(dev):
                raise NotAVirtualFunction(
                    f"PCI device {addr} is an SR-IOV physical function (PF) with "
                    f"{self._vf_count(dev)} VF(s), not a virtual function; give one of its VFs"
                )
            raise NotAVirtualFunction(
                f"PCI device {addr} is not an SR-IOV virtual function (no physfn link in {dev})"
            )
        pf_addr = normalise_pci_address(pf)
        if pf_addr is None:
            raise SysfsError(f"VF {addr}: physfn link points to {pf!r}, which is not a PCI address")
        pf_dev = self._device_dir(pf_addr)
        index = next((n for n, vf in self._virtfns(pf_dev) if vf == addr), None)
        if index is None:
            raise SysfsError(f"VF {addr} names {pf_addr} as its PF, but {pf_addr} has no virtfnN link to it")
        return self._build_vf(addr, pf_addr, pf_dev, index)

    def pf_address(self, pf: str) -> str:
        """The PCI address of a PF given as netdev name or PCI address; SysfsError if not a PF."""
        addr = normalise_pci_address(pf)
        if addr is None:
            if not _valid_ifname(pf):
                raise SysfsError(f"{pf!r} is neither a PCI address (DDDD:BB:DD.F) nor a network device name")
            addr = self._netdev_address(pf)
            if addr is None:
                raise SysfsError(
                    f"network device {pf} is not a PCI device (no device link in class/net/{pf})"
                )
            what = f"{addr} (network device {pf})"
        else:
            what = addr
        dev = self._device_dir(addr)
        if not self._is_pf(dev):
            if self._link_name(os.path.join(dev, "physfn")) is not None:
                raise SysfsError(f"PCI device {what} is an SR-IOV virtual function, not a PF")
            raise SysfsError(
                f"PCI device {what} has no SR-IOV capability (no sriov_totalvfs, no virtfn links)"
            )
        return addr

    def vfs_of_pf(self, pf_address: str) -> list[VirtualFunction]:
        """Every VF of the PF at `pf_address`, ordered by VF index."""
        addr = self._address(pf_address)
        dev = self._device_dir(addr)
        if not self._is_pf(dev):
            raise SysfsError(f"PCI device {addr} is not an SR-IOV physical function")
        out = []
        for index, vf_addr in self._virtfns(dev):
            if normalise_pci_address(vf_addr) is None:
                raise SysfsError(
                    f"PF {addr}: virtfn{index} points to {vf_addr!r}, which is not a PCI address"
                )
            out.append(self._build_vf(vf_addr, addr, dev, index))
        return out

    def netdev_pci_address(self, ifname: str) -> str | None:
        """PCI address behind a network device; None if there is no such netdev or it is not PCI."""
        if not _valid_ifname(ifname):
            return None
        try:
            return self._netdev_address(ifname)
        except DeviceNotFound:
            return None

    def netdevs_of(self, address: str) -> list[str]:
        """Network device names of a PCI device (empty when bound to vfio-pci or moved away)."""
        return self._names(os.path.join(self._device_dir(self._address(address)), "net"))

    # -- reading helpers ---------------------------------------------------------------------

    def _address(self, text: str) -> str:
        addr = normalise_pci_address(text)
        if addr is None:
            raise SysfsError(
                f"{text!r} is not a PCI address: expected DDDD:BB:DD.F or BB:DD.F in hex "
                "(device 00-1f, function 0-7), e.g. 0000:3b:00.2"
            )
        return addr

    def _device_dir(self, addr: str) -> str:
        # bus/pci/devices/<addr> is a symlink into devices/pci…/…; the kernel-side layout
        # below it is reached through that link, so the bridge hierarchy never matters here.
        path = os.path.join(self.root, "bus", "pci", "devices", addr)
        if not os.path.isdir(path):
            raise DeviceNotFound(f"no PCI device {addr} (nothing at {path})")
        return path

    def _netdev_address(self, ifname: str) -> str | None:
        net = os.path.join(self.root, "class", "net", ifname)
        if not os.path.lexists(net):
            raise DeviceNotFound(f"no network device {ifname} (nothing at {net})")
        target = self._link_name(os.path.join(net, "device"))
        return normalise_pci_address(target) if target is not None else None

    def _is_pf(self, dev: str) -> bool:
        return os.path.exists(os.path.join(dev, "sriov_totalvfs")) or bool(self._virtfns(dev))

    def _vf_count(self, dev: str) -> int:
        text = self._read(os.path.join(dev, "sriov_numvfs"))
        try:
            return int(text) if text is not None else len(self._virtfns(dev))
        except ValueError:
            return len(self._virtfns(dev))

    def _virtfns(self, dev: str) -> list[tuple[int, str]]:
        """(N, VF address) for each virtfnN link of a PF, by N."""
        out = []
        for name in self._names(dev):
            m = _VIRTFN.fullmatch(name)
            if m:
                target = self._link_name(os.path.join(dev, name))
                if target is not None:
                    out.append((int(m[1]), target))
        return sorted(out)

    def _build_vf(self, addr: str, pf_addr: str, pf_dev: str, index: int) -> VirtualFunction:
        dev = self._device_dir(addr)
        numa = self._read(os.path.join(dev, "numa_node"))
        try:
            numa_node: int | None = int(numa) if numa is not None else None
        except ValueError:
            numa_node = None
        if numa_node is not None and numa_node < 0:  # -1: the platform reports no NUMA affinity
            numa_node = None
        return VirtualFunction(
            address=addr,
            pf_address=pf_addr,
            pf_netdev=self._pf_netdev(pf_dev),
            index=index,
            driver=self._link_name(os.path.join(dev, "driver")),
            netdev=self._first(os.path.join(dev, "net")),
            numa_node=numa_node,
            rdma_device=self._first(os.path.join(dev, "infiniband")),
        )

    def _pf_netdev(self, pf_dev: str) -> str | None:
        """The PF's own netdev: in switchdev mode its net/ also lists the VF representors."""
        net = os.path.join(pf_dev, "net")
        names = self._names(net)
        own = [n for n in names
               if representor_vf_index(_read_attribute(os.path.join(net, n, "phys_port_name")) or "-")
               is None]
        candidates = own or names
        return candidates[0] if candidates else None

    def _first(self, directory: str) -> str | None:
        names = self._names(directory)
        return names[0] if names else None

    @staticmethod
    def _names(directory: str) -> list[str]:
        """Sorted entries of a directory; [] if it does not exist (no driver, no netdev …)."""
        try:
            return sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise SysfsError(f"cannot list {directory}: {exc.strerror or exc}") from None

    @staticmethod
    def _link_name(path: str) -> str | None:
        """Basename of a symlink's target; None if there is no link (unbound driver, no physfn)."""
        try:
            return os.path.basename(os.readlink(path).rstrip("/"))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # exists but is not a symlink: treat as absent
                return None
            raise SysfsError(f"cannot read link {path}: {exc.strerror or exc}") from None

    @staticmethod
    def _read(path: str) -> str | None:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return f.read().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SysfsError(f"cannot read {path}: {exc.strerror or exc}") from None


# -- switchdev representors -------------------------------------------------------------------

# The kernel's phys_port_name forms for a VF representor: "pf0vf3" (mlx5), "c1pf0vf3"
# (multi-host controllers), "vf3", or a bare VF index on some older drivers.
_REP_NAME = re.compile(r"^(?:c\d+)?(?:pf(?P<pf>\d+))?vf(?P<vf>\d+)$|^(?P<bare>\d+)$")


def representor_vf_index(phys_port_name: str) -> tuple[int | None, int] | None:
    """(PF number or None, VF index) from a representor's phys_port_name; None if not a VF rep."""
    m = _REP_NAME.match(phys_port_name.strip())
    if not m:
        return None
    if m["bare"] is not None:
        return None, int(m["bare"])
    return (int(m["pf"]) if m["pf"] is not None else None), int(m["vf"])


def _read_attribute(path: str) -> str | None:
    """A netdev attribute, None when absent *or unsupported*: reading phys_switch_id or
    phys_port_name of a device that has none fails with EOPNOTSUPP on a real kernel."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def vf_of_representor(sysfs: Sysfs, representor: str) -> VirtualFunction | None:
    """The VF a representor netdev stands for (the reverse of `find_representor`), or None:
    the PF with the same `phys_switch_id` (and, if the name says, the same PF number)
    and its VF of the index in the representor's `phys_port_name`."""
    net = os.path.join(sysfs.root, "class", "net")
    switch_id = _read_attribute(os.path.join(net, representor, "phys_switch_id"))
    parsed = representor_vf_index(_read_attribute(os.path.join(net, representor, "phys_port_name")) or "")
    if not switch_id or parsed is None:
        return None
    pf_number, vf_index = parsed
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return None
    for name in names:
        if name == representor or _read_attribute(os.path.join(net, name, "phys_switch_id")) != switch_id:
            continue
        port = _read_attribute(os.path.join(net, name, "phys_port_name")) or ""
        if representor_vf_index(port) is not None:
            continue  # another representor
        if pf_number is not None and re.fullmatch(r"p\d+", port) and int(port[1:]) != pf_number:
            continue  # another PF's uplink on a shared switch
        try:
            vfs = sysfs.vfs_of_pf(sysfs.pf_address(name))
        except SysfsError:
            continue
        found = next((vf for vf in vfs if vf.index == vf_index), None)
        if found is not None:
            return found
    return None


def find_representor(sysfs: Sysfs, vf: VirtualFunction) -> str | None:
    """The netdev representing `vf` on the eswitch (switchdev mode), or None (legacy mode).

    A representor shares the PF's `phys_switch_id` and names the VF in `phys_port_name`.
    """
    if not vf.pf_netdev:
        return None
    net = os.path.join(sysfs.root, "class", "net")
    switch_id = _read_attribute(os.path.join(net, vf.pf_netdev, "phys_switch_id"))
    if not switch_id:
        return None
    pf_port = _read_attribute(os.path.join(net, vf.pf_netdev, "phys_port_name")) or ""
    pf_number = int(pf_port[1:]) if re.fullmatch(r"p\d+", pf_port) else None
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return None
    for name in names:
        if name == vf.pf_netdev or name == vf.netdev:
            continue
        if _read_attribute(os.path.join(net, name, "phys_switch_id")) != switch_id:
            continue
        parsed = representor_vf_index(_read_attribute(os.path.join(net, name, "phys_port_name")) or "")
        if parsed is None or parsed[1] != vf.index:
            continue
        if parsed[0] is not None and pf_number is not None and parsed[0] != pf_number:
            continue  # another PF's VF with the same index on a shared switch
        return name
    return None


def representor_from_devlink(pf_address: str, vf_index: int, dump: str | None = None) -> str | None:
    """The VF's representor from devlink's port dump (`devlink -j port show`), where the kernel
    offers it: a port of the PF's devlink instance with flavour `pcivf` and that `vfnum`.
    `dump` is the JSON text (tests); None runs devlink. None when there is no such port."""
    import json
    import subprocess

    if dump is None:
        try:
            dump = subprocess.run(["devlink", "-j", "port", "show"], capture_output=True, text=True,
                                  timeout=5, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
    try:
        ports = json.loads(dump).get("port") or {}
    except (ValueError, AttributeError):
        return None
    for handle, attrs in ports.items():
        if not handle.startswith(f"pci/{pf_address}/") or not isinstance(attrs, dict):
            continue
        if attrs.get("flavour") == "pcivf" and attrs.get("vfnum") == vf_index and attrs.get("netdev"):
            return str(attrs["netdev"])
    return None
