"""tenantnet.plugin.system.rdmanl without RDMA hardware: every request byte for byte against
layouts computed by hand, answers decoded from hand-built bytes (an ACKed doit, a multipart
dump, errors with and without extended ack), the constants against the kernel's header —
and NetlinkRdmaControl's logic over a stand-in for the netlink calls.

The constants below are copied from include/uapi/rdma/rdma_netlink.h and
include/uapi/linux/netlink.h, not taken from the module; where the machine has the header
(/usr/include/rdma/rdma_netlink.h, Debian's linux-libc-dev) one test also reads the enums
from it. Netlink is in host byte order; the literals are little-endian (x86-64, arm64).
"""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from cni.errors import CniError
from tenantnet.plugin.system import nlframing, rdmacontrol, rdmanl
from tenantnet.plugin.system.rdmacontrol import (
    NetlinkRdmaControl,
    NetnsId,
    RdmaDeviceNotFound,
    RdmaProblem,
    RdmaSharedMode,
    RdmaUnavailable,
)

# --- include/uapi/linux/netlink.h ---
NETLINK_RDMA = 20
NLMSG_ERROR, NLMSG_DONE = 0x2, 0x3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x01, 0x02, 0x04
NLM_F_DUMP = 0x100 | 0x200  # NLM_F_ROOT | NLM_F_MATCH
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200
NLMSGERR_ATTR_MSG = 1
# --- include/uapi/rdma/rdma_netlink.h ---
RDMA_NL_NLDEV = 5  # enum { RDMA_NL_RDMA_CM = 1, RDMA_NL_IWCM, RDMA_NL_RSVD, RDMA_NL_LS, RDMA_NL_NLDEV }
RDMA_NLDEV_CMD_GET, RDMA_NLDEV_CMD_SET, RDMA_NLDEV_CMD_SYS_GET, RDMA_NLDEV_CMD_SYS_SET = 1, 2, 6, 7
RDMA_NLDEV_ATTR_PAD = 0  # = RDMA_NLDEV_ATTR_UNSPEC, before every 64-bit attribute
RDMA_NLDEV_ATTR_DEV_INDEX, RDMA_NLDEV_ATTR_DEV_NAME = 1, 2
RDMA_NLDEV_ATTR_NODE_GUID = 6
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
RDMA_NLDEV_NET_NS_FD = 68


def rdma_nl_get_type(client: int, op: int) -> int:
    return (client << 10) + op  # RDMA_NL_GET_TYPE


T_GET = rdma_nl_get_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_GET)  # 0x1401
T_SET = rdma_nl_get_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SET)  # 0x1402
T_SYS_GET = rdma_nl_get_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SYS_GET)  # 0x1406
T_SYS_SET = rdma_nl_get_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SYS_SET)  # 0x1407

NLMSGHDR = struct.Struct("=IHHII")


def test_host_byte_order_is_the_literals_order() -> None:
    assert sys.byteorder == "little", "netlink is host byte order; the literals below are little-endian"


def test_constants_are_the_headers() -> None:
    assert (T_GET, T_SET, T_SYS_GET, T_SYS_SET) == (0x1401, 0x1402, 0x1406, 0x1407)
    assert rdmanl.NETLINK_RDMA == NETLINK_RDMA
    assert rdmanl.RDMA_NL_NLDEV == RDMA_NL_NLDEV
    assert [rdmanl.nldev_type(c) for c in (1, 2, 6, 7)] == [T_GET, T_SET, T_SYS_GET, T_SYS_SET]
    assert (rdmanl.RDMA_NLDEV_ATTR_DEV_INDEX, rdmanl.RDMA_NLDEV_ATTR_DEV_NAME,
            rdmanl.RDMA_NLDEV_SYS_ATTR_NETNS_MODE, rdmanl.RDMA_NLDEV_NET_NS_FD) == (1, 2, 66, 68)
    assert (nlframing.NLM_F_DUMP, nlframing.NLM_F_CAPPED, nlframing.NLM_F_ACK_TLVS) == (0x300, 0x100, 0x200)
    # iproute2 rdma/sys.c: netns_modes_str[] = { "exclusive", "shared" }
    assert rdmanl.NETNS_MODES == {0: "exclusive", 1: "shared"}


