"""Benchmark of tenantnet-ipam; prints a markdown section (see docs/benchmarks-ipam.md).

    .venv/bin/python bench/bench_ipam.py [--execs 1000] [--samples 500]

1. Allocation cost in a /16 at 1 % and at 99 % full (in-process `ipam.plugin.add`), with
   the used addresses scattered at random and, as the worst case for the search, packed in
   one run just after the cursor.
2. 1,000 ADD + DEL through the `tenantnet-ipam` executable and Debian's `host-local`,
   interleaved in the same run: medians and ratio.
3. In-process allocations per second (ADD only, and ADD + DEL).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cni.env import parse_env
from cni.netconf import parse_netconf
from ipam import plugin
from ipam.config import Confinement
from ipam.sqlite_store import SqliteStore
from ipam.store import Allocation

IPAM = Path(sys.executable).parent / "tenantnet-ipam"
HOST_LOCAL = "/usr/lib/cni/host-local"
# Every store of this benchmark lives in a temporary directory: allowed here as the node
# config's `ipamDataDirs` would allow it (dataDir is confined, docs/security.md).
LIMITS = Confinement(data_dirs=(tempfile.gettempdir(),))
SUBNET = ipaddress.ip_network("10.128.0.0/16")


def conf(data_dir: str, ipam_type: str = "tenantnet-ipam") -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "bench", "type": "bridge",
            "ipam": {"type": ipam_type, "dataDir": data_dir,
                     "ranges": [[{"subnet": str(SUBNET)}]]}}


def env(cid: str, command: str = "ADD") -> Any:
    return parse_env({"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0",
                      "CNI_NETNS": "/var/run/netns/bench"})


def fill(store: SqliteStore, fraction: float, packed: bool, rnd: random.Random) -> int:
    usable = list(range(int(SUBNET.network_address) + 2, int(SUBNET.broadcast_address)))
    n = int(len(usable) * fraction)
    if packed:
        # worst case for the search: every address from the cursor on is taken
        chosen = usable[:n]
        cursor = usable[0] - 1
    else:
        chosen = rnd.sample(usable, n)
        cursor = rnd.choice(usable)
    with store.transaction() as txn:
        for i, value in enumerate(chosen):
            txn.insert(Allocation(network="bench", address=ipaddress.IPv4Address(value),
                                  container_id=f"fill{i}", ifname="eth0", created=1.0))
        txn.set_last_reserved("bench", 0, ipaddress.IPv4Address(cursor))
    return cursor


def per_allocation(samples: int, rnd: random.Random) -> dict[tuple[bool, float], float]:
    """Median seconds per in-process ADD for each (packed, fill level).

    The four pools are measured round-robin, so load from other processes hits all alike.
    Each ADD is DEL'd again, untimed, so the level stays put; when packed, the cursor is put
    back before the run of used addresses each time, so every sample pays the longest
    search."""
    with tempfile.TemporaryDirectory() as root:
        pools = []
        for packed in (False, True):
            for fraction in (0.01, 0.99):
                d = os.path.join(root, f"{packed}-{fraction}")
                store = plugin.open_store(d)
                assert isinstance(store, SqliteStore)
                cursor = ipaddress.IPv4Address(fill(store, fraction, packed, rnd))
                pools.append(((packed, fraction), store, cursor, parse_netconf(conf(d))))
        times: dict[tuple[bool, float], list[float]] = {key: [] for key, *_ in pools}
        for i in range(samples):
            for key, store, cursor, netconf in pools:
                if key[0]:
                    with store.transaction() as txn:
                        txn.set_last_reserved("bench", 0, cursor)
                t0 = time.perf_counter()
                plugin.add(env(f"b{i}"), netconf, LIMITS)
                times[key].append(time.perf_counter() - t0)
                plugin.delete(env(f"b{i}", "DEL"), netconf, LIMITS)
        return {key: statistics.median(v) for key, v in times.items()}


def exec_env(base: dict[str, str], command: str, cid: str) -> dict[str, str]:
    return dict(base, CNI_COMMAND=command, CNI_CONTAINERID=cid, CNI_IFNAME="eth0",
                CNI_NETNS="/var/run/netns/bench", CNI_PATH="/usr/lib/cni")


def run_exec(binary: str, environ: dict[str, str], stdin: bytes) -> float:
    t0 = time.perf_counter()
    p = subprocess.run([binary], env=environ, input=stdin, capture_output=True, check=False)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{binary} {environ['CNI_COMMAND']} failed: {p.stdout!r} {p.stderr!r}")
    return elapsed


def exec_comparison(n: int) -> dict[str, float]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    base.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package ships bytecode
    with tempfile.TemporaryDirectory() as d:
        base["PYTHONPYCACHEPREFIX"] = os.path.join(d, "pycache")
        node_config = Path(d, "tenantnet.yaml")
        node_config.write_text(f"logFile: {d}/log/tenantnet.log\nipamDataDirs: [{d}]\nstateDir: {d}/state\n")
        base["TENANTNET_CONFIG"] = str(node_config)
        ours = json.dumps(conf(os.path.join(d, "ours"))).encode()
        theirs = json.dumps(conf(os.path.join(d, "hl"), "host-local")).encode()
        run_exec(str(IPAM), exec_env(base, "ADD", "warm"), ours)  # compiles the bytecode
        t: dict[str, list[float]] = {"ours_add": [], "ours_del": [], "hl_add": [], "hl_del": []}
        for i in range(n):
            cid = f"c{i}"
            t["ours_add"].append(run_exec(str(IPAM), exec_env(base, "ADD", cid), ours))
            t["hl_add"].append(run_exec(HOST_LOCAL, exec_env(base, "ADD", cid), theirs))
            t["ours_del"].append(run_exec(str(IPAM), exec_env(base, "DEL", cid), ours))
            t["hl_del"].append(run_exec(HOST_LOCAL, exec_env(base, "DEL", cid), theirs))
        # what no Python plugin can avoid here: starting this interpreter with this venv
        starts = []
        for _ in range(50):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=base, check=True)
            starts.append(time.perf_counter() - t0)
        out = {k: statistics.median(v) for k, v in t.items() if v}
        out["python_start"] = statistics.median(starts)
        return out


def in_process_rate(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        netconf = parse_netconf(conf(d))
        t0 = time.perf_counter()
        for i in range(n):
            plugin.add(env(f"r{i}"), netconf, LIMITS)
        adds = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(n):
            plugin.add(env(f"s{i}"), netconf, LIMITS)
            plugin.delete(env(f"s{i}", "DEL"), netconf, LIMITS)
        pairs = n / (time.perf_counter() - t0)
        return adds, pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=1000, help="ADD+DEL pairs per plugin")
    parser.add_argument("--samples", type=int, default=500, help="allocations per fill level")
    parser.add_argument("--rate", type=int, default=5000, help="allocations for the rate")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rnd = random.Random(args.seed)

    levels = per_allocation(args.samples, rnd)
    execs = exec_comparison(args.execs)
    adds, pairs = in_process_rate(args.rate)

    print("## tenantnet-ipam benchmark\n")
    print(f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
          f"seed {args.seed}.\n")
    print(f"### Allocation cost in a /16 ({args.samples} in-process ADDs per level, median)\n")
    print("| fill | scattered at random | packed after the cursor (worst case) |")
    print("|---|---|---|")
    for fraction in (0.01, 0.99):
        print(f"| {fraction:.0%} | {levels[(False, fraction)] * 1e6:.0f} µs | "
              f"{levels[(True, fraction)] * 1e6:.0f} µs |")
    for packed, label in ((False, "scattered"), (True, "packed")):
        ratio = levels[(packed, 0.99)] / levels[(packed, 0.01)]
        print(f"\n99 % / 1 % ({label}): **{ratio:.2f}×**", end="")
    print("\n")
    print(f"### {args.execs} ADD + DEL through the executable (median per call)\n")
    print("| | ADD | DEL |")
    print("|---|---|---|")
    print(f"| tenantnet-ipam | {execs['ours_add'] * 1e3:.1f} ms | {execs['ours_del'] * 1e3:.1f} ms |")
    print(f"| host-local (Go) | {execs['hl_add'] * 1e3:.1f} ms | {execs['hl_del'] * 1e3:.1f} ms |")
    print(f"| ratio | {execs['ours_add'] / execs['hl_add']:.1f}× | "
          f"{execs['ours_del'] / execs['hl_del']:.1f}× |")
    print(f"\nStarting this venv's interpreter (`python -c pass`): "
          f"{execs['python_start'] * 1e3:.1f} ms median.\n")
    print("### In-process\n")
    print(f"- {adds:,.0f} allocations/s ({args.rate} ADDs into a /16)")
    print(f"- {pairs:,.0f} ADD + DEL pairs/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
