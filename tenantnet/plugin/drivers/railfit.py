"""Rail alignment at attach time, for the VF modes: which of the pod's GPUs a VF pairs with,
how far apart the two are on the PCIe tree, and — when tenantnet picks the VF from a `pf`/
`pfs` pool — which free VF to take so that the pod's rails pair 1:1 with its GPUs.

The pod's GPUs come from the kubelet's pod-resources API (`system/podresources.py`; one
client per socket per process, so the agent caches a pod's answer across its rails), their
PCI addresses from the nvidia driver's /proc files or the node config's `gpuMap`, and the
distances from sysfs (`system/pcitree.py`, classified by `tenantnet/plugin/rails.py`). The
rails the pod already has are its other VF records (same container id; the driver passes
them): their GPUs and NICs are not offered again, so an 8-GPU pod with 8 rails gets 8 pairs.

Anything that keeps us from knowing (no kubelet socket, an unmapped GPU, a device missing in
sysfs) is a `RailUnknown`: with `action: refuse` the ADD fails with code 107 saying what;
with `warn` the VF is attached unpaired and the reason logged.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from cni.errors import CniError, Code
from tenantnet.plugin import rails
from tenantnet.plugin.system.sysfs import SysfsError, VirtualFunction


class RailUnknown(Exception):
    """The pod's GPUs or their places on the PCIe tree cannot be told; the message says why."""


@dataclass(frozen=True)
class RailFit:
    """The GPU a VF was paired with (None: the pod has none left) and their distance."""

    gpu: str | None
    distance: str | None  # PIX, PXB, PHB, NODE or SYS

    def within(self, limit: str) -> bool:
        return self.distance is not None and rails.within(rails.parse_distance(self.distance),
                                                          rails.parse_distance(limit))


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def _client(socket_path: str) -> Any:
    """One pod-resources client per socket per process: its per-pod cache serves the pod's
    other rails (the agent), and a one-shot exec asks once."""
    from tenantnet.plugin.system.podresources import PodResourcesClient

    with _clients_lock:
        found = _clients.get(socket_path)
        if found is None:
            found = _clients[socket_path] = PodResourcesClient(socket_path)
        return found


def pod_gpus(node: Any, namespace: str, name: str) -> list[str]:
    """The PCI addresses of the pod's GPUs, in the kubelet's order."""
    from tenantnet.plugin.system import podresources

    if not namespace or not name:
        raise RailUnknown("CNI_ARGS names no K8S_POD_NAMESPACE / K8S_POD_NAME: the pod's GPUs cannot "
                          "be asked of the kubelet")
    try:
        grants = _client(node.pod_resources_socket).gpus_of(namespace, name, node.gpu_resource_names)
        ids = list(dict.fromkeys(g.device_id for g in grants))
        if not ids:
            return []
        source: Any = node.gpu_map if node.gpu_map else podresources.NvidiaProcfs(node.nvidia_proc_root)
        return list(podresources.gpu_pci_addresses(ids, source).values())
    except (podresources.PodResourcesError, podresources.GpuMappingError) as exc:
        raise RailUnknown(str(exc)) from None


def choose(node: Any, env: Any, candidates: list[VirtualFunction], earlier: list[rails.Pairing],
           limit: str, pool: bool = True) -> tuple[VirtualFunction, RailFit | None] | None:
    """Of the free `candidates`, the VF to give this rail, and its pairing (None when the pod
    has no GPU); None when there is no candidate. RailUnknown when it cannot be told.
    `earlier`: what the pod's other rails on this node got (their records). `pool`: tenantnet
    chooses (one rail per NIC); else the one candidate is the device plugin's choice, only
    paired."""
    if not candidates:
        return None
    gpus = pod_gpus(node, env.args.pod_namespace, env.args.pod_name)
    if not gpus:
        return candidates[0], None
    from tenantnet.plugin.system.pcitree import PcieTree

    tree = PcieTree(node.sysfs_root)
    by_nic: dict[str, list[str]] = {}
    for vf in candidates:
        by_nic.setdefault(vf.pf_address, []).append(vf.address)
    try:
        gpu_pos = [tree.position(g) for g in gpus]
        nic_pos = [tree.position(n) for n in {*by_nic, *(p.nic for p in earlier)}]
    except SysfsError as exc:
        raise RailUnknown(f"the PCIe tree: {exc}") from None
    table = rails.distance_table(gpu_pos, nic_pos)
    pick = rails.choose_rail(rails.Rail(env.ifname), gpus, by_nic, table, paired=earlier,
                             limit=rails.parse_distance(limit), distinct_nics=pool)
    if pick is None:
        return None if pool else (candidates[0], RailFit(None, None))
    vf = next(v for v in candidates if v.address == pick.vf)
    return vf, RailFit(pick.gpu, pick.distance.name if pick.distance is not None else None)


def decide(node: Any, conf: Any, env: Any, candidates: list[VirtualFunction], earlier: list[rails.Pairing],
           pool: bool = True) -> tuple[VirtualFunction, RailFit | None] | None:
    """`choose`, with the network's `railAlignment` applied: a pairing beyond `within` (or one
    that cannot be told) is refused with code 107 (`action: refuse`) or logged (`warn`)."""
    v = conf.vf
    assert v is not None and v.rail_within is not None
    try:
        found = choose(node, env, candidates, earlier, v.rail_within, pool)
    except RailUnknown as exc:
        problem = f"rail alignment of network {conf.name}: {exc}"
        if v.rail_action == "refuse":
            raise CniError(Code.RAIL_MISALIGNED, problem,
                           "check the node config's podResourcesSocket / gpuMap, or set railAlignment.action "
                           "to warn") from None
        _warn("rail.unknown", conf, problem)
        return (candidates[0], None) if candidates else None
    if found is None:
        return None
    vf, fit = found
    if fit is not None and not fit.within(v.rail_within):
        where = (f"the pod's nearest unpaired GPU {fit.gpu} is {fit.distance} from it" if fit.gpu
                 else "every GPU of the pod is paired with another of its rails already")
        problem = (f"rail alignment: VF {vf.address} (NIC {vf.pf_netdev or vf.pf_address}): {where}; network "
                   f"{conf.name} asks for railAlignment.within {v.rail_within}")
        if v.rail_action == "refuse":
            raise CniError(Code.RAIL_MISALIGNED, problem,
                           "give the pod a VF of the NIC beside its GPU (deviceID), or let tenantnet choose "
                           "one from pf/pfs")
        _warn("rail.misaligned", conf, problem)
    return vf, fit


def _warn(event: str, conf: Any, problem: str) -> None:
    from tenantnet.plugin.log import get

    # The log's warnings reach stderr too (entry/logsetup.py), so the runtime's log shows them.
    get("tenantnet.rails").warning(event, network=conf.name, problem=problem)
