"""Mode `ovs` asks OVSDB whether the bridge exists before it makes anything, but not again
for a bridge the same process found moments ago (tenantnet/plugin/drivers/ovs.py)."""

from __future__ import annotations

import pytest

from tenantnet.plugin.drivers import ovs


class CountingDb:
    endpoint = "unix:/run/test/db.sock"

    def __init__(self, bridges: set[str]) -> None:
        self.bridges = bridges
        self.asked: list[str] = []

    def bridge_exists(self, bridge: str) -> bool:
        self.asked.append(bridge)
        return bridge in self.bridges


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ovs, "_bridges_seen", {})


def test_a_bridge_found_is_not_asked_for_again_until_the_time_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(ovs.time, "monotonic", lambda: now[0])
    db = CountingDb({"br-rail1"})
    assert ovs._bridge_seen(db, "br-rail1")  # type: ignore[arg-type]
    now[0] += ovs.BRIDGE_SEEN_FOR - 0.01
    assert ovs._bridge_seen(db, "br-rail1")  # type: ignore[arg-type]
    assert db.asked == ["br-rail1"]
    now[0] += 0.02
    db.bridges.clear()  # gone since: asked again, and refused
    assert not ovs._bridge_seen(db, "br-rail1")  # type: ignore[arg-type]
    assert not ovs._bridge_seen(db, "br-rail1")  # type: ignore[arg-type]
    assert db.asked == ["br-rail1"] * 3


def test_a_missing_bridge_is_asked_every_time_and_endpoints_are_apart() -> None:
    db, other = CountingDb(set()), CountingDb({"br-x"})
    other.endpoint = "tcp:127.0.0.1:6640"
    assert not ovs._bridge_seen(db, "br-x")  # type: ignore[arg-type]
    assert ovs._bridge_seen(other, "br-x")  # type: ignore[arg-type]
    assert not ovs._bridge_seen(db, "br-x")  # type: ignore[arg-type]
    assert db.asked == ["br-x", "br-x"] and other.asked == ["br-x"]
