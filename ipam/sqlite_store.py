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

import fcntl
import ipaddress
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
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

    @property
    def db(self) -> sqlite3.Connection:
        return self._db

    def holds_nothing(self) -> bool:
        row = self._db.execute("SELECT NOT EXISTS (SELECT 1 FROM allocation)").fetchone()
        return bool(row[0])

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


# The files of a store, all in its dataDir. LOCK_NAME is held shared (flock) by every open
# store, in any process, and exclusively by `remove_if_unused` only: a store is removed only
# when nobody has it open. CREATED_NAME lists the directories tenantnet made for this store
# (deepest first); a store without it was not made by tenantnet (or by an older release)
# and is never removed.
LOCK_NAME = "ipam.lock"
CREATED_NAME = "ipam.created"
_STORE_FILES = frozenset({DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", f"{DB_NAME}-journal", "ipam.reserve",
                          LOCK_NAME, CREATED_NAME})
_NO_SURPRISES = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # no symlink followed, no FIFO waited on
_OPEN_ATTEMPTS = 50  # a store removed under our feet is made again; bounded all the same


def _missing_dirs(path: str) -> list[str]:
    """`path` and its parents that do not exist, deepest first."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _hold(data_dir: str, create: bool) -> tuple[Any, list[str]]:
    """The store's lock file, held shared, and the directories this call created. It is the
    lock file that is at the path now: one opened just before `remove_if_unused` unlinked it
    is let go and the store made again (or, without `create`, found missing)."""
    from hostfiles.confined import ensure_private_dir

    lock_path = os.path.join(data_dir, LOCK_NAME)
    made: list[str] = []
    for _ in range(_OPEN_ATTEMPTS):
        if create:
            missing = _missing_dirs(data_dir)
            ensure_private_dir(data_dir)
            made += [d for d in missing if d not in made]
        elif not os.path.exists(os.path.join(data_dir, DB_NAME)):
            raise CniError(Code.IO_FAILURE, f"no IPAM store at {os.path.join(data_dir, DB_NAME)}")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | _NO_SURPRISES, 0o600)
        except FileNotFoundError:
            continue  # the directory went (removed as unused): make it again
        lock = os.fdopen(fd, "r+b", buffering=0)  # closed with the store, or when it is collected
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                return lock, made
        except FileNotFoundError:
            pass
        except BaseException:
            lock.close()
            raise
        lock.close()
    raise CniError(Code.TRY_AGAIN_LATER, f"IPAM store in {data_dir!r} was removed and made again "
                                         f"{_OPEN_ATTEMPTS} times while this call opened it")


class SqliteStore(Store):
    """`<data_dir>/ipam.db`; safe to open from any number of processes at once.

    Closing it lets its files go (the connection, the lock); using it again opens them again,
    so a store closed by a cache that evicted it still works for whoever holds it."""

    def __init__(self, data_dir: str, *, create: bool = True) -> None:
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, DB_NAME)
        self.create = create
        self._lock = threading.RLock()
        self._reserve_used = False
        self._db: sqlite3.Connection | None = None
        self._hold: Any = None
        self.made_by_tenantnet = False  # CREATED_NAME is there: removable once it holds nothing
        self._open()

    def _open(self) -> None:
        try:
            self._hold, made = _hold(self.data_dir, self.create)
        except OSError as exc:
            raise CniError(
                Code.IO_FAILURE, f"cannot open IPAM store in {self.data_dir!r}: {exc.strerror or exc}"
            ) from None
        try:
            self._connect(made)
        except BaseException:
            self._hold.close()
            self._hold = None
            raise

    def _connect(self, made: list[str]) -> None:
        data_dir = self.data_dir
        created_path = os.path.join(data_dir, CREATED_NAME)
        try:
            if self.create:
                if made:
                    _write_created(created_path, made)
                # Create the file ourselves so it is 0600 whatever the umask (it names pods);
                # SQLite gives the -wal and -shm files the same mode.
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            elif not os.path.exists(self.path):
                raise CniError(Code.IO_FAILURE, f"no IPAM store at {self.path}")
            self.made_by_tenantnet = os.path.lexists(created_path)
            if self.create:
                self._keep_reserve()
            db = sqlite3.connect(
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
        self._db = db
        try:
            self._setup()
        except sqlite3.Error as exc:
            db.close()
            self._db = None
            raise CniError(Code.IO_FAILURE, f"cannot open IPAM store {self.path!r}: {exc}") from None
        except BaseException:
            db.close()
            self._db = None
            raise

    def _conn(self) -> sqlite3.Connection:
        """The connection, opened again if the store was closed (call with self._lock held)."""
        if self._db is None:
            self._open()
        assert self._db is not None
        return self._db

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
        assert db is not None
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
            db = self._conn()
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise CniError(
                    Code.TRY_AGAIN_LATER,
                    f"IPAM store {self.path!r} stayed locked for {BUSY_TIMEOUT_S:.0f} s: {exc}",
                ) from None
            try:
                yield SqliteTransaction(db)
            except sqlite3.Error as exc:
                db.execute("ROLLBACK")
                raise CniError(Code.IO_FAILURE, f"IPAM store {self.path!r}: {exc}") from None
            except BaseException:
                db.execute("ROLLBACK")
                raise
            try:
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise CniError(Code.IO_FAILURE, f"cannot commit to {self.path!r}: {exc}") from None
            if self._reserve_used:  # room again (this commit needed some): take the reserve back
                self._reserve_used = False
                self._keep_reserve()

    @contextmanager
    def snapshot(self) -> Iterator[SqliteTransaction]:
        """A read-only, consistent view (a deferred transaction that takes no write lock)."""
        with self._lock:
            db = self._conn()
            db.execute("BEGIN")
            try:
                yield SqliteTransaction(db)
            finally:
                db.execute("ROLLBACK")

    def holds_nothing(self) -> bool:
        """No allocation of any network (cursors are not counted: they go with the store)."""
        with self.snapshot() as txn:
            return txn.holds_nothing()

    def allocations(self, network: str | None = None) -> list[Allocation]:
        with self.snapshot() as txn:
            return txn.allocations(network)

    def cursors(self) -> dict[tuple[str, int], IPAddress]:
        with self.snapshot() as txn:
            return txn.cursors()

    def verify(self) -> list[str]:
        problems: list[str] = []
        with self.snapshot() as txn:
            db = txn.db
            check = db.execute("PRAGMA integrity_check").fetchall()
            if check != [("ok",)]:
                problems.extend(f"integrity_check: {r[0]}" for r in check)
            expected: dict[tuple[str, int, bytes, int], int] = {}
            for network, family, sup, sub, bit in db.execute(
                "SELECT network, family, super, sub, bit FROM allocation"
            ):
                key = (network, family, sup, sub)
                expected[key] = expected.get(key, 0) | (1 << bit)
            actual: dict[tuple[str, int, bytes, int], int] = {}
            full_expected: dict[tuple[str, int, bytes], int] = {}
            for network, family, sup, sub, w0, w1, w2, w3, used in db.execute(
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
                for network, family, sup, f0, f1, f2, f3 in db.execute(
                    "SELECT network, family, super, f0, f1, f2, f3 FROM full_block"
                )
            }
            if full_expected != full_actual:
                problems.append("full_block bitmaps do not match the used_block rows")
        return problems

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._hold is not None:
                self._hold.close()
                self._hold = None


def _write_created(path: str, made: list[str]) -> None:
    """Record the directories this store's creation made (kept if one is there already)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("".join(f"{d}\n" for d in made))


