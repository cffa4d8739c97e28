"""The nodes of a cluster network (ipam/cluster.py): liveness, and the operator's release of a
dead node's address blocks.

A node is registered under `<prefix>nodes/<name>` (name, underlay address) with a lease its
agent renews; while the key exists, the node might still be serving its blocks, so they
are never taken over — `release_node` refuses without force. A partitioned node that comes
back finds its blocks as it left them.
"""

from __future__ import annotations

import json
import time

from cni.errors import CniError, Code
from ipam.cluster import ClusterNode, client, owner_of
from ipam.etcd import Etcd, EtcdError, EtcdUnavailable
from ipam.holdings import forget_node

NODE_TTL = 15  # seconds a node stays "alive" in etcd after its agent's last heartbeat


def node_key(prefix: str, name: str) -> str:
    return f"{prefix}nodes/{name}"


class Liveness:
    """A node's registration (name, underlay address) under a lease its agent keeps alive:
    while the key exists, the node might still be serving its blocks, so they are never
    taken over (`release_node` refuses without force)."""

    def __init__(self, node: ClusterNode, address: str | None = None, ttl: int = NODE_TTL) -> None:
        self.node, self.address, self.ttl = node, address, ttl
        self.lease = 0

    def beat(self) -> None:
        """Register, or refresh the lease; EtcdUnavailable / EtcdError when etcd is away."""
        etcd = client(self.node.etcd)
        if self.lease and etcd.lease_keepalive(self.lease) > 0:
            return
        self.lease = etcd.lease_grant(self.ttl)
        info = {"name": self.node.name, "address": self.address, "since": round(time.time(), 3)}
        etcd.put(node_key(self.node.prefix, self.node.name), json.dumps(info).encode(), lease=self.lease)

    def stop(self) -> None:
        """Deregister at once (an orderly agent stop); best effort."""
        if self.lease:
            try:
                client(self.node.etcd).lease_revoke(self.lease)
            except (EtcdUnavailable, EtcdError):
                pass
            self.lease = 0


def alive_nodes(etcd: Etcd, prefix: str) -> dict[str, dict[str, object]]:
    """Registered nodes (their lease alive), by name."""
    out: dict[str, dict[str, object]] = {}
    for kv in etcd.range(f"{prefix}nodes/"):
        try:
            info = json.loads(kv.value)
        except ValueError:
            info = {}
        name = kv.key.rsplit("/", 1)[1]
        out[name] = {**(info if isinstance(info, dict) else {}), "name": name}
    return out


def blocks_by_node(etcd: Etcd, prefix: str) -> dict[str, list[tuple[str, str]]]:
    """Every claimed block, as (network, block) per owning node."""
    out: dict[str, list[tuple[str, str]]] = {}
    base = f"{prefix}ipam/"
    for kv in etcd.range(base):
        network, sep, block = kv.key[len(base):].partition("/blocks/")
        if sep:
            out.setdefault(owner_of(kv.value), []).append((network, block.replace("_", "/")))
    return out


def release_node(etcd: Etcd, prefix: str, name: str, force: bool = False) -> list[tuple[str, str]]:
    """Return every block of node `name` to the pool (the operator's action for a node that
    is gone for good); refused while the node's liveness lease is alive, unless `force`.
    Only blocks still owned by `name` are deleted (compared in the same transaction)."""
    if not force and name in alive_nodes(etcd, prefix):
        raise CniError(Code.TRY_AGAIN_LATER,
                       f"node {name!r} is alive (its agent renews its lease in etcd): its blocks may "
                       "still be serving pods; stop it first, or pass --force if it is truly gone")
    released = []
    base = f"{prefix}ipam/"
    for kv in etcd.range(base):
        network, sep, block = kv.key[len(base):].partition("/blocks/")
        if sep and owner_of(kv.value) == name and etcd.delete_if(kv.key, kv.value):
            released.append((network, block.replace("_", "/")))
    forget_node(etcd, prefix, name)
    return released
