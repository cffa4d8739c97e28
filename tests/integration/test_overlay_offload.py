"""Mode ovs-offload on an overlay network (issue 29), in the overlay lab (a simulation).

Node 1 of a two-node, two-rail OVN lab (tenantnet/lab/ovn.py) gets the lab's simulated
switchdev NIC (tenantnet/lab/nic.py) built *inside its network namespace*: two PFs, `pf0`
a port of the node's rail-0 underlay bridge `br-rail0`, `pf1` of `br-rail1`, each with two
VFs whose representors are veth peers of the VF netdevs. The node's tenantnet config is the
lab's plus the simulated NIC, and without `defaultRail`, so a network that names no rail
must take the rail from the VF's PF. The real plugin runs inside the node's namespace.

Shown: the representor on the VF's rail's integration bridge with iface-id = the logical
port, bound by that rail's chassis; the pod's VF with the port-security MAC and underlay-58
MTU; traffic over Geneve to a mode-ovs pod on node 2; the offload report counting the
pod's tunnel encap and decap flows and saying it is a simulation; a named rail whose
underlay does not carry the VF's PF refused (7) with nothing left; DEL leaves nothing.

What is not simulated: the PF veth is a port of the rail's underlay bridge, but the lab's
Geneve packets leave through that bridge's own uplink to the rail's ToR, not through the PF;
no flow is in hardware (OVS's userspace datapath).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import ovn
from tests.integration.overlaysupport import Invocation

pytestmark = pytest.mark.root

BIN = Path(sys.executable).parent
PLUGIN = str(BIN / "tenantnet")
CTL = str(BIN / "tenantnetctl")
NETWORK = "ovoff"
SUBNET = "10.88.60.0/24"
POD_MTU = ovn.UNDERLAY_MTU - 58

# The simulated NIC, built in node 1's namespace (veths are made where the process is).
BUILD_NIC = textwrap.dedent("""
    import sys
    from tenantnet.lab.nic import LabNic
    from tenantnet.lab.nicsysfs import connectx_pf
    pfs, reps = [], {}
    for name, bus in (("pf0", "3b"), ("pf1", "5e")):
        pf = connectx_pf(name, vfs=2, bus=bus, rdma=False)
        pf.switch_id = f"{bus}00112233445566"
        reps[name] = {i: f"{name}r{i}" for i in range(2)}
        pfs.append(pf)
    def no_vsctl(*args):
        raise AssertionError(f"a switchdev lab NIC needs no embedded switch: {args}")
    LabNic(sys.argv[1]).create(pfs, no_vsctl, representors=reps)
