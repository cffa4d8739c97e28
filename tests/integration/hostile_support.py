"""Helpers of the hostile-input suite (test_hostile.py): a bounded filesystem watcher, a
snapshot of everything an attachment leaves on a node, and process hygiene for the plugin
execs and the agent.

The filesystem watcher compares `path -> (st_ino, st_size, st_mtime_ns, st_mode)` of a
bounded set of directories (direct children only, `lstat`, never following a link) before
and after one plugin call, in two kinds of directory:

- *quiet* ones (`/etc`, `/root`, `/var/log`, `/dev/shm`, …) that nothing else on the test
  machine writes into while the suite runs: every change among their children is a finding;
- *busy* ones (`/`, `/tmp`, `/run`, `/var/lib`, the working directories, and the nearest existing
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
import re
import shutil
import signal
import socket
import sqlite3
import stat
import struct
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Stat = tuple[int, int, int, int]

QUIET_DIRS = (
    "/etc", "/etc/tenantnet", "/etc/tenantnet/resolv.d", "/etc/kubernetes/cni/net.d",
    "/etc/kubernetes/cni/net.d/ovs.d", "/etc/cron.d", "/root", "/var/log", "/run/k8s.cni.cncf.io",
    "/run/k8s.cni.cncf.io/devinfo", "/dev/shm",
)
# /var/lib/cni is libcni's cache (podman and containerd runs on the machine write results there);
# /var/lib/tenantnet is the default state directory of tenantnet runs with a default node config
# (/var/log/tenantnet, their log, is tenantnet's own and not watched at all).
BUSY_DIRS = ("/", "/tmp", "/run", "/run/netns", "/run/tenantnet", "/var/lib", "/var/lib/cni",
             "/var/lib/cni/networks", "/var/lib/tenantnet", "/var/lib/tenantnet/ipam")


def _real(path: str) -> str:
    return os.path.realpath(path)


@dataclass
class Watch:
    """What one snapshot looks at: dirs compared whole, dirs compared by name prefix."""

    full: set[str] = field(default_factory=set)
    targeted: dict[str, set[str]] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)  # the absolute candidates of every named path

    def target(self, directory: str, prefix: str) -> None:
        self.targeted.setdefault(directory, set()).add(prefix)


class FsWatcher:
    def __init__(self, token: str, *, quiet: Iterable[str] = QUIET_DIRS, busy: Iterable[str] = BUSY_DIRS,
                 extra_full: Iterable[str] = (), extra_busy: Iterable[str] = (),
                 exclude: Iterable[str] = ()) -> None:
        self.token = token
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

    def plan(self, named: Iterable[str], cwds: Iterable[str]) -> Watch:
        watch = Watch(full={d for d in self.quiet if os.path.isdir(d)})
        for d in self.busy:
            if os.path.isdir(d):
                watch.targeted.setdefault(d, set())
        for value in named:
            for p in self.candidates(value, cwds):
                watch.named.add(p)
                if p == "/":
                    continue
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
        ours = tuple(m for m in (self.token, *mine) if len(m) >= 6)
        runs = _HEX_RUN.findall(os.path.basename(path))
        return bool(runs) and all(not any(r in m or m in r for m in ours) for r in runs)

    def diff(self, before: dict[str, Stat], after: dict[str, Stat], mine: Iterable[str] = ()) -> list[str]:
        mine = tuple(mine)
        out = [f"created {p}" for p in sorted(after.keys() - before.keys()) if not self.foreign(p, mine)]
        out += [f"removed {p}" for p in sorted(before.keys() - after.keys()) if not self.foreign(p, mine)]
        for p in sorted(before.keys() & after.keys()):
            b, a = before[p], after[p]
            if b != a and not self.foreign(p, mine):
                what = [n for n, x, y in zip(("inode", "size", "mtime", "mode"), b, a, strict=True) if x != y]
                out.append(f"changed {p} ({', '.join(what)})")
        return out

    def begin(self, watch: Watch) -> Session:
        """Stat snapshot plus inotify on every watched directory, from now until `end`."""
        if self.inotify is None:
            self.inotify = Inotify()
        for d in watch.full | set(watch.targeted):
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
        dirs = session.watch.full | set(session.watch.targeted)
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
            if not self._wanted(directory, name, session.watch):
                continue
            for bit, word in _EVENT_WORDS:
                if mask & bit and (word, path) not in seen:
                    seen.add((word, path))
                    out.append(f"inotify: {word} {path}")
        return out

    def undo_created(self, session: Session) -> list[str]:
        """Remove what a case made appear that is provably its own (a named path, a sibling
        of one, or a name with the suite's token); returns what was removed."""
        watch, before, after = session.watch, session.before, session.after
        named_base = {os.path.basename(p) for p in watch.named if p != "/"}
        removed = []
        for p in sorted(after.keys() - before.keys()):
            name = os.path.basename(p)
            if not (self.token in name or p in watch.named or any(name.startswith(b) for b in named_base if b)):
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


_OTHER_ATTACHMENT = re.compile(r"tn[0-9a-f]{11}")
_LAB_LINK = re.compile(r"[a-z]([0-9a-f]{5})[a-z]")  # a lab's simulated NIC: t<tag>v0, e<tag>av0-esw, …


def state_diff(before: NodeState, after: NodeState, *, ours: set[str], container_id: str,
               lab_tags: set[str]) -> list[str]:
    """What one call left behind or took away. Host links are a set diff of `ip -j link`, less
    the links other test runs on the machine make and remove meanwhile: attachment veths
    (`tn` + 11 hex, or marked in their alias) that are neither this call's name nor carry
    its container id, the simulated NICs of other labs (named after their lab's hash), and
    links named with a random hex tag that is none of ours."""
    out = []

    mine = tuple(x for x in (container_id, *lab_tags) if len(x) >= 5)

    def foreign(name: str, alias: str) -> bool:
        if name in ours or (container_id and container_id in alias):
            return False
        if _OTHER_ATTACHMENT.fullmatch(name) or alias.startswith("tenantnet:"):
            return True
        m = _LAB_LINK.match(name)
        if m:
            return m.group(1) not in lab_tags
        # Other suites name their links with random hex tags of their own.
        runs = _HEX_RUN.findall(name)
        return bool(runs) and all(not any(r in x or x in r for x in mine) for r in runs)

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


