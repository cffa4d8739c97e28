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

A block that has held no address for `releaseAfter` seconds (default 300) goes back to the
pool on a later DEL or GC of the network (`Ledger.return_empty`).

Each agent keeps its node registered under a liveness lease (`ipam/nodes.py`); an operator
returns a dead node's blocks with `tenantnetctl ipam release-node`, refused while the lease
is alive unless forced — a partitioned node's blocks are never taken over automatically.

In the agent, the next block is claimed ahead of need, on a helper thread, once an ADD
allocates in the last quarter of the node's highest block (`Ledger.prefetch_if_low`).

A static address (`runtimeConfig.ips`, `IP=`, `args.cni.ips`) is served only by the node
that owns its block: its ADD claims the block when nobody has it, and is refused (code 111)
when another node does — so a static address never collides with a block allocation.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from cni.errors import CniError, Code
from cni.result import IPAddress, IPNetwork
from hostfiles.confined import ensure_private_dir
from ipam.config import ClusterSettings, IpamConfig, Range, RangeSet
from ipam.etcd import Etcd, EtcdConfig, EtcdError, EtcdUnavailable
from ipam.store import Store

__all__ = ["ClusterNode", "EtcdError", "EtcdUnavailable", "Ledger", "block_of", "blocks_of", "client",
           "owner_of", "restrict"]

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


def block_of(address: IPAddress, subnet: IPNetwork, sizes: ClusterSettings) -> IPNetwork:
    """The block of `subnet` that holds `address`."""
    prefix = max(sizes.block_size if address.version == 4 else sizes.block_size_v6, subnet.prefixlen)
    return ipaddress.ip_network(f"{address}/{prefix}", strict=False)


def _in(block: IPNetwork, rs: RangeSet) -> bool:
    """Whether `block` is one of range set `rs`'s subnets' blocks."""
    return any(r.family == block.version and block.subnet_of(r.subnet) for r in rs.ranges)  # type: ignore[arg-type]


def owner_of(value: bytes) -> str:
    """The node a block key's value names."""
    try:
        return str(json.loads(value).get("node", ""))
    except (ValueError, AttributeError):
        return value.decode("utf-8", "replace")


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


_parsed: dict[str, tuple[tuple[int, int, int], dict[IPNetwork, float | None]]] = {}
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


# When a claim of this process last found etcd unreachable, per blocks file: a claim that
# was waiting for the ledger's lock meanwhile fails at once (see `Ledger._locked_claim`).
_unreachable_at: dict[str, float] = {}

# The stores this process has served cluster networks from (the agent publishes their
# allocations, ipam/holdings.py).
data_dirs_seen: set[str] = set()


