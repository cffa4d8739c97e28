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
- One OVN chassis per rail NIC, all on the node's one vswitchd: OVN 23.03 has one encap IP
  per chassis, but documents chassis-specific keys (`ovn-<key>-<chassis>`) and `-n <chassis>`
  to run several ovn-controllers on one vswitchd (ovn-controller(8)). Rail 0's chassis is
  `<node>` with the plain keys and `br-int` (the single-NIC case as documented); rail r ≥ 1
  has its own ovn-controller `-n <node>-rail<r>`, integration bridge `br-int-rail<r>` and
  encap IP = the node's rail-r address. Transport zone `rail<r>` per chassis, so a chassis
  forms tunnels only to the same rail's chassis on other nodes, and a rail's Geneve traffic
  leaves through that rail's underlay (shown in tests/integration/test_ovn_lab.py by the
  ToR-side packet counters). Each controller has its own OVN_RUNDIR (23.03 has no --unixctl,
  its control socket goes there) and pid file.
- A management network for the lab's one etcd (cluster IPAM): etcd runs in a namespace
  `tn<hash>e` on 192.168.99.254 behind a Linux bridge there, each node reaches it through a
  veth `mgmt` (192.168.99.<i>) — a process inside a node's namespace cannot reach the host's
  loopback, and with no address in the host namespace two labs never collide.
- Per node a tenantnet node config (`OvnNode.node_config`, `<node dir>/tenantnet.yaml`): a
  tenantnet CNI call or agent run inside the node's namespace attaches to that node.
- The underlay, one per rail r: a /24 (192.168.<100+r>.0/24 by default), a Linux bridge
  `tn<hash>t<r>` in the host namespace as the rail's top-of-rack switch, and per node a veth
  whose node end is a port of an OVS bridge `br-rail<r>` in the node, the address on that
  bridge's internal port: the userspace datapath's `tnl_push` routes a tunnel only out of an
  OVS bridge — with the address on the veth itself the underlay pings, yet no Geneve packet
  leaves (shown here).
- Pods (`plug_pod`): a namespace `tn<hash>n<i>-<pod>` with `eth0`, whose peer is a port of
  the node's integration bridge of the pod's rail with `external_ids:iface-id=<logical
  switch port>`; `make_pod_netns` makes an empty one for a real CNI ADD.

What is not simulated: the nodes share one kernel and one clock; the "wire" is veths and a
Linux bridge; the datapath is OVS's userspace one, not a kernel or hardware datapath.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tenantnet.lab.ovs import LabError, has_exited

META = "ovn-lab.json"
NB_SCHEMA = "/usr/share/ovn/ovn-nb.ovsschema"
SB_SCHEMA = "/usr/share/ovn/ovn-sb.ovsschema"
VSWITCH_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
INTEGRATION_BRIDGE = "br-int"
DATAPATH = "netdev"
UNDERLAY_BASE = 100  # rail r's underlay is 192.168.<UNDERLAY_BASE + r>.0/24
UNDERLAY_MTU = 1500
MGMT_NET = "192.168.99.{}"  # the management network: etcd on .254, node i on .i
ETCD_HOST = MGMT_NET.format(254)
CLUSTER_POOLS = ("10.88.0.0/16",)
ETCD_PREFIX = "/tenantnet/"


@dataclass(frozen=True)
class OvnRail:
    """A node's rail NIC: its own OVN chassis, integration bridge and Geneve endpoint."""

    name: str                # rail<r>, a key of the node config's ovn.rails
    index: int
    chassis: str             # <node> for rail 0, <node>-rail<r> otherwise
    integration_bridge: str  # br-int for rail 0, br-int-rail<r> otherwise
    underlay_bridge: str     # br-rail<r>: its uplink is the rail's veth, the encap IP is on it
    encap_ip: str
    controller: str          # the ovn-controller's pid/log file stem in the node dir
    rundir: str              # that ovn-controller's OVN_RUNDIR (its control socket)


