"""VF configuration through its PF: the `IFLA_VF_*` attributes of rtnetlink.

This module owns what a VF looks like from its PF (`VfState`: admin MAC, VLAN/QoS/protocol,
spoofchk, trust, link state, rates), the interface the SR-IOV driver uses to read and change
it (`VfControl`, with a second implementation in the lab), and the real implementation over
netlink (`NetlinkVfControl`). The request bytes are built by pure functions (`vf_request`,
`encode_vf_request`) so they can be checked attribute by attribute without a kernel.

Each attribute goes to the kernel in its own request. The kernel's do_setvfinfo() applies the
attributes of one IFLA_VF_INFO in a fixed order and stops at the first error, so a NIC that
refuses one attribute (min_tx_rate on most Intel NICs, 802.1ad on mlx5) would otherwise take
the others down with it, and we could not say which one it refused.

The VLAN uses the legacy IFLA_VF_VLAN for 802.1Q (as iproute2 does: every kernel and driver
knows it, and the kernel fills in ETH_P_8021Q) and IFLA_VF_VLAN_LIST only when the protocol is
802.1ad, the one case that needs it. pyroute2 0.9 packs the list entry as 14 bytes, but
`struct ifla_vf_vlan_info` is 16 (padded to u32 alignment) and kernels since the 2024 fix
"rtnetlink: Correct nested IFLA_VF_VLAN_LIST attribute validation" (in 6.9 and the stable
branches) refuse anything shorter with EINVAL; our message class adds the two padding bytes.

Netlink errors go through `tenantnet.plugin.system.netlink.translated`, the one place that names
them; EOPNOTSUPP / EINVAL / ERANGE / EPROTONOSUPPORT on a set become `VfAttributeRefused` for
that attribute. pyroute2 is imported inside functions only (its import costs ~150 ms).
"""

from __future__ import annotations

import errno
import functools
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

from tenantnet.plugin.system.netlink import LinkNotFound, host_ipr, translated

LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}  # IFLA_VF_LINK_STATE_AUTO/_ENABLE/_DISABLE
VLAN_PROTOS = {"802.1q": 0x8100, "802.1ad": 0x88A8}  # ETH_P_8021Q, ETH_P_8021AD
RTEXT_FILTER_VF = 1  # ext_mask bit that makes the kernel include IFLA_VFINFO_LIST in a link dump

# The order `apply` sets fields in: the addressing and isolation attributes first and the link
# state last, so a VF whose link is forced up never carries traffic half-configured.
VF_FIELDS = ("mac", "vlan", "rate", "spoofchk", "trust", "link_state")
# VfState field names accepted by `apply` as well, mapped to the request that carries them.
_FIELD_OF = {"qos": "vlan", "proto": "vlan", "min_tx_rate": "rate", "max_tx_rate": "rate"}

# errno values by which a driver (or the kernel for it) says "not this attribute / value".
_REFUSALS = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ERANGE, errno.EPROTONOSUPPORT})
_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")
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


class VfAttributeRefused(Exception):
    """The NIC refused one VF attribute; `attribute` is our field name, `errno` the kernel's."""

    def __init__(self, attribute: str, pf_netdev: str, vf_index: int, value: str, reason: str,
                 err: int, field: str | None = None) -> None:
        name = errno.errorcode.get(err, str(err))
        super().__init__(
            f"the NIC behind PF {pf_netdev} refused {attribute}={value} for VF {vf_index}: {reason} ({name})"
        )
        self.attribute = attribute
        self.field = field or attribute  # the request it was part of: mac, vlan, rate, …
        self.pf_netdev = pf_netdev
        self.vf_index = vf_index
        self.errno = err
        self.also_refused: list[VfAttributeRefused] = []  # set by VfControl.apply


