"""Whether a claim or return of a cluster network's blocks found etcd unreachable while
another one waited for the network's ledger lock — across every process of the node.

Claims of one network queue behind one lock (ipam/cluster.py). During an etcd outage each
would spend its own `etcdTimeout` after the previous one's, so N ADDs needing a block would
get their code 11 one after another, N × etcdTimeout apart. The first claim that times out
marks the outage here, and every claim that was waiting meanwhile fails at once. Without
the agent each ADD is its own exec'd process, so the mark cannot be process memory alone:
it is a marker file beside the blocks file, `<dataDir>/cluster/<network>.unreachable`.

The marker carries no content and no clock: a waiter notes the file's identity (inode and
modification time, to the nanosecond) when it starts waiting, and gives up once they differ;
`mark` makes them differ even within one tick of the file system's clock. So a wall-clock
step changes nothing, reading it is one `lstat` (never an open, never blocking), and its path
lies in the store's own directory, which the node config confines. A marker that cannot be
written (read-only or full disk) leaves the process-local mark, the guard of one process.
"""

from __future__ import annotations

import os
import stat
import threading
import time

# Process-local marks: what a process knows even when the marker cannot be written.
_marks: dict[str, int] = {}
_lock = threading.Lock()


def marker_path(blocks_path: str) -> str:
    """`<network>.unreachable` beside `<network>.blocks`."""
    return blocks_path[: -len(".blocks")] + ".unreachable"


def seen(blocks_path: str) -> tuple[int, int, int]:
    """The marks of `blocks_path`'s network as of now; compare with a later `seen`."""
    local = _marks.get(blocks_path, 0)
    try:
        st = os.lstat(marker_path(blocks_path))
    except OSError:
        return (local, 0, 0)
    if not stat.S_ISREG(st.st_mode):
        return (local, 0, 0)
    return (local, st.st_ino, st.st_mtime_ns)


def mark(blocks_path: str) -> None:
    """etcd did not answer a claim or return of this network: waiters give up."""
    with _lock:
        _marks[blocks_path] = _marks.get(blocks_path, 0) + 1
    path = marker_path(blocks_path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            # Later than before by at least 1 ns: two outages in one clock tick stay two.
            now = max(st.st_mtime_ns + 1, time.time_ns())
            os.utime(fd, ns=(now, now))
    except OSError:
        pass
    finally:
        os.close(fd)
