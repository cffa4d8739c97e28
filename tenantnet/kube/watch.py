"""The agent's watch of the cluster: TenantNetworks, Namespaces and this node's labels,
written into the node's cache (tenantnet/plugin/kubecache.py) that every ADD reads.

One thread per kind: list (the cache of that kind replaced whole: what was deleted while
nobody watched is gone), then watch from the list's resourceVersion, each event written
at once (an atomic file per object). `synced.json` is written once every kind has been
listed, and again at each later full list: before it, ADDs fail closed ("not synced").
When the API server is unreachable the threads retry with a growing, jittered backoff
(0.5 s doubling up to 30 s) and the cache stays as it was: running pods keep their
networks, new ADDs get the last synced state — never an empty one.

The node thread also publishes this node's SR-IOV PFs (netdev name and PCI address, found
in the node's sysfs) as its Node's annotation `tenantnet.io/pfs`, patched only when it
differs, so the renderer can refuse a TenantNetwork naming PFs no node has (UnknownPF).
Advisory: any agent allowed to patch Nodes could write any Node's; the node enforces its own
PFs at ADD whatever the annotation says.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tenantnet.plugin import kubecache
from tenantnet.plugin.nodeconfig import NodeConfig, node_name_of
from tenantnet.plugin.system import sysfs
from tenantnet.plugin.tnrender import MAX_PUBLISHED_PFS, PFS_ANNOTATION

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
KINDS = ("tenantnetworks", "namespaces", "node")


class Source:
    """What the watcher asks of the API (lightkube in the agent; a fake in unit tests):
    `list(kind)` -> (objects as dicts, resourceVersion); `watch(kind, rv)` -> (type, dict)."""

    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        raise NotImplementedError

    def watch(self, kind: str, resource_version: str) -> Iterable[tuple[str, dict[str, Any]]]:
        raise NotImplementedError

    def annotate_node(self, name: str, key: str, value: str) -> None:
        """Set one annotation on the Node `name` (a merge patch)."""
        raise NotImplementedError


def discover_pfs(root: str) -> list[dict[str, str]]:
    """This node's SR-IOV PFs as [{name, pci}], by netdev name: every netdev of class/net
    that is a PF's own (not a switchdev representor, not a VF), at most MAX_PUBLISHED_PFS."""
    s = sysfs.Sysfs(root)
    try:
        names = sorted(os.listdir(os.path.join(root, "class", "net")))
    except OSError:
        return []
    out: list[dict[str, str]] = []
    for name in names:
        port = sysfs._read_attribute(os.path.join(root, "class", "net", name, "phys_port_name")) or "-"
        if sysfs.representor_vf_index(port) is not None:
            continue
        try:
            out.append({"name": name, "pci": s.pf_address(name)})
        except sysfs.SysfsError:
            continue
        if len(out) >= MAX_PUBLISHED_PFS:
            break
    return out


