"""A private OVN northbound ovsdb-server for tests and benchmarks: a database created from
the installed schema in a directory of our own, served on a unix socket there, by a child
process we stop by its pid. No ovn-northd: only the NB's contents are exercised.

`bulk_ports` fills it with other nodes' logical ports in one transaction (the load against
which a node's replica is measured)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenantnet.lab import kubehost
from tenantnet.plugin.system.ovsdb import Ovsdb

NB_SCHEMA = Path("/usr/share/ovn/ovn-nb.ovsschema")


@dataclass
class NbServer:
    dir: Path
    proc: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"unix:{self.dir / 'nb.sock'}"

    def stop(self, keep: bool = False) -> None:
        """Stop the server; with `keep`, leave its directory (database and all) for a restart."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> None:
        """The same database served again on the same socket (clients see a reconnect)."""
        self.stop(keep=True)
        self.proc = _serve(self.dir)
        _wait_socket(self)

    def nbctl(self, *args: str) -> str:
        return subprocess.run(["ovn-nbctl", f"--db={self.endpoint}", *args], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def transact(self, ops: list[dict[str, Any]], timeout: float = 120.0) -> list[Any]:
        db = Ovsdb(self.endpoint, timeout)
        try:
            result = db._rpc_call("lab NB transaction", "transact", ["OVN_Northbound", *ops])
        finally:
            db.close()
        for one in result:
            if isinstance(one, dict) and one.get("error"):
                raise RuntimeError(f"lab NB transaction: {one}")
        return list(result)


def _serve(tmp: Path) -> subprocess.Popen[bytes]:
    (tmp / "nb.sock").unlink(missing_ok=True)
    return subprocess.Popen(
        ["ovsdb-server", f"--remote=punix:{tmp / 'nb.sock'}", f"--unixctl={tmp / 'nb.ctl'}",
         f"--log-file={tmp / 'nb.log'}", "--no-chdir", str(tmp / "nb.db")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_socket(server: NbServer) -> None:
    # Until a connect succeeds, not until the file exists: ovsdb-server binds (the file
    # appears) before it listens, and on a loaded machine a client in between was refused.
    deadline = time.monotonic() + 10
    while not kubehost.socket_is_live(server.dir / "nb.sock"):
        if server.proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"ovsdb-server for the lab NB did not start (see {server.dir / 'nb.log'})")
        time.sleep(0.01)


def start(parent: str | None = None) -> NbServer:
    tmp = Path(tempfile.mkdtemp(prefix="tn-nb-", dir=parent))
    try:
        subprocess.run(["ovsdb-tool", "create", str(tmp / "nb.db"), str(NB_SCHEMA)], check=True,
                       capture_output=True, timeout=30)
        proc = _serve(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    server = NbServer(tmp, proc)
    _wait_socket(server)
    return server


def bulk_ports(server: NbServer, switch: str, count: int, *, owned: bool = True, nodes: int = 100,
               prefix: str = "other") -> None:
    """`count` logical ports of other nodes (`nodes` of them) on `switch` (created if missing,
    as tenantnet's), in one transaction. `owned`: with tenantnet's ownership ids, as another
    node's agent writes them; else as another CMS's."""
    network = switch.removeprefix("tn-")
    sw = server.transact([{"op": "select", "table": "Logical_Switch", "where": [["name", "==", switch]],
                           "columns": ["_uuid"]}])[0]["rows"]
    ops: list[dict[str, Any]] = []
    if not sw:
        ops.append({"op": "insert", "table": "Logical_Switch", "uuid-name": "sw",
                    "row": {"name": switch, "external_ids": ["map", [["tenantnet-owner", "tenantnet"],
                                                                     ["tenantnet-network", network]]]}})
        ref: list[Any] = ["named-uuid", "sw"]
    else:
        ref = sw[0]["_uuid"]
    names = []
    for i in range(count):
        mac = f"0a:58:{(i >> 16) & 255:02x}:{(i >> 8) & 255:02x}:{i & 255:02x}:01"
        ip = f"10.{128 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"
        ids = [["tenantnet-owner", "tenantnet"], ["tenantnet-network", network],
               ["tenantnet-node", f"node-{i % nodes}"], ["tenantnet-container-id", f"c{i:064x}"[-64:]],
               ["tenantnet-ifname", "net1"]] if owned else [["owner", "someone-else"]]
        address = f"{mac} {ip}"
        ops.append({"op": "insert", "table": "Logical_Switch_Port", "uuid-name": f"p{i}",
                    "row": {"name": f"{prefix}-{i}", "addresses": address, "port_security": address,
                            "external_ids": ["map", ids]}})
        names.append(["named-uuid", f"p{i}"])
    ops.append({"op": "mutate", "table": "Logical_Switch",
                "where": [["_uuid", "==", ref]] if ref[0] == "uuid" else [["name", "==", switch]],
                "mutations": [["ports", "insert", ["set", names]]]})
    if ref[0] == "named-uuid":  # the switch is inserted in this transaction: link through it
        ops[0]["row"]["ports"] = ["set", names]
        ops.pop()
    server.transact(ops)
