"""Fake sysfs trees: addresses and names of the NIC shapes, the layout the kernel uses
(relative links that resolve), idempotence, reconciliation, relocation."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tenantnet.lab.nicsysfs import SimPf, SimVf, connectx_pf, e810_pf, write_tree
from tenantnet.plugin.system.sysfs import Sysfs


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every file and symlink under root (directories are implied), relative to it."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_file():
                out[rel] = ("file", path.read_text())
    return out


def test_connectx_shape():
    pf = connectx_pf("ens1f0", vfs=10, dpdk_vfs=[9], bus="AF")
    assert (pf.address, pf.netdev, pf.driver) == ("0000:af:00.0", "ens1f0", "mlx5_core")
    assert [vf.address for vf in pf.vfs] == [
        "0000:af:00.2", "0000:af:00.3", "0000:af:00.4", "0000:af:00.5", "0000:af:00.6", "0000:af:00.7",
        "0000:af:01.0", "0000:af:01.1", "0000:af:01.2", "0000:af:01.3"]
    assert pf.vfs[0] == SimVf("0000:af:00.2", "ens1f0v0", "mlx5_core", rdma_device="mlx5_2")
    assert pf.vfs[9] == SimVf("0000:af:01.3", None, "vfio-pci", rdma_device=None)
    assert pf.totalvfs >= 10
    assert all(vf.rdma_device is None for vf in connectx_pf(rdma=False).vfs)


def test_e810_shape():
    pf = e810_pf(vfs=3, dpdk_vfs=[0])
    assert (pf.address, pf.netdev, pf.driver) == ("0000:5e:00.0", "lpf1", "ice")
    assert [(vf.address, vf.netdev, vf.driver, vf.rdma_device) for vf in pf.vfs] == [
        ("0000:5e:01.0", None, "vfio-pci", None), ("0000:5e:01.1", "lpf1v1", "iavf", None),
        ("0000:5e:01.2", "lpf1v2", "iavf", None)]


@pytest.mark.parametrize("make, message", [
    (lambda: connectx_pf(vfs=2, dpdk_vfs=[2]), r"dpdk_vfs \[2\] out of range"),
    (lambda: e810_pf(bus="5e0"), "not a two-digit hex PCI bus"),
    (lambda: e810_pf(vfs=249), "does not fit on bus 5e"),
])
def test_bad_shapes(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_layout_is_the_kernels(tmp_path):
    write_tree(tmp_path, [connectx_pf(vfs=2, dpdk_vfs=[1])])
    dev = tmp_path / "bus" / "pci" / "devices"
    pf, vf0, vf1 = dev / "0000:3b:00.0", dev / "0000:3b:00.2", dev / "0000:3b:00.3"
    assert os.readlink(vf0 / "physfn") == "../0000:3b:00.0"
    assert os.readlink(pf / "virtfn0") == "../0000:3b:00.2" and os.readlink(pf / "virtfn1") == "../0000:3b:00.3"
    assert (pf / "sriov_numvfs").read_text() == "2\n" and (pf / "sriov_totalvfs").read_text() == "8\n"
    assert (vf0 / "numa_node").read_text() == "0\n"
    assert os.readlink(vf0 / "net" / "lpf0v0" / "device") == "../../../0000:3b:00.2"
    assert (vf0 / "driver").resolve() == (tmp_path / "bus" / "pci" / "drivers" / "mlx5_core").resolve()
    assert (vf1 / "driver").resolve() == (tmp_path / "bus" / "pci" / "drivers" / "vfio-pci").resolve()
    assert not (vf1 / "net").exists() and not (vf1 / "infiniband").exists()
    assert (vf0 / "infiniband" / "mlx5_2").is_dir()
    assert (tmp_path / "class" / "net" / "lpf0v0").resolve() == (vf0 / "net" / "lpf0v0").resolve()
    assert (tmp_path / "bus" / "pci" / "drivers" / "vfio-pci" / "0000:3b:00.3").resolve() == vf1.resolve()
    # Every link relative, none dangling.
    for rel, (kind, target) in snapshot(tmp_path).items():
        if kind == "link":
            assert not os.path.isabs(target), rel
            assert (tmp_path / rel).exists(), f"{rel} -> {target} dangles"


def test_switch_id(tmp_path):
    pf = e810_pf(vfs=1)
    pf.switch_id = "3c2c30fffe6e8c10"
    write_tree(tmp_path, [pf])
    assert (tmp_path / "class" / "net" / "lpf1" / "phys_switch_id").read_text() == "3c2c30fffe6e8c10\n"


def test_idempotent(tmp_path):
    pfs = [connectx_pf(vfs=3, dpdk_vfs=[1]), e810_pf(vfs=2)]
    write_tree(tmp_path, pfs)
    first = snapshot(tmp_path)
    write_tree(str(tmp_path), pfs)
    assert snapshot(tmp_path) == first


def test_rewrite_reconciles_to_a_fresh_tree(tmp_path):
    # Rebind VF 0 to vfio-pci, VF 1 back from vfio-pci, and drop VFs 2-3: the rewritten tree
    # must be exactly what a fresh write of the new description gives.
    old = connectx_pf(vfs=4, dpdk_vfs=[1])
    write_tree(tmp_path / "a", [old])
    new = connectx_pf(vfs=2, dpdk_vfs=[0])
    write_tree(tmp_path / "a", [new])
    write_tree(tmp_path / "b", [new])
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")
    s = Sysfs(str(tmp_path / "a"))
    assert [(v.index, v.driver, v.netdev) for v in s.vfs_of_pf("0000:3b:00.0")] == [
        (0, "vfio-pci", None), (1, "mlx5_core", "lpf0v1")]
    assert s.netdev_pci_address("lpf0v0") is None and s.netdev_pci_address("lpf0v3") is None


def test_tree_works_after_moving(tmp_path):
    write_tree(tmp_path / "here", [connectx_pf(vfs=2), e810_pf(vfs=2, dpdk_vfs=[1])])
    before = Sysfs(str(tmp_path / "here")).vfs_of_pf("0000:5e:00.0")
    shutil.move(tmp_path / "here", tmp_path / "elsewhere")
    s = Sysfs(str(tmp_path / "elsewhere"))
    assert s.vfs_of_pf("0000:5e:00.0") == before
    assert s.pf_address("lpf0") == "0000:3b:00.0"


@pytest.mark.parametrize("pfs, message", [
    ([SimPf("0000:3b:00.0", "p0", "ice", [SimVf("0000:3b:00.0", "p0v0", "iavf")])], "appears twice"),
    ([SimPf("0000:3b:00.0", "p0", "ice"), SimPf("0000:3c:00.0", "p0", "ice")], "network device p0 appears twice"),
    ([SimPf("3b:00.0", "p0", "ice")], "not a normalised PCI address"),
    ([SimPf("0000:3b:00.0", "p/0", "ice")], "not a valid network device name"),
    ([SimPf("0000:3b:00.0", "p0", "ice", [SimVf("0000:3b:00.1", "v", "iavf")], totalvfs=0)], "sriov_totalvfs is 0"),
])
def test_impossible_descriptions_write_nothing(tmp_path, pfs, message):
    with pytest.raises(ValueError, match=message):
        write_tree(tmp_path, pfs)
    assert os.listdir(tmp_path) == []
