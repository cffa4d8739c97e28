"""`make demo`'s overlay act (issue 29) — a SIMULATION: the OVN overlay lab (tenantnet/lab/ovn.py).

Three simulated nodes with two rail NICs each; two tenants on rail 1, *in the same subnet*,
each tenant network one OVN logical switch. Every pod is attached by tenantnet itself: the
installed plugin exec'd inside the node's network namespace with that node's config
(a CNI ADD as the kubelet would make it), addresses from tenantnet-ipam's cluster mode on the
lab's etcd. The act shows, with real packets through the nodes' OVS (userspace datapath):

- within a tenant, across nodes: ICMP, TCP and ARP answered;
- across tenants, same subnet, same or another node: none of the three;
- a frame with a spoofed source MAC dropped by the port's port security (a listener in the
  destination pod counts the frames that arrive: 0 spoofed, all genuine ones);
- the rail's Geneve traffic leaving through rail 1's underlay: the packet counters of the
  nodes' rail-1 legs (ToR side) rise, rail 0's do not.

Prints one `[ok  ]`/`[FAIL]` line per claim; `main` returns the number of failures.
Everything it made goes also on failure: DEL of every attachment, then `ovn.down`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tenantnet.lab import ovn

ROOT = "/run/tenantnet-demo-overlay"
NODES = 3
RAILS = 2
RAIL = "rail1"  # the tenants' rail; rail 0 carries nothing of theirs
PLUGIN = str(Path(sys.executable).parent / "tenantnet")
SUBNET = "10.88.7.0/24"  # both tenants: one subnet, on purpose (inside the lab's cluster pool)
TENANTS = {"tenant-a": (100, "10.88.7.10", "10.88.7.99"), "tenant-b": (200, "10.88.7.100", "10.88.7.199")}
# pod -> (tenant network, node index)
PODS = {"a1": ("tenant-a", 1), "a2": ("tenant-a", 2), "a3": ("tenant-a", 3),
        "b1": ("tenant-b", 1), "b3": ("tenant-b", 3)}
SPOOFED_MAC = "0a:de:ad:be:ef:01"
FRAMES = 10
T = TypeVar("T")


def concurrently(checks: Iterable[Callable[[], T]]) -> list[T]:
    """Each check's result, in order, the checks run at once: each is a subprocess in a pod's
    namespace waiting on the network, so a row of negative checks costs one timeout, not one
    each (the claims are still printed in their order)."""
    from concurrent.futures import ThreadPoolExecutor

    todo = list(checks)
    with ThreadPoolExecutor(max(1, len(todo))) as pool:
        return list(pool.map(lambda check: check(), todo))


def network_config(tenant: str) -> dict[str, object]:
    """The tenant's NAD: an overlay network on rail 1; `vlan` is its segment (no 802.1Q tag)."""
    segment, lo, hi = TENANTS[tenant]
    return {"cniVersion": "1.0.0", "name": tenant, "type": "tenantnet", "mode": "ovs",
            "overlay": "geneve", "rail": RAIL, "vlan": segment,
            "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28, "releaseAfter": 0},
                     "ranges": [[{"subnet": SUBNET, "rangeStart": lo, "rangeEnd": hi}]]}}


@dataclass
class Pod:
    name: str
    tenant: str
    node: ovn.OvnNode
    netns: str
    container_id: str
    mac: str = ""
    ip: str = ""  # without prefix


@dataclass
class Act:
    lab: ovn.OvnLab
    pods: dict[str, Pod] = field(default_factory=dict)
    failures: int = 0

    def claim(self, ok: bool, what: str, detail: str = "") -> bool:
        print(f"  [{'ok  ' if ok else 'FAIL'}] {what}", flush=True)
        if detail and not ok:
            print(f"         {detail.strip()[:400]}", flush=True)
        self.failures += not ok
        return ok


