"""The OVN northbound client's cost on a node (tenantnet/plugin/system/ovnnb.py): memory of a
process holding the NB connection with N logical ports of other nodes in the NB, the CPU it
spends while other nodes add ports, and the ADD path's port transaction.

A private NB ovsdb-server (tenantnet.lab.nbserver, no ovn-northd) is filled with `--others`
ports of 100 other nodes on one tenant switch, in one transaction. Each variant runs in a
fresh child process (Python keeps freed memory, so one process per variant):

- `scoped`   the agent's handle: Scope(node), conditional monitoring (the node's own ports);
- `scoped-lsports` the same, but the switches' `ports` column replicated (what omitting it
             saves: it lists every node's ports);
- `renderer` Scope(None): every port tenantnet owns (all N here), registered columns only;
- `full`     ovsdbapp as commonly used (OvsdbIdl.from_server: every table and column,
             no condition) with the same add path — the replica the issue asks to avoid;
- `plain`    no IDL: the house JSON-RPC client (tenantnet.plugin.system.ovsdb), one
             `transact` inserting the port and mutating the switch (writes without a replica).

Per variant: RSS before connecting (interpreter + imports), after the initial sync, after
50 ports added (median ms per add_port), and CPU seconds while the parent adds `--churn`
other-node ports one transaction each.

    .venv/bin/python bench/bench_ovnnb.py [--others 10000] [--churn 500]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tenantnet.lab import nbserver  # noqa: E402

ADDS = 50
VARIANTS = ["scoped", "scoped-lsports", "renderer", "full", "plain"]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _say(**kv: Any) -> None:
    print(json.dumps(kv), flush=True)


def child(variant: str, endpoint: str) -> None:
    """One variant in this process: report as JSON lines; wait for the parent's churn."""
    from tenantnet.plugin.system import ovnnb, ovsdb

    if variant != "plain":
        import ovsdbapp.schema.ovn_northbound.impl_idl  # noqa: F401  (imports counted before connect)
    _say(phase="imported", rss=_rss_mb())
    t0 = time.perf_counter()
    add: Any
    if variant == "plain":
        db = ovsdb.Ovsdb(endpoint, 10)
        db._rpc_call("warm", "list_dbs", [])

        def add(i: int) -> None:
            address = f"0a:58:ff:00:{i >> 8:02x}:{i & 255:02x} 10.255.{i >> 8}.{i & 255}"
            result = db._rpc_call("add", "transact", ["OVN_Northbound",
                {"op": "insert", "table": "Logical_Switch_Port", "uuid-name": "p",
                 "row": {"name": f"bench-{i}", "addresses": address, "port_security": address,
                         "external_ids": ["map", [["tenantnet-owner", "tenantnet"],
                                                  ["tenantnet-node", "bench"],
                                                  ["tenantnet-network", "blue"]]]}},
                {"op": "mutate", "table": "Logical_Switch", "where": [["name", "==", "tn-blue"]],
                 "mutations": [["ports", "insert", ["set", [["named-uuid", "p"]]]]]}])
            if any(isinstance(r, dict) and r.get("error") for r in result):
                raise SystemExit(f"plain add failed: {result}")
    else:
        if variant == "full":
            class Full(ovnnb.OvnNb):
                """ovsdbapp's common use: the whole NB replicated (for comparison only)."""

                def _connect(self) -> Any:
                    from ovsdbapp.backend.ovs_idl import connection

                    idl = connection.OvsdbIdl.from_server(self.endpoint, "OVN_Northbound", leader_only=False)
                    return ovnnb._api_class()(connection.Connection(idl, timeout=60))

            nb: ovnnb.OvnNb = Full(endpoint, ovnnb.Scope(node="bench"), timeout=60)
        elif variant == "scoped-lsports":
            class WithPorts(ovnnb.OvnNb):
                """The agent's scope, but the switches' `ports` column replicated (for
                comparison only: what omitting it saves)."""

                def _connect(self) -> Any:
                    from ovsdbapp.backend.ovs_idl import connection, idlutils

                    helper = idlutils.get_schema_helper(self.endpoint, ovnnb.DB)
                    helper.register_columns("Logical_Switch", [*ovnnb._LS_COLUMNS, "ports"])
                    helper.register_columns("Logical_Switch_Port", ovnnb._LSP_COLUMNS)
                    idl = connection.OvsdbIdl(self.endpoint, helper, leader_only=False)
                    idl.cond_change("Logical_Switch", ovnnb.Scope.switch_condition())
                    idl.cond_change("Logical_Switch_Port", self.scope.port_condition())
                    return ovnnb._api_class()(connection.Connection(idl, timeout=60))

            nb = WithPorts(endpoint, ovnnb.Scope(node="bench"), timeout=60)
        else:
            nb = ovnnb.OvnNb(endpoint, ovnnb.Scope(node="bench" if variant == "scoped" else None), timeout=60)
        nb.api()

        def add(i: int) -> None:
            nb.add_port("tn-blue", f"bench-{i}", f"0a:58:ff:00:{i >> 8:02x}:{i & 255:02x}",
                        [f"10.255.{i >> 8}.{i & 255}"],
                        {"tenantnet-container-id": f"b{i}", "tenantnet-ifname": "net1",
                         "tenantnet-node": "bench"})
    sync = time.perf_counter() - t0
    rows = nb.replica_rows() if variant != "plain" else 0
    _say(phase="synced", rss=_rss_mb(), sync_s=sync, lsp_rows=rows)
    times = []
    for i in range(ADDS):
        t = time.perf_counter()
        add(i)
        times.append((time.perf_counter() - t) * 1000)
    _say(phase="added", rss=_rss_mb(), add_ms=statistics.median(times),
         add_p90_ms=sorted(times)[int(ADDS * 0.9)])
    cpu0 = _cpu()
    sys.stdin.readline()  # the parent's churn runs now; its end is the next line
    sys.stdin.readline()
    time.sleep(0.5)  # the last updates
    _say(phase="churned", rss=_rss_mb(), churn_cpu_s=_cpu() - cpu0)


