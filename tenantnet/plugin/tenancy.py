"""Tenant isolation enforced by the plugin: which pod may use which segment.

The policy lives in the node config (`tenancy:`) or a YAML file it names (`tenancyFile:`):

    tenancy:
      networks:                                 # the admin declares each network's fabric
        rail-1: {bridge: br-rail1}              # (ovsdb: the node's unless given)
        rail-2: {pfs: [ens1f0]}                 # SR-IOV VFs of these PFs
      tenants:
        team-a:
          namespaces: [team-a, "team-a-*"]      # exact names and glob patterns
          networks:
            rail-1: {vlans: [100, "200-210"], default: 100}
          sriov: {spoofchk: required, trust: forbidden, rdmaIsolation: required}

Without a policy nothing changes. Once a policy exists it is default-deny: a pod whose
namespace maps to no tenant, or whose tenant has no entry for the NAD's network, or a NAD
asking for a VLAN (access or trunk) outside the tenant's set for that network, is refused
with code 120 before anything is touched — whatever NAD the pod names. Segments are VLAN
ids per network, and the network's fabric is the admin's declaration, never the NAD's
(`tenantnet.plugin.settings.bind_fabric`): a policy that grants a tenant an undeclared network, or
one VLAN of one fabric (bridge or PF) to two tenants, is refused when it is loaded.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from typing import Any

from cni.errors import CniError, Code
from tenantnet.plugin.settings import TENANT_VLAN  # a NAD's "vlan": "tenant", resolved here

_RANGE = re.compile(r"^\s*(\d{1,4})\s*-\s*(\d{1,4})\s*$")


@dataclass(frozen=True)
class NetworkGrant:
    """The VLANs a tenant may use on one network, and the one "vlan": "tenant" picks."""

    vlans: frozenset[int]
    default: int | None = None

    def describe(self) -> str:
        return _ranges(sorted(self.vlans))


@dataclass(frozen=True)
class Tenant:
    """One tenant of the policy: its namespaces, its networks and the VF rules it must keep."""

    name: str
    namespaces: tuple[str, ...]
    networks: dict[str, NetworkGrant] = field(default_factory=dict)
    spoofchk_required: bool = False
    trust_forbidden: bool = False
    # The tenant's VFs' RDMA devices must be isolated in its pods (the subsystem in
    # exclusive netns mode), else its ADDs are refused.
    rdma_isolation_required: bool = False

    def owns(self, namespace: str) -> bool:
        return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in self.namespaces)


@dataclass(frozen=True)
class NetworkDecl:
    """The admin's declaration of a network's fabric: an OVS bridge (on `ovsdb`, empty = the
    node's), a set of PFs whose VFs it uses, or both (ovs-offload)."""

    bridge: str = ""
    ovsdb: str = ""
    pfs: tuple[str, ...] = ()
    # An overlay network (docs/overlay.md): `overlay: geneve` and its `rail` (the node's
    # default rail when empty); its VLANs are segments, each a logical switch of its own.
    overlay: str = ""
    rail: str = ""
    name: str = ""

    def modes(self) -> tuple[str, ...]:
        if self.overlay:
            return ("ovs-offload",) if self.pfs else ("ovs",)
        if self.bridge and self.pfs:
            return ("ovs-offload",)
        return ("ovs",) if self.bridge else ("sriov",)

    def fabrics(self, node_ovsdb: str, pf_identity: Any = None) -> list[str]:
        """The switches a VLAN of this network lives on (for "one VLAN, one tenant"); a PF
        named by netdev in one network and by PCI address in another is one fabric. An
        overlay's segment is a logical switch of that network alone."""
        if self.overlay:
            return [f"overlay network {self.name}"]
        if self.bridge:
            return [f"bridge {self.bridge} on {self.ovsdb or node_ovsdb}"]
        return [f"PF {pf_identity(pf) if pf_identity else pf}" for pf in self.pfs]


@dataclass(frozen=True)
class TenantPolicy:
    """The node's tenancy policy: the tenants and the networks it declares."""

    tenants: tuple[Tenant, ...]
    source: str = ""
    networks: dict[str, NetworkDecl] = field(default_factory=dict)

    def tenant_of(self, namespace: str) -> Tenant | None:
        """Exact names win over patterns; among patterns the longest (most specific) wins."""
        exact = [t for t in self.tenants if namespace in t.namespaces]
        if exact:
            return exact[0]
        matches = [(max(len(p) for p in t.namespaces if fnmatch.fnmatchcase(namespace, p)), t)
                   for t in self.tenants if t.owns(namespace)]
        return max(matches, key=lambda m: m[0])[1] if matches else None


def _ranges(ids: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(ids):
        if start is None:
            start = v
        if i + 1 == len(ids) or ids[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out) or "none"


def _bad(where: str, value: Any, allowed: str) -> CniError:
    return CniError(Code.INVALID_CONFIG, f"invalid tenancy policy {where}={value!r}: {allowed}")


def _vlan_set(where: str, items: Any) -> frozenset[int]:
    if not isinstance(items, list):
        raise _bad(where, items, 'must be a list of VLAN ids and "lo-hi" ranges')
    ids: set[int] = set()
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= 4094:
            ids.add(item)
            continue
        m = _RANGE.match(item) if isinstance(item, str) else None
        if not m or not 0 <= int(m[1]) <= int(m[2]) <= 4094:
            raise _bad(where, item, 'must be a VLAN id 0-4094 or a range "lo-hi"')
        ids.update(range(int(m[1]), int(m[2]) + 1))
    return frozenset(ids)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,62}")


def _declarations(raw: Any, node: Any) -> dict[str, NetworkDecl]:
    from tenantnet.plugin.nodeconfig import normalise_ovsdb_endpoint

    if not isinstance(raw, dict):
        raise _bad("networks", raw, "must be a mapping of network name to its fabric "
                                    "({bridge, ovsdb} and/or {pfs})")
    out = {}
    for net, spec in raw.items():
        where = f"networks.{net}"
        if not isinstance(spec, dict) or not set(spec) <= {"bridge", "ovsdb", "pfs", "overlay", "rail"}:
            raise _bad(where, spec, "must be a mapping with bridge (and ovsdb) and/or pfs, or overlay "
                                    "(and rail, and pfs for ovs-offload)")
        overlay = spec.get("overlay") or ""
        if overlay:
            rail = spec.get("rail") or ""
            if overlay != "geneve":
                raise _bad(f"{where}.overlay", overlay, 'must be "geneve"')
            if rail and not (isinstance(rail, str) and _NAME.fullmatch(rail)):
                raise _bad(f"{where}.rail", rail, "must be a rail name of the node config's ovn.rails")
            if spec.get("bridge") or spec.get("ovsdb"):
                raise _bad(f"{where}.bridge", spec.get("bridge") or spec.get("ovsdb"),
                           "an overlay's port goes on its rail's integration bridge (node config ovn.rails): "
                           "give rail, not bridge or ovsdb")
            pfs = spec.get("pfs") or []
            if not isinstance(pfs, list) or not all(isinstance(p, str) and _NAME.fullmatch(p) for p in pfs):
                raise _bad(f"{where}.pfs", pfs, "must be a list of PF netdev names or PCI addresses")
            out[str(net)] = NetworkDecl(pfs=tuple(pfs), overlay=overlay, rail=rail, name=str(net))
            continue
        if spec.get("rail"):
            raise _bad(f"{where}.rail", spec["rail"], "names an overlay rail: only with overlay")
        bridge = spec.get("bridge") or ""
        if bridge and not (isinstance(bridge, str) and _NAME.fullmatch(bridge)):
            raise _bad(f"{where}.bridge", bridge, "must be an OVS bridge name")
        ovsdb = spec.get("ovsdb") or ""
        if ovsdb:
            endpoint = normalise_ovsdb_endpoint(ovsdb) if isinstance(ovsdb, str) else None
            allowed = node.allowed_ovsdb() if node is not None else ()
            if endpoint is None or (node is not None and endpoint not in allowed):
                raise _bad(f"{where}.ovsdb", ovsdb, "must be the node config's ovsdb or one of its "
                                                    f"ovsdbEndpoints ({', '.join(allowed)})")
            ovsdb = endpoint
        pfs = spec.get("pfs") or []
        if not isinstance(pfs, list) or not all(isinstance(p, str) and _NAME.fullmatch(p) for p in pfs):
            raise _bad(f"{where}.pfs", pfs, "must be a list of PF netdev names or PCI addresses")
        if not bridge and not pfs:
            raise _bad(where, spec, "declares no fabric: give bridge and/or pfs")
        if ovsdb and not bridge:
            raise _bad(f"{where}.ovsdb", ovsdb, "needs a bridge")
        out[str(net)] = NetworkDecl(bridge, ovsdb, tuple(pfs))
    return out


def _pf_identity(node: Any) -> Any:
    """PF name or PCI address -> one identity (its PCI address when sysfs knows the PF)."""
    if node is None:
        return None
    from tenantnet.plugin.system.sysfs import Sysfs, SysfsError

    sysfs = Sysfs(node.sysfs_root)

    def identity(pf: str) -> str:
        try:
            return str(sysfs.pf_address(pf))
        except (SysfsError, OSError, ValueError):
            return pf

    return identity


def _one_tenant_per_vlan(tenants: list[Tenant], networks: dict[str, NetworkDecl], node: Any) -> None:
    """A VLAN of one fabric belongs to one tenant: two tenants on one segment would see
    each other's traffic whatever the NADs say."""
    owner: dict[tuple[str, int], tuple[str, str]] = {}
    node_ovsdb = node.ovsdb if node is not None else ""
    identity = _pf_identity(node) if any(d.pfs for d in networks.values()) else None
    for tenant in tenants:
        for net, grant in tenant.networks.items():
            for fabric in networks[net].fabrics(node_ovsdb, identity):
                for vlan in grant.vlans:
                    held = owner.setdefault((fabric, vlan), (tenant.name, net))
                    if held[0] != tenant.name:
                        raise _bad(f"tenants.{tenant.name}.networks.{net}.vlans", vlan,
                                   f"VLAN {vlan} of {fabric} is already granted to tenant {held[0]} "
                                   f"(network {held[1]}); a VLAN of one fabric belongs to one tenant")


def parse_policy(data: Any, source: str, node: Any = None) -> TenantPolicy:
    if not isinstance(data, dict) or not isinstance(data.get("tenants"), dict):
        raise _bad("tenants", data, "must be a mapping of tenant name to its namespaces and networks")
    declared = _declarations(data.get("networks") or {}, node)
    tenants = []
    for name, spec in data["tenants"].items():
        where = f"tenants.{name}"
        if not isinstance(spec, dict):
            raise _bad(where, spec, "must be a mapping")
        namespaces = spec.get("namespaces")
        if not isinstance(namespaces, list) or not namespaces or \
                not all(isinstance(n, str) and n for n in namespaces):
            raise _bad(f"{where}.namespaces", namespaces, "must be a non-empty list of names or globs")
        networks = {}
        grants = spec.get("networks") or {}
        if not isinstance(grants, dict):
            raise _bad(f"{where}.networks", grants, "must be a mapping of network name to its VLANs")
        for net, grant in grants.items():
            gwhere = f"{where}.networks.{net}"
            if str(net) not in declared:
                raise _bad(gwhere, grant, f"network {net} is not declared under networks: with its "
                                          "fabric (bridge/ovsdb or pfs); a NAD cannot be what decides it")
            if not isinstance(grant, dict):
                raise _bad(gwhere, grant, "must be a mapping with vlans (and optional default)")
            vlans = _vlan_set(f"{gwhere}.vlans", grant.get("vlans", []))
            default = grant.get("default")
            if default is not None and default not in vlans:
                raise _bad(f"{gwhere}.default", default,
                           f"must be one of the tenant's VLANs ({_ranges(sorted(vlans))})")
            networks[str(net)] = NetworkGrant(vlans, default)
        sriov = spec.get("sriov") or {}
        if not isinstance(sriov, dict):
            raise _bad(f"{where}.sriov", sriov, "must be a mapping")
        for key, allowed in (("spoofchk", ("required", "any")), ("trust", ("forbidden", "any")),
                             ("rdmaIsolation", ("required", "any"))):
            if sriov.get(key, "any") not in allowed:
                raise _bad(f"{where}.sriov.{key}", sriov.get(key), f"must be one of {', '.join(allowed)}")
        tenants.append(Tenant(str(name), tuple(namespaces), networks,
                              sriov.get("spoofchk") == "required", sriov.get("trust") == "forbidden",
                              sriov.get("rdmaIsolation") == "required"))
    _one_tenant_per_vlan(tenants, declared, node)
    return TenantPolicy(tuple(tenants), source, declared)


def load(node: Any) -> TenantPolicy | None:
    """The node's policy, from `tenancy:` inline or the file `tenancyFile:` names."""
    if node.tenancy is not None:
        return parse_policy(node.tenancy, node.source, node)
    if node.tenancy_file:
        import yaml

        try:
            with open(node.tenancy_file, encoding="utf-8") as fh:
                data = yaml.safe_load(fh)
        except OSError as exc:
            raise CniError(Code.IO_FAILURE,
                           f"cannot read tenancy policy {node.tenancy_file}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise CniError(Code.INVALID_CONFIG,
                           f"tenancy policy {node.tenancy_file} is not valid YAML: {exc}") from None
        return parse_policy(data.get("tenancy", data) if isinstance(data, dict) else data, node.tenancy_file,
                            node)
    return None


@dataclass(frozen=True)
class Decision:
    """Whether a namespace may attach to a network with a VLAN, and why (logged either way)."""

    allowed: bool
    tenant: str | None
    reason: str
    vlan: int | None = None  # the VLAN chosen for "vlan": "tenant"


def requested_vlans(raw: dict[str, Any], vlan: int | None, trunks: tuple[int, ...]) -> list[int]:
    out = [] if vlan is None else [vlan]
    return out + [t for t in trunks if t not in out]


def decide(policy: TenantPolicy, namespace: str, pod: str, network: str, raw: dict[str, Any],
           vlan: int | None, trunks: tuple[int, ...]) -> Decision:
    """May pod `namespace/pod` use these VLANs of `network`? (`vlan` None + raw "tenant": defer)."""
    who = f"pod {namespace or '?'}/{pod or '?'}"
    if not namespace:
        return Decision(False, None, f"{who}: no K8S_POD_NAMESPACE in CNI_ARGS, so no tenant; "
                                     f"a tenancy policy is in force (default deny)")
    tenant = policy.tenant_of(namespace)
    if tenant is None:
        return Decision(False, None, f"{who}: namespace {namespace} belongs to no tenant; a tenancy "
                                     f"policy is in force (default deny)")
    grant = tenant.networks.get(network)
    if grant is None:
        return Decision(False, tenant.name, f"{who} (tenant {tenant.name}) may not use network {network}: "
                                            f"the tenant has no segments on it")
    chosen = None
    if raw.get("vlan") == TENANT_VLAN:
        chosen = grant.default if grant.default is not None else (min(grant.vlans) if grant.vlans else None)
        if chosen is None:
            return Decision(False, tenant.name, f"{who} (tenant {tenant.name}): network {network} asks for "
                                                f"the tenant's VLAN, but the tenant has none there")
        vlan = chosen
    outside = [v for v in requested_vlans(raw, vlan, trunks) if v not in grant.vlans]
    if outside:
        return Decision(False, tenant.name,
                        f"{who} (tenant {tenant.name}) may not use network {network} segment "
                        f"vlan {_ranges(sorted(outside))}: the tenant's VLANs there are {grant.describe()}")
    if vlan is None and not trunks:
        return Decision(False, tenant.name, f"{who} (tenant {tenant.name}): network {network} names no "
                                            "VLAN, and an OVS port without tag or trunks carries every VLAN")
    if tenant.trust_forbidden and raw.get("trust") == "on":
        return Decision(False, tenant.name, f"{who} (tenant {tenant.name}) may not use trust on "
                                            f"(network {network})")
    return Decision(True, tenant.name, f"{who} (tenant {tenant.name}) may use network {network} "
                                       f"vlan {_ranges(sorted(requested_vlans(raw, vlan, trunks)))}", chosen)


def enforce(policy: TenantPolicy, conf: Any, env: Any, log: Any) -> Any:
    """Check an ADD against the policy; return the config to use (VLAN filled in, defaults forced)."""
    settings = conf.ovs or conf.vf
    overlay = conf.ovs.overlay if conf.ovs is not None else None
    # An overlay carries no tag: its `vlan` is the segment (a logical switch of its own).
    vlan = overlay.segment if overlay is not None else (settings.vlan if settings is not None else None)
    trunks = conf.ovs.trunks if conf.ovs is not None else ()
    d = decide(policy, env.args.pod_namespace, env.args.pod_name, conf.name, conf.base.raw,
               vlan if conf.base.raw.get("vlan") != TENANT_VLAN else None, trunks)
    if not d.allowed:
        log.warning("security.denied", event_type="tenant_isolation", network=conf.name,
                    pod_namespace=env.args.pod_namespace, pod_name=env.args.pod_name, tenant=d.tenant,
                    container_id=env.container_id, reason=d.reason)
        raise CniError(Code.TENANT_DENIED, f"tenant isolation: {d.reason}")
    log.info("security.allowed", network=conf.name, pod_namespace=env.args.pod_namespace,
             pod_name=env.args.pod_name, tenant=d.tenant)
    if d.vlan is not None and overlay is not None:
        from tenantnet.plugin.system.ovnnb import switch_name

        conf = replace(conf, ovs=replace(conf.ovs, overlay=replace(
            overlay, segment=d.vlan, switch=switch_name(conf.name, d.vlan))))
    elif d.vlan is not None:
        if conf.ovs is not None:
            conf = replace(conf, ovs=replace(conf.ovs, vlan=d.vlan))
        if conf.vf is not None:
            conf = replace(conf, vf=replace(conf.vf, vlan=d.vlan))
    tenant = policy.tenant_of(env.args.pod_namespace)
    if conf.vf is not None and tenant is not None and tenant.spoofchk_required:
        conf = replace(conf, vf=replace(conf.vf, spoofchk=True))
    if conf.vf is not None and tenant is not None and tenant.rdma_isolation_required:
        conf = replace(conf, vf=replace(conf.vf, rdma="exclusive",
                                        rdma_required_by=f"tenant {tenant.name}'s rdmaIsolation: required"))
    return conf