def _enum(text: str, pattern: str) -> dict[str, int]:
    """The values of the C enum whose body matches `pattern` (names, `= number`, `= NAME`)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    for body in re.findall(r"enum\s*\w*\s*\{([^}]*)\}", text):
        if re.search(pattern, body):
            break
    else:
        raise AssertionError(f"no enum with {pattern}")
    values: dict[str, int] = {}
    nxt = 0
    for item in (part.strip() for part in body.split(",")):
        if not item:
            continue
        name, _, expr = (s.strip() for s in item.partition("="))
        if expr:
            nxt = values[expr] if expr in values else int(expr, 0)
        values[name] = nxt
        nxt += 1
    return values


HEADER = Path("/usr/include/rdma/rdma_netlink.h")


@pytest.mark.skipif(not HEADER.exists(), reason=f"{HEADER} not installed (linux-libc-dev); the "
                                                "values above are checked against it where it is")
def test_constants_against_the_installed_header() -> None:
    text = HEADER.read_text()
    clients = _enum(text, r"\bRDMA_NL_NLDEV\b")
    commands = _enum(text, r"\bRDMA_NLDEV_CMD_SYS_SET\b")
    attrs = _enum(text, r"\bRDMA_NLDEV_NET_NS_FD\b")
    assert clients["RDMA_NL_NLDEV"] == rdmanl.RDMA_NL_NLDEV
    assert (commands["RDMA_NLDEV_CMD_GET"], commands["RDMA_NLDEV_CMD_SET"], commands["RDMA_NLDEV_CMD_SYS_GET"],
            commands["RDMA_NLDEV_CMD_SYS_SET"]) == (1, 2, 6, 7)
    assert (attrs["RDMA_NLDEV_ATTR_DEV_INDEX"], attrs["RDMA_NLDEV_ATTR_DEV_NAME"],
            attrs["RDMA_NLDEV_SYS_ATTR_NETNS_MODE"], attrs["RDMA_NLDEV_NET_NS_FD"]) == (1, 2, 66, 68)
    assert attrs["RDMA_NLDEV_ATTR_NODE_GUID"] == RDMA_NLDEV_ATTR_NODE_GUID
    assert "#define RDMA_NL_GET_TYPE(client, op) ((client << 10) + op)" in text


# ---- requests, byte for byte -------------------------------------------------------------------


def test_sys_get_bytes() -> None:
    # nlmsghdr: len 16 | type 0x1406 | flags REQUEST|ACK | seq 7 | pid 0 — no family header, no attributes
    assert rdmanl.encode_sys_get(7) == bytes.fromhex("10000000" "0614" "0500" "07000000" "00000000")


def test_sys_set_bytes() -> None:
    # len 24 | 0x1407 | REQUEST|ACK | seq 8 | pid 0, then NETNS_MODE: nla_len 5, type 66, u8, 3 bytes of pad
    header = "18000000" "0714" "0500" "08000000" "00000000"
    assert rdmanl.encode_sys_set(8, "exclusive") == bytes.fromhex(header + "05004200" "00" "000000")
    assert rdmanl.encode_sys_set(8, "shared") == bytes.fromhex(header + "05004200" "01" "000000")
    with pytest.raises(ValueError, match="'isolated': allowed are shared, exclusive"):
        rdmanl.encode_sys_set(8, "isolated")


def test_device_dump_bytes() -> None:
    # len 16 | 0x1401 | REQUEST|DUMP (0x301) | seq 1 | pid 0
    assert rdmanl.encode_dev_dump(1) == bytes.fromhex("10000000" "0114" "0103" "01000000" "00000000")


def test_move_bytes() -> None:
    # len 32 | 0x1402 | REQUEST|ACK | seq 3 | pid 0, DEV_INDEX (8, 1) u32 4, NET_NS_FD (8, 68) u32 9;
    # no DEV_NAME: nldev_set_doit would take the request for a rename.
    assert rdmanl.encode_move(3, 4, 9) == bytes.fromhex(
        "20000000" "0214" "0500" "03000000" "00000000" "08000100" "04000000" "08004400" "09000000")
    with pytest.raises(ValueError):
        rdmanl.encode_move(3, -1, 9)


# ---- answers, as the kernel sends them ---------------------------------------------------------


def nla(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) & 3)


def msg(mtype: int, flags: int, seq: int, body: bytes) -> bytes:
    out = NLMSGHDR.pack(NLMSGHDR.size + len(body), mtype, flags, seq, 4321) + body
    return out + b"\0" * (-len(out) & 3)


def ack(seq: int, request_type: int, code: int = 0, text: str | None = None) -> bytes:
    """NLMSG_ERROR as sent with NETLINK_CAP_ACK (the request's header only) and, with `text`,
    NETLINK_EXT_ACK's NLMSGERR_ATTR_MSG."""
    body = struct.pack("=i", -code) + NLMSGHDR.pack(16, request_type, NLM_F_REQUEST | NLM_F_ACK, seq, 0)
    flags = NLM_F_CAPPED
    if text is not None:
        body += nla(NLMSGERR_ATTR_MSG, text.encode() + b"\0")
        flags |= NLM_F_ACK_TLVS
    return msg(NLMSG_ERROR, flags, seq, body)


def device_body(index: int, name: str, guid: int = 0x0102030405060708) -> bytes:
    # fill_dev_info: DEV_INDEX, DEV_NAME, …, NODE_GUID as nla_put_u64_64bit (a PAD attribute first)
    return (nla(RDMA_NLDEV_ATTR_DEV_INDEX, struct.pack("=I", index))
            + nla(RDMA_NLDEV_ATTR_DEV_NAME, name.encode() + b"\0")
            + nla(RDMA_NLDEV_ATTR_PAD, b"") + nla(RDMA_NLDEV_ATTR_NODE_GUID, struct.pack("=Q", guid)))


def test_sys_get_answer_then_ack() -> None:
    answer = rdmanl.Answer(seq=7, acked=True)
    answer.feed(msg(T_SYS_GET, 0, 7, nla(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, b"\x00")))
    assert not answer.done  # a doit with NLM_F_ACK ends at the ACK
    answer.feed(ack(7, T_SYS_GET))
    assert answer.done
    [(kind, body)] = answer.bodies
    assert kind == T_SYS_GET
    assert rdmanl.decode_netns_mode(body) == "exclusive"
    assert rdmanl.decode_netns_mode(nla(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, b"\x01")) == "shared"
    with pytest.raises(rdmanl.RdmaNlError) as err:
        rdmanl.decode_netns_mode(nla(RDMA_NLDEV_ATTR_DEV_INDEX, b"\0\0\0\0"))
    assert err.value.errno == errno.EPROTO


def test_multipart_dump_across_datagrams() -> None:
    answer = rdmanl.Answer(seq=1, acked=False)
    answer.feed(msg(T_GET, NLM_F_MULTI, 1, device_body(0, "mlx5_0"))
                + msg(T_GET, NLM_F_MULTI, 1, device_body(1, "mlx5_1")))
    assert not answer.done
    answer.feed(msg(T_GET, NLM_F_MULTI, 1, device_body(7, "mlx5_2")) + msg(NLMSG_DONE, NLM_F_MULTI, 1, b"\0" * 4))
    assert answer.done
    assert [rdmanl.decode_device(body) for _, body in answer.bodies] == [(0, "mlx5_0"), (1, "mlx5_1"), (7, "mlx5_2")]
    assert rdmanl.decode_device(device_body(3, "x")).dev_index == 3


def test_answers_to_other_requests_are_ignored() -> None:
    answer = rdmanl.Answer(seq=5, acked=True)
    answer.feed(ack(4, T_SET, errno.EINVAL) + msg(T_SYS_GET, 0, 4, b""))  # an abandoned request's
    assert not answer.done and not answer.bodies
    answer.feed(ack(5, T_SET))
    assert answer.done and not answer.bodies


def test_nlmsg_error_becomes_the_errno() -> None:
    answer = rdmanl.Answer(seq=3, acked=True)
    with pytest.raises(rdmanl.RdmaNlError) as err:
        answer.feed(ack(3, T_SET, errno.EOPNOTSUPP))
    assert isinstance(err.value, OSError)
    assert err.value.errno == errno.EOPNOTSUPP
    assert err.value.strerror == os.strerror(errno.EOPNOTSUPP)


def test_nlmsg_error_with_extended_ack_text() -> None:
    text = "Device name already exists in the target net namespace"
    with pytest.raises(rdmanl.RdmaNlError) as err:
        rdmanl.Answer(seq=3, acked=True).feed(ack(3, T_SET, errno.EEXIST, text))
    assert err.value.errno == errno.EEXIST
    assert err.value.strerror == f"{os.strerror(errno.EEXIST)}: {text}"


def test_nlmsg_error_uncapped_echoes_the_request() -> None:
    # Without NETLINK_CAP_ACK the kernel echoes the whole request before the TLVs.
    request = rdmanl.encode_move(3, 4, 9)
    body = struct.pack("=i", -errno.EPERM) + request + nla(NLMSGERR_ATTR_MSG, b"not allowed\0")
    with pytest.raises(rdmanl.RdmaNlError) as err:
        rdmanl.Answer(seq=3, acked=True).feed(msg(NLMSG_ERROR, NLM_F_ACK_TLVS, 3, body))
    assert (err.value.errno, err.value.strerror) == (errno.EPERM, f"{os.strerror(errno.EPERM)}: not allowed")


def test_a_dump_failing_part_way() -> None:
    answer = rdmanl.Answer(seq=1, acked=False)
    with pytest.raises(rdmanl.RdmaNlError) as err:
        answer.feed(msg(T_GET, NLM_F_MULTI, 1, device_body(0, "mlx5_0"))
                    + msg(NLMSG_DONE, NLM_F_MULTI, 1, struct.pack("=i", -errno.EMSGSIZE)))
    assert err.value.errno == errno.EMSGSIZE


@pytest.mark.parametrize("data", [
    NLMSGHDR.pack(8, NLMSG_ERROR, 0, 1, 0),  # nlmsg_len below the header's size
    NLMSGHDR.pack(64, T_GET, 0, 1, 0),  # longer than the datagram
    msg(T_GET, 0, 1, struct.pack("=HH", 40, 1)),  # an attribute longer than the message
])
def test_malformed_answers(data: bytes) -> None:
    with pytest.raises(rdmanl.RdmaNlError) as err:
        answer = rdmanl.Answer(seq=1, acked=False)
        answer.feed(data)
        rdmanl.decode_device(answer.bodies[0][1])
    assert err.value.errno == errno.EPROTO


# ---- the socket wrapper over a recording stand-in ------------------------------------------------


class FakeSocket:
    """Records what is sent; answers each request with queued datagrams built for its seq."""

    def __init__(self, *replies: Any) -> None:
        self.sent: list[bytes] = []
        self.replies = list(replies)  # per request: a function seq -> list of datagrams
        self.pending: list[bytes] = []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        self.pending = self.replies.pop(0)(NLMSGHDR.unpack_from(data)[3])
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.pending.pop(0)

    def close(self) -> None:
        pass


def sent_headers(fake: FakeSocket) -> list[tuple[int, int, int]]:
    out = []
    for data in fake.sent:
        size, mtype, flags, seq, pid = NLMSGHDR.unpack_from(data)
        assert (size, pid) == (len(data), 0)
        out.append((mtype, flags, seq))
    return out


def dump_of(*names: str) -> Any:
    def reply(seq: int) -> list[bytes]:
        return [b"".join(msg(T_GET, NLM_F_MULTI, seq, device_body(i, n)) for i, n in enumerate(names)),
                msg(NLMSG_DONE, NLM_F_MULTI, seq, b"\0" * 4)]
    return reply


def test_netns_mode_and_devices_over_a_socket() -> None:
    fake = FakeSocket(lambda seq: [msg(T_SYS_GET, 0, seq, nla(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, b"\x01")),
                                   ack(seq, T_SYS_GET)],
                      dump_of("mlx5_0", "mlx5_1"))
    nl = rdmanl.RdmaNetlink(fake)  # type: ignore[arg-type]
    assert nl.netns_mode() == "shared"
    assert nl.devices() == [(0, "mlx5_0"), (1, "mlx5_1")]
    assert sent_headers(fake) == [(T_SYS_GET, NLM_F_REQUEST | NLM_F_ACK, 1), (T_GET, NLM_F_REQUEST | NLM_F_DUMP, 2)]


def test_move_by_name_resolves_the_index_in_the_same_namespace() -> None:
    fake = FakeSocket(dump_of("mlx5_0", "mlx5_1", "mlx5_2"), lambda seq: [ack(seq, T_SET)])
    rdmanl.RdmaNetlink(fake).move("mlx5_2", 9)  # type: ignore[arg-type]
    assert fake.sent[1] == rdmanl.encode_move(2, 2, 9)
    assert sent_headers(fake)[1] == (T_SET, NLM_F_REQUEST | NLM_F_ACK, 2)


def test_move_of_a_device_this_namespace_does_not_see() -> None:
    fake = FakeSocket(dump_of("mlx5_0"))
    with pytest.raises(rdmanl.RdmaNlError) as err:
        rdmanl.RdmaNetlink(fake).move("mlx5_2", 9)  # type: ignore[arg-type]
    assert err.value.errno == errno.ENODEV
    assert len(fake.sent) == 1  # the dump only: no SET


def test_shared_mode_refusal_from_the_kernel() -> None:
    fake = FakeSocket(lambda seq: [ack(seq, T_SET, errno.EOPNOTSUPP)])
    with pytest.raises(rdmanl.RdmaNlError) as err:
        rdmanl.RdmaNetlink(fake).move(4, 9)  # type: ignore[arg-type]
    assert err.value.errno == errno.EOPNOTSUPP
    assert fake.sent == [rdmanl.encode_move(1, 4, 9)]


def test_run_opens_the_socket_and_sends_from_inside_the_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    # A move must be sent by a thread inside the namespace holding the device (the kernel
    # compares current->nsproxy->net_ns), not only on a socket opened there.
    import threading

    from tenantnet.plugin.system.netns import NETNS_THREAD, NamespaceNotFound

    with pytest.raises(NamespaceNotFound):
        rdmanl.run(lambda nl: None, netns="/nonexistent/netns")
    if os.geteuid() != 0:
        pytest.skip("entering a namespace (setns) needs CAP_SYS_ADMIN")
    threads: list[str] = []

    def fake_socket() -> FakeSocket:
        threads.append(threading.current_thread().name)
        return FakeSocket(lambda seq: [ack(seq, T_SET)])

    monkeypatch.setattr(rdmanl, "open_socket", fake_socket)

    def work(nl: rdmanl.RdmaNetlink) -> str:
        nl.move(4, 9)
        return threading.current_thread().name

    assert rdmanl.run(work, netns=OWN_NETNS) == NETNS_THREAD
    assert threads == [NETNS_THREAD]


def _rdma_netlink_available() -> str | None:
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA).close()
    except OSError as exc:
        return f"this kernel has no NETLINK_RDMA ({exc.strerror}: ib_core is not loaded)"
    return None


