"""Netlink framing: the message header and the attribute walk, for every netlink family we
speak by hand (`rtnl`: NETLINK_ROUTE, `rdmanl`: NETLINK_RDMA).

What is here is what include/uapi/linux/netlink.h defines, and nothing of a family: the
`nlmsghdr` (len, type, flags, seq, pid; host byte order), NLMSG_ALIGN to 4 bytes, the
`nlattr` (len, type) walk with NLA_ALIGN to 4, NLMSG_ERROR's `nlmsgerr` (with the extended
ack's NLMSGERR_ATTR_MSG text), NLMSG_DONE, and `Answer`, which collects the answer to one
request from the datagrams that arrive (an ACKed doit, a multipart dump).

Every walk is bounded by the buffer it is given, as the kernel's own NLMSG_OK / RTA_OK
macros bound theirs: a header whose length is below the header's size or runs past the end
of the buffer is refused (errno EPROTO, in the caller's exception class), never read past,
never looped on. Fewer bytes than a header left at the end (padding) end the walk, as the
macros end it. tests/unit/test_nlframing.py holds the walks to those macros, compiled from
the kernel's header.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from typing import NamedTuple

# include/uapi/linux/netlink.h
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400  # in a NEW request's flags
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200  # in an NLMSG_ERROR's flags
NLMSGERR_ATTR_MSG = 1
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
NLMSG_ALIGNTO = NLA_ALIGNTO = 4

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
NLA = struct.Struct("=HH")  # nla_len, nla_type
_INT = struct.Struct("=i")


class NetlinkError(OSError):
    """The kernel refused a request (errno as it gave it), or its answer is malformed (EPROTO).
    Each family has its subclass; the walks raise the one they are given."""


def _align(size: int) -> int:
    return (size + 3) & ~3


# ---- encoding ---------------------------------------------------------------------------------


def nla(kind: int, payload: bytes) -> bytes:
    """One attribute, padded to NLA_ALIGNTO with zeroes."""
    size = NLA.size + len(payload)
    return NLA.pack(size, kind) + payload + b"\0" * (-size & 3)


def nest(kind: int, *parts: bytes) -> bytes:
    return nla(kind | NLA_F_NESTED, b"".join(parts))


def message(kind: int, flags: int, seq: int, payload: bytes = b"") -> bytes:
    """One request: its header (nlmsg_pid 0: to the kernel) and `payload`."""
    return NLMSGHDR.pack(NLMSGHDR.size + len(payload), kind, flags, seq, 0) + payload


# ---- decoding ---------------------------------------------------------------------------------


class Message(NamedTuple):
    type: int
    flags: int
    seq: int
    body: bytes


def messages(data: bytes, error: type[NetlinkError] = NetlinkError) -> Iterator[Message]:
    """The netlink messages of one datagram (NLMSG_OK / NLMSG_NEXT)."""
    offset, end = 0, len(data)
    while end - offset >= NLMSGHDR.size:
        size, kind, flags, seq, _ = NLMSGHDR.unpack_from(data, offset)
        if size < NLMSGHDR.size or size > end - offset:
            raise error(errno.EPROTO, f"malformed netlink answer: nlmsg_len {size} at byte {offset} "
                                      f"of {end}")
        yield Message(kind, flags, seq, data[offset + NLMSGHDR.size:offset + size])
        offset += _align(size)


def attributes(data: bytes, offset: int = 0, error: type[NetlinkError] = NetlinkError) -> dict[int, bytes]:
    """Attributes from `offset` on, by type (flag bits cleared); the last of a type wins."""
    out: dict[int, bytes] = {}
    end = len(data)
    while end - offset >= NLA.size:
        size, kind = NLA.unpack_from(data, offset)
        if size < NLA.size or size > end - offset:
            raise error(errno.EPROTO, f"malformed netlink attribute: nla_len {size} at byte {offset} "
                                      f"of {end}")
        out[kind & NLA_TYPE_MASK] = data[offset + NLA.size:offset + size]
        offset += _align(size)
    return out


def fixed(layout: struct.Struct, body: bytes, what: str, error: type[NetlinkError] = NetlinkError
          ) -> tuple[int, ...]:
    """A family's fixed header (`ifinfomsg`, …) at the start of `body`, or EPROTO if short."""
    if len(body) < layout.size:
        raise error(errno.EPROTO, f"malformed netlink answer: {what} of {len(body)} bytes, "
                                  f"{layout.size} expected")
    return layout.unpack_from(body)


def text(value: bytes) -> str:
    """A NUL-terminated string attribute."""
    return value.split(b"\0", 1)[0].decode(errors="replace")


def error_of(msg: Message, error: type[NetlinkError] = NetlinkError) -> NetlinkError | None:
    """The error an NLMSG_ERROR carries (None for an ACK), with the kernel's extended-ack
    text when there is one (NETLINK_EXT_ACK)."""
    if len(msg.body) < _INT.size:
        return error(errno.EPROTO, "truncated NLMSG_ERROR")
    code = -_INT.unpack_from(msg.body)[0]
    if code == 0:
        return None
    if code < 0:  # a positive "error" is no errno
        return error(errno.EPROTO, f"NLMSG_ERROR with error {-code}")
    message_text = os.strerror(code)
    if msg.flags & NLM_F_ACK_TLVS and len(msg.body) >= _INT.size + NLMSGHDR.size:
        # struct nlmsgerr: error, the request's header (+ its payload unless NLM_F_CAPPED), TLVs
        offset = _INT.size + NLMSGHDR.size
        if not msg.flags & NLM_F_CAPPED:
            offset = _INT.size + _align(NLMSGHDR.unpack_from(msg.body, _INT.size)[0])
        try:
            extra = attributes(msg.body, offset, error).get(NLMSGERR_ATTR_MSG)
        except NetlinkError:
            extra = None
        if extra:
            message_text = f"{message_text}: {text(extra)}"
    return error(code, message_text)


class Answer:
    """Collects the answers to one request from the datagrams that arrive (pure: feed it
    bytes). Done at the ACK (or error) of a doit, at NLMSG_DONE of a dump, at the first
    plain message of a request that asked for no ACK."""

    def __init__(self, seq: int, acked: bool, error: type[NetlinkError] = NetlinkError) -> None:
        self.seq = seq
        self.acked = acked
        self.error = error
        self.bodies: list[tuple[int, bytes]] = []  # (type, body) of every data message
        self.done = False

    def feed(self, data: bytes) -> None:
        for msg in messages(data, self.error):
            if msg.seq != self.seq or self.done:
                continue  # an answer to an earlier, abandoned request
            if msg.type == NLMSG_ERROR:
                failure = error_of(msg, self.error)
                if failure is not None:
                    raise failure
                self.done = True
            elif msg.type == NLMSG_DONE:
                # A dump that fails part-way says so in NLMSG_DONE's int.
                if len(msg.body) >= _INT.size and _INT.unpack_from(msg.body)[0] < 0:
                    code = -_INT.unpack_from(msg.body)[0]
                    raise self.error(code, os.strerror(code))
                self.done = True
            else:
                self.bodies.append((msg.type, msg.body))
                if not msg.flags & NLM_F_MULTI and not self.acked:
                    self.done = True
