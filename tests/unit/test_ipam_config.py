"""ipam.config: host-local and whereabouts fields, and the errors a user gets for bad ones."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

import pytest

from cni.env import parse_env
from cni.errors import CniError, Code
from cni.netconf import parse_netconf
from ipam import plugin
from ipam.config import DEFAULT_DATA_DIR, parse_ipam

pytestmark = pytest.mark.usefixtures("allow_tmp_ipam")


def ip(text: str) -> int:
    return int(ipaddress.ip_address(text))


def test_host_local_defaults_skip_network_gateway_and_broadcast() -> None:
    cfg = parse_ipam({"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.1.0.0/24"}]]})
    (rs,) = cfg.range_sets
    (r,) = rs.ranges
    assert r.gateway == ipaddress.ip_address("10.1.0.1")
    assert (r.start, r.end) == (ip("10.1.0.1"), ip("10.1.0.254"))
    # .0 network, .1 gateway, .255 broadcast are never in an allocatable segment
    assert r.segments() == [(ip("10.1.0.2"), ip("10.1.0.254"))]
    assert cfg.data_dir == DEFAULT_DATA_DIR


def test_host_local_full_fields_and_dual_stack() -> None:
    cfg = parse_ipam({
        "type": "host-local",
        "ranges": [
            [{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.20",
              "gateway": "10.1.0.254"}],
            [{"subnet": "fd00:1::/64"}],
        ],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254"}],
        "dataDir": "/run/x/ipam",
        "resolvConf": "/etc/resolv.conf",
    })
    v4, v6 = cfg.range_sets
    assert v4.ranges[0].segments() == [(ip("10.1.0.10"), ip("10.1.0.20"))]
    assert v6.family == 6
    # IPv6 has no broadcast: the last address is allocatable; ::1 is the default gateway
    assert v6.ranges[0].segments() == [(ip("fd00:1::2"), ip("fd00:1::ffff:ffff:ffff:ffff"))]
    assert [str(r.dst) for r in cfg.routes] == ["0.0.0.0/0", "192.168.0.0/16"]
    assert str(cfg.routes[1].gw) == "10.1.0.254"
    assert cfg.data_dir == "/run/x/ipam" and cfg.resolv_conf == "/etc/resolv.conf"


def test_host_local_legacy_single_subnet() -> None:
    cfg = parse_ipam({"subnet": "10.2.0.0/16", "rangeStart": "10.2.1.0", "rangeEnd": "10.2.1.9"})
    assert cfg.range_sets[0].ranges[0].segments() == [(ip("10.2.1.0"), ip("10.2.1.9"))]


def test_whereabouts_short_form_exclude_and_gateway() -> None:
    cfg = parse_ipam({
        "range": "10.3.0.10-10.3.0.20/24",
        "exclude": ["10.3.0.12/31", "10.3.0.16/32"],
        "gateway": "10.3.0.15",
    })
    r = cfg.range_sets[0].ranges[0]
    assert str(r.subnet) == "10.3.0.0/24"
    assert r.segments() == [
        (ip("10.3.0.10"), ip("10.3.0.11")),
        (ip("10.3.0.14"), ip("10.3.0.14")),
        (ip("10.3.0.17"), ip("10.3.0.20")),
    ]


def test_whereabouts_range_start_end_and_no_default_gateway() -> None:
    cfg = parse_ipam({"range": "10.4.0.0/24", "range_start": "10.4.0.100",
                      "range_end": "10.4.0.101"})
    r = cfg.range_sets[0].ranges[0]
    assert r.gateway is None
    assert r.segments() == [(ip("10.4.0.100"), ip("10.4.0.101"))]


def test_whereabouts_ip_ranges_dual_stack() -> None:
    cfg = parse_ipam({"ipRanges": [{"range": "10.5.0.0/28"}, {"range": "fd00:5::/120"}]})
    assert [rs.family for rs in cfg.range_sets] == [4, 6]


def test_dns_object() -> None:
    cfg = parse_ipam({"range": "10.6.0.0/24",
                      "dns": {"nameservers": ["10.6.0.53"], "search": ["svc.local"]}})
    assert cfg.dns.nameservers == ["10.6.0.53"] and cfg.dns.search == ["svc.local"]


# ---- bad configurations: code, message naming field and value, nothing recorded ------------

R = [[{"subnet": "10.9.0.0/24"}]]

BAD: list[tuple[str, dict[str, Any], int, list[str]]] = [
    ("no ranges", {}, 7, ["ipam.ranges", "no addresses configured"]),
    ("ranges not a list", {"ranges": {"subnet": "10.9.0.0/24"}}, 7,
     ["ipam.ranges", "must be a JSON list"]),
    ("ranges empty", {"ranges": []}, 7, ["ipam.ranges=[]", "must not be empty"]),
    ("range set empty", {"ranges": [[]]}, 7, ["ipam.ranges[0]=[]", "must not be empty"]),
    ("range not an object", {"ranges": [["10.9.0.0/24"]]}, 7,
     ["ipam.ranges[0][0]='10.9.0.0/24'", "JSON object"]),
    ("subnet missing", {"ranges": [[{"rangeStart": "10.9.0.5"}]]}, 7,
     ["ipam.ranges[0][0].subnet", "is required"]),
    ("subnet garbage", {"ranges": [[{"subnet": "10.9.0.0/33"}]]}, 7,
     ["ipam.ranges[0][0].subnet='10.9.0.0/33'", "CIDR"]),
    ("subnet without prefix", {"ranges": [[{"subnet": "10.9.0.0"}]]}, 7,
     ["ipam.ranges[0][0].subnet='10.9.0.0'", "CIDR"]),
    ("subnet too small", {"ranges": [[{"subnet": "10.9.0.0/31"}]]}, 7,
     ["ipam.ranges[0][0].subnet='10.9.0.0/31'", "too small", "/30"]),
    ("rangeStart not an IP", {"ranges": [[{"subnet": "10.9.0.0/24", "rangeStart": "x"}]]}, 7,
     ["ipam.ranges[0][0].rangeStart='x'", "IPv4 or IPv6 address"]),
    ("rangeStart outside", {"ranges": [[{"subnet": "10.9.0.0/24", "rangeStart": "10.8.0.5"}]]},
     7, ["rangeStart='10.8.0.5'", "inside subnet 10.9.0.0/24"]),
    ("rangeEnd is broadcast", {"ranges": [[{"subnet": "10.9.0.0/24", "rangeEnd": "10.9.0.255"}]]},
     7, ["rangeEnd='10.9.0.255'", "broadcast"]),
    ("start after end", {"ranges": [[{"subnet": "10.9.0.0/24", "rangeStart": "10.9.0.50",
                                      "rangeEnd": "10.9.0.40"}]]}, 7,
     ["rangeStart='10.9.0.50'", "must not be after rangeEnd 10.9.0.40"]),
    ("gateway outside", {"ranges": [[{"subnet": "10.9.0.0/24", "gateway": "10.9.1.1"}]]}, 7,
     ["gateway='10.9.1.1'", "inside subnet"]),
    ("gateway wrong family", {"ranges": [[{"subnet": "10.9.0.0/24", "gateway": "fd00::1"}]]}, 7,
     ["gateway='fd00::1'", "IPv4"]),
    ("mixed families in a set", {"ranges": [[{"subnet": "10.9.0.0/24"},
                                             {"subnet": "fd00::/64"}]]}, 7,
     ["ipam.ranges[0][1].subnet='fd00::/64'", "one family per range set"]),
    ("overlapping ranges", {"ranges": [[{"subnet": "10.9.0.0/24"}], [{"subnet": "10.9.0.0/25"}]]},
     7, ["ipam.ranges[1][0].subnet", "overlaps ipam.ranges[0][0]"]),
    ("exclude not a list", {"ranges": R, "exclude": "10.9.0.0/28"}, 7,
     ["ipam.exclude='10.9.0.0/28'", "JSON list"]),
    ("exclude garbage", {"range": "10.9.0.0/24", "exclude": ["10.9.0.300/32"]}, 7,
     ["ipam.exclude[0]='10.9.0.300/32'", "CIDR"]),
    ("exclude everything", {"range": "10.9.0.0/24", "exclude": ["10.9.0.0/24"]}, 7,
     ["ipam", "leaves no address to hand out"]),
    ("whereabouts reversed", {"range": "10.9.0.50-10.9.0.10/24"}, 7,
     ["range_start='10.9.0.50'", "must not be after range_end 10.9.0.10"]),
    ("whereabouts no prefix", {"range": "10.9.0.10-10.9.0.50"}, 7,
     ["ipam.range='10.9.0.10-10.9.0.50'", "needs /PREFIX"]),
    ("whereabouts range_end outside", {"range": "10.9.0.0/24", "range_end": "10.10.0.1"}, 7,
     ["ipam.range_end='10.10.0.1'", "inside subnet"]),
    ("both styles", {"ranges": R, "range": "10.9.0.0/24"}, 7,
     ["ipam.range='10.9.0.0/24'", "cannot be combined with ipam.ranges"]),
    ("dataDir relative", {"ranges": R, "dataDir": "ipam"}, 7,
     ["ipam.dataDir='ipam'", "absolute path"]),
    ("dataDir with ..", {"ranges": R, "dataDir": "/var/lib/../../etc"}, 7,
     ["ipam.dataDir='/var/lib/../../etc'", "'..'"]),
    ("route dst garbage", {"ranges": R, "routes": [{"dst": "default"}]}, 7,
     ["ipam.routes[0].dst='default'", "CIDR"]),
    ("route gw wrong family", {"ranges": R, "routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]},
     7, ["ipam.routes[0].gw='fd00::1'", "IPv4"]),
    ("dns not an object", {"ranges": R, "dns": ["10.0.0.53"]}, 7,
     ["ipam.dns=['10.0.0.53']", "JSON object"]),
    ("dns nameserver garbage", {"ranges": R, "dns": {"nameservers": ["dns.example"]}}, 7,
     ["ipam.dns.nameservers[0]='dns.example'", "IPv4 or IPv6"]),
    ("resolvConf relative", {"ranges": R, "resolvConf": "resolv.conf"}, 7,
     ["ipam.resolvConf='resolv.conf'", "absolute path"]),
    ("resolvConf missing", {"ranges": R, "resolvConf": "/nonexistent/resolv.conf"}, 7,
     ["ipam.resolvConf='/nonexistent/resolv.conf'", "allowed directories"]),
]


def _conf(ipam: dict[str, Any], **extra: Any) -> Any:
    raw = {"cniVersion": "1.0.0", "name": "net1", "type": "bridge", "ipam": ipam, **extra}
    return parse_netconf(raw)


def _env(**args: str) -> Any:
    environ = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/t",
               "CNI_IFNAME": "eth0"}
    environ.update(args)
    return parse_env(environ)


def test_there_are_at_least_twenty_bad_configurations() -> None:
    assert len(BAD) >= 20


@pytest.mark.parametrize(("ipam", "code", "needles"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_configuration_is_a_clear_error_and_records_nothing(
    tmp_path: Path, ipam: dict[str, Any], code: int, needles: list[str]
) -> None:
    data_dir = tmp_path / "store"
    ipam = {"type": "tenantnet-ipam", "dataDir": str(data_dir), **ipam}
    with pytest.raises(CniError) as info:
        plugin.add(_env(), _conf(ipam))
    assert info.value.code == code
    for needle in needles:
        assert needle in info.value.msg, info.value.msg
    # validated before the store is touched: not even the directory exists
    assert not data_dir.exists()


@pytest.mark.parametrize(
    ("extra", "env_args", "needle"),
    [
        ({"runtimeConfig": {"ips": ["not-an-ip"]}}, {}, "runtimeConfig.ips[0]='not-an-ip'"),
        ({"runtimeConfig": {"IPs": [5]}}, {}, "runtimeConfig.ips[0]=5"),
        ({"args": {"cni": {"ips": ["10.9.0.x"]}}}, {}, "args.cni.ips[0]='10.9.0.x'"),
    ],
)
def test_bad_static_request_is_code_7_and_records_nothing(
    tmp_path: Path, extra: dict[str, Any], env_args: dict[str, str], needle: str
) -> None:
    data_dir = tmp_path / "store"
    conf = _conf({"dataDir": str(data_dir), "ranges": R}, **extra)
    with pytest.raises(CniError) as info:
        plugin.add(_env(**env_args), conf)
    assert info.value.code == Code.INVALID_CONFIG
    assert needle in info.value.msg
    assert not data_dir.exists()


def test_bad_cni_args_ip_is_rejected_by_env_parsing() -> None:
    with pytest.raises(CniError) as info:
        _env(CNI_ARGS="IP=10.9.0.999")
    assert info.value.code == Code.INVALID_ENV and "IP='10.9.0.999'" in info.value.msg


def test_unavailable_static_address_records_nothing(tmp_path: Path) -> None:
    conf = _conf({"dataDir": str(tmp_path), "ranges": R, "exclude": ["10.9.0.64/26"]},
                 runtimeConfig={"ips": ["10.9.0.70/24"]})
    with pytest.raises(CniError) as info:
        plugin.add(_env(), conf)
    assert info.value.code == Code.ADDRESS_UNAVAILABLE
    assert "10.9.0.70" in info.value.msg and "excluded (10.9.0.64/26)" in info.value.msg
    store = plugin.open_store(str(tmp_path), create=False)
    assert store is not None and store.allocations() == []
    assert os.listdir(tmp_path)  # the store exists; it simply holds nothing


def _sets(n: int) -> list[list[dict[str, str]]]:
    return [[{"subnet": f"10.{i // 256}.{i % 256}.0/24"}] for i in range(n)]


@pytest.mark.parametrize(("ipam", "field"), [
    ({"ranges": _sets(1000)}, "ipam.ranges"),
    ({"ranges": _sets(17)}, "ipam.ranges"),
    ({"range": "10.200.0.0/24",
      "ipRanges": [{"range": f"10.{i}.0.0/24"} for i in range(16)]}, "ipam.ipRanges"),
])
def test_more_range_sets_than_the_limit_are_refused_naming_field_count_and_limit(
        tmp_path: Path, ipam: dict[str, Any], field: str) -> None:
    from ipam.config import MAX_RANGE_SETS

    count = len(ipam.get("ranges") or ipam["ipRanges"]) + ("range" in ipam)
    data_dir = tmp_path / "store"
    with pytest.raises(CniError) as info:
        plugin.add(_env(), _conf({"type": "tenantnet-ipam", "dataDir": str(data_dir), **ipam}))
    assert info.value.code == Code.INVALID_CONFIG
    assert f"{field}='{count} range sets'" in info.value.msg, info.value.msg
    assert f"at most {MAX_RANGE_SETS} range sets" in info.value.msg
    assert not data_dir.exists()


def test_the_limit_itself_is_accepted() -> None:
    from ipam.config import MAX_RANGE_SETS

    cfg = parse_ipam({"type": "tenantnet-ipam", "ranges": _sets(MAX_RANGE_SETS)})
    assert len(cfg.range_sets) == MAX_RANGE_SETS