def bold(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def cni(command: str, pod: Pod) -> subprocess.CompletedProcess[bytes]:
    """The plugin exec'd inside the pod's node namespace (that node's config), as a runtime would."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": pod.container_id,
           "CNI_NETNS": f"/run/netns/{pod.netns}", "CNI_IFNAME": "net1", "CNI_PATH": str(Path(PLUGIN).parent),
           "CNI_ARGS": f"K8S_POD_NAMESPACE=demo5;K8S_POD_NAME={pod.name}", "PATH": os.environ.get("PATH", "")}
    config = json.dumps(network_config(pod.tenant)).encode()
    return subprocess.run(ovn.in_node(pod.node, [PLUGIN]), input=config, env=env, capture_output=True,
                          timeout=60)


def in_pod(pod: Pod, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", pod.netns, *cmd], capture_output=True, text=True,
                          timeout=timeout)


def pings(src: Pod, dst: Pod, deadline: int) -> bool:
    """One echo reply within `deadline` s (ping keeps sending until then: the first request
    after a binding may meet flows still being installed)."""
    answered = in_pod(src, "ping", "-n", "-q", "-c", "1", "-i", "0.2", "-w", str(deadline), dst.ip)
    return answered.returncode == 0


# --- probes, each run in a pod's namespace (`python -m tenantnet.lab.overlaydemo <probe> ...`):
# AF_PACKET frames and plain sockets on net1, so the demo needs no arping, nc or tcpdump.

def arp_probe(mac: str, ip: str, target: str, seconds: float) -> str:
    """Broadcast ARP requests who-has `target` from (`mac`, `ip`) until an answer or `seconds`:
    the answering MAC, or ''."""
    import socket
    import struct

    own, address, wanted = bytes.fromhex(mac.replace(":", "")), socket.inet_aton(ip), socket.inet_aton(target)
    request = (b"\xff" * 6 + own + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
               + own + address + b"\0" * 6 + wanted)
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806)) as s:
        s.bind(("net1", 0))
        s.settimeout(0.2)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            s.send(request)
            try:
                while True:
                    frame = s.recv(128)
                    if frame[20:22] == b"\0\x02" and frame[28:32] == wanted:  # a reply from the target
                        return frame[22:28].hex(":")
            except TimeoutError:
                pass
    return ""


def _checksum(data: bytes) -> bytes:
    import struct

    data += b"\0" * (len(data) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return struct.pack("!H", ~total & 0xFFFF)


def send_frames(src_mac: str, dst_mac: str, src: str, dst: str, marker: str, count: int) -> None:
    """`count` ICMP echo requests src -> dst carrying `marker`, Ethernet source `src_mac` — the
    pod's own or a spoofed one; everything else in the frames is the same."""
    import socket
    import struct

    macs = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", ""))
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind(("net1", 0))
        for seq in range(count):
            icmp = struct.pack("!BBHHH", 8, 0, 0, 0x7E57, seq) + marker.encode()
            icmp = icmp[:2] + _checksum(icmp) + icmp[4:]
            ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), seq, 0, 64, 1, 0,
                             socket.inet_aton(src), socket.inet_aton(dst))
            ip = ip[:10] + _checksum(ip) + ip[12:]
            s.send(macs + b"\x08\x00" + ip + icmp)


def count_frames(marker: str, seconds: float) -> None:
    """Print `ready`, then how many incoming frames on net1 carried `marker`: counted until
    stdin closes (the sender is done) and `seconds` after (frames still in flight), so the
    window covers the whole send however slowly the sender starts."""
    import select
    import socket

    seen = 0
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003)) as s:
        s.bind(("net1", 0))
        s.settimeout(0.1)
        print("ready", flush=True)
        end = float("inf")
        while time.monotonic() < end:
            if end == float("inf") and select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.read(1):
                end = time.monotonic() + seconds
            try:
                frame, meta = s.recvfrom(2048)
            except TimeoutError:
                continue
            seen += marker.encode() in frame and meta[2] != socket.PACKET_OUTGOING
    print(seen, flush=True)


