"""A TenantNetwork rendered: the network config it means, the NAD each selected namespace
gets, and what the controller checks across networks (pure; the renderer in
tenantnet/kube/render.py writes the results, tnadmit.py renders a node's config with it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tenantnet.plugin.tenantnetworks import (
    API_VERSION,
    FINALIZER,
    KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAD_CNI_VERSION,
    NETWORK_FIELD,
    NETWORK_LABEL,
    TenantNetwork,
)
from tenantnet.plugin.tenants import TenantResolver


def render_config(tn: TenantNetwork, node_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The network config a TenantNetwork means: the NAD's `spec.config` (with the fabric's
    network-wide bridge/PFs), and on a node (with its labels) what the attachment gets."""
    bridge, pfs = tn.fabric.on(node_labels or {})
    config: dict[str, Any] = {
        "cniVersion": NAD_CNI_VERSION, "name": tn.name, "type": "tenantnet", NETWORK_FIELD: tn.name,
        "mode": tn.fabric.mode,
    }
    if tn.fabric.overlay:
        # No bridge: the node's rail (ovn.rails) names its integration bridge. `vlan` below is
        # the segment, no 802.1Q tag: the logical switch's tunnel key.
        config["overlay"] = tn.fabric.overlay
        if tn.fabric.rail:
            config["rail"] = tn.fabric.rail
    elif bridge:
        config["bridge"] = bridge
    if pfs:
        config["pfs"] = list(pfs)
    if tn.segment is not None:
        config["vlan"] = tn.segment
    if tn.mtu is not None:
        config["mtu"] = tn.mtu
    if tn.fabric.mode != "sriov":
        config["prewarm"] = tn.prewarm
    if tn.fabric.mode != "ovs":
        config["rdma"] = tn.rdma
        if tn.rail_alignment is not None:
            config["railAlignment"] = {"within": tn.rail_alignment.within, "action": tn.rail_alignment.action}
    ipam: dict[str, Any] = {"type": "tenantnet-ipam",
                            "ranges": [[r.to_config() for r in rs] for rs in tn.pool.ranges]}
    if tn.pool.routes:
        ipam["routes"] = [{"dst": d, **({"gw": g} if g else {})} for d, g in tn.pool.routes]
    if tn.pool.block_size is not None:
        ipam["cluster"] = {"blockSize": tn.pool.block_size}
    config["ipam"] = ipam
    capabilities = {}
    if tn.pod_choices.static_ip:
        capabilities["ips"] = True
    if tn.pod_choices.mac:
        capabilities["mac"] = True
    if tn.fabric.mode != "ovs":
        capabilities["deviceID"] = True
        capabilities["CNIDeviceInfoFile"] = True
    if capabilities:
        config["capabilities"] = capabilities
    return config


def render_nad(tn: TenantNetwork, namespace: str) -> dict[str, Any]:
    """The NetworkAttachmentDefinition the renderer writes into `namespace`."""
    annotations = {}
    if tn.fabric.resource_name and tn.fabric.mode != "ovs":
        annotations["k8s.v1.cni.cncf.io/resourceName"] = tn.fabric.resource_name
    metadata: dict[str, Any] = {
        "name": tn.name, "namespace": namespace,
        "labels": {NETWORK_LABEL: tn.name, MANAGED_BY_LABEL: MANAGED_BY},
        "finalizers": [FINALIZER],
        "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": tn.name, "uid": tn.uid,
                             "controller": True, "blockOwnerDeletion": True}],
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": metadata,
            "spec": {"config": json.dumps(render_config(tn), sort_keys=True, separators=(",", ":"))}}


def selected(tn: TenantNetwork, resolver: TenantResolver, namespaces: Mapping[str, Mapping[str, str]]
             ) -> tuple[list[str], list[str]]:
    """(namespaces the network is rendered into, conflicts: namespaces whose tenant sources
    disagree — reported in the status, given nothing)."""
    chosen, conflicts = [], []
    for ns in sorted(namespaces):
        labels = namespaces[ns]
        res = resolver.resolve(ns, labels)
        if res.conflict:
            conflicts.append(res.reason)
        elif tn.grants(ns, res, labels):
            chosen.append(ns)
    return chosen, conflicts


# The one "fabric" every overlay network shares: tunnel keys are global in an OVN northbound
# database, whatever the rail (a rail chooses the encap address, not the datapath).
OVERLAY_FABRIC = "the Geneve overlay"


def overlay_switch(network: str, segment: int) -> str:
    """The logical switch of an overlay TenantNetwork: `tn-<network>.<segment>` (issue 29's
    spec; a new segment is a new switch, the old one removed once its ports are gone)."""
    from tenantnet.plugin.system.ovnnb import switch_name

    return switch_name(network, segment)


