"""The Multus-style harness against the lab: three networks, network-status, device-info."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tenantnet.ops.harness import Pod
from tests.integration import nodestate

CTL = str(Path(sys.executable).parent / "tenantnetctl")

NADS = """
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: rail-ovs, namespace: ml}
spec:
  config: '{"cniVersion": "1.0.0", "type": "tenantnet", "bridge": "br-lab", "vlan": 100, "mtu": 1400,
            "capabilities": {"mac": true, "ips": true},
            "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.81.0.0/24"}]], "dataDir": "IPAM"}}'
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: rail-vf
  namespace: ml
  annotations: {k8s.v1.cni.cncf.io/resourceName: nvidia.com/rail0}
spec:
  config: '{"cniVersion": "1.0.0", "type": "tenantnet", "vlan": 200,
            "capabilities": {"deviceID": true, "CNIDeviceInfoFile": true},
            "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.82.0.0/24"}]], "dataDir": "IPAM"}}'
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: storage, namespace: ml}
spec:
  config: '{"cniVersion": "1.0.0", "type": "tenantnet", "bridge": "br-lab", "vlan": 300,
            "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.83.0.0/24"}]], "dataDir": "IPAM"}}'
"""

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: trainer-0
  namespace: ml
  annotations:
    k8s.v1.cni.cncf.io/networks: ANNOTATION
"""


def ctl(node, *args):
    return subprocess.run([CTL, "--node-config", str(node), *args], capture_output=True, text=True)


def files(tmp_path, annotation, lab_root):
    nad = tmp_path / "nads.yaml"
    # inside the lab node config's ipamDataDirs (<lab>/ipam)
    nad.write_text(NADS.replace("IPAM", str(lab_root / "ipam" / tmp_path.name)))
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD.replace("ANNOTATION", json.dumps(annotation)))
    return nad, pod


def test_three_networks_status_and_device_info(nic_lab, tmp_path):
    vf = json.loads(ctl(nic_lab.node_config, "lab", "status", "--dir", str(nic_lab.root), "--json").stdout)
    vf_address = vf["nics"][0]["vfs"][2]["address"]
    annotation = json.dumps([{"name": "rail-ovs", "mac": "02:81:00:00:00:07", "ips": ["10.81.0.50/24"]},
                             {"name": "rail-vf"}, {"name": "storage", "namespace": "ml"}])
    nad, pod = files(tmp_path, annotation, nic_lab.root)
    before = nodestate.snapshot(nic_lab)
    up = ctl(nic_lab.node_config, "pod", "up", str(pod), "--nad", str(nad),
             "--devices", f"nvidia.com/rail0={vf_address}")
    assert up.returncode == 0, up.stderr
    status = json.loads(up.stdout)
    assert [s["name"] for s in status] == ["ml/rail-ovs", "ml/rail-vf", "ml/storage"]
    assert [s["interface"] for s in status] == ["net1", "net2", "net3"]
    assert status[0]["ips"] == ["10.81.0.50"] and status[0]["mac"] == "02:81:00:00:00:07"
    assert status[1]["ips"][0].startswith("10.82.0.") and status[2]["ips"][0].startswith("10.83.0.")
    assert all("/" not in ip for s in status for ip in s["ips"]) and all(s["dns"] == {} for s in status)
    info = status[1]["device-info"]
    assert info["type"] == "pci" and info["version"] == "1.1.0"
    assert info["pci"]["pci-address"] == vf_address and info["pci"]["pf-pci-address"] == "0000:3b:00.0"
    assert info["pci"]["rdma-device"].startswith("mlx5_")
    p = Pod("ml", "trainer-0")
    links = subprocess.run(["ip", "-n", p.netns_name, "-br", "link"], capture_output=True, text=True).stdout
    assert all(f"net{i}" in links for i in (1, 2, 3))
    down = ctl(nic_lab.node_config, "pod", "down", str(pod))
    assert down.returncode == 0, down.stderr
    assert not Path(p.netns_path).exists()
    assert nic_lab.owned_ports() == [] and nic_lab.records() == []
    assert list((nic_lab.root / "devinfo").rglob("*.*")) == []
    left = ctl(nic_lab.node_config, "ipam", "ls", "--data-dir", str(nic_lab.root / "ipam" / tmp_path.name), "--json")
    assert json.loads(left.stdout) == []
    assert nodestate.diff(before, nodestate.snapshot(nic_lab)) == ""  # VFs, links, IPAM, files


