"""Kubernetes mode through the exec'd plugin on the lab: an ADD gets what the cached
TenantNetwork grants, whatever its NAD's text says; a foreign tenant's pod and a hand-written
NAD are refused and leave nothing. The cache is written by hand here, as the agent's watcher
would (tenantnet/plugin/kubecache.py); the watcher itself is tested in tests/e2e."""

from __future__ import annotations

import json
import shutil

import pytest

from tenantnet.plugin import kubecache
from tenantnet.plugin.tenants import TENANT_LABEL
from tests.integration.conftest import new_cid


def tenant_network(bridge, vlan=100):
    return {"metadata": {"name": "rail-1", "uid": "u-1", "generation": 1}, "spec": {
        "tenants": ["team-a"], "fabric": {"mode": "ovs", "bridge": bridge}, "vlan": vlan, "mtu": 1450,
        "ipam": {"ranges": [[{"subnet": "10.78.0.0/24", "gateway": "10.78.0.1"}]]}}}


@pytest.fixture
def kube_node(lab, tmp_path):
    """The lab's node config in Kubernetes mode, with a synced cache: TenantNetwork rail-1
    (bridge of the lab, VLAN 100) for tenant team-a; namespaces team-a and team-b."""
    cache = kubecache.CacheWriter(str(lab.state_dir))
    cache.put("tenantnetworks", "rail-1", tenant_network(lab.bridge))
    cache.put("namespaces", "team-a", kubecache.namespace_doc("team-a", {TENANT_LABEL: "team-a"}))
    cache.put("namespaces", "team-b", kubecache.namespace_doc("team-b", {TENANT_LABEL: "team-b"}))
    cache.mark_synced(1.0, "lab", {})
    node = tmp_path / "node.yaml"
    node.write_text(lab.node_config.read_text() + "kubernetes: true\n")
    yield node
    shutil.rmtree(kubecache.cache_dir(str(lab.state_dir)), ignore_errors=True)


def args(ns):
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME=p1"


def rendered_nad(**text):
    conf = {"cniVersion": "1.0.0", "name": "rail-1", "type": "tenantnet", "tenantNetwork": "rail-1"}
    conf.update(text)
    return conf


def test_a_rendered_nad_gets_the_tenant_networks_segment(lab, plugin, netns_factory, kube_node, no_leftovers):
    plugin.extra_env["TENANTNET_CONFIG"] = str(kube_node)
    pod = netns_factory()
    cid = new_cid()
    # The tenant edited its NAD: another VLAN, MTU, bridge, IPAM store, pre-warm, OVSDB.
    conf = rendered_nad(vlan=200, mtu=9000, bridge="br-int", prewarm=True, socket_file="unix:/tmp/x.sock",
                        ipam={"type": "host-local", "dataDir": str(lab.hostlocal_dir),
                              "ranges": [[{"subnet": "10.99.0.0/24"}]]})
    inv = plugin.add(conf, pod, cid, cni_args=args("team-a"))
    assert inv.code == 0, inv.stdout
    host = inv.out["interfaces"][0]["name"]
    assert lab.vsctl("get", "Port", host, "tag").strip() == "100"
    assert lab.vsctl("port-to-br", host).strip() == lab.bridge
    assert inv.out["ips"][0]["address"].startswith("10.78.0."), inv.out
    assert "mtu 1450" in pod.run("ip", "link", "show", "net1", check=True).stdout
    # The record holds the TenantNetwork's config: DEL releases from the node's own store.
    [record] = [json.loads(p.read_text()) for p in lab.records() if p.suffix == ".json"]
    assert record["conf"]["vlan"] == 100 and record["conf"]["ipam"]["type"] == "tenantnet-ipam"
    assert "dataDir" not in record["conf"]["ipam"] and record["conf"]["prewarm"] is False
    assert not any(lab.hostlocal_dir.rglob("10.99.*")), "the NAD's IPAM store was used"
    check = plugin.call("CHECK", {**conf, "prevResult": inv.out}, cid, pod.path, cni_args=args("team-a"))
    assert check.code == 0, check.stdout
    assert plugin.call("DEL", conf, cid, pod.path, cni_args=args("team-a")).code == 0


def test_a_foreign_tenants_pod_is_refused(lab, plugin, netns_factory, kube_node, no_leftovers):
    plugin.extra_env["TENANTNET_CONFIG"] = str(kube_node)
    pod = netns_factory()
    inv = plugin.add(rendered_nad(), pod, new_cid(), cni_args=args("team-b"))
    assert inv.code == 1 and inv.out["code"] == 120, inv.stdout
    assert "pod team-b/p1 may not use TenantNetwork rail-1: it grants tenants team-a" in inv.out["msg"]
    assert pod.run("ip", "link", "show", "net1").returncode != 0


