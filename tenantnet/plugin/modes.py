"""The attachment modes: which driver serves each, and the plan type its records carry.

Adding a mode means writing its driver (tenantnet/plugin/drivers/, one module that owns
the mode), a line in `_DRIVERS`, and the mode's name (and any new config fields it reads)
in tnconf, whose MODES a unit test holds equal to these. Drivers are imported only when
their mode is used: a node that runs only `ovs` never imports the VF code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from cni.errors import CniError, Code
from tenantnet.plugin.records import Plan

if TYPE_CHECKING:
    from tenantnet.plugin.drivers.base import Driver
    from tenantnet.plugin.nodeconfig import NodeConfig

_DRIVERS = {
    "ovs": "tenantnet.plugin.drivers.ovs:OvsDriver",
    "sriov": "tenantnet.plugin.drivers.sriov:SriovDriver",
    "ovs-offload": "tenantnet.plugin.drivers.ovs_offload:OvsOffloadDriver",
}
MODES = tuple(_DRIVERS)


def driver_class(mode: str) -> type[Driver]:
    target = _DRIVERS.get(mode)
    if target is None:
        raise CniError(
            Code.UNSUPPORTED_FIELD,
            f"unsupported field value: mode={mode!r}: not available in this version of tenantnet; "
            f"available modes: {', '.join(_DRIVERS)}",
        )
    module, _, name = target.partition(":")
    cls: type[Driver] = getattr(importlib.import_module(module), name)
    return cls


def for_mode(mode: str, node: NodeConfig) -> Driver:
    """The driver of `mode` for this node; CniError 8 for a mode this version lacks."""
    return driver_class(mode)(node)


def plan_type(mode: str) -> type[Plan]:
    """The plan class of `mode`'s records; the core's part only for an unknown mode (its
    DEL then fails on the mode, with the record kept)."""
    try:
        return driver_class(mode).plan_type
    except CniError:
        return Plan
