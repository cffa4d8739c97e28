"""What a stream of tenant-chosen dataDirs leaves behind (nothing: no descriptor, no file),
when a store may be removed (made by tenantnet, holding nothing, open nowhere), and DEL
after the node narrowed ipamDataDirs (it releases in a store tenantnet listed itself)."""

from __future__ import annotations

import multiprocessing
import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from cni.env import parse_env
from cni.errors import CniError, Code
from cni.netconf import parse_netconf
from ipam import known_stores, plugin
from ipam.config import Confinement
from ipam.sqlite_store import SqliteStore


def _env(cid: str, command: str = "ADD") -> Any:
    return parse_env({"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "net1",
                      "CNI_NETNS": "/var/run/netns/x", "CNI_ARGS": ""})


def _conf(data_dir: Path | str | None, name: str = "blue") -> Any:
    ipam: dict[str, Any] = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.20.0.0/24"}]]}
    if data_dir is not None:
        ipam["dataDir"] = str(data_dir)
    return parse_netconf({"cniVersion": "1.0.0", "name": name, "type": "bridge", "ipam": ipam})


def _limits(tmp: Path, *allowed: Path) -> Confinement:
    (tmp / "state").mkdir(exist_ok=True)
    dirs = allowed or (tmp / "ipam",)
    return Confinement(tuple(str(a) for a in dirs), (), str(dirs[-1] / "default"), str(tmp / "state" / "ipam-stores"))


def _after_the_grace(tmp: Path, limits: Confinement) -> None:
    """EMPTY_GRACE_S later (the empty marks made older), a DEL on the node: the sweep runs."""
    empty = tmp / "state" / "ipam-stores" / "empty"
    old = time.time() - plugin.EMPTY_GRACE_S - 1
    for mark in empty.iterdir() if empty.is_dir() else []:
        os.utime(mark, (old, old))
    # each DEL looks at MAX_SWEEP marks at most
    for _ in range(len(os.listdir(empty)) // known_stores.MAX_SWEEP + 1 if empty.is_dir() else 1):
        plugin.delete(_env("nobody", "DEL"), _conf(None), limits)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _forget_open_stores() -> None:
    """As a one-shot exec ends: this process's stores closed."""
    with plugin._stores_lock:
        stores = list(plugin._stores.values())
        plugin._stores.clear()
        plugin._listed.clear()
    for s in stores:
        s.close()


@pytest.fixture(autouse=True)
def _clean_cache() -> Any:
    _forget_open_stores()
    yield
    _forget_open_stores()


def test_a_stream_of_distinct_data_dirs_leaves_no_descriptor_and_no_file(tmp_path: Path) -> None:
    limits = _limits(tmp_path)
    (tmp_path / "ipam").mkdir()
    before = _fds()
    for i in range(3 * plugin.MAX_OPEN_STORES):
        data_dir = tmp_path / "ipam" / f"tenant-{i}" / "net"
        result = plugin.add(_env(f"c{i}"), _conf(data_dir), limits)
        assert result.ips
        plugin.delete(_env(f"c{i}", "DEL"), _conf(data_dir), limits)
    kept = len(list((tmp_path / "ipam").iterdir()))
    _after_the_grace(tmp_path, limits)
    grown = _fds() - before
    left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "ipam").rglob("*"))
    registry = tmp_path / "state" / "ipam-stores"
    listed = sorted(p.name for p in registry.iterdir() if p.name != "empty") + os.listdir(registry / "empty")
    print(f"descriptors grown: {grown}; entries left in ipam/: {len(left)}; stores listed: {len(listed)}")
    assert kept == 3 * plugin.MAX_OPEN_STORES  # within the grace, the stores (and cursors) stay
    assert grown <= 0, grown
    assert left == [], left[:8]  # each store, and the directories made for it, went
    assert listed == [], listed[:8]  # its listing and empty mark too


