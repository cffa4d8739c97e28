"""tenantnet.plugin.system.rtnl without a kernel: the bytes of every request it sends, decoded here field
by field, and the reading of answers (links, addresses, errors, dumps).

The constants and struct layouts below are copied from the kernel's uapi headers
(include/uapi/linux/netlink.h, rtnetlink.h, if_link.h, if_addr.h, veth.h, if.h), not taken from
the module, and the bytes are decoded with `struct`: a wrong type number, flag, field or
attribute in what the module sends fails a test even when the module is consistent with itself.
"""

from __future__ import annotations

import errno
import ipaddress
import struct
from dataclasses import dataclass

import pytest

from tenantnet.plugin.system import rtnl

# --- include/uapi/linux/netlink.h ---
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400  # NEW requests
NLM_F_DUMP = 0x300  # GET requests: NLM_F_ROOT | NLM_F_MATCH
NLA_F_NESTED = 0x8000
NLA_ALIGNTO = 4
# --- include/uapi/linux/rtnetlink.h ---
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK = 16, 17, 18, 19
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE = 24
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE = 1, 4, 5, 15
RT_TABLE_MAIN = 254
RTPROT_BOOT = 3
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253
RTN_UNICAST = 1
# --- include/uapi/linux/if_link.h ---
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU = 1, 3, 4
IFLA_LINKINFO, IFLA_NET_NS_PID, IFLA_IFALIAS = 18, 19, 20
IFLA_AF_SPEC, IFLA_NET_NS_FD = 26, 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_INET6_ADDR_GEN_MODE = 8
IN6_ADDR_GEN_MODE_NONE = 1
# --- include/uapi/linux/veth.h ---
VETH_INFO_PEER = 1
# --- include/uapi/linux/if_addr.h ---
IFA_ADDRESS, IFA_LOCAL = 1, 2
# --- include/uapi/linux/if.h, linux/socket.h ---
IFF_UP = 0x1
AF_UNSPEC, AF_INET, AF_INET6 = 0, 2, 10

NLMSGHDR = struct.Struct("=IHHII")  # nlmsg_len, nlmsg_type, nlmsg_flags, nlmsg_seq, nlmsg_pid
IFINFOMSG = struct.Struct("=BBHiII")  # ifi_family, __ifi_pad, ifi_type, ifi_index, ifi_flags, ifi_change
IFADDRMSG = struct.Struct("=BBBBI")  # ifa_family, ifa_prefixlen, ifa_flags, ifa_scope, ifa_index
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
NLMSGERR = struct.Struct("=i")  # error, then the request's nlmsghdr

CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL  # 0x605
CHANGE = NLM_F_REQUEST | NLM_F_ACK  # 0x5
DUMP = NLM_F_REQUEST | NLM_F_DUMP  # 0x301


def u32(value: int) -> bytes:
    return struct.pack("=I", value)


# ---- a socket that records what is sent -----------------------------------------------------

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
    return [(NLMSG_ERROR, 0, NLMSGERR.pack(-code) + b"\0" * NLMSGHDR.size)]


def fake_rtnl(*answers: list[tuple[int, int, bytes]]) -> tuple[FakeSocket, rtnl.Rtnl]:
    fake = FakeSocket()
    fake.answers += answers
    return fake, rtnl.Rtnl(fake)  # type: ignore[arg-type]


# ---- decoding what was sent -----------------------------------------------------------------

@dataclass
class Message:
    type: int
    flags: int
    seq: int
    body: bytes


def messages(fake: FakeSocket) -> list[Message]:
    """Every request sent, one netlink message per send, its header checked."""
    out = []
    for data in fake.sent:
        size, mtype, flags, seq, pid = NLMSGHDR.unpack_from(data)
        assert size == len(data), "nlmsg_len is not the message's length"
        assert pid == 0, "nlmsg_pid of a request to the kernel is 0"
        out.append(Message(mtype, flags, seq, data[NLMSGHDR.size:]))
    assert [m.seq for m in out] == list(range(1, len(out) + 1)), "a fresh sequence number per request"
    return out


