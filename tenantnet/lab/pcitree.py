"""A simulated PCIe tree — host bridges, root ports, PCIe switches, GPUs and SR-IOV NICs — in a
fake sysfs, for rail alignment in the unit tests and the lab. A simulation, labelled as one:
no device exists, only the files and symlinks the kernel would show for it.

This module owns the layout of the PCIe part of such a tree: the bridges and GPUs it writes
itself, the NICs through `tenantnet.lab.nicsysfs` (each PF placed under a downstream port with
`SimPf.parent`, its VFs beside it), plus the PCI identity files (`class`, `vendor`,
`device`) that `tenantnet.plugin.system.pcitree.PcieTree` reads to find GPUs and NICs. Like
nicsysfs it writes only below the root, with relative symlinks, and needs no privileges:

    devices/pci<dom>:<bus>/                                 a host bridge (root complex)
        <root port>/<switch upstream>/<downstream>/<device>/  nested as the hardware is
            class, vendor, device, numa_node                "0x060400", "0x10de", …, "-1" unknown
    bus/pci/devices/<addr> -> ../../../devices/…/<addr>     every function, bridges included

`hgx_8x8` is the shape of a DGX H100-class server (on Sapphire Rapids), simplified:

    socket 0 (NUMA 0)                                socket 1 (NUMA 1)
    ├─ host bridge pci0000:10                        ├─ host bridge pci0000:90
    │  └─ root port ─ switch ─┬─ GPU 0               │  └─ root port ─ switch ─┬─ GPU 4
    │                         └─ NIC 0               │                         └─ NIC 4
    ├─ host bridge pci0000:20                        ├─ host bridge pci0000:a0
    │  └─ root port ─ switch ─┬─ GPU 1               │  └─ …  GPU 5 / NIC 5
    │                         └─ NIC 1               ├─ host bridge pci0000:b0  …  GPU 6 / NIC 6
    ├─ host bridge pci0000:30  …  GPU 2 / NIC 2      └─ host bridge pci0000:c0  …  GPU 7 / NIC 7
    └─ host bridge pci0000:40  …  GPU 3 / NIC 3

Two sockets, four host bridges per socket — each an x16 stack of the CPU's PCIe root complex,
which Linux shows as a root complex of its own (`pci0000:BB`) — one root port per host
bridge, and on it one PCIe switch holding one GPU and one ConnectX NIC, the pairing NCCL
wants. So GPU i and NIC i are PIX and share their PCIe root (`resource.kubernetes.io/
pcieRoot`, the host bridge), which no other pair shares: a DRA `matchAttribute` on it pairs
exactly GPU i with NIC i. GPU i and the other NICs of its socket are NODE, the other
socket's SYS (no PXB or PHB here: the tests build other trees for those). Real servers
differ — several root ports per host bridge, two GPUs and NICs per switch, two-level
switches — and `SimPcieTree` builds any of those.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tenantnet.lab.nicsysfs import SimPf, connectx_pf, relink, write_attribute, write_tree
from tenantnet.plugin.pci import normalise_pci_address

BRIDGE_CLASS = 0x060400
GPU_CLASS = 0x030200  # 3D controller, as an SXM GPU shows itself
NIC_CLASS = 0x020000  # Ethernet controller
NVIDIA, MELLANOX, INTEL = 0x10DE, 0x15B3, 0x8086
H100_SXM = 0x2330
PEX_SWITCH_PORT = (0x1000, 0xC030)  # Broadcom PEX89000 switch ports (vendor, device)
ROOT_PORT = (INTEL, 0x352A)
# (vendor, PF device, VF device) of the NIC drivers nicsysfs knows.
_NIC_IDS = {"mlx5_core": (MELLANOX, 0x1021, 0x101E), "ice": (INTEL, 0x1593, 0x1889)}


@dataclass
class SimFunction:
    """A PCI function that is not a NIC: a bridge (root port, switch port) or a GPU."""

    address: str
    parent: str  # the directory it sits in, relative to the root ("devices/pci0000:10/…")
    numa_node: int
    pci_class: int
    vendor: int
    device: int

    @property
    def path(self) -> str:
        return f"{self.parent}/{self.address}"


@dataclass
class SimPcieTree:
    """A description of a simulated PCIe tree; build it top down, then `write` it.

    Each method takes the directory of the parent (a host bridge's or a bridge's, as returned
    by an earlier call) and returns the new node's directory. A node's NUMA node is its host
    bridge's unless given (-1: the platform reports none).
    """

    host_bridges: dict[str, int] = field(default_factory=dict)  # "pci0000:10" → NUMA node
    bridges: list[SimFunction] = field(default_factory=list)
    gpus: list[SimFunction] = field(default_factory=list)
    nics: list[SimPf] = field(default_factory=list)
    _numa: dict[str, int] = field(default_factory=dict, repr=False)

    def host_bridge(self, domain_bus: str, numa_node: int = 0) -> str:
        """A host bridge `pci<domain>:<bus>` (e.g. "0000:10")."""
        if normalise_pci_address(f"{domain_bus}:00.0") != f"{domain_bus}:00.0":
            raise ValueError(f"host bridge {domain_bus!r} is not DDDD:BB in lowercase hex")
        name = f"pci{domain_bus}"
        self.host_bridges[name] = numa_node
        path = f"devices/{name}"
        self._numa[path] = numa_node
        return path

    def bridge(self, parent: str, address: str, *, vendor_device: tuple[int, int] = PEX_SWITCH_PORT,
               pci_class: int = BRIDGE_CLASS) -> str:
        """A bridge below `parent`: a root port when `parent` is a host bridge, else a switch port."""
        node = SimFunction(address, parent, self._numa_of(parent), pci_class, *vendor_device)
        self.bridges.append(node)
        self._numa[node.path] = node.numa_node
        return node.path

    def root_port(self, host_bridge: str, address: str) -> str:
        return self.bridge(host_bridge, address, vendor_device=ROOT_PORT)

    def switch(self, parent: str, upstream: str, downstream: Sequence[str]) -> list[str]:
        """A PCIe switch: its upstream port below `parent`, its downstream ports below that."""
        usp = self.bridge(parent, upstream)
        return [self.bridge(usp, address) for address in downstream]

    def gpu(self, parent: str, address: str, *, numa_node: int | None = None,
            vendor: int = NVIDIA, device: int = H100_SXM, pci_class: int = GPU_CLASS) -> SimFunction:
        numa = self._numa_of(parent) if numa_node is None else numa_node
        node = SimFunction(address, parent, numa, pci_class, vendor, device)
        self.gpus.append(node)
        return node

    def nic(self, parent: str, pf: SimPf, *, numa_node: int | None = None) -> SimPf:
        """`pf` (from `nicsysfs.connectx_pf` / `e810_pf`) placed below `parent`, its VFs beside it."""
        if pf.driver not in _NIC_IDS:
            raise ValueError(f"PF {pf.address}: driver {pf.driver!r} has no PCI ids here; known: "
                             f"{', '.join(sorted(_NIC_IDS))}")
        pf.parent = parent
        pf.numa_node = self._numa_of(parent) if numa_node is None else numa_node
        for vf in pf.vfs:
            vf.numa_node = pf.numa_node
        self.nics.append(pf)
        return pf

    def write(self, root: str | Path) -> None:
        """Lay out (or bring up to date) the tree under `root`; nothing is written if the
        description is impossible (an address twice, a parent never declared)."""
        root = Path(root)
        self._check()
        for name in self.host_bridges:
            (root / "devices" / name).mkdir(parents=True, exist_ok=True)
        for node in [*self.bridges, *self.gpus]:
            _write_function(root, node.parent, node.address, node.pci_class, node.vendor, node.device,
                            node.numa_node)
        write_tree(root, self.nics)
        for pf in self.nics:
            vendor, pf_device, vf_device = _NIC_IDS[pf.driver]
            _write_ids(root / pf.parent / pf.address, NIC_CLASS, vendor, pf_device)
            for vf in pf.vfs:
                _write_ids(root / pf.parent / vf.address, NIC_CLASS, vendor, vf_device)

    def _numa_of(self, parent: str) -> int:
        if parent not in self._numa:
            raise ValueError(f"{parent!r} is no host bridge or bridge of this tree; "
                             "declare the parent first and pass the path it returned")
        return self._numa[parent]

    def _check(self) -> None:
        seen: set[str] = set()
        addresses = [n.address for n in [*self.bridges, *self.gpus]]
        addresses += [a for pf in self.nics for a in [pf.address, *(vf.address for vf in pf.vfs)]]
        for address in addresses:
            if normalise_pci_address(address) != address:
                raise ValueError(f"{address!r} is not a normalised PCI address (DDDD:BB:DD.F, lowercase)")
            if address in seen:
                raise ValueError(f"PCI address {address} appears twice")
            seen.add(address)


def hgx_8x8(vfs: int = 4, netdev_prefix: str = "lr", rdma: bool = True) -> SimPcieTree:
    """The simulated 8-GPU / 8-NIC server of the module docstring: GPU i and NIC i (a ConnectX
    PF with `vfs` VFs, netdev `<prefix><i>`, VFs `<prefix><i>v<j>`) share PCIe switch i, the
    only one below host bridge i.

    Buses: GPU i's host bridge is B = 0x10, 0x20, 0x30, 0x40 (NUMA 0), 0x90, 0xa0, 0xb0, 0xc0
    (NUMA 1); its root port B:01.0 leads to the switch on bus B+1, its downstream ports on B+2,
    the GPU on B+3 and the NIC on B+4. RDMA devices are numbered as mlx5 would on such a
    machine: the PFs take mlx5_0 … mlx5_7, NIC i's VF j is mlx5_<8 + i·vfs + j>.
    """
    tree = SimPcieTree()
    for index, bus in enumerate((0x10, 0x20, 0x30, 0x40, 0x90, 0xA0, 0xB0, 0xC0)):
        hb = tree.host_bridge(f"0000:{bus:02x}", numa_node=0 if bus < 0x80 else 1)
        rp = tree.root_port(hb, f"0000:{bus:02x}:01.0")
        to_gpu, to_nic = tree.switch(rp, f"0000:{bus + 1:02x}:00.0",
                                     [f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 2:02x}:01.0"])
        tree.gpu(to_gpu, f"0000:{bus + 3:02x}:00.0")
        pf = connectx_pf(f"{netdev_prefix}{index}", vfs=vfs, bus=f"{bus + 4:02x}", rdma=rdma)
        for j, vf in enumerate(pf.vfs):
            if vf.rdma_device is not None:
                vf.rdma_device = f"mlx5_{8 + index * vfs + j}"
        tree.nic(to_nic, pf)
    return tree


# -- layout helpers ------------------------------------------------------------------------


def _write_function(root: Path, parent: str, address: str, pci_class: int, vendor: int, device: int,
                    numa_node: int) -> None:
    dev = root / parent / address
    dev.mkdir(parents=True, exist_ok=True)
    _write_ids(dev, pci_class, vendor, device)
    write_attribute(dev / "numa_node", str(numa_node))
    bus_devices = root / "bus" / "pci" / "devices"
    relink(bus_devices / address, os.path.relpath(dev, bus_devices))


def _write_ids(dev: Path, pci_class: int, vendor: int, device: int) -> None:
    write_attribute(dev / "class", f"0x{pci_class:06x}")
    write_attribute(dev / "vendor", f"0x{vendor:04x}")
    write_attribute(dev / "device", f"0x{device:04x}")
