"""Mode `sriov`: an SR-IOV VF (legacy eswitch mode) moved into the pod, configured through its
PF — admin MAC, VLAN/QoS/proto, spoof checking, trust, link state, rates — and restored
exactly when the pod goes (the VF lifecycle is drivers/vf.py, shared with ovs-offload).

Everything the VF was before we touched it is read in `plan`, i.e. before the intent record
is written and before anything changes. DEL puts all of it back: from the pod, from the host
after the kernel returned the VF (netns gone), or, with no record at all, to safe defaults
(spoofchk on, trust off, no VLAN, no MAC). SR-IOV attachments never talk to OVSDB, so STATUS
has nothing of this mode's to probe.
"""

from __future__ import annotations

from typing import ClassVar

from tenantnet.plugin.drivers.vf import VfDriver, VfPlan


class SriovDriver(VfDriver):
    mode = "sriov"
    plan_type: ClassVar[type[VfPlan]] = VfPlan
