"""tenantnet/entry/metrics.py and the agent's offload collector: a scrape never blocks a CNI
call (nor, stalled inside its read of a store, an ADD through a one-worker agent), records
are parsed once per version, labels, IPAM pools (work linear in range sets and addresses,
bounded open stores), the command label. The HTTP bounds: test_httpserve.py."""

from __future__ import annotations

import ipaddress
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ipam.sqlite_store import SqliteStore
from ipam.store import Allocation
from tenantnet.entry import httpserve, metrics
from tenantnet.entry.metrics import AgentMetrics, AttachmentCollector, IpamPoolCollector, RecordIndex
from tenantnet.ops.flowreport.collector import NodeOffloadCollector
from tenantnet.ops.flowreport.report import Report, Snapshot
from tenantnet.plugin import modes, nodeconfig
from tenantnet.plugin.drivers.ovs import OvsPlan
from tenantnet.plugin.records import AttachmentRecord, PodRef, RecordStore
from tenantnet.plugin.system.dpctl import Target

STATUS = {"inflight": 0, "busyWorkers": 0, "maxInflight": 64, "oldestRunningS": 0.0, "rssKb": 1024,
          "served": 0, "rejected": 0, "expired": 0, "protocolErrors": 0}


def node_at(tmp_path: Path, extra: str = "") -> Any:
    path = tmp_path / "node.yaml"
    path.write_text(f"stateDir: {tmp_path}/state\nipamDataDirs: [{tmp_path}/ipam]\n"
                    f"ipamDataDir: {tmp_path}/ipam/default\nmetricsOffloadInterval: 1\n" + extra)
    return nodeconfig.load(str(path))


def record(network: str, cid: str, ifname: str = "net1", namespace: str = "ns", phase: str = "ready",
           ipam: dict[str, Any] | None = None) -> AttachmentRecord:
    conf: dict[str, Any] = {"name": network, "type": "tenantnet"}
    if ipam:
        conf["ipam"] = ipam
    return AttachmentRecord(network=network, container_id=cid, ifname=ifname, mode="ovs", phase=phase,
                            pod=PodRef(namespace, f"pod-{cid}", "uid"), plan=OvsPlan(host_ifname=f"tn{cid}"),
                            conf=conf)


def families(collector: Any) -> dict[str, Any]:
    return {f.name: f for f in collector.collect()}


