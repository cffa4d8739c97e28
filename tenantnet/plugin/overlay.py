"""Overlay networks (docs/overlay.md): a network config's `overlay: geneve`, and the node's
`ovn:` section that says where each rail's OVN chassis is.

An overlay network is one OVN logical switch (per segment); each attachment is one logical
switch port with port security, bound on this node by its OVS port's `iface-id`. Which
OVS (and integration bridge) takes the port is the node's, per rail: Debian 12's OVN 23.03
has one Geneve encap IP per chassis, so a node with several rail NICs runs one chassis per
rail (its own integration bridge and encap IP), and an attachment on rail r is bound on
rail r's chassis — its tunnel then leaves through rail r's NIC.

Pure: parsing and naming only; the OVN northbound client is tenantnet.plugin.system.ovnnb.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cni.errors import CniError, Code, invalid_config

OVERLAYS = ("geneve",)
# Geneve over IPv4 as OVN sends it: outer Ethernet 14 + IPv4 20 + UDP 8 + Geneve 8 + OVN's
# option 8 (the logical in/out ports). A pod MTU above underlay - 58 makes frames the
# underlay drops without a word (no fragmentation-needed comes back: CNI-FACTS §7).
GENEVE_OVERHEAD = 58
DEFAULT_RAIL = "default"
DEFAULT_INTEGRATION_BRIDGE = "br-int"
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # a rail name: a DNS label
_BRIDGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}")  # as tnconf's
_CHASSIS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}")
_RAIL_KEYS = ("integrationBridge", "ovsdb", "underlayMtu", "underlayBridge", "chassis", "userspaceDatapath")
_OVN_KEYS = ("northbound", "timeout", "rails", "defaultRail", "installTimeout")


@dataclass(frozen=True)
class OvnRail:
    """One rail NIC's OVN chassis on this node."""

    name: str
    integration_bridge: str = DEFAULT_INTEGRATION_BRIDGE
    ovsdb: str = ""  # "" = the node's
    underlay_mtu: int = 1500
    underlay_bridge: str = ""  # the OVS bridge whose uplink is this rail's NIC (ovs-offload)
    chassis: str = ""
    # The integration bridge is OVS's userspace datapath (the lab): a veth pod end must then
    # compute its own TX checksums (CNI-FACTS §7: TCP fails otherwise).
    userspace_datapath: bool = False

    @property
    def pod_mtu(self) -> int:
        return self.underlay_mtu - GENEVE_OVERHEAD


@dataclass(frozen=True)
class OvnSettings:
    """The node config's `ovn:` section."""

    northbound: str
    timeout: float = 5.0
    rails: dict[str, OvnRail] = field(default_factory=dict)
    default_rail: str = ""
    # An ADD returns once the rail's ovn-controller has installed the port's flows (it marks
    # the OVS Interface `external_ids:ovn-installed`), as OVN-Kubernetes waits: a pod that
    # starts sending before that loses its first ARP, and the kernel retries it only after
    # 1 s. Past this many seconds the ADD fails with code 11 (is ovn-controller running?);
    # 0: do not wait.
    install_timeout: float = 10.0

    def rail(self, name: str | None) -> OvnRail | None:
        if name is None:
            name = self.default_rail or (next(iter(self.rails)) if len(self.rails) == 1 else "")
        return self.rails.get(name)


