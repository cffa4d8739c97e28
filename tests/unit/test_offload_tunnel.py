"""The offload report's overlay flows: an ovs-offload pod's Geneve encap (the kernel
datapath's `set(tunnel(...))`, the userspace one's `tnl_push(...)`) and decap flows are the
pod's, counted and labelled; other flows are not labelled. The lab (tests/integration/
test_overlay_offload.py) shows the userspace form live; the kernel/tc form only as text here."""

from __future__ import annotations

from tenantnet.ops.flowreport import render
from tenantnet.ops.flowreport.report import build_report, snapshot_from_text, tunnel_role, view_of
from tenantnet.plugin.drivers.ovs_offload import OffloadPlan
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import AttachmentRecord, PodRef
from tenantnet.plugin.system.dpflows import parse_flow_line

# Kernel datapath with tc offload, rep = the pod's representor (port 5), genev_sys_6081 port 7.
TC_DUMP = (
    "ufid:1111aaaa-0000-0000-0000-000000000001, recirc_id(0),dp_hash(0/0),skb_priority(0/0),in_port(rep0),"
    "skb_mark(0/0),ct_state(0/0),eth(src=0a:00:00:00:00:01,dst=0a:00:00:00:00:02),eth_type(0x0800),"
    "ipv4(frag=no), packets:120, bytes:11760, used:0.2s, offloaded:yes, dp:tc, "
    "actions:set(tunnel(tun_id=0x1,dst=192.168.101.2,ttl=64,tp_dst=6081,"
    "geneve({class=0x102,type=0x80,len=4,0x10002}),flags(df|csum|key))),genev_sys_6081\n"
    "ufid:2222bbbb-0000-0000-0000-000000000002, tunnel(tun_id=0x1,src=192.168.101.2,dst=192.168.101.1,"
    "geneve({class=0x102,type=0x80,len=4,0x20001/0x7fffffff}),flags(+key)),recirc_id(0),"
    "in_port(genev_sys_6081),eth(src=0a:00:00:00:00:02,dst=0a:00:00:00:00:01),eth_type(0x0800),"
    "ipv4(frag=no), packets:118, bytes:11564, used:0.2s, offloaded:yes, dp:tc, actions:rep0\n"
    "ufid:3333cccc-0000-0000-0000-000000000003, recirc_id(0),in_port(rep0),eth_type(0x0806), "
    "packets:2, bytes:84, used:3.0s, dp:ovs, actions:userspace(pid=1,controller(reason=1))\n"
)


def offload_view(port: str = "rep0"):  # type: ignore[no-untyped-def]
    rec = AttachmentRecord(network="blue", container_id="c" * 64, ifname="net1", mode="ovs-offload",
                           phase="ready", pod=PodRef("team-a", "p"),
                           plan=OffloadPlan(representor=port, bridge="br-int", overlay_port="tnx.node1"))
    return view_of(rec)


def test_kernel_encap_and_decap_flows_are_the_pods_and_labelled() -> None:
    rep = build_report(None, snapshot_from_text(TC_DUMP), [offload_view()])
    (a,) = rep.attachments
    roles = {r.flow.ufid[:4]: (r.direction, r.tunnel) for r in a.flows}
    assert roles == {"1111": ("in", "geneve encap"), "2222": ("out", "geneve decap"), "3333": ("in", None)}
    assert a.tunnel_totals == {"encap": {"flows": 1, "packets": 120, "hwFlows": 1},
                               "decap": {"flows": 1, "packets": 118, "hwFlows": 1}}
    d = a.to_dict()
    assert d["tunnel"]["decap"]["packets"] == 118 and [f["tunnel"] for f in d["flows"]].count(None) == 1
    table = render.render_table(rep)
    assert "tunnel (geneve): encap 1 flows (120 packets, 1 in hardware), decap 1 flows (118 packets" in table
    assert "[geneve encap] set(tunnel(" in table
    assert rep.simulation is False and "simulation" not in table  # a real (tc) node is no simulation


def test_userspace_tnl_push_and_other_tunnels() -> None:
    push = parse_flow_line(
        "recirc_id(0),in_port(rep0),packet_type(ns=0,id=0),eth_type(0x0800),ipv4(frag=no), packets:4, "
        "bytes:392, used:0.5s, actions:tnl_push(tnl_port(genev_sys_6081),header(size=58,type=5,"
        "eth(dst=aa:bb:cc:dd:ee:ff,src=aa:bb:cc:dd:ee:00,dl_type=0x0800),ipv4(src=192.168.101.1,"
        "dst=192.168.101.2,proto=17,tos=0,ttl=64,frag=0x4000),udp(src=0,dst=6081,csum=0x0),"
        "geneve(crit,vni=0x1,options({class=0x102,type=0x80,len=4,0x10002}))),out_port(br-rail1))")
    assert tunnel_role(push) == "geneve encap"
    vxlan = parse_flow_line("tunnel(tun_id=0x5,src=10.0.0.2,dst=10.0.0.1,tp_dst=4789,flags(+key)),"
                            "in_port(vxlan_sys_4789),eth_type(0x0800), packets:1, bytes:98, used:1.0s, actions:3")
    assert tunnel_role(vxlan) == "vxlan decap"
    plain = parse_flow_line("in_port(rep0),eth_type(0x0800), packets:1, bytes:98, used:1.0s, actions:2")
    assert tunnel_role(plain) is None


def test_lab_nic_marks_the_report_a_simulation() -> None:
    node = NodeConfig(vf_control="lab:/tmp/somelab")
    rep = build_report(node, snapshot_from_text(TC_DUMP, dp_type="netdev", dp_name="netdev@ovs-netdev"),
                       [offload_view()])
    assert rep.software_only is False and rep.simulation is True and rep.to_dict()["simulation"] is True
    assert "NOTE: a simulation" in render.render_table(rep)