def test_short_form_and_unwinding_on_failure(nic_lab, tmp_path):
    # The third network names a NAD whose bridge does not exist: Multus-style unwinding must
    # remove the first two and the pod namespace.
    nad, pod = files(tmp_path, "ml/rail-ovs@net5, storage, broken", nic_lab.root)
    broken = ('\n---\napiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\n'
              'metadata: {name: broken, namespace: ml}\nspec:\n  config: \'{"cniVersion": "1.0.0", '
              '"type": "tenantnet", "bridge": "br-nowhere", "vlan": 9}\'\n')
    nad.write_text(nad.read_text() + broken)
    before = nodestate.snapshot(nic_lab)
    up = ctl(nic_lab.node_config, "pod", "up", str(pod), "--nad", str(nad))
    assert up.returncode == 1 and "ml/broken (net3) failed" in up.stderr and "br-nowhere" in up.stderr
    assert not Path(Pod("ml", "trainer-0").netns_path).exists()
    assert nic_lab.owned_ports() == [] and nic_lab.records() == []
    # the unwinding released the first two networks' addresses and host links too
    assert nodestate.diff(before, nodestate.snapshot(nic_lab)) == ""


def test_device_info_file_is_the_attachments_own_and_only_removed_while_ours(tmp_path):
    import os

    import pytest

    from cni.errors import CniError
    from tenantnet.plugin import devinfo

    folder = tmp_path / "devinfo" / "cni"
    name = str(folder / "ml-rail-vf-cid1_net2")
    assert devinfo.accepted(name, "cid1", "net2", str(folder)) == name
    for value, why in ((str(folder / "ml-rail-vf-cid2_net2"), "cid1_net2"),  # another pod's
                       (str(folder / "ml-rail-vf-cid1_net3"), "cid1_net2"),  # another interface's
                       (str(folder / "cid1_net2"), "<NAD namespace>-<NAD name>"),
                       (str(folder / "Upper-case-cid1_net2"), "<NAD namespace>-<NAD name>"),
                       (str(folder / "sub" / "ml-rail-vf-cid1_net2"), "<NAD namespace>-<NAD name>"),
                       (str(tmp_path / "devinfo" / "dp" / "x-device.json"), "allowed directories"),
                       (f"{folder}/../cni/ml-rail-vf-cid1_net2", "plain path"),
                       (str(folder / f"{'m' * 60}-{'n' * 200}-cid1_net2"), "longer than 244 bytes")):
        with pytest.raises(CniError) as err:
            devinfo.accepted(value, "cid1", "net2", str(folder))
        assert err.value.code == 7 and "runtimeConfig.CNIDeviceInfoFile" in err.value.msg and why in err.value.msg

    # a node config naming Multus's base directory (…/devinfo, earlier releases' default):
    # its cni/ folder, never the device plugin's dp/ beside it
    base = str(folder.parent)
    assert devinfo.accepted(name, "cid1", "net2", base) == name
    with pytest.raises(CniError) as err:
        devinfo.accepted(str(folder.parent / "dp" / "ml-rail-vf-cid1_net2"), "cid1", "net2", base)
    assert err.value.code == 7 and "<NAD namespace>-<NAD name>" in err.value.msg

    staged = devinfo.stage(name, {"pci-address": "0000:3b:00.2"}, str(folder))  # makes the folder
    assert stat_mode(folder) == 0o700 and stat_mode(folder.parent) == 0o755
    assert not os.path.exists(name) and devinfo.publish(staged)
    assert json.loads(Path(name).read_text()) == {"type": "pci", "version": "1.1.0",
                                                  "pci": {"pci-address": "0000:3b:00.2"}}
    assert stat_mode(Path(name)) == 0o600 and sorted(os.listdir(folder)) == [os.path.basename(name)]
    # a second writer never replaces what is there
    again = devinfo.stage(name, {"pci-address": "other"}, str(folder))
    assert not devinfo.publish(again) and "other" not in Path(name).read_text()
    assert sorted(os.listdir(folder)) == [os.path.basename(name)]
    # removed while it is ours; a file made in its place (even on the same inode) is not
    assert devinfo.remove(name, staged.identity, str(folder)) and not os.path.exists(name)
    staged = devinfo.stage(name, {"pci-address": "0000:3b:00.2"}, str(folder))
    assert devinfo.publish(staged)
    os.unlink(name)
    Path(name).write_text("someone else's")
    assert not devinfo.remove(name, staged.identity, str(folder)) and Path(name).read_text() == "someone else's"
    assert not devinfo.remove(name, staged.identity, str(tmp_path / "elsewhere"))
    # a crash between staging and recording: DEL removes the staging file (a name only
    # tenantnet makes, for this attachment) but nothing at the name itself
    devinfo.stage(name, {"pci-address": "x"}, str(folder))
    assert not devinfo.remove(name, None, str(folder))
    assert sorted(os.listdir(folder)) == [os.path.basename(name)]


def stat_mode(path: Path) -> int:
    import stat

    return stat.S_IMODE(path.lstat().st_mode)
