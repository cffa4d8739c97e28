"""The plain rtnetlink path against the real kernel: a veth born in a pod netns, addresses and
routes there, renames, moves, deletes — checked with iproute2's own view."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tenantnet.plugin.system import netlink


@pytest.fixture
def host_name() -> Iterator[str]:
    name = f"tnr{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


def ip_json(ns: Any, *args: str) -> Any:
    return json.loads(ns.run("ip", "-j", *args, check=True).stdout or "[]")


def test_veth_into_netns_configure_read_delete(netns_factory: Any, host_name: str) -> None:
    ns = netns_factory()
    netlink.create_veth_into_netns(host_name, "net1", ns.path, mtu=1400, pod_mac="02:00:00:12:34:56")
    host = netlink.host_link(host_name)
    assert host is not None and host.up and host.mtu == 1400 and host.kind == "veth"
    plan = netlink.AddressPlan(
        addresses=[ipaddress.ip_interface("10.77.0.5/24"), ipaddress.ip_interface("fd77::5/64")],
        routes=[("0.0.0.0/0", "10.77.0.1"), ("192.168.77.0/24", None)])
    state = netlink.configure_pod_interface(ns.path, "net1", plan)
    assert state.mac == "02:00:00:12:34:56" and state.mtu == 1400 and state.up
    assert {"10.77.0.5/24", "fd77::5/64"} <= set(state.addresses)
    # A repeated ADD configures the same again without error.
    netlink.configure_pod_interface(ns.path, "net1", plan)

    links = {link["ifname"]: link for link in ip_json(ns, "link", "show")}
    assert "UP" in links["net1"]["flags"] and "UP" in links["lo"]["flags"]
    routes = ip_json(ns, "route", "show")
    assert {"dst": "default", "gateway": "10.77.0.1"}.items() <= next(r for r in routes if r["dst"] == "default").items()
    direct = next(r for r in routes if r["dst"] == "192.168.77.0/24")
    assert direct["dev"] == "net1" and direct.get("scope") == "link"

    pod = netlink.pod_link(ns.path, "net1")
    assert pod is not None and pod.index == state.index
    assert netlink.pod_link(ns.path, "nope") is None

    netlink.set_pod_link(ns.path, "net1", new_name="net9", mtu=1300, up=True)
    renamed = netlink.pod_link(ns.path, "net9")
    assert renamed is not None and renamed.mtu == 1300 and renamed.up

    assert netlink.delete_host_link(host_name) is True
    assert netlink.host_link(host_name) is None
    assert "net9" not in {link["ifname"] for link in ip_json(ns, "link", "show")}
    assert netlink.delete_host_link(host_name) is False  # DEL may come twice


def test_errors_are_named(netns_factory: Any, host_name: str) -> None:
    ns = netns_factory()
    netlink.create_veth_into_netns(host_name, "net1", ns.path, mtu=None, pod_mac=None)
    with pytest.raises(netlink.LinkExists):
        netlink.create_veth_into_netns(host_name, "net2", ns.path, mtu=None, pod_mac=None)
    with pytest.raises(netlink.LinkNotFound):
        netlink.configure_pod_interface(ns.path, "absent", netlink.AddressPlan())
    with pytest.raises(netlink.NamespaceNotFound):
        netlink.pod_link("/run/netns/tnt-does-not-exist", "net1")


def test_move_to_netns_and_back(netns_factory: Any, host_name: str) -> None:
    ns = netns_factory()
    peer = host_name + "p"
    subprocess.run(["ip", "link", "add", host_name, "type", "veth", "peer", "name", peer], check=True)
    netlink.move_to_netns(peer, ns.path)
    assert netlink.host_link(peer) is None and netlink.pod_link(ns.path, peer) is not None
    assert netlink.return_to_host(ns.path, peer, host_name + "q") is True
    back = netlink.host_link(host_name + "q")
    assert back is not None and not back.up
    assert netlink.return_to_host(ns.path, peer, host_name + "q") is False
