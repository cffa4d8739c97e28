"""Mode ovs-offload on the lab's switchdev NIC: VF in the pod, representor on OVS."""

from __future__ import annotations

import json
import subprocess

import pytest

from tenantnet.lab.nic import LabNic, LabVfControl
from tests.atonce import at_once
from tests.integration.conftest import PluginRunner, new_cid


def nic(lab):
    return LabNic(str(lab.root)).describe()[0]


def conf_for(lab, vf, **kw):
    base = {"cniVersion": "1.1.0", "name": "offnet", "type": "tenantnet", "mode": "ovs-offload",
            "deviceID": vf["address"], "vlan": 100, "mtu": 1400,
            "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.96.0.0/24"}]],
                     "dataDir": str(lab.root / "ipam")}}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def link_json(dev, netns=None):
    """`ip -j link show dev` of `dev` in `netns` (None: this namespace); None if it is not there."""
    where = ["-n", netns] if netns else []
    link = subprocess.run(["ip", *where, "-j", "link", "show", "dev", dev], capture_output=True, text=True)
    return json.loads(link.stdout)[0] if link.returncode == 0 else None


def named(link):
    """(name, MAC, MTU) of a `link_json` answer; None for None."""
    return link and (link["ifname"], link["address"], link["mtu"])


def up_and_mtu(link):
    """Whether a representor's `link_json` answer is up, and its MTU (what DEL restores)."""
    return ("UP" in link["flags"], link["mtu"])


def link_state(dev, netns=None):
    """(name, MAC, MTU) of `dev` in `netns` (None: this namespace); None if it is not there."""
    return named(link_json(dev, netns))


def representor_state(rep, netns=None):
    """Whether the representor is up, and its MTU (what DEL restores)."""
    return up_and_mtu(link_json(rep, netns))


def vf_snapshot(lab):
    ctl = LabVfControl(str(lab.root))
    out = {}
    for vf in nic(lab)["vfs"]:
        out[vf["address"]] = (ctl.read(nic(lab)["pf"], vf["index"]).to_dict(), link_state(vf["netdev"]))
    return out


def own_allocations(lab):
    """tenantnet-ipam's allocations in the lab store these tests use."""
    import sqlite3

    db_path = lab.root / "ipam" / "ipam.db"
    if not db_path.exists():
        return []
    with sqlite3.connect(db_path) as db:
        return db.execute("SELECT address FROM allocation").fetchall()


def test_vf_in_pod_representor_on_ovs_and_isolation(switchdev_lab, off, netns_factory):
    before = vf_snapshot(switchdev_lab)
    vfs = nic(switchdev_lab)["vfs"]
    pods = []
    for vf, vlan in zip(vfs[:3], (100, 100, 200), strict=True):
        ns = netns_factory()
        cid = new_cid()
        conf = conf_for(switchdev_lab, vf, vlan=vlan)
        inv = off.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        rep, pod = inv.out["interfaces"]
        assert rep["name"] == vf["representor"] and pod["pciID"] == vf["address"] and pod["mtu"] == 1400
        port = json.loads(switchdev_lab.vsctl("--format=json", "--columns=tag,external_ids", "find", "Port",
                                              f"name={rep['name']}"))["data"][0]
        assert port[0] == vlan and dict(port[1][1])["tenantnet-container-id"] == cid
        # no bridge in the config: the one whose uplink is the VF's PF
        assert switchdev_lab.vsctl("port-to-br", rep["name"]).strip() == switchdev_lab.bridge
        pods.append((ns, cid, conf, inv.out["ips"][0]["address"].split("/")[0]))
    a, b, c = pods

    def ping(src, dst):
        return src[0].run("ping", "-c", "3", "-i", "0.3", "-W", "2", dst[3]).returncode == 0

    ab, ac = at_once(lambda: ping(a, b), lambda: ping(a, c))  # at once: the second waits out its deadline
    assert ab and not ac
    check = off.call("CHECK", {**a[2], "prevResult": off.add(a[2], a[0], a[1]).out}, a[1], a[0].path)
    assert check.code == 0, check.stdout
    for ns, cid, conf, _ in pods:
        assert off.call("DEL", conf, cid, ns.path).code == 0
    assert switchdev_lab.owned_ports() == [] and switchdev_lab.records() == []
    assert vf_snapshot(switchdev_lab) == before