""")


@dataclass
class OffloadLab:
    lab: ovn.OvnLab
    nic_root: str
    config: str  # node 1's tenantnet config: the lab's + the simulated NIC, no defaultRail

    @property
    def node1(self) -> ovn.OvnNode:
        return self.lab.nodes[0]

    @property
    def node2(self) -> ovn.OvnNode:
        return self.lab.nodes[1]

    def vfs(self) -> dict[str, list[dict[str, Any]]]:
        from tenantnet.lab.nic import LabNic

        return {pf["pf"]: pf["vfs"] for pf in LabNic(self.nic_root).describe()}

    def vf_state(self) -> dict[str, Any]:
        from tenantnet.lab.nic import LabNic

        return {pf: {i: vf["state"] for i, vf in entry["vfs"].items()}
                for pf, entry in LabNic(self.nic_root).read_state()["pfs"].items()}


@pytest.fixture(scope="module")
def olab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OffloadLab]:
    root = str(tmp_path_factory.mktemp("ovoff") / "lab")
    lab = ovn.up(root, nodes=2, rails=2)
    try:
        node = lab.nodes[0]
        nic_root = os.path.join(root, "nic1")
        os.makedirs(nic_root)
        subprocess.run(["ip", "netns", "exec", node.netns, sys.executable, "-c", BUILD_NIC, nic_root],
                       check=True, capture_output=True, text=True, cwd=str(Path(__file__).parents[2]))
        # Each PF is the uplink of its rail's underlay bridge (as `underlayBridge` declares).
        ovn.vsctl(node, "add-port", "br-rail0", "pf0")
        ovn.vsctl(node, "add-port", "br-rail1", "pf1")
        with open(node.node_config) as fh:
            text = "".join(line for line in fh if "defaultRail" not in line)
        config = os.path.join(node.root, "offload.yaml")
        with open(config, "w") as fh:
            fh.write(text + "# the simulated switchdev NIC (tenantnet/lab/nic.py), in this node's namespace\n"
                     f"sysfsRoot: {nic_root}/sys\nvfControl: lab:{nic_root}\n"
                     "vfControlModules: [tenantnet.lab.nic]\n")
        yield OffloadLab(lab, nic_root, config)
    finally:
        ovn.down(root)  # the node namespaces go, and with them every link of the simulated NIC


def overlay_conf(mode: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0", "name": NETWORK, "type": "tenantnet", "mode": mode, "overlay": "geneve",
        "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28},
                 "ranges": [[{"subnet": SUBNET}]]}}
    conf.update(extra)
    return conf


def in_node(node: ovn.OvnNode, config: str, cmd: list[str], stdin: str = "",
            env: dict[str, str] | None = None) -> Invocation:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TENANTNET_CONFIG": config, **(env or {})}
    if os.environ.get("PYTHONPATH"):  # a tree under test other than the installed one
        full["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = subprocess.run(["ip", "netns", "exec", node.netns, "env", *(f"{k}={v}" for k, v in full.items()),
                           *cmd], input=stdin, capture_output=True, text=True, timeout=90, check=False)
    return Invocation(proc.returncode, proc.stdout, proc.stderr)


def cni(command: str, node: ovn.OvnNode, config: str, conf: dict[str, Any], cid: str, netns: str,
        extra_env: dict[str, str] | None = None) -> Invocation:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{netns}",
           "CNI_IFNAME": "net1", "CNI_PATH": str(BIN),
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=tenant;K8S_POD_NAME=p{cid[:6]}", **(extra_env or {})}
    return in_node(node, config, [PLUGIN], json.dumps(conf), env)


def cid_of(name: str) -> str:
    return hashlib.sha256(f"{os.getpid()}/{name}".encode()).hexdigest()


def lsp_of(node: str, cid: str) -> str:
    from tenantnet.plugin.drivers import ovnport

    return ovnport.port_name(node, cid, "net1")


def nb_port(root: str, lsp: str) -> dict[str, Any] | None:
    out = ovn.nbctl(root, "--format=json", "--columns=name,addresses,port_security", "find",
                    "Logical_Switch_Port", f"name={lsp}")
    rows = json.loads(out)["data"]
    if not rows:
        return None
    def strings(cell: Any) -> list[str]:
        return cell[1] if isinstance(cell, list) and cell[0] == "set" else [cell]
    return {"addresses": strings(rows[0][1]), "port_security": strings(rows[0][2])}


def chassis_of(root: str, lsp: str, timeout: float = 10) -> str:
    """The chassis that bound `lsp` (waits until one has)."""
    ovn_uuid = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = json.loads(ovn.sbctl(root, "--format=json", "--columns=chassis", "find", "Port_Binding",
                                    f"logical_port={lsp}"))["data"]
        if rows and rows[0][0] != ["set", []]:
            ovn_uuid = rows[0][0][1]
            break
        time.sleep(0.05)
    assert ovn_uuid, f"{lsp} was not bound within {timeout} s"
    return ovn.sbctl(root, "get", "Chassis", ovn_uuid, "name").strip().strip('"')


def on_ovs(node: ovn.OvnNode, port: str) -> bool:
    return ovn.vsctl(node, "--bare", "--columns=name", "find", "Port", f"name={port}").strip() != ""


def pod_link(netns: str) -> dict[str, Any]:
    out = subprocess.run(["ip", "-n", netns, "-j", "link", "show", "dev", "net1"], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)[0]


def ping(netns: str, ip: str, tries: int = 5) -> bool:
    # The first packets after binding may be lost while ovn-controller installs flows.
    for _ in range(tries):
        if subprocess.run(["ip", "netns", "exec", netns, "ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "2",
                           ip], capture_output=True, timeout=30).returncode == 0:
            return True
    return False


def test_vf_rail_from_its_pf_traffic_report_and_del(olab: OffloadLab) -> None:
    lab, n1, n2 = olab.lab, olab.node1, olab.node2
    vf = olab.vfs()["pf1"][0]  # pf1 is rail 1's NIC on node 1
    state_before = olab.vf_state()
    a_ns, b_ns = ovn.make_pod_netns(lab, n1, "oa"), ovn.make_pod_netns(lab, n2, "ob")
    a_cid, b_cid = cid_of("oa"), cid_of("ob")
    a_conf = overlay_conf("ovs-offload", deviceID=vf["address"])  # no rail: the VF's PF says
    b_conf = overlay_conf("ovs", rail="rail1")
    added_a = added_b = False
    try:
        a = cni("ADD", n1, olab.config, a_conf, a_cid, a_ns)
        assert a.code == 0, (a.stdout, a.stderr)
        added_a = True
        b = cni("ADD", n2, n2.node_config, b_conf, b_cid, b_ns)
        assert b.code == 0, (b.stdout, b.stderr)
        added_b = True
        rep = vf["representor"]
        # the representor on rail 1's integration bridge, bound to this attachment's logical port
        assert ovn.vsctl(n1, "port-to-br", rep).strip() == "br-int-rail1"
        lsp = lsp_of(n1.name, a_cid)
        assert ovn.vsctl(n1, "get", "Interface", rep, "external_ids:iface-id").strip().strip('"') == lsp
        # ... and rail 1's chassis bound it: its tunnel leaves through rail 1
        assert chassis_of(lab.root, lsp) == n1.rails[1].chassis
        # the pod's VF netdev: the MAC port security names, the rail's underlay MTU - 58
        pod = next(i for i in a.result["interfaces"] if i.get("sandbox"))
        a_ip = a.result["ips"][0]["address"].split("/")[0]
        link = pod_link(a_ns)
        assert link["address"] == pod["mac"] and link["mtu"] == POD_MTU
        port = nb_port(lab.root, lsp)
        assert port is not None and port["port_security"] == [f"{pod['mac']} {a_ip}"]
        assert olab.vf_state()["pf1"]["0"]["mac"] == pod["mac"]  # the admin MAC at the PF too

        b_ip = b.result["ips"][0]["address"].split("/")[0]
        assert ping(a_ns, b_ip), "no reply over Geneve from the mode-ovs pod on node 2"

        # the offload report, while the flows are fresh: the pod's tunnel flows, counted and named
        subprocess.run(["ip", "netns", "exec", a_ns, "ping", "-n", "-q", "-c", "5", "-i", "0.1", b_ip],
                       capture_output=True, timeout=30)
        rpt = in_node(n1, olab.config, [CTL, "offload", "--json"])
        assert rpt.code == 0, (rpt.stdout, rpt.stderr)
        report = json.loads(rpt.stdout)
        assert report["simulation"] is True
        mine = next(x for x in report["attachments"] if x["containerID"] == a_cid)
        assert mine["representor"] == rep and mine["mode"] == "ovs-offload"
        labels = [f["tunnel"] for f in mine["flows"]]
        assert "geneve encap" in labels and "geneve decap" in labels, mine["flows"]
        assert mine["tunnel"]["encap"]["flows"] >= 1 and mine["tunnel"]["decap"]["flows"] >= 1
        assert mine["tunnel"]["encap"]["packets"] > 0 and mine["tunnel"]["decap"]["packets"] > 0
        encap = [f for f in mine["flows"] if f["tunnel"] == "geneve encap"]
        assert all(f["inPort"] == rep for f in encap)
        table = in_node(n1, olab.config, [CTL, "offload"])
        assert "simulation" in table.stdout and "[geneve encap]" in table.stdout, table.stdout

        check = cni("CHECK", n1, olab.config, {**a_conf, "cniVersion": "1.0.0", "prevResult": a.result},
                    a_cid, a_ns)
        assert check.code == 0, (check.stdout, check.stderr)
    finally:
        if added_a:
            assert cni("DEL", n1, olab.config, a_conf, a_cid, a_ns).code == 0
        if added_b:
            assert cni("DEL", n2, n2.node_config, b_conf, b_cid, b_ns).code == 0
    # nothing left: no logical port, the representor off OVS, the VF back as it was
    assert nb_port(lab.root, lsp_of(n1.name, a_cid)) is None
    assert not on_ovs(n1, vf["representor"])
    assert olab.vf_state() == state_before
    assert subprocess.run(["ip", "-n", n1.netns, "link", "show", "dev", vf["netdev"]],
                          capture_output=True).returncode == 0, "the VF netdev is not back on the node"


def test_rail_follows_the_pf_and_a_named_rail_must_carry_it(olab: OffloadLab) -> None:
    lab, n1 = olab.lab, olab.node1
    vf0 = olab.vfs()["pf0"][1]  # rail 0's NIC
    vf1 = olab.vfs()["pf1"][1]  # rail 1's NIC
    state_before = olab.vf_state()
    ns = ovn.make_pod_netns(lab, n1, "oc")
    cid = cid_of("oc")

    # a VF of pf0, no rail named: rail 0 (br-int, chassis node1)
    conf = overlay_conf("ovs-offload", deviceID=vf0["address"])
    add = cni("ADD", n1, olab.config, conf, cid, ns)
    assert add.code == 0, (add.stdout, add.stderr)
    try:
        assert ovn.vsctl(n1, "port-to-br", vf0["representor"]).strip() == "br-int"
        assert chassis_of(lab.root, lsp_of(n1.name, cid)) == n1.rails[0].chassis
    finally:
        assert cni("DEL", n1, olab.config, conf, cid, ns).code == 0

    # a VF of pf1 on a network that names rail 0: refused, naming VF, PF and rail; nothing made
    conf = overlay_conf("ovs-offload", deviceID=vf1["address"], rail="rail0")
    refused = cni("ADD", n1, olab.config, conf, cid, ns)
    assert refused.code == 1, (refused.stdout, refused.stderr)
    err = json.loads(refused.stdout)
    assert err["code"] == 7, err
    for word in (vf1["address"], "pf1", "rail0", "br-rail0"):
        assert word in err["msg"], err
    assert nb_port(lab.root, lsp_of(n1.name, cid)) is None
    assert not on_ovs(n1, vf1["representor"])
    assert subprocess.run(["ip", "-n", ns, "link", "show", "dev", "net1"], capture_output=True).returncode != 0
    assert olab.vf_state() == state_before
