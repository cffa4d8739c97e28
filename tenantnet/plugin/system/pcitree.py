"""The PCIe tree from sysfs: where each GPU and NIC sits — host bridge, root port, PCIe switches,
NUMA node — for rail alignment (`tenantnet.plugin.rails` turns two positions into a distance).

This module owns reading that part of sysfs and nothing else; it never writes. As in
`system/sysfs.py`, the tree lives under a configurable root (`/sys`, or a fake tree built by
`tenantnet.lab.pcitree`), every path is joined to that root and every symlink is read with
`os.readlink`; no absolute path is assumed.

Where a device sits is the kernel's own path for it. `bus/pci/devices/<addr>` is a symlink
into `devices/`, nested as the hardware is:

    ../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:08.0/0000:3d:00.0
                     host bridge root port   switch        switch        the device
                     (root complex)          upstream port downstream port

The component `pciDDDD:BB` is the host bridge; each PCI address after it is a bridge the
device sits below, the last one is the device. The bridges' roles follow from the nesting,
as PCIe allows no other shape: a bridge directly below the host bridge is a root port; a
bridge below a root port or a switch's downstream port is a switch's upstream port (the
switch is named by it); a bridge below an upstream port is a downstream port of that switch.
A bridge's `class` confirms it is a PCI-to-PCI bridge (0x0604xx); one whose class says
otherwise (a CardBus bridge, a vendor bridge) is `other` and the role count starts again
below it as below a host bridge. A missing `class` (a minimal fake tree) is taken as a
bridge: the kernel nests PCI devices only below bridges.

GPUs are PCI functions of class 0x0302xx (3D controller) or 0x0300xx (VGA) from a vendor in
`gpu_vendors` (NVIDIA, 0x10de, by default). NICs are Ethernet (0x0200xx) or InfiniBand
(0x0207xx) functions that are not SR-IOV virtual functions (no `physfn` link): a VF sits
beside its PF, so a VF's position is its PF's.

Not handled: devices behind a nested host bridge (Intel VMD's `pci10000:e0`, whose devices
have five-digit PCI domains): they are skipped by discovery, and asking for one is an error.

Every failure becomes a `SysfsError` (or `DeviceNotFound`) whose message names the address or
path and what is wrong; no bare `OSError` escapes.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from tenantnet.plugin.pci import normalise_pci_address
from tenantnet.plugin.system.sysfs import DeviceNotFound, Sysfs, SysfsError

NVIDIA = 0x10DE
GPU_VENDORS = frozenset({NVIDIA})

_BRIDGE_CLASS = 0x0604  # PCI-to-PCI bridge (class >> 8)
_GPU_CLASSES = frozenset({0x0302, 0x0300})  # 3D controller, VGA compatible controller
_NIC_CLASSES = frozenset({0x0200, 0x0207})  # Ethernet, InfiniBand

_HOST_BRIDGE = re.compile(r"pci[0-9a-f]{4,}:[0-9a-f]{2}")


class PortRole(StrEnum):
    """What a bridge above a device is, from its place in the tree."""

    ROOT_PORT = "root-port"
    SWITCH_UPSTREAM = "switch-upstream"
    SWITCH_DOWNSTREAM = "switch-downstream"
    OTHER = "other"  # a bridge whose class is not PCI-to-PCI


class DeviceKind(StrEnum):
    GPU = "gpu"
    NIC = "nic"


@dataclass(frozen=True)
class Bridge:
    """One bridge on a device's way up to its host bridge."""

    address: str
    role: PortRole
    pci_class: int | None  # None: no readable class file
    # The switch this port belongs to, named by its upstream port's address; None for a root
    # port or an `other` bridge.
    switch: str | None


@dataclass(frozen=True)
class PciePosition:
    """Where a PCI device sits: its host bridge, the bridges above it, its NUMA node."""

    address: str  # the device placed (for a VF: its PF)
    host_bridge: str  # "pci0000:3a"
    upstream: tuple[Bridge, ...]  # from the host bridge's side down to the device's parent
    numa_node: int | None  # None: the platform reports none (numa_node -1) or it is unreadable

    @property
    def root_port(self) -> str | None:
        """The root port above the device; None when it sits on the host bridge's own bus."""
        return next((b.address for b in self.upstream if b.role is PortRole.ROOT_PORT), None)

    @property
    def switches(self) -> tuple[str, ...]:
        """The PCIe switches above the device (their upstream ports), top down."""
        return tuple(b.address for b in self.upstream if b.role is PortRole.SWITCH_UPSTREAM)


@dataclass(frozen=True)
class PcieDevice:
    """A GPU or a NIC (PF) found under the sysfs root."""

    address: str
    kind: DeviceKind
    vendor: int | None
    device: int | None
    pci_class: int
    position: PciePosition