@pytest.mark.parametrize("how", ["double", "empty-netns"])
def test_del_variants(switchdev_lab, off, netns_factory, how):
    before = vf_snapshot(switchdev_lab)
    vf = nic(switchdev_lab)["vfs"][3]
    ns = netns_factory()
    cid = new_cid()
    conf = conf_for(switchdev_lab, vf, mac="02:96:00:00:00:01")
    assert off.add(conf, ns, cid).code == 0
    assert off.call("DEL", conf, cid, ns.path if how == "double" else "").code == 0
    assert off.call("DEL", conf, cid, "").code == 0
    assert switchdev_lab.owned_ports() == [] and switchdev_lab.records() == []
    assert vf_snapshot(switchdev_lab) == before
    assert own_allocations(switchdev_lab) == []


def test_refused_precondition_attaches_nothing(switchdev_lab, off, netns_factory, tmp_path):
    node = tmp_path / "node.yaml"
    node.write_text(switchdev_lab.node_config.read_text() + "offloadPreconditions: {ovsHwOffload: refuse}\n")
    off.extra_env["TENANTNET_CONFIG"] = str(node)
    ns = netns_factory()
    inv = off.add(conf_for(switchdev_lab, nic(switchdev_lab)["vfs"][0]), ns, new_cid())
    assert inv.out["code"] == 105 and "other_config:hw-offload is not true" in inv.out["msg"]
    assert ns.run("ip", "link", "show", "net1").returncode != 0
    assert switchdev_lab.owned_ports() == [] and switchdev_lab.records() == []


def test_legacy_nic_has_no_representor(nic_lab, netns_factory):
    runner = PluginRunner(nic_lab)
    vf = LabNic(str(nic_lab.root)).describe()[0]["vfs"][0]
    inv = runner.add(conf_for(nic_lab, vf, bridge=nic_lab.bridge), netns_factory(), new_cid())
    assert inv.out["code"] == 7 and "has no representor" in inv.out["msg"] and "legacy mode" in inv.out["msg"]
    assert nic_lab.records() == []


def test_status_reports_offload_preconditions(switchdev_lab, off, tmp_path):
    conf = conf_for(switchdev_lab, nic(switchdev_lab)["vfs"][0])
    ok = off.raw(off.env("STATUS", netns=None, cni_args=""), json.dumps(conf))
    assert ok.code == 0 and "other_config:hw-offload is not true" in ok.stderr  # warn: still available
    node = tmp_path / "node.yaml"
    node.write_text(switchdev_lab.node_config.read_text() + "offloadPreconditions: {ovsHwOffload: refuse}\n")
    off.extra_env["TENANTNET_CONFIG"] = str(node)
    bad = off.raw(off.env("STATUS", netns=None, cni_args=""), json.dumps(conf))
    assert bad.out["code"] == 50 and "offload precondition not met" in bad.out["msg"]
    switchdev_lab.vsctl("set", "Open_vSwitch", ".", "other_config:hw-offload=true")
    try:
        good = off.raw(off.env("STATUS", netns=None, cni_args=""), json.dumps(conf))
        assert good.code == 0, good.stdout
    finally:
        switchdev_lab.vsctl("remove", "Open_vSwitch", ".", "other_config", "hw-offload")


def test_offload_check_require_fails_on_software_datapath(switchdev_lab, off, netns_factory):
    vfs = nic(switchdev_lab)["vfs"]
    pods = []
    for vf in vfs[:2]:
        ns = netns_factory()
        cid = new_cid()
        conf = conf_for(switchdev_lab, vf, offloadCheck="require")
        inv = off.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        pods.append((ns, cid, conf, inv))
    (a, b) = pods
    peer = b[3].out["ips"][0]["address"].split("/")[0]
    assert a[0].run("ping", "-c", "3", "-i", "0.3", "-W", "2", peer).returncode == 0
    check = off.call("CHECK", {**a[2], "prevResult": a[3].out}, a[1], a[0].path)
    assert check.out["code"] == 103
    assert "in hardware" in check.out["msg"] or "software" in check.out["msg"], check.out["msg"]
    for ns, cid, conf, _ in pods:
        assert off.call("DEL", conf, cid, ns.path).code == 0


