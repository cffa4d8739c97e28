"""tenantnet's DRA ResourceSlices and DeviceClasses against the lab's real API server
(Kubernetes v1.36, resource.k8s.io/v1): the packaged DeviceClasses are accepted (their CEL
compiled by the server), the publisher's slices of the simulated 8-GPU server are accepted
through lightkube as the lab's admin, read back equal (a second pass writes nothing: the
comparison survives the server's round trip), split over 128 devices, and shrunk with the
generation raised and the extra slices deleted; and the real kube-scheduler, given a claim for
two GPUs (another driver's devices with their pcieRoot) and two rails of the packaged rail
class with one `matchAttribute: resource.kubernetes.io/pcieRoot` per pair, gives each rail a
VF of the NIC beside its GPU (without the constraints it takes rail-0's: checked once by hand).

The slices here are published under driver names of this test's own (not `tenantnet.io`), so
an agent of the lab publishing `tenantnet.io` slices for the same node is not disturbed; they,
the DeviceClasses, the claim, its pod and namespace are deleted at the end, also on failure. Fails (never skips) without the
Kubernetes binaries, as tests/e2e/test_kube_lab.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.kube import slices
from tenantnet.lab import kube, kubeimages
from tenantnet.lab.pcitree import hgx_8x8
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.system.pcitree import PcieTree
from tests.e2e.test_kube_lab import Lab, klab  # noqa: F401  (the session's lab, tests/e2e/conftest.py)
from tests.polling import poll

CLASSES = Path(__file__).resolve().parents[2] / "packaging" / "dra" / "deviceclasses.yaml"
DRIVER = "e2e-slices.tenantnet.io"


class Log:
    def info(self, event: str, **kw: Any) -> None:
        pass

    warning = info


def pool(lab: Lab) -> list[dict[str, Any]]:
    out = json.loads(lab.kubectl("get", "resourceslices.v1.resource.k8s.io", "-o", "json",
                                 f"--field-selector=spec.driver={DRIVER},spec.nodeName={lab.lab.node_name}"))
    return sorted(out["items"], key=lambda s: s["metadata"]["name"])


@pytest.fixture
def published(klab: Lab, tmp_path: Path) -> Iterator[tuple[Lab, slices.SlicePublisher, list]]:  # noqa: F811
    hgx_8x8(vfs=2).write(tmp_path)
    devices = slices.node_devices(NodeConfig(sysfs_root=str(tmp_path)), frozenset(),
                                  eswitch_mode=lambda netdev, address: "legacy")
    box = [devices]
    api = slices.LightkubeSliceApi(klab.lab.kubeconfig)
    pub = slices.SlicePublisher(api, DRIVER, klab.lab.node_name, lambda: box[0], Log())
    try:
        yield klab, pub, box
    finally:
        for s in pool(klab):
            klab.kubectl("delete", "resourceslices.v1.resource.k8s.io", s["metadata"]["name"], "--wait=false")


def test_packaged_device_classes_are_accepted(klab: Lab) -> None:  # noqa: F811
    names = ["vf.tenantnet.io", "rail.tenantnet.io", "switchdev-vf.tenantnet.io"]
    try:
        kube.apply(klab.lab, CLASSES.read_text())
        got = json.loads(klab.kubectl("get", "deviceclasses.v1.resource.k8s.io", *names, "-o", "json"))
        assert [c["metadata"]["name"] for c in got["items"]] == names
    finally:
        klab.kubectl("delete", "deviceclasses.v1.resource.k8s.io", *names, "--ignore-not-found")


def test_slices_of_the_8x8_server_are_accepted_and_kept_without_writes(published: Any) -> None:
    lab, pub, box = published
    assert pub.sync() is True
    (only,) = pool(lab)
    node_uid = json.loads(lab.kubectl("get", "node", lab.lab.node_name, "-o", "json"))["metadata"]["uid"]
    assert only["metadata"]["ownerReferences"][0]["uid"] == node_uid
    assert only["spec"]["pool"] == {"name": lab.lab.node_name, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in only["spec"]["devices"]] == [d["name"] for d in box[0]]
    assert only["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:10"}
    version = only["metadata"]["resourceVersion"]
    assert pub.sync() is False  # what the server returns compares equal: no write
    assert pool(lab)[0]["metadata"]["resourceVersion"] == version


def test_a_large_pool_is_split_then_shrunk(published: Any) -> None:
    lab, pub, box = published
    many = [{"name": f"vf-{i:04d}", "attributes": {slices.PCI_BUS_ID: {"string": f"0000:3b:{i % 32:02x}.{i % 8}"}}}
            for i in range(300)]
    box[0] = many
    assert pub.sync() is True
    got = pool(lab)
    assert [len(s["spec"]["devices"]) for s in got] == [128, 128, 44]
    assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in got} == {(1, 3)}
    box[0] = many[:5]
    assert pub.sync() is True
    (only,) = pool(lab)
    assert only["spec"]["pool"]["generation"] == 2 and len(only["spec"]["devices"]) == 5
    assert pub.sync() is False


GPU_DRIVER = "e2e-gpu.tenantnet.io"
NAMESPACE = "e2e-slices"


def our_classes() -> str:
    """The packaged DeviceClasses for this test's driver name (the same CEL, the driver's
    domain renamed), and a class for the test's GPUs."""
    text = CLASSES.read_text().replace('"tenantnet.io"', f'"{DRIVER}"')
    docs = [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        d["metadata"]["name"] = "e2e-" + d["metadata"]["name"]
    docs.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "e2e-gpu"},
                 "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}]}})
    return yaml.safe_dump_all(docs)


