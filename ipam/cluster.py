"""Cluster mode: one pool per network across every node, carved into per-node blocks on etcd.

A network whose `ipam` has `"cluster": {"blockSize": 26}` hands out addresses only from
blocks (here: /26s of its ranges) that this node owns. A block is claimed with one etcd
transaction — create `<prefix>ipam/<network>/blocks/<block>` if absent, value the node's
name — so a block has exactly one owner cluster-wide, and an address is only ever allocated
by the owner of its block, in the node-local store (`sqlite_store.py`) as before. An ADD with
room in a block it owns makes no etcd round trip; only a full set of blocks does, and when
etcd cannot be reached then, the ADD fails at once with code 11 (try again later).

The node remembers its blocks in `<dataDir>/cluster/<network>.blocks` (written after the
claim committed; ipam/blockfile.py reads and writes it). A crash between the two leaves a
block in etcd that the file lacks: the next claim lists the network's blocks (one range
call) and adopts every block etcd says is this node's before it claims a new one.

A block that has held no address for `releaseAfter` seconds (default 300) goes back to the
pool on a later DEL or GC of the network (`Ledger.return_empty`).

Each agent keeps its node registered under a liveness lease (`ipam/nodes.py`); an operator
returns a node's blocks with `tenantnetctl ipam release-node` after the node declared it is
leaving (`ipam leave`), or with `--force` — a lapsed lease proves nothing, so a partitioned
node's blocks are never taken over without one or the other. And a node checks: the agent's
heartbeat verifies every beat that etcd still names the node as each block's owner
(`Ledger.verify`: a block found gone is revoked locally, never allocated from again), and an
ADD without a verification in the last `VERIFY_FRESH` seconds verifies first
(`Ledger.ensure_verified`).

A node searches for a free block from a point of its own (`blocks_from`, seeded from its
name), so nodes do not all race for the same one; the search's outcome is typed (`Take`,
`Search`) and `Ledger.claim` turns it into a CNI code (lost races: 11, none left: 110).
The pool's checks (one block size, no overlap: ipam/pools.py) are compares of the claim's
own transaction.

In the agent, the next block is claimed ahead of need, on a helper thread, once an ADD
allocates in the last quarter of the node's highest block (`Ledger.prefetch_if_low`).

A static address (`runtimeConfig.ips`, `IP=`, `args.cni.ips`) is served only by the node
that owns its block: its ADD claims the block when nobody has it, and is refused (code 111)
when another node does — so a static address never collides with a block allocation.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from enum import Enum
from typing import Any, NamedTuple

from cni.errors import CniError, Code
from cni.result import IPAddress, IPNetwork
from ipam import outage
from ipam.blockfile import BlockFile, block_name, parse_block
from ipam.blocks import block_of, blocks_from, blocks_of, restrict
from ipam.blocks import contains as _in
from ipam.config import ClusterSettings, IpamConfig, RangeSet, check_cluster_pools
from ipam.etcd import Etcd, EtcdConfig, EtcdError, EtcdUnavailable, absent, put_op, value_is
from ipam.pools import Pool, PoolGuard
from ipam.store import Store

__all__ = ["ClusterNode", "EtcdError", "EtcdUnavailable", "Ledger", "block_of", "blocks_of", "client",
           "owner_of", "restrict"]

DEFAULT_PREFIX = "/tenantnet/"
MAX_CLAIM_ATTEMPTS = 64  # blocks raced for and lost before giving up (other nodes claiming)
# Seconds an ADD trusts this node's last verification that it owns its blocks: no longer
# than a node's liveness lease (ipam/nodes.py NODE_TTL), and the verification's read is sent
# before the beat renews the lease — so once the lease lapsed, the node trusts its blocks no
# longer either, and asks etcd before its next allocation.
VERIFY_FRESH = 15.0


class ClusterNode(NamedTuple):
    """This node in the cluster store (from the node config, admin-owned)."""

    name: str
    etcd: EtcdConfig
    prefix: str = DEFAULT_PREFIX
    # The admin's cluster pools (`clusterPools`): a cluster network's ranges must lie inside.
    pools: tuple[IPNetwork, ...] = ()


def leaving_key(prefix: str, name: str) -> str:
    """Where node `name` declares it is leaving (`tenantnetctl ipam leave`): it claims no
    block while the key exists, and `ipam release-node` may then return its blocks."""
    return f"{prefix}leaving/{name}"


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


_block_name, _parse_block = block_name, parse_block


def owner_of(value: bytes) -> str:
    """The node a block key's value names."""
    try:
        return str(json.loads(value).get("node", ""))
    except (ValueError, AttributeError):
        return value.decode("utf-8", "replace")


