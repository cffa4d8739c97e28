"""Overlay networks under a tenancy policy (docs/overlay.md, docs/tenancy.md): the admin
declares `overlay` and `rail`; each granted VLAN is a segment (a logical switch of its own),
held by one tenant; a NAD cannot turn a declared network into an overlay or the other way
round, nor pick another rail or a bridge."""

from __future__ import annotations

import pytest

from cni.errors import CniError, Code
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.settings import bind_fabric
from tenantnet.plugin.tenancy import parse_policy

NETWORKS = {"blue": {"overlay": "geneve", "rail": "rail1"}, "plain": {"bridge": "br-x"},
            "fast": {"overlay": "geneve", "pfs": ["ens1f0"]}}


def _policy(tenants: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    return parse_policy({"networks": NETWORKS, "tenants": tenants or {
        "a": {"namespaces": ["a"], "networks": {"blue": {"vlans": [10]}}},
        "b": {"namespaces": ["b"], "networks": {"blue": {"vlans": [20]}}}}}, "policy.yaml")


def test_overlay_declaration_and_its_modes() -> None:
    p = _policy()
    assert p.networks["blue"].overlay == "geneve" and p.networks["blue"].rail == "rail1"
    assert p.networks["blue"].modes() == ("ovs",)
    assert p.networks["fast"].modes() == ("ovs-offload",)


def test_one_segment_of_an_overlay_belongs_to_one_tenant() -> None:
    with pytest.raises(CniError) as err:
        _policy({"a": {"namespaces": ["a"], "networks": {"blue": {"vlans": [10]}}},
                 "b": {"namespaces": ["b"], "networks": {"blue": {"vlans": [10]}}}})
    assert "overlay network blue" in err.value.msg and "tenant a" in err.value.msg


@pytest.mark.parametrize("spec, field", [
    ({"overlay": "vxlan"}, "networks.n.overlay"),
    ({"overlay": "geneve", "bridge": "br-int"}, "networks.n.bridge"),
    ({"overlay": "geneve", "rail": "Rail 1"}, "networks.n.rail"),
    ({"bridge": "br-x", "rail": "rail1"}, "networks.n.rail"),
])
def test_bad_declarations_name_the_key(spec: dict[str, object], field: str) -> None:
    with pytest.raises(CniError) as err:
        parse_policy({"networks": {"n": spec}, "tenants": {}}, "policy.yaml")
    assert field in err.value.msg


def test_declaration_fills_overlay_and_rail() -> None:
    out = bind_fabric(_policy(), {"name": "blue", "type": "tenantnet", "vlan": 10}, NodeConfig())
    assert out["overlay"] == "geneve" and out["rail"] == "rail1" and "bridge" not in out


@pytest.mark.parametrize("nad, field", [
    ({"name": "blue", "rail": "rail0"}, "rail"),
    ({"name": "blue", "bridge": "br-int"}, "bridge"),
    ({"name": "blue", "socket_file": "/run/x.sock"}, "socket_file"),
    ({"name": "plain", "overlay": "geneve"}, "overlay"),
    ({"name": "fast", "pfs": ["ens9"]}, "pfs"),
])
def test_a_nad_cannot_move_a_declared_network(nad: dict[str, object], field: str) -> None:
    with pytest.raises(CniError) as err:
        bind_fabric(_policy(), {"type": "tenantnet", **nad}, NodeConfig())
    assert err.value.code == Code.TENANT_DENIED and f"{field}=" in err.value.msg
