"""Helpers of the hostile-input suite (test_hostile.py): a bounded filesystem watcher, a
snapshot of everything an attachment leaves on a node, and process hygiene for the plugin
execs and the agent.

The filesystem watcher compares `path -> (st_ino, st_size, st_mtime_ns, st_mode)` of a
bounded set of directories (direct children only, `lstat`, never following a link) before
and after one plugin call, in three kinds of directory:

- *private* ones: `/var/lib`, `/var/log`, `/etc`, `/root` and `/dev/shm` (those with nothing
  mounted below them), where tenantnet's defaults point and where other runs on the machine
  (libcni's result cache, other nodes' IPAM stores and logs, the Kubernetes lab, any
  Python's semaphores) write all the time. The process under test sees them through an
  overlay whose upper layer is the suite's own (`PrivateWrites`): everything in the upper
  layers is its doing and is a finding, whatever its name; the real directories are watched
  only for opens of the suite's own decoys (an open through the overlay is reported on the
  real file);
- *quiet* ones (`/etc/...`, `/run/k8s.cni.cncf.io`, … when not below a private one) that
  nothing else on the test machine writes into: every change among their children is a finding;
- *busy* ones (`/`, `/tmp`, `/run`, the working directories, and the nearest existing
  ancestor of every path a case names, e.g. inside the lab) that other work writes into
  all the time: there only the entries the case names (and their `.tmp.*`-style siblings)
  and entries carrying the suite's random token are compared.

A snapshot costs one `scandir` per directory: about a millisecond in all. While the call
runs, inotify watches the same directories, so that a file made and removed again (a rollback
that deletes what it wrote), or an open of a decoy or of /etc/shadow (a read outside), is seen
too. Names carrying another run's random hex tag are left out: other test suites on the
machine attack /etc and /tmp at the same time, each with names of its own.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import stat
import struct
import subprocess
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Stat = tuple[int, int, int, int]

QUIET_DIRS = (
    "/etc", "/etc/tenantnet", "/etc/tenantnet/resolv.d", "/etc/kubernetes/cni/net.d",
    "/etc/kubernetes/cni/net.d/ovs.d", "/etc/cron.d", "/root", "/run/k8s.cni.cncf.io",
    "/run/k8s.cni.cncf.io/devinfo", "/dev/shm",
)
# /var/lib (libcni's cache, tenantnet's default state and IPAM store) and /var/log are not
# here: the process under test sees them through PrivateWrites, whose upper layers are watched.
BUSY_DIRS = ("/", "/tmp", "/run", "/run/netns", "/run/tenantnet")
# tenantnet's own default log directory: a delegated exec without the lab's node config (the
# ipam.type cases) logs there, as tenantnet does on any node; not a finding.
TENANTNET_LOG_DIR = "/var/log/tenantnet"


def _real(path: str) -> str:
    return os.path.realpath(path)


@dataclass
class Watch:
    """What one snapshot looks at: dirs compared whole, dirs compared by name prefix."""

    full: set[str] = field(default_factory=set)
    targeted: dict[str, set[str]] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)  # the absolute candidates of every named path
    opens: set[str] = field(default_factory=set)  # dirs watched by inotify for sensitive opens only

    def target(self, directory: str, prefix: str) -> None:
        self.targeted.setdefault(directory, set()).add(prefix)


class FsWatcher:
    def __init__(self, token: str, *, quiet: Iterable[str] = QUIET_DIRS, busy: Iterable[str] = BUSY_DIRS,
                 extra_full: Iterable[str] = (), extra_busy: Iterable[str] = (),
                 exclude: Iterable[str] = (), private: Iterable[PrivateWrites] = ()) -> None:
        self.token = token
        self.private = tuple(private)
        self._uppers = tuple(u for pw in self.private for u in pw.uppers())
        self._under_private = tuple(d for pw in self.private for d in pw.layers)
        self.quiet = {_real(d) for d in quiet} | {_real(d) for d in extra_full}
        self.busy = {_real(d) for d in busy} | {_real(d) for d in extra_busy}
        self.exclude = tuple(_real(e) for e in exclude)
        self._exclude_under = tuple(e.rstrip("/") + "/" for e in self.exclude)
        # One inotify instance for the whole run: closing one with its watches costs ~10 ms.
        self.inotify: Inotify | None = None
        self.watched: dict[str, int] = {}  # directory -> inode it was watched at

    # ---- what to look at -------------------------------------------------------------------
    def candidates(self, value: str, cwds: Iterable[str]) -> set[str]:
        """Absolute paths a path-like string may reach: as given (relative ones against every
        working directory of a plugin), with `..` collapsed, and with links resolved."""
        text = value.split("\0", 1)[0]
        variants = {text, text.rstrip()}
        if text.startswith(("unix:", "punix:")):
            variants.add(text.partition(":")[2])
        out: set[str] = set()
        for v in variants:
            if not v:
                continue
            bases = [""] if v.startswith("/") else list(cwds)
            for base in bases:
                p = os.path.join(base, v) if base else v
                out.add(os.path.normpath(p))
                try:
                    out.add(os.path.realpath(p))
                except (OSError, ValueError):
                    pass
        return {p for p in out if p.startswith("/") and not p.startswith(("/proc/", "/sys/"))}

    def upper(self, path: str) -> bool:
        """Is `path` in an upper layer of PrivateWrites (so the process under test's doing)?"""
        return any(path == u or path.startswith(u + "/") for u in self._uppers)

    def show(self, path: str) -> str:
        for pw in self.private:
            shown = pw.show(path)
            if shown != path:
                return f"{shown} (in the overlay's upper layer {path})"
        return path

    def _covered(self, path: str) -> bool:
        return any(path == d or path.startswith(d + "/") for d in self._under_private)

    def plan(self, named: Iterable[str], cwds: Iterable[str]) -> Watch:
        # A quiet directory below a private one is seen in the upper layer; the real one is
        # still watched by inotify, for opens of the suite's decoys (an open through the
        # overlay is reported on the real file).
        watch = Watch(full={d for d in self.quiet if os.path.isdir(d) and not self._covered(d)})
        watch.opens = {d for d in self.quiet if os.path.isdir(d) and self._covered(d)}
        for pw in self.private:
            watch.full |= pw.directories()
        for d in self.busy:
            if os.path.isdir(d):
                watch.targeted.setdefault(d, set())
        for value in named:
            for p in self.candidates(value, cwds):
                watch.named.add(p)
                if p == "/" or self._covered(p):
                    continue  # below a private directory: its upper layer is watched whole
                if os.path.isdir(p) and not os.path.islink(p) and p not in watch.full:
                    # A directory a case names (a dataDir): what an IPAM plugin would put in it.
                    watch.target(p, "ipam")
                    watch.target(p, "lock")
                existing = p
                while not os.path.lexists(existing):
                    existing = os.path.dirname(existing)
                if existing == p:
                    watch.target(os.path.dirname(p), os.path.basename(p))
                else:
                    rest = os.path.relpath(p, existing).split(os.sep)[0]
                    watch.target(existing, rest)
        return watch

    # ---- looking -----------------------------------------------------------------------------
    def _excluded(self, path: str, watch: Watch) -> bool:
        if self.upper(path):
            shown = next((pw.show(path) for pw in self.private if pw.show(path) != path), path)
            return shown == TENANTNET_LOG_DIR or shown.startswith(TENANTNET_LOG_DIR + "/")
        return (path in self.exclude or path.startswith(self._exclude_under)) and path not in watch.named

    def _wanted(self, directory: str, name: str, watch: Watch) -> bool:
        """Is the entry `name` of `directory` compared (before the foreign-name rule)?"""
        if directory in watch.full:
            return True
        prefixes = watch.targeted.get(directory, set())
        return self.token in name or any(name.startswith(p) for p in prefixes)

    def snapshot(self, watch: Watch) -> dict[str, Stat]:
        out: dict[str, Stat] = {}
        for d in watch.full | set(watch.targeted):
            try:
                entries = list(os.scandir(d))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            for entry in entries:
                path = entry.path if d != "/" else "/" + entry.name
                if not self._wanted(d, entry.name, watch) or self._excluded(path, watch):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    # A sub-directory's own times change with what others put in it; what matters
                    # is that none appears, vanishes or is replaced. What a case could write in
                    # one is seen where that directory is watched itself (quiet, or the nearest
                    # existing ancestor of a path the case names) — and by inotify.
                    out[path] = (st.st_ino, 0, 0, st.st_mode)
                else:
                    out[path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        return out

    def foreign(self, path: str, mine: Iterable[str] = ()) -> bool:
        """An entry of another test run on the machine (other suites attack /etc and /tmp with
        names of their own): its name carries a random hex tag that is neither our token nor
        one of this case's ids. Everything this suite makes a plugin write carries our token."""
        if self.upper(path):
            return False  # only the process under test writes there
        ours = tuple(m for m in (self.token, *mine) if len(m) >= 6)
        runs = _HEX_RUN.findall(os.path.basename(path))
        return bool(runs) and all(not any(r in m or m in r for m in ours) for r in runs)

    def diff(self, before: dict[str, Stat], after: dict[str, Stat], mine: Iterable[str] = ()) -> list[str]:
        mine = tuple(mine)
        out = [f"created {self.show(p)}" for p in sorted(after.keys() - before.keys()) if not self.foreign(p, mine)]
        out += [f"removed {self.show(p)}" for p in sorted(before.keys() - after.keys()) if not self.foreign(p, mine)]
        for p in sorted(before.keys() & after.keys()):
            b, a = before[p], after[p]
            if b != a and not self.foreign(p, mine):
                what = [n for n, x, y in zip(("inode", "size", "mtime", "mode"), b, a, strict=True) if x != y]
                out.append(f"changed {self.show(p)} ({', '.join(what)})")
        return out

    def begin(self, watch: Watch) -> Session:
        """Stat snapshot plus inotify on every watched directory, from now until `end`."""
        if self.inotify is None:
            self.inotify = Inotify()
        for d in watch.full | set(watch.targeted) | watch.opens:
            try:
                ino = os.stat(d).st_ino
            except OSError:
                continue
            if self.watched.get(d) != ino:
                self.inotify.add(d)
                self.watched[d] = ino
        self.inotify.read()  # what happened before this call is not this call's doing
        return Session(watch=watch, before=self.snapshot(watch), inotify=self.inotify)

    def close(self) -> None:
        if self.inotify is not None:
            self.inotify.close()
            self.inotify = None
            self.watched.clear()

    def end(self, session: Session, mine: Iterable[str] = (), sensitive: Iterable[str] = ()) -> list[str]:
        """What happened in the watched directories since `begin`: entries made, removed,
        written, renamed, re-moded (inotify: also what came and went again), and opens of the
        `sensitive` files (reads outside tenantnet's directories)."""
        mine = tuple(mine)
        sensitive = set(sensitive)
        events = session.inotify.read()
        session.after = self.snapshot(session.watch)
        dirs = session.watch.full | set(session.watch.targeted) | session.watch.opens
        out = self.diff(session.before, session.after, mine)
        seen = set()
        for directory, mask, name in events:
            path = os.path.join(directory, name) if name else directory
            if not name or directory not in dirs or self.foreign(path, mine) or self._excluded(path, session.watch):
                continue
            if mask & IN_OPEN:
                if path in sensitive and ("opened", path) not in seen:
                    seen.add(("opened", path))
                    out.append(f"opened {path} (a read outside tenantnet's directories)")
                continue
            if directory in session.watch.opens or not self._wanted(directory, name, session.watch):
                continue
            for bit, word in _EVENT_WORDS:
                if mask & bit and (word, path) not in seen:
                    seen.add((word, path))
                    out.append(f"inotify: {word} {self.show(path)}")
        return out

    def undo_created(self, session: Session) -> list[str]:
        """Remove what a case made appear that is provably its own (a named path, a sibling
        of one, or a name with the suite's token); returns what was removed."""
        watch, before, after = session.watch, session.before, session.after
        named_base = {os.path.basename(p) for p in watch.named if p != "/"}
        removed = []
        for p in sorted(after.keys() - before.keys()):
            name = os.path.basename(p)
            if not (self.token in name or p in watch.named or any(name.startswith(b) for b in named_base if b)
                    or self.upper(p)):
                continue
            try:
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
                removed.append(p)
            except OSError:
                pass
        return removed


@dataclass
class Session:
    watch: Watch
    before: dict[str, Stat]
    inotify: Inotify
    after: dict[str, Stat] = field(default_factory=dict)


# ---- the busy host directories, seen through an overlay of the test's own ----------------------------

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_SLAVE = 0x1000, 0x4000, 1 << 19
PRIVATE_DIRS = ("/var/lib", "/var/log", "/etc", "/root", "/dev/shm")


def _has_submounts(d: str) -> bool:
    """Is anything mounted below `d`? (An overlay on `d` would hide it from the process.)"""
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    return any(p.startswith(d.rstrip("/") + "/") for p in points)


class PrivateWrites:
    """Host directories that other runs on the machine write into (`/var/lib`: libcni's
    cache, tenantnet's default state and IPAM store; `/var/log`; `/etc`: the Kubernetes lab's
    CNI configuration; `/root`: its kubeconfig; `/dev/shm`: any Python's semaphores), as the
    process under test
    sees them: an overlay whose lower layer is the real directory and whose upper layer is a
    directory this test owns, in a mount namespace of the process's own. The process reads
    the real files, and whatever it creates, writes, re-modes or removes there lands in the
    upper layer (a removal as a whiteout) and nowhere else; what other processes write stays
    in the real directory, which the process still sees. So the upper layers hold exactly what
    the process under test (and its children, which inherit the namespace) did there: a
    watcher compares them whole and attributes every change to it, while the real
    directories are not watched at all.

    `enter()` puts the calling thread in such a namespace (in a child between fork and
    exec: `preexec_fn`; in a worker thread: what it and the threads it starts do); `wrap(argv)`
    is the same for a command started through util-linux's unshare (the agent). Our mounts
    never propagate back: the namespace's mounts are made slaves of the host's (a netns the
    host mounts later under /run/netns is still seen)."""

    def __init__(self, root: Path, dirs: Iterable[str] = PRIVATE_DIRS) -> None:
        self.layers: dict[str, tuple[Path, Path]] = {}  # host directory -> (upper, work)
        for d in dirs:
            if not os.path.isdir(d) or os.path.islink(d) or _has_submounts(d):
                continue  # a directory with mounts below it stays a watched host directory
            key = d.strip("/").replace("/", "-")
            upper, work = root / f"{key}-upper", root / f"{key}-work"
            upper.mkdir(parents=True, exist_ok=True, mode=0o755)
            work.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.layers[d] = (upper, work)

    def _options(self, d: str) -> str:
        upper, work = self.layers[d]
        # index=off: one upper layer serves one mount after another (an exec each)
        return f"lowerdir={d},upperdir={upper},workdir={work},index=off"

    def enter(self) -> None:
        if _libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        if _libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rslave /")
        for d in self.layers:
            if _libc.mount(b"overlay", d.encode(), b"overlay", 0, self._options(d).encode()) != 0:
                raise OSError(ctypes.get_errno(), f"mount overlay on {d}")

    def wrap(self, argv: list[str]) -> list[str]:
        mounts = " && ".join(f"mount -t overlay overlay -o {self._options(d)} {d}" for d in self.layers)
        return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", f'{mounts or ":"} && exec "$@"',
                "sh", *argv]

    def uppers(self) -> dict[str, str]:
        """upper layer -> the host directory it stands for."""
        return {str(upper): d for d, (upper, _) in self.layers.items()}

    def show(self, path: str) -> str:
        """A path of an upper layer as the process under test wrote it."""
        for upper, d in self.uppers().items():
            if path == upper or path.startswith(upper + "/"):
                return d + path[len(upper):]
        return path

    def tree(self) -> dict[str, Stat]:
        """Everything in the upper layers: what the process under test did in the host directories."""
        out: dict[str, Stat] = {}
        for upper in self.uppers():
            for base, dirs, files in os.walk(upper):
                for name in dirs + files:
                    path = os.path.join(base, name)
                    try:
                        st = os.lstat(path)
                    except FileNotFoundError:
                        continue
                    out[path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        return out

    def directories(self) -> set[str]:
        """The upper layers and every directory in them (for inotify and the stat snapshot)."""
        out = set(self.uppers())
        for upper in self.uppers():
            out |= {os.path.join(base, n) for base, dirs, _ in os.walk(upper) for n in dirs}
        return out


def stand_ins(binds: dict[str, str]) -> Callable[[], None]:
    """For `preexec_fn`: the child gets a mount namespace of its own in which each host file
    `target` is the test's file `binds[target]` (a bind mount; our mounts never propagate
    back). A watch on the test's file then sees the process under test (and its children)
    reach `target`, and no other process on the machine: say /etc/shadow, which other
    work opens all the time."""

    def enter() -> None:
        if _libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        if _libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rslave /")
        for target, source in binds.items():
            if _libc.mount(source.encode(), target.encode(), None, MS_BIND, None) != 0:
                raise OSError(ctypes.get_errno(), f"mount --bind {source} {target}")

    return enter


class OtherWork:
    """What other runs on the machine do while a test watches, made by the test itself to show
    that its watchers ignore it: libcni's result cache and another node's IPAM store under
    /var/lib, another node's log under /var/log, a Multus configuration under /etc, a file
    in /root, a semaphore in /dev/shm, a Linux bridge, and a veth pair named like
    another attachment's host veth (`tn` + 11 hex digits). Names carry no hex tag (the old
    watchers' way of telling another run's names apart), so only attribution can ignore
    them. `start()` makes them (and one file it removes again at once), `stop()` removes
    them and any directory it had to make for them."""

    def __init__(self) -> None:
        letters = "".join(random.choice("ghijklmnopqrstuvwxyz") for _ in range(8))
        self.files = [f"/var/lib/cni/results/othernet-{letters}-eth0", f"/var/lib/tenantnet/ipam/{letters}/ipam.db-shm",
                      f"/var/log/tenantnet/other-{letters}.log", f"/root/.other-{letters}",
                      f"/dev/shm/sem.other-{letters}"]
        # A Multus configuration where a Kubernetes lab keeps them; /etc/kubernetes is made by
        # no test here for that.
        multus = "/etc/kubernetes/cni/net.d"
        self.files.append(f"{multus}/00-other-{letters}.conf" if os.path.isdir(multus) else f"/etc/other-{letters}.conf")
        self.churn = f"/var/lib/cni/results/othernet-{letters}-gone"
        self.links = {"bridge": f"brx{letters[:8]}", "veth": "tn" + uuid.uuid4().hex[:11]}
        self.made_dirs: list[str] = []

    def _dirs_for(self, path: str) -> None:
        missing = []
        d = os.path.dirname(path)
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            os.mkdir(d, 0o755)
            self.made_dirs.append(d)

    def start(self) -> None:
        for path in [*self.files, self.churn]:
            self._dirs_for(path)
            with open(path, "w") as fh:
                fh.write("another run's\n")
        os.unlink(self.churn)
        subprocess.run(["ip", "link", "add", self.links["bridge"], "type", "bridge"], check=True, capture_output=True)
        subprocess.run(["ip", "link", "add", self.links["veth"], "type", "veth", "peer", "name",
                        self.links["bridge"] + "p"], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", self.links["veth"], "alias", "tenantnet:0123456789abcdef:other/eth1"],
                       check=True, capture_output=True)

    def stop(self) -> None:
        for name in self.links.values():
            subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)
        for path in self.files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        for d in reversed(self.made_dirs):
            try:
                os.rmdir(d)
            except OSError:
                pass  # someone else put something there meanwhile: theirs now
        self.made_dirs.clear()

    def __enter__(self) -> OtherWork:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- inotify (ctypes: the standard library has no binding) -----------------------------------------

IN_MODIFY, IN_ATTRIB, IN_OPEN = 0x2, 0x4, 0x20
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_Q_OVERFLOW = 0x4000
_MASK = IN_MODIFY | IN_ATTRIB | IN_OPEN | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
_EVENT_WORDS = ((IN_CREATE, "created"), (IN_MOVED_TO, "renamed into"), (IN_MODIFY, "written"),
                (IN_ATTRIB, "changed attributes of"), (IN_MOVED_FROM, "renamed away"), (IN_DELETE, "deleted"))
_HEX_RUN = re.compile(r"[0-9a-f]{6,}")
_libc = ctypes.CDLL(None, use_errno=True)


class Inotify:
    def __init__(self) -> None:
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dirs: dict[int, set[str]] = {}  # one inode may be watched under several names (symlinks)

    def add(self, directory: str) -> None:
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(directory), _MASK)
        if wd >= 0:
            self.dirs.setdefault(wd, set()).add(directory)

    def read(self) -> list[tuple[str, int, str]]:
        """(directory, mask, name) of every event so far."""
        out = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return out
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, size = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16:offset + 16 + size].split(b"\0", 1)[0]
                offset += 16 + size
                # On a queue overflow (wd -1) events are lost; the stat comparison still stands.
                if wd in self.dirs and not mask & IN_Q_OVERFLOW:
                    out += [(d, mask, os.fsdecode(name)) for d in sorted(self.dirs[wd])]

    def close(self) -> None:
        os.close(self.fd)