@dataclass(frozen=True)
class OvnNode:
    """One simulated node of the overlay lab."""

    name: str            # also rail 0's OVN chassis name
    index: int
    netns: str
    root: str            # its run directory (conf.db, sockets, pid files, logs)
    encap_ips: list[str]  # one underlay address per rail (rails[r].encap_ip)
    rails: list[OvnRail] = field(default_factory=list)
    node_config: str = ""  # the tenantnet node config the lab wrote for this node
    mgmt_ip: str = ""      # its address on the management network (etcd)

    @property
    def ovsdb(self) -> str:
        return f"unix:{os.path.join(self.root, 'db.sock')}"

    def daemons(self) -> list[str]:
        """Its daemons' pid-file stems, in the order they are stopped."""
        return [*(r.controller for r in self.rails), "ovs-vswitchd", "ovsdb-server"]


@dataclass(frozen=True)
class OvnLab:
    root: str
    tag: str
    nb: str
    sb: str
    rails: int
    nodes: list[OvnNode] = field(default_factory=list)
    etcd: str = ""  # the lab's etcd client URL (reachable from the nodes' namespaces)


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


def _daemon(rundir: str, name: str, cmd: list[str], netns: str | None = None,
            ovn_rundir: str | None = None) -> None:
    """Start `cmd` detached, with pid file, log and (where it takes one) control socket in
    `rundir`; an ovn-controller's control socket goes to `ovn_rundir` (default `rundir`)."""
    args = [*cmd, f"--pidfile={rundir}/{name}.pid", f"--log-file={rundir}/{name}.log",
            "--detach", "--no-chdir"]
    env = _env(rundir)
    if name.startswith("ovn-controller"):
        env.update(OVN_RUNDIR=ovn_rundir or rundir)
    else:
        args.append(f"--unixctl={rundir}/{name}.ctl")
    _run(_in_ns(netns, args), f"starting {name}", env=env)


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


def _rail(node_name: str, root: str, index: int, rail: int) -> OvnRail:
    if rail == 0:
        return OvnRail(name="rail0", index=0, chassis=node_name, integration_bridge=INTEGRATION_BRIDGE,
                       underlay_bridge="br-rail0", encap_ip=underlay_address(0, index),
                       controller="ovn-controller", rundir=root)
    return OvnRail(name=f"rail{rail}", index=rail, chassis=f"{node_name}-rail{rail}",
                   integration_bridge=f"{INTEGRATION_BRIDGE}-rail{rail}", underlay_bridge=f"br-rail{rail}",
                   encap_ip=underlay_address(rail, index), controller=f"ovn-controller-rail{rail}",
                   rundir=os.path.join(root, f"rail{rail}"))


def _start_node(root: str, tag: str, index: int, rails: int, etcd: str) -> OvnNode:
    name = f"node{index}"
    node_root = os.path.join(root, name)
    node = OvnNode(name=name, index=index, netns=f"{tag}n{index}", root=node_root,
                   encap_ips=[underlay_address(r, index) for r in range(rails)],
                   rails=[_rail(name, node_root, index, r) for r in range(rails)],
                   node_config=os.path.join(node_root, "tenantnet.yaml"), mgmt_ip=MGMT_NET.format(index))
    os.makedirs(node.root, mode=0o700)
    _run(["ip", "netns", "add", node.netns], f"creating netns {node.netns}")
    ip_ns(node.netns, "link", "set", "lo", "up")
    if etcd:  # the management network exists for etcd only
        _mgmt(tag, node)
    db = os.path.join(node.root, "conf.db")
    _run(["ovsdb-tool", "create", db, VSWITCH_SCHEMA], f"{name}: creating conf.db", _env(node.root))
    _daemon(node.root, "ovsdb-server", ["ovsdb-server", db, f"--remote=punix:{node.root}/db.sock"],
            node.netns)
    vsctl(node, "--no-wait", "init")
    _daemon(node.root, "ovs-vswitchd", ["ovs-vswitchd", node.ovsdb], node.netns)
    for rail in node.rails:
        _underlay(tag, node, rail)
    sb = os.path.join(_central(root), "sb.sock")
    # Rail 0: the plain keys (what a single-NIC node has); they are also every other
    # chassis's defaults (ovn-remote, encap type, datapath type), which the
    # chassis-specific keys `<key>-<chassis>` override per rail (ovn-controller(8)).
    keys = [f"external_ids:system-id={name}", f"external_ids:hostname={name}",
            f"external_ids:ovn-remote=unix:{sb}", "external_ids:ovn-encap-type=geneve",
            f"external_ids:ovn-bridge-datapath-type={DATAPATH}"]
    for rail in node.rails:
        suffix = "" if rail.index == 0 else f"-{rail.chassis}"
        keys += [f"external_ids:ovn-encap-ip{suffix}={rail.encap_ip}",
                 f"external_ids:ovn-bridge{suffix}={rail.integration_bridge}",
                 # a chassis tunnels only to chassis of its own zone: the same rail's
                 f"external_ids:ovn-transport-zones{suffix}={rail.name}"]
        # the integration bridge made here with the userspace datapath: ovn-controller would
        # make it `system`
        vsctl(node, "add-br", rail.integration_bridge, "--", "set", "Bridge", rail.integration_bridge,
              f"datapath_type={DATAPATH}", "fail_mode=secure", "other_config:disable-in-band=true")
    vsctl(node, "set", "Open_vSwitch", ".", *keys)
    for rail in node.rails:
        os.makedirs(rail.rundir, mode=0o700, exist_ok=True)
        chassis = [] if rail.index == 0 else ["-n", rail.chassis]
        _daemon(node.root, rail.controller, ["ovn-controller", *chassis, node.ovsdb], node.netns,
                ovn_rundir=rail.rundir)
    _write_node_config(root, node, etcd)
    return node


