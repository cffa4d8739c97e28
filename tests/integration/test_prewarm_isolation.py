"""Pre-warm and tenant isolation (issue: a stale pre-warm rule delivered one tenant's frames
to another's pod). No rule of ours may output to a port that is not the live port of the
attachment it was written for — whatever the lock, the timing, a crash or a reused port
number — and on a bridge that pre-warms, a tenant may not choose its port's OpenFlow number
or its MAC unless the admin grants it (node config prewarmGrants).

Real OVS (the lab's userspace switch), real namespaces, real frames."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
from pathlib import Path

import pytest

from tenantnet.plugin import modes
from tenantnet.plugin import nodeconfig as config
from tenantnet.plugin.drivers import prewarm
from tenantnet.plugin.records import RecordStore
from tenantnet.plugin.system import warmframes
from tests.integration.conftest import new_cid
from tests.integration.test_prewarm import (
    NET,
    UNTAGGED,
    _add_pods,
    _records,
    _rx_packets,
    no_ipv6,
    ofctl,
    rules,
)
from tests.integration.test_prewarm import warm_conf as warm_conf  # noqa: F401  (a fixture)
from tests.polling import poll

OTHER_TENANT_VLAN = 200


def _ofport(lab, port: str) -> int:
    return int(json.loads(lab.vsctl("--format=json", "--columns=ofport", "list", "Interface", port))["data"][0][0])


def _live_ports(lab) -> dict[int, str]:
    """OpenFlow number -> port name, of every port on the lab's bridge now."""
    out = json.loads(lab.vsctl("--format=json", "--columns=name,ofport", "list", "Interface"))
    return {int(ofport): name for name, ofport in out["data"] if isinstance(ofport, int) and ofport > 0}


def _numbers(line: str) -> tuple[int, int]:
    match = re.search(r"in_port=(\d+),.*actions=output:(\d+)", line)
    assert match, line
    return int(match.group(1)), int(match.group(2))


def _lock_path(lab) -> Path:
    node = config.load(str(lab.node_config))
    return Path(node.state_dir) / f"prewarm-{hashlib.sha256(lab.bridge.encode()).hexdigest()[:16]}.lock"


