"""The stores tenantnet has opened where the node config allowed them: one small file per
store directory in `<stateDir>/ipam-stores/` (named by the SHA-256 of the path, holding the
path), written the first time a process opens the store under a config that allows it.

Why: a DEL must release what its ADD allocated even when the admin has since narrowed
`ipamDataDirs` (an upgrade, an edit), or the address leaks. The NAD's `dataDir` is tenant
input, so a DEL may go outside the allowed directories only to a directory listed here —
one tenantnet itself opened while it was allowed — never to a path a NAD names for the
first time. The entry goes when the store is removed (ipam/sqlite_store.remove_if_unused);
`empty/` notes since when each store has held nothing, so that a later DEL can remove it. The list
lives in the node's state directory and is kept only where that exists (tenantnet itself
made it): `tenantnet-ipam` run alone by another plugin lists nothing and keeps the plain
rule (a DEL releases only inside `ipamDataDirs`).

Reads are bounded (the path's length), never follow a symlink, never block on a FIFO.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat

_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_PATH = 4096


def _entry(registry: str, data_dir: str) -> str:
    return os.path.join(registry, hashlib.sha256(data_dir.encode()).hexdigest()[:40])


def record(registry: str, data_dir: str) -> None:
    """List `data_dir` (best effort: a DEL after a narrowing is what needs it)."""
    if not registry:
        return
    path = _entry(registry, data_dir)
    if os.path.lexists(path) or not os.path.isdir(os.path.dirname(registry)):
        return  # listed already, or no state directory (tenantnet-ipam alone: nothing to list in)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        if not os.path.isdir(registry):
            try:
                os.mkdir(registry, 0o700)
            except FileExistsError:
                pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _FLAGS, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data_dir.encode())
        os.replace(tmp, path)  # whole or not at all
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def recorded(registry: str, data_dir: str) -> bool:
    """Is `data_dir` a store directory tenantnet listed, still a real directory reached
    through no symlink?"""
    if not registry or len(data_dir) > _MAX_PATH:
        return False
    try:
        fd = os.open(_entry(registry, data_dir), os.O_RDONLY | _FLAGS)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or fh.read(_MAX_PATH + 1) != data_dir.encode():
            return False
    path = data_dir
    while True:
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def forget(registry: str, data_dir: str) -> None:
    """The store is gone: drop its listing and its empty mark."""
    if not registry:
        return
    for path in (_entry(registry, data_dir), _entry(os.path.join(registry, EMPTY), data_dir)):
        try:
            os.unlink(path)
        except OSError:
            pass


# ---- stores that hold nothing ------------------------------------------------------------
# `<registry>/empty/<hash>`: the store holds no allocation since the file's modification time
# (its content: the store's path). Kept apart from the listing so that finding the stores to
# remove reads only the few that are empty, not every store of the node.
EMPTY = "empty"
MAX_SWEEP = 64  # empty marks looked at per sweep: a sweep's cost is bounded, the rest waits


def mark_empty(registry: str, data_dir: str) -> None:
    """Note that `data_dir`'s store holds nothing from now (an earlier mark is kept)."""
    if not registry or not os.path.isdir(registry):
        return
    empty = os.path.join(registry, EMPTY)
    try:
        if not os.path.isdir(empty):
            try:
                os.mkdir(empty, 0o700)
            except FileExistsError:
                pass
        fd = os.open(_entry(empty, data_dir), os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600)
    except OSError:
        return  # marked already (or no room: the store is only kept longer)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data_dir.encode())


def unmark_empty(registry: str, data_dir: str) -> None:
    """The store holds an address again."""
    if not registry:
        return
    try:
        os.unlink(_entry(os.path.join(registry, EMPTY), data_dir))
    except OSError:
        pass


def empty_since(registry: str) -> list[tuple[str, float]]:
    """(store directory, since when it has held nothing) of at most MAX_SWEEP marked stores."""
    if not registry:
        return []
    empty = os.path.join(registry, EMPTY)
    out: list[tuple[str, float]] = []
    try:
        names = os.listdir(empty)
    except OSError:
        return []
    if len(names) > MAX_SWEEP:
        # a sample, so that marks of stores still open somewhere do not starve the others
        names = random.sample(names, MAX_SWEEP)
    for name in names:
        try:
            fd = os.open(os.path.join(empty, name), os.O_RDONLY | _FLAGS)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            data = fh.read(_MAX_PATH + 1)
        if stat.S_ISREG(st.st_mode) and len(data) <= _MAX_PATH:
            out.append((data.decode("utf-8", "replace"), st.st_mtime))
    return out