def samples(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


# ---- a scrape never blocks a CNI call ---------------------------------------------------------

def test_observe_does_not_wait_for_a_slow_scrape_and_a_second_scrape_gets_the_last_report(tmp_path):
    """What is checked is what happened, not how long it took: the report build is held on a
    gate the test opens, and the CNI calls and scrapes made meanwhile all return while it is
    still held — had any of them waited for the build, it would not have returned at all."""
    node = node_at(tmp_path)
    builds: list[float] = []
    gate = threading.Event()  # closed: a build in progress stays in progress

    def slow_build(_: Any, __: list[str]) -> Report:
        builds.append(time.monotonic())
        assert gate.wait(120), "the test never let the build end"
        snap = Snapshot(target=Target("x", "test"), duration=2.0)
        return Report(hostname="h", generated=time.time(), snapshot=snap, datapaths=[], attachments=[])

    offload = NodeOffloadCollector(lambda: node, build=slow_build)
    m = AgentMetrics(lambda: STATUS, lambda: node, [offload])
    host, port = m.serve("127.0.0.1", 0)
    url = f"http://{host}:{port}/metrics"
    try:
        def get() -> str:
            with urllib.request.urlopen(url, timeout=60) as resp:
                assert resp.status == 200
                return resp.read().decode()

        def observe_while_the_build_is_held() -> None:
            """200 CNI calls observed on a thread of their own all return while the build is
            held (the 60 s only bounds the wait for a broken build: it is no threshold)."""
            finished = threading.Event()

            def calls() -> None:
                for _ in range(200):
                    m.observe("tenantnet", "ADD", 0.005, 1, 7)
                finished.set()

            threading.Thread(target=calls, daemon=True).start()
            assert finished.wait(60), "a CNI call waited for the report build"
            assert not gate.is_set()  # ... which was still held when they had all returned

        def wait_for_builds(n: int) -> None:
            deadline = time.monotonic() + 60
            while len(builds) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(builds) == n, builds

        # The first scrape builds the report on its own thread (there is nothing to serve
        # yet); CNI calls meanwhile are not held up.
        first: list[str] = []
        scraper = threading.Thread(target=lambda: first.append(get()))
        scraper.start()
        wait_for_builds(1)
        observe_while_the_build_is_held()
        assert scraper.is_alive() and not first  # that scrape is still waiting for the build
        gate.set()
        scraper.join(60)
        assert len(builds) == 1 and first and "tenantnet_offload_up 1.0" in first[0]

        # The report is now older than metricsOffloadInterval (1 s): the next scrape starts a
        # rebuild on a thread of its own and is answered with the last report while that
        # rebuild is held, as is a scrape after it; CNI calls meanwhile are not held up.
        gate.clear()
        time.sleep(1.1)
        second = get()
        assert "tenantnet_offload_up 1.0" in second
        wait_for_builds(2)
        assert "tenantnet_offload_up 1.0" in get() and not gate.is_set()
        observe_while_the_build_is_held()
        gate.set()
        assert offload.settle()
        assert len(builds) == 2
        parsed = {f.name: f for f in text_string_to_metric_families(second)}
        errors = parsed["tenantnet_cni_errors"].samples
        assert [(s.labels["code"], s.labels["command"]) for s in errors if s.name.endswith("_total")] == \
            [("7", "ADD")]
    finally:
        m.stop()


def test_observe_labels_and_unknown_error_code(tmp_path):
    node = node_at(tmp_path)
    m = AgentMetrics(lambda: STATUS, lambda: node)
    m.observe("tenantnet", "ADD", 0.002, 0, None)
    m.observe("tenantnet", "ADDX", 0.002, 1, None)
    m.observe("tenantnet-ipam", "weird\n\"value", 0.002, 1, 4)
    parsed = {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    counts = {(s.labels["plugin"], s.labels["command"]): s.value
              for s in parsed["tenantnet_cni_request_duration_seconds"].samples if s.name.endswith("_count")}
    assert counts == {("tenantnet", "ADD"): 1, ("tenantnet", "other"): 1, ("tenantnet-ipam", "other"): 1}
    errors = {(s.labels["command"], s.labels["code"]): s.value
              for s in parsed["tenantnet_cni_errors"].samples if s.name.endswith("_total")}
    assert errors == {("other", "unknown"): 1, ("other", "4"): 1}


@pytest.mark.parametrize("command", sorted(metrics.COMMANDS))
def test_command_label_keeps_the_cni_commands(command):
    assert metrics.command_label(command) == command


@pytest.mark.parametrize("command", ["", "ADDX", "add", " ADD", "ADD ", "DEL\n", "VERSIÖN", "x" * 10_000])
def test_command_label_maps_anything_else_to_other(command):
    assert metrics.command_label(command) == "other"


# ---- records ---------------------------------------------------------------------------------

def test_record_index_reads_a_file_only_when_it_changed(tmp_path, monkeypatch):
    node = node_at(tmp_path)
    store = RecordStore(node.state_dir, modes.plan_type)
    for i in range(5):
        store.save(record("net-a", f"c{i}"))
    reads: list[str] = []
    real_read = RecordStore.read

    def counting(self: RecordStore, path: str) -> Any:
        reads.append(path)
        return real_read(self, path)

    monkeypatch.setattr(RecordStore, "read", counting)
    index = RecordIndex(max_age=0)
    assert len(index.snapshot(node)) == 5 and len(reads) == 5
    reads.clear()
    assert len(index.snapshot(node)) == 5 and reads == []          # nothing changed: nothing read
    store.save(record("net-a", "c1", phase="adding", namespace="a-longer-namespace"))  # rewritten
    store.save(record("net-a", "c9"))                                # new
    store.remove("net-a", "c2", "net1")                              # gone
    seen = index.snapshot(node)
    assert sorted(Path(p).parent.name for p in reads) == ["c1", "c9"]
    assert sorted(s.container_id for s in seen) == ["c0", "c1", "c3", "c4", "c9"]
    assert {s.container_id: s.phase for s in seen}["c1"] == "adding"
    reads.clear()
    index.snapshot(node)
    assert reads == []


def test_record_index_shares_a_fresh_snapshot(tmp_path):
    node = node_at(tmp_path)
    store = RecordStore(node.state_dir, modes.plan_type)
    store.save(record("net-a", "c0"))
    index = RecordIndex(max_age=60)
    assert len(index.snapshot(node)) == 1
    store.save(record("net-a", "c1"))
    assert len(index.snapshot(node)) == 1  # within max_age: the same walk
    index.max_age = 0
    assert len(index.snapshot(node)) == 2


def test_attachment_collector_labels_with_the_tenant_of_an_inline_policy(tmp_path):
    node = node_at(tmp_path, "tenancy:\n  networks:\n    rail-1: {bridge: br-lab}\n  tenants:\n"
                             "    team-a:\n      namespaces: [team-a, 'team-a-*']\n      networks:\n"
                             "        rail-1: {vlans: [100]}\n")
    store = RecordStore(node.state_dir, modes.plan_type)
    store.save(record("rail-1", "c0", namespace="team-a"))
    store.save(record("rail-1", "c1", namespace="team-a-dev"))
    store.save(record("rail-1", "c2", namespace="team-a-dev", phase="adding"))
    store.save(record("rail-1", "c3", namespace="nobody"))
    store.save(record("other", "c4", namespace="team-a", ifname="net2"))
    got = samples(families(AttachmentCollector(lambda: node, RecordIndex(max_age=0)))["tenantnet_attachments"])

    def key(network: str, tenant: str, phase: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"mode": "ovs", "network": network, "tenant": tenant, "phase": phase}.items()))

    assert got == {key("rail-1", "team-a", "ready"): 2, key("rail-1", "team-a", "adding"): 1,
                   key("rail-1", "", "ready"): 1, key("other", "team-a", "ready"): 1}