def test_offload_report_shows_representor_flows_and_nic_findings(switchdev_lab, off, netns_factory):
    import sys
    from pathlib import Path

    ctl = [str(Path(sys.executable).parent / "tenantnetctl"), "--node-config", str(switchdev_lab.node_config),
           "offload", "--network", "offnet", "--json"]
    vfs = nic(switchdev_lab)["vfs"]
    pods = []
    for vf in vfs[:2]:
        ns = netns_factory()
        cid = new_cid()
        conf = conf_for(switchdev_lab, vf)
        inv = off.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        pods.append((ns, cid, conf, inv.out["ips"][0]["address"].split("/")[0]))
    assert pods[0][0].run("ping", "-c", "5", "-i", "0.1", "-W", "2", pods[1][3]).returncode == 0
    report = json.loads(subprocess.run(ctl, capture_output=True, text=True).stdout)
    ports = {a["port"] for a in report["attachments"]}
    assert ports == {vfs[0]["representor"], vfs[1]["representor"]}
    for a in report["attachments"]:
        assert a["representor"] == a["port"] and a["flows"], a
        assert a["totals"]["software"]["packets"] >= 5 and a["hwPacketShare"] == 0
    assert report["softwareOnly"] is True
    assert "hw-tc-offload-off" not in {f["code"] for f in report["findings"]}
    # counters grow with the traffic sent
    assert pods[0][0].run("ping", "-c", "10", "-i", "0.05", "-W", "2", pods[1][3]).returncode == 0
    again = json.loads(subprocess.run(ctl, capture_output=True, text=True).stdout)
    before = {a["port"]: a["totals"]["software"]["packets"] for a in report["attachments"]}
    for a in again["attachments"]:
        assert a["totals"]["software"]["packets"] >= before[a["port"]] + 10, a["port"]
    state = LabNic(str(switchdev_lab.root))
    with state.locked_state() as s:
        next(iter(s["pfs"].values()))["hwTcOffload"] = False
    try:
        report = json.loads(subprocess.run(ctl, capture_output=True, text=True).stdout)
        off_findings = [f for f in report["findings"] if f["code"] == "hw-tc-offload-off"]
        assert off_findings and "ethtool -K" in off_findings[0]["fix"]
    finally:
        with state.locked_state() as s:
            next(iter(s["pfs"].values()))["hwTcOffload"] = True
    for ns, cid, conf, _ in pods:
        assert off.call("DEL", conf, cid, ns.path).code == 0


def test_gc_releases_an_unrecorded_representor_port_and_its_vf(switchdev_lab, off, netns_factory):
    """A record lost (or never written by an ADD killed at the wrong instant): GC finds the
    representor port by its ownership tag, finds the VF again from the representor, deletes
    the port and gives the VF back to the host in the fail-safe state."""
    vf = nic(switchdev_lab)["vfs"][2]
    ns = netns_factory()
    cid = new_cid()
    conf = conf_for(switchdev_lab, vf, vlan=300, mac="02:96:00:00:00:07")
    assert off.add(conf, ns, cid).code == 0
    ctl = LabVfControl(str(switchdev_lab.root))
    assert ctl.read(nic(switchdev_lab)["pf"], vf["index"]).mac == "02:96:00:00:00:07"
    for record in switchdev_lab.records():
        record.unlink()
    gc = {**conf, "cni.dev/valid-attachments": []}
    gc.pop("deviceID")  # as a NAD whose VF the device plugin hands out per pod
    inv = off.raw(off.env("GC", netns=None, cni_args=""), json.dumps(gc))
    assert inv.code == 0, inv.stdout
    assert switchdev_lab.owned_ports() == [] and switchdev_lab.records() == []
    assert own_allocations(switchdev_lab) == []  # its address too, from the GC's IPAM config
    # The VF's netdev is back in the host under its own name, and the one VF setting that
    # belongs to the PF in switchdev mode (the admin MAC) is reset.
    link = subprocess.run(["ip", "-j", "link", "show", "dev", vf["netdev"]], capture_output=True, text=True)
    assert link.returncode == 0, f"{vf['netdev']} not back in the host"
    assert ctl.read(nic(switchdev_lab)["pf"], vf["index"]).mac == "00:00:00:00:00:00"
    off.cleanups.clear()  # nothing left to DEL


def test_del_gives_the_representor_back_as_it_was_every_time(switchdev_lab, off, netns_factory):
    """vswitchd, until it has dropped a port, may set the device's flags back as it found
    them: DEL waits for it before restoring the representor (without that wait the
    representor was left up in 3 of 30 cycles)."""
    vf = nic(switchdev_lab)["vfs"][3]
    conf = conf_for(switchdev_lab, vf, mtu=1400)
    rep = vf["representor"]
    before = representor_state(rep)
    for _ in range(20):
        ns = netns_factory()
        cid = new_cid()
        assert off.add(conf, ns, cid).code == 0
        assert off.call("DEL", conf, cid, ns.path).code == 0
        assert representor_state(rep) == before
