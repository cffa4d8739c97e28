"""A cluster network's pool in etcd (ipam/cluster.py claims blocks of it): one block size per
network, and no two networks' pools overlapping unless both say they may.

    <prefix>pools/<network>    the network's block sizes; every claim compares them
    <prefix>ranges/<network>   the network's ranges, read by other networks' overlap checks

Both are checked on the way to a claim, never on an ADD with room. The overlap check's reads
become compares of the claim's own transaction (`PoolGuard`): two overlapping networks making
their first claims at once cannot both pass it.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any, NamedTuple

from cni.errors import CniError, Code
from cni.result import IPNetwork
from ipam.config import ClusterSettings, RangeSet
from ipam.etcd import Etcd, put_op, unchanged_since


class PoolGuard(NamedTuple):
    """What the overlap check read, as compares for the claim's transaction, and the
    network's ranges record to write in it (only when it changed)."""

    compares: tuple[dict[str, Any], ...] = ()
    puts: tuple[dict[str, Any], ...] = ()


class Pool:
    """One network's pool as this node's NAD gives it."""

    def __init__(self, prefix: str, network: str, sizes: ClusterSettings,
                 range_sets: tuple[RangeSet, ...]) -> None:
        self.prefix, self.network, self.sizes, self.range_sets = prefix, network, sizes, range_sets
        self.sizes_key = f"{prefix}pools/{network}"
        self.ranges_key = f"{prefix}ranges/{network}"

    def sizes_value(self) -> bytes:
        return json.dumps({"blockSize": self.sizes.block_size, "blockSizeV6": self.sizes.block_size_v6},
                          sort_keys=True).encode()

    def expected_prefix(self, block: IPNetwork) -> int | None:
        """The prefix length this node's settings give the block at `block`'s place (None:
        outside this node's view of the pool)."""
        for rs in self.range_sets:
            for r in rs.ranges:
                if r.family == block.version and block.network_address in r.subnet:
                    size = self.sizes.block_size if r.family == 4 else self.sizes.block_size_v6
                    return max(size, r.subnet.prefixlen)
        return None

    def agree(self, etcd: Etcd, taken: dict[IPNetwork, str]) -> None:
        """Make sure every node claims this network's blocks with the same block sizes. Blocks
        of different sizes overlap (a /26 holds four /28s) and are different keys, so two
        nodes reading the NAD before and after an edit of blockSize would both own the same
        addresses. Every claim is a transaction that compares the sizes, and they change only
        while no block exists."""
        mine = self.sizes_value()
        for _ in range(4):
            kv = etcd.get(self.sizes_key)
            if kv is not None and kv.value == mine:
                return
            odd = [(b, o) for b, o in sorted(taken.items(), key=lambda t: (t[0].version, t[0]))
                   if self.expected_prefix(b) not in (None, b.prefixlen)]
            if odd:
                block, owner = odd[0]
                raise CniError(Code.INVALID_CONFIG,
                               f"invalid network config: ipam.cluster: network {self.network!r} has "
                               f"blockSize {self.sizes.block_size} / blockSizeV6 {self.sizes.block_size_v6} "
                               f"here, but its blocks in the cluster store were claimed with other sizes "
                               f"(e.g. {block}, node {owner!r}): a network's block sizes cannot change "
                               "while it holds blocks",
                               "restore the earlier blockSize in the NAD, or release every address of "
                               "the network first")
            if etcd.put_if_revision(self.sizes_key, mine, kv.mod_revision if kv is not None else 0):
                return
        raise CniError(Code.TRY_AGAIN_LATER, f"network {self.network!r}: its block sizes in the cluster "
                                             "store keep changing (nodes disagree on the NAD?); try again")

    def _intervals(self) -> list[list[int]]:
        return [[r.family, r.start, r.end] for rs in self.range_sets for r in rs.ranges]

    def check_overlap(self, etcd: Etcd) -> PoolGuard:
        """Refuse a pool that overlaps another cluster network's (both would hand out the same
        addresses), unless both networks say they live on separate L2 segments
        (`allowOverlap`). A record counts only while its network holds blocks (a removed
        NAD's stays behind). What was read is returned as compares for the claim's
        transaction: no record changed or appeared since, and no overlapping network that
        held nothing has claimed a block since."""
        if not self.range_sets:
            return PoolGuard()
        mine = self._intervals()
        base = f"{self.prefix}ranges/"
        record = json.dumps({"ranges": mine, "allowOverlap": self.sizes.allow_overlap}).encode()
        current: bytes | None = None
        records, revision = etcd.range_at(base)
        compares = [unchanged_since(base, revision)]
        for kv in records:
            other = kv.key[len(base):]
            if other == self.network:
                current = kv.value
                continue
            try:
                theirs = json.loads(kv.value)
                spans = [(int(f), int(lo), int(hi)) for f, lo, hi in theirs["ranges"]]
                allowed = bool(theirs.get("allowOverlap"))
            except (ValueError, KeyError, TypeError):
                continue
            shared = [(f, max(lo, a), min(hi, b)) for f, lo, hi in spans for g, a, b in mine
                      if f == g and max(lo, a) <= min(hi, b)]
            if not shared or (allowed and self.sizes.allow_overlap):
                continue
            blocks = f"{self.prefix}ipam/{other}/blocks/"
            if not etcd.range(blocks):
                # It holds nothing (its NAD may be gone) — as long as it claims nothing before
                # this claim commits.
                compares.append(unchanged_since(blocks, revision))
                continue
            fam, lo, hi = shared[0]
            first, last = ipaddress.ip_address(lo), ipaddress.ip_address(hi)
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid network config: ipam.ranges: network {self.network!r} overlaps network "
                           f"{other!r} in the cluster store ({first}-{last}): two cluster networks would "
                           "hand out the same addresses",
                           "give them distinct ranges, or, when each lives on its own L2 segment (e.g. "
                           "its own VLAN), set ipam.cluster.allowOverlap: true on both")
        puts = () if current == record else (put_op(self.ranges_key, record),)
        return PoolGuard(tuple(compares), puts)