def nlas(data: bytes) -> dict[int, bytes]:
    """Attributes by type (NLA_F_NESTED kept in it), strictly: each nla_len fits, padding to
    NLA_ALIGNTO is zeroes, the lengths add up to the whole buffer, no type twice."""
    out: dict[int, bytes] = {}
    offset = 0
    while offset < len(data):
        assert len(data) - offset >= 4, "a truncated attribute header"
        size, kind = struct.unpack_from("=HH", data, offset)
        assert 4 <= size <= len(data) - offset, f"attribute {kind:#x}: nla_len {size} does not fit"
        end = offset + (size + NLA_ALIGNTO - 1) // NLA_ALIGNTO * NLA_ALIGNTO
        assert data[offset + size:end] == b"\0" * (end - offset - size), f"attribute {kind:#x}: padding"
        assert kind not in out, f"attribute {kind:#x} twice"
        out[kind] = data[offset + 4:offset + size]
        offset = end
    assert offset == len(data)
    return out


def ifinfomsg(body: bytes) -> tuple[tuple[int, int, int, int, int], dict[int, bytes]]:
    """(family, type, index, flags, change) and the attributes after the struct."""
    family, pad, itype, index, flags, change = IFINFOMSG.unpack_from(body)
    assert pad == 0
    return (family, itype, index, flags, change), nlas(body[IFINFOMSG.size:])


def ifaddrmsg(body: bytes) -> tuple[tuple[int, int, int, int, int], dict[int, bytes]]:
    return IFADDRMSG.unpack_from(body), nlas(body[IFADDRMSG.size:])


def rtmsg(body: bytes) -> tuple[tuple[int, ...], dict[int, bytes]]:
    return RTMSG.unpack_from(body), nlas(body[RTMSG.size:])


def veth_linkinfo(attrs: dict[int, bytes]) -> tuple[tuple[int, int, int, int, int], dict[int, bytes]]:
    """IFLA_LINKINFO { IFLA_INFO_KIND "veth", IFLA_INFO_DATA { VETH_INFO_PEER { ifinfomsg, attrs } } }:
    the peer's ifinfomsg and attributes."""
    info = nlas(attrs[IFLA_LINKINFO | NLA_F_NESTED])
    assert set(info) == {IFLA_INFO_KIND, IFLA_INFO_DATA | NLA_F_NESTED}
    assert info[IFLA_INFO_KIND] == b"veth"
    data = nlas(info[IFLA_INFO_DATA | NLA_F_NESTED])
    assert set(data) == {VETH_INFO_PEER | NLA_F_NESTED}
    return ifinfomsg(data[VETH_INFO_PEER | NLA_F_NESTED])


# ---- answers, as the kernel would send them ---------------------------------------------------

def nla(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) & 3)


def link_message(index: int, name: str, *, up: bool, mac: bytes = b"\x02\0\0\0\0\x01", mtu: int = 1500,
                 kind: str = "veth", alias: str | None = None) -> bytes:
    body = IFINFOMSG.pack(AF_UNSPEC, 0, 1, index, IFF_UP if up else 0, 0)  # ARPHRD_ETHER
    body += nla(IFLA_IFNAME, name.encode() + b"\0") + nla(IFLA_ADDRESS, mac) + nla(IFLA_MTU, u32(mtu))
    if alias is not None:
        body += nla(IFLA_IFALIAS, alias.encode() + b"\0")
    return body + nla(IFLA_LINKINFO | NLA_F_NESTED, nla(IFLA_INFO_KIND, kind.encode() + b"\0"))


# ---- create_veth ------------------------------------------------------------------------------

def test_create_veth_with_mtu_peer_mac_and_alias_peer_born_in_the_pod_netns() -> None:
    # The kernel ignores IFLA_IFALIAS in RTM_NEWLINK (`ip link add … alias` does not set it
    # either): the alias goes in a SETLINK on the new link's index.
    fake, rt = fake_rtnl(ack(), [(RTM_NEWLINK, 0, link_message(12, "tnabc", up=True, mtu=9000))], ack())
    rt.create_veth("tnabc", "net1", 42, mtu=9000, peer_mac="02:00:00:aa:bb:cc", alias="pod/ns1")
    msg, lookup, marked = messages(fake)
    assert (msg.type, msg.flags) == (RTM_NEWLINK, CREATE)
    assert (lookup.type, marked.type, marked.flags) == (RTM_GETLINK, RTM_SETLINK, CHANGE)
    assert ifinfomsg(marked.body) == ((AF_UNSPEC, 0, 12, 0, 0), {IFLA_IFALIAS: b"pod/ns1"})
    head, attrs = ifinfomsg(msg.body)
    assert head == (AF_UNSPEC, 0, 0, IFF_UP, IFF_UP)  # created up, like `ip link add … up`
    assert set(attrs) == {IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO | NLA_F_NESTED}
    assert attrs[IFLA_IFNAME] == b"tnabc\0"
    assert attrs[IFLA_MTU] == u32(9000)
    peer_head, peer = veth_linkinfo(attrs)
    assert peer_head == (AF_UNSPEC, 0, 0, 0, 0)
    assert peer == {IFLA_IFNAME: b"net1\0", IFLA_NET_NS_FD: u32(42), IFLA_MTU: u32(9000),
                    IFLA_ADDRESS: bytes.fromhex("020000aabbcc")}


