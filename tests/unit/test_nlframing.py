"""tenantnet.plugin.system.nlframing, the one netlink framing of rtnl.py and rdmanl.py, against
the kernel's own header: a small C program compiled here from /usr/include/linux/netlink.h
and rtnetlink.h (linux-libc-dev) prints the constants and the struct layouts, and walks
messages with NLMSG_OK / NLMSG_NEXT and attributes with RTA_OK / RTA_NEXT (struct rtattr is
struct nlattr's layout). The Python walks must yield what the macros yield and refuse,
with EPROTO, exactly where the macros stop with a header's worth of bytes left — for
hand-made malformed input (nla_len < 4, nla_len or nlmsg_len past the buffer, every
truncation) and for hypothesis' bytes. Then rtnl and rdmanl on malformed answers: their
own error, never a struct.error, never a silently shortened value."""

from __future__ import annotations

import errno
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenantnet.plugin.system import nlframing, rdmanl, rtnl
from tests.shimways import compiler

HEADERS = (Path("/usr/include/linux/netlink.h"), Path("/usr/include/linux/rtnetlink.h"))

ORACLE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <unistd.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "constants") == 0) {
        printf("NLMSG_ERROR %d\nNLMSG_DONE %d\nNLM_F_REQUEST %d\nNLM_F_MULTI %d\nNLM_F_ACK %d\n",
               NLMSG_ERROR, NLMSG_DONE, NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK);
        printf("NLM_F_DUMP %d\nNLM_F_EXCL %d\nNLM_F_CREATE %d\nNLM_F_CAPPED %d\nNLM_F_ACK_TLVS %d\n",
               NLM_F_DUMP, NLM_F_EXCL, NLM_F_CREATE, NLM_F_CAPPED, NLM_F_ACK_TLVS);
        printf("NLMSGERR_ATTR_MSG %d\nNLA_F_NESTED %d\nNLA_TYPE_MASK %d\n", NLMSGERR_ATTR_MSG,
               NLA_F_NESTED, (unsigned short)NLA_TYPE_MASK);
        printf("NLMSG_ALIGNTO %u\nNLA_ALIGNTO %d\nNLMSG_HDRLEN %d\nNLA_HDRLEN %d\n", NLMSG_ALIGNTO,
               NLA_ALIGNTO, NLMSG_HDRLEN, NLA_HDRLEN);
        printf("nlmsghdr %zu %zu %zu %zu %zu %zu\n", sizeof(struct nlmsghdr),
               offsetof(struct nlmsghdr, nlmsg_len), offsetof(struct nlmsghdr, nlmsg_type),
               offsetof(struct nlmsghdr, nlmsg_flags), offsetof(struct nlmsghdr, nlmsg_seq),
               offsetof(struct nlmsghdr, nlmsg_pid));
        printf("nlattr %zu %zu %zu\n", sizeof(struct nlattr), offsetof(struct nlattr, nla_len),
               offsetof(struct nlattr, nla_type));
        printf("nlmsgerr %zu\n", offsetof(struct nlmsgerr, msg));
        return 0;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while ((r = read(0, buf + n, cap - n)) > 0) {
        n += (size_t)r;
        if (n == cap)
            buf = realloc(buf, cap *= 2);
    }
    int len = (int)n;
    if (strcmp(argv[1], "messages") == 0) {
        struct nlmsghdr *nh = (struct nlmsghdr *)buf;
        for (; NLMSG_OK(nh, len); nh = NLMSG_NEXT(nh, len))
            printf("%u %u %u %u %ld\n", nh->nlmsg_len, nh->nlmsg_type, nh->nlmsg_flags, nh->nlmsg_seq,
                   (long)((char *)NLMSG_DATA(nh) - buf));
        puts(len >= (int)sizeof(struct nlmsghdr) ? "BAD" : "END");
    } else {
        struct rtattr *rta = (struct rtattr *)buf;
        for (; RTA_OK(rta, len); rta = RTA_NEXT(rta, len))
            printf("%u %u %ld\n", rta->rta_len, rta->rta_type, (long)((char *)RTA_DATA(rta) - buf));
        puts(len >= (int)sizeof(struct rtattr) ? "BAD" : "END");
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for header in HEADERS:
        if not header.exists():
            pytest.fail(f"{header} is missing: install linux-libc-dev (scripts/install-deps.sh)", pytrace=False)
    cc = compiler()
    assert cc, "no C compiler: install gcc (scripts/install-deps.sh does)"
    where = tmp_path_factory.mktemp("nloracle")
    (where / "oracle.c").write_text(ORACLE_C)
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-o", str(where / "oracle"), str(where / "oracle.c")],
                   check=True, capture_output=True)
    return where / "oracle"


def ask(oracle: Path, mode: str, data: bytes = b"") -> list[str]:
    return subprocess.run([str(oracle), mode], input=data, capture_output=True, check=True,
                          timeout=30).stdout.decode().splitlines()


def kernel_messages(oracle: Path, data: bytes) -> tuple[list[nlframing.Message], bool]:
    """(the messages NLMSG_OK/NLMSG_NEXT walk, whether they stopped on a bad header)."""
    *lines, end = ask(oracle, "messages", data)
    out = []
    for line in lines:
        size, kind, flags, seq, body = map(int, line.split())
        out.append(nlframing.Message(kind, flags, seq, data[body:body + size - 16]))
    return out, end == "BAD"


def python_messages(data: bytes) -> tuple[list[nlframing.Message], bool]:
    out: list[nlframing.Message] = []
    try:
        for message in nlframing.messages(data):
            out.append(message)
    except nlframing.NetlinkError as exc:
        assert exc.errno == errno.EPROTO and "nlmsg_len" in str(exc)
        return out, True
    return out, False


def kernel_attributes(oracle: Path, data: bytes) -> tuple[dict[int, bytes], bool]:
    *lines, end = ask(oracle, "attributes", data)
    out = {}
    for line in lines:
        size, kind, payload = map(int, line.split())
        out[kind & 0x3FFF] = data[payload:payload + size - 4]
    return out, end == "BAD"


def python_attributes(data: bytes) -> tuple[dict[int, bytes] | None, bool]:
    try:
        return nlframing.attributes(data), False
    except nlframing.NetlinkError as exc:
        assert exc.errno == errno.EPROTO and "nla_len" in str(exc)
        return None, True


def same_attributes(oracle: Path, data: bytes) -> None:
    kernel, kernel_bad = kernel_attributes(oracle, data)
    ours, bad = python_attributes(data)
    assert bad == kernel_bad, (data.hex(), kernel)
    if not bad:
        assert ours == kernel


def msg(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    data = struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body
    return data + b"\0" * (-len(data) & 3)


def attr(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) & 3)


# ---- the header ---------------------------------------------------------------------------------

def test_constants_and_layouts_are_the_kernel_headers(oracle):
    got = dict(line.split(" ", 1) for line in ask(oracle, "constants"))
    for name in ("NLMSG_ERROR", "NLMSG_DONE", "NLM_F_REQUEST", "NLM_F_MULTI", "NLM_F_ACK", "NLM_F_DUMP",
                 "NLM_F_EXCL", "NLM_F_CREATE", "NLM_F_CAPPED", "NLM_F_ACK_TLVS", "NLMSGERR_ATTR_MSG",
                 "NLA_F_NESTED", "NLA_TYPE_MASK", "NLMSG_ALIGNTO", "NLA_ALIGNTO"):
        assert getattr(nlframing, name) == int(got[name]), name
    assert int(got["NLMSG_HDRLEN"]) == nlframing.NLMSGHDR.size and int(got["NLA_HDRLEN"]) == nlframing.NLA.size
    # struct nlmsghdr {u32 len; u16 type; u16 flags; u32 seq; u32 pid}, struct nlattr {u16 len; u16 type}
    assert got["nlmsghdr"].split() == ["16", "0", "4", "6", "8", "12"] and nlframing.NLMSGHDR.format == "=IHHII"
    assert got["nlattr"].split() == ["4", "0", "2"] and nlframing.NLA.format == "=HH"
    assert got["nlmsgerr"] == "4"  # the request's header follows the int error


def test_encoders_are_walked_back_by_the_kernels_macros(oracle):
    inner = nlframing.nest(3, nlframing.nla(1, b"veth"), nlframing.nla(2, b"\x01\x02\x03"))
    attrs = nlframing.nla(1, b"eth0\0") + inner + nlframing.nla(4, struct.pack("=I", 1500))
    data = nlframing.message(16, nlframing.NLM_F_REQUEST | nlframing.NLM_F_ACK, 9, attrs)
    data += nlframing.message(3, nlframing.NLM_F_MULTI, 9)
    kernel, bad = kernel_messages(oracle, data)
    assert not bad and python_messages(data) == (kernel, False)
    assert [m.type for m in kernel] == [16, 3] and kernel[0].body == attrs
    same_attributes(oracle, attrs)
    assert nlframing.attributes(attrs) == {1: b"eth0\0", 3: inner[4:], 4: struct.pack("=I", 1500)}
    assert nlframing.attributes(inner[4:]) == {1: b"veth", 2: b"\x01\x02\x03"}


# ---- malformed: what the bounds refuse --------------------------------------------------------------

GOOD = msg(16, 0, 1, attr(3, b"eth0\0") + attr(4, b"\xdc\x05\0\0")) + msg(3, 2, 1, struct.pack("=i", 0))


@pytest.mark.parametrize("data", [
    struct.pack("=IHHII", 15, 16, 0, 1, 0) + b"\0" * 4,        # nlmsg_len below the header
    struct.pack("=IHHII", 0, 16, 0, 1, 0),                     # nlmsg_len 0: would loop forever
    struct.pack("=IHHII", 40, 16, 0, 1, 0) + b"\0" * 8,        # past the end of the datagram
    GOOD + struct.pack("=IHHII", 0xFFFFFFFF, 2, 0, 1, 0),      # a good message, then a huge length
])
def test_a_bad_message_length_is_refused_where_the_kernel_stops(oracle, data):
    kernel, bad = kernel_messages(oracle, data)
    assert bad and python_messages(data) == (kernel, True)


def test_every_truncation_of_a_datagram(oracle):
    for cut in range(len(GOOD) + 1):
        data = GOOD[:cut]
        assert python_messages(data) == kernel_messages(oracle, data), cut


@pytest.mark.parametrize("data", [
    struct.pack("=HH", 0, 1),                                  # nla_len 0: would loop forever
    struct.pack("=HH", 3, 1) + b"\0" * 4,                      # nla_len below the header
    struct.pack("=HH", 9, 1) + b"abcd",                        # past the end
    attr(1, b"ok") + struct.pack("=HH", 0xFFFF, 2) + b"x" * 8,  # a good one, then past the end
])
def test_a_bad_attribute_length_is_refused_where_the_kernel_stops(oracle, data):
    assert kernel_attributes(oracle, data)[1]
    same_attributes(oracle, data)


def test_every_truncation_of_attributes(oracle):
    data = attr(1, b"eth0\0") + attr(2, b"") + attr(3 | nlframing.NLA_F_NESTED, attr(1, b"veth"))
    for cut in range(len(data) + 1):
        same_attributes(oracle, data[:cut])


def test_an_error_message_shorter_than_its_int_is_refused():
    answer = nlframing.Answer(1, acked=True)
    with pytest.raises(nlframing.NetlinkError) as err:
        answer.feed(msg(nlframing.NLMSG_ERROR, 0, 1, b"\0\0"))
    assert err.value.errno == errno.EPROTO and "truncated NLMSG_ERROR" in str(err.value)


# ---- hypothesis against the macros ---------------------------------------------------------------------

def _structured() -> st.SearchStrategy[bytes]:
    """Mostly-valid netlink: messages of attributes, then a length field or the end mangled."""
    attrs = st.lists(st.tuples(st.integers(0, 0xFFFF), st.binary(max_size=12)), max_size=4).map(
        lambda items: b"".join(attr(k, p) for k, p in items))
    messages = st.lists(st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), attrs), max_size=4).map(
        lambda items: b"".join(msg(k, f, 1, a) for k, f, a in items))
    return st.tuples(messages, st.integers(0, 200), st.integers(0, 0xFFFFFFFF), st.integers(0, 200)).map(
        lambda t: _mangle(*t))