@pytest.mark.skipif(_rdma_netlink_available() is not None, reason=str(_rdma_netlink_available()))
def test_the_kernel_answers_sys_get() -> None:
    assert rdmanl.system_netns_mode() in ("shared", "exclusive")
    assert all(isinstance(d.dev_index, int) and d.name for d in rdmanl.devices())


def test_no_rdma_netlink_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_protocol(*args: Any) -> Any:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    monkeypatch.setattr(socket, "socket", no_protocol)  # what rdmanl.open_socket calls
    with pytest.raises(rdmanl.RdmaNlError, match="ib_core is not loaded") as err:
        rdmanl.open_socket()
    assert err.value.errno == errno.EPROTONOSUPPORT
    with pytest.raises(RdmaUnavailable):
        NetlinkRdmaControl().netns_mode()


# ---- NetlinkRdmaControl over stand-in netlink calls ----------------------------------------------

OWN_NETNS = "/proc/self/ns/net"  # a namespace every test process can open


class FakeCalls:
    """Devices by namespace path (None: the host); the kernel's errors for what it refuses."""

    def __init__(self, mode: str = "exclusive", **where: str | None) -> None:
        self.mode = mode
        self.where = dict(where)  # device -> namespace path or None
        self.calls: list[tuple[Any, ...]] = []
        self.arrives_after: dict[str, int] = {}  # device -> host lookups before it shows there

    def system_netns_mode(self, netns: str | None = None) -> str:
        return self.mode

    def index_of(self, name: str, netns: str | None = None) -> int | None:
        self.calls.append(("index_of", name, netns))
        if netns is None and self.arrives_after.get(name):
            self.arrives_after[name] -= 1
            return None
        return 7 if name in self.where and self.where[name] == netns else None

    def move_to_netns(self, device: str | int, netns_fd: int, *, netns: str | None = None) -> None:
        self.calls.append(("move", device, os.fstat(netns_fd).st_ino, netns))
        if self.mode == "shared":
            raise rdmanl.RdmaNlError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        if not isinstance(device, str) or self.where.get(device, "?") != netns:
            raise rdmanl.RdmaNlError(errno.ENODEV, "no RDMA device in this network namespace")
        self.where[device] = "moved"


