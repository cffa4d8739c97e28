"""Rail alignment on the lab's simulated 8-GPU / 8-NIC server (`lab up --gpus 8`, a simulation:
fake PCIe tree, VFs as veths, a simulated kubelet's pod-resources API): an 8-rail pod gets
eight VFs, each beside a different one of its GPUs (PIX); a device plugin's misaligned
deviceID is refused with code 107 under `action: refuse`, attached with a warning under
`warn`; a kubelet that cannot be asked is named."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import gpuserver
from tenantnet.lab import node as labmod
from tenantnet.lab.nic import LabNic
from tests.integration.conftest import Lab, PluginRunner, _runner, new_cid

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def gpu_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("gpulab")
    info = labmod.up(str(root / "run"), vfs=1, gpus=8)
    try:
        yield Lab(root=Path(info.root), node_config=Path(info.node_config), state_dir=Path(info.state_dir),
                  ovsdb=info.ovsdb, bridge=info.bridge, hostlocal_dir=Path(info.root) / "host-local")
    finally:
        labmod.down(info.root)


@pytest.fixture
def gp(gpu_lab: Lab) -> Iterator[PluginRunner]:
    yield from _runner(gpu_lab)


def nics(lab: Lab) -> list[dict[str, Any]]:
    return sorted(LabNic(str(lab.root)).describe(), key=lambda n: n["pf"])


def conf(lab: Lab, name: str, **kw: Any) -> dict[str, Any]:
    base = {"cniVersion": "1.0.0", "name": name, "type": "tenantnet", "vlan": 100,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.93.0.0/24"}]],
                     "dataDir": str(lab.hostlocal_dir)}}
    return {**base, **kw}


def pod_args(pod: str) -> str:
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE=gpu;K8S_POD_NAME={pod}"


def gpu_addresses(lab: Lab) -> list[str]:
    """The simulated GPUs' PCI addresses (the nvidia driver's /proc entries of the lab)."""
    return sorted(p.name for p in (lab.root / "proc" / "driver" / "nvidia" / "gpus").iterdir())


def ctl(lab: Lab, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tenantnet.ops.ctl", "--node-config", str(lab.node_config), *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def records(lab: Lab) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((lab.state_dir / "attachments").rglob("*.json"))]


def test_an_eight_rail_pod_pairs_each_rail_with_its_own_gpu(gpu_lab: Lab, gp: PluginRunner,
                                                            netns_factory: Any) -> None:
    gpus = gpuserver.assign_gpus(str(gpu_lab.root), "gpu", "trainer", 8)
    ns, cid = netns_factory(), new_cid()
    pool = [n["pf"] for n in nics(gpu_lab)]
    try:
        for i in range(8):
            c = conf(gpu_lab, f"rail-{i}", pfs=pool, railAlignment={"within": "PIX", "action": "refuse"})
            inv = gp.call("ADD", c, cid, ns.path, f"net{i + 1}", cni_args=pod_args("trainer"))
            assert inv.code == 0, inv.stdout + inv.stderr
        plans = [r["plan"] for r in records(gpu_lab) if r["container_id"] == cid]
        assert len(plans) == 8
        assert sorted(p["gpuDistance"] for p in plans) == ["PIX"] * 8
        assert len({p["gpu"] for p in plans}) == 8 and len({p["pfAddress"] for p in plans}) == 8
        assert {p["gpu"] for p in plans} == set(gpu_addresses(gpu_lab)) and len(gpus) == 8
        shown = json.loads(ctl(gpu_lab, "rails", "--json"))
        assert len(shown["gpus"]) == len(shown["nics"]) == 8 and len(shown["pairings"]) == 8
        diagonal = [shown["distances"][g["gpu"]][n["nic"]] for g, n in zip(shown["gpus"], shown["nics"], strict=True)]
        assert diagonal == ["PIX"] * 8 and all(len(n["freeVfs"]) == 0 for n in shown["nics"])
        listed = [r for r in json.loads(ctl(gpu_lab, "ls", "--json")) if r.get("containerID") == cid]
        assert sorted(r["gpuDistance"] for r in listed) == ["PIX"] * 8
        assert all(r["rdmaDevice"] and r["rdmaInPod"] for r in listed)
    finally:
        for i in range(8):
            gp.call("DEL", conf(gpu_lab, f"rail-{i}", pfs=pool), cid, ns.path, f"net{i + 1}",
                    cni_args=pod_args("trainer"))
        gpuserver.release_gpus(str(gpu_lab.root), "gpu", "trainer")
    assert [r for r in records(gpu_lab) if r["container_id"] == cid] == []


def test_a_misaligned_device_id_is_refused_or_warned(gpu_lab: Lab, gp: PluginRunner, netns_factory: Any) -> None:
    gpuserver.assign_gpus(str(gpu_lab.root), "gpu", "small", 1)  # GPU 0: beside NIC 0
    far = next(n for n in nics(gpu_lab) if n["pf"].endswith("g5"))["vfs"][0]["address"]  # the other socket
    ns, cid = netns_factory(), new_cid()
    try:
        refused = gp.call("ADD", conf(gpu_lab, "rail-x", deviceID=far,
                                      railAlignment={"within": "PIX", "action": "refuse"}),
                          cid, ns.path, "net1", cni_args=pod_args("small"))
        assert refused.out is not None and refused.out["code"] == 107, refused.stdout
        assert "is SYS from it" in refused.out["msg"] and "within PIX" in refused.out["msg"]
        assert [r for r in records(gpu_lab) if r["container_id"] == cid] == []
        warned = gp.call("ADD", conf(gpu_lab, "rail-x", deviceID=far, railAlignment={"within": "PIX"}),
                         cid, ns.path, "net1", cni_args=pod_args("small"))
        assert warned.code == 0, warned.stdout
        assert "rail alignment" in warned.stderr
        (plan,) = [r["plan"] for r in records(gpu_lab) if r["container_id"] == cid]
        assert (plan["gpu"], plan["gpuDistance"]) == ("0000:13:00.0", "SYS")  # GPU 0, the other socket
        assert gp.call("DEL", conf(gpu_lab, "rail-x", deviceID=far), cid, ns.path, "net1",
                       cni_args=pod_args("small")).code == 0
    finally:
        gpuserver.release_gpus(str(gpu_lab.root), "gpu", "small")


def test_a_kubelet_that_cannot_be_asked_is_named(gpu_lab: Lab, gp: PluginRunner, netns_factory: Any) -> None:
    vf = nics(gpu_lab)[0]["vfs"][0]["address"]
    ns, cid = netns_factory(), new_cid()
    inv = gp.call("ADD", conf(gpu_lab, "rail-y", deviceID=vf, railAlignment={"action": "refuse"}),
                  cid, ns.path, "net1", cni_args=pod_args("nobody"))
    assert inv.out is not None and inv.out["code"] == 107, inv.stdout
    assert "nobody" in inv.out["msg"]  # the kubelet does not know the pod
