"""`tenantnetctl offload` on the lab OVS with real traffic (root).

Two mode-`ovs` pods in VLAN 100 ping each other; the report must show exactly the datapath
flows through their ports (checked against the raw dump text, not only our parser), with
counters that grow as more pings are sent; JSON and Prometheus must agree; /metrics is
scraped over loopback from `tenantnetctl offload --listen`. The lab's datapath is userspace
(`dummy`), so every flow is software and the report must say it is the lab.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from tenantnet.ops.flowreport import render
from tenantnet.ops.flowreport.report import (
    Filters,
    attachment_offload,
    build_report,
    report_for_node,
    snapshot_from_text,
    view_of,
)
from tenantnet.plugin import modes
from tenantnet.plugin import nodeconfig as config
from tenantnet.plugin.records import RecordStore
from tenantnet.plugin.system import dpctl as source
from tenantnet.plugin.system.dpflows import SOFTWARE, parse_dump_flows
from tests.integration.conftest import new_cid
from tests.unit.test_offload import parse_exposition

NET = "offl100"


def _command(lab) -> list[str]:
    """`tenantnetctl offload` once ctl.py registers it; until then the module's own entry."""
    from tenantnet.ops.ctl import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    if "offload" in commands:
        return [str(Path(sys.executable).parent / "tenantnetctl"), "--node-config", str(lab.node_config), "offload"]
    return [sys.executable, "-m", "tenantnet.ops.flowreport.cli", "--node-config", str(lab.node_config)]


