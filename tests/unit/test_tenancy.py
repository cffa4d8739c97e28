"""Tenancy policy parsing and decisions (no root)."""

from __future__ import annotations

import pytest

from cni.errors import CniError
from tenantnet.config import NodeConfig
from tenantnet.tenancy import decide, load, parse_policy

POLICY = {"tenants": {
    "a": {"namespaces": ["team-a", "team-a-*"], "networks": {"rail": {"vlans": [100, "110-112"]}},
          "sriov": {"spoofchk": "required", "trust": "forbidden"}},
    "wide": {"namespaces": ["team-*"], "networks": {"rail": {"vlans": ["300-301"], "default": 301}}},
}}


def test_namespace_resolution_exact_then_longest_glob():
    p = parse_policy(POLICY, "x")
    assert p.tenant_of("team-a").name == "a"
    assert p.tenant_of("team-a-batch").name == "a"
    assert p.tenant_of("team-z").name == "wide"
    assert p.tenant_of("kube-system") is None


def test_decisions():
    p = parse_policy(POLICY, "x")
    assert decide(p, "team-a", "p", "rail", {}, 111, ()).allowed
    assert not decide(p, "team-a", "p", "rail", {}, 113, ()).allowed
    assert "vlan 113" in decide(p, "team-a", "p", "rail", {}, 113, ()).reason
    assert decide(p, "team-z", "p", "rail", {"vlan": "tenant"}, None, ()).vlan == 301
    assert decide(p, "team-a", "p", "rail", {"vlan": "tenant"}, None, ()).vlan == 100  # lowest
    refused = decide(p, "team-a", "p", "rail", {"trust": "on"}, 100, ())
    assert not refused.allowed and "trust on" in refused.reason
    assert not decide(p, "team-a", "p", "rail", {}, 100, (100, 300)).allowed


@pytest.mark.parametrize("bad,needle", [
    ({"tenants": []}, "tenants"),
    ({"tenants": {"a": {"namespaces": []}}}, "tenants.a.namespaces"),
    ({"tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [5000]}}}}}, "tenants.a.networks.n.vlans"),
    ({"tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": ["9-3"]}}}}}, "'9-3'"),
    ({"tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [1], "default": 2}}}}}, "default"),
    ({"tenants": {"a": {"namespaces": ["x"], "sriov": {"trust": "maybe"}}}}, "tenants.a.sriov.trust"),
])
def test_invalid_policies_name_the_key(bad, needle):
    with pytest.raises(CniError) as err:
        parse_policy(bad, "node.yaml")
    assert err.value.code == 7 and needle in err.value.msg


def test_policy_file(tmp_path):
    f = tmp_path / "policy.yaml"
    f.write_text("tenancy:\n  tenants:\n    a: {namespaces: [a], networks: {n: {vlans: [7]}}}\n")
    policy = load(NodeConfig(tenancy_file=str(f)))
    assert policy is not None and policy.tenants[0].networks["n"].vlans == frozenset({7})
    assert load(NodeConfig()) is None
