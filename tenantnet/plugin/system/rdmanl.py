"""RDMA netlink (NETLINK_RDMA, the `nldev` client): the subsystem's netns mode, the RDMA
devices of a namespace, and moving a device to another network namespace.

A plain socket of our own and a handful of fixed messages encoded with `struct`, framed by
`tenantnet.plugin.system.nlframing` (as `rtnl` is): what `rdma system show`, `rdma dev show` and
`rdma dev set <dev> netns <ns>` (iproute2) send. The encoders are pure functions returning
the bytes; the decoders read answers from bytes; `RdmaNetlink` only sends and receives.

Message layout: an nlmsghdr whose type is RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)
(= 5 << 10 | command), then the attributes directly (nldev has no family header: the kernel
parses with nlmsg_parse(nlh, 0, …)). Constants from include/uapi/rdma/rdma_netlink.h
(enum rdma_nldev_command, enum rdma_nldev_attr) and include/uapi/linux/netlink.h, checked by
compiling against Debian 12's linux-libc-dev 6.1 headers (/usr/include/rdma/rdma_netlink.h)
and against iproute2's copy (rdma/include/uapi/rdma/rdma_netlink.h).

What the kernel does with them (drivers/infiniband/core/nldev.c, device.c):
- SYS_GET answers RDMA_NLDEV_SYS_ATTR_NETNS_MODE, a u8: 1 shared (the ib_core default,
  module parameter `netns_mode`), 0 exclusive. SYS_SET with the same attribute changes it,
  but only while no network namespace other than init_net exists (else EBUSY).
- GET with NLM_F_DUMP lists the devices the socket's namespace can see: all of them in
  shared mode, only its own in exclusive mode. GET/SET of a single device need
  RDMA_NLDEV_ATTR_DEV_INDEX (there is no lookup by name: resolve it with a dump).
- SET with RDMA_NLDEV_NET_NS_FD moves the device (ib_device_set_netns_put): EOPNOTSUPP in
  shared mode (or when the driver cannot disassociate user contexts), EPERM without
  CAP_NET_ADMIN over the target, EINVAL when the index is not visible from the *socket's*
  namespace, ENODEV when the device is not in the *sending thread's* namespace
  (current->nsproxy->net_ns). So a device in a pod is moved by a thread that has entered the
  pod's namespace and opened its socket there — `run(work, netns=path)` does exactly that.
  Never send RDMA_NLDEV_ATTR_DEV_NAME with the move: nldev_set_doit treats a name as a
  rename and returns before looking at the namespace fd.
- A namespace that is destroyed hands its RDMA devices back to init_net (rdma_dev_exit_net).

Errors come back as `RdmaNlError`, an OSError with the kernel's errno (and its extended-ack
message, when it sent one). A kernel without ib_core has no NETLINK_RDMA: opening the socket
fails with EPROTONOSUPPORT.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from tenantnet.plugin.system import nlframing
from tenantnet.plugin.system.netns import _in_thread_inside, open_netns_fd
from tenantnet.plugin.system.nlframing import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkError, nla, text

T = TypeVar("T")

NETLINK_RDMA = 20
SOL_NETLINK = 270  # bits/socket.h; not exported by Python's socket module
NETLINK_CAP_ACK, NETLINK_EXT_ACK = 10, 11
# include/uapi/rdma/rdma_netlink.h
RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET, RDMA_NLDEV_CMD_SET = 1, 2
RDMA_NLDEV_CMD_SYS_GET, RDMA_NLDEV_CMD_SYS_SET = 6, 7
RDMA_NLDEV_ATTR_DEV_INDEX, RDMA_NLDEV_ATTR_DEV_NAME = 1, 2
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
RDMA_NLDEV_NET_NS_FD = 68
NETNS_MODES = {0: "exclusive", 1: "shared"}  # RDMA_NLDEV_SYS_ATTR_NETNS_MODE values (iproute2 rdma/sys.c)



class RdmaNlError(NetlinkError):
    """The kernel refused an RDMA netlink request (errno as the kernel gave it)."""


class RdmaDevice(NamedTuple):
    dev_index: int  # RDMA_NLDEV_ATTR_DEV_INDEX (`index` would shadow tuple.index)
    name: str


def nldev_type(command: int) -> int:
    """RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)."""
    return RDMA_NL_NLDEV << 10 | command


# ---- encoding (pure) ------------------------------------------------------------------------


def _message(command: int, flags: int, seq: int, attrs: bytes = b"") -> bytes:
    return nlframing.message(nldev_type(command), flags | NLM_F_REQUEST, seq, attrs)


def encode_sys_get(seq: int) -> bytes:
    """`rdma system show`: the subsystem's parameters (a doit, answered by one message + ACK)."""
    return _message(RDMA_NLDEV_CMD_SYS_GET, NLM_F_ACK, seq)