class PcieTree(Sysfs):
    """Read-only view of the PCIe tree under a sysfs `root` (addresses, device directories and
    links are read as `Sysfs` reads them)."""

    def __init__(self, root: str = "/sys", gpu_vendors: Iterable[int] = GPU_VENDORS) -> None:
        super().__init__(root)
        self.gpu_vendors = frozenset(gpu_vendors)

    # -- public API -------------------------------------------------------------------------

    def position(self, address: str) -> PciePosition:
        """Where the device at `address` sits; for an SR-IOV VF, where its PF sits."""
        addr = self._address(address)
        dev = self._device_dir(addr)
        pf = self._link_name(os.path.join(dev, "physfn"))
        if pf is not None:
            pf_addr = normalise_pci_address(pf)
            if pf_addr is None:
                raise SysfsError(f"VF {addr}: physfn link points to {pf!r}, which is not a PCI address")
            addr, dev = pf_addr, self._device_dir(pf_addr)
        return self._position(addr, dev)

    def gpus(self) -> list[PcieDevice]:
        """Every GPU under the root (class 3D or VGA controller from a vendor in gpu_vendors)."""
        return [d for d in self._devices() if d.kind is DeviceKind.GPU]

    def nics(self) -> list[PcieDevice]:
        """Every Ethernet or InfiniBand NIC under the root, PFs only (not SR-IOV VFs)."""
        return [d for d in self._devices() if d.kind is DeviceKind.NIC]

    # -- the tree ----------------------------------------------------------------------------

    def _position(self, addr: str, dev: str) -> PciePosition:
        link = os.path.join(self.root, "bus", "pci", "devices", addr)
        target = self._readlink(link)
        parts = [p for p in target.split("/") if p not in ("", ".")]
        hb = next((i for i, p in enumerate(parts) if _HOST_BRIDGE.fullmatch(p)), None)
        if hb is None:
            raise SysfsError(
                f"PCI device {addr}: {link} points to {target!r}, which passes through no host "
                "bridge (a pciDDDD:BB component)"
            )
        chain = parts[hb + 1:]
        if not chain or chain[-1] != addr:
            raise SysfsError(f"PCI device {addr}: {link} points to {target!r}, which does not end in {addr}")
        above = chain[:-1]
        for name in above:
            if normalise_pci_address(name) != name:
                raise SysfsError(
                    f"PCI device {addr}: {name!r} on its way up to {parts[hb]} ({target!r}) is not a "
                    "PCI address; devices behind a nested host bridge (Intel VMD) are not supported"
                )
        upstream: list[Bridge] = []
        previous: Bridge | None = None
        for depth, name in enumerate(above):
            # The bridge's own directory, reached through the device's link: the kernel (or
            # the fake tree's relative links) resolves each ".." physically, inside the root.
            bridge_dir = os.path.join(link, *[".."] * (len(above) - depth))
            pci_class = self._number(os.path.join(bridge_dir, "class"))
            bridge = _bridge(name, pci_class, previous)
            upstream.append(bridge)
            previous = bridge
        return PciePosition(address=addr, host_bridge=parts[hb], upstream=tuple(upstream),
                            numa_node=self._numa_node(dev))

    def _devices(self) -> list[PcieDevice]:
        out = []
        for name in self._names(os.path.join(self.root, "bus", "pci", "devices")):
            if normalise_pci_address(name) != name:
                continue  # a five-digit VMD domain, or something that is no PCI address
            dev = os.path.join(self.root, "bus", "pci", "devices", name)
            pci_class = self._number(os.path.join(dev, "class"))
            if pci_class is None:
                continue
            vendor = self._number(os.path.join(dev, "vendor"))
            if pci_class >> 8 in _GPU_CLASSES and vendor in self.gpu_vendors:
                kind = DeviceKind.GPU
            elif pci_class >> 8 in _NIC_CLASSES and self._link_name(os.path.join(dev, "physfn")) is None:
                kind = DeviceKind.NIC
            else:
                continue
            out.append(PcieDevice(address=name, kind=kind, vendor=vendor,
                                  device=self._number(os.path.join(dev, "device")),
                                  pci_class=pci_class, position=self._position(name, dev)))
        return out

    # -- reading helpers ---------------------------------------------------------------------

    def _numa_node(self, dev: str) -> int | None:
        value = self._number(os.path.join(dev, "numa_node"), base=10)
        return value if value is not None and value >= 0 else None  # -1: no NUMA affinity

    def _number(self, path: str, base: int = 16) -> int | None:
        """A numeric attribute ("0x020000", "1", "-1"); None if absent or not a number."""
        text = self._read(path)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            return None

    @staticmethod
    def _readlink(path: str) -> str:
        try:
            return os.readlink(path)
        except FileNotFoundError:
            raise DeviceNotFound(f"no PCI device at {path}") from None
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise SysfsError(f"{path} is not a symlink into devices/, so its place in the PCIe "
                                 "tree is unknown") from None
            raise SysfsError(f"cannot read link {path}: {exc.strerror or exc}") from None

    @staticmethod
    def _read(path: str) -> str | None:
        # As Sysfs._read, and a path through a file (a device with no such subdirectory) is
        # absent too.
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return f.read().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise SysfsError(f"cannot read {path}: {exc.strerror or exc}") from None


def _bridge(address: str, pci_class: int | None, parent: Bridge | None) -> Bridge:
    """The role of a bridge, from its class and the bridge above it (None: the host bridge)."""
    if pci_class is not None and pci_class >> 8 != _BRIDGE_CLASS:
        return Bridge(address, PortRole.OTHER, pci_class, None)
    if parent is None or parent.role is PortRole.OTHER:
        return Bridge(address, PortRole.ROOT_PORT, pci_class, None)
    if parent.role in (PortRole.ROOT_PORT, PortRole.SWITCH_DOWNSTREAM):
        return Bridge(address, PortRole.SWITCH_UPSTREAM, pci_class, address)
    return Bridge(address, PortRole.SWITCH_DOWNSTREAM, pci_class, parent.switch)
