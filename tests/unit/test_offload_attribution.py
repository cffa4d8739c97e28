"""Why a flow is not offloaded, per pod: the vswitchd log parser, offload-stats-show, the blame
per attachment, the findings, and the bounded log reader (LogCursor / read_tail)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tenantnet.ops.flowreport import attribution as att
from tenantnet.ops.flowreport.report import AttachmentView, build_report, snapshot_from_text
from tenantnet.plugin.system import offloadlog as ol
from tenantnet.plugin.system.dpflows import parse_dpctl_show

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "offload"


def fixture(name: str) -> str:
    return (FIX / name).read_text()


TC_LOG = fixture("vswitchd-tc-refusals.log").splitlines()
TC_PORTS = parse_dpctl_show(fixture("dpctl-show-tc-refusals.txt"))
LAB_LOG = fixture("vswitchd-lab-userspace.log").splitlines()
LAB_PORTS = parse_dpctl_show(fixture("dpctl-show-nonoffloaded-lab.txt"))


def view(ns: str, pod: str, port: str, mode: str = "ovs-offload", network: str = "rail-1",
         tenant: str | None = "t-a", ifname: str = "net1") -> AttachmentView:
    return AttachmentView(network=network, container_id=f"cid-{ns}-{pod}", ifname=ifname, mode=mode,
                          phase="ready", namespace=ns, pod=pod, tenant=tenant, port=port,
                          representor=port if mode == "ovs-offload" else None, bridge="br-int")


TRAIN0 = ("team-a", "train-0", "enp8s0f0_1")
INFER0 = ("team-b", "infer-0", "enp8s0f0_2")
TRAIN1 = ("team-a", "train-1", "enp8s0f0_3")


def tc_views() -> list[AttachmentView]:
    return [view(*TRAIN0), view(*INFER0, tenant="t-b"), view(*TRAIN1)]


def tc_report(log: list[str] | None = None, views: list[AttachmentView] | None = None,
              text: str = "", hw_offload: str = "true", dp_type: str = "system"):
    snap = snapshot_from_text(text, dp_type=dp_type, ports=TC_PORTS,
                              other_config={"hw-offload": hw_offload})
    snap.vswitchd_log = list(log or [])
    return build_report(None, snap, tc_views() if views is None else views)


# ---- one line at a time: every line of the synthetic fixture -----------------------------------

# sequence number of the line -> (reason, device) that classify() gives the line alone; None: no refusal.
PER_LINE = {
    "00120": None,                                      # bridge: unrelated
    "00121": None,                                      # probe tc: benign
    "00122": None,                                      # put[create]: names a flow, refuses nothing
    "00123": (ol.CT_STATE, None),
    "00124": (ol.TC_NOT_SUPPORTED, "enp8s0f0_1"),
    "00125": (ol.ACTION, None),
    "00126": (ol.TC_NOT_SUPPORTED, "enp8s0f0_2"),
    "00127": (ol.TABLE_FULL, None),
    "00128": (ol.TABLE_FULL, "enp8s0f0_1"),
    "00129": (ol.TABLE_FULL, "enp8s0f0_2"),              # E2BIG
    "00130": (ol.INVALID, "enp8s0f0_2"),
    "00131": None,
    "00132": (ol.INVALID, None),                         # the pre-2.15 format: errno only
    "00133": (ol.MATCH, None),
    "00134": (ol.TC_NOT_SUPPORTED, "enp8s0f0_1"),
    "00135": (ol.TUNNEL, None),
    "00136": (ol.TC_NOT_SUPPORTED, "vxlan_sys_4789"),
    "00137": (ol.RECIRC, None),
    "00138": (ol.TC_NOT_SUPPORTED, "enp8s0f0_2"),
    "00139": (ol.RECIRC, None),
    "00140": (ol.NO_FLOW_API, "enp8s0f0_3"),
    "00141": (ol.TC_MISMATCH, None),
    "00142": (ol.DEVICE_MISSING, "enp8s0f0_9"),
    "00143": (ol.OTHER, "enp8s0f0_1"),                   # unknown ERR of netdev_offload_tc: kept
    "00144": (ol.OTHER, None),                           # unknown offload failure: kept
    "00145": (ol.OTHER, "enp8s0f0_2"),                   # an errno we do not map
    "00146": (ol.MATCH, None),
    "00147": (ol.TC_NOT_SUPPORTED, "enp8s0f0_1"),
    "00148": None,                                       # upcall flow limit: not about offload
    "00149": None,                                       # timeval: unrelated
    "00150": (ol.MATCH, None),
    "00151": (ol.TC_NOT_SUPPORTED, "enp8s0f0_1"),
}


def test_every_fixture_line_is_classified_as_documented():
    seen = set()
    continuation = 0
    for line in TC_LOG:
        rec = ol.parse_log_line(line)
        if rec is None:
            continuation += 1     # the hex dump after "unknown attribute"
            continue
        seq = line.split("|")[1]
        ref = ol.classify(rec)
        got = (ref.reason, ref.port) if ref else None
        assert got == PER_LINE[seq], line
        if ref:
            assert ref.fix == ol.FIXES[ref.reason] and ref.fix
        seen.add(seq)
    assert seen == set(PER_LINE) and continuation == 2
    reasons = {v[0] for v in PER_LINE.values() if v}
    assert reasons == set(ol.FIXES) - {ol.NETDEV_FAILED}   # the lab log has that one


def test_vlog_fields():
    rec = ol.parse_log_line(TC_LOG[3])
    assert rec is not None
    assert (rec.timestamp, rec.module, rec.thread, rec.severity) == (
        "2026-11-30T10:01:02.341Z", "netdev_offload_tc", "handler5", "DBG")
    main = ol.parse_log_line(TC_LOG[19])
    assert main is not None and main.thread == "" and main.module == "netdev_offload_tc"
    assert ol.parse_log_line("Unused mask bits:") is None


def test_detail_and_summary_join_into_one_refusal_with_the_device():
    parse = ol.parse_vswitchd_log(TC_LOG)
    ol.resolve_refusals(parse, TC_PORTS)
    ct = [r for r in parse.refusals if r.reason == ol.CT_STATE]
    assert len(ct) == 1
    (r,) = ct
    assert r.port == "enp8s0f0_1" and r.errno_text == "Operation not supported"
    # the flow named on that thread just before: its ufid, and in_port 3 resolved by dpctl/show
    assert r.ufid == "1b5a8c60-5d5e-4c7c-9d3a-2f0c6a7e1a01" and r.in_port == "enp8s0f0_1"
    assert "ct_state(0x21/0x21)" in (r.match_text or "")
    assert len(r.lines) == 2 and "failed to offload flow" in r.example
    # "couldn't get tc prio" (ERR) + the DBG summary: one refusal, the higher severity
    prio = [x for x in parse.refusals if "couldn't get tc prio" in x.example]
    assert [(x.reason, x.port, x.severity) for x in prio] == [(ol.TABLE_FULL, "enp8s0f0_1", "ERR")]
    # each line used once: 26 lines with a refusal, 7 detail + summary pairs among them
    assert len(parse.refusals) == sum(1 for v in PER_LINE.values() if v) - 7 == 19
    assert parse.unparsed == 2


def test_old_format_summary_takes_the_flow_of_its_thread():
    parse = ol.parse_vswitchd_log(TC_LOG)
    ol.resolve_refusals(parse, TC_PORTS)
    (old,) = [r for r in parse.refusals if r.reason == ol.INVALID and r.port is None]
    assert old.in_port == "enp8s0f0_2" and old.ufid == "2c6b9d71-6e6f-4d8d-8e4b-3f1d7b8f2b02"


def test_lone_detail_stays_without_a_device():
    parse = ol.parse_vswitchd_log(TC_LOG)
    lone = [r for r in parse.refusals if "pkt_mark" in r.example]
    assert [(r.reason, r.port, r.in_port) for r in lone] == [(ol.MATCH, None, None)]


def test_lab_log_real_capture():
    parse = ol.parse_vswitchd_log(LAB_LOG)
    ol.resolve_refusals(parse, LAB_PORTS)
    # 9 "failed to add netdev flow" lines; probes, flow API assignment, "Mark id ... not found"
    # and "failed to delete netdev flow" are not refusals; nothing unknown
    assert [r.reason for r in parse.refusals] == [ol.NETDEV_FAILED] * 9
    # each names only its mega_ufid: the dpif_netdev flow_add line earlier gives in_port(N)
    assert {r.in_port for r in parse.refusals} == {"tnfff65ded2e7", "tnb9a966d6c39"}
    assert all(r.port is None and r.ufid for r in parse.refusals)
    assert parse.unparsed == 0


def test_unrelated_lines_are_ignored_and_unknown_offload_lines_kept():
    lines = [
        "2026-11-30T10:00:00.000Z|00001|bridge|INFO|bridge br-int: added interface p0 on port 1",
        "2026-11-30T10:00:00.000Z|00002|ofproto_dpif_upcall(revalidator3)|WARN|Dropped 3 log messages",
        "2026-11-30T10:00:00.000Z|00003|netdev_offload_tc|ERR|something new went wrong on p0",
        "2026-11-30T10:00:00.000Z|00004|dpif_netlink|WARN|hw offload of a meter failed: p0",
        "garbage without the vlog format",
    ]
    parse = ol.parse_vswitchd_log(lines)
    assert [(r.reason, r.message) for r in parse.refusals] == [
        (ol.OTHER, "something new went wrong on p0"), (ol.OTHER, "hw offload of a meter failed: p0")]
    assert parse.unparsed == 1 and parse.lines == 5


# ---- offload-stats-show ---------------------------------------------------------------------------

def test_offload_stats_real_capture():
    stats = ol.parse_offload_stats(fixture("offload-stats-show-lab.txt"))
    assert stats.totals["Inserted offloads"] == 0 and stats.totals["Enqueued offloads"] == 0
    assert stats.totals["Cumulative Average latency (us)"] == 33607
    assert stats.threads[0]["Exponential Latency stddev (us)"] == 12516
    assert len(stats.totals) == 6 and not stats.skipped


def test_offload_stats_other_shapes():
    text = "HW Offload stats:\n   Total  CT bi-dir Connections:     12\n   [  1]   Inserted offloads:  7\n" \
           "ovs-appctl: something odd\n"
    stats = ol.parse_offload_stats(text)
    assert stats.totals == {"CT bi-dir Connections": 12}
    assert stats.threads == {1: {"Inserted offloads": 7}}
    assert stats.skipped == ["ovs-appctl: something odd"]


# ---- attribution ------------------------------------------------------------------------------

def by_subject(failures: list[att.PodFailure]) -> dict[tuple[str, str], int]:
    return {(f.subject, f.reason): f.count for f in failures}


def test_refusals_blamed_on_the_right_pods_and_the_rest_on_the_node():
    failures = att.failures_for(tc_report(), TC_LOG)
    assert by_subject(failures) == {
        ("team-a/train-0", ol.CT_STATE): 1,
        ("team-a/train-0", ol.MATCH): 2,              # IPv6 fragments, unknown attribute
        ("team-a/train-0", ol.TABLE_FULL): 1,
        ("team-a/train-0", ol.TC_NOT_SUPPORTED): 1,   # a summary without detail
        ("team-a/train-0", ol.OTHER): 1,              # "flow get failed (dev enp8s0f0_1 ...)"
        ("team-b/infer-0", ol.ACTION): 1,
        ("team-b/infer-0", ol.RECIRC): 1,
        ("team-b/infer-0", ol.TABLE_FULL): 1,
        ("team-b/infer-0", ol.INVALID): 2,            # one by device, one by the flow's in_port 4
        ("team-b/infer-0", ol.OTHER): 1,
        ("team-a/train-1", ol.NO_FLOW_API): 1,
        ("node", ol.MATCH): 1,                        # pkt_mark: no device, no flow
        ("node", ol.TUNNEL): 1,                       # on vxlan_sys_4789: no attachment's port
        ("node", ol.RECIRC): 1,
        ("node", ol.DEVICE_MISSING): 1,
        ("node", ol.TC_MISMATCH): 1,
        ("node", ol.OTHER): 1,
    }
    train0 = next(f for f in failures if f.subject == "team-a/train-0" and f.reason == ol.CT_STATE)
    assert (train0.namespace, train0.pod, train0.tenant, train0.network, train0.ifname, train0.port) == (
        "team-a", "train-0", "t-a", "rail-1", "net1", "enp8s0f0_1")
    assert "ct_state isn't supported" in train0.example and train0.fix == ol.FIXES[ol.CT_STATE]
    tunnel = next(f for f in failures if f.reason == ol.TUNNEL)
    assert tunnel.port == "vxlan_sys_4789" and tunnel.pod is None
    # attachments first (in the report's order), the node last
    subjects = [f.subject for f in failures]
    assert subjects.index("team-a/train-1") < subjects.index("node")
    assert subjects[-1] == "node" and subjects[0] == "team-a/train-0"


def test_counts_sum_per_attachment_and_reason():
    failures = att.failures_for(tc_report(), TC_LOG + TC_LOG)
    assert by_subject(failures)[("team-b/infer-0", ol.INVALID)] == 4


def test_lab_software_flows_and_log_blamed_on_both_pods():
    pa, pb = view("offcap", "pa", "tnfff65ded2e7", mode="ovs"), view("offcap", "pb", "tnb9a966d6c39", mode="ovs")
    for name in ("dump-flows-nonoffloaded-lab.txt", "dump-flows-m-nonoffloaded-lab.txt"):
        snap = snapshot_from_text("", dp_type="dummy", dp_name="dummy@ovs-dummy", ports=LAB_PORTS,
                                  other_config={"hw-offload": "true"})
        report = build_report(None, snap, [pa, pb])
        failures = att.failures_for(report, LAB_LOG, fixture(name))
        got = {(f.subject, f.reason): (f.count, f.packets) for f in failures}
        assert got == {
            ("offcap/pa", att.SOFTWARE_DATAPATH): (2, 9),
            ("offcap/pb", att.SOFTWARE_DATAPATH): (3, 11),
            ("offcap/pa", ol.NETDEV_FAILED): (5, 0),
            ("offcap/pb", ol.NETDEV_FAILED): (4, 0),
        }, name
        lab = next(f for f in failures if f.reason == att.SOFTWARE_DATAPATH)
        assert "no NIC" in lab.fix and lab.source == "flows"


SYSTEM_FLOWS = (
    "ufid:11111111-2222-3333-4444-555555555555, recirc_id(0),in_port(enp8s0f0_1),eth_type(0x0800), "
    "packets:10, bytes:900, used:0.5s, dp:ovs, actions:enp8s0f0\n"
    "ufid:11111111-2222-3333-4444-555555555556, recirc_id(0),in_port(enp8s0f0),eth_type(0x0800), "
    "packets:4, bytes:400, used:0.5s, dp:ovs, actions:enp8s0f0_2\n"
    "ufid:11111111-2222-3333-4444-555555555557, recirc_id(0),in_port(enp8s0f0),eth_type(0x0806), "
    "packets:0, bytes:0, used:never, dp:ovs, actions:enp8s0f0_2\n"
    "ufid:11111111-2222-3333-4444-555555555558, recirc_id(0),in_port(enp8s0f0_1),eth_type(0x86dd), "
    "packets:7, bytes:700, used:0.5s, offloaded:yes, dp:tc, actions:enp8s0f0\n"
    "ufid:11111111-2222-3333-4444-555555555559, recirc_id(0),in_port(2),eth_type(0x0800), "
    "packets:3, bytes:300, used:0.5s, dp:ovs, actions:1\n"
)


def test_software_flows_on_a_real_datapath():
    veth = view("team-c", "web-0", "tnveth0001", mode="ovs")
    views = [*tc_views(), veth]
    flows = SYSTEM_FLOWS + ("ufid:11111111-2222-3333-4444-55555555555a, recirc_id(0),in_port(tnveth0001),"
                            "eth_type(0x0800), packets:2, bytes:200, used:0.5s, dp:ovs, actions:enp8s0f0\n")
    got = {(f.subject, f.reason): (f.count, f.packets)
           for f in att.failures_for(tc_report(views=views, text=flows), [])}
    assert got == {
        ("team-a/train-0", att.NOT_OFFLOADED): (1, 10),   # in_port is its representor
        ("team-b/infer-0", att.NOT_OFFLOADED): (1, 4),    # from the uplink, output to it
        ("team-c/web-0", att.VETH_PORT): (1, 2),
        ("node", att.NOT_OFFLOADED): (1, 3),              # uplink -> br-int: nobody's
    }
    # the offloaded flow and the idle one are not failures; the same set from a text dump
    again = att.failures_for(tc_report(views=views), [], nonoffloaded_text=flows)
    assert {(f.subject, f.reason): (f.count, f.packets) for f in again} == got


def test_software_flows_with_hw_offload_off():
    got = {(f.subject, f.reason) for f in att.failures_for(tc_report(text=SYSTEM_FLOWS, hw_offload="false"))}
    assert ("team-a/train-0", att.OFFLOAD_DISABLED) in got and att.NOT_OFFLOADED not in {r for _, r in got}


def test_filtered_report_drops_other_pods_instead_of_blaming_the_node():
    shown = [view(*TRAIN0)]
    report = tc_report(views=shown)
    failures = att.failures_for(report, TC_LOG, all_views=tc_views())
    subjects = {f.subject for f in failures}
    assert subjects == {"team-a/train-0", "node"}
    assert by_subject(failures)[("node", ol.OTHER)] == 1     # the node's own, not infer-0's
    # without all_views the filtered-out pod's refusals would look like the node's
    assert by_subject(att.failures_for(report, TC_LOG))[("node", ol.OTHER)] == 2


def test_count_key_labels():
    failures = att.failures_for(tc_report(), TC_LOG)
    pod = next(f for f in failures if f.reason == ol.ACTION)
    node = next(f for f in failures if f.subject == "node")
    assert att.count_key(pod) == {"namespace": "team-b", "pod": "infer-0", "network": "rail-1",
                                  "reason": "action-unsupported"}
    assert att.count_key(node) == {"namespace": "", "pod": "", "network": "", "reason": node.reason}


def test_findings_in_the_report():
    report = tc_report(TC_LOG)
    mine = [f for f in report.findings if f.code.startswith("offload-")]
    ct = next(f for f in mine if f.code == "offload-ct-state-unsupported")
    assert ct.subject == "team-a/train-0" and ct.severity == "warning"
    assert "enp8s0f0_1 (team-a/train-0 on rail-1)" in ct.message and ct.fix == ol.FIXES[ol.CT_STATE]
    assert next(f for f in mine if f.code == "offload-hw-table-full").severity == "error"
    assert {f.subject for f in mine} == {"team-a/train-0", "team-b/infer-0", "team-a/train-1", "node"}
    assert len(mine) == len(att.failures_for(report, TC_LOG))
    assert all(f.to_dict()["code"] for f in mine)
    # no log lines and no software flows: nothing to say
    assert not [f for f in tc_report().findings if f.code.startswith("offload-")]


def test_every_reason_has_a_fix_and_a_description():
    assert set(att.FIXES) == set(att.DESCRIPTIONS) == set(att.REASONS)
    assert all(att.FIXES[r] for r in att.REASONS)


# ---- LogCursor and read_tail -------------------------------------------------------------------

@pytest.fixture
def no_hang():
    """Fail instead of hanging if a read ever blocks."""
    def boom(signum, frame):
        raise TimeoutError("blocked")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_cursor_new_lines_only_and_partial_line_held_back(tmp_path):
    log = tmp_path / "ovs-vswitchd.log"
    log.write_text("a\nb\n")
    cur = ol.LogCursor(str(log))
    assert cur.read_new() == ["a", "b"]
    assert cur.read_new() == []
    with log.open("a") as fh:
        fh.write("c\npart")
    assert cur.read_new() == ["c"]
    with log.open("a") as fh:
        fh.write("ial\n")
    assert cur.read_new() == ["partial"]


def test_cursor_start_at_end(tmp_path):
    log = tmp_path / "l.log"
    log.write_text("old\n")
    cur = ol.LogCursor(str(log), start_at_end=True)
    assert cur.read_new() == []
    with log.open("a") as fh:
        fh.write("new\n")
    assert cur.read_new() == ["new"]


def test_cursor_rotation_and_truncation(tmp_path):
    log = tmp_path / "l.log"
    log.write_text("one\ntwo\n")
    cur = ol.LogCursor(str(log))
    assert cur.read_new() == ["one", "two"]
    os.rename(log, tmp_path / "l.log.1")            # logrotate: a new file, a new inode
    log.write_text("three\n")
    assert cur.read_new() == ["three"] and cur.restarts == 1
    log.write_text("")                              # copytruncate: same inode, shorter
    with log.open("a") as fh:
        fh.write("4\n")
    assert cur.read_new() == ["4"] and cur.restarts == 2


def test_cursor_read_bound(tmp_path):
    log = tmp_path / "l.log"
    log.write_text("12345\n67890\nabcde\n")
    cur = ol.LogCursor(str(log))
    assert cur.read_new(max_bytes=8) == ["12345"]    # only whole lines within the bound
    assert cur.read_new(max_bytes=8) == ["67890"]
    assert cur.read_new(max_bytes=100) == ["abcde"]
    with log.open("a") as fh:
        fh.write("x" * 50 + "\nafter\n")
    assert cur.read_new(max_bytes=16) == []          # a line longer than the bound is skipped ...
    assert cur.read_new(max_bytes=16) == []
    assert cur.read_new(max_bytes=16) == []
    assert cur.read_new(max_bytes=16) == ["after"]   # ... and the cursor moves on
    assert cur.skipped_bytes == 51
    with pytest.raises(ValueError):
        cur.read_new(max_bytes=0)


def test_cursor_refuses_fifo_and_symlink_without_blocking(tmp_path, no_hang):
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(ol.LogFileError, match="not a regular file"):
        ol.LogCursor(str(fifo)).read_new()
    with pytest.raises(ol.LogFileError, match="not a regular file"):
        ol.read_tail(str(fifo))
    real = tmp_path / "real.log"
    real.write_text("x\n")
    link = tmp_path / "link.log"
    link.symlink_to(real)
    with pytest.raises(ol.LogFileError, match="symbolic link"):
        ol.LogCursor(str(link)).read_new()
    with pytest.raises(ol.LogFileError):
        ol.LogCursor(str(tmp_path / "missing.log")).read_new()


def test_read_tail_bound(tmp_path):
    log = tmp_path / "l.log"
    log.write_text("first line\nsecond\nthird\nunfinished")
    assert ol.read_tail(str(log)) == ["first line", "second", "third"]
    # the window starts inside "first line": that fragment and the unfinished line are dropped
    assert ol.read_tail(str(log), max_bytes=len("line\nsecond\nthird\nunfinished")) == ["second", "third"]
    assert ol.read_tail(str(log), max_bytes=3) == []


# ---- the agent's counter -------------------------------------------------------------------

def rebuilt(collector, node, scrape):
    """What `scrape()` shows after exactly one rebuild that began after this call (a scrape
    starts the rebuild that is due on a thread of its own, and serves the last report). With
    the interval at 0 every scrape starts one, so the scrape that reads is made with the
    interval out of reach: no rebuild still running while the test writes the log."""
    assert collector.settle()
    node.metrics_offload_interval = 0.0
    scrape()
    assert collector.settle()
    node.metrics_offload_interval = 1e9
    return scrape()


def test_the_agents_failure_counter_counts_each_logged_refusal_once(tmp_path):
    """NodeOffloadCollector reads only the log's new lines at each rebuild (from the log's end
    when the agent starts), so `tenantnet_offload_failures_total` grows by the refusals logged
    since, and never counts one twice."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tenantnet.ops.flowreport.collector import NodeOffloadCollector

    log = tmp_path / "ovs-vswitchd.log"
    log.write_text(fixture("vswitchd-tc-refusals.log"))  # before the agent: not counted
    node = SimpleNamespace(vswitchd_log=str(log), metrics_offload_interval=0.0)
    collector = NodeOffloadCollector(lambda: node, lambda _node, _lines: tc_report())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    def totals() -> dict[tuple[str, str], float]:
        body = rebuilt(collector, node, lambda: generate_latest(registry))
        out: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                if s.name == "tenantnet_offload_failures_total":
                    out[(s.labels["pod"], s.labels["reason"])] = s.value
        return out

    assert totals() == {}
    expected = by_subject(att.failures_for(tc_report(), fixture("vswitchd-tc-refusals.log").splitlines()))
    with log.open("a") as fh:
        fh.write(fixture("vswitchd-tc-refusals.log"))
    first = totals()
    assert sum(first.values()) == sum(expected.values()) > 0
    assert totals() == first  # nothing new logged: nothing counted
    with log.open("a") as fh:
        fh.write(fixture("vswitchd-tc-refusals.log"))
    assert {k: v / 2 for k, v in totals().items()} == first


