"""Offload observability without root: parsers on every sample, classification, shares,
findings, the Prometheus text (parsed back by a small exposition-format parser below),
the /metrics server on loopback, the CLI's argument handling."""

from __future__ import annotations

import argparse
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenantnet.ops.flowreport import cli, render
from tenantnet.ops.flowreport.report import (
    FINDING_SOURCES,
    Finding,
    attach_flows,
    build_report,
    register_finding_source,
    snapshot_from_text,
    summarize,
    view_of,
)
from tenantnet.ops.flowreport.server import MetricsServer, parse_listen
from tenantnet.ops.flowreport.tc import parse_tc_filters
from tenantnet.plugin.drivers.ovs import OvsPlan
from tenantnet.plugin.drivers.ovs_offload import OffloadPlan
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import AttachmentRecord, Plan, PodRef
from tenantnet.plugin.system import dpctl as source
from tenantnet.plugin.system.dpflows import (
    OFFLOADED,
    PARTIAL,
    SOFTWARE,
    UNKNOWN,
    action_outputs,
    parse_dpctl_show,
    parse_dump_dps,
    parse_dump_flows,
    parse_flow_line,
    resolve_ports,
)
from tenantnet.plugin.tenancy import parse_policy

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "offload"


def sample(name: str) -> str:
    return (FIX / name).read_text()


# ---- a small parser of the Prometheus text exposition format 0.0.4 -------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)]; asserts HELP/TYPE precede samples and the syntax holds."""
    assert text.endswith("\n")
    typed: dict[str, str] = {}
    helped: set[str] = set()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped")
            typed[name] = kind
            out.setdefault(name, [])
            continue
        assert not line.startswith("#") and line.strip(), f"bad line {line!r}"
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, body, value = m.groups()
        assert name in typed and name in helped, f"{name} has no TYPE/HELP before its samples"
        labels: dict[str, str] = {}
        pos = 0
        while body and pos < len(body):
            lm = _LABEL.match(body, pos)
            assert lm, f"bad labels in {line!r}"
            raw = lm.group(2)
            labels[lm.group(1)] = re.sub(r"\\(.)", lambda x: {"n": "\n"}.get(x.group(1), x.group(1)), raw)
            pos = lm.end()
        out[name].append((labels, float(value)))
    return out


# ---- parsers on the samples ------------------------------------------------------------------

def test_dump_flows_m_tc_sample():
    dump = parse_dump_flows(sample("dump-flows-m-tc.txt"))
    assert dump.skipped == []
    assert len(dump.flows) == 4
    f0, f1, arp, vlan = dump.flows
    assert f0.ufid == "2f6c1d0e-58b1-4c7a-9e41-0a7c3b9d5e11"
    assert (f0.in_port, f0.outputs, f0.packets, f0.bytes, f0.used) == ("eth2", ["eth3"], 1287340, 1902315220, 0.31)
    assert (f0.offloaded, f0.dp, f0.classification) == ("yes", "tc", OFFLOADED)
    assert f1.classification == OFFLOADED and f1.in_port == "eth3"
    assert arp.classification == SOFTWARE and arp.dp == "ovs" and arp.offloaded is None
    assert arp.outputs == ["p0", "eth3"]  # push_vlan(...) and pop_vlan are not outputs
    assert vlan.flags == "P." and vlan.classification == OFFLOADED
    assert vlan.match["vlan"] == "vid=100,pcp=0" and vlan.match["eth_type"] == "0x8100"
    assert vlan.match["encap"].startswith("eth_type(0x0800)")


def test_dump_flows_m_partial_and_doca_sample():
    dump = parse_dump_flows(sample("dump-flows-m-partial.txt"))
    assert dump.skipped == []
    dpdk, doca = dump.flows
    assert (dpdk.offloaded, dpdk.dp, dpdk.classification) == ("partial", "ovs", PARTIAL)
    assert (doca.offloaded, doca.dp, doca.classification) == ("yes", "doca", OFFLOADED)
    assert doca.in_port == "pf0vf0" and doca.outputs == ["pf0vf1"] and doca.used == 0.18


