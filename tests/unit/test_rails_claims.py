"""`tenantnetctl rails --claims` (tenantnet/ops/railsctl.py): the GPU↔rail pairs the scheduler
made through DRA, on the lab's simulated 8-GPU / 8-NIC server (hgx_8x8: GPU i and NIC i share
PCIe switch i below host bridge i; other pairs of a socket NODE, across sockets SYS).

The slices' devices come from the producers themselves (`tenantnet.kube.slices.node_devices`
for tenantnet.io, `tenantnet.lab.gpudra.device` for the simulated GPUs), wrapped in
ResourceSlice objects; the claims are written by hand as resource.k8s.io/v1 returns them."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tenantnet.kube.slices import PCIE_ROOT, node_devices, pcie_root
from tenantnet.lab import gpudra
from tenantnet.lab.pcitree import hgx_8x8
from tenantnet.ops import ctl, railsctl
from tenantnet.plugin.draclaims import ClaimDevice, ClaimRecord, ClaimStore
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.system.pcitree import PcieTree

NODE = "gpu-node-1"
UID = "3c1d5a8e-7b2f-4e0a-9c4d-1a2b3c4d5e6f"
OTHER_UID = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
GPU_DRIVER = gpudra.DRIVER
NUMA = "resource.kubernetes.io/numaNode"


@pytest.fixture(scope="module")
def sysfs(tmp_path_factory: Any) -> str:
    root = tmp_path_factory.mktemp("hgx") / "sys"
    hgx_8x8(vfs=2).write(root)
    return str(root)


def gpu_pci(i: int) -> str:
    return f"0000:{(0x10, 0x20, 0x30, 0x40, 0x90, 0xA0, 0xB0, 0xC0)[i] + 3:02x}:00.0"


def rail_device(nic: int, vf: int = 0) -> str:
    """The tenantnet.io device of NIC `nic`'s VF `vf` (hgx_8x8: the NIC on bus B+4, VFs from .2)."""
    bus = (0x10, 0x20, 0x30, 0x40, 0x90, 0xA0, 0xB0, 0xC0)[nic] + 4
    return f"vf-0000-{bus:02x}-00-{2 + vf}"


def slice_of(driver: str, devices: list[dict[str, Any]], generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-{driver}-0", "resourceVersion": "42"},
            "spec": {"driver": driver, "nodeName": NODE, "devices": devices,
                     "pool": {"name": NODE, "generation": generation, "resourceSliceCount": 1}}}


@pytest.fixture(scope="module")
def slices(sysfs: str) -> list[dict[str, Any]]:
    rails = node_devices(NodeConfig(sysfs_root=sysfs), frozenset(), eswitch_mode=lambda *_: None)
    gpus = [gpudra.device(gpudra.SimGpu(f"gpu-{i}", i, g.address, pcie_root(sysfs, g.address),
                                        g.position.numa_node, f"GPU-{i:08d}-0000-0000-0000-000000000000"))
            for i, g in enumerate(sorted(PcieTree(sysfs).gpus(), key=lambda d: d.address))]
    return [slice_of("tenantnet.io", rails), slice_of(GPU_DRIVER, gpus)]


def claim(pairs: list[tuple[int, str]], *, uid: str = UID, name: str = "trainer-rails", pool: str = NODE,
          constrained: bool = True, extra_rails: list[str] = (), match: str = PCIE_ROOT) -> dict[str, Any]:
    """A claim of GPU i with rail device d for each (i, d), one constraint per pair, as the
    scheduler leaves it allocated and reserved for pod `trainer`; `extra_rails`: rail devices
    whose requests no constraint names."""
    requests, constraints, results = [], [], []
    for i, device in pairs:
        requests += [{"name": f"gpu-{i}", "exactly": {"deviceClassName": GPU_DRIVER, "count": 1}},
                     {"name": f"rail-{i}", "exactly": {"deviceClassName": "tenantnet.io", "count": 1}}]
        if constrained:
            constraints.append({"requests": [f"gpu-{i}", f"rail-{i}"], "matchAttribute": match})
        results += [{"request": f"gpu-{i}", "driver": GPU_DRIVER, "pool": pool, "device": f"gpu-{i}"},
                    {"request": f"rail-{i}", "driver": "tenantnet.io", "pool": pool, "device": device}]
    for j, device in enumerate(extra_rails):
        requests.append({"name": f"spare-{j}", "exactly": {"deviceClassName": "tenantnet.io", "count": 1}})
        results.append({"request": f"spare-{j}", "driver": "tenantnet.io", "pool": pool, "device": device})
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a", "uid": uid, "resourceVersion": "7"},
        "spec": {"devices": {"requests": requests, "constraints": constraints}},
        "status": {
            "allocation": {"devices": {"results": results},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": [pool]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "c0ffee00-0000-4000-8000-000000000001"}],
        },
    }


