"""The overlay lab (a simulation, `tenantnet/lab/ovn.py`): OVN central + two nodes with two
rails, each node in its own network namespace with its own OVS (userspace datapath) and one
ovn-controller (one OVN chassis) per rail, joined by a Linux-bridge top-of-rack switch per
rail. Tenant A's pods on the two nodes reach each other over Geneve; tenant B, another
logical switch with the same subnet, reaches its own pods and not A's (neither ICMP nor ARP);
a network on rail 1 tunnels through rail 1's underlay and not rail 0's; each node's tenantnet
node config loads; `down` leaves no namespace, link, process or directory of the lab."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenantnet.lab import ovn

pytestmark = pytest.mark.root

SUBNET = "10.77.0.{}/24"  # both tenants: the same subnet, on purpose


def ping(pod: ovn.LabPod, ip: str, deadline: int = 5) -> subprocess.CompletedProcess[str]:
    """Ping until one reply comes or `deadline` s passed (-i 5 ms: the first reply is timed)."""
    return subprocess.run(["ip", "netns", "exec", pod.netns, "ping", "-n", "-q", "-c", "1", "-i", "0.005",
                           "-w", str(deadline), ip.split("/")[0]], capture_output=True, text=True, timeout=30)


def lsp_add(root: str, switch: str, pod_lsp: str, mac: str, ip: str) -> None:
    addr = f"{mac} {ip.split('/')[0]}"
    ovn.nbctl(root, "lsp-add", switch, pod_lsp, "--", "lsp-set-addresses", pod_lsp, addr,
              "--", "lsp-set-port-security", pod_lsp, addr)


def chassis_of(root: str, lsp: str) -> str:
    out = ovn.sbctl(root, "--format=json", "--columns=chassis", "find", "Port_Binding", f"logical_port={lsp}")
    rows = json.loads(out)["data"]
    return "" if not rows or rows[0][0] == ["set", []] else rows[0][0][1]


def wait_bound(root: str, lsp: str, timeout: float = 10) -> float:
    start = time.monotonic()
    while not chassis_of(root, lsp):
        assert time.monotonic() - start < timeout, f"{lsp} was not bound by any chassis within {timeout} s"
        time.sleep(0.005)
    return time.monotonic() - start


SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7777)); s.listen(1); s.settimeout(10); print("ready", flush=True)
c, _ = s.accept(); c.sendall(c.recv(64)); c.close()
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], 7777), timeout=5); c.sendall(b"over geneve")
sys.stdout.write(c.recv(64).decode())
"""


def tcp_echo(server: ovn.LabPod, client: ovn.LabPod) -> bytes:
    """A TCP echo from `client` to a server in `server`'s namespace: what comes back."""
    srv = subprocess.Popen(["ip", "netns", "exec", server.netns, sys.executable, "-c", SERVER],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert srv.stdout is not None and srv.stdout.readline().strip() == b"ready"
        out = subprocess.run(["ip", "netns", "exec", client.netns, sys.executable, "-c", CLIENT,
                              server.ip.split("/")[0]], capture_output=True, timeout=15)
        assert out.returncode == 0, out.stderr.decode()
        return out.stdout
    finally:
        srv.kill()
        srv.wait()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ovn.OvnLab]:
    root = str(tmp_path_factory.mktemp("ovn") / "lab")
    made = ovn.up(root, nodes=2, rails=2)
    try:
        yield made
    finally:
        ovn.down(root)


