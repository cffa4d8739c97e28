"""The nodes of a cluster network (ipam/cluster.py): liveness, and the operator's release of a
dead node's address blocks.

A node is registered under `<prefix>nodes/<name>` (name, underlay address) with a lease its
agent renews. A lapsed lease does not prove a node dead — it may only be cut off, and a node
without an agent has no lease at all — so a plain `release_node` returns only the blocks of
a node that declared itself that it is leaving (`declare_leaving`, `tenantnetctl ipam leave`
on that node: it first stops allocating from its blocks and claiming new ones). Anything
else needs `force`, and the operator's word that the node is gone: a node that is in fact
alive stops allocating from the released blocks once it verifies them (its heartbeat, every
5 s; an ADD after 15 s without one) — addresses it gave out before that may then be given
out again by the blocks' next owner.
"""

from __future__ import annotations

import json
import time

from cni.errors import CniError, Code
from ipam.cluster import VERIFY_FRESH, ClusterNode, client, leaving_key, owner_of
from ipam.etcd import Etcd, EtcdError, EtcdUnavailable
from ipam.holdings import forget_node

# Seconds a node stays "alive" in etcd after its agent's last heartbeat: as long as an ADD
# trusts the beat's verification of the node's blocks (ipam/cluster.py), never shorter.
NODE_TTL = int(VERIFY_FRESH)


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


def declare_leaving(etcd: Etcd, prefix: str, name: str) -> None:
    """Node `name` is leaving the cluster: it claims no block from now on (ipam/cluster.py
    checks the key before every claim), and `release_node` may return its blocks."""
    etcd.put(leaving_key(prefix, name), json.dumps({"since": round(time.time(), 3)}).encode())


def is_leaving(etcd: Etcd, prefix: str, name: str) -> bool:
    return etcd.get(leaving_key(prefix, name)) is not None


def release_node(etcd: Etcd, prefix: str, name: str, force: bool = False) -> list[tuple[str, str]]:
    """Return every block of node `name` to the pool (the operator's action for a node that
    is gone for good). Without `force`, only for a node that declared it is leaving; a node
    that owns no block needs neither. Only blocks still owned by `name` are deleted (compared
    in the same transaction); the declaration goes with them, so the node may join again."""
    if not force and not is_leaving(etcd, prefix, name) and name in blocks_by_node(etcd, prefix):
        alive = name in alive_nodes(etcd, prefix)
        raise CniError(Code.TRY_AGAIN_LATER,
                       f"node {name!r} has not declared it is leaving (`tenantnetctl ipam leave` on that "
                       "node)"
                       + (", and its agent renews its lease in etcd" if alive else
                          ": its lease lapsed, but a node that is only cut off (or runs no agent) keeps "
                          "allocating from its blocks"),
                       "run `tenantnetctl ipam leave` on the node first; or, only for a node you know is "
                       "gone for good, pass --force — if it is in fact alive, it may give out addresses of "
                       "those blocks until it next verifies them with etcd (within 5 s with its agent, 15 s "
                       "without), the same addresses the blocks' next owner gives out")
    released = []
    base = f"{prefix}ipam/"
    for kv in etcd.range(base):
        network, sep, block = kv.key[len(base):].partition("/blocks/")
        if sep and owner_of(kv.value) == name and etcd.delete_if(kv.key, kv.value):
            released.append((network, block.replace("_", "/")))
    forget_node(etcd, prefix, name)
    etcd.delete(leaving_key(prefix, name))
    return released
