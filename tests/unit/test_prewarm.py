"""Pre-warm's pure parts: cookies, a pair's OpenFlow operations, what the cluster store may
hold, and the warm frames (each must be dropped by the peer's kernel, never delivered). GC,
DEL and re-warm against a real switch: tests/integration/test_prewarm.py."""

from __future__ import annotations

import json
import struct

import pytest

from tenantnet.plugin.drivers import prewarm
from tenantnet.plugin.drivers.ovs import OvsPlan
from tenantnet.plugin.records import PHASE_READY, AttachmentRecord
from tenantnet.plugin.system import openflow, warmframes
from tenantnet.plugin.system.openflow import AddRule, DeleteStrict, Rule

A = "0a:58:0a:00:00:01"
B = "0a:58:0a:00:00:02"


def test_cookies_name_the_network_the_source_and_the_destination():
    a = prewarm.ident_of("rail0", "c" * 64, "net1")
    b = prewarm.ident_of("rail0", "d" * 64, "net2")
    assert a >> 48 == 0x746E  # "tn": every delete is masked to it
    assert a & prewarm.NETWORK_MASK == b & prewarm.NETWORK_MASK
    assert a & prewarm.NETWORK_MASK != prewarm.ident_of("rail1", "c" * 64, "net1") & prewarm.NETWORK_MASK
    assert a != prewarm.ident_of("rail0", "c" * 64, "net2")
    assert a & prewarm.DESTINATION_MASK == 0  # an identity sits where a rule's source goes
    cookie = prewarm.pair_cookie(a, b)
    assert prewarm.source_ident(cookie) == a and prewarm.destination_ident(cookie) == b
    assert prewarm.pair_cookie(b, a) != cookie
    # The (cookie, mask) of "rules from a" matches a->b and not b->a; "rules to a" the reverse.
    value, mask = prewarm.from_ident(a)
    assert cookie & mask == value and prewarm.pair_cookie(b, a) & mask != value
    value, mask = prewarm.to_ident(a)
    assert prewarm.pair_cookie(b, a) & mask == value and cookie & mask != value
    value, mask = prewarm.network_cookie("rail0")
    assert value == a & ~0xFFFFFFFF and mask == 0xFFFFFFFF00000000
    assert prewarm.OURS == "cookie=0x746e000000000000/0xffff000000000000"


def test_a_pairs_ops_delete_only_our_own_identical_rule_then_add_with_check_overlap():
    a = prewarm.End(prewarm.ident_of("n", "a", "net1"), "tna", 3, A, "/run/netns/a", "net1", False)
    b = prewarm.End(prewarm.ident_of("n", "b", "net1"), "tnb", 4, B, "/run/netns/b", "net1", False)
    legacy, delete, add = a.ops(b)
    # Strict, with any cookie of ours: only our twin — of either shape, the one an older
    # version wrote (no VLAN_VID match) and the current one.
    assert legacy == DeleteStrict(prewarm.TN, 1, 3, A, B, None, prewarm.TN_MASK)
    assert delete == DeleteStrict(prewarm.TN, 1, 3, A, B, openflow.OFPVID_NONE, prewarm.TN_MASK)
    # Only frames without an 802.1Q header: a tagged one meets NORMAL, which drops it on an access port.
    cookie = prewarm.pair_cookie(a.ident, b.ident)
    assert add == AddRule(Rule(cookie, 1, 3, A, B, 4, openflow.OFPVID_NONE), check_overlap=True)
    assert "in_port=3,dl_src=0a:58:0a:00:00:01,dl_dst=0a:58:0a:00:00:02,vlan_vid=none,actions=output:4" \
        in openflow._describe(add)


def _live(ofport: int, mac: str, network: str = "n", vlan: int | None = 100) -> prewarm._Live:
    return prewarm._Live(ofport, mac, network, vlan)


def test_a_rule_is_backed_only_by_both_ends_live_on_its_very_ports():
    a, b = prewarm.ident_of("n", "a", "net1"), prewarm.ident_of("n", "b", "net1")
    rule = Rule(prewarm.pair_cookie(a, b), 1, 3, A, B, 4, openflow.OFPVID_NONE)
    live = {a: [_live(3, A)], b: [_live(4, B)]}
    assert prewarm._backed(rule, live)
    # The destination's port now has another number (deleted, and 4 given to someone else).
    assert not prewarm._backed(rule, {a: [_live(3, A)], b: [_live(7, B)]})
    # The destination gone (or removing: sweep leaves such records out) — whoever has its MAC.
    assert not prewarm._backed(rule, {a: [_live(3, A)]})
    assert not prewarm._backed(rule, {a: [_live(3, A)], prewarm.ident_of("m", "x", "net1"): [_live(4, B, "m")]})
    # Another MAC on the destination's port, another VLAN, another source port.
    assert not prewarm._backed(rule, {a: [_live(3, A)], b: [_live(4, "0a:58:0a:00:00:09")]})
    assert not prewarm._backed(rule, {a: [_live(3, A)], b: [_live(4, B, vlan=200)]})
    assert not prewarm._backed(rule, {a: [_live(5, A)], b: [_live(4, B)]})
    # Older shapes: no VLAN_VID match, another priority, actions other than one output.
    for old in (Rule(rule.cookie, 1, 3, A, B, 4), Rule(rule.cookie, 2, 3, A, B, 4, openflow.OFPVID_NONE),
                Rule(rule.cookie, 1, 3, A, B, 0, openflow.OFPVID_NONE)):
        assert not prewarm._backed(old, live)
    # Two attachments sharing a 16-bit identity: kept while one of them matches exactly.
    assert prewarm._backed(rule, {a: [_live(3, A)], b: [_live(9, B), _live(4, B)]})