def test_ipam_pool_collector_counts_range_and_use_and_ignores_dirs_outside_ipam_data_dirs(tmp_path):
    node = node_at(tmp_path)
    inside, outside = tmp_path / "ipam" / "a", tmp_path / "elsewhere"
    pool = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.9.0.0/24", "rangeStart": "10.9.0.10",
                                                   "rangeEnd": "10.9.0.29"}]]}
    for directory, network in ((inside, "net-in"), (outside, "net-out")):
        store = SqliteStore(str(directory))
        with store.transaction() as txn:
            for i in range(3):
                txn.insert(Allocation(network=network, address=ipaddress.ip_address(f"10.9.0.{10 + i}"),
                                      container_id=f"c{i}", ifname="net1"))
        store.close()
    records = RecordStore(node.state_dir, modes.plan_type)
    for i in range(3):
        records.save(record("net-in", f"c{i}", ipam={**pool, "dataDir": str(inside)}))
        records.save(record("net-out", f"c{i}", ipam={**pool, "dataDir": str(outside)}))
    records.save(record("plain", "c9", ipam={"type": "host-local", "subnet": "10.8.0.0/24"}))
    got = families(IpamPoolCollector(lambda: node, RecordIndex(max_age=0)))
    labels = (("family", "ipv4"), ("network", "net-in"), ("range_set", "0"))
    assert samples(got["tenantnet_ipam_pool_addresses"]) == {labels: 20}
    assert samples(got["tenantnet_ipam_pool_used_addresses"]) == {labels: 3}


