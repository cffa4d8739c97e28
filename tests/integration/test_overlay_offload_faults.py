"""Faults on an overlay network in mode ovs-offload: the plugin SIGKILLed at every `ovn.*`
crash point, in the overlay lab with the simulated switchdev NIC of test_overlay_offload.py
(node 1: `pf0` on rail 0, `pf1` on rail 1, two VFs each, representors veth peers).

- An ADD killed at each crash point of an ADD (from the code: test_faults.overlay_steps()),
  then the runtime's ADD again: exactly one logical port for the attachment, its VF in the
  pod with the port-security MAC and the rail's MTU, its representor the one OVS port of
  it, on the rail's integration bridge, bound to that port; then its DEL leaves nothing.
- The same kill, then a DEL instead: no logical port, no OVS port, no record, the
  representor off OVS, and every VF and representor of the NIC as it was before the ADD
  (VF control state; VF netdev and representor back in the node's namespace under their
  names with their MAC and MTU; the representor's up flag and MTU: test_ovs_offload's
  link_json and its readings).
- A DEL killed at its crash point (the logical port just deleted), then DEL again: the same.
- GC: an offload attachment whose record is lost has its logical port and representor port
  removed and its VF given back; a live attachment (kept as valid) keeps all of its own.

A bystander attachment (a VF of pf0, rail 0) lives through the whole module: every case
checks it still has exactly its one logical port and representor port.
"""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import ovn
from tests.integration import overlaysupport as s
from tests.integration import test_overlay_offload as oo
from tests.integration.test_overlay_faults import ADD_POINTS, DEL_POINT, FAULT_ENV, leftovers
from tests.integration.test_overlay_offload import olab as olab  # noqa: F401  (a fixture)
from tests.integration.test_ovs_offload import link_json, link_state, named, up_and_mtu

pytestmark = pytest.mark.root

OWNER_CID = "tenantnet-container-id"


@dataclass
class Attachment:
    """A VF of node 1 attached (or to be) to pod namespace `pod.netns` in mode ovs-offload."""

    pod: s.Pod  # for test_overlay_faults.leftovers: container id, ifname, netns, node
    vf: dict[str, Any]
    bridge: str  # the integration bridge of the VF's rail
    mac: str = ""
    ip: str = ""

    @property
    def lsp(self) -> str:
        return oo.lsp_of(self.pod.node.name, self.pod.container_id)

    def take(self, inv: s.Invocation) -> None:
        assert inv.code == 0, inv
        self.mac = next(i["mac"] for i in inv.result["interfaces"] if i.get("sandbox"))
        self.ip = inv.result["ips"][0]["address"].split("/")[0]


@dataclass
class Node1:
    o: oo.OffloadLab
    count: int = 0
    made: list[Attachment] = field(default_factory=list)

    def attachment(self, pf: str, index: int) -> Attachment:
        self.count += 1
        name = f"of{self.count}"
        vf = self.o.vfs()[pf][index]
        netns = ovn.make_pod_netns(self.o.lab, self.o.node1, name)
        conf = oo.overlay_conf("ovs-offload", deviceID=vf["address"])  # the rail: the VF's PF's
        pod = s.Pod(name, self.o.node1, netns, oo.cid_of(name), conf)
        att = Attachment(pod, vf, {"pf0": "br-int", "pf1": "br-int-rail1"}[pf])
        self.made.append(att)
        return att

    def cni(self, command: str, att: Attachment, fault: str | None = None) -> s.Invocation:
        return oo.cni(command, self.o.node1, self.o.config, att.pod.conf, att.pod.container_id, att.pod.netns,
                      extra_env={FAULT_ENV: fault} if fault else None)

    def add(self, att: Attachment) -> None:
        att.take(self.cni("ADD", att))

    def gc(self, valid: list[Attachment]) -> s.Invocation:
        body = {**oo.overlay_conf("ovs-offload"), "cniVersion": "1.1.0",  # a NAD without deviceID
                "cni.dev/valid-attachments": [{"containerID": a.pod.container_id, "ifname": a.pod.ifname}
                                              for a in valid]}
        return oo.in_node(self.o.node1, self.o.config, [oo.PLUGIN], json.dumps(body),
                          {"CNI_COMMAND": "GC", "CNI_PATH": str(oo.BIN)})

    def nic_state(self) -> dict[str, Any]:
        """The NIC as DEL must give it back: each VF's control state; each VF netdev's and
        representor's (name, MAC, MTU) in the node's namespace (None: not there); each
        representor's up flag and MTU."""
        ns = self.o.node1.netns
        links = {}
        for vf in [vf for vfs in self.o.vfs().values() for vf in vfs]:
            rep = link_json(vf["representor"], ns)  # one look at it, for both of its entries
            links[vf["address"]] = (link_state(vf["netdev"], ns), named(rep), rep and up_and_mtu(rep))
        return {"control": self.o.vf_state(), "links": links}


@pytest.fixture(scope="module")
def lab1(olab: oo.OffloadLab) -> Node1:  # noqa: F811
    return Node1(olab)


@pytest.fixture
def node1(lab1: Node1) -> Iterator[Node1]:
    """Node 1; what a failed case left attached is DELeted after it (a passing case leaves
    nothing of its own), so that the next case finds its VF free."""
    first = len(lab1.made)
    yield lab1
    for att in lab1.made[first:]:
        if leftovers(lab1.o.lab, att.pod):
            lab1.cni("DEL", att)


@pytest.fixture(scope="module")
def bystander(lab1: Node1) -> Iterator[Attachment]:
    att = lab1.attachment("pf0", 0)
    lab1.add(att)
    yield att
    assert lab1.cni("DEL", att).code == 0


