"""The overlay lab — a simulation, labelled as one: OVN central and N nodes in network namespaces.

Everything lives under one private root directory and under names derived from it
(`tn<hash>…`), so two labs never collide and `down` finds every trace again:

- OVN central: the NB and SB `ovsdb-server`s (schemas from /usr/share/ovn) on unix sockets
  in `<root>/central`, and `ovn-northd`, all in the host network namespace.
- Per node i (`node<i>`): a network namespace `tn<hash>n<i>` holding its own `ovsdb-server`,
  `ovs-vswitchd` (userspace datapath, `datapath_type=netdev`: the `ovs-netdev` tap it makes
  is then the namespace's own) and `ovn-controller` — both run *inside* the namespace,
  because ovn-controller and vswitchd open netdevs by name in their own namespace
  (CNI-FACTS §7). Unix sockets cross namespaces, so every node reaches the one SB socket.
  The chassis name is the node name; Geneve endpoint = the node's address on rail 0.
- The underlay, one per rail r: a /24 (192.168.<100+r>.0/24 by default), a Linux bridge
  `tn<hash>t<r>` in the host namespace as the rail's top-of-rack switch, and per node a veth
  whose node end is a port of an OVS bridge `br-rail<r>` in the node, the address on that
  bridge's internal port: the userspace datapath's `tnl_push` routes a tunnel only out of an
  OVS bridge — with the address on the veth itself the underlay pings, yet no Geneve packet
  leaves (shown here).
  OVN 23.03 has one encap IP per chassis, so rails beyond 0 get their underlay but carry no
  tunnels yet (one chassis per rail NIC is the way, CNI-FACTS §7).
- Pods (`plug_pod`): a namespace `tn<hash>n<i>-<pod>` with `eth0`, whose peer is a port of
  the node's br-int with `external_ids:iface-id=<logical switch port>`.

What is not simulated: the nodes share one kernel and one clock; the "wire" is veths and a
Linux bridge; the datapath is OVS's userspace one, not a kernel or hardware datapath.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tenantnet.lab.ovs import LabError, has_exited

META = "ovn-lab.json"
NB_SCHEMA = "/usr/share/ovn/ovn-nb.ovsschema"
SB_SCHEMA = "/usr/share/ovn/ovn-sb.ovsschema"
VSWITCH_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
INTEGRATION_BRIDGE = "br-int"
DATAPATH = "netdev"
UNDERLAY_BASE = 100  # rail r's underlay is 192.168.<UNDERLAY_BASE + r>.0/24


@dataclass(frozen=True)
class OvnNode:
    """One simulated node of the overlay lab."""

    name: str            # also its OVN chassis name
    index: int
    netns: str
    root: str            # its run directory (conf.db, sockets, pid files, logs)
    encap_ips: list[str]  # one underlay address per rail; OVN 23.03 uses the first (rail 0)

    @property
    def ovsdb(self) -> str:
        return f"unix:{os.path.join(self.root, 'db.sock')}"


@dataclass(frozen=True)
class OvnLab:
    root: str
    tag: str
    nb: str
    sb: str
    rails: int
    nodes: list[OvnNode] = field(default_factory=list)


def tag_of(root: str) -> str:
    """The prefix of every name this lab makes in the kernel (≤ 7 chars: link names are ≤ 15)."""
    return "tn" + hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:5]


def _central(root: str) -> str:
    return os.path.join(root, "central")


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None, timeout: float = 30) -> str:
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise LabError(f"{what}: {cmd[0]} is not installed (apt-get install ovn-central ovn-host)") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{what}: {' '.join(cmd)} did not finish within {timeout} s") from None
    if proc.returncode != 0:
        raise LabError(f"{what} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _env(rundir: str) -> dict[str, str]:
    # OVN 23.03's ovn-controller has no --unixctl: its control socket goes to OVN_RUNDIR
    # (as ovn-controller.<pid>.ctl), so each node gets its own (CNI-FACTS §7).
    return dict(os.environ, OVS_RUNDIR=rundir, OVS_DBDIR=rundir, OVS_LOGDIR=rundir,
                OVN_RUNDIR=rundir, OVN_DBDIR=rundir, OVN_LOGDIR=rundir)


def _in_ns(netns: str | None, cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


def _daemon(rundir: str, name: str, cmd: list[str], netns: str | None = None) -> None:
    """Start `cmd` detached, with pid file, log and (where it takes one) control socket in `rundir`."""
    args = [*cmd, f"--pidfile={rundir}/{name}.pid", f"--log-file={rundir}/{name}.log",
            "--detach", "--no-chdir"]
    if name != "ovn-controller":
        args.append(f"--unixctl={rundir}/{name}.ctl")
    _run(_in_ns(netns, args), f"starting {name}", env=_env(rundir))


def nbctl(lab_root: str, *args: str) -> str:
    """ovn-nbctl against the lab's NB database."""
    sock = os.path.join(_central(lab_root), "nb.sock")
    return _run(["ovn-nbctl", f"--db=unix:{sock}", "--timeout=10", *args], "ovn-nbctl " + " ".join(args))


