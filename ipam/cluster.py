"""Cluster mode: one pool per network across every node, carved into per-node blocks on etcd.

A network whose `ipam` has `"cluster": {"blockSize": 26}` hands out addresses only from
blocks (here: /26s of its ranges) that this node owns. A block is claimed with one etcd
transaction — create `<prefix>ipam/<network>/blocks/<block>` if absent, value the node's
name — so a block has exactly one owner cluster-wide, and an address is only ever allocated
by the owner of its block, in the node-local store (`sqlite_store.py`) as before. An ADD with
room in a block it owns makes no etcd round trip; only a full set of blocks does, and when
etcd cannot be reached then, the ADD fails at once with code 11 (try again later).

The node remembers its blocks in `<dataDir>/cluster/<network>.blocks` (written after the
claim committed). A crash between the two leaves a block in etcd that the file lacks: the
next claim lists the network's blocks (one range call) and adopts every block etcd says is
this node's before it claims a new one.

Not yet here (issue 14 continues): returning empty blocks after a grace period, claiming
ahead at a low-water mark, node liveness leases and operator release of a dead node's
blocks, and cluster-wide reservation of static addresses (refused in cluster mode until then).
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from cni.errors import CniError, Code
from cni.result import IPNetwork
from hostfiles.confined import ensure_private_dir
from ipam.config import ClusterSettings, IpamConfig, Range, RangeSet
from ipam.etcd import Etcd, EtcdConfig, EtcdError, EtcdUnavailable

DEFAULT_PREFIX = "/tenantnet/"
MAX_CLAIM_ATTEMPTS = 64  # blocks raced for and lost before giving up (other nodes claiming)


class ClusterNode(NamedTuple):
    """This node in the cluster store (from the node config, admin-owned)."""

    name: str
    etcd: EtcdConfig
    prefix: str = DEFAULT_PREFIX


def default_node_name() -> str:
    return socket.gethostname()


_clients: dict[EtcdConfig, Etcd] = {}
_clients_lock = threading.Lock()


def client(config: EtcdConfig) -> Etcd:
    """One client per configuration per process (the agent reuses its connections)."""
    with _clients_lock:
        found = _clients.get(config)
        if found is None:
            found = _clients[config] = Etcd(config)
        return found


def _block_name(block: IPNetwork) -> str:
    return str(block).replace("/", "_")


def _parse_block(name: str) -> IPNetwork:
    return ipaddress.ip_network(name.replace("_", "/"))


def blocks_of(rs: RangeSet, sizes: ClusterSettings) -> Iterator[IPNetwork]:
    """The blocks of a range set, in address order, lazily (an IPv6 /64 has 2^58 /122s).
    A range's subnet smaller than a block is one block."""
    for r in rs.ranges:
        prefix = max(sizes.block_size if r.family == 4 else sizes.block_size_v6, r.subnet.prefixlen)
        size = 1 << (r.subnet.max_prefixlen - prefix)
        base = int(r.subnet.network_address)
        first = (r.start - base) // size
        last = (r.end - base) // size
        for i in range(first, last + 1):
            yield ipaddress.ip_network((base + i * size, prefix))


def restrict(cfg: IpamConfig, owned: list[IPNetwork]) -> IpamConfig:
    """`cfg` with every range cut down to the parts inside blocks this node owns."""
    sets = []
    for rs in cfg.range_sets:
        ranges = []
        for r in rs.ranges:
            for b in owned:
                if b.version != r.family or not b.subnet_of(r.subnet):  # type: ignore[arg-type]
                    continue
                lo, hi = max(r.start, int(b.network_address)), min(r.end, int(b.broadcast_address))
                if lo <= hi:
                    ranges.append(Range(r.subnet, lo, hi, r.gateway, r.exclude))
        sets.append(RangeSet(tuple(ranges)))
    return cfg._replace(range_sets=tuple(sets))


class Ledger:
    """The blocks of one network: this node's (local file), and claiming more (etcd)."""

    def __init__(self, node: ClusterNode, network: str, data_dir: str, sizes: ClusterSettings) -> None:
        self.node, self.network, self.sizes = node, network, sizes
        self.dir = os.path.join(data_dir, "cluster")
        self.path = os.path.join(self.dir, f"{network}.blocks")
        self.key_prefix = f"{node.prefix}ipam/{network}/blocks/"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_private_dir(self.dir)
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def owned(self) -> list[IPNetwork]:
        """The blocks this node owns, as it remembers them (no etcd call)."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                names = [line.strip() for line in fh.read(1 << 20).splitlines() if line.strip()]
        except FileNotFoundError:
            return []
        return [_parse_block(n) for n in names]

    def _remember(self, blocks: list[IPNetwork]) -> None:
        tmp = f"{self.path}.tmp.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{_block_name(b)}\n" for b in sorted(blocks, key=lambda b: (b.version, b))))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def claim(self, rs: RangeSet) -> IPNetwork:
        """A block of `rs` for this node: one etcd owns already (adopted), else a new one
        claimed with one transaction. Code 11 when etcd is unreachable, code 18 when every
        block of the range set belongs to some node."""
        etcd = client(self.node.etcd)
        mine = self.node.name.encode()
        try:
            with self._locked():
                known = set(self.owned())
                taken: dict[IPNetwork, bytes] = {}
                for kv in etcd.range(self.key_prefix):
                    try:
                        block = _parse_block(kv.key[len(self.key_prefix):])
                    except ValueError:
                        continue
                    owner = json.loads(kv.value).get("node", "").encode() if kv.value.startswith(b"{") \
                        else kv.value
                    taken[block] = owner
                adopted = [b for b, o in taken.items() if o == mine and b not in known]
                wanted = [b for b in adopted if any(b.subnet_of(r.subnet) for r in rs.ranges  # type: ignore[arg-type]
                                                    if r.family == b.version)]
                if adopted:
                    self._remember(sorted(known | set(adopted), key=lambda b: (b.version, b)))
                if wanted:
                    return wanted[0]
                value = json.dumps({"node": self.node.name, "claimed": round(time.time(), 3)}).encode()
                attempts = 0
                for block in blocks_of(rs, self.sizes):
                    if block in taken or block in known:
                        continue
                    attempts += 1
                    if etcd.create(self.key_prefix + _block_name(block), value):
                        self._remember([*known, block])
                        return block
                    if attempts >= MAX_CLAIM_ATTEMPTS:
                        break
        except EtcdUnavailable as exc:
            raise CniError(Code.TRY_AGAIN_LATER, f"network {self.network!r} needs a new address block "
                                                 f"and the cluster store is unreachable: {exc}") from None
        except EtcdError as exc:
            raise CniError(Code.IO_FAILURE, f"network {self.network!r}: claiming an address block: {exc}") \
                from None
        raise CniError(Code.POOL_EXHAUSTED,
                       f"pool exhausted: network {self.network!r} has no unclaimed block left in "
                       f"{rs.describe()} (every block belongs to a node)",
                       "release addresses, or blocks of nodes that are gone")