class LightkubeSource(Source):
    def __init__(self, kubeconfig: str, node_name: str) -> None:
        from lightkube.resources.core_v1 import Namespace, Node

        from tenantnet.kube import api

        self.client = api.client(kubeconfig, field_manager="tenantnet-agent")
        self.node_name = node_name
        self.resources = {"tenantnetworks": api.TenantNetwork, "namespaces": Namespace, "node": Node}

    def _fields(self, kind: str) -> dict[str, str] | None:
        return {"metadata.name": self.node_name} if kind == "node" else None

    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        from tenantnet.kube import api

        got = self.client.list(self.resources[kind], fields=self._fields(kind))
        items = [api.as_dict(o) for o in got]
        return items, got.resourceVersion

    def watch(self, kind: str, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        from tenantnet.kube import api

        # From "0" (any version, served by the API server's watch cache at once), not from
        # the list's revision: an API server whose etcd cannot be asked for progress (etcd
        # before 3.5.13, the lab's) keeps a kind's watch cache at that kind's last change and
        # refuses a newer revision ("Too large resource version") until the kind changes
        # again. The cache's objects come again as ADDED: the watcher writes only changes.
        for event, obj in self.client.watch(
            self.resources[kind],
            fields=self._fields(kind),
            resource_version="0",
            server_timeout=api.WATCH_SECONDS,
        ):
            yield event, api.as_dict(obj)

    def annotate_node(self, name: str, key: str, value: str) -> None:
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        self.client.patch(Node, name, {"metadata": {"annotations": {key: value}}}, patch_type=PatchType.MERGE)


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name", ""))


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


class NodeWatch:
    """The cache's writer: started by the agent when the node config says `kubernetes: true`."""

    def __init__(
        self,
        node: NodeConfig,
        log: Any,
        source_factory: Callable[[], Source] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.node = node
        self.log = log
        # its Node: nodeName, else what the DaemonSet passes (spec.nodeName: a host's name need not be
        # its node's), else the host name
        self.node_name = node_name_of(node)
        self.cache = kubecache.CacheWriter(node.state_dir)
        self._source_factory = source_factory or (lambda: LightkubeSource(node.kubeconfig, self.node_name))
        self._sleep = sleep
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._listed: set[str] = set()
        self._node_labels: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self._written: dict[tuple[str, str], dict[str, Any]] = {}  # what the cache holds, to skip rewrites
        self.events = 0
        self.lists = 0
        self._announced = False
        self.last_error = ""
        self.published_pfs: str | None = None  # the annotation's value, as last seen or patched

    def start(self) -> None:
        source = self._source_factory()
        for kind in KINDS:
            t = threading.Thread(
                target=self._run, args=(source, kind), name=f"tenantnet-kube-{kind}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        # A watch in progress ends with its stream (the server closes it within WATCH_SECONDS);
        # the threads are daemons, so the agent's exit does not wait for them.
        self._stop.set()

    def report(self) -> dict[str, Any]:
        """For `tenantnetctl agent status`: whether the cache is complete, and what went wrong last."""
        with self._lock:
            return {"synced": self._listed >= set(KINDS), "lists": self.lists, "events": self.events,
                    "lastError": self.last_error or None,
                    "pfs": json.loads(self.published_pfs) if self.published_pfs else None}

    def synced(self) -> bool:
        with self._lock:
            return self._listed >= set(KINDS)

    def _run(self, source: Source, kind: str) -> None:
        delay = BACKOFF_FIRST
        while not self._stop.is_set():
            try:
                items, version = source.list(kind)
                self._replace(kind, items)
                if kind == "node" and items:
                    self._publish(source, items[0])
                delay = BACKOFF_FIRST
                for event, obj in source.watch(kind, version):
                    if self._stop.is_set():
                        return
                    self._apply(kind, event, obj)
                    if kind == "node" and event != "DELETED":
                        self._publish(source, obj)
                # The stream ended without error: list again (what changed in between is in it).
            except Exception as exc:  # the API unreachable, a 410, a refusal: keep the cache, retry
                self.last_error = f"{kind}: {type(exc).__name__}: {exc}"[:500]
                self.log.warning(
                    "kube.watch_failed",
                    kind=kind,
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    retry_in=round(delay, 2),
                )
                self._sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, BACKOFF_MAX)

    def _publish(self, source: Source, node: dict[str, Any]) -> None:
        """Patch the Node's `tenantnet.io/pfs` when it differs from what sysfs shows now.
        Its failure (no RBAC, the API away) is logged, never fatal: the annotation is advisory."""
        want = json.dumps(discover_pfs(self.node.sysfs_root), separators=(",", ":"))
        have = ((node.get("metadata") or {}).get("annotations") or {}).get(PFS_ANNOTATION)
        if have == want:
            self.published_pfs = want
            return
        try:
            source.annotate_node(self.node_name, PFS_ANNOTATION, want)
        except Exception as exc:
            self.last_error = f"publishing PFs: {type(exc).__name__}: {exc}"[:500]
            self.log.warning("kube.publish_pfs_failed", node=self.node_name, error=self.last_error)
            return
        self.published_pfs = want
        self.log.info("kube.published_pfs", node=self.node_name, pfs=json.loads(want))

    def _doc(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        if kind == "namespaces":
            return kubecache.namespace_doc(_name(obj), _labels(obj))
        return kubecache.tenant_network_doc(obj)

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self._lock:
            if kind == "node":
                self._node_labels = _labels(items[0]) if items else {}
            else:
                docs = {_name(o): self._doc(kind, o) for o in items}
                for name in self.cache.names(kind) - set(docs):
                    self._drop(kind, name)
                for name, doc in docs.items():
                    self._put(kind, name, doc)
            self._listed.add(kind)
            self.lists += 1
            self._mark()

    def _apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self.events += 1
            if kind == "node":
                if event != "DELETED":
                    self._node_labels = _labels(obj)
                    self._mark()
                return
            if event == "DELETED":
                self._drop(kind, _name(obj))
            elif event in ("ADDED", "MODIFIED"):
                self._put(kind, _name(obj), self._doc(kind, obj))
            self._mark()

    def _put(self, kind: str, name: str, doc: dict[str, Any]) -> None:
        if self._written.get((kind, name)) != doc:
            self.cache.put(kind, name, doc)
            self._written[(kind, name)] = doc

    def _drop(self, kind: str, name: str) -> None:
        self.cache.drop(kind, name)
        self._written.pop((kind, name), None)

    def _mark(self) -> None:
        if self._listed >= set(KINDS):
            self.cache.mark_synced(time.time(), self.node_name, self._node_labels)
            if not self._announced:
                self._announced = True
                self.log.info("kube.synced", node=self.node_name, lists=self.lists)
