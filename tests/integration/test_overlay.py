"""Overlay attachments (docs/overlay.md) made by the real tenantnet plugin, exec'd inside the
nodes of the OVN lab (tenantnet/lab/ovn.py, a simulation: nodes are network namespaces, the
datapath is OVS's userspace one): the logical switch port and its port security, the binding
on the right rail's chassis, the MTU's 58 bytes, traffic across nodes, CHECK and DEL, and the
tenancy policy's segments."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import ovn

pytestmark = pytest.mark.usefixtures("ovn_installed")

BIN = Path(sys.executable).parent
SUBNET = "10.88.9.0/24"  # inside the lab's clusterPools (10.88.0.0/16)


@pytest.fixture(scope="module")
def lab() -> Iterator[ovn.OvnLab]:
    root = tempfile.mkdtemp(prefix="tn-overlay-")
    try:
        yield ovn.up(root, nodes=2, rails=2)
    finally:
        ovn.down(root)
        shutil.rmtree(root, ignore_errors=True)


def conf(name: str = "ov-blue", **extra: Any) -> dict[str, Any]:
    out = {"cniVersion": "1.0.0", "name": name, "type": "tenantnet", "mode": "ovs", "overlay": "geneve",
           "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28, "allowOverlap": True},
                    "ranges": [[{"subnet": SUBNET}]]}}
    out.update(extra)
    return out


def cni(command: str, node: ovn.OvnNode, config: dict[str, Any], cid: str, netns: str,
        node_config: str | None = None, namespace: str = "team-a") -> tuple[int, dict[str, Any]]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command, "CNI_PATH": str(BIN),
           "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{netns}", "CNI_IFNAME": "net1",
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=p-{cid[:6]}"}
    cmd = ["ip", "netns", "exec", node.netns, "env", f"TENANTNET_CONFIG={node_config or node.node_config}",
           str(BIN / "tenantnet")]
    proc = subprocess.run(cmd, input=json.dumps(config).encode(), env=env, capture_output=True, timeout=60,
                          check=False)
    out = proc.stdout.decode().strip()
    return proc.returncode, json.loads(out) if out else {}


def lsps(lab: ovn.OvnLab) -> dict[str, dict[str, Any]]:
    """Logical switch ports in the NB: name -> {addresses, port_security, external_ids}."""
    data = json.loads(ovn.nbctl(lab.root, "--format=json", "--columns=name,addresses,port_security,external_ids",
                                "list", "Logical_Switch_Port"))
    out = {}
    for row in data["data"]:
        name, addresses, security, ids = row
        out[name] = {"addresses": _set(addresses), "port_security": _set(security), "external_ids": dict(ids[1])}
    return out


def _set(value: Any) -> list[str]:
    return list(value[1]) if isinstance(value, list) and value and value[0] == "set" else [value]


def switch_of(lab: ovn.OvnLab, lsp: str) -> str:
    return ovn.nbctl(lab.root, "lsp-get-ls", lsp).split("(")[-1].rstrip(")\n")


def chassis_of(lab: ovn.OvnLab, lsp: str) -> str:
    """The chassis name the SB has bound the logical port to ("" while unbound)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        uuid = ovn.sbctl(lab.root, "--bare", "--columns=chassis", "find", "Port_Binding",
                         f"logical_port={lsp}").strip()
        if uuid:
            return ovn.sbctl(lab.root, "--bare", "--columns=name", "list", "Chassis", uuid).strip()
        time.sleep(0.05)
    return ""


def ping(netns: str, address: str, tries: int = 20) -> bool:
    """True once `address` answers from `netns` (the first packets after a binding may be lost
    while ovn-controller installs its flows)."""
    for _ in range(tries):
        if subprocess.run(["ip", "netns", "exec", netns, "ping", "-c1", "-W0.3", address],
                          capture_output=True, check=False).returncode == 0:
            return True
    return False


def pod_netns(lab: ovn.OvnLab, node: ovn.OvnNode, name: str) -> str:
    netns = f"{node.netns}-{name}"
    if not os.path.exists(f"/run/netns/{netns}"):
        ovn.make_pod_netns(lab, node, name)
    return netns


def link(netns: str, ifname: str = "net1") -> dict[str, Any]:
    out = subprocess.run(["ip", "-j", "-n", netns, "link", "show", ifname], capture_output=True, text=True,
                         check=False).stdout
    return json.loads(out)[0] if out.strip() else {}


def address_of(result: dict[str, Any]) -> str:
    return str(result["ips"][0]["address"].split("/")[0])