def sbctl(lab_root: str, *args: str) -> str:
    sock = os.path.join(_central(lab_root), "sb.sock")
    return _run(["ovn-sbctl", f"--db=unix:{sock}", "--timeout=10", *args], "ovn-sbctl " + " ".join(args))


def vsctl(node: OvnNode, *args: str) -> str:
    """ovs-vsctl against a node's conf.db (from the host: the socket is a file)."""
    return _run(["ovs-vsctl", f"--db={node.ovsdb}", "--timeout=10", *args], "ovs-vsctl " + " ".join(args),
                env=_env(node.root))


def ip_ns(netns: str, *args: str) -> str:
    return _run(["ip", "-n", netns, *args], f"ip -n {netns} {' '.join(args)}")


def _sysctl(netns: str, key: str, value: str) -> None:
    _run(["ip", "netns", "exec", netns, "sysctl", "-qw", f"{key}={value}"], f"sysctl {key} in {netns}")


def _link_exists(name: str, netns: str | None = None) -> bool:
    cmd = ["ip", *(["-n", netns] if netns else []), "link", "show", name]
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def underlay_address(rail: int, index: int) -> str:
    return f"192.168.{UNDERLAY_BASE + rail}.{index}"


def _start_central(root: str) -> None:
    central = _central(root)
    os.makedirs(central, mode=0o700)
    env = _env(central)
    for db, schema in (("nb", NB_SCHEMA), ("sb", SB_SCHEMA)):
        _run(["ovsdb-tool", "create", f"{central}/{db}.db", schema], f"creating the {db.upper()} database",
             env)
        _daemon(central, f"ovsdb-server-{db}",
                ["ovsdb-server", f"{central}/{db}.db", f"--remote=punix:{central}/{db}.sock"])
    nbctl(root, "init")
    _daemon(central, "ovn-northd", ["ovn-northd", f"--ovnnb-db=unix:{central}/nb.sock",
                                    f"--ovnsb-db=unix:{central}/sb.sock"])


