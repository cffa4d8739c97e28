"""The node's own record of a cluster network's address blocks (ipam/cluster.py decides what
goes in it; this module only reads and writes it), all in `<dataDir>/cluster/`:

    <network>.blocks      the blocks this node owns and allocates from, one a line, with since
                          when each has been seen empty; replaced by rename, so a reader sees
                          one version or the next
    <network>.blocks.lock the ledger's lock (flock) across the node's processes
    <network>.returning   blocks taken out of `.blocks` whose return etcd has not heard of yet
    <network>.revoked     blocks this node found gone from it in etcd (another node's now, or
                          released by an operator): never allocated from again; the addresses
                          already given in them stay recorded until their DEL
    <network>.verified    when this node last read from etcd that it still owns every block of
                          `.blocks`: the boot and the CLOCK_MONOTONIC second the read was sent

Reading `.blocks` costs a stat when it has not changed (parsed once per version, per process).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cni.result import IPNetwork
from hostfiles.confined import ensure_private_dir

_parsed: dict[str, tuple[tuple[int, int, int], dict[IPNetwork, float | None]]] = {}
_stamps: dict[str, tuple[tuple[int, int, int], float]] = {}
_boot_id: str | None = None


def block_name(block: IPNetwork) -> str:
    return str(block).replace("/", "_")


def parse_block(name: str) -> IPNetwork:
    return ipaddress.ip_network(name.replace("_", "/"))


def boot_id() -> str:
    """This boot's identity: a monotonic stamp from an earlier boot means nothing now."""
    global _boot_id
    if _boot_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
                _boot_id = fh.read().strip()
        except OSError:
            _boot_id = "unknown"
    return _boot_id


class BlockFile:
    """The files of one network in one store's directory."""

    def __init__(self, data_dir: str, network: str) -> None:
        self.dir = os.path.join(data_dir, "cluster")
        self.path = os.path.join(self.dir, f"{network}.blocks")
        base = self.path[: -len(".blocks")]
        self.returning_path = base + ".returning"
        self.revoked_path = base + ".revoked"
        self.verified_path = base + ".verified"

    @contextmanager
    def locked(self, give_up: Callable[[], bool] | None = None,
               on_give_up: Callable[[], BaseException] | None = None) -> Iterator[None]:
        """The ledger's file lock (across the node's processes). With `give_up`, the wait is
        a poll that raises `on_give_up()` as soon as `give_up()` says so (flock is not
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
                        assert on_give_up is not None
                        raise on_give_up()
                    if got:
                        break
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)

    def read(self) -> dict[IPNetwork, float | None]:
        """block -> since when it has been seen empty (None: in use, or not checked yet)."""
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
        blocks = {parse_block(f[0]): (float(f[1]) if len(f) > 1 else None) for f in lines}
        _parsed[self.path] = (sig, blocks)
        return dict(blocks)

    def _replace(self, path: str, text: str, fsync: bool = True) -> None:
        tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)

    def write(self, blocks: dict[IPNetwork, float | None]) -> None:
        lines = []
        for b in sorted(blocks, key=lambda b: (b.version, b)):
            since = blocks[b]
            lines.append(f"{block_name(b)}\n" if since is None else f"{block_name(b)} {since:.3f}\n")
        self._replace(self.path, "".join(lines))

    # ---- returns etcd has not heard of ----

    def returning(self) -> list[IPNetwork]:
        try:
            with open(self.returning_path, encoding="utf-8") as fh:
                return [parse_block(line.strip()) for line in fh.read(1 << 20).splitlines() if line.strip()]
        except (FileNotFoundError, ValueError):
            return []

    def returning_since(self) -> float:
        """When etcd last failed to hear of a return (the `.returning` file's mtime; 0: never)."""
        try:
            return os.stat(self.returning_path).st_mtime
        except FileNotFoundError:
            return 0.0

    def set_returning(self, blocks: list[IPNetwork], keep_since: bool = False) -> None:
        if not blocks:
            if os.path.exists(self.returning_path):
                os.unlink(self.returning_path)
            return
        since = self.returning_since() if keep_since else 0.0
        self._replace(self.returning_path, "".join(f"{block_name(b)}\n" for b in blocks), fsync=False)
        if since:
            os.utime(self.returning_path, (since, since))

    # ---- blocks found gone ----

    def revoked(self) -> dict[IPNetwork, float]:
        """Blocks found gone from this node in etcd, with when (wall clock)."""
        out: dict[IPNetwork, float] = {}
        try:
            with open(self.revoked_path, encoding="utf-8") as fh:
                for line in fh.read(1 << 20).splitlines():
                    fields = line.split()
                    if fields:
                        try:
                            out[parse_block(fields[0])] = float(fields[1]) if len(fields) > 1 else 0.0
                        except ValueError:
                            continue
        except FileNotFoundError:
            pass
        return out

    def add_revoked(self, blocks: list[IPNetwork]) -> None:
        now = time.time()
        known = self.revoked()
        for b in blocks:
            known.setdefault(b, now)
        self._replace(self.revoked_path, "".join(f"{block_name(b)} {t:.3f}\n" for b, t in known.items()))

    def forget_revoked(self, blocks: list[IPNetwork]) -> None:
        """Blocks this node owns again (claimed anew): no longer listed as revoked."""
        known = self.revoked()
        if any(b in known for b in blocks):
            left = {b: t for b, t in known.items() if b not in blocks}
            self._replace(self.revoked_path, "".join(f"{block_name(b)} {t:.3f}\n" for b, t in left.items()))

    # ---- the last verification ----

    def verified_at(self) -> float | None:
        """The CLOCK_MONOTONIC second of the last verification sent in this boot (None: none)."""
        try:
            st = os.stat(self.verified_path)
        except FileNotFoundError:
            return None
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = _stamps.get(self.verified_path)
        if cached is not None and cached[0] == sig:
            return cached[1]
        try:
            with open(self.verified_path, encoding="ascii") as fh:
                boot, _, when = fh.read(200).strip().partition(" ")
            stamp = float(when)
        except (OSError, ValueError):
            return None
        if boot != boot_id():
            return None
        _stamps[self.verified_path] = (sig, stamp)
        return stamp

    def set_verified(self, sent_at: float) -> None:
        # No fsync: after a crash the stamp is either the last one or an earlier one (safe).
        self._replace(self.verified_path, f"{boot_id()} {sent_at:.3f}\n", fsync=False)
