"""Shared support for the overlay fault and isolation tests: the real tenantnet plugin exec'd
inside a node's namespace of the OVN lab (tenantnet/lab/ovn.py), pods made by real CNI ADDs,
traffic between them (ICMP, TCP, ARP), and what OVN and the node hold afterwards.

Everything a test makes lives under the lab's root and tag, so the lab's `down` removes it;
the daemons a test stops and restarts are the lab's own, found by their pid files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tenantnet.lab import ovn

BIN = Path(sys.executable).parent
PLUGIN = str(BIN / "tenantnet")
SUBNET = "10.88.50.0/24"  # every tenant of the isolation tests: one subnet, on purpose
T = TypeVar("T")


def concurrently(checks: Iterable[Callable[[], T]]) -> list[T]:
    """Each check's result, in order, all run at once. For traffic checks (each a subprocess in
    a pod's namespace, mostly waiting on the network): a row of them costs one wait."""
    from concurrent.futures import ThreadPoolExecutor

    todo = list(checks)
    with ThreadPoolExecutor(max(1, len(todo))) as pool:
        return list(pool.map(lambda check: check(), todo))


def overlay_conf(name: str, first: int, last: int, segment: int | None = None,
                 subnet: str = SUBNET) -> dict[str, Any]:
    """An overlay network on rail 0 with cluster IPAM handing out `<subnet>.first..last` only:
    several networks share the subnet with ranges that do not overlap, so an address names
    one pod in the whole lab."""
    base = subnet.rsplit(".", 1)[0]
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0", "name": name, "type": "tenantnet", "mode": "ovs", "overlay": "geneve",
        "rail": "rail0",
        "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28, "allowOverlap": True},
                 "ranges": [[{"subnet": subnet, "rangeStart": f"{base}.{first}", "rangeEnd": f"{base}.{last}"}]]},
    }
    if segment is not None:
        conf["vlan"] = segment
    return conf


@dataclass(frozen=True)
class Invocation:
    code: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        return json.loads(self.stdout) if self.stdout.strip() else {}


def cni_env(command: str, node: ovn.OvnNode, container_id: str = "", netns: str = "", ifname: str = "net1",
            extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """A CNI call's environment (the node's config comes from `ovn.in_node`)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command, "CNI_PATH": str(BIN),
           "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=tenant;K8S_POD_NAME=p" + container_id[:6]}
    if container_id:
        env["CNI_CONTAINERID"] = container_id
    env["CNI_NETNS"] = f"/run/netns/{netns}" if netns else ""
    if ifname:
        env["CNI_IFNAME"] = ifname
    if "PYTHONPATH" in os.environ:  # the plugin runs the tree under test
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update(extra_env or {})
    return env


def cni(command: str, node: ovn.OvnNode, conf: dict[str, Any], container_id: str = "", netns: str = "",
        ifname: str = "net1", extra_env: dict[str, str] | None = None, timeout: float = 60) -> Invocation:
    """The tenantnet plugin exec'd in `node`'s namespace with that node's config."""
    env = cni_env(command, node, container_id, netns, ifname, extra_env)
    proc = subprocess.run(ovn.in_node(node, [PLUGIN]), input=json.dumps(conf).encode(), env=env,
                          capture_output=True, timeout=timeout, check=False)
    return Invocation(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def gc(node: ovn.OvnNode, conf: dict[str, Any], valid: list[tuple[str, str]]) -> Invocation:
    """CNI GC on `node` for `conf`'s network, keeping the (container id, ifname) attachments in `valid`."""
    body = {**conf, "cniVersion": "1.1.0",
            "cni.dev/valid-attachments": [{"containerID": c, "ifname": i} for c, i in valid]}
    return cni("GC", node, body, ifname="")


@dataclass
class Pod:
    """One attachment made by a real ADD: its node, namespace and what the result said."""

    name: str
    node: ovn.OvnNode
    netns: str
    container_id: str
    conf: dict[str, Any]
    ifname: str = "net1"
    ip: str = ""    # without prefix
    mac: str = ""

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.netns, *cmd], capture_output=True, text=True,
                              timeout=timeout, check=False)


def container_id(name: str) -> str:
    import hashlib

    return hashlib.sha256(name.encode()).hexdigest()


def new_pod(lab: ovn.OvnLab, node: ovn.OvnNode, name: str, conf: dict[str, Any]) -> Pod:
    """An empty pod namespace on `node` (named under the lab's tag: `down` removes it)."""
    netns = ovn.make_pod_netns(lab, node, name)
    return Pod(name=name, node=node, netns=netns, container_id=container_id(f"{lab.root}/{name}"), conf=conf)


def add(pod: Pod, extra_env: dict[str, str] | None = None) -> Invocation:
    inv = cni("ADD", pod.node, pod.conf, pod.container_id, pod.netns, pod.ifname, extra_env)
    if inv.code == 0:
        take_result(pod, inv)
    return inv