def test_dump_flows_type_offloaded_short_form():
    text = sample("dump-flows-type-offloaded.txt")
    short = parse_dump_flows(text)
    assert [f.classification for f in short.flows] == [UNKNOWN, UNKNOWN]  # no dp/offloaded: no guess
    dump = parse_dump_flows(text, assume_offloaded=True)
    assert [f.classification for f in dump.flows] == [OFFLOADED, OFFLOADED]
    assert dump.flows[0].ufid is None and dump.flows[0].in_port == "4" and dump.flows[0].outputs == ["5"]
    resolve_ports(dump.flows, {"4": "eth2", "5": "eth3"})
    assert (dump.flows[0].in_port, dump.flows[0].outputs) == ("eth2", ["eth3"])


def test_lab_sample_is_software():
    dump = parse_dump_flows(sample("dump-flows-m-lab.txt"))
    assert dump.flows and dump.skipped == []
    assert {f.dp for f in dump.flows} == {"ovs"}
    assert {f.classification for f in dump.flows} == {SOFTWARE}
    ports = parse_dpctl_show(sample("dpctl-show-lab.txt"))
    assert "0" in ports and all(v for v in ports.values())


def test_tc_without_offloaded_is_software_not_hardware():
    # OVS prints offloaded:yes whenever tc reports the rule in hardware (lib/dpctl.c,
    # netdev-offload-tc.c); a dp:tc line without it is a not_in_hw rule: tc software.
    line = sample("dump-flows-m-tc.txt").splitlines()[0].replace(" offloaded:yes,", "")
    flow = parse_flow_line(line)
    assert flow.dp == "tc" and flow.offloaded is None
    assert flow.classification == SOFTWARE and "not in hardware" in flow.reason


def test_dp_extra_info_after_actions_and_unknown_fields():
    line = sample("dump-flows-m-partial.txt").splitlines()[0] + ", dp-extra-info:miniflow_bits(4,1)"
    flow = parse_flow_line(line)
    assert flow.actions == "dpdk-vf1" and flow.extra["dp-extra-info"] == "miniflow_bits(4,1)"
    line2 = sample("dump-flows-m-tc.txt").splitlines()[0].replace(", dp:tc,", ", dp:tc, newfield:42,")
    flow2 = parse_flow_line(line2)
    assert flow2.extra == {"newfield": "42"} and flow2.classification == OFFLOADED


def test_used_never_and_headers():
    text = "flow-dump from the main thread:\n" + sample("dump-flows-type-offloaded.txt").replace(
        "used:0.310s", "used:never", 1)
    dump = parse_dump_flows(text)
    assert dump.skipped == [] and dump.flows[0].used is None and dump.flows[1].used == 0.31


def test_malformed_lines_are_skipped_and_counted():
    dump = parse_dump_flows(sample("dump-flows-malformed.txt"))
    good = parse_dump_flows(sample("dump-flows-m-tc.txt"))
    assert len(dump.flows) == 1 and dump.flows[0].ufid == good.flows[0].ufid
    assert len(dump.skipped) >= 5
    assert all(s.why for s in dump.skipped)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("abc(),:= 0123456789.\n") + [
    "packets:", "bytes:", "actions:", "used:", "dp:", "offloaded:", ", ", "ufid:", "in_port("]),
    max_size=80).map("".join))
def test_parser_never_raises(text):
    dump = parse_dump_flows(text)
    assert len(dump.flows) + len(dump.skipped) <= text.count("\n") + 1


def test_action_outputs():
    assert action_outputs("push_vlan(vid=100,pcp=0),p0,pop_vlan,eth3") == ["p0", "eth3"]
    assert action_outputs("drop") == []
    assert action_outputs("ct(zone=5),recirc(0x1)") == []
    assert action_outputs("clone(tnl_push(header(...)),out_port(3)),2") == ["2"]
    assert action_outputs("check_pkt_len(size=200,gt(4),le(5))") == ["4", "5"]


def test_dump_dps():
    assert parse_dump_dps("dummy@ovs-dummy\n") == [("dummy", "dummy@ovs-dummy")]
    assert parse_dump_dps("system@ovs-system\nnetdev@ovs-netdev\n")[1] == ("netdev", "netdev@ovs-netdev")


