"""Tenant escape: with a tenancy policy, the admin's declaration decides a network's fabric,
never the NAD (docs/security.md, "Fabric bound by the admin").

Two tenants on two switches and two PFs: lab 1 (the session's) with its bridge and a second
bridge, lab 2 (this module's own OVS, whose bridge has the *same name* as lab 1's) for
`socket_file` / `configuration_path`, and in lab 2 a simulated NIC with two PFs. Every field
that names a fabric, set by one tenant to the other's, is refused with code 120 naming the
field and leaves nothing; the same fields omitted or repeated exactly work. A policy that
grants one VLAN of one fabric to two tenants is refused whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.lab import node as labmod
from tenantnet.lab.nic import LabNic, LabVfControl
from tenantnet.lab.nicsysfs import connectx_pf
from tests.integration.conftest import Lab, Netns, PluginRunner, new_cid
from tests.integration.test_trust_defects import CTL, node_settings, pod_link, write_node


@dataclass
class Fabrics:
    lab: Lab  # lab 1: the node's OVSDB
    lab2: Lab
    a_bridge: str  # lab 1's bridge: team-a's
    b_bridge: str  # lab 1's second bridge: team-b's
    pf_a: str  # lab 2's NIC: PF A is team-a's, PF B team-b's
    pf_b: str
    pf_a_address: str
    vfs_a: list[dict[str, Any]]
    vfs_b: list[dict[str, Any]]
    conf_lab2: str  # configuration_path files naming lab 2's / lab 1's OVSDB
    conf_node: str
    sysfs_root: str
    vf_control: str

    @property
    def lab2_sock(self) -> str:
        return self.lab2.ovsdb.removeprefix("unix:")

    @property
    def vf_a(self) -> str:
        return str(self.vfs_a[0]["address"])

    @property
    def vf_b(self) -> str:
        return str(self.vfs_b[0]["address"])


@pytest.fixture(scope="module")
def fabrics(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabrics]:
    root = tmp_path_factory.mktemp("esc")
    info = labmod.up(str(root / "run"))
    b_bridge = f"br-b{uuid.uuid4().hex[:6]}"
    ovs_d = Path(node_settings(lab)["ovsConfigurationPaths"][0])
    ovs_d.mkdir(parents=True, exist_ok=True)
    t = uuid.uuid4().hex[:8]
    conf_lab2, conf_node = ovs_d / f"esc-{t}-lab2.json", ovs_d / f"esc-{t}-node.json"
    try:
        lab.vsctl("add-br", b_bridge, "--", "set", "Bridge", b_bridge, f"datapath_type={labmod.DATAPATH}")
        # Two legacy PFs in lab 2, VF netdevs (real links) named after that lab.
        prefix = "e" + hashlib.sha256(info.root.encode()).hexdigest()[:5]
        pfs = [connectx_pf(f"{prefix}a", vfs=3, bus="3b", rdma=False),
               connectx_pf(f"{prefix}b", vfs=3, bus="5e", rdma=False)]
        LabNic(info.root).create(pfs, lambda *a: labmod.vsctl(info.root, *a))
        card = {pf["pf"]: pf for pf in LabNic(info.root).describe()}
        lab2 = Lab(root=Path(info.root), node_config=Path(info.node_config), state_dir=Path(info.state_dir),
                   ovsdb=info.ovsdb, bridge=info.bridge, hostlocal_dir=Path(info.root) / "host-local")
        conf_lab2.write_text(json.dumps({"socket_file": info.ovsdb}))
        conf_node.write_text(json.dumps({"socket_file": lab.ovsdb}))
        yield Fabrics(lab=lab, lab2=lab2, a_bridge=lab.bridge, b_bridge=b_bridge,
                      pf_a=pfs[0].netdev, pf_b=pfs[1].netdev, pf_a_address=pfs[0].address,
                      vfs_a=card[pfs[0].netdev]["vfs"], vfs_b=card[pfs[1].netdev]["vfs"],
                      conf_lab2=str(conf_lab2), conf_node=str(conf_node),
                      sysfs_root=f"{info.root}/sys", vf_control=f"lab:{info.root}")
    finally:
        conf_lab2.unlink(missing_ok=True)
        conf_node.unlink(missing_ok=True)
        try:
            lab.vsctl("--if-exists", "del-br", b_bridge)
        finally:
            labmod.down(info.root)


def escape_policy(f: Fabrics) -> dict[str, Any]:
    return {
        "networks": {
            "net-a": {"bridge": f.a_bridge},
            "net-b": {"bridge": f.b_bridge},
            "net-a2": {"bridge": f.lab2.bridge, "ovsdb": f.lab2.ovsdb},  # same bridge name, other switch
            "vf-a": {"pfs": [f.pf_a]},
            "vf-b": {"pfs": [f.pf_b]},
        },
        "tenants": {
            "team-a": {"namespaces": ["team-a"], "networks": {"net-a": {"vlans": [100]}, "net-a2": {"vlans": [100]},
                                                                "vf-a": {"vlans": [100]}}},
            "team-b": {"namespaces": ["team-b"], "networks": {"net-b": {"vlans": [100]}, "vf-b": {"vlans": [100]}}},
        },
    }


def fabric_node(path: Path, f: Fabrics, policy: dict[str, Any]) -> Path:
    """A node config on lab 1's OVSDB, with lab 2's OVSDB allowed and its NIC as the node's."""
    (path.parent / "log").mkdir(parents=True, exist_ok=True)
    return write_node(path, f.lab, stateDir=str(path.parent / "state"), logFile=str(path.parent / "log" / "tn.log"),
                      sysfsRoot=f.sysfs_root, vfControl=f.vf_control, vfControlModules=["tenantnet.lab.nic"], ovsdbEndpoints=[f.lab2.ovsdb],
                      tenancy=policy)