_restricted: dict[tuple[str, tuple[IPNetwork, ...], tuple[RangeSet, ...]], tuple[RangeSet, ...]] = {}


# Claiming ahead (`Ledger.prefetch_if_low`): the share of the highest block left when the
# next block is claimed, and where that claim runs (set by the agent; None: not at all).
LOW_WATER = 0.25
# Seconds after etcd failed to hear of a block's return before a DEL tells it again (a GC
# always tries: it is not on a pod's path, and it is how the pool converges after an outage).
RETRY_RETURNS_AFTER = 30.0
_background: Callable[[Callable[[], None]], object] | None = None
_prefetching: set[tuple[str, int]] = set()
_prefetching_lock = threading.Lock()


def set_background(run: Callable[[Callable[[], None]], object] | None) -> None:
    """Where ahead-of-need block claims run (e.g. a thread pool's submit)."""
    global _background
    _background = run


# The stores this process has served cluster networks from (the agent publishes their
# allocations, ipam/holdings.py).
data_dirs_seen: set[str] = set()


class Take(Enum):
    """What one claim transaction of one block came to."""

    TAKEN = "taken"  # this node owns the block now
    LOST_RACE = "lost race"  # another node has it (claimed it meanwhile)
    STALE = "stale"  # the pool's block sizes or ranges changed since they were checked


class Search(NamedTuple):
    """What a search for a free block came to: a block, or why none (`Ledger.claim` turns
    that into a CNI code: lost races are code 11, no free block left code 110)."""

    block: IPNetwork | None
    lost_races: int = 0


