"""`tenantnetctl lab up|down|status`: the lab's entry point — a simulation, labelled as one.

The lab is a private Open vSwitch (userspace datapath) and, on request, a simulated SR-IOV
NIC, on this machine, with a node config that points tenantnet at them
(`tenantnet/lab/node.py`); with `--kubernetes`, a real Kubernetes node over that OVS
(`tenantnet/lab/kube.py`: test infrastructure, not a simulation). tenantnetctl hands its
`lab` subcommand to this module; nothing else outside the lab imports the lab (an
import-linter contract, pyproject.toml).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tenantnet.lab import cluster
from tenantnet.lab import node as lab
from tenantnet.lab.ovs import LabError

__all__ = ["DEFAULT_CLUSTER_ROOT", "LabError", "cluster_node_config", "register", "running_node_config"]


DEFAULT_CLUSTER_ROOT = "/run/tenantnet-lab-cluster"


def cluster_node_config(root: str, name: str) -> str:
    """The node config of simulated node `name` of the cluster lab in `root` (`pod up --node`)."""
    meta = cluster.status(root)
    if meta is None:
        raise LabError(f"no cluster lab in {root} (tenantnetctl lab up --nodes N --dir {root})")
    for node in meta["nodes"]:
        if node["name"] == name:
            return str(node["node_config"])
    raise LabError(f"the cluster lab in {root} has no node {name!r}; it has "
                       + ", ".join(n["name"] for n in meta["nodes"]))


def running_node_config() -> str | None:
    """The default lab's node config while that lab is up (tenantnetctl's last default)."""
    info = lab.status()
    return info.node_config if info.running else None


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `lab up|down|status` to tenantnetctl's subcommands."""
    p_lab = subparsers.add_parser("lab", help="a private Open vSwitch lab on this machine")
    lab_sub = p_lab.add_subparsers(dest="lab_command", required=True, metavar="up|down|status|gpus")
    for name, text in (("up", "start the lab OVS and write its node config"),
                       ("down", "remove the lab and everything in it"),
                       ("status", "is the lab running (exit 3 if not)")):
        p = lab_sub.add_parser(name, help=text)
        p.add_argument("--dir", default=lab.DEFAULT_ROOT,
                       help=f"lab run directory (default {lab.DEFAULT_ROOT})")
        if name == "up":
            p.add_argument("--bridge", default=lab.DEFAULT_BRIDGE, help="OVS bridge to create")
            p.add_argument("--vfs", type=int, default=0, metavar="N",
                           help="also build a simulated SR-IOV NIC (PF lpf0) with N VFs (0-16)")
            p.add_argument("--switchdev", action="store_true",
                           help="the simulated NIC in switchdev mode: VF representors for OVS offload")
            p.add_argument("--gpus", type=int, default=0, metavar="8",
                           help="the simulated 8-GPU / 8-NIC server instead (two sockets, a PCIe switch "
                                "per GPU and NIC, --vfs VFs per NIC, default 2) and a simulated kubelet "
                                "answering the pod-resources API, for rail alignment; with --kubernetes, "
                                "the lab node is that server (default 4 VFs per NIC) and the simulated GPU "
                                "DRA driver gpu.lab.tenantnet.io publishes its GPUs")
            p.add_argument("--dpdk-vfs", type=int, default=0, metavar="K",
                           help="bind the last K simulated VFs to vfio-pci (DPDK mode)")
            p.add_argument("--nodes", type=int, default=1, metavar="N",
                           help="N simulated nodes (1-8), each its own OVS and node config, joined by a "
                                "trunk top-of-rack switch, with a private etcd for cluster IPAM")
            p.add_argument("--no-etcd", action="store_true",
                           help="with --nodes (and --overlay): no etcd for cluster IPAM")
            p.add_argument("--overlay", action="store_true",
                           help="with --nodes: the OVN overlay lab instead (tenantnet/lab/ovn.py): OVN "
                                "central, and per node a network namespace with its own OVS (userspace "
                                "datapath) and one ovn-controller (OVN chassis) per rail, Geneve over a "
                                "Linux-bridge ToR per rail, a tenantnet node config per node, one etcd")
            p.add_argument("--rails", type=int, default=1, metavar="R",
                           help="with --overlay: R underlay rails (1-8), 192.168.(100+r).0/24 each")
            p.add_argument("--kubernetes", action="store_true",
                           help="a real Kubernetes node instead: etcd, API server, controller-manager, "
                                "scheduler, containerd and a kubelet with Multus as its CNI, over the lab "
                                "OVS (docs/kubernetes.md)")
            p.add_argument("--refuse", action="append", metavar="FIELD",
                           choices=["mac", "vlan", "spoofchk", "trust", "link_state", "rate"],
                           help="make the simulated NIC refuse this VF attribute (repeatable)")
        if name != "down":
            p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=cmd_lab)
    p = lab_sub.add_parser("gpus", help="play the device plugin on the simulated GPU server "
                                        "(lab up --gpus 8): give a pod GPUs, or take them back")
    p.add_argument("--dir", default=lab.DEFAULT_ROOT, help=f"lab run directory (default {lab.DEFAULT_ROOT})")
    p.add_argument("--pod", required=True, metavar="NAMESPACE/NAME", help="the pod")
    p.add_argument("--count", type=int, default=0, metavar="N",
                   help="give the pod N free GPUs (1-8); 0: take its GPUs back")
    p.set_defaults(func=cmd_lab_gpus)
    return p_lab