def tcp_serve(port: int) -> None:
    """An echo server: prints `ready`, echoes each connection's first message (until killed)."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(4)
        print("ready", flush=True)
        while True:
            conn, _ = s.accept()
            with conn:
                conn.sendall(conn.recv(64))


def tcp_echo(ip: str, port: int, timeout: float = 3) -> None:
    import socket

    with socket.create_connection((ip, port), timeout=timeout) as c:
        c.sendall(TCP_MESSAGE.encode())
        sys.stdout.write(c.recv(64).decode())


PROBES = {"arp": lambda a: print(arp_probe(a[0], a[1], a[2], float(a[3]))),
          "send": lambda a: send_frames(a[0], a[1], a[2], a[3], a[4], int(a[5])),
          "count": lambda a: count_frames(a[0], float(a[1])),
          "serve": lambda a: tcp_serve(int(a[0])),
          "connect": lambda a: tcp_echo(a[0], int(a[1]), *map(float, a[2:3]))}
MODULE = "tenantnet.lab.overlaydemo"
TCP_PORT = 7777
TCP_MESSAGE = "over geneve, rail 1"


def probe(pod: Pod, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return in_pod(pod, sys.executable, "-m", MODULE, *args, timeout=timeout)


def probe_popen(pod: Pod, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(["ip", "netns", "exec", pod.netns, sys.executable, "-m", MODULE, *args],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def arp(src: Pod, dst: Pod, seconds: float) -> str:
    """The MAC answering `src`'s ARP request for `dst`'s address, or ''."""
    return probe(src, "arp", src.mac, src.ip, dst.ip, str(seconds)).stdout.strip()


def frames_arriving(src: Pod, dst: Pod, src_mac: str, marker: str) -> int:
    """How many of FRAMES ICMP frames sent by `src` with Ethernet source `src_mac` reach `dst`."""
    listener = probe_popen(dst, "count", marker, "0.5", stdin=subprocess.PIPE)
    try:
        assert listener.stdout is not None and listener.stdin is not None
        if listener.stdout.readline().strip() != "ready":
            return -1
        probe(src, "send", src_mac, dst.mac, src.ip, dst.ip, marker, str(FRAMES))
        listener.stdin.close()  # sent: the listener counts 0.5 s more, then says how many
        return int(listener.stdout.readline().strip() or -1)
    finally:
        listener.kill()
        listener.wait()


def underlay_packets(lab: ovn.OvnLab) -> dict[str, int]:
    """rx+tx packets of each node's rail legs, read on the ToR side (host namespace)."""
    counts = {}
    for node in lab.nodes:
        for rail in node.rails:
            stats = Path("/sys/class/net", f"{lab.tag}h{node.index}r{rail.index}", "statistics")
            counts[f"{node.name}/{rail.name}"] = int((stats / "rx_packets").read_text()) + \
                int((stats / "tx_packets").read_text())
    return counts


@dataclass(frozen=True)
class LogicalPort:
    name: str
    addresses: str
    port_security: str
    external_ids: dict[str, str]


def _column(value: object) -> str:
    """An ovn-nbctl JSON set/atom as text: ["set", []] -> "", "x" -> "x", ["set", [a, b]] -> "a b"."""
    if isinstance(value, list) and value and value[0] == "set":
        return " ".join(map(str, value[1]))
    return str(value)


def our_ports(lab: ovn.OvnLab) -> list[LogicalPort]:
    """The NB's logical switch ports that tenantnet owns (external_ids)."""
    out = ovn.nbctl(lab.root, "--format=json", "--columns=name,addresses,port_security,external_ids", "find",
                    "Logical_Switch_Port", "external_ids:tenantnet-owner=tenantnet")
    return [LogicalPort(name=name, addresses=_column(addresses), port_security=_column(security),
                        external_ids=dict(ids[1]))
            for name, addresses, security, ids in json.loads(out)["data"]]


