"""The TenantNetwork API's pure core: parsing and bounds, the tenant resolver, rendering,
and the CRD's schema agreeing with the parser (no root, no cluster)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from cni.errors import CniError
from tenantnet.plugin.tenantnetworks import (
    FINALIZER,
    NETWORK_LABEL,
    InvalidTenantNetwork,
    parse_tenant_network,
)
from tenantnet.plugin.tenants import CAPSULE_LABEL, TENANT_LABEL, TenantResolver, parse_sources
from tenantnet.plugin.tnrender import (
    auto_vlan,
    cluster_conflicts,
    published_pfs,
    render_config,
    render_nad,
    selected,
    unknown_pfs,
)

CRD = Path(__file__).resolve().parents[2] / "packaging" / "crds" / "tenantnetwork.yaml"


def tn_obj(**spec_changes):
    spec = {
        "tenants": ["team-a"],
        "fabric": {"mode": "ovs", "bridge": "br-rail1"},
        "vlan": 100,
        "mtu": 9000,
        "ipam": {"ranges": [[{"subnet": "10.10.0.0/24", "rangeStart": "10.10.0.10", "rangeEnd": "10.10.0.200",
                               "gateway": "10.10.0.1"}]], "blockSize": 28},
    }
    spec.update(spec_changes)
    return {"apiVersion": "tenantnet.io/v1alpha1", "kind": "TenantNetwork",
            "metadata": {"name": "rail-1", "uid": "u-1", "generation": 3}, "spec": spec}


def test_parse_a_full_network():
    tn = parse_tenant_network(tn_obj(prewarm=True, podChoices={"staticIP": True}))
    assert tn.name == "rail-1" and tn.uid == "u-1" and tn.generation == 3
    assert tn.tenants == ("team-a",) and tn.segment == 100 and tn.mtu == 9000 and tn.prewarm
    assert tn.fabric.on({}) == ("br-rail1", ())
    assert tn.pool.block_size == 28 and tn.pool.ranges[0][0].subnet == "10.10.0.0/24"
    assert tn.pod_choices.static_ip and not tn.pod_choices.mac


BAD = [
    # (id, spec change, the field named, words of what is allowed)
    ("vlan-0", {"vlan": 0}, "spec.vlan", "1 to 4094"),
    ("vlan-4095", {"vlan": 4095}, "spec.vlan", "1 to 4094"),
    ("vlan-missing", {"vlan": None}, "spec.vlan", '"auto"'),
    ("vlan-word", {"vlan": "tenant"}, "spec.vlan", '"auto"'),
    ("vlan-bool", {"vlan": True}, "spec.vlan", "1 to 4094"),
    ("mtu", {"mtu": 70000}, "spec.mtu", "576 to 9216"),
    ("unknown-field", {"dataDir": "/etc"}, "spec.dataDir", "unknown field"),
    ("nobody", {"tenants": []}, "spec.tenants", "who gets the network"),
    ("tenant-name", {"tenants": ["Team A"]}, "spec.tenants", "DNS labels"),
    ("tenant-dup", {"tenants": ["a", "a"]}, "spec.tenants", "distinct"),
    ("tenants-too-many", {"tenants": [f"t{i}" for i in range(257)]}, "spec.tenants", "at most 256"),
    ("empty-selector", {"namespaceSelector": {}}, "spec.namespaceSelector", "must not be empty"),
    ("selector-op", {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
     "operator", "In, NotIn"),
    ("mode", {"fabric": {"mode": "macvlan", "bridge": "b"}}, "spec.fabric.mode", "ovs, sriov"),
    ("ovs-no-bridge", {"fabric": {"mode": "ovs"}}, "spec.fabric.bridge", "needs a bridge"),
    ("sriov-no-pfs", {"fabric": {"mode": "sriov"}}, "spec.fabric.pfs", "needs the PFs"),
    ("bridge-name", {"fabric": {"mode": "ovs", "bridge": "br 1;rm"}}, "spec.fabric.bridge", "OVS bridge"),
    ("fabric-field", {"fabric": {"mode": "ovs", "bridge": "b", "socket_file": "/tmp/x"}},
     "spec.fabric.socket_file", "unknown field"),
    ("cidr", {"ipam": {"ranges": [[{"subnet": "10.0.0.0/33"}]]}}, "subnet", "CIDR"),
    ("cidr-wide", {"ipam": {"ranges": [[{"subnet": "0.0.0.0/0"}]]}}, "subnet", "/8 to /30"),
    ("range-outside", {"ipam": {"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"}]]}},
     "rangeStart", "inside 10.0.0.0/24"),
    ("no-ranges", {"ipam": {"ranges": []}}, "spec.ipam.ranges", "1 to 16"),
    ("ipam-datadir", {"ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}]], "dataDir": "/etc"}},
     "spec.ipam.dataDir", "unknown field"),
    ("block", {"ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}]], "blockSize": 31}}, "spec.ipam.blockSize",
     "16 to 30"),
    ("prewarm-sriov", {"fabric": {"mode": "sriov", "pfs": ["ens1f0"]}, "prewarm": True}, "spec.prewarm",
     "ovs and ovs-offload"),
    ("rdma-ovs", {"rdma": "exclusive"}, "spec.rdma", "modes sriov and ovs-offload"),
    ("choice", {"podChoices": {"bridge": True}}, "spec.podChoices.bridge", "known: staticIP, mac"),
]


@pytest.mark.parametrize("change,where,allowed", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_refusals_name_the_field_and_what_is_allowed(change, where, allowed):
    obj = tn_obj(**change)
    obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
    with pytest.raises(InvalidTenantNetwork) as info:
        parse_tenant_network(obj)
    assert where in str(info.value) and allowed in str(info.value), str(info.value)
    assert str(info.value).startswith("TenantNetwork rail-1: ")


def test_name_must_be_a_dns_label():
    obj = tn_obj()
    obj["metadata"]["name"] = "Rail_1"
    with pytest.raises(InvalidTenantNetwork, match="metadata.name"):
        parse_tenant_network(obj)


def test_vlan_auto_takes_the_status_vlan_only():
    obj = tn_obj(vlan="auto")
    assert parse_tenant_network(obj).segment is None
    obj["status"] = {"vlan": 3001}
    assert parse_tenant_network(obj).segment == 3001
    obj["status"] = {"vlan": 5000}  # a broken status is no VLAN
    assert parse_tenant_network(obj).segment is None
    fixed = tn_obj(vlan=100)
    fixed["status"] = {"vlan": 3001}  # a status never overrides the admin's VLAN
    assert parse_tenant_network(fixed).segment == 100


def test_per_node_fabric():
    tn = parse_tenant_network(tn_obj(fabric={"mode": "ovs-offload", "bridge": "br-x", "pfs": ["ens1f0"], "nodes": [
        {"nodeSelector": {"matchLabels": {"rack": "r2"}}, "pfs": ["ens2f0"]}]}))
    assert tn.fabric.on({"rack": "r2"}) == ("br-x", ("ens2f0",))
    assert tn.fabric.on({"rack": "r1"}) == ("br-x", ("ens1f0",))
    with pytest.raises(InvalidTenantNetwork, match="must select some nodes"):
        parse_tenant_network(tn_obj(fabric={"mode": "ovs", "bridge": "b", "nodes": [
            {"nodeSelector": {}, "bridge": "c"}]}))


# ---- the resolver ------------------------------------------------------------------------------

ALL = TenantResolver(("label", "capsule", "hnc", "name"), (("team-a", ("team-a", "team-a-*")),
                                                            ("wide", ("team-*",))))


def test_each_source_alone():
    assert TenantResolver(("label",)).resolve("x", {TENANT_LABEL: "team-a"}).tenant == "team-a"
    assert TenantResolver(("capsule",)).resolve("x", {CAPSULE_LABEL: "oil"}).tenant == "oil"
    hnc = {"acme.tree.hnc.x-k8s.io/depth": "2", "acme-ml.tree.hnc.x-k8s.io/depth": "1",
           "acme-ml-train.tree.hnc.x-k8s.io/depth": "0"}
    assert TenantResolver(("hnc",)).resolve("acme-ml-train", hnc).tenant == "acme"
    assert TenantResolver(("hnc",)).resolve("acme", {"acme.tree.hnc.x-k8s.io/depth": "0"}).tenant == "acme"
    assert ALL.resolve("team-a-ml", {}).tenant == "team-a"  # longest glob
    assert ALL.resolve("team-z", {}).tenant == "wide"
    assert ALL.resolve("default", {}).tenant is None
    # A source the admin did not list is not consulted.
    assert TenantResolver(("label",)).resolve("x", {CAPSULE_LABEL: "oil"}).tenant is None


def test_sources_that_agree_and_that_disagree():
    ok = ALL.resolve("team-a", {TENANT_LABEL: "team-a", CAPSULE_LABEL: "team-a"})
    assert ok.tenant == "team-a" and not ok.conflict and "label says team-a, capsule says team-a" in ok.reason
    bad = ALL.resolve("team-a", {TENANT_LABEL: "team-a", CAPSULE_LABEL: "oil"})
    assert bad.tenant is None and bad.conflict
    assert "the tenant sources disagree (label says team-a, capsule says oil, name says team-a)" in bad.reason
    # The name source disagreeing with a label is a conflict too: fail closed.
    assert ALL.resolve("team-b", {TENANT_LABEL: "team-a"}).conflict


def test_malformed_labels_fail_closed():
    r = ALL.resolve("x", {TENANT_LABEL: "Not A Name"})
    assert r.conflict and "is not a tenant name" in r.reason
    two_roots = {"a.tree.hnc.x-k8s.io/depth": "1", "b.tree.hnc.x-k8s.io/depth": "1",
                 "x.tree.hnc.x-k8s.io/depth": "0"}
    assert "two roots at depth 1" in TenantResolver(("hnc",)).resolve("x", two_roots).reason
    assert TenantResolver(("hnc",)).resolve("x", {"a.tree.hnc.x-k8s.io/depth": "deep"}).conflict


def test_node_config_sources():
    assert parse_sources(["capsule", "label"]) == ("capsule", "label")
    for bad in ([], ["label", "label"], ["ldap"], "label", [1]):
        assert parse_sources(bad) is None


# ---- grants and rendering ----------------------------------------------------------------------

def test_grants_by_tenant_or_selector():
    tn = parse_tenant_network(tn_obj(namespaceSelector={"matchLabels": {"rail-access": "yes"}}))
    r = TenantResolver(("label",))
    assert tn.grants("a", r.resolve("a", {TENANT_LABEL: "team-a"}), {TENANT_LABEL: "team-a"})
    assert not tn.grants("b", r.resolve("b", {TENANT_LABEL: "team-b"}), {TENANT_LABEL: "team-b"})
    assert tn.grants("c", r.resolve("c", {}), {"rail-access": "yes"})
    # Disagreeing sources grant nothing, whatever the selector says.
    both = {TENANT_LABEL: "team-a", CAPSULE_LABEL: "oil", "rail-access": "yes"}
    assert not tn.grants("d", ALL.resolve("d", both), both)


def test_render_config_is_the_admins_network():
    tn = parse_tenant_network(tn_obj(prewarm=True, podChoices={"staticIP": True, "mac": True}))
    config = render_config(tn)
    assert config == {
        "cniVersion": "1.0.0", "name": "rail-1", "type": "tenantnet", "tenantNetwork": "rail-1", "mode": "ovs",
        "bridge": "br-rail1", "vlan": 100, "mtu": 9000, "prewarm": True,
        "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28},
                 "ranges": [[{"subnet": "10.10.0.0/24", "rangeStart": "10.10.0.10", "rangeEnd": "10.10.0.200",
                              "gateway": "10.10.0.1"}]]},
        "capabilities": {"ips": True, "mac": True},
    }
    sriov = parse_tenant_network(tn_obj(fabric={"mode": "sriov", "pfs": ["ens1f0"], "resourceName": "nvidia.com/rail0"},
                                        rdma="exclusive", railAlignment={"within": "PIX", "action": "refuse"}))
    c = render_config(sriov)
    assert c["pfs"] == ["ens1f0"] and "bridge" not in c and "prewarm" not in c and c["rdma"] == "exclusive"
    assert c["railAlignment"] == {"within": "PIX", "action": "refuse"}
    assert c["capabilities"] == {"deviceID": True, "CNIDeviceInfoFile": True}


def test_render_nad_is_owned_labelled_protected():
    tn = parse_tenant_network(tn_obj())
    nad = render_nad(tn, "team-a")
    meta = nad["metadata"]
    assert (meta["name"], meta["namespace"]) == ("rail-1", "team-a")
    assert meta["labels"][NETWORK_LABEL] == "rail-1" and meta["finalizers"] == [FINALIZER]
    assert meta["ownerReferences"] == [{"apiVersion": "tenantnet.io/v1alpha1", "kind": "TenantNetwork",
                                        "name": "rail-1", "uid": "u-1", "controller": True,
                                        "blockOwnerDeletion": True}]
    assert json.loads(nad["spec"]["config"]) == render_config(tn)


def test_selected_namespaces_and_conflicts():
    tn = parse_tenant_network(tn_obj())
    namespaces = {"a1": {TENANT_LABEL: "team-a"}, "b1": {TENANT_LABEL: "team-b"},
                  "x": {TENANT_LABEL: "team-a", CAPSULE_LABEL: "oil"}}
    chosen, conflicts = selected(tn, TenantResolver(("label", "capsule")), namespaces)
    assert chosen == ["a1"] and len(conflicts) == 1 and "namespace x" in conflicts[0]


def test_controller_side_conflicts():
    a = parse_tenant_network(tn_obj())
    b_obj = tn_obj(tenants=["team-b"], ipam={"ranges": [[{"subnet": "10.20.0.0/24"}]]})
    b_obj["metadata"]["name"] = "rail-2"
    b = parse_tenant_network(b_obj)
    tenants = {"rail-1": frozenset({"team-a"}), "rail-2": frozenset({"team-b"})}
    assert "VLAN 100 of bridge br-rail1 is TenantNetwork rail-1's" in cluster_conflicts([a, b], tenants)["rail-2"]
    c_obj = copy.deepcopy(b_obj)
    c_obj["spec"]["vlan"] = 200
    c_obj["spec"]["ipam"] = {"ranges": [[{"subnet": "10.10.0.128/25"}]]}
    c = parse_tenant_network(c_obj)
    assert "overlaps TenantNetwork rail-1's 10.10.0.0/24" in cluster_conflicts([a, c], tenants)["rail-2"]
    d_obj = copy.deepcopy(b_obj)
    d_obj["spec"]["vlan"] = 200
    assert cluster_conflicts([a, parse_tenant_network(d_obj)], tenants) == {}


def test_published_pfs_of_a_node():
    pfs = '[{"name": "ens1f0", "pci": "0000:3b:00.0"}, {"name": "ens2f0", "pci": "0000:5e:00.0"}, 7]'
    assert published_pfs({"tenantnet.io/pfs": pfs}) == {"ens1f0", "0000:3b:00.0", "ens2f0", "0000:5e:00.0"}
    assert published_pfs({"tenantnet.io/pfs": "[]"}) == frozenset()
    for bad in (None, {}, {"tenantnet.io/pfs": "not json"}, {"tenantnet.io/pfs": '{"a": 1}'},
                {"tenantnet.io/pfs": "[" + " " * 20000 + "]"}):
        assert published_pfs(bad) is None, bad


def test_a_vf_network_naming_pfs_no_node_publishes_is_refused():
    tn = parse_tenant_network(tn_obj(fabric={"mode": "sriov", "pfs": ["ens1f0"], "nodes": [
        {"nodeSelector": {"matchLabels": {"rack": "r2"}}, "pfs": ["0000:5e:00.0"]}]}))
    r1 = ({"rack": "r1"}, frozenset({"ens1f0", "0000:3b:00.0"}))
    r2 = ({"rack": "r2"}, frozenset({"ens2f0", "0000:5e:00.0"}))
    assert unknown_pfs(tn, {"n1": r1, "n2": r2}) is None
    # One node of several publishing the PF is enough; a PF no node would use is not checked.
    assert unknown_pfs(tn, {"n1": r1, "n3": ({"rack": "r1"}, None)}) is None
    assert unknown_pfs(tn, {}) is None
    why = unknown_pfs(tn, {"n1": ({"rack": "r1"}, frozenset({"ens9f0"})), "n2": r2, "n3": ({}, None)})
    assert why == ("PF ens1f0 is on none of the nodes its fabric selects: n1 (publishes ens9f0), "
                   "n3 (publishes no PF)"), why
    # The node-specific entry's PF, by PCI address (any case), against the rack-r2 nodes only.
    tn2 = parse_tenant_network(tn_obj(fabric={"mode": "sriov", "pfs": ["ens1f0"], "nodes": [
        {"nodeSelector": {"matchLabels": {"rack": "r2"}}, "pfs": ["0000:5E:00.1"]}]}))
    assert unknown_pfs(tn2, {"n1": r1, "n2": r2}).startswith("PF 0000:5E:00.1 is on none of the nodes its "
                                                              "fabric selects: n2 (publishes 0000:5e:00.0, ens2f0)")
    assert unknown_pfs(parse_tenant_network(tn_obj()), {"n1": ({}, None)}) is None  # ovs: no PFs
    many = {f"n{i}": ({}, frozenset()) for i in range(8)}
    assert unknown_pfs(parse_tenant_network(tn_obj(fabric={"mode": "sriov", "pfs": ["ens1f0"]})),
                       many).endswith("n4 (publishes no PF) and 3 more")


def test_auto_vlan_is_unique_per_fabric():
    tn = parse_tenant_network(tn_obj(vlan="auto"))
    assert auto_vlan(tn, {"bridge br-rail1": {3000, 3001}}, 3000, 3009) == 3002
    assert auto_vlan(tn, {"bridge br-other": {3000}}, 3000, 3009) == 3000
    assert auto_vlan(tn, {"bridge br-rail1": set(range(3000, 3010))}, 3000, 3009) is None


# ---- the CRD ------------------------------------------------------------------------------------

def test_crd_is_structural_and_bounded_as_the_parser():
    doc = yaml.safe_load(CRD.read_text())
    assert doc["apiVersion"] == "apiextensions.k8s.io/v1" and doc["spec"]["scope"] == "Cluster"
    version = doc["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert spec["required"] == ["fabric", "vlan", "ipam"]
    # Every field the parser knows is in the schema, and no other (a structural schema
    # prunes unknown fields, so the two must agree).
    assert set(props) == {"tenants", "namespaceSelector", "fabric", "vlan", "mtu", "ipam", "prewarm", "rdma",
                          "railAlignment", "podChoices"}
    assert props["tenants"]["maxItems"] == 256
    assert (props["mtu"]["minimum"], props["mtu"]["maximum"]) == (576, 9216)
    assert props["ipam"]["properties"]["blockSize"] == {"type": "integer", "minimum": 16, "maximum": 30}
    assert set(props["ipam"]["properties"]) == {"ranges", "routes", "blockSize"}
    assert props["fabric"]["properties"]["mode"]["enum"] == ["ovs", "sriov", "ovs-offload"]
    assert set(props["podChoices"]["properties"]) == {"staticIP", "mac"}

    def walk(node, path="$"):
        # Structural: every object level has a type (int-or-string excepted) — no free maps.
        if isinstance(node, dict) and ("properties" in node or "items" in node):
            assert "type" in node, f"{path} has no type"
            for k, v in node.get("properties", {}).items():
                assert "type" in v or v.get("x-kubernetes-int-or-string"), f"{path}.{k} has no type"
                walk(v, f"{path}.{k}")
            if "items" in node:
                walk(node["items"], f"{path}[]")
    walk(version["schema"]["openAPIV3Schema"])


def test_packaged_rbac_is_least_privilege():
    """The agent reads, and patches Nodes only (its PFs' annotation), besides the DRA driver's
    ResourceSlices and ResourceClaim status; the renderer writes NADs,
    TenantNetworks' status and its Lease, never a TenantNetwork's spec (the e2e tier runs both
    under these rules for real)."""
    docs = list(yaml.safe_load_all((CRD.parents[1] / "rbac.yaml").read_text()))
    roles = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] in ("ClusterRole", "Role")}
    writes = {"create", "update", "patch", "delete", "deletecollection", "*"}
    agent_writes = [(r["apiGroups"], r["resources"], set(r["verbs"]) & writes) for r in roles["tenantnet-agent"]
                    if set(r["verbs"]) & writes]
    assert agent_writes == [([""], ["nodes"], {"patch"}),
                            # the DRA driver's own slices and its claims' status (docs/dra.md)
                            (["resource.k8s.io"], ["resourceslices"], {"create", "update", "patch", "delete"}),
                            (["resource.k8s.io"], ["resourceclaims/status"], {"update", "patch"})]
    [driver] = [r for r in roles["tenantnet-agent"] if r["resources"] == ["resourceclaims/driver"]]
    assert driver["resourceNames"] == ["tenantnet.io"]  # our own entries of a claim's status.devices
    assert all(v.startswith("associated-node:") for v in driver["verbs"])  # claims of the agent's node only
    granted = {(g, res): set(r["verbs"]) for r in roles["tenantnet-renderer"] for g in r["apiGroups"]
               for res in r["resources"]}
    assert not granted[("tenantnet.io", "tenantnetworks")] & writes
    assert granted[("tenantnet.io", "tenantnetworks/status")] >= {"patch"}
    assert granted[("k8s.cni.cncf.io", "network-attachment-definitions")] >= {"create", "patch", "delete"}
    assert [r["resources"] for r in roles["tenantnet-renderer-lease"]] == [["leases"]]
    bindings = {d["metadata"]["name"]: d["subjects"][0]["name"] for d in docs if d["kind"].endswith("Binding")}
    assert bindings == {"tenantnet-agent": "tenantnet", "tenantnet-renderer": "tenantnet-renderer",
                        "tenantnet-renderer-lease": "tenantnet-renderer"}
    renderer = yaml.safe_load((CRD.parents[1] / "renderer.yaml").read_text())["spec"]["template"]["spec"]
    daemonset = yaml.safe_load((CRD.parents[1] / "daemonset.yaml").read_text())["spec"]["template"]["spec"]
    assert (renderer["serviceAccountName"], daemonset["serviceAccountName"]) == ("tenantnet-renderer", "tenantnet")


def test_packaged_node_config_in_kubernetes_mode_loads(tmp_path):
    from tenantnet.plugin import nodeconfig

    text = yaml.safe_load((CRD.parents[1] / "configmap.yaml").read_text())["data"]["tenantnet.yaml"]
    text = text.replace("# kubernetes: true", "kubernetes: true").replace(
        "# tenantSources: [label, capsule, hnc]", "tenantSources: [label, capsule, hnc]")
    path = tmp_path / "tenantnet.yaml"
    path.write_text(text)
    node = nodeconfig.load(str(path))
    assert node.kubernetes and node.tenant_sources == ("label", "capsule", "hnc") and not node.legacy_nads
    path.write_text(text.replace("tenantSources: [label, capsule, hnc]", "tenantSources: [label, ldap]"))
    with pytest.raises(CniError) as info:
        nodeconfig.load(str(path))
    assert "tenantSources" in info.value.msg and "from label, capsule, hnc, name" in info.value.msg
