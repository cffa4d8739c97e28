"""The blocks of a cluster network's pool (ipam/cluster.py claims them): how a range set is
carved into blocks, the order a node searches them in, and a config cut down to the blocks
a node owns. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterator

from cni.result import IPAddress, IPNetwork
from ipam.config import ClusterSettings, IpamConfig, Range, RangeSet


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


def block_of(address: IPAddress, subnet: IPNetwork, sizes: ClusterSettings) -> IPNetwork:
    """The block of `subnet` that holds `address`."""
    prefix = max(sizes.block_size if address.version == 4 else sizes.block_size_v6, subnet.prefixlen)
    return ipaddress.ip_network(f"{address}/{prefix}", strict=False)


def contains(block: IPNetwork, rs: RangeSet) -> bool:
    """Whether `block` is one of range set `rs`'s subnets' blocks."""
    return any(r.family == block.version and block.subnet_of(r.subnet) for r in rs.ranges)  # type: ignore[arg-type]


def start_index(node: str, count: int) -> int:
    """Where node `node` starts its search among `count` blocks: stable per node, spread
    across nodes, so nodes do not all race for the same first free block (Calico's way)."""
    digest = hashlib.sha256(node.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count if count else 0


def blocks_from(rs: RangeSet, sizes: ClusterSettings, node: str) -> Iterator[IPNetwork]:
    """Every block of `rs` once, starting at `node`'s own point and wrapping around, lazily."""
    spans = []
    for r in rs.ranges:
        prefix = max(sizes.block_size if r.family == 4 else sizes.block_size_v6, r.subnet.prefixlen)
        size = 1 << (r.subnet.max_prefixlen - prefix)
        base = int(r.subnet.network_address)
        spans.append((base, size, prefix, (r.start - base) // size, (r.end - base) // size))
    total = sum(last - first + 1 for _, _, _, first, last in spans)
    begin = start_index(node, total)
    for lo, hi in ((begin, total), (0, begin)):  # global block indices [lo, hi): onwards, then wrapped
        offset = 0
        for base, size, prefix, first, last in spans:
            count = last - first + 1
            for i in range(max(lo, offset), min(hi, offset + count)):
                yield ipaddress.ip_network((base + (first + i - offset) * size, prefix))
            offset += count


def restrict(cfg: IpamConfig, owned: list[IPNetwork]) -> IpamConfig:
    """`cfg` with every range cut down to the parts inside blocks this node owns (adjacent
    blocks merged, so a node's usual run of consecutive blocks is one interval)."""
    sets = []
    for rs in cfg.range_sets:
        ranges = []
        for r in rs.ranges:
            spans = sorted((int(b.network_address), int(b.broadcast_address)) for b in owned
                           if b.version == r.family and b.subnet_of(r.subnet))  # type: ignore[arg-type]
            merged: list[list[int]] = []
            for lo, hi in spans:
                if merged and lo <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            for lo, hi in merged:
                lo, hi = max(r.start, lo), min(r.end, hi)
                if lo <= hi:
                    ranges.append(Range(r.subnet, lo, hi, r.gateway, r.exclude))
        sets.append(RangeSet(tuple(ranges)))
    return cfg._replace(range_sets=tuple(sets))
