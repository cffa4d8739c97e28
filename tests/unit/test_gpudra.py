"""The lab's simulated GPU DRA driver (tenantnet/lab/gpudra.py, a simulation): its slice from the
simulated server's fake tree, its CDI specs written and removed idempotently, and the errors
of a prepare it cannot do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tenantnet.kube.kubeletplugin import ClaimRef, PreparedDevice
from tenantnet.kube.slices import pcie_root
from tenantnet.lab import gpudra
from tenantnet.lab.gpuserver import gpu_uuid
from tenantnet.lab.pcitree import hgx_8x8
from tenantnet.plugin.system.pcitree import PcieTree

NODE = "tenantnet-lab"
UID = "0f6b2a52-5c1e-4a43-9a53-6f3f8f1f2a10"


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> tuple[str, str]:
    """The simulated server's fake sysfs and nvidia proc files, as gpuserver.build lays them out."""
    root = tmp_path_factory.mktemp("hgx")
    tree = hgx_8x8(vfs=1)
    tree.write(root / "sys")
    for i, g in enumerate(tree.gpus):
        info = root / "proc" / "driver" / "nvidia" / "gpus" / g.address / "information"
        info.parent.mkdir(parents=True)
        info.write_text(f"Model: \t\t NVIDIA H100 80GB HBM3 (simulated)\nGPU UUID: \t {gpu_uuid(i)}\n"
                        f"Bus Location: \t {g.address}\n")
    return str(root / "sys"), str(root / "proc")


@pytest.fixture(scope="module")
def gpus(server: tuple[str, str]) -> list[gpudra.SimGpu]:
    return gpudra.discover(*server)


class FakeSliceApi:
    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}

    def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        return [s for s in self.slices.values()
                if s["spec"]["nodeName"] == node_name and s["spec"]["driver"] == driver]

    def create_slice(self, body: dict[str, Any]) -> None:
        self.slices[body["metadata"]["name"]] = json.loads(json.dumps(body))

    def replace_slice(self, body: dict[str, Any]) -> None:
        self.create_slice(body)

    def delete_slice(self, name: str) -> None:
        del self.slices[name]

    def node_uid(self, node_name: str) -> str:
        return "node-uid"


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))

    warning = info


def test_discovery_pairs_each_gpu_with_the_pcie_root_of_its_nic(server: tuple[str, str],
                                                                  gpus: list[gpudra.SimGpu]) -> None:
    sysfs, _ = server
    assert [(g.name, g.index, g.uuid) for g in gpus] == [(f"gpu-{i}", i, gpu_uuid(i)) for i in range(8)]
    nics = sorted(PcieTree(sysfs).nics(), key=lambda n: n.address)
    # GPU i and NIC i (and NIC i's VFs) behind one switch, one PCIe root; no other pair shares it.
    assert [g.pcie_root for g in gpus] == [pcie_root(sysfs, n.address) for n in nics] == [
        "pci0000:10", "pci0000:20", "pci0000:30", "pci0000:40",
        "pci0000:90", "pci0000:a0", "pci0000:b0", "pci0000:c0"]
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[0].pci_address == "0000:13:00.0"


def test_the_slice_names_every_gpu_as_simulated(gpus: list[gpudra.SimGpu]) -> None:
    api, log = FakeSliceApi(), Log()
    assert gpudra.publisher(api, NODE, gpus, log).sync() is True
    (s,) = api.slices.values()
    assert s["apiVersion"] == "resource.k8s.io/v1"
    assert s["metadata"]["labels"] == {"tenantnet.io/simulated": "true"}
    assert "simulation" in s["metadata"]["annotations"]["tenantnet.io/description"]
    assert s["spec"]["driver"] == "gpu.lab.tenantnet.io" and s["spec"]["nodeName"] == NODE
    assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    devices = s["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert devices[5]["attributes"] == {
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:a0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:a3:00.0"},
        "numaNode": {"int": 1},
        "uuid": {"string": gpu_uuid(5)},
        "productName": {"string": "NVIDIA H100 80GB HBM3 (simulated)"},
        "simulated": {"bool": True},
    }
    # A second pass finds it equal and writes nothing.
    assert gpudra.publisher(api, NODE, gpus, log).sync() is False


def test_device_class_selects_the_driver() -> None:
    import yaml

    dc = yaml.safe_load(gpudra.DEVICE_CLASS)
    assert dc["kind"] == "DeviceClass" and dc["metadata"]["name"] == "gpu.lab.tenantnet.io"
    assert dc["metadata"]["labels"] == {"tenantnet.io/simulated": "true"}
    assert dc["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "gpu.lab.tenantnet.io"'}}]


def claim(*results: dict[str, str], uid: str = UID) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": "train-gpus", "uid": uid},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def result(device: str, request: str = "gpus", pool: str = NODE,
           driver: str = "gpu.lab.tenantnet.io") -> dict[str, str]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


REF = ClaimRef("ml", "train-gpus", UID)


