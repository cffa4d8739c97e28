"""Issue 29's targets on the overlay lab (tenantnet/lab/ovn.py, a simulation: 2 nodes, 1 rail).

The tenantnet agent runs inside node1's network namespace (`tenantnetctl agent run` with the
lab's node config, so its agentSocket is `<node1 dir>/agent.sock`); every CNI call is an exec
of the plugin executable (`.venv/bin/tenantnet`, the trampoline) inside that namespace, which
forwards it to the agent. Measured in one run:

1. ADD (and DEL) on an overlay network vs the same on a VLAN network, same agent, same node,
   same cluster IPAM (the lab's etcd): `blue` = mode ovs, overlay geneve, rail0 (br-int, an
   OVN logical switch port); `red` = mode ovs, bridge `br-vlan` (an OVS bridge of node1's
   vswitchd made here, netdev datapath), vlan 100. Rounds interleaved, each ADD in a fresh
   pod netns (made and removed outside the timing); figure = the wall time of the exec
   (includes `ip netns exec` + `env`, measured alone and printed). Target ≤ 1.5× (medians).
2. Port bound → first packet across nodes: a pod on node2 (ADD through the plugin) runs a UDP
   echo server; per round a fresh pod netns on node1 runs a prober *before* the ADD that
   sends one datagram every 1 ms to node2's pod (sendto fails until the ADD has put the
   address in; the kernel's ARP then resolves through OVN's ARP responder), and the ADD is
   made through the agent. All instants on CLOCK_MONOTONIC (one clock for every namespace of
   the host): the ADD's return (the exec has exited), the LSP's insert as seen by an
   `ovsdb-client monitor` of the NB (a notification: it trails the commit by the monitor's
   delivery), the first datagram node2's pod receives (the echo server stamps it) and the
   first echo the node1 pod receives. Target: median(ADD return → first delivered) ≤ 30 ms.
3. Agent memory with 10,000 logical ports of other nodes in the NB: 10,000 LSPs on `tn-blue`
   with tenantnet's ownership ids of 100 other nodes, in 4 transactions; then, in turn, fresh
   agents on node1: one with the lab's node config doing an overlay ADD+DEL (so its NB
   connection and replica exist), one with the same config minus `ovn` doing a VLAN ADD+DEL;
   VmRSS of each from /proc/<pid>/status after its calls. Target: overlay − plain ≤ 50 MB.

    .venv/bin/python bench/bench_overlay.py [--adds 60] [--probes 10] [--others 10000]
                                           [--dir /tmp/tnb-overlay] [--keep] [--out docs/benchmarks.md]
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
    from tenantnet.entry import shim
    from tenantnet.plugin import nodepath

    log_path = work / f"agent-{name}.log"
    cmd = ovn.in_node(node, [CTL, "agent", "run"])
    cmd = [*cmd[:-3], f"TENANTNET_CONFIG={node_config}", *cmd[-3:]]
    with open(log_path, "wb") as err:
        # `ip netns exec` and `env` exec: the child's pid is the agent's
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    agent = Agent(proc, nodepath.agent_socket_of(node_config)[0], log=log_path)
    deadline = time.monotonic() + 30
    while True:
        try:
            agent.pid = int(agent.status()["pid"])
            return agent
        except (shim.AgentUnavailable, shim.AgentFailed):
            if proc.poll() is not None or time.monotonic() > deadline:
                agent.stop()
                raise SystemExit(f"agent {name} did not start: {log_path.read_text()}") from None
            time.sleep(0.05)


# ---------------------------------------------------------------------------- 1. ADD times

def add_times(lab: ovn.OvnLab, node: ovn.OvnNode, agent: Agent, count: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {f"{w}-{v}": [] for w in ("overlay", "vlan") for v in ("add", "del")}
    served0 = agent.status()["served"]
    timed: dict[str, str] = {}
    for i in range(-1, count):  # round -1: untimed (first NB connect, first switch, first block)
        for who, conf in (("overlay", OVERLAY), ("vlan", VLAN)):
            netns = ovn.make_pod_netns(lab, node, f"a{uuid.uuid4().hex[:6]}")
            cid = uuid.uuid4().hex
            add = cni(node, "ADD", netns, cid, conf)
            dele = cni(node, "DEL", netns, cid, conf)
            subprocess.run(["ip", "netns", "delete", netns], check=True)
            if i >= 0:
                timed[cid] = who
                times[f"{who}-add"].append(add.ms)
                times[f"{who}-del"].append(dele.ms)
    served = agent.status()["served"] - served0
    if served < 4 * (count + 1):
        raise SystemExit(f"the agent served {served} of {4 * (count + 1)} calls: not the agent path")
    # the agent's own figure per ADD (its log's add.done ms: from the request to the result)
    from tenantnet.plugin import nodeconfig

    for line in Path(nodeconfig.load(node.node_config).log_file or "").read_text().splitlines():
        if '"add.done"' in line:
            entry = json.loads(line)
            if entry.get("container_id") in timed:
                times.setdefault(f"{timed[entry['container_id']]}-agent", []).append(float(entry["ms"]))
    return times


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
mode, token, dst_ip, dst_mac, port, timeout = sys.argv[1:7]
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


def first_packet(lab: ovn.OvnLab, n1: ovn.OvnNode, n2: ovn.OvnNode, count: int,
                 procs: list[subprocess.Popen[str]]) -> dict[str, list[dict[str, float]]]:
    """Per probe mode ("raw", "kernel"), per round: instants relative to the ADD's return (ms)."""
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
    rounds: dict[str, list[dict[str, float]]] = {"raw": [], "kernel": []}
    try:
        for i in range(-1, count):  # round -1 untimed
            for mode in ("raw", "kernel"):
                netns = ovn.make_pod_netns(lab, n1, f"p{uuid.uuid4().hex[:6]}")
                token = uuid.uuid4().hex[:12]
                probe = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-I", "-S", "-c",
                                          PROBE, mode, token, server_ip, server_mac, str(ECHO_PORT), "5"],
                                         stdout=subprocess.PIPE, text=True)
                procs.append(probe)
                assert probe.stdout is not None
                probe.stdout.readline()  # ready: it is trying every 1 ms
                cid = uuid.uuid4().hex
                add = cni(n1, "ADD", netns, cid, OVERLAY)
                got = json.loads(probe.stdout.readline() or "{}")
                probe.wait(10)
                delivered = deliveries.wait(token, 1)
                lsp, installed = nb.wait(cid), local.wait(cid)
                cni(n1, "DEL", netns, cid, OVERLAY)
                subprocess.run(["ip", "netns", "delete", netns], check=True)
                if delivered is None:
                    raise SystemExit(f"round {i} ({mode}): nothing delivered within 5 s: {got}")
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
                rounds[mode].append(r)
                log(f"  {mode} {i + 1}/{count}: ADD {add.ms:.0f} ms; from its return: LSP seen "
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


def memory(lab: ovn.OvnLab, node: ovn.OvnNode, work: Path, rounds: int,
           agents: list[Agent]) -> dict[str, list[float]]:
    plain = plain_node_config(node, work)
    rss: dict[str, list[float]] = {"overlay": [], "plain": [], "overlay-started": [], "plain-started": []}
    for r in range(rounds):
        for who, config, conf in (("overlay", node.node_config, OVERLAY), ("plain", plain, VLAN)):
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

def report(args: argparse.Namespace, times: dict[str, list[float]], overhead: float,
           probes: dict[str, list[dict[str, float]]], rss: dict[str, list[float]], fill_s: float,
           nb_ports: int, loads: list[str], took: float) -> list[str]:
    ov_add, vl_add = summary(times["overlay-add"]), summary(times["vlan-add"])
    ov_del, vl_del = summary(times["overlay-del"]), summary(times["vlan-del"])
    ratio = ov_add["median"] / vl_add["median"]
    ov_in = summary(times["overlay-agent"]) if times.get("overlay-agent") else {}
    vl_in = summary(times["vlan-agent"]) if times.get("vlan-agent") else {}
    nb_w = times["nb-alone"]
    nb_w_s = summary(nb_w)
    net_ratio = (ov_add["median"] - overhead) / (vl_add["median"] - overhead)

    def col(mode: str, key: str, base: str | None = None) -> list[float]:
        return [p[key] - (p[base] if base else 0) for p in probes[mode]
                if key in p and (not base or base in p)]

    rss_ov, rss_pl = statistics.median(rss["overlay"]), statistics.median(rss["plain"])
    extra = rss_ov - rss_pl
    lines = [
        "## Overlay (issue 29)", "",
        f"`bench/bench_overlay.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Linux "
        f"{platform.release()}, Python {platform.python_version()}. The overlay lab "
        "(`tenantnet/lab/ovn.py`, a simulation: 2 nodes in network namespaces, each its own ovsdb-server, "
        "ovs-vswitchd with the "
        "userspace datapath and ovn-controller; OVN central and one etcd for cluster IPAM; one rail). The "
        "agent runs inside node1's namespace; every CNI call is an exec of `.venv/bin/tenantnet` (the "
        "trampoline) inside it, forwarded to the agent. Load average (1/5/15 min): "
        f"{' → '.join(loads)}; the bench took {took:.0f} s.", "",
        f"**1. ADD through the agent, overlay vs VLAN** ({args.adds} rounds interleaved, a fresh pod "
        "netns each; same agent, node and cluster IPAM; ms of one exec)", "",
        "| verb | overlay median | p90 | VLAN median | p90 | ratio (median) |",
        "|---|---:|---:|---:|---:|---:|",
        f"| ADD | {ov_add['median']:.1f} | {ov_add['p90']:.1f} | {vl_add['median']:.1f} | "
        f"{vl_add['p90']:.1f} | "
        f"{ratio:.2f}× |",
        f"| DEL | {ov_del['median']:.1f} | {ov_del['p90']:.1f} | {vl_del['median']:.1f} | "
        f"{vl_del['p90']:.1f} | "
        f"{ov_del['median'] / vl_del['median']:.2f}× |",
        *([f"| ADD, the agent's own `add.done` ms | {ov_in['median']:.1f} | {ov_in['p90']:.1f} | "
           f"{vl_in['median']:.1f} | {vl_in['p90']:.1f} | {ov_in['median'] / vl_in['median']:.2f}× |"]
          if ov_in and vl_in else []), "",
        f"Overlay = mode ovs, `overlay: geneve` on rail0 (veth on br-int, the logical switch port written "
        f"through ovsdbapp); VLAN = mode ovs on `{VLAN_BRIDGE}` (an OVS bridge of the same vswitchd, "
        "netdev), vlan 100. Each figure holds `ip netns exec` + `env` "
        f"({overhead:.1f} ms alone, median); without it the ratio is {net_ratio:.2f}×. Target ADD ≤ 1.5× "
        f"VLAN: {verdict(ratio <= 1.5, f'{ratio:.2f}×')} (on the exec's wall time, the issue's agent path)"
        + (f"; the agent's own processing alone is {ov_in['median'] / vl_in['median']:.2f}× "
           f"(+{ov_in['median'] - vl_in['median']:.1f} ms). Of that, the logical switch port's NB "
           f"transaction alone (`OvnNb.add_port` from node1's namespace, same NB, connection up, "
           f"{len(nb_w)} ports) takes {nb_w_s['median']:.1f} ms (p90 {nb_w_s['p90']:.1f}); the pod end's TX "
           "checksum off is one ioctl (≈ 0.1 ms, measured once by hand); the rest is not attributed (the "
           "agent logs no per-step times). The lab's northd, ovn-controllers and vswitchds share the "
           "machine's cores with the agent" if ov_in and vl_in else "") + ".", "",
        f"**2. Port bound → first packet across nodes** ({len(probes['raw'])} pods on node1 per probe, "
        "one at a time, the two probes alternating; the peer a pod on node2 running a UDP echo server that "
        "stamps each probe's first arriving datagram; the new pod's prober, started before the ADD, tries "
        "every 1 ms. `raw`: once net1 has its address, a whole Ethernet frame to the peer's MAC "
        "(AF_PACKET): the data path alone, no ARP. `kernel`: a UDP socket, as an application would send "
        "(the kernel ARPs first). All instants on CLOCK_MONOTONIC, in ms after the ADD's exec returned; "
        "\"LSP seen\" and \"ovn-installed\" are the arrival of an `ovsdb-client monitor` notification of "
        "the NB row's insert and of node1's Interface getting `external_ids:ovn-installed` (ovn-controller "
        "has installed the port's flows))", "",
        "| probe | instant (ms after the ADD returned) | median | min | max | each |",
        "|---|---|---:|---:|---:|---|"]
    for mode in ("raw", "kernel"):
        for key, base, label in (("lsp", None, "LSP insert seen"), ("installed", None, "ovn-installed seen"),
                                 ("first_sent", None, "first datagram sent"),
                                 ("delivered", None, "**first datagram delivered on node2**"),
                                 ("reply", None, "first echo back in the new pod"),
                                 ("delivered", "lsp", "delivered − LSP seen"),
                                 ("delivered", "installed", "delivered − ovn-installed seen")):
            vals = col(mode, key, base)
            if vals:
                lines.append(f"| {mode} | {label} | {statistics.median(vals):.1f} | {min(vals):.1f} | "
                             f"{max(vals):.1f} | " + ", ".join(f"{v:.0f}" for v in vals) + " |")
    adds = [p["add_ms"] for m in probes for p in probes[m]]
    raw, kern = statistics.median(col("raw", "delivered")), statistics.median(col("kernel", "delivered"))
    slow = sum(1 for v in col("kernel", "delivered") if v > 500)
    lines += [
        "", f"The ADDs themselves: median {statistics.median(adds):.1f} ms. Target median(ADD returned "
        f"→ first packet delivered) ≤ 30 ms — data path (`raw`): {verdict(raw <= 30, f'{raw:.1f} ms')}; an "
        f"application's first datagram (`kernel`): {verdict(kern <= 30, f'{kern:.1f} ms')}. In {slow} of "
        f"{len(col('kernel', 'delivered'))} kernel rounds the first datagram arrived ≈ 1 s after the ADD: "
        "consistent with the pod's first ARP request being dropped (the pod can send from the moment its "
        "address is in, before the ADD returns and often before ovn-controller has installed the port's "
        "flows, see ovn-installed) and the kernel retrying after `retrans_time_ms` = 1000 — not captured "
        "on the wire here. The raw probe shows the data path itself ready within a few ms of ovn-installed; "
        "an ADD that returned only once the Interface shows `ovn-installed` (what OVN-Kubernetes waits for) "
        "would give an application the same.", "",
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
    ap.add_argument("--dir", default="/tmp/tnb-overlay", help="the lab's root (removed first and after)")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    ap.add_argument("--out", help="markdown file to put the block in (docs/benchmarks.md)")
    args = ap.parse_args()
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
        log(f"1. ADD/DEL overlay vs VLAN, {args.adds} rounds")
        times = add_times(lab, n1, agent, args.adds)
        log(f"   overlay ADD {statistics.median(times['overlay-add']):.1f} ms, VLAN ADD "
            f"{statistics.median(times['vlan-add']):.1f} ms (load {load()})")
        times["nb-alone"] = nb_alone(lab, n1)
        log(f"2. bound → first packet, {args.probes} pods")
        probes = first_packet(lab, n1, n2, args.probes, procs)
        agent.stop()
        agents.remove(agent)
        loads.append(load())
        log(f"3. filling the NB with {args.others} LSPs of other nodes")
        fill_s = fill_nb(lab, "tn-blue", args.others)
        nb_ports = len(ovn.nbctl(args.dir, "--bare", "--columns=_uuid", "list",
                                 "Logical_Switch_Port").split())
        rss = memory(lab, n1, work, args.mem_rounds, agents)
        loads.append(load())
        lines = report(args, times, overhead, probes, rss, fill_s, nb_ports, loads,
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