def cmd_lab_gpus(args: argparse.Namespace) -> int:
    from tenantnet.lab import gpuserver

    namespace, sep, name = args.pod.partition("/")
    if not sep or not namespace or not name or not 0 <= args.count <= 8:
        print("tenantnetctl lab gpus: --pod NAMESPACE/NAME and --count 0-8", file=sys.stderr)
        return 2
    if not os.path.exists(gpuserver.pods_file(args.dir)):
        print(f"tenantnetctl lab gpus: no simulated GPU server in {args.dir} "
              f"(lab up --gpus 8 --dir {args.dir})", file=sys.stderr)
        return 1
    if args.count == 0:
        gpuserver.release_gpus(args.dir, namespace, name)
        print(f"pod {args.pod} holds no GPU now")
        return 0
    try:
        ids = gpuserver.assign_gpus(args.dir, namespace, name, args.count)
    except ValueError as exc:
        print(f"tenantnetctl lab gpus: {exc}", file=sys.stderr)
        return 1
    print(f"pod {args.pod} holds {', '.join(ids)} (simulated; the lab's kubelet reports them)")
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    if args.lab_command == "up" and not (0 <= args.vfs <= 16 and 0 <= args.dpdk_vfs <= args.vfs):
        print("tenantnetctl lab up: --vfs must be 0-16 and --dpdk-vfs at most --vfs", file=sys.stderr)
        return 2
    if args.lab_command == "up" and args.gpus not in (0, 8):
        print("tenantnetctl lab up: --gpus must be 8 (the simulated server has 8 GPUs and 8 NICs)",
              file=sys.stderr)
        return 2
    if args.lab_command == "up" and args.kubernetes and ((args.vfs and not args.gpus) or args.nodes != 1):
        print("tenantnetctl lab up: --kubernetes is one node over the lab OVS: no --nodes, and --vfs "
              "only with --gpus 8 (the simulated server's VFs per NIC)", file=sys.stderr)
        return 2
    if args.lab_command == "up" and not 1 <= args.nodes <= 8:
        print("tenantnetctl lab up: --nodes must be 1-8", file=sys.stderr)
        return 2
    from tenantnet.lab import kube  # only here: tenantnetctl reads this module for every command

    try:
        if (args.kubernetes if args.lab_command == "up" else kube.is_kube(args.dir)):
            return _cmd_kube(args)
        from tenantnet.lab import ovn

        if (args.overlay if args.lab_command == "up" else ovn.load(args.dir) is not None):
            return _cmd_overlay(args)
        multi = args.nodes > 1 if args.lab_command == "up" else cluster.is_cluster(args.dir)
        if multi:
            return _cmd_cluster(args)
        if args.lab_command == "up":
            info = lab.up(args.dir, args.bridge, vfs=args.vfs, dpdk_vfs=args.dpdk_vfs,
                          refuse=args.refuse or [], switchdev=args.switchdev, gpus=args.gpus)
            if args.json:
                print(json.dumps(lab.as_dict(info), indent=2))
            else:
                print(f"lab is up in {info.root}: OVS bridge {info.bridge} (userspace datapath)")
                print(f"ovsdb-server pid {info.ovsdb_server_pid}, ovs-vswitchd pid {info.ovs_vswitchd_pid}")
                for nic in info.nics:
                    print(f"simulated SR-IOV NIC ({nic['mode']}): PF {nic['pf']} ({nic['pfAddress']}), "
                          f"{len(nic['vfs'])} VFs: " + ", ".join(v["address"] for v in nic["vfs"]))
                print(f"node config: {info.node_config}")
                print(f"  export TENANTNET_CONFIG={info.node_config}")
            return 0
        if args.lab_command == "down":
            removed = lab.down(args.dir)
            what = f"removed: {', '.join(removed)}" if removed else "nothing was running"
            print(f"lab is down; {what}")
            return 0
        info = lab.status(args.dir)
        if args.json:
            print(json.dumps(lab.as_dict(info), indent=2))
        else:
            print(f"lab {info.root}: {'running' if info.running else 'not running'}")
            if info.running:
                print(f"  bridge {info.bridge}, OVSDB {info.ovsdb}, node config {info.node_config}")
        return 0 if info.running else 3
    except lab.LabError as exc:
        print(f"tenantnetctl lab {args.lab_command}: {exc}", file=sys.stderr)
        return 1