def test_an_offload_rebuild_waits_while_cni_calls_are_in_flight(monkeypatch):
    """A due rebuild is put off while calls are in flight, at most DEFERRAL_LIMIT intervals;
    the cached text is served meanwhile."""
    from types import SimpleNamespace

    from tenantnet.ops.flowreport import collector as col

    clock = [1000.0]
    monkeypatch.setattr(col.time, "monotonic", lambda: clock[0])
    builds: list[float] = []
    node = SimpleNamespace(metrics_offload_interval=15.0, vswitchd_log="/nonexistent/ovs-vswitchd.log")
    busy = [False]

    def build(_node, _lines):
        builds.append(clock[0])
        return tc_like_report()

    c = col.NodeOffloadCollector(lambda: node, build, busy=lambda: busy[0])
    first = c.exposition()  # the first one: built on this thread
    assert builds == [1000.0] and b"tenantnet_offload_up" in first
    busy[0] = True
    clock[0] += 20  # due, but calls are in flight: put off
    assert c.exposition() == first and c.settle() and len(builds) == 1
    clock[0] += 100  # 120 s: still put off
    assert c.exposition() == first and c.settle() and len(builds) == 1
    clock[0] += 30  # 150 s: DEFERRAL_LIMIT (10) intervals — no longer
    c.exposition()
    assert c.settle() and len(builds) == 2
    busy[0] = False
    clock[0] += 16
    c.exposition()
    assert c.settle() and len(builds) == 3


def tc_like_report():
    from tenantnet.ops.flowreport.report import build_report, snapshot_from_text

    return build_report(None, snapshot_from_text(""), [])


def test_a_flood_of_scrapes_is_bounded(tmp_path, monkeypatch):
    """Anyone who reaches the port: at most SCRAPES_AT_ONCE scrapes run at once (the rest get
    503 at once), and a body younger than BODY_REUSE is sent again, not rebuilt."""
    import urllib.error
    from concurrent.futures import ThreadPoolExecutor

    node = node_at(tmp_path)
    builds = [0]
    monkeypatch.setattr(metrics, "BODY_REUSE", 5.0)  # the check of reuse below must not race a slow box

    class Slow:
        def exposition(self) -> bytes:
            builds[0] += 1
            time.sleep(0.6)
            return b"# slow\n"

    m = AgentMetrics(lambda: STATUS, lambda: node, [Slow()])
    host, port = m.serve("127.0.0.1", 0)
    url = f"http://{host}:{port}/metrics"

    def status() -> int:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    try:
        with ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(lambda _: status(), range(12)))
        assert 503 in codes and 200 in codes, codes  # (a late one may get a freed slot, and a reused body)
        assert builds[0] <= metrics.SCRAPES_AT_ONCE
        before = builds[0]
        assert status() == 200 and builds[0] == before  # within BODY_REUSE of the last build: reused
    finally:
        m.stop()


# ---- who may scrape --------------------------------------------------------------------------

def scrape(url: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    import urllib.error

    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return int(resp.status), dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), dict(err.headers), err.read()


def test_a_token_file_makes_every_scrape_present_its_token_and_a_rotated_one_applies_at_once(tmp_path):
    node = node_at(tmp_path)
    # A Secret as kubelet projects it: token -> ..data/token, ..data -> ..v1 (a directory)
    secret = tmp_path / "secret"
    (secret / "..v1").mkdir(parents=True)
    (secret / "..v1" / "token").write_text("s3cret-one\n")  # a Secret's value may end with a newline
    (secret / "..data").symlink_to("..v1")
    token = secret / "token"
    token.symlink_to("..data/token")
    m = AgentMetrics(lambda: STATUS, lambda: node)
    host, port = m.serve("127.0.0.1", 0, str(token))
    url = f"http://{host}:{port}/metrics"
    try:
        code, headers, body = scrape(url)
        assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert b"bearer token is required" in body and b"s3cret" not in body
        code, _, body = scrape(url, "s3cret-on")  # a prefix is not the token
        assert code == 401 and b"not this node's metrics token" in body and b"s3cret" not in body
        code, _, body = scrape(url, "s3cret-one")
        assert code == 200 and b"tenantnet_agent_inflight" in body
        # kubelet rotates a Secret by swapping ..data to a new directory: the new file applies
        (secret / "..v2").mkdir()
        (secret / "..v2" / "token").write_text("s3cret-two")
        (secret / "..data_tmp").symlink_to("..v2")
        (secret / "..data_tmp").rename(secret / "..data")
        assert scrape(url, "s3cret-one")[0] == 401
        assert scrape(url, "s3cret-two")[0] == 200
        status_404 = scrape(f"http://{host}:{port}/other")[0]
        assert status_404 == 404  # no token needed to learn a path does not exist; nothing is served
    finally:
        m.stop()


