"""Is an attachment's traffic in hardware, and can it be? For the modes with an OVS port.

`port_offload` reads the datapath flows through one OVS port now (ovs-appctl, three calls
per datapath; no OVSDB, no findings: CHECK with `"offloadCheck": "require"` stays cheap).
`preconditions` are the checks without which no flow of a switchdev VF is offloaded at
all — eswitch in switchdev mode, `hw-tc-offload` on the PF and the representor, OVS
`other_config:hw-offload=true` — each with what is wrong and the fix. Mode ovs-offload
makes them on ADD and STATUS; the operators' offload report (tenantnet/ops/flowreport)
shows the same ones per attachment.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tenantnet.plugin.system import dpctl
from tenantnet.plugin.system.dpflows import (
    OFFLOADED,
    PARTIAL,
    SOFTWARE,
    DpFlow,
    parse_dump_flows,
    resolve_ports,
)
from tenantnet.plugin.system.sysfs import VirtualFunction
from tenantnet.plugin.system.vfcontrol import VfControl

# Datapaths that cannot offload anything (every flow is software by construction).
SOFTWARE_ONLY_DATAPATHS = frozenset({"dummy"})


@dataclass
class OffloadSummary:
    """Is an attachment's traffic in hardware? For CHECK with "offloadCheck": "require"."""

    port: str | None
    flows: int = 0             # datapath flows through the port now (they expire ~10 s idle)
    hw_flows: int = 0          # offloaded:yes
    partial_flows: int = 0     # offloaded:partial
    sw_flows: int = 0
    packets: int = 0
    hw_packets: int = 0
    datapath_types: list[str] = field(default_factory=list)
    software_only: bool = False  # every datapath is one that cannot offload (the lab)
    error: str | None = None     # flows could not be read

    @property
    def carries_traffic(self) -> bool:
        return self.packets > 0

    @property
    def in_hardware(self) -> bool:
        return self.hw_flows > 0

    def require_failed(self, accept_partial: bool = False) -> bool:
        """The rule of `offloadCheck: require`: traffic flows and none of it in hardware."""
        hw = self.hw_flows + (self.partial_flows if accept_partial else 0)
        return self.error is None and self.carries_traffic and hw == 0

    def message(self) -> str:
        if self.error:
            return f"offload state of port {self.port} unknown: {self.error}"
        if self.port is None:
            return "the attachment has no OVS port, so no datapath flows"
        base = (f"port {self.port}: {self.flows} active datapath flow(s), {self.hw_flows} in hardware, "
                f"{self.partial_flows} partial, {self.sw_flows} in software; {self.packets} packets, "
                f"{self.hw_packets} of them in hardware")
        if self.software_only:
            base += f"; datapath {'/'.join(self.datapath_types)} is the lab's userspace datapath (no NIC)"
        return base


def summarize(port: str | None, flows: Iterable[DpFlow], datapath_types: Iterable[str],
              error: str | None = None) -> OffloadSummary:
    """The summary of the flows through `port` (already selected) on datapaths of these types."""
    totals = {c: {"flows": 0, "packets": 0} for c in (OFFLOADED, PARTIAL, SOFTWARE)}
    chosen = list(flows)
    for flow in chosen:
        bucket = totals.get(flow.classification)
        if bucket is not None:
            bucket["flows"] += 1
            bucket["packets"] += flow.packets
    types = sorted(set(datapath_types))
    return OffloadSummary(
        port=port, flows=len(chosen), hw_flows=totals[OFFLOADED]["flows"],
        partial_flows=totals[PARTIAL]["flows"], sw_flows=totals[SOFTWARE]["flows"],
        packets=sum(f.packets for f in chosen), hw_packets=totals[OFFLOADED]["packets"],
        datapath_types=types, software_only=bool(types) and set(types) <= SOFTWARE_ONLY_DATAPATHS,
        error=error,
    )


def port_offload(node: Any, port: str | None, appctl_target: str | None = None,
                 timeout: float | None = None) -> OffloadSummary:
    """The offload state of the flows through `port` now. Never raises for OVS trouble:
    `error` says it."""
    wait: float = timeout if timeout else getattr(node, "ovsdb_timeout", dpctl.DEFAULT_TIMEOUT)
    flows: list[DpFlow] = []
    types: list[str] = []
    error = None
    try:
        for dp in dpctl.read_datapaths(dpctl.find_target(node.ovsdb, appctl_target).path, wait):
            dump = parse_dump_flows(dp.text)
            resolve_ports(dump.flows, dp.ports)
            types.append(dp.type)
            if port:
                flows += [f for f in dump.flows if f.touches(port)]
    except dpctl.OffloadError as exc:
        error = str(exc)
    return summarize(port, flows, types, error)


@dataclass(frozen=True)
class Miss:
    """An offload precondition not met: which (a key of the node config's
    `offloadPreconditions`), what is wrong, and the fix."""

    key: str
    problem: str
    fix: str

    def text(self) -> str:
        return f"{self.problem}; fix: {self.fix}"


def vf_preconditions(control: VfControl, vf: VirtualFunction, representor: str | None) -> list[Miss]:
    """The NIC's part: eswitch mode, hw-tc-offload on the PF and the representor."""
    misses = []
    mode = control.eswitch_mode(vf.pf_netdev or "", vf.pf_address)
    if mode is not None and mode != "switchdev":
        misses.append(Miss("eswitchSwitchdev", f"the eswitch of PF {vf.pf_address} is in {mode} mode",
                           f"devlink dev eswitch set pci/{vf.pf_address} mode switchdev"))
    for name in filter(None, (vf.pf_netdev, representor)):
        if control.hw_tc_offload(name) is False:
            misses.append(Miss("hwTcOffload", f"hw-tc-offload is off on {name}",
                               f"ethtool -K {name} hw-tc-offload on"))
    return misses


def ovs_preconditions(other_config: dict[str, str]) -> list[Miss]:
    """OVS's part: other_config:hw-offload."""
    if other_config.get("hw-offload") == "true":
        return []
    return [Miss("ovsHwOffload", "OVS other_config:hw-offload is not true, so no flow is offloaded",
                 "ovs-vsctl set Open_vSwitch . other_config:hw-offload=true, then restart ovs-vswitchd")]