def _start_node(root: str, tag: str, index: int, rails: int) -> OvnNode:
    name = f"node{index}"
    node = OvnNode(name=name, index=index, netns=f"{tag}n{index}", root=os.path.join(root, name),
                   encap_ips=[underlay_address(r, index) for r in range(rails)])
    os.makedirs(node.root, mode=0o700)
    _run(["ip", "netns", "add", node.netns], f"creating netns {node.netns}")
    ip_ns(node.netns, "link", "set", "lo", "up")
    db = os.path.join(node.root, "conf.db")
    _run(["ovsdb-tool", "create", db, VSWITCH_SCHEMA], f"{name}: creating conf.db", _env(node.root))
    _daemon(node.root, "ovsdb-server", ["ovsdb-server", db, f"--remote=punix:{node.root}/db.sock"],
            node.netns)
    vsctl(node, "--no-wait", "init")
    _daemon(node.root, "ovs-vswitchd", ["ovs-vswitchd", node.ovsdb], node.netns)
    for rail in range(rails):
        _underlay(tag, node, rail)
    # br-int made here with the userspace datapath: ovn-controller would make it `system`.
    vsctl(node, "add-br", INTEGRATION_BRIDGE, "--", "set", "Bridge", INTEGRATION_BRIDGE,
          f"datapath_type={DATAPATH}", "fail_mode=secure", "other_config:disable-in-band=true")
    sb = os.path.join(_central(root), "sb.sock")
    vsctl(node, "set", "Open_vSwitch", ".", f"external_ids:system-id={name}",
          f"external_ids:hostname={name}", f"external_ids:ovn-remote=unix:{sb}",
          "external_ids:ovn-encap-type=geneve", f"external_ids:ovn-encap-ip={node.encap_ips[0]}",
          f"external_ids:ovn-bridge={INTEGRATION_BRIDGE}",
          f"external_ids:ovn-bridge-datapath-type={DATAPATH}")
    _daemon(node.root, "ovn-controller", ["ovn-controller", node.ovsdb], node.netns)
    return node


def _underlay(tag: str, node: OvnNode, rail: int) -> None:
    """Node `node`'s leg on rail `rail`: veth to the rail's ToR, OVS bridge br-rail<r> with the address."""
    tor, host_end, node_end = f"{tag}t{rail}", f"{tag}h{node.index}r{rail}", f"rail{rail}"
    bridge = f"br-rail{rail}"
    _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end, "netns", node.netns],
         f"{node.name}: underlay veth on rail {rail}")
    _run(["ip", "link", "set", host_end, "master", tor, "up"], f"{node.name}: joining {tor}")
    # The kernel sees the AF_PACKET port too: without arp_ignore=1 it also answers ARP for the
    # bridge's address (two replies), and IPv6 on it would send its own traffic (CNI-FACTS §7).
    _sysctl(node.netns, f"net.ipv4.conf.{node_end}.arp_ignore", "1")
    _sysctl(node.netns, f"net.ipv6.conf.{node_end}.disable_ipv6", "1")
    ip_ns(node.netns, "link", "set", node_end, "up")
    vsctl(node, "add-br", bridge, "--", "set", "Bridge", bridge, f"datapath_type={DATAPATH}",
          "--", "add-port", bridge, node_end)
    _sysctl(node.netns, f"net.ipv6.conf.{bridge}.disable_ipv6", "1")
    ip_ns(node.netns, "addr", "add", f"{node.encap_ips[rail]}/24", "dev", bridge)
    ip_ns(node.netns, "link", "set", bridge, "up")


def up(root: str, nodes: int = 2, rails: int = 1) -> OvnLab:
    """Build the overlay lab in `root` (a leftover one there is removed first)."""
    if not 1 <= nodes <= 32 or not 1 <= rails <= 8:
        raise LabError("the overlay lab takes 1-32 nodes and 1-8 rails")
    if os.path.exists(root):
        down(root)
    os.makedirs(root, mode=0o700)
    tag = tag_of(root)
    central = _central(root)
    lab = OvnLab(root=root, tag=tag, nb=f"unix:{central}/nb.sock", sb=f"unix:{central}/sb.sock", rails=rails)
    _save(lab)
    try:
        _start_central(root)
        for rail in range(rails):
            tor = f"{tag}t{rail}"
            _run(["ip", "link", "add", tor, "type", "bridge"], f"creating ToR bridge {tor}")
            _run(["ip", "link", "set", tor, "up"], f"bringing {tor} up")
        for index in range(1, nodes + 1):
            lab.nodes.append(_start_node(root, tag, index, rails))
            _save(lab)
    except (LabError, OSError):
        down(root)
        raise
    return lab


