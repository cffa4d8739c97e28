"""What a VF looks like from its PF (`VfState`: admin MAC, VLAN/QoS/protocol, spoofchk,
trust, link state, rates) and its rtnetlink encoding: the `IFLA_VF_*` request of one field
(`vf_request`, `encode_vf_request`) and the parsing of `IFLA_VFINFO_LIST`. Pure functions,
no socket, so every request can be checked attribute by attribute without a kernel; the
netlink calls are `vfcontrol.NetlinkVfControl`.

The VLAN uses the legacy IFLA_VF_VLAN for 802.1Q (as iproute2 does: every kernel and driver
knows it, and the kernel fills in ETH_P_8021Q) and IFLA_VF_VLAN_LIST only when the protocol is
802.1ad, the one case that needs it. pyroute2 0.9 packs the list entry as 14 bytes, but
`struct ifla_vf_vlan_info` is 16 (padded to u32 alignment) and kernels since the 2024 fix
"rtnetlink: Correct nested IFLA_VF_VLAN_LIST attribute validation" (in 6.9 and the stable
branches) refuse anything shorter with EINVAL; our message class adds the two padding bytes.
pyroute2 is imported inside functions only (its import costs ~150 ms).
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}  # IFLA_VF_LINK_STATE_AUTO/_ENABLE/_DISABLE
VLAN_PROTOS = {"802.1q": 0x8100, "802.1ad": 0x88A8}  # ETH_P_8021Q, ETH_P_8021AD
# The order `apply` sets fields in: the addressing and isolation attributes first and the link
# state last, so a VF whose link is forced up never carries traffic half-configured.
VF_FIELDS = ("mac", "vlan", "rate", "spoofchk", "trust", "link_state")
_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")
_U32_MAX = 0xFFFFFFFF


_U32_MAX = 0xFFFFFFFF


@dataclass
class VfState:
    """A VF as its PF reports it; also what we ask the PF to make of it."""

    mac: str = "00:00:00:00:00:00"  # admin MAC; all zeros: none set, the VF driver picks one
    vlan: int = 0
    qos: int = 0
    proto: str = "802.1q"
    spoofchk: bool | None = None  # None: the driver does not report it
    trust: bool | None = None
    link_state: str = "auto"
    min_tx_rate: int = 0  # Mbps, 0: no guarantee
    max_tx_rate: int = 0  # Mbps, 0: unlimited

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VfState:
        # Unknown keys are ignored so a record written by a newer version still loads.
        known = {f.name for f in dataclass_fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# -- pure request building -------------------------------------------------------------------


def vf_request(vf_index: int, field: str, state: VfState) -> dict[str, Any]:
    """The pyroute2 `vf=` argument that sets one field (a VF_FIELDS name) of a VF to `state`'s value.

    Raises ValueError naming the field, the value and what is allowed.
    """
    if not isinstance(vf_index, int) or isinstance(vf_index, bool) or not 0 <= vf_index < 0x7FFFFFFF:
        raise ValueError(f"VF index {vf_index!r} is not a non-negative integer")
    if field == "mac":
        mac = state.mac.lower() if isinstance(state.mac, str) else state.mac
        if not isinstance(mac, str) or not _MAC.fullmatch(mac):
            raise ValueError(f"mac {state.mac!r} is not a MAC address (six hex octets joined by ':')")
        if int(mac[:2], 16) & 1:
            raise ValueError(f"mac {state.mac} is a multicast address; a VF needs a unicast MAC")
        return {"vf": vf_index, "mac": mac}
    if field == "vlan":
        _check_int("vlan", state.vlan, 0, 4094)  # 4095 is reserved by 802.1Q
        _check_int("qos", state.qos, 0, 7)
        if state.proto not in VLAN_PROTOS:
            allowed = ", ".join(VLAN_PROTOS)
            raise ValueError(f"proto {state.proto!r} is not a VLAN protocol; allowed: {allowed}")
        if state.proto == "802.1q":
            # IFLA_VF_VLAN {vf, vlan, qos}: the kernel sets the protocol to 802.1Q itself.
            return {"vf": vf_index, "vlan": {"vlan": state.vlan, "qos": state.qos}}
        # IFLA_VF_VLAN_LIST [IFLA_VF_VLAN_INFO {vf, vlan, qos, be16 proto}]
        entry = {"vlan": state.vlan, "qos": state.qos, "proto": VLAN_PROTOS[state.proto]}
        return {"vf": vf_index, "vlan": [entry]}
    if field == "rate":
        _check_int("min_tx_rate", state.min_tx_rate, 0, _U32_MAX)
        _check_int("max_tx_rate", state.max_tx_rate, 0, _U32_MAX)
        return {"vf": vf_index, "rate": {"min_tx_rate": state.min_tx_rate, "max_tx_rate": state.max_tx_rate}}
    if field in ("spoofchk", "trust"):
        value = getattr(state, field)
        if not isinstance(value, bool):
            raise ValueError(f"{field} {value!r} must be true or false to be set")
        return {"vf": vf_index, field: int(value)}
    if field == "link_state":
        if state.link_state not in LINK_STATES:
            raise ValueError(f"link_state {state.link_state!r} is not one of {', '.join(LINK_STATES)}")
        return {"vf": vf_index, "link_state": LINK_STATES[state.link_state]}
    raise ValueError(f"unknown VF request field {field!r}; allowed: {', '.join(VF_FIELDS)}")


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} {value!r} is out of range: allowed {low}-{high}")


@functools.cache
def _vf_message_class() -> Any:
    """pyroute2's ifinfmsg with IFLA_VF_VLAN_INFO padded to sizeof(struct ifla_vf_vlan_info)."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    base = ifinfmsg.vflist.vfinfo

    # pyroute2 finds a nested NLA class as an attribute of its parent class, by the name in
    # nla_map, so each level is subclassed down to the one that changes.
    # pyroute2 is untyped, so its classes are Any to mypy: the ignores below are for that.
    class padded_ivvi(base.vf_vlist.ivvi):  # type: ignore[name-defined,misc]
        # {u32 vf, vlan, qos; be16 vlan_proto} is 16 bytes in C; pyroute2 stops at 14.
        fields = (*base.vf_vlist.ivvi.fields, ("__pad", "2x"))

    class padded_vf_vlist(base.vf_vlist):  # type: ignore[name-defined,misc]
        ivvi = padded_ivvi

    class padded_vfinfo(base):  # type: ignore[valid-type,misc]
        vf_vlist = padded_vf_vlist

    class padded_vflist(ifinfmsg.vflist):  # type: ignore[misc]
        vfinfo = padded_vfinfo

    class vf_ifinfmsg(ifinfmsg):  # type: ignore[misc]
        vflist = padded_vflist

    return vf_ifinfmsg