def test_eight_aligned_pairs_are_all_pix(sysfs: str, slices: list[dict[str, Any]]) -> None:
    [c] = railsctl.dra_pairs([claim([(i, rail_device(i)) for i in range(8)])], slices, NODE, sysfs, {})
    assert c["claim"] == "team-a/trainer-rails" and c["pods"] == ["team-a/trainer"] and c["unpaired"] == []
    assert [p["distance"] for p in c["pairs"]] == ["PIX"] * 8
    for i, p in enumerate(c["pairs"]):
        assert p["gpu"] == {"request": f"gpu-{i}", "driver": GPU_DRIVER, "device": f"gpu-{i}", "pci": gpu_pci(i),
                            "pcieRoot": pcie_root(sysfs, gpu_pci(i))}
        assert p["rail"]["device"] == rail_device(i) and p["rail"]["pf"] == f"lr{i}"
        assert p["rail"]["vf"] == f"{gpu_pci(i)[:5]}{int(gpu_pci(i)[5:7], 16) + 1:02x}:00.2"
        assert p["rail"]["pcieRoot"] == p["gpu"]["pcieRoot"] is not None


def test_swapped_pairs_show_the_distance_sysfs_gives(sysfs: str, slices: list[dict[str, Any]]) -> None:
    """GPU 0 with NIC 1's VF (same socket, other host bridge) and GPU 1 with NIC 4's (the
    other socket). Made as the scheduler would make them if the tenantnet slice published a
    wrong pcieRoot (equal to the GPU's): the distance comes from sysfs, not from the slice."""
    lying = json.loads(json.dumps(slices))
    for d in lying[0]["spec"]["devices"]:
        if d["name"] == rail_device(1):
            d["attributes"][PCIE_ROOT] = {"string": pcie_root(sysfs, gpu_pci(0))}
    [c] = railsctl.dra_pairs([claim([(0, rail_device(1)), (1, rail_device(4)), (2, rail_device(2))])],
                             lying, NODE, sysfs, {})
    assert [(p["gpu"]["device"], p["rail"]["device"], p["distance"]) for p in c["pairs"]] == [
        ("gpu-0", rail_device(1), "NODE"), ("gpu-1", rail_device(4), "SYS"), ("gpu-2", rail_device(2), "PIX")]
    assert c["pairs"][0]["rail"]["pcieRoot"] == c["pairs"][0]["gpu"]["pcieRoot"]  # what the slice said
    assert c["pairs"][1]["rail"]["pcieRoot"] != c["pairs"][1]["gpu"]["pcieRoot"]


def test_a_rail_without_a_pcie_root_constraint_is_unpaired(sysfs: str, slices: list[dict[str, Any]]) -> None:
    c = claim([(0, rail_device(0))], extra_rails=[rail_device(3, 1)])
    numa_only = claim([(5, rail_device(5))], uid=OTHER_UID, name="numa-only", match=NUMA)
    [first, second] = railsctl.dra_pairs([numa_only, c], slices, NODE, sysfs, {})
    assert first["claim"] == "team-a/numa-only" and second["claim"] == "team-a/trainer-rails"  # sorted
    assert [p["distance"] for p in second["pairs"]] == ["PIX"]
    [spare] = second["unpaired"]
    assert spare["device"] == rail_device(3, 1) and spare["vf"] == "0000:44:00.3" and spare["pf"] == "lr3"
    assert "no request of another driver shares a matchAttribute resource.kubernetes.io/pcieRoot constraint " \
           "with request 'spare-0'" in spare["why"]
    assert first["pairs"] == [] and [u["device"] for u in first["unpaired"]] == [rail_device(5)]


def test_claims_of_other_nodes_and_unallocated_claims_are_ignored(sysfs: str, slices: list[dict[str, Any]]) -> None:
    elsewhere = claim([(0, rail_device(0))], uid=OTHER_UID, name="elsewhere", pool="gpu-node-2")
    pending = claim([(1, rail_device(1))], name="pending")
    del pending["status"]
    gpus_only = claim([(2, rail_device(2))], name="gpus-only")
    gpus_only["status"]["allocation"]["devices"]["results"] = [
        r for r in gpus_only["status"]["allocation"]["devices"]["results"] if r["driver"] == GPU_DRIVER]
    assert railsctl.dra_pairs([elsewhere, pending, gpus_only], slices, NODE, sysfs, {}) == []
    assert len(railsctl.dra_pairs([elsewhere], slices, "gpu-node-2", sysfs, {})) == 1  # that node's view