def test_stores_holding_addresses_stay_and_open_descriptors_are_bounded(tmp_path: Path) -> None:
    limits = _limits(tmp_path)
    before = _fds()
    dirs = [tmp_path / "ipam" / f"t{i}" for i in range(3 * plugin.MAX_OPEN_STORES)]
    for i, d in enumerate(dirs):
        plugin.add(_env(f"c{i}"), _conf(d), limits)
    grown = _fds() - before
    print(f"descriptors grown with {len(dirs)} stores holding an address: {grown}")
    # at most MAX_OPEN_STORES stores open, each a connection, its WAL and shm, and its lock
    assert 0 < grown <= 4 * plugin.MAX_OPEN_STORES, grown
    assert len(plugin._stores) == plugin.MAX_OPEN_STORES
    # an evicted store works again for whoever asks (the first ones were evicted)
    for i, d in enumerate(dirs):
        assert [a.container_id for a in SqliteStore(str(d), create=False).allocations()] == [f"c{i}"]
        plugin.delete(_env(f"c{i}", "DEL"), _conf(d), limits)
    _after_the_grace(tmp_path, limits)
    assert not any(d.exists() for d in dirs)


def test_a_store_stays_while_open_elsewhere_and_goes_with_the_next_del(tmp_path: Path) -> None:
    limits = _limits(tmp_path)
    d = tmp_path / "ipam" / "t"
    plugin.add(_env("c1"), _conf(d), limits)
    plugin.add(_env("c2"), _conf(d), limits)
    other = SqliteStore(str(d), create=False)  # as another process holding it open would
    plugin.delete(_env("c1", "DEL"), _conf(d), limits)
    plugin.delete(_env("c2", "DEL"), _conf(d), limits)
    _after_the_grace(tmp_path, limits)
    assert (d / "ipam.db").exists() and other.allocations() == []
    other.close()
    _after_the_grace(tmp_path, limits)  # the next DEL on the node: now nobody has it open
    assert not d.exists()


def test_a_store_used_again_within_the_grace_keeps_its_cursor(tmp_path: Path) -> None:
    limits = _limits(tmp_path)
    d = tmp_path / "ipam" / "t"
    first = plugin.add(_env("c1"), _conf(d), limits).ips[0].address
    plugin.delete(_env("c1", "DEL"), _conf(d), limits)
    again = plugin.add(_env("c2"), _conf(d), limits).ips[0].address
    assert again != first  # host-local's cursor: a freed address is not handed out at once
    _after_the_grace(tmp_path, limits)  # it holds an address: its empty mark went, it stays
    assert (d / "ipam.db").exists()


def test_stores_not_made_by_tenantnet_the_default_and_cluster_ledgers_stay(tmp_path: Path) -> None:
    limits = _limits(tmp_path)
    existing = tmp_path / "ipam" / "admin-made"
    existing.mkdir(parents=True)  # the directory was there before the store
    cluster = tmp_path / "ipam" / "with-ledger"
    for i, d in enumerate((existing, None, cluster)):
        plugin.add(_env(f"c{i}"), _conf(d), limits)
    (cluster / "cluster").mkdir()
    for i, d in enumerate((existing, None, cluster)):
        plugin.delete(_env(f"c{i}", "DEL"), _conf(d), limits)
    _after_the_grace(tmp_path, limits)
    assert (existing / "ipam.db").exists()
    assert (tmp_path / "ipam" / "default" / "ipam.db").exists()
    assert (cluster / "ipam.db").exists()


def test_a_refused_add_and_a_status_leave_no_store(tmp_path: Path) -> None:
    limits = _limits(tmp_path)
    d = tmp_path / "ipam" / "t"
    conf = parse_netconf({"cniVersion": "1.0.0", "name": "blue", "type": "bridge",
                          "runtimeConfig": {"ips": ["10.20.0.1"]},  # the gateway: code 111
                          "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.20.0.0/24"}]],
                                   "dataDir": str(d)}})
    with pytest.raises(CniError) as err:
        plugin.add(_env("c1"), conf, limits)
    assert err.value.code == Code.ADDRESS_UNAVAILABLE
    _after_the_grace(tmp_path, limits)
    assert not d.exists()
    plugin.status(_conf(d), limits)
    _after_the_grace(tmp_path, limits)
    assert not d.exists()


