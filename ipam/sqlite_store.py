"""The node-local store: one SQLite database (`<dataDir>/ipam.db`) in WAL mode.

Why SQLite: it is in the standard library, a transaction is atomic across a SIGKILL at any
instant (uncommitted WAL frames are ignored on the next open), and `BEGIN IMMEDIATE` gives
one writer at a time across processes with a bounded wait — exactly host-local's file lock,
but with one indexed row per allocation instead of a file per address.

Durability: `synchronous=NORMAL`. In WAL mode that survives any process crash; only a power
loss can drop the last few commits, never corrupt the file — and every sandbox those commits
were about died with the power too (a lost DEL leaves a stale row that GC reclaims).

Flat allocation cost: besides the `allocation` rows, two derived tables keep bitmaps —
`used_block`, the held addresses of each 256-address block, and `full_block`, the full
blocks of each 65,536-address superblock — maintained by triggers so no code path can let
them drift. Finding the first free address after the cursor costs a few point lookups
whatever the fill level: one per non-full block visited and one per superblock of full
blocks skipped, never one per used address.
"""

from __future__ import annotations

import ipaddress
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from cni.errors import CniError, Code
from cni.result import IPAddress
from ipam.sqlite_schema import SCHEMA_VERSION, schema_statements
from ipam.store import Allocation, Store

DB_NAME = "ipam.db"
BUSY_TIMEOUT_S = 30.0
_MASK64 = (1 << 64) - 1

_COLUMNS = "network, address, container_id, ifname, pod_namespace, pod_name, netns, created"


def _split(value: int) -> tuple[bytes, int, int]:
    """(super, sub, bit) of an address: its superblock key, block in it, address in block."""
    return (value >> 16).to_bytes(16, "big"), (value >> 8) & 255, value & 255


def _bits(w0: int, w1: int, w2: int, w3: int) -> int:
    """Four signed 64-bit SQLite integers as one 256-bit Python int."""
    return (w0 & _MASK64) | (w1 & _MASK64) << 64 | (w2 & _MASK64) << 128 | (w3 & _MASK64) << 192


_ALL = (1 << 256) - 1


def _row(row: tuple[Any, ...]) -> Allocation:
    return Allocation(
        network=row[0],
        address=ipaddress.ip_address(row[1]),
        container_id=row[2],
        ifname=row[3],
        pod_namespace=row[4],
        pod_name=row[5],
        netns=row[6],
        created=row[7],
    )


def _sort_key(a: Allocation) -> tuple[str, int, int]:
    return (a.network, a.address.version, int(a.address))