def test_create_veth_without_mtu_mac_or_alias_and_down() -> None:
    fake, rt = fake_rtnl(ack())
    rt.create_veth("tnabc", "eth0", 7, up=False)
    [msg] = messages(fake)
    assert (msg.type, msg.flags) == (RTM_NEWLINK, CREATE)
    head, attrs = ifinfomsg(msg.body)
    assert head == (AF_UNSPEC, 0, 0, 0, 0)
    assert set(attrs) == {IFLA_IFNAME, IFLA_LINKINFO | NLA_F_NESTED}  # no IFLA_MTU, no IFLA_IFALIAS
    assert attrs[IFLA_IFNAME] == b"tnabc\0"
    peer_head, peer = veth_linkinfo(attrs)
    assert peer_head == (AF_UNSPEC, 0, 0, 0, 0)
    assert peer == {IFLA_IFNAME: b"eth0\0", IFLA_NET_NS_FD: u32(7)}


@pytest.mark.parametrize("up", [True, False])
def test_create_veth_without_ipv6_link_local_sets_addr_gen_mode_none_before_up(up: bool) -> None:
    answers = [ack(), [(RTM_NEWLINK, 0, link_message(31, "tnabc", up=False, mtu=1400))], ack()]
    fake, rt = fake_rtnl(*answers, *([ack()] if up else []))
    rt.create_veth("tnabc", "net1", 9, mtu=1400, peer_mac="02:00:00:00:00:07", up=up,
                   ipv6_link_local=False, alias="a")
    sent = messages(fake)
    assert [(m.type, m.flags) for m in sent] == [(RTM_NEWLINK, CREATE), (RTM_GETLINK, NLM_F_REQUEST),
                                                 (RTM_SETLINK, CHANGE)] + ([(RTM_SETLINK, CHANGE)] if up else [])
    # 1. the pair, created down (an address could be generated the moment it is up)
    head, attrs = ifinfomsg(sent[0].body)
    assert head == (AF_UNSPEC, 0, 0, 0, 0)
    assert {k: attrs[k] for k in (IFLA_IFNAME, IFLA_MTU)} == {IFLA_IFNAME: b"tnabc\0", IFLA_MTU: u32(1400)}
    assert set(attrs) == {IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO | NLA_F_NESTED}  # no alias: ignored here
    assert veth_linkinfo(attrs) == ((AF_UNSPEC, 0, 0, 0, 0), {
        IFLA_IFNAME: b"net1\0", IFLA_NET_NS_FD: u32(9), IFLA_MTU: u32(1400),
        IFLA_ADDRESS: bytes.fromhex("020000000007")})
    # 2. its index, asked by name
    head, attrs = ifinfomsg(sent[1].body)
    assert head == (AF_UNSPEC, 0, 0, 0, 0) and attrs == {IFLA_IFNAME: b"tnabc\0"}
    # 3. the alias, and IFLA_AF_SPEC { AF_INET6 { IFLA_INET6_ADDR_GEN_MODE = NONE (u8) } }
    head, attrs = ifinfomsg(sent[2].body)
    assert head == (AF_UNSPEC, 0, 31, 0, 0)
    assert set(attrs) == {IFLA_IFALIAS, IFLA_AF_SPEC | NLA_F_NESTED} and attrs[IFLA_IFALIAS] == b"a"
    af = nlas(attrs[IFLA_AF_SPEC | NLA_F_NESTED])
    assert set(af) == {AF_INET6 | NLA_F_NESTED}
    assert nlas(af[AF_INET6 | NLA_F_NESTED]) == {IFLA_INET6_ADDR_GEN_MODE: bytes([IN6_ADDR_GEN_MODE_NONE])}
    # 4. then up, and nothing else changed
    if up:
        assert ifinfomsg(sent[3].body) == ((AF_UNSPEC, 0, 31, IFF_UP, IFF_UP), {})