def _save(lab: OvnLab) -> None:
    with open(os.path.join(lab.root, META), "w") as fh:
        json.dump(asdict(lab), fh, indent=2)


def load(root: str) -> OvnLab | None:
    try:
        with open(os.path.join(root, META)) as fh:
            raw: dict[str, Any] = json.load(fh)
    except (OSError, ValueError):
        return None
    raw["nodes"] = [OvnNode(**n) for n in raw.get("nodes", [])]
    return OvnLab(**raw)


def _pid(rundir: str, name: str) -> int | None:
    """The daemon's pid — only while it runs and its command line names this run directory
    (a recycled pid of some other process is never signalled)."""
    try:
        with open(os.path.join(rundir, f"{name}.pid")) as fh:
            pid = int(fh.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().decode(errors="replace")
    except (OSError, ValueError):
        return None
    if has_exited(pid) or rundir not in cmdline:
        return None
    return pid


def _stop(rundir: str, name: str) -> bool:
    pid = _pid(rundir, name)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + 5
    while not has_exited(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline += 5
        time.sleep(0.01)
    return True


NODE_DAEMONS = ("ovn-controller", "ovs-vswitchd", "ovsdb-server")
CENTRAL_DAEMONS = ("ovn-northd", "ovsdb-server-nb", "ovsdb-server-sb")


def _strays(root: str) -> list[int]:
    """Processes of ours (an OVS/OVN daemon) whose command line names a file in `root`."""
    prefix = os.path.abspath(root) + "/"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) in {"ovsdb-server", "ovs-vswitchd", "ovn-controller", "ovn-northd"} \
                and any(prefix in a for a in argv[1:]) and not has_exited(int(entry)):
            found.append(int(entry))
    return found


def _lab_netns(tag: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(tag)]


def _lab_links(tag: str) -> list[str]:
    return [name for name in os.listdir("/sys/class/net") if name.startswith(tag)]


def down(root: str) -> list[str]:
    """Remove the overlay lab: processes (by pid, checked), pod and node namespaces, ToR
    bridges and host-side veths, the directory. Returns what was removed."""
    removed: list[str] = []
    tag = tag_of(root)
    node_dirs = sorted(d for d in os.listdir(root) if d.startswith("node")) if os.path.isdir(root) else []
    for d in node_dirs:
        rundir = os.path.join(root, d)
        for name in NODE_DAEMONS:
            pid = _pid(rundir, name)
            if pid is None:
                continue
            if name == "ovn-controller":
                # `exit` lets it remove its Chassis row and bindings from the SB before it ends.
                ctl = os.path.join(rundir, f"ovn-controller.{pid}.ctl")
                subprocess.run(["ovn-appctl", "-t", ctl, "exit"],
                               capture_output=True, timeout=10, check=False)
            _stop(rundir, name)
            removed.append(f"{d}: {name}")
    central = _central(root)
    for name in CENTRAL_DAEMONS:
        if _stop(central, name):
            removed.append(name)
    strays = _strays(root)
    for pid in strays:
        # A lab whose directory went (rm -rf) before `down`: its daemons still run, inside
        # namespaces that `ip netns delete` would only unname. Found by their command line.
        try:
            os.kill(pid, signal.SIGTERM)
            removed.append(f"stray pid {pid}")
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while any(not has_exited(pid) for pid in strays) and time.monotonic() < deadline:
        time.sleep(0.01)
    for netns in _lab_netns(tag):  # pods (tag + n<i>-<pod>) and nodes alike
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)
        removed.append(f"netns {netns}")
    for link in _lab_links(tag):  # ToR bridges; veth host ends went with their node namespaces
        if subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False).returncode == 0:
            removed.append(f"link {link}")
    shutil.rmtree(root, ignore_errors=True)
    return removed