def own_ino() -> int:
    return os.stat(OWN_NETNS).st_ino


def test_control_move_into_a_pod() -> None:
    calls = FakeCalls(mlx5_2=None)
    NetlinkRdmaControl(calls).move("mlx5_2", OWN_NETNS)
    assert calls.calls == [("move", "mlx5_2", own_ino(), None)]  # sent from the host, fd of the target


def test_control_move_repeated_is_harmless() -> None:
    calls = FakeCalls(mlx5_2=OWN_NETNS)  # in the pod already
    NetlinkRdmaControl(calls).move("mlx5_2", OWN_NETNS)
    assert calls.calls[-1] == ("index_of", "mlx5_2", OWN_NETNS)


def test_control_move_in_shared_mode_names_the_fix() -> None:
    with pytest.raises(RdmaSharedMode, match="rdma system set netns exclusive") as err:
        NetlinkRdmaControl(FakeCalls("shared", mlx5_2=None)).move("mlx5_2", OWN_NETNS)
    assert err.value.errno == errno.EOPNOTSUPP
    assert "shared netns mode" in str(err.value)


def test_control_move_of_a_device_in_another_pod() -> None:
    with pytest.raises(RdmaDeviceNotFound) as err:
        NetlinkRdmaControl(FakeCalls(mlx5_2="/run/netns/other")).move("mlx5_2", OWN_NETNS)
    assert err.value.errno == errno.ENODEV