def test_add_across_nodes_binds_ports_with_port_security_and_del_removes_them(lab: ovn.OvnLab) -> None:
    n1, n2 = lab.nodes[:2]
    a, b = pod_netns(lab, n1, "a1"), pod_netns(lab, n2, "b1")
    code, ra = cni("ADD", n1, conf(), "a1" * 32, a)
    assert code == 0, ra
    code, rb = cni("ADD", n2, conf(), "b1" * 32, b)
    assert code == 0, rb
    try:
        ports = {name: p for name, p in lsps(lab).items() if p["external_ids"].get("tenantnet-network") == "ov-blue"}
        assert len(ports) == 2
        for name, port in ports.items():
            node = port["external_ids"]["tenantnet-node"]
            result = ra if node == n1.name else rb
            pod_if = result["interfaces"][1]
            want = f"{pod_if['mac']} {address_of(result)}"
            assert port["port_security"] == [want] and port["addresses"] == [want]
            assert switch_of(lab, name) == "tn-ov-blue"
            assert chassis_of(lab, name) == node  # rail0's chassis is the node itself
        # The pod end: MTU = underlay 1500 - 58, the MAC port security names, and (userspace
        # datapath) its TX checksums computed by itself.
        assert link(a)["mtu"] == 1442 and link(a)["address"] == ra["interfaces"][1]["mac"]
        assert ovn.tx_checksum_in(a, "net1") is False and ovn.tx_checksum_in(b, "net1") is False
        assert ping(a, address_of(rb)) and ping(b, address_of(ra))
        code, out = cni("CHECK", n1, {**conf(), "prevResult": ra}, "a1" * 32, a)
        assert code == 0, out
    finally:
        assert cni("DEL", n1, conf(), "a1" * 32, a)[0] == 0
        assert cni("DEL", n2, conf(), "b1" * 32, b)[0] == 0
    assert not [p for p in lsps(lab).values() if p["external_ids"].get("tenantnet-network") == "ov-blue"]
    assert ra["interfaces"][0]["name"] not in ovn.vsctl(n1, "list-ports", "br-int").split()
    assert not link(a)  # the pod end went with the veth


def test_a_rails_attachment_is_bound_on_that_rails_chassis(lab: ovn.OvnLab) -> None:
    n1, n2 = lab.nodes[:2]
    a, b = pod_netns(lab, n1, "a2"), pod_netns(lab, n2, "b2")
    net = conf("ov-rail1", rail="rail1")
    code, ra = cni("ADD", n1, net, "a2" * 32, a)
    assert code == 0, ra
    code, rb = cni("ADD", n2, net, "b2" * 32, b)
    assert code == 0, rb
    try:
        ports = {p["external_ids"]["tenantnet-node"]: name for name, p in lsps(lab).items()
                 if p["external_ids"].get("tenantnet-network") == "ov-rail1"}
        assert chassis_of(lab, ports[n1.name]) == f"{n1.name}-rail1"
        assert chassis_of(lab, ports[n2.name]) == f"{n2.name}-rail1"
        host_port = ra["interfaces"][0]["name"]
        assert host_port in ovn.vsctl(n1, "list-ports", "br-int-rail1").split()
        assert ping(a, address_of(rb))
    finally:
        cni("DEL", n1, net, "a2" * 32, a)
        cni("DEL", n2, net, "b2" * 32, b)


@pytest.mark.parametrize("field, value, needle", [
    ("mtu", 1443, "at most 1442"),
    ("rail", "rail7", "rail0, rail1"),
    ("bridge", "br-other", "integration bridge br-int"),
    ("trunk", [{"id": 5}], "trunks are for VLANs"),
    ("overlay", "vxlan", "geneve"),
])
def test_a_config_that_cannot_work_is_refused_and_leaves_nothing(lab: ovn.OvnLab, field: str, value: Any,
                                                                 needle: str) -> None:
    n1 = lab.nodes[0]
    a = pod_netns(lab, n1, "a3")
    before = set(lsps(lab))
    code, err = cni("ADD", n1, conf("ov-bad", **{field: value}), "a3" * 32, a)
    assert code == 1 and err["code"] == 7 and needle in err["msg"] and field in err["msg"], err
    assert set(lsps(lab)) == before
    assert not link(a)


def test_a_fitting_mtu_is_kept(lab: ovn.OvnLab) -> None:
    n1 = lab.nodes[0]
    a = pod_netns(lab, n1, "a4")
    code, ra = cni("ADD", n1, conf("ov-mtu", mtu=1400), "a4" * 32, a)
    assert code == 0, ra
    try:
        assert link(a)["mtu"] == 1400
    finally:
        cni("DEL", n1, conf("ov-mtu", mtu=1400), "a4" * 32, a)