def parse_node_ovn(value: Any, bad: Any, normalise_ovsdb_endpoint: Any) -> OvnSettings:
    """The node config's `ovn` mapping; `bad(key, value, allowed)` makes the error (naming
    the node config file); endpoints are read as the node config reads `ovsdb`."""
    if not isinstance(value, dict) or not set(value) <= set(_OVN_KEYS):
        raise bad("ovn", value, f"a mapping with {', '.join(_OVN_KEYS)}")
    nb = value.get("northbound")
    endpoint = normalise_ovsdb_endpoint(nb) if isinstance(nb, str) else None
    if endpoint is None:
        raise bad("ovn.northbound", nb,
                  "the OVN northbound database: unix:/path, tcp:host:port or ssl:host:port")
    timeout = value.get("timeout", 5.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0.1 <= timeout <= 120:
        raise bad("ovn.timeout", timeout, "a number of seconds between 0.1 and 120")
    raw_rails = value.get("rails", {DEFAULT_RAIL: {}})
    if not isinstance(raw_rails, dict) or not raw_rails or len(raw_rails) > 64:
        raise bad("ovn.rails", raw_rails, "a mapping of 1 to 64 rail names to their chassis settings")
    rails = {}
    for name, spec in raw_rails.items():
        where = f"ovn.rails.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad("ovn.rails", name, "rail names are DNS labels (a-z, 0-9, '-')")
        spec = spec or {}
        if not isinstance(spec, dict) or not set(spec) <= set(_RAIL_KEYS):
            raise bad(where, spec, f"a mapping with {', '.join(_RAIL_KEYS)}")
        rails[name] = _rail(name, spec, where, bad, normalise_ovsdb_endpoint)
    default = value.get("defaultRail", "")
    if default and default not in rails:
        raise bad("ovn.defaultRail", default, f"one of the rails ({', '.join(rails)})")
    install = value.get("installTimeout", 10.0)
    if isinstance(install, bool) or not isinstance(install, (int, float)) or not 0 <= install <= 300:
        raise bad("ovn.installTimeout", install, "a number of seconds between 0 (do not wait) and 300")
    return OvnSettings(northbound=endpoint, timeout=float(timeout), rails=rails, default_rail=default,
                       install_timeout=float(install))


def _rail(name: str, spec: dict[str, Any], where: str, bad: Any, normalise: Any) -> OvnRail:
    bridge = spec.get("integrationBridge", DEFAULT_INTEGRATION_BRIDGE)
    if not isinstance(bridge, str) or not _BRIDGE.fullmatch(bridge):
        raise bad(f"{where}.integrationBridge", bridge, "an OVS bridge name")
    ovsdb = spec.get("ovsdb", "")
    if ovsdb:
        ovsdb = normalise(ovsdb) if isinstance(ovsdb, str) else None
        if ovsdb is None:
            raise bad(f"{where}.ovsdb", spec.get("ovsdb"), "an OVSDB endpoint: unix:/path, tcp:host:port")
    mtu = spec.get("underlayMtu", 1500)
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not 68 + GENEVE_OVERHEAD <= mtu <= 65535:
        raise bad(f"{where}.underlayMtu", mtu, f"the rail NIC's MTU, {68 + GENEVE_OVERHEAD} to 65535")
    underlay = spec.get("underlayBridge", "")
    if underlay and not (isinstance(underlay, str) and _BRIDGE.fullmatch(underlay)):
        raise bad(f"{where}.underlayBridge", underlay, "an OVS bridge name")
    chassis = spec.get("chassis", "")
    if chassis and not (isinstance(chassis, str) and _CHASSIS.fullmatch(chassis)):
        raise bad(f"{where}.chassis", chassis, "an OVN chassis name")
    userspace = spec.get("userspaceDatapath", False)
    if not isinstance(userspace, bool):
        raise bad(f"{where}.userspaceDatapath", userspace, "true or false")
    return OvnRail(name=name, integration_bridge=bridge, ovsdb=ovsdb, underlay_mtu=mtu,
                   underlay_bridge=underlay, chassis=chassis, userspace_datapath=userspace)


@dataclass(frozen=True)
class Overlay:
    """An overlay network as one attachment gets it."""

    kind: str  # "geneve"
    rail: OvnRail
    segment: int | None  # the network config's `vlan`: which of the network's switches
    switch: str
    northbound: str
    timeout: float
    install_timeout: float = 10.0


def parse(raw: dict[str, Any], node: Any, mode: str, vlan: int | None,
          trunks: tuple[int, ...]) -> Overlay | None:
    """The network config's overlay fields, or None for a network without `overlay`.
    Refusals name the field and what is allowed (code 7; a mode that has no overlay: 8)."""
    kind = raw.get("overlay")
    if kind in (None, "", False):
        if raw.get("rail") not in (None, ""):
            raise invalid_config("rail", raw.get("rail"), "names an overlay rail: only with \"overlay\"")
        return None
    if kind not in OVERLAYS:
        raise invalid_config("overlay", kind, f"must be one of {', '.join(OVERLAYS)}")
    if mode not in ("ovs", "ovs-offload"):
        raise CniError(Code.UNSUPPORTED_FIELD, f"unsupported field value: overlay={kind!r} with mode {mode}: "
                                               "an overlay attaches OVS ports (modes ovs and ovs-offload)")
    ovn: OvnSettings | None = node.ovn
    if ovn is None:
        raise invalid_config("overlay", kind, "this node has no OVN (node config `ovn:` with the northbound "
                                              "database and its rails' chassis)")
    rail_name = raw.get("rail")
    if rail_name is not None and not isinstance(rail_name, str):
        raise invalid_config("rail", rail_name, "must be a rail name")
    rail = ovn.rail(rail_name or None)
    if rail is None and not rail_name and mode == "ovs-offload" and ovn.rails:
        # Provisional: mode ovs-offload takes the rail of the VF's PF once the VF is chosen
        # (drivers/ovs_offload.py); the largest MTU here, so only an MTU no rail fits is refused.
        rail = max(ovn.rails.values(), key=lambda r: r.underlay_mtu)
    if rail is None:
        raise invalid_config("rail", rail_name,
                             f"must be one of this node's OVN rails: {', '.join(ovn.rails)}"
                             + ("" if rail_name else " (the node has several and no defaultRail)"))
    if trunks:
        raise invalid_config("trunk", list(trunks),
                             "an overlay port carries one segment; trunks are for VLANs")
    bridge = raw.get("bridge")
    if bridge not in (None, "") and bridge != rail.integration_bridge:
        raise invalid_config("bridge", bridge,
                             f"on an overlay, the port goes on rail {rail.name}'s integration bridge "
                             f"{rail.integration_bridge} (leave bridge out)")
    network = raw.get("name")
    from tenantnet.plugin.system.ovnnb import switch_name

    segment = vlan or None  # VLAN 0 is "untagged": no segment
    return Overlay(kind=kind, rail=rail, segment=segment, switch=switch_name(str(network), segment),
                   northbound=ovn.northbound, timeout=ovn.timeout, install_timeout=ovn.install_timeout)


def check_mtu(overlay: Overlay, mtu: int | None) -> int:
    """The pod MTU: the underlay's minus the overhead, or the requested one if it fits."""
    limit = overlay.rail.pod_mtu
    if mtu is None:
        return limit
    if mtu > limit:
        raise invalid_config("mtu", mtu,
                             f"must be at most {limit} on this overlay: rail {overlay.rail.name}'s underlay "
                             f"MTU {overlay.rail.underlay_mtu} minus {GENEVE_OVERHEAD} bytes of Geneve "
                             "(larger frames would be dropped without an error)")
    return mtu
