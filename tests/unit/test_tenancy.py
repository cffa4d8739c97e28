"""Tenancy policy parsing and decisions (no root)."""

from __future__ import annotations

import pytest

from cni.errors import CniError
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.tenancy import decide, load, parse_policy

POLICY = {"networks": {"rail": {"bridge": "br-rail"}}, "tenants": {
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


N = {"n": {"bridge": "br-n"}}


@pytest.mark.parametrize("bad,needle", [
    # the fabric is the admin's: every granted network is declared, each VLAN of a fabric
    # belongs to one tenant
    ({"tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [5]}}}}}, "network n is not declared"),
    ({"networks": {"n": {}}, "tenants": {}}, "networks.n"),
    ({"networks": {"n": {"bridge": "br/x"}}, "tenants": {}}, "networks.n.bridge"),
    ({"networks": {"n": {"pfs": "ens1"}}, "tenants": {}}, "networks.n.pfs"),
    ({"networks": {"n": {"bridge": "b", "switch": 1}}, "tenants": {}}, "networks.n"),
    ({"networks": N, "tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [5, 6]}}},
                                 "b": {"namespaces": ["y"], "networks": {"n": {"vlans": ["6-7"]}}}}},
     "VLAN 6 of bridge br-n"),
    ({"networks": {"n": {"bridge": "br-n"}, "m": {"bridge": "br-n"}},
      "tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [5]}}},
                  "b": {"namespaces": ["y"], "networks": {"m": {"vlans": [5]}}}}}, "already granted to tenant a"),
    ({"networks": {"n": {"pfs": ["ens1", "ens2"]}, "m": {"pfs": ["ens2"]}},
      "tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [0]}}},
                  "b": {"namespaces": ["y"], "networks": {"m": {"vlans": [0]}}}}}, "VLAN 0 of PF ens2"),
    ({"tenants": []}, "tenants"),
    ({"tenants": {"a": {"namespaces": []}}}, "tenants.a.namespaces"),
    ({"networks": N, "tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [5000]}}}}}, "tenants.a.networks.n.vlans"),
    ({"networks": N, "tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": ["9-3"]}}}}}, "'9-3'"),
    ({"networks": N, "tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [1], "default": 2}}}}}, "default"),
    ({"tenants": {"a": {"namespaces": ["x"], "sriov": {"trust": "maybe"}}}}, "tenants.a.sriov.trust"),
])
def test_invalid_policies_name_the_key(bad, needle):
    with pytest.raises(CniError) as err:
        parse_policy(bad, "node.yaml")
    assert err.value.code == 7 and needle in err.value.msg


def test_policy_file(tmp_path):
    f = tmp_path / "policy.yaml"
    f.write_text("tenancy:\n  networks: {n: {bridge: br-n}}\n"
                 "  tenants:\n    a: {namespaces: [a], networks: {n: {vlans: [7]}}}\n")
    policy = load(NodeConfig(tenancy_file=str(f)))
    assert policy is not None and policy.tenants[0].networks["n"].vlans == frozenset({7})
    assert load(NodeConfig()) is None


def test_same_vlan_on_two_fabrics_may_go_to_two_tenants():
    p = parse_policy({"networks": {"n": {"bridge": "br-1"}, "m": {"bridge": "br-2"}},
                      "tenants": {"a": {"namespaces": ["x"], "networks": {"n": {"vlans": [5]}}},
                                  "b": {"namespaces": ["y"], "networks": {"m": {"vlans": [5]}}}}}, "x")
    assert p.networks["n"].modes() == ("ovs",) and p.networks["m"].bridge == "br-2"


def test_declared_ovsdb_must_be_allowed_by_the_node():
    node = NodeConfig(ovsdb="unix:/a.sock", ovsdb_endpoints=("unix:/b.sock",))
    ok = parse_policy({"networks": {"n": {"bridge": "br", "ovsdb": "/b.sock"}}, "tenants": {}}, "x", node)
    assert ok.networks["n"].ovsdb == "unix:/b.sock"
    with pytest.raises(CniError) as err:
        parse_policy({"networks": {"n": {"bridge": "br", "ovsdb": "unix:/c.sock"}}, "tenants": {}}, "x", node)
    assert "networks.n.ovsdb" in err.value.msg


def test_rdma_isolation_required_forces_exclusive_rdma():
    from dataclasses import make_dataclass
    from types import SimpleNamespace

    from cni.netconf import parse_netconf
    from tenantnet.plugin.tenancy import enforce
    from tenantnet.plugin.tnconf import VfSettings

    policy = parse_policy({"networks": {"rail": {"pfs": ["ens1f0"]}}, "tenants": {"a": {
        "namespaces": ["team-a"], "networks": {"rail": {"vlans": [100]}},
        "sriov": {"rdmaIsolation": "required"}}}}, "x")
    assert policy.tenant_of("team-a").rdma_isolation_required
    base = parse_netconf({"cniVersion": "1.0.0", "name": "rail", "type": "tenantnet", "vlan": 100})
    conf = make_dataclass("Conf", ["base", "name", "ovs", "vf"])(base, "rail", None,
                                                                 VfSettings(pfs=("ens1f0",), vlan=100))
    env = SimpleNamespace(args=SimpleNamespace(pod_namespace="team-a", pod_name="p"), container_id="c")
    log = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    forced = enforce(policy, conf, env, log)
    assert forced.vf.rdma == "exclusive" and "rdmaIsolation: required" in forced.vf.rdma_required_by
    with pytest.raises(CniError) as err:
        parse_policy({"networks": {}, "tenants": {"a": {"namespaces": ["x"], "sriov": {"rdmaIsolation": "yes"}}}},
                     "x")
    assert "rdmaIsolation" in err.value.msg