def encode_sys_set(seq: int, mode: str) -> bytes:
    """`rdma system set netns shared|exclusive`."""
    value = {name: value for value, name in NETNS_MODES.items()}.get(mode)
    if value is None:
        raise ValueError(f"RDMA netns mode {mode!r}: allowed are shared, exclusive")
    return _message(RDMA_NLDEV_CMD_SYS_SET, NLM_F_ACK, seq,
                    nla(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, struct.pack("=B", value)))


def encode_dev_dump(seq: int) -> bytes:
    """`rdma dev show`: every device the socket's namespace can see (a dump)."""
    return _message(RDMA_NLDEV_CMD_GET, NLM_F_DUMP, seq)


def encode_move(seq: int, index: int, netns_fd: int) -> bytes:
    """`rdma dev set <dev> netns <ns>`: DEV_INDEX u32 + NET_NS_FD u32, nothing else (a name
    would make it a rename)."""
    if not 0 <= index <= 0xFFFFFFFF or not 0 <= netns_fd <= 0xFFFFFFFF:
        raise ValueError(f"RDMA device index {index} / netns fd {netns_fd} out of the u32 range")
    return _message(RDMA_NLDEV_CMD_SET, NLM_F_ACK, seq,
                    nla(RDMA_NLDEV_ATTR_DEV_INDEX, struct.pack("=I", index))
                    + nla(RDMA_NLDEV_NET_NS_FD, struct.pack("=I", netns_fd)))


# ---- decoding (pure) ------------------------------------------------------------------------


def attributes(data: bytes, offset: int = 0) -> dict[int, bytes]:
    """Top-level attributes from `offset` on, by type (flag bits cleared); the last one wins."""
    return nlframing.attributes(data, offset, RdmaNlError)


