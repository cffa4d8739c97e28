"""The overlay lab (a simulation, `tenantnet/lab/ovn.py`): OVN central + two nodes, each in its
own network namespace with its own OVS (userspace datapath) and ovn-controller, joined by a
Linux-bridge top-of-rack switch on one rail. Tenant A's pods on the two nodes reach each other
over Geneve; tenant B, another logical switch with the same subnet, reaches its own pods and
not A's (neither ICMP nor ARP); `down` leaves no namespace, link or process of the lab."""

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
    made = ovn.up(root, nodes=2)
    try:
        yield made
    finally:
        ovn.down(root)


def test_lab_is_up(lab: ovn.OvnLab) -> None:
    status = ovn.status(lab.root)
    assert status is not None and status["ovn"]["running"]
    assert [n["name"] for n in status["nodes"]] == ["node1", "node2"]
    assert all(n["running"] for n in status["nodes"])
    assert status["nodes"][1]["encapIps"] == ["192.168.100.2"]
    for node in lab.nodes:
        # every node's OVS runs in its own namespace, and its chassis registered in the SB
        pid = ovn._pid(node.root, "ovs-vswitchd")
        assert pid and os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert node.netns in subprocess.run(["ip", "netns", "identify", str(pid)],
                                            capture_output=True, text=True).stdout
    deadline = time.monotonic() + 10
    while "node2" not in (chassis := ovn.sbctl(lab.root, "--columns=name,encaps", "list", "Chassis")):
        assert time.monotonic() < deadline, chassis
        time.sleep(0.05)
    assert "node1" in chassis


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


def test_down_leaves_nothing(lab: ovn.OvnLab) -> None:
    pids = [ovn._pid(n.root, d) for n in lab.nodes for d in ovn.NODE_DAEMONS]
    pids += [ovn._pid(os.path.join(lab.root, "central"), d) for d in ovn.CENTRAL_DAEMONS]
    assert all(pids), pids
    removed = ovn.down(lab.root)
    assert "netns tn" in " ".join(removed)
    assert ovn._lab_netns(lab.tag) == []
    assert ovn._lab_links(lab.tag) == []
    assert not os.path.exists(lab.root)
    for pid in pids:
        assert pid is not None and not os.path.exists(f"/proc/{pid}/cmdline") or \
            lab.root not in open(f"/proc/{pid}/cmdline").read()
    assert ovn.status(lab.root) is None


def test_cli_overlay_up_status_down(tmp_path: Path) -> None:
    """`tenantnetctl lab up --nodes N --overlay` (one node, two rails), status, down."""
    ctl = str(Path(sys.executable).parent / "tenantnetctl")
    root = str(tmp_path / "lab")
    try:
        up = subprocess.run([ctl, "lab", "up", "--nodes", "1", "--rails", "2", "--overlay", "--dir", root,
                             "--json"], capture_output=True, text=True, timeout=60)
        assert up.returncode == 0, up.stderr
        shown = json.loads(up.stdout)
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
