"""Every error a caller can cause: the right CNI code, a message naming what was wrong,
nothing left behind (no link, no OVS port, no record, no address), no traceback."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import new_cid

# (id, env changes (None = unset), config changes (None = delete key) or raw stdin, code, text)
CASES = [
    ("no-command", {"CNI_COMMAND": None}, {}, 4, "CNI_COMMAND"),
    ("bad-command", {"CNI_COMMAND": "FOO"}, {}, 4, "CNI_COMMAND='FOO'"),
    ("no-containerid", {"CNI_CONTAINERID": None}, {}, 4, "CNI_CONTAINERID"),
    ("no-netns", {"CNI_NETNS": None}, {}, 4, "CNI_NETNS"),
    ("no-ifname", {"CNI_IFNAME": None}, {}, 4, "CNI_IFNAME"),
    ("cid-traversal", {"CNI_CONTAINERID": "../../etc"}, {}, 4, "CNI_CONTAINERID='../../etc'"),
    ("cid-slash", {"CNI_CONTAINERID": "abc/def"}, {}, 4, "CNI_CONTAINERID"),
    ("cid-newline", {"CNI_CONTAINERID": "abc\ndef"}, {}, 4, "CNI_CONTAINERID"),
    ("cid-overlong", {"CNI_CONTAINERID": "a" * 300}, {}, 4, "at most 200"),
    ("ifname-traversal", {"CNI_IFNAME": "../x"}, {}, 4, "CNI_IFNAME='../x'"),
    ("ifname-overlong", {"CNI_IFNAME": "a" * 16}, {}, 4, "at most 15"),
    ("ifname-dot", {"CNI_IFNAME": "."}, {}, 4, "CNI_IFNAME"),
    ("ifname-space", {"CNI_IFNAME": "net 1"}, {}, 4, "CNI_IFNAME"),
    ("netns-relative", {"CNI_NETNS": "var/run/netns/x"}, {}, 4, "absolute path"),
    ("netns-missing", {"CNI_NETNS": "/run/netns/tnt-does-not-exist"}, {}, 4, "no such network namespace"),
    ("args-malformed", {"CNI_ARGS": "K8S_POD_NAME"}, {}, 4, "CNI_ARGS"),
    ("args-unknown", {"CNI_ARGS": "FOO=bar"}, {}, 4, "unknown key(s) FOO"),
    ("args-mac", {"CNI_ARGS": "IgnoreUnknown=1;MAC=zz"}, {}, 4, "MAC='zz'"),
    ("args-mac-multicast", {"CNI_ARGS": "MAC=01:00:5e:00:00:01"}, {}, 4, "unicast"),
    ("args-ip", {"CNI_ARGS": "IP=10.0.0.999"}, {}, 4, "IP='10.0.0.999'"),
    ("json-invalid", {}, b"{not json", 6, "cannot decode"),
    ("json-array", {}, b"[1, 2]", 6, "must be a JSON object"),
    ("json-empty", {}, b"", 6, "cannot decode"),
    ("no-cniversion", {}, {"cniVersion": None}, 7, "cniVersion is missing"),
    ("old-cniversion", {}, {"cniVersion": "0.2.0"}, 1, "cniVersion='0.2.0'"),
    ("future-cniversion", {}, {"cniVersion": "9.9.9"}, 1, "supported: 0.3.0"),
    ("no-name", {}, {"name": None}, 7, "name"),
    ("name-traversal", {}, {"name": "../evil"}, 7, "name='../evil'"),
    ("bad-mode", {}, {"mode": "bogus"}, 7, "mode='bogus'"),
    ("no-mode-no-bridge", {}, {"bridge": None}, 7, "cannot infer mode"),
    ("offload-without-vf", {}, {"mode": "ovs-offload"}, 7, "needs deviceID"),
    ("sriov-without-vf", {}, {"mode": "sriov"}, 7, "mode sriov needs deviceID"),
    ("sriov-bad-pci", {}, {"bridge": None, "deviceID": "zz:00.1"}, 7, "deviceID='zz:00.1'"),
    ("vlan-4095", {}, {"vlan": 4095}, 7, "vlan=4095"),
    ("vlan-string", {}, {"vlan": "100"}, 7, "vlan='100'"),
    ("vlan-negative", {}, {"vlan": -1}, 7, "vlan=-1"),
    ("trunk-not-list", {}, {"trunk": 5}, 7, "trunk=5"),
    ("trunk-min-gt-max", {}, {"trunk": [{"minID": 30, "maxID": 20}]}, 7, "minID 30 is greater than maxID 20"),
    ("trunk-id-range", {}, {"trunk": [{"id": 5000}]}, 7, "trunk[0].id=5000"),
    ("trunk-item-shape", {}, {"trunk": [{"from": 1}]}, 7, "trunk[0]"),
    ("mtu-too-small", {}, {"mtu": 10}, 7, "mtu=10"),
    ("mac-bad", {}, {"mac": "xx"}, 7, "mac='xx'"),
    ("runtime-mac-bad", {}, {"runtimeConfig": {"mac": "nope"}}, 7, "runtimeConfig.mac='nope'"),
    ("bridge-bad-name", {}, {"bridge": "br/../x"}, 7, "bridge='br/../x'"),
    ("bridge-unknown", {}, {"bridge": "br-nowhere"}, 7, "no such bridge"),
    ("ofport-zero", {}, {"ofport_request": 0}, 7, "ofport_request=0"),
    ("interface-type", {}, {"interface_type": "dpdk"}, 2, "interface_type='dpdk'"),
    ("socket-file-scheme", {}, {"socket_file": "ftp:host"}, 7, "socket_file='ftp:host'"),
    ("socket-file-ssl", {}, {"socket_file": "ssl:127.0.0.1:6640"}, 2, "ssl"),
    ("runtimeconfig-type", {}, {"runtimeConfig": [1]}, 7, "runtimeConfig"),
    ("args-type", {}, {"args": "x"}, 7, "args"),
    ("ipam-type", {}, {"ipam": "host-local"}, 7, "ipam"),
    ("ipam-traversal", {}, {"ipam": {"type": "../../bin/sh"}}, 7, "ipam.type='../../bin/sh'"),
    ("ipam-missing-plugin", {}, {"ipam": {"type": "no-such-ipam"}}, 7, "no such executable"),
    ("prevresult-garbage", {}, {"prevResult": {"ips": [{"address": "x"}]}}, 6, "prevResult"),
    ("logfile-relative", {}, {"logFile": "tenantnet.log"}, 7, "logFile='tenantnet.log'"),
]


@pytest.mark.parametrize("env_change,conf_change,code,text",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(lab, plugin, netns_factory, no_leftovers, env_change, conf_change, code, text):
    ns = netns_factory()
    env = plugin.env("ADD", new_cid(), ns.path, "net1")
    for key, value in env_change.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    if isinstance(conf_change, bytes):
        stdin = conf_change
    else:
        conf = plugin.conf()
        for key, value in conf_change.items():
            if value is None:
                conf.pop(key, None)
            else:
                conf[key] = value
        stdin = json.dumps(conf).encode()
    inv = plugin.raw(env, stdin)
    assert inv.code == 1
    # stdout is exactly one JSON document: the CNI error.
    err = json.loads(inv.stdout)
    assert set(err) <= {"cniVersion", "code", "msg", "details"}
    assert err["code"] == code, err
    assert text in err["msg"], err["msg"]
    assert "Traceback" not in inv.stderr and "Traceback" not in inv.stdout
    assert ns.run("ip", "link", "show", "net1").returncode != 0  # nothing in the pod


def test_at_least_thirty_cases():
    assert len(CASES) >= 30
