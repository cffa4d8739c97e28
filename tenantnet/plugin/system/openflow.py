"""OpenFlow rules through a direct OpenFlow 1.4 connection to the bridge's management
socket (`<bridge>.mgmt` in OVS's run directory), with the standard library's `socket` and
`struct` only — what `ovs-ofctl` did, without an exec (≈ 20 ms each) on an ADD's path.

What the rules mean is drivers/prewarm.py; this module only speaks the protocol:

- `Switch(target)` connects lazily (`unix:<path>`, `tcp:<host>:<port>`, or a bare bridge
  name: `<OVS_RUNDIR or /var/run/openvswitch>/<bridge>.mgmt`), says HELLO with a version
  bitmap of OpenFlow 1.4 only and checks that the switch allows 1.4;
- `bundle(ops)` writes AddRule / DeleteStrict flow_mods as one OpenFlow 1.4 bundle (flags
  ATOMIC|ORDERED): OPEN_REQUEST, one BUNDLE_ADD_MESSAGE per flow_mod and a barrier, whose
  reply comes after every error the adds caused (OVS checks each message when it is added,
  and leaves a message it refused out of the bundle: committing then would apply the rest),
  then COMMIT_REQUEST — or DISCARD_REQUEST if an add was refused. All of it or nothing: a
  rule that overlaps another at the same priority (`check_overlap`) fails the commit and
  OpenflowError.overlap says so;
- `delete(cookie, mask, eth_dst)` is a non-strict OFPFC_DELETE in every table, followed by
  a barrier: the rules are gone when it returns;
- `rules(cookie, mask)` reads the rules (OFPMP_FLOW multipart, every table, REPLY_MORE
  followed) as `Rule`s.

One request at a time per Switch (a lock: the agent's threads share it). Every operation
has one deadline (`timeout`) that bounds each socket call, and at most MAX_REPLY bytes are
read for it. ECHO_REQUESTs from the switch are answered while waiting and when a call
finds them queued; other asynchronous messages (PORT_STATUS, …) are ignored; replies are
matched by xid. A connection that fails is dropped, and the next call connects again; a
call that finds its idle connection closed by the switch (vswitchd restarted, or dropped
us after unanswered keepalives) reconnects once by itself.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

VERSION = 0x05  # OpenFlow 1.4
DEFAULT_RUNDIR = "/var/run/openvswitch"
MAX_REPLY = 16 << 20  # bytes read for one operation (~150 000 rules of pre-warm's shape)
MAX_MESSAGE = 1 << 20  # one message (OpenFlow's 16-bit length field keeps it under 64 KiB anyway)
_T = TypeVar("_T")
_ALLOW_14 = ("add it to the bridge's protocols (ovs-vsctl set Bridge <bridge> "
             "protocols=OpenFlow10,OpenFlow13,OpenFlow14)")

# ---- OpenFlow 1.4 numbers (openflow-common.h, openflow-1.3.h, openflow-1.4.h) -----------------
OFPT_HELLO = 0
OFPT_ERROR = 1
OFPT_ECHO_REQUEST = 2
OFPT_ECHO_REPLY = 3
OFPT_FLOW_MOD = 14
OFPT_MULTIPART_REQUEST = 18
OFPT_MULTIPART_REPLY = 19
OFPT_BARRIER_REQUEST = 20
OFPT_BARRIER_REPLY = 21
OFPT_BUNDLE_CONTROL = 33
OFPT_BUNDLE_ADD_MESSAGE = 34

OFPHET_VERSIONBITMAP = 1

OFPFC_ADD = 0
OFPFC_DELETE = 3
OFPFC_DELETE_STRICT = 4
OFPFF_CHECK_OVERLAP = 1 << 1

OFPP_ANY = 0xFFFFFFFF
OFPG_ANY = 0xFFFFFFFF
OFP_NO_BUFFER = 0xFFFFFFFF
OFPTT_ALL = 0xFF
ALL_ONES = (1 << 64) - 1

OFPMT_OXM = 1
OFPXMC_OPENFLOW_BASIC = 0x8000
OFPXMT_OFB_IN_PORT = 0
OFPXMT_OFB_ETH_DST = 3
OFPXMT_OFB_ETH_SRC = 4
OFPXMT_OFB_VLAN_VID = 6
# VLAN_VID values (OpenFlow 1.3 §7.2.3.8): OFPVID_NONE, unmasked, matches only frames without
# an 802.1Q header; OFPVID_PRESENT | vid one tagged with that VLAN id.
OFPVID_NONE = 0x0000
OFPVID_PRESENT = 0x1000
OFPIT_APPLY_ACTIONS = 4
OFPAT_OUTPUT = 0

OFPMP_FLOW = 1  # OpenFlow 1.5 calls it OFPMP_FLOW_DESC
OFPMPF_REPLY_MORE = 1

OFPBCT_OPEN_REQUEST = 0
OFPBCT_OPEN_REPLY = 1
OFPBCT_COMMIT_REQUEST = 4
OFPBCT_COMMIT_REPLY = 5
OFPBCT_DISCARD_REQUEST = 6
OFPBCT_DISCARD_REPLY = 7
OFPBF_ATOMIC = 1
OFPBF_ORDERED = 2

OFPET_HELLO_FAILED = 0
OFPET_FLOW_MOD_FAILED = 5
OFPET_BUNDLE_FAILED = 17
OFPET_EXPERIMENTER = 0xFFFF
OFPFMFC_OVERLAP = 3
OFPBFC_MSG_FAILED = 13

_ERROR_TYPES = {
    0: "HELLO_FAILED", 1: "BAD_REQUEST", 2: "BAD_ACTION", 3: "BAD_INSTRUCTION", 4: "BAD_MATCH",
    5: "FLOW_MOD_FAILED", 6: "GROUP_MOD_FAILED", 7: "PORT_MOD_FAILED", 8: "TABLE_MOD_FAILED",
    9: "QUEUE_OP_FAILED", 10: "SWITCH_CONFIG_FAILED", 11: "ROLE_REQUEST_FAILED",
    12: "METER_MOD_FAILED", 13: "TABLE_FEATURES_FAILED", 14: "BAD_PROPERTY",
    15: "ASYNC_CONFIG_FAILED", 16: "FLOW_MONITOR_FAILED", 17: "BUNDLE_FAILED", 0xFFFF: "EXPERIMENTER",
}
_ERROR_CODES = {
    1: {0: "BAD_VERSION", 1: "BAD_TYPE", 2: "BAD_MULTIPART", 5: "EPERM", 6: "BAD_LEN", 9: "BAD_TABLE_ID",
        11: "BAD_PORT"},
    2: {0: "BAD_TYPE", 1: "BAD_LEN", 4: "BAD_OUT_PORT", 5: "BAD_ARGUMENT", 6: "EPERM"},
    4: {0: "BAD_TYPE", 1: "BAD_LEN", 3: "BAD_DL_ADDR_MASK", 6: "BAD_FIELD", 7: "BAD_VALUE",
        8: "BAD_MASK", 9: "BAD_PREREQ", 10: "DUP_FIELD", 11: "EPERM"},
    5: {0: "UNKNOWN", 1: "TABLE_FULL", 2: "BAD_TABLE_ID", 3: "OVERLAP", 4: "EPERM", 5: "BAD_TIMEOUT",
        6: "BAD_COMMAND", 7: "BAD_FLAGS", 8: "CANT_SYNC", 9: "BAD_PRIORITY", 10: "IS_SYNC"},
    17: {0: "UNKNOWN", 1: "EPERM", 2: "BAD_ID", 3: "BUNDLE_EXIST", 4: "BUNDLE_CLOSED",
         5: "OUT_OF_BUNDLES", 6: "BAD_TYPE", 7: "BAD_FLAGS", 8: "MSG_BAD_LEN", 9: "MSG_BAD_XID",
         10: "MSG_UNSUP", 11: "MSG_CONFLICT", 12: "MSG_TOO_MANY", 13: "MSG_FAILED", 14: "TIMEOUT",
         15: "BUNDLE_IN_PROGRESS"},
}

_HEADER = struct.Struct("!BBHI")  # version, type, length, xid
# ofp_flow_mod after the header: cookie, cookie_mask, table_id, command, idle_timeout,
# hard_timeout, priority, buffer_id, out_port, out_group, flags, importance (1.4; pad in 1.3).
_FLOW_MOD = struct.Struct("!QQBBHHHIIIHH")
# ofp_flow_stats up to its match: length, table_id, pad, duration_sec, duration_nsec, priority,
# idle_timeout, hard_timeout, flags, importance, pad2, cookie, packet_count, byte_count.
_FLOW_STATS = struct.Struct("!HBxIIHHHHHxxQQQ")
_MULTIPART = struct.Struct("!HH4x")  # type, flags, pad
_FLOW_STATS_REQUEST = struct.Struct("!B3xII4xQQ")  # table_id, out_port, out_group, cookie, mask
_BUNDLE_CTRL = struct.Struct("!IHH")  # bundle_id, type, flags
_BUNDLE_ADD = struct.Struct("!I2xH")  # bundle_id, pad, flags
_OUTPUT = struct.Struct("!HHIH6x")  # type, len, port, max_len, pad
_INSTRUCTION = struct.Struct("!HH4x")  # type, len, pad (APPLY_ACTIONS)

assert _HEADER.size + _FLOW_MOD.size == 48 and _FLOW_STATS.size == 48


class OpenflowError(Exception):
    """The switch refused a request (`type`/`code`: its OpenFlow error; `overlap`: a rule
    overlapped one of the same priority, check_overlap), or could not be asked (the socket
    is missing, refused, silent, or does not speak OpenFlow 1.4: `type` and `code` None)."""

    def __init__(self, message: str, *, type: int | None = None, code: int | None = None,
                 overlap: bool = False) -> None:
        super().__init__(message)
        self.type = type
        self.code = code
        self.overlap = overlap


@dataclass(frozen=True)
class Rule:
    """What pre-warm writes and reads back: `cookie`, `priority`, in_port/eth_src/eth_dst
    and, if not None, vlan_vid -> output:N. A rule read back that has another shape (other
    match fields, masks, other actions) has `output` 0 and, of these fields, those it has
    (in_port 0 / eth "" / vlan_vid None if not)."""

    cookie: int
    priority: int
    in_port: int
    eth_src: str  # "aa:bb:cc:dd:ee:ff", lower-case
    eth_dst: str
    output: int  # actions=output:N; 0 when the actions are something else
    vlan_vid: int | None = None  # OXM VLAN_VID, unmasked (OFPVID_NONE: untagged only); None: no match on it


@dataclass(frozen=True)
class AddRule:
    """OFPFC_ADD of `rule` in table 0 (no time-outs), with OFPFF_CHECK_OVERLAP unless told."""

    rule: Rule
    check_overlap: bool = True


@dataclass(frozen=True)
class DeleteStrict:
    """OFPFC_DELETE_STRICT in table 0 of the rule with exactly this priority and match
    (`vlan_vid` None: a match without VLAN_VID, as a strict delete needs the whole match)
    and a cookie equal to `cookie` under `cookie_mask` (all ones: exactly this cookie)."""

    cookie: int
    priority: int
    in_port: int
    eth_src: str
    eth_dst: str
    vlan_vid: int | None = None
    cookie_mask: int = ALL_ONES


Op = AddRule | DeleteStrict


@dataclass(frozen=True)
class Message:
    """One OpenFlow message as received: its type, xid and body (after the 8-byte header)."""

    type: int
    xid: int
    body: bytes
    version: int = VERSION


# ---- encoders ---------------------------------------------------------------------------------
def mac_bytes(mac: str) -> bytes:
    parts = mac.split(":")
    try:
        if len(parts) != 6 or any(len(p) != 2 for p in parts):
            raise ValueError
        return bytes(int(p, 16) for p in parts)
    except ValueError:
        raise OpenflowError(f"{mac!r} is not a MAC address (aa:bb:cc:dd:ee:ff)") from None


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _check_u(value: int, bits: int, what: str) -> int:
    if not 0 <= value < (1 << bits):
        raise OpenflowError(f"{what} {value} does not fit OpenFlow's {bits}-bit field")
    return value


def _check_vlan_vid(value: int) -> int:
    if value != OFPVID_NONE and not OFPVID_PRESENT <= value <= OFPVID_PRESENT | 4095:
        raise OpenflowError(f"vlan_vid {value:#x} is neither OFPVID_NONE (0x0000, no 802.1Q header) nor "
                            f"OFPVID_PRESENT|id (0x1000-0x1fff)")
    return value


def message(type_: int, xid: int, body: bytes = b"") -> bytes:
    return _HEADER.pack(VERSION, type_, _HEADER.size + len(body), xid) + body


def hello(xid: int) -> bytes:
    """HELLO with a version bitmap element naming OpenFlow 1.4 only."""
    return message(OFPT_HELLO, xid, struct.pack("!HHI", OFPHET_VERSIONBITMAP, 8, 1 << VERSION))


def _oxm(field: int, value: bytes) -> bytes:
    return struct.pack("!I", OFPXMC_OPENFLOW_BASIC << 16 | field << 9 | len(value)) + value


def encode_match(in_port: int | None = None, eth_src: str | None = None,
                 eth_dst: str | None = None, vlan_vid: int | None = None) -> bytes:
    """An ofp_match of type OXM (IN_PORT, ETH_DST, ETH_SRC, VLAN_VID as given, unmasked),
    padded to 8 bytes; its length field counts the OXMs but not the padding."""
    fields = b""
    if in_port is not None:
        fields += _oxm(OFPXMT_OFB_IN_PORT, struct.pack("!I", _check_u(in_port, 32, "in_port")))
    if eth_dst is not None:
        fields += _oxm(OFPXMT_OFB_ETH_DST, mac_bytes(eth_dst))
    if eth_src is not None:
        fields += _oxm(OFPXMT_OFB_ETH_SRC, mac_bytes(eth_src))
    if vlan_vid is not None:
        fields += _oxm(OFPXMT_OFB_VLAN_VID, struct.pack("!H", _check_vlan_vid(vlan_vid)))
    length = 4 + len(fields)
    return struct.pack("!HH", OFPMT_OXM, length) + fields + bytes(-length % 8)


def apply_output(port: int) -> bytes:
    """Instructions: APPLY_ACTIONS [OUTPUT port, max_len 0]."""
    action = _OUTPUT.pack(OFPAT_OUTPUT, _OUTPUT.size, _check_u(port, 32, "output port"), 0)
    return _INSTRUCTION.pack(OFPIT_APPLY_ACTIONS, _INSTRUCTION.size + len(action)) + action


def flow_mod(xid: int, *, command: int, cookie: int = 0, cookie_mask: int = 0, table_id: int = 0,
             priority: int = 0, flags: int = 0, out_port: int = OFPP_ANY, out_group: int = OFPG_ANY,
             match: bytes = b"", instructions: bytes = b"") -> bytes:
    body = _FLOW_MOD.pack(_check_u(cookie, 64, "cookie"), _check_u(cookie_mask, 64, "cookie mask"),
                          table_id, command, 0, 0, _check_u(priority, 16, "priority"), OFP_NO_BUFFER,
                          out_port, out_group, flags, 0)
    return message(OFPT_FLOW_MOD, xid, body + (match or encode_match()) + instructions)


def encode_op(xid: int, op: Op) -> bytes:
    """The flow_mod of one bundle operation."""
    if isinstance(op, AddRule):
        r = op.rule
        return flow_mod(xid, command=OFPFC_ADD, cookie=r.cookie, priority=r.priority,
                        flags=OFPFF_CHECK_OVERLAP if op.check_overlap else 0,
                        match=encode_match(r.in_port, r.eth_src, r.eth_dst, r.vlan_vid),
                        instructions=apply_output(r.output))
    return flow_mod(xid, command=OFPFC_DELETE_STRICT, cookie=op.cookie, cookie_mask=op.cookie_mask,
                    priority=op.priority, match=encode_match(op.in_port, op.eth_src, op.eth_dst, op.vlan_vid))


def bundle_control(xid: int, bundle_id: int, kind: int, flags: int = OFPBF_ATOMIC | OFPBF_ORDERED) -> bytes:
    return message(OFPT_BUNDLE_CONTROL, xid, _BUNDLE_CTRL.pack(bundle_id, kind, flags))


def bundle_add(bundle_id: int, inner: bytes, flags: int = OFPBF_ATOMIC | OFPBF_ORDERED) -> bytes:
    """BUNDLE_ADD_MESSAGE carrying `inner` whole (the same xid as it: OVS checks); the flags
    must be the bundle's own (OVS checks that too)."""
    _, _, _, xid = _HEADER.unpack_from(inner)
    return message(OFPT_BUNDLE_ADD_MESSAGE, xid, _BUNDLE_ADD.pack(bundle_id, flags) + inner)