def cluster_conflicts(networks: list[TenantNetwork], resolver_tenants: Mapping[str, frozenset[str]]
                      ) -> dict[str, str]:
    """What the controller refuses across TenantNetworks (name -> reason; the older network,
    by name order, keeps its claim): overlapping pools, one VLAN of one fabric for two
    networks of different tenants, and one segment for two overlay networks (whatever their
    tenants and rails: the segment is the logical switch's tunnel key, unique in the NB; an
    overlay and a VLAN network may share a number). `resolver_tenants`: each network's
    tenants (listed and selected namespaces' tenants), computed by the caller."""
    refused: dict[str, str] = {}
    ok: list[TenantNetwork] = []
    for tn in sorted(networks, key=lambda n: n.name):
        reason = ""
        for other in ok:
            both = tn.pool.overlaps(other.pool)
            if both:
                reason = f"ipam range {both[0]} overlaps TenantNetwork {other.name}'s {both[1]}"
                break
            if tn.fabric.overlay and other.fabric.overlay:
                if tn.segment is not None and tn.segment == other.segment:
                    reason = (f"segment {tn.segment} is overlay TenantNetwork {other.name}'s tunnel key "
                              f"(logical switch {overlay_switch(other.name, tn.segment)}); a tunnel key "
                              "is unique in the OVN northbound database, whatever the tenants and rails")
                    break
                continue
            mine = resolver_tenants.get(tn.name, frozenset())
            theirs = resolver_tenants.get(other.name, frozenset())
            if tn.segment is not None and tn.segment == other.segment and mine != theirs and \
                    set(_fabrics(tn)) & set(_fabrics(other)):
                shared = sorted(set(_fabrics(tn)) & set(_fabrics(other)))[0]
                reason = (f"VLAN {tn.segment} of {shared} is TenantNetwork {other.name}'s "
                          f"(tenants {', '.join(sorted(theirs)) or 'none'}); a VLAN of one fabric belongs "
                          "to one tenant")
                break
        if reason:
            refused[tn.name] = reason
        else:
            ok.append(tn)
    return refused


def _fabrics(tn: TenantNetwork) -> list[str]:
    if tn.fabric.overlay:
        return [OVERLAY_FABRIC]  # its PFs (ovs-offload) carry Geneve, not the segment as a tag
    out = []
    per_node = [(n.bridge or tn.fabric.bridge, n.pfs or tn.fabric.pfs) for n in tn.fabric.nodes]
    for bridge, pfs in [(tn.fabric.bridge, tn.fabric.pfs), *per_node]:
        if bridge:
            out.append(f"bridge {bridge}")
        else:
            out.extend(f"PF {p}" for p in pfs)
    return out


def auto_vlan(tn: TenantNetwork, taken: Mapping[str, set[int]], lo: int, hi: int) -> int | None:
    """The lowest VLAN of the admin's range [lo, hi] free on every fabric of `tn`
    (taken: fabric -> VLANs in use there), or None when the range is used up. An overlay
    network's one fabric is OVERLAY_FABRIC: it picks among the overlay segments in use."""
    used: set[int] = set()
    for f in _fabrics(tn):
        used |= taken.get(f, set())
    for vlan in range(lo, hi + 1):
        if vlan not in used:
            return vlan
    return None


PFS_ANNOTATION = "tenantnet.io/pfs"  # on a Node: the SR-IOV PFs its agent found (tenantnet/kube/watch.py)
MAX_PUBLISHED_PFS = 64


def published_pfs(annotations: Mapping[str, str] | None) -> frozenset[str] | None:
    """The PF names and PCI addresses a Node's `tenantnet.io/pfs` annotation lists (a JSON
    list of {name, pci}); None when the node publishes none (no agent, or not valid)."""
    raw = (annotations or {}).get(PFS_ANNOTATION)
    if not isinstance(raw, str) or len(raw) > 16384:
        return None
    try:
        items = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    out: set[str] = set()
    for item in items[:MAX_PUBLISHED_PFS]:
        if isinstance(item, dict):
            out.update(str(item[k]) for k in ("name", "pci") if isinstance(item.get(k), str) and item[k])
    return frozenset(out)


def unknown_pfs(tn: TenantNetwork,
                nodes: Mapping[str, tuple[Mapping[str, str], frozenset[str] | None]]) -> str | None:
    """Why a VF network names PFs no node has, or None. `nodes`: name -> (labels, the PFs it
    publishes, None if none). A PF is known when any node its fabric (the node-specific entry
    chosen by the node's labels) gives it to publishes it; a PF no node would use is not
    checked (a node may join later). Advisory: each node still enforces its own PFs at ADD."""
    if tn.fabric.mode == "ovs":
        return None
    from tenantnet.plugin.pci import normalise_pci_address

    users: dict[str, list[str]] = {}
    for node in sorted(nodes):
        for pf in tn.fabric.on(nodes[node][0])[1]:
            users.setdefault(pf, []).append(node)
    missing = []
    for pf, on in users.items():
        wanted = {pf, normalise_pci_address(pf) or pf}
        if not any(wanted & (nodes[n][1] or frozenset()) for n in on):
            def says(n: str) -> str:
                has = sorted(nodes[n][1] or ())
                return f"{n} (publishes {', '.join(has)})" if has else f"{n} (publishes no PF)"

            shown = ", ".join(says(n) for n in on[:5]) + (f" and {len(on) - 5} more" if len(on) > 5 else "")
            missing.append(f"PF {pf} is on none of the nodes its fabric selects: {shown}")
    return "; ".join(missing)[:4096] or None
