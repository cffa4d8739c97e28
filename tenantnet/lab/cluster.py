"""The multi-node lab — a simulation, labelled as one: N nodes on this one machine.

Each simulated node is a whole lab node (`node.py`): its own Open vSwitch instance (userspace
datapath), state directory, IPAM store and node config, named `node1` … `nodeN`. A further
OVS instance plays the top-of-rack switch (`br-tor`): every node's `br-lab` has an uplink
veth to it, a trunk port on both sides, so tenant VLANs travel tagged between nodes as on
a real rail. A private etcd (Debian's etcd-server, free loopback ports, stopped by its pid)
is the cluster store the node configs name, so tenantnet-ipam hands out one pool across the
nodes in per-node blocks (docs/ipam.md, "Cluster mode").

What is not simulated: the nodes share one kernel, one host network namespace and one
machine's clock; their OVS instances are separate processes, their links distinct by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from typing import Any

from tenantnet.lab import node as lab_node
from tenantnet.lab.ovs import LabError, vsctl

META = "cluster.json"
TOR_BRIDGE = "br-tor"
ETCD_PREFIX = "/tenantnet/"
CLUSTER_POOLS = ("10.0.0.0/8", "fd00::/16")  # the private ranges the demo and the tests take from


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def _start_etcd(root: str) -> tuple[str, int]:
    """A single-member etcd in `root`: (client URL, pid)."""
    client, peer = _free_port(), _free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    os.makedirs(root, mode=0o700, exist_ok=True)
    with open(os.path.join(root, "etcd.log"), "ab") as log:
        try:
            proc = subprocess.Popen(
                ["etcd", "--name", "lab", "--data-dir", os.path.join(root, "data"),
                 "--listen-client-urls", url, "--advertise-client-urls", url,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"lab={peer_url}", "--log-level", "error"],
                stdout=log, stderr=log, start_new_session=True)
        except FileNotFoundError:
            raise LabError("etcd is not installed (apt-get install etcd-server)") from None
    with open(os.path.join(root, "etcd.pid"), "w") as fh:
        fh.write(f"{proc.pid}\n")
    from ipam.etcd import Etcd, EtcdConfig, EtcdUnavailable

    deadline = time.monotonic() + 15
    while True:
        try:
            Etcd(EtcdConfig((url,), timeout=0.5)).get("/lab-probe")
            return url, proc.pid
        except EtcdUnavailable:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"etcd did not start (see {root}/etcd.log)") from None
            time.sleep(0.1)


def _stop_pid(pidfile: str) -> bool:
    try:
        with open(pidfile) as fh:
            pid = int(fh.read().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            # Reap it when this process started it (a `lab up` in the same process, as the
            # tests do): a zombie still answers kill(pid, 0).
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return True


def _uplinks(root: str, n: int) -> list[tuple[str, str]]:
    tag = "c" + hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:5]
    return [(f"{tag}u{i}", f"{tag}t{i}") for i in range(1, n + 1)]


def up(root: str, nodes: int, vfs: int = 0, etcd: bool = True) -> dict[str, Any]:
    """Build the cluster lab in `root` (removed first if it is left from a crash)."""
    if os.path.exists(root):
        down(root)
    os.makedirs(root, mode=0o700)
    meta: dict[str, Any] = {"nodes": [], "etcd": None, "tor": os.path.join(root, "tor")}
    try:
        if etcd:
            meta["etcd"], _ = _start_etcd(os.path.join(root, "etcd"))
        lab_node.up(meta["tor"], TOR_BRIDGE)
        for i, (uplink, tor_port) in enumerate(_uplinks(root, nodes), start=1):
            node_root = os.path.join(root, f"node{i}")
            info = lab_node.up(node_root, lab_node.DEFAULT_BRIDGE, vfs=vfs)
            _ip("link", "add", uplink, "type", "veth", "peer", "name", tor_port)
            _ip("link", "set", uplink, "up")
            _ip("link", "set", tor_port, "up")
            # No tag, no trunks: both ends are trunks of every VLAN (802.1Q tagged on the wire).
            vsctl(node_root, "add-port", info.bridge, uplink)
            vsctl(meta["tor"], "add-port", TOR_BRIDGE, tor_port)
            with open(info.node_config, "a") as fh:
                # (its ipamDataDir, <node root>/ipam, is the lab node's own: node.node_config_text)
                fh.write(f"# node {i} of the cluster lab in {root} (a simulation)\n"
                         f"nodeName: node{i}\n")
                if meta["etcd"]:
                    # The admin's pools the lab's cluster networks take their ranges from.
                    fh.write(f"etcdEndpoints: [{meta['etcd']}]\netcdPrefix: {ETCD_PREFIX}\n"
                             f"clusterPools: [{', '.join(CLUSTER_POOLS)}]\n")
            meta["nodes"].append({"name": f"node{i}", "node_config": info.node_config, "bridge": info.bridge,
                                  "root": node_root, "uplink": uplink})
    except (LabError, OSError, subprocess.CalledProcessError):
        down(root)
        raise
    with open(os.path.join(root, META), "w") as fh:
        json.dump(meta, fh, indent=2)
    return status(root) or meta


def status(root: str) -> dict[str, Any] | None:
    """The cluster lab in `root`, or None when there is none."""
    try:
        with open(os.path.join(root, META)) as fh:
            meta: dict[str, Any] = json.load(fh)
    except (OSError, ValueError):
        return None
    meta["running"] = all(lab_node.status(n["root"]).running for n in meta["nodes"]) and \
        lab_node.status(meta["tor"]).running
    return meta


def is_cluster(root: str) -> bool:
    return os.path.exists(os.path.join(root, META))


def down(root: str) -> list[str]:
    """Remove every node, the top-of-rack switch, the uplinks and etcd; what was removed."""
    removed: list[str] = []
    names = sorted(d for d in os.listdir(root) if d.startswith("node")) if os.path.isdir(root) else []
    for name in names:
        removed += [f"{name}: {r}" for r in lab_node.down(os.path.join(root, name))]
    for uplink, _ in _uplinks(root, len(names) or 16):
        if os.path.exists(f"/sys/class/net/{uplink}"):
            subprocess.run(["ip", "link", "delete", uplink], capture_output=True, check=False)
            removed.append(f"link {uplink}")
    if os.path.isdir(os.path.join(root, "tor")):
        removed += [f"tor: {r}" for r in lab_node.down(os.path.join(root, "tor"))]
    if _stop_pid(os.path.join(root, "etcd", "etcd.pid")):
        removed.append("etcd")
    shutil.rmtree(root, ignore_errors=True)
    return removed