def _mgmt(tag: str, node: OvnNode) -> None:
    """The node's leg on the management network: veth `mgmt` to the etcd namespace's bridge."""
    mgmt_ns = f"{tag}e"
    ip_ns(node.netns, "link", "add", "mgmt", "type", "veth", "peer", "name", f"m{node.index}",
          "netns", mgmt_ns)
    ip_ns(mgmt_ns, "link", "set", f"m{node.index}", "master", "br-mgmt", "up")
    _sysctl(node.netns, "net.ipv6.conf.mgmt.disable_ipv6", "1")
    ip_ns(node.netns, "addr", "add", f"{node.mgmt_ip}/24", "dev", "mgmt")
    ip_ns(node.netns, "link", "set", "mgmt", "up")


def _start_etcd(root: str, tag: str) -> str:
    """The lab's one etcd (cluster IPAM), in the management namespace: its client URL.

    Like tenantnet/lab/cluster.py's (free port, private data dir, stopped by pid), but on
    the management address, which the nodes' namespaces reach and the host's loopback is not."""
    import sys

    from tenantnet.lab.cluster import _free_port

    mgmt_ns = f"{tag}e"
    _run(["ip", "netns", "add", mgmt_ns], f"creating netns {mgmt_ns}")
    ip_ns(mgmt_ns, "link", "set", "lo", "up")
    ip_ns(mgmt_ns, "link", "add", "br-mgmt", "type", "bridge")
    _sysctl(mgmt_ns, "net.ipv6.conf.br-mgmt.disable_ipv6", "1")
    ip_ns(mgmt_ns, "addr", "add", f"{ETCD_HOST}/24", "dev", "br-mgmt")
    ip_ns(mgmt_ns, "link", "set", "br-mgmt", "up")
    etcd_dir = os.path.join(root, "etcd")
    os.makedirs(etcd_dir, mode=0o700)
    # the namespace is new and empty: any port is free in it
    client, peer = _free_port(), _free_port()
    url, peer_url = f"http://{ETCD_HOST}:{client}", f"http://{ETCD_HOST}:{peer}"
    with open(os.path.join(etcd_dir, "etcd.log"), "ab") as log:
        try:
            # `ip netns exec` execs etcd: the pid is etcd's
            proc = subprocess.Popen(
                ["ip", "netns", "exec", mgmt_ns, "etcd", "--name", "lab", "--data-dir",
                 os.path.join(etcd_dir, "data"), "--listen-client-urls", url, "--advertise-client-urls", url,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"lab={peer_url}", "--log-level", "error"],
                stdout=log, stderr=log, start_new_session=True)
        except FileNotFoundError:
            raise LabError("etcd is not installed (apt-get install etcd-server)") from None
    with open(os.path.join(etcd_dir, "etcd.pid"), "w") as fh:
        fh.write(f"{proc.pid}\n")
    probe = ("import sys, time\nfrom ipam.etcd import Etcd, EtcdConfig, EtcdUnavailable\n"
             "deadline = time.monotonic() + 15\nwhile True:\n"
             "    try:\n        Etcd(EtcdConfig((sys.argv[1],), timeout=0.5)).get('/lab-probe'); break\n"
             "    except EtcdUnavailable:\n"
             "        if time.monotonic() > deadline: sys.exit(1)\n        time.sleep(0.1)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        _run(["ip", "netns", "exec", mgmt_ns, sys.executable, "-c", probe, url], "waiting for etcd", env,
             timeout=30)
    except LabError:
        raise LabError(f"etcd did not start (see {etcd_dir}/etcd.log)") from None
    return url


