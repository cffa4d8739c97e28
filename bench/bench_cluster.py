"""tenantnet-ipam in cluster mode (etcd blocks) beside the node-local store, in one run.

In-process `ipam.plugin.add` + `delete` on a /16, interleaved: the node-local store alone, and
cluster mode with /26 blocks on a private single-member etcd (Debian's etcd-server) on a free
loopback port. Counts every etcd request, so "etcd writes per ADD" is measured, not assumed.
Prints a markdown block (make bench puts it into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import ipaddress
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cni.env import parse_env  # noqa: E402
from cni.netconf import parse_netconf  # noqa: E402
from ipam import plugin  # noqa: E402
from ipam.cluster import ClusterNode  # noqa: E402
from ipam.config import Confinement  # noqa: E402
from ipam.etcd import Etcd, EtcdConfig  # noqa: E402

POOLS = (ipaddress.ip_network("10.0.0.0/8"),)  # the admin's cluster pools (clusterPools)
from tests.integration.etcdsupport import EtcdCluster, EtcdServer  # noqa: E402
from tests.polling import poll  # noqa: E402

WRITES = ("/v3/kv/txn", "/v3/kv/put", "/v3/kv/deleterange")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="ADDs per store")
    parser.add_argument("--nodes", type=int, default=8, help="simulated nodes in the burst")
    parser.add_argument("--per-node", type=int, default=128, help="ADDs per node in the burst")
    parser.add_argument("--parallel", type=int, default=16, help="ADDs at a time per node")
    args = parser.parse_args()
    calls: dict[str, int] = {}
    original = Etcd.call

    def counted(self: Etcd, path: str, body: dict) -> dict:  # type: ignore[type-arg]
        calls[path] = calls.get(path, 0) + 1
        return original(self, path, body)

    Etcd.call = counted  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        server = EtcdServer(root / "etcd").start()
        try:
            node = ClusterNode("bench-node", EtcdConfig((server.endpoint,)), "/bench/", POOLS)
            limits = Confinement((d,), ())

            def conf(kind: str) -> object:
                ipam = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.200.0.0/16"}]],
                        "dataDir": f"{d}/{kind}"}
                if kind == "cluster":
                    ipam["cluster"] = {"blockSize": 26}
                return parse_netconf({"cniVersion": "1.0.0", "name": f"bench-{kind}", "type": "x",
                                      "ipam": ipam})

            def env(cid: str, command: str) -> object:
                return parse_env({"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "net1",
                                  "CNI_NETNS": "/run/netns/b", "CNI_PATH": "/usr/lib/cni"})

            confs = {"local": conf("local"), "cluster": conf("cluster")}
            times: dict[str, list[float]] = {"local": [], "cluster": []}
            for i in range(args.count):
                for kind, c in confs.items():
                    t0 = time.perf_counter()
                    plugin.add(env(f"c{i}", "ADD"), c, limits, node if kind == "cluster" else None)  # type: ignore[arg-type]
                    times[kind].append(time.perf_counter() - t0)
            writes = sum(n for p, n in calls.items() if p in WRITES)
            reads = sum(n for p, n in calls.items() if p not in WRITES)
            blocks = len(Etcd(EtcdConfig((server.endpoint,))).range("/bench/ipam/bench-cluster/blocks/"))
            burst = node_burst(d, server.endpoint, args.nodes, args.per_node, args.parallel)
        finally:
            server.remove()
        quorum = members_lost(root / "quorum")
    local, clustered = statistics.median(times["local"]), statistics.median(times["cluster"])
    print("## Cluster IPAM (etcd blocks) beside the node-local store\n")
    print(f"{args.count} in-process ADDs each, interleaved, on a /16; cluster mode with /26 blocks on a "
          "single-member etcd on loopback.\n")
    print("| store | ADD median | p90 |")
    print("|---|---:|---:|")
    for kind, label in (("local", "node-local (SQLite)"), ("cluster", "cluster mode (blocks on etcd)")):
        xs = sorted(times[kind])
        print(f"| {label} | {statistics.median(xs) * 1e6:.0f} µs | {xs[int(len(xs) * 0.9)] * 1e6:.0f} µs |")
    print(f"\nRatio (median): **{clustered / local:.2f}×** (target ≤ 1.2×). etcd: {writes} writes and "
          f"{reads} reads for {args.count} ADDs = **{writes / args.count:.4f} writes per ADD** "
          "(target ≤ 1/16 "
          f"= 0.0625); {blocks} blocks claimed.")
    print(f"\n**Burst on one NAD**: {args.nodes} simulated nodes (own node name and store each) × "
          f"{args.per_node} ADDs, {args.parallel} at a time per node, all at once, in-process against one "
          f"etcd; then every DEL (releaseAfter 0). ADDs took {burst['add_s']:.2f} s, DELs "
          f"{burst['del_s']:.2f} s; {burst['failures']} failures, {burst['duplicates']} duplicate addresses "
          f"of {burst['addresses']}; blocks claimed {burst['blocks_claimed']}, left after the DELs "
          f"{burst['blocks_left']}, addresses left {burst['addresses_left']}.")
    print(f"\n**etcd as 3 members on loopback** (one node, 8 ADDs at a time, /28 blocks so claims are "
          f"frequent): one member SIGKILLed mid-burst → {quorum['one_failed']} failed ADDs of "
          f"{quorum['one_adds']} (target 0). Two killed (no quorum) → {quorum['room_ok']} ADDs with room in "
          f"the node's blocks succeeded, {quorum['code11']} got code 11 (slowest answer "
          f"{quorum['code11_max_s']:.1f} s), {quorum['other_errors']} other errors. After both came back: "
          f"{quorum['after_adds']} more ADDs, {quorum['after_failed']} failed; every DEL and a GC → "
          f"{quorum['duplicates']} duplicates, {quorum['addresses_left']} addresses and "
          f"{quorum['blocks_left']} blocks left.")
    return 0


def members_lost(root: Path) -> dict[str, float]:
    """A 3-member etcd losing one member mid-burst, then a second (no quorum), then recovering."""
    from concurrent.futures import ThreadPoolExecutor

    from cni.errors import CniError

    members = EtcdCluster(root / "etcd").start()
    d = str(root)
    limits = Confinement((d,), ())
    who = ClusterNode("node-q", EtcdConfig(members.endpoints), "/quorum/", POOLS)
    conf = parse_netconf({"cniVersion": "1.0.0", "name": "rail-q", "type": "x", "ipam": {
        "type": "tenantnet-ipam", "ranges": [[{"subnet": "10.202.0.0/20"}]], "dataDir": f"{d}/store",
        "cluster": {"blockSize": 28, "releaseAfter": 0}}})

    def env(cid: str, command: str) -> object:
        return parse_env({"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "net1",
                          "CNI_NETNS": "/run/netns/b", "CNI_PATH": "/usr/lib/cni"})

    held: dict[str, str] = {}
    out: dict[str, float] = {}

    def one(cid: str) -> tuple[str, str | int, float]:
        t0 = time.perf_counter()
        try:
            result = plugin.add(env(cid, "ADD"), conf, limits, who)  # type: ignore[arg-type]
            return cid, str(result.ips[0].address.ip), time.perf_counter() - t0
        except CniError as err:
            return cid, err.code, time.perf_counter() - t0

    def failed(results: list[tuple[str, str | int, float]]) -> int:
        return sum(1 for _, a, _ in results if not isinstance(a, str))

    pool = ThreadPoolExecutor(8)
    try:
        futures = [pool.submit(one, f"a{i}") for i in range(200)]
        time.sleep(0.05)
        members.members[0].stop()  # mid-burst
        results = [f.result() for f in futures]
        held.update({c: a for c, a, _ in results if isinstance(a, str)})
        out["one_adds"], out["one_failed"] = len(results), failed(results)
        members.members[1].stop()  # no quorum
        results = [f.result() for f in [pool.submit(one, f"q{i}") for i in range(40)]]
        held.update({c: a for c, a, _ in results if isinstance(a, str)})
        out["room_ok"] = sum(1 for _, a, _ in results if isinstance(a, str))
        out["code11"] = sum(1 for _, a, _ in results if a == 11)
        out["code11_max_s"] = max([t for _, a, t in results if a == 11], default=0.0)
        out["other_errors"] = len(results) - out["room_ok"] - out["code11"]
        for m in members.members[:2]:
            m.start(wait=False)
        for m in members.members:
            poll(m._healthy, timeout=30)
        results = [f.result() for f in [pool.submit(one, f"r{i}") for i in range(100)]]
        held.update({c: a for c, a, _ in results if isinstance(a, str)})
        out["after_adds"], out["after_failed"] = len(results), failed(results)
        out["duplicates"] = len(held) - len(set(held.values()))
        for f in [pool.submit(plugin.delete, env(c, "DEL"), conf, limits, who) for c in held]:  # type: ignore[arg-type]
            f.result()
        plugin.gc(conf, set(), limits, who)  # type: ignore[arg-type]
        store = plugin.open_store(f"{d}/store")
        out["addresses_left"] = len(store.allocations("rail-q")) if store else 0
        out["blocks_left"] = len(Etcd(EtcdConfig(members.endpoints)).range("/quorum/ipam/rail-q/blocks/"))
    finally:
        pool.shutdown()
        members.remove()
    return out


def node_burst(d: str, endpoint: str, nodes: int, per_node: int, parallel: int) -> dict[str, float]:
    """Many nodes claiming blocks and allocating at once on one network, then releasing all."""
    from concurrent.futures import ThreadPoolExecutor

    limits = Confinement((d,), ())
    who = [ClusterNode(f"node-{n}", EtcdConfig((endpoint,), timeout=5.0), "/burst/", POOLS)
           for n in range(nodes)]

    def conf(n: int) -> object:
        return parse_netconf({"cniVersion": "1.0.0", "name": "rail-burst", "type": "x", "ipam": {
            "type": "tenantnet-ipam", "ranges": [[{"subnet": "10.201.0.0/16"}]], "dataDir": f"{d}/burst-{n}",
            "cluster": {"blockSize": 26, "releaseAfter": 0}}})

    def env(cid: str, command: str) -> object:
        return parse_env({"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "net1",
                          "CNI_NETNS": "/run/netns/b", "CNI_PATH": "/usr/lib/cni"})

    confs = [conf(n) for n in range(nodes)]
    failures = 0
    addresses: list[str] = []

    def one(n: int, i: int) -> str:
        result = plugin.add(env(f"n{n}-{i}", "ADD"), confs[n], limits, who[n])  # type: ignore[arg-type]
        return str(result.ips[0].address.ip)

    pools = [ThreadPoolExecutor(parallel) for _ in range(nodes)]
    t0 = time.perf_counter()
    futures = [(pools[n].submit(one, n, i)) for i in range(per_node) for n in range(nodes)]
    for f in futures:
        try:
            addresses.append(f.result())
        except Exception:
            failures += 1
    add_s = time.perf_counter() - t0
    etcd = Etcd(EtcdConfig((endpoint,)))
    claimed = len(etcd.range("/burst/ipam/rail-burst/blocks/"))
    t0 = time.perf_counter()
    dels = [pools[n].submit(plugin.delete, env(f"n{n}-{i}", "DEL"), confs[n], limits, who[n])  # type: ignore[arg-type]
            for i in range(per_node) for n in range(nodes)]
    for f in dels:
        f.result()
    del_s = time.perf_counter() - t0
    for pool in pools:
        pool.shutdown()
    left = sum(len(plugin.open_store(f"{d}/burst-{n}").allocations("rail-burst")) for n in range(nodes))  # type: ignore[union-attr]
    return {"add_s": add_s, "del_s": del_s, "failures": failures, "addresses": len(addresses),
            "duplicates": len(addresses) - len(set(addresses)), "blocks_claimed": claimed,
            "blocks_left": len(etcd.range("/burst/ipam/rail-burst/blocks/")), "addresses_left": left}


if __name__ == "__main__":
    sys.exit(main())
