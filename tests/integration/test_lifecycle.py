"""ADD / DEL / CHECK / GC / STATUS against a real OVS, real netns and Debian's host-local."""

from __future__ import annotations

import json

from tests.integration.conftest import new_cid


def pod_link(ns, ifname="net1"):
    out = ns.run("ip", "-j", "addr", "show", "dev", ifname)
    return json.loads(out.stdout)[0] if out.returncode == 0 else None


def test_add_creates_port_link_and_addresses(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(mtu=1400, mac="02:11:22:33:44:55")
    inv = plugin.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    res = inv.out
    host, pod = res["interfaces"]
    assert host["name"].startswith("tn") and len(host["name"]) <= 15
    assert pod == {"name": "net1", "mac": "02:11:22:33:44:55", "sandbox": ns.path}
    assert res["ips"][0]["address"].startswith("10.77.0.") and res["ips"][0]["interface"] == 1
    link = pod_link(ns)
    assert link["mtu"] == 1400 and link["address"] == "02:11:22:33:44:55"
    assert any(a["local"] == res["ips"][0]["address"].split("/")[0] for a in link["addr_info"])
    port = json.loads(lab.vsctl("--format=json", "--columns=name,tag,external_ids", "find", "Port",
                                f"name={host['name']}"))["data"][0]
    assert port[1] == 100
    ids = dict(port[2][1])
    assert ids["tenantnet-owner"] == "tenantnet" and ids["tenantnet-container-id"] == cid
    assert ids["tenantnet-ifname"] == "net1" and ids["tenantnet-pod-namespace"] == "ns1"
    assert ids["tenantnet-pod-name"] == "pod1" and ids["tenantnet-network"] == "testnet"
    mtu_request = lab.vsctl("get", "Interface", host["name"], "mtu_request").strip()
    assert mtu_request == "1400"  # requested in the same transaction as the port
    assert plugin.call("DEL", conf, cid, ns.path).code == 0


def test_add_is_idempotent(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf()
    first = plugin.add(conf, ns, cid)
    second = plugin.add(conf, ns, cid)
    assert first.code == second.code == 0
    assert first.out == second.out
    assert len(lab.owned_ports()) == 1 and len(lab.allocations()) == 1 and len(lab.records()) == 1
    assert plugin.call("DEL", conf, cid, ns.path).code == 0


def test_double_del_and_del_without_netns(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf()
    assert plugin.add(conf, ns, cid).code == 0
    # containerd: DEL with netns and prevResult, then DEL again with CNI_NETNS="" and no prevResult
    add = plugin.add(conf, ns, cid)  # repeated ADD returns the recorded result
    first = plugin.call("DEL", {**conf, "prevResult": add.out}, cid, ns.path)
    assert first.code == 0, first.stdout
    second = plugin.call("DEL", conf, cid, "")
    assert second.code == 0 and second.stdout == ""
    assert pod_link(ns) is None


def test_del_with_empty_netns_cleans_everything(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf()
    assert plugin.add(conf, ns, cid).code == 0
    assert plugin.call("DEL", conf, cid, "").code == 0
    assert pod_link(ns) is None


def test_del_after_netns_was_destroyed(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf()
    assert plugin.add(conf, ns, cid).code == 0
    ns.delete()
    inv = plugin.call("DEL", conf, cid, ns.path)
    assert inv.code == 0, inv.stdout


def test_del_without_record_still_cleans(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf()
    assert plugin.add(conf, ns, cid).code == 0
    for rec in lab.records():
        rec.unlink()
    assert plugin.call("DEL", conf, cid, ns.path).code == 0
    assert pod_link(ns) is None


def test_del_of_unknown_attachment_succeeds(lab, plugin, no_leftovers):
    inv = plugin.call("DEL", plugin.conf(), new_cid(), "")
    assert inv.code == 0 and inv.stdout == ""


def test_check_passes_then_names_drift(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(mtu=1450)
    add = plugin.add(conf, ns, cid)
    assert add.code == 0
    checked = {**conf, "prevResult": add.out}
    ok = plugin.call("CHECK", checked, cid, ns.path)
    assert ok.code == 0 and ok.stdout == "", ok.stdout
    host = add.out["interfaces"][0]["name"]
    lab.vsctl("set", "Port", host, "tag=300")
    addr = add.out["ips"][0]["address"]
    ns.run("ip", "addr", "del", addr, "dev", "net1", check=True)
    bad = plugin.call("CHECK", checked, cid, ns.path)
    assert bad.out["code"] == 103
    assert f"OVS port {host} has tag 300, expected 100" in bad.out["msg"]
    assert f"net1 lacks address {addr}" in bad.out["msg"]
    assert plugin.call("DEL", conf, cid, ns.path).code == 0


def test_check_needs_prev_result_and_a_record(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    conf = plugin.conf()
    inv = plugin.call("CHECK", conf, new_cid(), ns.path)
    assert inv.out["code"] == 7 and "prevResult" in inv.out["msg"]
    inv = plugin.call("CHECK", {**conf, "prevResult": {"cniVersion": "1.0.0"}}, new_cid(), ns.path)
    assert inv.out["code"] == 3 and "no attachment recorded" in inv.out["msg"]
    old = plugin.call("CHECK", {**conf, "cniVersion": "0.3.1", "prevResult": {}}, new_cid(), ns.path)
    assert old.out["code"] == 1 and "does not allow CHECK" in old.out["msg"]


def test_gc_releases_everything_not_listed(lab, plugin, netns_factory, no_leftovers):
    conf = plugin.conf()  # Debian's host-local 1.1.1 does not accept cniVersion 1.1.0
    ns1, ns2, ns3 = netns_factory(), netns_factory(), netns_factory()
    keep_cid, drop_cid, orphan_cid = new_cid(), new_cid(), new_cid()
    assert plugin.add(conf, ns1, keep_cid).code == 0
    assert plugin.add(conf, ns2, drop_cid).code == 0
    assert plugin.add(conf, ns3, orphan_cid).code == 0
    # An orphan: the record is lost, only the OVS port's ownership tags remain.
    for rec in lab.records():
        if orphan_cid in str(rec):
            rec.unlink()
    gc = {**conf, "cniVersion": "1.1.0",
          "cni.dev/valid-attachments": [{"containerID": keep_cid, "ifname": "net1"}]}
    inv = plugin.raw(plugin.env("GC", netns=None, cni_args=""), json.dumps(gc))
    assert inv.code == 0, inv.stdout
    assert len(lab.owned_ports()) == 1 and len(lab.records()) == 1
    assert pod_link(ns1) is not None and pod_link(ns2) is None and pod_link(ns3) is None
    # host-local cannot GC (Debian ships 1.1.1); the orphan's address is released by DEL below.
    assert plugin.call("DEL", conf, keep_cid, ns1.path).code == 0
    assert plugin.call("DEL", conf, orphan_cid, "").code == 0


def test_gc_with_older_key(lab, plugin, netns_factory, no_leftovers):
    conf = plugin.conf()
    ns = netns_factory()
    cid = new_cid()
    assert plugin.add(conf, ns, cid).code == 0
    inv = plugin.raw(plugin.env("GC", netns=None, cni_args=""),
                     json.dumps({**conf, "cniVersion": "1.1.0", "cni.dev/attachments": []}))
    assert inv.code == 0, inv.stdout
    assert lab.owned_ports() == [] and lab.records() == [] and lab.allocations() == []


def test_status_ok_and_50_when_ovsdb_unreachable(lab, plugin, tmp_path):
    conf = plugin.conf(cniVersion="1.1.0")
    ok = plugin.raw(plugin.env("STATUS", netns=None, cni_args=""), json.dumps(conf))
    assert ok.code == 0 and ok.stdout == ""
    bad = plugin.raw(plugin.env("STATUS", netns=None, cni_args=""),
                     json.dumps({**conf, "socket_file": f"unix:{tmp_path}/nothing.sock"}))
    assert bad.code == 1 and bad.out["code"] == 50
    assert "nothing.sock" in bad.out["msg"]


def test_add_with_ovsdb_unreachable_is_try_again_and_leaves_nothing(lab, plugin, netns_factory,
                                                                     tmp_path, no_leftovers):
    ns = netns_factory()
    node = tmp_path / "node.yaml"  # a NAD may name only endpoints the node config allows
    node.write_text(lab.node_config.read_text() + f"ovsdbEndpoints: [unix:{tmp_path}/nothing.sock]\n")
    plugin.extra_env["TENANTNET_CONFIG"] = str(node)
    conf = plugin.conf(socket_file=f"unix:{tmp_path}/nothing.sock")
    inv = plugin.add(conf, ns)
    assert inv.out["code"] == 11 and "nothing.sock" in inv.out["msg"]
    assert pod_link(ns) is None


def test_unknown_bridge_is_code_7_and_leaves_nothing(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    inv = plugin.add(plugin.conf(bridge="br-missing"), ns)
    assert inv.out["code"] == 7 and "bridge='br-missing'" in inv.out["msg"]
    assert pod_link(ns) is None


def test_trunk_port_and_mac_from_cni_args(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(vlan=None, trunk=[{"id": 10}, {"minID": 20, "maxID": 22}])
    inv = plugin.add(conf, ns, cid, cni_args="IgnoreUnknown=1;MAC=02:aa:bb:cc:dd:ee")
    assert inv.code == 0, inv.stdout
    host = inv.out["interfaces"][0]["name"]
    assert lab.vsctl("get", "Port", host, "trunks").strip() == "[10, 20, 21, 22]"
    assert inv.out["interfaces"][1]["mac"] == "02:aa:bb:cc:dd:ee"
    assert plugin.call("DEL", conf, cid, ns.path).code == 0


def test_failed_ipam_rolls_back_the_port(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    conf = plugin.conf(ipam={"type": "host-local", "ranges": "not-a-list",
                             "dataDir": str(lab.hostlocal_dir)})
    inv = plugin.add(conf, ns)
    assert inv.code != 0 and "IPAM plugin host-local ADD failed" in inv.out["msg"]
    assert pod_link(ns) is None


def test_two_interfaces_in_one_pod(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    a = plugin.conf(name="net-a")
    b = plugin.conf(name="net-b", vlan=200)
    assert plugin.add(a, ns, cid, "net1").code == 0
    assert plugin.add(b, ns, cid, "net2").code == 0
    assert pod_link(ns, "net1") and pod_link(ns, "net2")
    assert plugin.call("DEL", b, cid, ns.path, "net2").code == 0
    assert plugin.call("DEL", a, cid, ns.path, "net1").code == 0


def test_ipam_refusing_the_version_rolls_back_cleanly(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    inv = plugin.add(plugin.conf(cniVersion="1.1.0"), ns)  # host-local 1.1.1 refuses 1.1.0
    assert inv.out["code"] == 1 and "IPAM plugin host-local ADD failed" in inv.out["msg"]
    assert pod_link(ns) is None


def test_unwritable_state_dir_is_io_failure_and_touches_nothing(lab, plugin, netns_factory, tmp_path):
    blocked = tmp_path / "state-is-a-file"
    blocked.write_text("not a directory")
    node = tmp_path / "node.yaml"
    node.write_text(f"ovsdb: {lab.ovsdb}\nstateDir: {blocked}\nlogFile: {tmp_path}/log\n"
                    f"ipamDataDirs: [{lab.hostlocal_dir}]\n")
    plugin.extra_env["TENANTNET_CONFIG"] = str(node)
    ns = netns_factory()
    inv = plugin.add(plugin.conf(), ns)
    assert inv.out["code"] == 5 and str(blocked) in inv.out["msg"]
    assert pod_link(ns) is None and lab.owned_ports() == []