def test_create_veth_without_ipv6_link_local_fails_if_the_link_vanished() -> None:
    fake, rt = fake_rtnl(ack(), ack(errno.ENODEV))
    with pytest.raises(rtnl.RtnlError) as exc:
        rt.create_veth("tnabc", "net1", 9, ipv6_link_local=False)
    assert exc.value.errno == errno.ENODEV
    assert [(m.type, m.flags) for m in messages(fake)] == [(RTM_NEWLINK, CREATE), (RTM_GETLINK, NLM_F_REQUEST)]


# ---- set_link, delete_link, link, links -------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "flags", "change", "expected"), [
    ({"up": True}, IFF_UP, IFF_UP, {}),
    ({"up": False}, 0, IFF_UP, {}),
    ({"name": "net2"}, 0, 0, {IFLA_IFNAME: b"net2\0"}),
    ({"mac": "02:00:00:00:00:09"}, 0, 0, {IFLA_ADDRESS: bytes.fromhex("020000000009")}),
    ({"mtu": 1400}, 0, 0, {IFLA_MTU: u32(1400)}),
    ({"netns_fd": 17}, 0, 0, {IFLA_NET_NS_FD: u32(17)}),
    ({"netns_pid": 4242}, 0, 0, {IFLA_NET_NS_PID: u32(4242)}),
    ({"alias": "tenant-a/pod1"}, 0, 0, {IFLA_IFALIAS: b"tenant-a/pod1"}),
    ({"alias": ""}, 0, 0, {IFLA_IFALIAS: b""}),  # an empty alias clears it
    ({"up": True, "name": "net2", "mac": "02:00:00:00:00:09", "mtu": 9000, "netns_fd": 5, "netns_pid": 99,
      "alias": "x"}, IFF_UP, IFF_UP,
     {IFLA_IFNAME: b"net2\0", IFLA_ADDRESS: bytes.fromhex("020000000009"), IFLA_MTU: u32(9000),
      IFLA_NET_NS_FD: u32(5), IFLA_NET_NS_PID: u32(99), IFLA_IFALIAS: b"x"}),
])
def test_set_link_changes_only_what_is_asked(kwargs: dict, flags: int, change: int,
                                             expected: dict[int, bytes]) -> None:
    fake, rt = fake_rtnl(ack())
    rt.set_link(5, **kwargs)
    [msg] = messages(fake)
    assert (msg.type, msg.flags) == (RTM_SETLINK, CHANGE)
    assert ifinfomsg(msg.body) == ((AF_UNSPEC, 0, 5, flags, change), expected)


def test_move_link_moves_and_configures_in_one_setlink() -> None:
    fake, rt = fake_rtnl(ack())
    rt.move_link(5, rtnl.LinkChange(name="net1", mac="02:aa:00:00:00:01", mtu=1450, alias="tenantnet:x"),
                 netns_fd=9)
    [msg] = messages(fake)
    assert (msg.type, msg.flags) == (RTM_SETLINK, CHANGE)
    assert ifinfomsg(msg.body) == ((AF_UNSPEC, 0, 5, 0, 0), {
        IFLA_NET_NS_FD: u32(9), IFLA_IFNAME: b"net1\0", IFLA_ADDRESS: bytes.fromhex("02aa00000001"),
        IFLA_MTU: u32(1450), IFLA_IFALIAS: b"tenantnet:x"})


def test_move_link_home_by_pid_restores_state_and_clears_the_alias() -> None:
    fake, rt = fake_rtnl(ack())
    rt.move_link(7, rtnl.LinkChange(name="ens1f0v2", up=True, alias=""), netns_pid=4242)
    [msg] = messages(fake)
    assert ifinfomsg(msg.body) == ((AF_UNSPEC, 0, 7, IFF_UP, IFF_UP), {
        IFLA_NET_NS_PID: u32(4242), IFLA_IFNAME: b"ens1f0v2\0", IFLA_IFALIAS: b""})


def test_move_link_refused_before_the_move_is_a_plain_error() -> None:
    # The link is still here (looked up by index): nothing moved.
    fake, rt = fake_rtnl(ack(errno.EEXIST), [(RTM_NEWLINK, 0, link_message(5, "ens1f0v2", up=False))])
    with pytest.raises(rtnl.RtnlError) as exc:
        rt.move_link(5, rtnl.LinkChange(name="net1"), netns_fd=9)
    assert type(exc.value) is rtnl.RtnlError and exc.value.errno == errno.EEXIST
    _, lookup = messages(fake)
    assert (lookup.type, lookup.flags) == (RTM_GETLINK, NLM_F_REQUEST)
    assert ifinfomsg(lookup.body) == ((AF_UNSPEC, 0, 5, 0, 0), {})