def test_tc_filter_sample():
    rules = parse_tc_filters(sample("tc-filter-show-in-hw.txt"))
    assert len(rules) == 2
    hw, sw = rules
    assert (hw.protocol, hw.pref, hw.kind, hw.chain, hw.handle) == ("ip", 2, "flower", 0, "0x1")
    assert hw.in_hw is True and hw.in_hw_count == 1
    assert hw.match["dst_mac"] == "02:00:0a:00:64:03"
    assert (hw.packets, hw.hw_packets, hw.actions[0].sw_packets) == (1287340, 1287340, 0)
    assert sw.in_hw is False and sw.packets == 3 and sw.hw_packets is None and sw.protocol == "arp"
    assert parse_tc_filters("garbage\n\tSent 1 bytes 2 pkt\nfilter\n") == []


# ---- report -------------------------------------------------------------------------------

def record(ns: str, name: str, port: str, mode: str = "ovs", network: str = "rail-1",
           representor: bool = False) -> AttachmentRecord:
    plan: Plan = OffloadPlan(representor=port, bridge="br0") if representor else OvsPlan(host_ifname=port,
                                                                                         bridge="br0")
    return AttachmentRecord(network=network, container_id="c" * 64 + port, ifname="net1", mode=mode,
                            phase="ready", pod=PodRef(ns, name), plan=plan)


POLICY = parse_policy({"networks": {"rail-1": {"bridge": "br-rail1"}},
                       "tenants": {"a": {"namespaces": ["team-a"], "networks": {"rail-1": {"vlans": [100]}}}}}, "t")


def tc_report(other_config=None, mode="ovs-offload", sources=()):
    snap = snapshot_from_text(sample("dump-flows-m-tc.txt"), other_config=other_config)
    views = [view_of(record("team-a", "p2", "eth2", mode, representor=mode == "ovs-offload"), POLICY),
             view_of(record("team-b", "p3", "eth3", mode), POLICY),
             view_of(record("team-a", "dpdk", "", "sriov"), POLICY)]
    views[2].port = None
    return build_report(None, snap, views, sources)


def test_report_flows_per_attachment_and_shares():
    rep = tc_report({"hw-offload": "true"})
    a, b, vf = rep.attachments
    assert a.tenant == "a" and b.tenant is None and a.port == a.representor == "eth2"
    # eth2: in_port of flows 0 and 2 (arp), output of flows 1 and 3
    assert sorted((r.flow.ufid[:4], r.direction) for r in a.flows) == [
        ("2f6c", "in"), ("5a0e", "out"), ("8d41", "out"), ("c3b9", "in")]
    t = a.totals
    assert (t[OFFLOADED]["flows"], t[SOFTWARE]["flows"]) == (3, 1)
    assert a.packets == 1287340 + 961102 + 3 + 20417
    assert a.hw_flow_share == 0.75
    assert a.hw_packet_share == pytest.approx((a.packets - 3) / a.packets)
    assert [r.flow.ufid[:4] for r in b.flows] == ["2f6c", "8d41", "c3b9"]
    assert vf.flows == [] and vf.hw_packet_share is None
    codes = {f.code for f in rep.findings}
    assert "flows-not-offloaded" in codes and "hw-offload-off" not in codes
    assert rep.tenants()["a"]["attachments"] == 2


def test_summary_for_check():
    rep = tc_report({"hw-offload": "true"})
    s = summarize(rep.attachments[0], rep.snapshot)
    assert s.carries_traffic and s.in_hardware and not s.require_failed()
    assert "3 in hardware" in s.message()
    lab = snapshot_from_text(sample("dump-flows-m-lab.txt"), dp_type="dummy", dp_name="dummy@ovs-dummy",
                             ports=parse_dpctl_show(sample("dpctl-show-lab.txt")))
    port = next(f.in_port for f in lab.datapaths[0][1] if f.in_port.startswith("tn"))
    view = view_of(record("x", "y", port))
    attach_flows([view], lab)
    ls = summarize(view, lab)
    assert ls.carries_traffic and ls.require_failed() and ls.software_only
    assert "lab's userspace datapath" in ls.message()


@pytest.mark.parametrize("cfg,code,severity", [
    ({}, "hw-offload-off", "warning"),
    ({"hw-offload": "false", "tc-policy": "skip_sw"}, "tc-policy-ignored", "info"),
    ({"hw-offload": "true", "tc-policy": "skip_hw"}, "tc-policy-skip-hw", "warning"),
    ({"hw-offload": "true", "tc-policy": "skip_sw"}, "tc-policy-skip-sw", "info"),
])
def test_node_findings(cfg, code, severity):
    rep = tc_report(cfg)
    found = [f for f in rep.findings if f.code == code]
    assert found and found[0].severity == severity and found[0].fix


