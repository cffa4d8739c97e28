"""The allocation store's interface: what the allocator and the operators' commands need.

A backend offers atomic, serialisable transactions over a small set of primitives (who
holds an address, which addresses an owner holds, the first free address in an interval,
the per-range-set cursor) plus a snapshot listing. The SQLite backend (`ipam.sqlite_store`)
maps a transaction onto `BEGIN IMMEDIATE … COMMIT`; a cluster-wide backend on etcd would
map it onto an optimistic software transaction (read revisions recorded, `Txn` with
compare-on-revision at commit, retried on conflict) with one key per address and one per
256-address block, so the same allocator code runs unchanged.

The generic operations below (release by owner, by address, GC) are written against the
interface only.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

from cni.result import IPAddress


class Allocation(NamedTuple):
    """One address held by one attachment (network, container id, ifname)."""

    network: str
    address: IPAddress
    container_id: str
    ifname: str
    pod_namespace: str = ""
    pod_name: str = ""
    netns: str = ""
    created: float = 0.0  # Unix time of the ADD that recorded it

    @property
    def attachment(self) -> tuple[str, str]:
        return (self.container_id, self.ifname)

    def to_dict(self) -> dict[str, object]:
        return {
            "network": self.network,
            "address": str(self.address),
            "containerID": self.container_id,
            "ifname": self.ifname,
            "podNamespace": self.pod_namespace,
            "podName": self.pod_name,
            "netns": self.netns,
            "created": self.created,
        }


class Transaction(Protocol):
    """Reads and writes that commit together or not at all, isolated from other processes."""

    def owned_by(self, network: str, container_id: str, ifname: str) -> list[Allocation]: ...

    def holder(self, network: str, address: IPAddress) -> Allocation | None: ...

    def first_free(self, network: str, family: int, lo: int, hi: int) -> int | None:
        """The lowest address in [lo, hi] (integers) that nobody holds, or None."""
        ...

    def last_reserved(self, network: str, range_set: int) -> IPAddress | None: ...

    def set_last_reserved(self, network: str, range_set: int, address: IPAddress) -> None: ...

    def insert(self, allocation: Allocation) -> None:
        """Record an allocation; the address must be free (the backend enforces it)."""
        ...

    def delete(self, network: str, address: IPAddress) -> None: ...

    def allocations(self, network: str | None = None) -> list[Allocation]: ...


class Store(abc.ABC):
    """A place allocations live. One instance per dataDir (or per cluster)."""

    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[Transaction]:
        """An exclusive, atomic transaction: committed on normal exit, else rolled back."""

    def snapshot(self) -> AbstractContextManager[Transaction]:
        """A consistent read-only view; backends may make it cheaper than `transaction`."""
        return self.transaction()

    @abc.abstractmethod
    def allocations(self, network: str | None = None) -> list[Allocation]:
        """A consistent snapshot of all allocations (of one network), by network and address."""

    @abc.abstractmethod
    def verify(self) -> list[str]:
        """Internal consistency problems (empty when the store is intact)."""

    def close(self) -> None:  # noqa: B027 - optional for backends without resources
        """Release the backend's resources."""

    def free_reserve(self) -> bool:
        """Give up space kept for releases on a full disk; False if there is none to give."""
        return False


# ---- generic operations ----------------------------------------------------------------


def release_owner(store: Store, network: str, container_id: str, ifname: str) -> list[Allocation]:
    """Release whatever (network, container id, ifname) holds; nothing held is fine.

    A release must work on a full disk too (else a failed ADD leaves its address behind):
    if the store has no room to record it, its reserve is given up and the release retried."""
    for attempt in (1, 2):
        try:
            with store.transaction() as txn:
                held = txn.owned_by(network, container_id, ifname)
                for a in held:
                    txn.delete(network, a.address)
            return held
        except Exception as exc:
            text = str(getattr(exc, "msg", exc)).lower()
            if attempt == 1 and ("full" in text or "no space" in text) and store.free_reserve():
                continue
            raise
    raise AssertionError("unreachable")


def release_addresses(store: Store, allocations: Iterable[Allocation]) -> list[Allocation]:
    """Release the given allocations if they are still held by the same attachment."""
    released = []
    with store.transaction() as txn:
        for a in allocations:
            current = txn.holder(a.network, a.address)
            if current is not None and current.attachment == a.attachment:
                txn.delete(a.network, a.address)
                released.append(a)
    return released


def gc(store: Store, network: str | None, keep: set[tuple[str, str]]) -> list[Allocation]:
    """Release every allocation (of `network`, or of all) whose attachment is not in `keep`."""
    with store.transaction() as txn:
        gone = [a for a in txn.allocations(network) if a.attachment not in keep]
        for a in gone:
            txn.delete(a.network, a.address)
    return gone