def test_move_link_refused_after_the_move_says_so() -> None:
    # The link is gone from here: it moved, and a later part (here the rename) was refused.
    fake, rt = fake_rtnl(ack(errno.EEXIST), ack(errno.ENODEV))
    with pytest.raises(rtnl.MovedUnconfigured) as exc:
        rt.move_link(5, rtnl.LinkChange(name="net1"), netns_fd=9)
    assert exc.value.errno == errno.EEXIST
    assert [m.type for m in messages(fake)] == [RTM_SETLINK, RTM_GETLINK]


def test_delete_link_by_name() -> None:
    fake, rt = fake_rtnl(ack())
    assert rt.delete_link("tnabc") is True
    [msg] = messages(fake)
    assert (msg.type, msg.flags) == (RTM_DELLINK, CHANGE)
    assert ifinfomsg(msg.body) == ((AF_UNSPEC, 0, 0, 0, 0), {IFLA_IFNAME: b"tnabc\0"})


def test_link_by_name_is_read_back_and_a_missing_one_is_none() -> None:
    fake, rt = fake_rtnl([(RTM_NEWLINK, 0, link_message(12, "tnabc", up=True, mtu=9000, alias="pod1"))],
                         ack(errno.ENODEV))
    link = rt.link("tnabc")
    assert link == rtnl.Link(index=12, name="tnabc", mac="02:00:00:00:00:01", mtu=9000, up=True, kind="veth",
                             alias="pod1")
    assert rt.link("gone") is None
    first, second = messages(fake)
    assert (first.type, first.flags) == (RTM_GETLINK, NLM_F_REQUEST)  # asked by name, not a dump
    assert ifinfomsg(first.body) == ((AF_UNSPEC, 0, 0, 0, 0), {IFLA_IFNAME: b"tnabc\0"})
    assert ifinfomsg(second.body) == ((AF_UNSPEC, 0, 0, 0, 0), {IFLA_IFNAME: b"gone\0"})


def test_links_dump_request_and_its_answers() -> None:
    fake, rt = fake_rtnl([
        (RTM_NEWLINK, NLM_F_MULTI, link_message(1, "lo", up=True, mac=b"\0" * 6, mtu=65536, kind="")),
        (RTM_NEWLINK, NLM_F_MULTI, link_message(12, "tnabc", up=False, mtu=1400, alias="t/p")),
        (NLMSG_DONE, NLM_F_MULTI, struct.pack("=i", 0)),
    ])
    assert rt.links() == [
        rtnl.Link(index=1, name="lo", mac="00:00:00:00:00:00", mtu=65536, up=True, kind=""),
        rtnl.Link(index=12, name="tnabc", mac="02:00:00:00:00:01", mtu=1400, up=False, kind="veth",
                  alias="t/p"),
    ]
    [msg] = messages(fake)
    assert (msg.type, msg.flags) == (RTM_GETLINK, DUMP)
    assert ifinfomsg(msg.body) == ((AF_UNSPEC, 0, 0, 0, 0), {})


# ---- addresses and routes ---------------------------------------------------------------------

def test_ipv4_address_carries_local_and_address_ipv6_only_address() -> None:
    fake, rt = fake_rtnl(ack(), ack())
    rt.add_address(7, ipaddress.ip_interface("10.1.2.3/24"))
    rt.add_address(7, ipaddress.ip_interface("fd00::5/64"))
    v4, v6 = messages(fake)
    assert (v4.type, v4.flags) == (v6.type, v6.flags) == (RTM_NEWADDR, CREATE)
    assert ifaddrmsg(v4.body) == ((AF_INET, 24, 0, RT_SCOPE_UNIVERSE, 7),
                                  {IFA_LOCAL: bytes([10, 1, 2, 3]), IFA_ADDRESS: bytes([10, 1, 2, 3])})
    assert ifaddrmsg(v6.body) == ((AF_INET6, 64, 0, RT_SCOPE_UNIVERSE, 7),
                                  {IFA_ADDRESS: bytes.fromhex("fd000000000000000000000000000005")})