def _mangle(data: bytes, where: int, value: int, cut: int) -> bytes:
    if data and where < len(data) - 4:
        data = data[:where] + struct.pack("=I", value) + data[where + 4:]
    return data[:len(data) - cut % (len(data) + 1)] if cut % 3 == 0 else data


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=96), _structured()))
def test_fuzz_message_walk_is_the_kernels(oracle, data):
    assert python_messages(data) == kernel_messages(oracle, data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=64), _structured().map(lambda d: d[16:])))
def test_fuzz_attribute_walk_is_the_kernels(oracle, data):
    same_attributes(oracle, data)


# ---- the two families on malformed answers ------------------------------------------------------------

IFINFOMSG = struct.Struct("=BxHiII")


class OneAnswer:
    """A socket whose every answer is `data` with the request's seq written in."""

    def __init__(self, build) -> None:  # type: ignore[no-untyped-def]
        self.build = build
        self.seq = 0

    def send(self, data: bytes) -> int:
        self.seq = struct.unpack_from("=IHHII", data)[3]
        return len(data)

    def recv(self, size: int) -> bytes:
        return bytes(self.build(self.seq))

    def close(self) -> None:
        pass


def link_body(*attrs: bytes) -> bytes:
    return IFINFOMSG.pack(0, 1, 7, 1, 0) + b"".join(attrs)