def test_the_scheduler_pairs_each_gpu_with_the_vf_on_its_pcie_root(published: Any, tmp_path: Path) -> None:
    """The real kube-scheduler allocates a claim for two given GPUs (published as another
    driver's devices with their pcieRoot) and two rails, one `matchAttribute:
    resource.kubernetes.io/pcieRoot` per GPU/rail pair: each rail gets a VF of the NIC beside
    its GPU. The pod itself never starts (no kubelet plugin serves these drivers here)."""
    lab, pub, box = published
    tree = PcieTree(str(tmp_path))
    gpus = sorted(g.address for g in tree.gpus())
    gpu_devices = [{"name": f"gpu-{i}", "attributes": {
        slices.PCI_BUS_ID: {"string": g}, slices.PCIE_ROOT: {"string": slices.pcie_root(str(tmp_path), g)}}}
        for i, g in enumerate(gpus)]
    gpu_pub = slices.SlicePublisher(slices.LightkubeSliceApi(lab.lab.kubeconfig), GPU_DRIVER, lab.lab.node_name,
                                    lambda: gpu_devices, Log())
    pairs = {"a": 2, "b": 5}  # request suffix -> GPU index
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "rails", "namespace": NAMESPACE},
        "spec": {"devices": {
            "requests": [r for key, i in pairs.items() for r in (
                {"name": f"gpu-{key}", "exactly": {"deviceClassName": "e2e-gpu", "selectors": [{"cel": {
                    "expression": f'device.attributes["resource.kubernetes.io"].pciBusID == "{gpus[i]}"'}}]}},
                {"name": f"rail-{key}", "exactly": {"deviceClassName": "e2e-rail.tenantnet.io"}})],
            "constraints": [{"requests": [f"gpu-{key}", f"rail-{key}"],
                             "matchAttribute": slices.PCIE_ROOT} for key in pairs],
        }},
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rails", "namespace": NAMESPACE},
           "spec": {"resourceClaims": [{"name": "rails", "resourceClaimName": "rails"}],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": kubeimages.PAUSE_IMAGE, "imagePullPolicy": "Never",
                                    "resources": {"claims": [{"name": "rails"}]}}]}}
    try:
        assert pub.sync() and gpu_pub.sync()
        kube.apply(lab.lab, our_classes())
        lab.kubectl("create", "namespace", NAMESPACE)
        kube.apply(lab.lab, json.dumps(claim))
        kube.apply(lab.lab, json.dumps(pod))

        def allocation() -> Any:
            got = json.loads(lab.kubectl("get", "resourceclaims.v1.resource.k8s.io", "rails", "-n", NAMESPACE,
                                         "-o", "json"))
            return (got.get("status") or {}).get("allocation")

        assert poll(allocation, timeout=60, interval=0.5), lab.kubectl("describe", "pod", "rails", "-n", NAMESPACE)
        results = {r["request"]: r for r in allocation()["devices"]["results"]}
        rail_of = {d["name"]: d["attributes"]["rail"]["string"] for d in box[0]}
        for key, i in pairs.items():
            assert results[f"gpu-{key}"]["device"] == f"gpu-{i}"
            assert results[f"rail-{key}"]["driver"] == DRIVER
            assert rail_of[results[f"rail-{key}"]["device"]] == f"rail-{i}"
    finally:
        lab.kubectl("delete", "pod", "rails", "-n", NAMESPACE, "--ignore-not-found", "--grace-period=0", "--force")
        lab.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false")
        names = [d["metadata"]["name"] for d in yaml.safe_load_all(our_classes())]
        lab.kubectl("delete", "deviceclasses.v1.resource.k8s.io", *names, "--ignore-not-found")
        for s in json.loads(lab.kubectl("get", "resourceslices.v1.resource.k8s.io", "-o", "json",
                                        f"--field-selector=spec.driver={GPU_DRIVER}"))["items"]:
            lab.kubectl("delete", "resourceslices.v1.resource.k8s.io", s["metadata"]["name"], "--wait=false")