@pytest.mark.parametrize("make", ["missing", "empty", "fifo", "directory", "too-large"])
def test_a_token_file_that_cannot_give_a_token_refuses_every_scrape_without_blocking(tmp_path, make):
    """Fails closed: no token, no metrics (503, naming the file and why), and a FIFO named
    as the file is not opened for a blocking read."""
    node = node_at(tmp_path)
    token = tmp_path / "token"
    if make == "empty":
        token.write_text("\n")
    elif make == "fifo":
        os.mkfifo(token)
    elif make == "directory":
        token.mkdir()
    elif make == "too-large":
        token.write_text("x" * (httpserve.MAX_TOKEN_BYTES + 1))
    m = AgentMetrics(lambda: STATUS, lambda: node)
    host, port = m.serve("127.0.0.1", 0, str(token))
    try:
        started = time.monotonic()
        code, _, body = scrape(f"http://{host}:{port}/metrics", "anything")
        assert code == 503 and str(token).encode() in body and b"without a token" in body, body
        assert b"tenantnet_agent" not in body
        assert time.monotonic() - started < 5
    finally:
        m.stop()


def test_without_a_token_file_the_endpoint_is_open_and_the_default_address_is_loopback(tmp_path):
    node = node_at(tmp_path)
    assert node.metrics_address == "127.0.0.1" and node.metrics_token_file == ""
    m = AgentMetrics(lambda: STATUS, lambda: node)
    host, port = m.serve(node.metrics_address, 0)
    try:
        assert scrape(f"http://{host}:{port}/metrics")[0] == 200
    finally:
        m.stop()
    with pytest.raises(Exception, match="metricsTokenFile"):
        node_at(tmp_path, "metricsTokenFile: relative/token\n")


@pytest.mark.parametrize("address,token,warned", [("0.0.0.0", "", True), ("::", "", True),
                                                  ("10.1.2.3", "", True), ("0.0.0.0", "/t/token", False),
                                                  ("127.0.0.1", "", False), ("::1", "", False)])
def test_the_agent_warns_when_it_serves_the_metrics_beyond_the_node_without_a_token(
        tmp_path, monkeypatch, address, token, warned):
    """What is bound is the admin's choice; the warning says what it exposes. (The serve is
    stubbed: a test does not open a port on the node's addresses.)"""
    from tenantnet.entry import agent as agentmod

    served: list[tuple[str, int, str]] = []
    monkeypatch.setattr(AgentMetrics, "serve",
                        lambda self, a, p, t="": served.append((a, p, t)) or (a, p))
    node = node_at(tmp_path, f"metricsPort: 9477\nmetricsAddress: '{address}'\n"
                   + (f"metricsTokenFile: {token}\n" if token else ""))
    agent = agentmod.Agent(str(tmp_path / "agent.sock"), str(tmp_path / "node.yaml"))
    events: list[tuple[str, str, dict[str, Any]]] = []

    class Log:
        def __getattr__(self, level: str) -> Any:
            return lambda event, **kw: events.append((level, event, kw))

    agent.log = Log()
    agent._serve_metrics(node)
    assert served == [(node.metrics_address, 9477, token)]
    assert agent.status(asking=False)["metricsToken"] is bool(token)
    warnings = [e for e in events if e[0] == "warning"]
    if warned:
        assert [w[1] for w in warnings] == ["agent.metrics_without_token"]
        assert "metricsTokenFile" in warnings[0][2]["hint"]
    else:
        assert warnings == []


# ---- the IPAM pool collector: linear work, bounded open stores ------------------------------

def many_sets(n: int) -> dict[str, Any]:
    """A pool of `n` range sets (/28 each, 10.64.0.0 upwards; every other one with a second range)."""
    sets = []
    for i in range(n):
        base = ipaddress.ip_address("10.64.0.0") + 64 * i
        ranges = [{"subnet": f"{base}/28"}]
        if i % 2:
            ranges.append({"subnet": f"{base + 32}/28"})
        sets.append(ranges)
    return {"type": "tenantnet-ipam", "ranges": sets}