def chassis_of(lab: ovn.OvnLab, lsp: str) -> str:
    out = json.loads(ovn.sbctl(lab.root, "--format=json", "--columns=chassis", "find", "Port_Binding",
                               f"logical_port={lsp}"))["data"]
    if not out or out[0][0] == ["set", []]:
        return ""
    return ovn.sbctl(lab.root, "get", "Chassis", out[0][0][1], "name").strip().strip('"')


def attach(act: Act) -> None:
    bold("act 5: two tenants on overlay rail 1, three nodes, one subnet (CNI ADD inside each node)")
    # one ADD after another: concurrent ones (by node) measured no faster on 2 cores, the
    # plugin being CPU-bound there
    for name, (tenant, index) in PODS.items():
        node = act.lab.nodes[index - 1]
        pod = Pod(name=name, tenant=tenant, node=node, netns=ovn.make_pod_netns(act.lab, node, name),
                  container_id=(name * 32)[:64])
        act.pods[name] = pod
        out = cni("ADD", pod)
        if not act.claim(out.returncode == 0, f"ADD {name} on {node.name} ({tenant}, {RAIL})",
                         (out.stdout + out.stderr).decode()):
            continue
        result = json.loads(out.stdout)
        pod.ip = result["ips"][0]["address"].split("/")[0]
        pod.mac = next(i["mac"] for i in result["interfaces"] if i.get("sandbox"))
    for pod in act.pods.values():
        print(f"         {pod.name}: {pod.tenant:9} {pod.node.name}  net1 {pod.ip:12} {pod.mac}")
    ips = [p.ip for p in act.pods.values()]
    act.claim(all(ips) and len(set(ips)) == len(ips), f"{len(ips)} pods, {len(set(ips))} distinct addresses "
              f"in {SUBNET} (cluster IPAM on the lab's etcd)")
    rows = our_ports(act.lab)
    print("  logical switch ports tenantnet wrote (addresses = port security = MAC IP):")
    for row in rows:
        print(f"         {row.external_ids.get('tenantnet-switch', '?'):16} {row.name}  "
              f"port_security {row.port_security}")
    act.claim(len(rows) == len(PODS) and all(r.addresses == r.port_security != "" for r in rows),
              f"{len(rows)} logical ports, each with port security = its addresses")
    # every port bound on its node's rail-1 chassis (ovn-controller -n <node>-rail1)
    deadline = time.monotonic() + 10
    wanted = {p.name: f"{p.node.name}-{RAIL}" for p in act.pods.values()}
    by_container = {row.external_ids.get("tenantnet-container-id"): row.name for row in rows}
    lsps = {p.name: by_container.get(p.container_id, "") for p in act.pods.values()}
    while True:
        bound = {name: chassis_of(act.lab, lsp) for name, lsp in lsps.items()}
        if bound == wanted or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    act.claim(bound == wanted, "each port bound on its node's rail-1 chassis: "
              + ", ".join(f"{n}@{c}" for n, c in sorted(bound.items())), f"expected {wanted}")


