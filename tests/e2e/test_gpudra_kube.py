"""Issue 28: the lab's simulated GPU DRA driver (`gpu.lab.tenantnet.io`, tenantnet/lab/gpudra.py,
a simulation: no GPU exists) on a real Kubernetes node of its own.

One lab, `tenantnetctl lab up --kubernetes --gpus 8 --vfs 2` in /run/tnk-gpu-<pid> (not the
session's shared lab: this one is the simulated 8-GPU server; test_dra_kube uses it first,
tests/e2e/conftest.py), taken down by this module's last test, and at the session's end also
on failure. Checked: the driver's ResourceSlice is accepted by the API server with the
eight GPUs and their PCIe roots, one per GPU/NIC pair (the NIC's is the same); the lab's
node config names the simulated server and the DRA settings; a pod whose ResourceClaimTemplate
asks for one GPU is placed by the real scheduler, the kubelet has the driver prepare it, and
the container sees the CDI env var naming that GPU; deleting the pod removes the claim's CDI
spec. A pod asking for 9 GPUs, and one asking for 2 GPUs on one PCIe root (every GPU has its
own), stay Pending with the scheduler's reason. `lab down` leaves nothing of the lab.

The GPU + rail pairing (tenantnet's own slices beside these) is the DRA e2e's, not this one's.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.kube.slices import pcie_root
from tenantnet.lab import gpudra, kube, kubeimages
from tenantnet.lab.kubeconf import tag
from tenantnet.plugin import nodeconfig
from tenantnet.plugin.system.pcitree import PcieTree
from tests.polling import poll

CTL = str(Path(sys.executable).parent / "tenantnetctl")
NS = "gpu-e2e"


def _ctl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def lab(gpu_kube_session: Any) -> kube.KubeLab:
    """The simulated 8-GPU server's lab (tests/e2e/conftest.py's GpuKubeSession: test_dra_kube
    used it first and put back what its agent changed); taken down by the last test here, and
    by the session's end also on failure."""
    info: kube.KubeLab = gpu_kube_session.lab()
    kubectl(info, "create", "namespace", NS)
    return info


def kubectl(lab: kube.KubeLab, *args: str, **kw: Any) -> str:
    return kube.kubectl(lab, *args, **kw)


def get(lab: kube.KubeLab, *args: str) -> Any:
    return json.loads(kubectl(lab, "get", *args, "-o", "json"))


