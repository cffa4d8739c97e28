"""The fast path: tenantnet through the shim + agent, beside the in-process plugin and
Debian's Go `bridge` + `host-local`, measured in the same run on this machine.

1. ADD/DEL latency, mode `ovs` on the lab's OVS, one attachment at a time, interleaved:
   trampoline + agent with tenantnet-ipam (in the agent) and with Go host-local (exec'd by
   the agent); in-process (no agent) with host-local; Go bridge + host-local.
2. The exec's own cost: VERSION through an agent (which does nothing for it) by the
   trampoline and by the Python shim, beside /bin/true, the bare interpreter, Go bridge's
   VERSION and VERSION in-process.
3. The burst: 128 pods × 8 attachments (1,024 ADDs, 16 execs in parallel, lab OVS ports,
   tenantnet-ipam), then the 1,024 DELs; afterwards no OVS port, address or record may be
   left; the agent's peak RSS and the CPU the agent and ovs-vswitchd used. Twice: with one
   network and VLAN per rail (as GPU clusters deploy rails), and with every rail on one
   network and VLAN (all 1,024 ports in one broadcast domain).

Every figure is the wall time of one exec as a runtime would see it (env + stdin, fork +
exec + wait); netns creation is outside the timing.

    .venv/bin/python bench/bench_agent.py [--count 30] [--pods 128] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    PLUGIN,
    burst_jobs,
    cpu_seconds,
    exec_plugin,
    machine_line,
    node_configs,
    run_burst,
    runtime_env,
    start_agent,
    stop_agent,
    summary,
    table,
    write_block,
)
from tenantnet.entry import agentctl as agentmod  # noqa: E402
from tenantnet.lab import node as lab  # noqa: E402

GO_BRIDGE = "/usr/lib/cni/bridge"


def netns_add(name: str) -> str:
    subprocess.run(["ip", "netns", "add", name], check=True)
    return f"/run/netns/{name}"


def timed(cmd: list[str], env: dict[str, str], stdin: bytes) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, input=stdin, env=env, capture_output=True, check=False)
    elapsed = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed: {proc.stdout.decode()} {proc.stderr.decode()}")
    return elapsed


def latency(info: lab.LabInfo, work: Path, agent_conf: Path, plain_conf: Path, count: int) -> list[str]:
    base = runtime_env()
    hostlocal = {"type": "host-local", "ranges": [[{"subnet": "10.211.0.0/16"}]], "dataDir": str(work / "hl")}
    own = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.212.0.0/16"}]], "dataDir": str(work / "ipam")}
    ours = {"cniVersion": "1.0.0", "name": "bench-agent", "type": "tenantnet", "bridge": info.bridge,
            "vlan": 100}
    go = {"cniVersion": "1.0.0", "name": "bench-go", "type": "bridge", "bridge": "tnbench1",
          "ipam": {**hostlocal, "ranges": [[{"subnet": "10.213.0.0/16"}]]}}
    variants = {
        "agent+own": (PLUGIN, agent_conf, {**ours, "ipam": own}),
        "agent+hl": (PLUGIN, agent_conf, {**ours, "ipam": hostlocal}),
        "inproc+hl": (PLUGIN, plain_conf, {**ours, "ipam": hostlocal}),
        "go": (GO_BRIDGE, plain_conf, go),
    }
    times: dict[str, list[float]] = {f"{v}-{verb}": [] for v in variants for verb in ("add", "del")}
    for i in range(count):
        for who, (cmd, node, conf) in variants.items():
            name = f"tnba-{uuid.uuid4().hex[:8]}"
            path = netns_add(name)
            try:
                env = {**base, "TENANTNET_CONFIG": str(node), "CNI_CONTAINERID": uuid.uuid4().hex,
                       "CNI_NETNS": path}
                times[f"{who}-add"].append(exec_plugin(cmd, {**env, "CNI_COMMAND": "ADD"}, conf))
                times[f"{who}-del"].append(exec_plugin(cmd, {**env, "CNI_COMMAND": "DEL"}, conf))
            finally:
                subprocess.run(["ip", "netns", "delete", name], check=False)
        print(f"\rlatency {i + 1}/{count}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    subprocess.run(["ip", "link", "delete", "tnbench1"], capture_output=True, check=False)
    s = {k: summary(v) for k, v in times.items()}
    lines = ["**Mode `ovs`, one attachment at a time** (ratio: against Go `bridge`+`host-local`):", ""]
    lines += table([("ADD", s["agent+own-add"], s["go-add"]), ("DEL", s["agent+own-del"], s["go-del"])],
                   "trampoline+agent, tenantnet-ipam", "Go `bridge`+`host-local`")
    lines += ["", *table([("ADD", s["agent+hl-add"], s["go-add"]), ("DEL", s["agent+hl-del"], s["go-del"])],
                         "trampoline+agent, Go host-local", "Go `bridge`+`host-local`")]
    lines += ["", *table([("ADD", s["inproc+hl-add"], s["go-add"]), ("DEL", s["inproc+hl-del"], s["go-del"])],
                         "in-process (no agent), Go host-local", "Go `bridge`+`host-local`")]
    return lines


def overhead(agent_conf: Path, plain_conf: Path, count: int) -> list[str]:
    """The floor each figure stands on: VERSION through the agent (which does nothing but
    answer) by the trampoline and by the Python shim, beside an exec of /bin/true, the bare
    interpreter and Go `bridge` answering VERSION itself."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": "VERSION"}
    shim = str(Path(PLUGIN).with_name("tenantnet-shim"))
    rows: dict[str, list[float]] = {"true": [], "python-IS": [], "go": [], "trampoline": [], "shim": [],
                                    "inproc": []}
    for _ in range(count):
        rows["true"].append(timed(["/bin/true"], base, b""))
        rows["python-IS"].append(timed([sys.executable, "-I", "-S", "-c", "pass"], base, b""))
        rows["go"].append(timed([GO_BRIDGE], base, b"{}"))
        rows["trampoline"].append(timed([PLUGIN], {**base, "TENANTNET_CONFIG": str(agent_conf)}, b"{}"))
        rows["shim"].append(timed([shim], {**base, "TENANTNET_CONFIG": str(agent_conf)}, b"{}"))
        rows["inproc"].append(timed([PLUGIN], {**base, "TENANTNET_CONFIG": str(plain_conf)}, b"{}"))
    s = {k: summary(v) for k, v in rows.items()}
    labels = {"true": "`/bin/true` (what any exec costs from here)",
              "python-IS": "`python -I -S -c pass` (the interpreter as the Python shim starts it)",
              "go": "Go `bridge` answering VERSION itself",
              "trampoline": "trampoline → agent (`tenantnet`, the compiled exec)",
              "shim": "Python shim → agent (`tenantnet-shim`, the portable fallback)",
              "inproc": "trampoline, no agent → Python shim → in-process"}
    ratio = s["trampoline"]["median"] / s["true"]["median"]
    return ["**The exec's own cost** (VERSION: the agent does nothing but answer):", "",
            "| exec | median | p90 |", "|---|---:|---:|",
            *(f"| {label} | {s[k]['median']:.2f} | {s[k]['p90']:.2f} |" for k, label in labels.items()),
            "", f"The trampoline's VERSION through the agent takes {ratio:.2f}× an exec of `/bin/true` "
            "(target ≤ 1.5×); the Python shim's, "
            f"{s['shim']['median'] / s['true']['median']:.1f}×."]