def test_address_dump_request_keeps_only_the_asked_link() -> None:
    def addr(family: int, prefix: int, index: int, ip: str) -> bytes:
        return IFADDRMSG.pack(family, prefix, 0, 0, index) + nla(IFA_ADDRESS, ipaddress.ip_address(ip).packed)

    fake, rt = fake_rtnl([(RTM_NEWADDR, NLM_F_MULTI, addr(AF_INET, 24, 7, "10.1.2.3")),
                          (RTM_NEWADDR, NLM_F_MULTI, addr(AF_INET, 8, 1, "127.0.0.1")),
                          (RTM_NEWADDR, NLM_F_MULTI, addr(AF_INET6, 64, 7, "fd00::5")),
                          (NLMSG_DONE, NLM_F_MULTI, struct.pack("=i", 0))])
    assert rt.addresses(7) == ["10.1.2.3/24", "fd00::5/64"]
    [msg] = messages(fake)
    assert (msg.type, msg.flags) == (RTM_GETADDR, DUMP)
    assert ifaddrmsg(msg.body) == ((AF_UNSPEC, 0, 0, 0, 0), {})


@pytest.mark.parametrize(("dst", "gw", "family", "scope", "attrs"), [
    # the default route: no RTA_DST (dst_len 0), via the gateway
    ("0.0.0.0/0", "10.1.2.1", AF_INET, RT_SCOPE_UNIVERSE, {RTA_GATEWAY: bytes([10, 1, 2, 1])}),
    # a subnet with a gateway
    ("10.200.0.0/16", "10.1.2.1", AF_INET, RT_SCOPE_UNIVERSE,
     {RTA_DST: bytes([10, 200, 0, 0]), RTA_GATEWAY: bytes([10, 1, 2, 1])}),
    # on-link: no gateway, link scope
    ("192.168.0.0/16", None, AF_INET, RT_SCOPE_LINK, {RTA_DST: bytes([192, 168, 0, 0])}),
    ("::/0", "fd00::1", AF_INET6, RT_SCOPE_UNIVERSE, {RTA_GATEWAY: bytes.fromhex("fd000000000000000000000000000001")}),
    ("fd01::/64", None, AF_INET6, RT_SCOPE_LINK, {RTA_DST: bytes.fromhex("fd010000000000000000000000000000")}),
])
def test_route_in_the_main_table(dst: str, gw: str | None, family: int, scope: int,
                                 attrs: dict[int, bytes]) -> None:
    fake, rt = fake_rtnl(ack())
    rt.add_route(dst, oif=7, gateway=gw)
    [msg] = messages(fake)
    assert (msg.type, msg.flags) == (RTM_NEWROUTE, CREATE)
    prefixlen = ipaddress.ip_network(dst).prefixlen
    assert rtmsg(msg.body) == (
        (family, prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0),
        {RTA_OIF: u32(7), RTA_TABLE: u32(RT_TABLE_MAIN), **attrs})


# ---- errors and the transport -----------------------------------------------------------------

def test_errors_carry_the_kernel_errno_and_deleting_a_missing_link_is_false() -> None:
    fake, rt = fake_rtnl(ack(errno.EEXIST), ack(errno.ENODEV), ack(errno.EPERM))
    with pytest.raises(rtnl.RtnlError) as exc:
        rt.create_veth("tnabc", "net1", 3)
    assert exc.value.errno == errno.EEXIST
    assert rt.delete_link("tnabc") is False
    with pytest.raises(rtnl.RtnlError) as exc:
        rt.delete_link("tnabc")
    assert exc.value.errno == errno.EPERM
    assert [(m.type, m.flags) for m in messages(fake)] == [(RTM_NEWLINK, CREATE), (RTM_DELLINK, CHANGE),
                                                           (RTM_DELLINK, CHANGE)]


def test_answers_to_an_abandoned_request_are_skipped() -> None:
    class Stale(FakeSocket):
        def recv(self, size: int) -> bytes:
            seq = NLMSGHDR.unpack_from(self.sent[-1])[3]
            err = NLMSGHDR.size + NLMSGERR.size + NLMSGHDR.size
            stale = NLMSGHDR.pack(err, NLMSG_ERROR, 0, seq - 1, 0) + NLMSGERR.pack(-errno.EPERM) \
                + b"\0" * NLMSGHDR.size
            return stale + NLMSGHDR.pack(err, NLMSG_ERROR, 0, seq, 0) + NLMSGERR.pack(0) + b"\0" * NLMSGHDR.size

    fake = Stale()
    rt = rtnl.Rtnl(fake)  # type: ignore[arg-type]
    rt._seq = 10
    rt.set_link(3, up=True)  # the stale EPERM for seq 10 is not taken for this request's answer
    assert NLMSGHDR.unpack_from(fake.sent[0])[3] == 11
