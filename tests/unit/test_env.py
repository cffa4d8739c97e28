"""CNI environment and CNI_ARGS parsing (no root needed)."""

from __future__ import annotations

import pytest

from cni.env import parse_cni_args, parse_env
from cni.errors import CniError

BASE = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123", "CNI_NETNS": "/run/netns/x",
        "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin:/usr/lib/cni"}


def test_add_env_parsed():
    env = parse_env(BASE)
    assert (env.command, env.container_id, env.netns, env.ifname) == ("ADD", "abc123", "/run/netns/x", "net1")
    assert env.path == ("/opt/cni/bin", "/usr/lib/cni")


@pytest.mark.parametrize("verb", ["VERSION", "GC", "STATUS"])
def test_verbs_that_need_no_container(verb):
    assert parse_env({"CNI_COMMAND": verb}).command == verb


def test_del_accepts_empty_and_dummy_netns():
    assert parse_env({**BASE, "CNI_COMMAND": "DEL", "CNI_NETNS": ""}).netns == ""
    assert parse_env({**BASE, "CNI_COMMAND": "DEL", "CNI_NETNS": "dummy"}).netns == ""
    with pytest.raises(CniError) as err:
        parse_env({**BASE, "CNI_NETNS": ""})
    assert err.value.code == 4 and "CNI_NETNS" in err.value.msg


def test_multus_cni_args_repeated_keys_any_order():
    args = parse_cni_args(
        "K8S_POD_UID=u1;IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;"
        "K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_NAME=p;MAC=02:00:00:00:00:AA;IP=10.0.0.5/24,fd00::5")
    assert (args.pod_namespace, args.pod_name, args.pod_uid, args.infra_container_id) == ("ns", "p", "u1", "c")
    assert args.mac == "02:00:00:00:00:aa"
    assert args.ips == ("10.0.0.5/24", "fd00::5/128")


def test_containerd_and_podman_forms():
    assert parse_cni_args("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;IgnoreUnknown=1").pod_name == "b"
    assert parse_cni_args("IgnoreUnknown=1;K8S_POD_NAME=x;FOO=bar").raw["FOO"] == "bar"
    assert parse_cni_args("").pod_name == ""
    assert parse_cni_args(";;").pod_name == ""


@pytest.mark.parametrize("text,needle", [
    ("FOO=bar", "unknown key(s) FOO"),
    ("novalue", "is not KEY=VALUE"),
    ("=x", "is not KEY=VALUE"),
    ("MAC=00:11:22:33:44", "MAC="),
    ("MAC=03:00:00:00:00:01", "unicast"),
    ("MAC=00:00:00:00:00:00", "all zeros"),
    ("IP=300.1.1.1", "IP='300.1.1.1'"),
])
def test_bad_cni_args(text, needle):
    with pytest.raises(CniError) as err:
        parse_cni_args(text)
    assert err.value.code == 4 and needle in err.value.msg


@pytest.mark.parametrize("var,value,needle", [
    ("CNI_CONTAINERID", "../x", "CNI_CONTAINERID"),
    ("CNI_CONTAINERID", "-leadingdash", "must start with a letter or digit"),
    ("CNI_CONTAINERID", "x" * 201, "at most 200"),
    ("CNI_IFNAME", "a" * 16, "at most 15"),
    ("CNI_IFNAME", "net/1", "'/'"),
    ("CNI_IFNAME", "net:1", "':'"),
    ("CNI_IFNAME", "..", "'.' or '..'"),
    ("CNI_IFNAME", "net\t1", "whitespace"),
    ("CNI_NETNS", "relative/path", "absolute"),
    ("CNI_NETNS", "/run/netns/../../etc", "plain path"),
    ("CNI_COMMAND", "add", "allowed: ADD"),
])
def test_bad_env(var, value, needle):
    with pytest.raises(CniError) as err:
        parse_env({**BASE, var: value})
    assert err.value.code == 4 and needle in err.value.msg


def test_missing_variables_are_named():
    for var in ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"):
        env = dict(BASE)
        del env[var]
        with pytest.raises(CniError) as err:
            parse_env(env)
        assert err.value.code == 4 and var in err.value.msg
    with pytest.raises(CniError) as err:
        parse_env({})
    assert "CNI_COMMAND" in err.value.msg
