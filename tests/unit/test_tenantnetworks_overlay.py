"""Overlay TenantNetworks (issue 29): `spec.fabric.overlay: geneve` and `rail` parsed and
refused by name, rendered without a bridge, their segments unique among overlay networks
(tunnel keys are global in the NB), `vlan: auto` among the overlay segments, and the CRD
holding the same bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tenantnet.plugin.tenantnetworks import InvalidTenantNetwork, parse_tenant_network
from tenantnet.plugin.tnrender import (
    OVERLAY_FABRIC,
    _fabrics,
    auto_vlan,
    cluster_conflicts,
    overlay_switch,
    render_config,
    render_nad,
)

CRD = Path(__file__).resolve().parents[2] / "packaging" / "crds" / "tenantnetwork.yaml"


def obj(name="blue", subnet="10.20.0.0/24", vlan=100, tenants=("team-a",), **fabric):
    fab = {"mode": "ovs", "overlay": "geneve", **fabric}
    fab = {k: v for k, v in fab.items() if v is not None}
    return {"apiVersion": "tenantnet.io/v1alpha1", "kind": "TenantNetwork",
            "metadata": {"name": name, "uid": f"u-{name}", "generation": 1},
            "spec": {"tenants": list(tenants), "fabric": fab, "vlan": vlan,
                     "ipam": {"ranges": [[{"subnet": subnet}]]}}}


def test_an_overlay_network_parses_with_its_rail_and_segment():
    tn = parse_tenant_network(obj(rail="rail1"))
    assert (tn.fabric.overlay, tn.fabric.rail, tn.fabric.bridge, tn.segment) == ("geneve", "rail1", "", 100)
    offload = parse_tenant_network(obj(mode="ovs-offload", pfs=["ens1f0"]))
    assert (offload.fabric.overlay, offload.fabric.rail, offload.fabric.pfs) == ("geneve", "", ("ens1f0",))
    # Without overlay nothing changed: mode ovs still needs its bridge.
    plain = parse_tenant_network(obj(overlay=None, bridge="br-rail1"))
    assert (plain.fabric.overlay, plain.fabric.bridge) == ("", "br-rail1")


BAD = [
    # (id, fabric changes, the field named, words of what is allowed)
    ("sriov", {"mode": "sriov", "pfs": ["ens1f0"]}, "spec.fabric.overlay", "modes ovs, ovs-offload only"),
    ("vxlan", {"overlay": "vxlan"}, "spec.fabric.overlay", "must be one of geneve"),
    ("bridge", {"bridge": "br-int"}, "spec.fabric.bridge", "give rail, not bridge"),
    ("node-bridge", {"mode": "ovs-offload", "pfs": ["ens1f0"],
                     "nodes": [{"nodeSelector": {"matchLabels": {"a": "b"}}, "bridge": "br-x"}]},
     "spec.fabric.nodes[0].bridge", "give rail, not bridge"),
    ("rail-name", {"rail": "Rail_0"}, "spec.fabric.rail", "DNS label"),
    ("rail-without-overlay", {"overlay": None, "bridge": "br-rail1", "rail": "rail0"}, "spec.fabric.rail",
     "only with overlay"),
    ("ovs-pfs", {"pfs": ["ens1f0"]}, "spec.fabric.pfs", "no PFs"),
    ("offload-no-pfs", {"mode": "ovs-offload"}, "spec.fabric.pfs", "needs the PFs"),
]


@pytest.mark.parametrize("change,where,words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_an_overlay_refusal_names_the_field(change, where, words):
    with pytest.raises(InvalidTenantNetwork) as exc:
        parse_tenant_network(obj(**change))
    assert exc.value.where == where and words in str(exc.value), str(exc.value)


def test_an_overlay_segment_keeps_the_vlan_bounds():
    for vlan in (0, 4095, "tenant"):
        with pytest.raises(InvalidTenantNetwork, match="Geneve VNI") as exc:
            parse_tenant_network(obj(vlan=vlan))
        assert exc.value.where == "spec.vlan"


def test_an_overlay_renders_overlay_rail_and_segment_and_no_bridge():
    config = render_config(parse_tenant_network(obj(rail="rail1")))
    assert (config["overlay"], config["rail"], config["vlan"], config["mode"]) == ("geneve", "rail1", 100, "ovs")
    assert "bridge" not in config and "pfs" not in config
    # No rail given: none rendered (the node's default rail), and the NAD carries the same.
    bare = render_config(parse_tenant_network(obj()))
    assert "rail" not in bare and bare["overlay"] == "geneve"
    nad = json.loads(render_nad(parse_tenant_network(obj()), "ns1")["spec"]["config"])
    assert nad["overlay"] == "geneve" and "bridge" not in nad and nad["vlan"] == 100
    offload = render_config(parse_tenant_network(obj(mode="ovs-offload", pfs=["ens1f0"], rail="rail0")),
                            {"kubernetes.io/hostname": "n1"})
    assert offload["pfs"] == ["ens1f0"] and "bridge" not in offload and offload["rail"] == "rail0"
    assert offload["capabilities"]["deviceID"] is True


def test_the_switch_name_carries_the_segment():
    assert overlay_switch("blue", 100) == "tn-blue.100"


def _tenants(*tns):
    return {t.name: frozenset(t.tenants) for t in tns}


def test_two_overlays_with_one_segment_conflict_whatever_tenants_and_rails():
    a = parse_tenant_network(obj("a-net", "10.1.0.0/24", 300, ("team-a",), rail="rail0"))
    b = parse_tenant_network(obj("b-net", "10.2.0.0/24", 300, ("team-a",), rail="rail1"))
    c = parse_tenant_network(obj("c-net", "10.3.0.0/24", 300, ("team-c",)))
    refused = cluster_conflicts([c, b, a], _tenants(a, b, c))
    assert set(refused) == {"b-net", "c-net"}, refused  # the older by name keeps it
    assert "segment 300" in refused["b-net"] and "a-net" in refused["b-net"] and "tn-a-net.300" in refused["b-net"]
    assert "tunnel key is unique in the OVN northbound database" in refused["c-net"]
    other = parse_tenant_network(obj("d-net", "10.4.0.0/24", 301, ("team-c",)))
    assert cluster_conflicts([a, other], _tenants(a, other)) == {}


def test_an_overlay_and_a_vlan_network_may_share_a_number():
    overlay = parse_tenant_network(obj("a-net", "10.1.0.0/24", 300, ("team-a",)))
    vlan = parse_tenant_network(obj("b-net", "10.2.0.0/24", 300, ("team-b",), overlay=None, bridge="br-rail1"))
    offload = parse_tenant_network(obj("c-net", "10.3.0.0/24", 300, ("team-c",), mode="ovs-offload",
                                       pfs=["ens1f0"]))
    sriov = parse_tenant_network(obj("d-net", "10.4.0.0/24", 300, ("team-d",), overlay=None, mode="sriov",
                                     pfs=["ens1f0"]))
    assert cluster_conflicts([overlay, vlan], _tenants(overlay, vlan)) == {}
    # The overlay-offload's PF carries Geneve, not the segment as a tag: no conflict with a
    # VLAN network of the same number on that PF; only with the other overlay.
    assert cluster_conflicts([offload, sriov], _tenants(offload, sriov)) == {}
    assert set(cluster_conflicts([overlay, offload, sriov], _tenants(overlay, offload, sriov))) == {"c-net"}
    # Pools still conflict across kinds.
    clash = parse_tenant_network(obj("z-net", "10.1.0.128/25", 999, ("team-z",), overlay=None, bridge="b"))
    assert "overlaps" in cluster_conflicts([overlay, clash], _tenants(overlay, clash))["z-net"]


def test_auto_picks_among_the_overlay_segments():
    auto = parse_tenant_network(obj("auto-net", vlan="auto"))
    assert _fabrics(auto) == [OVERLAY_FABRIC]
    taken = {OVERLAY_FABRIC: {10, 11}, "bridge br-rail1": {12, 13}}
    assert auto_vlan(auto, taken, 10, 14) == 12  # VLANs on bridges do not count
    assert auto_vlan(auto, {OVERLAY_FABRIC: set(range(10, 15))}, 10, 14) is None


def test_crd_carries_the_overlay_bounds():
    version = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]
    fabric = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["fabric"]
    assert fabric["properties"]["overlay"]["enum"] == ["geneve"]
    rail = fabric["properties"]["rail"]
    assert rail["maxLength"] == 63 and rail["pattern"] == "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    rules = " ".join(r["rule"] for r in fabric["x-kubernetes-validations"])
    assert "self.mode in ['ovs', 'ovs-offload']" in rules and "!has(self.rail) || has(self.overlay)" in rules
    assert "self.nodes.all(n, !has(n.bridge))" in rules
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["overlay"]
    assert set(status["properties"]) == {"switch", "tunnelKey", "state", "message"}
