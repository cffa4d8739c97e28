"""Choosing addresses: host-local's semantics on top of any `ipam.store.Transaction`.

One address per range set. Static requests go to the range set that contains them;
the other range sets continue after their last reserved address (wrapping around), so a
freed address is not handed out again at once. Never the network, broadcast, gateway or
an excluded address: the search runs only over `Range.segments()`, which leave them out.
"""

from __future__ import annotations

import ipaddress
import time
from typing import NamedTuple

from cni.errors import CniError, Code
from cni.result import IPAddress
from ipam.config import IpamConfig, Range, RangeSet
from ipam.store import Allocation, Transaction


class Owner(NamedTuple):
    """Who an ADD allocates for; (network, container_id, ifname) is the identity."""

    network: str
    container_id: str
    ifname: str
    pod_namespace: str = ""
    pod_name: str = ""
    netns: str = ""


class Grant(NamedTuple):
    """An address handed out, with the range (subnet, gateway) it came from."""

    range_set: int
    range: Range
    address: IPAddress


def locate(cfg: IpamConfig, address: IPAddress) -> tuple[int, Range] | None:
    for i, rs in enumerate(cfg.range_sets):
        r = rs.range_of(address)
        if r is not None:
            return i, r
    return None


def requested_by_set(cfg: IpamConfig, network: str, requested: list[IPAddress]) -> dict[int, IPAddress]:
    """The requested static addresses by range set; code 111 naming the address when one is
    in no range, reserved, or a second one of the same range set."""
    wanted: dict[int, IPAddress] = {}
    for addr in requested:
        found = locate(cfg, addr)
        if found is None:
            ranges = "; ".join(rs.describe() for rs in cfg.range_sets)
            raise CniError(
                Code.ADDRESS_UNAVAILABLE,
                f"requested address {addr} is not in any range of network {network!r} "
                f"(ranges: {ranges})",
            )
        idx, rng = found
        reason = rng.reserved_reason(addr)
        if reason:
            raise CniError(
                Code.ADDRESS_UNAVAILABLE,
                f"requested address {addr} of network {network!r} cannot be handed out: {reason}",
            )
        if idx in wanted:
            raise CniError(
                Code.ADDRESS_UNAVAILABLE,
                f"requested addresses {wanted[idx]} and {addr} are both in range set {idx} of "
                f"network {network!r}; at most one address per range set is allowed",
            )
        wanted[idx] = addr
    return wanted


def search_order(rs: RangeSet, last: IPAddress | None) -> list[tuple[int, int]]:
    """The allocatable [lo, hi] intervals of a range set in the order host-local tries them:
    from just after `last` to the end, then from the beginning up to `last`."""
    segs = [seg for r in rs.ranges for seg in r.segments()]
    owner = [i for i, r in enumerate(rs.ranges) for _ in r.segments()]
    if last is None:
        return segs
    home = next((i for i, r in enumerate(rs.ranges) if r.contains(last)), None)
    if home is None:
        return segs  # the cursor is from an older config: start from the beginning
    value = int(last)
    k = next((i for i, (seg, o) in enumerate(zip(segs, owner, strict=True))
              if o == home and seg[1] > value), None)
    if k is None:
        # `last` is at or after the end of its range: the next range comes first.
        k = max(i for i, o in enumerate(owner) if o == home) + 1
        k %= len(segs)
        return segs[k:] + segs[:k]
    lo, hi = segs[k]
    order = [(max(lo, value + 1), hi)] + segs[k + 1:] + segs[:k]
    if lo <= value:
        order.append((lo, value))
    return order


def next_free(txn: Transaction, network: str, idx: int, rs: RangeSet) -> IPAddress | None:
    last = txn.last_reserved(network, idx)
    for lo, hi in search_order(rs, last):
        found = txn.first_free(network, rs.family, lo, hi)
        if found is not None:
            if rs.family == 6:
                return ipaddress.IPv6Address(found)
            return ipaddress.IPv4Address(found)
    return None


def _satisfies(cfg: IpamConfig, held: list[Allocation], wanted: dict[int, IPAddress]) -> list[Grant] | None:
    """The grants `held` already amounts to, if it is exactly what this ADD would produce."""
    if len(held) != len(cfg.range_sets):
        return None
    grants: dict[int, Grant] = {}
    for a in held:
        found = locate(cfg, a.address)
        if found is None or found[0] in grants or found[1].reserved_reason(a.address):
            return None
        idx, rng = found
        if idx in wanted and wanted[idx] != a.address:
            return None
        grants[idx] = Grant(idx, rng, a.address)
    return [grants[i] for i in sorted(grants)]


def allocate(
    txn: Transaction,
    cfg: IpamConfig,
    owner: Owner,
    requested: list[IPAddress] | None = None,
) -> list[Grant]:
    """One address from each range set for `owner`, recorded in `txn`.

    Idempotent: if the owner already holds what this request would give, that is returned
    unchanged. If it holds something else (the config or the request changed), the old
    addresses are released in the same transaction.
    """
    network = owner.network
    wanted = requested_by_set(cfg, network, requested or [])
    held = txn.owned_by(network, owner.container_id, owner.ifname)
    if held:
        same = _satisfies(cfg, held, wanted)
        if same is not None:
            return same
        for a in held:
            txn.delete(network, a.address)
    now = time.time()
    grants: list[Grant] = []
    for idx, rs in enumerate(cfg.range_sets):
        if idx in wanted:
            addr = wanted[idx]
            other = txn.holder(network, addr)
            if other is not None:
                raise CniError(
                    Code.ADDRESS_UNAVAILABLE,
                    f"requested address {addr} of network {network!r} is already allocated to "
                    f"container {other.container_id} interface {other.ifname}",
                )
        else:
            found = next_free(txn, network, idx, rs)
            if found is None:
                raise CniError(
                    Code.POOL_EXHAUSTED,
                    f"pool exhausted: network {network!r} has no free address in range set "
                    f"{idx} ({rs.describe()})",
                    "release addresses (tenantnetctl ipam gc / release) or add a range",
                )
            addr = found
        txn.insert(Allocation(
            network=network,
            address=addr,
            container_id=owner.container_id,
            ifname=owner.ifname,
            pod_namespace=owner.pod_namespace,
            pod_name=owner.pod_name,
            netns=owner.netns,
            created=now,
        ))
        # As host-local does for every reservation, static ones included.
        txn.set_last_reserved(network, idx, addr)
        rng = rs.range_of(addr)
        assert rng is not None  # the address came from this range set
        grants.append(Grant(idx, rng, addr))
    return grants
