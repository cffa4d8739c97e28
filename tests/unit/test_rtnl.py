"""tenantnet.system.rtnl without a kernel: the bytes of each request, read back field by field
against the uapi layouts (linux/netlink.h, rtnetlink.h, if_link.h, veth.h), and the
reading of answers (links, addresses, errors, dumps)."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

import pytest

from tenantnet.system import rtnl

NLMSGHDR = struct.Struct("=IHHII")
IFINFOMSG = struct.Struct("=BxHiII")


class FakeSocket:
    """Records what is sent; answers with queued datagrams (seq filled in from the request)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.answers: list[list[tuple[int, int, bytes]]] = []  # per request: (type, flags, body)

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)

    def recv(self, size: int) -> bytes:
        seq = NLMSGHDR.unpack_from(self.sent[-1])[3]
        out = b""
        for mtype, flags, body in self.answers.pop(0):
            out += NLMSGHDR.pack(NLMSGHDR.size + len(body), mtype, flags, seq, 0) + body
            out += b"\0" * (-len(out) & 3)
        return out

    def close(self) -> None:
        pass


def ack(code: int = 0) -> list[tuple[int, int, bytes]]:
    return [(rtnl.NLMSG_ERROR, 0, struct.pack("=i", -code) + b"\0" * 16)]


def attrs(data: bytes) -> list[tuple[int, bytes]]:
    out, offset = [], 0
    while offset < len(data):
        size, kind = struct.unpack_from("=HH", data, offset)
        out.append((kind, data[offset + 4:offset + size]))
        offset += (size + 3) & ~3
    return out


def request(fake: FakeSocket, index: int = -1) -> tuple[int, int, bytes]:
    data = fake.sent[index]
    size, mtype, flags, _, _ = NLMSGHDR.unpack_from(data)
    assert size == len(data)
    return mtype, flags, data[NLMSGHDR.size:]


def link_message(index: int, name: str, *, up: bool, mac: bytes = b"\x02\0\0\0\0\x01", mtu: int = 1500,
                 kind: str = "veth") -> bytes:
    body = IFINFOMSG.pack(0, 1, index, 1 if up else 0, 0)
    for kind_, payload in ((rtnl.IFLA_IFNAME, name.encode() + b"\0"), (rtnl.IFLA_ADDRESS, mac),
                           (rtnl.IFLA_MTU, struct.pack("=I", mtu)),
                           (rtnl.IFLA_LINKINFO | rtnl.NLA_F_NESTED,
                            rtnl._nla(rtnl.IFLA_INFO_KIND, kind.encode() + b"\0"))):
        body += rtnl._nla(kind_, payload)
    return body


def test_create_veth_with_its_peer_born_in_the_pod_netns() -> None:
    fake = FakeSocket()
    fake.answers.append(ack())
    rtnl.Rtnl(fake).create_veth("tnabc", "net1", 42, mtu=9000, peer_mac="02:00:00:aa:bb:cc")  # type: ignore[arg-type]
    mtype, flags, body = request(fake)
    assert mtype == rtnl.RTM_NEWLINK
    assert flags == rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK | rtnl.NLM_F_CREATE | rtnl.NLM_F_EXCL
    family, _, index, ifi_flags, change = IFINFOMSG.unpack_from(body)
    assert (family, index, ifi_flags, change) == (0, 0, 1, 1)  # created up, like `ip link add … up`
    top = dict(attrs(body[IFINFOMSG.size:]))
    assert top[rtnl.IFLA_IFNAME] == b"tnabc\0"
    assert top[rtnl.IFLA_MTU] == struct.pack("=I", 9000)
    info = dict(attrs(top[rtnl.IFLA_LINKINFO | rtnl.NLA_F_NESTED]))
    assert info[rtnl.IFLA_INFO_KIND] == b"veth"
    data = dict(attrs(info[rtnl.IFLA_INFO_DATA | rtnl.NLA_F_NESTED]))
    peer = data[rtnl.VETH_INFO_PEER | rtnl.NLA_F_NESTED]
    assert IFINFOMSG.unpack_from(peer) == (0, 0, 0, 0, 0)
    peer_attrs = dict(attrs(peer[IFINFOMSG.size:]))
    assert peer_attrs == {rtnl.IFLA_IFNAME: b"net1\0", rtnl.IFLA_NET_NS_FD: struct.pack("=I", 42),
                          rtnl.IFLA_MTU: struct.pack("=I", 9000),
                          rtnl.IFLA_ADDRESS: bytes.fromhex("020000aabbcc")}