def flow_stats_request(xid: int, cookie: int, cookie_mask: int, in_port: int | None = None,
                       eth_src: str | None = None, eth_dst: str | None = None) -> bytes:
    """A flow-desc request; with match fields, for the rules whose match is those fields or
    more specific (OpenFlow's non-strict matching)."""
    body = _MULTIPART.pack(OFPMP_FLOW, 0) + _FLOW_STATS_REQUEST.pack(
        OFPTT_ALL, OFPP_ANY, OFPG_ANY, _check_u(cookie, 64, "cookie"),
        _check_u(cookie_mask, 64, "cookie mask"))
    return message(OFPT_MULTIPART_REQUEST, xid, body + encode_match(in_port, eth_src, eth_dst))


# ---- decoders ---------------------------------------------------------------------------------
class _Malformed(Exception):
    pass


def _match_fields(data: bytes) -> tuple[int, str, str, int | None, bool]:
    """in_port, eth_src, eth_dst, vlan_vid (0 / "" / None when absent) of an OXM match's
    fields, and whether the match is exactly the first three, unmasked, with or without an
    unmasked VLAN_VID (a rule written before pre-warm matched on VLAN_VID has none)."""
    in_port, src, dst, vlan_vid, seen, exact = 0, "", "", None, set(), True
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise _Malformed("truncated OXM header")
        (header,) = struct.unpack_from("!I", data, pos)
        klass, field, masked, length = header >> 16, header >> 9 & 0x7F, header >> 8 & 1, header & 0xFF
        value = data[pos + 4:pos + 4 + length]
        if len(value) != length:
            raise _Malformed("truncated OXM value")
        pos += 4 + length
        if klass != OFPXMC_OPENFLOW_BASIC or masked:
            exact = False
            continue
        if field == OFPXMT_OFB_IN_PORT and length == 4:
            (in_port,) = struct.unpack("!I", value)
        elif field == OFPXMT_OFB_ETH_SRC and length == 6:
            src = mac_text(value)
        elif field == OFPXMT_OFB_ETH_DST and length == 6:
            dst = mac_text(value)
        elif field == OFPXMT_OFB_VLAN_VID and length == 2:
            (vlan_vid,) = struct.unpack("!H", value)
            continue  # optional: not one of the three `seen` counts
        else:
            exact = False
            continue
        seen.add(field)
    return in_port, src, dst, vlan_vid, exact and len(seen) == 3


