"""The DRA ResourceSlices of this node (tenantnet/kube/slices.py): the devices and attributes of
the lab's simulated 8-GPU / 8-NIC server, held VFs left out, GPU i and NIC i on one PCIe root
(and the pairs on different ones); the publisher against a fake API: slices of at most 128
devices, the pool's generation raised on change only, stale slices deleted, no write when
nothing differs (also for a new agent taking over), retries after API failures, and the
packaged DeviceClasses' shape."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.kube import slices
from tenantnet.lab.nicsysfs import connectx_pf, write_tree
from tenantnet.lab.pcitree import hgx_8x8
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.system.pcitree import PcieTree
from tests.polling import poll

CLASSES = Path(__file__).resolve().parents[2] / "packaging" / "dra" / "deviceclasses.yaml"
NODE = "gpu-node-1"


@pytest.fixture(scope="module")
def hgx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hgx-slices")
    hgx_8x8(vfs=2).write(root)
    return root


def legacy(pf_netdev: str, pf_address: str) -> str | None:
    return "legacy"


def string(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"][name]
    (only,) = value.values()
    return only


# -- devices --------------------------------------------------------------------------------------


def test_the_8x8_server_offers_every_vf_with_its_place(hgx: Path) -> None:
    devices = slices.node_devices(NodeConfig(sysfs_root=str(hgx)), frozenset(), eswitch_mode=legacy)
    assert len(devices) == 16  # 8 NICs × 2 VFs
    assert [d["name"] for d in devices] == sorted(d["name"] for d in devices)
    first = devices[0]
    assert first == {"name": "vf-0000-14-00-2", "attributes": {
        "eswitchMode": {"string": "legacy"},
        "k8s.cni.cncf.io/deviceID": {"string": "0000:14:00.2"},
        "numaNode": {"int": 0},
        "pf": {"string": "lr0"},
        "pfPciAddress": {"string": "0000:14:00.0"},
        "rail": {"string": "rail-0"},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "resource.kubernetes.io/pciBusID": {"string": "0000:14:00.2"},
        "resource.kubernetes.io/pcieRoot": {"string": slices.pcie_root(str(hgx), "0000:14:00.0")},
    }}
    for d in devices:
        bdf = string(d, slices.PCI_BUS_ID)
        assert d["name"] == "vf-" + bdf.replace(":", "-").replace(".", "-")
        assert string(d, slices.MULTUS_DEVICE_ID) == bdf
        assert len(d["name"]) <= 63 and d["name"].replace("-", "").isalnum()
        assert len(d["attributes"]) <= 32  # the API's limit per device
    rails = {string(d, "pf"): string(d, "rail") for d in devices}
    assert rails == {f"lr{i}": f"rail-{i}" for i in range(8)}
    numa = {string(d, "pf"): string(d, "numaNode") for d in devices}
    assert numa == {f"lr{i}": 0 if i < 4 else 1 for i in range(8)}


def test_vfs_the_cni_path_holds_are_not_offered(hgx: Path) -> None:
    node = NodeConfig(sysfs_root=str(hgx))
    every = {string(d, slices.PCI_BUS_ID) for d in slices.node_devices(node, frozenset(), eswitch_mode=legacy)}
    held = frozenset({"0000:14:00.2", "0000:c4:00.3"})
    left = {string(d, slices.PCI_BUS_ID) for d in slices.node_devices(node, held, eswitch_mode=legacy)}
    assert held <= every and left == every - held


def test_gpu_i_and_nic_i_share_a_pcie_root_and_the_pairs_do_not(hgx: Path) -> None:
    """What lets the kube-scheduler pair GPU i with NIC i's VF by `matchAttribute:
    resource.kubernetes.io/pcieRoot` and nothing else: one root complex per GPU/NIC switch."""
    devices = slices.node_devices(NodeConfig(sysfs_root=str(hgx)), frozenset(), eswitch_mode=legacy)
    nic_roots = {string(d, "rail"): string(d, slices.PCIE_ROOT) for d in devices}
    gpus = sorted(g.address for g in PcieTree(str(hgx)).gpus())
    gpu_roots = {f"rail-{i}": slices.pcie_root(str(hgx), g) for i, g in enumerate(gpus)}
    assert gpu_roots == nic_roots
    assert len(set(gpu_roots.values())) == 8
    assert all(r is not None and r.startswith("pci0000:") for r in gpu_roots.values())


def test_pcie_root_is_the_host_bridge_and_none_for_no_device(hgx: Path) -> None:
    vf = "0000:14:00.3"
    assert slices.pcie_root(str(hgx), vf) == slices.pcie_root(str(hgx), "0000:14:00.0")  # a VF sits at its PF
    assert slices.pcie_root(str(hgx), vf) == PcieTree(str(hgx)).position(vf).host_bridge
    assert slices.pcie_root(str(hgx), "0000:ee:00.0") is None
    assert slices.pcie_root(str(hgx), "not-an-address") is None


def test_a_nic_without_gpus_is_no_rail_and_the_eswitch_mode_is_left_out_when_unknown(tmp_path: Path) -> None:
    write_tree(tmp_path, [connectx_pf("lpf0", vfs=2, bus="3b"), connectx_pf("lpf1", vfs=1, bus="5e")])
    modes = {"lpf0": "switchdev", "lpf1": None}
    devices = slices.node_devices(NodeConfig(sysfs_root=str(tmp_path)), frozenset(),
                                  eswitch_mode=lambda netdev, address: modes[netdev])
    assert [d["name"] for d in devices] == ["vf-0000-3b-00-2", "vf-0000-3b-00-3", "vf-0000-5e-00-2"]
    assert all("rail" not in d["attributes"] for d in devices)
    assert [d["attributes"].get("eswitchMode") for d in devices] == [{"string": "switchdev"}] * 2 + [None]
    assert {string(d, "pf") for d in devices} == {"lpf0", "lpf1"}


def test_device_name_refuses_what_is_no_pci_address() -> None:
    assert slices.device_name("1b:00.2") == "vf-0000-1b-00-2"
    with pytest.raises(ValueError, match="not a PCI address"):
        slices.device_name("eth0")


# -- the publisher ---------------------------------------------------------------------------------


class FakeApi:
    """The API server's part the publisher uses: slices by name with resourceVersions, a
    Node's uid, writes counted, and failures on demand."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.writes: list[tuple[str, str]] = []
        self.fail = 0  # the next this-many calls raise
        self.lock = threading.Lock()

    def _maybe_fail(self) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise ConnectionError("API server unreachable (simulated)")

    def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        with self.lock:
            self._maybe_fail()
            return [copy.deepcopy(o) for o in self.objects.values()
                    if o["spec"]["nodeName"] == node_name and o["spec"]["driver"] == driver]

    def _store(self, body: dict[str, Any]) -> None:
        self.version += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.version)
        self.objects[body["metadata"]["name"]] = body

    def create_slice(self, body: dict[str, Any]) -> None:
        with self.lock:
            self._maybe_fail()
            assert body["metadata"]["name"] not in self.objects, "AlreadyExists"
            self._store(body)
            self.writes.append(("create", body["metadata"]["name"]))

    def replace_slice(self, body: dict[str, Any]) -> None:
        with self.lock:
            self._maybe_fail()
            have = self.objects[body["metadata"]["name"]]
            assert body["metadata"].get("resourceVersion") == have["metadata"]["resourceVersion"], "Conflict"
            self._store(body)
            self.writes.append(("replace", body["metadata"]["name"]))

    def delete_slice(self, name: str) -> None:
        with self.lock:
            self._maybe_fail()
            del self.objects[name]
            self.writes.append(("delete", name))

    def node_uid(self, node_name: str) -> str:
        with self.lock:
            self._maybe_fail()
            return f"uid-of-{node_name}"

    def pool(self) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(self.objects[n]) for n in sorted(self.objects)]


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))

    warning = info


def fake_devices(n: int, prefix: str = "0000:3b") -> list[dict[str, Any]]:
    return [{"name": f"vf-{i:04d}", "attributes": {slices.PCI_BUS_ID: {"string": f"{prefix}:{i % 32:02x}.{i % 8}"}}}
            for i in range(n)]


def publisher(api: FakeApi, devices: list[dict[str, Any]] | None = None) -> tuple[slices.SlicePublisher, list]:
    box = [devices if devices is not None else fake_devices(3)]
    pub = slices.SlicePublisher(api, slices.DRIVER, NODE, lambda: box[0], Log(), interval=3600)
    pub.backoff_first = pub.backoff_max = 0.01
    pub.coalesce = 0
    return pub, box


def published_devices(api: FakeApi) -> list[str]:
    return [d["name"] for s in api.pool() for d in s["spec"]["devices"]]


def test_first_pass_creates_the_pool_owned_by_the_node() -> None:
    api = FakeApi()
    pub, _ = publisher(api)
    assert pub.sync() is True
    (only,) = api.pool()
    assert only["apiVersion"] == "resource.k8s.io/v1" and only["kind"] == "ResourceSlice"
    assert only["metadata"]["name"] == f"{NODE}-tenantnet.io-0"
    assert only["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": f"uid-of-{NODE}", "controller": True}]
    spec = only["spec"]
    assert spec["driver"] == "tenantnet.io" and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["vf-0000", "vf-0001", "vf-0002"]
    assert pub.report()["generation"] == 1 and pub.report()["devices"] == 3


def test_no_write_when_nothing_changed_also_for_the_next_agent() -> None:
    api = FakeApi()
    pub, _ = publisher(api)
    pub.sync()
    before = len(api.writes)
    assert pub.sync() is False and pub.sync() is False
    successor, _ = publisher(api)  # an agent restarted: fresh state, the same slices in the API
    assert successor.sync() is False
    assert len(api.writes) == before
    assert successor.report()["generation"] == 1


def test_generation_rises_on_change_only() -> None:
    api = FakeApi()
    pub, box = publisher(api)
    pub.sync()
    box[0] = fake_devices(2)  # a VF taken by the CNI path
    assert pub.sync() is True
    assert [s["spec"]["pool"]["generation"] for s in api.pool()] == [2]
    assert published_devices(api) == ["vf-0000", "vf-0001"]
    assert pub.sync() is False
    box[0] = [dict(d, attributes={**d["attributes"], "eswitchMode": {"string": "switchdev"}})
              for d in fake_devices(2)]  # the same devices, an attribute changed
    assert pub.sync() is True
    assert [s["spec"]["pool"]["generation"] for s in api.pool()] == [3]


def test_more_than_128_devices_split_into_slices_of_one_pool() -> None:
    api = FakeApi()
    pub, box = publisher(api, fake_devices(300))
    pub.sync()
    pool = api.pool()
    assert [len(s["spec"]["devices"]) for s in pool] == [128, 128, 44]
    assert {s["spec"]["pool"]["name"] for s in pool} == {NODE}
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in pool] == [3, 3, 3]
    assert {s["spec"]["pool"]["generation"] for s in pool} == {1}
    assert published_devices(api) == [f"vf-{i:04d}" for i in range(300)]
    box[0] = fake_devices(10)
    pub.sync()
    (only,) = api.pool()
    assert only["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
    assert sorted(w for w in api.writes if w[0] == "delete") == [
        ("delete", f"{NODE}-tenantnet.io-1"), ("delete", f"{NODE}-tenantnet.io-2")]


def test_stale_slices_of_this_node_and_driver_are_deleted_others_kept() -> None:
    api = FakeApi()
    old = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
           "metadata": {"name": f"{NODE}-tenantnet.io-x7k2p"},
           "spec": {"driver": "tenantnet.io", "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 5, "resourceSliceCount": 1}, "devices": []}}
    other_node = copy.deepcopy(old)
    other_node["metadata"]["name"] = "node-2-tenantnet.io-0"
    other_node["spec"]["nodeName"] = "node-2"
    other_driver = copy.deepcopy(old)
    other_driver["metadata"]["name"] = f"{NODE}-gpu.example.com-0"
    other_driver["spec"]["driver"] = "gpu.example.com"
    for body in (old, other_node, other_driver):
        api._store(body)
    pub, _ = publisher(api)
    pub.sync()
    assert sorted(api.objects) == [f"{NODE}-gpu.example.com-0", f"{NODE}-tenantnet.io-0", "node-2-tenantnet.io-0"]
    # The pool's generation goes on from the highest seen: consumers keep the newest.
    assert api.objects[f"{NODE}-tenantnet.io-0"]["spec"]["pool"]["generation"] == 6


def test_an_empty_node_publishes_one_empty_slice() -> None:
    api = FakeApi()
    pub, _ = publisher(api, [])
    pub.sync()
    (only,) = api.pool()
    assert only["spec"]["devices"] == [] and only["spec"]["pool"]["resourceSliceCount"] == 1


def test_a_slice_edited_by_someone_else_is_put_back() -> None:
    api = FakeApi()
    pub, _ = publisher(api)
    pub.sync()
    api.objects[f"{NODE}-tenantnet.io-0"]["spec"]["devices"].pop()
    assert pub.sync() is True
    assert published_devices(api) == ["vf-0000", "vf-0001", "vf-0002"]


def test_duplicate_device_names_are_refused() -> None:
    api = FakeApi()
    pub, _ = publisher(api, fake_devices(2) + fake_devices(1))
    with pytest.raises(ValueError, match="vf-0000"):
        pub.sync()
    assert api.writes == []


def test_api_failures_are_retried_and_the_wanted_state_reached() -> None:
    api = FakeApi()
    api.fail = 5
    pub, box = publisher(api)
    pub.start()
    try:
        assert poll(lambda: published_devices(api) == ["vf-0000", "vf-0001", "vf-0002"], timeout=30)
        report = pub.report()
        assert report["failures"] == 5 and report["lastError"] is None and report["generation"] == 1
        # A change while the API is away again: refresh() asks, the retries carry it through.
        api.fail = 3
        box[0] = fake_devices(1)
        pub.refresh()
        assert poll(lambda: published_devices(api) == ["vf-0000"], timeout=30)
        assert poll(lambda: pub.report()["failures"] == 8, timeout=30)
        assert {s["spec"]["pool"]["generation"] for s in api.pool()} == {2}
    finally:
        pub.stop()


def test_a_failure_midway_leaves_a_pool_the_next_pass_completes() -> None:
    api = FakeApi()
    pub, box = publisher(api, fake_devices(300))
    pub.sync()
    box[0] = fake_devices(200)
    api.fail = 0
    calls = {"n": 0}
    real = api.replace_slice

    def second_replace_fails(body: dict[str, Any]) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("connection reset (simulated)")
        real(body)

    api.replace_slice = second_replace_fails  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        pub.sync()
    assert pub.sync() is True
    pool = api.pool()
    assert published_devices(api) == [f"vf-{i:04d}" for i in range(200)]
    assert {s["spec"]["pool"]["generation"] for s in pool} == {3}  # past the half-written 2
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in pool] == [2, 2]


def test_refresh_wakes_the_publisher_and_stop_leaves_the_slices() -> None:
    api = FakeApi()
    pub, box = publisher(api)
    pub.start()
    try:
        assert poll(lambda: len(published_devices(api)) == 3, timeout=30)
        box[0] = fake_devices(5)
        pub.refresh()  # interval is an hour: only refresh() can bring this pass
        assert poll(lambda: len(published_devices(api)) == 5, timeout=30)
    finally:
        pub.stop()
    assert len(published_devices(api)) == 5
    assert not pub._thread or not pub._thread.is_alive()


def test_long_node_names_still_give_valid_slice_names() -> None:
    base = slices.slice_base_name("n" * 253, "tenantnet.io")
    assert len(base) + len("-999") <= 253
    assert base != slices.slice_base_name("n" * 252 + "m", "tenantnet.io")


# -- the packaged DeviceClasses --------------------------------------------------------------------


def test_packaged_device_classes() -> None:
    docs = list(yaml.safe_load_all(CLASSES.read_text()))
    assert [d["metadata"]["name"] for d in docs] == ["vf.tenantnet.io", "rail.tenantnet.io",
                                                      "switchdev-vf.tenantnet.io"]
    for d in docs:
        assert d["apiVersion"] == "resource.k8s.io/v1" and d["kind"] == "DeviceClass"
        (selector,) = d["spec"]["selectors"]
        expression = selector["cel"]["expression"]
        # The driver first: a selector reading an attribute another driver's device lacks
        # would abort the allocation.
        assert expression.startswith('device.driver == "tenantnet.io"')
        assert expression.count("(") == expression.count(")")
    by_name = {d["metadata"]["name"]: d["spec"]["selectors"][0]["cel"]["expression"] for d in docs}
    assert 'has(device.attributes["tenantnet.io"].rail)' in by_name["rail.tenantnet.io"]
    assert ('has(device.attributes["tenantnet.io"].eswitchMode)' in by_name["switchdev-vf.tenantnet.io"]
            and '.eswitchMode == "switchdev"' in by_name["switchdev-vf.tenantnet.io"])
    # The commented example of a class carrying a network is itself a valid DeviceClass.
    example = "\n".join(line[4:] for line in CLASSES.read_text().splitlines() if line.startswith("#   "))
    carried = yaml.safe_load(example[example.index("apiVersion:"):])
    assert carried["kind"] == "DeviceClass"
    assert carried["spec"]["config"] == [{"opaque": {"driver": "tenantnet.io",
                                                     "parameters": {"network": "blue-rails"}}}]


def test_labels_a_subclass_sets_are_compared_too() -> None:
    class Labelled(slices.SlicePublisher):
        def wanted(self, devices: list[dict[str, Any]], generation: int, uid: str) -> list[dict[str, Any]]:
            out = super().wanted(devices, generation, uid)
            for s in out:
                s["metadata"]["labels"] = {"example.com/simulated": "true"}
            return out

    api = FakeApi()
    plain, _ = publisher(api)
    plain.sync()
    labelled = Labelled(api, slices.DRIVER, NODE, lambda: fake_devices(3), Log())
    assert labelled.sync() is True  # the label was missing
    assert api.pool()[0]["metadata"]["labels"] == {"example.com/simulated": "true"}
    api.objects[f"{NODE}-tenantnet.io-0"]["metadata"]["labels"]["someone.else/mark"] = "x"
    assert labelled.sync() is False  # others' labels are no reason to write
