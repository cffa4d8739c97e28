"""The agent's heartbeat loop (tenantnet/entry/heartbeat.py) without etcd: pre-warm's
`sync_remote` runs at every beat that reaches the store — so what an ADD or DEL could not
publish or remove during an outage is done at the first beat after it — and a beat whose
pre-warm step fails is retried at the next."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ipam.etcd import EtcdUnavailable
from tenantnet.entry.heartbeat import Heartbeat
from tenantnet.plugin.drivers import prewarm
from tenantnet.plugin.nodeconfig import NodeConfig


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append(("warning", event))

    def info(self, event: str, **fields: Any) -> None:
        self.events.append(("info", event))


class Liveness:
    """Fails its first `down` beats (etcd away), then succeeds."""

    def __init__(self, down: int) -> None:
        self.down, self.beats = down, 0
        self.node = type("Node", (), {"name": "node1"})()

    def beat(self) -> None:
        self.beats += 1
        if self.beats <= self.down:
            raise EtcdUnavailable("no etcd endpoint answered within 5 s")

    def stop(self) -> None:
        pass


class Publisher:
    def beat(self) -> None:
        pass


def test_prewarm_is_synced_at_the_first_beat_that_reaches_etcd_and_retried_after_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[set[str]] = []
    done = threading.Event()

    def sync(node: Any, greeted: set[str], plan_type: Any) -> set[str]:
        calls.append(set(greeted))
        if len(calls) == 2:
            raise EtcdUnavailable("the put of a missing key timed out")  # this beat's step fails
        if len(calls) >= 4:
            done.set()
        return greeted | {f"k{len(calls)}"}

    monkeypatch.setattr(prewarm, "sync_remote", sync)
    log = Log()
    beat = Heartbeat(NodeConfig(state_dir=str(tmp_path)), log)  # no etcd: nothing real is started
    liveness = Liveness(down=3)
    beat.liveness, beat.publisher, beat.interval = liveness, Publisher(), 0.01
    thread = threading.Thread(target=beat._run, daemon=True)
    thread.start()
    try:
        assert done.wait(5), f"pre-warm was synced {len(calls)} times"
    finally:
        beat._stop.set()
        thread.join(5)
    # Not while etcd was away (beats 1-3); at beat 4, the first that reached it, and every beat after.
    assert liveness.beats >= 3 + len(calls) and len(calls) >= 4
    # What a beat handled goes to the next; a failed step keeps the previous set and is retried.
    assert calls[:4] == [set(), {"k1"}, {"k1"}, {"k1", "k3"}]
    assert ("warning", "prewarm.sync_failed") in log.events
    assert log.events.index(("warning", "cluster.heartbeat_failed")) < log.events.index(
        ("info", "cluster.heartbeat_restored"))


def test_a_beat_waits_for_nothing_when_there_is_no_store(tmp_path: Path) -> None:
    beat = Heartbeat(NodeConfig(state_dir=str(tmp_path)), Log())
    beat.start()  # no etcd in the node config: no thread
    beat.stop()
    assert beat.liveness is None and beat._thread is None
