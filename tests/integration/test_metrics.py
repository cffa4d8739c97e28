"""The agent's /metrics endpoint (docs/metrics.md, tenantnet/entry/metrics.py) on the lab.

- Scraping once a second during a burst of 1,024 ADDs (bench_agent's burst: 128 pods × 8
  rails, 16 execs at once through the trampoline and agent) costs the agent at most 5 % more
  CPU and the burst no measurable wall time.
- What the endpoint says is right: request counts and error codes, attachments, IPAM pool
  use, in-flight calls; a hostile CNI_COMMAND adds no label values.

Each test starts its own agent through `tenantnetctl agent run` (which also registers the
offload report's collector, so /metrics has the `tenantnet_offload_*` families) in a private
run dir, serving /metrics on a free port of 127.0.0.1, and stops it by pid.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sqlite3
import string
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.common import burst_jobs, cpu_seconds, run_burst
from tenantnet.entry import shim
from tenantnet.entry.metrics import BODY_REUSE
from tenantnet.lab import node as labmod
from tests.integration.conftest import BIN, PLUGIN, Lab, new_cid
from tests.integration.test_agent import AgentProcess, call, shim_env, start_agent

CTL = str(BIN / "tenantnetctl")
REQUIRED = ("tenantnet_cni_request_duration_seconds", "tenantnet_attachments", "tenantnet_agent_inflight")


# run_dir and agents: tests/integration/conftest.py


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics_node_config(lab: Lab, run_dir: Path, port: int, extra: str = "") -> Path:
    """The lab's node config plus a private `agentSocket` and /metrics on 127.0.0.1:`port`."""
    path = run_dir / "node.yaml"
    path.write_text(lab.node_config.read_text() + f"agentSocket: {run_dir}/sock/agent.sock\n"
                    f"metricsPort: {port}\nmetricsAddress: 127.0.0.1\n" + extra)
    return path


