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
from typing import TYPE_CHECKING

from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.netconf import NetConf
from cni.result import DNS, IPAddress, IPConfig, Result
from hostfiles.confined import confined_dir
from ipam import allocator
from ipam.config import Confinement, IpamConfig, data_dir_of, parse_ipam, static_requests
from ipam.sqlite_store import DB_NAME, SqliteStore
from ipam.store import Allocation, Store, release_owner
from ipam.store import gc as store_gc

if TYPE_CHECKING:
    from ipam.cluster import ClusterNode

_stores: dict[str, SqliteStore] = {}
_stores_pid = os.getpid()
_stores_lock = threading.Lock()


def open_store(data_dir: str, *, create: bool = True) -> Store | None:
    """The store for `data_dir`, opened once per process (None if absent and not `create`)."""
    global _stores_pid
    with _stores_lock:
        if _stores_pid != os.getpid():
            # A forked child must not share its parent's SQLite connections.
            _stores.clear()
            _stores_pid = os.getpid()
        store = _stores.get(data_dir)
        if store is None:
            if not create and not os.path.exists(os.path.join(data_dir, DB_NAME)):
                return None
            store = SqliteStore(data_dir)
            _stores[data_dir] = store
        return store


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
    store = open_store(data_dir)
    assert store is not None
    if cfg.cluster is None:
        with store.transaction() as txn:
            grants = allocator.allocate(txn, cfg, _owner(env, conf), requested)
    else:
        grants = _allocate_in_blocks(store, cfg, env, conf, requested, data_dir, cluster_node)
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
    data_dir = _data_dir(conf.ipam, limits)
    store = open_store(data_dir, create=False)
    if store is not None:
        release_owner(store, conf.name, env.container_id, env.ifname)
        return_empty_blocks(store, conf, data_dir, cluster_node)


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
    store = open_store(_data_dir(conf.ipam, limits), create=False)
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
    store = open_store(data_dir, create=False)
    if store is not None:
        store_gc(store, conf.name, keep)
        # GC also returns blocks etcd names as this node's that its blocks file lost.
        return_empty_blocks(store, conf, data_dir, cluster_node, sweep=True)


def status(conf: NetConf, limits: Confinement | None = None) -> None:
    cfg = parse_ipam(conf.ipam)
    try:
        store = open_store(_data_dir(conf.ipam, limits))
        assert store is not None
        with store.snapshot() as txn:
            for idx, rs in enumerate(cfg.range_sets):
                if allocator.next_free(txn, conf.name, idx, rs) is None:
                    raise CniError(
                        Code.NOT_AVAILABLE,
                        f"not available: network {conf.name!r} has no free address in range set "
                        f"{idx} ({rs.describe()})",
                    )
    except CniError as err:
        if err.code == Code.NOT_AVAILABLE:
            raise
        raise CniError(Code.NOT_AVAILABLE, f"not available: {err.msg}", err.details) from None
