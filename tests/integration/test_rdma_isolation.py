"""A VF's RDMA device follows it into the pod and comes back before the netdev leaves — on the
lab's simulated NIC and its simulated RDMA control (the lab kernel has no RDMA): every DEL
variant, shared netns mode (warned, or refused with code 106 before anything is touched),
and two pods never holding each other's device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tenantnet.lab.rdma import LabRdmaControl
from tenantnet.plugin.system.rdmacontrol import netns_identity
from tests.integration.conftest import new_cid
from tests.integration.nodestate import diff, snapshot
from tests.integration.test_sriov import vfconf, vfs

pytestmark = pytest.mark.root


@pytest.fixture
def rdma(nic_lab: Any) -> Iterator[LabRdmaControl]:
    control = LabRdmaControl(str(nic_lab.root))
    yield control
    control.set_netns_mode("exclusive")  # the lab's start, whatever a test did


def holder(rdma: LabRdmaControl, device: str) -> str | None:
    return {d["device"]: d["netns"] for d in rdma.describe()}[device]


def rdma_vf(nic_lab: Any, n: int = 0) -> dict[str, Any]:
    """The n-th VF with a netdev and an RDMA device, with "rdma": the device's name."""
    devices = {d["pciAddress"]: d["device"] for d in LabRdmaControl(str(nic_lab.root)).describe()}
    return [{**vf, "rdma": devices[vf["address"]]} for vf in vfs(nic_lab)
            if vf["netdev"] and vf["address"] in devices][n]


def test_the_rdma_device_is_in_the_pod_and_back_after_del(nic_lab: Any, vfp: Any, netns_factory: Any,
                                                          rdma: LabRdmaControl) -> None:
    vf = rdma_vf(nic_lab)
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"])
    before = snapshot(nic_lab)
    inv = vfp.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    assert holder(rdma, vf["rdma"]) == str(netns_identity(ns.path))
    assert vfp.call("DEL", conf, cid, ns.path).code == 0
    assert holder(rdma, vf["rdma"]) is None
    assert diff(before, snapshot(nic_lab)) == ""


@pytest.mark.parametrize("how", ["empty-netns", "netns-destroyed", "record-missing"])
def test_every_del_variant_returns_the_rdma_device(nic_lab: Any, vfp: Any, netns_factory: Any,
                                                   rdma: LabRdmaControl, how: str) -> None:
    vf = rdma_vf(nic_lab, 1)
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"])
    before = snapshot(nic_lab)
    assert vfp.add(conf, ns, cid).code == 0
    assert holder(rdma, vf["rdma"]) is not None
    if how == "netns-destroyed":
        ns.delete()
    if how == "record-missing":
        for rec in nic_lab.records():
            rec.unlink()
    inv = vfp.call("DEL", conf, cid, ns.path if how != "empty-netns" else "")
    assert inv.code == 0, inv.stdout
    assert holder(rdma, vf["rdma"]) is None
    if how == "record-missing":
        from tenantnet.lab.nic import LabVfControl

        LabVfControl(str(nic_lab.root)).set_spoofchk("lpf0", vf["index"], False)  # the lab's start
    assert diff(before, snapshot(nic_lab)) == ""


def test_two_pods_hold_only_their_own_rdma_devices(nic_lab: Any, vfp: Any, netns_factory: Any,
                                                   rdma: LabRdmaControl) -> None:
    pods = []
    for n in range(2):
        vf = rdma_vf(nic_lab, n)
        ns = netns_factory()
        cid = new_cid()
        conf = vfconf(nic_lab, vf["address"], name=f"rdma{n}")
        assert vfp.add(conf, ns, cid).code == 0
        pods.append((vf, ns, cid, conf))
    (a, ns_a, _, _), (b, ns_b, _, _) = pods[0], pods[1]
    assert holder(rdma, a["rdma"]) == str(netns_identity(ns_a.path))
    assert holder(rdma, b["rdma"]) == str(netns_identity(ns_b.path))
    # From pod A's namespace, B's device cannot be moved (it is not there).
    assert not rdma.return_to_host(b["rdma"], ns_a.path)
    for _, ns, cid, conf in pods:
        assert vfp.call("DEL", conf, cid, ns.path).code == 0
    assert holder(rdma, a["rdma"]) is None and holder(rdma, b["rdma"]) is None


def test_shared_mode_warns_or_refuses(nic_lab: Any, vfp: Any, netns_factory: Any,
                                      rdma: LabRdmaControl) -> None:
    rdma.set_netns_mode("shared")
    vf = rdma_vf(nic_lab)
    ns = netns_factory()
    cid = new_cid()
    before = snapshot(nic_lab)
    refused = vfp.add(vfconf(nic_lab, vf["address"], rdma="exclusive"), ns, cid)
    assert refused.code == 1 and refused.out["code"] == 106, refused.stdout
    assert "shared netns mode" in refused.out["msg"] and "rdma: exclusive" in refused.out["msg"]
    assert "shared netns mode" in refused.out["msg"] and "rdma system set netns exclusive" in refused.out["details"]
    assert diff(before, snapshot(nic_lab)) == ""  # refused before anything was touched
    status = vfp.call("STATUS", vfconf(nic_lab, vf["address"], rdma="exclusive", cniVersion="1.1.0"))
    assert status.out is not None and status.out["code"] == 50 and "shared netns mode" in status.out["msg"]
    assert vfp.call("STATUS", vfconf(nic_lab, vf["address"], cniVersion="1.1.0")).code == 0  # auto: fine
    conf = vfconf(nic_lab, vf["address"])  # rdma: auto
    inv = vfp.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    assert "shared" in inv.stderr and holder(rdma, vf["rdma"]) is None  # warned; the device stays
    assert vfp.call("DEL", conf, cid, ns.path).code == 0
    off = vfconf(nic_lab, vf["address"], rdma="off")
    rdma.set_netns_mode("exclusive")
    assert vfp.add(off, ns, cid).code == 0 and holder(rdma, vf["rdma"]) is None  # off: left alone
    assert vfp.call("DEL", off, cid, ns.path).code == 0
    bad = vfp.add(vfconf(nic_lab, vf["address"], rdma="yes"), ns, cid)
    assert bad.out["code"] == 7 and "rdma" in bad.out["msg"]