def start_ctl_agent(node_config: Path) -> AgentProcess:
    """`.venv/bin/tenantnetctl --node-config X agent run`, once it answers STATUS."""
    return start_agent(node_config, command=[CTL, "--node-config", str(node_config), "agent", "run"],
                       up_within=30)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def scrape(url: str) -> dict[str, Any]:
    """The endpoint's families by name (a counter's without `_total`, as the parser names it)."""
    status, text = get(url)
    assert status == 200, text[:2000]
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Any], sample: str, **labels: str) -> float | None:
    """The value of the one sample named `sample` whose labels include `labels` (None: none)."""
    family = families.get(sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum"))
    hits = [s.value for s in (family.samples if family else [])
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) <= 1, (sample, labels, hits)
    return hits[0] if hits else None


class Scraper(threading.Thread):
    """GETs /metrics every `every` seconds until stopped; keeps (status, seconds, body).
    Bodies are parsed afterwards (`check`), so this process's parsing does not compete with
    the burst's execs for the two cores: a Prometheus server parses on its own machine."""

    def __init__(self, url: str, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.done = threading.Event()
        self.scrapes: list[tuple[int, float, str]] = []

    def run(self) -> None:
        while not self.done.is_set():
            started = time.monotonic()
            try:
                status, body = get(self.url)
            except OSError as exc:
                status, body = 0, repr(exc)
            self.scrapes.append((status, time.monotonic() - started, body))
            self.done.wait(max(0.0, self.every - (time.monotonic() - started)))

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=60)

    def check(self) -> dict[str, float]:
        """Every scrape answered 200 and has the families; (count, slowest s, largest bytes)."""
        assert self.scrapes, "no scrape happened"
        for status, _, body in self.scrapes:
            assert status == 200, (status, body[:2000])
            names = {f.name for f in text_string_to_metric_families(body)}
            missing = [n for n in REQUIRED if n not in names]
            assert not missing, (missing, sorted(names))
            assert any(n.startswith("tenantnet_offload_") for n in names), sorted(names)
        return {"scrapes": len(self.scrapes), "slowest_s": max(s for _, s, _ in self.scrapes),
                "largest_bytes": max(len(b) for _, _, b in self.scrapes)}


# ---- a scrape during a burst ---------------------------------------------------------------

PODS, RAILS, PARALLEL = 128, 8, 16
# One round of each (the suite's time: a round is ≈ 15 s). The 5 % bound does not compare
# rounds — it is the endpoint's self-measured share of the scraped round's CPU — so one
# round is enough for it; the wall guard compares two single rounds, hence its margin.
ORDER = ("scraped", "plain")
PLAIN_FOR_REBUILD = 1  # the round (a plain one) after whose ADDs one offload rebuild is measured
CPU_BOUND = 0.05   # what the endpoint cost the agent, as a share of the agent's CPU for the burst
WALL_BOUND = 0.30  # the ADD phase's wall time, scraped vs not: a guard only (see the docstring)


def offload_rebuild_cost(node: Path) -> dict[str, float]:
    """What one rebuild of the offload report costs now, measured in this process (the same
    code the agent's NodeOffloadCollector runs): CPU seconds to build it, the samples it
    serves and the CPU seconds to serialise them once (paid on every scrape until the next
    rebuild)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from tenantnet.ops.flowreport.collector import NodeOffloadCollector
    from tenantnet.plugin import nodeconfig

    conf = nodeconfig.load(str(node))
    collector = NodeOffloadCollector(lambda: conf)
    started = time.process_time()
    families = list(collector.collect())
    built = time.process_time() - started
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    started = time.process_time()
    text = generate_latest(registry)
    return {"offload_build_cpu_s": built, "offload_samples": sum(len(f.samples) for f in families),
            "offload_serialise_cpu_s": time.process_time() - started, "offload_bytes": len(text)}


def test_scraping_every_second_does_not_slow_a_1024_add_burst(lab, run_dir, agents, record_property):
    """What is compared, and why:

    The same burst as bench_agent's (128 pods × 8 rails = 1,024 ADDs, 16 execs at once through
    `.venv/bin/tenantnet`, tenantnet-ipam, then the 1,024 DELs) runs twice on one agent,
    first with and then without a thread GETting /metrics once a second.

    Asserted at 5 %: what the endpoint costs the agent, measured by the agent itself — the CPU
    time of its scrape threads and of the offload report's rebuilds (`time.thread_time()`
    around each; exported as `tenantnet_metrics_cpu_seconds_total`) — as a share of the
    agent's whole CPU (utime + stime of the agent and its waited-for children, from
    /proc/<pid>/stat) over the scraped bursts. Comparing the agent's total CPU between
    scraped and plain rounds would say the same with noise: on this shared 2-core box the
    same burst's CPU moves by ±20 % from round to round, which 5 % drowns in.

    Printed, and asserted only as a guard at 30 %: the scraped vs plain ratios of the agent's
    CPU and of the ADD phases' wall time (what a runtime sees; the scraper's own process
    shares the cores with the 16 execs here, which a Prometheus server on another machine
    would not).

    The offload report runs at the default `metricsOffloadInterval` (15 s): built at the first
    scrape, before the bursts, then rebuilt when due — but not while CNI calls are in flight,
    for up to ten intervals (collector.DEFERRAL_LIMIT), since a rebuild at 1,024
    attachments costs ≈ 0.5 s of the agent's CPU and interpreter lock. Scrapes in between get
    the cached text. What one rebuild costs is measured separately after a plain round's
    ADDs (printed, not asserted).

    Every scrape must answer 200 with the request-duration histogram, the attachments and
    in-flight gauges and the offload families; afterwards nothing of ours may be left (OVS
    ports, records, addresses, host links).
    """
    from tenantnet.plugin.drivers.ovs import host_ifname

    port = free_port()
    node = metrics_node_config(lab, run_dir, port, "")  # the default metricsOffloadInterval, 15 s
    agents.append(agent := start_ctl_agent(node))
    url = f"http://127.0.0.1:{port}/metrics"
    ipam_dir = lab.root / "ipam" / run_dir.name  # the lab's node config allows <lab>/ipam
    confs = {r: json.dumps({"cniVersion": "1.0.0", "name": f"tnm-rail{r}", "type": "tenantnet",
                            "bridge": lab.bridge, "vlan": 200 + r,
                            "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": f"10.{220 + r}.0.0/16"}]],
                                     "dataDir": str(ipam_dir)}}).encode() for r in range(1, RAILS + 1)}
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_PATH": f"{BIN}:/usr/lib/cni",
            "TENANTNET_CONFIG": str(node)}
    vswitchd = labmod.status(str(lab.root)).ovs_vswitchd_pid
    counters = {"agent_cpu": lambda: cpu_seconds(agent.proc.pid, children=True),
                "vswitchd_cpu": lambda: cpu_seconds(vswitchd)}
    names = [f"tnm-{uuid.uuid4().hex[:8]}" for _ in range(PODS)]
    rounds: list[dict[str, Any]] = []
    rebuild: dict[str, float] = {}
    attempted: set[str] = set()
    try:
        for n in names:  # one set of pods for every round: a DEL leaves the netns empty
            subprocess.run(["ip", "netns", "add", n], check=True)
        paths = [f"/run/netns/{n}" for n in names]
        assert "tenantnet_offload_up" in scrape(url)  # the offload report, built now (0 attachments)
        # Warm-up (not measured): the first ADDs of a fresh agent pay one-off costs.
        warm = run_burst(PLUGIN, base, confs, burst_jobs(paths[:16], RAILS), PARALLEL)
        assert [c for v in warm.values() for c, _ in v["results"]] == [0] * 2 * 16 * RAILS
        for i, kind in enumerate(ORDER):
            jobs = burst_jobs(paths, RAILS)
            attempted |= {host_ifname(cid, f"net{r}") for cid, _, r in jobs}
            scraper = Scraper(url) if kind == "scraped" else None
            endpoint_cpu = value(scrape(url), "tenantnet_metrics_cpu_seconds_total") or 0.0
            if scraper:
                scraper.start()
            try:
                phases = run_burst(PLUGIN, base, confs, jobs, PARALLEL, counters, verbs=("ADD",))
                # 1,024 attachments now; measured outside the phases' counters, and in a plain
                # round: the pause it makes is a quiet moment, in which the agent would rightly
                # rebuild its offload report — a scraper there would charge that to the burst.
                if i == PLAIN_FOR_REBUILD:
                    rebuild = offload_rebuild_cost(node)
                phases.update(run_burst(PLUGIN, base, confs, jobs, PARALLEL, counters, verbs=("DEL",)))
            finally:
                if scraper:
                    scraper.stop()
            endpoint_cpu = (value(scrape(url), "tenantnet_metrics_cpu_seconds_total") or 0.0) - endpoint_cpu
            failed = [out.decode()[-300:] for v in ("ADD", "DEL") for c, out in phases[v]["results"] if c]
            assert not failed, failed[:3]
            row = {"round": i + 1, "kind": kind,
                   "add_wall_s": phases["ADD"]["wall"], "del_wall_s": phases["DEL"]["wall"],
                   "add_cpu_s": phases["ADD"]["agent_cpu"], "del_cpu_s": phases["DEL"]["agent_cpu"],
                   "vswitchd_cpu_s": phases["ADD"]["vswitchd_cpu"] + phases["DEL"]["vswitchd_cpu"],
                   "endpoint_cpu_s": endpoint_cpu}
            if scraper:
                row.update(scraper.check())
            rounds.append(row)
            print(f"\nround {row['round']} {kind:7}: ADD {row['add_wall_s']:.2f} s wall, agent CPU ADD "
                  f"{row['add_cpu_s']:.2f} s + DEL {row['del_cpu_s']:.2f} s (of which /metrics "
                  f"{row['endpoint_cpu_s']:.3f} s), DEL {row['del_wall_s']:.2f} s wall"
                  + (f"; {row['scrapes']} scrapes, slowest {row['slowest_s']:.3f} s, "
                     f"largest {row['largest_bytes'] / 1024:.0f} KiB" if scraper else ""), flush=True)
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "delete", n], capture_output=True, check=False)

    def of(kind: str, key: str) -> list[float]:
        return [r[key] for r in rounds if r["kind"] == kind]

    cpu = {k: sum(of(k, "add_cpu_s")) + sum(of(k, "del_cpu_s")) for k in ("scraped", "plain")}
    wall = {k: sum(of(k, "add_wall_s")) for k in ("scraped", "plain")}
    cost = sum(of("scraped", "endpoint_cpu_s")) / cpu["scraped"]
    cpu_ratio, wall_ratio = cpu["scraped"] / cpu["plain"], wall["scraped"] / wall["plain"]
    summary = (f"/metrics cost the agent {sum(of('scraped', 'endpoint_cpu_s')):.3f} s of CPU in the scraped "
               f"bursts, {100 * cost:.2f} % of its {cpu['scraped']:.2f} s for them; "
               f"agent CPU per burst (ADD+DEL), sum over {len(of('plain', 'add_cpu_s'))} rounds each: "
               f"scraped {cpu['scraped']:.2f} s, plain {cpu['plain']:.2f} s → {cpu_ratio:.3f}×; "
               f"ADD wall, sum: scraped {wall['scraped']:.2f} s, plain {wall['plain']:.2f} s → {wall_ratio:.3f}×; "
               f"one offload rebuild at {PODS * RAILS} attachments: {rebuild['offload_build_cpu_s']:.2f} s CPU, "
               f"{rebuild['offload_samples']:.0f} samples, {rebuild['offload_bytes'] / 1024:.0f} KiB, "
               f"{rebuild['offload_serialise_cpu_s']:.3f} s CPU per scrape to serialise")
    print("\n" + summary)
    record_property("metrics_burst_rounds", json.dumps(rounds))
    record_property("metrics_burst_summary", summary)
    record_property("metrics_offload_rebuild", json.dumps(rebuild))

    assert lab.owned_ports() == []
    assert lab.records() == []
    with sqlite3.connect(ipam_dir / "ipam.db") as db:
        assert db.execute("SELECT count(*) FROM allocation").fetchone()[0] == 0
    assert [n for n in attempted if os.path.exists(f"/sys/class/net/{n}")] == []
    assert cost <= CPU_BOUND, summary
    assert wall_ratio <= 1 + WALL_BOUND, summary


# ---- what the endpoint says ------------------------------------------------------------------

def test_endpoint_counts_calls_errors_attachments_and_pools(lab, run_dir, agents, netns_factory):
    port = free_port()
    node = metrics_node_config(lab, run_dir, port)
    agents.append(agent := start_ctl_agent(node))
    url = f"http://127.0.0.1:{port}/metrics"
    network = f"tnm-{run_dir.name[-6:].lower()}"
    ipam_dir = lab.root / "ipam" / run_dir.name
    conf = {"cniVersion": "1.0.0", "name": network, "type": "tenantnet", "bridge": lab.bridge, "vlan": 30,
            "ipam": {"type": "tenantnet-ipam", "dataDir": str(ipam_dir),
                     "ranges": [[{"subnet": "10.125.0.0/24", "rangeStart": "10.125.0.10",
                                  "rangeEnd": "10.125.0.29"}]]}}

    def adds(fams: dict[str, Any]) -> float:
        return value(fams, "tenantnet_cni_request_duration_seconds_count", plugin="tenantnet", command="ADD") or 0

    before = scrape(url)
    attached = []
    try:
        for _ in range(3):
            ns, cid = netns_factory(), new_cid()
            code, out, _ = call(shim_env(node, "ADD", CNI_CONTAINERID=cid, CNI_IFNAME="net1", CNI_NETNS=ns.path), conf)
            assert code == 0, out
            attached.append(cid)
        ns = netns_factory()
        code, out, _ = call(shim_env(node, "ADD", CNI_CONTAINERID=new_cid(), CNI_IFNAME="net1", CNI_NETNS=ns.path),
                            {**conf, "vlan": 5000})
        assert code == 1 and out["code"] == 7, out
        # A scrape within BODY_REUSE (0.5 s) of the last is sent the same body; its records
        # may be RecordIndex.max_age (0.1 s) old.
        time.sleep(BODY_REUSE + 0.1)
        after = scrape(url)
        assert adds(after) - adds(before) == 4
        assert value(after, "tenantnet_cni_errors_total", plugin="tenantnet", command="ADD", code="7") == 1
        assert value(after, "tenantnet_attachments", mode="ovs", network=network, phase="ready") == 3
        assert value(after, "tenantnet_attachments", mode="ovs", network=network, phase="adding") is None
        assert value(after, "tenantnet_ipam_pool_addresses", network=network, range_set="0", family="ipv4") == 20
        assert value(after, "tenantnet_ipam_pool_used_addresses", network=network, range_set="0",
                     family="ipv4") == 3
        assert value(after, "tenantnet_agent_inflight") == 0
        report = json.loads(subprocess.run([CTL, "--node-config", str(node), "agent", "status", "--json"],
                                           capture_output=True, check=True).stdout)
        assert report["metrics"] == f"127.0.0.1:{port}"

        # A hostile CNI_COMMAND: through the plugin exec, then 1,000 random ones on the socket.
        code, out, _ = call(shim_env(node, "ADDX", CNI_CONTAINERID=new_cid(), CNI_IFNAME="net1",
                                     CNI_NETNS=ns.path), conf)
        assert code == 1, out
        rng = random.Random(7)
        alphabet = string.printable.replace("\x00", "") + "äÖ€\u202e"
        stdin = json.dumps(conf).encode()
        for _ in range(1000):
            command = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
            env = {k.encode(): v.encode() for k, v in shim_env(node, command, CNI_CONTAINERID=new_cid(),
                                                                 CNI_IFNAME="net1", CNI_NETNS=ns.path).items()}
            shim.ask(agent.socket, "tenantnet", env, stdin, 30)
        # The 1,001 calls may take less than BODY_REUSE since the last scrape (≈ 0.3 ms each
        # on the socket): without the wait this scrape can be sent that one's body again.
        time.sleep(BODY_REUSE + 0.1)
        hostile = scrape(url)
        histogram = hostile["tenantnet_cni_request_duration_seconds"].samples
        commands = {s.labels["command"] for s in histogram} | \
            {s.labels["command"] for s in hostile["tenantnet_cni_errors"].samples}
        assert commands <= {"ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "other"}, commands
        others = value(hostile, "tenantnet_cni_request_duration_seconds_count", plugin="tenantnet", command="other")
        assert others == 1001, others  # "ADDX" and the 1,000 (seeded: none of them is a CNI verb)
        assert adds(hostile) == adds(after)
    finally:
        for cid in attached:
            code, out, _ = call(shim_env(node, "DEL", CNI_CONTAINERID=cid, CNI_IFNAME="net1", CNI_NETNS=""), conf)
            assert code == 0, out
    time.sleep(BODY_REUSE + 0.1)
    idle = scrape(url)
    assert value(idle, "tenantnet_attachments", mode="ovs", network=network, phase="ready") is None
    assert value(idle, "tenantnet_agent_inflight") == 0
    assert lab.owned_ports() == [] and lab.records() == []
    with sqlite3.connect(ipam_dir / "ipam.db") as db:
        assert db.execute("SELECT count(*) FROM allocation").fetchone()[0] == 0


def test_with_a_token_file_scrapes_and_tenantnetctl_present_the_token(lab, run_dir, agents):
    """The real agent with metricsTokenFile: a scrape without the token gets 401, with it the
    families; `agent status` says a token is asked for; `tenantnetctl offload --prometheus`
    reads the agent's families with the token rather than falling back to reading OVS."""
    port = free_port()
    token = run_dir / "metrics-token"
    token.write_text(uuid.uuid4().hex + "\n")
    token.chmod(0o400)
    node = metrics_node_config(lab, run_dir, port, f"metricsTokenFile: {token}\n")
    agents.append(start_ctl_agent(node))
    url = f"http://127.0.0.1:{port}/metrics"
    status, text = get(url)
    assert status == 401 and "bearer token is required" in text
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token.read_text().strip()}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200 and "tenantnet_agent_inflight" in resp.read().decode()
    report = json.loads(subprocess.run([CTL, "--node-config", str(node), "agent", "status", "--json"],
                                       capture_output=True, check=True).stdout)
    assert report["metricsToken"] is True
    out = subprocess.run([CTL, "--node-config", str(node), "offload", "--prometheus"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "did not answer" not in out.stderr and "cannot be asked" not in out.stderr, out.stderr
    assert "tenantnet_offload_up" in out.stdout