def reachability(act: Act) -> None:
    p = act.pods
    bold("act 5: within a tenant across nodes: ICMP, TCP, ARP (real packets over Geneve)")
    within = (("a1", "a2"), ("a2", "a3"), ("a3", "a1"), ("b1", "b3"))
    server = probe_popen(p["a3"], "serve", str(TCP_PORT))
    try:
        assert server.stdout is not None
        ready = server.stdout.readline().strip() == "ready"
        *reached, answer, echo = concurrently([
            *(lambda src=src, dst=dst: pings(p[src], p[dst], 5) for src, dst in within),
            lambda: arp(p["a1"], p["a2"], 2),
            lambda: probe(p["a1"], "connect", p["a3"].ip, str(TCP_PORT))])
        for (src, dst), ok in zip(within, reached, strict=True):
            act.claim(ok, f"ICMP {src} ({p[src].node.name}) -> {dst} {p[dst].ip} ({p[dst].node.name}) "
                      "reaches")
        act.claim(answer == p["a2"].mac, f"ARP a1 who-has {p['a2'].ip}: answered {answer or 'nothing'}")
        act.claim(ready and echo.stdout == TCP_MESSAGE,
                  f"TCP a1 -> a3 {p['a3'].ip}:{TCP_PORT} echoed {echo.stdout!r}", echo.stderr)

        bold("act 5: across tenants, same subnet, same or another node: nothing passes")
        # all at once, the run costs the longest wait (TCP's 1.5 s); short waits, as the same
        # probes answered just above within a tenant
        crossing = (("b1", "a1"), ("b1", "a2"), ("a3", "b3"), ("a1", "b3"))
        asking = (("b1", "a1"), ("a1", "b3"))
        *crossed, refused = concurrently([
            *(lambda src=src, dst=dst: pings(p[src], p[dst], 1) for src, dst in crossing),
            *(lambda src=src, dst=dst: arp(p[src], p[dst], 1) for src, dst in asking),
            lambda: probe(p["b1"], "connect", p["a3"].ip, str(TCP_PORT), "1.5")])
        for (src, dst), ok in zip(crossing, crossed[:len(crossing)], strict=True):
            act.claim(not ok, f"ICMP {src} ({p[src].tenant}) -> {dst} {p[dst].ip} ({p[dst].tenant}, "
                      f"{'same node' if p[src].node is p[dst].node else 'another node'}) blocked")
        for (src, dst), answer in zip(asking, crossed[len(crossing):], strict=True):
            act.claim(answer == "", f"ARP {src} who-has {p[dst].ip} ({p[dst].tenant}): "
                      f"answered {answer or 'nothing'}")
        act.claim(refused.returncode != 0 and refused.stdout == "",
                  f"TCP b1 -> a3 {p['a3'].ip}:{TCP_PORT} (tenant-a's server): no connection "
                  f"({(refused.stderr.strip().splitlines() or ['?'])[-1][:60]})")
    finally:
        server.kill()
        server.wait()


def spoofing(act: Act) -> None:
    p = act.pods
    bold(f"act 5: a spoofed source MAC: {FRAMES} ICMP frames a1 -> a2, counted arriving in a2")
    # both at once: each listener counts only its own marker
    spoofed, genuine = concurrently([lambda: frames_arriving(p["a1"], p["a2"], SPOOFED_MAC, "tn-spoofed"),
                                     lambda: frames_arriving(p["a1"], p["a2"], p["a1"].mac, "tn-genuine")])
    act.claim(spoofed == 0, f"eth src {SPOOFED_MAC} (not a1's): {spoofed} of {FRAMES} arrived "
              "(port security drops them at a1's port)")
    act.claim(genuine == FRAMES, f"eth src {p['a1'].mac} (a1's own), same frames otherwise: "
              f"{genuine} of {FRAMES} arrived")


