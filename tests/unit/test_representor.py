"""Representor discovery on fake switchdev trees (no root)."""

from __future__ import annotations

import pytest

from tenantnet.lab.nicsysfs import connectx_pf, write_representors, write_tree
from tenantnet.plugin.system.sysfs import Sysfs, find_representor, representor_vf_index


@pytest.mark.parametrize("name,parsed", [
    ("pf0vf3", (0, 3)), ("c1pf0vf3", (0, 3)), ("vf3", (None, 3)), ("3", (None, 3)), ("pf1vf12", (1, 12)),
    ("p0", None), ("pf0", None), ("", None), ("vfx", None),
])
def test_phys_port_name_forms(name, parsed):
    assert representor_vf_index(name) == parsed


def switchdev_tree(root):
    """A ConnectX PF ens1f0 with 3 VFs in switchdev mode, representors ens1f0_0..2."""
    pf = connectx_pf("ens1f0", vfs=3)
    pf.switch_id = "0011223344"
    write_tree(root, [pf])
    write_representors(root, pf, {0: "ens1f0_0", 1: "ens1f0_1", 2: "ens1f0_2"})
    sysfs = Sysfs(str(root))
    return sysfs, sysfs.vfs_of_pf(pf.address)


def test_representors_found_by_switch_id_and_port_name(tmp_path):
    sysfs, vfs = switchdev_tree(tmp_path)
    assert [find_representor(sysfs, vf) for vf in vfs] == ["ens1f0_0", "ens1f0_1", "ens1f0_2"]
    assert vfs[0].pf_netdev == "ens1f0"  # not a representor, though they share the PF's net/


def test_legacy_mode_has_none(tmp_path):
    pf = connectx_pf("ens1f0", vfs=2)
    write_tree(tmp_path, [pf])
    sysfs = Sysfs(str(tmp_path))
    assert find_representor(sysfs, sysfs.vfs_of_pf(pf.address)[0]) is None


def test_other_switch_is_ignored(tmp_path):
    pf = connectx_pf("ens1f0", vfs=1)
    pf.switch_id = "aaaa"
    write_tree(tmp_path, [pf])
    write_representors(tmp_path, pf, {0: "rep0"})
    (tmp_path / "class" / "net" / "rep0").resolve().joinpath("phys_switch_id").write_text("bbbb")
    sysfs = Sysfs(str(tmp_path))
    assert find_representor(sysfs, sysfs.vfs_of_pf(pf.address)[0]) is None


def test_representor_from_devlink_port_dump():
    from pathlib import Path

    from tenantnet.plugin.system.sysfs import representor_from_devlink

    dump = (Path(__file__).parent.parent / "fixtures" / "devlink" / "port-show-switchdev.json").read_text()
    assert representor_from_devlink("0000:06:00.0", 1, dump) == "ens2f0pf0vf1"
    assert representor_from_devlink("0000:06:00.1", 0, dump) == "ens2f1pf1vf0"
    assert representor_from_devlink("0000:06:00.0", 7, dump) is None  # no such VF
    assert representor_from_devlink("0000:06:00.0", 0, '{"port": {}}') is None
    assert representor_from_devlink("0000:06:00.0", 0, "not json") is None


def test_vf_of_representor_is_the_reverse_lookup(tmp_path):
    from tenantnet.plugin.system.sysfs import vf_of_representor

    sysfs, vfs = switchdev_tree(tmp_path)
    assert [vf_of_representor(sysfs, f"ens1f0_{i}").address for i in range(3)] == [vf.address for vf in vfs]
    assert vf_of_representor(sysfs, "ens1f0") is None  # the PF's uplink is no VF representor
    assert vf_of_representor(sysfs, "nosuchdev") is None