def _only_output(data: bytes) -> int:
    """N when the instructions are exactly APPLY_ACTIONS [OUTPUT N], else 0."""
    if len(data) != _INSTRUCTION.size + _OUTPUT.size:
        return 0
    itype, ilen = struct.unpack_from("!HH", data)
    atype, alen, port, _ = _OUTPUT.unpack_from(data, _INSTRUCTION.size)
    if itype != OFPIT_APPLY_ACTIONS or ilen != len(data) or atype != OFPAT_OUTPUT or alen != _OUTPUT.size:
        return 0
    return int(port)


def decode_flow_stats(body: bytes) -> list[Rule]:
    """The `Rule`s of a flow stats multipart reply's entries (`body`: after the 16-byte
    multipart header)."""
    rules = []
    pos = 0
    while pos < len(body):
        if pos + _FLOW_STATS.size + 4 > len(body):
            raise _Malformed("truncated flow stats entry")
        fixed = _FLOW_STATS.unpack_from(body, pos)
        length, priority, cookie = fixed[0], fixed[4], fixed[9]
        if length < _FLOW_STATS.size + 8 or pos + length > len(body) or length % 8:
            raise _Malformed(f"flow stats entry of {length} bytes")
        entry = body[pos:pos + length]
        mtype, mlen = struct.unpack_from("!HH", entry, _FLOW_STATS.size)
        mend = _FLOW_STATS.size + (mlen + 7) // 8 * 8
        if mtype != OFPMT_OXM or mlen < 4 or mend > length:
            raise _Malformed("flow stats entry without an OXM match")
        match = entry[_FLOW_STATS.size + 4:_FLOW_STATS.size + mlen]
        in_port, src, dst, vlan_vid, exact = _match_fields(match)
        output = _only_output(entry[mend:]) if exact else 0
        rules.append(Rule(cookie=cookie, priority=priority, in_port=in_port, eth_src=src, eth_dst=dst,
                          output=output, vlan_vid=vlan_vid))
        pos += length
    return rules