def test_tenancy_segments_are_switches_and_stay_the_tenants(lab: ovn.OvnLab, tmp_path: Path) -> None:
    """Under a policy the network's VLANs are segments: team-a's `vlan: tenant` lands on
    tn-ov-ten.10, and team-b asking for segment 10 is refused (120) before anything exists."""
    n1 = lab.nodes[0]
    node_config = tmp_path / "node.yaml"
    node_config.write_text(Path(n1.node_config).read_text() + (
        "tenancy:\n"
        "  networks:\n"
        "    ov-ten: {overlay: geneve, rail: rail0}\n"
        "  tenants:\n"
        "    a: {namespaces: [team-a], networks: {ov-ten: {vlans: [10], default: 10}}}\n"
        "    b: {namespaces: [team-b], networks: {ov-ten: {vlans: [20]}}}\n"))
    a, b = pod_netns(lab, n1, "a5"), pod_netns(lab, n1, "b5")
    code, ra = cni("ADD", n1, conf("ov-ten", vlan="tenant"), "a5" * 32, a, str(node_config), "team-a")
    assert code == 0, ra
    try:
        mine = [n for n, p in lsps(lab).items() if p["external_ids"].get("tenantnet-network") == "ov-ten"]
        assert len(mine) == 1 and switch_of(lab, mine[0]) == "tn-ov-ten.10"
        before = set(lsps(lab))
        code, err = cni("ADD", n1, conf("ov-ten", vlan=10), "b5" * 32, b, str(node_config), "team-b")
        assert code == 1 and err["code"] == 120 and "vlan 10" in err["msg"], err
        code, err = cni("ADD", n1, conf("ov-ten", vlan=20, rail="rail1"), "b5" * 32, b, str(node_config),
                        "team-b")
        assert code == 1 and err["code"] == 120 and "rail" in err["msg"], err
        assert set(lsps(lab)) == before and not link(b)
    finally:
        cni("DEL", n1, conf("ov-ten", vlan="tenant"), "a5" * 32, a, str(node_config), "team-a")


def test_prewarm_on_an_overlay_is_declined_and_said_per_attachment(lab: ovn.OvnLab) -> None:
    """Pre-warm pairs ports of one bridge; on an overlay the ADD succeeds unwarmed, and the
    attachment says so (`tenantnetctl ls`)."""
    n1 = lab.nodes[0]
    a = pod_netns(lab, n1, "a6")
    net = conf("ov-warm", prewarm=True)
    code, ra = cni("ADD", n1, net, "a6" * 32, a)
    assert code == 0, ra
    try:
        out = subprocess.run(["ip", "netns", "exec", n1.netns, "env", f"TENANTNET_CONFIG={n1.node_config}",
                              str(BIN / "tenantnetctl"), "ls", "--json"], capture_output=True, text=True,
                             check=True).stdout
        rows = [r for r in json.loads(out) if r.get("network") == "ov-warm"]
        assert len(rows) == 1 and rows[0]["prewarm"] == "not warmed: overlay"
        assert rows[0]["overlaySwitch"] == "tn-ov-warm" and rows[0]["overlayPort"].endswith(f".{n1.name}")
    finally:
        cni("DEL", n1, net, "a6" * 32, a)


def test_status_asks_the_rails_ovsdb_and_the_northbound(lab: ovn.OvnLab, tmp_path: Path) -> None:
    """STATUS of an overlay network: 0 while both answer; 50 naming the NB when the node
    config's northbound is a socket nothing serves."""
    n1 = lab.nodes[0]
    net = {**conf("ov-status"), "cniVersion": "1.1.0"}
    # No agent runs in this lab: without agentSocket, STATUS does not ask for one.
    text = "".join(line for line in Path(n1.node_config).read_text().splitlines(keepends=True)
                   if not line.startswith("agentSocket:"))
    working, broken = tmp_path / "node.yaml", tmp_path / "broken.yaml"
    working.write_text(text)
    code, err = cni("STATUS", n1, net, "", "", str(working))
    assert code == 0, err
    broken.write_text(text.replace(f"northbound: unix:{lab.root}/central/nb.sock",
                                   f"northbound: unix:{tmp_path}/no-nb.sock"))
    code, err = cni("STATUS", n1, net, "", "", str(broken))
    assert code == 1 and err["code"] == 50 and "no-nb.sock" in err["msg"], err