def test_control_move_into_no_namespace() -> None:
    from tenantnet.plugin.system.netns import NamespaceNotFound

    with pytest.raises(NamespaceNotFound):
        NetlinkRdmaControl(FakeCalls(mlx5_2=None)).move("mlx5_2", "/nonexistent/netns")


def test_control_return_from_a_live_pod_is_sent_from_inside_it() -> None:
    calls = FakeCalls(mlx5_2=OWN_NETNS)
    assert NetlinkRdmaControl(calls, host_netns=OWN_NETNS).return_to_host("mlx5_2", OWN_NETNS)
    assert calls.calls == [("move", "mlx5_2", own_ino(), OWN_NETNS)]  # inside the pod, the host's fd


def test_control_return_when_the_pod_netns_is_gone_waits_for_the_kernel() -> None:
    calls = FakeCalls(mlx5_2=None)
    calls.arrives_after["mlx5_2"] = 2  # the kernel's teardown is asynchronous
    assert NetlinkRdmaControl(calls, settle=2.0).return_to_host("mlx5_2", "/run/netns/gone-already")
    assert [c for c in calls.calls if c[0] == "move"] == []
    assert len(calls.calls) == 3


def test_control_return_gives_up_after_settle() -> None:
    calls = FakeCalls(mlx5_2="/run/netns/elsewhere")
    assert not NetlinkRdmaControl(calls, settle=0.05).return_to_host("mlx5_2", "/run/netns/gone-already")


