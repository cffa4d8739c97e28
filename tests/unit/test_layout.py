"""What the restructuring added: typed plans that read the records earlier versions wrote,
the VF-control registry, the one reading of the node-config path and agentSocket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cni.errors import CniError
from tenantnet.plugin import modes, nodeconfig, nodepath
from tenantnet.plugin.drivers.ovs import OvsPlan
from tenantnet.plugin.drivers.ovs_offload import OffloadPlan
from tenantnet.plugin.drivers.vf import VfPlan
from tenantnet.plugin.records import AttachmentRecord, Plan
from tenantnet.plugin.system import vfcontrol
from tenantnet.plugin.system.vfstate import VfState

# Plans as the dict-based records of the previous release wrote them.
OLD_SRIOV = {"deviceID": "0000:3b:02.1", "pfAddress": "0000:3b:00.0", "pf": "lpf0", "vfIndex": 1,
             "driver": "mlx5_core", "dpdk": False, "numaNode": 0, "rdma": "mlx5_3",
             "original": {"vf": {"mac": "00:00:00:00:00:00", "vlan": 0, "qos": 0, "proto": "802.1q",
                                 "spoofchk": True, "trust": False, "link_state": "auto",
                                 "min_tx_rate": 0, "max_tx_rate": 0},
                          "netdev": {"name": "lpf0v1", "mac": "02:00:00:00:00:01", "mtu": 1500, "up": False,
                                     "alias": ""}},
             "cniArgs": "K8S_POD_NAME=p", "deviceInfoFile": "/run/devinfo/x.json"}
OLD_OFFLOAD = {**OLD_SRIOV, "representor": "tr1", "bridge": "br-lab", "ovsdb": None, "vlan": 100,
               "trunks": [], "mtu": 9000, "ofportRequest": None,
               "representorOriginal": {"mtu": 1500, "up": False}, "preconditionWarnings": ["w"]}
OLD_OVS = {"hostIfname": "tn0123456789a", "bridge": "br-lab", "ovsdb": "unix:/x/db.sock", "vlan": 100,
           "trunks": [200, 201], "mtu": None, "ofportRequest": 7, "cniArgs": ""}


def _record(mode: str, plan: dict[str, object]) -> str:
    return json.dumps({"format": 1, "network": "n", "container_id": "c" * 64, "ifname": "net1",
                       "mode": mode, "netns": "/run/netns/p", "phase": "ready",
                       "pod": {"namespace": "ns", "name": "p", "uid": ""}, "plan": plan, "conf": {},
                       "result": None, "created": 1.0, "updated": 1.0})


def test_records_of_the_previous_release_load_as_typed_plans() -> None:
    sriov = AttachmentRecord.from_json(_record("sriov", OLD_SRIOV), modes.plan_type).plan
    assert isinstance(sriov, VfPlan) and not isinstance(sriov, OffloadPlan)
    assert (sriov.device_id, sriov.pf, sriov.vf_index, sriov.rdma) == ("0000:3b:02.1", "lpf0", 1, "mlx5_3")
    assert sriov.original is not None and sriov.original.vf == VfState(spoofchk=True, trust=False)
    assert sriov.original.netdev is not None and sriov.original.netdev.name == "lpf0v1"
    assert (sriov.cni_args, sriov.device_info_file) == ("K8S_POD_NAME=p", "/run/devinfo/x.json")
    off = AttachmentRecord.from_json(_record("ovs-offload", OLD_OFFLOAD), modes.plan_type).plan
    assert isinstance(off, OffloadPlan) and off.port_name() == "tr1" and off.vlan == 100
    assert off.representor_original is not None and off.representor_original.mtu == 1500
    ovs = AttachmentRecord.from_json(_record("ovs", OLD_OVS), modes.plan_type).plan
    assert isinstance(ovs, OvsPlan) and ovs.port_name() == "tn0123456789a" and ovs.trunks == [200, 201]
    # Written back, each plan is the same JSON object again (the core's defaults omitted), plus
    # this release's fields at their defaults: the old release never moved an RDMA device
    # (so DEL leaves it alone), paired no GPU and pre-warmed nothing.
    assert sriov.to_dict() == {**OLD_SRIOV, "rdmaIsolated": False, "gpu": None, "gpuDistance": None}
    assert ovs.to_dict() == {**{k: v for k, v in OLD_OVS.items() if k != "cniArgs"}, "prewarm": "",
                             "prewarmRules": 0}


def test_an_unknown_mode_keeps_the_cores_part_and_fails_on_its_mode() -> None:
    rec = AttachmentRecord.from_json(_record("vxlan", {"cniArgs": "A=1", "vni": 5}), modes.plan_type)
    assert type(rec.plan) is Plan and rec.plan.cni_args == "A=1"
    with pytest.raises(CniError) as err:
        modes.for_mode("vxlan", nodeconfig.NodeConfig())
    assert err.value.code == 2 and "available modes: ovs, sriov, ovs-offload" in err.value.msg


def test_vf_control_registry() -> None:
    assert isinstance(vfcontrol.control_for("netlink"), vfcontrol.NetlinkVfControl)
    with pytest.raises(CniError) as err:
        vfcontrol.control_for("nosuch:/x", ())
    assert err.value.code == 7 and "'nosuch'" in err.value.msg and "vfControlModules" in err.value.msg
    # The lab's NIC registers itself when its module is imported (as vfControlModules names it).
    control = vfcontrol.control_for("lab:/nonexistent-lab", ["tenantnet.lab.nic"])
    assert type(control).__module__ == "tenantnet.lab.nic"


@pytest.mark.parametrize("text,needle", [
    ("vfControl: lab\n", "vfControl"),
    ("vfControlModules: [tenantnet.lab.nic, '../x']\n", "vfControlModules"),
    ("vfControlModules: tenantnet.lab.nic\n", "vfControlModules"),
    ("{agentSocket: /run/elsewhere.sock}\n", "agentSocket"),
])
def test_node_config_refusals(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "tenantnet.yaml"
    path.write_text(text)
    with pytest.raises(CniError) as err:
        nodeconfig.load(str(path))
    assert err.value.code == 7 and needle in err.value.msg


def test_node_config_path_from_either_kind_of_environment(tmp_path: Path) -> None:
    assert nodepath.node_config_path(environ={}) == nodepath.DEFAULT_PATH
    assert nodepath.given(environ={"TENANTNET_CONFIG": "/a.yaml"}) == "/a.yaml"
    assert nodepath.given(environ={b"TENANTNET_CONFIG": b"/b.yaml"}) == "/b.yaml"
    assert nodepath.given("/explicit.yaml", {"TENANTNET_CONFIG": "/a.yaml"}) == "/explicit.yaml"
    path = tmp_path / "n.yaml"
    path.write_text("agentSocket: '/run/x/agent.sock'  # the shim reads this line\n")
    assert nodeconfig.load(environ={"TENANTNET_CONFIG": str(path)}).agent_socket == "/run/x/agent.sock"


def test_the_config_accepts_exactly_the_modes_with_a_driver() -> None:
    from tenantnet.plugin import tnconf

    assert modes.MODES == tnconf.MODES
    assert all(modes.driver_class(m).mode == m for m in modes.MODES)
