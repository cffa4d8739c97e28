"""tenantnet.ops.ipamctl (`tenantnetctl ipam …`) and the host-local import, on a temporary store."""

from __future__ import annotations

import argparse
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from cni.env import parse_env
from cni.netconf import parse_netconf
from ipam import plugin
from tenantnet.ops import ipamctl as cli

pytestmark = pytest.mark.usefixtures("allow_tmp_ipam")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tenantnetctl")
    cli.register(p.add_subparsers(dest="command", required=True))
    return p


def ctl(capsys: Any, *argv: str) -> tuple[int, str, str]:
    args = parser().parse_args(list(argv))
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def allocate(data_dir: Path, cid: str, netns: str, network: str = "blue") -> None:
    conf = parse_netconf({"cniVersion": "1.0.0", "name": network, "type": "bridge",
                          "ipam": {"dataDir": str(data_dir),
                                   "ranges": [[{"subnet": "10.30.0.0/24"}]]}})
    env = parse_env({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0",
                     "CNI_NETNS": netns,
                     "CNI_ARGS": f"K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-{cid};IgnoreUnknown=1"})
    plugin.add(env, conf)


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    live_netns = tmp_path / "netns-live"
    live_netns.write_text("")
    allocate(tmp_path, "alive", str(live_netns))  # 10.30.0.2
    allocate(tmp_path, "dead", str(tmp_path / "netns-gone"))  # 10.30.0.3
    allocate(tmp_path, "dead", str(tmp_path / "netns-gone"), network="red")  # red 10.30.0.2
    return tmp_path


def test_ls_table_and_json(capsys: Any, populated: Path) -> None:
    code, out, _ = ctl(capsys, "ipam", "ls", "--data-dir", str(populated))
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["NETWORK", "ADDRESS", "CONTAINER", "IFNAME", "POD",
                                              "CREATED"]
    assert lines[1].split()[:5] == ["blue", "10.30.0.2", "alive", "eth0", "ns/pod-alive"]
    code, out, _ = ctl(capsys, "ipam", "ls", "--network", "red", "--json",
                       "--data-dir", str(populated))
    rows = json.loads(out)
    assert code == 0 and [(r["network"], r["address"], r["containerID"]) for r in rows] == [
        ("red", "10.30.0.2", "dead")]


def test_ls_without_store_says_where_it_looked(capsys: Any, tmp_path: Path) -> None:
    code, _, err = ctl(capsys, "ipam", "ls", "--data-dir", str(tmp_path / "none"))
    assert code == 1 and "no IPAM store in" in err and str(tmp_path / "none") in err


def test_show_and_release(capsys: Any, populated: Path) -> None:
    code, out, _ = ctl(capsys, "ipam", "show", "10.30.0.3", "--data-dir", str(populated))
    assert code == 0 and "dead" in out and "pod-dead" in out
    # 10.30.0.2 is held in two networks: release must be told which
    code, _, err = ctl(capsys, "ipam", "release", "10.30.0.2", "--data-dir", str(populated))
    assert code == 1 and "several networks (blue, red)" in err
    code, out, _ = ctl(capsys, "ipam", "release", "10.30.0.2", "--network", "red", "--json",
                       "--data-dir", str(populated))
    assert code == 0 and json.loads(out)[0]["network"] == "red"
    code, _, err = ctl(capsys, "ipam", "show", "10.30.0.2", "--network", "red",
                       "--data-dir", str(populated))
    assert code == 1 and "not allocated in network 'red'" in err
    code, _, err = ctl(capsys, "ipam", "show", "banana", "--data-dir", str(populated))
    assert code == 1 and "'banana' is not an IPv4 or IPv6 address" in err


def test_gc_by_netns(capsys: Any, populated: Path) -> None:
    code, out, _ = ctl(capsys, "ipam", "gc", "--dry-run", "--data-dir", str(populated))
    assert code == 0 and out.count("would release") == 2
    assert len(plugin.open_store(str(populated)).allocations()) == 3  # type: ignore[union-attr]
    code, out, _ = ctl(capsys, "ipam", "gc", "--json", "--data-dir", str(populated))
    released = json.loads(out)["released"]
    assert {(r["network"], r["containerID"]) for r in released} == {("blue", "dead"),
                                                                    ("red", "dead")}
    left = plugin.open_store(str(populated)).allocations()  # type: ignore[union-attr]
    assert [a.container_id for a in left] == ["alive"]


