"""Mode sriov on the lab's simulated NIC: VFs moved into pods, configured through the PF
(lab VF control), and restored exactly — netdev and PF-side state — whatever DEL gets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tenantnet.lab.nic import LabNic, LabVfControl
from tests.atonce import at_once
from tests.integration.conftest import PLUGIN, new_cid


def vfs(lab):
    return LabNic(str(lab.root)).describe()[0]["vfs"]


def snapshot(lab):
    """Everything a VF is, per VF: PF-side state and the host netdev (name, MAC, MTU, up)."""
    ctl = LabVfControl(str(lab.root))
    out = {}
    for vf in vfs(lab):
        state = ctl.read("lpf0", vf["index"]).to_dict()
        link = None
        if vf["netdev"]:
            j = subprocess.run(["ip", "-j", "link", "show", "dev", vf["netdev"]], capture_output=True, text=True)
            if j.returncode == 0:
                d = json.loads(j.stdout)[0]
                link = (d["ifname"], d["address"], d["mtu"], "UP" in d["flags"])
        out[vf["address"]] = (state, link)
    return out


def vfconf(lab, address, **kw):
    base = {"cniVersion": "1.0.0", "name": "vfnet", "type": "tenantnet", "deviceID": address,
            "vlan": 100,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.91.0.0/24"}]],
                     "dataDir": str(lab.hostlocal_dir)}}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def test_vf_attach_configures_and_del_restores_everything(nic_lab, vfp, netns_factory):
    before = snapshot(nic_lab)
    vf = vfs(nic_lab)[0]
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"], mac="02:aa:00:00:00:01", mtu=1450, trust="on",
                  link_state="enable", min_tx_rate=100, max_tx_rate=1000, vlanQoS=3)
    inv = vfp.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    assert inv.out["interfaces"] == [{"name": "net1", "mac": "02:aa:00:00:00:01", "sandbox": ns.path}]
    link = json.loads(ns.run("ip", "-j", "addr", "show", "dev", "net1").stdout)[0]
    assert link["mtu"] == 1450 and link["address"] == "02:aa:00:00:00:01"
    state = LabVfControl(str(nic_lab.root)).read("lpf0", vf["index"])
    assert (state.vlan, state.qos, state.spoofchk, state.trust, state.link_state) == (100, 3, True, True, "enable")
    assert (state.min_tx_rate, state.max_tx_rate, state.mac) == (100, 1000, "02:aa:00:00:00:01")
    assert not Path(f"/sys/class/net/{vf['netdev']}").exists()  # moved into the pod
    assert nic_lab.allocations() != [] and nic_lab.records() != []
    assert vfp.call("DEL", conf, cid, ns.path).code == 0
    assert snapshot(nic_lab) == before  # every VF attribute and the netdev's name/mac/mtu/state
    assert nic_lab.allocations() == [] and nic_lab.records() == []
    assert ns.run("ip", "link", "show", "net1").returncode != 0


def test_result_1_1_carries_pci_id_and_mtu(nic_lab, vfp, netns_factory):
    vf = vfs(nic_lab)[1]
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"], cniVersion="1.1.0", ipam=None, mtu=1400)
    inv = vfp.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    (pod,) = inv.out["interfaces"]
    assert pod["pciID"] == vf["address"] and pod["mtu"] == 1400 and pod["name"] == "net1"
    assert vfp.call("DEL", conf, cid, ns.path).code == 0


def test_vlan_isolation_between_vfs(nic_lab, vfp, netns_factory):
    before = snapshot(nic_lab)
    addrs = [vf["address"] for vf in vfs(nic_lab)[:3]]
    pods = []
    for address, vlan, (lo, hi) in zip(addrs, (100, 100, 200),
                                       (("10.92.0.10", "10.92.0.99"),) * 2 + (("10.92.0.100", "10.92.0.199"),), strict=True):
        ns = netns_factory()
        cid = new_cid()
        conf = vfconf(nic_lab, address, name=f"vf{vlan}", vlan=vlan, ipam={
            "type": "host-local", "dataDir": str(nic_lab.hostlocal_dir),
            "ranges": [[{"subnet": "10.92.0.0/24", "rangeStart": lo, "rangeEnd": hi}]]})
        inv = vfp.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        pods.append((ns, cid, conf, inv.out["ips"][0]["address"].split("/")[0]))
    (a, b, c) = pods

    def ping(src, dst):
        return src[0].run("ping", "-c", "3", "-i", "0.3", "-W", "2", dst[3]).returncode == 0

    # at once: the two that must fail each wait out their deadline
    ab, ba, ac, cb = at_once(lambda: ping(a, b), lambda: ping(b, a), lambda: ping(a, c), lambda: ping(c, b))
    assert ab and ba
    assert not ac and not cb
    for ns, cid, conf, _ in pods:
        assert vfp.call("DEL", conf, cid, ns.path).code == 0
    assert snapshot(nic_lab) == before


@pytest.mark.parametrize("how", ["empty-netns", "netns-destroyed", "record-missing"])
def test_del_variants_return_the_vf(nic_lab, vfp, netns_factory, how):
    before = snapshot(nic_lab)
    vf = vfs(nic_lab)[2]
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"], trust="on")
    assert vfp.add(conf, ns, cid).code == 0
    if how == "netns-destroyed":
        ns.delete()
    if how == "record-missing":
        for rec in nic_lab.records():
            rec.unlink()
    # A lost record is found out by the runtime's first DEL, which names the netns: the VF
    # there carries this attachment's mark, so it is provably ours (docs/security.md).
    inv = vfp.call("DEL", conf, cid, ns.path if how in ("netns-destroyed", "record-missing") else "")
    assert inv.code == 0, inv.stdout
    after = snapshot(nic_lab)
    if how == "record-missing":
        # Nothing says what the VF was: it is reset to the fail-safe state, its netdev is home.
        state, link = after[vf["address"]]
        assert (state["spoofchk"], state["trust"], state["vlan"], state["mac"]) == \
            (True, False, 0, "00:00:00:00:00:00")
        assert link is not None and link[0] == vf["netdev"]
        LabVfControl(str(nic_lab.root)).set_spoofchk("lpf0", vf["index"], False)  # back to the lab's start
    else:
        assert after == before
    assert nic_lab.records() == [] and nic_lab.allocations() == []


def test_pod_ifname_taken_is_code_4_and_the_vf_comes_back(nic_lab, vfp, netns_factory):
    """The VF moves in and is renamed in one request; in a pod whose ifname is taken it is left
    there under its own name: the ADD fails with the runtime's error (code 4), and its rollback
    brings that VF back exactly — not the pod's interface called ifname."""
    before = snapshot(nic_lab)
    vf = vfs(nic_lab)[2]
    ns = netns_factory()
    ns.run("ip", "link", "add", "net1", "type", "veth", "peer", "name", "other", check=True)
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"], mac="02:aa:00:00:00:09", mtu=1400)
    inv = vfp.add(conf, ns, cid)
    assert inv.code == 1 and inv.out["code"] == 4, inv.stdout
    assert inv.out["msg"] == f"invalid CNI_IFNAME='net1': an interface of that name already exists in {ns.path}"
    def pod_links():
        return sorted(d["ifname"] for d in json.loads(ns.run("ip", "-j", "link", "show").stdout))

    assert pod_links() == ["lo", "net1", "other"]  # the pod's own interface stays
    assert snapshot(nic_lab) == before and nic_lab.records() == [] and nic_lab.allocations() == []
    assert vfp.call("DEL", conf, cid, ns.path).code == 0
    assert pod_links() == ["lo", "net1", "other"]


