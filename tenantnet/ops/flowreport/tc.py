"""`tc -s filter show dev DEV ingress`: flower rules, whether each is in hardware, counters.

This module owns that text format only. iproute2 prints, per rule, a header line
`filter protocol P pref N flower chain C handle H`, indented match lines (`dst_mac ...`),
the flags `skip_hw` / `skip_sw`, `in_hw [in_hw_count N]` or `not_in_hw`, then each action
with `Sent B bytes P pkt (...)` and, when the driver reports them apart, `Sent software ...`
and `Sent hardware ...` lines. A header line without `handle` only announces the chain
and is skipped. Unknown lines are kept verbatim in `other`; nothing here raises on input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_HEADER = re.compile(r"^filter\s+(?P<rest>.*)$")
_SENT = re.compile(r"^Sent (?:(?P<kind>software|hardware) )?(?P<bytes>\d+) bytes (?P<pkt>\d+) pkt")
_ACTION = re.compile(r"^action order (\d+):\s*(.*)$")
_MATCH_KEYS = frozenset({
    "dst_mac", "src_mac", "eth_type", "ip_proto", "dst_ip", "src_ip", "dst_port", "src_port",
    "vlan_id", "vlan_prio", "vlan_ethtype", "cvlan_id", "ip_flags", "ip_tos", "ip_ttl",
    "enc_key_id", "enc_dst_ip", "enc_src_ip", "enc_dst_port", "ct_state", "ct_zone", "ct_mark",
    "indev",
})


@dataclass
class TcAction:
    order: int
    text: str
    packets: int | None = None
    bytes: int | None = None
    sw_packets: int | None = None
    hw_packets: int | None = None
    sw_bytes: int | None = None
    hw_bytes: int | None = None


@dataclass
class TcFilter:
    protocol: str | None = None
    pref: int | None = None
    kind: str | None = None          # "flower", ...
    chain: int | None = None
    handle: str | None = None
    match: dict[str, str] = field(default_factory=dict)
    in_hw: bool | None = None        # None: the kernel printed neither in_hw nor not_in_hw
    in_hw_count: int | None = None
    skip_hw: bool = False
    skip_sw: bool = False
    actions: list[TcAction] = field(default_factory=list)
    other: list[str] = field(default_factory=list)

    @property
    def packets(self) -> int | None:
        """The rule's count: its first action's (every packet of the rule passes it)."""
        return self.actions[0].packets if self.actions else None

    @property
    def hw_packets(self) -> int | None:
        return self.actions[0].hw_packets if self.actions else None

    def to_dict(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "pref": self.pref, "kind": self.kind, "chain": self.chain,
                "handle": self.handle, "match": self.match, "inHw": self.in_hw,
                "inHwCount": self.in_hw_count, "skipHw": self.skip_hw, "skipSw": self.skip_sw,
                "packets": self.packets, "hwPackets": self.hw_packets,
                "actions": [a.__dict__ for a in self.actions]}


def _header(rest: str) -> TcFilter:
    words = rest.split()
    f = TcFilter()
    i = 0
    while i < len(words):
        w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else None
        if w == "protocol" and nxt:
            f.protocol, i = nxt, i + 2
        elif w == "pref" and nxt and nxt.isdigit():
            f.pref, i = int(nxt), i + 2
        elif w == "chain" and nxt and nxt.isdigit():
            f.chain, i = int(nxt), i + 2
        elif w == "handle" and nxt:
            f.handle, i = nxt, i + 2
        else:
            if f.kind is None and w.isidentifier():
                f.kind = w
            i += 1
    return f


def parse_tc_filters(text: str) -> list[TcFilter]:
    """Every rule (header with a handle) of `tc -s filter show` output."""
    rules: list[TcFilter] = []
    current: TcFilter | None = None
    action: TcAction | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        h = _HEADER.match(line)
        if h:
            rule = _header(h.group("rest"))
            current, action = (rule, None) if rule.handle is not None else (None, None)
            if current is not None:
                rules.append(current)
            continue
        if current is None:
            continue
        words = line.split()
        a = _ACTION.match(line)
        s = _SENT.match(line)
        if a:
            action = TcAction(order=int(a.group(1)), text=a.group(2))
            current.actions.append(action)
        elif s and action is not None:
            nbytes, pkts = int(s.group("bytes")), int(s.group("pkt"))
            if s.group("kind") == "software":
                action.sw_bytes, action.sw_packets = nbytes, pkts
            elif s.group("kind") == "hardware":
                action.hw_bytes, action.hw_packets = nbytes, pkts
            else:
                action.bytes, action.packets = nbytes, pkts
        elif words[0] == "in_hw":
            current.in_hw = True
            if len(words) >= 3 and words[1] == "in_hw_count" and words[2].isdigit():
                current.in_hw_count = int(words[2])
        elif words[0] == "not_in_hw":
            current.in_hw = False
        elif words[0] in ("skip_hw", "skip_sw"):
            setattr(current, words[0], True)
        elif action is None and words[0] in _MATCH_KEYS and len(words) >= 2:
            current.match[words[0]] = " ".join(words[1:])
        elif action is None:
            current.other.append(line)
    return rules