def test_constraints_without_requests_and_subrequests(sysfs: str, slices: list[dict[str, Any]]) -> None:
    """No `requests`: the constraint binds every request of the claim; a constraint naming `r`
    covers the subrequest `r/s` a prioritized list allocated."""
    c = claim([(6, rail_device(6))])
    c["spec"]["devices"]["constraints"] = [{"matchAttribute": PCIE_ROOT}]
    [got] = railsctl.dra_pairs([c], slices, NODE, sysfs, {})
    assert [(p["gpu"]["device"], p["distance"]) for p in got["pairs"]] == [("gpu-6", "PIX")]

    c = claim([(7, rail_device(7))])
    for r in c["status"]["allocation"]["devices"]["results"]:
        r["request"] += "/fast"
    [got] = railsctl.dra_pairs([c], slices, NODE, sysfs, {})
    assert [(p["gpu"]["request"], p["rail"]["request"], p["distance"]) for p in got["pairs"]] == [
        ("gpu-7/fast", "rail-7/fast", "PIX")]
    c["spec"]["devices"]["constraints"][0]["requests"] = ["gpu-7/slow", "rail-7/fast"]
    [got] = railsctl.dra_pairs([c], slices, NODE, sysfs, {})
    assert got["pairs"] == [] and len(got["unpaired"]) == 1


def test_count_requests_pair_each_gpu_once(sysfs: str, slices: list[dict[str, Any]]) -> None:
    """Requests `gpus` and `rails` of count 2 under one constraint: rails and GPUs 1:1 (a GPU
    not yet paired first), though both rails' nearest GPU is gpu-0."""
    c = claim([])
    c["spec"]["devices"]["constraints"] = [{"requests": ["gpus", "rails"], "matchAttribute": PCIE_ROOT}]
    c["status"]["allocation"]["devices"]["results"] = [
        {"request": "gpus", "driver": GPU_DRIVER, "pool": NODE, "device": "gpu-0"},
        {"request": "gpus", "driver": GPU_DRIVER, "pool": NODE, "device": "gpu-1"},
        {"request": "rails", "driver": "tenantnet.io", "pool": NODE, "device": rail_device(0, 0)},
        {"request": "rails", "driver": "tenantnet.io", "pool": NODE, "device": rail_device(0, 1)}]
    [got] = railsctl.dra_pairs([c], slices, NODE, sysfs, {})
    assert [(p["gpu"]["device"], p["rail"]["device"], p["distance"]) for p in got["pairs"]] == [
        ("gpu-0", rail_device(0, 0), "PIX"), ("gpu-1", rail_device(0, 1), "NODE")]


def test_a_gpu_missing_from_the_slices_pairs_without_a_distance(sysfs: str, slices: list[dict[str, Any]]) -> None:
    [c] = railsctl.dra_pairs([claim([(0, rail_device(0))])], slices[:1], NODE, sysfs, {})
    [p] = c["pairs"]
    assert p["gpu"]["device"] == "gpu-0" and p["gpu"]["pci"] is None and p["distance"] is None
    assert "pciBusID" in p["distanceError"]


# -- the command -------------------------------------------------------------------------------


def node_config(tmp_path: Path, sysfs: str, **extra: Any) -> str:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"stateDir": str(state), "sysfsRoot": sysfs, "nodeName": NODE,
                                "kubernetes": True, **extra}))
    return str(path)