class VfControl(ABC):
    """Reading and changing VFs through their PF (netlink on a real node, the lab's simulation)."""

    @abstractmethod
    def read(self, pf_netdev: str, vf_index: int) -> VfState: ...

    @abstractmethod
    def set_mac(self, pf_netdev: str, vf_index: int, mac: str) -> None: ...

    @abstractmethod
    def set_vlan(self, pf_netdev: str, vf_index: int, vlan: int, qos: int, proto: str) -> None: ...

    @abstractmethod
    def set_spoofchk(self, pf_netdev: str, vf_index: int, on: bool) -> None: ...

    @abstractmethod
    def set_trust(self, pf_netdev: str, vf_index: int, on: bool) -> None: ...

    @abstractmethod
    def set_link_state(self, pf_netdev: str, vf_index: int, state: str) -> None: ...

    @abstractmethod
    def set_rate(self, pf_netdev: str, vf_index: int, min_tx_rate: int, max_tx_rate: int) -> None: ...

    def eswitch_mode(self, pf_netdev: str, pf_address: str) -> str | None:
        """`switchdev` or `legacy` as devlink reports it; None when it cannot be told."""
        import json
        import subprocess

        try:
            proc = subprocess.run(["devlink", "-j", "dev", "eswitch", "show", f"pci/{pf_address}"],
                                  capture_output=True, text=True, timeout=5, check=False)
            mode = json.loads(proc.stdout)["dev"][f"pci/{pf_address}"]["mode"]
        except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
            return None
        return str(mode)

    def hw_tc_offload(self, netdev: str) -> bool | None:
        """The `hw-tc-offload` netdev feature (ethtool -k); None when it cannot be told."""
        import subprocess

        try:
            proc = subprocess.run(["ethtool", "-k", netdev], capture_output=True, text=True, timeout=5,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        for line in proc.stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "hw-tc-offload":
                return value.strip().startswith("on")
        return None

    def recover_netdev(self, pf_netdev: str, vf_index: int, address: str) -> str | None:
        """The VF's netdev when the kernel's own return of it cannot be seen; None on a real NIC.

        A real kernel hands a VF back to the host when its netns dies, so sysfs finds it.
        The lab's simulated VFs are veths, which die with the netns instead; the lab
        re-creates them here.
        """
        return None

    def apply(self, pf_netdev: str, vf_index: int, wanted: VfState, fields: Iterable[str]) -> None:
        """Set exactly the named fields of `wanted`, one request each, in `VF_FIELDS` order.

        Fields are `VF_FIELDS` names or VfState names (`qos`/`proto` set the VLAN request,
        `min_tx_rate`/`max_tx_rate` the rate request). Every named field is validated before
        the first request, so a bad value (ValueError) changes nothing. A NIC refusing one
        attribute does not stop the others: they are all still set, then `VfAttributeRefused`
        for the first refusal is raised (any further ones in its `also_refused`). Any other
        error (the PF is gone …) stops at once.
        """
        requested = set()
        for name in fields:
            if name not in VF_FIELDS and name not in _FIELD_OF:
                allowed = ", ".join(VF_FIELDS + tuple(_FIELD_OF))
                raise ValueError(f"unknown VF field {name!r}; allowed: {allowed}")
            requested.add(_FIELD_OF.get(name, name))
        for field in requested:
            vf_request(vf_index, field, wanted)  # validation only: raises ValueError naming the field
        refused: list[VfAttributeRefused] = []
        for field in VF_FIELDS:
            if field not in requested:
                continue
            try:
                self._set_field(pf_netdev, vf_index, field, wanted)
            except VfAttributeRefused as exc:
                refused.append(exc)
        if refused:
            first = refused[0]
            first.also_refused = refused[1:]
            if first.also_refused:
                first.add_note("also refused: " + "; ".join(str(e) for e in first.also_refused))
            raise first

    def _set_field(self, pf_netdev: str, vf_index: int, field: str, wanted: VfState) -> None:
        if field == "mac":
            self.set_mac(pf_netdev, vf_index, wanted.mac)
        elif field == "vlan":
            self.set_vlan(pf_netdev, vf_index, wanted.vlan, wanted.qos, wanted.proto)
        elif field == "rate":
            self.set_rate(pf_netdev, vf_index, wanted.min_tx_rate, wanted.max_tx_rate)
        elif field == "spoofchk":
            assert wanted.spoofchk is not None  # vf_request refused None already
            self.set_spoofchk(pf_netdev, vf_index, wanted.spoofchk)
        elif field == "trust":
            assert wanted.trust is not None
            self.set_trust(pf_netdev, vf_index, wanted.trust)
        elif field == "link_state":
            self.set_link_state(pf_netdev, vf_index, wanted.link_state)


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
def _vf_message_class() -> type:
    """pyroute2's ifinfmsg with IFLA_VF_VLAN_INFO padded to sizeof(struct ifla_vf_vlan_info)."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    base = ifinfmsg.vflist.vfinfo

    # pyroute2 finds a nested NLA class as an attribute of its parent class, by the name in
    # nla_map, so each level is subclassed down to the one that changes.
    class padded_ivvi(base.vf_vlist.ivvi):  # type: ignore[name-defined,misc]
        # {u32 vf, vlan, qos; be16 vlan_proto} is 16 bytes in C; pyroute2 stops at 14.
        fields = (*base.vf_vlist.ivvi.fields, ("__pad", "2x"))

    class padded_vf_vlist(base.vf_vlist):  # type: ignore[name-defined,misc]
        ivvi = padded_ivvi

    class padded_vfinfo(base):  # type: ignore[valid-type,misc]
        vf_vlist = padded_vf_vlist

    class padded_vflist(ifinfmsg.vflist):  # type: ignore[name-defined,misc]
        vfinfo = padded_vfinfo

    class vf_ifinfmsg(ifinfmsg):  # type: ignore[valid-type,misc]
        vflist = padded_vflist

    return vf_ifinfmsg


def _request_message(pf_index: int, vf_index: int, field: str, state: VfState) -> Any:
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

    msg = _request_message(pf_index, vf_index, field, state)
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


# -- the real implementation ----------------------------------------------------------------------


class NetlinkVfControl(VfControl):
    """VF control with rtnetlink in the current (host) network namespace.

    Uses the process's one host IPRoute socket from `tenantnet.plugin.system.netlink` (opened on first
    use); `ipr` lets tests pass a stand-in.
    """

    def __init__(self, ipr: Any = None) -> None:
        self._given_ipr = ipr

    def _ipr(self) -> Any:
        return self._given_ipr if self._given_ipr is not None else host_ipr()

    @staticmethod
    def _pf_index(ipr: Any, pf_netdev: str) -> int:
        found = ipr.link_lookup(ifname=pf_netdev)
        if not found:
            raise LinkNotFound(f"PF {pf_netdev} not found in the host network namespace", errno.ENODEV)
        return int(found[0])

    def read(self, pf_netdev: str, vf_index: int) -> VfState:
        ipr = self._ipr()
        with translated(f"reading VF {vf_index} of PF {pf_netdev}"):
            index = self._pf_index(ipr, pf_netdev)
            msgs = ipr.link("get", index=index, ext_mask=RTEXT_FILTER_VF)
            vfs = parse_vfinfo(msgs[0]) if msgs else {}
        if vf_index not in vfs:
            raise LinkNotFound(
                f"PF {pf_netdev} has no VF {vf_index} (it reports {len(vfs)} VF(s))", errno.ENODEV
            )
        return vfs[vf_index]

    def set_mac(self, pf_netdev: str, vf_index: int, mac: str) -> None:
        self._set(pf_netdev, vf_index, "mac", VfState(mac=mac))

    def set_vlan(self, pf_netdev: str, vf_index: int, vlan: int, qos: int, proto: str) -> None:
        self._set(pf_netdev, vf_index, "vlan", VfState(vlan=vlan, qos=qos, proto=proto))

    def set_spoofchk(self, pf_netdev: str, vf_index: int, on: bool) -> None:
        self._set(pf_netdev, vf_index, "spoofchk", VfState(spoofchk=on))

    def set_trust(self, pf_netdev: str, vf_index: int, on: bool) -> None:
        self._set(pf_netdev, vf_index, "trust", VfState(trust=on))

    def set_link_state(self, pf_netdev: str, vf_index: int, state: str) -> None:
        self._set(pf_netdev, vf_index, "link_state", VfState(link_state=state))

    def set_rate(self, pf_netdev: str, vf_index: int, min_tx_rate: int, max_tx_rate: int) -> None:
        self._set(pf_netdev, vf_index, "rate", VfState(min_tx_rate=min_tx_rate, max_tx_rate=max_tx_rate))

    def _set(self, pf_netdev: str, vf_index: int, field: str, state: VfState) -> None:
        from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
        from pyroute2.netlink.exceptions import NetlinkError
        from pyroute2.netlink.rtnl import RTM_NEWLINK

        ipr = self._ipr()
        with translated(f"setting {field} of VF {vf_index} on PF {pf_netdev}"):
            msg = _request_message(self._pf_index(ipr, pf_netdev), vf_index, field, state)
            try:
                # tuple(): the ACK (or the error) arrives only while the response is consumed.
                tuple(ipr.nlm_request(msg, msg_type=RTM_NEWLINK, msg_flags=NLM_F_REQUEST | NLM_F_ACK))
            except NetlinkError as exc:
                if exc.code not in _REFUSALS:
                    raise  # ENODEV (PF gone) and the rest: named by translated
                reason = exc.args[1] if len(exc.args) > 1 and exc.args[1] else os.strerror(exc.code)
                attribute, value = _refused_attribute(field, state, exc.code)
                raise VfAttributeRefused(attribute, pf_netdev, vf_index, value, str(reason), exc.code,
                                         field) from None


def _refused_attribute(field: str, state: VfState, err: int) -> tuple[str, str]:
    """Which of our fields to blame when the request for `field` was refused, and its value."""
    if field == "rate":
        # One IFLA_VF_RATE carries both rates. A nonzero minimum is what NICs refuse (ixgbe,
        # i40e, iavf allow only max_tx_rate), so blame it when it was asked for.
        if state.min_tx_rate:
            return "min_tx_rate", f"{state.min_tx_rate} (with max_tx_rate={state.max_tx_rate})"
        return "max_tx_rate", str(state.max_tx_rate)
    if field == "vlan":
        if err == errno.EPROTONOSUPPORT:  # mlx5 legacy mode: 802.1Q only
            return "proto", state.proto
        return "vlan", f"{state.vlan} (qos {state.qos}, proto {state.proto})"
    value = getattr(state, field)
    if isinstance(value, bool):
        return field, "on" if value else "off"
    return field, str(value)


# ---- which VF control a node uses ---------------------------------------------------------
# The node config's `vfControl` is `netlink` (a real NIC) or `<scheme>:<argument>`, served by
# a VF control registered under that scheme. Providers outside the plugin wing — the lab's
# simulated NIC — register themselves when imported; the node config's `vfControlModules`
# names the modules to import. So the plugin never imports the lab, and the lab's NIC is
# used only where the admin's node config says so.
_PROVIDERS: dict[str, Callable[[str], VfControl]] = {}


def register(scheme: str, factory: Callable[[str], VfControl]) -> None:
    """Serve `vfControl: <scheme>:<argument>` with `factory(argument)`."""
    _PROVIDERS[scheme] = factory


def control_for(spec: str, modules: Iterable[str] = ()) -> VfControl:
    """The VF control the node config's `vfControl` names; `modules` (its `vfControlModules`)
    are imported first when no provider of the scheme is registered yet."""
    if spec == "netlink":
        return NetlinkVfControl()
    scheme, _, argument = spec.partition(":")
    if scheme not in _PROVIDERS:
        import importlib

        for module in modules:
            importlib.import_module(module)
    factory = _PROVIDERS.get(scheme)
    if factory is None:
        from cni.errors import CniError, Code

        raise CniError(Code.INVALID_CONFIG, f"invalid node config: vfControl {spec!r}: no VF control "
                                            f"provides {scheme!r} (vfControlModules: {list(modules)})")
    return factory(argument)
