"""Tenant isolation on overlay networks, with real traffic across the OVN lab's nodes.

Five tenants on ONE subnet (10.88.50.0/24), each reached only through tenantnet's real ADD
exec'd inside a node's namespace: three overlay networks (red, green, blue: one logical
switch each) and one network with two segments (`vlan` 10 and 20: tn-seg.10, tn-seg.20).
Each tenant has a pod on two of the three nodes. Cluster IPAM gives each network its own
range of the /24, so an address names one pod in the whole lab and a reply can only come
from that pod.

For every pair of tenants, from a pod of one to a pod of the other on another node: no ARP
answer, and — with the other pod's MAC put in the neighbour table by hand, so the frames do
leave — no ICMP reply and no TCP connection. Within each tenant across nodes: ICMP and TCP.
Port security: a pod that takes another MAC, or another address (a free one, or a live
pod's), reaches no one (its datagrams arrive nowhere) while a correct pod on the same
network still does, and it reaches them again once it is back to what its port allows.
The checks of one moment run together (their own UDP ports), the correct pod's among the
spoofer's: its datagrams arriving is the control that the spoofer's did not arrive for a
reason of the port, not of the moment.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tenantnet.lab import ovn
from tests.integration import overlaysupport as s

pytestmark = pytest.mark.root

# name -> (network config, the two nodes (indexes) its pods are on)
TENANTS = {
    "red": (s.overlay_conf("red", 16, 63), (0, 1)),
    "green": (s.overlay_conf("green", 64, 111), (1, 2)),
    "blue": (s.overlay_conf("blue", 112, 159), (2, 0)),
    # one network, two segments: one IPAM range (the network's), two logical switches
    "seg10": (s.overlay_conf("seg", 160, 254, segment=10), (0, 2)),
    "seg20": (s.overlay_conf("seg", 160, 254, segment=20), (1, 0)),
}


@dataclass
class Tenants:
    lab: ovn.OvnLab
    pods: dict[str, list[s.Pod]]      # tenant -> its two pods (on two different nodes)
    spoofer: s.Pod                    # a third red pod, on node3, for the port security test
    servers: list[s.TcpServer]


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    root = str(tmp_path_factory.mktemp("ovniso") / "lab")
    lab = ovn.up(root, nodes=3)
    servers: list[s.TcpServer] = []
    try:
        made = s.attach_all(lab, [(i, f"{name}{k}", conf) for name, (conf, where) in TENANTS.items()
                                  for k, i in enumerate(where)] + [(2, "red2", TENANTS["red"][0])])
        pods = {name: made[2 * n:2 * n + 2] for n, name in enumerate(TENANTS)}
        spoofer = made[-1]
        # started together, then waited for: their interpreters start at once
        for pod in [p for two in pods.values() for p in two]:
            servers.append(s.TcpServer(pod, wait=False))
        for server in servers:
            server.wait_ready()
        yield Tenants(lab, pods, spoofer, servers)
    finally:
        for server in servers:
            server.close()
        ovn.down(root)


def test_the_tenants_share_one_subnet_on_their_own_switches(tenants: Tenants) -> None:
    """What the other tests rest on: every pod is on 10.88.50.0/24, no address twice, each
    tenant on its own logical switch, its two pods on two nodes."""
    pods = [p for two in tenants.pods.values() for p in two] + [tenants.spoofer]
    ips = [p.ip for p in pods]
    assert all(ip.startswith("10.88.50.") for ip in ips) and len(set(ips)) == len(ips), ips
    switch_of = {name: ids.get("tenantnet-switch") for name, ids in s.logical_ports(tenants.lab)}
    switches = {}
    for tenant, two in tenants.pods.items():
        assert two[0].node.name != two[1].node.name
        lsps = [lsp for p in two for lsp in s.ports_of(tenants.lab, p)]
        assert len(lsps) == 2, (tenant, lsps)
        switches[tenant] = {switch_of[lsp] for lsp in lsps}
    assert switches == {"red": {"tn-red"}, "green": {"tn-green"}, "blue": {"tn-blue"},
                        "seg10": {"tn-seg.10"}, "seg20": {"tn-seg.20"}}


def test_within_a_tenant_across_nodes_icmp_and_tcp_pass(tenants: Tenants) -> None:
    def check(pair: tuple[s.Pod, s.Pod]) -> tuple[str, bool, str]:
        src, dst = pair
        return f"{src.name}@{src.node.name} -> {dst.name}@{dst.node.name}", s.ping(src, dst.ip), s.tcp(src, dst.ip)

    pairs = [(a, b) for a, b in tenants.pods.values()] + [(b, a) for a, b in tenants.pods.values()]
    results = s.concurrently([lambda pair=pair: check(pair) for pair in pairs])
    failed = [r for r in results if not (r[1] and r[2] == "echo")]
    assert not failed, failed


def _cross(src: s.Pod, dst: s.Pod) -> list[str]:
    """What leaked from tenant of `src` to `dst`'s (empty: nothing). Each wait is short (1 s)
    because these checks only ever run together with a positive control through the same
    function on the same machine load (red0 -> red1, which must show all three answers)."""
    leaks = []
    # ARP: the other's address never resolves
    if s.arp_answered(src, dst.ip):
        leaks.append(f"ARP answered: {s.neighbour(src, dst.ip)}")
    # ICMP and TCP with the frames addressed to the other pod's real MAC
    src.run("ip", "neigh", "replace", dst.ip, "lladdr", dst.mac, "dev", src.ifname, "nud", "permanent")
    try:
        if s.ping(src, dst.ip, deadline=1):
            leaks.append("ICMP answered")
        got = s.tcp(src, dst.ip, timeout=1)
        if got != "TimeoutError":  # an echo, or even a RST ("refused"), would be an answer
            leaks.append(f"TCP: {got}")
    finally:
        src.run("ip", "neigh", "del", dst.ip, "dev", src.ifname)
    return leaks


def test_every_pair_of_tenants_is_isolated_across_nodes(tenants: Tenants) -> None:
    """Both directions of every pair of tenants, each from a pod to the other tenant's pod on
    another node (red<->green ... seg10<->seg20): ARP, ICMP and TCP all unanswered. All 20
    run at once, together with the positive control (red0 -> red1, the same checks, which
    must see every answer): the negatives are not blind, whatever the machine's load."""
    checks = []
    for t1, t2 in itertools.permutations(tenants.pods, 2):
        src = tenants.pods[t1][0]
        dst = next(p for p in tenants.pods[t2] if p.node.name != src.node.name)
        checks.append((src, dst))
    assert len(checks) == 20 and {(a.name[:-1], b.name[:-1]) for a, b in checks} == \
        set(itertools.permutations(["red", "green", "blue", "seg10", "seg20"], 2))
    red0, red1 = tenants.pods["red"]
    *results, seen = s.concurrently([*(lambda a=a, b=b: _cross(a, b) for a, b in checks),
                                     lambda: _cross(red0, red1)])
    leaks = {f"{a.name}@{a.node.name} -> {b.name}@{b.node.name}": r
             for (a, b), r in zip(checks, results, strict=True) if r}
    assert not leaks, leaks
    # the same checks, in the same run, do see a pod of the own tenant: the negative above is
    # not a blind test
    assert [leak.split(":")[0] for leak in seen] == ["ARP answered", "ICMP answered", "TCP"], seen
    assert seen[2] == "TCP: echo" and red1.mac in seen[0], seen


