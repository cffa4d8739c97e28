"""tenantnet's own network-config fields, decoded into typed settings.

Field names and meanings follow ovs-cni (`bridge`, `vlan`, `trunk`, `mtu`, `mac`,
`ofport_request`, `interface_type`, `socket_file`, `configuration_path`, …) and sriov-cni
(`deviceID`, `pf`, …) so that a NAD written for them works after changing only `type`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from cni.env import CniEnv, mac_problem
from cni.errors import CniError, Code, invalid_config
from cni.netconf import NetConf, ci_get
from cni.result import DNS
from tenantnet.plugin import overlay, settings
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.overlay import Overlay
from tenantnet.plugin.settings import TENANT_VLAN

# The modes a config may name; tenantnet/plugin/modes.py has a driver for each (a unit test
# checks that the two agree).
MODES = ("ovs", "sriov", "ovs-offload")
_DNS_WORD = re.compile(r"[!-~]{1,253}")  # printable ASCII, no whitespace: a resolv.conf word
_BRIDGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}")  # fullmatch ("$" allows a final "\n")


@dataclass(frozen=True)
class OvsPortSettings:
    """The OVS port's settings of a network config (modes ovs and ovs-offload)."""

    bridge: str
    vlan: int | None = None
    trunks: tuple[int, ...] = ()
    mtu: int | None = None
    ofport_request: int | None = None
    ovsdb: str = ""
    prewarm: bool = False  # `prewarm` (default: the node config's): drivers/prewarm.py
    overlay: Overlay | None = None  # `overlay: geneve` (tenantnet/plugin/overlay.py)
    # Pre-warm was asked for on an overlay, where it does not run (its rules pair ports of one
    # bridge by OpenFlow number; an overlay's peers are behind tunnels): said per attachment.
    prewarm_declined: bool = False


RDMA_CHOICES = ("auto", "exclusive", "off")


@dataclass(frozen=True)
class VfSettings:
    """sriov-cni's fields; spoofchk on and trust off unless the config says otherwise."""

    device_id: str | None = None
    pfs: tuple[str, ...] = ()
    vlan: int = 0
    vlan_qos: int = 0
    vlan_proto: str = "802.1q"
    spoofchk: bool = True
    trust: bool = False
    link_state: str | None = None
    min_tx_rate: int | None = None
    max_tx_rate: int | None = None
    mtu: int | None = None
    device_id_field: str = "deviceID"  # where the NAD (or Multus) named the VF, for messages
    # Under a tenancy policy: the PFs the admin declared for the network (a VF named by
    # deviceID must belong to one of them); empty = no restriction.
    allowed_pfs: tuple[str, ...] = ()
    # The VF's RDMA device: moved into the pod when the RDMA subsystem isolates namespaces
    # ("auto": else a warning; "exclusive": else the ADD is refused), or left alone ("off").
    rdma: str = "auto"
    rdma_required_by: str = "the network's rdma: exclusive"  # or the tenancy policy
    # railAlignment: the VF must be within this PCIe distance (PIX, PXB, PHB, NODE) of one of
    # the pod's GPUs not paired with another rail of the pod; "warn" or "refuse" otherwise.
    rail_within: str | None = None
    rail_action: str = "warn"


@dataclass(frozen=True)
class TenantnetConf:
    """A network config as tenantnet reads it: validated, with the node's defaults applied."""

    base: NetConf
    mode: str
    mac: str | None
    ovs: OvsPortSettings | None
    ipam_type: str
    vf: VfSettings | None = None
    offload_check: bool = False  # "offloadCheck": "require": CHECK fails on software-only traffic
    dns: DNS = field(default_factory=DNS)
    log_file: str | None = None
    log_level: str | None = None
    device_info_file: str | None = None  # confined to the node's deviceInfoDir

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def cni_version(self) -> str:
        return self.base.cni_version

    @property
    def mtu(self) -> int | None:
        if self.ovs is not None and self.ovs.mtu:
            return self.ovs.mtu
        return self.vf.mtu if self.vf is not None else None