def test_lab_is_up(lab: ovn.OvnLab) -> None:
    status = ovn.status(lab.root)
    assert status is not None and status["ovn"]["running"]
    assert [n["name"] for n in status["nodes"]] == ["node1", "node2"]
    assert all(n["running"] for n in status["nodes"])
    assert status["nodes"][1]["encapIps"] == ["192.168.100.2", "192.168.101.2"]
    for node in lab.nodes:
        # every node's OVS runs in its own namespace, and its chassis registered in the SB
        pid = ovn._pid(node.root, "ovs-vswitchd")
        assert pid and os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert node.netns in subprocess.run(["ip", "netns", "identify", str(pid)],
                                            capture_output=True, text=True).stdout
    # one chassis per rail NIC per node, each with its rail's address as its Geneve endpoint
    want = {"node1": "192.168.100.1", "node1-rail1": "192.168.101.1",
            "node2": "192.168.100.2", "node2-rail1": "192.168.101.2"}
    deadline = time.monotonic() + 10
    while (encaps := encap_ips(lab.root)) != want:
        assert time.monotonic() < deadline, f"SB Encap rows {encaps}, expected {want}"
        time.sleep(0.05)
    chassis = json.loads(ovn.sbctl(lab.root, "--format=json", "--columns=name", "list", "Chassis"))["data"]
    assert sorted(row[0] for row in chassis) == sorted(want)
    # transport zones: each integration bridge tunnels only to the same rail on the other node
    for node, peer in ((lab.nodes[0], "2"), (lab.nodes[1], "1")):
        for rail in node.rails:
            deadline = time.monotonic() + 10
            while (remotes := tunnel_remotes(node, rail.integration_bridge)) != [f"192.168.{100 + rail.index}.{peer}"]:
                assert time.monotonic() < deadline, f"{node.name} {rail.integration_bridge}: tunnels to {remotes}"
                time.sleep(0.05)


def encap_ips(root: str) -> dict[str, str]:
    rows = json.loads(ovn.sbctl(root, "--format=json", "--columns=chassis_name,ip", "list", "Encap"))["data"]
    return {name: ip for name, ip in rows}


def tunnel_remotes(node: ovn.OvnNode, bridge: str) -> list[str]:
    """The remote IPs of the Geneve ports on `bridge` of `node`."""
    remotes = []
    for port in ovn.vsctl(node, "list-ports", bridge).split():
        options = ovn.vsctl(node, "get", "Interface", port, "options")
        if "remote_ip" in options and ovn.vsctl(node, "get", "Interface", port, "type").strip() == "geneve":
            remotes.append(options.split('remote_ip="')[1].split('"')[0])
    return sorted(remotes)


