"""Results in each spec version's shape; prevResult passed on when chained."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import new_cid

LEGACY = ("0.3.0", "0.3.1", "0.4.0")


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0"])
def test_result_shape_per_version(lab, plugin, netns_factory, no_leftovers, version):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(cniVersion=version, mtu=1400)
    inv = plugin.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    res = inv.out
    assert res["cniVersion"] == version
    assert set(res) <= {"cniVersion", "interfaces", "ips", "routes", "dns"}
    # mtu/pciID/socketPath are 1.1.0 only: before it the pod interface has no mtu, even with
    # one configured (and set on the link); the host interface never has a sandbox.
    host, pod = res["interfaces"]
    assert set(host) == {"name", "mac"}
    link = pod_link(ns)
    assert link["mtu"] == 1400
    assert pod == {"name": "net1", "mac": link["address"], "sandbox": ns.path}
    ip = res["ips"][0]
    if version in LEGACY:
        assert ip["version"] == "4"
    else:
        assert "version" not in ip
    assert ip["interface"] == 1 and ip["gateway"] == "10.77.0.1"
    assert plugin.call("DEL", conf, cid, ns.path).code == 0


def test_result_shape_1_1_0(lab, plugin, netns_factory, no_leftovers):
    # Debian's host-local (1.1.1) refuses cniVersion 1.1.0, so this network has no IPAM.
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(cniVersion="1.1.0", mtu=1400, ipam=None)
    inv = plugin.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    host, pod = inv.out["interfaces"]
    assert set(host) == {"name", "mac"}  # the OVS host end: no mtu reported, no sandbox
    link = pod_link(ns)
    assert link["mtu"] == 1400
    assert pod == {"name": "net1", "mac": link["address"], "mtu": 1400, "sandbox": ns.path}
    assert "ips" not in inv.out
    assert plugin.call("DEL", conf, cid, ns.path).code == 0


def pod_link(ns) -> dict:
    """The pod's `net1` as the kernel has it (`ip -j link`)."""
    return json.loads(ns.run("ip", "-j", "link", "show", "net1", check=True).stdout)[0]


def test_version_command(plugin):
    inv = plugin.raw(plugin.env("VERSION", cni_args=""), json.dumps({"cniVersion": "1.0.0"}))
    assert inv.code == 0
    assert inv.out == {"cniVersion": "1.1.0",
                       "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}
    # podman sends VERSION with CNI_NETNS=dummy and nothing else of use
    env = plugin.env("VERSION", cni_args="")
    env["CNI_NETNS"] = "dummy"
    assert plugin.raw(env, b"").out["supportedVersions"][-1] == "1.1.0"


def test_prev_result_is_passed_on(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": ns.path}],
        "ips": [{"address": "192.168.10.5/24", "gateway": "192.168.10.1", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "192.168.10.1"}],
        "dns": {"nameservers": ["192.168.10.53"]},
    }
    conf = plugin.conf(prevResult=prev)
    inv = plugin.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    res = inv.out
    assert [i["name"] for i in res["interfaces"]][0] == "eth0"
    assert res["interfaces"][2]["name"] == "net1"
    assert res["ips"][0] == {"address": "192.168.10.5/24", "gateway": "192.168.10.1", "interface": 0}
    assert res["ips"][1]["interface"] == 2
    assert res["routes"] == [{"dst": "0.0.0.0/0", "gw": "192.168.10.1"}]
    assert res["dns"] == {"nameservers": ["192.168.10.53"]}
    assert plugin.call("DEL", conf, cid, ns.path).code == 0


def test_runtime_config_keys_case_insensitive(lab, plugin, netns_factory, no_leftovers):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(runtimeConfig={"MAC": "02:12:34:56:78:9a", "DNS": {"Servers": ["10.0.0.53"],
                                                                          "Searches": ["svc.local"]}})
    inv = plugin.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    assert inv.out["interfaces"][1]["mac"] == "02:12:34:56:78:9a"
    assert inv.out["dns"] == {"nameservers": ["10.0.0.53"], "search": ["svc.local"]}
    assert plugin.call("DEL", conf, cid, ns.path).code == 0


def test_own_ipam_in_process_dual_stack_1_1_0(lab, plugin, netns_factory, no_leftovers, tmp_path):
    """ipam.type tenantnet-ipam runs inside the plugin (no exec) and speaks 1.1.0."""
    ns = netns_factory()
    cid = new_cid()
    data = lab.root / "ipam" / tmp_path.name  # the lab node config allows <lab>/ipam
    conf = plugin.conf(cniVersion="1.1.0", mtu=1400, ipam={
        "type": "tenantnet-ipam", "dataDir": str(data),
        "ranges": [[{"subnet": "10.55.0.0/24"}], [{"subnet": "fd55::/64"}]],
        "routes": [{"dst": "0.0.0.0/0"}]})
    # No tenantnet-ipam on CNI_PATH: only an in-process call can succeed.
    env = plugin.env("ADD", cid, ns.path, "net1")
    env["CNI_PATH"] = "/nonexistent"
    inv = plugin.raw(env, json.dumps(conf))
    assert inv.code == 0, inv.stdout
    plugin.cleanups.append((conf, cid, "net1"))
    ips = [ip["address"] for ip in inv.out["ips"]]
    assert ips[0].startswith("10.55.0.") and ips[1].startswith("fd55::")
    assert inv.out["interfaces"][1]["mtu"] == 1400
    assert inv.out["routes"] == [{"dst": "0.0.0.0/0"}]
    route = ns.run("ip", "-j", "route", "show", "default")
    assert json.loads(route.stdout)[0]["gateway"] == "10.55.0.1"
    gc = {**conf, "cni.dev/valid-attachments": []}
    out = plugin.raw(plugin.env("GC", netns=None, cni_args=""), json.dumps(gc))
    assert out.code == 0, out.stdout
    listed = subprocess.run([str(Path(sys.executable).parent / "tenantnetctl"), "ipam", "ls", "--data-dir",
                             str(data), "--json"], capture_output=True, text=True, check=True)
    assert json.loads(listed.stdout) == []
