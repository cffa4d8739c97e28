"""A plain rtnetlink socket for the few requests on the attachment hot path.

pyroute2's synchronous IPRoute drives an asyncio loop per request and resolves a name by
dumping every link: ≈ 1–2 ms per request here, and a dump that grows with the number of
pods on the node. The requests an `ovs` attachment needs (look a link up by name, create a
veth whose peer is born in the pod, bring links up, add addresses and routes, delete a
link), and a VF netdev's move into the pod and back, configured in the same request, are a
handful of fixed messages, so they are encoded here with `struct` and sent on a socket of
our own: tens of microseconds of Python per request, plus what the kernel takes.
Everything else (VF attributes, dumps for GC …) stays with pyroute2.

Errors come back as `RtnlError` (an OSError carrying the kernel's errno; EPROTO for a
malformed answer); `tenantnet.plugin.system.netlink` turns them into its named exceptions,
as it does pyroute2's. The netlink framing (headers, attribute walk, ACKs, dumps) is
`tenantnet.plugin.system.nlframing`'s, bounds-checked; the layouts here are linux/rtnetlink.h,
linux/if_link.h, linux/if_addr.h, linux/veth.h.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import threading
from dataclasses import dataclass

from tenantnet.plugin.system import nlframing
from tenantnet.plugin.system.nlframing import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NetlinkError,
    fixed,
    nest,
    nla,
    text,
)

NETLINK_ROUTE = 0
# message types
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK = 16, 17, 18, 19
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
# link attributes
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_NET_NS_PID, IFLA_NET_NS_FD = 1, 3, 4, 18, 19, 28
IFLA_AF_SPEC, IFLA_INET6_ADDR_GEN_MODE, IN6_ADDR_GEN_MODE_NONE = 26, 8, 1
IFLA_IFALIAS = 20
IFLA_GROUP = 27
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFF_UP = 0x1
# address / route attributes
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE = 1, 4, 5, 15
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RTN_UNICAST = 254, 3, 0, 253, 1

_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, proto, scope, type, flags


class RtnlError(NetlinkError):
    """The kernel refused a request (errno as the kernel gave it)."""


class MovedUnconfigured(RtnlError):
    """`Rtnl.move_link`: the link did move, and the kernel refused part of what the same
    request set on it afterwards (errno as the kernel gave it)."""


@dataclass
class Link:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    kind: str
    alias: str = ""


@dataclass(frozen=True)
class LinkChange:
    """What a request sets on a link; None leaves it as it is (an empty alias clears it)."""

    name: str | None = None
    mac: str | None = None
    mtu: int | None = None
    up: bool | None = None
    alias: str | None = None


def _name(value: str) -> bytes:
    return value.encode() + b"\0"


def _u32(value: int) -> bytes:
    return struct.pack("=I", value)


def _mac(value: str) -> bytes:
    return bytes(int(x, 16) for x in value.split(":"))


def _attrs(data: bytes, offset: int) -> dict[int, bytes]:
    """Attributes from `offset` on (type without the nested/byte-order bits)."""
    return nlframing.attributes(data, offset, RtnlError)


def _link(body: bytes) -> Link:
    _, _, index, flags, _ = fixed(_IFINFOMSG, body, "ifinfomsg", RtnlError)
    attrs = _attrs(body, _IFINFOMSG.size)
    kind = ""
    if IFLA_LINKINFO in attrs:
        info = _attrs(attrs[IFLA_LINKINFO], 0)
        kind = text(info.get(IFLA_INFO_KIND, b""))
    mac = attrs.get(IFLA_ADDRESS, b"")
    mtu = attrs.get(IFLA_MTU, b"")
    return Link(index=index, name=text(attrs.get(IFLA_IFNAME, b"")),
                mac=":".join(f"{b:02x}" for b in mac), mtu=struct.unpack_from("=I", mtu)[0]
                if len(mtu) >= 4 else 0, up=bool(flags & IFF_UP), kind=kind,
                alias=text(attrs.get(IFLA_IFALIAS, b"")))


class Rtnl:
    """One NETLINK_ROUTE socket. Not shared between threads (each request waits for its own
    answer on the socket); the namespace is the one the socket was opened in."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self.sock = sock or open_socket()
        self._seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transport ------------------------------------------------------------------------
    def _request(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        """Send one request; the (type, body) of every answer message up to its ACK or DONE."""
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        self.sock.send(nlframing.message(kind, flags | NLM_F_REQUEST, self._seq, body))
        answer = nlframing.Answer(self._seq, bool(flags & NLM_F_ACK), RtnlError)
        while not answer.done:
            answer.feed(self.sock.recv(1 << 16))
        return answer.bodies

    def _ack(self, kind: int, flags: int, body: bytes) -> None:
        self._request(kind, flags | NLM_F_ACK, body)

    # ---- links ----------------------------------------------------------------------------
    def link(self, name: str = "", *, index: int = 0) -> Link | None:
        """The link called `name` (or numbered `index`) in this socket's namespace, or None."""
        try:
            answers = self._request(RTM_GETLINK, 0, _IFINFOMSG.pack(0, 0, index, 0, 0)
                                    + (nla(IFLA_IFNAME, _name(name)) if name else b""))
        except RtnlError as exc:
            if exc.errno in (errno.ENODEV, errno.ENOENT):
                return None
            raise
        return _link(answers[0][1]) if answers else None

    def delete_link(self, name: str) -> bool:
        """Delete the link called `name`; False if there is none."""
        try:
            self._ack(RTM_DELLINK, 0, _IFINFOMSG.pack(0, 0, 0, 0, 0) + nla(IFLA_IFNAME, _name(name)))
        except RtnlError as exc:
            if exc.errno in (errno.ENODEV, errno.ENOENT):
                return False
            raise
        return True

    def set_group(self, name: str, group: int) -> bool:
        """Put the link called `name` in link group `group`; False if there is no such link."""
        try:
            self._ack(RTM_SETLINK, 0, _IFINFOMSG.pack(0, 0, 0, 0, 0) + nla(IFLA_IFNAME, _name(name))
                      + nla(IFLA_GROUP, _u32(group)))
        except RtnlError as exc:
            if exc.errno in (errno.ENODEV, errno.ENOENT):
                return False
            raise
        return True

    def delete_group(self, group: int) -> None:
        """Delete every link of link group `group` in one unregistration: the kernel waits
        for RCU once for all of them (linux/rtnetlink.c, rtnl_group_dellink)."""
        self._ack(RTM_DELLINK, 0, _IFINFOMSG.pack(0, 0, 0, 0, 0) + nla(IFLA_GROUP, _u32(group)))

    def links(self) -> list[Link]:
        """Every link of the namespace (a dump: for GC, not for the hot path)."""
        return [_link(body) for kind, body in
                self._request(RTM_GETLINK, NLM_F_DUMP, _IFINFOMSG.pack(0, 0, 0, 0, 0)) if kind == RTM_NEWLINK]

    def create_veth(self, name: str, peer: str, peer_netns_fd: int, *, mtu: int | None = None,
                    peer_mac: str | None = None, up: bool = True, ipv6_link_local: bool = True,
                    alias: str | None = None) -> Link | None:
        """A veth pair `name` (here) ↔ `peer`, the peer created directly in the namespace
        of `peer_netns_fd`; returns `name` as read back when it had to be (always without
        `ipv6_link_local`), else None. Without `ipv6_link_local`, `name` never gets an IPv6
        address (addr_gen_mode none, set before it comes up)."""
        if not ipv6_link_local:
            self.create_veth(name, peer, peer_netns_fd, mtu=mtu, peer_mac=peer_mac, up=False)
            link = self.link(name)
            if link is None:
                raise RtnlError(errno.ENODEV, f"{name} vanished right after it was created")
            # The kernel refuses IFLA_AF_SPEC when creating a link: set it on the new link.
            no_addresses = nla(IFLA_INET6_ADDR_GEN_MODE, bytes([IN6_ADDR_GEN_MODE_NONE]))
            # The kernel ignores IFLA_IFALIAS in a NEWLINK: the alias rides on this SETLINK.
            marked = nla(IFLA_IFALIAS, alias.encode()) if alias else b""
            self._ack(RTM_SETLINK, 0, _IFINFOMSG.pack(0, 0, link.index, 0, 0) + marked
                      + nest(IFLA_AF_SPEC, nest(socket.AF_INET6, no_addresses)))
            if up:
                self.set_link(link.index, up=True)
            return link
        peer_attrs = [nla(IFLA_IFNAME, _name(peer)), nla(IFLA_NET_NS_FD, _u32(peer_netns_fd))]
        own = [nla(IFLA_IFNAME, _name(name))]
        if mtu:
            peer_attrs.append(nla(IFLA_MTU, _u32(mtu)))
            own.append(nla(IFLA_MTU, _u32(mtu)))
        if peer_mac:
            peer_attrs.append(nla(IFLA_ADDRESS, _mac(peer_mac)))
        info = nest(IFLA_LINKINFO, nla(IFLA_INFO_KIND, b"veth"),
                     nest(IFLA_INFO_DATA, nest(VETH_INFO_PEER, _IFINFOMSG.pack(0, 0, 0, 0, 0),
                                                 *peer_attrs)))
        flags = IFF_UP if up else 0  # applied at creation, as `ip link add … up` does
        self._ack(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL,
                  _IFINFOMSG.pack(0, 0, 0, flags, flags) + b"".join(own) + info)
        if not alias:
            return None
        created = self.link(name)  # the kernel ignores IFLA_IFALIAS in a NEWLINK
        if created is None:
            raise RtnlError(errno.ENODEV, f"{name} vanished right after it was created")
        self.set_link(created.index, alias=alias)
        return created

    def set_link(self, index: int, *, up: bool | None = None, name: str | None = None,
                 mac: str | None = None, mtu: int | None = None, netns_fd: int | None = None,
                 netns_pid: int | None = None, alias: str | None = None) -> None:
        attrs = []
        if alias is not None:  # an empty alias clears it
            attrs.append(nla(IFLA_IFALIAS, alias.encode()))
        if name is not None:
            attrs.append(nla(IFLA_IFNAME, _name(name)))
        if mac is not None:
            attrs.append(nla(IFLA_ADDRESS, _mac(mac)))
        if mtu is not None:
            attrs.append(nla(IFLA_MTU, _u32(mtu)))
        if netns_fd is not None:
            attrs.append(nla(IFLA_NET_NS_FD, _u32(netns_fd)))
        if netns_pid is not None:
            attrs.append(nla(IFLA_NET_NS_PID, _u32(netns_pid)))
        flags = change = 0
        if up is not None:
            flags, change = (IFF_UP if up else 0), IFF_UP
        self._ack(RTM_SETLINK, 0,
                  _IFINFOMSG.pack(0, 0, index, flags, change) + b"".join(attrs))

    def move_link(self, index: int, change: LinkChange, *, netns_fd: int | None = None,
                  netns_pid: int | None = None) -> None:
        """Move link `index` into the namespace of `netns_fd` (or of process `netns_pid`) and
        apply `change` to it there, in one RTM_SETLINK.

        The kernel moves first (linux/rtnetlink.c, do_setlink): that closes the link, so a
        rename needs no down of its own, and a link whose name is taken in the target takes
        `change.name` on the way. Then, on the moved link: MAC, MTU, name, alias, state.
        Each part is applied as it comes, so a refusal after the move leaves the link
        moved: that is `MovedUnconfigured`; any other RtnlError means it did not move."""
        try:
            self.set_link(index, netns_fd=netns_fd, netns_pid=netns_pid, name=change.name, mac=change.mac,
                          mtu=change.mtu, up=change.up, alias=change.alias)
        except RtnlError as exc:
            if self.link(index=index) is not None:
                raise
            raise MovedUnconfigured(exc.errno, exc.strerror) from None

    # ---- addresses and routes -------------------------------------------------------------
    def add_address(self, index: int, address: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> None:
        """Add `address` (with its prefix) to the link; EEXIST if it is there already."""
        ip = address.ip.packed
        family = socket.AF_INET if address.version == 4 else socket.AF_INET6
        attrs = nla(IFA_ADDRESS, ip)
        if family == socket.AF_INET:
            attrs = nla(IFA_LOCAL, ip) + attrs
        self._ack(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL,
                  _IFADDRMSG.pack(family, address.network.prefixlen, 0, RT_SCOPE_UNIVERSE, index) + attrs)

    def addresses(self, index: int) -> list[str]:
        """The link's addresses as "ip/prefix" (both families)."""
        out = []
        for _, body in self._request(RTM_GETADDR, NLM_F_DUMP, _IFADDRMSG.pack(0, 0, 0, 0, 0)):
            family, prefixlen, _, _, ifindex = fixed(_IFADDRMSG, body, "ifaddrmsg", RtnlError)
            if ifindex != index:
                continue
            attrs = _attrs(body, _IFADDRMSG.size)
            raw = attrs.get(IFA_ADDRESS) or attrs.get(IFA_LOCAL)
            if raw:
                if len(raw) not in (4, 16):
                    raise RtnlError(errno.EPROTO, f"malformed netlink answer: an address of {len(raw)} bytes")
                out.append(f"{ipaddress.ip_address(raw)}/{prefixlen}")
        return out

    def add_route(self, dst: str, *, oif: int, gateway: str | None = None) -> None:
        """A route in the main table; EEXIST if it is there already."""
        net = ipaddress.ip_network(dst, strict=False)
        family = socket.AF_INET if net.version == 4 else socket.AF_INET6
        attrs = nla(RTA_OIF, _u32(oif)) + nla(RTA_TABLE, _u32(RT_TABLE_MAIN))
        if net.prefixlen:
            attrs += nla(RTA_DST, net.network_address.packed)
        if gateway:
            attrs += nla(RTA_GATEWAY, ipaddress.ip_address(gateway).packed)
        scope = RT_SCOPE_UNIVERSE if gateway else RT_SCOPE_LINK
        self._ack(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL,
                  _RTMSG.pack(family, net.prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0)
                  + attrs)


def open_socket() -> socket.socket:
    """A NETLINK_ROUTE socket in the calling thread's network namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((0, 0))
    except OSError:
        sock.close()
        raise
    return sock


_host = threading.local()


def host() -> Rtnl:
    """This thread's socket in the host namespace (opened on first use).

    The caller must be a thread that stays in the host namespace (see netns.NETNS_THREAD)."""
    rt = getattr(_host, "rtnl", None)
    if rt is None:
        rt = _host.rtnl = Rtnl()
    return rt