def test_hw_offload_off_is_info_without_offload_attachments_and_lab_says_so():
    assert [f.severity for f in tc_report({}, mode="ovs").findings if f.code == "hw-offload-off"] == ["info"]
    snap = snapshot_from_text(sample("dump-flows-m-lab.txt"), dp_type="dummy", dp_name="dummy@ovs-dummy")
    rep = build_report(None, snap, [])
    assert rep.software_only
    assert any(f.code == "lab-datapath" and "no NIC" in f.message for f in rep.findings)
    assert "NOTE: this is the lab" in render.render_table(rep)


def test_finding_hooks_and_a_broken_hook():
    def eswitch(report):
        return [Finding("eswitch-legacy", "warning", f"{len(report.attachments)} seen", "devlink ... switchdev")]

    def broken(report):
        raise RuntimeError("boom")

    rep = tc_report({"hw-offload": "true"}, sources=[eswitch, broken])
    codes = {f.code: f for f in rep.findings}
    assert codes["eswitch-legacy"].message == "3 seen"
    assert "boom" in codes["check-failed"].message
    try:
        assert register_finding_source(eswitch) is eswitch and register_finding_source(eswitch)
        assert FINDING_SOURCES.count(eswitch) == 1
        assert "eswitch-legacy" in {f.code for f in tc_report({}).findings}
    finally:
        FINDING_SOURCES.remove(eswitch)


def test_malformed_lines_become_a_finding():
    snap = snapshot_from_text(sample("dump-flows-malformed.txt"))
    rep = build_report(None, snap, [])
    assert any(f.code == "unparsed-lines" for f in rep.findings)


# ---- output formats -----------------------------------------------------------------------

def test_prometheus_parses_and_agrees_with_json():
    rep = tc_report({"hw-offload": "true", "tc-policy": "none"})
    text = render.render_prometheus(rep)
    metrics = parse_exposition(text)
    data = json.loads(render.render_json(rep))
    assert metrics["tenantnet_offload_up"] == [({}, 1.0)]
    assert metrics["tenantnet_offload_hw_offload_enabled"] == [({}, 1.0)]
    for a in data["attachments"]:
        for cls, t in a["totals"].items():
            got = [v for lab, v in metrics["tenantnet_offload_attachment_packets"]
                   if lab["pod"] == a["name"] and lab["network"] == a["network"] and lab["class"] == cls]
            assert got == [t["packets"]]
        shares = [v for lab, v in metrics["tenantnet_offload_attachment_hw_flow_share"] if lab["pod"] == a["name"]]
        assert shares == ([] if a["hwFlowShare"] is None else [pytest.approx(a["hwFlowShare"])])
    names = set(metrics)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "offload.md").read_text()
    for name in names:  # every metric is documented
        assert name in doc, name
    for series in metrics.values():
        for labels, _ in series:
            for label in labels:
                assert f"`{label}`" in doc, label


def test_label_escaping_round_trips():
    rep = tc_report({"hw-offload": "true"})
    rep.attachments[0].tenant = 'we"ird\\ten\nant'
    metrics = parse_exposition(render.render_prometheus(rep))
    tenants = {lab["tenant"] for lab, _ in metrics["tenantnet_offload_attachment_flows"]}
    assert 'we"ird\\ten\nant' in tenants


def test_table_lists_flows_and_findings():
    out = render.render_table(tc_report({}))
    assert "team-a/p2" in out and "offloaded" in out and "hw-offload-off" in out and "fix:" in out
    assert "not on OVS" in out


# ---- server, source, CLI -------------------------------------------------------------------

def test_metrics_server_on_loopback():
    rep = tc_report({"hw-offload": "true"})
    server = MetricsServer("127.0.0.1", 0, lambda: render.render_prometheus(rep)).start()
    try:
        host, port = server.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"] == render.CONTENT_TYPE
            metrics = parse_exposition(resp.read().decode())
        assert metrics["tenantnet_offload_up"] == [({}, 1.0)]
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{host}:{port}/nope", timeout=5)
        assert err.value.code == 404
    finally:
        server.stop()