def test_prepare_writes_the_cdi_spec_and_unprepare_removes_it_both_idempotent(
        tmp_path: Path, gpus: list[gpudra.SimGpu]) -> None:
    api_claim = claim(result("gpu-3"), result("gpu-6", "more"), result("vf-0000-14-00-2", driver="tenantnet.io"))
    h = gpudra.GpuClaims(gpus, NODE, str(tmp_path), lambda ns, name: api_claim, Log())
    first = h.prepare([REF])[UID]
    assert first.error == ""
    assert first.devices == (
        PreparedDevice(("gpus",), NODE, "gpu-3", (f"gpu.lab.tenantnet.io/gpu=claim-{UID}-gpu-3",)),
        PreparedDevice(("more",), NODE, "gpu-6", (f"gpu.lab.tenantnet.io/gpu=claim-{UID}-gpu-6",)))
    spec_file = tmp_path / f"gpu.lab.tenantnet.io-{UID}.json"
    spec = json.loads(spec_file.read_text())
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "gpu.lab.tenantnet.io/gpu"
    assert spec["annotations"]["tenantnet.io/simulated"] == "true"
    assert spec["annotations"]["tenantnet.io/claim"] == "ml/train-gpus"
    assert spec["devices"] == [
        {"name": f"claim-{UID}-gpu-3", "containerEdits": {"env": [f"LAB_SIMULATED_GPU_3={gpu_uuid(3)}"]}},
        {"name": f"claim-{UID}-gpu-6", "containerEdits": {"env": [f"LAB_SIMULATED_GPU_6={gpu_uuid(6)}"]}}]
    # The kubelet retries: the same answer, the same file, nothing else in the dir.
    assert h.prepare([REF])[UID] == first
    assert json.loads(spec_file.read_text()) == spec
    assert sorted(p.name for p in tmp_path.iterdir()) == [spec_file.name]
    assert h.unprepare([REF]) == {UID: ""}
    assert not spec_file.exists()
    assert h.unprepare([REF]) == {UID: ""}  # gone already: done
    assert list(tmp_path.iterdir()) == []


def test_prepare_refuses_what_is_not_one_of_the_gpus(tmp_path: Path, gpus: list[gpudra.SimGpu]) -> None:
    def answer(api_claim: dict[str, Any]) -> str:
        h = gpudra.GpuClaims(gpus, NODE, str(tmp_path), lambda ns, name: api_claim, Log())
        got = h.prepare([REF])[UID]
        assert got.devices == () and list(tmp_path.iterdir()) == []
        return got.error

    assert answer(claim(result("gpu-0"), result("gpu-8"))) == (
        f"claim ml/train-gpus: device {NODE}/gpu-8 (request gpus) is not one of this node's simulated GPUs "
        f"(pool {NODE}: gpu-0, gpu-1, gpu-2, gpu-3, gpu-4, gpu-5, gpu-6, gpu-7)")
    assert "device other-node/gpu-1 (request gpus) is not one of" in answer(claim(result("gpu-1", pool="other-node")))
    assert answer(claim(result("vf-1", driver="tenantnet.io"))) == (
        "claim ml/train-gpus: no device of driver gpu.lab.tenantnet.io is allocated to it")
    assert "the API has uid 1-2-3, the kubelet asked for " + UID in answer(claim(result("gpu-0"), uid="1-2-3"))


def test_prepare_when_the_api_fails(tmp_path: Path, gpus: list[gpudra.SimGpu]) -> None:
    def away(namespace: str, name: str) -> dict[str, Any]:
        raise ConnectionError("connection refused")

    got = gpudra.GpuClaims(gpus, NODE, str(tmp_path), away, Log()).prepare([REF])[UID]
    assert got.error == "claim ml/train-gpus: cannot read it from the API: connection refused"


def test_discovery_needs_the_uuid_files(tmp_path: Path) -> None:
    hgx_8x8(vfs=1).write(tmp_path / "sys")
    with pytest.raises(ValueError, match=r"GPU 0000:13:00.0 in .* has no .*/information with its UUID"):
        gpudra.discover(str(tmp_path / "sys"), str(tmp_path / "proc"))


def test_help_says_it_is_a_simulation(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        gpudra.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the text
    assert "simulated GPU DRA driver (gpu.lab.tenantnet.io; a simulation" in out and "--lab DIR" in out


def test_lab_up_refuses_what_the_kubernetes_lab_cannot_be(tmp_path: Path) -> None:
    import subprocess
    import sys

    ctl = str(Path(sys.executable).parent / "tenantnetctl")
    for extra, said in ((["--vfs", "2"], "--vfs only with --gpus 8"), (["--gpus", "4"], "--gpus must be 8")):
        got = subprocess.run([ctl, "lab", "up", "--kubernetes", *extra, "--dir", str(tmp_path / "lab")],
                             capture_output=True, text=True, check=False)
        assert got.returncode == 2 and said in got.stderr, got.stderr
    assert not (tmp_path / "lab").exists()