def test_ipv4_address_carries_local_and_address_ipv6_only_address() -> None:
    fake = FakeSocket()
    fake.answers += [ack(), ack()]
    rt = rtnl.Rtnl(fake)  # type: ignore[arg-type]
    rt.add_address(7, ipaddress.ip_interface("10.1.2.3/24"))
    rt.add_address(7, ipaddress.ip_interface("fd00::5/64"))
    mtype, flags, body = request(fake, 0)
    assert mtype == rtnl.RTM_NEWADDR and flags & rtnl.NLM_F_EXCL
    assert struct.unpack_from("=BBBBI", body) == (socket.AF_INET, 24, 0, 0, 7)
    assert attrs(body[8:]) == [(rtnl.IFA_LOCAL, bytes([10, 1, 2, 3])), (rtnl.IFA_ADDRESS, bytes([10, 1, 2, 3]))]
    _, _, body6 = request(fake, 1)
    assert struct.unpack_from("=BBBBI", body6) == (socket.AF_INET6, 64, 0, 0, 7)
    assert attrs(body6[8:]) == [(rtnl.IFA_ADDRESS, ipaddress.ip_address("fd00::5").packed)]


@pytest.mark.parametrize(("dst", "gw", "scope", "has_dst"), [
    ("0.0.0.0/0", "10.1.2.1", rtnl.RT_SCOPE_UNIVERSE, False),
    ("192.168.0.0/16", None, rtnl.RT_SCOPE_LINK, True),
])
def test_route_in_the_main_table(dst: str, gw: str | None, scope: int, has_dst: bool) -> None:
    fake = FakeSocket()
    fake.answers.append(ack())
    rtnl.Rtnl(fake).add_route(dst, oif=7, gateway=gw)  # type: ignore[arg-type]
    mtype, _, body = request(fake)
    assert mtype == rtnl.RTM_NEWROUTE
    family, dst_len, _, _, table, proto, scope_, rtype, _ = struct.unpack_from("=BBBBBBBBI", body)
    net = ipaddress.ip_network(dst)
    assert (family, dst_len, table, proto, scope_, rtype) == (socket.AF_INET, net.prefixlen, 254, 3, scope, 1)
    got = dict(attrs(body[12:]))
    assert got[rtnl.RTA_OIF] == struct.pack("=I", 7) and got[rtnl.RTA_TABLE] == struct.pack("=I", 254)
    assert (rtnl.RTA_DST in got) == has_dst
    assert got.get(rtnl.RTA_GATEWAY) == (ipaddress.ip_address(gw).packed if gw else None)


def test_set_link_changes_only_what_is_asked() -> None:
    fake = FakeSocket()
    fake.answers += [ack(), ack()]
    rt = rtnl.Rtnl(fake)  # type: ignore[arg-type]
    rt.set_link(5, up=False)
    _, _, body = request(fake)
    assert IFINFOMSG.unpack_from(body) == (0, 0, 5, 0, 1) and body[IFINFOMSG.size:] == b""
    rt.set_link(5, name="net2", mac="02:00:00:00:00:09", mtu=1400, netns_pid=99)
    mtype, _, body = request(fake)
    assert mtype == rtnl.RTM_SETLINK and IFINFOMSG.unpack_from(body)[3:] == (0, 0)
    assert dict(attrs(body[IFINFOMSG.size:])) == {
        rtnl.IFLA_IFNAME: b"net2\0", rtnl.IFLA_ADDRESS: bytes.fromhex("020000000009"),
        rtnl.IFLA_MTU: struct.pack("=I", 1400), rtnl.IFLA_NET_NS_PID: struct.pack("=I", 99)}