def test_overlay_ping_and_tenant_isolation(lab: ovn.OvnLab) -> None:
    n1, n2 = lab.nodes
    root = lab.root
    ovn.nbctl(root, "ls-add", "tenant-a", "--", "ls-add", "tenant-b")
    a1 = ("a1", "tenant-a-a1", "0a:00:00:00:a0:01", SUBNET.format(1))
    a2 = ("a2", "tenant-a-a2", "0a:00:00:00:a0:02", SUBNET.format(2))
    b1 = ("b1", "tenant-b-b1", "0a:00:00:00:b0:03", SUBNET.format(3))
    b2 = ("b2", "tenant-b-b2", "0a:00:00:00:b0:04", SUBNET.format(4))
    for _name, lsp, mac, ip in (a1, a2):
        lsp_add(root, "tenant-a", lsp, mac, ip)
    for _name, lsp, mac, ip in (b1, b2):
        lsp_add(root, "tenant-b", lsp, mac, ip)
    pod_a1 = ovn.plug_pod(lab, n1, *a1)
    pod_b1 = ovn.plug_pod(lab, n1, *b1)
    pod_b2 = ovn.plug_pod(lab, n2, *b2)
    pod_a2 = ovn.plug_pod(lab, n2, *a2, bind=False)
    wait_bound(root, pod_a1.lsp)

    # "port bound -> first ping delivered": from setting iface-id on node2 to a1's first reply
    start = time.monotonic()
    ovn.bind_pod(n2, pod_a2)
    bound = wait_bound(root, pod_a2.lsp)
    result = ping(pod_a1, pod_a2.ip)
    first_ping = time.monotonic() - start
    assert result.returncode == 0, f"a1 (node1) -> a2 (node2) over Geneve failed:\n{result.stdout}{result.stderr}"
    assert chassis_of(root, pod_a1.lsp) != chassis_of(root, pod_a2.lsp)
    print(f"\nport bound (iface-id set) -> SB binding {bound * 1000:.0f} ms, "
          f"-> first ping delivered {first_ping * 1000:.0f} ms")
    sent = result.stdout.split("packets transmitted")[0].split()[-1]
    rtt = subprocess.run(["ip", "netns", "exec", pod_a2.netns, "ping", "-n", "-q", "-c", "20", "-i", "0.01",
                          pod_a1.ip.split("/")[0]], capture_output=True, text=True, timeout=30)
    assert rtt.returncode == 0, rtt.stdout
    print(f"echo requests sent until the first reply: {sent}; pod RTT {rtt.stdout.strip().splitlines()[-1]}")
    # the path is a Geneve tunnel that ovn-controller made towards the other node's encap IP
    tunnels = ovn.vsctl(n1, "--format=json", "--columns=type,options", "find", "Interface", "type=geneve")
    assert "192.168.100.2" in tunnels, tunnels

    # TCP too (it needs the pod ends' TX checksum offload off in the userspace datapath)
    assert tcp_echo(pod_a2, pod_a1) == b"over geneve"

    # Tenant B works in itself, across nodes...
    assert ping(pod_b1, pod_b2.ip).returncode == 0
    # ...and neither tenant reaches the other, on the same subnet, on the same or another node.
    for src, dst in ((pod_a1, pod_b2), (pod_a1, pod_b1), (pod_b2, pod_a2), (pod_b2, pod_a1)):
        blocked = ping(src, dst.ip, deadline=1)
        assert blocked.returncode != 0, f"{src.name} reached {dst.name} of the other tenant:\n{blocked.stdout}"
        # no ARP answer either: the neighbour entry never got the other tenant's MAC
        neigh = ovn.ip_ns(src.netns, "neigh", "show", dst.ip.split("/")[0], "dev", "eth0")
        assert dst.mac not in neigh and "lladdr" not in neigh, neigh
    # the same neighbour table does hold the own tenant's peer
    assert pod_a2.mac in ovn.ip_ns(pod_a1.netns, "neigh", "show", pod_a2.ip.split("/")[0], "dev", "eth0")
    # TX checksum offload is off on the pod ends (userspace datapath, CNI-FACTS §7)
    assert ovn.tx_checksum_in(pod_a1.netns, "eth0") is False
    assert ovn.tx_checksum_in(pod_b2.netns, "eth0") is False


def packets(link: str) -> int:
    """rx + tx packets of a host-side link (a node's underlay veth, ToR end)."""
    stats = Path("/sys/class/net", link, "statistics")
    return int((stats / "rx_packets").read_text()) + int((stats / "tx_packets").read_text())


def test_rail1_traffic_stays_on_rail1(lab: ovn.OvnLab) -> None:
    """A network whose ports are bound on the rail-1 chassis of two nodes: ping and TCP pass,
    and the Geneve packets cross rail 1's ToR, none rail 0's."""
    n1, n2 = lab.nodes
    root = lab.root
    ovn.nbctl(root, "ls-add", "rail1-net")
    p1 = ("r1a", "rail1-net-r1a", "0a:00:00:00:c1:01", "10.78.0.1/24")
    p2 = ("r1b", "rail1-net-r1b", "0a:00:00:00:c1:02", "10.78.0.2/24")
    for _name, lsp, mac, ip in (p1, p2):
        lsp_add(root, "rail1-net", lsp, mac, ip)
    pod1 = ovn.plug_pod(lab, n1, *p1, rail=1)
    pod2 = ovn.plug_pod(lab, n2, *p2, rail=1)
    wait_bound(root, pod1.lsp)
    wait_bound(root, pod2.lsp)
    assert chassis_uuid_name(root, pod1.lsp) == "node1-rail1"
    assert chassis_uuid_name(root, pod2.lsp) == "node2-rail1"
    # the first exchange (ARP, tunnel neighbour resolution) before the counters are read
    assert ping(pod1, pod2.ip).returncode == 0
    legs = {f"{rail}{n.index}": f"{lab.tag}h{n.index}r{rail[-1]}" for n in lab.nodes for rail in ("rail0", "rail1")}
    before = {leg: packets(link) for leg, link in legs.items()}
    burst = subprocess.run(["ip", "netns", "exec", pod1.netns, "ping", "-n", "-q", "-c", "50", "-i", "0.005",
                            pod2.ip.split("/")[0]], capture_output=True, text=True, timeout=30)
    assert burst.returncode == 0 and " 0% packet loss" in burst.stdout, burst.stdout
    assert tcp_echo(pod2, pod1) == b"over geneve"
    delta = {leg: packets(legs[leg]) - before[leg] for leg in legs}
    print(f"\nunderlay packets (ToR-side veths, rx+tx) during 50 pings + one TCP echo on rail 1: {delta}")
    # 50 requests + 50 replies cross each node's rail-1 leg, plus the TCP exchange
    assert delta["rail11"] >= 100 and delta["rail12"] >= 100, delta
    assert delta["rail01"] == 0 and delta["rail02"] == 0, delta