def node_config_text(lab_root: str, node: OvnNode, etcd: str) -> str:
    """The node's tenantnet config: everything it names lies in the node's directory; OVN NB
    is the lab's, one rail per underlay with its own chassis and integration bridge."""
    r = node.root
    central = _central(lab_root)
    text = (
        f"# written by `tenantnetctl lab up --overlay` (a simulation): node {node.name} of the overlay\n"
        f"# lab in {lab_root}; for calls made inside its network namespace {node.netns}\n"
        f"nodeName: {node.name}\n"
        f"nodeAddress: {node.mgmt_ip}\n"
        f"ovsdb: {node.ovsdb}\n"
        f"stateDir: {r}/state\n"
        f"logFile: {r}/log/tenantnet.log\n"
        f"agentSocket: {r}/agent.sock\n"
        f"deviceInfoDir: {r}/devinfo/cni\n"
        f"ipamDataDirs: [{r}/ipam, {r}/state/ipam]\n"
        f"ipamDataDir: {r}/ipam\n"
        f"resolvConfPaths: [{r}/resolv.d]\n"
        f"ovsConfigurationPaths: [{r}/ovs.d]\n"
        "replaceDefaults: [ipamDataDirs, resolvConfPaths, ovsConfigurationPaths]\n"
    )
    if etcd:
        text += (
            "# the lab's one etcd (management network): cluster IPAM hands unique addresses\n"
            f"etcdEndpoints: [{etcd}]\n"
            f"etcdPrefix: {ETCD_PREFIX}\n"
            f"clusterPools: [{', '.join(CLUSTER_POOLS)}]\n"
        )
    text += (
        "ovn:\n"
        f"  northbound: unix:{central}/nb.sock\n"
        "  timeout: 5\n"
        "  rails:\n"
    )
    for rail in node.rails:
        text += (
            f"    {rail.name}:\n"
            f"      integrationBridge: {rail.integration_bridge}\n"
            f"      ovsdb: {node.ovsdb}\n"
            f"      underlayMtu: {UNDERLAY_MTU}\n"
            f"      underlayBridge: {rail.underlay_bridge}\n"
            f"      chassis: {rail.chassis}\n"
            "      userspaceDatapath: true\n"
        )
    text += "  defaultRail: rail0\n"
    return text


def _write_node_config(lab_root: str, node: OvnNode, etcd: str) -> None:
    for sub in ("state", "log", "ipam", "devinfo/cni", "resolv.d", "ovs.d"):
        os.makedirs(os.path.join(node.root, sub), mode=0o700, exist_ok=True)
    with open(node.node_config, "w") as fh:
        fh.write(node_config_text(lab_root, node, etcd))


def _underlay(tag: str, node: OvnNode, rail: OvnRail) -> None:
    """Node `node`'s leg on rail `rail`: veth to the rail's ToR, OVS bridge br-rail<r> with the address."""
    tor, host_end, node_end = f"{tag}t{rail.index}", f"{tag}h{node.index}r{rail.index}", rail.name
    bridge = rail.underlay_bridge
    _run(["ip", "link", "add", host_end, "mtu", str(UNDERLAY_MTU), "type", "veth", "peer", "name", node_end,
          "mtu", str(UNDERLAY_MTU), "netns", node.netns], f"{node.name}: underlay veth on {rail.name}")
    _run(["ip", "link", "set", host_end, "master", tor, "up"], f"{node.name}: joining {tor}")
    # The kernel sees the AF_PACKET port too: without arp_ignore=1 it also answers ARP for the
    # bridge's address (two replies), and IPv6 on it would send its own traffic (CNI-FACTS §7).
    _sysctl(node.netns, f"net.ipv4.conf.{node_end}.arp_ignore", "1")
    _sysctl(node.netns, f"net.ipv6.conf.{node_end}.disable_ipv6", "1")
    ip_ns(node.netns, "link", "set", node_end, "up")
    vsctl(node, "add-br", bridge, "--", "set", "Bridge", bridge, f"datapath_type={DATAPATH}",
          "--", "add-port", bridge, node_end)
    _sysctl(node.netns, f"net.ipv6.conf.{bridge}.disable_ipv6", "1")
    ip_ns(node.netns, "addr", "add", f"{rail.encap_ip}/24", "dev", bridge)
    ip_ns(node.netns, "link", "set", bridge, "up")


