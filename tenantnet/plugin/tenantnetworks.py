"""The TenantNetwork API (tenantnet.io/v1alpha1): its objects parsed into typed, bounded settings.

Pure: a TenantNetwork object (JSON, as the API server serves it) becomes a `TenantNetwork`,
or an `InvalidTenantNetwork` naming the field, the value and what is allowed. No client
library, no I/O: the renderer (tenantnet/kube/render.py) and every node (tnadmit.py, from
the agent's cache) parse with this one module, resolve tenants with tenants.py and render
with tnrender.py, so they cannot disagree on what a network grants. The CRD
(packaging/crds/tenantnetwork.yaml) carries the same bounds as a schema, so most mistakes
are refused by the API server already; they are checked again here because a node must
never trust a cache file more than the API.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tenantnet.plugin.tenants import Resolution, dns_label

GROUP = "tenantnet.io"
VERSION = "v1alpha1"
KIND = "TenantNetwork"
PLURAL = "tenantnetworks"
API_VERSION = f"{GROUP}/{VERSION}"

# What a rendered NAD carries: the network it renders (labels and the config's identifying
# field — Multus hands a node only the config JSON, never the NAD's metadata), its owner,
# and a finalizer so that only the renderer removes it.
NETWORK_FIELD = "tenantNetwork"
NETWORK_LABEL = "tenantnet.io/tenant-network"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "tenantnet-renderer"
FINALIZER = "tenantnet.io/rendered-nad"
NAD_CNI_VERSION = "1.0.0"

MODES = ("ovs", "sriov", "ovs-offload")  # as tenantnet/plugin/tnconf.py's
OVERLAYS = ("geneve",)  # issue 29: an OVN logical switch per network, its segment the Geneve VNI
OVERLAY_MODES = ("ovs", "ovs-offload")  # a port on the rail's integration bridge (veth or representor)
RDMA_CHOICES = ("auto", "exclusive", "off")
RAIL_LEVELS = ("PIX", "PXB", "PHB", "NODE")
POD_CHOICES = ("staticIP", "mac")

# Bounds (the CRD's schema has the same): a TenantNetwork is small, and a node reads it on
# every ADD.
MAX_TENANTS = 256
MAX_SELECTOR_TERMS = 16
MAX_SELECTOR_VALUES = 64
MAX_PFS = 16
MAX_NODE_FABRICS = 32
MAX_RANGE_SETS = 16  # ipam/config.py's MAX_RANGE_SETS
MAX_RANGES = 16
MAX_ROUTES = 32

_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_NETDEV = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,62}")  # a PF netdev name or PCI address
_BRIDGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}")  # as tnconf's
_RESOURCE = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


class InvalidTenantNetwork(ValueError):
    """A TenantNetwork (or a label set) that breaks a rule: names the field, the value and
    what is allowed. The renderer reports it in the object's status; a node refuses."""

    def __init__(self, network: str, where: str, value: Any, allowed: str) -> None:
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"TenantNetwork {network or '?'}: {where}={shown}: {allowed}")
        self.network = network
        self.where = where


def dns_subdomain(value: object) -> bool:
    return isinstance(value, str) and _DNS_SUBDOMAIN.fullmatch(value) is not None


def label_key_problem(key: object) -> str | None:
    """Why `key` is not a Kubernetes label key ([prefix/]name), or None."""
    if not isinstance(key, str):
        return "a label key is a string"
    prefix, _, name = key.rpartition("/")
    if prefix and not dns_subdomain(prefix):
        return "a label key's prefix is a DNS subdomain (at most 253 characters)"
    if not _LABEL_NAME.fullmatch(name):
        return ("a label key's name is at most 63 letters, digits, '-', '_', '.', starting and ending "
                "alphanumeric")
    return None


def label_value_ok(value: object) -> bool:
    return isinstance(value, str) and _LABEL_VALUE.fullmatch(value) is not None


