"""What batching saves, as times: concurrent host link deletions against the same deletions one
after the other, and an OpenFlow bundle on a kept connection against a new connection and an
`ovs-ofctl --bundle` exec.

The pass/fail tests count the work instead (tests/integration/test_batching.py: two
RTM_DELLINKs for twelve links; tests/integration/test_openflow.py: no reconnection, two writes
per bundle): times on a shared, loaded machine are figures, not bounds.

    .venv/bin/python bench/bench_batching.py [--rounds 5] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_block  # noqa: E402
from tenantnet.lab import node as lab  # noqa: E402
from tenantnet.plugin.system import netlink, rtnl  # noqa: E402
from tenantnet.plugin.system import openflow as of  # noqa: E402

LINKS = 12
COOKIE = 0x0F1B_0000_0000_0000
PORT = 41000


def veths(ns: str, n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    names = [f"tnbb{tag}{i:02d}" for i in range(n)]
    for i, name in enumerate(names):
        subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", f"pb{tag}{i}",
                        "netns", ns], check=True)
    return names


def one_by_one(names: list[str]) -> float:
    started = time.perf_counter()
    for name in names:
        rtnl.Rtnl().delete_link(name)
    return time.perf_counter() - started


def together(names: list[str]) -> float:
    barrier = threading.Barrier(len(names))

    def one(name: str) -> None:
        barrier.wait()
        netlink.delete_host_link(name)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def deletions(rounds: int) -> tuple[list[float], list[float]]:
    ns = f"tnbb-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    apart: list[float] = []
    batched: list[float] = []
    try:
        for _ in range(rounds):  # alternating, so that machine noise hits both alike
            apart.append(one_by_one(veths(ns, LINKS)))
            batched.append(together(veths(ns, LINKS)))
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)
    return apart, batched


def rule(n: int) -> of.Rule:
    mac = f"02:0f:1b:00:00:{n:02x}"
    return of.Rule(cookie=COOKIE | n, priority=1, in_port=PORT + n, eth_src=mac,
                   eth_dst=f"02:0f:1b:00:01:{n:02x}", output=PORT + 1 - n)


def bundles(count: int) -> dict[str, list[float]]:
    work = Path(tempfile.mkdtemp(prefix="tn-bench-"))
    info = lab.up(str(work / "lab"))
    target = f"unix:{info.root}/{info.bridge}.mgmt"
    rules = [rule(0), rule(1)]
    ops: list[of.Op] = []
    for r in rules:
        ops += [of.DeleteStrict(r.cookie, r.priority, r.in_port, r.eth_src, r.eth_dst), of.AddRule(r)]
    lines = "".join(f"delete_strict cookie={r.cookie:#x}/-1,priority=1,in_port={r.in_port},"
                    f"dl_src={r.eth_src},dl_dst={r.eth_dst}\nadd check_overlap,cookie={r.cookie:#x},"
                    f"priority=1,in_port={r.in_port},dl_src={r.eth_src},dl_dst={r.eth_dst},"
                    f"actions=output:{r.output}\n" for r in rules)
    times: dict[str, list[float]] = {"kept": [], "fresh": [], "ofctl": []}
    try:
        with of.Switch(target) as sw:
            sw.bundle(ops)  # connected
            for _ in range(count):
                started = time.perf_counter()
                sw.bundle(ops)
                times["kept"].append(time.perf_counter() - started)
                started = time.perf_counter()
                with of.Switch(target) as once:
                    once.bundle(ops)
                times["fresh"].append(time.perf_counter() - started)
                started = time.perf_counter()
                subprocess.run(["ovs-ofctl", "-O", "OpenFlow14", "--bundle", "add-flows", target, "-"],
                               input=lines, text=True, capture_output=True, check=True)
                times["ofctl"].append(time.perf_counter() - started)
            sw.delete(COOKIE, 0xFFFF_0000_0000_0000)
    finally:
        lab.down(info.root)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help=f"rounds of {LINKS} deletions each way (default 5)")
    ap.add_argument("--count", type=int, default=50, help="bundles of each kind (default 50)")
    ap.add_argument("--out", help="markdown file to update between the bench_batching markers")
    args = ap.parse_args()

    apart, batched = deletions(args.rounds)
    times = bundles(args.count)
    ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
    a, b = statistics.median(apart) * 1000, statistics.median(batched) * 1000
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores, Linux {platform.release()}, "
             f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.1f} at the end.", "",
             f"**{LINKS} host veth deletions** (median of {args.rounds} rounds, alternating): one after the "
             f"other {a:.0f} ms, at once through `netlink.delete_host_link` {b:.0f} ms ({b / a:.2f}×; one "
             "plain RTM_DELLINK, then one for a link group of the rest: two RCU waits instead of "
             f"{LINKS}).", "",
             f"**A bundle of 2 rules (4 flow_mods)**, median of {args.count}, ms: `openflow.Switch.bundle` "
             f"on a kept connection {ms['kept']:.3f}, a new `Switch` + the bundle {ms['fresh']:.3f}, "
             f"`ovs-ofctl --bundle` {ms['ofctl']:.3f} ({ms['ofctl'] / ms['kept']:.0f}× the kept "
             "connection's)."]
    write_block(args.out, "bench_batching", lines)


if __name__ == "__main__":
    main()
