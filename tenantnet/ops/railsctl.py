"""`tenantnetctl rails`: the node's GPUs and NICs, their PCIe distances (as `nvidia-smi topo -m`
names them: PIX, PXB, PHB, NODE, SYS), the free VFs of each NIC, and which pod's rail holds
which VF–GPU pairing (from the attachment records). Table, or `--json`.

`tenantnetctl rails --claims`: the pairs the kube-scheduler made through DRA (docs/rails.md,
"DRA: the pairs the scheduler made"). A pod asks in one ResourceClaim for GPUs (another
driver's devices) and rails (`tenantnet.io` devices) with a `matchAttribute:
resource.kubernetes.io/pcieRoot` constraint per pair; the scheduler only guarantees the two
share a host bridge. This view shows, for every claim allocated on this node, which VF went
with which GPU and how far apart they really are on this node's PCIe tree — the distance
computed from sysfs as the rest of `rails` computes it, not taken from the slices, so a slice
publishing a wrong pcieRoot shows up as a pair that is not PIX.

Split so it can be tested without an API server: `dra_pairs` is pure over the claims and
slices as the API returns them (JSON dicts) and the node's sysfs; `read_dra` reads them
(lightkube, the node config's kubeconfig, "" = in-cluster, as the agent); `cmd_rails`
renders. A constraint pairs a `tenantnet.io` device with the devices of other drivers whose
requests it names too (no `requests`: every request of the claim; a request `r` also covers
its subrequests `r/s`). Several candidates (a request with `count` > 1): a GPU not yet paired
in the claim first, then same pcieRoot, then nearest; none: the device is listed unpaired,
with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from tenantnet.ops.ipamctl import columns


def register(subparsers: Any, node_config_path: Callable[[argparse.Namespace], str | None]) -> None:
    p = subparsers.add_parser("rails", help="GPUs and NICs of this node, their PCIe distances, free VFs, "
                                            "and the pods' rail pairings",
                              description="Without options: the node's GPU x NIC distance matrix, each NIC's "
                                          "free VFs and nearest GPU, and the CNI path's rail pairings. With "
                                          "--claims: the GPU-rail pairs the kube-scheduler made through DRA.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--claims", action="store_true",
                   help="the ResourceClaims allocated on this node with tenantnet.io devices: each VF paired "
                        "with the device of another driver (the GPU) whose request shares a matchAttribute "
                        "resource.kubernetes.io/pcieRoot constraint with its request, both pcieRoots, and "
                        "their PCIe distance from this node's sysfs (PIX: same switch); devices without such "
                        "a pair are listed unpaired. Reads the API with the node config's kubeconfig "
                        "(needs kubernetes: true)")
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


# -- DRA: the pairs the scheduler made ---------------------------------------------------------


def dra_pairs(claims: list[dict[str, Any]], slices: list[dict[str, Any]], node_name: str, sysfs_root: str,
              claim_records: Mapping[str, Any]) -> list[dict[str, Any]]:
    """For every claim with a `tenantnet.io` device allocated from this node's pool (`node_name`):
    {"claim": "ns/name", "uid", "pods": ["ns/pod", …], "pairs": [{"gpu", "rail", "distance"}],
    "unpaired": [rail + "why"]}, sorted by claim. `claims`, `slices`: resource.k8s.io/v1 objects
    as JSON. `claim_records`: {claim uid: draclaims.ClaimRecord} of this node (the pods'
    interface names). Distances from the PCIe tree under `sysfs_root` (None, with
    "distanceError", when a device is not found there)."""
    from tenantnet.plugin.draclaims import DRIVER
    from tenantnet.plugin.rails import Distance

    devices = _slice_devices(slices)
    distance = _Distances(sysfs_root)
    out = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        status = claim.get("status") or {}
        results = [r for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
                   if isinstance(r, dict)]
        ours = [r for r in results if r.get("driver") == DRIVER and r.get("pool") == node_name]
        if not ours:
            continue  # another node's claim, a claim without rails, or not allocated yet
        namespace, uid = meta.get("namespace") or "", meta.get("uid") or ""
        record = claim_records.get(uid)
        constraints = [c for c in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []
                       if isinstance(c, dict) and c.get("matchAttribute") == _PCIE_ROOT]
        used: set[tuple[str, str, str]] = set()
        pairs, unpaired = [], []
        for r in ours:
            rail = _rail(r, devices, record, sysfs_root)
            request = r.get("request", "")
            partners = [o for o in results if o.get("driver") != DRIVER and any(
                _covers(c, request) and _covers(c, o.get("request", "")) for c in constraints)]
            if not partners:
                unpaired.append({**rail, "why": f"no request of another driver shares a matchAttribute "
                                                f"{_PCIE_ROOT} constraint with request {request!r}"})
                continue
            gpus = [_gpu(o, devices) for o in partners]
            measured = [distance.between(g["pci"], rail["vf"]) for g in gpus]
            best = min(range(len(gpus)), key=lambda i: (
                _key(partners[i]) in used,
                gpus[i]["pcieRoot"] is None or gpus[i]["pcieRoot"] != rail["pcieRoot"],
                measured[i][0] if measured[i][0] is not None else Distance.SYS + 1,
                i))
            used.add(_key(partners[best]))
            level, error = measured[best]
            pair: dict[str, Any] = {"gpu": gpus[best], "rail": rail,
                                    "distance": level.name if level is not None else None}
            if error:
                pair["distanceError"] = error
            pairs.append(pair)
        pods = [f"{namespace}/{ref.get('name')}" if ref.get("resource") == "pods"
                else f"{ref.get('resource')}/{ref.get('name')}"
                for ref in status.get("reservedFor") or [] if isinstance(ref, dict)]
        out.append({"claim": f"{namespace}/{meta.get('name')}", "uid": uid, "pods": pods,
                    "pairs": pairs, "unpaired": unpaired})
    return sorted(out, key=lambda c: c["claim"])


_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"  # tenantnet.kube.slices.PCIE_ROOT: the standard name
_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"


def _covers(constraint: dict[str, Any], request: str) -> bool:
    """Whether a constraint applies to a result's request: no `requests` means every request;
    `r` covers its subrequests `r/s` (a prioritized list's choice), `r/s` only itself."""
    named = constraint.get("requests") or []
    return not named or request in named or request.split("/", 1)[0] in named


def _key(result: dict[str, Any]) -> tuple[str, str, str]:
    return result.get("driver", ""), result.get("pool", ""), result.get("device", "")


def _slice_devices(slices: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """{(driver, pool, device): attributes as plain values}; of a pool seen at several
    generations (a rewrite under way), the newest."""
    found: dict[tuple[str, str, str], tuple[int, dict[str, Any]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        generation = int(pool.get("generation") or 0)
        for d in spec.get("devices") or []:
            key = (spec.get("driver") or "", pool.get("name") or "", d.get("name") or "")
            if key not in found or found[key][0] <= generation:
                attrs = d.get("attributes") or {}
                found[key] = (generation, {name: _plain(v) for name, v in attrs.items()})
    return {k: attrs for k, (_, attrs) in found.items()}


def _plain(value: Any) -> Any:
    """A DeviceAttribute ({"string": …} | {"int": …} | {"bool": …} | {"version": …}) as its value."""
    if isinstance(value, dict):
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                return value[kind]
    return None


def _rail(result: dict[str, Any], devices: dict[tuple[str, str, str], dict[str, Any]], record: Any,
          sysfs_root: str) -> dict[str, Any]:
    from tenantnet.plugin.draclaims import vf_of_device
    from tenantnet.plugin.system.sysfs import Sysfs, SysfsError

    name = result.get("device", "")
    attrs = devices.get(_key(result), {})
    vf = vf_of_device(name) or attrs.get(_PCI_BUS_ID)
    pf, pf_pci = attrs.get("pf"), attrs.get("pfPciAddress")
    if vf and not (pf and pf_pci):  # not in the slices (any more): ask sysfs
        try:
            info = Sysfs(sysfs_root).vf(vf)
            pf, pf_pci = pf or info.pf_netdev, pf_pci or info.pf_address
        except SysfsError:
            pass
    ifname = None
    if record is not None:
        ifname = next((d.ifname for d in record.devices if d.device == name), None) or None
    return {"request": result.get("request"), "device": name, "vf": vf, "pf": pf, "pfPci": pf_pci,
            "pcieRoot": attrs.get(_PCIE_ROOT), "ifname": ifname}


def _gpu(result: dict[str, Any], devices: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
    attrs = devices.get(_key(result), {})
    return {"request": result.get("request"), "driver": result.get("driver"),
            "device": result.get("device"), "pci": attrs.get(_PCI_BUS_ID), "pcieRoot": attrs.get(_PCIE_ROOT)}


class _Distances:
    """PCIe distances on this node's tree, each device's position read once."""

    def __init__(self, sysfs_root: str) -> None:
        from tenantnet.plugin.system.pcitree import PcieTree

        self.tree = PcieTree(sysfs_root)
        self.positions: dict[str, Any] = {}

    def between(self, gpu: str | None, vf: str | None) -> tuple[Any, str]:
        """(rails.Distance, "") or (None, why not)."""
        from tenantnet.plugin import rails
        from tenantnet.plugin.system.sysfs import SysfsError

        if not gpu:
            return None, "the GPU's slice gives no resource.kubernetes.io/pciBusID"
        if not vf:
            return None, "the rail's PCI address is unknown"
        try:
            for address in (gpu, vf):
                if address not in self.positions:
                    self.positions[address] = self.tree.position(address)
        except SysfsError as exc:
            return None, str(getattr(exc, "msg", exc))
        return rails.classify(self.positions[gpu], self.positions[vf]), ""


class DraUnavailable(Exception):
    """The claims cannot be read: not in Kubernetes mode, or the API cannot be reached."""


def read_dra(node: Any, node_name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every ResourceClaim of the cluster, this node's ResourceSlices of every driver), as
    JSON; DraUnavailable with a one-line reason."""
    import yaml
    from lightkube import ApiError
    from lightkube.core.exceptions import ConfigError

    if not node.kubernetes:
        raise DraUnavailable(f"node config {node.source}: kubernetes is not true; --claims reads the "
                             "ResourceClaims from the Kubernetes API (node config keys kubernetes: true, "
                             "kubeconfig)")
    where = node.kubeconfig or "the in-cluster ServiceAccount"
    try:
        from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

        from tenantnet.kube import api

        client = api.client(node.kubeconfig, field_manager="tenantnetctl")
        claims = [api.as_dict(c) for c in client.list(ResourceClaim, namespace="*")]
        slices = [api.as_dict(s) for s in client.list(ResourceSlice, fields={"spec.nodeName": node_name})]
    except ApiError as exc:
        st = exc.status
        raise DraUnavailable(f"the API server refused to list ResourceClaims/ResourceSlices (with {where}): "
                             f"{st.code} {st.reason}: {st.message}") from None
    except _http_errors() as exc:
        raise DraUnavailable(f"cannot reach the API server (with {where}): "
                             f"{type(exc).__name__}: {exc}") from None
    except (ConfigError, OSError, yaml.YAMLError, ValueError) as exc:
        raise DraUnavailable(f"cannot use the kubeconfig {where}: {exc}") from None
    return claims, slices


def _http_errors() -> tuple[type[Exception], ...]:
    """The errors of the HTTP library under lightkube (1.x: httpx2, 0.x: httpx): a server that
    cannot be reached, a time-out, a TLS failure."""
    try:
        import httpx2 as http
    except ImportError:
        import httpx as http
    return (http.HTTPError,)


def claims_view(node: Any) -> list[dict[str, Any]]:
    """`rails --claims` as data: dra_pairs over what the API and this node's records hold."""
    from tenantnet.plugin.draclaims import ClaimStore
    from tenantnet.plugin.nodeconfig import node_name_of

    name = node_name_of(node)
    claims, slices = read_dra(node, name)
    try:
        records = {rec.uid: rec for rec in ClaimStore(node.state_dir).all()}
    except OSError as exc:  # e.g. run as a user who may not read the state dir: no ifnames
        print(f"tenantnetctl rails: cannot read the claim records under {node.state_dir}: "
              f"{exc.strerror or exc}; interface names not shown", file=sys.stderr)
        records = {}
    return dra_pairs(claims, slices, name, node.sysfs_root, records)


def render_claims(data: list[dict[str, Any]]) -> str:
    """The claims as one table: a row per pair, then per unpaired device, and a summary."""
    def root(pair: dict[str, Any]) -> str:
        a, b = pair["gpu"]["pcieRoot"], pair["rail"]["pcieRoot"]
        return a or "-" if a == b else f"{a or '-'} / {b or '-'}"

    def pf(rail: dict[str, Any]) -> str:
        return rail["pf"] or rail["pfPci"] or "-"

    rows = [["CLAIM", "PODS", "GPU", "GPU PCI", "RAIL VF", "PF", "IFNAME", "PCIE ROOT", "DISTANCE"]]
    counts: dict[str, int] = {}
    for c in data:
        pods = ",".join(c["pods"]) or "-"
        for p in c["pairs"]:
            g, r = p["gpu"], p["rail"]
            dist = p["distance"] or "?"
            counts[dist] = counts.get(dist, 0) + 1
            rows.append([c["claim"], pods, f"{g['driver']}/{g['device']}", g["pci"] or "-",
                         r["vf"] or r["device"], pf(r), r["ifname"] or "-", root(p), dist])
        for r in c["unpaired"]:
            counts["unpaired"] = counts.get("unpaired", 0) + 1
            rows.append([c["claim"], pods, "-", "-", r["vf"] or r["device"], pf(r), r["ifname"] or "-",
                         r["pcieRoot"] or "-", "unpaired"])
    from tenantnet.plugin.rails import Distance

    order = [*Distance.__members__, "?", "unpaired"]
    summary = ", ".join(f"{counts[k]} {k}" for k in order if k in counts)
    lines = [columns(rows), "", f"{len(data)} claim(s): {summary}"]
    notes = [f"{c['claim']} {p['rail']['vf']}: {p['distanceError']}" for c in data for p in c["pairs"]
             if p.get("distanceError")]
    notes += [f"{c['claim']} {r['vf'] or r['device']}: {r['why']}" for c in data for r in c["unpaired"]]
    return "\n".join(lines + notes)


def cmd_rails(args: argparse.Namespace) -> int:
    from cni.errors import CniError
    from tenantnet.plugin import nodeconfig
    from tenantnet.plugin.system.sysfs import SysfsError

    try:
        node = nodeconfig.load(args.node_config_path(args))
        if args.claims:
            claims = claims_view(node)
        else:
            data = view(node)
    except (CniError, SysfsError, DraUnavailable) as exc:
        print(f"tenantnetctl rails{' --claims' if args.claims else ''}: {getattr(exc, 'msg', exc)}",
              file=sys.stderr)
        return 1
    if args.claims:
        if args.json:
            print(json.dumps(claims, indent=2))
        elif not claims:
            print("no ResourceClaim has tenantnet.io devices allocated on this node")
        else:
            print(render_claims(claims))
        return 0
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