def take_result(pod: Pod, inv: Invocation) -> None:
    """The pod's address and MAC, from its ADD's result."""
    result = inv.result
    pod.ip = result["ips"][0]["address"].split("/")[0]
    pod.mac = next(i["mac"] for i in result["interfaces"] if i.get("sandbox"))


def delete(pod: Pod, extra_env: dict[str, str] | None = None) -> Invocation:
    return cni("DEL", pod.node, pod.conf, pod.container_id, pod.netns, pod.ifname, extra_env)


def attach(lab: ovn.OvnLab, node: ovn.OvnNode, name: str, conf: dict[str, Any]) -> Pod:
    pod = new_pod(lab, node, name, conf)
    inv = add(pod)
    assert inv.code == 0, f"ADD {name} on {node.name}: {inv.code} {inv.stdout} {inv.stderr}"
    return pod


def attach_all(lab: ovn.OvnLab, wanted: list[tuple[int, str, dict[str, Any]]]) -> list[Pod]:
    """A pod for each (node index, name, network config), in that order: each node's ADDs one
    after another (as its kubelet would), the nodes' at once."""
    pods = [new_pod(lab, lab.nodes[node], name, conf) for node, name, conf in wanted]
    by_node: dict[str, list[Pod]] = {}
    for pod in pods:
        by_node.setdefault(pod.node.name, []).append(pod)
    done = concurrently([lambda group=group: [(pod, add(pod)) for pod in group] for group in by_node.values()])
    failed = [f"ADD {pod.name} on {pod.node.name}: {inv.code} {inv.stdout} {inv.stderr}"
              for group in done for pod, inv in group if inv.code != 0]
    assert not failed, failed
    return pods


# --- traffic ------------------------------------------------------------------------------

def ping(src: Pod, ip: str, deadline: int = 5) -> bool:
    """One reply within `deadline` s (the first after a binding may be lost: flows being installed)."""
    out = src.run("ping", "-n", "-q", "-c", "1", "-i", "0.05", "-w", str(deadline), ip,
                  timeout=deadline + 10)
    return out.returncode == 0


SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(c.recv(64)); c.close()
"""
CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    c.sendall(b"echo"); sys.stdout.write(c.recv(64).decode())
except OSError as exc:
    sys.stdout.write("refused" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__)
"""