def chassis_uuid_name(root: str, lsp: str) -> str:
    """The name of the chassis `lsp` is bound on."""
    uuid = chassis_of(root, lsp)
    return ovn.sbctl(root, "get", "Chassis", uuid, "name").strip().strip('"')


def test_status_json(lab: ovn.OvnLab) -> None:
    """`tenantnetctl lab status --json` of the overlay lab: OVN endpoints, per node its netns,
    node config and per rail its chassis, bridges and encap address."""
    ctl = str(Path(sys.executable).parent / "tenantnetctl")
    out = subprocess.run([ctl, "lab", "status", "--dir", lab.root, "--json"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    shown = json.loads(out.stdout)
    assert shown["ovn"]["nb"] == f"unix:{lab.root}/central/nb.sock"
    assert shown["ovn"]["sb"] == f"unix:{lab.root}/central/sb.sock"
    assert shown["etcd"].startswith("http://192.168.99.254:")
    node2 = shown["nodes"][1]
    assert node2["netns"] == lab.nodes[1].netns and node2["nodeConfig"] == f"{lab.root}/node2/tenantnet.yaml"
    assert node2["rails"] == {
        "rail0": {"chassis": "node2", "integrationBridge": "br-int", "underlayBridge": "br-rail0",
                  "encapIp": "192.168.100.2", "running": True},
        "rail1": {"chassis": "node2-rail1", "integrationBridge": "br-int-rail1", "underlayBridge": "br-rail1",
                  "encapIp": "192.168.101.2", "running": True},
    }


def test_node_configs_load(lab: ovn.OvnLab) -> None:
    """Each node's config loads with tenantnet's own loader and names that node's OVS, dirs
    and the lab's etcd, which answers from inside the node's namespace."""
    import yaml

    from tenantnet.plugin import nodeconfig

    for node in lab.nodes:
        text = Path(node.node_config).read_text()
        try:
            config = nodeconfig.load(node.node_config)
        except Exception as exc:  # a tree whose loader does not know `ovn` yet: the rest must load
            assert "'ovn'" in str(exc), exc
            flat = Path(node.root, "flat.yaml")
            flat.write_text(text.split("\novn:\n")[0] + "\n")
            config = nodeconfig.load(str(flat))
        assert config.node_name == node.name
        assert config.ovsdb == node.ovsdb
        assert config.state_dir == f"{node.root}/state" and config.agent_socket == f"{node.root}/agent.sock"
        assert config.ipam_data_dir == f"{node.root}/ipam" and config.ipam_data_dirs[0] == f"{node.root}/ipam"
        assert config.etcd_endpoints == (lab.etcd,) and config.cluster_pools == ("10.88.0.0/16",)
        section = yaml.safe_load(text)["ovn"]
        assert section["northbound"] == lab.nb
        assert section["rails"]["rail1"] == {"integrationBridge": "br-int-rail1", "ovsdb": node.ovsdb,
                                             "underlayMtu": 1500, "underlayBridge": "br-rail1",
                                             "chassis": f"{node.name}-rail1", "userspaceDatapath": True}
        # the underlay's MTU is what the config says
        mtu = ovn.ip_ns(node.netns, "-j", "link", "show", "rail1")
        assert json.loads(mtu)[0]["mtu"] == section["rails"]["rail1"]["underlayMtu"]
        # etcd answers at the configured endpoint from inside the node (the management network)
        probe = ("import sys\nfrom ipam.etcd import Etcd, EtcdConfig\n"
                 "Etcd(EtcdConfig((sys.argv[1],), timeout=2)).get('/probe'); print('ok')")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        out = subprocess.run(ovn.in_node(node, [sys.executable, "-c", probe, lab.etcd]), capture_output=True,
                             text=True, timeout=30, env=env)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    # arp_ignore on the underlay ports (the kernel would answer ARP next to OVS)
    for rail in lab.nodes[0].rails:
        got = subprocess.run(ovn.in_node(lab.nodes[0], ["sysctl", "-n", f"net.ipv4.conf.{rail.name}.arp_ignore"]),
                             capture_output=True, text=True, timeout=10).stdout.strip()
        assert got == "1", (rail.name, got)


def test_in_node_and_pod_netns(lab: ovn.OvnLab) -> None:
    node = lab.nodes[0]
    env = subprocess.run(ovn.in_node(node, ["sh", "-c", "echo $TENANTNET_CONFIG; ip -br link"]),
                         capture_output=True, text=True, timeout=10)
    assert env.returncode == 0 and env.stdout.splitlines()[0] == node.node_config
    assert "br-int-rail1" in env.stdout and "mgmt" in env.stdout
    netns = ovn.make_pod_netns(lab, node, "empty")
    assert netns in ovn._lab_netns(lab.tag)
    links = ovn.ip_ns(netns, "-br", "link")
    assert links.split()[0] == "lo" and len(links.strip().splitlines()) == 1, links


def test_down_leaves_nothing(lab: ovn.OvnLab) -> None:
    pids = [ovn._pid(n.root, d) for n in lab.nodes for d in n.daemons()]
    pids += [ovn._pid(os.path.join(lab.root, "central"), d) for d in ovn.CENTRAL_DAEMONS]
    pids.append(ovn._pid(os.path.join(lab.root, "etcd"), "etcd"))
    assert all(pids) and len(pids) == 2 * 4 + 3 + 1, pids
    removed = ovn.down(lab.root)
    assert "netns tn" in " ".join(removed) and "etcd" in removed
    assert ovn._lab_netns(lab.tag) == []
    assert ovn._lab_links(lab.tag) == []
    assert not os.path.exists(lab.root)
    for pid in pids:
        assert pid is not None and ovn.has_exited(pid) or lab.root not in open(f"/proc/{pid}/cmdline").read()
    assert ovn._strays(lab.root) == []
    assert ovn.status(lab.root) is None


def test_cli_overlay_up_status_down(tmp_path: Path) -> None:
    """`tenantnetctl lab up --nodes N --overlay` (one node, two rails, no etcd: the module's
    lab has one), status, down."""
    ctl = str(Path(sys.executable).parent / "tenantnetctl")
    root = str(tmp_path / "lab")
    try:
        up = subprocess.run([ctl, "lab", "up", "--nodes", "1", "--rails", "2", "--overlay", "--no-etcd",
                             "--dir", root, "--json"], capture_output=True, text=True, timeout=60)
        assert up.returncode == 0, up.stderr
        shown = json.loads(up.stdout)
        assert not shown.get("etcd")
        assert "etcdEndpoints" not in Path(shown["nodes"][0]["nodeConfig"]).read_text()
        assert shown["nodes"][0]["encapIps"] == ["192.168.100.1", "192.168.101.1"]
        assert shown["ovn"]["nb"] == f"unix:{root}/central/nb.sock"
        status = subprocess.run([ctl, "lab", "status", "--dir", root], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0 and "overlay lab" in status.stdout, status.stdout + status.stderr
        down = subprocess.run([ctl, "lab", "down", "--dir", root], capture_output=True, text=True, timeout=60)
        assert down.returncode == 0 and "ovn-northd" in down.stdout, down.stdout + down.stderr
        assert ovn._lab_netns(ovn.tag_of(root)) == [] and ovn._lab_links(ovn.tag_of(root)) == []
        gone = subprocess.run([ctl, "lab", "status", "--dir", root], capture_output=True, text=True, timeout=30)
        assert gone.returncode == 3
    finally:
        ovn.down(root)
