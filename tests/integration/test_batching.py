"""Concurrent requests share the kernel's and OVS's slow steps (issue 16): host link
deletions become one unregistration (one RCU wait for all), and OVSDB changes made while a
transaction is in flight commit together (one vswitchd reconfiguration for all)."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tenantnet.plugin.system import netlink, ovsdb, rtnl


@pytest.fixture
def veths() -> Iterator[Any]:
    """make(n) → n veth host ends named tnb<rand><i>, their peers in a private netns."""
    ns = f"tnbt-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    made: list[str] = []

    def make(n: int) -> list[str]:
        tag = uuid.uuid4().hex[:6]
        names = [f"tnb{tag}{i:02d}" for i in range(n)]
        for i, name in enumerate(names):
            subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", f"p{tag}{i}",
                            "netns", ns], check=True)
            made.append(name)
        return names

    try:
        yield make
    finally:
        for name in made:
            subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "delete", ns], check=False)


def _present(name: str) -> bool:
    return rtnl.Rtnl().link(name) is not None


def _delete_concurrently(names: list[str]) -> tuple[float, list[bool]]:
    results: dict[str, bool] = {}
    barrier = threading.Barrier(len(names))

    def one(name: str) -> None:
        barrier.wait()
        results[name] = netlink.delete_host_link(name)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, [results[n] for n in names]


def test_concurrent_link_deletions_pay_one_wait(veths: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve deletions at once: the first runs alone as a plain RTM_DELLINK, the eleven that
    arrive meanwhile go into one link group deleted with one RTM_DELLINK — two unregistrations
    (two RCU waits) where one after the other pays twelve. Counted, not timed: the time that
    saves is a figure of `make bench` (bench/bench_batching.py)."""
    together = veths(12)
    queue = netlink._reaper._deletions
    plain: list[str] = []
    grouped: list[str] = []
    group_deletions: list[int] = []
    real_delete_link, real_set_group, real_delete_group = (
        rtnl.Rtnl.delete_link, rtnl.Rtnl.set_group, rtnl.Rtnl.delete_group)

    def delete_link(self: rtnl.Rtnl, name: str) -> bool:
        plain.append(name)
        if len(plain) == 1:
            # The first deletion stays under way until the eleven others have queued behind
            # it, as they do during its RCU wait on an idle machine (on a loaded one the
            # threads may come later: then the test would show nothing). 60 s: only if they
            # never do.
            deadline = time.monotonic() + 60
            while len(queue._queued) < 11 and time.monotonic() < deadline:
                time.sleep(0.005)
        return real_delete_link(self, name)

    def set_group(self: rtnl.Rtnl, name: str, group: int) -> bool:
        grouped.append(name)
        return real_set_group(self, name, group)

    def delete_group(self: rtnl.Rtnl, group: int) -> None:
        group_deletions.append(group)
        real_delete_group(self, group)

    monkeypatch.setattr(rtnl.Rtnl, "delete_link", delete_link)
    monkeypatch.setattr(rtnl.Rtnl, "set_group", set_group)
    monkeypatch.setattr(rtnl.Rtnl, "delete_group", delete_group)
    _, results = _delete_concurrently(together)
    assert results == [True] * 12
    assert not any(_present(n) for n in together)
    # Two RTM_DELLINKs for twelve links: one plain, one of a group holding the eleven others.
    assert len(plain) == 1 and len(group_deletions) == 1, (plain, group_deletions)
    assert sorted(plain + grouped) == sorted(together)


def test_batched_deletion_touches_only_its_own_links(veths: Any) -> None:
    bystander, foreign_group = veths(2)
    # Another tool's link in a link group of its own, and one in the default group.
    subprocess.run(["ip", "link", "set", foreign_group, "group", "77"], check=True)
    targets = veths(8)
    missing = [f"tnbgone{i}" for i in range(3)]  # DEL of links already gone: False, no error
    _, results = _delete_concurrently(targets + missing)
    assert results == [True] * 8 + [False] * 3
    assert _present(bystander) and _present(foreign_group)
    assert not any(_present(n) for n in targets)