class Ledger:
    """The blocks of one network: this node's (local file), and claiming more (etcd)."""

    def __init__(self, node: ClusterNode, network: str, data_dir: str, sizes: ClusterSettings,
                 pool: tuple[RangeSet, ...] = ()) -> None:
        self.node, self.network, self.sizes = node, network, sizes
        self.pool = pool  # the network's range sets (the pool's diagnostics in etcd need them)
        self.dir = os.path.join(data_dir, "cluster")
        data_dirs_seen.add(data_dir)
        self.path = os.path.join(self.dir, f"{network}.blocks")
        self.key_prefix = f"{node.prefix}ipam/{network}/blocks/"
        self.sizes_key = f"{node.prefix}pools/{network}"
        self.ranges_key = f"{node.prefix}ranges/{network}"
        self.seen: list[IPNetwork] = []

    @contextmanager
    def _locked(self, give_up: Callable[[], bool] | None = None) -> Iterator[None]:
        """The ledger's file lock (across the node's processes). With `give_up`, the wait is
        a poll that raises EtcdUnavailable as soon as `give_up()` says so (flock is not
        first-come-first-served: a waiter could otherwise see the lock change hands many
        times before it gets it)."""
        ensure_private_dir(self.dir)
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            if give_up is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        got = True
                    except BlockingIOError:
                        got = False
                    # Asked after the attempt too: the lock comes free just as its holder gives up.
                    if give_up():
                        raise EtcdUnavailable(
                            "a claim of this network made while this one waited found no etcd "
                            f"endpoint answering within {self.node.etcd.timeout:g} s")
                    if got:
                        break
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)

    @contextmanager
    def _locked_claim(self) -> Iterator[None]:
        """The ledger's lock for a claim. Claims of one network queue behind one another;
        when etcd has no quorum each would spend its own etcdTimeout after the previous one's,
        so a burst of ADDs needing a block would wait N × etcdTimeout for its code 11. A
        claim waiting for the lock when another claim of this process finds etcd unreachable
        fails at once instead — and a claim begun later still tries etcd."""
        waited_from = time.monotonic()
        with self._locked(lambda: _unreachable_at.get(self.path, 0.0) > waited_from):
            try:
                yield
            except EtcdUnavailable:
                _unreachable_at[self.path] = time.monotonic()
                raise

    def _read(self) -> dict[IPNetwork, float | None]:
        """block -> since when it has been seen empty (None: in use, or not checked yet).
        Parsed once per version of the file (replaced by rename, so its inode changes)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {}
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = _parsed.get(self.path)
        if cached is not None and cached[0] == sig:
            return dict(cached[1])
        try:
            with open(self.path, encoding="utf-8") as fh:
                lines = [line.split() for line in fh.read(1 << 20).splitlines() if line.strip()]
        except FileNotFoundError:
            return {}
        blocks = {_parse_block(f[0]): (float(f[1]) if len(f) > 1 else None) for f in lines}
        _parsed[self.path] = (sig, blocks)
        return dict(blocks)

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
        tmp = f"{self.path}.tmp.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            for b in sorted(blocks, key=lambda b: (b.version, b)):
                since = blocks[b]
                fh.write(f"{_block_name(b)}\n" if since is None else f"{_block_name(b)} {since:.3f}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def _remember(self, blocks: list[IPNetwork]) -> None:
        current = self._read()
        self._write({b: current.get(b) for b in blocks})

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
        waited_from = time.monotonic()
        with self._locked():
            pending = self._returning()
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
            if _unreachable_at.get(self.path, 0.0) > waited_from or (
                    not sweep and pending and time.time() - self._returning_since() < RETRY_RETURNS_AFTER):
                # A claim or return of this network found etcd unreachable while this call
                # waited for the lock, or a return etcd did not hear of is recent: tell etcd
                # later rather than wait for it once more — DELs queued behind each other, or
                # one after another during an outage, must not each spend an etcdTimeout.
                if todo != pending:
                    self._set_returning(todo, keep_since=True)
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
                _unreachable_at[self.path] = time.monotonic()
                self._set_returning(todo[told:])
                raise
            if pending:
                self._set_returning([])
        return returned

    @property
    def _returning_path(self) -> str:
        return self.path[: -len(".blocks")] + ".returning"

    def _returning(self) -> list[IPNetwork]:
        """Blocks taken out of the blocks file whose return etcd has not heard of yet."""
        try:
            with open(self._returning_path, encoding="utf-8") as fh:
                return [_parse_block(line.strip()) for line in fh.read(1 << 20).splitlines() if line.strip()]
        except (FileNotFoundError, ValueError):
            return []

    def _returning_since(self) -> float:
        """When etcd last failed to hear of a return (the `.returning` file's mtime; 0: never)."""
        try:
            return os.stat(self._returning_path).st_mtime
        except FileNotFoundError:
            return 0.0

    def _set_returning(self, blocks: list[IPNetwork], keep_since: bool = False) -> None:
        if not blocks:
            if os.path.exists(self._returning_path):
                os.unlink(self._returning_path)
            return
        since = self._returning_since() if keep_since else 0.0
        tmp = f"{self._returning_path}.tmp.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{_block_name(b)}\n" for b in blocks))
        if since:
            os.utime(tmp, (since, since))
        os.replace(tmp, self._returning_path)

    def _value(self) -> bytes:
        return json.dumps({"node": self.node.name, "claimed": round(time.time(), 3)}).encode()

    # ---- one pool, one block size: checked on the way to etcd, never on an ADD with room ----

    def _sizes_value(self) -> bytes:
        return json.dumps({"blockSize": self.sizes.block_size, "blockSizeV6": self.sizes.block_size_v6},
                          sort_keys=True).encode()

    def _expected_prefix(self, block: IPNetwork) -> int | None:
        """The prefix length this node's settings give the block at `block`'s place (None:
        outside this node's view of the pool)."""
        for rs in self.pool:
            for r in rs.ranges:
                if r.family == block.version and block.network_address in r.subnet:
                    size = self.sizes.block_size if r.family == 4 else self.sizes.block_size_v6
                    return max(size, r.subnet.prefixlen)
        return None

    def _agree(self, etcd: Etcd, taken: dict[IPNetwork, str]) -> None:
        """Make sure every node claims this network's blocks with the same block sizes. Blocks
        of different sizes overlap (a /26 holds four /28s) and are different keys, so two
        nodes reading the NAD before and after an edit of blockSize would both own the same
        addresses. The sizes live at `<prefix>pools/<network>`; every claim is a transaction
        that compares them (`create_guarded`), and they change only while no block exists."""
        mine = self._sizes_value()
        for _ in range(4):
            kv = etcd.get(self.sizes_key)
            if kv is not None and kv.value == mine:
                return
            odd = [(b, o) for b, o in sorted(taken.items(), key=lambda t: (t[0].version, t[0]))
                   if self._expected_prefix(b) not in (None, b.prefixlen)]
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
        return [[r.family, r.start, r.end] for rs in self.pool for r in rs.ranges]

    def _check_overlap(self, etcd: Etcd) -> None:
        """Refuse a pool that overlaps another cluster network's (both would hand out the same
        addresses), unless both networks say they live on separate L2 segments
        (`allowOverlap`). Each network records its ranges at `<prefix>ranges/<network>`;
        a record counts only while its network holds blocks (a removed NAD's stays behind)."""
        if not self.pool:
            return
        mine = self._intervals()
        base = f"{self.node.prefix}ranges/"
        record = json.dumps({"ranges": mine, "allowOverlap": self.sizes.allow_overlap}).encode()
        current: bytes | None = None
        for kv in etcd.range(base):
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
            if not etcd.range(f"{self.node.prefix}ipam/{other}/blocks/"):
                continue  # a network that holds nothing (its NAD may be gone)
            fam, lo, hi = shared[0]
            first, last = ipaddress.ip_address(lo), ipaddress.ip_address(hi)
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid network config: ipam.ranges: network {self.network!r} overlaps network "
                           f"{other!r} in the cluster store ({first}-{last}): two cluster networks would "
                           "hand out the same addresses",
                           "give them distinct ranges, or, when each lives on its own L2 segment (e.g. "
                           "its own VLAN), set ipam.cluster.allowOverlap: true on both")
        if current != record:
            etcd.put(self.ranges_key, record)

    def _take(self, etcd: Etcd, block: IPNetwork, taken: dict[IPNetwork, str]) -> bool:
        """Claim `block` for this node in one transaction guarded by the pool's block sizes;
        False when another node has it (or claimed it meanwhile)."""
        key = self.key_prefix + _block_name(block)
        for _ in range(4):
            if etcd.create_guarded(key, self._value(), self.sizes_key, self._sizes_value()):
                return True
            kv = etcd.get(key)
            if kv is not None:
                # Ours when an earlier attempt of this call committed without its answer
                # reaching us (the client tries the next endpoint after a time-out).
                return owner_of(kv.value) == self.node.name
            self._agree(etcd, taken)  # the sizes changed under us: agree again (or refuse)
        return False

    def hold(self, block: IPNetwork, address: IPAddress) -> None:
        """Make sure this node owns `block` (the one a static address is in): claimed now if
        nobody has it. A static address is served only by the owner of its block, so it can
        never collide with another node's allocation; another node's block is code 111."""
        if block in self.owned():
            return
        etcd = client(self.node.etcd)
        key = self.key_prefix + _block_name(block)
        try:
            with self._locked_claim():
                known = self.owned()
                if block in known:
                    return
                taken = self._taken(etcd)
                self._agree(etcd, taken)
                self._check_overlap(etcd)
                clash = [b for b in taken if b != block and b.overlaps(block)]
                if clash:
                    raise CniError(Code.ADDRESS_UNAVAILABLE,
                                   f"requested address {address} of network {self.network!r} is in block "
                                   f"{clash[0]}, which node {taken[clash[0]]!r} owns")
                if not self._take(etcd, block, taken):
                    kv = etcd.get(key)
                    owner = owner_of(kv.value) if kv is not None else "?"
                    if owner != self.node.name:
                        raise CniError(Code.ADDRESS_UNAVAILABLE,
                                       f"requested address {address} of network {self.network!r} is in block "
                                       f"{block}, which node {owner!r} owns: on a cluster network a static "
                                       "address is served only by the node that owns its block")
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

    def claim(self, rs: RangeSet, seen: list[IPNetwork] | None = None) -> IPNetwork:
        """A block of `rs` for this node: one etcd owns already (adopted), else a new one
        claimed with one transaction. Code 11 when etcd is unreachable, code 110 when every
        block of the range set belongs to some node."""
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
                taken = self._taken(etcd)
                adopted = [b for b, o in taken.items() if o == self.node.name and b not in known]
                wanted = [b for b in adopted if _in(b, rs)]
                if adopted:
                    self._remember(sorted(known | set(adopted), key=lambda b: (b.version, b)))
                    pending = self._returning()
                    if set(pending) & set(adopted):  # ours again: no longer to be returned
                        self._set_returning([b for b in pending if b not in adopted])
                if wanted:
                    return wanted[0]
                if not self.pool:
                    self.pool = (rs,)
                self._agree(etcd, taken)
                self._check_overlap(etcd)
                # After _agree every block inside this node's view of the pool has the size it
                # expects; one outside it (an earlier, wider range) may still overlap a candidate.
                strays = [t for t in taken if self._expected_prefix(t) is None]
                attempts = 0
                for block in blocks_of(rs, self.sizes):
                    if block in taken or block in known or any(t.overlaps(block) for t in strays):
                        continue
                    attempts += 1
                    if self._take(etcd, block, taken):
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
