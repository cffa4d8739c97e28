"""tenantnet's DRA ResourceSlices and DeviceClasses against the lab's real API server
(Kubernetes v1.36, resource.k8s.io/v1): the packaged DeviceClasses are accepted (their CEL
compiled by the server), the publisher's slices of the simulated 8-GPU server are accepted
through lightkube as the lab's admin, read back equal (a second pass writes nothing: the
comparison survives the server's round trip), split over 128 devices, and shrunk with the
generation raised and the extra slices deleted.

The slices here are published under a driver name of this test's own (not `tenantnet.io`), so
an agent of the lab publishing `tenantnet.io` slices for the same node is not disturbed; they
and the DeviceClasses are deleted at the end, also on failure. Fails (never skips) without the
Kubernetes binaries, as tests/e2e/test_kube_lab.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.kube import slices
from tenantnet.lab import kube
from tenantnet.lab.pcitree import hgx_8x8
from tenantnet.plugin.nodeconfig import NodeConfig
from tests.e2e.test_kube_lab import Lab, klab  # noqa: F401  (the session's lab, tests/e2e/conftest.py)

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