def ctl(lab, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TENANTNET_CONFIG"}
    return subprocess.run([*_command(lab), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)


def ping(ns, address: str, count: int) -> None:
    res = ns.run("ping", "-c", str(count), "-i", "0.05", "-W", "1", address)
    assert res.returncode == 0, res.stdout + res.stderr


def lines_touching(text: str, port: str) -> set[str]:
    """ufids of the dump lines naming `port` as in_port or as an output — by text alone."""
    out = set()
    for line in text.splitlines():
        actions = line.rsplit("actions:", 1)[-1].split(", dp-extra-info:")[0]
        if f"in_port({port})" in line or port in re.split(r"[,()]", actions):
            out.add(line.split(",", 1)[0])  # the ufid
    return out


def test_report_shows_exactly_the_pods_flows_and_counters_grow(lab, plugin, netns_factory, no_leftovers):
    conf = plugin.conf(name=NET, vlan=100, ipam={
        "type": "host-local", "dataDir": str(lab.hostlocal_dir),
        "ranges": [[{"subnet": "10.89.0.0/24", "rangeStart": "10.89.0.10", "rangeEnd": "10.89.0.50"}]]})
    pods = {}
    for name in ("a", "b"):
        ns, cid = netns_factory(), new_cid()
        # No IPv6 in these pods: its router solicitations and MLD reports would add packets
        # between two reports at random, and the JSON/Prometheus comparison below is exact.
        ns.run("sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", check=True)
        ns.run("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", check=True)
        inv = plugin.add(conf, ns, cid, cni_args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=offl;K8S_POD_NAME={name}")
        assert inv.code == 0, inv.stdout
        pods[name] = (ns, cid, inv.out["ips"][0]["address"].split("/")[0])
    try:
        node = config.load(str(lab.node_config))
        records = {r.pod.name: r for r in RecordStore(node.state_dir, modes.plan_type).list(NET)}
        ports = {n: r.plan.host_ifname for n, r in records.items()}
        (na, _, _), (_, _, ipb) = pods["a"], pods["b"]
        ping(na, ipb, 3)

        report, warnings = report_for_node(node, Filters(network=NET))
        assert warnings == [] and report.ok, report.snapshot.error
        assert report.software_only and report.snapshot.skipped == []
        assert any(f.code == "lab-datapath" for f in report.findings)
        views = {v.pod: v for v in report.attachments}
        assert set(views) == {"a", "b"}
        first = {}
        for name, v in views.items():
            assert v.port == ports[name] and v.flows, f"no flows for {name}"
            for ref in v.flows:  # every flow shown goes through the pod's port...
                assert ref.flow.in_port == v.port or v.port in ref.flow.outputs
                assert ref.flow.classification == SOFTWARE and ref.flow.dp == "ovs"
            first[name] = {r.flow.ufid: r.flow.packets for r in v.flows}
            assert v.hw_packet_share == 0 and v.packets >= 3
        # Exactly: from one dump text, the flows shown for a port are the lines naming it
        # (as in_port or output) — checked by plain text search, independent of the parser.
        text = source.appctl(str(lab.root / "ovs-vswitchd.ctl"), "dpctl/dump-flows", "-m")
        snap = snapshot_from_text(text, dp_type="dummy", dp_name="dummy@ovs-dummy")
        exact = build_report(node, snap, [view_of(r) for r in records.values()])
        for v in exact.attachments:
            assert {"ufid:" + r.flow.ufid for r in v.flows} == lines_touching(text, v.port), v.pod
            assert any(r.direction == "in" for r in v.flows) and any(r.direction == "out" for r in v.flows)

        ping(na, ipb, 10)
        report2, _ = report_for_node(node, Filters(network=NET))
        for v in report2.attachments:
            now = {r.flow.ufid: r.flow.packets for r in v.flows}
            common = set(now) & set(first[v.pod])
            assert common, "the same datapath flows should still be there"
            assert all(now[u] >= first[v.pod][u] for u in common)
            assert sum(now[u] for u in common) >= sum(first[v.pod][u] for u in common) + 10
        summary = attachment_offload(records["a"], node)
        assert summary.require_failed() and summary.software_only and "lab" in summary.message()
        # One report, two renderings: identical numbers.
        prom2 = parse_exposition(render.render_prometheus(report2))
        for v in report2.attachments:
            for cls, t in v.totals.items():
                assert [x for lab_, x in prom2["tenantnet_offload_attachment_packets"]
                        if lab_["pod"] == v.pod and lab_["class"] == cls] == [t["packets"]]

        # The CLI: JSON and Prometheus describe the same attachments and classes (exact
        # agreement of the numbers is checked above on one report: between two CLI calls an
        # ARP re-probe may add a datapath flow), the table says "lab".
        data = json.loads(ctl(lab, "--json", "--network", NET).stdout)
        prom = parse_exposition(ctl(lab, "--prometheus", "--network", NET).stdout)
        assert data["softwareOnly"] is True and data["ok"] is True
        for a in data["attachments"]:
            for cls, t in a["totals"].items():
                got = [v for lab_, v in prom["tenantnet_offload_attachment_flows"]
                       if lab_["pod"] == a["name"] and lab_["class"] == cls]
                assert len(got) == 1 and (got[0] >= t["flows"] if cls == "software" else got == [t["flows"]]), \
                    (a["name"], cls)
            pk = [v for lab_, v in prom["tenantnet_offload_attachment_packets"]
                  if lab_["pod"] == a["name"] and lab_["class"] == "software"]
            assert len(pk) == 1 and pk[0] >= a["totals"]["software"]["packets"]
        assert [v for _, v in prom["tenantnet_offload_datapath_info"]] == [1.0]
        assert prom["tenantnet_offload_datapath_info"][0][0]["software_only"] == "true"
        table = ctl(lab, "--pod", "offl/a")
        assert table.returncode == 0 and "NOTE: this is the lab" in table.stdout and ports["a"] in table.stdout
        assert "offl/b" not in table.stdout

        # /metrics over loopback, from the real CLI, stopped by the test.
        env = {k: v for k, v in os.environ.items() if k != "TENANTNET_CONFIG"}
        proc = subprocess.Popen([*_command(lab), "--listen", "127.0.0.1:0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            line = proc.stdout.readline()
            m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
            assert m, line + proc.stderr.read() if proc.poll() is not None else line
            with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=10) as resp:
                scraped = parse_exposition(resp.read().decode())
            assert scraped["tenantnet_offload_up"] == [({}, 1.0)]
            pods_seen = {lab_["pod"] for lab_, _ in scraped["tenantnet_offload_attachment_flows"]}
            assert {"a", "b"} <= pods_seen
        finally:
            proc.terminate()
            assert proc.wait(timeout=10) == 0
    finally:
        for ns, cid, _ in pods.values():
            assert plugin.call("DEL", conf, cid, ns.path).code == 0


def test_live_dump_parses_completely(lab):
    """Whatever the lab's vswitchd prints now (after other tests' traffic) parses without skips."""
    target = str(lab.root / "ovs-vswitchd.ctl")
    dps = source.read_datapaths(target, timeout=5)
    assert [d.type for d in dps] == ["dummy"]
    for dp in dps:
        dump = parse_dump_flows(dp.text)
        assert dump.skipped == []
        assert all(f.dp == "ovs" for f in dump.flows)
        assert "0" in dp.ports  # dpctl/show lists the datapath's own port
