"""Tenant isolation on ADD: allowed and refused cases against the lab; refused ones leave nothing."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import new_cid

POLICY = """
tenancy:
  networks:
    rail: {bridge: BRIDGE}
    sneaky: {bridge: BRIDGE}
  tenants:
    team-a:
      namespaces: [team-a, "team-a-*"]
      networks:
        rail: {vlans: [100, "110-119"], default: 110}
    team-b:
      namespaces: [team-b]
      networks:
        rail: {vlans: [200]}
    others:
      namespaces: ["team-*"]
      networks:
        rail: {vlans: [300]}
"""


@pytest.fixture
def policy_node(lab, tmp_path):
    node = tmp_path / "node.yaml"
    node.write_text(f"ovsdb: {lab.ovsdb}\nstateDir: {lab.state_dir}\nlogFile: {tmp_path}/tn.log\n"
                    f"ipamDataDirs: [{lab.hostlocal_dir}]\n" + POLICY.replace("BRIDGE", lab.bridge))
    return node


def args(ns):
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME=p1" if ns else "IgnoreUnknown=1"


CASES = [
    # (id, pod namespace, config changes, expected tag/trunks or None if refused, message part)
    ("exact-ns", "team-a", {"vlan": 100}, 100, None),
    ("glob-ns", "team-a-ml", {"vlan": 115}, 115, None),
    ("longest-glob-wins", "team-a-x", {"vlan": 300}, None, "(tenant team-a) may not use network rail segment vlan 300"),
    ("broader-glob", "team-c", {"vlan": 300}, 300, None),
    ("tenant-vlan-default", "team-a", {"vlan": "tenant"}, 110, None),
    ("tenant-vlan-lowest", "team-b", {"vlan": "tenant"}, 200, None),
    ("other-tenants-vlan", "team-a", {"vlan": 200}, None, "pod team-a/p1 (tenant team-a) may not use network rail segment vlan 200"),
    ("b-into-a", "team-b", {"vlan": 100}, None, "(tenant team-b) may not use network rail segment vlan 100: the tenant's VLANs there are 200"),
    ("no-tenant", "default", {"vlan": 100}, None, "namespace default belongs to no tenant"),
    ("no-namespace", "", {"vlan": 100}, None, "no K8S_POD_NAMESPACE"),
    ("unlisted-network", "team-a", {"name": "sneaky", "vlan": 100}, None, "may not use network sneaky"),
    ("trunk-inside", "team-a", {"vlan": None, "trunk": [{"id": 100}, {"minID": 110, "maxID": 112}]}, [100, 110, 111, 112], None),
    ("trunk-outside", "team-a", {"vlan": None, "trunk": [{"id": 100}, {"id": 200}]}, None, "segment vlan 200"),
    ("no-vlan-is-every-vlan", "team-a", {"vlan": None}, None, "carries every VLAN"),
]


@pytest.mark.parametrize("ns,change,expect,text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_tenancy_decisions(lab, plugin, netns_factory, no_leftovers, policy_node, ns, change, expect, text):
    plugin.extra_env["TENANTNET_CONFIG"] = str(policy_node)
    pod = netns_factory()
    cid = new_cid()
    conf = plugin.conf(name="rail")
    conf.update(change)
    conf = {k: v for k, v in conf.items() if v is not None}
    inv = plugin.add(conf, pod, cid, cni_args=args(ns))
    if expect is None:
        assert inv.code == 1 and inv.out["code"] == 120, inv.stdout
        assert text in inv.out["msg"], inv.out["msg"]
        assert pod.run("ip", "link", "show", "net1").returncode != 0
        events = [json.loads(line) for line in (policy_node.parent / "tn.log").read_text().splitlines()]
        denied = [e for e in events if e.get("event") == "security.denied"]
        assert denied and denied[-1]["tenant"] in (None, "team-a", "team-b", "others")
        assert denied[-1]["pod_namespace"] == ns
        return
    assert inv.code == 0, inv.stdout
    host = inv.out["interfaces"][0]["name"]
    if isinstance(expect, list):
        assert lab.vsctl("get", "Port", host, "trunks").strip() == str(expect)
    else:
        assert lab.vsctl("get", "Port", host, "tag").strip() == str(expect)
    check = plugin.call("CHECK", {**conf, "prevResult": inv.out}, cid, pod.path, cni_args=args(ns))
    assert check.code == 0, check.stdout
    assert plugin.call("DEL", conf, cid, pod.path, cni_args=args(ns)).code == 0


def test_without_policy_behaviour_is_unchanged(lab, plugin, netns_factory, no_leftovers):
    pod = netns_factory()
    cid = new_cid()
    conf = plugin.conf(name="rail", vlan=200)
    assert plugin.add(conf, pod, cid, cni_args=args("default")).code == 0
    assert plugin.call("DEL", conf, cid, pod.path).code == 0
    inv = plugin.add(plugin.conf(name="rail", vlan="tenant"), netns_factory(), new_cid())
    assert inv.out["code"] == 7 and 'vlan="tenant" needs a tenancy policy' in inv.out["msg"]


def test_policy_check_explains_without_attaching(lab, policy_node, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    nad = tmp_path / "nad.json"
    nad.write_text(json.dumps({"cniVersion": "1.0.0", "name": "rail", "type": "tenantnet",
                               "bridge": lab.bridge, "vlan": "tenant"}))
    ctl = str(Path(sys.executable).parent / "tenantnetctl")
    ok = subprocess.run([ctl, "--node-config", str(policy_node), "policy", "check", "--pod", "team-a/p",
                         "--config", str(nad)], capture_output=True, text=True)
    assert ok.returncode == 0 and "allowed" in ok.stdout and "team-a" in ok.stdout and "110" in ok.stdout
    no = subprocess.run([ctl, "--node-config", str(policy_node), "policy", "check", "--pod", "default/p",
                         "--config", str(nad)], capture_output=True, text=True)
    assert no.returncode == 1 and "refused" in no.stdout and "belongs to no tenant" in no.stdout
    shown = subprocess.run([ctl, "--node-config", str(policy_node), "policy", "show", "--json"],
                           capture_output=True, text=True, check=True)
    tenants = {t["name"]: t for t in json.loads(shown.stdout)["tenants"]}
    assert tenants["team-a"]["networks"]["rail"]["vlans"] == "100, 110-119"
    assert lab.owned_ports() == []