class Ledger:
    """The blocks of one network: this node's (local file, ipam/blockfile.py), and claiming,
    verifying and returning them (etcd)."""

    def __init__(self, node: ClusterNode, network: str, data_dir: str, sizes: ClusterSettings,
                 pool: tuple[RangeSet, ...] = ()) -> None:
        self.node, self.network, self.sizes = node, network, sizes
        self.pool = pool  # the network's range sets (the pool's diagnostics in etcd need them)
        self.file = BlockFile(data_dir, network)
        data_dirs_seen.add(data_dir)
        self.path = self.file.path
        self.key_prefix = f"{node.prefix}ipam/{network}/blocks/"
        self.pool_of = Pool(node.prefix, network, sizes, pool)
        self.sizes_key = self.pool_of.sizes_key
        self.seen: list[IPNetwork] = []

    def _locked(self, give_up: Callable[[], bool] | None = None) -> AbstractContextManager[None]:
        return self.file.locked(give_up, lambda: EtcdUnavailable(
            "a claim of this network made while this one waited found no etcd endpoint answering within "
            f"{self.node.etcd.timeout:g} s"))

    @contextmanager
    def _locked_claim(self) -> Iterator[None]:
        """The ledger's lock for a claim. Claims of one network queue behind one another;
        when etcd has no quorum each would spend its own etcdTimeout after the previous one's,
        so a burst of ADDs needing a block would wait N × etcdTimeout for its code 11. A
        claim waiting for the lock when another claim of this node finds etcd unreachable
        fails at once instead — and a claim begun later still tries etcd."""
        waited_from = outage.seen(self.path)  # across the node's processes (ipam/outage.py)
        with self._locked(lambda: outage.seen(self.path) != waited_from):
            try:
                yield
            except EtcdUnavailable:
                outage.mark(self.path)
                raise

    def _read(self) -> dict[IPNetwork, float | None]:
        return self.file.read()

    def owned(self) -> list[IPNetwork]:
        """The blocks this node owns, as it remembers them (no etcd call)."""
        return list(self._read())

    def restricted(self, cfg: IpamConfig) -> IpamConfig:
        """`restrict(cfg, self.owned())`, computed once per version of the blocks file (an ADD
        with room then costs a stat, not a walk over every block)."""
        blocks = tuple(self._read())
        self.seen = list(blocks)  # what this view was made from (`claim` compares against it)
        key = (self.path, blocks, cfg.range_sets)
        found = _restricted.get(key)
        if found is None:
            if len(_restricted) > 256:
                _restricted.clear()
            found = _restricted[key] = restrict(cfg, list(blocks)).range_sets
        return cfg._replace(range_sets=found)

    def _write(self, blocks: dict[IPNetwork, float | None]) -> None:
        self.file.write(blocks)

    def _remember(self, blocks: list[IPNetwork]) -> None:
        current = self._read()
        self._write({b: current.get(b) for b in blocks})
        self.file.forget_revoked(blocks)

    # ---- does this node still own its blocks? ----

    def _reconcile(self, taken: dict[IPNetwork, str], sent_at: float,
                   among: set[IPNetwork] | None = None) -> list[IPNetwork]:
        """With the ledger's lock held and `taken` read from etcd (the read sent at
        `sent_at`, CLOCK_MONOTONIC): take every block (of `among`, when given: those listed
        before the read) etcd no longer names as this node's out of the blocks file, so that
        no ADD allocates from it again, and note that ownership was verified. The blocks
        found gone."""
        blocks = self._read()
        gone = [b for b in blocks if taken.get(b) != self.node.name and (among is None or b in among)]
        if gone:
            self.file.add_revoked(gone)
            self._write({b: since for b, since in blocks.items() if b not in gone})
        self.file.set_verified(sent_at)
        return gone

    def verify(self) -> list[IPNetwork]:
        """Read from etcd which blocks this node still owns (one range call); a block another
        node has now, or an operator released (`ipam release-node --force`), is revoked
        locally. The blocks found gone. EtcdUnavailable / EtcdError propagate.

        The read is made without the ledger's lock (a claim must not wait for it while etcd
        is away), so only blocks listed before it was sent are judged: one this node claims
        meanwhile is not in it."""
        before = set(self._read())
        sent_at = time.monotonic()
        taken = self._taken(client(self.node.etcd)) if before else {}
        with self._locked():
            return self._reconcile(taken, sent_at, before)

    def surrender(self, store: Store | None) -> list[IPNetwork]:
        """This node is leaving (`tenantnetctl ipam leave`): no ADD allocates from its blocks
        again (revoked locally, inside the store's write transaction, so no ADD still works
        from the earlier list); etcd names the node as their owner until `release-node`."""
        with self._locked():
            if store is None:
                blocks = self._read()
            else:
                with store.transaction():
                    blocks = self._read()
                    self._surrender(blocks)
                return list(blocks)
            self._surrender(blocks)
            return list(blocks)

    def _surrender(self, blocks: dict[IPNetwork, float | None]) -> None:
        if blocks:
            self.file.add_revoked(list(blocks))
            self._write({})

    def ensure_verified(self) -> None:
        """Before an ADD allocates from this node's blocks: unless this node verified its
        ownership within `VERIFY_FRESH` seconds (the agent's heartbeat does, every 5 s), verify
        it now. A node whose lease lapsed may have lost its blocks to `ipam release-node
        --force` meanwhile; one cut off from etcd for longer than its lease stops allocating
        (code 11) until it can verify again. A stat when the heartbeat is healthy."""
        last = self.file.verified_at()
        if last is not None and 0 <= time.monotonic() - last < VERIFY_FRESH:
            return
        if not self._read():
            return  # nothing to allocate from: the claim asks etcd anyway
        try:
            self.verify()
        except EtcdUnavailable as exc:
            raise CniError(Code.TRY_AGAIN_LATER,
                           f"network {self.network!r}: this node has not verified for {VERIFY_FRESH:g} s "
                           "that it still owns its address blocks (no agent heartbeat, or cut off from the "
                           f"cluster store), and the cluster store is unreachable: {exc}") from None
        except EtcdError as exc:
            raise CniError(Code.IO_FAILURE,
                           f"network {self.network!r}: verifying this node's address blocks: {exc}") from None

    def return_empty(self, store: Store, release_after: float, sweep: bool = False) -> list[IPNetwork]:
        """Give back to the pool every block of this node that has held no address for
        `release_after` seconds (as seen by earlier calls); the blocks returned. The choice is
        made inside the store's write transaction, so no ADD of this node can allocate in a
        block while it is being returned, and etcd is told while the ledger's lock is still
        held, so no claim of this node can adopt the block back in between (it would then
        allocate in a block etcd is about to call free).

        A block whose return etcd did not hear of (unreachable) is remembered in
        `<network>.returning` and told again on the next call. With `sweep` (GC), blocks
        that etcd says are this node's but the blocks file lacks and that hold no address (a
        crash between a claim and the file) are returned too."""
        now = time.time()
        returned: list[IPNetwork] = []
        waited_from = outage.seen(self.path)
        with self._locked():
            pending = self.file.returning()
            with store.transaction() as txn:
                blocks = self._read()
                before = dict(blocks)
                held = [a.address for a in txn.allocations(self.network)]
                for block in list(blocks):
                    if any(a.version == block.version and a in block for a in held):
                        blocks[block] = None
                        continue
                    since = blocks[block]
                    if since is None and release_after > 0:
                        blocks[block] = now  # empty from now on: returned once the grace has passed
                    elif since is None or now - since >= release_after:
                        returned.append(block)
                        del blocks[block]
                if blocks != before:
                    self._write(blocks)
            todo = list(dict.fromkeys([*pending, *returned]))
            if not todo and not sweep:
                return []
            recent = time.time() - self.file.returning_since() < RETRY_RETURNS_AFTER
            if outage.seen(self.path) != waited_from or (not sweep and pending and recent):
                # A claim or return of this network found etcd unreachable while this call
                # waited for the lock, or a return etcd did not hear of is recent: tell etcd
                # later rather than wait for it once more — DELs queued behind each other, or
                # one after another during an outage, must not each spend an etcdTimeout.
                if todo != pending:
                    self.file.set_returning(todo, keep_since=True)
                return returned
            etcd = client(self.node.etcd)
            told = 0
            try:
                if sweep:
                    todo += [b for b, owner in self._taken(etcd).items()
                             if owner == self.node.name and b not in blocks and b not in todo
                             and not any(a.version == b.version and a in b for a in held)]
                for block in todo:
                    key = self.key_prefix + _block_name(block)
                    kv = etcd.get(key)
                    if kv is not None and owner_of(kv.value) == self.node.name:
                        etcd.delete_if(key, kv.value)
                    told += 1
            except EtcdUnavailable:
                outage.mark(self.path)
                self.file.set_returning(todo[told:])
                raise
            if pending:
                self.file.set_returning([])
        return returned

    def _value(self) -> bytes:
        return json.dumps({"node": self.node.name, "claimed": round(time.time(), 3)}).encode()

    def _before_claim(self, etcd: Etcd, taken: dict[IPNetwork, str]) -> PoolGuard:
        """What every claim checks first: the node has not declared it is leaving, the
        network's sizes agree, its ranges overlap no other network's (as compares for the
        claim's transaction)."""
        if etcd.get(leaving_key(self.node.prefix, self.node.name)) is not None:
            raise CniError(Code.TRY_AGAIN_LATER,
                           f"network {self.network!r}: node {self.node.name!r} has declared it is leaving "
                           "the cluster (tenantnetctl ipam leave): it claims no address block until an "
                           "operator ran `tenantnetctl ipam release-node` for it")
        self.pool_of.agree(etcd, taken)
        return self.pool_of.check_overlap(etcd)

    def _take(self, etcd: Etcd, block: IPNetwork, guard: PoolGuard) -> Take:
        """Claim `block` for this node in one transaction that also compares the pool's block
        sizes and what the overlap check read (`guard`)."""
        key = self.key_prefix + _block_name(block)
        sizes = self.pool_of.sizes_value()
        if etcd.txn([absent(key), value_is(self.sizes_key, sizes), *guard.compares],
                    [put_op(key, self._value()), put_op(self.sizes_key, sizes), *guard.puts]):
            return Take.TAKEN
        kv = etcd.get(key)
        if kv is None:
            return Take.STALE
        # Ours when an earlier attempt of this call committed without its answer reaching us
        # (the client tries the next endpoint after a time-out).
        return Take.TAKEN if owner_of(kv.value) == self.node.name else Take.LOST_RACE

    def _take_checked(self, etcd: Etcd, block: IPNetwork, guard: PoolGuard) -> Take:
        """`_take`, checking the pool again (or refusing) each time it changed meanwhile."""
        for _ in range(4):
            took = self._take(etcd, block, guard)
            if took is not Take.STALE:
                return took
            guard = self._before_claim(etcd, self._taken(etcd))
        return Take.STALE

    def _check_pools(self, range_sets: tuple[RangeSet, ...]) -> None:
        check_cluster_pools(range_sets, self.node.pools)

    def hold(self, block: IPNetwork, address: IPAddress) -> None:
        """Make sure this node owns `block` (the one a static address is in): claimed now if
        nobody has it. A static address is served only by the owner of its block, so it can
        never collide with another node's allocation; another node's block is code 111."""
        if block in self.owned():
            return
        self._check_pools(self.pool)
        etcd = client(self.node.etcd)
        try:
            with self._locked_claim():
                sent_at = time.monotonic()
                taken = self._taken(etcd)
                self._reconcile(taken, sent_at)
                known = self.owned()
                if block in known:
                    return
                guard = self._before_claim(etcd, taken)
                clash = [b for b in taken if b != block and b.overlaps(block)]
                if clash:
                    raise CniError(Code.ADDRESS_UNAVAILABLE,
                                   f"requested address {address} of network {self.network!r} is in block "
                                   f"{clash[0]}, which node {taken[clash[0]]!r} owns")
                took = self._take_checked(etcd, block, guard)
                if took is Take.LOST_RACE:
                    owner = self._taken(etcd).get(block, "?")
                    raise CniError(Code.ADDRESS_UNAVAILABLE,
                                   f"requested address {address} of network {self.network!r} is in block "
                                   f"{block}, which node {owner!r} owns: on a cluster network a static "
                                   "address is served only by the node that owns its block")
                if took is Take.STALE:
                    raise CniError(Code.TRY_AGAIN_LATER,
                                   f"network {self.network!r}: the cluster store's pools kept changing while "
                                   f"block {block} was claimed; try again")
                self._remember([*known, block])
        except EtcdUnavailable as exc:
            raise CniError(Code.TRY_AGAIN_LATER, f"network {self.network!r}: the static address {address} is "
                                                 f"in a block this node does not own yet, and the cluster "
                                                 f"store is unreachable: {exc}") from None
        except EtcdError as exc:
            raise CniError(Code.IO_FAILURE,
                           f"network {self.network!r}: claiming block {block}: {exc}") from None

    def _taken(self, etcd: Etcd) -> dict[IPNetwork, str]:
        """Every claimed block of the network in etcd, with its owning node (one range call)."""
        taken: dict[IPNetwork, str] = {}
        for kv in etcd.range(self.key_prefix):
            try:
                taken[_parse_block(kv.key[len(self.key_prefix):])] = owner_of(kv.value)
            except ValueError:
                continue
        return taken

    def prefetch_if_low(self, cfg: IpamConfig, grants: list[Any]) -> None:
        """Claim the next block ahead of need, off the ADD's path, when an ADD has just
        allocated in the last quarter of the highest block this node owns in a range set (the
        cursor moves up through the node's blocks, so that is "running low"). Only where a
        background runner is set (the agent: `set_background`); a one-shot exec claims on
        demand instead. At most one claim per network and range set runs at a time."""
        if _background is None:
            return
        owned = self.owned()
        for grant in grants:
            blocks = [b for b in owned if b.version == grant.address.version
                      and b.subnet_of(grant.range.subnet)]
            if not blocks:
                continue
            top = max(blocks)
            size = top.num_addresses
            offset = int(grant.address) - int(top.network_address)
            if not 0 <= offset < size or offset < size * (1 - LOW_WATER):
                continue
            key = (self.path, grant.range_set)
            with _prefetching_lock:
                if key in _prefetching:
                    continue
                _prefetching.add(key)
            rs = cfg.range_sets[grant.range_set]

            def run(rs: RangeSet = rs, key: tuple[str, int] = key) -> None:
                try:
                    self.claim(rs)
                except CniError:
                    pass  # the next ADD that needs the block claims it (and reports why not)
                finally:
                    with _prefetching_lock:
                        _prefetching.discard(key)

            _background(run)

    def _search(self, etcd: Etcd, rs: RangeSet, taken: dict[IPNetwork, str], known: set[IPNetwork],
                guard: PoolGuard) -> Search:
        """Claim the first free block of `rs` from this node's own starting point on."""
        # After agreeing on sizes every block inside this node's view of the pool has the size
        # it expects; one outside it (an earlier, wider range) may still overlap a candidate.
        strays = [t for t in taken if self.pool_of.expected_prefix(t) is None]
        lost = 0
        for block in blocks_from(rs, self.sizes, self.node.name):
            if block in taken or block in known or any(t.overlaps(block) for t in strays):
                continue
            took = self._take_checked(etcd, block, guard)
            if took is Take.TAKEN:
                return Search(block, lost)
            lost += 1
            if lost >= MAX_CLAIM_ATTEMPTS:
                break
        return Search(None, lost)

    def claim(self, rs: RangeSet, seen: list[IPNetwork] | None = None) -> IPNetwork:
        """A block of `rs` for this node: one etcd owns already (adopted), else a new one
        claimed with one transaction. Code 11 when etcd is unreachable or every block tried
        was claimed by another node first, code 110 when every block of the range set belongs
        to some node."""
        if not self.pool:
            self.pool = (rs,)
            self.pool_of = Pool(self.node.prefix, self.network, self.sizes, self.pool)
        self._check_pools(self.pool)
        etcd = client(self.node.etcd)
        try:
            with self._locked_claim():
                known = set(self.owned())
                if seen is not None:
                    # A concurrent ADD of this node claimed a block while this one waited for
                    # the lock: use that one (many ADDs finding the blocks full at once must
                    # not claim one block each).
                    fresh = [b for b in known - set(seen) if _in(b, rs)]
                    if fresh:
                        return fresh[0]
                sent_at = time.monotonic()
                taken = self._taken(etcd)
                self._reconcile(taken, sent_at)  # blocks found gone are revoked here too
                known = set(self.owned())
                guard = self._before_claim(etcd, taken)
                # A block etcd names as this node's that the file lacks: a crash between a claim
                # and the file. (A node that declared it is leaving never gets here.)
                adopted = [b for b, o in taken.items() if o == self.node.name and b not in known]
                wanted = [b for b in adopted if _in(b, rs)]
                if adopted:
                    self._remember(sorted(known | set(adopted), key=lambda b: (b.version, b)))
                    pending = self.file.returning()
                    if set(pending) & set(adopted):  # ours again: no longer to be returned
                        self.file.set_returning([b for b in pending if b not in adopted])
                if wanted:
                    return wanted[0]
                found = self._search(etcd, rs, taken, known, guard)
                if found.block is not None:
                    self._remember([*known, *adopted, found.block])
                    return found.block
        except EtcdUnavailable as exc:
            raise CniError(Code.TRY_AGAIN_LATER, f"network {self.network!r} needs a new address block "
                                                 f"and the cluster store is unreachable: {exc}") from None
        except EtcdError as exc:
            raise CniError(Code.IO_FAILURE, f"network {self.network!r}: claiming an address block: {exc}") \
                from None
        if found.lost_races >= MAX_CLAIM_ATTEMPTS:
            raise CniError(Code.TRY_AGAIN_LATER,
                           f"network {self.network!r}: other nodes claimed each of the {found.lost_races} "
                           f"free blocks of {rs.describe()} this node tried first; try again")
        raise CniError(Code.POOL_EXHAUSTED,
                       f"pool exhausted: network {self.network!r} has no unclaimed block left in "
                       f"{rs.describe()} (every block belongs to a node)",
                       "release addresses, or blocks of nodes that are gone")