def error_name(type_: int, code: int) -> str:
    kind = _ERROR_TYPES.get(type_, f"type {type_}")
    return f"OFPET_{kind}/{_ERROR_CODES.get(type_, {}).get(code, f'code {code}')}"


def decode_error(body: bytes) -> tuple[int, int, bytes]:
    """type, code and data of an OFPT_ERROR's body (an experimenter error: its exp_code as
    the code, the experimenter id and data as the data)."""
    if len(body) < 4:
        raise _Malformed("truncated error message")
    type_, code = struct.unpack_from("!HH", body)
    return type_, code, body[4:]


def hello_allows(version: int, body: bytes) -> bool:
    """Whether a received HELLO (its header's `version`, its `body`) allows OpenFlow 1.4."""
    pos = 0
    while pos + 4 <= len(body):
        etype, elen = struct.unpack_from("!HH", body, pos)
        if elen < 4:
            break
        if etype == OFPHET_VERSIONBITMAP and elen >= 8:
            (bitmap,) = struct.unpack_from("!I", body, pos + 4)
            return bool(bitmap >> VERSION & 1)
        pos += (elen + 7) // 8 * 8
    return version >= VERSION


def mgmt_target(ovsdb_endpoint: str, bridge: str) -> str:
    """The bridge's management socket: OVS keeps `<bridge>.mgmt` in its run directory, the
    directory of the node's OVSDB unix socket (as dpctl.py finds the control socket). A
    tcp:/ssl: OVSDB may be remote: then the bridge name, resolved in OVS's default run directory."""
    kind, _, rest = ovsdb_endpoint.partition(":")
    if kind == "unix" and rest.startswith("/"):
        candidate = os.path.join(os.path.dirname(rest), f"{bridge}.mgmt")
        if os.path.exists(candidate):
            return f"unix:{candidate}"
    return bridge


