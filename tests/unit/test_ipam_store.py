"""ipam.sqlite_store: schema, the derived block bitmaps, and refusing what it cannot honour."""

from __future__ import annotations

import ipaddress
import sqlite3
from pathlib import Path

import pytest

from cni.errors import CniError, Code
from ipam.sqlite_store import SqliteStore
from ipam.store import Allocation, gc, release_addresses, release_owner


def alloc(addr: str, cid: str, network: str = "n") -> Allocation:
    return Allocation(network=network, address=ipaddress.ip_address(addr), container_id=cid,
                      ifname="eth0")


def test_wal_mode_and_bitmaps_follow_inserts_and_deletes(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path))
    with store.transaction() as txn:
        for i in range(300):  # crosses a 256-address block
            txn.insert(alloc(str(ipaddress.ip_address("10.0.0.0") + i), f"c{i}"))
    db = sqlite3.connect(tmp_path / "ipam.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT count(*), sum(used) FROM used_block").fetchone() == (2, 300)
    release_owner(store, "n", "c5", "eth0")
    gc(store, "n", {(f"c{i}", "eth0") for i in range(256)})  # drops the whole second block
    assert db.execute("SELECT count(*), sum(used) FROM used_block").fetchone() == (1, 255)
    with store.snapshot() as txn:
        assert txn.first_free("n", 4, int(ipaddress.ip_address("10.0.0.0")),
                              int(ipaddress.ip_address("10.0.1.255"))) == \
            int(ipaddress.ip_address("10.0.0.5"))
    assert store.verify() == []
    db.close()
    store.close()


def test_duplicate_insert_is_refused_and_rolled_back(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path))
    with store.transaction() as txn:
        txn.insert(alloc("10.0.0.1", "a"))
    with pytest.raises(CniError) as info, store.transaction() as txn:
        txn.insert(alloc("10.0.0.2", "b"))
        txn.insert(alloc("10.0.0.1", "c"))
    assert info.value.code == Code.ADDRESS_UNAVAILABLE and "10.0.0.1" in info.value.msg
    assert [a.container_id for a in store.allocations()] == ["a"]  # b rolled back too
    assert store.verify() == []


def test_addresses_cannot_be_moved_behind_the_bitmaps_back(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path))
    with store.transaction() as txn:
        txn.insert(alloc("10.0.0.1", "a"))
    db = sqlite3.connect(tmp_path / "ipam.db")
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        db.execute("UPDATE allocation SET bit = 9")
    db.close()


def test_verify_detects_a_tampered_bitmap(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path))
    with store.transaction() as txn:
        txn.insert(alloc("10.0.0.1", "a"))
    db = sqlite3.connect(tmp_path / "ipam.db")
    db.execute("UPDATE used_block SET w0 = 0")
    db.commit()
    db.close()
    assert store.verify() != []


def test_release_addresses_skips_an_address_that_changed_hands(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path))
    with store.transaction() as txn:
        txn.insert(alloc("10.0.0.1", "new-owner"))
    assert release_addresses(store, [alloc("10.0.0.1", "old-owner")]) == []
    assert len(store.allocations()) == 1


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    SqliteStore(str(tmp_path)).close()
    db = sqlite3.connect(tmp_path / "ipam.db")
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(CniError) as info:
        SqliteStore(str(tmp_path))
    assert info.value.code == Code.IO_FAILURE and "schema version 99" in info.value.msg


def test_unwritable_data_dir_is_an_io_error(tmp_path: Path) -> None:
    blocker = tmp_path / "f"
    blocker.write_text("")
    with pytest.raises(CniError) as info:
        SqliteStore(str(blocker / "x"))
    assert info.value.code == Code.IO_FAILURE and str(blocker) in info.value.msg


def test_full_blocks_are_tracked_per_superblock(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path))
    base = ipaddress.ip_address("10.0.0.0")
    with store.transaction() as txn:
        for i in range(3 * 256):
            txn.insert(alloc(str(base + i), f"c{i}"))
    db = sqlite3.connect(tmp_path / "ipam.db")
    assert db.execute("SELECT f0, f1, f2, f3 FROM full_block").fetchall() == [(0b111, 0, 0, 0)]
    release_owner(store, "n", "c300", "eth0")  # block 1 is no longer full
    assert db.execute("SELECT f0 FROM full_block").fetchall() == [(0b101,)]
    with store.snapshot() as txn:  # the skip lands exactly on the hole
        assert txn.first_free("n", 4, int(base), int(base) + 2000) == int(base) + 300
    gc(store, "n", set())
    assert db.execute("SELECT count(*) FROM full_block").fetchone() == (0,)
    assert store.verify() == []
    db.close()
