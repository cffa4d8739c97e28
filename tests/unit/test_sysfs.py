"""sysfs discovery on fake trees shaped like an NVIDIA ConnectX and an Intel E810 (built with
`tenantnet.lab.nicsysfs`): PF ↔ VF both ways, VF index, netdev, driver, NUMA node, RDMA, DPDK-bound
VFs, missing netdevs, and the message for every wrong address a user can give."""

from __future__ import annotations

import os

import pytest

from tenantnet.lab.nicsysfs import connectx_pf, e810_pf, write_tree
from tenantnet.plugin.system.sysfs import (
    USERSPACE_DRIVERS,
    DeviceNotFound,
    NotAVirtualFunction,
    Sysfs,
    SysfsError,
    VirtualFunction,
    normalise_pci_address,
)

CX_PF, E810_PF = "0000:3b:00.0", "0000:5e:00.0"


@pytest.fixture
def sysfs(tmp_path):
    """ConnectX lpf0 with 4 VFs (VF 2 bound to vfio-pci); E810 lpf1 with 3 VFs on NUMA node 1,
    VF 1's netdev missing (moved into a pod's netns, so absent from the host's sysfs view)."""
    cx = connectx_pf(vfs=4, dpdk_vfs=[2])
    e810 = e810_pf(vfs=3)
    e810.numa_node = 1
    for vf in e810.vfs:
        vf.numa_node = 1
    e810.vfs[1].netdev = None
    write_tree(tmp_path, [cx, e810])
    # A plain PCI device (an NVMe drive) and a virtual netdev, for the wrong-device cases.
    nvme = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0"
    nvme.mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices" / "0000:01:00.0").symlink_to("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0")
    (tmp_path / "devices" / "virtual" / "net" / "veth0").mkdir(parents=True)
    (tmp_path / "class" / "net" / "veth0").symlink_to("../../devices/virtual/net/veth0")
    return Sysfs(str(tmp_path))


def test_connectx_vf(sysfs):
    assert sysfs.vf("0000:3b:00.3") == VirtualFunction(
        address="0000:3b:00.3", pf_address=CX_PF, pf_netdev="lpf0", index=1, driver="mlx5_core",
        netdev="lpf0v1", numa_node=0, rdma_device="mlx5_3")
    assert not sysfs.vf("0000:3b:00.3").userspace


def test_connectx_vfs_cross_device_boundary(tmp_path):
    write_tree(tmp_path, [connectx_pf(vfs=8)])  # 00.2 … 00.7, then 01.0, 01.1
    vfs = Sysfs(str(tmp_path)).vfs_of_pf(CX_PF)
    assert [(v.index, v.address, v.netdev) for v in vfs[5:]] == [
        (5, "0000:3b:00.7", "lpf0v5"), (6, "0000:3b:01.0", "lpf0v6"), (7, "0000:3b:01.1", "lpf0v7")]


def test_dpdk_bound_vf_has_no_netdev(sysfs):
    vf = sysfs.vf("0000:3b:00.4")
    assert (vf.index, vf.driver, vf.netdev, vf.rdma_device) == (2, "vfio-pci", None, None)
    assert vf.userspace and "vfio-pci" in USERSPACE_DRIVERS
    assert sysfs.netdevs_of("0000:3b:00.4") == []


def test_e810_vf(sysfs):
    assert sysfs.vf("0000:5e:01.2") == VirtualFunction(
        address="0000:5e:01.2", pf_address=E810_PF, pf_netdev="lpf1", index=2, driver="iavf",
        netdev="lpf1v2", numa_node=1, rdma_device=None)


def test_vf_whose_netdev_is_missing(sysfs):
    vf = sysfs.vf("0000:5e:01.1")
    assert (vf.index, vf.driver, vf.netdev) == (1, "iavf", None)
    assert not vf.userspace  # a kernel driver without a netdev is not DPDK mode


def test_vfs_of_pf_by_index_and_back(sysfs):
    vfs = sysfs.vfs_of_pf(CX_PF)
    assert [(v.index, v.address) for v in vfs] == [
        (0, "0000:3b:00.2"), (1, "0000:3b:00.3"), (2, "0000:3b:00.4"), (3, "0000:3b:00.5")]
    for vf in vfs + sysfs.vfs_of_pf(E810_PF):
        assert sysfs.vf(vf.address) == vf
        assert sysfs.pf_address(vf.pf_address) == vf.pf_address


def test_pf_without_vfs(tmp_path):
    write_tree(tmp_path, [e810_pf(vfs=0)])
    s = Sysfs(str(tmp_path))
    assert s.pf_address("lpf1") == E810_PF  # sriov_totalvfs says it is a PF
    assert s.vfs_of_pf(E810_PF) == []


@pytest.mark.parametrize("text", ["3b:00.3", "0000:3B:00.3", "0000:3b:00.3"])
def test_address_forms(sysfs, text):
    assert sysfs.vf(text).address == "0000:3b:00.3"


def test_pf_given_as_vf(sysfs):
    with pytest.raises(NotAVirtualFunction, match=r"0000:3b:00\.0 is an SR-IOV physical function \(PF\) with 4 VF"):
        sysfs.vf("3b:00.0")


def test_plain_pci_device_given_as_vf(sysfs):
    with pytest.raises(NotAVirtualFunction, match=r"0000:01:00\.0 is not an SR-IOV virtual function"):
        sysfs.vf("0000:01:00.0")