def target_address(target: str) -> tuple[int, str | tuple[str, int]]:
    """The socket family and address of an OpenFlow target: unix:<path>, tcp:<host>:<port>,
    or a bridge name (its management socket in OVS_RUNDIR, default /var/run/openvswitch)."""
    kind, sep, rest = target.partition(":")
    if not sep:
        if not target or "/" in target:
            raise OpenflowError(f"OpenFlow target {target!r}: name a bridge, unix:<path> or "
                                "tcp:<host>:<port>")
        rundir = os.environ.get("OVS_RUNDIR") or DEFAULT_RUNDIR
        return socket.AF_UNIX, os.path.join(rundir, f"{target}.mgmt")
    if kind == "unix" and rest:
        return socket.AF_UNIX, rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            host = host.strip("[]")
            return socket.AF_INET6 if ":" in host else socket.AF_INET, (host, int(port))
    raise OpenflowError(f"OpenFlow target {target!r}: only unix:<path>, tcp:<host>:<port> or a bridge "
                        "name are supported")


# ---- the connection ---------------------------------------------------------------------------
class _Stale(Exception):
    """The idle connection a call reused turned out closed by the switch: connect again."""


class Switch:
    """One switch's OpenFlow connection, opened on first use (see the module)."""

    def __init__(self, target: str, timeout: float = 5.0) -> None:
        self.target = target
        self.timeout = timeout
        self._family, self._address = target_address(target)
        self._sock: socket.socket | None = None
        self._buf = b""
        self._xid = 0
        self._bundle_id = 0
        self._read = 0  # bytes read for the current operation
        self._negotiated = False  # HELLOs exchanged on the current connection
        self._lock = threading.Lock()

    def __enter__(self) -> Switch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Switch({self.target!r})"

    # ---- the API ----------------------------------------------------------------------------
    def bundle(self, ops: list[Op]) -> None:
        """Apply `ops` atomically and in order, or raise OpenflowError with nothing applied."""
        if ops:
            self._call(f"writing {len(ops)} OpenFlow rule changes to {self.target}", self._bundle, ops)

    def delete(self, cookie: int, cookie_mask: int, eth_dst: str | None = None,
               out_port: int | None = None, in_port: int | None = None) -> None:
        """Delete every rule (any table, priority, port) whose cookie matches under the mask
        and, if given, that matches `eth_dst` as its destination MAC, `in_port` as its input
        port, and outputs to `out_port`; done when this returns."""
        what = f"deleting OpenFlow rules cookie={cookie:#x}/{cookie_mask:#x} on {self.target}"
        match = encode_match(in_port=in_port, eth_dst=eth_dst)
        self._call(what, self._delete, cookie, cookie_mask, match,
                   OFPP_ANY if out_port is None else _check_u(out_port, 32, "out_port"))

    def rules(self, cookie: int, cookie_mask: int, *, in_port: int | None = None, eth_src: str | None = None,
              eth_dst: str | None = None) -> list[Rule]:
        """Every rule (any table) whose cookie matches `cookie` under `cookie_mask` — and, when
        given, whose match has these fields (or is more specific)."""
        what = f"reading OpenFlow rules cookie={cookie:#x}/{cookie_mask:#x} on {self.target}"
        return self._call(what, self._rules, cookie, cookie_mask, (in_port, eth_src, eth_dst))

    def close(self) -> None:
        with self._lock:
            self._drop()

    # ---- operations (under the lock, on a connected socket) ------------------------------------
    def _bundle(self, what: str, sock: socket.socket, deadline: float, ops: list[Op]) -> None:
        self._bundle_id = self._bundle_id % 0xFFFFFFFF + 1
        bid = self._bundle_id
        open_xid = self._next_xid()
        adds: dict[int, Op] = {}
        out = [bundle_control(open_xid, bid, OFPBCT_OPEN_REQUEST)]
        for op in ops:
            xid = self._next_xid()
            adds[xid] = op
            out.append(bundle_add(bid, encode_op(xid, op)))
        barrier = self._next_xid()
        out.append(message(OFPT_BARRIER_REQUEST, barrier))
        self._send(sock, deadline, b"".join(out), first=True)
        errors: list[tuple[int, Message]] = []
        for m in self._replies(sock, deadline, {open_xid, barrier, *adds}):
            if m.type == OFPT_ERROR:
                errors.append((m.xid, m))
            elif m.xid == barrier and m.type == OFPT_BARRIER_REPLY:
                break
        if errors:
            # Something was refused on its way into the bundle (or the bundle was not opened):
            # drop the bundle rather than commit what is left of it.
            discard = self._next_xid()
            self._send(sock, deadline, bundle_control(discard, bid, OFPBCT_DISCARD_REQUEST))
            next(self._replies(sock, deadline, {discard}))
            raise self._error(what, errors, adds)
        commit = self._next_xid()
        self._send(sock, deadline, bundle_control(commit, bid, OFPBCT_COMMIT_REQUEST))
        for m in self._replies(sock, deadline, {commit, *adds}):
            if m.type == OFPT_ERROR:
                errors.append((m.xid, m))
                if m.xid == commit:
                    break
            elif m.xid == commit:
                if m.type != OFPT_BUNDLE_CONTROL or len(m.body) < _BUNDLE_CTRL.size or \
                        _BUNDLE_CTRL.unpack_from(m.body)[1] != OFPBCT_COMMIT_REPLY:
                    raise self._protocol(what, f"answered the commit with message type {m.type}")
                break
        if errors:
            raise self._error(what, errors, adds)

    def _delete(self, what: str, sock: socket.socket, deadline: float, cookie: int, cookie_mask: int,
                match: bytes, out_port: int = OFPP_ANY) -> None:
        xid, barrier = self._next_xid(), self._next_xid()
        request = flow_mod(xid, command=OFPFC_DELETE, cookie=cookie, cookie_mask=cookie_mask,
                           table_id=OFPTT_ALL, match=match, out_port=out_port)
        self._send(sock, deadline, request + message(OFPT_BARRIER_REQUEST, barrier), first=True)
        errors = []
        for m in self._replies(sock, deadline, {xid, barrier}):
            if m.type == OFPT_ERROR:
                errors.append((m.xid, m))
            elif m.xid == barrier:
                break
        if errors:
            raise self._error(what, errors, {})

    def _rules(self, what: str, sock: socket.socket, deadline: float, cookie: int,
               cookie_mask: int, match: tuple[int | None, str | None, str | None] = (None, None, None)
               ) -> list[Rule]:
        xid = self._next_xid()
        self._send(sock, deadline, flow_stats_request(xid, cookie, cookie_mask, *match), first=True)
        rules: list[Rule] = []
        for m in self._replies(sock, deadline, {xid}):
            if m.type == OFPT_ERROR:
                raise self._error(what, [(xid, m)], {})
            if m.type != OFPT_MULTIPART_REPLY or len(m.body) < _MULTIPART.size:
                raise self._protocol(what, f"answered a flow stats request with message type {m.type}")
            kind, flags = _MULTIPART.unpack_from(m.body)
            if kind != OFPMP_FLOW:
                raise self._protocol(what, f"answered a flow stats request with multipart type {kind}")
            try:
                rules += decode_flow_stats(m.body[_MULTIPART.size:])
            except _Malformed as exc:
                raise self._protocol(what, f"sent a malformed flow stats reply ({exc})") from None
            if not flags & OFPMPF_REPLY_MORE:
                break
        return rules

    # ---- errors ---------------------------------------------------------------------------------
    def _error(self, what: str, errors: list[tuple[int, Message]], ops: dict[int, Op]) -> OpenflowError:
        """One OpenflowError for the errors an operation drew: the first that is not just
        the bundle's "a message failed", naming the operation it refers to."""
        decoded = []
        for xid, m in errors:
            try:
                type_, code, _ = decode_error(m.body)
            except _Malformed:
                type_, code = -1, -1
            decoded.append((xid, type_, code))
        overlap = any(t == OFPET_FLOW_MOD_FAILED and c == OFPFMFC_OVERLAP for _, t, c in decoded)
        main = next((d for d in decoded if (d[1], d[2]) != (OFPET_BUNDLE_FAILED, OFPBFC_MSG_FAILED)),
                    decoded[0])
        xid, type_, code = main
        detail = error_name(type_, code)
        op = ops.get(xid)
        if op is not None:
            detail += f" for operation {list(ops).index(xid) + 1} of {len(ops)} ({_describe(op)})"
        hint = ""
        if overlap:
            hint = ": a rule of somebody else's at the same priority overlaps it (nothing was applied)"
        elif ops:
            hint = " (nothing was applied)"
        return OpenflowError(f"{what}: the switch refused it: {detail}{hint}", type=type_, code=code,
                             overlap=overlap)

    def _protocol(self, what: str, detail: str) -> OpenflowError:
        self._drop()
        return OpenflowError(f"{what}: {self.target} {detail}: not an OpenFlow 1.4 switch?")

    # ---- the socket ---------------------------------------------------------------------------
    def _call(self, what: str, operation: Callable[..., _T], *args: object) -> _T:
        with self._lock:
            for attempt in (1, 2):
                deadline = time.monotonic() + self.timeout
                self._read = 0
                try:
                    fresh = self._sock is None
                    sock = self._connect(what, deadline)
                    if not fresh:
                        self._drain(sock)
                    return operation(what, sock, deadline, *args)
                except _Stale:
                    self._drop()
                    if fresh or attempt == 2:
                        raise OpenflowError(f"{what}: {self.target} closed the connection; is "
                                            "ovs-vswitchd restarting?") from None
                except _Malformed as exc:
                    self._drop()
                    raise OpenflowError(f"{what}: {self.target} {exc}") from None
                except TimeoutError:
                    self._drop()
                    raise OpenflowError(f"{what}: {self.target} did not answer within "
                                        f"{self.timeout:g} s") from None
                except OSError as exc:
                    self._drop()
                    raise OpenflowError(f"{what}: the connection to {self.target} failed: "
                                        f"{exc.strerror or exc}") from None
                except BaseException:
                    # OpenflowError included: a refusal leaves the connection good, but a
                    # protocol error or an interruption may leave it mid-message.
                    if self._buf or self._sock is None:
                        self._drop()
                    raise
            raise AssertionError("unreachable")  # pragma: no cover

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock, self._buf, self._negotiated = None, b"", False

    def _next_xid(self) -> int:
        self._xid = self._xid % 0xFFFFFFFF + 1
        return self._xid

    def _connect(self, what: str, deadline: float) -> socket.socket:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(self._address)
        except TimeoutError:
            sock.close()
            raise OpenflowError(f"{what}: cannot connect to {self.target} within "
                                f"{self.timeout:g} s") from None
        except OSError as exc:
            sock.close()
            hint = ""
            if self._family == socket.AF_UNIX:
                hint = (f" (the management socket of a bridge: is ovs-vswitchd running, does the bridge "
                        f"exist, is {os.path.dirname(str(self._address))} its run directory?)")
            raise OpenflowError(f"{what}: cannot connect to {self.target}: "
                                f"{exc.strerror or exc}{hint}") from None
        except BaseException:
            sock.close()
            raise
        self._sock, self._buf, self._negotiated = sock, b"", False
        xid = self._next_xid()
        self._send(sock, deadline, hello(xid))
        m = self._receive(sock, deadline)
        if m.type == OFPT_ERROR:
            self._drop()
            type_, code, _ = decode_error(m.body)
            raise OpenflowError(f"{what}: {self.target} refused OpenFlow 1.4 ({error_name(type_, code)}): "
                                f"{_ALLOW_14}", type=type_, code=code)
        if m.type != OFPT_HELLO:
            raise self._protocol(what, f"began with message type {m.type} instead of HELLO")
        if not hello_allows(m.version, m.body):
            self._drop()
            raise OpenflowError(f"{what}: {self.target} does not allow OpenFlow 1.4: {_ALLOW_14}")
        self._negotiated = True
        return sock

    def _send(self, sock: socket.socket, deadline: float, data: bytes, first: bool = False) -> None:
        """Send `data`; `first`: the operation's first request, whose failure on a reused
        connection means the switch closed it meanwhile (_Stale: nothing was sent)."""
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            if first:
                raise _Stale() from None
            raise

    def _drain(self, sock: socket.socket) -> None:
        """What the switch sent while the connection was idle: answer its echo requests,
        forget the rest; _Stale if it closed the connection."""
        readable = select.poll()  # poll, not select: a descriptor above 1023 is fine
        readable.register(sock, select.POLLIN)
        while readable.poll(0):
            try:
                chunk = sock.recv(1 << 16)
            except (ConnectionResetError, BrokenPipeError):
                raise _Stale() from None
            if not chunk:
                raise _Stale()
            self._buf += chunk
            while (m := self._parse()) is not None:
                if m.type == OFPT_ECHO_REQUEST:
                    self._send(sock, time.monotonic() + self.timeout, message(OFPT_ECHO_REPLY, m.xid, m.body))
        self._read = 0

    def _parse(self) -> Message | None:
        """The next whole message in the buffer, if there is one."""
        if len(self._buf) < _HEADER.size:
            return None
        version, type_, length, xid = _HEADER.unpack_from(self._buf)
        if length < _HEADER.size or length > MAX_MESSAGE:
            raise _Malformed(f"sent a message of {length} bytes: not an OpenFlow switch?")
        if not self._negotiated and (type_ not in (OFPT_HELLO, OFPT_ERROR) or not 0 < version < 0x10):
            raise _Malformed("did not begin with an OpenFlow HELLO: not an OpenFlow switch?")
        if self._negotiated and version != VERSION:
            raise _Malformed(f"sent an OpenFlow message of version {version:#x}, not 1.4 ({VERSION:#x})")
        if len(self._buf) < length:
            return None
        body, self._buf = self._buf[_HEADER.size:length], self._buf[length:]
        return Message(type_, xid, body, version)

    def _receive(self, sock: socket.socket, deadline: float) -> Message:
        """The next message (answering none: see _replies)."""
        while True:
            m = self._parse()
            if m is not None:
                return m
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise _Malformed("closed the connection without answering (is ovs-vswitchd restarting?)")
            self._read += len(chunk)
            if self._read > MAX_REPLY:
                raise _Malformed(f"sent more than {MAX_REPLY} bytes for one request")
            self._buf += chunk

    def _replies(self, sock: socket.socket, deadline: float, xids: set[int]) -> Iterator[Message]:
        """The messages answering `xids`, in order; echo requests answered, the rest ignored."""
        while True:
            m = self._receive(sock, deadline)
            if m.type == OFPT_ECHO_REQUEST:
                self._send(sock, deadline, message(OFPT_ECHO_REPLY, m.xid, m.body))
            elif m.xid in xids:
                yield m


def _describe(op: Op) -> str:
    if isinstance(op, AddRule):
        r = op.rule
        return (f"add cookie={r.cookie:#x},priority={r.priority},in_port={r.in_port},dl_src={r.eth_src},"
                f"dl_dst={r.eth_dst}{_vlan_text(r.vlan_vid)},actions=output:{r.output}")
    return (f"delete_strict cookie={op.cookie:#x},priority={op.priority},in_port={op.in_port},"
            f"dl_src={op.eth_src},dl_dst={op.eth_dst}{_vlan_text(op.vlan_vid)}")


def _vlan_text(vlan_vid: int | None) -> str:
    if vlan_vid is None:
        return ""
    return ",vlan_vid=none" if vlan_vid == OFPVID_NONE else f",vlan_vid={vlan_vid:#06x}"
