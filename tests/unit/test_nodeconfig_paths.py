"""The node config's allowed-paths lists: a config's list adds to the built-in defaults
(`replaceDefaults` drops them), and the lab writes a node config that is consistent."""

from __future__ import annotations

from pathlib import Path

import pytest

from cni.errors import CniError, Code
from tenantnet.plugin import nodeconfig, settings


def _load(tmp_path: Path, text: str) -> nodeconfig.NodeConfig:
    path = tmp_path / "tenantnet.yaml"
    path.write_text(text)
    return nodeconfig.load(str(path))


@pytest.mark.parametrize("ipam_type", ["tenantnet-ipam", "host-local"])
def test_adding_an_ipam_data_dir_keeps_the_defaults_so_a_nad_without_data_dir_still_works(
        tmp_path: Path, ipam_type: str) -> None:
    # What docs/security.md tells an admin migrating a NAD with its own dataDir to do.
    node = _load(tmp_path, f"ipamDataDirs: [{tmp_path}/ipam]\n")
    assert node.ipam_data_dirs == (*nodeconfig.DEFAULT_IPAM_DATA_DIRS, f"{tmp_path}/ipam")
    settings.ipam_paths({"type": ipam_type}, node)  # the default dataDir: still allowed
    settings.ipam_paths({"type": ipam_type, "dataDir": f"{tmp_path}/ipam/blue"}, node)
    with pytest.raises(CniError) as err:
        settings.ipam_paths({"type": ipam_type, "dataDir": f"{tmp_path}/elsewhere"}, node)
    assert err.value.code == Code.INVALID_CONFIG and "ipam.dataDir" in err.value.msg


def test_every_allowed_paths_list_extends_its_defaults(tmp_path: Path) -> None:
    node = _load(tmp_path, f"resolvConfPaths: [{tmp_path}/r]\novsConfigurationPaths: [{tmp_path}/o]\n"
                           f"ipamDataDirs: [{tmp_path}/i, /var/lib/cni/networks]\n")
    assert node.resolv_conf_paths == (*nodeconfig.DEFAULT_RESOLV_CONF_PATHS, f"{tmp_path}/r")
    assert node.ovs_configuration_paths == (*nodeconfig.DEFAULT_OVS_CONFIGURATION_PATHS, f"{tmp_path}/o")
    # a default named again is listed once
    assert node.ipam_data_dirs == (*nodeconfig.DEFAULT_IPAM_DATA_DIRS, f"{tmp_path}/i")


def test_replace_defaults_gives_a_list_in_full(tmp_path: Path) -> None:
    node = _load(tmp_path, f"ipamDataDirs: [{tmp_path}/i]\nipamDataDir: {tmp_path}/i\n"
                           f"resolvConfPaths: [{tmp_path}/r]\nreplaceDefaults: [ipamDataDirs]\n")
    assert node.ipam_data_dirs == (f"{tmp_path}/i",)
    assert node.resolv_conf_paths == (*nodeconfig.DEFAULT_RESOLV_CONF_PATHS, f"{tmp_path}/r")
    with pytest.raises(CniError) as err:
        settings.ipam_paths({"type": "host-local"}, node)  # its default is no longer allowed
    assert "ipamDataDirs" in err.value.msg


@pytest.mark.parametrize(("text", "needles"), [
    ("replaceDefaults: [ipamDataDirs]\n", ["replaceDefaults", "names ipamDataDirs, which this config "
                                                              "does not give"]),
    ("replaceDefaults: [stateDir]\n", ["replaceDefaults=['stateDir']", "ovsConfigurationPaths, "
                                                                       "resolvConfPaths, ipamDataDirs"]),
    ("replaceDefaults: ipamDataDirs\n", ["replaceDefaults='ipamDataDirs'"]),
])
def test_a_bad_replace_defaults_is_a_clear_error(tmp_path: Path, text: str, needles: list[str]) -> None:
    with pytest.raises(CniError) as err:
        _load(tmp_path, f"ipamDataDirs: [{tmp_path}/i]\n" * ("ipamDataDirs" not in text) + text)
    assert err.value.code == Code.INVALID_CONFIG
    for needle in needles:
        assert needle in err.value.msg, err.value.msg


@pytest.mark.parametrize(("gpus", "vfs"), [(0, 0), (0, 4), (8, 2)])
def test_the_lab_node_config_is_self_consistent(tmp_path: Path, gpus: int, vfs: int) -> None:
    from cni.netconf import parse_netconf
    from hostfiles.confined import within
    from tenantnet.lab import node as lab_node
    from tenantnet.ops import multus

    root = tmp_path / "lab"
    node = _load(tmp_path, lab_node.node_config_text(str(root), gpus=gpus, vfs=vfs))
    # tenantnet-ipam's store for a NAD without dataDir is one the node allows
    assert within(node.ipam_data_dir, node.ipam_data_dirs), (node.ipam_data_dir, node.ipam_data_dirs)
    settings.ipam_paths({"type": "tenantnet-ipam"}, node)
    # every directory it names is the lab's: none of the host's defaults
    named = [node.state_dir, node.log_file, node.device_info_dir, node.ipam_data_dir, *node.ipam_data_dirs,
             *node.resolv_conf_paths, *node.ovs_configuration_paths]
    assert all(within(p, (str(root),)) for p in named), named
    # the lab's Multus puts device-info files where the plugin may write them, and uses that dir
    assert multus.devinfo_dir(node) == node.device_info_dir
    nad = multus.Nad("default", "blue", {"cniVersion": "1.0.0", "name": "blue", "type": "tenantnet",
                                         "capabilities": {"CNIDeviceInfoFile": True}})
    pod = multus.PodSpec("default", "p", {})
    (delegate,) = multus.plan_delegates(pod, [multus.Selection("blue", "default")], {("default", "blue"): nad},
                                        {}, "c0ffee", "uid-1", multus.devinfo_dir(node))
    assert delegate.devinfo_file is not None
    assert Path(delegate.devinfo_file).parent == Path(node.device_info_dir)
    assert settings.device_info_file(parse_netconf(delegate.conf), node) == delegate.devinfo_file


def test_the_default_device_info_dir_is_the_one_multus_writes_to() -> None:
    assert nodeconfig.NodeConfig().device_info_dir == "/var/run/k8s.cni.cncf.io/devinfo/cni"