def test_only_well_formed_published_peers_are_used():
    base = "/tenantnet/prewarm/"
    ok = prewarm._published(json.dumps({"mac": A.upper(), "vlan": 100}).encode(), base + "rail/node2/c/net1", base)
    assert ok == prewarm.Published(base + "rail/node2/c/net1", "rail", "node2", A, 100)
    for value, key in ((b"{not json", "rail/n/c/i"), (json.dumps({"mac": "ff"}).encode(), "rail/n/c/i"),
                       (json.dumps({"mac": A, "vlan": "100"}).encode(), "rail/n/c/i"),
                       (json.dumps({"mac": A}).encode(), "rail/n/c"),
                       (json.dumps({"vlan": 1}).encode(), "rail/n/c/i"),
                       (json.dumps({"mac": "ff:ff:ff:ff:ff:ff", "vlan": 1}).encode(), "rail/n/c/i"),
                       (json.dumps({"mac": "01:00:5e:00:00:01"}).encode(), "rail/n/c/i"),
                       (json.dumps({"mac": A, "vlan": True}).encode(), "rail/n/c/i"),
                       (json.dumps({"mac": A, "vlan": 5000}).encode(), "rail/n/c/i")):
        assert prewarm._published(value, base + key, base) is None


def test_the_pod_interface_is_read_from_the_result():
    rec = AttachmentRecord(network="n", container_id="c", ifname="net1", mode="ovs", phase=PHASE_READY,
                           plan=OvsPlan(host_ifname="tn0", prewarm="warm"),
                           result={"interfaces": [{"name": "tn0", "mac": "aa:aa:aa:aa:aa:aa"},
                                                  {"name": "net1", "mac": A.upper(), "sandbox": "/run/netns/x"}],
                                   "ips": [{"address": "10.0.0.2/24", "interface": 1},
                                           {"address": "fd00::2/64", "interface": 1}]})
    assert prewarm._pod_interface(rec) == (A, True)
    rec.result = {"interfaces": [{"name": "net1", "mac": A, "sandbox": "/x"}], "ips": [
        {"address": "10.0.0.2/24", "interface": 0}]}
    assert prewarm._pod_interface(rec) == (A, False)
    rec.result = None
    assert prewarm._pod_interface(rec) is None
    assert prewarm.enabled(OvsPlan(prewarm="pending")) and not prewarm.enabled(OvsPlan())


def _ones_complement(data: bytes) -> int:
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


@pytest.mark.parametrize("ethertype", [warmframes.ETH_P_IP, warmframes.ETH_P_ARP, warmframes.ETH_P_IPV6])
def test_warm_frames_are_addressed_minimum_size_and_undeliverable(ethertype):
    frame = warmframes.frame(A, B, ethertype)
    assert frame[:6] == bytes.fromhex(B.replace(":", "")) and frame[6:12] == bytes.fromhex(A.replace(":", ""))
    assert struct.unpack("!H", frame[12:14])[0] == ethertype and len(frame) >= 60
    body = frame[14:]
    if ethertype == warmframes.ETH_P_IP:
        header = body[:20]
        assert header[0] == 0x45 and struct.unpack("!H", header[2:4])[0] <= len(body)
        assert _ones_complement(header) != 0xFFFF  # a valid header sums to 0xffff: this one must not
        assert header[6] & 0x20 == 0 and struct.unpack("!H", header[6:8])[0] & 0x1FFF == 0  # not a fragment
    elif ethertype == warmframes.ETH_P_ARP:
        assert body[4] == 0  # hardware address length 0: arp_rcv drops it
    else:
        assert body[0] >> 4 == 6 and body[6] == 59 and body[24:40] == bytes(16)  # no next header, to ::
    assert warmframes.MARK in frame or ethertype == warmframes.ETH_P_ARP


def test_macs_are_checked():
    with pytest.raises(ValueError):
        warmframes.frame("not-a-mac", B, warmframes.ETH_P_IP)


def test_mgmt_target_is_next_to_the_ovsdb_socket(tmp_path):
    (tmp_path / "br0.mgmt").touch()
    assert openflow.mgmt_target(f"unix:{tmp_path}/db.sock", "br0") == f"unix:{tmp_path}/br0.mgmt"
    assert openflow.mgmt_target(f"unix:{tmp_path}/db.sock", "br1") == "br1"
    assert openflow.mgmt_target("tcp:10.0.0.1:6640", "br0") == "br0"
