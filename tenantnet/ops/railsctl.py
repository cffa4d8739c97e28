"""`tenantnetctl rails`: the node's GPUs and NICs, their PCIe distances (as `nvidia-smi topo -m`
names them: PIX, PXB, PHB, NODE, SYS), the free VFs of each NIC, and which pod's rail holds
which VF–GPU pairing (from the attachment records). Table, or `--json`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from tenantnet.ops.ipamctl import columns


def register(subparsers: Any, node_config_path: Callable[[argparse.Namespace], str | None]) -> None:
    p = subparsers.add_parser("rails", help="GPUs and NICs of this node, their PCIe distances, free VFs, "
                                            "and the pods' rail pairings")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_rails, node_config_path=node_config_path)


def view(node: Any) -> dict[str, Any]:
    """Everything `rails` shows, as data."""
    from tenantnet.plugin import modes, rails
    from tenantnet.plugin.drivers.vf import VfPlan
    from tenantnet.plugin.records import CorruptRecord, RecordStore
    from tenantnet.plugin.system.pcitree import PcieTree
    from tenantnet.plugin.system.sysfs import Sysfs, SysfsError

    tree = PcieTree(node.sysfs_root)
    gpus, nics = tree.gpus(), tree.nics()
    table = rails.distance_table([g.position for g in gpus], [n.position for n in nics])
    held: dict[str, Any] = {}
    pairings = []
    for rec in RecordStore(node.state_dir, modes.plan_type).list():
        if isinstance(rec, CorruptRecord) or not isinstance(rec.plan, VfPlan) or not rec.plan.device_id:
            continue
        held[rec.plan.device_id] = rec
        if rec.plan.gpu:
            pairings.append({"pod": f"{rec.pod.namespace}/{rec.pod.name}", "containerID": rec.container_id,
                             "ifname": rec.ifname, "network": rec.network, "vf": rec.plan.device_id,
                             "nic": rec.plan.pf_address, "gpu": rec.plan.gpu,
                             "distance": rec.plan.gpu_distance})
    sysfs = Sysfs(node.sysfs_root)
    nic_rows = []
    for n in nics:
        try:
            vfs = sysfs.vfs_of_pf(n.address)
        except SysfsError:
            vfs = []
        free = [vf.address for vf in vfs if vf.address not in held and not vf.userspace and vf.netdev]
        nearest = min(((table[(g.address, n.address)], g.address) for g in gpus), default=None)
        nic_rows.append({"nic": n.address, "numaNode": n.position.numa_node, "vfs": len(vfs), "freeVfs": free,
                         "nearestGpu": nearest[1] if nearest else None,
                         "nearestDistance": nearest[0].name if nearest else None})
    return {
        "gpus": [{"gpu": g.address, "numaNode": g.position.numa_node} for g in gpus],
        "nics": nic_rows,
        "distances": {g.address: {n.address: table[(g.address, n.address)].name for n in nics} for g in gpus},
        "pairings": pairings,
    }


def cmd_rails(args: argparse.Namespace) -> int:
    from cni.errors import CniError
    from tenantnet.plugin import nodeconfig
    from tenantnet.plugin.system.sysfs import SysfsError

    try:
        data = view(nodeconfig.load(args.node_config_path(args)))
    except (CniError, SysfsError) as exc:
        print(f"tenantnetctl rails: {getattr(exc, 'msg', exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    if not data["gpus"] and not data["nics"]:
        print("no GPU and no NIC found under the node's sysfsRoot")
        return 0
    nics = [n["nic"] for n in data["nics"]]
    head = ["GPU \\ NIC", *nics, "NUMA"]
    lines = [head] + [[g["gpu"], *(data["distances"][g["gpu"]][n] for n in nics), str(g["numaNode"])]
                      for g in data["gpus"]]
    print(columns(lines))
    print()
    print(columns([["NIC", "NUMA", "VFS", "FREE", "NEAREST GPU"]] + [
        [n["nic"], str(n["numaNode"]), str(n["vfs"]), str(len(n["freeVfs"])),
         f"{n['nearestGpu']} ({n['nearestDistance']})" if n["nearestGpu"] else "-"] for n in data["nics"]]))
    if data["pairings"]:
        print()
        print(columns([["POD", "IFNAME", "NETWORK", "VF", "NIC", "GPU", "DISTANCE"]] + [
            [p["pod"], p["ifname"], p["network"], p["vf"], p["nic"], p["gpu"], p["distance"] or "-"]
            for p in data["pairings"]]))
    return 0
