"""A link's trip into the pod and back (tenantnet.plugin.system.netlink's move_into_pod and
return_from_pod, which carry a VF's netdev) without a kernel: the requests sent (one
RTM_SETLINK each way, after one lookup), which link in the pod is taken on the way back, and
how a refusal is worded — as the move's, as the configuration's, or as the name taken in the
pod (NameTakenInPod, which the VF driver turns into the runtime's error: test_vf_netdev.py)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest

from tenantnet.plugin.system import netlink, rtnl
from tests.unit.test_rtnl import (
    AF_UNSPEC,
    IFF_UP,
    IFLA_ADDRESS,
    IFLA_IFALIAS,
    IFLA_IFNAME,
    IFLA_MTU,
    IFLA_NET_NS_FD,
    IFLA_NET_NS_PID,
    RTM_GETLINK,
    RTM_NEWLINK,
    RTM_SETLINK,
    FakeSocket,
    ack,
    fake_rtnl,
    ifinfomsg,
    link_message,
    messages,
    u32,
)

NETNS = "/run/netns/pod-a"
MARK = "tenantnet:mark"
POD_SIDE = netlink.LinkChange(name="net1", mac="02:aa:00:00:00:01", mtu=1450, alias=MARK)
DOWN_UNMARKED = netlink.LinkChange(up=False, alias="")


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[FakeSocket, rtnl.Rtnl]]]:
    """The host socket (and the pod's netns fd) netlink.move_into_pod gets: set `[0]` to a fake_rtnl."""
    made: list[tuple[FakeSocket, rtnl.Rtnl]] = []
    writers: list[int] = []

    def open_netns_fd(path: str) -> int:
        # A pipe's read end stands in for the netns fd: once it is closed, writing fails.
        assert path == NETNS
        read_end, write_end = os.pipe()
        writers.append(write_end)
        return read_end

    monkeypatch.setattr(netlink, "open_netns_fd", open_netns_fd)
    monkeypatch.setattr(rtnl, "host", lambda: made[0][1])
    yield made
    assert len(writers) == 1
    with pytest.raises(BrokenPipeError):
        os.write(writers[0], b"x")  # the netns fd was closed, whatever happened
    os.close(writers[0])


def link_found(index: int, name: str, *, up: bool = False, alias: str | None = None
               ) -> list[tuple[int, int, bytes]]:
    return [(RTM_NEWLINK, 0, link_message(index, name, up=up, alias=alias))]


def test_move_into_pod_is_one_lookup_and_one_setlink(host: list) -> None:
    host.append(fake_rtnl(link_found(12, "ens1f0v2"), ack()))
    netlink.move_into_pod("ens1f0v2", NETNS, POD_SIDE)
    lookup, move = messages(host[0][0])
    assert lookup.type == RTM_GETLINK and ifinfomsg(lookup.body)[1] == {IFLA_IFNAME: b"ens1f0v2\0"}
    header, attrs = ifinfomsg(move.body)
    assert move.type == RTM_SETLINK and header == (AF_UNSPEC, 0, 12, 0, 0)  # left down: the core brings it up
    assert set(attrs) == {IFLA_NET_NS_FD, IFLA_IFNAME, IFLA_ADDRESS, IFLA_MTU, IFLA_IFALIAS}
    assert (attrs[IFLA_IFNAME], attrs[IFLA_MTU], attrs[IFLA_IFALIAS]) == (b"net1\0", u32(1450), b"tenantnet:mark")


def test_a_netdev_not_in_the_host_is_not_found(host: list) -> None:
    host.append(fake_rtnl(ack(errno.ENODEV)))
    with pytest.raises(netlink.LinkNotFound, match="link ens1f0v2 not found in the host namespace"):
        netlink.move_into_pod("ens1f0v2", NETNS, POD_SIDE)


def test_a_refused_move_is_worded_as_the_move(host: list) -> None:
    # Both the netdev's name and the ifname are taken in the pod: nothing moved.
    host.append(fake_rtnl(link_found(12, "ens1f0v2"), ack(errno.EEXIST), link_found(12, "ens1f0v2")))
    with pytest.raises(netlink.LinkExists) as exc:
        netlink.move_into_pod("ens1f0v2", NETNS, POD_SIDE)
    assert str(exc.value) == f"moving ens1f0v2 into {NETNS}: File exists"


@pytest.mark.parametrize(("refused", "problem", "wording"), [
    # The rename refused: the pod has a link of that name (the VF driver's CNI_IFNAME error).
    (errno.EEXIST, netlink.NameTakenInPod, "File exists"),
    (errno.EPERM, netlink.NetlinkProblem, "Operation not permitted"),
])
def test_a_refused_configuration_after_the_move_is_worded_as_it(host: list, refused: int,
                                                                 problem: type[netlink.NetlinkProblem],
                                                                 wording: str) -> None:
    host.append(fake_rtnl(link_found(12, "ens1f0v2"), ack(refused), ack(errno.ENODEV)))
    with pytest.raises(problem) as exc:
        netlink.move_into_pod("ens1f0v2", NETNS, POD_SIDE)
    assert type(exc.value) is problem
    assert str(exc.value) == f"configuring ens1f0v2 in {NETNS}: {wording}"
    assert exc.value.errno == refused


@pytest.fixture
def pod(monkeypatch: pytest.MonkeyPatch) -> list[tuple[FakeSocket, rtnl.Rtnl]]:
    """The socket in the pod netlink.return_from_pod gets: set `[0]` to a fake_rtnl."""
    made: list[tuple[FakeSocket, rtnl.Rtnl]] = []

    def open_rtnl(path: str) -> rtnl.Rtnl:
        assert path == NETNS
        return made[0][1]

    monkeypatch.setattr(netlink, "open_rtnl", open_rtnl)
    return made


def test_return_from_pod_is_one_lookup_and_one_setlink(pod: list) -> None:
    pod.append(fake_rtnl(link_found(3, "net1", up=True, alias=MARK), ack()))
    home = netlink.LinkChange(mac="02:00:00:00:00:07", mtu=1500, up=True, alias="was")
    assert netlink.return_from_pod(NETNS, "net1", "ens1f0v2", home, MARK) is True
    lookup, move = messages(pod[0][0])
    assert ifinfomsg(lookup.body)[1] == {IFLA_IFNAME: b"net1\0"}
    assert ifinfomsg(move.body) == ((AF_UNSPEC, 0, 3, IFF_UP, IFF_UP), {
        IFLA_NET_NS_PID: u32(os.getpid()), IFLA_IFNAME: b"ens1f0v2\0",
        IFLA_ADDRESS: bytes.fromhex("020000000007"), IFLA_MTU: u32(1500), IFLA_IFALIAS: b"was"})


def test_return_from_pod_sets_only_what_home_says(pod: list) -> None:
    # No MAC or MTU to put back (nothing known of them): down and unmarked only.
    pod.append(fake_rtnl(link_found(3, "net1", up=True), ack()))
    assert netlink.return_from_pod(NETNS, "net1", "net1", DOWN_UNMARKED, MARK) is True
    _, move = messages(pod[0][0])
    assert ifinfomsg(move.body) == ((AF_UNSPEC, 0, 3, 0, IFF_UP), {
        IFLA_NET_NS_PID: u32(os.getpid()), IFLA_IFNAME: b"net1\0", IFLA_IFALIAS: b""})


def test_return_from_pod_without_the_vf_is_false(pod: list) -> None:
    pod.append(fake_rtnl(ack(errno.ENODEV), ack(errno.ENODEV)))
    assert netlink.return_from_pod(NETNS, "net1", "ens1f0v2", DOWN_UNMARKED, MARK) is False
    assert [ifinfomsg(m.body)[1] for m in messages(pod[0][0])] == [{IFLA_IFNAME: b"net1\0"},
                                                                   {IFLA_IFNAME: b"ens1f0v2\0"}]


@pytest.mark.parametrize(("lookups", "taken"), [
    # The pod's own net1 (unmarked) and the VF under its own name beside it (its rename was
    # refused): the VF goes, net1 stays.
    ([link_found(3, "net1", alias="the pod's"), link_found(9, "ens1f0v2")], 9),
    # The VF under its own name only (never renamed).
    ([ack(errno.ENODEV), link_found(9, "ens1f0v2")], 9),
    # An unmarked net1 alone: taken, as ever (a mark can be cleared inside the pod).
    ([link_found(3, "net1"), ack(errno.ENODEV)], 3),
])
def test_return_from_pod_takes_the_vf_not_an_unmarked_namesake(pod: list, lookups: list, taken: int) -> None:
    pod.append(fake_rtnl(*lookups, ack()))
    assert netlink.return_from_pod(NETNS, "net1", "ens1f0v2", DOWN_UNMARKED, MARK) is True
    *_, move = messages(pod[0][0])
    assert move.type == RTM_SETLINK and ifinfomsg(move.body)[0][2] == taken


@pytest.mark.parametrize(("moved", "wording"), [
    (False, f"returning net1 from {NETNS} to the host as ens1f0v2: File exists"),
    (True, "configuring host link ens1f0v2: File exists"),
])
def test_return_from_pod_refusals_are_worded_by_the_part_refused(pod: list, moved: bool, wording: str) -> None:
    pod.append(fake_rtnl(link_found(3, "net1", alias=MARK), ack(errno.EEXIST),
                         ack(errno.ENODEV) if moved else link_found(3, "net1", alias=MARK)))
    with pytest.raises(netlink.LinkExists) as exc:
        netlink.return_from_pod(NETNS, "net1", "ens1f0v2", DOWN_UNMARKED, MARK)
    assert str(exc.value) == wording