def test_the_agents_failure_counter_drops_the_series_of_pods_that_are_gone(tmp_path):
    """A pod's series last while one of its attachments is in the node's report; then they go
    (pods come and go by the thousand). The node's own series stay, and a filtered report,
    which cannot tell a pod is gone, drops nothing."""
    from dataclasses import replace
    from types import SimpleNamespace

    from tenantnet.ops.flowreport.collector import NodeOffloadCollector, prune_failures

    log = tmp_path / "ovs-vswitchd.log"
    log.write_text("")
    node = SimpleNamespace(vswitchd_log=str(log), metrics_offload_interval=0.0)
    views = {"now": tc_views()}

    def build(_node, _lines):
        return replace(tc_report(views=views["now"]), complete=True)

    collector = NodeOffloadCollector(lambda: node, build)

    def pods() -> set[str]:
        families = {f.name: f for f in rebuilt(collector, node, collector.collect)}
        return {s.labels["pod"] for s in families["tenantnet_offload_failures"].samples}

    assert pods() == set()
    with log.open("a") as fh:
        fh.write(fixture("vswitchd-tc-refusals.log"))
    assert pods() == {"train-0", "infer-0", "train-1", ""}
    views["now"] = [v for v in tc_views() if v.pod != "infer-0"]  # its pod was deleted
    assert pods() == {"train-0", "train-1", ""}
    views["now"] = []
    assert pods() == {""}

    counts = {("team-a", "train-0", "rail-1", ol.MATCH): 2.0}
    prune_failures(tc_report(views=[]), counts)  # not complete: a selection, not the node
    assert counts == {("team-a", "train-0", "rail-1", ol.MATCH): 2.0}