def test_parse_listen():
    assert parse_listen("127.0.0.1:9477") == ("127.0.0.1", 9477)
    assert parse_listen(":0") == ("0.0.0.0", 0)
    assert parse_listen("[::1]:80") == ("::1", 80)
    for bad in ("127.0.0.1", "x:y", "h:70000"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_find_target(tmp_path):
    assert source.find_target("unix:/x/db.sock", "/explicit.ctl").path == "/explicit.ctl"
    assert source.find_target("tcp:10.0.0.1:6640").path == "ovs-vswitchd"
    assert source.find_target(f"unix:{tmp_path}/db.sock").path == "ovs-vswitchd"
    (tmp_path / "ovs-vswitchd.ctl").touch()
    assert source.find_target(f"unix:{tmp_path}/db.sock").path == f"{tmp_path}/ovs-vswitchd.ctl"
    (tmp_path / "ovs-vswitchd.pid").write_text("4242\n")
    (tmp_path / "ovs-vswitchd.4242.ctl").touch()
    assert source.find_target(f"unix:{tmp_path}/db.sock").path == f"{tmp_path}/ovs-vswitchd.4242.ctl"


def _parser():
    parser = argparse.ArgumentParser(prog="tenantnetctl")
    parser.add_argument("--node-config")
    cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_cli_unreachable_vswitchd_is_exit_1_with_a_clear_error(tmp_path, capsys):
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"ovsdb: unix:{tmp_path}/db.sock\nstateDir: {tmp_path}/state\novsdbTimeout: 1\n")
    args = _parser().parse_args(["--node-config", str(cfg), "offload", "--appctl-target", str(tmp_path / "no.ctl")])
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert "ovs-appctl" in err and "--appctl-target" in err
    args = _parser().parse_args(["--node-config", str(cfg), "offload", "--json", "--appctl-target",
                                 str(tmp_path / "no.ctl")])
    assert args.func(args) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["attachments"] == []


def test_cli_bad_arguments(tmp_path, capsys):
    args = _parser().parse_args(["offload", "--pod", "nopod"])
    assert args.func(args) == 2
    with pytest.raises(SystemExit):
        _parser().parse_args(["offload", "--json", "--prometheus"])


def test_node_config_default_is_usable():
    assert source.find_target(NodeConfig().ovsdb).path  # never empty


def test_attach_flows_ignores_ports_not_ours():
    snap = snapshot_from_text(sample("dump-flows-m-tc.txt"))
    v = view_of(record("a", "b", "eth9"))
    attach_flows([v], snap)
    assert v.flows == []


def test_lab_short_form_resolves_to_the_same_ports_as_m():
    # Both dumps were taken one after the other from the same lab datapath.
    ports = parse_dpctl_show(sample("dpctl-show-lab.txt"))
    short = parse_dump_flows(sample("dump-flows-lab.txt"))
    long_ = parse_dump_flows(sample("dump-flows-m-lab.txt"))
    assert short.skipped == [] and len(short.flows) == len(long_.flows)
    resolve_ports(short.flows, ports)

    def key(flows):
        return sorted((f.in_port, tuple(f.outputs)) for f in flows)

    assert key(short.flows) == key(long_.flows)
    assert all(f.in_port.startswith("tn") for f in long_.flows)
    assert "br-lab" in long_.flows[0].outputs and long_.flows[0].extra["dp-extra-info"].startswith("miniflow_bits")


def test_metrics_server_with_a_token_file_serves_only_scrapes_that_present_it(tmp_path):
    """`offload --listen` serves the same tenant-naming families as the agent, so it asks for
    the node config's metricsTokenFile token the same way."""
    rep = tc_report({"hw-offload": "true"})
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    server = MetricsServer("127.0.0.1", 0, lambda: render.render_prometheus(rep), str(token)).start()
    try:
        host, port = server.address
        url = f"http://{host}:{port}/metrics"
        for headers in ({}, {"Authorization": "Bearer tok-12"}, {"Authorization": "Basic tok-123"}):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5)
            assert err.value.code == 401 and err.value.headers["WWW-Authenticate"].startswith("Bearer")
            assert b"tok-123" not in err.value.read()
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer tok-123"}),
                                    timeout=5) as resp:
            assert parse_exposition(resp.read().decode())["tenantnet_offload_up"] == [({}, 1.0)]
        token.unlink()  # fails closed
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer tok-123"}),
                                   timeout=5)
        assert err.value.code == 503
    finally:
        server.stop()