def hold(directory: Path, network: str, addresses: list[str]) -> None:
    store = SqliteStore(str(directory))
    with store.transaction() as txn:
        for i, a in enumerate(addresses):
            txn.insert(Allocation(network=network, address=ipaddress.ip_address(a), container_id=f"c{i}",
                                  ifname="net1"))
    store.close()


class Work:
    """What a pool collect did: ipam sections parsed, store rows read, range-set scans."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from ipam import config
        from ipam.config import RangeSet
        from ipam.sqlite_store import SqliteTransaction

        self.parsed = self.rows = self.scans = 0
        real_parse, real_rows, real_range_of = config.parse_ipam, SqliteTransaction.allocations, RangeSet.range_of

        def parse(raw: Any) -> Any:
            self.parsed += 1
            return real_parse(raw)

        def rows(txn: Any, network: str | None = None) -> Any:
            got = real_rows(txn, network)
            self.rows += len(got)
            return got

        def range_of(rs: Any, address: Any) -> Any:
            self.scans += 1
            return real_range_of(rs, address)

        monkeypatch.setattr(config, "parse_ipam", parse)
        monkeypatch.setattr(SqliteTransaction, "allocations", rows)
        monkeypatch.setattr(RangeSet, "range_of", range_of)

    def reset(self) -> None:
        self.parsed = self.rows = self.scans = 0


@pytest.mark.parametrize("sets", [10, 1000])
def test_a_pool_scrape_does_work_linear_in_its_range_sets_and_addresses(tmp_path, monkeypatch, sets):
    """1,000 range sets × 3 pods cost 2.8 s a scrape when every set rescanned every address.
    Now each address is placed once (a binary search), each row is read once, the ipam
    section is parsed once per version, not per scrape: the counts below do not depend on the
    number of sets, and the figures are those of the old per-set scan."""
    from ipam import config

    # ipam/config.py now refuses more than a few range sets in a new NAD; records made before
    # that may still have many, and the collector's cost must not depend on that cap.
    monkeypatch.setattr(config, "MAX_RANGE_SETS", 10_000, raising=False)
    node = node_at(tmp_path)
    directory = tmp_path / "ipam" / "pool"
    pool = {**many_sets(sets), "dataDir": str(directory)}
    held = ["10.64.0.1", "10.64.0.65", f"{ipaddress.ip_address('10.64.0.0') + 64 * (sets - 1) + 33}"]
    hold(directory, "net-many", held)
    records = RecordStore(node.state_dir, modes.plan_type)
    for i in range(3):
        records.save(record("net-many", f"c{i}", ipam=pool))
    collector = IpamPoolCollector(lambda: node, RecordIndex(max_age=0))
    work = Work(monkeypatch)
    got = families(collector)
    assert (work.parsed, work.rows, work.scans) == (1, 3, 0)
    pools = {f.name: f for f in [*collector.collect()]}  # a second scrape: nothing parsed again
    assert (work.parsed, work.rows, work.scans) == (1, 6, 0)
    assert samples(pools["tenantnet_ipam_pool_used_addresses"]) == \
        samples(got["tenantnet_ipam_pool_used_addresses"])

    # The same figures as the per-set scan gave (RangeSet.range_of over every address).
    from ipam.config import parse_ipam

    conf = parse_ipam(pool)
    expected_used, expected_size = {}, {}
    for i, rs in enumerate(conf.range_sets):
        key = (("family", f"ipv{rs.family}"), ("network", "net-many"), ("range_set", str(i)))
        expected_used[key] = sum(1 for a in held if rs.range_of(ipaddress.ip_address(a)) is not None)
        expected_size[key] = sum(hi - lo + 1 for r in rs.ranges for lo, hi in r.segments())
    assert samples(got["tenantnet_ipam_pool_used_addresses"]) == expected_used
    assert samples(got["tenantnet_ipam_pool_addresses"]) == expected_size
    assert sum(expected_used.values()) == 3 and len(expected_used) == sets


def test_pool_placement_agrees_with_range_of_for_both_families_and_holes(tmp_path):
    """The binary search places addresses exactly as RangeSet.range_of does: v4 and v6 sets,
    several ranges per set, gaps between ranges, addresses in no set."""
    from ipam.config import parse_ipam
    from tenantnet.entry.metrics import _Pool

    conf = parse_ipam({"type": "tenantnet-ipam", "ranges": [
        [{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.20"},
         {"subnet": "10.3.0.0/24"}],
        [{"subnet": "fd00:1::/120"}],
        [{"subnet": "10.2.0.0/24"}, {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.100"}],
        [{"subnet": "fd00:2::/120", "exclude": ["fd00:2::80/121"]}]]})
    addresses = [ipaddress.ip_address(a) for a in (
        "10.1.0.9", "10.1.0.10", "10.1.0.20", "10.1.0.21", "10.1.0.99", "10.1.0.100", "10.1.0.254",
        "10.2.0.1", "10.3.0.7", "10.4.0.1", "0.0.0.0", "255.255.255.255", "fd00:1::1", "fd00:1::ff",
        "fd00:2::90", "fd00:3::1", "::")]
    expected = [sum(1 for a in addresses if rs.range_of(a) is not None) for rs in conf.range_sets]
    assert _Pool(conf).used(addresses) == expected
    assert expected == [3, 2, 3, 1]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_stores_are_bounded_evicted_and_closed_when_empty_or_unnamed(tmp_path):
    """A tenant can name a data dir per NAD (within ipamDataDirs): the collector keeps at most
    MAX_OPEN_STORES open, closes a store that holds nothing of the networks read from it, and
    one that no record names any more — and the process's descriptors do not grow with the
    number of data dirs."""
    node = node_at(tmp_path)
    records = RecordStore(node.state_dir, modes.plan_type)
    dirs = 3 * metrics.MAX_OPEN_STORES
    for i in range(dirs):
        directory = tmp_path / "ipam" / f"d{i}"
        pool = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.9.0.0/24"}]], "dataDir": str(directory)}
        # the first third hold an address, the rest an empty store
        hold(directory, f"net-{i}", ["10.9.0.5"] if i < metrics.MAX_OPEN_STORES else [])
        records.save(record(f"net-{i}", f"c{i}", ipam=pool))
    fds = open_fds()
    probe = SqliteStore(str(tmp_path / "ipam" / "d0"), create=False)
    probe.allocations()
    per_store = open_fds() - fds  # the database, its -wal and -shm (and whatever else the store holds)
    probe.close()
    bound = per_store * metrics.MAX_OPEN_STORES
    collector = IpamPoolCollector(lambda: node, RecordIndex(max_age=0))
    fds = open_fds()
    got = families(collector)
    assert len(got["tenantnet_ipam_pool_used_addresses"].samples) == dirs  # every network still shown
    holding = {str(tmp_path / "ipam" / f"d{i}") for i in range(metrics.MAX_OPEN_STORES)}
    assert set(collector.open_stores) == holding  # the empty ones were closed after their read
    grown = open_fds() - fds
    assert 0 < grown <= bound, (grown, per_store)
    # More holding dirs than the bound: the least recently read are closed.
    for i in range(metrics.MAX_OPEN_STORES, dirs):
        hold(tmp_path / "ipam" / f"d{i}", f"net-{i}", ["10.9.0.6"])
    families(collector)
    assert len(collector.open_stores) == metrics.MAX_OPEN_STORES
    assert open_fds() - fds <= bound
    # Records gone: their stores are closed at the next scrape.
    for i in range(dirs):
        records.remove(f"net-{i}", f"c{i}", "net1")
    assert families(collector)["tenantnet_ipam_pool_used_addresses"].samples == []
    assert collector.open_stores == []
    assert open_fds() <= fds


# ---- a scrape never delays a CNI call ---------------------------------------------------------

STALLING_AGENT = r"""
import os, sys, threading, time
from ipam.sqlite_store import SqliteTransaction
from tenantnet.entry import agentctl

