"""The agent's watcher (tenantnet/kube/watch.py) against a scripted API: the cache it writes,
what an outage leaves, and that the ADD path reads what it wrote. The real API server is
tests/e2e/test_tenantnetworks_kube.py."""

from __future__ import annotations

import threading
from dataclasses import replace

from tenantnet.kube.watch import BACKOFF_MAX, NodeWatch, Source
from tenantnet.plugin import kubecache
from tenantnet.plugin.nodeconfig import NodeConfig
from tests.polling import poll

TN = {"metadata": {"name": "rail-1", "uid": "u", "managedFields": [{"x": 1}]}, "spec": {
    "tenants": ["team-a"], "fabric": {"mode": "ovs", "bridge": "br"}, "vlan": 100,
    "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}]]}}}


def ns(name, **labels):
    return {"metadata": {"name": name, "labels": labels}}


class Log:
    def __init__(self):
        self.lines = []

    def info(self, event, **kw):
        self.lines.append((event, kw))

    def warning(self, event, **kw):
        self.lines.append((event, kw))


class ScriptedApi(Source):
    """Lists from `objects`; a watch yields what `push` queues, fails while `down`."""

    def __init__(self):
        self.objects = {"tenantnetworks": [TN], "namespaces": [ns("team-a", **{"tenantnet.io/tenant": "team-a"})],
                        "node": [{"metadata": {"name": "n1", "labels": {"rack": "r1"}}}]}
        self.down = False
        self.events = {k: [] for k in self.objects}
        self.cond = threading.Condition()
        self.lists = 0
        self.annotations = []

    def annotate_node(self, name, key, value):
        self.annotations.append((name, key, value))

    def list(self, kind):
        if self.down:
            raise ConnectionRefusedError("API server unreachable")
        self.lists += 1
        return list(self.objects[kind]), "1"

    def watch(self, kind, resource_version):
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.events[kind] or self.down, timeout=0.2)
                if self.down:
                    raise ConnectionResetError("watch stream broken")
                while self.events[kind]:
                    yield self.events[kind].pop(0)

    def push(self, kind, event, obj):
        with self.cond:
            self.events[kind].append((event, obj))
            self.cond.notify_all()


def start(tmp_path, api, sleeps=None, sysfs_root=None):
    node = replace(NodeConfig(), kubernetes=True, state_dir=str(tmp_path), node_name="n1",
                   sysfs_root=str(sysfs_root or tmp_path / "no-sysfs"))
    asked = sleeps if sleeps is not None else []

    def sleep(seconds):  # the backoff asked for is recorded; the test waits 10 ms instead
        asked.append(seconds)
        threading.Event().wait(0.01)

    w = NodeWatch(node, Log(), source_factory=lambda: api, sleep=sleep)
    w.start()
    return w


def test_lists_then_watches_into_the_cache(tmp_path):
    api = ScriptedApi()
    w = start(tmp_path, api)
    try:
        assert poll(lambda: kubecache.read_sync(str(tmp_path)) is not None, 30), "the cache to be synced"
        sync = kubecache.read_sync(str(tmp_path))
        assert (sync.node_name, sync.node_labels) == ("n1", {"rack": "r1"})
        cached = kubecache.read_object(str(tmp_path), "tenantnetworks", "rail-1")
        assert cached["spec"] == TN["spec"] and "managedFields" not in cached["metadata"]
        assert kubecache.read_object(str(tmp_path), "namespaces", "team-a")["labels"] == {"tenantnet.io/tenant": "team-a"}
        api.push("namespaces", "ADDED", ns("team-b", **{"tenantnet.io/tenant": "team-b"}))
        api.push("tenantnetworks", "DELETED", TN)
        assert poll(lambda: kubecache.read_object(str(tmp_path), "tenantnetworks", "rail-1") is None, 30), "the deletion"
        assert poll(lambda: kubecache.read_object(str(tmp_path), "namespaces", "team-b") is not None, 30), "team-b"
        api.push("node", "MODIFIED", {"metadata": {"name": "n1", "labels": {"rack": "r2"}}})
        assert poll(lambda: kubecache.read_sync(str(tmp_path)).node_labels == {"rack": "r2"}, 30), "the node's labels"
    finally:
        w.stop()


def test_an_outage_keeps_the_last_synced_state_and_backs_off(tmp_path):
    api = ScriptedApi()
    sleeps: list[float] = []
    w = start(tmp_path, api, sleeps)
    try:
        assert poll(lambda: kubecache.read_sync(str(tmp_path)) is not None, 30), "the cache to be synced"
        with api.cond:
            api.down = True
            api.cond.notify_all()
        assert poll(lambda: len(sleeps) >= 12, 30), "retries while the API is down"
        # Nothing was removed: running pods' networks stay known.
        assert kubecache.read_object(str(tmp_path), "tenantnetworks", "rail-1") is not None
        assert kubecache.read_object(str(tmp_path), "namespaces", "team-a") is not None
        per_kind = sorted(sleeps)
        assert per_kind[-1] > per_kind[0] * 3 and max(sleeps) <= BACKOFF_MAX * 1.2  # grows, bounded
        assert any(e == "kube.watch_failed" and "unreachable" in kw["error"] for e, kw in w.log.lines)
        report = w.report()  # what `tenantnetctl agent status` shows
        assert report["synced"] and "ConnectionRefusedError: API server unreachable" in report["lastError"]
        # Deleted during the outage: the relist after it removes it.
        api.objects["tenantnetworks"] = []
        with api.cond:
            api.down = False
            api.cond.notify_all()
        assert poll(lambda: kubecache.read_object(str(tmp_path), "tenantnetworks", "rail-1") is None, 60), \
            "the relist after the outage"
    finally:
        w.stop()


def test_the_node_s_pfs_are_published_on_its_node(tmp_path):
    from tenantnet.kube.watch import discover_pfs
    from tenantnet.lab import nicsysfs

    root = tmp_path / "sys"
    nicsysfs.write_tree(root, [nicsysfs.connectx_pf("ens1f0", vfs=2), nicsysfs.e810_pf("ens2f0", vfs=1)])
    # the PFs' own netdevs only: their VFs' netdevs are no PFs
    assert discover_pfs(str(root)) == [{"name": "ens1f0", "pci": "0000:3b:00.0"},
                                       {"name": "ens2f0", "pci": "0000:5e:00.0"}]
    assert discover_pfs(str(tmp_path / "nothing")) == []
    api = ScriptedApi()
    w = start(tmp_path / "state", api, sysfs_root=root)
    want = '[{"name":"ens1f0","pci":"0000:3b:00.0"},{"name":"ens2f0","pci":"0000:5e:00.0"}]'
    try:
        assert poll(lambda: api.annotations == [("n1", "tenantnet.io/pfs", want)], 30), api.annotations
        # Its own patch comes back as an event: the annotation is as wanted, no second patch.
        node = {"metadata": {"name": "n1", "labels": {"rack": "r1"}, "annotations": {"tenantnet.io/pfs": want}}}
        api.push("node", "MODIFIED", node)
        assert poll(lambda: w.events >= 1, 30)
        assert len(api.annotations) == 1 and w.report()["pfs"][0]["name"] == "ens1f0"
        # Someone else's edit of it is put back.
        api.push("node", "MODIFIED", {"metadata": {**node["metadata"], "annotations": {"tenantnet.io/pfs": "[]"}}})
        assert poll(lambda: len(api.annotations) == 2, 30) and api.annotations[1][2] == want
    finally:
        w.stop()
