"""The IPAM verbs as an in-process API: what `tenantnet` calls without exec, and what the
`tenantnet-ipam` executable wraps.

    add(env, conf) -> Result        one address per range set, idempotent per attachment
    delete(env, conf) -> None       releases; succeeds when nothing is held
    check(env, conf) -> None        raises CniError(CHECK_FAILED) on drift
    gc(conf, keep) -> None          releases the network's allocations not in `keep`
    status(conf) -> None            raises CniError(NOT_AVAILABLE) if an ADD could not succeed

`conf.ipam` is the `ipam` section, `conf.name` the network (the pool's identity). The whole
config is validated before the store is opened, so bad input never leaves a trace.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.netconf import NetConf
from cni.result import DNS, IPAddress, IPConfig, Result
from hostfiles.confined import confined_dir
from ipam import allocator, known_stores
from ipam.config import Confinement, IpamConfig, data_dir_of, parse_ipam, static_requests
from ipam.sqlite_store import DB_NAME, Removal, SqliteStore, remove_if_unused
from ipam.store import Allocation, Store, release_owner
from ipam.store import gc as store_gc

if TYPE_CHECKING:
    from ipam.cluster import ClusterNode

# The stores this process has open, most recently used last. Bounded: a tenant choosing a new
# dataDir per NAD must not grow the agent's descriptors (four per open store) without end.
# An evicted store is closed; whoever still holds it opens it again on its next use.
MAX_OPEN_STORES = 32
_stores: OrderedDict[str, SqliteStore] = OrderedDict()
_stores_pid = os.getpid()
_stores_lock = threading.Lock()
# Store directories this process has listed in the node's known stores (known_stores.py).
_listed: set[str] = set()


def open_store(data_dir: str, *, create: bool = True) -> SqliteStore | None:
    """The store for `data_dir`, opened once per process (None if absent and not `create`)."""
    global _stores_pid
    evicted: list[SqliteStore] = []
    with _stores_lock:
        if _stores_pid != os.getpid():
            # A forked child must not share its parent's SQLite connections.
            _stores.clear()
            _listed.clear()
            _stores_pid = os.getpid()
        store = _stores.get(data_dir)
        if store is None:
            if not create and not os.path.exists(os.path.join(data_dir, DB_NAME)):
                return None
            store = SqliteStore(data_dir, create=create)
            _stores[data_dir] = store
            while len(_stores) > MAX_OPEN_STORES:
                evicted.append(_stores.popitem(last=False)[1])
        else:
            _stores.move_to_end(data_dir)
    for old in evicted:
        old.close()  # outside the cache's lock: it waits for a transaction still running on it
    return store


def _opened(data_dir: str, limits: Confinement | None, *, create: bool = True) -> SqliteStore | None:
    """`open_store`, and the store listed as one tenantnet opened where it was allowed."""
    store = open_store(data_dir, create=create)
    if store is not None and data_dir not in _listed:
        known_stores.record(_limits(limits).known_stores, data_dir)
        if len(_listed) > 4 * MAX_OPEN_STORES:
            _listed.clear()
        _listed.add(data_dir)
    return store


# How long a store tenantnet made must have held nothing before a DEL or GC removes it. Not
# at once: its cursors go with it, and host-local never hands a just-freed address out again
# at once (a peer's ARP entry for it may still be fresh; Linux keeps a stale one up to 60 s).
EMPTY_GRACE_S = 60.0


def _removable(store: SqliteStore, data_dir: str, limits: Confinement | None) -> bool:
    """A store that may go once it holds nothing: tenantnet made it, and it is not the
    node's default store (that one serves every NAD without dataDir)."""
    return store.made_by_tenantnet and data_dir != _limits(limits).default_data_dir


def note_if_empty(store: SqliteStore, data_dir: str, limits: Confinement | None) -> None:
    """Mark a removable store that holds nothing (known_stores.mark_empty)."""
    if not _removable(store, data_dir, limits):
        return
    try:
        if store.holds_nothing():
            known_stores.mark_empty(_limits(limits).known_stores, data_dir)
    except CniError:
        pass