@pytest.mark.parametrize("point", ["add.recorded", "sriov.vf-configured", "sriov.netdev-moved", "add.attached",
                                   "add.ipam-done"])
def test_sigkill_mid_add_then_del(nic_lab, vfp, netns_factory, point):
    before = snapshot(nic_lab)
    vf = vfs(nic_lab)[3]
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"], vlan=300)
    vfp.extra_env["TENANTNET_TEST_FAULT"] = point
    inv = vfp.add(conf, ns, cid)
    vfp.extra_env.clear()
    assert inv.code == -9
    assert vfp.call("DEL", conf, cid, "").code == 0
    assert snapshot(nic_lab) == before and nic_lab.records() == [] and nic_lab.allocations() == []


def test_dpdk_vf_reports_pci_id_and_allocates(nic_lab, vfp, netns_factory):
    dpdk = vfs(nic_lab)[-1]
    assert dpdk["driver"] == "vfio-pci" and dpdk["netdev"] is None
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, dpdk["address"])
    inv = vfp.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    assert inv.out["interfaces"] == [{"name": "net1", "sandbox": ns.path}]  # pciID is 1.1.0-only
    assert inv.out["ips"][0]["address"].startswith("10.91.0.")
    assert ns.run("ip", "link", "show", "net1").returncode != 0  # nothing moved: DPDK owns it
    assert LabVfControl(str(nic_lab.root)).read("lpf0", dpdk["index"]).vlan == 100
    check = vfp.call("CHECK", {**conf, "prevResult": inv.out}, cid, ns.path)
    assert check.code == 0, check.stdout
    assert vfp.call("DEL", conf, cid, ns.path).code == 0
    assert LabVfControl(str(nic_lab.root)).read("lpf0", dpdk["index"]).vlan == 0