@pytest.fixture(scope="module")
def escape_node(fabrics: Fabrics, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fabric_node(tmp_path_factory.mktemp("escnode") / "node.yaml", fabrics, escape_policy(fabrics))


@dataclass
class Tenants:
    """Calls as a tenant's pod makes them; every successful ADD is DELeted at the end."""

    runner: PluginRunner
    made: list[tuple[dict[str, Any], str, str]]

    def add(self, ns: Netns, namespace: str, conf: dict[str, Any], cid: str) -> Any:
        inv = self.runner.add(conf, ns, cid, cni_args=args(namespace))
        if inv.code == 0:
            self.made.append((conf, cid, namespace))
        return inv

    def delete(self, namespace: str, conf: dict[str, Any], cid: str, netns: str = "") -> Any:
        return self.runner.call("DEL", conf, cid, netns, cni_args=args(namespace))


def args(namespace: str) -> str:
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=p1"


@pytest.fixture
def tenants(fabrics: Fabrics, escape_node: Path) -> Iterator[Tenants]:
    runner = PluginRunner(fabrics.lab, extra_env={"TENANTNET_CONFIG": str(escape_node)})
    t = Tenants(runner, [])
    yield t
    for conf, cid, namespace in reversed(t.made):
        t.delete(namespace, conf, cid)


def vf_state(f: Fabrics) -> dict[str, Any]:
    ctl = LabVfControl(str(f.lab2.root))
    out = {}
    for pf in LabNic(str(f.lab2.root)).describe():
        for vf in pf["vfs"]:
            out[vf["address"]] = (ctl.read(pf["pf"], vf["index"]).to_dict(),
                                  os.path.exists(f"/sys/class/net/{vf['netdev']}"))
    return out


def records(node: Path) -> list[Path]:
    return sorted((node.parent / "state" / "attachments").rglob("*.json"))


def nad(network: str, **fields: Any) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": network, "type": "tenantnet", "vlan": 100, **fields}


# (id, pod namespace, network, fields set by the NAD, words of which the message names one)
ESCAPES: list[tuple[str, str, str, Callable[[Fabrics], dict[str, Any]], tuple[str, ...]]] = [
    ("bridge-of-team-a", "team-b", "net-b", lambda f: {"bridge": f.a_bridge}, ("bridge",)),
    ("bridge-of-team-b", "team-a", "net-a", lambda f: {"bridge": f.b_bridge}, ("bridge",)),
    ("socket_file-other-switch", "team-b", "net-b", lambda f: {"socket_file": f.lab2.ovsdb}, ("socket_file",)),
    ("socket_file-bare-path", "team-b", "net-b", lambda f: {"socket_file": f.lab2_sock}, ("socket_file",)),
    ("socket_file-node-for-lab2-net", "team-a", "net-a2", lambda f: {"socket_file": f.lab.ovsdb},
     ("socket_file",)),
    ("configuration_path-other-switch", "team-b", "net-b", lambda f: {"configuration_path": f.conf_lab2},
     ("configuration_path",)),
    ("configuration_path-node-for-lab2-net", "team-a", "net-a2",
     lambda f: {"configuration_path": f.conf_node}, ("configuration_path",)),
    ("whole-other-fabric", "team-b", "net-b", lambda f: {"bridge": f.lab2.bridge, "socket_file": f.lab2.ovsdb},
     ("bridge", "socket_file")),
    ("vf-of-team-a-on-ovs-net", "team-b", "net-b", lambda f: {"deviceID": f.vf_a}, ("deviceID",)),
    ("pf", "team-b", "vf-b", lambda f: {"pf": f.pf_a}, ("pf",)),
    ("pf-by-address", "team-b", "vf-b", lambda f: {"pf": f.pf_a_address}, ("pf",)),
    ("pfs", "team-b", "vf-b", lambda f: {"pfs": [f.pf_a]}, ("pfs",)),
    ("pfs-one-foreign", "team-b", "vf-b", lambda f: {"pfs": [f.pf_b, f.pf_a]}, ("pfs",)),
    ("deviceID", "team-b", "vf-b", lambda f: {"deviceID": f.vf_a}, ("deviceID",)),
    ("pciBusID", "team-b", "vf-b", lambda f: {"pciBusID": f.vf_a}, ("pciBusID",)),
    ("runtimeConfig.deviceID", "team-b", "vf-b", lambda f: {"runtimeConfig": {"deviceID": f.vf_a}},
     ("runtimeConfig.deviceID",)),
    ("deviceID-beside-own-pf", "team-b", "vf-b", lambda f: {"pf": f.pf_b, "deviceID": f.vf_a}, ("deviceID",)),
    ("deviceID-of-team-b", "team-a", "vf-a", lambda f: {"deviceID": f.vf_b}, ("deviceID",)),
    ("bridge-on-vf-net", "team-b", "vf-b", lambda f: {"bridge": f.a_bridge, "deviceID": f.vf_b}, ("bridge",)),
]


@pytest.mark.parametrize("namespace,network,fields,words", [e[1:] for e in ESCAPES], ids=[e[0] for e in ESCAPES])
def test_a_field_naming_another_tenants_fabric_is_refused_with_120(fabrics, tenants, escape_node, netns_factory,
                                                                  namespace, network, fields, words):
    before = vf_state(fabrics)
    ns = netns_factory()
    cid = new_cid()
    conf = nad(network, **fields(fabrics))
    inv = tenants.add(ns, namespace, conf, cid)
    assert inv.code == 1 and inv.out is not None and inv.out["code"] == 120, inv.stdout
    assert any(word in inv.out["msg"] for word in words), inv.out["msg"]
    assert "Traceback" not in inv.stderr

    def nothing_left(after: str) -> None:
        assert fabrics.lab.owned_ports() == [], f"a port on lab 1 after {after}"
        assert fabrics.lab2.owned_ports() == [], f"a port on lab 2 after {after}"
        assert records(escape_node) == [], f"a record after {after}"
        assert pod_link(ns) is None, f"an interface in the pod after {after}"
        assert vf_state(fabrics) == before, f"a VF changed by {after}"

    nothing_left("the refused ADD")
    cleanup = tenants.delete(namespace, conf, cid, ns.path)  # what the runtime sends next
    assert cleanup.code == 0, cleanup.stdout
    nothing_left("the clean-up DEL")


def port_on(lab: Lab, name: str) -> tuple[str, Any] | None:
    try:
        bridge = lab.vsctl("port-to-br", name).strip()
    except labmod.LabError:
        return None
    return bridge, json.loads(lab.vsctl("--format=json", "get", "Port", name, "tag"))


# (id, pod namespace, network, fields, where it must land: "lab", "lab2" (OVS) or "pf-a"/"pf-b")
ALLOWED: list[tuple[str, str, str, Callable[[Fabrics], dict[str, Any]], str]] = [
    ("omitted", "team-b", "net-b", lambda f: {}, "lab"),
    ("bridge-repeated", "team-b", "net-b", lambda f: {"bridge": f.b_bridge}, "lab"),
    ("socket_file-of-the-node-repeated", "team-a", "net-a", lambda f: {"socket_file": f.lab.ovsdb}, "lab"),
    ("lab2-omitted", "team-a", "net-a2", lambda f: {}, "lab2"),
    ("lab2-socket_file-repeated", "team-a", "net-a2", lambda f: {"socket_file": f.lab2.ovsdb}, "lab2"),
    ("lab2-socket_file-bare-path", "team-a", "net-a2", lambda f: {"socket_file": f.lab2_sock}, "lab2"),
    ("lab2-configuration_path", "team-a", "net-a2", lambda f: {"configuration_path": f.conf_lab2}, "lab2"),
    ("lab2-bridge-and-socket_file", "team-a", "net-a2",
     lambda f: {"bridge": f.lab2.bridge, "socket_file": f.lab2.ovsdb}, "lab2"),
    ("vf-omitted", "team-b", "vf-b", lambda f: {}, "pf-b"),
    ("vf-pf-repeated", "team-b", "vf-b", lambda f: {"pf": f.pf_b}, "pf-b"),
    ("vf-pfs-repeated", "team-b", "vf-b", lambda f: {"pfs": [f.pf_b]}, "pf-b"),
    ("vf-deviceID-own", "team-b", "vf-b", lambda f: {"deviceID": f.vf_b}, "pf-b"),
    ("vf-pciBusID-own", "team-b", "vf-b", lambda f: {"pciBusID": f.vf_b}, "pf-b"),
    ("vf-runtimeConfig.deviceID-own", "team-b", "vf-b", lambda f: {"runtimeConfig": {"deviceID": f.vf_b}}, "pf-b"),
    ("vf-a-omitted", "team-a", "vf-a", lambda f: {}, "pf-a"),
]


@pytest.mark.parametrize("namespace,network,fields,where", [a[1:] for a in ALLOWED], ids=[a[0] for a in ALLOWED])
def test_declared_fabric_fields_omitted_or_repeated_work(fabrics, tenants, escape_node, netns_factory, namespace,
                                                         network, fields, where):
    before = vf_state(fabrics)
    ns = netns_factory()
    cid = new_cid()
    conf = nad(network, **fields(fabrics))
    inv = tenants.add(ns, namespace, conf, cid)
    assert inv.code == 0, inv.stdout
    if where in ("lab", "lab2"):
        host = inv.out["interfaces"][0]["name"]
        here, there = (fabrics.lab, fabrics.lab2) if where == "lab" else (fabrics.lab2, fabrics.lab)
        bridge = fabrics.b_bridge if network == "net-b" else fabrics.a_bridge if network == "net-a" \
            else fabrics.lab2.bridge
        assert port_on(here, host) == (bridge, 100)
        assert port_on(there, host) is None
    else:
        vfs = fabrics.vfs_a if where == "pf-a" else fabrics.vfs_b
        pf = fabrics.pf_a if where == "pf-a" else fabrics.pf_b
        pci = inv.out["interfaces"][-1].get("pciID")
        (vf,) = [v for v in vfs if v["address"] == pci]
        assert LabVfControl(str(fabrics.lab2.root)).read(pf, vf["index"]).vlan == 100
    assert pod_link(ns) is not None
    assert tenants.delete(namespace, conf, cid, ns.path).code == 0
    tenants.made.clear()
    assert fabrics.lab.owned_ports() == [] and fabrics.lab2.owned_ports() == []
    assert records(escape_node) == [] and vf_state(fabrics) == before


def test_the_escape_policy_itself_is_valid(escape_node):
    shown = subprocess.run([CTL, "--node-config", str(escape_node), "policy", "show", "--json"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert {t["name"] for t in json.loads(shown.stdout)["tenants"]} == {"team-a", "team-b"}


# ---- one VLAN of one fabric, two tenants ----------------------------------------------------

def _grants(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"team-a": {"namespaces": ["team-a"], "networks": a}, "team-b": {"namespaces": ["team-b"], "networks": b}}


# (id, policy, what team-a's ADD asks, words the refusal names)
CONFLICTS: list[tuple[str, Callable[[Fabrics], dict[str, Any]], Callable[[Fabrics], dict[str, Any]],
                      tuple[str, ...]]] = [
    ("one-network-two-tenants",
     lambda f: {"networks": {"net-a": {"bridge": f.a_bridge}},
                "tenants": _grants({"net-a": {"vlans": [100]}}, {"net-a": {"vlans": [100]}})},
     lambda f: nad("net-a"), ("100", "team-a", "team-b")),
    ("two-networks-one-bridge",
     lambda f: {"networks": {"net-a": {"bridge": f.a_bridge}, "net-x": {"bridge": f.a_bridge}},
                "tenants": _grants({"net-a": {"vlans": [100]}}, {"net-x": {"vlans": ["90-110"]}})},
     lambda f: nad("net-a"), ("100", "team-a", "team-b")),
    ("two-networks-one-bridge-node-ovsdb-spelt-out",
     lambda f: {"networks": {"net-a": {"bridge": f.a_bridge}, "net-x": {"bridge": f.a_bridge, "ovsdb": f.lab.ovsdb}},
                "tenants": _grants({"net-a": {"vlans": [100]}}, {"net-x": {"vlans": [100]}})},
     lambda f: nad("net-a"), ("100", "team-a", "team-b")),
    ("two-networks-one-pf",
     lambda f: {"networks": {"vf-a": {"pfs": [f.pf_a]}, "vf-x": {"pfs": [f.pf_b, f.pf_a]}},
                "tenants": _grants({"vf-a": {"vlans": [100]}}, {"vf-x": {"vlans": [100]}})},
     lambda f: nad("vf-a", deviceID=f.vf_a), ("100", "team-a", "team-b")),
    ("one-pf-by-name-and-by-address",
     lambda f: {"networks": {"vf-a": {"pfs": [f.pf_a]}, "vf-x": {"pfs": [f.pf_a_address]}},
                "tenants": _grants({"vf-a": {"vlans": [100]}}, {"vf-x": {"vlans": [100]}})},
     lambda f: nad("vf-a", deviceID=f.vf_a), ("100", "team-a", "team-b")),
    ("grant-of-an-undeclared-network",
     lambda f: {"networks": {"net-a": {"bridge": f.a_bridge}},
                "tenants": _grants({"net-a": {"vlans": [100]}, "net-q": {"vlans": [200]}}, {})},
     lambda f: nad("net-a"), ("net-q",)),
]


@pytest.mark.parametrize("policy,request_of,words", [c[1:] for c in CONFLICTS], ids=[c[0] for c in CONFLICTS])
def test_a_vlan_of_one_fabric_granted_twice_refuses_the_whole_policy(fabrics, netns_factory, tmp_path, policy,
                                                                     request_of, words):
    node = fabric_node(tmp_path / "node.yaml", fabrics, policy(fabrics))
    runner = PluginRunner(fabrics.lab, extra_env={"TENANTNET_CONFIG": str(node)})
    before = vf_state(fabrics)
    ns = netns_factory()
    cid = new_cid()
    conf = request_of(fabrics)
    try:
        inv = runner.add(conf, ns, cid, cni_args=args("team-a"))
        assert inv.code == 1 and inv.out is not None and inv.out["code"] == 7, inv.stdout
        for word in words:
            assert word in inv.out["msg"], inv.out["msg"]
        check = runner.call("CHECK", {**conf, "prevResult": {"cniVersion": "1.1.0", "interfaces": [
            {"name": "net1", "sandbox": ns.path}], "ips": []}}, cid, ns.path, cni_args=args("team-a"))
        assert check.code == 1 and check.out["code"] == 7, check.stdout
        shown = subprocess.run([CTL, "--node-config", str(node), "policy", "show"], capture_output=True,
                               text=True, timeout=60)
        assert shown.returncode == 1, shown.stdout + shown.stderr
        assert "Traceback" not in shown.stderr
        for word in words:
            assert word in shown.stdout + shown.stderr, shown.stdout + shown.stderr
        assert fabrics.lab.owned_ports() == [] and records(node) == [] and pod_link(ns) is None
        assert vf_state(fabrics) == before
    finally:
        for c, i, f in list(runner.cleanups):
            runner.call("DEL", c, i, "", f, cni_args=args("team-a"))


def test_the_same_bridge_name_on_two_switches_is_two_fabrics(fabrics, netns_factory, tmp_path):
    policy = {"networks": {"net-a": {"bridge": fabrics.a_bridge},
                           "net-z": {"bridge": fabrics.lab2.bridge, "ovsdb": fabrics.lab2.ovsdb}},
              "tenants": _grants({"net-a": {"vlans": [100]}}, {"net-z": {"vlans": [100]}})}
    node = fabric_node(tmp_path / "node.yaml", fabrics, policy)
    shown = subprocess.run([CTL, "--node-config", str(node), "policy", "show"], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    runner = PluginRunner(fabrics.lab, extra_env={"TENANTNET_CONFIG": str(node)})
    ns = netns_factory()
    cid = new_cid()
    conf = nad("net-z")
    try:
        inv = runner.add(conf, ns, cid, cni_args=args("team-b"))
        assert inv.code == 0, inv.stdout
        host = inv.out["interfaces"][0]["name"]
        assert port_on(fabrics.lab2, host) == (fabrics.lab2.bridge, 100) and port_on(fabrics.lab, host) is None
        assert runner.call("DEL", conf, cid, ns.path, cni_args=args("team-b")).code == 0
        assert fabrics.lab2.owned_ports() == []
    finally:
        for c, i, f in list(runner.cleanups):
            runner.call("DEL", c, i, "", f, cni_args=args("team-b"))


def test_policy_file_is_what_the_node_config_holds(fabrics, tmp_path):
    """The conflict check also holds for a policy in `tenancyFile` (not only inline)."""
    policy = CONFLICTS[0][1](fabrics)
    policy_file = tmp_path / "tenancy.yaml"
    policy_file.write_text(yaml.safe_dump({"tenancy": policy}))
    node = write_node(tmp_path / "node.yaml", fabrics.lab, stateDir=str(tmp_path / "state"),
                      tenancyFile=str(policy_file))
    shown = subprocess.run([CTL, "--node-config", str(node), "policy", "show"], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 1 and "team-b" in shown.stdout + shown.stderr, shown.stdout + shown.stderr