def sweep_empty(limits: Confinement | None, now: float | None = None) -> list[str]:
    """Remove the stores that have held nothing for EMPTY_GRACE_S (the ones removed). Best
    effort: a store open in another process, or whose files are busy, stays for a later call;
    one holding an address again loses its mark."""
    registry = _limits(limits).known_stores
    now = time.time() if now is None else now
    removed = []
    for data_dir, since in known_stores.empty_since(registry):
        if now - since < EMPTY_GRACE_S:
            continue
        if not known_stores.recorded(registry, data_dir):
            known_stores.forget(registry, data_dir)  # its listing went: only the mark was left
            continue
        with _stores_lock:
            store = _stores.pop(data_dir, None)
        if store is not None:
            store.close()  # our own open copy would count as a user
        outcome = remove_if_unused(data_dir)
        if outcome is Removal.REMOVED:
            known_stores.forget(registry, data_dir)
            _listed.discard(data_dir)
            removed.append(data_dir)
        elif outcome is not Removal.IN_USE:
            known_stores.unmark_empty(registry, data_dir)
    return removed


def _requested(env: CniEnv, conf: NetConf) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return static_requests(iter([
        ("runtimeConfig.ips", conf.runtime("ips")),
        ("CNI_ARGS IP", list(env.args.ips)),
        ("args.cni.ips", conf.args_cni.get("ips")),
    ]))


def _limits(limits: Confinement | None) -> Confinement:
    from ipam import config

    return limits or config.DEFAULT_CONFINEMENT


def _data_dir(ipam: object, limits: Confinement | None) -> str:
    """The config's dataDir, inside the directories the node allows (code 7 otherwise)."""
    value = data_dir_of(ipam if isinstance(ipam, dict) else {}, _limits(limits).default_data_dir)
    return confined_dir("ipam.dataDir", value, _limits(limits).data_dirs)


def _dns(cfg: IpamConfig, limits: Confinement | None) -> DNS:
    dns = DNS()
    if cfg.resolv_conf:
        from ipam.resolv import parse_resolv_conf

        dns = parse_resolv_conf(cfg.resolv_conf, _limits(limits).resolv_conf_paths)
    # A literal `dns` object wins, field by field, over what resolvConf said.
    return DNS(
        nameservers=list(cfg.dns.nameservers or dns.nameservers),
        domain=cfg.dns.domain or dns.domain,
        search=list(cfg.dns.search or dns.search),
        options=list(cfg.dns.options or dns.options),
    )


def _owner(env: CniEnv, conf: NetConf) -> allocator.Owner:
    return allocator.Owner(
        network=conf.name,
        container_id=env.container_id,
        ifname=env.ifname,
        pod_namespace=env.args.pod_namespace,
        pod_name=env.args.pod_name,
        netns=env.netns,
    )


def add(env: CniEnv, conf: NetConf, limits: Confinement | None = None,
        cluster_node: ClusterNode | None = None) -> Result:
    cfg = parse_ipam(conf.ipam)
    requested = _requested(env, conf)
    data_dir = _data_dir(conf.ipam, limits)
    dns = _dns(cfg, limits)  # read resolvConf before recording anything: its errors are config errors
    store = _opened(data_dir, limits)
    assert store is not None
    try:
        if cfg.cluster is None:
            with store.transaction() as txn:
                grants = allocator.allocate(txn, cfg, _owner(env, conf), requested)
        else:
            grants = _allocate_in_blocks(store, cfg, env, conf, requested, data_dir, cluster_node)
    except CniError:
        note_if_empty(store, data_dir, limits)  # a refused ADD's new store goes like any empty one
        raise
    if _removable(store, data_dir, limits):
        known_stores.unmark_empty(_limits(limits).known_stores, data_dir)  # holds one again
    ips = [
        IPConfig(
            address=ipaddress.ip_interface(f"{g.address}/{g.range.subnet.prefixlen}"),
            gateway=g.range.gateway,
        )
        for g in grants
    ]
    return Result(ips=ips, routes=list(cfg.routes), dns=dns)