def request_message(pf_index: int, vf_index: int, field: str, state: VfState) -> Any:
    """The ifinfmsg `ipr.link("set", index=pf_index, vf=vf_request(…))` would build, VLAN padded."""
    from pyroute2.iproute.linux import get_arguments_processor

    # The same argument processing IPRoute.link() runs, so `vf=` means what it means there;
    # only the message class differs (the padding fix above).
    query = {"index": pf_index, "vf": vf_request(vf_index, field, state)}
    proc = get_arguments_processor("link", "set", query)
    cls = _vf_message_class()
    msg = cls()
    for name, *_ in msg.fields:
        msg[name] = proc.get_value(name, default=0, mode="field")
    for key, value in proc.items():
        nla = cls.name2nla(key)
        if msg.valid_nla(nla) and value is not None:
            msg["attrs"].append([nla, value])
    return msg


def encode_vf_request(pf_index: int, vf_index: int, field: str, state: VfState) -> bytes:
    """The netlink message bytes that set one field: what NetlinkVfControl sends (seq and pid 0).

    The type is RTM_NEWLINK with NLM_F_REQUEST|NLM_F_ACK and no NLM_F_CREATE — what pyroute2's
    and iproute2's `link set` send; for an existing ifindex the kernel handles it as RTM_SETLINK.
    """
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    msg = request_message(pf_index, vf_index, field, state)
    msg["header"]["type"] = RTM_NEWLINK
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    msg["header"]["sequence_number"] = 0
    msg["header"]["pid"] = 0
    msg.encode()
    return bytes(msg.data)


# -- parsing ------------------------------------------------------------------------------------


def parse_vfinfo(link_msg: Any) -> dict[int, VfState]:
    """VF states by VF index from an RTM_NEWLINK read with ext_mask=RTEXT_FILTER_VF."""
    vflist = link_msg.get("IFLA_VFINFO_LIST")
    if not vflist:
        return {}
    out: dict[int, VfState] = {}
    for position, info in enumerate(vflist.get_attrs("IFLA_VF_INFO")):
        state = VfState()
        mac = info.get("IFLA_VF_MAC")
        index = mac["vf"] if mac is not None else position
        if mac is not None:
            state.mac = mac["mac"].lower()
        vlan_list = info.get("IFLA_VF_VLAN_LIST")
        vlan_info = vlan_list.get("IFLA_VF_VLAN_INFO") if vlan_list else None
        if vlan_info is not None:  # kernels since 4.9 report the protocol here
            state.vlan, state.qos = vlan_info["vlan"], vlan_info["qos"]
            proto = vlan_info["proto"]
            state.proto = next((k for k, v in VLAN_PROTOS.items() if v == proto), f"0x{proto:04x}")
        elif (vlan := info.get("IFLA_VF_VLAN")) is not None:
            state.vlan, state.qos = vlan["vlan"], vlan["qos"]
        if (rate := info.get("IFLA_VF_RATE")) is not None:
            state.min_tx_rate, state.max_tx_rate = rate["min_tx_rate"], rate["max_tx_rate"]
        elif (tx_rate := info.get("IFLA_VF_TX_RATE")) is not None:
            state.max_tx_rate = tx_rate["tx_rate"]
        # The kernel presets spoofchk and trust to (u32)-1 and sends that when the driver does
        # not report them; that is "unknown", not "on".
        if (spoofchk := info.get("IFLA_VF_SPOOFCHK")) is not None and spoofchk["spoofchk"] != _U32_MAX:
            state.spoofchk = bool(spoofchk["spoofchk"])
        if (trust := info.get("IFLA_VF_TRUST")) is not None and trust["trust"] != _U32_MAX:
            state.trust = bool(trust["trust"])
        if (link_state := info.get("IFLA_VF_LINK_STATE")) is not None:
            value = link_state["link_state"]
            state.link_state = next((k for k, v in LINK_STATES.items() if v == value), str(value))
        out[index] = state
    return out