def decode_netns_mode(body: bytes) -> str:
    """"shared" or "exclusive" from a SYS_GET answer's attributes."""
    raw = attributes(body).get(RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
    if raw is None or len(raw) < 1:
        raise RdmaNlError(errno.EPROTO, "SYS_GET answer without RDMA_NLDEV_SYS_ATTR_NETNS_MODE")
    mode = NETNS_MODES.get(raw[0])
    if mode is None:
        raise RdmaNlError(errno.EPROTO, f"unknown RDMA netns mode {raw[0]}")
    return mode


def decode_device(body: bytes) -> RdmaDevice:
    """Index and name from a GET answer's attributes."""
    attrs = attributes(body)
    index, name = attrs.get(RDMA_NLDEV_ATTR_DEV_INDEX), attrs.get(RDMA_NLDEV_ATTR_DEV_NAME)
    if index is None or len(index) < 4 or name is None:
        raise RdmaNlError(errno.EPROTO, "RDMA device answer without DEV_INDEX / DEV_NAME")
    return RdmaDevice(struct.unpack_from("=I", index)[0], text(name))


class Answer(nlframing.Answer):
    """nlframing.Answer raising RdmaNlError."""

    def __init__(self, seq: int, acked: bool) -> None:
        super().__init__(seq, acked, RdmaNlError)


# ---- transport -------------------------------------------------------------------------------


def open_socket() -> socket.socket:
    """A NETLINK_RDMA socket in the calling thread's network namespace."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_RDMA)
    except OSError as exc:
        if exc.errno == errno.EPROTONOSUPPORT:
            raise RdmaNlError(errno.EPROTONOSUPPORT, "this kernel has no RDMA netlink "
                                                     "(NETLINK_RDMA: ib_core is not loaded)") from None
        raise
    try:
        for option in (NETLINK_CAP_ACK, NETLINK_EXT_ACK):
            try:
                sock.setsockopt(SOL_NETLINK, option, 1)
            except OSError:
                pass  # older kernels: plain errors, still with their errno
        sock.bind((0, 0))
    except OSError:
        sock.close()
        raise
    return sock


class RdmaNetlink:
    """One NETLINK_RDMA socket, for one thread at a time; its namespace is the one it was
    opened in (and a move must also be *sent* from a thread in the device's namespace)."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self.sock = sock or open_socket()
        self._seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RdmaNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq

    def _request(self, encode: Callable[[int], bytes], acked: bool) -> list[tuple[int, bytes]]:
        seq = self._next_seq()
        self.sock.send(encode(seq))
        answer = Answer(seq, acked)
        while not answer.done:
            answer.feed(self.sock.recv(1 << 16))
        return answer.bodies

    def netns_mode(self) -> str:
        answers = self._request(encode_sys_get, acked=True)
        for kind, body in answers:
            if kind == nldev_type(RDMA_NLDEV_CMD_SYS_GET):
                return decode_netns_mode(body)
        raise RdmaNlError(errno.EPROTO, "no answer to RDMA SYS_GET")

    def set_netns_mode(self, mode: str) -> None:
        encode_sys_set(0, mode)  # validation before anything is sent
        self._request(lambda seq: encode_sys_set(seq, mode), acked=True)

    def devices(self) -> list[RdmaDevice]:
        return [decode_device(body) for kind, body in self._request(encode_dev_dump, acked=False)
                if kind == nldev_type(RDMA_NLDEV_CMD_GET)]

    def index_of(self, name: str) -> int | None:
        for device in self.devices():
            if device.name == name:
                return device.dev_index
        return None

    def move(self, device: str | int, netns_fd: int) -> None:
        """Move `device` (name or index, as this socket's namespace sees it) to the namespace
        of `netns_fd`. A name not seen here: ENODEV."""
        if isinstance(device, str):
            index = self.index_of(device)
            if index is None:
                raise RdmaNlError(errno.ENODEV, f"no RDMA device {device} in this network namespace")
        else:
            index = device
        self._request(lambda seq: encode_move(seq, index, netns_fd), acked=True)


# ---- where the socket lives ------------------------------------------------------------------


def run(work: Callable[[RdmaNetlink], T], netns: str | None = None) -> T:
    """`work(nl)` with a socket in the calling thread's namespace (`netns` None), or on a
    short-lived thread that has entered the namespace at the path `netns` and opened the
    socket there — so both the socket and the sending thread are inside, as a move of a
    device held by that namespace needs. NamespaceNotFound when `netns` is none."""

    def body() -> T:
        with RdmaNetlink() as nl:
            return work(nl)

    if netns is None:
        return body()
    fd = open_netns_fd(netns)
    try:
        return _in_thread_inside(fd, netns, body)
    finally:
        os.close(fd)


def system_netns_mode(netns: str | None = None) -> str:
    """"shared" or "exclusive" (the same for every namespace: it is the subsystem's)."""
    return run(lambda nl: nl.netns_mode(), netns)


def set_system_netns_mode(mode: str, netns: str | None = None) -> None:
    run(lambda nl: nl.set_netns_mode(mode), netns)


def devices(netns: str | None = None) -> list[RdmaDevice]:
    """The RDMA devices visible from the namespace (every device in shared mode)."""
    return run(lambda nl: nl.devices(), netns)


def index_of(name: str, netns: str | None = None) -> int | None:
    return run(lambda nl: nl.index_of(name), netns)


def move_to_netns(device: str | int, netns_fd: int, *, netns: str | None = None) -> None:
    """Move `device`, held by the namespace at `netns` (None: the caller's), to the namespace
    of `netns_fd` (back to the host: an fd of the host's namespace, opened by the caller)."""
    run(lambda nl: nl.move(device, netns_fd), netns)
