"""The multi-node lab (a simulation): three nodes, each its own OVS and node config, joined by
a trunk top-of-rack switch, one etcd. Tenant A's pods on two nodes reach each other across
the underlay; tenant B on the same rail (another VLAN) is unreachable; addresses come from
one pool without a duplicate; `lab down` leaves nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import cluster
from tests.atonce import at_once

pytestmark = pytest.mark.root
PLUGIN = str(Path(sys.executable).parent / "tenantnet")


def nad(name: str, vlan: int, lo: str, hi: str) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": name, "type": "tenantnet", "bridge": "br-lab", "vlan": vlan,
            "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28, "releaseAfter": 0},
                     "ranges": [[{"subnet": "10.96.0.0/24", "rangeStart": lo, "rangeEnd": hi}]]}}


TENANT_A = nad("tenant-a", 100, "10.96.0.10", "10.96.0.99")
TENANT_B = nad("tenant-b", 200, "10.96.0.100", "10.96.0.199")


@pytest.fixture(scope="module")
def lab3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One three-node lab for the module: each test removes the pods it made (and the first
    checks that every block went back), and the last, test_lab_down_leaves_nothing, takes it
    down and checks what is left — a bring-up and a `down` (~16 s: four OVS, etcd) each
    fewer than a lab per test. The `down` here finds nothing when that test ran."""
    root = str(tmp_path_factory.mktemp("cluster") / "lab")
    meta = cluster.up(root, 3)
    meta["root"] = root
    try:
        yield meta
    finally:
        cluster.down(root)


class Pods:
    def __init__(self) -> None:
        self.made: list[tuple[dict[str, Any], str, str, dict[str, Any]]] = []

    def call(self, node: dict[str, Any], verb: str, ns: str, cid: str, conf: dict[str, Any]) -> Any:
        env = {"PATH": os.environ["PATH"], "TENANTNET_CONFIG": node["node_config"], "CNI_COMMAND": verb,
               "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{ns}" if ns else "", "CNI_IFNAME": "net1",
               "CNI_PATH": f"{Path(PLUGIN).parent}:/usr/lib/cni"}
        return subprocess.run([PLUGIN], input=json.dumps(conf).encode(), env=env, capture_output=True, timeout=60)

    def attach(self, node: dict[str, Any], conf: dict[str, Any]) -> tuple[str, str]:
        ns, cid = f"tcl{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        subprocess.run(["ip", "netns", "add", ns], check=True)
        self.made.append((node, ns, cid, conf))
        proc = self.call(node, "ADD", ns, cid, conf)
        assert proc.returncode == 0, proc.stdout
        return ns, json.loads(proc.stdout)["ips"][0]["address"].split("/")[0]

    def remove_all(self) -> None:
        for node, ns, cid, conf in reversed(self.made):
            assert self.call(node, "DEL", ns, cid, conf).returncode == 0
            subprocess.run(["ip", "netns", "delete", ns], check=False)
        self.made.clear()


def reaches(ns: str, address: str) -> bool:
    return subprocess.run(["ip", "netns", "exec", ns, "ping", "-c", "2", "-W", "1", address],
                          capture_output=True).returncode == 0


def test_tenants_across_nodes(lab3: dict[str, Any], tmp_path: Path) -> None:
    node1, node2, node3 = lab3["nodes"]
    pods = Pods()
    try:
        a1, ip_a1 = pods.attach(node1, TENANT_A)
        a2, ip_a2 = pods.attach(node2, TENANT_A)
        _, ip_a3 = pods.attach(node3, TENANT_A)
        b2, ip_b2 = pods.attach(node2, TENANT_B)
        addresses = [ip_a1, ip_a2, ip_a3, ip_b2]
        assert len(set(addresses)) == 4, addresses  # one pool per network across the nodes
        # at once: the two that must fail each wait out their deadline
        a1a2, a2a3, a1b2, b2a2 = at_once(lambda: reaches(a1, ip_a2), lambda: reaches(a2, ip_a3),
                                         lambda: reaches(a1, ip_b2), lambda: reaches(b2, ip_a2))
        assert a1a2 and a2a3  # tenant A across the underlay
        assert not a1b2 and not b2a2  # tenant B's VLAN is another rail
        nodes = json.loads(subprocess.run(
            [sys.executable, "-m", "tenantnet.ops.ctl", "--node-config", node1["node_config"], "ipam", "nodes",
             "--json"], capture_output=True, text=True, check=True).stdout)
        assert {n["name"] for n in nodes} == {"node1", "node2", "node3"}  # each owns blocks
    finally:
        pods.remove_all()
    # Every DEL returned its node's empty blocks (releaseAfter 0).
    from ipam import nodes as ipam_nodes
    from ipam.etcd import Etcd, EtcdConfig

    assert ipam_nodes.blocks_by_node(Etcd(EtcdConfig((lab3["etcd"],))), cluster.ETCD_PREFIX) == {}


NAD_YAML = """
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: rail-0, namespace: ml}
spec:
  config: '{"cniVersion": "1.0.0", "type": "tenantnet", "bridge": "br-lab", "vlan": 100,
            "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28, "releaseAfter": 0},
                     "ranges": [[{"subnet": "10.97.0.0/24"}]]}}'
"""
POD_YAML = """
apiVersion: v1
kind: Pod
metadata:
  name: trainer-NAME
  namespace: ml
  annotations: {k8s.v1.cni.cncf.io/networks: rail-0}
"""


def test_pods_placed_on_nodes_with_pod_up_node(lab3: dict[str, Any], tmp_path: Path) -> None:
    nad = tmp_path / "nad.yaml"
    nad.write_text(NAD_YAML)
    root = str(Path(lab3["nodes"][0]["root"]).parent)

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tenantnet.ops.ctl", *args], capture_output=True, text=True,
                              timeout=60)

    pods = []
    for name in ("node1", "node3"):
        pod = tmp_path / f"{name}.yaml"
        pod.write_text(POD_YAML.replace("NAME", name))
        up = ctl("pod", "up", str(pod), "--nad", str(nad), "--node", name, "--lab-dir", root)
        assert up.returncode == 0, up.stderr
        pods.append((pod, name, json.loads(up.stdout)))
    try:
        ips = [status[-1]["ips"][0] for _, _, status in pods]  # Multus's network-status
        assert len(set(ips)) == 2
        unknown = ctl("pod", "up", str(pods[0][0]), "--nad", str(nad), "--node", "node9", "--lab-dir", root)
        assert unknown.returncode == 2 and "has no node 'node9'" in unknown.stderr
    finally:
        for pod, name, _ in pods:
            assert ctl("pod", "down", str(pod), "--node", name, "--lab-dir", root).returncode == 0


def test_lab_down_leaves_nothing(lab3: dict[str, Any]) -> None:
    """Last in the module: takes down the module's lab, after the tests above used it."""
    root = lab3["root"]
    assert os.path.isdir(root)
    pid = int((Path(root) / "etcd" / "etcd.pid").read_text())
    os.kill(pid, 0)  # etcd runs (the check below must be able to fail)
    uplinks = [n["uplink"] for n in lab3["nodes"]]
    assert uplinks and all(os.path.exists(f"/sys/class/net/{u}") for u in uplinks)
    cluster.down(root)
    assert not os.path.exists(root)
    assert not any(os.path.exists(f"/sys/class/net/{u}") for u in uplinks)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