def test_control_return_without_netns_looks_once() -> None:
    calls = FakeCalls(mlx5_2=None)
    assert NetlinkRdmaControl(calls).return_to_host("mlx5_2", None)
    calls = FakeCalls(mlx5_2="/run/netns/elsewhere")
    assert not NetlinkRdmaControl(calls, settle=5.0).return_to_host("mlx5_2", None)
    assert len(calls.calls) == 1


def test_control_return_of_a_device_already_home() -> None:
    calls = FakeCalls(mlx5_2=None)
    assert NetlinkRdmaControl(calls, host_netns=OWN_NETNS).return_to_host("mlx5_2", OWN_NETNS)


def test_control_where() -> None:
    control = NetlinkRdmaControl(FakeCalls(mlx5_2=None, mlx5_3=OWN_NETNS, mlx5_4="/run/netns/x"))
    assert control.where("mlx5_2") is None
    st = os.stat(OWN_NETNS)
    assert control.where("mlx5_3", [OWN_NETNS]) == NetnsId(st.st_dev, st.st_ino)
    with pytest.raises(RdmaDeviceNotFound, match=f"nor in {OWN_NETNS}"):
        control.where("mlx5_4", [OWN_NETNS, "/nonexistent"])


def test_control_other_kernel_errors_keep_their_errno() -> None:
    class Refusing(FakeCalls):
        def move_to_netns(self, device: str | int, netns_fd: int, *, netns: str | None = None) -> None:
            raise rdmanl.RdmaNlError(errno.EPERM, os.strerror(errno.EPERM))

    with pytest.raises(RdmaProblem) as err:
        NetlinkRdmaControl(Refusing(mlx5_2=None)).move("mlx5_2", OWN_NETNS)
    assert err.value.errno == errno.EPERM and type(err.value) is RdmaProblem