class SqliteTransaction:
    """The `ipam.store.Transaction` primitives on one open SQLite transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def owned_by(self, network: str, container_id: str, ifname: str) -> list[Allocation]:
        rows = self._db.execute(
            # Without statistics the planner prefers the primary key's `network = ?` prefix,
            # a scan of the whole pool; the owner index makes this one lookup.
            f"SELECT {_COLUMNS} FROM allocation INDEXED BY allocation_owner "
            "WHERE network = ? AND container_id = ? AND ifname = ?",
            (network, container_id, ifname),
        ).fetchall()
        return sorted((_row(r) for r in rows), key=_sort_key)

    def holder(self, network: str, address: IPAddress) -> Allocation | None:
        value = int(address)
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM allocation WHERE network = ? AND family = ? AND super = ? "
            "AND sub = ? AND bit = ?",
            (network, address.version, *_split(value)),
        ).fetchone()
        return _row(row) if row else None

    def first_free(self, network: str, family: int, lo: int, hi: int) -> int | None:
        pos = lo
        full_of: dict[int, int] = {}
        while pos <= hi:
            sup, sub, _ = _split(pos)
            row = self._db.execute(
                "SELECT w0, w1, w2, w3 FROM used_block WHERE network = ? AND family = ? "
                "AND super = ? AND sub = ?",
                (network, family, sup, sub),
            ).fetchone()
            if row is None:
                return pos  # nothing in pos's block is held
            base = pos & ~255
            top = min(hi, base + 255)
            window = ((1 << (top - base + 1)) - 1) & ~((1 << (pos - base)) - 1)
            free = window & ~_bits(*row)
            if free:
                return base + (free & -free).bit_length() - 1
            pos = base + 256
            # Skip completely full blocks a superblock (256 blocks) at a time.
            while pos <= hi:
                high = pos >> 16
                if high not in full_of:
                    f = self._db.execute(
                        "SELECT f0, f1, f2, f3 FROM full_block WHERE network = ? AND family = ? "
                        "AND super = ?",
                        (network, family, high.to_bytes(16, "big")),
                    ).fetchone()
                    full_of[high] = _bits(*f) if f else 0
                open_blocks = ~full_of[high] & _ALL & ~((1 << ((pos >> 8) & 255)) - 1)
                if open_blocks:
                    pos = (high << 16) | (((open_blocks & -open_blocks).bit_length() - 1) << 8)
                    break
                pos = (high + 1) << 16
        return None

    def last_reserved(self, network: str, range_set: int) -> IPAddress | None:
        row = self._db.execute(
            "SELECT address FROM cursor WHERE network = ? AND range_set = ?",
            (network, range_set),
        ).fetchone()
        return ipaddress.ip_address(row[0]) if row else None

    def set_last_reserved(self, network: str, range_set: int, address: IPAddress) -> None:
        self._db.execute(
            "INSERT INTO cursor (network, range_set, address) VALUES (?, ?, ?) "
            "ON CONFLICT (network, range_set) DO UPDATE SET address = excluded.address",
            (network, range_set, str(address)),
        )

    def insert(self, allocation: Allocation) -> None:
        value = int(allocation.address)
        try:
            self._db.execute(
                "INSERT INTO allocation (network, family, super, sub, bit, address, "
                "container_id, ifname, pod_namespace, pod_name, netns, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    allocation.network,
                    allocation.address.version,
                    *_split(value),
                    str(allocation.address),
                    allocation.container_id,
                    allocation.ifname,
                    allocation.pod_namespace,
                    allocation.pod_name,
                    allocation.netns,
                    allocation.created or time.time(),
                ),
            )
        except sqlite3.IntegrityError:
            raise CniError(
                Code.ADDRESS_UNAVAILABLE,
                f"address {allocation.address} of network {allocation.network!r} "
                "is already allocated",
            ) from None

    def delete(self, network: str, address: IPAddress) -> None:
        value = int(address)
        self._db.execute(
            "DELETE FROM allocation WHERE network = ? AND family = ? AND super = ? AND sub = ? "
            "AND bit = ?",
            (network, address.version, *_split(value)),
        )

    def allocations(self, network: str | None = None) -> list[Allocation]:
        if network is None:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM allocation").fetchall()
        else:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM allocation WHERE network = ?", (network,)
            ).fetchall()
        return sorted((_row(r) for r in rows), key=_sort_key)

    def cursors(self) -> dict[tuple[str, int], IPAddress]:
        rows = self._db.execute("SELECT network, range_set, address FROM cursor").fetchall()
        return {(n, i): ipaddress.ip_address(a) for n, i, a in rows}


_T = TypeVar("_T")


def _retry_locked(step: Callable[[], _T]) -> _T:
    """Run a setup step that SQLite may refuse with 'locked' while another process does it."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    delay = 0.002
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


RESERVE_NAME = "ipam.reserve"
RESERVE_BYTES = 256 << 10