@pytest.mark.parametrize("build", [
    # an nlmsg_len past the datagram: the body was cut (the old walk read what was there)
    lambda seq: struct.pack("=IHHII", 200, rtnl.RTM_NEWLINK, 0, seq, 0) + link_body(attr(rtnl.IFLA_IFNAME, b"eth0\0")),
    # an attribute past the message: IFLA_IFNAME read short before
    lambda seq: msg(rtnl.RTM_NEWLINK, 0, seq, link_body(struct.pack("=HH", 64, rtnl.IFLA_IFNAME) + b"eth0\0\0\0\0")),
    # an attribute with nla_len < 4: the old walk stopped there and answered without it
    lambda seq: msg(rtnl.RTM_NEWLINK, 0, seq, link_body(attr(rtnl.IFLA_MTU, b"\xdc\x05\0\0"),
                                                        struct.pack("=HH", 2, rtnl.IFLA_IFNAME), attr(1, b"x"))),
    # a body shorter than struct ifinfomsg
    lambda seq: msg(rtnl.RTM_NEWLINK, 0, seq, b"\0" * 6),
    # NLMSG_ERROR without its int
    lambda seq: msg(nlframing.NLMSG_ERROR, 0, seq, b"\0"),
])
def test_rtnl_refuses_a_malformed_answer_with_eproto(build):
    with pytest.raises(rtnl.RtnlError) as err:
        rtnl.Rtnl(OneAnswer(build)).link("eth0")  # type: ignore[arg-type]
    assert err.value.errno == errno.EPROTO, err.value