def _allocate_in_blocks(store: Store, cfg: IpamConfig, env: CniEnv, conf: NetConf,
                        requested: list[IPAddress], data_dir: str,
                        node: ClusterNode | None) -> list[allocator.Grant]:
    """Cluster mode: allocate in the node-local store from blocks this node owns, claiming
    a block (one etcd transaction, outside the store's lock) when a range set has no room."""
    assert cfg.cluster is not None
    if node is None:
        raise CniError(Code.INVALID_CONFIG, f"invalid network config: ipam.cluster: network {conf.name!r} "
                                            "is cluster-wide, and this node config names no cluster store "
                                            "(etcdEndpoints)")
    from ipam import cluster  # only networks in cluster mode pay for the etcd client's imports

    ledger = cluster.Ledger(node, conf.name, data_dir, cfg.cluster, cfg.range_sets)
    ledger.ensure_verified()  # a stat while the agent's heartbeat verifies the node's blocks
    for idx, address in allocator.requested_by_set(cfg, conf.name, requested).items():
        subnet = cfg.range_sets[idx].range_of(address)
        assert subnet is not None  # requested_by_set found it there
        ledger.hold(cluster.block_of(address, subnet.subnet, cfg.cluster), address)
    owner = _owner(env, conf)
    for _ in range(len(cfg.range_sets) * 4 + 1):
        with store.transaction() as txn:
            # Read inside the write transaction: a block being returned (Ledger.return_empty,
            # in the same kind of transaction) is either still listed here, or already gone.
            mine = ledger.restricted(cfg)
            if all(rs.ranges for rs in mine.range_sets):
                try:
                    grants = allocator.allocate(txn, mine, owner, requested)
                except CniError as err:
                    if err.code != Code.POOL_EXHAUSTED:
                        raise
                else:
                    ledger.prefetch_if_low(cfg, grants)
                    return grants
            # The node's blocks are full (or it has none) for some range set: which one is
            # looked up only now, so that an ADD with room pays for nothing of this.
            short = [idx for idx, rs in enumerate(mine.range_sets)
                     if not rs.ranges or allocator.next_free(txn, conf.name, idx, rs) is None]
        if not short:
            continue  # freed meanwhile by a concurrent DEL
        ledger.claim(cfg.range_sets[short[0]], ledger.seen)
    raise CniError(Code.TRY_AGAIN_LATER, f"network {conf.name!r}: the blocks claimed for this node filled "
                                         "up as fast as they were claimed; try again")


def delete(env: CniEnv, conf: NetConf, limits: Confinement | None = None,
           cluster_node: ClusterNode | None = None) -> None:
    # Only dataDir is needed to release: a DEL must work even if the ranges were since
    # edited into something invalid, and must not create a store that never existed.
    data_dir = _release_dir(conf.ipam, limits)
    store = _opened(data_dir, limits, create=False)
    if store is not None:
        release_owner(store, conf.name, env.container_id, env.ifname)
        return_empty_blocks(store, conf, data_dir, cluster_node)
        note_if_empty(store, data_dir, limits)
    sweep_empty(limits)


def _release_dir(ipam: object, limits: Confinement | None) -> str:
    """Where a DEL releases: the config's dataDir if the node allows it, else if it is a
    store tenantnet opened while it was allowed (ipam/known_stores.py) — so narrowing
    ipamDataDirs does not leak the addresses allocated before. Code 7 otherwise."""
    try:
        return _data_dir(ipam, limits)
    except CniError as err:
        if err.code != Code.INVALID_CONFIG:
            raise
        try:
            value = data_dir_of(ipam if isinstance(ipam, dict) else {}, _limits(limits).default_data_dir)
        except CniError:
            raise err from None
        if not known_stores.recorded(_limits(limits).known_stores, value):
            raise
        return value