real = SqliteTransaction.allocations
stalled, release = sys.argv[1], sys.argv[2]

def allocations(self, network=None):
    rows = real(self, network)  # the read snapshot is open from here until it returns
    if threading.current_thread().name.startswith("tenantnet-metrics"):
        open(stalled, "w").close()
        until = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < until:
            time.sleep(0.01)
    return rows

SqliteTransaction.allocations = allocations
sys.exit(agentctl.main(sys.argv[3:]))
"""


def test_a_scrape_stalled_mid_collect_does_not_delay_a_cni_call(tmp_path):
    """A real agent with one worker; a scrape's pool collector stalls inside its read snapshot
    of a store (on the HTTP server's thread). Meanwhile an ADD through the agent allocates in
    that same store and is answered — the stall is released only after that, so an ADD that
    waited for the scrape (a lock, the worker, the store) would never be answered, and the
    test fails on the ADD's own time-out, not on a duration."""
    import json
    import socket as sockets
    import subprocess
    import sys

    from tenantnet.entry import agentctl, shim

    with sockets.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "sock").mkdir(mode=0o700)
    node_yaml = tmp_path / "node.yaml"
    node_yaml.write_text(f"stateDir: {tmp_path}/state\novsdb: unix:{tmp_path}/no-ovsdb.sock\n"
                         f"agentSocket: {tmp_path}/sock/agent.sock\nipamDataDirs: [{tmp_path}/ipam]\n"
                         f"ipamDataDir: {tmp_path}/ipam/default\nlogFile: {tmp_path}/agent.log\n"
                         f"metricsPort: {port}\n")
    directory = tmp_path / "ipam" / "pool"
    pool = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.77.0.0/24"}]], "dataDir": str(directory)}
    hold(directory, "net-s", ["10.77.0.10"])
    RecordStore(str(tmp_path / "state"), modes.plan_type).save(record("net-s", "c0", ipam=pool))
    stalled, release = tmp_path / "stalled", tmp_path / "release"
    agent = subprocess.Popen([sys.executable, "-c", STALLING_AGENT, str(stalled), str(release),
                              "--node-config", str(node_yaml), "run", "--workers", "1"],
                             stderr=subprocess.PIPE)
    sock = f"{tmp_path}/sock/agent.sock"
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        until = time.monotonic() + 60
        while True:
            try:
                agentctl.query_status(sock)
                break
            except (shim.AgentUnavailable, shim.AgentFailed):
                assert agent.poll() is None and time.monotonic() < until, agent.stderr.read().decode()  # type: ignore[union-attr]
                time.sleep(0.05)
        scraped: list[str] = []
        scraper = threading.Thread(target=lambda: scraped.append(
            urllib.request.urlopen(url, timeout=180).read().decode()))
        scraper.start()
        while not stalled.exists():
            assert time.monotonic() < until and scraper.is_alive(), "the scrape did not reach the store"
            time.sleep(0.01)

        env = {b"CNI_COMMAND": b"ADD", b"CNI_CONTAINERID": b"c1", b"CNI_IFNAME": b"net1",
               b"CNI_NETNS": b"/var/run/netns/x", b"CNI_PATH": b"/usr/lib/cni",
               b"TENANTNET_CONFIG": str(node_yaml).encode()}
        conf = json.dumps({"cniVersion": "1.0.0", "name": "net-s", "type": "tenantnet", "ipam": pool}).encode()
        code, out, err = shim.ask(sock, "tenantnet-ipam", env, conf, 60)
        assert code == 0, (out, err)
        assert json.loads(out)["ips"][0]["address"].startswith("10.77.0.")
        assert scraper.is_alive() and not scraped  # the scrape is still stalled: the ADD did not wait

        release.touch()
        scraper.join(60)
        assert scraped
        used = value_of(scraped[0], "tenantnet_ipam_pool_used_addresses", network="net-s")
        assert used == 1  # the stalled read's snapshot: from before the ADD
        time.sleep(metrics.BODY_REUSE + 0.1)
        stalled.unlink()
        with urllib.request.urlopen(url, timeout=180) as resp:
            assert value_of(resp.read().decode(), "tenantnet_ipam_pool_used_addresses", network="net-s") == 2
    finally:
        release.touch()
        agent.terminate()
        agent.wait(timeout=30)


def value_of(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None
