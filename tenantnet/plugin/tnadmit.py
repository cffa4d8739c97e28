"""Kubernetes mode: an ADD gets what the admin's TenantNetwork grants, not what the NAD says.

In Kubernetes mode (node config `kubernetes: true`) a NAD is only a pointer: its
`tenantNetwork` field names the TenantNetwork it was rendered from (Multus hands a node the
config JSON alone, never the NAD's metadata, so the owner travels in the config). The
network config the attachment gets is rendered here, on the node, from the cached
TenantNetwork (kubecache.py) — fabric, VLAN, MTU, IPAM pool, pre-warm, RDMA, rail
alignment — after checking that the pod's namespace resolves to a tenant the network
grants (tenantnetworks.TenantResolver, the renderer's own). From the NAD's text and the
pod's annotation only what the network lets a pod choose is kept (`podChoices`: static IPs,
MAC), plus what Multus injects for the VF (deviceID, the device-info file), bound to the
network's PFs. Everything else in the text is ignored, and logged.

A NAD of `type: tenantnet` that names no TenantNetwork is hand-written: refused (code 120)
unless the node config allows legacy NADs (`legacyNads: true`; the tenancy policy then
applies as before). No API request happens here: an unknown network or namespace fails
closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.netconf import NetConf, ci_get, parse_netconf
from tenantnet.plugin import kubecache, tenantnetworks, tnrender
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.tenantnetworks import NETWORK_FIELD, InvalidTenantNetwork, TenantNetwork
from tenantnet.plugin.tenants import TenantResolver

# runtimeConfig keys Multus may inject that a TenantNetwork attachment uses; a pod choice
# among them only when granted. Every other key (portMappings, bandwidth, …) is dropped.
_RUNTIME_VF_KEYS = ("deviceID", "CNIDeviceInfoFile")
# NAD keys whose value is taken (under the rules of _pod_choices), not overridden.
_PASSED = ("cniVersion", "runtimeConfig", "args", "capabilities", "mac", "deviceID", "pciBusID")


@dataclass(frozen=True)
class Admitted:
    """The network config to settle (rendered from the TenantNetwork) and its PFs."""

    conf: NetConf
    network: TenantNetwork
    tenant: str | None
    pfs: tuple[str, ...]


def _deny(msg: str) -> CniError:
    return CniError(Code.TENANT_DENIED, f"tenant isolation: {msg}")


def resolver_for(node: NodeConfig) -> TenantResolver:
    """The node's tenant resolver: its sources in the admin's order; the `name` source's
    globs are the tenancy policy's `namespaces` (today's policy, loaded only then)."""
    patterns: tuple[tuple[str, tuple[str, ...]], ...] = ()
    if "name" in node.tenant_sources:
        from tenantnet.plugin import tenancy

        policy = tenancy.load(node)
        if policy is None:
            raise CniError(Code.INVALID_CONFIG, "invalid node config: tenantSources lists name, but the node "
                                                "config has no tenancy policy naming namespaces per tenant")
        patterns = tuple((t.name, t.namespaces) for t in policy.tenants)
    return TenantResolver(node.tenant_sources, patterns)


def _unreadable(exc: kubecache.CacheUnreadable) -> CniError:
    return CniError(Code.IO_FAILURE, f"the node's TenantNetwork cache is unusable: {exc}",
                    "the agent rewrites it from the API server; until then ADDs fail closed")


def admit(conf: NetConf, env: CniEnv, node: NodeConfig, log: Any) -> Admitted | None:
    """The TenantNetwork's config for this ADD/CHECK; None: not Kubernetes mode, or a
    legacy NAD the node allows (the caller then applies today's policy)."""
    name = conf.raw.get(NETWORK_FIELD)
    if not node.kubernetes:
        if name is None:
            return None
        raise CniError(Code.INVALID_CONFIG, f"invalid network config: {NETWORK_FIELD}={name!r}: this node "
                                            "does not enforce TenantNetworks (node config kubernetes: false)")
    who = f"pod {env.args.pod_namespace or '?'}/{env.args.pod_name or '?'}"
    if name is None:
        if node.legacy_nads:
            return None
        log.warning("security.denied", event_type="hand_written_nad", network=conf.name,
                    pod_namespace=env.args.pod_namespace, pod_name=env.args.pod_name,
                    container_id=env.container_id)
        raise _deny(f"{who}: network {conf.name} names no {NETWORK_FIELD}: on this node networks are "
                    "declared as TenantNetworks and their NADs rendered by tenantnet; a hand-written NAD "
                    "of type tenantnet is refused (node config legacyNads: false)")
    if not kubecache.valid_name(name):
        raise _deny(f"{NETWORK_FIELD}={name!r}: must name a TenantNetwork (a DNS label)")
    if conf.name != name:
        # Records are keyed by the network's name: a DEL must find what the ADD made.
        raise _deny(f"name={conf.name!r}: a rendered NAD's network is named after its TenantNetwork "
                    f"({NETWORK_FIELD}={name!r})")
    try:
        sync = kubecache.read_sync(node.state_dir)
        if sync is None:
            raise CniError(Code.TRY_AGAIN_LATER, f"TenantNetwork {name}: this node has not synced with the "
                                                 "API server yet (no TenantNetworks known); try again later")
        obj = kubecache.read_object(node.state_dir, "tenantnetworks", name)
        if obj is None:
            raise _deny(f"{who}: no TenantNetwork {name} is known to this node (the cluster has none of "
                        "that name, as last synced)")
        namespace = env.args.pod_namespace
        if not namespace:
            raise _deny(f"{who}: no K8S_POD_NAMESPACE in CNI_ARGS, so no tenant for TenantNetwork {name}")
        ns = kubecache.read_object(node.state_dir, "namespaces", namespace)
    except kubecache.CacheUnreadable as exc:
        raise _unreadable(exc) from None
    if ns is None:
        raise CniError(Code.TRY_AGAIN_LATER, f"tenant isolation: {who}: namespace {namespace} is not yet "
                                             "known to this node; try again later")
    try:
        tn = tenantnetworks.parse_tenant_network(obj)
        labels = tenantnetworks.checked_labels(ns.get("labels"), f"namespace {namespace} labels", name)
    except InvalidTenantNetwork as exc:
        raise _deny(f"{exc}; refused on this node") from None
    resolution = resolver_for(node).resolve(namespace, labels)
    if not tn.grants(namespace, resolution, labels):
        log.warning("security.denied", event_type="tenant_isolation", network=name, tenant=resolution.tenant,
                    pod_namespace=namespace, pod_name=env.args.pod_name, container_id=env.container_id,
                    reason=resolution.reason)
        why = resolution.reason if resolution.conflict or resolution.tenant is None else \
            f"tenant {resolution.tenant}"
        raise _deny(f"{who} may not use TenantNetwork {name}: it grants {tn.describe_grant()}; {why}")
    if tn.segment is None:
        raise _deny(f"TenantNetwork {name} has vlan: auto and no VLAN assigned yet (status.vlan): refused "
                    "until the renderer assigns one")
    raw = tnrender.render_config(tn, sync.node_labels)
    raw["cniVersion"] = conf.cni_version
    raw.update(_pod_choices(conf, env, tn, who))
    ignored = sorted(k for k, v in conf.raw.items() if k not in _PASSED and raw.get(k) != v)
    log.info("security.allowed", network=name, pod_namespace=namespace, pod_name=env.args.pod_name,
             tenant=resolution.tenant, source="TenantNetwork", ignored_nad_fields=ignored or None)
    return Admitted(parse_netconf(raw), tn, resolution.tenant, tn.fabric.on(sync.node_labels)[1])


def _pod_choices(conf: NetConf, env: CniEnv, tn: TenantNetwork, who: str) -> dict[str, Any]:
    """What the pod (its annotation through Multus, or its NAD's text) may still set: static
    IPs and a MAC when the network grants them (a refusal names the field otherwise), the
    VF Multus's device plugin picked (bound to the network's PFs by the settings layer), and
    the device-info file (confined there too). Nothing else."""
    out: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    asked = {
        "mac": [("runtimeConfig.mac", conf.runtime("mac")), ("CNI_ARGS MAC", env.args.mac or None),
                ("mac", conf.raw.get("mac"))],
        "staticIP": [("runtimeConfig.ips", conf.runtime("ips")), ("args.cni.ips", conf.args_cni.get("ips")),
                     ("CNI_ARGS IP", ",".join(env.args.ips) or None)],
    }
    granted = {"mac": tn.pod_choices.mac, "staticIP": tn.pod_choices.static_ip}
    for choice, sources in asked.items():
        for where, value in sources:
            if value in (None, "", []):
                continue
            if not granted[choice]:
                raise _deny(f"{where}={value!r}: TenantNetwork {tn.name} does not let a pod choose its "
                            f"{'MAC' if choice == 'mac' else 'addresses'} (spec.podChoices.{choice})")
    if tn.pod_choices.mac:
        if conf.runtime("mac") not in (None, ""):
            runtime["mac"] = conf.runtime("mac")
        if conf.raw.get("mac") not in (None, ""):
            out["mac"] = conf.raw["mac"]
    if tn.pod_choices.static_ip:
        if conf.runtime("ips") not in (None, []):
            runtime["ips"] = conf.runtime("ips")
        if conf.args_cni.get("ips") not in (None, []):
            out["args"] = {"cni": {"ips": conf.args_cni["ips"]}}
    if tn.fabric.mode != "ovs":
        for key in _RUNTIME_VF_KEYS:
            value = ci_get(conf.runtime_config, key)
            if value not in (None, ""):
                runtime[key] = value
        for key in ("deviceID", "pciBusID"):
            if conf.raw.get(key) not in (None, ""):
                out[key] = conf.raw[key]
    if runtime:
        out["runtimeConfig"] = runtime
    return out