@pytest.mark.parametrize("spoof", ["mac", "free-ip", "peer-ip"])
def test_port_security_drops_a_spoofing_pod(tenants: Tenants, spoof: str) -> None:
    """The third red pod (node3) sends as another MAC, or another address: its datagrams reach
    neither red pod (node1, node2), while red0 (correct) still reaches red1 at the same time;
    back to its own MAC and address, it reaches them again. As a live pod's address it takes
    red1's to send to red0, then red0's to send to red1 (sending to the address it holds
    would never leave it)."""
    red0, red1 = tenants.pods["red"]
    pod = tenants.spoofer
    assert s.udp_sources(pod, red1) == [pod.ip] * 10, "the pod is not reachable even before spoofing"
    # (the source it sends as, the pods it sends to)
    rounds = {"mac": [(pod.ip, [red0, red1])], "free-ip": [("10.88.50.9", [red0, red1])],
              "peer-ip": [(red1.ip, [red0]), (red0.ip, [red1])]}[spoof]
    for source, targets in rounds:
        if spoof == "mac":
            changed = ("link", "set", "dev", pod.ifname, "address", "0a:00:00:00:5b:01")
            restore = ("link", "set", "dev", pod.ifname, "address", pod.mac)
        else:
            changed = ("addr", "replace", f"{source}/24", "dev", pod.ifname)
            restore = ("addr", "del", f"{source}/24", "dev", pod.ifname)
            # the spoofed address as the only one: the kernel sends from it
            pod.run("ip", "addr", "del", f"{pod.ip}/24", "dev", pod.ifname)
        assert pod.run("ip", *changed).returncode == 0
        try:
            *reached, control = s.concurrently(
                [*(lambda t=t: s.udp_sources(pod, t, port=7788) for t in targets),
                 lambda: s.udp_sources(red0, red1, port=7789)])
            assert reached == [[]] * len(targets), \
                f"{spoof}: reached {[t.ip for t in targets]} as {source}: {reached}"
            assert control == [red0.ip] * 10
        finally:
            pod.run("ip", *restore)
            if spoof != "mac":
                pod.run("ip", "addr", "add", f"{pod.ip}/24", "dev", pod.ifname)
    assert s.concurrently([lambda: s.udp_sources(pod, red1), lambda: s.udp_sources(pod, red0)]) == \
        [[pod.ip] * 10] * 2
