"""Kubernetes mode on the node: an ADD settled from the cached TenantNetwork, never from the
NAD's text (tnconf.settle -> tnadmit.admit, kubecache). No root, no cluster."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from cni.env import CniArgs, CniEnv
from cni.errors import CniError
from cni.netconf import parse_netconf
from tenantnet.plugin import kubecache, tnconf
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.tenants import CAPSULE_LABEL, TENANT_LABEL

TN = {"metadata": {"name": "rail-1", "uid": "u-1", "generation": 1}, "spec": {
    "tenants": ["team-a"], "fabric": {"mode": "ovs", "bridge": "br-rail1"}, "vlan": 100, "mtu": 9000,
    "ipam": {"ranges": [[{"subnet": "10.10.0.0/24"}]]}}}


class Log:
    def __init__(self):
        self.lines = []

    def info(self, event, **kw):
        self.lines.append(("info", event, kw))

    def warning(self, event, **kw):
        self.lines.append(("warning", event, kw))


@pytest.fixture
def node(tmp_path):
    state = tmp_path / "state"
    cache = kubecache.CacheWriter(str(state))
    cache.put("tenantnetworks", "rail-1", TN)
    cache.put("namespaces", "team-a", kubecache.namespace_doc("team-a", {TENANT_LABEL: "team-a"}))
    cache.put("namespaces", "team-b", kubecache.namespace_doc("team-b", {TENANT_LABEL: "team-b"}))
    cache.mark_synced(1.0, "node1", {"rack": "r1"})
    return replace(NodeConfig(), kubernetes=True, state_dir=str(state), log_file=str(tmp_path / "tn.log"))


def nad(**changes):
    raw = {"cniVersion": "1.0.0", "name": "rail-1", "type": "tenantnet", "tenantNetwork": "rail-1"}
    raw.update(changes)
    return parse_netconf({k: v for k, v in raw.items() if v is not None})


def env(ns="team-a", **args):
    return CniEnv("ADD", "c" * 64, "/run/netns/x", "net1", CniArgs(pod_namespace=ns, pod_name="p", **args))


def settle(node, conf, e=None, log=None):
    return tnconf.settle(conf, e or env(), node, log or Log())


def refused(node, conf, e=None):
    with pytest.raises(CniError) as info:
        settle(node, conf, e)
    return info.value


def test_the_attachment_gets_the_tenant_networks_settings(node):
    log = Log()
    t = settle(node, nad(), log=log)
    assert (t.mode, t.ovs.bridge, t.ovs.vlan, t.mtu, t.ipam_type) == ("ovs", "br-rail1", 100, 9000, "tenantnet-ipam")
    assert t.base.ipam == {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.10.0.0/24"}]]}
    assert log.lines[-1][:2] == ("info", "security.allowed") and log.lines[-1][2]["tenant"] == "team-a"


def test_a_hostile_nad_is_overridden(node, tmp_path):
    log = Log()
    t = settle(node, nad(bridge="br-other", vlan=200, mtu=1400, prewarm=True, socket_file="unix:/tmp/evil",
                         ipam={"type": "host-local", "dataDir": "/etc", "ranges": [[{"subnet": "0.0.0.0/0"}]]},
                         logFile="/etc/passwd", trunk=[{"minID": 1, "maxID": 4094}]), log=log)
    assert (t.ovs.bridge, t.ovs.vlan, t.ovs.trunks, t.mtu, t.ovs.prewarm) == ("br-rail1", 100, (), 9000, False)
    assert t.ovs.ovsdb == NodeConfig().ovsdb and t.log_file == node.log_file
    assert "dataDir" not in t.base.ipam and t.base.ipam["type"] == "tenantnet-ipam"
    ignored = log.lines[-1][2]["ignored_nad_fields"]
    assert set(ignored) >= {"bridge", "vlan", "mtu", "prewarm", "socket_file", "ipam", "logFile", "trunk"}


def test_a_foreign_tenants_pod_is_refused(node):
    err = refused(node, nad(), env("team-b"))
    assert err.code == 120
    assert "pod team-b/p may not use TenantNetwork rail-1: it grants tenants team-a; tenant team-b" in err.msg


def test_a_hand_written_nad_is_refused_unless_legacy_nads(node):
    hand = parse_netconf({"cniVersion": "1.0.0", "name": "mine", "type": "tenantnet", "bridge": "br-rail1",
                          "vlan": 100})
    err = refused(node, hand)
    assert err.code == 120 and "network mine names no tenantNetwork" in err.msg and "legacyNads: false" in err.msg
    # legacyNads: today's path (no policy here: the NAD as it is).
    assert settle(replace(node, legacy_nads=True), hand).ovs.vlan == 100


UNKNOWN = [
    # (id, how the cache is spoiled, code, message part)
    ("network", lambda s: os.unlink(f"{s}/kube/tenantnetworks/rail-1.json"), 120,
     "no TenantNetwork rail-1 is known to this node"),
    ("namespace", lambda s: os.unlink(f"{s}/kube/namespaces/team-a.json"), 11,
     "namespace team-a is not yet known to this node"),
    ("never-synced", lambda s: os.unlink(f"{s}/kube/synced.json"), 11, "has not synced with the API server"),
    ("symlink", lambda s: (os.unlink(f"{s}/kube/namespaces/team-a.json"),
                           os.symlink(f"{s}/kube/namespaces/team-b.json", f"{s}/kube/namespaces/team-a.json")),
     5, "cache is unusable"),
    ("fifo", lambda s: (os.unlink(f"{s}/kube/tenantnetworks/rail-1.json"),
                        os.mkfifo(f"{s}/kube/tenantnetworks/rail-1.json")), 5, "not a regular file"),
    ("garbage", lambda s: open(f"{s}/kube/tenantnetworks/rail-1.json", "w").write("{not json"), 5, "not JSON"),
]


@pytest.mark.parametrize("spoil,code,text", [u[1:] for u in UNKNOWN], ids=[u[0] for u in UNKNOWN])
def test_what_is_unknown_fails_closed(node, spoil, code, text):
    spoil(node.state_dir)
    err = refused(node, nad())
    assert err.code == code and text in err.msg, err.msg


def test_a_cached_object_out_of_bounds_is_refused(node):
    bad = copy.deepcopy(TN)
    bad["spec"]["vlan"] = 5000  # the API server would have refused it: the node does too
    kubecache.CacheWriter(node.state_dir).put("tenantnetworks", "rail-1", bad)
    err = refused(node, nad())
    assert err.code == 120 and "spec.vlan=5000" in err.msg


def test_pod_choices_only_when_granted(node):
    err = refused(node, nad(runtimeConfig={"mac": "02:00:00:00:00:01"}))
    assert err.code == 120 and "runtimeConfig.mac='02:00:00:00:00:01'" in err.msg and "podChoices.mac" in err.msg
    err = refused(node, nad(), env(ips=("10.10.0.5",)))
    assert err.code == 120 and "CNI_ARGS IP" in err.msg and "podChoices.staticIP" in err.msg
    granted = copy.deepcopy(TN)
    granted["spec"]["podChoices"] = {"mac": True, "staticIP": True}
    kubecache.CacheWriter(node.state_dir).put("tenantnetworks", "rail-1", granted)
    t = settle(node, nad(runtimeConfig={"mac": "02:00:00:00:00:01", "ips": ["10.10.0.5/24"],
                                        "portMappings": [{"hostPort": 22}]}))
    assert t.mac == "02:00:00:00:00:01" and t.base.runtime_config == {"mac": "02:00:00:00:00:01",
                                                                      "ips": ["10.10.0.5/24"]}


def test_vlan_auto_needs_the_assigned_vlan(node):
    auto = copy.deepcopy(TN)
    auto["spec"]["vlan"] = "auto"
    w = kubecache.CacheWriter(node.state_dir)
    w.put("tenantnetworks", "rail-1", auto)
    assert "no VLAN assigned yet" in refused(node, nad()).msg
    auto["status"] = {"vlan": 3001}
    w.put("tenantnetworks", "rail-1", auto)
    assert settle(node, nad()).ovs.vlan == 3001


def test_sources_that_disagree_refuse(node):
    w = kubecache.CacheWriter(node.state_dir)
    w.put("namespaces", "team-a", kubecache.namespace_doc("team-a", {TENANT_LABEL: "team-a",
                                                                     CAPSULE_LABEL: "team-b"}))
    err = refused(replace(node, tenant_sources=("label", "capsule")), nad())
    assert err.code == 120 and "the tenant sources disagree (label says team-a, capsule says team-b)" in err.msg


def test_name_must_be_the_tenant_networks(node):
    err = refused(node, nad(name="other"))
    assert err.code == 120 and "named after its TenantNetwork" in err.msg


def test_per_node_fabric_from_the_nodes_labels(node):
    tn = copy.deepcopy(TN)
    tn["spec"]["fabric"]["nodes"] = [{"nodeSelector": {"matchLabels": {"rack": "r1"}}, "bridge": "br-r1"}]
    kubecache.CacheWriter(node.state_dir).put("tenantnetworks", "rail-1", tn)
    assert settle(node, nad()).ovs.bridge == "br-r1"


def test_without_kubernetes_mode_a_tenant_network_nad_is_refused(node):
    err = refused(replace(node, kubernetes=False), nad())
    assert err.code == 7 and "kubernetes: false" in err.msg


def test_the_add_path_imports_no_client_library(node, tmp_path):
    """No API request on the ADD path: the client libraries are not even imported."""
    code = (
        "import sys\n"
        "from dataclasses import replace\n"
        "from cni.env import CniArgs, CniEnv\n"
        "from cni.netconf import parse_netconf\n"
        "from tenantnet.plugin import tnconf\n"
        "from tenantnet.plugin.nodeconfig import NodeConfig\n"
        "class L:\n    def info(self, *a, **k): pass\n    def warning(self, *a, **k): pass\n"
        f"node = replace(NodeConfig(), kubernetes=True, state_dir={node.state_dir!r})\n"
        "conf = parse_netconf({'cniVersion': '1.0.0', 'name': 'rail-1', 'type': 'tenantnet',"
        " 'tenantNetwork': 'rail-1'})\n"
        "t = tnconf.settle(conf, CniEnv('ADD', 'c' * 64, '/x', 'net1', CniArgs(pod_namespace='team-a')), node, L())\n"
        "assert t.ovs.vlan == 100\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightkube', 'kubernetes', 'kr8s', 'httpx')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