def test_check_names_vf_drift(nic_lab, vfp, netns_factory):
    vf = vfs(nic_lab)[0]
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"])
    add = vfp.add(conf, ns, cid)
    assert add.code == 0
    ok = vfp.call("CHECK", {**conf, "prevResult": add.out}, cid, ns.path)
    assert ok.code == 0, ok.stdout
    LabVfControl(str(nic_lab.root)).set_vlan("lpf0", vf["index"], 999, 0, "802.1q")
    LabVfControl(str(nic_lab.root)).set_trust("lpf0", vf["index"], True)
    bad = vfp.call("CHECK", {**conf, "prevResult": add.out}, cid, ns.path)
    assert bad.out["code"] == 103
    assert f"VF {vf['address']} VLAN/QoS/proto is 999/0/802.1q, expected 100/0/802.1q" in bad.out["msg"]
    assert f"VF {vf['address']} trust is on, expected off" in bad.out["msg"]
    assert vfp.call("DEL", conf, cid, ns.path).code == 0


def test_pick_free_vf_from_pf_and_race_for_the_last_one(nic_lab, vfp, netns_factory):
    before = snapshot(nic_lab)
    netdev_vfs = [vf for vf in vfs(nic_lab) if vf["netdev"]]
    conf = vfconf(nic_lab, None, pf="lpf0", ipam=None)
    held = []
    for _ in netdev_vfs[:-1]:  # take all but one
        ns = netns_factory()
        cid = new_cid()
        inv = vfp.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        held.append((ns, cid))
    racers = []
    for _ in range(2):
        ns = netns_factory()
        cid = new_cid()
        env = vfp.env("ADD", cid, ns.path, "net1")
        proc = subprocess.Popen([PLUGIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        racers.append((ns, cid, proc))
    for _, _, proc in racers:
        proc.stdin.write(json.dumps(conf).encode())
        proc.stdin.close()
    results = [(ns, cid, proc.wait(timeout=60), json.loads(proc.stdout.read())) for ns, cid, proc in racers]
    for *_, proc in racers:
        proc.stdout.close()
    winners = [r for r in results if r[2] == 0]
    losers = [r for r in results if r[2] != 0]
    assert len(winners) == 1 and len(losers) == 1
    assert losers[0][3]["code"] == 11 and "no free VF on lpf0" in losers[0][3]["msg"]
    held.append(winners[0][:2])
    for ns, cid in held:
        assert vfp.call("DEL", conf, cid, ns.path).code == 0
    assert snapshot(nic_lab) == before


BAD = [
    ({"vlan": 4095}, 7, "vlan=4095"),
    ({"vlan": None, "vlanQoS": 3}, 7, "vlanQoS=3: needs a non-zero vlan"),
    ({"vlanProto": "802.1x"}, 7, "vlanProto='802.1x'"),
    ({"spoofchk": "yes"}, 7, "spoofchk='yes'"),
    ({"link_state": "up"}, 7, "link_state='up'"),
    ({"min_tx_rate": 500, "max_tx_rate": 100}, 7, "min_tx_rate=500"),
    ({"deviceID": "0000:3b:1f.7"}, 7, "deviceID='0000:3b:1f.7'"),
    ({"deviceID": "0000:3b:00.0"}, 7, "deviceID='0000:3b:00.0'"),  # the PF itself
    ({"deviceID": "3b:00:02"}, 7, "deviceID='3b:00:02'"),
    ({"deviceID": None, "pf": "nope0"}, 7, "pf='nope0'"),
    ({"deviceID": None, "mode": "sriov"}, 7, "needs deviceID"),
    ({"deviceID": None}, 7, "cannot infer mode"),
    ({"mtu": 20}, 7, "mtu=20"),
]


@pytest.mark.parametrize("change,code,text", BAD, ids=[b[2][:24] for b in BAD])
def test_bad_vf_configs_change_nothing(nic_lab, vfp, netns_factory, change, code, text):
    before = snapshot(nic_lab)
    vf = vfs(nic_lab)[0]
    ns = netns_factory()
    base = vfconf(nic_lab, vf["address"])
    base.update(change)
    conf = {k: v for k, v in base.items() if v is not None}
    inv = vfp.add(conf, ns, new_cid())
    assert inv.code == 1 and inv.out["code"] == code and text in inv.out["msg"], inv.out
    assert snapshot(nic_lab) == before and nic_lab.records() == []


def test_vf_held_by_another_pod_is_refused(nic_lab, vfp, netns_factory):
    vf = vfs(nic_lab)[0]
    ns1, ns2 = netns_factory(), netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"])
    assert vfp.add(conf, ns1, cid).code == 0
    inv = vfp.add(conf, ns2, new_cid(), cni_args="IgnoreUnknown=1")
    assert inv.out["code"] == 7 and "already attached to pod ns1/pod1" in inv.out["msg"]
    assert vfp.call("DEL", conf, cid, ns1.path).code == 0


def test_refused_attribute_errors_only_when_asked(nic_lab, vfp, netns_factory):
    vf = vfs(nic_lab)[4]
    nic = LabNic(str(nic_lab.root))
    with nic.locked_state() as state:
        state["refuse"] = ["rate"]
    try:
        before = snapshot(nic_lab)
        ns = netns_factory()
        inv = vfp.add(vfconf(nic_lab, vf["address"], max_tx_rate=100), ns, new_cid())
        assert inv.out["code"] == 2 and "rate" in inv.out["msg"] and "refused" in inv.out["msg"]
        assert snapshot(nic_lab) == before and nic_lab.records() == []
        cid = new_cid()
        ok = vfp.add(vfconf(nic_lab, vf["address"]), ns, cid)  # no rate asked: fine
        assert ok.code == 0, ok.stdout
        assert vfp.call("DEL", vfconf(nic_lab, vf["address"]), cid, ns.path).code == 0
    finally:
        with nic.locked_state() as state:
            state["refuse"] = []


def test_fifty_add_del_cycles_leave_every_vf_as_it_was(nic_lab, netns_factory):
    """In-process (the core is a library), so 50 cycles take seconds, not minutes."""
    from cni.env import parse_env
    from cni.netconf import parse_netconf
    from tenantnet.entry import logsetup
    from tenantnet.plugin import nodeconfig as config
    from tenantnet.plugin.core import Plugin

    node = config.load(str(nic_lab.node_config))
    logsetup.setup(node.log_file, "warning", stderr=False)
    plugin = Plugin(node)
    before = snapshot(nic_lab)
    netdev_vfs = [vf for vf in vfs(nic_lab) if vf["netdev"]]
    ns = netns_factory()
    settings = [
        {"vlan": 100}, {"vlan": 200, "vlanQoS": 5, "trust": "on"}, {"vlan": 0, "spoofchk": "off"},
        {"vlan": 300, "mac": "02:bb:00:00:00:01", "mtu": 1300}, {"link_state": "disable", "max_tx_rate": 10},
        {"vlan": 4094, "vlanProto": "802.1ad", "min_tx_rate": 1, "max_tx_rate": 2},
    ]
    for i in range(50):
        vf = netdev_vfs[i % len(netdev_vfs)]
        raw = vfconf(nic_lab, vf["address"], ipam=None, **settings[i % len(settings)])
        env = {"CNI_CONTAINERID": f"cycle{i}", "CNI_IFNAME": "net1", "CNI_NETNS": ns.path,
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=cycles;K8S_POD_NAME=p"}
        out = plugin.add(parse_env({**env, "CNI_COMMAND": "ADD"}), parse_netconf(raw))
        assert out["interfaces"][0]["name"] == "net1"
        plugin.delete(parse_env({**env, "CNI_COMMAND": "DEL"}), parse_netconf(raw))
        assert snapshot(nic_lab) == before, f"cycle {i} left VF {vf['address']} changed"
    assert nic_lab.records() == []