def _read_created(data_dir: str) -> list[str] | None:
    """The directories CREATED_NAME lists, or None without a (regular, small) one."""
    try:
        fd = os.open(os.path.join(data_dir, CREATED_NAME), os.O_RDONLY | _NO_SURPRISES)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = fh.read(1 << 16).decode("utf-8", "replace")
    # Only data_dir and its own parents: whatever else the file might say is never removed.
    parents = set(_self_and_parents(data_dir))
    return [d for d in text.splitlines() if d in parents]


def _self_and_parents(data_dir: str) -> list[str]:
    out, path = [], data_dir
    while True:
        out.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            return out
        path = parent


class Removal(Enum):
    """What `remove_if_unused` found."""

    REMOVED = "removed"
    IN_USE = "open somewhere"  # try again later
    HOLDS = "holds allocations"
    NOT_OURS = "not made by tenantnet, or not only a store"


def remove_if_unused(data_dir: str) -> Removal:
    """Remove the store in `data_dir` (its files, and the directories tenantnet made for it)
    if tenantnet made it, it holds no allocation, nothing else is in the directory, and no
    process has it open — this process's own SqliteStore of it must be closed first. Nothing
    is touched otherwise, and the answer says why. Safe against concurrent opens: an opener waits for the
    shared lock, then finds the lock file it holds gone from the path and makes the store
    again (`_hold`)."""
    made = _read_created(data_dir)
    if made is None:
        return Removal.NOT_OURS
    lock_path = os.path.join(data_dir, LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | _NO_SURPRISES)
    except OSError:
        return Removal.NOT_OURS
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Removal.IN_USE  # open somewhere (another process, or another store object)
        if os.stat(lock_path).st_ino != os.fstat(fd).st_ino:
            return Removal.IN_USE
        if not set(os.listdir(data_dir)) <= _STORE_FILES:
            return Removal.NOT_OURS  # a cluster ledger, or anything not ours: the directory stays
        db_path = os.path.join(data_dir, DB_NAME)
        if os.path.exists(db_path):
            db = sqlite3.connect(db_path, timeout=0, isolation_level=None)
            try:
                if not SqliteTransaction(db).holds_nothing():
                    return Removal.HOLDS
            finally:
                db.close()  # the last connection: SQLite checkpoints and removes the WAL
        for name in sorted(_STORE_FILES - {LOCK_NAME}):
            try:
                os.unlink(os.path.join(data_dir, name))
            except FileNotFoundError:
                pass
        os.unlink(lock_path)  # last: an opener waiting for it now finds the path changed
        for directory in made:
            try:
                os.rmdir(directory)
            except OSError:
                break  # not empty (another store below it) or not ours to remove
        return Removal.REMOVED
    except (OSError, sqlite3.Error):
        return Removal.IN_USE  # busy (SQLite) or half-read: looked at again later
    finally:
        os.close(fd)