def checked_labels(labels: object, where: str = "labels", network: str = "") -> dict[str, str]:
    """A label map, every key and value as Kubernetes allows them (a cache file is read back
    through this, so a corrupt one cannot smuggle a key the API server would refuse)."""
    if labels is None:
        return {}
    if not isinstance(labels, dict) or len(labels) > 512:
        raise InvalidTenantNetwork(network, where, labels, "must be a map of at most 512 labels")
    for key, value in labels.items():
        problem = label_key_problem(key)
        if problem:
            raise InvalidTenantNetwork(network, f"{where}[{key!r}]", key, problem)
        if not label_value_ok(value):
            raise InvalidTenantNetwork(network, f"{where}[{key!r}]", value,
                                       "a label value is at most 63 letters, digits, '-', '_', '.'")
    return dict(labels)


# ---- label selectors ------------------------------------------------------------------------

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels


@dataclass(frozen=True)
class LabelSelector:
    """metav1.LabelSelector: every matchLabels pair and every expression must hold. An empty
    selector matches everything (as in Kubernetes): the CRD refuses an empty one where that
    would grant a network to every namespace by accident."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[LabelRequirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and \
            all(e.matches(labels) for e in self.expressions)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.match_labels]
        for e in self.expressions:
            values = f" ({', '.join(e.values)})" if e.values else ""
            parts.append(f"{e.key} {e.operator}{values}")
        return ", ".join(parts) or "(everything)"


def parse_selector(raw: object, where: str, network: str = "") -> LabelSelector:
    if not isinstance(raw, dict) or not set(raw) <= {"matchLabels", "matchExpressions"}:
        raise InvalidTenantNetwork(network, where, raw, "must be a label selector with matchLabels "
                                                        "and/or matchExpressions")
    labels = checked_labels(raw.get("matchLabels"), f"{where}.matchLabels", network)
    if len(labels) > MAX_SELECTOR_TERMS:
        raise InvalidTenantNetwork(network, f"{where}.matchLabels", labels,
                                   f"at most {MAX_SELECTOR_TERMS} labels")
    exprs_raw = raw.get("matchExpressions") or []
    if not isinstance(exprs_raw, list) or len(exprs_raw) > MAX_SELECTOR_TERMS:
        raise InvalidTenantNetwork(network, f"{where}.matchExpressions", exprs_raw,
                                   f"must be a list of at most {MAX_SELECTOR_TERMS} expressions")
    exprs = []
    for i, e in enumerate(exprs_raw):
        ewhere = f"{where}.matchExpressions[{i}]"
        if not isinstance(e, dict) or not set(e) <= {"key", "operator", "values"}:
            raise InvalidTenantNetwork(network, ewhere, e, "must be {key, operator, values}")
        problem = label_key_problem(e.get("key"))
        if problem:
            raise InvalidTenantNetwork(network, f"{ewhere}.key", e.get("key"), problem)
        op = e.get("operator")
        if op not in SELECTOR_OPERATORS:
            raise InvalidTenantNetwork(network, f"{ewhere}.operator", op,
                                       f"must be one of {', '.join(SELECTOR_OPERATORS)}")
        values = e.get("values") or []
        if not isinstance(values, list) or len(values) > MAX_SELECTOR_VALUES or \
                not all(label_value_ok(v) for v in values):
            raise InvalidTenantNetwork(network, f"{ewhere}.values", values,
                                       f"must be a list of at most {MAX_SELECTOR_VALUES} label values")
        if (op in ("In", "NotIn")) != bool(values):
            raise InvalidTenantNetwork(network, f"{ewhere}.values", values,
                                       "In and NotIn need values; Exists and DoesNotExist take none")
        exprs.append(LabelRequirement(e["key"], op, tuple(values)))
    return LabelSelector(tuple(sorted(labels.items())), tuple(exprs))


# ---- the TenantNetwork ----------------------------------------------------------------------

@dataclass(frozen=True)
class NodeFabric:
    """Per-node differences: on nodes the selector matches, this bridge and/or these PFs."""

    selector: LabelSelector
    bridge: str = ""
    pfs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fabric:
    mode: str
    bridge: str = ""
    pfs: tuple[str, ...] = ()
    resource_name: str = ""  # the device plugin's resource, for the NAD's annotation (VF modes)
    nodes: tuple[NodeFabric, ...] = ()
    # "geneve": the network is an OVN logical switch; the node's rail config (ovn.rails in
    # its node config) decides the integration bridge, so an overlay names no bridge.
    overlay: str = ""
    rail: str = ""  # which of the node's OVN rails; "" = the node's default rail

    def on(self, node_labels: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
        """(bridge, PFs) on a node with these labels: the first matching nodes[] entry's
        fields, each falling back to the network-wide one."""
        for entry in self.nodes:
            if entry.selector.matches(node_labels):
                return entry.bridge or self.bridge, entry.pfs or self.pfs
        return self.bridge, self.pfs


@dataclass(frozen=True)
class PoolRange:
    subnet: str
    range_start: str = ""
    range_end: str = ""
    gateway: str = ""

    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(self.subnet)

    def bounds(self) -> tuple[int, int]:
        net = self.network()
        lo = int(ipaddress.ip_address(self.range_start)) if self.range_start else int(net.network_address)
        hi = int(ipaddress.ip_address(self.range_end)) if self.range_end else int(net.broadcast_address)
        return lo, hi

    def to_config(self) -> dict[str, str]:
        out = {"subnet": self.subnet}
        for key, value in (("rangeStart", self.range_start), ("rangeEnd", self.range_end),
                           ("gateway", self.gateway)):
            if value:
                out[key] = value
        return out


@dataclass(frozen=True)
class Pool:
    """The admin's addresses for the network: range sets (one address from each per
    attachment), optional routes, and the cluster block size (cluster mode of tenantnet-ipam)."""

    ranges: tuple[tuple[PoolRange, ...], ...]
    routes: tuple[tuple[str, str], ...] = ()  # (dst, gw or "")
    block_size: int | None = None

    def overlaps(self, other: Pool) -> tuple[str, str] | None:
        for mine in (r for rs in self.ranges for r in rs):
            for theirs in (r for rs in other.ranges for r in rs):
                a, b = mine.network(), theirs.network()
                if a.version != b.version:
                    continue
                (lo1, hi1), (lo2, hi2) = mine.bounds(), theirs.bounds()
                if lo1 <= hi2 and lo2 <= hi1:
                    return mine.subnet, theirs.subnet
        return None


@dataclass(frozen=True)
class PodChoices:
    """What a pod (its annotation, or its NAD's text) may still choose: nothing else."""

    static_ip: bool = False
    mac: bool = False


@dataclass(frozen=True)
class RailAlignment:
    within: str = "PIX"
    action: str = "warn"


@dataclass(frozen=True)
class TenantNetwork:
    name: str
    fabric: Fabric
    pool: Pool
    uid: str = ""
    generation: int = 0
    tenants: tuple[str, ...] = ()
    namespace_selector: LabelSelector | None = None
    vlan: int | None = None  # None with vlan_auto: the renderer assigns one (status.vlan)
    vlan_auto: bool = False
    assigned_vlan: int | None = None
    mtu: int | None = None
    prewarm: bool = False
    rdma: str = "auto"
    rail_alignment: RailAlignment | None = None
    pod_choices: PodChoices = field(default_factory=PodChoices)

    @property
    def segment(self) -> int | None:
        """The VLAN in force: the admin's, or the one the renderer assigned for "auto"."""
        return self.assigned_vlan if self.vlan_auto else self.vlan

    def grants(self, namespace: str, resolution: Resolution, labels: Mapping[str, str]) -> bool:
        """Whether pods of this namespace may use the network: its tenant is listed, or its
        labels match the namespaceSelector. Disagreeing tenant sources grant nothing."""
        if resolution.conflict:
            return False
        if resolution.tenant is not None and resolution.tenant in self.tenants:
            return True
        return self.namespace_selector is not None and self.namespace_selector.matches(labels)

    def describe_grant(self) -> str:
        parts = []
        if self.tenants:
            parts.append(f"tenants {', '.join(self.tenants)}")
        if self.namespace_selector is not None:
            parts.append(f"namespaces matching {self.namespace_selector.describe()}")
        return " and ".join(parts) or "nobody"


def _bad(network: str, where: str, value: Any, allowed: str) -> InvalidTenantNetwork:
    return InvalidTenantNetwork(network, where, value, allowed)


def _known(network: str, where: str, obj: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise _bad(network, f"{where}.{unknown[0]}", obj[unknown[0]],
                   f"unknown field (known: {', '.join(known)})")


def _int(network: str, where: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(network, where, value, f"must be an integer from {lo} to {hi}")
    return value


def _parse_fabric(network: str, raw: object) -> Fabric:
    if not isinstance(raw, dict):
        raise _bad(network, "spec.fabric", raw, "must be an object with mode and bridge and/or pfs")
    _known(network, "spec.fabric", raw, ("mode", "bridge", "pfs", "resourceName", "nodes", "overlay", "rail"))
    mode = raw.get("mode")
    if mode not in MODES:
        raise _bad(network, "spec.fabric.mode", mode, f"must be one of {', '.join(MODES)}")
    overlay = raw.get("overlay") or ""
    if overlay and overlay not in OVERLAYS:
        raise _bad(network, "spec.fabric.overlay", overlay,
                   f"must be one of {', '.join(OVERLAYS)} (or absent: a VLAN network)")
    if overlay and mode not in OVERLAY_MODES:
        raise _bad(network, "spec.fabric.overlay", overlay,
                   f"an overlay attaches ports to OVN's integration bridge: modes {', '.join(OVERLAY_MODES)} "
                   f"only, not {mode}")
    rail = raw.get("rail") or ""
    if rail and not overlay:
        raise _bad(network, "spec.fabric.rail", rail, "names one of the node's OVN rails: only with overlay: "
                                                      "geneve")
    if rail and not dns_label(rail):
        raise _bad(network, "spec.fabric.rail", rail, "must name a rail of the node config's ovn.rails "
                                                      "(a DNS label)")

    def bridge_of(where: str, value: object) -> str:
        if value in (None, ""):
            return ""
        if not isinstance(value, str) or not _BRIDGE.fullmatch(value):
            raise _bad(network, where, value, "must name an OVS bridge (letters, digits, '_', '.', '-'; "
                                              "at most 63 characters)")
        return value

    def pfs_of(where: str, value: object) -> tuple[str, ...]:
        if value in (None, []):
            return ()
        if not isinstance(value, list) or len(value) > MAX_PFS or \
                not all(isinstance(p, str) and _NETDEV.fullmatch(p) for p in value):
            raise _bad(network, where, value, f"must be a list of at most {MAX_PFS} PF netdev names or "
                                              "PCI addresses")
        return tuple(value)

    bridge = bridge_of("spec.fabric.bridge", raw.get("bridge"))
    pfs = pfs_of("spec.fabric.pfs", raw.get("pfs"))
    resource = raw.get("resourceName") or ""
    if resource and not (isinstance(resource, str) and _RESOURCE.fullmatch(resource)):
        raise _bad(network, "spec.fabric.resourceName", resource, "must be an extended resource name "
                                                                   "like nvidia.com/rail0")
    nodes_raw = raw.get("nodes") or []
    if not isinstance(nodes_raw, list) or len(nodes_raw) > MAX_NODE_FABRICS:
        raise _bad(network, "spec.fabric.nodes", nodes_raw, f"must be a list of at most {MAX_NODE_FABRICS}")
    nodes = []
    for i, entry in enumerate(nodes_raw):
        where = f"spec.fabric.nodes[{i}]"
        if not isinstance(entry, dict):
            raise _bad(network, where, entry, "must be {nodeSelector, bridge and/or pfs}")
        _known(network, where, entry, ("nodeSelector", "bridge", "pfs"))
        selector = parse_selector(entry.get("nodeSelector"), f"{where}.nodeSelector", network)
        if selector.empty:
            raise _bad(network, f"{where}.nodeSelector", entry.get("nodeSelector"),
                       "must select some nodes (an empty selector is every node: use the fabric's own "
                       "fields)")
        node_fabric = NodeFabric(selector, bridge_of(f"{where}.bridge", entry.get("bridge")),
                                 pfs_of(f"{where}.pfs", entry.get("pfs")))
        if not node_fabric.bridge and not node_fabric.pfs:
            raise _bad(network, where, entry, "changes nothing: give bridge and/or pfs")
        nodes.append(node_fabric)
    fabric = Fabric(str(mode), bridge, pfs, str(resource), tuple(nodes), str(overlay), str(rail))
    if overlay:
        # The rail's integration bridge is the node's to say (ovn.rails.<rail>.integrationBridge):
        # a bridge here could only disagree with it.
        for where, b in [("spec.fabric.bridge", bridge)] + \
                [(f"spec.fabric.nodes[{i}].bridge", n.bridge) for i, n in enumerate(nodes)]:
            if b:
                raise _bad(network, where, b, "an overlay network's bridge is the integration bridge of the "
                                              "node's rail (node config ovn.rails): give rail, not bridge")
    for where, (b, p) in [("spec.fabric", (bridge, pfs))] + \
            [(f"spec.fabric.nodes[{i}]", (n.bridge or bridge, n.pfs or pfs)) for i, n in enumerate(nodes)]:
        if mode in ("ovs",) and not b and not overlay:
            raise _bad(network, f"{where}.bridge", b or None, "mode ovs needs a bridge")
        if mode == "ovs" and p:
            raise _bad(network, f"{where}.pfs", list(p), "mode ovs attaches veth ports: no PFs")
        if mode in ("sriov", "ovs-offload") and not p:
            raise _bad(network, f"{where}.pfs", None, f"mode {mode} needs the PFs whose VFs it hands out")
        if mode == "sriov" and b:
            raise _bad(network, f"{where}.bridge", b, "mode sriov uses no bridge")
    return fabric


def _parse_address(network: str, where: str, value: object, net: Any) -> str:
    if value in (None, ""):
        return ""
    try:
        addr = ipaddress.ip_address(value) if isinstance(value, str) else None
    except ValueError:
        addr = None
    if addr is None or addr not in net:
        raise _bad(network, where, value, f"must be an address inside {net}")
    return str(addr)


def _parse_pool(network: str, raw: object) -> Pool:
    if not isinstance(raw, dict):
        raise _bad(network, "spec.ipam", raw, "must be an object with ranges (and routes, blockSize)")
    _known(network, "spec.ipam", raw, ("ranges", "routes", "blockSize"))
    sets_raw = raw.get("ranges")
    if not isinstance(sets_raw, list) or not 1 <= len(sets_raw) <= MAX_RANGE_SETS:
        raise _bad(network, "spec.ipam.ranges", sets_raw,
                   f"must be a list of 1 to {MAX_RANGE_SETS} range sets (one address from each)")
    sets = []
    for i, rs in enumerate(sets_raw):
        if not isinstance(rs, list) or not 1 <= len(rs) <= MAX_RANGES:
            raise _bad(network, f"spec.ipam.ranges[{i}]", rs, f"must be a list of 1 to {MAX_RANGES} ranges")
        ranges = []
        for j, r in enumerate(rs):
            where = f"spec.ipam.ranges[{i}][{j}]"
            if not isinstance(r, dict):
                raise _bad(network, where, r, "must be {subnet, rangeStart, rangeEnd, gateway}")
            _known(network, where, r, ("subnet", "rangeStart", "rangeEnd", "gateway"))
            subnet = r.get("subnet")
            try:
                net = ipaddress.ip_network(subnet, strict=False) if isinstance(subnet, str) else None
            except ValueError:
                net = None
            if net is None or net.prefixlen > net.max_prefixlen - 2 or \
                    net.prefixlen < (8 if net.version == 4 else 16):
                raise _bad(network, f"{where}.subnet", r.get("subnet"),
                           "must be a CIDR (IPv4 /8 to /30, IPv6 /16 to /126)")
            pr = PoolRange(str(net), _parse_address(network, f"{where}.rangeStart", r.get("rangeStart"), net),
                           _parse_address(network, f"{where}.rangeEnd", r.get("rangeEnd"), net),
                           _parse_address(network, f"{where}.gateway", r.get("gateway"), net))
            lo, hi = pr.bounds()
            if lo > hi:
                raise _bad(network, f"{where}.rangeStart", pr.range_start, f"must not be past rangeEnd "
                                                                            f"{pr.range_end}")
            ranges.append(pr)
        if len({r.network().version for r in ranges}) > 1:
            raise _bad(network, f"spec.ipam.ranges[{i}]", rs, "one range set is one address family")
        sets.append(tuple(ranges))
    routes_raw = raw.get("routes") or []
    if not isinstance(routes_raw, list) or len(routes_raw) > MAX_ROUTES:
        raise _bad(network, "spec.ipam.routes", routes_raw, f"must be a list of at most {MAX_ROUTES} routes")
    routes = []
    for i, route in enumerate(routes_raw):
        where = f"spec.ipam.routes[{i}]"
        if not isinstance(route, dict) or not set(route) <= {"dst", "gw"}:
            raise _bad(network, where, route, "must be {dst, gw}")
        try:
            dst = str(ipaddress.ip_network(str(route.get("dst")), strict=False))
            gw = str(ipaddress.ip_address(route["gw"])) if route.get("gw") else ""
        except (ValueError, TypeError):
            raise _bad(network, where, route, "dst must be a CIDR, gw an address") from None
        routes.append((dst, gw))
    block = raw.get("blockSize")
    block_size = None if block is None else _int(network, "spec.ipam.blockSize", block, 16, 30)
    return Pool(tuple(sets), tuple(routes), block_size)


def parse_tenant_network(obj: object) -> TenantNetwork:
    """A TenantNetwork object (metadata, spec, status) as the API server serves it."""
    if not isinstance(obj, dict):
        raise _bad("", "object", obj, "must be a TenantNetwork object")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    # A NAD is named after its network, and a NAD's name is a DNS label.
    if not dns_label(name):
        raise _bad("", "metadata.name", name,
                   "must be a DNS label (at most 63 lowercase letters, digits, '-')")
    assert isinstance(name, str) and isinstance(meta, dict)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise _bad(name, "spec", spec, "must be an object")
    _known(name, "spec", spec, ("tenants", "namespaceSelector", "fabric", "vlan", "mtu", "ipam", "prewarm",
                                "rdma", "railAlignment", "podChoices"))
    tenants = spec.get("tenants") or []
    if not isinstance(tenants, list) or len(tenants) > MAX_TENANTS or \
            not all(dns_label(t) for t in tenants) or len(set(tenants)) != len(tenants):
        raise _bad(name, "spec.tenants", tenants, f"must be a list of at most {MAX_TENANTS} distinct tenant "
                                                  "names (DNS labels)")
    selector = None
    if spec.get("namespaceSelector") is not None:
        selector = parse_selector(spec["namespaceSelector"], "spec.namespaceSelector", name)
        if selector.empty:
            raise _bad(name, "spec.namespaceSelector", spec["namespaceSelector"],
                       "must not be empty (that would be every namespace of the cluster)")
    if not tenants and selector is None:
        raise _bad(name, "spec.tenants", None,
                   "give tenants and/or a namespaceSelector: who gets the network")
    fabric = _parse_fabric(name, spec.get("fabric"))
    vlan_raw = spec.get("vlan")
    vlan_auto = vlan_raw == "auto"
    vlan: int | None = None
    if not vlan_auto:
        if isinstance(vlan_raw, bool) or not isinstance(vlan_raw, int) or not 1 <= vlan_raw <= 4094:
            # Required: an OVS port without a tag carries every VLAN of its bridge. On an
            # overlay it is the segment, the logical switch's tunnel key (Geneve VNI).
            raise _bad(name, "spec.vlan", vlan_raw, 'must be a VLAN id from 1 to 4094, or "auto"' +
                       (" (on an overlay: the segment, the Geneve VNI)" if fabric.overlay else ""))
        vlan = vlan_raw
    status_raw = obj.get("status")
    status: dict[str, Any] = status_raw if isinstance(status_raw, dict) else {}
    assigned = status.get("vlan") if vlan_auto else None
    if assigned is not None and (isinstance(assigned, bool) or not isinstance(assigned, int)
                                 or not 1 <= assigned <= 4094):
        assigned = None  # a broken status is no VLAN: the node then refuses (unknown)
    mtu = None if spec.get("mtu") is None else _int(name, "spec.mtu", spec["mtu"], 576, 9216)
    prewarm = spec.get("prewarm", False)
    if not isinstance(prewarm, bool):
        raise _bad(name, "spec.prewarm", prewarm, "must be true or false")
    if prewarm and fabric.mode == "sriov":
        raise _bad(name, "spec.prewarm", prewarm, "pre-warm writes OVS flows: modes ovs and ovs-offload only")
    rdma = spec.get("rdma", "auto")
    if rdma not in RDMA_CHOICES:
        raise _bad(name, "spec.rdma", rdma, f"must be one of {', '.join(RDMA_CHOICES)}")
    rail = None
    if spec.get("railAlignment") is not None:
        ra = spec["railAlignment"]
        if not isinstance(ra, dict):
            raise _bad(name, "spec.railAlignment", ra, "must be {within, action}")
        _known(name, "spec.railAlignment", ra, ("within", "action"))
        if ra.get("within", "PIX") not in RAIL_LEVELS:
            raise _bad(name, "spec.railAlignment.within", ra.get("within"),
                       f"must be one of {', '.join(RAIL_LEVELS)}")
        if ra.get("action", "warn") not in ("warn", "refuse"):
            raise _bad(name, "spec.railAlignment.action", ra.get("action"), 'must be "warn" or "refuse"')
        rail = RailAlignment(str(ra.get("within", "PIX")), str(ra.get("action", "warn")))
    if (rail is not None or rdma != "auto") and fabric.mode == "ovs":
        raise _bad(name, "spec.rdma" if rail is None else "spec.railAlignment", rdma if rail is None else
                   spec["railAlignment"], "applies to VFs: modes sriov and ovs-offload only")
    choices_raw = spec.get("podChoices") or {}
    if not isinstance(choices_raw, dict):
        raise _bad(name, "spec.podChoices", choices_raw, "must be {staticIP, mac}")
    _known(name, "spec.podChoices", choices_raw, POD_CHOICES)
    for key in POD_CHOICES:
        if not isinstance(choices_raw.get(key, False), bool):
            raise _bad(name, f"spec.podChoices.{key}", choices_raw[key], "must be true or false")
    generation = meta.get("generation", 0)
    uid = meta.get("uid", "")
    return TenantNetwork(
        name=name, uid=uid if isinstance(uid, str) else "",
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
        tenants=tuple(tenants), namespace_selector=selector, fabric=fabric,
        pool=_parse_pool(name, spec.get("ipam")), vlan=vlan, vlan_auto=vlan_auto, assigned_vlan=assigned,
        mtu=mtu, prewarm=prewarm, rdma=str(rdma), rail_alignment=rail,
        pod_choices=PodChoices(choices_raw.get("staticIP", False), choices_raw.get("mac", False)),
    )