# ---- the node: links, ports, records, allocations ------------------------------------------------

@dataclass(frozen=True)
class NodeState:
    host_links: dict[str, str]  # name -> ifalias, of the host's netns
    ports: frozenset[str]  # every port on the lab's OVS
    owned_ports: frozenset[str]  # those tenantnet marks as its own
    records: frozenset[str]  # everything below <stateDir>/attachments, *.json.tmp.* included
    allocations: frozenset[str]  # host-local's allocation files in the lab's dataDir
    ipam_rows: int  # tenantnet-ipam allocations in the lab's store
    pod_links: frozenset[str]  # links in the pod's netns
    vfs: tuple[Any, ...] = ()  # simulated NIC: (address, PF-side state, netdev present) per VF


def ovsdb_select(endpoint: str, table: str, columns: list[str], timeout: float = 10) -> list[dict[str, Any]]:
    """Rows of one OVSDB table, by one JSON-RPC `transact` on the lab's unix socket: the same
    answer as `ovs-vsctl list`, without an exec per snapshot."""
    path = endpoint.partition(":")[2] if endpoint.startswith("unix:") else endpoint
    request = {"method": "transact", "id": 1,
               "params": ["Open_vSwitch", {"op": "select", "table": table, "where": [], "columns": columns}]}
    decoder = json.JSONDecoder()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(request).encode())
        buf = ""
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("OVSDB closed the connection before answering")
            buf += chunk.decode()
            try:
                reply, _ = decoder.raw_decode(buf.lstrip())
            except ValueError:
                continue
            if reply.get("id") != 1:  # an echo or notification: not ours
                buf = ""
                continue
            if reply.get("error") or "error" in reply["result"][0]:
                raise RuntimeError(f"OVSDB select failed: {reply}")
            return list(reply["result"][0]["rows"])


