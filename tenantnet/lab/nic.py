"""The lab's simulated SR-IOV NIC — a simulation, labelled as one.

This kernel has no SR-IOV and no netdevsim, so the lab builds what the plugin can see of a
NIC: a fake sysfs tree (`tenantnet.lab.nicsysfs`) laid out as the kernel lays out a ConnectX PF
and its VFs, with **real veth netdevs** standing in for the VF netdevs. Each VF netdev's
peer sits on an OVS bridge (`br-esw0`) that plays the NIC's embedded switch: the VF's VLAN
becomes that port's tag, and `link_state disable` takes the peer down, so VLAN isolation
between VFs shows in real traffic.

`LabVfControl` implements the same `VfControl` interface as the netlink one. It keeps the
per-VF PF-side state (admin MAC, VLAN/QoS/proto, spoofchk, trust, link state, rates) in a
JSON file; of these the VLAN id and link state are emulated in the data path, the rest are
recorded and reported back (a veth cannot enforce spoof checking or rate limits). A real
NIC returns a VF to the host when its pod netns is destroyed; a veth is destroyed instead,
so `recover_netdev` re-creates it — the lab's stand-in for the kernel's behaviour.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tenantnet.lab import statefile
from tenantnet.lab.nicsysfs import SimPf, write_representors, write_tree
from tenantnet.lab.ovs import paths, vsctl
from tenantnet.plugin.system import vfcontrol
from tenantnet.plugin.system.vfcontrol import VfAttributeRefused, VfControl
from tenantnet.plugin.system.vfstate import VfState

ESW_BRIDGE = "br-esw0"
# Lab VFs start as a fresh NIC's: no MAC, no VLAN, spoof checking off, not trusted.
INITIAL = VfState(mac="00:00:00:00:00:00", vlan=0, qos=0, proto="802.1q", spoofchk=False,
                  trust=False, link_state="auto", min_tx_rate=0, max_tx_rate=0)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _set_link_quietly(name: str, **change: Any) -> None:
    """Best effort, as the emulated NIC would: a netdev that is not in the host (moved into a
    pod) or refuses the change is left as it is."""
    from tenantnet.plugin.system import netlink

    try:
        netlink.set_host_link(name, **change)
    except netlink.NetlinkProblem:
        pass


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def _initial_state() -> dict[str, Any]:
    return {"bridge": ESW_BRIDGE, "pfs": {}, "refuse": []}


def peer_name(vf_netdev: str) -> str:
    return f"{vf_netdev}-esw"[:15]


class LabNic:
    """Creates and removes the simulated NIC of one lab directory."""

    def __init__(self, lab_root: str) -> None:
        self.root = Path(lab_root)
        self.state_path = self.root / "nic" / "state.json"
        self.sysfs_root = self.root / "sys"

    @contextmanager
    def locked_state(self) -> Iterator[dict[str, Any]]:
        with statefile.locked(self.state_path, _initial_state) as state:
            yield state

    def read_state(self) -> dict[str, Any]:
        return statefile.read(self.state_path, _initial_state)

    def create(self, pfs: list[SimPf], vsctl: Any, refuse: list[str] | None = None,
               representors: dict[str, dict[int, str]] | None = None, uplink_bridge: str = "") -> None:
        """Lay out the NIC. PFs named in `representors` are in switchdev mode: each VF netdev
        is one end of a veth pair whose other end is its representor, the PF netdev (a real
        veth too) is the uplink port of `uplink_bridge`; the rest are in legacy mode, their VFs
        wired to the emulated embedded switch."""
        representors = representors or {}
        write_tree(self.sysfs_root, pfs)
        if any(pf.netdev not in representors for pf in pfs):
            vsctl("--may-exist", "add-br", ESW_BRIDGE, "--", "set", "Bridge", ESW_BRIDGE,
                  "datapath_type=dummy", "external_ids:tenantnet-lab=embedded-switch")
        with self.locked_state() as state:
            state["refuse"] = list(refuse or [])
            for pf in pfs:
                reps = representors.get(pf.netdev)
                entry_pf: dict[str, Any] = {"address": pf.address, "mode": "switchdev" if reps else "legacy",
                                            "hwTcOffload": True, "vfs": {}}
                if reps is not None:
                    write_representors(self.sysfs_root, pf, reps)
                    entry_pf["uplinkPeer"] = f"{pf.netdev}w"[:15]
                    if not _link_exists(pf.netdev):
                        _ip("link", "add", pf.netdev, "type", "veth", "peer", "name", entry_pf["uplinkPeer"])
                    _ip("link", "set", pf.netdev, "up")
                    if uplink_bridge:
                        vsctl("--may-exist", "add-port", uplink_bridge, pf.netdev)
                for index, vf in enumerate(pf.vfs):
                    entry = {"address": vf.address, "netdev": vf.netdev, "driver": vf.driver,
                             "state": INITIAL.to_dict()}
                    if vf.netdev and reps is not None:
                        entry["representor"] = reps[index]
                        self._make_switchdev_pair(vf.netdev, reps[index])
                    elif vf.netdev:
                        entry["peer"] = peer_name(vf.netdev)
                        self._make_vf_netdev(vf.netdev, entry["peer"], vsctl, vlan=0)
                    entry_pf["vfs"][str(index)] = entry
                state["pfs"][pf.netdev] = entry_pf

    @staticmethod
    def _make_switchdev_pair(netdev: str, representor: str) -> None:
        if not _link_exists(netdev):
            if _link_exists(representor):
                _ip("link", "delete", representor, check=False)
            _ip("link", "add", netdev, "type", "veth", "peer", "name", representor)

    @staticmethod
    def _make_vf_netdev(netdev: str, peer: str, vsctl: Any, vlan: int) -> None:
        made = False
        if not _link_exists(netdev):
            if _link_exists(peer):
                _ip("link", "delete", peer, check=False)
            _ip("link", "add", netdev, "type", "veth", "peer", "name", peer)
            made = True
        _ip("link", "set", peer, "up")
        if made:
            # A peer made anew (the VF's veth died with a pod's namespace): ovs-vswitchd does not
            # reopen a vanished netdev that comes back under its old name, so the port is
            # deleted and added again — else the VF is silently cut off from the switch
            # (two transactions: in one, vswitchd keeps the port and its stale netdev by name)
            vsctl("--if-exists", "del-port", ESW_BRIDGE, peer)
            vsctl("add-port", ESW_BRIDGE, peer)
        else:
            vsctl("--may-exist", "add-port", ESW_BRIDGE, peer)
        if vlan:
            vsctl("set", "Port", peer, f"tag={vlan}")
        else:
            vsctl("clear", "Port", peer, "tag")

    def destroy(self) -> list[str]:
        removed = []
        for pf in self.read_state().get("pfs", {}).values():
            for vf in list(pf["vfs"].values()) + [{"netdev": pf.get("uplinkPeer")}]:
                for name in (vf.get("netdev"), vf.get("peer"), vf.get("representor")):
                    if not name or not _link_exists(name):
                        continue
                    if _ip("link", "delete", name, check=False).returncode == 0:
                        removed.append(f"link {name}")
        return removed

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for pf_netdev, pf in self.read_state().get("pfs", {}).items():
            out.append({
                "pf": pf_netdev, "pfAddress": pf["address"], "mode": pf.get("mode", "legacy"),
                "simulated": True,
                "vfs": [{"index": int(i), "address": vf["address"], "netdev": vf["netdev"],
                         "driver": vf["driver"], "representor": vf.get("representor")}
                        for i, vf in sorted(pf["vfs"].items(), key=lambda kv: int(kv[0]))],
            })
        return out


class LabVfControl(VfControl):
    """VF control through the lab's emulated embedded switch (see the module docstring)."""

    def __init__(self, lab_root: str) -> None:
        self.nic = LabNic(lab_root)
        self.lab_root = lab_root

    def _vsctl(self, *args: str) -> str:
        return vsctl(self.lab_root, *args)

    def _set_esw_tag(self, port: str, vlan: int) -> None:
        """The VF's VLAN on its embedded-switch port, through the process's OVSDB handle
        (an ovs-vsctl exec per attribute cost 15–30 ms, more than a real NIC's whole ADD)."""
        from tenantnet.plugin.system import ovsdb

        ovsdb.connect("unix:" + paths(self.lab_root)["sock"]).set_port_tag(port, vlan or None)

    @contextmanager
    def _vf(self, pf: str, index: int) -> Iterator[dict[str, Any]]:
        with self.nic.locked_state() as state:
            try:
                vf = state["pfs"][pf]["vfs"][str(index)]
            except KeyError:
                raise VfAttributeRefused("vf", pf, index, str(index), "the lab NIC has no such VF",
                                         errno.ENODEV) from None
            vf["_refuse"] = state.get("refuse", [])
            try:
                yield vf
            finally:
                vf.pop("_refuse", None)

    def _update(self, pf: str, index: int, field: str, **values: Any) -> dict[str, Any]:
        with self._vf(pf, index) as vf:
            if vf.get("representor") and field != "mac":
                # As mlx5 does: in switchdev mode VLAN, spoofchk, trust, link state and rates
                # belong to the representor's OVS port, not to the PF's VF settings.
                raise VfAttributeRefused(field, pf, index, ",".join(f"{k}={v}" for k, v in values.items()),
                                         "the eswitch is in switchdev mode", errno.EOPNOTSUPP, field)
            if field in vf["_refuse"]:
                shown = ",".join(f"{k}={v}" for k, v in values.items())
                raise VfAttributeRefused(field, pf, index, shown,
                                         "the lab NIC was started with --refuse " + field,
                                         errno.EOPNOTSUPP, field)
            vf["state"].update(values)
            return dict(vf)

    def read(self, pf_netdev: str, vf_index: int) -> VfState:
        with self._vf(pf_netdev, vf_index) as vf:
            return VfState.from_dict(vf["state"])

    def set_mac(self, pf_netdev: str, vf_index: int, mac: str) -> None:
        vf = self._update(pf_netdev, vf_index, "mac", mac=mac)
        # A NIC hands the admin MAC to the VF's netdev; do the same while it is in the host.
        if mac != "00:00:00:00:00:00" and vf.get("netdev"):
            _set_link_quietly(vf["netdev"], mac=mac)

    def set_vlan(self, pf_netdev: str, vf_index: int, vlan: int, qos: int, proto: str) -> None:
        vf = self._update(pf_netdev, vf_index, "vlan", vlan=vlan, qos=qos, proto=proto)
        if vf.get("peer"):
            self._set_esw_tag(vf["peer"], vlan)

    def set_spoofchk(self, pf_netdev: str, vf_index: int, on: bool) -> None:
        self._update(pf_netdev, vf_index, "spoofchk", spoofchk=on)

    def set_trust(self, pf_netdev: str, vf_index: int, on: bool) -> None:
        self._update(pf_netdev, vf_index, "trust", trust=on)

    def set_link_state(self, pf_netdev: str, vf_index: int, state: str) -> None:
        vf = self._update(pf_netdev, vf_index, "link_state", link_state=state)
        if vf.get("peer"):
            _set_link_quietly(vf["peer"], up=state != "disable")

    def set_rate(self, pf_netdev: str, vf_index: int, min_tx_rate: int, max_tx_rate: int) -> None:
        self._update(pf_netdev, vf_index, "rate", min_tx_rate=min_tx_rate, max_tx_rate=max_tx_rate)

    def recover_netdev(self, pf_netdev: str, vf_index: int, address: str) -> str | None:
        with self._vf(pf_netdev, vf_index) as vf:
            netdev, peer, vlan = vf.get("netdev"), vf.get("peer"), vf["state"]["vlan"]
            link_state, representor = vf["state"]["link_state"], vf.get("representor")
        if netdev and representor:
            if not _link_exists(netdev):
                LabNic._make_switchdev_pair(netdev, representor)
            return netdev
        if not netdev or not peer:
            return None
        if not _link_exists(netdev):
            LabNic._make_vf_netdev(netdev, peer, self._vsctl, vlan)
            if link_state == "disable":
                _ip("link", "set", peer, "down", check=False)
        return netdev

    def eswitch_mode(self, pf_netdev: str, pf_address: str) -> str | None:
        return self.nic.read_state().get("pfs", {}).get(pf_netdev, {}).get("mode")

    def hw_tc_offload(self, netdev: str) -> bool | None:
        # The simulated NIC claims hw-tc-offload on its PF and representors (a veth has none;
        # the lab's datapath is userspace, so nothing is offloaded whatever this says).
        for pf_netdev, pf in self.nic.read_state().get("pfs", {}).items():
            if netdev == pf_netdev or any(v.get("representor") == netdev for v in pf["vfs"].values()):
                return bool(pf.get("hwTcOffload", True))
        return None


# The lab's node config says `vfControl: lab:<lab dir>` and `vfControlModules:
# [tenantnet.lab.nic]`: importing this module is what serves it.
vfcontrol.register("lab", LabVfControl)
