"""Issue 29's targets on the overlay lab (tenantnet/lab/ovn.py, a simulation: 2 nodes, 1 rail).

The tenantnet agent runs inside node1's network namespace (`tenantnetctl agent run` with the
lab's node config, so its agentSocket is `<node1 dir>/agent.sock`); every CNI call is an exec
of the plugin executable (`.venv/bin/tenantnet`, the trampoline) inside that namespace, which
forwards it to the agent. Measured in one run:

1. ADD (and DEL) through the agent in three variants, same agent, same node, same cluster
   IPAM (the lab's etcd): `red` = mode ovs on `br-vlan` (an OVS bridge of node1's vswitchd
   made here, netdev datapath), vlan 100; `blue` = mode ovs, overlay geneve, rail0 (br-int, an
   OVN logical switch port) with the lab's node config (ovn.installTimeout default: the ADD
   waits for ovn-installed), and `blue` again naming a copy with `installTimeout: 0` (the agent
   reads the node config each request names, so one agent serves both). Rounds interleaved,
   the order rotated each round, each ADD in a fresh pod netns (made and removed outside the
   timing); figure = the wall time of the exec (includes `ip netns exec` + `env`, measured
   alone and printed), plus the agent's `add.done` and the CPU the lab's daemons spent during
   the exec. Target ≤ 1.5× VLAN (medians), for each overlay variant.
1b. Where the time goes: a second agent (the same `tenantnetctl agent run`, wrapped in a
   scratch entry point, PROFILE below) logs perf_counter and thread CPU per call of the ADD's
   steps; 1 ms sleepers inside the agent and as their own process tell GIL waits from CPU
   starvation. Nothing in tenantnet is changed for it.
2. Port bound → first packet across nodes: a pod on node2 (ADD through the plugin) runs a UDP
   echo server; per round a fresh pod netns on node1 runs a prober that sends one datagram
   every 1 ms to node2's pod, either started before the ADD (`raw`: AF_PACKET frames, no ARP:
   the data path; `kernel-early`: a UDP socket sending from the moment the address is in) or
   once the ADD's exec has returned (`kernel`, `kernel-nowait`: a UDP socket, as an
   application the runtime starts after the ADD). All instants on CLOCK_MONOTONIC (one clock
   for every namespace of the host): the ADD's return, the LSP's insert as seen by an
   `ovsdb-client monitor` of the NB, node1's Interface getting ovn-installed (another
   monitor), the first datagram node2's pod receives (the echo server stamps it) and the
   first echo back. Target: median(ADD return → first delivered) ≤ 30 ms.
3. Agent memory with 10,000 logical ports of other nodes in the NB: 10,000 LSPs on `tn-blue`
   with tenantnet's ownership ids of 100 other nodes, in 4 transactions; then, in turn, fresh
   agents on node1: one with the `installTimeout: 0` node config doing an overlay ADD+DEL (so
   its NB connection and replica exist), one with the same config minus `ovn` doing a VLAN
   ADD+DEL; VmRSS of each from /proc/<pid>/status after its calls. Target: overlay − plain
   ≤ 50 MB.

    .venv/bin/python bench/bench_overlay.py [--adds 60] [--probes 10] [--profiled 20] [--others 10000]
                                           [--dir /tmp/tnb-overlay] [--keep] [--raw FILE]
                                           [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import summary, write_block  # noqa: E402
from tenantnet.lab import ovn  # noqa: E402

BIN = Path(sys.executable).parent
PLUGIN = str(BIN / "tenantnet")
CTL = str(BIN / "tenantnetctl")
VLAN_BRIDGE = "br-vlan"
ECHO_PORT = 7007
OTHER_NODES = 100
FILL_TXNS = 4
VARIANTS = ("vlan", "overlay-nowait", "overlay-wait")


def ipam(subnet: str) -> dict[str, Any]:
    return {"type": "tenantnet-ipam", "cluster": {"blockSize": 28}, "ranges": [[{"subnet": subnet}]]}


OVERLAY = {"cniVersion": "1.0.0", "name": "blue", "type": "tenantnet", "mode": "ovs", "overlay": "geneve",
           "rail": "rail0", "ipam": ipam("10.88.1.0/24")}
VLAN = {"cniVersion": "1.0.0", "name": "red", "type": "tenantnet", "mode": "ovs", "bridge": VLAN_BRIDGE,
        "vlan": 100, "ipam": ipam("10.88.2.0/24")}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def verdict(ok: bool, figure: str) -> str:
    return "met" if ok else f"**missed** ({figure})"


@dataclass
class Call:
    code: int
    out: str
    err: str
    ms: float
    returned: float  # CLOCK_MONOTONIC when the exec had exited


def cni(node: ovn.OvnNode, verb: str, netns: str, cid: str, conf: dict[str, Any],
        node_config: str | None = None) -> Call:
    """One exec of the plugin in `node`'s namespace, as a runtime inside that node would."""
    env = {"CNI_COMMAND": verb, "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{netns}" if netns else "",
           "CNI_IFNAME": "net1", "CNI_PATH": str(BIN),
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=p{cid[:6]}",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    cmd = ovn.in_node(node, [PLUGIN])
    if node_config:  # in_node's `env TENANTNET_CONFIG=` names the lab's; a later one wins
        cmd = [*cmd[:-1], f"TENANTNET_CONFIG={node_config}", PLUGIN]
    start = time.perf_counter()
    proc = subprocess.run(cmd, input=json.dumps(conf).encode(), env=env, capture_output=True, check=False)
    returned = time.monotonic()
    call = Call(proc.returncode, proc.stdout.decode(), proc.stderr.decode(),
                (time.perf_counter() - start) * 1000, returned)
    if call.code != 0:
        raise SystemExit(f"{verb} {conf['name']} on {node.name} failed ({call.code}): {call.out} {call.err}")
    return call


# ---------------------------------------------------------------------------- the agent

@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    socket: str
    pid: int = 0
    log: Path = field(default_factory=Path)

    def status(self) -> dict[str, Any]:
        from tenantnet.entry import agentctl

        return agentctl.query_status(self.socket)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise SystemExit(f"no VmRSS for the agent (pid {self.pid})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start_agent(node: ovn.OvnNode, node_config: str, work: Path, name: str) -> Agent:
    """`tenantnetctl agent run` inside `node`'s namespace with `node_config`, once it answers."""
    cmd = ovn.in_node(node, [CTL, "agent", "run"])
    cmd = [*cmd[:-3], f"TENANTNET_CONFIG={node_config}", *cmd[-3:]]
    return _spawn_agent(cmd, node_config, work / f"agent-{name}.log", f"agent {name}")


def _spawn_agent(cmd: list[str], node_config: str, log_path: Path, what: str,
                 env: dict[str, str] | None = None) -> Agent:
    """Start the agent `cmd` runs (its stderr to `log_path`) and return it once it answers on
    the node config's socket; SystemExit naming `what` if it does not within 30 s."""
    from tenantnet.entry import shim
    from tenantnet.plugin import nodepath

    with open(log_path, "wb") as err:
        # `ip netns exec` and `env` exec: the child's pid is the agent's
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    agent = Agent(proc, nodepath.agent_socket_of(node_config)[0], log=log_path)
    deadline = time.monotonic() + 30
    while True:
        try:
            agent.pid = int(agent.status()["pid"])
            return agent
        except (shim.AgentUnavailable, shim.AgentFailed):
            if proc.poll() is not None or time.monotonic() > deadline:
                agent.stop()
                raise SystemExit(f"{what} did not start: {log_path.read_text()}") from None
            time.sleep(0.05)


# ---------------------------------------------------------------------------- 1. ADD times

def no_wait_config(node: ovn.OvnNode, work: Path) -> str:
    """The lab's node config with `ovn.installTimeout: 0` (an overlay ADD returns without
    waiting for ovn-controller): same agentSocket, state and log, so the same agent serves
    it — the agent reads the node config a request names (TENANTNET_CONFIG)."""
    text = Path(node.node_config).read_text()
    if "\novn:\n" not in text:
        raise SystemExit(f"{node.node_config} has no ovn: section")
    path = work / "no-wait.yaml"
    path.write_text(text.replace("\novn:\n", "\novn:\n  installTimeout: 0\n", 1))
    return str(path)


def daemon_pids(root: str) -> dict[str, int]:
    """The lab's OVS/OVN daemons and etcd (their pid files under the lab root), by
    "<dir>/<name>" (central/ovn-northd, node1/ovn-controller, ...)."""
    pids = {}
    for pidfile in Path(root).rglob("*.pid"):
        try:
            pids[f"{pidfile.parent.name}/{pidfile.stem}"] = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return pids


def cpu_ms(pids: list[int]) -> float:
    """utime + stime of `pids` (ms)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total * 1000 / tick


def variant_confs(no_wait: str) -> dict[str, tuple[dict[str, Any], str | None]]:
    """variant -> (network config, node config to name; None: the lab's)."""
    return {"vlan": (VLAN, None), "overlay-nowait": (OVERLAY, no_wait), "overlay-wait": (OVERLAY, None)}


def add_times(lab: ovn.OvnLab, node: ovn.OvnNode, agent: Agent, count: int,
              no_wait: str, variants: tuple[str, ...] = VARIANTS) -> dict[str, list[float]]:
    """ADD+DEL per variant per round, interleaved, the variants' order rotated each round.
    Per ADD: the exec's wall time, the agent's `add.done` ms, and the CPU the lab's daemons
    and the agent spent during the exec."""
    confs = variant_confs(no_wait)
    times: dict[str, list[float]] = {f"{w}-{v}": [] for w in variants for v in ("add", "del", "daemon-cpu",
                                                                               "agent-cpu")}
    served0 = agent.status()["served"]
    daemons = daemon_pids(lab.root)
    timed: dict[str, str] = {}
    for i in range(-1, count):  # round -1: untimed (first NB connect, first switch, first block)
        for k in range(len(variants)):
            who = variants[(i + k) % len(variants)]
            conf, config = confs[who]
            netns = ovn.make_pod_netns(lab, node, f"a{uuid.uuid4().hex[:6]}")
            cid = uuid.uuid4().hex
            d0 = {name: cpu_ms([pid]) for name, pid in daemons.items()}
            a0 = cpu_ms([agent.pid])
            add = cni(node, "ADD", netns, cid, conf, node_config=config)
            d1 = {name: cpu_ms([pid]) for name, pid in daemons.items()}
            a1 = cpu_ms([agent.pid])
            dele = cni(node, "DEL", netns, cid, conf, node_config=config)
            subprocess.run(["ip", "netns", "delete", netns], check=True)
            if i >= 0:
                timed[cid] = who
                times[f"{who}-add"].append(add.ms)
                times[f"{who}-del"].append(dele.ms)
                times[f"{who}-daemon-cpu"].append(sum(d1.values()) - sum(d0.values()))
                for name in daemons:
                    times.setdefault(f"{who}-cpu:{name}", []).append(d1[name] - d0[name])
                times[f"{who}-agent-cpu"].append(a1 - a0)
    served = agent.status()["served"] - served0
    if served < 2 * len(variants) * (count + 1):
        raise SystemExit(f"the agent served {served} of {2 * len(variants) * (count + 1)} calls: not the "
                         "agent path")
    # the agent's own figure per ADD (its log's add.done ms: from the request to the result)
    from tenantnet.plugin import nodeconfig

    for line in Path(nodeconfig.load(node.node_config).log_file or "").read_text().splitlines():
        if '"add.done"' in line:
            entry = json.loads(line)
            if entry.get("container_id") in timed:
                times.setdefault(f"{timed[entry['container_id']]}-agent", []).append(float(entry["ms"]))
    return times


# ---------------------------------------------------------------------------- 1b. where the time goes

# An agent with its ADD steps timed: the same `tenantnetctl agent run`, after wrapping the
# functions an ADD calls (module/class attributes, looked up at call time) so that each call
# writes one JSON line (container id from the request's log context, perf_counter start/end,
# the thread's CPU); a thread sleeping 1 ms at a time logs how late it wakes (GIL held by
# another thread of the agent, or no CPU for the agent). The wrappers cost ~10-20 µs per step.
PROFILE = r'''
import functools, json, sys, threading, time
import structlog
from tenantnet.plugin import core, ipam_client, results
from tenantnet.plugin.drivers import base, ovnport, ovs, ovsport
from tenantnet.plugin.records import RecordStore
from tenantnet.plugin.system import ethtool, netlink, ovnnb
from tenantnet.entry import plugin as entry
from ovsdbapp.backend.ovs_idl import transaction

out = open(sys.argv[1], "a", buffering=1)
lock = threading.Lock()

def emit(**kw):
    with lock:
        out.write(json.dumps(kw) + "\n")

def wrap(owner, attr, label):
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*a, **k):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            ctx = structlog.contextvars.get_contextvars()
            emit(cid=ctx.get("container_id", ""), cmd=ctx.get("command", ""), step=label, t0=t0,
                 t1=time.perf_counter(), cpu=time.thread_time() - c0,
                 thread=threading.current_thread().name)
    setattr(owner, attr, timed)

for owner, attr, label in (
        (entry, "run_call", "request"), (core.Plugin, "add", "add"), (core.Plugin, "_add", "add.locked"),
        (core.tnconf, "settle", "conf.settle"), (ovs.OvsDriver, "plan", "plan"),
        (RecordStore, "save", "record.save"), (ovs.OvsDriver, "attach", "attach"),
        (ovs, "_bridge_seen", "attach.bridge-seen"),
        (netlink, "delete_host_link", "attach.delete-stale-link"),
        (netlink, "create_veth_into_netns", "attach.veth"), (ethtool, "set_tx_checksum", "pod.tx-csum-off"),
        (ovsport, "add_owned_port", "bg.ovs-port"), (ipam_client, "run", "ipam"),
        (ovs.OvsDriver, "addressed", "addressed"), (netlink, "configure_pod_interface", "pod.configure"),
        (results, "assemble", "result.assemble"), (base.Pending, "result", "core.waits"),
        (core.Plugin, "_ready", "ready"),
        (ovnport, "bind", "bg.ovn-bind"), (ovnport, "_nb", "ovn.nb-handle"),
        (ovnport, "wait_installed", "ovn.wait-installed"), (ovnport.Ovsdb, "interface_ids", "ovn.poll"),
        (ovnnb.OvnNb, "ensure_switch", "ovn.ensure-switch"), (ovnnb.OvnNb, "add_port", "ovn.add-port"),
        (ovnnb.OvnNb, "_commit", "ovn.txn"), (transaction.Transaction, "do_commit", "ovn.idl-do-commit")):
    wrap(owner, attr, label)

def lateness():
    """How late a 1 ms sleep wakes: the GIL held by another thread, or no CPU for this one."""
    while True:
        t = time.perf_counter()
        time.sleep(0.001)
        late = time.perf_counter() - t - 0.001
        if late > 0.0003:
            emit(step="late", t0=t, t1=t + 0.001 + late, late=late)

threading.Thread(target=lateness, name="bench-lateness", daemon=True).start()
sys.argv = ["tenantnetctl", "agent", "run"]
from tenantnet.ops import ctl
ctl.main()
'''


def start_profiled_agent(node: ovn.OvnNode, work: Path, steps: Path) -> Agent:
    path = [p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    cmd = ["ip", "netns", "exec", node.netns, "env", f"TENANTNET_CONFIG={node.node_config}",
           sys.executable, "-c", PROFILE, str(steps)]
    return _spawn_agent(cmd, node.node_config, work / "agent-profiled.log", "the profiled agent", env)


# The same 1 ms sleeper as a process of its own in node1's namespace: it wakes late only
# when no CPU is free (the GIL is not its concern), so the agent's sleeper minus this one is
# roughly the time the agent's threads waited for each other's GIL.
SLEEPER = r"""
import json, sys, time
out = open(sys.argv[1], "a", buffering=1)
while True:
    t = time.perf_counter()
    time.sleep(0.001)
    late = time.perf_counter() - t - 0.001
    if late > 0.0003:
        out.write(json.dumps({"step": "late", "t0": t, "t1": t + 0.001 + late, "late": late}) + "\n")
"""

# Steps of threads without a request's context (ovsdbapp's connection thread): counted in
# the ADD whose `add` window they start in.
UNTAGGED = ("ovn.idl-do-commit",)


def breakdown(steps: Path, outside: Path, timed: dict[str, str]) -> dict[str, dict[str, list[float]]]:
    """variant -> step -> ms per ADD (a step called twice in one ADD: summed), plus "late" /
    "late.outside" (ms the agent's / the outside 1 ms sleeper woke late within the ADD's `add`
    window) and "cpu.<step>" (the thread's CPU)."""
    per: dict[str, dict[str, float]] = {}
    late: dict[str, list[tuple[float, float, float]]] = {"late": [], "late.outside": []}
    untagged: list[dict[str, Any]] = []
    windows: dict[str, tuple[float, float]] = {}
    for path, key in ((steps, "late"), (outside, "late.outside")):
        for line in path.read_text().splitlines() if path.exists() else []:
            e = json.loads(line)
            if e["step"] == "late":
                late[key].append((e["t0"], e["t1"], e["late"]))
                continue
            if e["step"] in UNTAGGED:
                untagged.append(e)
                continue
            cid = e["cid"]
            if cid not in timed or e.get("cmd") != "ADD":
                continue
            d = per.setdefault(cid, {})
            d[e["step"]] = d.get(e["step"], 0.0) + (e["t1"] - e["t0"]) * 1000
            d["cpu." + e["step"]] = d.get("cpu." + e["step"], 0.0) + e["cpu"] * 1000
            d["n." + e["step"]] = d.get("n." + e["step"], 0) + 1
            if e["step"] == "add":
                windows[cid] = (e["t0"], e["t1"])
    for e in untagged:
        for cid, (a, b) in windows.items():
            if a <= e["t0"] <= b:
                d = per[cid]
                d[e["step"]] = d.get(e["step"], 0.0) + (e["t1"] - e["t0"]) * 1000
                d["cpu." + e["step"]] = d.get("cpu." + e["step"], 0.0) + e["cpu"] * 1000
    out: dict[str, dict[str, list[float]]] = {}
    for cid, d in per.items():
        if cid in windows:
            a, b = windows[cid]
            for key, spans in late.items():
                d[key] = sum(x * 1000 for t0, t1, x in spans if t1 > a and t0 < b)
        for step, ms in d.items():
            out.setdefault(timed[cid], {}).setdefault(step, []).append(ms)
    return out


def profiled_adds(lab: ovn.OvnLab, node: ovn.OvnNode, work: Path, count: int,
                  no_wait: str) -> dict[str, dict[str, list[float]]]:
    steps, outside = work / "steps.jsonl", work / "late-outside.jsonl"
    agent = start_profiled_agent(node, work, steps)
    sleeper = subprocess.Popen(["ip", "netns", "exec", node.netns, sys.executable, "-c", SLEEPER,
                                str(outside)])
    try:
        served0 = agent.status()["served"]
        confs = variant_confs(no_wait)
        timed: dict[str, str] = {}
        for i in range(-1, count):
            for k in range(len(VARIANTS)):
                who = VARIANTS[(i + k) % len(VARIANTS)]
                conf, config = confs[who]
                netns = ovn.make_pod_netns(lab, node, f"b{uuid.uuid4().hex[:6]}")
                cid = uuid.uuid4().hex
                cni(node, "ADD", netns, cid, conf, node_config=config)
                cni(node, "DEL", netns, cid, conf, node_config=config)
                subprocess.run(["ip", "netns", "delete", netns], check=True)
                if i >= 0:
                    timed[cid] = who
        if agent.status()["served"] - served0 < 2 * len(VARIANTS) * (count + 1):
            raise SystemExit("the profiled agent did not serve every call")
    finally:
        agent.stop()
        sleeper.terminate()
        sleeper.wait(10)
    return breakdown(steps, outside, timed)


NB_ALONE = r"""
import json, statistics, sys, time
from tenantnet.plugin.system import ovnnb
nb = ovnnb.connect(sys.argv[1], ovnnb.Scope(node=sys.argv[2]), 5)
nb.ensure_switch("bench-nb-alone", external_ids={}, segment=None, create_only=True)
deadline = time.monotonic() + 5
while True:  # the switch's row reaches this connection's replica a moment after its insert
    try:
        nb.add_port("tn-bench-nb-alone", "bench-alone-warm", "0a:00:00:00:ff:ff", ["10.99.255.255"],
                    {"tenantnet-container-id": "alonewarm", "tenantnet-ifname": "net1"})
        break
    except ovnnb.SwitchNotFound:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.01)
nb.delete_port("bench-alone-warm")
add = []
for i in range(int(sys.argv[3]) + 1):
    t = time.perf_counter()
    nb.add_port("tn-bench-nb-alone", f"bench-alone-{i}", f"0a:00:00:00:{i >> 8:02x}:{i & 255:02x}",
                [f"10.99.{i >> 8}.{i & 255}"],
                {"tenantnet-container-id": f"alone{i}", "tenantnet-ifname": "net1"})
    took = (time.perf_counter() - t) * 1000
    nb.delete_port(f"bench-alone-{i}")
    if i:
        add.append(took)
print(json.dumps(add))
"""


def nb_alone(lab: ovn.OvnLab, node: ovn.OvnNode, count: int = 20) -> list[float]:
    """ms of the ADD's NB write alone: OvnNb.add_port (the agent's scope, its connection up)
    from a process in `node`'s namespace against the lab's NB, on a switch of its own."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(["ip", "netns", "exec", node.netns, sys.executable, "-c", NB_ALONE, lab.nb,
                          node.name, str(count)], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the NB write alone failed: {out.stderr}")
    ovn.nbctl(lab.root, "ls-del", "tn-bench-nb-alone")
    return list(json.loads(out.stdout))


def exec_overhead(node: ovn.OvnNode, count: int = 20) -> float:
    """Median ms of `ip netns exec <node> env TENANTNET_CONFIG=… true`: in every call's figure."""
    cmd = ovn.in_node(node, ["true"])
    ms = []
    for _ in range(count):
        t = time.perf_counter()
        subprocess.run(cmd, check=True)
        ms.append((time.perf_counter() - t) * 1000)
    return statistics.median(ms)


# ---------------------------------------------------------------------------- 2. bound → first packet

# node2's pod: echoes every datagram, and prints (once per probe token) when the first arrived
ECHO = r"""
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
seen = set()
while True:
    data, peer = s.recvfrom(256)
    now = time.monotonic()
    token, seq = data.split()[:2]
    if token not in seen:
        seen.add(token)
        print(json.dumps({"token": token.decode(), "delivered": now, "seq": int(seq)}), flush=True)
    s.sendto(data, peer)
"""

# the new pod's prober, started before the ADD: every 1 ms one datagram to node2's pod.
# `kernel`: a UDP socket (sendto fails until the ADD has put the address in; the first one
# then waits for the kernel's ARP). `raw`: once net1 has its address, a whole Ethernet frame
# to the peer's MAC through an AF_PACKET socket — no ARP on the way, so what is timed is
# the data path (flows on both nodes, the tunnel), not the kernel's ARP timers.
PROBE = r"""
import fcntl, json, select, socket, struct, sys, time
mode, token, dst_ip, dst_mac, port, timeout, start = sys.argv[1:8]
port, SPORT = int(port), 7008
dst = socket.inet_aton(dst_ip)
dmac = bytes.fromhex(dst_mac.replace(":", ""))
deadline = time.monotonic() + float(timeout)
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("0.0.0.0", SPORT))
rx.setblocking(False)
raw = src = smac = None

def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    t = (t >> 16) + (t & 0xFFFF)
    return ~(t + (t >> 16)) & 0xFFFF

print("ready", flush=True)
if start == "after":  # an application started once the ADD has returned: the bench says when
    sys.stdin.readline()
sent = failed = 0
first_sent = None
while time.monotonic() < deadline:
    now = time.monotonic()
    payload = b"%s %d %r" % (token.encode(), sent, now)
    try:
        if mode == "kernel":
            rx.sendto(payload, (dst_ip, port))
        else:
            if raw is None:
                q = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                src = fcntl.ioctl(q.fileno(), 0x8915, struct.pack("256s", b"net1"))[20:24]   # SIOCGIFADDR
                smac = fcntl.ioctl(q.fileno(), 0x8927, struct.pack("256s", b"net1"))[18:24]  # SIOCGIFHWADDR
                q.close()
                raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
                raw.bind(("net1", 0))
            udp = struct.pack("!HHHH", SPORT, port, 8 + len(payload), 0) + payload
            ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), sent & 0xFFFF, 0, 64, 17, 0, src, dst)
            ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
            raw.send(dmac + smac + b"\x08\x00" + ip + udp)
        sent += 1
        first_sent = first_sent or now
    except OSError:
        raw = None
        failed += 1  # no net1, no address, link down yet: the ADD has not got that far
    r, _, _ = select.select([rx], [], [], 0.001)
    if r:
        try:
            data = rx.recv(256)
        except OSError:
            continue
        print(json.dumps({"reply": time.monotonic(), "first_sent": first_sent, "sent": sent,
                          "failed": failed}), flush=True)
        sys.exit(0)
print(json.dumps({"reply": None, "first_sent": first_sent, "sent": sent, "failed": failed}), flush=True)
"""


class Watch:
    """`ovsdb-client monitor` of one table: the instant (CLOCK_MONOTONIC at the line's arrival)
    each container id's row first showed `needle` (NB LSP "insert"; OVS Interface
    "ovn-installed": ovn-controller has installed the port's flows)."""

    def __init__(self, endpoint: str, db: str, table: str, needle: str) -> None:
        self.seen: dict[str, float] = {}
        self.needle = needle
        self.proc = subprocess.Popen(["stdbuf", "-oL", "ovsdb-client", "monitor", endpoint, db, table,
                                      "name,external_ids", "--format=csv"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        import re

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            m = re.search(r'tenantnet-container-id=\W*([0-9a-f]+)', line)
            if m and self.needle in line and ",initial," not in line:
                self.seen.setdefault(m.group(1), now)

    def wait(self, cid: str, timeout: float = 5) -> float | None:
        deadline = time.monotonic() + timeout
        while cid not in self.seen and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.seen.get(cid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Deliveries:
    """The echo server's stdout: token -> the instant its first datagram arrived on node2."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: dict[str, float] = {}
        self.proc = proc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            self.seen.setdefault(msg["token"], msg["delivered"])

    def wait(self, token: str, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while token not in self.seen and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.seen.get(token)


# (label, probe mode, installTimeout 0?, started after the ADD returned?)
PROBES = (("raw", "raw", False, False), ("kernel", "kernel", False, True),
          ("kernel-nowait", "kernel", True, True), ("kernel-early", "kernel", False, False))


def first_packet(lab: ovn.OvnLab, n1: ovn.OvnNode, n2: ovn.OvnNode, count: int,
                 procs: list[subprocess.Popen[str]], no_wait: str) -> dict[str, list[dict[str, float]]]:
    """Per probe ("raw", "kernel": the ADD waits for ovn-installed, as the lab's node config
    has it; "kernel-nowait": installTimeout 0), per round: instants relative to the ADD's
    return (ms)."""
    server_ns = ovn.make_pod_netns(lab, n2, "echo")
    cid2 = uuid.uuid4().hex
    res = json.loads(cni(n2, "ADD", server_ns, cid2, OVERLAY).out)
    server_ip = res["ips"][0]["address"].split("/")[0]
    server_mac = next(i["mac"] for i in res["interfaces"] if i.get("sandbox"))
    echo = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-I", "-S", "-c", ECHO,
                             str(ECHO_PORT)], stdout=subprocess.PIPE, text=True)
    procs.append(echo)
    assert echo.stdout is not None
    echo.stdout.readline()
    deliveries = Deliveries(echo)
    nb = Watch(lab.nb, "OVN_Northbound", "Logical_Switch_Port", ",insert,")
    local = Watch(n1.ovsdb, "Open_vSwitch", "Interface", "ovn-installed")
    time.sleep(0.3)  # the monitors' initial dumps are past
    rounds: dict[str, list[dict[str, float]]] = {label: [] for label, *_ in PROBES}
    try:
        for i in range(-1, count):  # round -1 untimed
            for label, mode, nowait, after in PROBES:
                config = no_wait if nowait else None
                netns = ovn.make_pod_netns(lab, n1, f"p{uuid.uuid4().hex[:6]}")
                token = uuid.uuid4().hex[:12]
                probe = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-I", "-S", "-c",
                                          PROBE, mode, token, server_ip, server_mac, str(ECHO_PORT), "5",
                                          "after" if after else "now"],
                                         stdin=subprocess.PIPE if after else subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, text=True)
                procs.append(probe)
                assert probe.stdout is not None
                probe.stdout.readline()  # ready: it is trying every 1 ms
                cid = uuid.uuid4().hex
                add = cni(n1, "ADD", netns, cid, OVERLAY, node_config=config)
                if after:  # a "now" prober may be done already (its first ARP went through)
                    assert probe.stdin is not None
                    probe.stdin.write("go\n")
                    probe.stdin.close()
                got = json.loads(probe.stdout.readline() or "{}")
                probe.wait(10)
                delivered = deliveries.wait(token, 1)
                lsp, installed = nb.wait(cid), local.wait(cid)
                cni(n1, "DEL", netns, cid, OVERLAY, node_config=config)
                subprocess.run(["ip", "netns", "delete", netns], check=True)
                if delivered is None:
                    raise SystemExit(f"round {i} ({label}): nothing delivered within 5 s: {got}")
                if i < 0:
                    continue
                r = {"add_ms": add.ms, "delivered": (delivered - add.returned) * 1000}
                if got.get("reply"):
                    r["reply"] = (got["reply"] - add.returned) * 1000
                if got.get("first_sent"):
                    r["first_sent"] = (got["first_sent"] - add.returned) * 1000
                if lsp is not None:
                    r["lsp"] = (lsp - add.returned) * 1000
                if installed is not None:
                    r["installed"] = (installed - add.returned) * 1000
                rounds[label].append(r)
                log(f"  {label} {i + 1}/{count}: ADD {add.ms:.0f} ms; from its return: LSP seen "
                    f"{r.get('lsp', float('nan')):.1f}, ovn-installed "
                    f"{r.get('installed', float('nan')):.1f}, "
                    f"first sent {r.get('first_sent', float('nan')):.1f}, delivered {r['delivered']:.1f}, "
                    f"echo back {r.get('reply', float('nan')):.1f} ms")
    finally:
        nb.stop()
        local.stop()
        echo.terminate()
        echo.wait(10)
        cni(n2, "DEL", server_ns, cid2, OVERLAY)
    return rounds


# ---------------------------------------------------------------------------- 3. memory

def fill_nb(lab: ovn.OvnLab, switch: str, count: int) -> float:
    """`count` LSPs of other nodes on `switch` (which exists), in FILL_TXNS transactions: seconds."""
    from tenantnet.plugin.system import ovsdb

    db = ovsdb.Ovsdb(lab.nb, 120)
    t = time.perf_counter()
    try:
        per = (count + FILL_TXNS - 1) // FILL_TXNS
        for start in range(0, count, per):
            ops: list[Any] = []
            names = []
            for i in range(start, min(count, start + per)):
                mac = f"0a:59:{(i >> 16) & 255:02x}:{(i >> 8) & 255:02x}:{i & 255:02x}:01"
                address = f"{mac} 10.{128 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"
                ops.append({"op": "insert", "table": "Logical_Switch_Port", "uuid-name": f"p{i}",
                            "row": {"name": f"other-{i}", "addresses": address, "port_security": address,
                                    "external_ids": ["map", [
                                        ["tenantnet-owner", "tenantnet"], ["tenantnet-network", "blue"],
                                        ["tenantnet-switch", switch],
                                        ["tenantnet-node", f"other{i % OTHER_NODES}"],
                                        ["tenantnet-container-id", f"{i:064x}"],
                                        ["tenantnet-ifname", "net1"]]]}})
                names.append(["named-uuid", f"p{i}"])
            ops.append({"op": "mutate", "table": "Logical_Switch", "where": [["name", "==", switch]],
                        "mutations": [["ports", "insert", ["set", names]]]})
            result = db._rpc_call("bench NB fill", "transact", ["OVN_Northbound", *ops])
            errors = [r for r in result if isinstance(r, dict) and r.get("error")]
            if errors or (isinstance(result[-1], dict) and result[-1].get("count") != 1):
                raise SystemExit(f"filling the NB failed: {errors or result[-1]}")
    finally:
        db.close()
    return time.perf_counter() - t


def plain_node_config(node: ovn.OvnNode, work: Path) -> str:
    """The lab's node config without `ovn` (a node without overlay), its own agent socket."""
    lines = []
    for line in Path(node.node_config).read_text().splitlines():
        if line.startswith("ovn:"):
            break
        if line.startswith("agentSocket:"):
            line = f"agentSocket: {work}/plain/agent.sock"
        lines.append(line)
    path = work / "plain.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def memory(lab: ovn.OvnLab, node: ovn.OvnNode, work: Path, rounds: int, agents: list[Agent],
           no_wait: str) -> dict[str, list[float]]:
    """RSS of fresh agents. The overlay one runs the `installTimeout: 0` copy: with 10,000
    ports on the switch, ovn-controller (on the lab's 2 shared cores) did not mark a new port
    installed within the default 10 s in a trial run, and what is measured here is memory."""
    plain = plain_node_config(node, work)
    rss: dict[str, list[float]] = {"overlay": [], "plain": [], "overlay-started": [], "plain-started": []}
    for r in range(rounds):
        for who, config, conf in (("overlay", no_wait, OVERLAY), ("plain", plain, VLAN)):
            agent = start_agent(node, config, work, f"{who}{r}")
            agents.append(agent)
            rss[f"{who}-started"].append(agent.rss_mb())
            netns = ovn.make_pod_netns(lab, node, f"m{uuid.uuid4().hex[:6]}")
            cid = uuid.uuid4().hex
            cni(node, "ADD", netns, cid, conf, node_config=config)
            cni(node, "DEL", netns, cid, conf, node_config=config)
            subprocess.run(["ip", "netns", "delete", netns], check=True)
            time.sleep(0.5)  # the NB monitor's updates after the DEL are in
            rss[who].append(agent.rss_mb())
            agent.stop()
            agents.remove(agent)
    return rss


# ---------------------------------------------------------------------------- report

STEPS = (  # (step, label) in the order an ADD runs them; "bg." ones on a helper thread
    ("request", "the agent's request (`run_call`: parse, node config, the ADD, the answer)"),
    ("add", "`Plugin.add` (what `add.done` times, plus settle and the lock)"),
    ("conf.settle", "network config settled (`tnconf.settle`, overlay parse)"),
    ("plan", "driver plan (names, pod MAC derived)"),
    ("record.save", "attachment record written (intent + ready: 2 saves)"),
    ("attach", "driver attach (main thread)"),
    ("attach.bridge-seen", "  bridge exists? (cached 30 s)"),
    ("attach.delete-stale-link", "  stale host link removed"),
    ("attach.veth", "  veth made, pod end moved in"),
    ("bg.ovs-port", "bg: OVS port transaction (local ovsdb-server)"),
    ("ipam", "bg: cluster IPAM (etcd)"),
    ("addressed", "overlay bind started (`addressed`, main thread)"),
    ("pod.configure", "pod interface addresses/routes/up"),
    ("pod.tx-csum-off", "  pod end TX checksum off (overlay: on that step's own socket)"),
    ("result.assemble", "result assembled"),
    ("core.waits", "core waits for background steps (`Pending.result`, all)"),
    ("ready", "`_ready` (pre-warm etc.)"),
    ("bg.ovn-bind", "bg: overlay bind (`ovnport.bind`, whole)"),
    ("ovn.nb-handle", "  NB handle (`ovnport._nb`)"),
    ("ovn.ensure-switch", "  ensure_switch (skipped while cached 30 s)"),
    ("ovn.add-port", "  `OvnNb.add_port`"),
    ("ovn.txn", "    of which the ovsdbapp transaction (`_commit`, caller's side)"),
    ("ovn.idl-do-commit", "      of which ovsdbapp's connection thread ran it (`do_commit`: to the reply)"),
    ("ovn.wait-installed", "  wait for `ovn-installed` (polls of the local OVSDB)"),
    ("late", "a 1 ms sleeper in the agent woke late, summed over the ADD (GIL or no free CPU)"),
    ("late.outside", "the same sleeper as its own process (no free CPU only)"),
)
LABELS = {"vlan": "VLAN", "overlay-nowait": "overlay, installTimeout 0 (no wait)",
          "overlay-wait": "overlay, default (waits for ovn-installed)"}


def report(args: argparse.Namespace, times: dict[str, list[float]], overhead: float,
           probes: dict[str, list[dict[str, float]]], steps: dict[str, dict[str, list[float]]],
           rss: dict[str, list[float]], fill_s: float, nb_ports: int, loads: list[str],
           took: float) -> list[str]:
    def med(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    def step(who: str, name: str, agg: Any = med) -> float:
        return float(agg(steps.get(who, {}).get(name) or [float("nan")]))

    def daemons(who: str) -> str:
        per = sorted(((mean(v), k.split(":", 1)[1]) for k, v in times.items() if k.startswith(f"{who}-cpu:")),
                     reverse=True)
        return ", ".join(f"{name} {ms:.1f}" for ms, name in per if ms >= 0.05) or "none"

    vl = summary(times["vlan-add"])
    nb_w = summary(times["nb-alone"])
    lines = [
        "## Overlay (issue 29)", "",
        f"`bench/bench_overlay.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Linux "
        f"{platform.release()}, Python {platform.python_version()}. The overlay lab "
        "(`tenantnet/lab/ovn.py`, a simulation: 2 nodes in network namespaces, each its own ovsdb-server, "
        "ovs-vswitchd with the userspace datapath and ovn-controller; OVN central and one etcd for cluster "
        "IPAM; one rail). The agent runs inside node1's namespace; every CNI call is an exec of "
        "`.venv/bin/tenantnet` (the trampoline) inside it, forwarded to the agent. Load average "
        f"(1/5/15 min): {' → '.join(loads)}; the bench took {took:.0f} s.", "",
        f"**1. ADD through the agent: VLAN vs overlay without and with the wait for ovn-installed** "
        f"({args.adds} rounds, in each round one ADD+DEL per variant in a fresh pod netns, the variants' "
        "order rotated per round; one agent serves all three — the overlay variants differ only in the "
        "node config the request names, the lab's (`ovn.installTimeout` default 10 s) or a copy with "
        "`installTimeout: 0`; ms of one exec)", "",
        "| ADD | median | p90 | ratio to VLAN (median) | ≤ 1.5× | agent's `add.done` median | p90 | "
        "lab daemons' CPU ms during the exec (mean) | agent CPU ms (mean) | DEL median |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    ratios: dict[str, float] = {}
    for who in VARIANTS:
        add, agent_ms = summary(times[f"{who}-add"]), summary(times.get(f"{who}-agent") or [float("nan")])
        ratios[who] = add["median"] / vl["median"]
        ok = "—" if who == "vlan" else verdict(ratios[who] <= 1.5, f"{ratios[who]:.2f}×")
        lines.append(f"| {LABELS[who]} | {add['median']:.1f} | {add['p90']:.1f} | {ratios[who]:.2f}× | "
                     f"{ok} | {agent_ms['median']:.1f} | {agent_ms['p90']:.1f} | "
                     f"{mean(times[f'{who}-daemon-cpu']):.1f} | {mean(times[f'{who}-agent-cpu']):.1f} | "
                     f"{med(times[f'{who}-del']):.1f} |")
    net = {w: (summary(times[f"{w}-add"])["median"] - overhead) / (vl["median"] - overhead) for w in VARIANTS}
    lines += [
        "", f"Each exec holds `ip netns exec` + `env` ({overhead:.1f} ms alone, median); without it the "
        f"ratios are {net['overlay-nowait']:.2f}× (no wait) and {net['overlay-wait']:.2f}× (wait). CPU "
        "columns: utime+stime from /proc (10 ms ticks, so a median of 0 or 10 is coarse) of the lab's "
        "ovsdb-servers, vswitchds, northd and ovn-controllers, and of the agent, between the exec's start "
        "and end (their sum over many ADDs is exact, each one coarse: hence means). Per daemon, mean CPU ms "
        f"per ADD — overlay without the wait: {daemons('overlay-nowait')}; with it: "
        f"{daemons('overlay-wait')}; VLAN: {daemons('vlan')}. The like-for-like pair is **VLAN vs overlay "
        "without the wait**: the VLAN ADD returns once its OVS port row is committed, without waiting "
        "for ovs-vswitchd to have the port or flows either. The waiting ADD returns a pod whose flows "
        "exist (section 2), which a VLAN ADD does not promise; its ratio is "
        "the price of that promise, not like for like. The NB write alone "
        f"(`OvnNb.add_port` from a process in node1's namespace, connection up, {len(times['nb-alone'])} "
        f"ports): {nb_w['median']:.1f} ms (p90 {nb_w['p90']:.1f}).", "",
        f"**1b. Where an ADD's time goes in the agent** ({args.profiled} rounds per variant with an agent "
        "whose ADD steps are timed: the same `tenantnetctl agent run` with the functions below wrapped to "
        "log perf_counter and thread CPU per call, ~10-20 µs each; a thread sleeping 1 ms at a time logs "
        "how late it wakes. Median ms per ADD; indented = part of the row above; `bg:` runs on a helper "
        "thread, overlapping the main thread's steps)", "",
        "| step | " + " | ".join(LABELS[w] for w in VARIANTS) + " |",
        "|---|" + "---:|" * len(VARIANTS)]
    for name, label in STEPS:
        cells = []
        for who in VARIANTS:
            vals = steps.get(who, {}).get(name)
            cpu = steps.get(who, {}).get("cpu." + name)
            cells.append("—" if not vals else f"{med(vals):.2f}" + (
                f" (cpu {med(cpu):.2f})" if cpu and name in ("request", "ovn.add-port", "ovn.wait-installed",
                                                              "bg.ovn-bind") else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    nw, wt, vn = "overlay-nowait", "overlay-wait", "vlan"
    gil = step(nw, "late") - step(nw, "late.outside")
    lines += [
        "", "(cpu …) = CPU of the thread running that step. Reading it, medians of this run:", "",
        f"- The agent's own ADD (`add`): VLAN {step(vn, 'add'):.1f} ms, overlay {step(nw, 'add'):.1f} ms "
        f"without the wait (+{step(nw, 'add') - step(vn, 'add'):.1f}), {step(wt, 'add'):.1f} ms with it "
        f"(+{step(wt, 'add') - step(vn, 'add'):.1f}).",
        f"- The main thread does the same work as VLAN plus the pod end's TX checksum off "
        f"({step(nw, 'pod.tx-csum-off'):.2f} ms: one ioctl on the socket the pod configuration holds in "
        f"the pod netns). But its steps run slower: pod interface configuration "
        f"{step(nw, 'pod.configure'):.1f} ms vs "
        f"{step(vn, 'pod.configure'):.1f} ms with the same thread CPU "
        f"({step(nw, 'cpu.pod.configure'):.2f} vs {step(vn, 'cpu.pod.configure'):.2f} ms): it waits, for a "
        f"CPU or the GIL. Then it waits for the overlay bind: {step(nw, 'core.waits'):.1f} ms without the "
        f"wait, {step(wt, 'core.waits'):.1f} ms with it (VLAN: {step(vn, 'core.waits'):.2f}).",
        f"- The bind's NB write (`OvnNb.add_port`): {step(nw, 'ovn.add-port'):.1f} ms in the ADD (the NB "
        f"write alone, from a quiet process, is {nb_w['median']:.1f} ms). Of it, ovsdbapp's connection "
        f"thread runs the transaction for {step(nw, 'ovn.idl-do-commit'):.1f} ms until the NB's reply, "
        f"{step(nw, 'cpu.ovn.idl-do-commit'):.2f} ms of it on CPU (python-ovs builds and parses the JSON in "
        "Python: the venv's `ovs` wheel has no C extension `ovs._json`); handing the transaction to that "
        f"thread and the result back costs {step(nw, 'ovn.txn') - step(nw, 'ovn.idl-do-commit'):.1f} ms. "
        "`ensure_switch` is off the path (a switch seen in the last 30 s is not asked again): 0 calls.",
        f"- No free CPU: a 1 ms sleeper as its own process wakes {step(nw, 'late.outside'):.1f} ms late in "
        f"total during an overlay ADD, {step(vn, 'late.outside'):.1f} ms during a VLAN one — on this "
        f"{os.cpu_count()}-core machine the lab's northd, NB/SB servers and both nodes' ovn-controllers "
        f"react to the new port while the agent works (CPU per ADD above). Inside the agent the same "
        f"sleeper is {step(nw, 'late'):.1f} ms late: ≈ {gil:.1f} ms more, the GIL held by the agent's "
        "other threads "
        "(ovsdbapp's connection thread parsing the reply and the replica's updates, the helpers).",
        f"- The wait for ovn-installed: {step(wt, 'ovn.wait-installed'):.1f} ms (p90 "
        f"{summary(steps.get(wt, {}).get('ovn.wait-installed') or [float('nan')])['p90']:.1f}), "
        f"{step(wt, 'n.ovn.poll'):.0f} polls of the local OVSDB (median; `wait_installed` sleeps 1 ms, then "
        "2 ms between them, so it sees the mark at most 2 ms late).", ""]

    def col(mode: str, key: str, base: str | None = None) -> list[float]:
        return [p[key] - (p[base] if base else 0) for p in probes[mode]
                if key in p and (not base or base in p)]

    rss_ov, rss_pl = statistics.median(rss["overlay"]), statistics.median(rss["plain"])
    extra = rss_ov - rss_pl
    lines += [
        f"**2. Port bound → first packet across nodes** ({len(probes['raw'])} pods on node1 per probe, one "
        "at a time, the probes alternating; the peer a pod on node2 running a UDP echo server that stamps "
        "each probe's first arriving datagram; the new pod's prober tries every 1 ms. `raw` (started "
        "before the ADD, waiting ADD): once net1 has its address, a whole Ethernet "
        "frame to the peer's MAC (AF_PACKET): the data path alone, no ARP. `kernel` (waiting ADD) and "
        "`kernel-nowait` (`installTimeout: 0`): a UDP socket opened once the ADD's exec has returned, as "
        "a container's application (the runtime starts it after the ADD) — the kernel ARPs first. "
        "`kernel-early` (waiting ADD): the UDP socket sending from before the ADD, i.e. from the moment the "
        "address is in, while the ADD still waits: what a process already in the pod would see. All "
        "instants on CLOCK_MONOTONIC, in ms after the ADD's exec returned; \"LSP seen\" and "
        "\"ovn-installed seen\" are the arrival of an `ovsdb-client monitor` notification of the NB row's "
        "insert and of node1's Interface getting `external_ids:ovn-installed`)", "",
        "| probe | instant (ms after the ADD returned) | median | min | max | each |",
        "|---|---|---:|---:|---:|---|"]
    for mode, *_ in PROBES:
        for key, base, label in (("add_ms", None, "the ADD exec itself (ms)"),
                                 ("lsp", None, "LSP insert seen"), ("installed", None, "ovn-installed seen"),
                                 ("first_sent", None, "first datagram sent"),
                                 ("delivered", None, "**first datagram delivered on node2**"),
                                 ("reply", None, "first echo back in the new pod"),
                                 ("delivered", "installed", "delivered − ovn-installed seen")):
            vals = col(mode, key, base)
            if vals:
                lines.append(f"| {mode} | {label} | {statistics.median(vals):.1f} | {min(vals):.1f} | "
                             f"{max(vals):.1f} | " + ", ".join(f"{v:.0f}" for v in vals) + " |")
    raw, kern = med(col("raw", "delivered")), med(col("kernel", "delivered"))

    def late(mode: str) -> str:
        vals = col(mode, "delivered")
        return f"{sum(1 for v in vals if v > 500)} of {len(vals)} rounds ≈ 1 s late"

    lines += [
        "", f"Target median(ADD returned → first packet delivered) ≤ 30 ms, with the wait — data path "
        f"(`raw`): {raw:.1f} ms, {verdict(raw <= 30, f'{raw:.1f} ms')}; an application started after the "
        f"ADD (`kernel`): {kern:.1f} ms, {verdict(kern <= 30, f'{kern:.1f} ms')} ({late('kernel')}). "
        f"Without the wait (`kernel-nowait`): {med(col('kernel-nowait', 'delivered')):.1f} ms "
        f"({late('kernel-nowait')}). A sender already running in the pod during the ADD (`kernel-early`): "
        f"{med(col('kernel-early', 'delivered')):.1f} ms ({late('kernel-early')}): its first ARP leaves "
        "as soon as the address is in — before the ADD's wait has seen ovn-installed — and is lost; the "
        "kernel retries after `retrans_time_ms` = 1000. The wait protects what the runtime starts after "
        "the ADD, not a process that sends during it. The way back is not covered by ovn-installed (that "
        "is node1's flows): the first echo reached the new pod ≈ 1 s late in "
        f"{sum(1 for v in col('kernel', 'reply') if v > 500)} of {len(col('kernel', 'reply'))} `kernel` "
        "rounds — node2's reply needed node2's side to know the new port (its ARP for the new pod, or its "
        "flows towards node1's new port, not yet in place when the first datagram arrived).", "",
        f"**3. Agent memory with {nb_ports} logical ports of other nodes in the NB** (on `tn-blue`, "
        f"tenantnet's ownership ids of {OTHER_NODES} other nodes, written in {FILL_TXNS} transactions in "
        f"{fill_s:.1f} s; {args.mem_rounds} fresh agent(s) each, alternating; VmRSS after the calls)", "",
        "| agent | RSS at start MB | RSS after ADD+DEL MB |", "|---|---:|---:|",
        f"| node config with `ovn`, overlay ADD+DEL (its NB connection up) | "
        f"{statistics.median(rss['overlay-started']):.1f} | {rss_ov:.1f} |",
        f"| the same config without `ovn`, VLAN ADD+DEL | {statistics.median(rss['plain-started']):.1f} | "
        f"{rss_pl:.1f} |", "",
        f"Overlay − plain: **{extra:+.1f} MB** (each: overlay "
        f"{', '.join(f'{v:.1f}' for v in rss['overlay'])}; "
        f"plain {', '.join(f'{v:.1f}' for v in rss['plain'])}). Target ≤ 50 MB: "
        f"{verdict(extra <= 50, f'{extra:.1f} MB')}. The difference holds ovsdbapp's and the OVS IDL's "
        "imports as well as the replica; the replica's row count is in-process only "
        "(`OvnNb.replica_rows`, bench/bench_ovnnb.py: 0 LSP rows held with 10,000 other-node ports).", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adds", type=int, default=60, help="ADD+DEL rounds per network (target 1)")
    ap.add_argument("--probes", type=int, default=10, help="pods timed to their first packet (target 2)")
    ap.add_argument("--others", type=int, default=10000, help="other nodes' LSPs in the NB (target 3)")
    ap.add_argument("--mem-rounds", type=int, default=2, help="fresh agents per variant (target 3)")
    ap.add_argument("--profiled", type=int, default=20, help="rounds with the ADD's steps timed (1b)")
    ap.add_argument("--raw", help="also write every figure as JSON here")
    ap.add_argument("--from-raw", help="only render the block from a --raw file (same counts as that run)")
    ap.add_argument("--dir", default="/tmp/tnb-overlay", help="the lab's root (removed first and after)")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    ap.add_argument("--out", help="markdown file to put the block in (docs/benchmarks.md)")
    args = ap.parse_args()
    if args.from_raw:  # render a run kept with --raw again (no lab)
        raw = json.loads(Path(args.from_raw).read_text())
        write_block(args.out, "bench_overlay", report(
            args, raw["times"], raw["overhead"], raw["probes"], raw["steps"], raw["rss"], raw["fill_s"],
            raw["nb_ports"], raw["loads"], raw["took"]))
        return
    started = time.monotonic()
    loads = [load()]
    agents: list[Agent] = []
    procs: list[subprocess.Popen[str]] = []
    log(f"overlay lab up in {args.dir} (load {loads[0]})")
    lab = ovn.up(args.dir, nodes=2, rails=1)
    try:
        n1, n2 = lab.nodes[:2]
        ovn.vsctl(n1, "add-br", VLAN_BRIDGE, "--", "set", "Bridge", VLAN_BRIDGE,
                  f"datapath_type={ovn.DATAPATH}")
        work = Path(n1.root) / "bench"
        work.mkdir(mode=0o700)
        (work / "plain").mkdir(mode=0o700)
        agent = start_agent(n1, n1.node_config, work, "main")
        agents.append(agent)
        overhead = exec_overhead(n1)
        no_wait = no_wait_config(n1, work)
        log(f"1. ADD/DEL VLAN vs overlay (no wait, wait for ovn-installed), {args.adds} rounds")
        times = add_times(lab, n1, agent, args.adds, no_wait)
        log("   ADD " + ", ".join(f"{w} {statistics.median(times[f'{w}-add']):.1f} ms" for w in VARIANTS)
            + f" (load {load()})")
        times["nb-alone"] = nb_alone(lab, n1)
        log(f"2. bound → first packet, {args.probes} pods per probe")
        probes = first_packet(lab, n1, n2, args.probes, procs, no_wait)
        agent.stop()
        agents.remove(agent)
        loads.append(load())
        log(f"1b. the ADD's steps, an agent with them timed, {args.profiled} rounds")
        steps = profiled_adds(lab, n1, work, args.profiled, no_wait)

        log(f"3. filling the NB with {args.others} LSPs of other nodes")
        fill_s = fill_nb(lab, "tn-blue", args.others)
        nb_ports = len(ovn.nbctl(args.dir, "--bare", "--columns=_uuid", "list",
                                 "Logical_Switch_Port").split())
        rss = memory(lab, n1, work, args.mem_rounds, agents, no_wait)
        loads.append(load())
        if args.raw:
            Path(args.raw).write_text(json.dumps({
                "times": times, "overhead": overhead, "probes": probes, "steps": steps, "rss": rss,
                "fill_s": fill_s, "nb_ports": nb_ports, "loads": loads, "took": time.monotonic() - started}))
        lines = report(args, times, overhead, probes, steps, rss, fill_s, nb_ports, loads,
                       time.monotonic() - started)
    finally:
        for a in agents:
            a.stop()
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(10)
        if not args.keep:
            log("lab down")
            ovn.down(args.dir)
    write_block(args.out, "bench_overlay", lines)
    log(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