def test_a_hand_written_nad_is_refused(lab, plugin, netns_factory, kube_node, no_leftovers):
    plugin.extra_env["TENANTNET_CONFIG"] = str(kube_node)
    pod = netns_factory()
    inv = plugin.add(plugin.conf(name="mine", vlan=100), pod, new_cid(), cni_args=args("team-a"))
    assert inv.code == 1 and inv.out["code"] == 120, inv.stdout
    assert "network mine names no tenantNetwork" in inv.out["msg"]
    assert pod.run("ip", "link", "show", "net1").returncode != 0


def test_an_unknown_tenant_network_fails_closed(lab, plugin, netns_factory, kube_node, no_leftovers):
    plugin.extra_env["TENANTNET_CONFIG"] = str(kube_node)
    inv = plugin.add(rendered_nad(name="rail-9", tenantNetwork="rail-9"), netns_factory(), new_cid(),
                     cni_args=args("team-a"))
    assert inv.out["code"] == 120 and "no TenantNetwork rail-9 is known to this node" in inv.out["msg"]


def test_a_vf_gets_the_tenant_networks_segment_whatever_the_nad_says(nic_lab, vfp, netns_factory, tmp_path):
    """Mode sriov on the simulated NIC: the VF comes from the TenantNetwork's PF with its
    VLAN; the NAD's own vlan, pf, trust and spoofchk are ignored; a VF the NAD names on a PF
    the network does not have is refused."""
    from tenantnet.lab.nic import LabNic, LabVfControl

    [card] = LabNic(str(nic_lab.root)).describe()
    pf = card["pf"]
    cache = kubecache.CacheWriter(str(nic_lab.state_dir))
    cache.put("tenantnetworks", "rail-vf", {"metadata": {"name": "rail-vf", "uid": "u-2"}, "spec": {
        "tenants": ["team-a"], "fabric": {"mode": "sriov", "pfs": [pf]}, "vlan": 300, "rdma": "off",
        "ipam": {"ranges": [[{"subnet": "10.79.0.0/24"}]]}}})
    cache.put("namespaces", "team-a", kubecache.namespace_doc("team-a", {TENANT_LABEL: "team-a"}))
    cache.mark_synced(1.0, "lab", {})
    node = tmp_path / "node.yaml"
    node.write_text(nic_lab.node_config.read_text() + "kubernetes: true\n")
    vfp.extra_env["TENANTNET_CONFIG"] = str(node)
    try:
        pod = netns_factory()
        cid = new_cid()
        conf = {"cniVersion": "1.0.0", "name": "rail-vf", "type": "tenantnet", "tenantNetwork": "rail-vf",
                "vlan": 200, "pf": "ens9f9", "trust": "on", "spoofchk": "off"}
        inv = vfp.add(conf, pod, cid, cni_args=args("team-a"))
        assert inv.code == 0, inv.stdout
        [record] = [json.loads(p.read_text()) for p in nic_lab.records() if p.suffix == ".json"]
        [vf] = [v for v in card["vfs"] if v["address"] == record["plan"]["deviceID"]]
        state = LabVfControl(str(nic_lab.root)).read(pf, vf["index"]).to_dict()
        assert (state["vlan"], state["trust"], state["spoofchk"]) == (300, False, True), state
        assert vfp.call("DEL", conf, cid, pod.path, cni_args=args("team-a")).code == 0
        # A VF named on stdin must be one of the network's PFs' VFs (here: a made-up address).
        stray = vfp.add({**conf, "deviceID": "0000:ff:1f.7"}, netns_factory(), new_cid(), cni_args=args("team-a"))
        assert stray.code == 1 and stray.out["code"] in (7, 120), stray.stdout
    finally:
        shutil.rmtree(kubecache.cache_dir(str(nic_lab.state_dir)), ignore_errors=True)


def test_an_in_process_add_imports_no_client_library(lab, plugin, netns_factory, kube_node, no_leftovers):
    """No API request on the ADD path: a whole ADD and DEL in one process (the shim's
    in-process path, as without an agent) leave lightkube and its HTTP client unimported."""
    import subprocess
    import sys

    pod = netns_factory()
    cid = new_cid()
    env = {**plugin.env("ADD", cid, pod.path, "net1", cni_args=args("team-a")),
           "TENANTNET_CONFIG": str(kube_node)}
    code = (
        "import json, os, sys\n"
        "from tenantnet.entry.plugin import run_in_process\n"
        f"conf = json.dumps({rendered_nad()!r}).encode()\n"
        "rc, out = run_in_process(dict(os.environ), conf)\n"
        "assert rc == 0, out\n"
        "rc, out = run_in_process({**os.environ, 'CNI_COMMAND': 'DEL'}, conf)\n"
        "assert rc == 0, out\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightkube', 'kubernetes', 'kr8s', 'httpx', 'httpx2', 'tenantnet'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert "tenantnet.plugin.tnadmit" in modules  # the ADD went through Kubernetes mode
    assert not [m for m in modules if not m.startswith("tenantnet")], modules
    assert not [m for m in modules if m.startswith("tenantnet.kube")], modules