def status(root: str) -> dict[str, Any] | None:
    """{"ovn": {"nb", "sb", "northd"}, "nodes": [{name, netns, encapIps, ovsdb, running}]}, or None."""
    lab = load(root)
    if lab is None:
        return None
    central = _central(root)
    return {
        "root": root,
        "ovn": {"nb": lab.nb, "sb": lab.sb, "running": all(_pid(central, d) for d in CENTRAL_DAEMONS)},
        "nodes": [{"name": n.name, "netns": n.netns, "encapIps": n.encap_ips, "ovsdb": n.ovsdb,
                   "running": all(_pid(n.root, d) for d in NODE_DAEMONS)} for n in lab.nodes],
    }


# --- pods ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabPod:
    name: str
    netns: str
    node: str
    port: str   # the br-int port (veth host end) in the node's namespace
    lsp: str
    mac: str
    ip: str     # with prefix length


SIOCETHTOOL = 0x8946
ETHTOOL_GTXCSUM = 0x16
ETHTOOL_STXCSUM = 0x17


def tx_checksum(ifname: str, on: bool | None = None) -> bool:
    """Read (and with `on` set) an interface's TX checksum offload in this process's namespace —
    what `ethtool -K <if> tx off` does, for machines without ethtool."""
    value = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_GTXCSUM if on is None else ETHTOOL_STXCSUM,
                                                    int(bool(on))))
    ifr = struct.pack("16sP", ifname.encode(), ctypes.addressof(value))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)
    if on is None:
        return bool(struct.unpack("II", value.raw[:8])[1])
    return on


def tx_checksum_in(netns: str, ifname: str, on: bool | None = None) -> bool:
    """`tx_checksum` run in namespace `netns` (a child process: this one stays where it is)."""
    import sys

    code = "from tenantnet.lab.ovn import tx_checksum as t\n"
    if on is not None:
        code += f"t({ifname!r}, {on!r})\n"
    code += f"print(t({ifname!r}))"  # read back: what the kernel kept
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = _run(["ip", "netns", "exec", netns, sys.executable, "-c", code], f"tx checksum offload in {netns}",
               env)
    return out.strip() == "True"


def plug_pod(lab: OvnLab, node: OvnNode, pod: str, lsp: str, mac: str, ip: str, bind: bool = True) -> LabPod:
    """A pod on `node`: namespace + eth0, its peer a br-int port; `bind` sets iface-id = `lsp`
    at once (else `bind_pod` does, e.g. to time the binding)."""
    netns = f"{node.netns}-{pod}"
    port = f"{lab.tag}v" + hashlib.sha256(netns.encode()).hexdigest()[:6]
    _run(["ip", "netns", "add", netns], f"creating pod netns {netns}")
    ip_ns(node.netns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip_ns(netns, "link", "set", "eth0", "address", mac)
    ip_ns(netns, "addr", "add", ip, "dev", "eth0")
    ip_ns(netns, "link", "set", "lo", "up")
    ip_ns(netns, "link", "set", "eth0", "up")
    # The userspace datapath leaves TX checksums of a veth pod to the stack: TCP fails otherwise.
    if tx_checksum_in(netns, "eth0", False):
        raise LabError(f"{netns}: eth0 kept its tx checksum offload")
    # The node's kernel would otherwise send its own IPv6 (DAD, router solicitations) to the pod
    # through the host end: that end is only an AF_PACKET port of br-int, never an interface.
    _sysctl(node.netns, f"net.ipv6.conf.{port}.disable_ipv6", "1")
    ip_ns(node.netns, "link", "set", port, "up")
    vsctl(node, "add-port", INTEGRATION_BRIDGE, port)
    result = LabPod(name=pod, netns=netns, node=node.name, port=port, lsp=lsp, mac=mac, ip=ip)
    if bind:
        bind_pod(node, result)
    return result


def bind_pod(node: OvnNode, pod: LabPod) -> None:
    vsctl(node, "set", "Interface", pod.port, f"external_ids:iface-id={pod.lsp}")