def claim_template(name: str, count: int, same_root: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": gpudra.DRIVER, "count": count}}]}
    if same_root:
        spec["constraints"] = [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": {"spec": {"devices": spec}}}


def pod(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                     "containers": [{
                         "name": "main", "image": kubeimages.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                         "command": ["sh", "-c", "env | grep LAB_SIMULATED_GPU_ ; sleep 3600"],
                         "resources": {"claims": [{"name": "gpus"}]}}]}}


def apply(lab: kube.KubeLab, *docs: dict[str, Any]) -> None:
    kube.apply(lab, yaml.safe_dump_all(docs))


def test_the_slice_is_published_with_a_pcie_root_per_gpu_nic_pair(lab: kube.KubeLab) -> None:
    slices = get(lab, "resourceslices", "-l", "tenantnet.io/simulated=true")["items"]
    assert len(slices) == 1, slices
    spec = slices[0]["spec"]
    assert (spec["driver"], spec["nodeName"]) == (gpudra.DRIVER, kube.NODE_NAME)
    published = {d["name"]: {k: next(iter(v.values())) for k, v in d["attributes"].items()} for d in spec["devices"]}
    assert sorted(published) == [f"gpu-{i}" for i in range(8)]
    assert {a["simulated"] for a in published.values()} == {True}
    assert {a["productName"] for a in published.values()} == {"NVIDIA H100 80GB HBM3 (simulated)"}
    # `lab status --json` shows what was published, and the driver's pid.
    shown = json.loads(_ctl("lab", "status", "--dir", lab.root, "--json").stdout)
    assert [(g["name"], g["pci"], g["uuid"], g["pcieRoot"]) for g in shown["gpus"]] == [
        (n, a["resource.kubernetes.io/pciBusID"], a["uuid"], a["resource.kubernetes.io/pcieRoot"])
        for n, a in sorted(published.items())]
    assert "tenantnet.lab.gpudra" in Path(f"/proc/{shown['pids']['gpu-dra']}/cmdline").read_text()
    # Every GPU its own PCIe root, and the NIC behind its switch the same one.
    config = nodeconfig.load(lab.node_config)
    nics = sorted(PcieTree(config.sysfs_root).nics(), key=lambda n: n.address)
    roots = [published[f"gpu-{i}"]["resource.kubernetes.io/pcieRoot"] for i in range(8)]
    assert roots == [pcie_root(config.sysfs_root, n.address) for n in nics] and len(set(roots)) == 8
    # The node config: the simulated server, and the DRA settings of this lab's kubelet and containerd.
    assert (config.dra, config.kubernetes) == (True, True)
    assert (config.kubelet_root_dir, config.cdi_dir, config.nri_socket) == (
        lab.kubelet_root, f"{lab.root}/containerd/cdi", f"{lab.root}/containerd/nri/nri.sock")


def test_a_pod_with_one_gpu_sees_it_and_its_cdi_spec_goes_with_it(lab: kube.KubeLab) -> None:
    apply(lab, claim_template("one-gpu", 1), pod("one", "one-gpu"))
    kubectl(lab, "wait", "-n", NS, "pod/one", "--for=condition=Ready", "--timeout=120s", timeout=150)
    (claim,) = get(lab, "resourceclaims", "-n", NS)["items"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (gpudra.DRIVER, kube.NODE_NAME)
    index = int(result["device"].removeprefix("gpu-"))
    uuid = next(g["uuid"] for g in lab.gpus if g["name"] == result["device"])
    assert poll(lambda: "LAB_SIMULATED_GPU_" in kubectl(lab, "logs", "-n", NS, "one"), timeout=30)
    assert kubectl(lab, "logs", "-n", NS, "one").split() == [f"LAB_SIMULATED_GPU_{index}={uuid}"]
    spec_file = gpudra.cdi_spec_path(f"{lab.root}/containerd/cdi", claim["metadata"]["uid"])
    spec = json.loads(spec_file.read_text())
    assert spec["annotations"]["tenantnet.io/simulated"] == "true"
    kubectl(lab, "delete", "-n", NS, "pod", "one", "--wait=true", timeout=120)
    assert poll(lambda: not spec_file.exists(), timeout=60), "the claim's CDI spec stayed"
    assert poll(lambda: get(lab, "resourceclaims", "-n", NS)["items"] == [], timeout=60)
    assert list(Path(f"{lab.root}/containerd/cdi").iterdir()) == []


def test_what_cannot_be_allocated_stays_pending_with_the_reason(lab: kube.KubeLab) -> None:
    apply(lab, claim_template("nine-gpus", 9), pod("nine", "nine-gpus"),
          claim_template("two-on-one-root", 2, same_root=True), pod("pair", "two-on-one-root"))

    def unschedulable(name: str) -> dict[str, Any] | None:
        p = get(lab, "pod", "-n", NS, name)
        cond = next((c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"), None)
        return cond if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" else None

    for name in ("nine", "pair"):
        assert poll(lambda n=name: unschedulable(n), timeout=60), get(lab, "pod", "-n", NS, name)["status"]
        cond = unschedulable(name)
        assert cond is not None and "cannot allocate all claims" in cond["message"], cond
        events = get(lab, "events", "-n", NS, f"--field-selector=involvedObject.name={name}")["items"]
        assert any(e["reason"] == "FailedScheduling" and "cannot allocate all claims" in e["message"]
                   for e in events), events
        assert get(lab, "pod", "-n", NS, name)["status"]["phase"] == "Pending"
    kubectl(lab, "delete", "-n", NS, "pods", "nine", "pair", "--wait=true", timeout=120)


def test_lab_down_leaves_nothing(lab: kube.KubeLab) -> None:
    """Last: takes the module's lab down (the fixture's own down is then a no-op)."""
    pid = lab.pids["gpu-dra"]
    ovs_tag = "t" + hashlib.sha256(os.path.abspath(lab.ovs_root).encode()).hexdigest()[:5]
    assert any(n.startswith(f"{ovs_tag}g") for n in os.listdir("/sys/class/net"))  # the VFs were there
    down = _ctl("lab", "down", "--dir", lab.root)
    assert down.returncode == 0 and "gpu-dra" in down.stdout, down.stdout + down.stderr
    assert not Path(lab.root).exists()
    assert [n for n in os.listdir("/sys/class/net") if n.startswith((f"{ovs_tag}g", f"tk{tag(lab.root)}"))] == []
    with open("/proc/self/mountinfo") as fh:
        assert [line for line in fh if lab.root in line] == []
    assert not Path(f"/proc/{pid}").exists() or "gpudra" not in Path(f"/proc/{pid}/cmdline").read_text()
