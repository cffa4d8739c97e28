"""First-packet round-trip time between two pods, with pre-warm and without, on the lab's OVS.

Per trial: two fresh pods (mode `ovs`, one network, VLAN 300), IPv6 off in both, each with a
static neighbour entry for the other (so the first packet is the ICMP echo itself, not an
ARP exchange), then one `ping -c 1` and, 0.2 s later, a second one for the steady state.
The network has `prewarm: true` or not; the two variants alternate trial by trial so that
machine noise hits both alike. The lab's datapath is OVS's userspace one (dpif-netdev): a
miss costs an upcall to ovs-vswitchd's handler thread and a flow translation — what a NIC
with tc flower pays too, plus the tc/driver insertion there (docs/offload.md).

    .venv/bin/python bench/bench_prewarm.py [--count 20] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import PLUGIN, node_configs, runtime_env, start_agent, stop_agent, write_block  # noqa: E402
from tenantnet.lab import node as lab  # noqa: E402

_TIME = re.compile(r"time=([0-9.]+) ms")
_MISSED = re.compile(r"lookups: hit:\d+ missed:(\d+)")


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False, timeout=30)


def _plugin(env: dict[str, str], conf: dict, command: str, cid: str, netns: str) -> dict:
    proc = subprocess.run([PLUGIN], input=json.dumps(conf).encode(), capture_output=True, check=False,
                          env={**env, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns})
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed: {proc.stdout.decode()} {proc.stderr.decode()}")
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def _ping(ns: str, address: str) -> float:
    res = _run("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", address)
    m = _TIME.search(res.stdout)
    if res.returncode != 0 or not m:
        raise SystemExit(f"ping {address} from {ns} failed: {res.stdout} {res.stderr}")
    return float(m.group(1))


def _missed(ctl: str) -> int:
    """Datapath misses so far (each one an upcall to ovs-vswitchd and a flow translation)."""
    out = _run("ovs-appctl", "-t", ctl, "dpctl/show").stdout
    return sum(int(m) for m in _MISSED.findall(out))


def trial(env: dict[str, str], conf: dict, ctl: str) -> tuple[float, float, float, int]:
    names = [f"tnpw-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    pods = []
    add_ms = 0.0
    try:
        for name in names:
            _run("ip", "netns", "add", name)
            for key in ("default", "all"):
                _run("ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1")
            cid = uuid.uuid4().hex
            started = time.perf_counter()
            out = _plugin(env, conf, "ADD", cid, f"/run/netns/{name}")
            add_ms = (time.perf_counter() - started) * 1000  # the second pod's: the one that pairs
            mac = next(i["mac"] for i in out["interfaces"] if i.get("sandbox"))
            pods.append((name, cid, mac, out["ips"][0]["address"].split("/")[0]))
        (na, _, maca, ipa), (nb, _, macb, ipb) = pods
        _run("ip", "-n", na, "neigh", "replace", ipb, "lladdr", macb, "dev", "net1", "nud", "permanent")
        _run("ip", "-n", nb, "neigh", "replace", ipa, "lladdr", maca, "dev", "net1", "nud", "permanent")
        before = _missed(ctl)
        first = _ping(na, ipb)
        misses = _missed(ctl) - before
        time.sleep(0.2)
        return first, _ping(na, ipb), add_ms, misses
    finally:
        for _, cid, _, _ in pods:
            _plugin(env, conf, "DEL", cid, "")
        for name in names:
            _run("ip", "netns", "delete", name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20, help="trials per variant (default 20)")
    ap.add_argument("--out", help="markdown file to update between the bench_prewarm markers")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tnpw-"))
    info = lab.up(str(work / "lab"))
    agent_conf, _ = node_configs(info.node_config, work)
    agent = start_agent(agent_conf, work / "agent.err")
    try:
        env = runtime_env(str(agent_conf))
        base = {"cniVersion": "1.0.0", "type": "tenantnet", "bridge": info.bridge, "vlan": 300,
                "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.230.0.0/24"}]],
                         "dataDir": str(work / "ipam")}}
        confs = {"pre-warm": {**base, "name": "bench-warm", "prewarm": True},
                 "no pre-warm": {**base, "name": "bench-cold"}}
        results: dict[str, list[tuple[float, float, float, int]]] = {k: [] for k in confs}
        ctl = f"{info.root}/ovs-vswitchd.ctl"
        for _ in range(args.count):
            for variant, conf in confs.items():
                results[variant].append(trial(env, conf, ctl))
    finally:
        stop_agent(agent)
        lab.down(info.root)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores, Linux {platform.release()}; "
             f"{args.count} fresh pod pairs per variant, alternating; each figure is one ping's "
             "round-trip time as ping reports it; the ADD is the second pod's (the pairer: it pairs "
             "with the first), exec'd through the trampoline and the agent.", "",
             "First-packet round trip (ICMP echo, static neighbours, lab userspace datapath, ms):", "",
             "| variant | first packet median | min | max | second packet median | datapath misses of "
             "the first exchange (median) | ADD of the pairer (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for variant, rows in results.items():
        firsts, seconds, adds = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
        lines.append(f"| {variant} | {statistics.median(firsts):.3f} | {min(firsts):.3f} | {max(firsts):.3f} "
                     f"| {statistics.median(seconds):.3f} | {statistics.median(r[3] for r in rows):g} "
                     f"| {statistics.median(adds):.0f} |")
    warm = statistics.median(r[0] for r in results["pre-warm"])
    cold = statistics.median(r[0] for r in results["no pre-warm"])
    lines += ["", f"The first packet takes {cold / warm:.1f}× as long without pre-warm as with it."]
    write_block(args.out, "bench_prewarm", lines)


if __name__ == "__main__":
    main()