def _cmd_cluster(args: argparse.Namespace) -> int:
    """`lab up --nodes N`, and status/down of such a lab (tenantnet/lab/cluster.py)."""
    if args.lab_command == "up":
        meta = cluster.up(args.dir, args.nodes, vfs=args.vfs, etcd=not args.no_etcd)
    elif args.lab_command == "down":
        removed = cluster.down(args.dir)
        print(f"cluster lab is down; removed: {', '.join(removed) or 'nothing'}")
        return 0
    else:
        meta = cluster.status(args.dir) or {"nodes": [], "running": False, "etcd": None}
    shown = {"root": args.dir, "running": meta.get("running", False), "etcd": meta.get("etcd"),
             "nodes": [{"name": n["name"], "node_config": n["node_config"], "bridge": n["bridge"]}
                       for n in meta["nodes"]]}
    if getattr(args, "json", False):
        print(json.dumps(shown, indent=2))
    else:
        print(f"cluster lab {args.dir}: {len(shown['nodes'])} simulated nodes, "
              f"{'running' if shown['running'] else 'not running'}; etcd {shown['etcd'] or 'none'}")
        for n in shown["nodes"]:
            print(f"  {n['name']}: bridge {n['bridge']}, node config {n['node_config']}")
    return 0 if shown["running"] else 3


def _cmd_overlay(args: argparse.Namespace) -> int:
    """`lab up --nodes N --overlay`, and status/down of such a lab (tenantnet/lab/ovn.py)."""
    from tenantnet.lab import ovn

    if args.lab_command == "down":
        removed = ovn.down(args.dir)
        print(f"overlay lab is down; removed: {', '.join(removed) or 'nothing'}")
        return 0
    if args.lab_command == "up":
        if not 1 <= args.rails <= 8:
            print("tenantnetctl lab up: --rails must be 1-8", file=sys.stderr)
            return 2
        ovn.up(args.dir, nodes=args.nodes, rails=args.rails, etcd=not args.no_etcd)
    shown = ovn.status(args.dir) or {"ovn": {"nb": None, "sb": None, "running": False}, "nodes": []}
    running = shown["ovn"]["running"] and all(n["running"] for n in shown["nodes"])
    if getattr(args, "json", False):
        print(json.dumps(shown, indent=2))
    else:
        print(f"overlay lab {args.dir} (a simulation): OVN NB {shown['ovn']['nb']}, SB {shown['ovn']['sb']}, "
              f"{len(shown['nodes'])} nodes, {'running' if running else 'not running'}; "
              f"etcd {shown.get('etcd') or 'none'}")
        for n in shown["nodes"]:
            print(f"  {n['name']}: netns {n['netns']}, OVSDB {n['ovsdb']}, node config {n['nodeConfig']}")
            for rail, r in n["rails"].items():
                print(f"    {rail}: chassis {r['chassis']}, {r['integrationBridge']}, "
                      f"encap IP {r['encapIp']} on {r['underlayBridge']}")
        print(f"  ovn-nbctl --db={shown['ovn']['nb']} show")
        if shown["nodes"]:
            n = shown["nodes"][0]
            print(f"  in a node: ip netns exec {n['netns']} env TENANTNET_CONFIG={n['nodeConfig']} ...")
    return 0 if running else 3


def _cmd_kube(args: argparse.Namespace) -> int:
    """`lab up --kubernetes`, and status/down of such a lab (tenantnet/lab/kube.py)."""
    from tenantnet.lab import kube

    if args.lab_command == "down":
        removed = kube.down(args.dir)
        print(f"Kubernetes lab is down; removed: {', '.join(removed) or 'nothing'}")
        return 0
    if args.lab_command == "up":
        info = kube.up(args.dir, gpus=args.gpus, vfs=args.vfs or 4) if args.gpus else kube.up(args.dir)
    else:
        info = kube.status(args.dir)
    if getattr(args, "json", False):
        print(json.dumps(kube.as_dict(info), indent=2))
    elif info.running:
        print(f"Kubernetes lab {info.root}: node {info.node_name} ({info.node_ip}), "
              f"pids {', '.join(f'{k} {v}' for k, v in info.pids.items())}")
        print(f"  export KUBECONFIG={info.kubeconfig}")
        print(f"  kubectl: {info.kubectl}; tenantnet node config: {info.node_config}")
        for g in info.gpus:
            print(f"  simulated GPU {g['name']}: {g['pci']} {g['uuid']}, pcieRoot {g['pcieRoot']}, "
                  f"NUMA {g['numaNode']} (DRA driver gpu.lab.tenantnet.io, pid {info.pids.get('gpu-dra')})")
    else:
        print(f"Kubernetes lab {info.root}: not running")
    return 0 if info.running else 3