def ovs_ports(lab: Any) -> tuple[frozenset[str], frozenset[str]]:
    names, owned = set(), set()
    for row in ovsdb_select(lab.ovsdb, "Port", ["name", "external_ids"]):
        names.add(row["name"])
        ids = row["external_ids"]
        pairs = dict(ids[1]) if isinstance(ids, list) and ids and ids[0] == "map" else {}
        if pairs.get("tenantnet-owner") == "tenantnet":
            owned.add(row["name"])
    return frozenset(names), frozenset(owned)


def host_links() -> dict[str, str]:
    out = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    return {link["ifname"]: link.get("ifalias", "") for link in json.loads(out)}


def netns_links(netns: str) -> frozenset[str]:
    proc = subprocess.run(["ip", "-n", netns, "-j", "link"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return frozenset({f"<cannot list: {proc.stderr.strip()}>"})
    return frozenset(link["ifname"] for link in json.loads(proc.stdout))


def ipam_rows(data_dir: Path) -> int:
    db = data_dir / "ipam.db"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return int(conn.execute("SELECT count(*) FROM allocation").fetchone()[0])
    except sqlite3.Error:
        return -1


def node_state(lab: Any, netns: str, own_ipam_dir: Path, nic: bool = False) -> NodeState:
    ports, owned = ovs_ports(lab)
    attachments = lab.state_dir / "attachments"
    records = frozenset(str(p.relative_to(attachments)) for p in attachments.rglob("*")) \
        if attachments.exists() else frozenset()
    vfs: tuple[Any, ...] = ()
    if nic:
        from tenantnet.lab.nic import LabNic, LabVfControl

        ctl = LabVfControl(str(lab.root))
        rows = []
        for vf in LabNic(str(lab.root)).describe()[0]["vfs"]:
            present = bool(vf["netdev"]) and os.path.exists(f"/sys/class/net/{vf['netdev']}")
            rows.append((vf["address"], json.dumps(ctl.read("lpf0", vf["index"]).to_dict(), sort_keys=True),
                         present))
        vfs = tuple(rows)
    return NodeState(host_links=host_links(), ports=ports, owned_ports=owned, records=records,
                     allocations=frozenset(lab.allocations()), ipam_rows=ipam_rows(own_ipam_dir),
                     pod_links=netns_links(netns), vfs=vfs)


_LAB_LINK = re.compile(r"[a-z]([0-9a-f]{5})[a-z]")  # a lab's simulated NIC: t<tag>v0, e<tag>av0-esw, …


def state_diff(before: NodeState, after: NodeState, *, ours: set[str], container_id: str,
               lab_tags: set[str]) -> list[str]:
    """What one call left behind or took away. Host links are a set diff of `ip -j link`
    limited to the links this call can own — other runs on the machine make and remove links
    (attachment veths, bridges, their labs' NICs) all the time: the names it was given or
    derives (`ours`: the host veth of its container id and ifname, the ifname itself), a link
    whose alias carries its container id (tenantnet's ownership mark), and the links of our
    labs' simulated NICs (named after their lab's hash, in `lab_tags`). A link of the pod
    namespace is compared whole (`pod_links`), and the whole-node snapshot
    (tests/integration/nodestate.py) looks at links by peer and mark."""
    out = []

    def foreign(name: str, alias: str) -> bool:
        if name in ours or (container_id and container_id in alias):
            return False
        m = _LAB_LINK.match(name)
        return not (m and m.group(1) in lab_tags)

    added = {n: a for n, a in after.host_links.items() if n not in before.host_links}
    gone = {n: a for n, a in before.host_links.items() if n not in after.host_links}
    out += [f"host link {n} appeared (alias {a!r})" for n, a in sorted(added.items()) if not foreign(n, a)]
    out += [f"host link {n} disappeared" for n, a in sorted(gone.items()) if not foreign(n, a)]
    for what, b, a in (("OVS port", before.ports, after.ports),
                       ("tenantnet-owned OVS port", before.owned_ports, after.owned_ports),
                       ("attachment record/file", before.records, after.records),
                       ("host-local allocation", before.allocations, after.allocations),
                       ("pod link", before.pod_links, after.pod_links)):
        out += [f"{what} {x} left behind" for x in sorted(a - b)]
        out += [f"{what} {x} removed" for x in sorted(b - a)]
    if before.ipam_rows != after.ipam_rows:
        out.append(f"tenantnet-ipam allocations went from {before.ipam_rows} to {after.ipam_rows}")
    if before.vfs != after.vfs:
        changed = [b[0] for b, a in zip(before.vfs, after.vfs, strict=False) if b != a]
        out.append(f"simulated VFs changed: {', '.join(changed) or 'the VF list'}")
    return out


# ---- processes -------------------------------------------------------------------------------------

def children(pid: int) -> list[int]:
    """Direct children of `pid` (all its threads')."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
        except OSError:
            pass
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def _state_and_pgid(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[2])


def live_group_members(pgid: int) -> list[int]:
    """Processes (not zombies) still in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _state_and_pgid(int(name))
            if info and info[1] == pgid and info[0] != "Z":
                out.append(int(name))
    return out


def kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def release_fifos(paths: Iterable[str]) -> bool:
    """Give every reader blocked opening one of these FIFOs its writer (and at once EOF).
    True if someone was waiting, i.e. a FIFO was opened for reading by the plugin."""
    woke = False
    for path in paths:
        try:
            if not stat.S_ISFIFO(os.lstat(path).st_mode):
                continue
        except (OSError, ValueError):
            continue
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader, nothing blocked on it
                raise
            continue
        woke = True
        os.close(fd)
    return woke