def test_netns_identity() -> None:
    st = os.stat(OWN_NETNS)
    assert rdmacontrol.netns_identity(OWN_NETNS) == NetnsId(st.st_dev, st.st_ino)
    assert rdmacontrol.netns_identity("/proc/self/ns/uts") is None  # a namespace, not a network one
    assert rdmacontrol.netns_identity(__file__) is None
    assert rdmacontrol.netns_identity("/nonexistent") is None
    assert str(NetnsId(4, 4026531840)) == "net:[4026531840]"
    assert NetnsId.from_dict(NetnsId(4, 5).to_dict()) == NetnsId(4, 5)


# ---- the registry -------------------------------------------------------------------------------


def test_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rdmacontrol._PROVIDERS, "_factories", dict(rdmacontrol._PROVIDERS._factories))
    assert isinstance(rdmacontrol.control_for("netlink"), NetlinkRdmaControl)
    made: list[str] = []

    class Stub(NetlinkRdmaControl):
        def __init__(self, argument: str) -> None:
            made.append(argument)
            super().__init__()

    rdmacontrol.register("test-stub", Stub)
    assert isinstance(rdmacontrol.control_for("test-stub:/some/dir"), Stub)
    assert made == ["/some/dir"]
    with pytest.raises(CniError, match=r"rdmaControl 'nope:x': no RDMA control provides 'nope' "
                                       r"\(rdmaControlModules: \['json'\]\)") as err:
        rdmacontrol.control_for("nope:x", ["json"])
    assert err.value.code == 7


def test_registry_imports_the_named_module() -> None:
    control = rdmacontrol.control_for("lab-rdma:/tmp/nowhere", ["tenantnet.lab.rdma"])
    assert type(control).__name__ == "LabRdmaControl"