def _int_field(raw: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    if key not in raw or raw[key] is None:
        return None
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise invalid_config(key, value, f"must be an integer from {lo} to {hi}")
    return value


def _vlan_id(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 4094:
        raise invalid_config(where, value, 'must be a VLAN id, an integer from 0 to 4094 (or "tenant")'
                             if where == "vlan" else "must be a VLAN id, an integer from 0 to 4094")
    return value


def _vlan(raw: dict[str, Any]) -> int | None:
    """`vlan`: an id, absent, or "tenant" (the pod's tenant's VLAN, resolved by the policy)."""
    value = raw.get("vlan")
    if value is None or value == TENANT_VLAN:
        return None
    return _vlan_id("vlan", value)


def parse_trunk(value: Any) -> tuple[int, ...]:
    """ovs-cni's `trunk`: [{"id": 10}, {"minID": 20, "maxID": 30}] -> sorted VLAN ids."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid_config("trunk", value, 'must be a list like [{"id": 10}, {"minID": 20, "maxID": 30}]')
    ids: set[int] = set()
    for i, item in enumerate(value):
        where = f"trunk[{i}]"
        shape = set(item) & {"id", "minID", "maxID"} if isinstance(item, dict) else None
        if shape not in ({"id"}, {"minID", "maxID"}):
            raise invalid_config(where, item, 'must be {"id": N} or {"minID": N, "maxID": M} (not both)')
        if "id" in item:
            ids.add(_vlan_id(f"{where}.id", item["id"]))
            continue
        lo = _vlan_id(f"{where}.minID", item["minID"])
        hi = _vlan_id(f"{where}.maxID", item["maxID"])
        if lo > hi:
            raise invalid_config(where, item, f"minID {lo} is greater than maxID {hi}")
        ids.update(range(lo, hi + 1))
    return tuple(sorted(ids))


def infer_mode(raw: dict[str, Any]) -> str:
    mode = raw.get("mode")
    if mode is not None:
        if mode not in MODES:
            raise invalid_config("mode", mode, f"must be one of {', '.join(MODES)}")
        return str(mode)
    has_bridge = bool(raw.get("bridge"))
    runtime = raw.get("runtimeConfig")
    # Multus puts a deviceID from the pod annotation only into runtimeConfig.
    names_vf = any(raw.get(k) for k in ("deviceID", "pciBusID", "pf", "pfs")) or \
        bool(isinstance(runtime, dict) and ci_get(runtime, "deviceID"))
    if has_bridge and names_vf:
        return "ovs-offload"
    if names_vf:
        return "sriov"
    if has_bridge:
        return "ovs"
    raise CniError(
        Code.INVALID_CONFIG,
        "invalid network config: cannot infer mode: set \"mode\", or \"bridge\" for an OVS port, "
        "or \"deviceID\"/\"pf\" for an SR-IOV VF",
    )


def _mac_sources(conf: NetConf, env: CniEnv) -> tuple[tuple[str, Any], ...]:
    # ovs-cni's precedence: runtimeConfig.mac over CNI_ARGS MAC over the NAD's "mac".
    return (("runtimeConfig.mac", conf.runtime("mac")),
            ("CNI_ARGS MAC", env.args.mac or None),
            ("mac", conf.raw.get("mac")))


def _mac(conf: NetConf, env: CniEnv) -> str | None:
    for where, value in _mac_sources(conf, env):
        if value in (None, ""):
            continue
        if not isinstance(value, str) or mac_problem(value):
            raise invalid_config(where, value, mac_problem(str(value)) or "must be a string")
        return value.lower()
    return None


def _strings(where: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise invalid_config(where, value, "must be a list of strings")
    return list(value)


def _check_dns(where: str, servers: list[str], searches: list[str], options: list[str]) -> None:
    """Every server an address, every search domain and option one printable word: the
    result's DNS ends up in a resolv.conf, where a newline would add lines of its own."""
    for i, server in enumerate(servers):
        try:
            ipaddress.ip_address(server)
        except ValueError:
            raise invalid_config(f"{where}.servers[{i}]", server, "must be an IP address") from None
    for key, words in (("searches", searches), ("options", options)):
        for i, word in enumerate(words):
            if not _DNS_WORD.fullmatch(word):
                raise invalid_config(f"{where}.{key}[{i}]", word,
                                     "must be one word of printable characters (no whitespace)")


def _dns(conf: NetConf) -> DNS:
    try:
        dns = DNS.from_dict(conf.raw.get("dns"), "dns") if conf.raw.get("dns") else DNS()
    except CniError as err:
        raise CniError(Code.INVALID_CONFIG, f"invalid network config: {err.msg}") from None
    _check_dns("dns", dns.nameservers, dns.search, dns.options)
    rt = conf.runtime("dns")
    if rt is None:
        return dns
    if not isinstance(rt, dict):
        raise invalid_config("runtimeConfig.dns", rt, "must be an object with servers, searches, options")
    # containerd capitalises these keys (Servers, Searches, Options).
    servers = _strings("runtimeConfig.dns.servers", ci_get(rt, "servers"))
    searches = _strings("runtimeConfig.dns.searches", ci_get(rt, "searches"))
    options = _strings("runtimeConfig.dns.options", ci_get(rt, "options"))
    _check_dns("runtimeConfig.dns", servers, searches, options)
    if servers:
        dns.nameservers = servers
    if searches:
        dns.search = searches
    if options:
        dns.options = options
    return dns


def _runtime_types(conf: NetConf) -> None:
    """The runtimeConfig and args fields tenantnet or its IPAM reads, type-checked at the edge."""
    for key in ("mac", "deviceID", "CNIDeviceInfoFile"):
        value = conf.runtime(key)
        if value is not None and not isinstance(value, str):
            raise invalid_config(f"runtimeConfig.{key}", value, "must be a string")
    for where, value in (("runtimeConfig.ips", conf.runtime("ips")),
                         ("args.cni.ips", conf.args_cni.get("ips"))):
        for i, item in enumerate(_strings(where, value)):
            try:
                ipaddress.ip_interface(item)
            except ValueError:
                raise invalid_config(f"{where}[{i}]", item, "must be an IPv4 or IPv6 address "
                                                           "(optionally /prefix)") from None


def parse(conf: NetConf, env: CniEnv, node: NodeConfig) -> TenantnetConf:
    raw = conf.raw
    # DEL must clean up whatever the config says of logging (the entry point logs to the
    # node's file then); every other verb refuses a logFile outside the log directory.
    log_file, log_level = settings.log_settings(raw if env.command != "DEL" else {}, node)
    _runtime_types(conf)
    mode = infer_mode(raw)
    ovs = None
    if mode in ("ovs", "ovs-offload"):
        bridge = raw.get("bridge")
        vlan, trunks = _vlan(raw), parse_trunk(raw.get("trunk"))
        on_overlay = overlay.parse(raw, node, mode, vlan, trunks)
        if on_overlay is not None:
            # The rail's chassis decides bridge and OVSDB; the VLAN is the segment, no tag.
            bridge = on_overlay.rail.integration_bridge
            vlan = None
        if mode == "ovs-offload" and bridge in (None, ""):
            bridge = ""  # offload: the bridge whose uplink is the VF's PF, found at ADD
        elif not isinstance(bridge, str) or not _BRIDGE_RE.fullmatch(bridge):
            raise invalid_config(
                "bridge", bridge,
                "must name an OVS bridge (letters, digits, '_', '.', '-'; at most 63 characters)",
            )
        interface_type = raw.get("interface_type")
        if mode == "ovs" and interface_type not in (None, "", "system"):
            raise CniError(
                Code.UNSUPPORTED_FIELD,
                f"unsupported field value: interface_type={interface_type!r}; "
                "mode ovs attaches a veth pair, so only \"system\" (the default) is supported",
            )
        mtu = _int_field(raw, "mtu", 68, 65535)
        endpoint = settings.ovsdb_endpoint(raw, node)
        # On an overlay nothing is written on the bridge for pre-warm, so no bridge rule applies.
        wants_prewarm = _prewarm(raw, node, bridge, env.command == "ADD" and on_overlay is None)
        if on_overlay is not None:
            mtu = overlay.check_mtu(on_overlay, mtu)
            endpoint = on_overlay.rail.ovsdb or node.ovsdb
        ovs = OvsPortSettings(
            bridge=bridge,
            vlan=vlan,
            trunks=trunks,
            mtu=mtu,
            ofport_request=_int_field(raw, "ofport_request", 1, 65279),
            ovsdb=endpoint,
            # Pre-warm pairs ports on one bridge by OpenFlow number; an overlay's peers are
            # behind tunnels (docs/overlay.md: the ADD says it did not warm).
            prewarm=wants_prewarm and on_overlay is None,
            prewarm_declined=wants_prewarm and on_overlay is not None,
            overlay=on_overlay,
        )
        # DEL and GC undo what an ADD made, under whatever node config. An overlay port is
        # never a pre-warm target (its MAC is pinned by the logical port's port security).
        if env.command == "ADD" and on_overlay is None:
            _prewarm_bridge_fields(conf, env, node, ovs)
        for key in ("link_state_check_retries", "link_state_check_interval"):
            _int_field(raw, key, 0, 100000)  # accepted for ovs-cni compatibility; veths need no wait
    if ovs is None and raw.get("prewarm") not in (None, False):
        raise CniError(Code.UNSUPPORTED_FIELD,
                       f"unsupported field value: prewarm={raw.get('prewarm')!r}; pre-warm makes OVS "
                       f"datapath flows, so it applies to modes ovs and ovs-offload, not {mode}")
    vf = _vf_settings(conf) if mode in ("sriov", "ovs-offload") else None
    offload_check = raw.get("offloadCheck", "off")
    if offload_check not in ("off", "require"):
        raise invalid_config("offloadCheck", offload_check, 'must be "off" or "require"')
    ipam_type = settings.ipam_type(conf)
    settings.ipam_paths(conf.ipam, node)
    return TenantnetConf(
        base=conf,
        mode=mode,
        mac=_mac(conf, env),
        ovs=ovs,
        ipam_type=ipam_type,
        dns=_dns(conf),
        log_file=log_file,
        log_level=log_level,
        vf=vf,
        offload_check=offload_check == "require",
        device_info_file=settings.device_info_file(conf, node) if mode != "ovs" else None,
    )


def _prewarm(raw: dict[str, Any], node: NodeConfig, bridge: str, adding: bool) -> bool:
    value = raw.get("prewarm")
    if value is None:
        return node.prewarm
    if not isinstance(value, bool):
        raise invalid_config("prewarm", value, "must be true or false")
    if value and adding and not node.prewarm_bridge(bridge):
        raise invalid_config("prewarm", value,
                             f"pre-warm may not run on bridge {bridge!r}: its OpenFlow rules are written on "
                             "a bridge other tenants share, so the admin names the bridges it may run on "
                             f"(node config prewarmBridges: {list(node.prewarm_bridges)})")
    return value


def _prewarm_bridge_fields(conf: NetConf, env: CniEnv, node: NodeConfig, ovs: OvsPortSettings) -> None:
    """On a bridge that pre-warms, a port's OpenFlow number and its MAC are the admin's to
    grant (node config prewarmGrants): a rule written for an attachment sends its frames to a
    port number, for a MAC — with either chosen, another tenant's port could stand where a
    rule of a departed one still points (docs/security.md, "Pre-warm")."""
    if not node.prewarm_bridge(ovs.bridge):
        return
    why = (f"bridge {ovs.bridge or '(the PF uplink bridge)'!r} pre-warms, and there the admin grants it "
           f"(node config prewarmGrants: {list(node.prewarm_grants)})")
    if ovs.ofport_request is not None and "ofport_request" not in node.prewarm_grants:
        raise invalid_config("ofport_request", ovs.ofport_request, f"not allowed: {why}")
    if "mac" not in node.prewarm_grants:
        for where, value in _mac_sources(conf, env):
            if value not in (None, ""):
                raise invalid_config(where, value, f"a chosen MAC is not allowed: {why}")


def _on_off(raw: dict[str, Any], key: str, default: bool) -> bool:
    value: object = raw.get(key)
    if value is None:
        return default
    if value not in ("on", "off"):
        raise invalid_config(key, value, 'must be "on" or "off"')
    return value == "on"


def device_id(conf: NetConf) -> tuple[str, str] | None:
    """(the VF's PCI address, the field that gave it): runtimeConfig.deviceID, else
    `deviceID`, else Multus's `pciBusID`."""
    from tenantnet.plugin.pci import normalise_pci_address

    for where, value in (("runtimeConfig.deviceID", conf.runtime("deviceID")),
                         ("deviceID", conf.raw.get("deviceID")),
                         ("pciBusID", conf.raw.get("pciBusID"))):
        if value in (None, ""):
            continue
        address = normalise_pci_address(value) if isinstance(value, str) else None
        if address is None:
            raise invalid_config(where, value, "must be a PCI address like 0000:3b:00.2")
        return address, where
    return None


def _vf_settings(conf: NetConf) -> VfSettings:
    raw = conf.raw
    pfs: list[str] = []
    if raw.get("pf") is not None:
        pf = raw["pf"]
        if not isinstance(pf, str) or not _BRIDGE_RE.fullmatch(pf.replace(":", "")):
            raise invalid_config("pf", raw["pf"], "must be a PF netdev name or PCI address")
        pfs.append(raw["pf"])
    if raw.get("pfs") is not None:
        if not isinstance(raw["pfs"], list) or \
                not all(isinstance(p, str) and _BRIDGE_RE.fullmatch(p.replace(":", "")) for p in raw["pfs"]):
            raise invalid_config("pfs", raw["pfs"], "must be a list of PF netdev names or PCI addresses")
        pfs.extend(raw["pfs"])
    named = device_id(conf)
    dev, dev_field = named if named else (None, "deviceID")
    if dev is None and not pfs:
        raise CniError(Code.INVALID_CONFIG, "invalid network config: mode sriov needs deviceID "
                       "(or Multus's pciBusID / runtimeConfig.deviceID), or pf/pfs to pick a free VF from")
    vlan = _vlan(raw) or 0
    deferred = raw.get("vlan") == TENANT_VLAN  # filled in by the tenancy policy
    qos = _int_field(raw, "vlanQoS", 0, 7) or 0
    if qos and not (vlan or deferred):
        raise invalid_config("vlanQoS", qos, "needs a non-zero vlan")
    proto = raw.get("vlanProto", "802.1q")
    if proto not in ("802.1q", "802.1Q", "802.1ad", "802.1AD"):
        raise invalid_config("vlanProto", proto, 'must be "802.1q" or "802.1ad"')
    proto = proto.lower()
    if proto == "802.1ad" and not (vlan or deferred):
        raise invalid_config("vlanProto", proto, "needs a non-zero vlan")
    link_state = raw.get("link_state")
    if link_state is not None and link_state not in ("auto", "enable", "disable"):
        raise invalid_config("link_state", link_state, 'must be "auto", "enable" or "disable"')
    rail_within, rail_action = _rail_alignment(raw.get("railAlignment"))
    rdma = raw.get("rdma", "auto")
    if rdma not in RDMA_CHOICES:
        raise invalid_config("rdma", rdma, 'must be "auto", "exclusive" or "off"')
    min_rate = _int_field(raw, "min_tx_rate", 0, 10_000_000)
    max_rate = _int_field(raw, "max_tx_rate", 0, 10_000_000)
    if min_rate and max_rate and min_rate > max_rate:
        raise invalid_config("min_tx_rate", min_rate, f"must not exceed max_tx_rate ({max_rate})")
    return VfSettings(
        device_id=dev, device_id_field=dev_field, pfs=tuple(pfs), vlan=vlan, vlan_qos=qos, vlan_proto=proto,
        spoofchk=_on_off(raw, "spoofchk", True), trust=_on_off(raw, "trust", False),
        link_state=link_state, min_tx_rate=min_rate, max_tx_rate=max_rate,
        mtu=_int_field(raw, "mtu", 68, 65535), rdma=rdma, rail_within=rail_within, rail_action=rail_action,
    )


RAIL_LEVELS = ("PIX", "PXB", "PHB", "NODE")


def _rail_alignment(raw: Any) -> tuple[str | None, str]:
    if raw is None:
        return None, "warn"
    if not isinstance(raw, dict):
        raise invalid_config("railAlignment", raw,
                             'must be an object such as {"within": "PIX", "action": "warn"}')
    unknown = sorted(set(raw) - {"within", "action"})
    if unknown:
        raise invalid_config(f"railAlignment.{unknown[0]}", raw[unknown[0]],
                             "unknown field (known: within, action)")
    within = raw.get("within", "PIX")
    if within not in RAIL_LEVELS:
        raise invalid_config("railAlignment.within", within, f"must be one of {', '.join(RAIL_LEVELS)}")
    action = raw.get("action", "warn")
    if action not in ("warn", "refuse"):
        raise invalid_config("railAlignment.action", action, 'must be "warn" or "refuse"')
    return str(within), str(action)


def settle(conf: NetConf, env: CniEnv, node: NodeConfig, log: Any) -> TenantnetConf:
    """The checked, typed settings of an ADD or CHECK: the admin's fabric bound in
    (settings.bind_fabric), the NAD parsed, and the tenancy policy's decision applied."""
    from dataclasses import replace

    if node.kubernetes or "tenantNetwork" in conf.raw:  # tnadmit.py is imported only then
        from tenantnet.plugin import tnadmit

        admitted = tnadmit.admit(conf, env, node, log)
        if admitted is not None:  # the TenantNetwork's settings; no tenancy policy applies
            tconf = parse(admitted.conf, env, node)
            if tconf.vf is not None:  # a VF Multus names must be on the network's PFs
                tconf = replace(tconf, vf=replace(tconf.vf, allowed_pfs=admitted.pfs))
            return tconf
    policy = None
    if node.tenancy is not None or node.tenancy_file:  # without a policy tenancy.py is not imported
        from tenantnet.plugin import tenancy

        policy = tenancy.load(node)
    raw = settings.bind_fabric(policy, conf.raw, node)
    if raw is not conf.raw:
        conf = replace(conf, raw=raw)
    tconf = parse(conf, env, node)
    if policy is None:
        if tconf.base.raw.get("vlan") == TENANT_VLAN:
            raise CniError(Code.INVALID_CONFIG, 'invalid network config: vlan="tenant" needs a tenancy '
                                                "policy in the node config")
        return tconf
    if tconf.vf is not None:
        decl = policy.networks.get(conf.name)
        if decl is not None:
            tconf = replace(tconf, vf=replace(tconf.vf, allowed_pfs=decl.pfs))
    decided: TenantnetConf = tenancy.enforce(policy, tconf, env, log)
    return decided
