"""The PCIe tree from sysfs, on simulated trees (`tenantnet.lab.pcitree`): the chain of bridges up to
the host bridge and their roles, NUMA nodes, GPU and NIC discovery, a VF placed at its PF, the
simulated 8-GPU / 8-NIC server, the nicsysfs `parent` extension, and the message for every
broken tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tenantnet.lab.nicsysfs import SimPf, connectx_pf, e810_pf, write_tree
from tenantnet.lab.pcitree import SimPcieTree, hgx_8x8
from tenantnet.plugin.system.pcitree import (
    Bridge,
    DeviceKind,
    PcieTree,
    PortRole,
)
from tenantnet.plugin.system.sysfs import DeviceNotFound, Sysfs, SysfsError

ROOT, USP, DSP, OTHER = PortRole.ROOT_PORT, PortRole.SWITCH_UPSTREAM, PortRole.SWITCH_DOWNSTREAM, PortRole.OTHER


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
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


def hgx_root(tmp_path_factory) -> Path:
    """The simulated 8-GPU / 8-NIC server (2 VFs per NIC), written once per test session and
    only read afterwards (test_rails uses it too): writing it costs about half a second here."""
    root = tmp_path_factory.getbasetemp() / "hgx-8x8-vfs2"
    if not (root / "done").exists():
        hgx_8x8(vfs=2).write(root)
        (root / "done").touch()
    return root


@pytest.fixture(scope="module")
def hgx(tmp_path_factory):
    return PcieTree(str(hgx_root(tmp_path_factory)))


def small_tree() -> SimPcieTree:
    """One host bridge (NUMA 0), a root port, a switch with a GPU and a one-VF NIC."""
    t = SimPcieTree()
    rp = t.root_port(t.host_bridge("0000:10"), "0000:10:01.0")
    to_gpu, to_nic = t.switch(rp, "0000:11:00.0", ["0000:12:00.0", "0000:12:01.0"])
    t.gpu(to_gpu, "0000:13:00.0")
    t.nic(to_nic, connectx_pf("n0", vfs=1, bus="14"))
    return t


def roles(position):
    return [(b.address, b.role) for b in position.upstream]


def test_chain_of_a_gpu_behind_a_switch(hgx):
    pos = hgx.position("0000:13:00.0")
    assert pos.host_bridge == "pci0000:10" and pos.numa_node == 0
    assert pos.upstream == (
        Bridge("0000:10:01.0", ROOT, 0x060400, None),
        Bridge("0000:11:00.0", USP, 0x060400, "0000:11:00.0"),
        Bridge("0000:12:00.0", DSP, 0x060400, "0000:11:00.0"),
    )
    assert pos.root_port == "0000:10:01.0" and pos.switches == ("0000:11:00.0",)


def test_vf_sits_where_its_pf_sits(hgx):
    pf = hgx.position("0000:14:00.0")
    assert hgx.position("0000:14:00.3") == pf == hgx.position("14:00.2")
    assert pf.address == "0000:14:00.0" and pf.upstream[-1].address == "0000:12:01.0"


def test_hgx_discovery(hgx):
    gpus, nics = hgx.gpus(), hgx.nics()
    assert [g.address for g in gpus] == [
        "0000:13:00.0", "0000:23:00.0", "0000:33:00.0", "0000:43:00.0",
        "0000:93:00.0", "0000:a3:00.0", "0000:b3:00.0", "0000:c3:00.0"]
    assert [n.address for n in nics] == [
        "0000:14:00.0", "0000:24:00.0", "0000:34:00.0", "0000:44:00.0",
        "0000:94:00.0", "0000:a4:00.0", "0000:b4:00.0", "0000:c4:00.0"]  # PFs only, no VF
    assert {(g.kind, g.vendor, g.pci_class) for g in gpus} == {(DeviceKind.GPU, 0x10DE, 0x030200)}
    assert {(n.kind, n.vendor, n.pci_class) for n in nics} == {(DeviceKind.NIC, 0x15B3, 0x020000)}
    assert [g.position.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    # Each pair its own host bridge (PCIe root), as on a DGX H100: no two pairs share one.
    assert [n.position.host_bridge for n in nics] == [g.position.host_bridge for g in gpus] == [
        "pci0000:10", "pci0000:20", "pci0000:30", "pci0000:40",
        "pci0000:90", "pci0000:a0", "pci0000:b0", "pci0000:c0"]
    # Each GPU shares its switch with exactly one NIC, and every switch hangs off its own root port.
    assert [g.position.switches for g in gpus] == [n.position.switches for n in nics]
    assert len({g.position.root_port for g in gpus}) == 8


def test_hgx_nics_are_sysfs_nics_too(hgx):
    s = Sysfs(hgx.root)
    vfs = s.vfs_of_pf("0000:c4:00.0")
    assert [(v.netdev, v.numa_node, v.rdma_device) for v in vfs] == [
        ("lr7v0", 1, "mlx5_22"), ("lr7v1", 1, "mlx5_23")]
    assert s.pf_address("lr0") == "0000:14:00.0"


def test_rdma_device_names_are_unique(tmp_path):
    tree = hgx_8x8(vfs=3)
    names = [vf.rdma_device for pf in tree.nics for vf in pf.vfs]
    assert len(set(names)) == len(names) == 24 and names[0] == "mlx5_8"


def test_reading_changes_nothing(hgx):
    before = snapshot(Path(hgx.root))
    hgx.gpus(), hgx.nics(), hgx.position("0000:94:00.2")
    assert snapshot(Path(hgx.root)) == before


def test_write_is_idempotent_and_links_relative(tmp_path):
    tree = small_tree()
    tree.write(tmp_path)
    first = snapshot(tmp_path)
    tree.write(tmp_path)
    assert snapshot(tmp_path) == first
    for rel, (kind, target) in first.items():
        if kind == "link":
            assert not os.path.isabs(target) and (tmp_path / rel).exists(), rel


def test_tree_works_after_moving(tmp_path):
    small_tree().write(tmp_path / "here")
    before = PcieTree(str(tmp_path / "here")).position("0000:14:00.2")
    os.rename(tmp_path / "here", tmp_path / "there")
    assert PcieTree(str(tmp_path / "there")).position("0000:14:00.2") == before


def test_two_level_switch_roles(tmp_path):
    t = SimPcieTree()
    hb = t.host_bridge("0000:20")
    rp = t.root_port(hb, "0000:20:01.0")
    top = t.switch(rp, "0000:21:00.0", ["0000:22:00.0", "0000:22:01.0"])
    low = t.switch(top[0], "0000:23:00.0", ["0000:24:00.0"])
    t.gpu(low[0], "0000:25:00.0")
    t.write(tmp_path)
    pos = PcieTree(str(tmp_path)).position("0000:25:00.0")
    assert roles(pos) == [("0000:20:01.0", ROOT), ("0000:21:00.0", USP), ("0000:22:00.0", DSP),
                          ("0000:23:00.0", USP), ("0000:24:00.0", DSP)]
    assert pos.switches == ("0000:21:00.0", "0000:23:00.0")
    assert [b.switch for b in pos.upstream] == [None, "0000:21:00.0", "0000:21:00.0", "0000:23:00.0", "0000:23:00.0"]


def test_nic_with_its_own_root_port_from_plain_nicsysfs(tmp_path):
    # nicsysfs's default layout: the PF right below a root port, which has no class file.
    write_tree(tmp_path, [connectx_pf(vfs=2)])
    pos = PcieTree(str(tmp_path)).position("0000:3b:00.2")
    assert (pos.address, pos.host_bridge) == ("0000:3b:00.0", "pci0000:3a")
    assert pos.upstream == (Bridge("0000:3a:00.0", ROOT, None, None),)
    assert pos.switches == () and pos.root_port == "0000:3a:00.0"
    # Without class files the NIC is not discovered: discovery needs the PCI class.
    assert PcieTree(str(tmp_path)).nics() == []


def test_device_on_the_host_bridge_bus_and_other_bridge(tmp_path):
    t = SimPcieTree()
    hb = t.host_bridge("0000:20")
    t.gpu(hb, "0000:20:05.0")  # a root-complex integrated endpoint: no root port above it
    cardbus = t.bridge(hb, "0000:20:06.0", pci_class=0x060700)
    rp = t.bridge(cardbus, "0000:30:00.0")
    t.gpu(rp, "0000:31:00.0")
    t.write(tmp_path)
    tree = PcieTree(str(tmp_path))
    direct = tree.position("0000:20:05.0")
    assert direct.upstream == () and direct.root_port is None
    assert roles(tree.position("0000:31:00.0")) == [("0000:20:06.0", OTHER), ("0000:30:00.0", ROOT)]


def test_numa_node_unknown_and_inherited(tmp_path):
    t = SimPcieTree()
    hb = t.host_bridge("0000:20", numa_node=1)
    rp = t.root_port(hb, "0000:20:01.0")
    t.gpu(rp, "0000:21:00.0", numa_node=-1)
    rp2 = t.root_port(hb, "0000:20:02.0")
    t.nic(rp2, connectx_pf("n0", vfs=1, bus="22"))
    t.write(tmp_path)
    tree = PcieTree(str(tmp_path))
    assert tree.position("0000:21:00.0").numa_node is None
    assert tree.position("0000:22:00.2").numa_node == 1
    (tmp_path / "devices/pci0000:20/0000:20:02.0/0000:22:00.0/numa_node").write_text("garbage\n")
    assert tree.position("0000:22:00.0").numa_node is None


def test_gpu_vendors_and_classes_are_configurable(tmp_path):
    t = SimPcieTree()
    hb = t.host_bridge("0000:20")
    t.gpu(t.root_port(hb, "0000:20:01.0"), "0000:21:00.0", vendor=0x1002, device=0x74A1)  # not NVIDIA
    t.gpu(t.root_port(hb, "0000:20:02.0"), "0000:22:00.0", pci_class=0x030000)  # VGA class
    t.gpu(t.root_port(hb, "0000:20:03.0"), "0000:23:00.0", pci_class=0x010802)  # an NVMe drive
    ib = t.nic(t.root_port(hb, "0000:20:04.0"), connectx_pf("ib0", vfs=1, bus="24"))
    t.nic(t.root_port(hb, "0000:20:05.0"), e810_pf("eth0", vfs=1, bus="25"))
    t.write(tmp_path)
    (tmp_path / "devices/pci0000:20/0000:20:04.0" / ib.address / "class").write_text("0x020700\n")
    default = PcieTree(str(tmp_path))
    assert [g.address for g in default.gpus()] == ["0000:22:00.0"]
    assert [g.address for g in PcieTree(str(tmp_path), gpu_vendors={0x1002, 0x10DE}).gpus()] == [
        "0000:21:00.0", "0000:22:00.0"]
    assert [(n.address, n.vendor, n.pci_class) for n in default.nics()] == [
        ("0000:24:00.0", 0x15B3, 0x020700), ("0000:25:00.0", 0x8086, 0x020000)]


# -- errors ----------------------------------------------------------------------------------


def test_errors(tmp_path):
    small_tree().write(tmp_path)
    devices = tmp_path / "bus" / "pci" / "devices"
    tree = PcieTree(str(tmp_path))
    with pytest.raises(SysfsError, match=r"'3b:00' is not a PCI address: expected DDDD:BB:DD.F"):
        tree.position("3b:00")
    with pytest.raises(DeviceNotFound, match=r"no PCI device 0000:3b:00.0 \(nothing at .*/bus/pci/devices/0000:3b:00.0\)"):
        tree.position("0000:3b:00.0")
    # A directory where the link should be.
    (tmp_path / "devices" / "x" / "0000:01:00.0").mkdir(parents=True)
    (devices / "0000:01:00.0").mkdir()
    with pytest.raises(SysfsError, match=r"/bus/pci/devices/0000:01:00.0 is not a symlink into devices/"):
        tree.position("0000:01:00.0")
    # A link that passes through no host bridge.
    (devices / "0000:02:00.0").symlink_to("../../../devices/x/0000:01:00.0")
    with pytest.raises(SysfsError, match=r"passes through no host bridge \(a pciDDDD:BB component\)"):
        tree.position("0000:02:00.0")
    # A link that ends in another device.
    (devices / "0000:03:00.0").symlink_to("../../../devices/pci0000:10/0000:10:01.0")
    with pytest.raises(SysfsError, match=r"which does not end in 0000:03:00.0"):
        tree.position("0000:03:00.0")
    # Behind Intel VMD: a nested host bridge.
    vmd = tmp_path / "devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0/0000:04:00.0"
    vmd.mkdir(parents=True)
    (devices / "0000:04:00.0").symlink_to("../../../devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0/0000:04:00.0")
    with pytest.raises(SysfsError, match=r"'pci10000:e0' on its way up to pci0000:00 .*\(Intel VMD\)"):
        tree.position("0000:04:00.0")
    # A VF whose physfn is no PCI address.
    (tmp_path / "devices/pci0000:10/0000:05:00.0").mkdir()
    (devices / "0000:05:00.0").symlink_to("../../../devices/pci0000:10/0000:05:00.0")
    (tmp_path / "devices/pci0000:10/0000:05:00.0/physfn").symlink_to("../nowhere")
    with pytest.raises(SysfsError, match=r"VF 0000:05:00.0: physfn link points to 'nowhere'"):
        tree.position("0000:05:00.0")


def test_unreadable_attribute_is_a_sysfs_error(tmp_path):
    small_tree().write(tmp_path)
    cls = tmp_path / "devices/pci0000:10/0000:10:01.0/class"
    cls.unlink()
    cls.mkdir()  # reading it fails with EISDIR
    with pytest.raises(SysfsError, match=r"cannot read .*/bus/pci/devices/0000:13:00.0/\.\./\.\./\.\./class: Is a directory"):
        PcieTree(str(tmp_path)).position("0000:13:00.0")


# -- the builders' checks ------------------------------------------------------------------------


def test_builder_refuses_impossible_trees(tmp_path):
    t = SimPcieTree()
    with pytest.raises(ValueError, match=r"'devices/pci0000:99' is no host bridge or bridge of this tree"):
        t.gpu("devices/pci0000:99", "0000:99:00.0")
    with pytest.raises(ValueError, match="host bridge '0000:1G' is not DDDD:BB"):
        t.host_bridge("0000:1G")
    hb = t.host_bridge("0000:20")
    t.gpu(hb, "0000:20:01.0")
    t.nic(hb, connectx_pf("n0", vfs=1, bus="20"))  # its PF is 0000:20:00.0, fine; then a clash:
    t.gpu(hb, "0000:20:00.2")
    with pytest.raises(ValueError, match=r"PCI address 0000:20:00.2 appears twice"):
        t.write(tmp_path)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="driver 'weird' has no PCI ids here"):
        t.nic(hb, SimPf("0000:30:00.0", "w0", "weird"))


@pytest.mark.parametrize("parent", ["/devices/pci0000:10", "devices", "devices/../etc", "sys/pci0000:10",
                                    "devices//x"])
def test_nicsysfs_parent_must_stay_in_devices(tmp_path, parent):
    pf = connectx_pf(vfs=1, parent=parent)
    with pytest.raises(ValueError, match=r"is not a path inside the tree's devices/ directory"):
        write_tree(tmp_path, [pf])
    assert os.listdir(tmp_path) == []


def test_nicsysfs_parent_places_pf_and_vfs(tmp_path):
    pf = connectx_pf(vfs=2, parent="devices/pci0000:10/0000:10:01.0")
    write_tree(tmp_path, [pf])
    assert os.readlink(tmp_path / "bus/pci/devices/0000:3b:00.3") == \
        "../../../devices/pci0000:10/0000:10:01.0/0000:3b:00.3"
    assert Sysfs(str(tmp_path)).vf("0000:3b:00.3").pf_address == "0000:3b:00.0"