def test_a_lone_deletion_is_a_plain_one(veths: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (name,) = veths(1)
    grouped: list[int] = []
    monkeypatch.setattr(rtnl.Rtnl, "delete_group", lambda self, g: grouped.append(g))
    assert netlink.delete_host_link(name) is True
    assert not _present(name) and grouped == []
    assert netlink.delete_host_link(name) is False  # DEL repeated


def test_concurrent_port_changes_commit_together(lab: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    db = ovsdb.connect(lab.ovsdb)
    sizes: list[int] = []  # per write transaction: the rows it inserts
    real = ovsdb.Ovsdb._rpc_ops

    def counted(self: ovsdb.Ovsdb, what: str, ops: list[Any]) -> Any:
        inserts = sum(op["op"] == "insert" for op in ops)
        if inserts:
            sizes.append(inserts)
            time.sleep(0.02)  # a slow round trip: the others arrive while this one is in flight
        return real(self, what, ops)

    monkeypatch.setattr(ovsdb.Ovsdb, "_rpc_ops", counted)
    tag = uuid.uuid4().hex[:6]
    names = [f"tng{tag}{i:02d}" for i in range(12)]
    barrier = threading.Barrier(len(names))
    errors: list[BaseException] = []

    def add(i: int, name: str) -> None:
        barrier.wait()
        try:
            db.add_port(ovsdb.PortSpec(bridge=lab.bridge, name=name, tag=100 + i,
                                       external_ids={"tenantnet-network": "batch"}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i, n)) for i, n in enumerate(names)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        # Two rows per port (Port, Interface); fewer transactions than ports, one carrying many.
        assert sum(sizes) == 2 * len(names) and len(sizes) < len(names) and max(sizes) >= 6, sizes
        for i, name in enumerate(names):
            state = db.port(name)
            assert state is not None and state.owned and state.tag == 100 + i and state.bridge == lab.bridge
    finally:
        monkeypatch.setattr(ovsdb.Ovsdb, "_rpc_ops", real)
        for name in names:
            db.delete_port(name)
    assert all(db.port(n) is None for n in names)


def test_a_refused_change_fails_only_its_own_caller(lab: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group with a port that is not ours: its delete is refused, the others' go through."""
    db = ovsdb.connect(lab.ovsdb)
    tag = uuid.uuid4().hex[:6]
    foreign = f"tnf{tag}"
    lab.vsctl("add-port", lab.bridge, foreign)  # an operator's port: no ownership tag
    ours = [f"tno{tag}{i}" for i in range(6)]
    for name in ours:
        db.add_port(ovsdb.PortSpec(bridge=lab.bridge, name=name))
    real = ovsdb.Ovsdb._rpc_ops
    sizes: list[int] = []  # per write transaction: the rows it deletes

    def slow(self: ovsdb.Ovsdb, what: str, ops: list[Any]) -> Any:
        deletes = sum(op["op"] == "delete" and op["table"] == "Port" for op in ops)
        if deletes:
            sizes.append(deletes)
            time.sleep(0.02)
        return real(self, what, ops)

    monkeypatch.setattr(ovsdb.Ovsdb, "_rpc_ops", slow)
    outcome: dict[str, Any] = {}
    barrier = threading.Barrier(len(ours) + 1)

    def delete(name: str) -> None:
        barrier.wait()
        try:
            outcome[name] = db.delete_port(name)
        except ovsdb.OvsdbFailure as exc:
            outcome[name] = exc

    threads = [threading.Thread(target=delete, args=(n,)) for n in [*ours, foreign]]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert max(sizes) > 1, sizes  # they did meet in one transaction first
        assert all(outcome[n] is True for n in ours), outcome
        assert isinstance(outcome[foreign], ovsdb.OvsdbFailure) and "not owned" in str(outcome[foreign])
        assert foreign in lab.vsctl("list-ports", lab.bridge).split()
        assert not set(ours) & set(lab.vsctl("list-ports", lab.bridge).split())
    finally:
        monkeypatch.setattr(ovsdb.Ovsdb, "_rpc_ops", real)
        lab.vsctl("--if-exists", "del-port", foreign)
        for name in ours:
            db.delete_port(name)


def test_a_write_failing_inside_a_group_fails_alone(lab: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction of several writes fails as a whole when one of them fails in it (here:
    the port it guards does not exist); the others are then committed one by one."""
    db = ovsdb.connect(lab.ovsdb)
    tag = uuid.uuid4().hex[:6]
    present = f"tnt{tag}"
    db.add_port(ovsdb.PortSpec(bridge=lab.bridge, name=present))
    real = ovsdb.Ovsdb._rpc_ops
    grouped: list[str] = []

    def slow(self: ovsdb.Ovsdb, what: str, ops: list[Any]) -> Any:
        if any(op["op"] == "update" for op in ops):
            grouped.append(what)
            time.sleep(0.02)
        return real(self, what, ops)

    monkeypatch.setattr(ovsdb.Ovsdb, "_rpc_ops", slow)
    outcome: dict[str, Any] = {}
    barrier = threading.Barrier(3)

    def retag(name: str, vlan: int) -> None:
        barrier.wait()
        time.sleep(0.005 if name == present else 0)
        try:
            db.set_port_tag(name, vlan)
            outcome[name] = True
        except ovsdb.OvsdbFailure as exc:
            outcome[name] = exc

    names = [f"tnmissing{tag}", present, f"tnmissing2{tag}"]
    threads = [threading.Thread(target=retag, args=(n, 40 + i)) for i, n in enumerate(names)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert any(w.endswith("port changes") for w in grouped), grouped  # they met in one
        assert outcome[present] is True and lab.vsctl("get", "Port", present, "tag").strip() == "41"
        for missing in (names[0], names[2]):
            assert isinstance(outcome[missing], ovsdb.OvsdbFailure) and "no such port" in str(outcome[missing])
    finally:
        monkeypatch.setattr(ovsdb.Ovsdb, "_rpc_ops", real)
        db.delete_port(present)