def up(root: str, nodes: int = 2, rails: int = 1, etcd: bool = True) -> OvnLab:
    """Build the overlay lab in `root` (a leftover one there is removed first); with `etcd`,
    the lab's etcd for cluster IPAM, named in every node config."""
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
        if etcd:
            lab = replace(lab, etcd=_start_etcd(root, tag))
            _save(lab)
        _start_central(root)
        for rail in range(rails):
            tor = f"{tag}t{rail}"
            _run(["ip", "link", "add", tor, "type", "bridge"], f"creating ToR bridge {tor}")
            _run(["ip", "link", "set", tor, "up"], f"bringing {tor} up")
        for index in range(1, nodes + 1):
            lab.nodes.append(_start_node(root, tag, index, rails, lab.etcd))
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
    nodes = []
    for n in raw.get("nodes", []):
        n["rails"] = [OvnRail(**r) for r in n.get("rails", [])]
        nodes.append(OvnNode(**n))
    raw["nodes"] = nodes
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


OUR_PROGRAMS = frozenset({"ovsdb-server", "ovs-vswitchd", "ovn-controller", "ovn-northd", "etcd"})


def _strays(root: str) -> list[int]:
    """Processes of ours (an OVS/OVN daemon, etcd) whose command line names a file in `root`."""
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
        if os.path.basename(argv[0]) in OUR_PROGRAMS \
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
        # every rail's ovn-controller first (pid files ovn-controller[-rail<r>].pid), then OVS
        controllers = sorted(f[:-4] for f in os.listdir(rundir)
                             if f.startswith("ovn-controller") and f.endswith(".pid"))
        for name in [*controllers, *NODE_DAEMONS[1:]]:
            pid = _pid(rundir, name)
            if pid is None:
                continue
            if name.startswith("ovn-controller"):
                # `exit` lets it remove its Chassis row and bindings from the SB before it ends;
                # its control socket is in its own OVN_RUNDIR (rail r ≥ 1: <node dir>/rail<r>).
                ovn_rundir = rundir if name == "ovn-controller" else \
                    os.path.join(rundir, name.removeprefix("ovn-controller-"))
                ctl = os.path.join(ovn_rundir, f"ovn-controller.{pid}.ctl")
                subprocess.run(["ovn-appctl", "-t", ctl, "exit"],
                               capture_output=True, timeout=10, check=False)
            _stop(rundir, name)
            removed.append(f"{d}: {name}")
    central = _central(root)
    for name in CENTRAL_DAEMONS:
        if _stop(central, name):
            removed.append(name)
    etcd_dir = os.path.join(root, "etcd")
    etcd_pid = _pid(etcd_dir, "etcd")
    if etcd_pid is not None and _stop(etcd_dir, "etcd"):
        removed.append("etcd")
        try:  # reap it when this process started it (`up` in the same process, as tests do)
            os.waitpid(etcd_pid, os.WNOHANG)
        except ChildProcessError:
            pass
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
    """The lab as JSON-ready data, or None when there is none: {"ovn": {nb, sb, running},
    "etcd", "rails", "nodes": [{name, netns, nodeConfig, ovsdb, mgmtIp, encapIps, running,
    "rails": {rail<r>: {chassis, integrationBridge, underlayBridge, encapIp, running}}}]}."""
    lab = load(root)
    if lab is None:
        return None
    central = _central(root)
    return {
        "root": root,
        "ovn": {"nb": lab.nb, "sb": lab.sb, "running": all(_pid(central, d) for d in CENTRAL_DAEMONS)},
        "etcd": lab.etcd or None,
        "rails": lab.rails,
        "nodes": [{"name": n.name, "netns": n.netns, "nodeConfig": n.node_config, "ovsdb": n.ovsdb,
                   "mgmtIp": n.mgmt_ip, "encapIps": n.encap_ips,
                   "running": all(_pid(n.root, d) for d in n.daemons()),
                   "rails": {r.name: {"chassis": r.chassis, "integrationBridge": r.integration_bridge,
                                      "underlayBridge": r.underlay_bridge, "encapIp": r.encap_ip,
                                      "running": _pid(n.root, r.controller) is not None}
                             for r in n.rails}}
                  for n in lab.nodes],
    }


