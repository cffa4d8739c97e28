"""`tenantnetctl doctor`'s overlay checks on the OVN lab (tenantnet/lab/ovn.py, a simulation:
a node is a network namespace with its own OVS, userspace datapath, and one ovn-controller per
rail). Run inside the node's namespace, as the DaemonSet's doctor runs on its node: the
northbound database and both rails' chassis PASS — integration bridge, the chassis keys
(plain for rail0, `-<chassis>` for rail1), the encap IP on the node's own br-rail<r>, the
underlay MTU against br-rail<r>'s interfaces, the netdev datapath. Then a copy of the node
config with rail1's integration bridge misnamed FAILs naming it, and an underlayMtu larger
than the rail's interfaces WARNs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.lab import ovn

pytestmark = pytest.mark.usefixtures("ovn_installed")

CTL = str(Path(sys.executable).parent / "tenantnetctl")
RAIL_CHECKS = ("bridge", "chassis", "encap IP", "underlay MTU", "datapath")


@pytest.fixture(scope="module")
def lab() -> Iterator[ovn.OvnLab]:
    root = tempfile.mkdtemp(prefix="tn-doctor-ovn-")
    try:
        yield ovn.up(root, nodes=1, rails=2)
    finally:
        ovn.down(root)
        shutil.rmtree(root, ignore_errors=True)


def doctor_in_node(node: ovn.OvnNode, tmp_path: Path, node_config: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """The doctor's JSON report, run inside the node's namespace; empty CNI dirs of its own,
    no kubeconfig (HOME is tmp_path)."""
    for d in ("net.d", "bin"):
        (tmp_path / d).mkdir(exist_ok=True)
    cmd = ovn.in_node(node, [CTL, "doctor", "--node-config", node_config, "--json",
                             "--cni-conf-dir", str(tmp_path / "net.d"), "--cni-bin-dir", str(tmp_path / "bin")])
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path)})
    assert run.stderr == "", run.stderr
    return run.returncode, {c["name"]: c for c in json.loads(run.stdout)["checks"]}


def test_overlay_checks_pass_on_the_lab_node_and_a_wrong_integration_bridge_fails(
        lab: ovn.OvnLab, tmp_path: Path) -> None:
    node = lab.nodes[0]
    _, checks = doctor_in_node(node, tmp_path, node.node_config)
    names = ["OVN northbound", *(f"rail {r.name} {c}" for r in node.rails for c in RAIL_CHECKS)]
    assert {n: checks[n]["status"] for n in names} == dict.fromkeys(names, "PASS"), \
        {n: checks[n] for n in names if checks[n]["status"] != "PASS"}
    rail0, rail1 = node.rails[0], node.rails[1]
    assert checks["rail rail0 chassis"]["detail"].startswith(
        f"chassis {rail0.chassis}: ovn-bridge=br-int, ovn-encap-ip={rail0.encap_ip}")
    assert f"ovn-bridge-{rail1.chassis}={rail1.integration_bridge}" in checks["rail rail1 chassis"]["detail"]
    assert checks["rail rail1 encap IP"]["detail"] == f"{rail1.encap_ip} on {rail1.underlay_bridge} (this node's)"

    # A copy of the node config naming a bridge that is not rail1's, and an underlay MTU the
    # lab's rail0 (veths of MTU 1500) cannot carry.
    config = yaml.safe_load(Path(node.node_config).read_text())
    config["ovn"]["rails"]["rail1"]["integrationBridge"] = "br-wrong"
    config["ovn"]["rails"]["rail0"]["underlayMtu"] = 9000
    broken = tmp_path / "node.yaml"
    broken.write_text(yaml.safe_dump(config))
    code, checks = doctor_in_node(node, tmp_path, str(broken))
    bridge, chassis = checks["rail rail1 bridge"], checks["rail rail1 chassis"]
    assert bridge["status"] == "FAIL" and "br-wrong" in bridge["detail"], bridge
    assert "add-br br-wrong" in bridge["fix"]
    assert chassis["status"] == "FAIL", chassis
    assert f"uses {rail1.integration_bridge}" in chassis["detail"] and "br-wrong" in chassis["detail"]
    mtu = checks["rail rail0 underlay MTU"]
    assert mtu["status"] == "WARN" and "underlayMtu 9000 is larger than" in mtu["detail"], mtu
    assert mtu["fix"].startswith("set ovn.rails.rail0.underlayMtu to 1500 (pods then get 1442)")
    assert checks["rail rail0 chassis"]["status"] == "PASS"
    assert code == 1
