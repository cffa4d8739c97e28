"""`tenantnetctl doctor` on the lab: its private OVS, its simulated SR-IOV NICs (legacy and
switchdev) and a real agent. A healthy lab node's OVS checks PASS; a declared bridge removed
is a FAIL naming it, with the command that makes it again."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tenantnet.lab import node as labmod
from tests.integration.conftest import Lab
from tests.integration.test_agent import agent_node_config, start_agent

CTL = str(Path(sys.executable).parent / "tenantnetctl")


def doctor(node_config: Path, tmp_path: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    """The doctor's report on `node_config`, by check name; no kubeconfig (HOME is tmp_path),
    empty CNI dirs of its own."""
    for d in ("net.d", "bin"):
        (tmp_path / d).mkdir(exist_ok=True)
    run = subprocess.run([CTL, "doctor", "--node-config", str(node_config), "--json",
                          "--cni-conf-dir", str(tmp_path / "net.d"), "--cni-bin-dir", str(tmp_path / "bin")],
                         capture_output=True, text=True, timeout=120, check=False,
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path)})
    assert run.stderr == "", run.stderr
    return run.returncode, {c["name"]: c for c in json.loads(run.stdout)["checks"]}


def with_policy(lab: Lab, path: Path, networks: dict[str, Any], extra: str = "") -> Path:
    path.write_text(lab.node_config.read_text() + extra +
                    "tenancy:\n  networks: " + json.dumps(networks) + "\n  tenants: {}\n")
    return path


def test_healthy_lab_ovs_passes_and_a_removed_bridge_fails_naming_it(lab: Lab, tmp_path: Path) -> None:
    bridge = f"brd{uuid.uuid4().hex[:6]}"
    lab.vsctl("add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev")
    try:
        node = with_policy(lab, tmp_path / "node.yaml", {"doc": {"bridge": bridge}})
        _, checks = doctor(node, tmp_path)
        assert checks[f"OVSDB {lab.ovsdb}"]["status"] == "PASS", checks[f"OVSDB {lab.ovsdb}"]
        assert checks[f"bridge {lab.bridge}"]["status"] == "PASS"  # the lab's prewarmBridges
        assert checks[f"bridge {bridge}"]["status"] == "PASS", checks[f"bridge {bridge}"]
        lab.vsctl("del-br", bridge)
        code, checks = doctor(node, tmp_path)
        c = checks[f"bridge {bridge}"]
        assert c["status"] == "FAIL" and bridge in c["detail"] and "network doc" in c["detail"]
        assert c["fix"] == f"ovs-vsctl --db={lab.ovsdb} add-br {bridge}"
        assert checks[f"bridge {lab.bridge}"]["status"] == "PASS"
        assert code == 1
    finally:
        lab.vsctl("--if-exists", "del-br", bridge)


def test_the_real_agent_passes(lab: Lab, run_dir: Path, agents: list[Any], tmp_path: Path) -> None:
    node = agent_node_config(lab, run_dir)
    _, checks = doctor(node, tmp_path)
    assert checks["agent"]["status"] == "WARN"  # not started yet: in-process
    agents.append(start_agent(node))
    _, checks = doctor(node, tmp_path)
    assert checks["agent"]["status"] == "PASS", checks["agent"]
    assert "(root)" in checks["agent"]["detail"]


def test_simulated_nic_pf_passes_and_legacy_eswitch_fails_for_ovs_offload(nic_lab: Lab, tmp_path: Path) -> None:
    pf = labmod.status(str(nic_lab.root)).nics[0]
    node = with_policy(nic_lab, tmp_path / "node.yaml",
                       {"vf": {"pfs": [pf["pf"]]}, "off": {"bridge": nic_lab.bridge, "pfs": [pf["pf"]]}})
    _, checks = doctor(node, tmp_path)
    c = checks[f"PF {pf['pf']}"]
    assert c["status"] == "PASS" and f"{pf['pfAddress']}, 6 VFs" in c["detail"], c
    e = checks[f"eswitch {pf['pf']}"]
    assert e["status"] == "FAIL" and "legacy" in e["detail"]
    assert e["fix"] == f"devlink dev eswitch set pci/{pf['pfAddress']} mode switchdev"


def test_switchdev_eswitch_passes(switchdev_lab: Lab, tmp_path: Path) -> None:
    pf = labmod.status(str(switchdev_lab.root)).nics[0]
    node = with_policy(switchdev_lab, tmp_path / "node.yaml", {"off": {"bridge": switchdev_lab.bridge,
                                                                       "pfs": [pf["pf"]]}})
    _, checks = doctor(node, tmp_path)
    assert checks[f"eswitch {pf['pf']}"]["status"] == "PASS", checks[f"eswitch {pf['pf']}"]
    assert checks[f"PF {pf['pf']}"]["status"] == "PASS"
