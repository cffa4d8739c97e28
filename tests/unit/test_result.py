"""The result model in each spec version's shape."""

from __future__ import annotations

import pytest

from cni.errors import CniError
from cni.result import Result

FULL = {
    "cniVersion": "1.1.0",
    "interfaces": [{"name": "tnabc", "mac": "02:00:00:00:00:01"},
                   {"name": "net1", "mac": "02:00:00:00:00:02", "mtu": 1400, "sandbox": "/run/netns/p",
                    "pciID": "0000:03:00.2", "socketPath": "/run/x.sock"}],
    "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 1},
            {"address": "fd00::2/64", "interface": 1}],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1", "mtu": 1400, "advmss": 1360, "priority": 5,
                "table": 100, "scope": 0}],
    "dns": {"nameservers": ["10.0.0.53"], "search": ["a.local"]},
}


def test_roundtrip_1_1_0():
    assert Result.from_dict(FULL).to_dict("1.1.0") == FULL


def test_1_0_0_drops_1_1_fields():
    out = Result.from_dict(FULL).to_dict("1.0.0")
    assert out["interfaces"][1] == {"name": "net1", "mac": "02:00:00:00:00:02", "sandbox": "/run/netns/p"}
    assert out["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}]
    assert "version" not in out["ips"][0]


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0"])
def test_legacy_versions_carry_ip_version(version):
    out = Result.from_dict(FULL).to_dict(version)
    assert out["cniVersion"] == version
    assert [ip["version"] for ip in out["ips"]] == ["4", "6"]
    assert "mtu" not in out["interfaces"][1]


def test_ipam_result_has_no_interfaces():
    out = Result.from_dict(FULL).to_dict("1.0.0", ipam=True)
    assert "interfaces" not in out
    assert all("interface" not in ip for ip in out["ips"])


def test_legacy_input_is_accepted():
    legacy = {"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.1.0.2/16", "gateway": "10.1.0.1"}],
              "dns": {}}
    r = Result.from_dict(legacy)
    assert str(r.ips[0].address) == "10.1.0.2/16" and r.dns.empty()


@pytest.mark.parametrize("bad", [
    {"ips": [{"address": "nonsense"}]},
    {"ips": [{"address": "10.0.0.1/24", "interface": -1}]},
    {"interfaces": [{"mac": "x"}]},
    {"routes": [{"gw": "10.0.0.1"}]},
    {"dns": {"nameservers": "10.0.0.53"}},
    [],
])
def test_undecodable_results(bad):
    with pytest.raises(CniError) as err:
        Result.from_dict(bad, "prevResult")
    assert err.value.code == 6 and "prevResult" in err.value.msg