def test_del_removes_its_rules_without_waiting_for_the_bridge_lock(lab, plugin, netns_factory, warm_conf,
                                                                   no_leftovers):
    """The bridge lock is held by somebody else (a warm of a big network, a stuck process):
    DEL still removes every rule from and to its port before the port goes. (It used to wait
    5 s for the lock, then delete the port and leave the rules: a peer's rule pointing at a
    number OVS could give to a port of another tenant.)"""
    pods = _add_pods(plugin, netns_factory, warm_conf, ["a", "b", "c"])
    b_port = _records(lab)["b"].plan.port_name()
    b_ofport = _ofport(lab, b_port)
    assert any(_numbers(r)[1] == b_ofport for r in rules(lab)), "no rule sends to b: this test shows nothing"
    fd = os.open(_lock_path(lab), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        inv = plugin.call("DEL", warm_conf, pods.pop("b")["cid"], "", "net1")
        assert inv.code == 0, inv.stdout + inv.stderr
        left = [r for r in rules(lab) if b_ofport in _numbers(r)]
        assert left == [], f"rules from or to b's deleted port {b_ofport} left: {left}"
        assert len(rules(lab)) == 2  # a <-> c stay
    finally:
        os.close(fd)
    for p in pods.values():
        assert plugin.call("DEL", warm_conf, p["cid"], "", "net1").code == 0
    assert rules(lab) == []


def _frames_to(lab, src: dict, mac: str, receiver) -> int:
    """Send 3 IPv4 frames from pod `src` to `mac`, then count what `receiver`'s interface got.
    A marker frame from src to itself first would teach nothing: the count is taken after the
    frames' own path (a rule, or NORMAL's flood on src's VLAN) has been taken, which takes
    milliseconds in the userspace datapath."""
    before = _rx_packets(receiver)
    warmframes.send(src["ns"].path, "net1", [warmframes.frame(src["mac"], mac, warmframes.ETH_P_IP)] * 3)
    poll(lambda: _rx_packets(receiver) >= before + 3, timeout=1.5)
    return _rx_packets(receiver) - before


@pytest.mark.parametrize("cleaner", ["agent-round", "gc"])
def test_a_rule_left_for_a_departed_port_never_reaches_another_tenant(lab, plugin, netns_factory, warm_conf,
                                                                        no_leftovers, cleaner):
    """What a process killed between writing a pair and re-reading its peer leaves: a rule of
    ours, in our shape and cookie, from a to a departed attachment d, sending to d's freed
    port number. Another tenant's pod (another VLAN) then takes that very number and d's MAC
    (granted here: the lab's node config grants both; a production node refuses them where
    pre-warm runs — the next test). Its ports and MAC match; its identity does not: the
    agent's round and GC remove the rule, and a's frames to that MAC no longer reach it. (GC
    used to keep such a rule while any record had the departed MAC; the round never looked.)"""
    pods = _add_pods(plugin, netns_factory, warm_conf, ["a", "b"])
    a = pods["a"]
    a_rec = _records(lab)["a"]
    a_ofport = _ofport(lab, a_rec.plan.port_name())
    departed_mac = "0a:58:0a:5b:00:77"
    number = max(n for n in _live_ports(lab) if n < 0xFF00) + 40  # free now, as a deleted port's number is
    ghost = prewarm.pair_cookie(prewarm.ident_of(NET, a["cid"], "net1"), prewarm.ident_of(NET, "d" * 64, "net1"))
    ofctl(lab, "add-flow", f"cookie={ghost:#x},priority=1,in_port={a_ofport},{UNTAGGED},dl_src={a['mac']},"
                           f"dl_dst={departed_mac},actions=output:{number}")
    intruder_ns, intruder_cid = netns_factory(), new_cid()
    no_ipv6(intruder_ns)
    intruder_conf = plugin.conf(name="other-tenant", vlan=OTHER_TENANT_VLAN, mac=departed_mac, ofport_request=number,
                                ipam={"type": "host-local", "dataDir": str(lab.hostlocal_dir),
                                      "ranges": [[{"subnet": "10.92.0.0/24"}]]})
    inv = plugin.add(intruder_conf, intruder_ns, intruder_cid)
    assert inv.code == 0, inv.stdout + inv.stderr
    try:
        assert number in _live_ports(lab), "the intruder did not get the number: this test shows nothing"
        # The stale rule delivers a's frames to the other tenant's pod (what the fix removes).
        assert _frames_to(lab, a, departed_mac, intruder_ns) == 3
        node = config.load(str(lab.node_config))
        if cleaner == "agent-round":
            prewarm.reconcile(node, modes.plan_type)
        else:
            gc = plugin.call("GC", {**warm_conf, "cni.dev/valid-attachments": [
                {"containerID": p["cid"], "ifname": "net1"} for p in pods.values()]}, "", "", "")
            assert gc.code == 0, gc.stdout
        left = rules(lab)
        assert not [r for r in left if f"output:{number}" in r], left
        assert len(left) == 2, left  # a <-> b, untouched
        assert _frames_to(lab, a, departed_mac, intruder_ns) == 0
    finally:
        assert plugin.call("DEL", intruder_conf, intruder_cid, "", "net1").code == 0
        for p in pods.values():
            assert plugin.call("DEL", warm_conf, p["cid"], "", "net1").code == 0
    assert rules(lab) == []


@pytest.fixture
def strict_node(lab, plugin, tmp_path):
    """The lab's node config as a production node would have it: the lab's bridge pre-warms,
    and no tenant may choose a port number or a MAC there."""
    text = "".join(line + "\n" for line in lab.node_config.read_text().splitlines()
                   if not line.startswith(("prewarmBridges:", "prewarmGrants:")))
    path = tmp_path / "node.yaml"
    path.write_text(text + f"prewarmBridges: [{lab.bridge}]\n")
    plugin.extra_env["TENANTNET_CONFIG"] = str(path)
    yield path
    del plugin.extra_env["TENANTNET_CONFIG"]


@pytest.mark.parametrize(("field", "conf", "cni_args", "message"), [
    ("ofport_request", {"ofport_request": 4000}, "", "invalid network config: ofport_request=4000: not allowed"),
    ("mac", {"mac": "0a:58:0a:5b:00:77"}, "", "invalid network config: mac='0a:58:0a:5b:00:77': a chosen MAC"),
    ("runtimeConfig.mac", {"runtimeConfig": {"mac": "0a:58:0a:5b:00:78"}}, "",
     "invalid network config: runtimeConfig.mac='0a:58:0a:5b:00:78': a chosen MAC"),
    ("CNI_ARGS MAC", {}, "IgnoreUnknown=1;K8S_POD_NAMESPACE=t2;K8S_POD_NAME=x;MAC=0a:58:0a:5b:00:79",
     "invalid network config: CNI_ARGS MAC='0a:58:0a:5b:00:79': a chosen MAC"),
])
def test_on_a_bridge_that_prewarms_port_numbers_and_macs_are_the_admins(lab, plugin, netns_factory, strict_node,
                                                                         no_leftovers, field, conf, cni_args,
                                                                         message):
    # Not a pre-warming network itself: the bridge is what counts (another tenant's
    # network there pre-warms).
    nad = plugin.conf(name="other-tenant", vlan=OTHER_TENANT_VLAN, **conf)
    kw = {"cni_args": cni_args} if cni_args else {}
    inv = plugin.add(nad, netns_factory(), **kw)
    assert inv.code != 0 and inv.out["code"] == 7, inv.stdout
    assert inv.out["msg"].startswith(message), inv.out["msg"]
    assert f"bridge '{lab.bridge}' pre-warms" in inv.out["msg"] and "prewarmGrants" in inv.out["msg"]


def test_prewarm_runs_only_on_the_bridges_the_admin_names(lab, plugin, netns_factory, tmp_path, no_leftovers):
    text = "".join(line + "\n" for line in lab.node_config.read_text().splitlines()
                   if not line.startswith(("prewarmBridges:", "prewarmGrants:")))
    path = tmp_path / "node.yaml"
    path.write_text(text + "prewarmBridges: [br-elsewhere]\n")
    plugin.extra_env["TENANTNET_CONFIG"] = str(path)
    try:
        warm = plugin.conf(name=NET, vlan=100, prewarm=True)
        inv = plugin.add(warm, netns_factory())
        assert inv.code != 0 and inv.out["code"] == 7, inv.stdout
        assert inv.out["msg"].startswith(f"invalid network config: prewarm=True: pre-warm may not run on bridge "
                                         f"'{lab.bridge}'"), inv.out["msg"]
        assert "prewarmBridges: ['br-elsewhere']" in inv.out["msg"]
        # This bridge does not pre-warm: a NAD's MAC stays the tenant's (ovs-cni's field).
        ns, cid = netns_factory(), new_cid()
        chosen = plugin.conf(name="macnet", vlan=100, mac="0a:58:0a:5b:00:7a")
        inv = plugin.add(chosen, ns, cid)
        assert inv.code == 0, inv.stdout + inv.stderr
        assert plugin.call("DEL", chosen, cid, "", "net1").code == 0
    finally:
        del plugin.extra_env["TENANTNET_CONFIG"]


def test_adds_and_dels_at_once_leave_no_rule_to_a_port_that_is_not_its_attachments(
        lab, plugin, netns_factory, warm_conf, no_leftovers):
    """Natural contention: while pods of one pre-warming network are added, others are
    deleted, all at once. Right after (no agent round, no GC), every rule of ours takes
    packets from a live port and sends them to a live port whose pod has the rule's
    destination MAC."""
    pods = _add_pods(plugin, netns_factory, warm_conf, [f"p{i}" for i in range(10)])
    leaving = [pods.pop(f"p{i}") for i in range(0, 10, 2)]
    arriving = [(netns_factory(), new_cid()) for _ in range(5)]
    for ns, _ in arriving:
        no_ipv6(ns)
    results: list[tuple[str, int, str]] = []

    def delete(p: dict) -> None:
        inv = plugin.call("DEL", warm_conf, p["cid"], "", "net1")
        results.append(("DEL", inv.code, inv.stdout + inv.stderr))

    def add(ns, cid) -> None:
        inv = plugin.add(warm_conf, ns, cid)
        results.append(("ADD", inv.code, inv.stdout + inv.stderr))
        if inv.code == 0:
            mac = next(i["mac"] for i in inv.out["interfaces"] if i.get("sandbox"))
            pods[cid] = {"ns": ns, "cid": cid, "mac": mac}

    threads = [threading.Thread(target=delete, args=(p,)) for p in leaving] + \
              [threading.Thread(target=add, args=a) for a in arriving]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert all(code == 0 for _, code, _ in results) and len(results) == 10, results
        live = _live_ports(lab)
        mac_of = {}
        node = config.load(str(lab.node_config))
        for rec in RecordStore(node.state_dir, modes.plan_type).list(NET):
            mac = prewarm._pod_interface(rec)
            mac_of[_ofport(lab, rec.plan.port_name())] = mac[0] if mac else None
        for line in rules(lab):
            in_port, out_port = _numbers(line)
            assert in_port in live and out_port in live, f"a rule names a port that is gone: {line}"
            assert f"dl_dst={mac_of.get(out_port)}" in line, f"a rule sends to a port of another pod: {line}"
    finally:
        for p in pods.values():
            assert plugin.call("DEL", warm_conf, p["cid"], "", "net1").code == 0
    assert rules(lab) == []