def test_unknown_address(sysfs):
    with pytest.raises(DeviceNotFound, match=r"no PCI device 0000:3b:00\.6"):
        sysfs.vf("0000:3b:00.6")
    with pytest.raises(DeviceNotFound):
        sysfs.vfs_of_pf("0000:99:00.0")
    with pytest.raises(DeviceNotFound):
        sysfs.netdevs_of("0000:99:00.0")


@pytest.mark.parametrize("text", [
    "", "3b:00", "3b:00.", "0000:3b:20.0", "0000:3b:00.8", "zz:00.0", "00000:3b:00.0", "0000:3b:000.0",
    " 0000:3b:00.2", "0000:3b:00.2\n", "0000:3b:00.2/../0000:3b:00.0", "lpf0"])
def test_malformed_addresses(sysfs, text):
    assert normalise_pci_address(text) is None
    with pytest.raises(SysfsError, match="is not a PCI address") as err:
        sysfs.vf(text)
    assert not isinstance(err.value, DeviceNotFound) and repr(text) in str(err.value)


@pytest.mark.parametrize("text, expected", [
    ("0000:3b:00.2", "0000:3b:00.2"), ("3b:00.2", "0000:3b:00.2"), ("0000:AF:1F.7", "0000:af:1f.7"),
    ("10de:01:00.0", "10de:01:00.0"), ("3b:1f.0", "0000:3b:1f.0")])
def test_normalise(text, expected):
    assert normalise_pci_address(text) == expected


def test_normalise_non_string():
    assert normalise_pci_address(None) is None  # type: ignore[arg-type]


def test_pf_by_netdev_name_and_by_address(sysfs):
    assert sysfs.pf_address("lpf0") == CX_PF
    assert sysfs.pf_address("lpf1") == E810_PF
    assert sysfs.pf_address("5e:00.0") == E810_PF


@pytest.mark.parametrize("pf, cls, message", [
    ("lpf0v0", SysfsError, r"0000:3b:00\.2 \(network device lpf0v0\) is an SR-IOV virtual function, not a PF"),
    ("0000:3b:00.2", SysfsError, r"0000:3b:00\.2 is an SR-IOV virtual function"),
    ("0000:01:00.0", SysfsError, "has no SR-IOV capability"),
    ("veth0", SysfsError, "network device veth0 is not a PCI device"),
    ("eth9", DeviceNotFound, "no network device eth9"),
    ("0000:3b:00.6", DeviceNotFound, r"no PCI device 0000:3b:00\.6"),
    ("../../bus", SysfsError, "neither a PCI address"),
    ("a b", SysfsError, "neither a PCI address"),
    ("x" * 16, SysfsError, "neither a PCI address"),
])
def test_pf_address_errors(sysfs, pf, cls, message):
    with pytest.raises(cls, match=message):
        sysfs.pf_address(pf)


def test_vfs_of_pf_on_a_vf(sysfs):
    with pytest.raises(SysfsError, match=r"0000:3b:00\.2 is not an SR-IOV physical function"):
        sysfs.vfs_of_pf("0000:3b:00.2")


def test_netdev_pci_address(sysfs):
    assert sysfs.netdev_pci_address("lpf0v3") == "0000:3b:00.5"
    assert sysfs.netdev_pci_address("lpf1") == E810_PF
    assert sysfs.netdev_pci_address("veth0") is None  # virtual: no device link
    assert sysfs.netdev_pci_address("nope") is None
    assert sysfs.netdev_pci_address("../..") is None


def test_netdevs_of(sysfs):
    assert sysfs.netdevs_of("0000:3b:00.2") == ["lpf0v0"]
    assert sysfs.netdevs_of("3b:00.0") == ["lpf0"]
    assert sysfs.netdevs_of("0000:5e:01.1") == []


def test_numa_node_unknown(sysfs, tmp_path):
    dev = os.path.join(str(tmp_path), "bus", "pci", "devices")
    with open(os.path.join(dev, "0000:3b:00.2", "numa_node"), "w") as f:
        f.write("-1\n")  # what platforms without NUMA information report
    os.unlink(os.path.join(dev, "0000:3b:00.3", "numa_node"))
    assert sysfs.vf("0000:3b:00.2").numa_node is None
    assert sysfs.vf("0000:3b:00.3").numa_node is None


def test_unbound_vf_has_no_driver(sysfs, tmp_path):
    os.unlink(tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.5" / "driver")
    assert sysfs.vf("0000:3b:00.5").driver is None


def test_vf_missing_from_its_pf(sysfs, tmp_path):
    os.unlink(tmp_path / "bus" / "pci" / "devices" / CX_PF / "virtfn3")
    with pytest.raises(SysfsError, match=r"VF 0000:3b:00\.5 names 0000:3b:00\.0 as its PF, but .* no virtfnN link"):
        sysfs.vf("0000:3b:00.5")


def test_vf_whose_pf_is_gone(sysfs, tmp_path):
    os.unlink(tmp_path / "bus" / "pci" / "devices" / E810_PF)
    with pytest.raises(DeviceNotFound, match=r"no PCI device 0000:5e:00\.0"):
        sysfs.vf("0000:5e:01.0")


def test_real_sys_is_readable():
    # Read-only and harmless: loopback is not a PCI device; an absent address is just absent.
    s = Sysfs()
    assert s.netdev_pci_address("lo") is None
    with pytest.raises(DeviceNotFound):
        s.vf("ffff:ff:1f.7")
