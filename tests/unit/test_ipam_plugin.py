"""ipam.plugin (the in-process API) and tenantnet.entry.ipam's handler, run through cni.skel in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni import skel
from cni.env import parse_env
from cni.errors import CniError, Code
from cni.netconf import parse_netconf
from ipam import plugin
from tenantnet.entry import ipam as ipam_main

pytestmark = pytest.mark.usefixtures("allow_tmp_ipam")


def raw_conf(tmp_path: Path, version: str = "1.0.0", **ipam: Any) -> dict[str, Any]:
    ipam.setdefault("ranges", [[{"subnet": "10.20.0.0/24"}], [{"subnet": "fd00:20::/64"}]])
    return {"cniVersion": version, "name": "blue", "type": "bridge",
            "ipam": {"type": "tenantnet-ipam", "dataDir": str(tmp_path), **ipam}}


def env(cid: str = "c1", ifname: str = "eth0", command: str = "ADD", args: str = "") -> Any:
    return parse_env({"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname,
                      "CNI_NETNS": "/var/run/netns/x", "CNI_ARGS": args})


def run(command: str, raw: dict[str, Any], cid: str = "c1", ifname: str = "eth0",
        args: str = "") -> tuple[int, dict[str, Any] | None]:
    environ = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname,
               "CNI_NETNS": "/var/run/netns/x", "CNI_ARGS": args, "CNI_PATH": "/usr/lib/cni"}
    code, out = skel.run(ipam_main.handle, environ, json.dumps(raw).encode())
    return code, json.loads(out) if out else None


def test_add_result_dual_stack_routes_dns_and_pod_identity(tmp_path: Path) -> None:
    raw = raw_conf(tmp_path, routes=[{"dst": "0.0.0.0/0"}], dns={"nameservers": ["10.20.0.53"]})
    code, out = run("ADD", raw, args="K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web;IgnoreUnknown=1")
    assert code == 0
    assert out == {
        "cniVersion": "1.0.0",
        "ips": [{"address": "10.20.0.2/24", "gateway": "10.20.0.1"},
                {"address": "fd00:20::2/64", "gateway": "fd00:20::1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.20.0.53"]},
    }
    store = plugin.open_store(str(tmp_path), create=False)
    assert store is not None
    (a4, a6) = store.allocations("blue")
    assert (a4.pod_namespace, a4.pod_name, a4.netns) == ("ns1", "web", "/var/run/netns/x")
    assert a4.created > 0 and a6.container_id == "c1"


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_result_is_emitted_in_the_config_version(tmp_path: Path, version: str) -> None:
    code, out = run("ADD", raw_conf(tmp_path, version=version))
    assert code == 0 and out is not None and out["cniVersion"] == version
    legacy = version.startswith("0.")
    assert ("version" in out["ips"][0]) is legacy
    assert "interfaces" not in out and "interface" not in out["ips"][0]


def test_add_is_idempotent_and_del_is_idempotent(tmp_path: Path) -> None:
    raw = raw_conf(tmp_path)
    _, first = run("ADD", raw)
    _, again = run("ADD", raw)
    assert first == again
    _, other_if = run("ADD", raw, ifname="net1")  # another interface is another attachment
    assert other_if != first
    assert run("DEL", raw) == (0, None)
    assert run("DEL", raw) == (0, None)
    store = plugin.open_store(str(tmp_path), create=False)
    assert store is not None
    assert {a.ifname for a in store.allocations()} == {"net1"}


def test_del_with_nothing_allocated_creates_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "never"
    raw = raw_conf(data_dir)
    raw["ipam"]["ranges"] = "garbage"  # DEL needs only dataDir: it must still succeed
    assert run("DEL", raw) == (0, None)
    assert not data_dir.exists()


def test_static_requests_from_all_three_sources(tmp_path: Path) -> None:
    raw = raw_conf(tmp_path)
    raw["runtimeConfig"] = {"IPs": ["10.20.0.50/24"]}  # containerd capitalises keys
    _, out = run("ADD", raw, cid="a")
    assert out is not None and out["ips"][0]["address"] == "10.20.0.50/24"
    raw = raw_conf(tmp_path)
    _, out = run("ADD", raw, cid="b", args="IgnoreUnknown=1;IP=fd00:20::99")
    assert out is not None and out["ips"][1]["address"] == "fd00:20::99/64"
    raw = raw_conf(tmp_path)
    raw["args"] = {"cni": {"ips": ["10.20.0.60", "fd00:20::60"]}}
    _, out = run("ADD", raw, cid="c")
    assert out is not None
    assert [i["address"] for i in out["ips"]] == ["10.20.0.60/24", "fd00:20::60/64"]


def test_taken_static_address_is_111_as_json(tmp_path: Path) -> None:
    raw = raw_conf(tmp_path)
    raw["runtimeConfig"] = {"ips": ["10.20.0.50"]}
    assert run("ADD", raw, cid="a")[0] == 0
    code, out = run("ADD", raw, cid="b")
    assert code == 1 and out is not None
    assert out["code"] == 111 and "10.20.0.50" in out["msg"] and out["cniVersion"] == "1.0.0"


def test_check_passes_then_detects_drift(tmp_path: Path) -> None:
    raw = raw_conf(tmp_path)
    _, result = run("ADD", raw)
    assert result is not None
    conf_with_prev = dict(raw, prevResult=result)
    assert run("CHECK", conf_with_prev) == (0, None)
    # a prevResult that claims another address of our range
    wrong = json.loads(json.dumps(result))
    wrong["ips"][0]["address"] = "10.20.0.77/24"
    code, out = run("CHECK", dict(raw, prevResult=wrong))
    assert code == 1 and out is not None and out["code"] == Code.CHECK_FAILED
    assert "10.20.0.2" in out["msg"] or "10.20.0.77" in out["msg"]
    # the config gained a range set the attachment has no address from
    raw3 = raw_conf(tmp_path, ranges=[[{"subnet": "10.20.0.0/24"}], [{"subnet": "fd00:20::/64"}],
                                      [{"subnet": "10.21.0.0/24"}]])
    code, out = run("CHECK", raw3)
    assert out is not None and out["code"] == 103 and "range set 2" in out["msg"]
    run("DEL", raw)
    code, out = run("CHECK", raw)
    assert out is not None and out["code"] == 103 and "holds no address" in out["msg"]


def test_gc_releases_everything_not_valid_and_only_in_its_network(tmp_path: Path) -> None:
    raw = raw_conf(tmp_path)
    for cid in ("keep", "gone1", "gone2"):
        run("ADD", raw, cid=cid)
    other = dict(raw, name="red")
    run("ADD", other, cid="gone1")
    gc_conf = dict(raw, **{"cni.dev/valid-attachments": [{"containerID": "keep",
                                                          "ifname": "eth0"}]})
    environ = {"CNI_COMMAND": "GC", "CNI_PATH": "/usr/lib/cni"}
    assert skel.run(ipam_main.handle, environ, json.dumps(gc_conf).encode()) == (0, "")
    store = plugin.open_store(str(tmp_path), create=False)
    assert store is not None
    assert {(a.network, a.container_id) for a in store.allocations()} == {
        ("blue", "keep"), ("red", "gone1")}


def test_status_reports_exhaustion_as_50(tmp_path: Path) -> None:
    raw = raw_conf(tmp_path, ranges=[[{"subnet": "10.22.0.0/30"}]])
    conf = parse_netconf(raw)
    plugin.status(conf)  # empty pool: available
    plugin.add(env(), conf)
    with pytest.raises(CniError) as info:
        plugin.status(conf)
    assert info.value.code == Code.NOT_AVAILABLE and "'blue'" in info.value.msg
    assert "10.22.0.0/30" in info.value.msg


def test_status_reports_unusable_data_dir_as_50(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    conf = parse_netconf(raw_conf(blocker / "sub"))
    with pytest.raises(CniError) as info:
        plugin.status(conf)
    assert info.value.code == Code.NOT_AVAILABLE and str(blocker) in info.value.msg


def test_resolv_conf_fills_dns(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# comment\nnameserver 10.0.0.53\nnameserver fd00::53\n"
                      "search a.example b.example\noptions ndots:2\ndomain example\n")
    conf = parse_netconf(raw_conf(tmp_path / "s", resolvConf=str(resolv)))
    result = plugin.add(env(), conf)
    assert result.dns.nameservers == ["10.0.0.53", "fd00::53"]
    assert result.dns.search == ["a.example", "b.example"]
    assert result.dns.options == ["ndots:2"] and result.dns.domain == "example"


def test_store_file_is_private(tmp_path: Path) -> None:
    plugin.add(env(), parse_netconf(raw_conf(tmp_path)))
    assert os.stat(tmp_path / "ipam.db").st_mode & 0o077 == 0


def test_version_is_answered_without_config() -> None:
    code, out = skel.run(ipam_main.handle, {"CNI_COMMAND": "VERSION"}, b"")
    assert code == 0 and "1.0.0" in json.loads(out)["supportedVersions"]
