"""VF configuration through its PF: the `IFLA_VF_*` attributes of rtnetlink.

This module owns the interface the VF drivers use to read and change a VF through its PF
(`VfControl`, with a second implementation in the lab registered by scheme, see the end),
and the real implementation over netlink (`NetlinkVfControl`). What a VF looks like
(`VfState`) and the request bytes are `vfstate.py`.

Each attribute goes to the kernel in its own request. The kernel's do_setvfinfo() applies the
attributes of one IFLA_VF_INFO in a fixed order and stops at the first error, so a NIC that
refuses one attribute (min_tx_rate on most Intel NICs, 802.1ad on mlx5) would otherwise take
the others down with it, and we could not say which one it refused.

Netlink errors go through `tenantnet.plugin.system.netlink.translated`, the one place that names
them; EOPNOTSUPP / EINVAL / ERANGE / EPROTONOSUPPORT on a set become `VfAttributeRefused` for
that attribute. pyroute2 is imported inside functions only (its import costs ~150 ms).
"""

from __future__ import annotations

import errno
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from tenantnet.plugin.system.netlink import LinkNotFound, host_ipr, translated
from tenantnet.plugin.system.providers import Providers
from tenantnet.plugin.system.vfstate import VF_FIELDS, VfState, parse_vfinfo, request_message, vf_request

RTEXT_FILTER_VF = 1  # ext_mask bit that makes the kernel include IFLA_VFINFO_LIST in a link dump

# VfState field names accepted by `apply` as well, mapped to the request that carries them.
_FIELD_OF = {"qos": "vlan", "proto": "vlan", "min_tx_rate": "rate", "max_tx_rate": "rate"}

# errno values by which a driver (or the kernel for it) says "not this attribute / value".
_REFUSALS = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ERANGE, errno.EPROTONOSUPPORT})
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
            msg = request_message(self._pf_index(ipr, pf_netdev), vf_index, field, state)
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


# ---- which VF control a node uses (the registry: providers.py) --------------------------
# The node config's `vfControl` is `netlink` (a real NIC) or `<scheme>:<argument>`, served by
# a VF control registered under that scheme. Providers outside the plugin wing — the lab's
# simulated NIC — register themselves when imported; the node config's `vfControlModules`
# names the modules to import. So the plugin never imports the lab, and the lab's NIC is
# used only where the admin's node config says so.
_PROVIDERS = Providers[VfControl]("vfControl", "VF control", NetlinkVfControl)


def register(scheme: str, factory: Callable[[str], VfControl]) -> None:
    """Serve `vfControl: <scheme>:<argument>` with `factory(argument)`."""
    _PROVIDERS.register(scheme, factory)


def control_for(spec: str, modules: Iterable[str] = ()) -> VfControl:
    """The VF control the node config's `vfControl` names (see `providers.py`)."""
    return _PROVIDERS.control_for(spec, modules)