class TcpServer:
    """An echo server in a pod, on a port of that pod's own (namespaces are private: any is free)."""

    PORT = 7777

    def __init__(self, pod: Pod, wait: bool = True) -> None:
        self.pod = pod
        self.proc = subprocess.Popen(["ip", "netns", "exec", pod.netns, sys.executable, "-c", SERVER,
                                      str(self.PORT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == b"ready"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> TcpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tcp(src: Pod, ip: str, timeout: float = 3) -> str:
    """What a TCP echo from `src` to `ip` gets back: "echo", or the failure (timeout, refused)."""
    out = src.run(sys.executable, "-c", CLIENT, ip, str(TcpServer.PORT), str(timeout), timeout=timeout + 20)
    return out.stdout.strip() or out.stderr.strip()


# Counts until it has all `count` datagrams (a positive check ends at once), else until its
# stdin closes (the sender is done) and `grace` s more for datagrams in flight: the window
# always covers the whole send, however slowly the sender starts on a busy machine.
UDP_LISTENER = """
import select, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", int(sys.argv[1])))
count, grace = int(sys.argv[2]), float(sys.argv[3]); print("ready", flush=True)
seen, end = [], float("inf")
while len(seen) < count and time.monotonic() < end:
    ready = select.select([s, sys.stdin] if end == float("inf") else [s], [], [], 0.05)[0]
    if sys.stdin in ready and not sys.stdin.read(1):
        end = time.monotonic() + grace
    if s in ready:
        seen.append(s.recvfrom(64)[1][0])
print(" ".join(seen))
"""
UDP_SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[3])):
    try:
        s.sendto(b"x", (sys.argv[1], int(sys.argv[2])))
    except OSError:
        pass
    time.sleep(0.02)
"""


def udp_sources(src: Pod, dst: Pod, count: int = 10, port: int = 7788) -> list[str]:
    """The source addresses of the datagrams `dst` received while `src` sent `count` to it.

    `src` gets a permanent neighbour entry for `dst` first, so it sends without ARP: what
    `dst` sees depends only on the frames `src` puts on its port (not on ARP, nor on a reply
    path, which a changed MAC or address would break anyway)."""
    src.run("ip", "neigh", "replace", dst.ip, "lladdr", dst.mac, "dev", src.ifname, "nud", "permanent")
    listener = subprocess.Popen(["ip", "netns", "exec", dst.netns, sys.executable, "-c", UDP_LISTENER, str(port),
                                 str(count), "0.5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        src.run(sys.executable, "-c", UDP_SENDER, dst.ip, str(port), str(count))
        out, _ = listener.communicate(timeout=30)  # closes its stdin: sent
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
        src.run("ip", "neigh", "del", dst.ip, "dev", src.ifname)
    return out.split()


def neighbour(src: Pod, ip: str) -> str:
    """`src`'s neighbour entry for `ip` on its overlay interface ("" when none)."""
    return src.run("ip", "neigh", "show", ip, "dev", src.ifname).stdout.strip()


def arp_answered(src: Pod, ip: str) -> bool:
    """Whether `ip` answered `src`'s ARP: the kernel resolves it when `src` pings (no arping
    here). The entry is flushed first, so an answer must be a fresh one."""
    src.run("ip", "neigh", "flush", "dev", src.ifname, "to", ip)
    src.run("ping", "-n", "-q", "-c", "2", "-i", "0.2", "-W", "1", ip, timeout=15)
    entry = neighbour(src, ip)
    return "lladdr" in entry


# --- what OVN and the node hold -----------------------------------------------------------

def logical_ports(lab: ovn.OvnLab) -> list[tuple[str, dict[str, str]]]:
    """Every logical switch port in the NB (name, external_ids), duplicates included."""
    out = ovn.nbctl(lab.root, "--format=json", "--columns=name,external_ids", "list", "Logical_Switch_Port")
    return [(name, dict(ids[1])) for name, ids in json.loads(out)["data"]]


def ports_of(lab: ovn.OvnLab, pod: Pod) -> list[str]:
    """The NB's logical ports that are `pod`'s attachment (by its container id and ifname)."""
    return [name for name, ids in logical_ports(lab)
            if ids.get("tenantnet-container-id") == pod.container_id and ids.get("tenantnet-ifname") == pod.ifname]


def ovs_ports(node: ovn.OvnNode) -> list[tuple[str, dict[str, str]]]:
    """The node's OVS ports that tenantnet owns (name, external_ids)."""
    out = ovn.vsctl(node, "--format=json", "--columns=name,external_ids", "list", "Interface")
    return [(name, dict(ids[1])) for name, ids in json.loads(out)["data"]
            if dict(ids[1]).get("tenantnet-owner") == "tenantnet"]


def records(node: ovn.OvnNode) -> list[Path]:
    """Every file under the node's records directory (temp files of a crashed write too)."""
    root = Path(node.root, "state", "attachments")
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def node_links(node: ovn.OvnNode) -> list[str]:
    """The node namespace's veths (pod host ends): the lab itself makes none."""
    out = subprocess.run(["ip", "-n", node.netns, "-j", "link", "show", "type", "veth"], capture_output=True,
                         text=True, check=False).stdout
    return sorted(link["ifname"] for link in json.loads(out or "[]") if link["ifname"] not in ("mgmt",)
                  and not link["ifname"].startswith("rail"))


# --- the lab's daemons, stopped and started again -----------------------------------------

CENTRAL = "central"


@dataclass(frozen=True)
class Daemon:
    """One of the lab's daemons: where its pid file is, and the command `ovn.up` started it with."""

    name: str
    rundir: str
    cmd: list[str]
    netns: str | None = None
    ovn_rundir: str | None = None


def central_daemon(lab: ovn.OvnLab, name: str) -> Daemon:
    central = os.path.join(lab.root, CENTRAL)
    if name == "ovn-northd":
        return Daemon(name, central, ["ovn-northd", f"--ovnnb-db=unix:{central}/nb.sock",
                                      f"--ovnsb-db=unix:{central}/sb.sock"])
    db = name.removeprefix("ovsdb-server-")
    return Daemon(name, central, ["ovsdb-server", f"{central}/{db}.db", f"--remote=punix:{central}/{db}.sock"])


def controller(node: ovn.OvnNode, rail: int = 0) -> Daemon:
    r = node.rails[rail]
    chassis = [] if r.index == 0 else ["-n", r.chassis]
    return Daemon(r.controller, node.root, ["ovn-controller", *chassis, node.ovsdb], node.netns, r.rundir)


def kill(daemon: Daemon) -> int:
    """SIGKILL the daemon (a crash, not a clean exit: an ovn-controller keeps its chassis)."""
    import signal

    pid = ovn._pid(daemon.rundir, daemon.name)
    assert pid is not None, f"{daemon.name} is not running in {daemon.rundir}"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not ovn.has_exited(pid):
        assert time.monotonic() < deadline, f"{daemon.name} ({pid}) survived SIGKILL"
        time.sleep(0.01)
    return pid


def start(daemon: Daemon) -> None:
    """Start it again as the lab did (same pid file, socket, log)."""
    ovn._daemon(daemon.rundir, daemon.name, daemon.cmd, daemon.netns, ovn_rundir=daemon.ovn_rundir)
    assert ovn._pid(daemon.rundir, daemon.name) is not None, f"{daemon.name} did not start again"