def duplicates(o: oo.OffloadLab) -> list[str]:
    names = [name for name, _ in s.logical_ports(o.lab)]
    return sorted({name for name in names if names.count(name) > 1})


def assert_live(n: Node1, att: Attachment) -> None:
    """Exactly one logical port for the attachment (its port security: the pod's MAC and
    address), its VF in the pod with that MAC and the rail's MTU, its representor the one OVS
    port of it, on the rail's integration bridge with iface-id = the logical port; a record."""
    o, node = n.o, n.o.node1
    assert duplicates(o) == []
    assert s.ports_of(o.lab, att.pod) == [att.lsp]
    port = oo.nb_port(o.lab.root, att.lsp)
    assert port is not None and port["port_security"] == [f"{att.mac} {att.ip}"], port
    link = oo.pod_link(att.pod.netns)
    assert (link["address"], link["mtu"]) == (att.mac, oo.POD_MTU), link
    rep = att.vf["representor"]
    assert [name for name, ids in s.ovs_ports(node) if ids.get(OWNER_CID) == att.pod.container_id] == [rep]
    assert ovn.vsctl(node, "port-to-br", rep).strip() == att.bridge
    assert ovn.vsctl(node, "get", "Interface", rep, "external_ids:iface-id").strip().strip('"') == att.lsp
    assert [p for p in s.records(node) if att.pod.container_id in str(p)], "no record"


def assert_gone(n: Node1, att: Attachment, before: dict[str, Any]) -> None:
    """Nothing of the attachment (logical port, OVS port, record, pod interface), the
    representor off OVS, and the NIC as it was before its ADD."""
    assert duplicates(n.o) == []
    assert leftovers(n.o.lab, att.pod) == []
    assert not oo.on_ovs(n.o.node1, att.vf["representor"])
    assert n.nic_state() == before


@pytest.mark.parametrize(("point", "then"), [(p, then) for p in ADD_POINTS for then in ("ADD", "DEL")])
def test_sigkill_at_an_overlay_point_of_add(node1: Node1, bystander: Attachment, point: str, then: str) -> None:
    """The plugin dies at the crash point of an ADD; the runtime ADDs again (then DELs) or
    DELs: exactly the attachment's one logical port, or nothing of it and the NIC as before."""
    before = node1.nic_state()
    att = node1.attachment("pf1", 0)
    killed = node1.cni("ADD", att, fault=point)
    assert killed.code == -signal.SIGKILL and killed.stdout == "", killed
    if point != "ovn.lsp-adding":  # the crash came after the NB write: the port is there
        assert s.ports_of(node1.o.lab, att.pod) == [att.lsp]
    if then == "ADD":
        node1.add(att)
        assert_live(node1, att)
    assert node1.cni("DEL", att).code == 0
    assert_gone(node1, att, before)
    assert_live(node1, bystander)


def test_sigkill_after_the_logical_port_is_deleted(node1: Node1, bystander: Attachment) -> None:
    """The plugin dies just after a DEL removed the logical port (representor port, VF and
    record still there); the runtime's DEL again gives everything back."""
    before = node1.nic_state()
    att = node1.attachment("pf1", 0)
    node1.add(att)
    assert_live(node1, att)
    killed = node1.cni("DEL", att, fault=DEL_POINT)
    assert killed.code == -signal.SIGKILL, killed
    assert s.ports_of(node1.o.lab, att.pod) == []
    assert [p for p in s.records(node1.o.node1) if att.pod.container_id in str(p)], "the record went first"
    assert node1.cni("DEL", att).code == 0
    assert_gone(node1, att, before)
    assert_live(node1, bystander)


def test_gc_removes_an_unrecorded_offload_attachment_and_keeps_a_live_one(
        node1: Node1, bystander: Attachment) -> None:
    """A record lost: GC (the bystander valid) removes that attachment's logical port and
    representor port and gives its VF back; the bystander keeps its own."""
    before = node1.nic_state()
    att = node1.attachment("pf1", 1)
    node1.add(att)
    assert_live(node1, att)
    root = Path(node1.o.node1.root, "state", "attachments")
    lost = [p for p in root.glob(f"*/{att.pod.container_id}")]
    assert lost, list(root.rglob("*"))
    for path in lost:
        shutil.rmtree(path)
    assert s.ports_of(node1.o.lab, att.pod) == [att.lsp] and oo.on_ovs(node1.o.node1, att.vf["representor"])
    gc = node1.gc(valid=[bystander])
    assert gc.code == 0, gc
    assert duplicates(node1.o) == []
    assert leftovers(node1.o.lab, att.pod) == []
    rep, ns = att.vf["representor"], node1.o.node1.netns
    assert not oo.on_ovs(node1.o.node1, rep)
    # Without the record the VF's and representor's original MAC and MTU are unknown
    # (docs/ovs-offload.md, GC): the VF gets the fail-safe state at the PF (as before its ADD
    # here) and its netdev comes home under its sysfs name; the representor is left down.
    # Every other VF and representor is as it was.
    after = node1.nic_state()
    assert after["control"] == before["control"]
    netdev, representor, (up, _) = after["links"].pop(att.vf["address"])
    assert (netdev[0], representor[0], up) == (att.vf["netdev"], rep, False), (netdev, representor, up)
    assert after["links"] == {k: v for k, v in before["links"].items() if k != att.vf["address"]}
    assert link_state(att.vf["netdev"], ns) is not None
    assert_live(node1, bystander)