def underlay(act: Act) -> None:
    p = act.pods
    lab = act.lab
    bold("act 5: rail 1's traffic leaves through rail 1's underlay (ToR-side packet counters)")
    for node in lab.nodes:
        print(f"         {node.name}: rail0 {node.rails[0].encap_ip} (chassis {node.rails[0].chassis}), "
              f"rail1 {node.rails[1].encap_ip} (chassis {node.rails[1].chassis})")
    before = underlay_packets(lab)
    burst = in_pod(p["a1"], "ping", "-n", "-q", "-c", "50", "-i", "0.01", p["a2"].ip)
    delta = {leg: count - before[leg] for leg, count in underlay_packets(lab).items()}
    print("         50 pings a1 (node1) -> a2 (node2), packets on each leg (rx+tx):")
    print("         " + ", ".join(f"{leg} +{n}" for leg, n in delta.items()))
    act.claim(burst.returncode == 0 and delta["node1/rail1"] >= 100 and delta["node2/rail1"] >= 100,
              f"node1/rail1 +{delta['node1/rail1']}, node2/rail1 +{delta['node2/rail1']}: the Geneve packets "
              "(50 requests + 50 replies each)", burst.stdout)
    rail0 = {leg: n for leg, n in delta.items() if leg.endswith("/rail0")}
    act.claim(all(n == 0 for n in rail0.values()), f"rail 0's legs: {sum(rail0.values())} packets")
    node1 = lab.nodes[0]
    remotes = tunnel_remotes(node1, node1.rails[1].integration_bridge)
    rail1_peers = sorted(n.rails[1].encap_ip for n in lab.nodes[1:])
    act.claim(remotes == rail1_peers, f"node1's rail-1 bridge {node1.rails[1].integration_bridge} tunnels to "
              f"{', '.join(remotes) or 'nothing'} only (rail 1's chassis: a transport zone per rail)",
              f"expected {rail1_peers}")


def tunnel_remotes(node: ovn.OvnNode, bridge: str) -> list[str]:
    """The remote IPs of the Geneve ports ovn-controller made on `bridge` of `node`."""
    out = json.loads(ovn.vsctl(node, "--format=json", "--columns=name,type,options", "find", "Interface",
                               "type=geneve"))["data"]
    ports = set(ovn.vsctl(node, "list-ports", bridge).split())
    return sorted(dict(options[1]).get("remote_ip", "") for name, _type, options in out if name in ports)


def detach(act: Act) -> None:
    bold("act 5: DEL of every attachment")
    for pod in act.pods.values():
        out = cni("DEL", pod)
        act.claim(out.returncode == 0, f"DEL {pod.name}", (out.stdout + out.stderr).decode())
    left = our_ports(act.lab)
    act.claim(left == [], f"logical switch ports of tenantnet left in the NB: {len(left)}")


def main(root: str = ROOT) -> int:
    """Run the act in `root`; returns the number of failed claims (a lab that does not come
    up counts as one)."""
    start = time.monotonic()
    bold(f"act 5: the OVN overlay lab, a SIMULATION: {NODES} nodes in network namespaces, "
         f"{RAILS} rail NICs each (one OVN chassis per rail), a Linux-bridge ToR per rail")
    try:
        lab = ovn.up(root, nodes=NODES, rails=RAILS)
    except Exception as exc:  # noqa: BLE001 — the demo says why and goes on to the next act
        print(f"  [FAIL] the overlay lab did not come up: {exc}")
        ovn.down(root)
        return 1
    act = Act(lab)
    try:
        print(f"  [ok  ] up in {time.monotonic() - start:.1f} s; OVN NB {lab.nb}; etcd {lab.etcd}")
        attach(act)
        if all(p.ip for p in act.pods.values()):
            reachability(act)
            spoofing(act)
            underlay(act)
        detach(act)
    except Exception as exc:  # noqa: BLE001 — counted, and the lab still goes down below
        act.claim(False, f"the act stopped: {type(exc).__name__}: {exc}")
    finally:
        if act.pods and any(p.ip for p in act.pods.values()):
            for pod in act.pods.values():  # a DEL twice is harmless; here for an act cut short
                cni("DEL", pod)
        ovn.down(root)
    gone = not os.path.exists(root) and ovn._lab_netns(lab.tag) == [] and ovn._lab_links(lab.tag) == []
    act.claim(gone, "lab down: no namespace, link or directory of it left")
    print(f"  act 5 took {time.monotonic() - start:.1f} s", flush=True)
    return act.failures


if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in PROBES:
        PROBES[sys.argv[1]](sys.argv[2:])
        sys.exit(0)
    sys.exit(min(main(*sys.argv[1:2]), 100))
