"""tenantnet-ipam in cluster mode (etcd blocks) beside the node-local store, in one run.

In-process `ipam.plugin.add` + `delete` on a /16, interleaved: the node-local store alone, and
cluster mode with /26 blocks on a private single-member etcd (Debian's etcd-server) on a free
loopback port. Counts every etcd request, so "etcd writes per ADD" is measured, not assumed.
Prints a markdown block (make bench puts it into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
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
from tests.integration.etcdsupport import EtcdServer  # noqa: E402

WRITES = ("/v3/kv/txn", "/v3/kv/put", "/v3/kv/deleterange")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="ADDs per store")
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
            node = ClusterNode("bench-node", EtcdConfig((server.endpoint,)), "/bench/")
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
        finally:
            server.remove()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