def test_rtnl_reads_a_well_formed_answer():
    def build(seq: int) -> bytes:
        return msg(rtnl.RTM_NEWLINK, 0, seq, link_body(attr(rtnl.IFLA_IFNAME, b"eth0\0"),
                                                       attr(rtnl.IFLA_MTU, struct.pack("=I", 9000))))
    link = rtnl.Rtnl(OneAnswer(build)).link("eth0")  # type: ignore[arg-type]
    assert link is not None and (link.index, link.name, link.mtu, link.up) == (7, "eth0", 9000, True)


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(st.binary(max_size=80), st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=8)),
                                                        max_size=5).map(lambda a: link_body(*(attr(k, p) for k, p in a)))),
       cut=st.integers(0, 8))
def test_fuzz_rtnl_and_rdmanl_decoders_raise_only_their_own_error(body, cut):
    body = body[:len(body) - cut] if cut < len(body) else body
    try:
        rtnl._link(body)
    except rtnl.RtnlError as exc:
        assert exc.errno == errno.EPROTO
    try:
        rdmanl.decode_device(body)
    except rdmanl.RdmaNlError as exc:
        assert exc.errno == errno.EPROTO
    for family, error in ((rtnl, rtnl.RtnlError), (rdmanl, rdmanl.RdmaNlError)):
        answer = nlframing.Answer(1, acked=False, error=error)
        try:
            answer.feed(msg(nlframing.NLMSG_ERROR, 0, 1, body[:cut]) if cut < 4 else body)
        except error as exc:
            assert isinstance(exc, nlframing.NetlinkError), family
