"""The node's copy of the cluster objects it enforces: `<stateDir>/kube/`.

The agent's watcher (tenantnet/kube/watch.py) writes it; every ADD reads it (tnadmit.py),
never the API server. One file per object, so an ADD reads exactly its TenantNetwork and
its pod's namespace whatever the size of the cluster (1,000 namespaces in one file would be
a megabyte parsed per ADD):

    kube/synced.json                 {"version": 1, "syncedAt": <unix time>, "node": {name, labels}}
    kube/tenantnetworks/<name>.json  the TenantNetwork (metadata.name/uid/generation, spec, status)
    kube/namespaces/<name>.json      {"name", "labels"}

Each file is written whole to a temporary name and renamed over the old one (a reader sees
the old object or the new, never half of one), and read with O_NOFOLLOW | O_NONBLOCK, a
regular-file check and a size bound: the state directory is the admin's, but a reader must
not hang or follow a link whatever is found there. `synced.json` appears only after the
first complete list of every kind; without it nothing is known, and an ADD fails closed. An
API outage leaves the files as they were: pods keep the networks last seen.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from typing import Any

CACHE_DIR = "kube"
FORMAT_VERSION = 1
KINDS = ("tenantnetworks", "namespaces")
MAX_OBJECT_BYTES = 256 << 10  # a TenantNetwork at its schema's bounds is well under this
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
# Namespace and TenantNetwork names are DNS labels: nothing else is ever a file name here.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class CacheUnreadable(Exception):
    """A cache file that exists but cannot be used (not a regular file, too big, not JSON)."""


@dataclass(frozen=True)
class SyncState:
    synced_at: float
    node_name: str
    node_labels: dict[str, str]


def cache_dir(state_dir: str) -> str:
    return os.path.join(state_dir, CACHE_DIR)


def valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _read(path: str) -> Any:
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink; EACCES…
        raise CacheUnreadable(f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheUnreadable(f"{path}: not a regular file")
        if st.st_size > MAX_OBJECT_BYTES:
            raise CacheUnreadable(f"{path}: {st.st_size} bytes, more than {MAX_OBJECT_BYTES}")
        data = os.read(fd, MAX_OBJECT_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return json.loads(data)
    except ValueError as exc:
        raise CacheUnreadable(f"{path}: not JSON ({exc})") from None


def read_object(state_dir: str, kind: str, name: str) -> dict[str, Any] | None:
    """One cached object, or None when the cache has none of that name."""
    if kind not in KINDS or not valid_name(name):
        return None
    got = _read(os.path.join(cache_dir(state_dir), kind, f"{name}.json"))
    if got is not None and not isinstance(got, dict):
        raise CacheUnreadable(f"{kind}/{name}.json: not a JSON object")
    return got


def read_sync(state_dir: str) -> SyncState | None:
    """When the cache was last complete, and the node's own labels then; None: never."""
    got = _read(os.path.join(cache_dir(state_dir), "synced.json"))
    if got is None:
        return None
    node = got.get("node") if isinstance(got, dict) else None
    if not isinstance(got, dict) or got.get("version") != FORMAT_VERSION or \
            not isinstance(got.get("syncedAt"), int | float) or not isinstance(node, dict):
        raise CacheUnreadable("synced.json: not a cache this tenantnet wrote (version, syncedAt, node)")
    labels = node.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        raise CacheUnreadable("synced.json: node.labels is not a map of strings")
    return SyncState(float(got["syncedAt"]), str(node.get("name", "")), dict(labels))


# ---- writing (the agent's watcher) ------------------------------------------------------------

def _write_atomic(directory: str, name: str, doc: Any) -> None:
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class CacheWriter:
    """The watcher's side: put and drop objects, replace a kind after a full list, mark
    the cache synced. Files 0600 in directories 0700 (they name every tenant's namespaces)."""

    def __init__(self, state_dir: str) -> None:
        self.root = cache_dir(state_dir)
        for sub in ("", *KINDS):
            os.makedirs(os.path.join(self.root, sub), mode=0o700, exist_ok=True)

    def put(self, kind: str, name: str, doc: dict[str, Any]) -> None:
        if kind not in KINDS or not valid_name(name):
            return  # the API server allows no other names; a stranger is not written
        _write_atomic(os.path.join(self.root, kind), f"{name}.json", doc)

    def drop(self, kind: str, name: str) -> None:
        if kind not in KINDS or not valid_name(name):
            return
        try:
            os.unlink(os.path.join(self.root, kind, f"{name}.json"))
        except FileNotFoundError:
            pass

    def names(self, kind: str) -> set[str]:
        directory = os.path.join(self.root, kind)
        return {f[:-5] for f in os.listdir(directory) if f.endswith(".json") and not f.startswith(".")}

    def replace_all(self, kind: str, docs: dict[str, dict[str, Any]]) -> None:
        """After a full list: every listed object written, every other one removed."""
        for name, doc in docs.items():
            self.put(kind, name, doc)
        for name in self.names(kind) - set(docs):
            self.drop(kind, name)

    def mark_synced(self, synced_at: float, node_name: str, node_labels: dict[str, str]) -> None:
        _write_atomic(self.root, "synced.json", {"version": FORMAT_VERSION, "syncedAt": synced_at,
                                                 "node": {"name": node_name, "labels": node_labels}})


def namespace_doc(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": dict(labels)}


def tenant_network_doc(obj: dict[str, Any]) -> dict[str, Any]:
    """What of a TenantNetwork the node keeps: identity, spec, status (not managedFields)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "uid", "generation", "resourceVersion") if k in meta},
            "spec": obj.get("spec") or {}, "status": obj.get("status") or {}}