def return_empty_blocks(store: Store, conf: NetConf, data_dir: str, node: ClusterNode | None,
                        sweep: bool = False) -> None:
    """Cluster mode: blocks of this node empty for `releaseAfter` go back to the pool. Best
    effort, never an error: a DEL always succeeds locally, and what is not returned now is
    returned by a later DEL or GC."""
    if node is None or not isinstance(conf.ipam, dict) or conf.ipam.get("cluster") is None:
        return
    from ipam import cluster

    try:
        settings = parse_ipam(conf.ipam).cluster
        assert settings is not None
        cluster.Ledger(node, conf.name, data_dir, settings).return_empty(store, settings.release_after, sweep)
    except (CniError, OSError, cluster.EtcdUnavailable, cluster.EtcdError):
        pass


def check(env: CniEnv, conf: NetConf, limits: Confinement | None = None) -> None:
    cfg = parse_ipam(conf.ipam)
    where = f"network {conf.name!r} container {env.container_id} interface {env.ifname}"
    store = _opened(_data_dir(conf.ipam, limits), limits, create=False)
    held: list[Allocation] = []
    if store is not None:
        with store.snapshot() as txn:
            held = txn.owned_by(conf.name, env.container_id, env.ifname)
    if not held:
        raise CniError(Code.CHECK_FAILED, f"check failed: {where} holds no address")
    by_set: dict[int, list[Allocation]] = {}
    for a in held:
        found = allocator.locate(cfg, a.address)
        if found is None:
            raise CniError(
                Code.CHECK_FAILED,
                f"check failed: {where} holds {a.address}, which is in no range of the config",
            )
        by_set.setdefault(found[0], []).append(a)
    for idx, rs in enumerate(cfg.range_sets):
        got = by_set.get(idx, [])
        if len(got) != 1:
            listed = ", ".join(str(a.address) for a in got) or "none"
            raise CniError(
                Code.CHECK_FAILED,
                f"check failed: {where} should hold one address of range set {idx} "
                f"({rs.describe()}), holds {listed}",
            )
    if conf.prev_result is not None:
        previous = {ip.address.ip for ip in conf.prev_result.ips}
        mine = {a.address for a in held}
        for a in held:
            if a.address not in previous:
                raise CniError(
                    Code.CHECK_FAILED,
                    f"check failed: {where} holds {a.address}, missing from prevResult.ips",
                )
        for ip in previous:
            if allocator.locate(cfg, ip) is not None and ip not in mine:
                raise CniError(
                    Code.CHECK_FAILED,
                    f"check failed: prevResult.ips has {ip}, which {where} does not hold",
                )


def gc(conf: NetConf, keep: set[tuple[str, str]], limits: Confinement | None = None,
       cluster_node: ClusterNode | None = None) -> None:
    data_dir = _data_dir(conf.ipam, limits)
    store = _opened(data_dir, limits, create=False)
    if store is not None:
        store_gc(store, conf.name, keep)
        # GC also returns blocks etcd names as this node's that its blocks file lost.
        return_empty_blocks(store, conf, data_dir, cluster_node, sweep=True)
        note_if_empty(store, data_dir, limits)
    sweep_empty(limits)


def status(conf: NetConf, limits: Confinement | None = None) -> None:
    cfg = parse_ipam(conf.ipam)
    try:
        data_dir = _data_dir(conf.ipam, limits)
        store = _opened(data_dir, limits)
        assert store is not None
        try:
            with store.snapshot() as txn:
                for idx, rs in enumerate(cfg.range_sets):
                    if allocator.next_free(txn, conf.name, idx, rs) is None:
                        raise CniError(
                            Code.NOT_AVAILABLE,
                            f"not available: network {conf.name!r} has no free address in range set "
                            f"{idx} ({rs.describe()})",
                        )
        finally:
            note_if_empty(store, data_dir, limits)  # STATUS made it to see it could: not to keep
    except CniError as err:
        if err.code == Code.NOT_AVAILABLE:
            raise
        raise CniError(Code.NOT_AVAILABLE, f"not available: {err.msg}", err.details) from None