def _churn(data_dir: str, limits: Confinement, worker: int, removals: Any, keep: bool) -> None:
    """One-shot processes' ADD and DEL on one store: each call opens and closes it, and
    every DEL that leaves it empty removes it at once (no grace: the race is the point).
    Until the store has been removed (and made again) a few times, or 400 rounds."""
    plugin.EMPTY_GRACE_S = 0.0
    sweep = plugin.sweep_empty

    def counted(limits: Confinement | None, now: float | None = None) -> list[str]:
        gone = sweep(limits, now)
        with removals.get_lock():
            removals.value += len(gone)
        return gone

    plugin.sweep_empty = counted  # type: ignore[assignment]
    rng = random.Random(worker)
    for r in range(400):
        if removals.value >= 8:
            break
        cid = f"w{worker}-{r}"
        assert plugin.add(_env(cid), _conf(data_dir), limits).ips
        _forget_open_stores()
        # what the ADD recorded is in the store at the path (not in a file removed under it)
        seen = SqliteStore(data_dir, create=False)
        assert cid in [a.container_id for a in seen.allocations()], cid
        seen.close()
        plugin.delete(_env(cid, "DEL"), _conf(data_dir), limits)
        _forget_open_stores()
        time.sleep(rng.random() / 200)  # a gap between pods: the store is empty, room to remove it
    if keep:
        plugin.add(_env(f"keeper-{worker}"), _conf(data_dir), limits)
        _forget_open_stores()


def test_removal_racing_adds_of_other_processes_loses_nothing(tmp_path: Path) -> None:
    limits = _limits(tmp_path)
    d = str(tmp_path / "ipam" / "shared")
    ctx = multiprocessing.get_context("fork")
    removals = ctx.Value("i", 0)
    procs = [ctx.Process(target=_churn, args=(d, limits, w, removals, w % 2 == 0)) for w in range(3)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=300)
        assert [p.exitcode for p in procs] == [0] * len(procs)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    print(f"the shared store was removed {removals.value} times while the others used it")
    assert removals.value > 0  # the race did happen
    store = SqliteStore(d, create=False)
    try:
        assert sorted(a.container_id for a in store.allocations()) == ["keeper-0", "keeper-2"]
        assert store.verify() == []
    finally:
        store.close()


def test_del_after_the_node_narrowed_ipam_data_dirs_releases_where_add_allocated(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    before = _limits(tmp_path, old, new)
    after = _limits(tmp_path, new)
    d = old / "tenant-a"
    plugin.add(_env("c1"), _conf(d), before)
    plugin.add(_env("c2"), _conf(d), before)
    with pytest.raises(CniError) as err:  # ADD and CHECK keep to the node's list
        plugin.add(_env("c3"), _conf(d), after)
    assert err.value.code == Code.INVALID_CONFIG
    _forget_open_stores()  # the DEL comes in another process, after the upgrade
    plugin.delete(_env("c1", "DEL"), _conf(d), after)
    with sqlite3.connect(d / "ipam.db") as db:
        assert [r[0] for r in db.execute("SELECT container_id FROM allocation")] == ["c2"]
    plugin.delete(_env("c2", "DEL"), _conf(d), after)
    _after_the_grace(tmp_path, after)
    assert not d.exists()  # the last one released, the store went (it and its listing)
    assert os.listdir(tmp_path / "state" / "ipam-stores") == ["empty"]


def test_del_never_goes_to_a_disallowed_dir_tenantnet_did_not_list(tmp_path: Path) -> None:
    limits = _limits(tmp_path, tmp_path / "new")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = SqliteStore(str(elsewhere))  # a store, but never opened by tenantnet where allowed
    store.close()
    with pytest.raises(CniError) as err:
        plugin.delete(_env("c1", "DEL"), _conf(elsewhere), limits)
    assert err.value.code == Code.INVALID_CONFIG and "ipam.dataDir" in err.value.msg
    # a listing naming another path, or a symlinked directory, does not count either
    listed = _limits(tmp_path, tmp_path / "old", tmp_path / "new")
    plugin.add(_env("c1"), _conf(tmp_path / "old" / "x"), listed)
    _forget_open_stores()
    os.rename(tmp_path / "old" / "x", tmp_path / "old" / "y")
    os.symlink(tmp_path / "old" / "y", tmp_path / "old" / "x")
    with pytest.raises(CniError):
        plugin.delete(_env("c1", "DEL"), _conf(tmp_path / "old" / "x"), limits)