def test_a_tenant_networks_overlay_uses_the_renderers_switch_and_its_segment_as_tunnel_key(
        lab: ovn.OvnLab, tmp_path: Path) -> None:
    """Kubernetes mode: the renderer's switch keeper makes tn-<name>.<segment> with the segment
    as requested tunnel key; the nodes' ADDs of the rendered NAD (whatever its text says) join
    it, northd gives the datapath that key (the Geneve VNI), pods talk across nodes, and a pod
    of a tenant the network does not grant is refused (120) with nothing made."""
    from tenantnet.kube.nbswitches import SwitchKeeper
    from tenantnet.plugin import kubecache
    from tenantnet.plugin.tenants import TENANT_LABEL

    tn = {"metadata": {"name": "ov-tn", "uid": "u-ov", "generation": 1}, "spec": {
        "tenants": ["team-a"], "fabric": {"mode": "ovs", "overlay": "geneve", "rail": "rail0"}, "vlan": 321,
        "ipam": {"ranges": [[{"subnet": "10.88.32.0/24"}]], "blockSize": 28}}}
    keeper = SwitchKeeper(f"unix:{lab.root}/central/nb.sock")
    try:
        result = keeper.sync({"ov-tn": 321})
    finally:
        keeper.close()
    assert not result.unreachable and result.statuses["ov-tn"].switch == "tn-ov-tn.321"
    configs = {}
    for node in lab.nodes[:2]:
        state = next(line.split(":", 1)[1].strip() for line in Path(node.node_config).read_text().splitlines()
                     if line.startswith("stateDir:"))
        cache = kubecache.CacheWriter(state)
        cache.put("tenantnetworks", "ov-tn", tn)
        for ns in ("team-a", "team-b"):
            cache.put("namespaces", ns, kubecache.namespace_doc(ns, {TENANT_LABEL: ns}))
        cache.mark_synced(1.0, "lab", {})
        configs[node.name] = tmp_path / f"{node.name}.yaml"
        configs[node.name].write_text(Path(node.node_config).read_text() + "kubernetes: true\n")
    # The tenant's NAD text asks for another rail and segment: the TenantNetwork decides.
    nad = {"cniVersion": "1.0.0", "name": "ov-tn", "type": "tenantnet", "tenantNetwork": "ov-tn",
           "rail": "rail1", "vlan": 999}
    n1, n2 = lab.nodes[:2]
    a, b, c = pod_netns(lab, n1, "a7"), pod_netns(lab, n2, "b7"), pod_netns(lab, n2, "c7")
    code, ra = cni("ADD", n1, nad, "a7" * 32, a, str(configs[n1.name]))
    assert code == 0, ra
    code, rb = cni("ADD", n2, nad, "b7" * 32, b, str(configs[n2.name]))
    assert code == 0, rb
    try:
        ports = [n for n, p in lsps(lab).items() if p["external_ids"].get("tenantnet-network") == "ov-tn"]
        assert len(ports) == 2 and {switch_of(lab, p) for p in ports} == {"tn-ov-tn.321"}
        assert {chassis_of(lab, p) for p in ports} == {n1.name, n2.name}  # rail0, not the NAD's rail1
        key = ovn.sbctl(lab.root, "--bare", "--columns=tunnel_key", "find", "Datapath_Binding",
                        "external_ids:name=tn-ov-tn.321").strip()
        assert key == "321"
        assert ping(a, address_of(rb))
        before = set(lsps(lab))
        code, err = cni("ADD", n2, nad, "c7" * 32, c, str(configs[n2.name]), "team-b")
        assert code == 1 and err["code"] == 120, err
        assert set(lsps(lab)) == before and not link(c)
    finally:
        cni("DEL", n1, nad, "a7" * 32, a, str(configs[n1.name]))
        cni("DEL", n2, nad, "b7" * 32, b, str(configs[n2.name]))


def test_an_unreachable_northbound_fails_the_add_with_11_and_leaves_nothing(lab: ovn.OvnLab,
                                                                             tmp_path: Path) -> None:
    """NB not reachable: nothing was sent, so the ADD's rollback has no logical port to undo —
    code 11 (try again later), and no record, veth or OVS port is left for a DEL to find."""
    n1 = lab.nodes[0]
    broken = tmp_path / "node.yaml"
    state = tmp_path / "state"
    text = Path(n1.node_config).read_text().replace(
        f"northbound: unix:{lab.root}/central/nb.sock", f"northbound: unix:{tmp_path}/no-nb.sock")
    text = "".join(f"stateDir: {state}\n" if line.startswith("stateDir:") else line
                   for line in text.splitlines(keepends=True))
    broken.write_text(text)
    a = pod_netns(lab, n1, "a8")
    ports_before = set(ovn.vsctl(n1, "list-ports", "br-int").split())
    code, err = cni("ADD", n1, conf("ov-nonb"), "a8" * 32, a, str(broken))
    assert code == 1 and err["code"] == 11 and "no-nb.sock" in err["msg"], err
    assert not link(a)
    assert set(ovn.vsctl(n1, "list-ports", "br-int").split()) == ports_before
    records = [p for p in state.rglob("*.json") if "ov-nonb" in str(p) and "ipam" not in str(p)]
    assert not records, records