class SqliteStore(Store):
    """`<data_dir>/ipam.db`; safe to open from any number of processes at once."""

    def __init__(self, data_dir: str, *, create: bool = True) -> None:
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, DB_NAME)
        self._lock = threading.RLock()
        self._reserve_used = False
        try:
            if create:
                from hostfiles.confined import ensure_private_dir

                ensure_private_dir(data_dir)
                # Create the file ourselves so it is 0600 whatever the umask (it names pods);
                # SQLite gives the -wal and -shm files the same mode.
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            elif not os.path.exists(self.path):
                raise CniError(Code.IO_FAILURE, f"no IPAM store at {self.path}")
            if create:
                self._keep_reserve()
            self._db = sqlite3.connect(
                self.path,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,  # guarded by self._lock instead
            )
        except OSError as exc:
            raise CniError(
                Code.IO_FAILURE, f"cannot open IPAM store in {data_dir!r}: {exc.strerror or exc}"
            ) from None
        except sqlite3.Error as exc:
            raise CniError(Code.IO_FAILURE, f"cannot open IPAM store {self.path!r}: {exc}") from None
        try:
            self._setup()
        except sqlite3.Error as exc:
            self._db.close()
            raise CniError(Code.IO_FAILURE, f"cannot open IPAM store {self.path!r}: {exc}") from None

    @property
    def _reserve_path(self) -> str:
        return os.path.join(self.data_dir, RESERVE_NAME)

    def _keep_reserve(self) -> None:
        """A preallocated file beside the database: on a full filesystem it is given up so
        that releases (SQLite needs room to log them) still succeed. Best effort."""
        path = self._reserve_path
        if os.path.exists(path):
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError:
            os.close(fd)
            os.unlink(path)
            return
        os.close(fd)

    def free_reserve(self) -> bool:
        try:
            os.unlink(self._reserve_path)
        except OSError:
            return False
        self._reserve_used = True
        return True

    def _setup(self) -> None:
        db = self._db
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = OFF")
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        if mode.lower() != "wal":
            _retry_locked(lambda: db.execute("PRAGMA journal_mode = WAL").fetchone())
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise CniError(
                Code.IO_FAILURE,
                f"IPAM store {self.path!r} has schema version {version}; this tenantnet-ipam "
                f"understands up to {SCHEMA_VERSION} (was it written by a newer release?)",
            )

        def create() -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("PRAGMA user_version").fetchone()[0] == 0:
                    for statement in schema_statements():
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        _retry_locked(create)

    @contextmanager
    def transaction(self) -> Iterator[SqliteTransaction]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise CniError(
                    Code.TRY_AGAIN_LATER,
                    f"IPAM store {self.path!r} stayed locked for {BUSY_TIMEOUT_S:.0f} s: {exc}",
                ) from None
            try:
                yield SqliteTransaction(self._db)
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise CniError(Code.IO_FAILURE, f"IPAM store {self.path!r}: {exc}") from None
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise CniError(Code.IO_FAILURE, f"cannot commit to {self.path!r}: {exc}") from None
            if self._reserve_used:  # room again (this commit needed some): take the reserve back
                self._reserve_used = False
                self._keep_reserve()

    @contextmanager
    def snapshot(self) -> Iterator[SqliteTransaction]:
        """A read-only, consistent view (a deferred transaction that takes no write lock)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield SqliteTransaction(self._db)
            finally:
                self._db.execute("ROLLBACK")

    def allocations(self, network: str | None = None) -> list[Allocation]:
        with self.snapshot() as txn:
            return txn.allocations(network)

    def cursors(self) -> dict[tuple[str, int], IPAddress]:
        with self.snapshot() as txn:
            return txn.cursors()

    def verify(self) -> list[str]:
        problems: list[str] = []
        with self.snapshot():
            check = self._db.execute("PRAGMA integrity_check").fetchall()
            if check != [("ok",)]:
                problems.extend(f"integrity_check: {r[0]}" for r in check)
            expected: dict[tuple[str, int, bytes, int], int] = {}
            for network, family, sup, sub, bit in self._db.execute(
                "SELECT network, family, super, sub, bit FROM allocation"
            ):
                key = (network, family, sup, sub)
                expected[key] = expected.get(key, 0) | (1 << bit)
            actual: dict[tuple[str, int, bytes, int], int] = {}
            full_expected: dict[tuple[str, int, bytes], int] = {}
            for network, family, sup, sub, w0, w1, w2, w3, used in self._db.execute(
                "SELECT network, family, super, sub, w0, w1, w2, w3, used FROM used_block"
            ):
                bits = _bits(w0, w1, w2, w3)
                actual[(network, family, sup, sub)] = bits
                if bin(bits).count("1") != used:
                    problems.append(f"used_block {network}/{sup.hex()}/{sub}: count {used}")
                if bits == _ALL:
                    k = (network, family, sup)
                    full_expected[k] = full_expected.get(k, 0) | (1 << sub)
            if expected != actual:
                problems.append("used_block bitmaps do not match the allocation rows")
            full_actual = {
                (network, family, sup): _bits(f0, f1, f2, f3)
                for network, family, sup, f0, f1, f2, f3 in self._db.execute(
                    "SELECT network, family, super, f0, f1, f2, f3 FROM full_block"
                )
            }
            if full_expected != full_actual:
                problems.append("full_block bitmaps do not match the used_block rows")
        return problems

    def close(self) -> None:
        with self._lock:
            self._db.close()
