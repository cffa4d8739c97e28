"""The plain rtnetlink path against the real kernel: a veth born in a pod netns, addresses and
routes there, renames, moves (also moved and configured in one request), deletes — checked
with iproute2's own view."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tenantnet.plugin.system import netlink, rtnl
from tenantnet.plugin.system.netns import open_netns_fd, open_rtnl


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

    assert netlink.delete_host_link(host_name) is True
    assert netlink.host_link(host_name) is None
    assert "net1" not in {link["ifname"] for link in ip_json(ns, "link", "show")}
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


def link_in(ns: Any, name: str) -> tuple[str, str, int, bool, str] | None:
    """(name, MAC, MTU, up, alias) of `name` in `ns` (None: the host), as iproute2 sees it."""
    cmd = ["ip", "-j", "link", "show", "dev", name]
    proc = ns.run(*cmd) if ns else subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        return None
    d = json.loads(proc.stdout)[0]
    return d["ifname"], d["address"], d["mtu"], "UP" in d["flags"], d.get("ifalias", "")


POD_SIDE = rtnl.LinkChange(name="net1", mac="02:aa:00:00:00:01", mtu=1450, alias="tenantnet:mark")


def move_in(name: str, ns: Any) -> None:
    fd = open_netns_fd(ns.path)
    try:
        rt = rtnl.host()
        link = rt.link(name)
        assert link is not None
        rt.move_link(link.index, POD_SIDE, netns_fd=fd)
    finally:
        os.close(fd)


@pytest.fixture
def vf_like(host_name: str) -> str:
    """A down host netdev with a peer, as the lab's VF netdevs are."""
    subprocess.run(["ip", "link", "add", host_name, "type", "veth", "peer", "name", host_name + "p"], check=True)
    return host_name


@pytest.mark.parametrize("taken", [(), ("own name",)])
def test_move_link_moves_renames_and_configures_in_one_request(netns_factory: Any, vf_like: str,
                                                                taken: tuple[str, ...]) -> None:
    ns = netns_factory()
    if taken:  # the netdev's own name is taken in the pod: the kernel gives it the new name on the way
        ns.run("ip", "link", "add", vf_like, "type", "veth", "peer", "name", "other", check=True)
    move_in(vf_like, ns)
    assert link_in(ns, "net1") == ("net1", "02:aa:00:00:00:01", 1450, False, "tenantnet:mark")
    assert link_in(None, vf_like) is None


def test_move_link_refused_before_the_move_leaves_the_link_home(netns_factory: Any, vf_like: str) -> None:
    ns = netns_factory()
    for name, peer in ((vf_like, "other0"), ("net1", "other1")):  # both names taken in the pod
        ns.run("ip", "link", "add", name, "type", "veth", "peer", "name", peer, check=True)
    with pytest.raises(rtnl.RtnlError) as exc:
        move_in(vf_like, ns)
    assert type(exc.value) is rtnl.RtnlError and exc.value.errno == errno.EEXIST
    home = link_in(None, vf_like)
    assert home is not None and home[2] == 1500 and home[4] == ""


def test_move_link_refused_after_the_move_says_it_moved(netns_factory: Any, vf_like: str) -> None:
    ns = netns_factory()
    ns.run("ip", "link", "add", "net1", "type", "veth", "peer", "name", "other", check=True)
    with pytest.raises(rtnl.MovedUnconfigured) as exc:
        move_in(vf_like, ns)
    assert exc.value.errno == errno.EEXIST
    # In the kernel's order: moved, MAC and MTU set, then the rename refused (and no alias).
    assert link_in(ns, vf_like) == (vf_like, "02:aa:00:00:00:01", 1450, False, "")
    assert link_in(None, vf_like) is None


def test_move_link_home_restores_name_mac_mtu_state_and_alias(netns_factory: Any, vf_like: str) -> None:
    ns = netns_factory()
    move_in(vf_like, ns)
    ns.run("ip", "link", "set", "net1", "up", check=True)
    ns.run("ip", "addr", "add", "10.78.0.5/24", "dev", "net1", check=True)
    with open_rtnl(ns.path) as rt:
        link = rt.link("net1")
        assert link is not None and link.up
        # Up in the pod: the move closes it, so the rename needs no down of its own.
        rt.move_link(link.index, rtnl.LinkChange(name=vf_like, mac="02:00:00:00:00:07", mtu=1500, up=True,
                                                 alias=""), netns_pid=os.getpid())
    assert link_in(None, vf_like) == (vf_like, "02:00:00:00:00:07", 1500, True, "")
    assert link_in(ns, "net1") is None
