"""Who holds what, cluster-wide: each node's allocations as it last published them, and
release requests an operator files for another node.

The allocations of a cluster network live in the store of the node that owns their block
(ipam/cluster.py) — a node's SQLite file, which no other node can read. So that
`tenantnetctl ipam ls/show/release/gc --cluster` work from any node, each agent publishes,
on its heartbeat (every 5 s), every cluster network's allocations of its stores to
`<prefix>ipam/<network>/held/<node>` — only when they changed since the last beat, so a
burst of ADDs costs one etcd write per network per beat, not one per ADD, and an ADD still
makes no etcd round trip. What other nodes show is as of that node's last beat (`asOf`).

A release of an address another node holds cannot be done here: it is filed as a request
under `<prefix>requests/<node>/<network>/<address>` (with the container and interface it
was meant for), and that node's agent carries it out on its next beat — releasing the
address only if the same attachment still holds it — and deletes the request. A request to
a node that is gone stays until `tenantnetctl ipam release-node` clears its blocks (and
its requests and published holdings with them).

The published record is a view for operators; no invariant rests on it. Exactly-once
ownership rests on the blocks in etcd and the node-local store, as before.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cni.result import IPAddress, IPNetwork
from ipam.cluster import ClusterNode, client
from ipam.etcd import Etcd
from ipam.store import Allocation, release_addresses

MAX_PUBLISHED = 1 << 20  # bytes per record: etcd's default request limit is 1.5 MiB
CLUSTER_DIR = "cluster"  # <dataDir>/cluster/<network>.blocks marks a cluster network


def held_key(prefix: str, network: str, node: str) -> str:
    return f"{prefix}ipam/{network}/held/{node}"


def request_key(prefix: str, node: str, network: str, address: IPAddress) -> str:
    return f"{prefix}requests/{node}/{network}/{address}"


@dataclass(frozen=True)
class Holding:
    """One address held somewhere in the cluster, as its node published it."""

    node: str
    block: str
    allocation: Allocation
    as_of: float  # when the node published it (0: this node's own store, read just now)

    def to_dict(self) -> dict[str, object]:
        return {**self.allocation.to_dict(), "node": self.node, "block": self.block, "asOf": self.as_of}


def cluster_networks(data_dir: str) -> list[str]:
    """The cluster networks a store serves (those with a blocks file)."""
    try:
        names = os.listdir(os.path.join(data_dir, CLUSTER_DIR))
    except OSError:
        return []
    return sorted(n[: -len(".blocks")] for n in names if n.endswith(".blocks"))


def _blocks(data_dir: str, network: str) -> list[IPNetwork]:
    out: list[IPNetwork] = []
    try:
        with open(os.path.join(data_dir, CLUSTER_DIR, f"{network}.blocks"), encoding="utf-8") as fh:
            for line in fh.read(1 << 20).splitlines():
                if line.strip():
                    try:
                        out.append(ipaddress.ip_network(line.split()[0].replace("_", "/")))
                    except ValueError:
                        continue
    except OSError:
        pass
    return out


def block_name(address: IPAddress, blocks: Iterable[IPNetwork]) -> str:
    for b in blocks:
        if b.version == address.version and address in b:
            return str(b)
    return "-"


def _record(rows: list[Allocation], blocks: list[IPNetwork]) -> list[dict[str, Any]]:
    return [{**a.to_dict(), "block": block_name(a.address, blocks)} for a in rows]


class Publisher:
    """The agent's side: publish its stores' cluster allocations, carry out release requests."""

    def __init__(self, node: ClusterNode, data_dirs: Callable[[], Iterable[str]],
                 open_store: Callable[[str], Any]) -> None:
        self.node, self.data_dirs, self.open_store = node, data_dirs, open_store
        self._digests: dict[str, str] = {}  # key -> digest of what was last published

    def beat(self) -> int:
        """Carry out this node's release requests, then publish what changed; the number of
        etcd writes made. EtcdUnavailable / EtcdError propagate (the heartbeat logs them)."""
        etcd = client(self.node.etcd)
        self._carry_out(etcd)
        writes = 0
        for data_dir in dict.fromkeys(self.data_dirs()):
            networks = cluster_networks(data_dir)
            if not networks:
                continue
            store = self.open_store(data_dir)
            if store is None:
                continue
            for network in networks:
                rows = _record(store.allocations(network), _blocks(data_dir, network))
                key = held_key(self.node.prefix, network, self.node.name)
                body = json.dumps(rows, sort_keys=True)
                digest = hashlib.sha256(body.encode()).hexdigest()
                if self._digests.get(key) == digest:
                    continue
                truncated = False
                while len(body) > MAX_PUBLISHED and rows:
                    rows, truncated = rows[: len(rows) // 2], True
                    body = json.dumps(rows, sort_keys=True)
                value = json.dumps({"node": self.node.name, "asOf": round(time.time(), 3),
                                    "truncated": truncated, "allocations": rows}, sort_keys=True)
                etcd.put(key, value.encode())
                self._digests[key] = digest
                writes += 1
        return writes

    def _carry_out(self, etcd: Etcd) -> None:
        base = f"{self.node.prefix}requests/{self.node.name}/"
        pending = etcd.range(base)
        if not pending:
            return
        for kv in pending:
            network, _, address = kv.key[len(base):].partition("/")
            try:
                wanted = json.loads(kv.value)
                addr = ipaddress.ip_address(address)
            except ValueError:
                etcd.delete_if(kv.key, kv.value)
                continue
            for data_dir in dict.fromkeys(self.data_dirs()):
                if network not in cluster_networks(data_dir):
                    continue
                store = self.open_store(data_dir)
                if store is None:
                    continue
                rows = [a for a in store.allocations(network) if a.address == addr
                        and a.container_id == wanted.get("containerID") and a.ifname == wanted.get("ifname")]
                release_addresses(store, rows)
            etcd.delete_if(kv.key, kv.value)
        self._digests.clear()  # republish what the releases changed


def published(etcd: Etcd, prefix: str, network: str | None = None) -> list[Holding]:
    """Every node's published allocations (of `network`), by network and address."""
    base = f"{prefix}ipam/" + (f"{network}/" if network else "")
    out: list[Holding] = []
    for kv in etcd.range(base):
        head, sep, node = kv.key.rpartition("/held/")
        if not sep:
            continue
        try:
            doc = json.loads(kv.value)
            as_of = float(doc.get("asOf", 0))
            for row in doc.get("allocations", []):
                a = Allocation(str(row["network"]), ipaddress.ip_address(row["address"]),
                               str(row["containerID"]), str(row["ifname"]), str(row.get("podNamespace", "")),
                               str(row.get("podName", "")), str(row.get("netns", "")),
                               float(row.get("created", 0)))
                out.append(Holding(node, str(row.get("block", "-")), a, as_of))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a record this version cannot read: skipped, never fatal
    out.sort(key=lambda h: (h.allocation.network, h.allocation.address.version, h.allocation.address))
    return out


def local(node: str, data_dir: str, store: Any, network: str | None = None) -> list[Holding]:
    """This node's own cluster allocations, read from its store just now."""
    out = []
    for net in cluster_networks(data_dir):
        if network is not None and net != network:
            continue
        blocks = _blocks(data_dir, net)
        out += [Holding(node, block_name(a.address, blocks), a, 0.0) for a in store.allocations(net)]
    return out


def request_release(etcd: Etcd, prefix: str, holding: Holding, by: str) -> str:
    """File a release of `holding` for its node's agent; the request's key."""
    a = holding.allocation
    key = request_key(prefix, holding.node, a.network, a.address)
    etcd.put(key, json.dumps({"containerID": a.container_id, "ifname": a.ifname, "by": by,
                              "at": round(time.time(), 3)}).encode())
    return key


def forget_node(etcd: Etcd, prefix: str, name: str) -> None:
    """Drop a node's published holdings and pending requests (it is gone; its blocks too)."""
    for kv in etcd.range(f"{prefix}ipam/"):
        if kv.key.endswith(f"/held/{name}"):
            etcd.delete_if(kv.key, kv.value)
    for kv in etcd.range(f"{prefix}requests/{name}/"):
        etcd.delete_if(kv.key, kv.value)
