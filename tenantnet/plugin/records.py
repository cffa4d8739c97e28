"""Attachment records: what we are about to do, and later what we did, per attachment.

A record is written *before* the kernel or OVS is touched (phase `adding`) and completed
afterwards (phase `ready`, with the result). DEL, CHECK and GC start from it, so a crash at
any instant leaves enough on disk to undo everything. Files are written atomically
(temp file, rename) with mode 0600, one per attachment:

    <stateDir>/attachments/<network>/<containerID>/<ifname>.json

Each path component was validated by `cni.names` before it gets here. A record that cannot
be read as this format (bad JSON, wrong types, a newer format) is *quarantined* — moved to
`<stateDir>/quarantine/` — so that DEL and GC go on from the request and what the system
shows instead of failing on it for ever; `tenantnetctl ls` lists quarantined records.
Calls for one (container id, ifname) are serialised across processes by `lock`.

No fsync: a killed process loses nothing the page cache holds, and what a power cut can
lose or revert here, the reboot that follows has made harmless (the pod's namespace and
veth are gone, VFs reset; an OVS port of ours found without a record is removed by the
runtime's DEL or GC through its external_ids). docs/architecture.md, "Durability", argues
it per piece of state; tests/integration/test_power_cut.py checks it on a filesystem whose
unwritten pages are really dropped.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from cni.names import container_id_problem, ifname_problem, network_name_problem
from hostfiles.confined import ensure_private_dir
from tenantnet.plugin import digest, faults

PHASE_ADDING = "adding"
PHASE_READY = "ready"
FORMAT = 1


_P = TypeVar("_P", bound="Plan")


@dataclass
class Plan:
    """What an attachment's driver fixed before anything was created — one dataclass per
    driver (tenantnet/plugin/drivers) — plus what the core keeps with it. Serialised in the
    record as one JSON object: a field's key is its name in camelCase, or `metadata["key"]`.
    Keys this version does not know are ignored on reading (a newer tenantnet's additions)."""

    # The core's part: CNI_ARGS of the ADD (IPAM DEL gets the same), the device-info file
    # ADD was given and the identity ("device:inode") of the one it wrote there (DEL removes
    # only that file, tenantnet/plugin/devinfo.py), and "a record-less DEL found nothing of
    # this attachment".
    cni_args: str = ""
    device_info_file: str | None = None
    device_info_id: str | None = None
    nothing_owned: bool = False

    # Fields holding an object with to_dict(): how to read it back.
    _decoders: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    _CORE: ClassVar[frozenset[str]] = frozenset({"cni_args", "device_info_file", "device_info_id",
                                                 "nothing_owned"})
    # Fields left out of the JSON while they hold their default (a plan's optional parts:
    # records of networks that do not use them stay as they were).
    _SPARSE: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if (f.name in self._CORE or f.name in self._SPARSE) and value == f.default:
                continue
            out[_key(f)] = value.to_dict() if hasattr(value, "to_dict") else value
        return out

    @classmethod
    def from_dict(cls: type[_P], data: dict[str, Any]) -> _P:
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = _key(f)
            if key in data:
                value = data[key]
                decode = cls._decoders.get(f.name)
                values[f.name] = decode(value) if decode is not None and value is not None else value
        return cls(**values)


def _key(f: Field[Any]) -> str:
    given = f.metadata.get("key")
    if given:
        return str(given)
    head, *rest = f.name.split("_")
    return head + "".join(part.capitalize() for part in rest)


@dataclass
class PodRef:
    """The pod an attachment belongs to (from CNI_ARGS; empty when the runtime gives none)."""

    namespace: str = ""
    name: str = ""
    uid: str = ""


@dataclass
class AttachmentRecord:
    """What tenantnet made for one attachment, as stored on disk: its plan, phase and result."""

    network: str
    container_id: str
    ifname: str
    mode: str
    netns: str = ""
    phase: str = PHASE_ADDING
    pod: PodRef = field(default_factory=PodRef)
    # Driver-specific names fixed before anything is created (host veth, bridge, endpoint).
    plan: Plan = field(default_factory=Plan)
    # The network config as given (without prevResult), for IPAM DEL/GC later.
    conf: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None  # in CNI 1.1.0 form
    # Steps of ADD known to be done, kept only in memory during one ADD so that its
    # rollback undoes exactly those. None (as read from disk) means "unknown: undo all".
    progress: set[str] | None = field(default=None, compare=False)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    def mark(self, step: str) -> None:
        """Note that `step` of this ADD is done (or about to be), for an exact rollback."""
        if self.progress is not None:
            self.progress.add(step)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.network, self.container_id, self.ifname)

    def to_json(self) -> str:
        # Built by hand and written without indentation: dataclasses.asdict deep-copies
        # every nested value and `indent` switches json to its pure-Python encoder, together
        # ≈ 2 ms per save, twice per ADD. `tenantnetctl ls` shows records readably.
        data = {"format": FORMAT, "network": self.network, "container_id": self.container_id,
                "ifname": self.ifname, "mode": self.mode, "netns": self.netns, "phase": self.phase,
                "pod": {"namespace": self.pod.namespace, "name": self.pod.name, "uid": self.pod.uid},
                "plan": self.plan.to_dict(), "conf": self.conf, "result": self.result,
                "created": self.created, "updated": self.updated}
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, plan_type: Callable[[str], type[Plan]] | None = None) -> AttachmentRecord:
        """Parse a record; ValueError naming what is wrong if it is not one we wrote.
        `plan_type(mode)` is the plan class of the record's mode (`modes.plan_type`);
        without it the plan is read as the core's part only."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a record is a JSON object, this is {type(data).__name__}")
        fmt = data.pop("format", FORMAT)
        if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt > FORMAT:
            raise ValueError(f"format {fmt!r} is not one this tenantnet reads (up to {FORMAT})")
        data.pop("progress", None)
        for key, kinds in _FIELD_TYPES.items():
            if key in data and not isinstance(data[key], kinds):
                raise ValueError(f"{key} is {type(data[key]).__name__}, not {kinds}")
        for key in ("network", "container_id", "ifname", "mode"):
            if key not in data:
                raise ValueError(f"{key} is missing")
        pod = data.get("pod") or {}
        if not all(isinstance(pod.get(k, ""), str) for k in ("namespace", "name", "uid")) or \
                not set(pod) <= {"namespace", "name", "uid"}:
            raise ValueError("pod must hold namespace, name and uid strings")
        data["pod"] = PodRef(**pod)
        if "plan" in data:
            data["plan"] = (plan_type(data["mode"]) if plan_type else Plan).from_dict(data["plan"])
        unknown = set(data) - set(_FIELD_TYPES) - {"pod"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        return cls(**data)


_FIELD_TYPES: dict[str, Any] = {
    "network": str, "container_id": str, "ifname": str, "mode": str, "netns": str, "phase": str,
    "pod": dict, "plan": dict, "conf": dict, "result": (dict, type(None)),
    "created": (int, float), "updated": (int, float),
}
_LOCK_STRIPES = 256


class CorruptRecord(Exception):
    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class RecordStore:
    def __init__(self, state_dir: str, plan_type: Callable[[str], type[Plan]] | None = None) -> None:
        """`plan_type(mode)`: the plan class per mode (`tenantnet.plugin.modes.plan_type`)."""
        self.plan_type = plan_type
        self.state_dir = state_dir
        self.root = os.path.join(state_dir, "attachments")
        self.quarantine_root = os.path.join(state_dir, "quarantine")

    @contextmanager
    def lock(self, container_id: str, ifname: str) -> Iterator[None]:
        """Serialise every call for one (container id, ifname), across processes and threads.

        256 lock files, by hash: a bounded number of files (one per attachment would grow
        with every pod ever seen, and removing them races with waiters), at the price of an
        occasional wait behind an unrelated attachment. flock dies with its holder."""
        hashed = digest.sha256_bytes(f"{container_id}/{ifname}".encode())
        lock_dir = os.path.join(self.state_dir, "locks")
        ensure_private_dir(lock_dir)
        path = os.path.join(lock_dir, f"attachment-{hashed[0] % _LOCK_STRIPES:02x}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def quarantine(self, problem: CorruptRecord) -> str | None:
        """Move an unreadable record out of the way; the new path (None if it was gone)."""
        if not problem.path:
            return None
        rel = os.path.relpath(problem.path, self.root)
        target = os.path.join(self.quarantine_root, f"{rel}.{time.time_ns()}")
        ensure_private_dir(os.path.dirname(target))
        try:
            os.replace(problem.path, target)
        except FileNotFoundError:
            return None
        return target

    def quarantined(self) -> list[str]:
        """Paths of quarantined records."""
        out: list[str] = []
        for base, _, files in os.walk(self.quarantine_root):
            out.extend(os.path.join(base, f) for f in files)
        return sorted(out)

    def path(self, network: str, container_id: str, ifname: str) -> str:
        # Defence in depth: the entry points validated these already.
        for value, problem in (
            (network, network_name_problem),
            (container_id, container_id_problem),
            (ifname, ifname_problem),
        ):
            if problem(value):
                raise ValueError(f"unsafe name for a record path: {value!r}")
        return os.path.join(self.root, network, container_id, ifname + ".json")

    def load(self, network: str, container_id: str, ifname: str) -> AttachmentRecord | None:
        path = self.path(network, container_id, ifname)
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            return None
        try:
            return AttachmentRecord.from_json(text, self.plan_type)
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptRecord(f"attachment record {path} is unreadable: {exc}", path) from None

    def save(self, record: AttachmentRecord, *, rewrite: bool = False) -> None:
        """Write the record atomically (temp file, rename): a reader, or the process after
        a SIGKILL, sees the previous version or this one, never a part (no fsync: see the
        module's docstring). With `rewrite` (the caller holds the attachment's lock and
        wrote this record before) its directory is known to be there and is not checked again."""
        record.updated = time.time()
        path = self.path(*record.key)
        directory = os.path.dirname(path)
        if not rewrite:
            ensure_private_dir(directory)
        tmp = f"{path}.tmp.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(record.to_json())
            faults.step("record.tmp-written")  # the temp file exists, the rename has not happened
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def remove(self, network: str, container_id: str, ifname: str) -> None:
        path = self.path(network, container_id, ifname)
        directory = os.path.dirname(path)
        stale_tmp = []
        try:
            # A temp file of a writer killed between create and rename.
            prefix = os.path.basename(path) + ".tmp."
            stale_tmp = [n for n in os.listdir(directory) if n.startswith(prefix)]
        except FileNotFoundError:
            pass
        for name in [os.path.basename(path)] + stale_tmp:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass
        # Drop the now-empty container and network directories (best effort).
        for directory in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
            try:
                os.rmdir(directory)
            except OSError:
                break

    def sweep_temp(self, network: str) -> list[str]:
        """Remove temp files of writers that died between create and rename (their pid is
        gone); a live writer's, this process's included, is left to finish."""
        removed = []
        for base, _, files in os.walk(os.path.join(self.root, network)):
            for name in files:
                stem, sep, pid = name.rpartition(".tmp.")
                if not sep or not stem.endswith(".json") or not pid.isdigit():
                    continue
                if int(pid) == os.getpid() or os.path.exists(f"/proc/{pid}"):
                    continue
                try:
                    os.unlink(os.path.join(base, name))
                    removed.append(os.path.join(base, name))
                except FileNotFoundError:
                    pass
        return removed

    def files(self, network: str | None = None) -> Iterator[str]:
        """The path of every record file — of one network, or all — without reading them."""
        try:
            networks = [network] if network else sorted(os.listdir(self.root))
        except FileNotFoundError:
            return
        for net in networks:
            net_dir = os.path.join(self.root, net)
            try:
                containers = sorted(os.listdir(net_dir))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for cid in containers:
                cdir = os.path.join(net_dir, cid)
                try:
                    files = sorted(os.listdir(cdir))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for name in files:
                    if name.endswith(".json"):
                        yield os.path.join(cdir, name)

    def read(self, path: str) -> AttachmentRecord | CorruptRecord | None:
        """The record in the file at `path` (one of `files()`); None if it is gone."""
        try:
            with open(path, encoding="utf-8") as fh:
                return AttachmentRecord.from_json(fh.read(), self.plan_type)
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError) as exc:
            return CorruptRecord(f"attachment record {path} is unreadable: {exc}", path)

    def list(self, network: str | None = None) -> Iterator[AttachmentRecord | CorruptRecord]:
        """Every record (or the problem reading it) — of one network, or all."""
        for path in self.files(network):
            item = self.read(path)
            if item is not None:
                yield item
