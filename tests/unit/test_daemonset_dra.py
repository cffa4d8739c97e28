"""The packaged DaemonSet and ConfigMap for DRA (docs/dra.md): the ConfigMap's commented DRA
keys load once uncommented, and the agent's container mounts each directory they name — the
kubelet's plugins_registry and the driver's plugins/tenantnet.io under kubeletRootDir, the NRI
socket's directory, cdiDir — at the host's own path (the kubelet dials the socket path the
agent registers; containerd reads the CDI specs it writes), from hostPaths that never keep the
pod from starting on a node without DRA."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tenantnet.plugin import nodeconfig

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
DRA_KEYS = ("dra", "kubeletRootDir", "nriSocket", "cdiDir")


def packaged_node_config_with_dra(tmp_path: Path) -> nodeconfig.NodeConfig:
    text = yaml.safe_load((PACKAGING / "configmap.yaml").read_text())["data"]["tenantnet.yaml"]
    for key in ("kubernetes", *DRA_KEYS):
        assert text.count(f"\n# {key}: ") == 1, key  # commented out, once
        text = text.replace(f"\n# {key}: ", f"\n{key}: ")
    path = tmp_path / "tenantnet.yaml"
    path.write_text(text)
    return nodeconfig.load(str(path))


def test_the_configmaps_dra_keys_load_and_say_what_containerd_needs(tmp_path: Path) -> None:
    node = packaged_node_config_with_dra(tmp_path)
    assert node.dra and node.kubernetes
    defaults = nodeconfig.NodeConfig()
    assert (node.kubelet_root_dir, node.nri_socket, node.cdi_dir) == \
        (defaults.kubelet_root_dir, defaults.nri_socket, defaults.cdi_dir)
    text = (PACKAGING / "configmap.yaml").read_text()
    assert "plugin_request_timeout" in text and "disable = false" in text


def test_the_agent_mounts_what_the_dra_keys_name_at_the_hosts_own_paths(tmp_path: Path) -> None:
    node = packaged_node_config_with_dra(tmp_path)
    spec = yaml.safe_load((PACKAGING / "daemonset.yaml").read_text())["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    [agent] = [c for c in spec["containers"] if c["name"] == "agent"]
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"] if m["name"] in volumes}
    wanted = [os.path.join(node.kubelet_root_dir, "plugins_registry"),
              os.path.join(node.kubelet_root_dir, "plugins", "tenantnet.io"),
              os.path.dirname(node.nri_socket), node.cdi_dir]
    for path in wanted:
        mount = mounts[path]
        assert volumes[mount["name"]]["path"] == path, path
        assert volumes[mount["name"]]["type"] == "DirectoryOrCreate", path  # DRA is off on most nodes
        assert not mount.get("readOnly") and "mountPropagation" not in mount, mount
    # Only the driver's own plugin directory, not the other drivers' sockets.
    assert os.path.join(node.kubelet_root_dir, "plugins") not in mounts