def burst(info: lab.LabInfo, work: Path, agent_conf: Path, agent_pid: int, sock: str, pods: int,
          rails: int, parallel: int, one_vlan: bool) -> list[str]:
    """`pods` pods × `rails` attachments, ADDs then DELs, `parallel` execs at once. Each pod
    has one container id and interfaces net1..netN. Rails are separate networks (rail<r>,
    VLAN 200+r, a subnet each), as GPU clusters deploy them; with `one_vlan` every rail is on
    one network and VLAN instead, so all ports share one broadcast domain."""
    layout = "one-vlan" if one_vlan else "rails"
    ipam_dir = work / f"burst-ipam-{layout}"

    def network(r: int) -> bytes:
        r = 1 if one_vlan else r
        ipam = {"type": "tenantnet-ipam", "ranges": [[{"subnet": f"10.{220 + r}.0.0/16"}]],
                "dataDir": str(ipam_dir)}
        return json.dumps({"cniVersion": "1.0.0", "name": f"bench-{layout}-{r}", "type": "tenantnet",
                           "bridge": info.bridge, "vlan": 200 + r, "ipam": ipam}).encode()

    confs = {r: network(r) for r in range(1, rails + 1)}
    names = [f"tnbb-{uuid.uuid4().hex[:8]}" for _ in range(pods)]
    paths = [netns_add(n) for n in names]
    base = runtime_env(str(agent_conf))  # CNI_IFNAME and CNI_ARGS are set per call (run_burst)
    jobs = burst_jobs(paths, rails)

    cpu: dict[str, float] = {}
    try:
        phases = run_burst(PLUGIN, base, confs, jobs, parallel,
                           {"agent": lambda: cpu_seconds(agent_pid),
                            "vswitchd": lambda: cpu_seconds(info.ovs_vswitchd_pid)})
        for verb, phase in phases.items():
            for what in ("agent", "vswitchd", "wall"):
                cpu[f"{verb}-{what}"] = phase[what]
        adds, dels = phases["ADD"]["results"], phases["DEL"]["results"]
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "delete", n], check=False)
    failed = sorted({json.loads(out)["msg"][-160:] for c, out in adds + dels if c != 0 and out.strip()})
    status = agentmod.query_status(sock)
    ports = json.loads(lab.vsctl(info.root, "--format=json", "--columns=name,external_ids", "list", "Port"))
    owned = [n for n, ids in ports["data"] if dict(ids[1]).get("tenantnet-owner") == "tenantnet"]
    with sqlite3.connect(ipam_dir / "ipam.db") as db:
        addresses = db.execute("SELECT count(*) FROM allocation").fetchone()[0]
    records = [p for p in (Path(info.state_dir) / "attachments").rglob("*") if p.is_file()]
    n = len(jobs)
    what = ("every rail on one network and VLAN (one broadcast domain of all ports)" if one_vlan else
            f"one network and VLAN per rail ({rails} networks)")
    rows = []
    for verb, results in (("ADD", adds), ("DEL", dels)):
        wall = cpu[verb + "-wall"]
        rows.append(f"| {n} {verb}s | {wall:.1f} | {wall * 1000 / n:.1f} | {sum(1 for c, _ in results if c)} "
                    f"| {cpu[verb + '-agent']:.1f} | {cpu[verb + '-vswitchd']:.1f} |")
    return [f"**Burst, {what}**: {pods} pods × {rails} attachments = {n} ADDs, {parallel} execs in "
            "parallel, lab OVS + tenantnet-ipam, through trampoline + agent; then the same DELs:", "",
            "| phase | wall time (s) | per attachment (ms) | failed | agent CPU (s) | ovs-vswitchd CPU (s) |",
            "|---|---:|---:|---:|---:|---:|", *rows, "",
            f"Left afterwards: {len(owned)} OVS ports of ours, {addresses} addresses, "
            f"{len(records)} records. "
            f"Agent peak RSS so far {status['peakRssKb'] / 1024:.0f} MB ({status['workers']} workers, limit "
            f"{status['maxInflight']} in flight, {status['rejected']} rejected)."
            + (f" Distinct failures (message ends): {failed[:3]}" if failed else "")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=30, help="attachments per variant (default 30)")
    ap.add_argument("--pods", type=int, default=128, help="pods in the burst (default 128)")
    ap.add_argument("--rails", type=int, default=8, help="attachments per pod (default 8)")
    ap.add_argument("--parallel", type=int, default=16, help="execs at once in the burst (default 16)")
    ap.add_argument("--workers", type=int, help="the agent's --workers (default: the agent's own default)")
    ap.add_argument("--burst-only", action="store_true", help="only the two bursts (no latency rows)")
    ap.add_argument("--out", help="markdown file to update between the bench_agent markers")
    args = ap.parse_args()
    if args.burst_only and args.out:
        ap.error("--burst-only leaves out the rows the bench_agent block holds; print it, without --out")

    work = Path(tempfile.mkdtemp(prefix="tnba-"))
    info = lab.up(str(work / "lab"))
    agent_conf, plain_conf = node_configs(info.node_config, work)
    agent = start_agent(agent_conf, work / "agent.err", args.workers)
    try:
        lines = [machine_line(args.count, "attachments per variant"), ""]
        if not args.burst_only:
            lines += latency(info, work, agent_conf, plain_conf, args.count)
            lines += ["", *overhead(agent_conf, plain_conf, max(args.count, 30))]
        for one_vlan in (False, True):
            lines += ["", *burst(info, work, agent_conf, agent.pid, f"{work}/sock/agent.sock", args.pods,
                                 args.rails, args.parallel, one_vlan)]
    finally:
        stop_agent(agent)
        lab.down(info.root)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    write_block(args.out, "bench_agent", lines)


if __name__ == "__main__":
    main()