def in_node(node: OvnNode, cmd: list[str]) -> list[str]:
    """`cmd` run inside `node`'s network namespace, with its node config as tenantnet's
    (TENANTNET_CONFIG): a CNI call or agent run made so attaches to that node."""
    return ["ip", "netns", "exec", node.netns, "env", f"TENANTNET_CONFIG={node.node_config}", *cmd]


def make_pod_netns(lab: OvnLab, node: OvnNode, name: str) -> str:
    """An empty pod network namespace (only `lo`, up) for a CNI ADD on `node`; named under the
    lab's tag, so `down` removes it. Returns its name (`ip netns` name)."""
    netns = f"{node.netns}-{name}"
    if not netns.startswith(lab.tag):
        raise LabError(f"{node.name} is not a node of the lab in {lab.root}")
    _run(["ip", "netns", "add", netns], f"creating pod netns {netns}")
    ip_ns(netns, "link", "set", "lo", "up")
    return netns


# --- pods ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabPod:
    name: str
    netns: str
    node: str
    port: str   # the integration bridge's port (veth host end) in the node's namespace
    lsp: str
    mac: str
    ip: str     # with prefix length


def tx_checksum_in(netns: str, ifname: str, on: bool | None = None) -> bool:
    """Read (and with `on` set) the TX checksum offload of `ifname` in namespace `netns` —
    what `ethtool -K <if> tx off` does, for machines without ethtool (tenantnet's own
    SIOCETHTOOL helper, which opens its socket inside the namespace)."""
    from tenantnet.plugin.system import ethtool

    return ethtool.tx_checksum(f"/run/netns/{netns}", ifname, on)


def plug_pod(lab: OvnLab, node: OvnNode, pod: str, lsp: str, mac: str, ip: str, bind: bool = True,
             rail: int = 0) -> LabPod:
    """A pod on `node`: namespace + eth0, its peer a port of rail `rail`'s integration bridge;
    `bind` sets iface-id = `lsp` at once (else `bind_pod` does, e.g. to time the binding)."""
    netns = f"{node.netns}-{pod}"
    port = f"{lab.tag}v" + hashlib.sha256(netns.encode()).hexdigest()[:6]
    make_pod_netns(lab, node, pod)
    ip_ns(node.netns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip_ns(netns, "link", "set", "eth0", "address", mac)
    ip_ns(netns, "addr", "add", ip, "dev", "eth0")
    ip_ns(netns, "link", "set", "eth0", "up")
    # The userspace datapath leaves TX checksums of a veth pod to the stack: TCP fails otherwise.
    if tx_checksum_in(netns, "eth0", False):
        raise LabError(f"{netns}: eth0 kept its tx checksum offload")
    # The node's kernel would otherwise send its own IPv6 (DAD, router solicitations) to the pod
    # through the host end: that end is only an AF_PACKET port of br-int, never an interface.
    _sysctl(node.netns, f"net.ipv6.conf.{port}.disable_ipv6", "1")
    ip_ns(node.netns, "link", "set", port, "up")
    vsctl(node, "add-port", node.rails[rail].integration_bridge, port)
    result = LabPod(name=pod, netns=netns, node=node.name, port=port, lsp=lsp, mac=mac, ip=ip)
    if bind:
        bind_pod(node, result)
    return result


def bind_pod(node: OvnNode, pod: LabPod) -> None:
    vsctl(node, "set", "Interface", pod.port, f"external_ids:iface-id={pod.lsp}")