def test_gc_with_keep_file(capsys: Any, populated: Path) -> None:
    keep = populated / "keep.json"
    keep.write_text(json.dumps({"cni.dev/valid-attachments": [
        {"containerID": "dead", "ifname": "eth0"}]}))
    code, _, _ = ctl(capsys, "ipam", "gc", "--network", "blue", "--keep-file", str(keep),
                     "--data-dir", str(populated))
    assert code == 0
    left = plugin.open_store(str(populated)).allocations()  # type: ignore[union-attr]
    assert {(a.network, a.container_id) for a in left} == {("blue", "dead"), ("red", "dead")}
    keep.write_text("[{\"ifname\": 3}]")
    code, _, err = ctl(capsys, "ipam", "gc", "--keep-file", str(keep),
                       "--data-dir", str(populated))
    assert code == 1 and "cannot use --keep-file" in err


def host_local_dir(root: Path) -> Path:
    """host-local's layout: <dataDir>/<network>/<ip> and last_reserved_ip.<n>."""
    net = root / "blue"
    net.mkdir(parents=True)
    (net / "10.30.0.7").write_text("ctr-a\r\neth0")
    (net / "10.30.0.8").write_text("ctr-b\r\nnet1")
    (net / "10.30.0.9").write_text("ctr-old")  # pre-0.7 format: no interface name
    (net / "fd00:30::7").write_text("ctr-a\r\neth0")
    (net / "last_reserved_ip.0").write_text("10.30.0.9")
    (net / "last_reserved_ip.1").write_text("fd00:30::7")
    (net / "lock").write_text("")
    return root


def test_import_host_local_then_allocation_continues_after_its_cursor(capsys: Any,
                                                                      tmp_path: Path) -> None:
    src = host_local_dir(tmp_path / "cni-networks")
    store_dir = tmp_path / "store"
    code, out, _ = ctl(capsys, "ipam", "import-host-local", str(src), "--dry-run",
                       "--data-dir", str(store_dir))
    assert code == 0 and "would import 4" in out
    assert plugin.open_store(str(store_dir)).allocations() == []  # type: ignore[union-attr]
    code, out, _ = ctl(capsys, "ipam", "import-host-local", str(src), "--json",
                       "--data-dir", str(store_dir))
    report = json.loads(out)
    assert code == 0 and report["recorded"] and len(report["imported"]) == 4
    held = {(str(a.address), a.container_id, a.ifname)
            for a in plugin.open_store(str(store_dir)).allocations()}  # type: ignore[union-attr]
    assert held == {("10.30.0.7", "ctr-a", "eth0"), ("10.30.0.8", "ctr-b", "net1"),
                    ("10.30.0.9", "ctr-old", "eth0"), ("fd00:30::7", "ctr-a", "eth0")}
    # importing again is harmless
    code, out, _ = ctl(capsys, "ipam", "import-host-local", str(src), "--data-dir", str(store_dir))
    assert code == 0 and "imported 0" in out and "4 already present" in out
    # the same ADD as host-local would get: ctr-a is unchanged, a new one continues after .9
    conf = parse_netconf({"cniVersion": "1.0.0", "name": "blue", "type": "bridge",
                          "ipam": {"type": "tenantnet-ipam", "dataDir": str(store_dir),
                                   "ranges": [[{"subnet": "10.30.0.0/24"}],
                                              [{"subnet": "fd00:30::/64"}]]}})

    def add(cid: str) -> list[str]:
        env = parse_env({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0",
                         "CNI_NETNS": "/x"})
        return [str(ip.address) for ip in plugin.add(env, conf).ips]

    assert add("ctr-a") == ["10.30.0.7/24", "fd00:30::7/64"]
    assert add("ctr-new") == ["10.30.0.10/24", "fd00:30::8/64"]


def test_import_conflict_records_nothing(capsys: Any, tmp_path: Path) -> None:
    src = host_local_dir(tmp_path / "cni-networks")
    store_dir = tmp_path / "store"
    conf = parse_netconf({"cniVersion": "1.0.0", "name": "blue", "type": "bridge",
                          "ipam": {"dataDir": str(store_dir),
                                   "ranges": [[{"subnet": "10.30.0.0/24"}]]},
                          "runtimeConfig": {"ips": ["10.30.0.8"]}})
    plugin.add(parse_env({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "someone-else",
                          "CNI_IFNAME": "eth0", "CNI_NETNS": "/x"}), conf)
    code, out, _ = ctl(capsys, "ipam", "import-host-local", str(src / "blue"),
                       "--data-dir", str(store_dir))
    assert code == 1 and "conflict: 10.30.0.8 (blue) is ctr-b net1" in out
    assert "nothing recorded" in out
    held = plugin.open_store(str(store_dir)).allocations()  # type: ignore[union-attr]
    assert [(a.address, a.container_id) for a in held] == [
        (ipaddress.ip_address("10.30.0.8"), "someone-else")]


def test_import_missing_dir_is_an_error(capsys: Any, tmp_path: Path) -> None:
    code, _, err = ctl(capsys, "ipam", "import-host-local", str(tmp_path / "nope"),
                       "--data-dir", str(tmp_path / "s"))
    assert code == 1 and "is not a directory" in err
