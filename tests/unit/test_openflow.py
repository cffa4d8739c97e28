"""The OpenFlow 1.4 client (tenantnet/plugin/system/openflow.py) without a switch: byte
layouts of what it sends, decoding of what OVS 3.1 sent (replies recorded from the lab), and
its conversation with a scripted fake switch on a unix socket (echo requests, async noise,
REPLY_MORE, refusals, a dropped connection, silence)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tenantnet.plugin.system import openflow as of

A, B = "02:00:00:00:00:01", "02:00:00:00:00:02"
RULE = of.Rule(cookie=0xABC0000000000001, priority=1, in_port=6, eth_src=A, eth_dst=B, output=5)

# A MULTIPART_REPLY (OFPMP_FLOW) from the lab's ovs-vswitchd 3.1 for `rules(0, 0)` with four rules:
#   cookie=0x99,priority=7,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00 actions=output:3,output:4
#   cookie=0x1234,priority=1,in_port=5,dl_dst=02:00:00:00:00:02 actions=drop
#   RULE (in_port=6,dl_src=A,dl_dst=B actions=output:5, check_overlap)
#   priority=0 actions=NORMAL
FLOWS_REPLY = bytes.fromhex(
    "051301800000000600010000000000000070000000000000001e84800007000000000000000000000000000000000099"
    "00000000000000000000000000000000000100148000070c010000000000010000000000000000000004002800000000"
    "00000010000000030000000000000000000000100000000400000000000000000048000000000000017d784000010000"
    "000000000000000000000000000012340000000000000000000000000000000000010016800000040000000580000606"
    "0200000000020000006800000000000000000000000100000000000200000000abc00000000000010000000000000000"
    "000000000000000000010020800000040000000680000806020000000001800006060200000000020004001800000000"
    "00000010000000050000000000000000005000000000000002ebae400000000000000000000000000000000000000000"
    "000000000000000000000000000000000001000400000000000400180000000000000010fffffffa0000000000000000")

# The lab's ovs-vswitchd 3.1 answering `rules(cookie, -1)` for one rule written by
# AddRule(Rule(0xabc0000000000009, 1, 6, A, B, 5, OFPVID_NONE)); ovs-ofctl shows it as
#   priority=1,in_port=6,vlan_tci=0x0000/0x1fff,dl_src=A,dl_dst=B actions=output:5
# (OXMs in the reply: IN_PORT, ETH_SRC, ETH_DST, VLAN_VID 0x0000 unmasked).
UNTAGGED_REPLY = bytes.fromhex(
    "051300800000000700010000000000000070000000000000006acfc0000100000000000200000000abc000000000000900"
    "000000000000000000000000000000000100268000000400000006800008060200000000018000060602000000000280"
    "000c0200000000000400180000000000000010000000050000000000000000")

# The OFPT_ERROR the lab's switch sent for a bundle's AddRule that overlapped a foreign rule
# (xid 9: the BUNDLE_ADD_MESSAGE's, its data the refused message), then the commit's (xid 11).
OVERLAP_ERROR = bytes.fromhex(
    "05010084000000090005000305220078000000090000000200000003050e006800000009abc00000000000020000"
    "0000000000000000000000000001ffffffffffffffffffffffff000200000001002080000004000000058000060602"
    "000000000280000806020000000001000400180000000000000010000000060000000000000000")
COMMIT_ERROR = bytes.fromhex("0501001c0000000b0011000d052100100000000b0000000200040003")


def _u16(data: bytes, at: int) -> int:
    return int(struct.unpack_from("!H", data, at)[0])


# ---- encoders -----------------------------------------------------------------------------------
def test_hello_offers_only_openflow_14() -> None:
    assert of.hello(7).hex() == "0500001000000007" "00010008" "00000020"


def test_match_is_oxm_in_port_eth_dst_eth_src_padded_to_8() -> None:
    m = of.encode_match(6, A, B)
    assert m.hex() == ("00010020"                        # OFPMT_OXM, length 32 (4 + 8 + 10 + 10)
                       "80000004" "00000006"             # OXM_OF_IN_PORT
                       "80000606" "020000000002"         # OXM_OF_ETH_DST
                       "80000806" "020000000001"         # OXM_OF_ETH_SRC
                       "")
    assert len(m) % 8 == 0 and len(m) == 32
    only_dst = of.encode_match(eth_dst=B)
    assert only_dst.hex() == "0001000e" "80000606" "020000000002" "0000"  # length 14, padded to 16
    assert of.encode_match().hex() == "00010004" "00000000"  # the empty match is 8 bytes too


def test_match_with_no_vlan_tag_is_vlan_vid_0_unmasked() -> None:
    m = of.encode_match(6, A, B, of.OFPVID_NONE)
    assert m.hex() == ("00010026"                        # OFPMT_OXM, length 38 (32 + 6)
                       "80000004" "00000006"
                       "80000606" "020000000002"
                       "80000806" "020000000001"
                       "80000c02" "0000"                 # OXM_OF_VLAN_VID (field 6, no mask, 2 bytes) = OFPVID_NONE
                       "0000")                           # padded to 40
    # a tagged VLAN id is OFPVID_PRESENT | id (not used by pre-warm, but the encoder knows it)
    assert of.encode_match(vlan_vid=of.OFPVID_PRESENT | 100).hex() == "0001000a" "80000c02" "1064" "000000000000"
    add = of.encode_op(1, of.AddRule(of.Rule(1, 1, 6, A, B, 5, of.OFPVID_NONE)))
    assert add[48:88] == m and _u16(add, 2) == len(add) == 48 + 40 + 24
    strict = of.encode_op(2, of.DeleteStrict(1, 1, 6, A, B, of.OFPVID_NONE))
    assert strict[48:] == m  # a strict delete names the whole match, VLAN_VID too
    assert of.encode_op(3, of.DeleteStrict(1, 1, 6, A, B))[48:] == of.encode_match(6, A, B)


def test_vlan_vid_values_are_checked() -> None:
    for bad in (1, 100, 0x0FFF, 0x2000, -1):  # an id without OFPVID_PRESENT, out of 13 bits
        with pytest.raises(of.OpenflowError, match=rf"vlan_vid {bad:#x} is neither OFPVID_NONE .*0x1000-0x1fff"):
            of.encode_match(vlan_vid=bad)


def test_flow_mod_add_layout() -> None:
    data = of.encode_op(0x11, of.AddRule(RULE))
    header, body = data[:8], data[8:]
    assert header.hex() == "050e0068" "00000011"  # v1.4, FLOW_MOD, 104 bytes, xid
    (cookie, mask, table, command, idle, hard, priority, buffer_id, out_port, out_group, flags,
     importance) = struct.unpack_from("!QQBBHHHIIIHH", body)
    assert (cookie, mask, table, command, idle, hard, priority) == (RULE.cookie, 0, 0, of.OFPFC_ADD, 0, 0, 1)
    assert (buffer_id, out_port, out_group) == (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    assert (flags, importance) == (of.OFPFF_CHECK_OVERLAP, 0)
    assert body[40:72] == of.encode_match(6, A, B)
    # APPLY_ACTIONS (type 4, len 24, pad) [OUTPUT (type 0, len 16) port 5, max_len 0, pad 6]
    assert body[72:].hex() == "00040018" "00000000" "00000010" "00000005" "0000" "000000000000"
    assert _u16(data, 2) == len(data) and len(data) % 8 == 0
    assert struct.unpack_from("!H", of.encode_op(1, of.AddRule(RULE, check_overlap=False)), 44)[0] == 0


def test_flow_mod_delete_strict_and_delete_layouts() -> None:
    data = of.encode_op(3, of.DeleteStrict(RULE.cookie, 1, 6, A, B))
    cookie, mask, table, command = struct.unpack_from("!QQBB", data, 8)
    assert (cookie, mask, table, command) == (RULE.cookie, (1 << 64) - 1, 0, of.OFPFC_DELETE_STRICT)
    assert _u16(data, 30) == 1 and data[48:] == of.encode_match(6, A, B)  # priority; no instructions
    delete = of.flow_mod(4, command=of.OFPFC_DELETE, cookie=0xAB, cookie_mask=0xFF, table_id=of.OFPTT_ALL,
                         match=of.encode_match(eth_dst=B))
    assert struct.unpack_from("!QQBB", delete, 8) == (0xAB, 0xFF, 0xFF, of.OFPFC_DELETE)
    assert struct.unpack_from("!II", delete, 36) == (0xFFFFFFFF, 0xFFFFFFFF)  # out_port, out_group ANY
    assert len(delete) == 48 + 16


def test_bundle_messages() -> None:
    assert of.bundle_control(5, 9, of.OFPBCT_OPEN_REQUEST).hex() == "0521001000000005" "00000009" "0000" "0003"
    inner = of.encode_op(0x42, of.AddRule(RULE))
    add = of.bundle_add(9, inner)
    assert add[:16].hex() == f"0522{16 + len(inner):04x}00000042" "00000009" "0000" "0003"  # the inner's xid
    assert add[16:] == inner  # whole, unpadded (no properties)


def test_flow_stats_request_layout() -> None:
    data = of.flow_stats_request(8, 0xAB00, 0xFF00)
    assert data.hex() == ("0512003800000008" "0001" "0000" "00000000"   # MULTIPART_REQUEST, OFPMP_FLOW
                          "ff000000" "ffffffff" "ffffffff" "00000000"     # table ALL, out_port/group ANY
                          "000000000000ab00" "000000000000ff00"           # cookie, cookie_mask
                          "00010004" "00000000")                          # empty OXM match


def test_bad_values_are_refused_before_anything_is_sent() -> None:
    with pytest.raises(of.OpenflowError, match="not a MAC address"):
        of.encode_match(eth_dst="02:00:00:00:00")
    with pytest.raises(of.OpenflowError, match="not a MAC address"):
        of.encode_match(eth_src="zz:00:00:00:00:01")
    with pytest.raises(of.OpenflowError, match="32-bit"):
        of.encode_match(in_port=1 << 32)
    with pytest.raises(of.OpenflowError, match="16-bit"):
        of.encode_op(1, of.AddRule(of.Rule(1, 70000, 1, A, B, 2)))


def test_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OVS_RUNDIR", raising=False)
    assert of.target_address("br-x") == (socket.AF_UNIX, "/var/run/openvswitch/br-x.mgmt")
    monkeypatch.setenv("OVS_RUNDIR", "/tmp/run")
    assert of.target_address("br-x") == (socket.AF_UNIX, "/tmp/run/br-x.mgmt")
    assert of.target_address("unix:/a/b.mgmt") == (socket.AF_UNIX, "/a/b.mgmt")
    assert of.target_address("tcp:127.0.0.1:6653") == (socket.AF_INET, ("127.0.0.1", 6653))
    assert of.target_address("tcp:[::1]:6653") == (socket.AF_INET6, ("::1", 6653))
    for bad in ("ssl:1.2.3.4:6653", "tcp:nohost", "", "a/b"):
        with pytest.raises(of.OpenflowError, match="OpenFlow target"):
            of.Switch(bad)


# ---- decoders -----------------------------------------------------------------------------------
def test_decode_recorded_flow_stats_reply() -> None:
    version, type_, length, _ = struct.unpack_from("!BBHI", FLOWS_REPLY)
    assert (version, type_, length) == (5, of.OFPT_MULTIPART_REPLY, len(FLOWS_REPLY))
    assert struct.unpack_from("!HH", FLOWS_REPLY, 8) == (of.OFPMP_FLOW, 0)  # no REPLY_MORE
    rules = of.decode_flow_stats(FLOWS_REPLY[16:])
    assert rules == [
        of.Rule(0x99, 7, 0, "", "", 0),                        # masked dl_dst, two outputs: not our shape
        of.Rule(0x1234, 1, 5, "", B, 0),                       # no dl_src, actions=drop
        RULE,
        of.Rule(0, 0, 0, "", "", 0),                           # actions=NORMAL (OUTPUT to 0xfffffffa)
    ]


def test_decode_recorded_untagged_only_rule() -> None:
    assert struct.unpack_from("!BBH", UNTAGGED_REPLY) == (5, of.OFPT_MULTIPART_REPLY, len(UNTAGGED_REPLY))
    assert of.decode_flow_stats(UNTAGGED_REPLY[16:]) == [
        of.Rule(0xABC0000000000009, 1, 6, A, B, 5, vlan_vid=of.OFPVID_NONE)]
    # and a rule of the shape written before the VLAN_VID match still reads as ours, without it
    assert of.decode_flow_stats(FLOWS_REPLY[16:])[2] == RULE and RULE.vlan_vid is None


def _stats_entry(cookie: int, priority: int, match: bytes, instructions: bytes) -> bytes:
    """A flow stats entry as OVS lays it out, around `match` and `instructions`."""
    length = 48 + len(match) + len(instructions)
    return struct.pack("!HBxIIHHHHHxxQQQ", length, 0, 1, 2, priority, 0, 0, 0, 0, cookie, 3, 4) + match + instructions


@pytest.mark.parametrize("vlan_vid", [None, of.OFPVID_NONE, of.OFPVID_PRESENT | 7])
def test_what_the_encoder_writes_the_decoder_reads_back(vlan_vid: int | None) -> None:
    rule = of.Rule(0x746E000100000002, 1, 9, A, B, 12, vlan_vid)
    mod = of.encode_op(5, of.AddRule(rule))
    match_len = (_u16(mod, 50) + 7) // 8 * 8
    entry = _stats_entry(rule.cookie, rule.priority, mod[48:48 + match_len], mod[48 + match_len:])
    assert of.decode_flow_stats(entry) == [rule]


def test_masked_vlan_vid_is_not_our_shape() -> None:
    # OFPVID_PRESENT/OFPVID_PRESENT ("any tag"): masked, so not a rule pre-warm wrote.
    oxms = (struct.pack("!I", 0x80000004) + struct.pack("!I", 6) + struct.pack("!I", 0x80000606) + of.mac_bytes(B)
            + struct.pack("!I", 0x80000806) + of.mac_bytes(A) + struct.pack("!IHH", 0x80000D04, 0x1000, 0x1000))
    match = struct.pack("!HH", of.OFPMT_OXM, 4 + len(oxms)) + oxms
    match += bytes(-len(match) % 8)
    (rule,) = of.decode_flow_stats(_stats_entry(0x99, 1, match, of.apply_output(5)))
    assert (rule.in_port, rule.eth_src, rule.eth_dst, rule.output, rule.vlan_vid) == (6, A, B, 0, None)


def test_decode_refuses_malformed_entries() -> None:
    body = FLOWS_REPLY[16:]
    with pytest.raises(of._Malformed):
        of.decode_flow_stats(body[:60])
    broken = bytearray(body)
    broken[0:2] = (3).to_bytes(2, "big")  # an entry length below its fixed part
    with pytest.raises(of._Malformed):
        of.decode_flow_stats(bytes(broken))


def test_decode_recorded_overlap_error() -> None:
    type_, code, data = of.decode_error(OVERLAP_ERROR[8:])
    assert (type_, code) == (of.OFPET_FLOW_MOD_FAILED, of.OFPFMFC_OVERLAP)
    assert of.error_name(type_, code) == "OFPET_FLOW_MOD_FAILED/OVERLAP"
    assert data[1] == of.OFPT_BUNDLE_ADD_MESSAGE  # OVS quotes the message as it came
    assert of.error_name(*of.decode_error(COMMIT_ERROR[8:])[:2]) == "OFPET_BUNDLE_FAILED/MSG_FAILED"


def test_hello_versions() -> None:
    bitmap = struct.pack("!HHI", 1, 8, 0b111110)  # 1.0 … 1.4 (what OVS says)
    assert of.hello_allows(6, bitmap)
    assert not of.hello_allows(6, struct.pack("!HHI", 1, 8, 0b10))  # 1.0 only
    assert of.hello_allows(5, b"") and not of.hello_allows(4, b"")  # no bitmap: the header's version


# ---- against a scripted fake switch --------------------------------------------------------------
Handler = Callable[["FakeSwitch", socket.socket, of.Message], None]


class FakeSwitch:
    """A unix-socket OpenFlow 1.4 'switch' answering with `handler` per message received."""

    def __init__(self, path: Path, handler: Handler, greet: bytes | None = None) -> None:
        self.path, self.handler = str(path), handler
        self.greet = greet if greet is not None else of.message(of.OFPT_HELLO, 1, struct.pack("!HHI", 1, 8, 0x3E))
        self.received: list[of.Message] = []
        self.connections = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._conversation, args=(conn,), daemon=True).start()

    def _conversation(self, conn: socket.socket) -> None:
        with conn:
            conn.sendall(self.greet)
            buf = b""
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while len(buf) >= 8 and len(buf) >= _u16(buf, 2):
                    length = _u16(buf, 2)
                    m = of.Message(buf[1], int.from_bytes(buf[4:8], "big"), buf[8:length], buf[0])
                    buf = buf[length:]
                    self.received.append(m)
                    try:
                        self.handler(self, conn, m)
                    except OSError:
                        return

    def close(self) -> None:
        self.listener.close()


def ovs_like(fake: FakeSwitch, conn: socket.socket, m: of.Message) -> None:
    """Answer as OVS would, with an echo request and a PORT_STATUS thrown in before replies."""
    noise = of.message(of.OFPT_ECHO_REQUEST, 0x7777, b"ping") + of.message(12, 0, bytes(72))
    if m.type == of.OFPT_BUNDLE_CONTROL:
        bid, kind, flags = struct.unpack_from("!IHH", m.body)
        conn.sendall(noise + of.bundle_control(m.xid, bid, kind + 1, flags))
    elif m.type == of.OFPT_BARRIER_REQUEST:
        conn.sendall(noise + of.message(of.OFPT_BARRIER_REPLY, m.xid))
    elif m.type == of.OFPT_MULTIPART_REQUEST:
        entries = FLOWS_REPLY[16:]
        first = entries[:_u16(entries, 0)]  # one entry with REPLY_MORE, then the rest
        conn.sendall(of.message(of.OFPT_MULTIPART_REPLY, m.xid, struct.pack("!HH4x", 1, 1) + first) + noise
                     + of.message(of.OFPT_MULTIPART_REPLY, m.xid, struct.pack("!HH4x", 1, 0)
                                  + entries[len(first):]))


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[..., FakeSwitch]]:
    made: list[FakeSwitch] = []

    def make(handler: Handler = ovs_like, greet: bytes | None = None) -> FakeSwitch:
        made.append(FakeSwitch(tmp_path / f"s{len(made)}.mgmt", handler, greet))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_bundle_conversation(fake: Callable[..., FakeSwitch]) -> None:
    f = fake()
    with of.Switch(f"unix:{f.path}", timeout=2) as sw:
        sw.bundle([of.DeleteStrict(RULE.cookie, 1, 6, A, B), of.AddRule(RULE)])
    types = [m.type for m in f.received]
    assert types[0] == of.OFPT_HELLO and of.hello_allows(f.received[0].version, f.received[0].body)
    # open, two adds, the barrier, then the commit; every echo request answered with its xid and data
    assert [t for t in types if t not in (of.OFPT_HELLO, of.OFPT_ECHO_REPLY)] == [
        of.OFPT_BUNDLE_CONTROL, of.OFPT_BUNDLE_ADD_MESSAGE, of.OFPT_BUNDLE_ADD_MESSAGE,
        of.OFPT_BARRIER_REQUEST, of.OFPT_BUNDLE_CONTROL]
    ctrl = [struct.unpack_from("!IHH", m.body) for m in f.received if m.type == of.OFPT_BUNDLE_CONTROL]
    assert [c[1] for c in ctrl] == [of.OFPBCT_OPEN_REQUEST, of.OFPBCT_COMMIT_REQUEST]
    assert {c[2] for c in ctrl} == {of.OFPBF_ATOMIC | of.OFPBF_ORDERED} and ctrl[0][0] == ctrl[1][0]
    echoes = [m for m in f.received if m.type == of.OFPT_ECHO_REPLY]
    assert echoes and all((m.xid, m.body) == (0x7777, b"ping") for m in echoes)
    adds = [m for m in f.received if m.type == of.OFPT_BUNDLE_ADD_MESSAGE]
    assert all(m.xid == int.from_bytes(m.body[12:16], "big") for m in adds)  # outer xid == inner xid


def test_rules_follow_reply_more(fake: Callable[..., FakeSwitch]) -> None:
    f = fake()
    with of.Switch(f"unix:{f.path}", timeout=2) as sw:
        assert sw.rules(0, 0) == of.decode_flow_stats(FLOWS_REPLY[16:])
        assert len(sw.rules(0, 0)) == 4  # the same connection again
    assert f.connections == 1


def test_overlap_at_commit(fake: Callable[..., FakeSwitch]) -> None:
    def refuse(fake_: FakeSwitch, conn: socket.socket, m: of.Message) -> None:
        commits = [x for x in fake_.received if x.type == of.OFPT_BUNDLE_CONTROL
                   and struct.unpack_from("!IHH", x.body)[1] == of.OFPBCT_COMMIT_REQUEST]
        if commits == [m]:  # the first commit only
            add = next(x for x in fake_.received if x.type == of.OFPT_BUNDLE_ADD_MESSAGE)
            conn.sendall(of.message(of.OFPT_ERROR, add.xid, OVERLAP_ERROR[8:])
                         + of.message(of.OFPT_ERROR, m.xid, COMMIT_ERROR[8:]))
        else:
            ovs_like(fake_, conn, m)

    f = fake(refuse)
    sw = of.Switch(f"unix:{f.path}", timeout=2)
    with pytest.raises(of.OpenflowError) as info:
        sw.bundle([of.AddRule(RULE)])
    assert info.value.overlap and (info.value.type, info.value.code) == (5, 3)
    assert "OVERLAP for operation 1 of 1 (add cookie=0xabc0000000000001" in str(info.value)
    sw.bundle([of.DeleteStrict(RULE.cookie, 1, 6, A, B)])  # the connection is still good
    assert f.connections == 1
    sw.close()


def test_refused_add_discards_the_bundle(fake: Callable[..., FakeSwitch]) -> None:
    """An add refused on its way in (OVS leaves it out of the bundle) must not be followed by
    a commit of the rest."""
    def bad_match(fake_: FakeSwitch, conn: socket.socket, m: of.Message) -> None:
        if m.type == of.OFPT_BUNDLE_ADD_MESSAGE and len(fake_.received) == 4:  # the second add
            conn.sendall(of.message(of.OFPT_ERROR, m.xid, struct.pack("!HH", 4, 7) + m.body[:64]))
        else:
            ovs_like(fake_, conn, m)

    f = fake(bad_match)
    with of.Switch(f"unix:{f.path}", timeout=2) as sw, pytest.raises(of.OpenflowError) as info:
        sw.bundle([of.AddRule(RULE), of.AddRule(RULE), of.AddRule(RULE)])
    assert not info.value.overlap and "OFPET_BAD_MATCH/BAD_VALUE for operation 2 of 3" in str(info.value)
    kinds = [struct.unpack_from("!IHH", m.body)[1] for m in f.received if m.type == of.OFPT_BUNDLE_CONTROL]
    assert kinds == [of.OFPBCT_OPEN_REQUEST, of.OFPBCT_DISCARD_REQUEST]


def test_delete_waits_for_the_barrier_and_reports_errors(fake: Callable[..., FakeSwitch]) -> None:
    def eperm(fake_: FakeSwitch, conn: socket.socket, m: of.Message) -> None:
        if m.type == of.OFPT_FLOW_MOD:
            conn.sendall(of.message(of.OFPT_ERROR, m.xid, struct.pack("!HH", 5, 4) + m.body[:64]))
        ovs_like(fake_, conn, m)

    f = fake()
    with of.Switch(f"unix:{f.path}", timeout=2) as sw:
        sw.delete(0xAB00, 0xFF00, eth_dst=B)
    mod = next(m for m in f.received if m.type == of.OFPT_FLOW_MOD)
    assert struct.unpack_from("!QQBB", mod.body) == (0xAB00, 0xFF00, of.OFPTT_ALL, of.OFPFC_DELETE)
    assert mod.body[40:] == of.encode_match(eth_dst=B)
    assert [m.type for m in f.received if m.type != of.OFPT_ECHO_REPLY][-2:] == [of.OFPT_FLOW_MOD,
                                                                                of.OFPT_BARRIER_REQUEST]
    g = fake(eperm)
    with of.Switch(f"unix:{g.path}", timeout=2) as sw, pytest.raises(of.OpenflowError, match="FLOW_MOD_FAILED/EPERM"):
        sw.delete(0xAB00, 0xFF00)


def test_idle_connection_closed_by_the_switch_reconnects_once(fake: Callable[..., FakeSwitch]) -> None:
    conns: list[socket.socket] = []

    def remember(fake_: FakeSwitch, conn: socket.socket, m: of.Message) -> None:
        conns.append(conn)
        ovs_like(fake_, conn, m)

    f = fake(remember)
    sw = of.Switch(f"unix:{f.path}", timeout=2)
    sw.delete(1, 1)
    conns[-1].shutdown(socket.SHUT_RDWR)  # the switch drops us while we are idle (e.g. it restarted)
    time.sleep(0.05)
    sw.delete(1, 1)
    assert f.connections == 2
    sw.close()


def test_silent_socket_times_out(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.mgmt")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        started = time.monotonic()
        with pytest.raises(of.OpenflowError, match="did not answer within 0.3 s"):
            of.Switch(f"unix:{path}", timeout=0.3).rules(0, 0)
        # The message shows the 0.3 s time-out ended the call; the clock only rules out a hang
        # (a silent switch never answers): 10 s, far above the 0.3 s even on a loaded machine.
        assert time.monotonic() - started < 10
    finally:
        listener.close()


def test_not_openflow_and_old_versions(fake: Callable[..., FakeSwitch]) -> None:
    f = fake(greet=b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with pytest.raises(of.OpenflowError, match="not an OpenFlow switch|not 1.4|instead of HELLO"):
        of.Switch(f"unix:{f.path}", timeout=1).rules(0, 0)
    old = fake(greet=bytes.fromhex("0100000800000001"))  # an OpenFlow 1.0 HELLO without a bitmap
    with pytest.raises(of.OpenflowError, match="does not allow OpenFlow 1.4: add it to the bridge's protocols"):
        of.Switch(f"unix:{old.path}", timeout=1).rules(0, 0)


def test_missing_socket_says_what_to_check(tmp_path: Path) -> None:
    with pytest.raises(of.OpenflowError, match="No such file.*is ovs-vswitchd running, does the bridge exist"):
        of.Switch(f"unix:{tmp_path}/br-none.mgmt", timeout=1).bundle([of.AddRule(RULE)])


def test_threads_share_one_switch(fake: Callable[..., FakeSwitch]) -> None:
    f = fake()
    sw = of.Switch(f"unix:{f.path}", timeout=5)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                sw.bundle([of.AddRule(RULE)])
                assert len(sw.rules(0, 0)) == 4
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sw.close()
    assert not errors and f.connections == 1
