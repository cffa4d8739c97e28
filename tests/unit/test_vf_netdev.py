"""What the VF driver (tenantnet.plugin.drivers.vf) asks of netlink for a VF's netdev, without
a kernel: how it comes home, and the pod's ifname already taken as the runtime's error (CNI code
4). The requests themselves, and how netlink words a refusal: test_netlink_move.py."""

from __future__ import annotations

import errno
from types import SimpleNamespace
from typing import Any

import pytest

from cni.errors import CniError, Code
from cni.netconf import parse_netconf
from tenantnet.plugin.drivers import vf
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import AttachmentRecord
from tenantnet.plugin.system import netlink
from tenantnet.plugin.tnconf import _vf_settings

NETNS = "/run/netns/pod-a"


def test_a_netdev_comes_home_as_it_was() -> None:
    was = vf.NetdevState("ens1f0v2", mac="02:00:00:00:00:07", mtu=1500, up=True, alias="was")
    assert vf.netdev_home(was) == netlink.LinkChange(mac="02:00:00:00:00:07", mtu=1500, up=True, alias="was")
    # A MAC or MTU not read is left as it is; nothing known at all: down and unmarked.
    assert vf.netdev_home(vf.NetdevState("ens1f0v2")) == netlink.LinkChange(up=False, alias="")
    assert vf.netdev_home(None) == vf.UNKNOWN_NETDEV_HOME == netlink.LinkChange(up=False, alias="")


class AppliedAtThePf:
    """The PF takes every VF setting."""

    def apply(self, *args: Any) -> None:
        pass


def test_the_pod_ifname_taken_is_the_runtimes_error(monkeypatch: pytest.MonkeyPatch) -> None:
    moves: list[tuple[str, str, netlink.LinkChange]] = []

    def name_taken(name: str, netns_path: str, pod_side: netlink.LinkChange) -> None:
        moves.append((name, netns_path, pod_side))
        raise netlink.NameTakenInPod(f"configuring {name} in {netns_path}: File exists", errno.EEXIST)

    monkeypatch.setattr(netlink, "move_into_pod", name_taken)
    driver = vf.VfDriver(NodeConfig())
    driver._control = AppliedAtThePf()  # type: ignore[assignment]
    plan = vf.VfPlan(device_id="0000:3b:00.2", pf="ens1f0", vf_index=2,
                     original=vf.VfOriginal(vf.SAFE_VF_STATE, vf.NetdevState("ens1f0v2")))
    record = AttachmentRecord(network="rail", container_id="c1", ifname="net1", mode="sriov", netns=NETNS,
                              plan=plan, progress=set())
    settings = _vf_settings(parse_netconf({"cniVersion": "1.0.0", "name": "rail", "type": "tenantnet",
                                           "mode": "sriov", "deviceID": "0000:3b:00.2"}))
    with pytest.raises(CniError) as exc:
        driver.attach(record, SimpleNamespace(vf=settings, mac=None))  # type: ignore[arg-type]
    assert exc.value.code == Code.INVALID_ENV
    assert exc.value.msg == f"invalid CNI_IFNAME='net1': an interface of that name already exists in {NETNS}"
    assert [(name, path, pod_side.name) for name, path, pod_side in moves] == [("ens1f0v2", NETNS, "net1")]
    # The VF is left in the pod under its host name: the rollback brings it home.
    assert record.progress == {vf.STEP_VF, vf.STEP_NETDEV}
