"""Pre-warm's cluster side without a cluster: how long a pod's ADD gives an etcd that does
not answer, the order of greeting and publishing, and the heartbeat's `sync_remote` doing
what an ADD or DEL could not (publish a missing key, greeting from it first; remove a key
no record backs). With a real etcd and the lab: tests/integration/test_prewarm.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tenantnet.plugin.drivers import prewarm
from tenantnet.plugin.drivers.ovs import OvsPlan
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import PHASE_READY, AttachmentRecord, RecordStore
from tests.polling import poll
from tests.silentpeer import SilentEtcd

BASE = "/tn/prewarm/"
ME = "node1"


@pytest.fixture
def silent() -> Iterator[SilentEtcd]:
    server = SilentEtcd()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _fresh_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prewarm, "_cluster_failed_at", {})


def _record(name: str, state: str, mac: str, *, vlan: int | None = 100, network: str = "rail",
            trunks: list[int] | None = None) -> AttachmentRecord:
    return AttachmentRecord(
        network=network, container_id=name, ifname="net1", mode="ovs", netns=f"/run/netns/{name}",
        phase=PHASE_READY,
        plan=OvsPlan(host_ifname=f"tn{name}", bridge="br0", vlan=vlan, trunks=trunks or [], prewarm=state),
        result={"interfaces": [{"name": "net1", "mac": mac, "sandbox": f"/run/netns/{name}"}]})


def _end(record: AttachmentRecord) -> prewarm.End:
    mac = record.result["interfaces"][0]["mac"] if record.result else ""
    return prewarm.End(1, "tnx", 3, mac, record.netns, "net1", False)


# ---- the pod's path against an etcd that does not answer ------------------------------------
def test_an_add_waits_at_most_cluster_wait_and_then_leaves_the_store_to_the_heartbeat(
        silent: SilentEtcd, tmp_path: Path) -> None:
    # etcdTimeout at its largest, so that "gave up after CLUSTER_WAIT, not etcdTimeout" is
    # told apart by a factor of 60, whatever else the machine is doing (the figure is printed;
    # bounds on time belong to `make bench`).
    node = NodeConfig(state_dir=str(tmp_path), etcd_endpoints=(f"http://127.0.0.1:{silent.port}",),
                      node_name=ME, etcd_timeout=30.0)
    record = _record("a", prewarm.PENDING, "0a:58:0a:00:00:01")
    started = time.monotonic()
    assert prewarm._publish_and_greet(node, record, _end(record)) == 0
    first = time.monotonic() - started
    print(f"\npre-warm's cluster step with etcd not answering: {first * 1000:.0f} ms "
          f"(CLUSTER_WAIT {prewarm.CLUSTER_WAIT:g} s, etcdTimeout {node.etcd_timeout:g} s)")
    assert silent.held, "no connection was made: this test shows nothing"
    assert first < node.etcd_timeout, "the ADD waited for etcdTimeout, not CLUSTER_WAIT"
    # The next ADD and a DEL, within CLUSTER_RETRY_AFTER: no connection at all.
    connections = len(silent.held)
    assert prewarm._publish_and_greet(node, _record("b", prewarm.PENDING, "0a:58:0a:00:00:02"), _end(record)) == 0
    prewarm._unpublish(node, record)
    time.sleep(0.05)
    assert len(silent.held) == connections
    # Once CLUSTER_RETRY_AFTER has passed, a pod's call tries the store again (and waits as little).
    prewarm._cluster_failed_at.update({k: v - prewarm.CLUSTER_RETRY_AFTER for k, v in
                                       prewarm._cluster_failed_at.items()})
    started = time.monotonic()
    prewarm._unpublish(node, record)
    assert time.monotonic() - started < node.etcd_timeout
    assert poll(lambda: len(silent.held) >= connections + 1, timeout=10)


def test_the_heartbeat_keeps_the_nodes_etcd_timeout(silent: SilentEtcd, tmp_path: Path) -> None:
    node = NodeConfig(state_dir=str(tmp_path), etcd_endpoints=(f"http://127.0.0.1:{silent.port}",),
                      node_name=ME, etcd_timeout=1.0)
    store, short = prewarm._cluster(node), prewarm._cluster(node, prewarm.CLUSTER_WAIT)
    assert store is not None and short is not None
    assert (store.etcd.config.timeout, short.etcd.config.timeout) == (1.0, prewarm.CLUSTER_WAIT)
    quick = NodeConfig(state_dir=str(tmp_path), etcd_endpoints=node.etcd_endpoints, node_name=ME, etcd_timeout=0.2)
    shortest = prewarm._cluster(quick, prewarm.CLUSTER_WAIT)
    assert shortest is not None and shortest.etcd.config.timeout == 0.2  # a shorter etcdTimeout stays


# ---- with a scripted store -------------------------------------------------------------------
@dataclass
class KV:
    key: str
    value: bytes


@dataclass
class FakeEtcd:
    """The calls pre-warm makes, on a dict; `fail` names calls that raise."""

    data: dict[str, bytes] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)
    config: object = field(default_factory=object)

    def _call(self, name: str, key: str) -> None:
        self.calls.append((name, key))
        if name in self.fail:
            raise OSError(f"etcd {name} failed")

    def range(self, prefix: str) -> list[KV]:
        self._call("range", prefix)
        return [KV(k, v) for k, v in sorted(self.data.items()) if k.startswith(prefix)]

    def put(self, key: str, value: bytes) -> None:
        self._call("put", key)
        self.data[key] = value

    def delete(self, key: str) -> None:
        self._call("delete", key)
        self.data.pop(key, None)


@pytest.fixture
def etcd(monkeypatch: pytest.MonkeyPatch) -> FakeEtcd:
    fake = FakeEtcd()
    store = prewarm.ClusterStore(fake, ME, BASE)
    monkeypatch.setattr(prewarm, "_cluster", lambda node, wait=None: store)
    return fake


@pytest.fixture
def frames(monkeypatch: pytest.MonkeyPatch, etcd: FakeEtcd) -> list[tuple[str, str]]:
    """(source MAC, destination MAC) of every frame sent; also noted in etcd.calls, in order."""
    sent: list[tuple[str, str]] = []

    def send(src: prewarm.End, dst: prewarm.End) -> None:
        sent.append((src.mac, dst.mac))
        etcd.calls.append(("frame", dst.mac))

    monkeypatch.setattr(prewarm, "_send", send)
    return sent


def _remote(etcd: FakeEtcd, node: str, name: str, mac: str, vlan: int = 100, network: str = "rail") -> str:
    key = f"{BASE}{network}/{node}/{name}/net1"
    etcd.data[key] = json.dumps({"mac": mac, "vlan": vlan}).encode()
    return key


def test_an_add_greets_the_remote_peers_before_it_publishes(etcd: FakeEtcd, frames: list, tmp_path: Path) -> None:
    node = NodeConfig(state_dir=str(tmp_path))
    _remote(etcd, "node2", "x", "0a:58:0a:00:01:01")
    _remote(etcd, "node2", "y", "0a:58:0a:00:01:02", vlan=200)  # another VLAN: not a peer
    record = _record("a", prewarm.PENDING, "0a:58:0a:00:00:01")
    assert prewarm._publish_and_greet(node, record, _end(record)) == 1
    mine = f"{BASE}rail/{ME}/a/net1"
    # A key in the store means its pod has greeted: the heartbeat relies on it.
    assert etcd.calls == [("range", f"{BASE}rail/"), ("frame", "0a:58:0a:00:01:01"), ("put", mine)]
    assert json.loads(etcd.data[mine]) == {"mac": "0a:58:0a:00:00:01", "vlan": 100}


def test_a_failed_put_is_left_to_the_heartbeat(etcd: FakeEtcd, frames: list, tmp_path: Path) -> None:
    node = NodeConfig(state_dir=str(tmp_path))
    _remote(etcd, "node2", "x", "0a:58:0a:00:01:01")
    etcd.fail = {"put"}
    record = _record("a", prewarm.PENDING, "0a:58:0a:00:00:01")
    assert prewarm._publish_and_greet(node, record, _end(record)) == 1  # greeted all the same
    assert f"{BASE}rail/{ME}/a/net1" not in etcd.data
    calls = len(etcd.calls)
    assert prewarm._publish_and_greet(node, record, _end(record)) == 0  # deferred: not asked again
    assert len(etcd.calls) == calls


def test_the_heartbeat_publishes_what_an_add_could_not_and_removes_what_a_del_could_not(
        etcd: FakeEtcd, frames: list, tmp_path: Path) -> None:
    node = NodeConfig(state_dir=str(tmp_path))
    store = RecordStore(str(tmp_path), lambda mode: OvsPlan)
    published = _record("pub", prewarm.WARM, "0a:58:0a:00:00:01")        # its ADD published it
    missed = _record("miss", prewarm.REMOTE_ONLY, "0a:58:0a:00:00:02")   # its ADD could not
    others = [_record("fail", prewarm.FAILED, "0a:58:0a:00:00:03"),       # OVS failed: no publish at ADD
              _record("trunk", prewarm.TRUNK, "0a:58:0a:00:00:04", trunks=[100]),  # never pre-warmed
              _record("going", prewarm.REMOVING, "0a:58:0a:00:00:05"),    # its DEL has begun
              _record("adding", prewarm.PENDING, "0a:58:0a:00:00:06")]    # its ADD is on it
    for r in (published, missed, *others):
        store.save(r)
    _remote(etcd, ME, "pub", "0a:58:0a:00:00:01")
    going = _remote(etcd, ME, "going", "0a:58:0a:00:00:05")  # backed by a record still: kept
    ghost = _remote(etcd, ME, "ghost", "0a:58:0a:00:00:07")  # a DEL that could not reach the store
    old = _remote(etcd, "node2", "old", "0a:58:0a:00:01:01")  # greeted by an earlier beat
    new = _remote(etcd, "node2", "new", "0a:58:0a:00:01:02")
    _remote(etcd, "node2", "v200", "0a:58:0a:00:01:03", vlan=200)

    greeted = prewarm.sync_remote(node, {old}, lambda mode: OvsPlan)
    assert greeted == {old, new, f"{BASE}rail/node2/v200/net1"}
    assert sorted(frames) == sorted([
        ("0a:58:0a:00:00:01", "0a:58:0a:00:01:02"),  # published: the new peer only
        ("0a:58:0a:00:00:02", "0a:58:0a:00:01:01"),  # missed: every peer, as its ADD would have
        ("0a:58:0a:00:00:02", "0a:58:0a:00:01:02")])
    puts = [k for c, k in etcd.calls if c == "put"]
    assert puts == [f"{BASE}rail/{ME}/miss/net1"]
    assert json.loads(etcd.data[puts[0]]) == {"mac": "0a:58:0a:00:00:02", "vlan": 100}
    # The put after its pod's frames (a key in the store means its pod has greeted).
    assert etcd.calls.index(("put", puts[0])) > etcd.calls.index(("frame", "0a:58:0a:00:01:01"))
    assert [k for c, k in etcd.calls if c == "delete"] == [ghost] and going in etcd.data

    # The next beat: nothing new, nothing missing, nothing stale.
    etcd.calls.clear()
    frames.clear()
    assert prewarm.sync_remote(node, greeted, lambda mode: OvsPlan) == greeted
    assert frames == [] and [c for c, _ in etcd.calls] == ["range"]


def test_nothing_is_published_without_a_cluster_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = NodeConfig(state_dir=str(tmp_path))
    sent: list[Any] = []
    monkeypatch.setattr(prewarm, "_send", lambda *a: sent.append(a))
    record = _record("a", prewarm.PENDING, "0a:58:0a:00:00:01")
    assert prewarm._publish_and_greet(node, record, _end(record)) == 0
    assert prewarm.sync_remote(node, {"x"}, lambda mode: OvsPlan) == {"x"} and sent == []