def run(capsys: Any, config: str, *argv: str) -> tuple[int, str, str]:
    args = ctl.build_parser().parse_args(["--node-config", config, "rails", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_shape_with_the_claim_record_s_ifnames(tmp_path: Path, sysfs: str, slices: list[dict[str, Any]],
                                                    capsys: Any, monkeypatch: Any) -> None:
    config = node_config(tmp_path, sysfs)
    ClaimStore(str(tmp_path / "state")).save(ClaimRecord(
        uid=UID, namespace="team-a", name="trainer-rails", network="rail", tenant="a", attach="nri",
        pod_uid="c0ffee00-0000-4000-8000-000000000001", pod_name="trainer",
        devices=[ClaimDevice(request="rail-0", device=rail_device(0), vf="0000:14:00.2", ifname="rail0")]))
    claims = [claim([(0, rail_device(0)), (1, rail_device(4))], extra_rails=[rail_device(2)])]
    seen = []

    def fake_read(node: NodeConfig, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        seen.append((node.sysfs_root, name))
        return claims, slices

    monkeypatch.setattr(railsctl, "read_dra", fake_read)
    code, out, err = run(capsys, config, "--claims", "--json")
    assert (code, err) == (0, "") and seen == [(sysfs, NODE)]
    root0, root1 = pcie_root(sysfs, gpu_pci(0)), pcie_root(sysfs, gpu_pci(1))
    assert json.loads(out) == [{
        "claim": "team-a/trainer-rails", "uid": UID, "pods": ["team-a/trainer"],
        "pairs": [
            {"gpu": {"request": "gpu-0", "driver": GPU_DRIVER, "device": "gpu-0", "pci": gpu_pci(0),
                     "pcieRoot": root0},
             "rail": {"request": "rail-0", "device": rail_device(0), "vf": "0000:14:00.2", "pf": "lr0",
                      "pfPci": "0000:14:00.0", "pcieRoot": root0, "ifname": "rail0"},
             "distance": "PIX"},
            {"gpu": {"request": "gpu-1", "driver": GPU_DRIVER, "device": "gpu-1", "pci": gpu_pci(1),
                     "pcieRoot": root1},
             "rail": {"request": "rail-1", "device": rail_device(4), "vf": "0000:94:00.2", "pf": "lr4",
                      "pfPci": "0000:94:00.0", "pcieRoot": pcie_root(sysfs, "0000:94:00.0"), "ifname": None},
             "distance": "SYS"},
        ],
        "unpaired": [{"request": "spare-0", "device": rail_device(2), "vf": "0000:34:00.2", "pf": "lr2",
                      "pfPci": "0000:34:00.0", "pcieRoot": pcie_root(sysfs, "0000:34:00.0"), "ifname": None,
                      "why": "no request of another driver shares a matchAttribute "
                             "resource.kubernetes.io/pcieRoot constraint with request 'spare-0'"}],
    }]

    code, out, err = run(capsys, config, "--claims")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["CLAIM", "PODS", "GPU", "GPU", "PCI", "RAIL", "VF", "PF", "IFNAME", "PCIE", "ROOT",
                                "DISTANCE"]
    assert lines[1].split() == ["team-a/trainer-rails", "team-a/trainer", f"{GPU_DRIVER}/gpu-0", gpu_pci(0),
                                "0000:14:00.2", "lr0", "rail0", root0, "PIX"]
    assert lines[2].split()[-4:] == [root1, "/", pcie_root(sysfs, "0000:94:00.0"), "SYS"]
    assert lines[3].split() == ["team-a/trainer-rails", "team-a/trainer", "-", "-", "0000:34:00.2", "lr2", "-",
                                pcie_root(sysfs, "0000:34:00.0"), "unpaired"]
    assert "1 claim(s): 1 PIX, 1 SYS, 1 unpaired" in out

    claims.clear()
    assert run(capsys, config, "--claims") == (
        0, "no ResourceClaim has tenantnet.io devices allocated on this node\n", "")
    assert run(capsys, config, "--claims", "--json") == (0, "[]\n", "")


def test_not_in_kubernetes_mode_is_one_line(tmp_path: Path, sysfs: str, capsys: Any) -> None:
    config = node_config(tmp_path, sysfs, kubernetes=False)
    code, out, err = run(capsys, config, "--claims")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith(f"tenantnetctl rails --claims: node config {config}: "
                                                   "kubernetes is not true")


def test_api_unreachable_is_one_line(tmp_path: Path, sysfs: str, capsys: Any) -> None:
    with socket.socket() as s:  # a port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                  "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    code, out, err = run(capsys, node_config(tmp_path, sysfs, kubeconfig=str(kubeconfig)), "--claims", "--json")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith(
        f"tenantnetctl rails --claims: cannot reach the API server (with {kubeconfig}): ConnectError")

    missing = tmp_path / "no-such-kubeconfig"
    code, out, err = run(capsys, node_config(tmp_path, sysfs, kubeconfig=str(missing)), "--claims")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith(f"tenantnetctl rails --claims: cannot use the kubeconfig {missing}: ")


def test_help_documents_the_option(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        ctl.build_parser().parse_args(["rails", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--claims" in out and "matchAttribute resource.kubernetes.io/pcieRoot" in out