def test_link_by_name_is_read_back_and_a_missing_one_is_none() -> None:
    fake = FakeSocket()
    fake.answers.append([(rtnl.RTM_NEWLINK, 0, link_message(12, "tnabc", up=True, mtu=9000))])
    fake.answers.append(ack(errno.ENODEV))
    rt = rtnl.Rtnl(fake)  # type: ignore[arg-type]
    link = rt.link("tnabc")
    assert link == rtnl.Link(index=12, name="tnabc", mac="02:00:00:00:00:01", mtu=9000, up=True, kind="veth")
    mtype, flags, body = request(fake)
    assert mtype == rtnl.RTM_GETLINK and not flags & rtnl.NLM_F_DUMP  # asked by name, not a dump
    assert dict(attrs(body[IFINFOMSG.size:])) == {rtnl.IFLA_IFNAME: b"tnabc\0"}
    assert rt.link("gone") is None


def test_errors_carry_the_kernel_errno_and_deleting_a_missing_link_is_false() -> None:
    fake = FakeSocket()
    fake.answers += [ack(errno.EEXIST), ack(errno.ENODEV), ack(errno.EPERM)]
    rt = rtnl.Rtnl(fake)  # type: ignore[arg-type]
    with pytest.raises(rtnl.RtnlError) as exc:
        rt.create_veth("tnabc", "net1", 3)
    assert exc.value.errno == errno.EEXIST
    assert rt.delete_link("tnabc") is False
    with pytest.raises(rtnl.RtnlError) as exc:
        rt.delete_link("tnabc")
    assert exc.value.errno == errno.EPERM


def test_address_dump_keeps_only_the_asked_link() -> None:
    def addr(family: int, prefix: int, index: int, ip: str) -> bytes:
        packed = ipaddress.ip_address(ip).packed
        return struct.pack("=BBBBI", family, prefix, 0, 0, index) + rtnl._nla(rtnl.IFA_ADDRESS, packed)

    fake = FakeSocket()
    fake.answers.append([(rtnl.RTM_NEWADDR, rtnl.NLM_F_MULTI, addr(2, 24, 7, "10.1.2.3")),
                         (rtnl.RTM_NEWADDR, rtnl.NLM_F_MULTI, addr(2, 8, 1, "127.0.0.1")),
                         (rtnl.RTM_NEWADDR, rtnl.NLM_F_MULTI, addr(10, 64, 7, "fd00::5")),
                         (rtnl.NLMSG_DONE, rtnl.NLM_F_MULTI, struct.pack("=i", 0))])
    assert rtnl.Rtnl(fake).addresses(7) == ["10.1.2.3/24", "fd00::5/64"]  # type: ignore[arg-type]
    _, flags, _ = request(fake)
    assert flags & rtnl.NLM_F_DUMP == rtnl.NLM_F_DUMP


def test_answers_to_an_abandoned_request_are_skipped() -> None:
    class Stale(FakeSocket):
        def recv(self, size: int) -> bytes:
            seq = NLMSGHDR.unpack_from(self.sent[-1])[3]
            stale = NLMSGHDR.pack(NLMSGHDR.size + 20, rtnl.NLMSG_ERROR, 0, seq - 1, 0) + struct.pack("=i", -1) \
                + b"\0" * 16
            return stale + NLMSGHDR.pack(NLMSGHDR.size + 20, rtnl.NLMSG_ERROR, 0, seq, 0) + b"\0" * 20

    fake = Stale()
    rt = rtnl.Rtnl(fake)  # type: ignore[arg-type]
    rt._seq = 10
    rt.set_link(3, up=True)  # the stale EPERM for seq 10 is not taken for this request's answer