def run(variant: str, others: int, churn: int) -> dict[str, Any]:
    server = nbserver.start()
    try:
        nbserver.bulk_ports(server, "tn-blue", others)
        proc = subprocess.Popen([sys.executable, __file__, "--child", variant, server.endpoint],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        out: dict[str, Any] = {}
        try:
            for _ in range(3):
                msg = json.loads(proc.stdout.readline())
                out[f"rss_{msg.pop('phase')}"] = msg.pop("rss")
                out.update(msg)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            # Other nodes' agents adding ports, one transaction each (the 100 nodes' churn).
            for i in range(churn):
                address = f"0a:59:00:00:{i >> 8:02x}:{i & 255:02x} 10.254.{i >> 8}.{i & 255}"
                server.transact([
                    {"op": "insert", "table": "Logical_Switch_Port", "uuid-name": "p",
                     "row": {"name": f"churn-{i}", "addresses": address, "port_security": address,
                             "external_ids": ["map", [["tenantnet-owner", "tenantnet"],
                                                      ["tenantnet-node", f"node-{i % 100}"],
                                                      ["tenantnet-network", "blue"]]]}},
                    {"op": "mutate", "table": "Logical_Switch", "where": [["name", "==", "tn-blue"]],
                     "mutations": [["ports", "insert", ["set", [["named-uuid", "p"]]]]]}])
            proc.stdin.write("done\n")
            proc.stdin.flush()
            msg = json.loads(proc.stdout.readline())
            out["rss_churned"] = msg["rss"]
            out["churn_cpu_s"] = msg["churn_cpu_s"]
        finally:
            proc.stdin.close()
            proc.wait(30)
        return out
    finally:
        server.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--others", type=int, default=10000, help="other nodes' ports in the NB")
    ap.add_argument("--churn", type=int, default=500, help="other-node ports added while measuring CPU")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    print(f"NB with {args.others} ports of 100 other nodes on tn-blue; {ADDS} adds; churn {args.churn}")
    print("| variant | LSP rows held | sync s | RSS imported MB | RSS synced MB | RSS after adds MB "
          "| add_port median ms | p90 ms | CPU s during churn | RSS after churn MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        r = run(variant, args.others, args.churn)
        print(f"| {variant} | {r.get('lsp_rows', 0)} | {r['sync_s']:.2f} | {r['rss_imported']:.1f} "
              f"| {r['rss_synced']:.1f} | {r['rss_added']:.1f} | {r['add_ms']:.2f} | {r['add_p90_ms']:.2f} "
              f"| {r['churn_cpu_s']:.2f} | {r['rss_churned']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
