"""Datapath flow dumps as typed records: the parser of `ovs-appctl dpctl/dump-flows`.

This module owns the text formats only (no processes, no OVS): it turns the lines that
`dpctl/dump-flows -m` and `dpctl/dump-flows type=offloaded` print into `DpFlow` records and
classifies each as running in hardware, partially in hardware or in software. It also
parses `dpctl/dump-dps` and `dpctl/show` (for port numbers -> names).

The line format is OVS's own (lib/dpctl.c `format_dpif_flow`, lib/dpif.c
`dpif_flow_stats_format`), in this order, sections separated by ", ":

    [ufid:UUID, ]MATCH, packets:N, bytes:N, used:(S.SSSs|never)[, flags:F]
    [, offloaded:(yes|partial)][, dp:LAYER], actions:ACTIONS[, dp-extra-info:TEXT]

MATCH is `field(value),field(value),...` (with `-m` every field, wildcarded ones as
`x(0/0)`); ACTIONS is a comma list where a bare port name or number is an output. OVS prints
`offloaded:` and `dp:` only with `-m`, and prints `offloaded:yes` whenever the flow is in
hardware, `offloaded:partial` when the layer is `ovs` but part of the work is in hardware
(OVS-DPDK's mark-and-recirculate). So with `dp:` present and no `offloaded:`, the flow is
*not* in hardware — also for `dp:tc`: tc flower reports `not_in_hw` rules (tc-policy
`skip_hw`, or a rule the NIC refused) with `offloaded` false, and those run in the kernel's
tc software path.

Unknown `key:value` sections are kept in `extra`; a line that cannot be read is skipped
and counted, never raised, because a report about a thousand flows must not die on one
line a newer OVS formats differently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

OFFLOADED = "offloaded"
PARTIAL = "partial"
SOFTWARE = "software"
# Only for text with neither `dp:` nor `offloaded:` (a dump without -m) and no hint from
# the caller: we refuse to guess.
UNKNOWN = "unknown"
CLASSES = (OFFLOADED, PARTIAL, SOFTWARE, UNKNOWN)

# Datapath layers whose flows live in a NIC when `offloaded:yes` (tc flower offloaded to
# an eswitch, DOCA flow, DPDK rte_flow full offload). Used for the explanation only: the
# classification follows the `offloaded:` field, as OVS itself decides it.
HARDWARE_LAYERS = frozenset({"tc", "doca", "dpdk"})

# Bare (parenthesis-free) action keywords that are not outputs (lib/odp-util.c).
_BARE_ACTIONS = frozenset({"drop", "pop_vlan", "pop_eth", "pop_nsh", "ct_clear", "pop_mpls"})
# Actions whose arguments hold further actions (outputs inside them are outputs too).
_NESTED_ACTIONS = frozenset({"clone", "check_pkt_len", "sample", "actions", "gt", "le"})
_KEY = re.compile(r"^([A-Za-z_][\w-]*):(.*)$", re.S)
# `ovs-appctl dpctl/dump-flows` on the userspace datapath prints one header per PMD thread.
_HEADER = re.compile(r"^(flow-dump from |dump from |\S+@\S+:$)")
# in_port(...) at the top level of a match (start, or after a comma; never inside encap()).
_IN_PORT = re.compile(r"(?:^|,)in_port\(([^()]*)\)")
_SHOW_PORT = re.compile(r"^\s*port (\d+): (\S+)(?: \((.*)\))?\s*$")


@dataclass
class DpFlow:
    """One datapath flow as OVS printed it, plus our classification."""

    match_text: str                  # the match as printed: `field(value),field(value),...`
    packets: int
    bytes: int
    used: float | None               # seconds since last hit; None for `never`
    actions: str                     # raw action list
    outputs: list[str]               # output ports named in the actions (names or numbers)
    in_port: str | None              # raw value of in_port(...), a name or a number
    ufid: str | None = None
    offloaded: str | None = None     # "yes", "partial", "no" or None (field absent)
    dp: str | None = None            # datapath layer: "ovs", "tc", "doca", ...
    flags: str | None = None         # TCP flags seen, e.g. "P."
    extra: dict[str, str] = field(default_factory=dict)  # fields we do not know
    classification: str = UNKNOWN
    reason: str = ""                 # why this class, in words
    line: str = ""

    @property
    def match(self) -> dict[str, str]:
        """field -> raw value inside its parentheses (parsed on demand: the report needs only
        in_port, and splitting every field of 100k flows costs seconds)."""
        return parse_match(self.match_text)

    def touches(self, port: str, aliases: frozenset[str] = frozenset()) -> str | None:
        """'in', 'out', 'both' or None: does this flow come from or go to `port`?"""
        names = {port} | set(aliases)
        came = self.in_port in names
        goes = any(o in names for o in self.outputs)
        if came and goes:
            return "both"
        return "in" if came else "out" if goes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ufid": self.ufid, "inPort": self.in_port, "outputs": self.outputs,
            "packets": self.packets, "bytes": self.bytes, "used": self.used,
            "offloaded": self.offloaded, "dp": self.dp, "flags": self.flags,
            "class": self.classification, "reason": self.reason,
            "match": self.match, "actions": self.actions, "extra": self.extra,
        }


@dataclass
class SkippedLine:
    number: int
    text: str
    why: str


@dataclass
class FlowDump:
    flows: list[DpFlow] = field(default_factory=list)
    skipped: list[SkippedLine] = field(default_factory=list)


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside parentheses (match and action values nest them).

    Jumps from separator to separator with str.find/str.count (C speed): a node with
    100k datapath flows prints ~60 MB, and a per-character Python loop took seconds."""
    out: list[str] = []
    start = scan = depth = 0
    while True:
        pos = text.find(sep, scan)
        if pos < 0:
            out.append(text[start:])
            return out
        depth += text.count("(", scan, pos) - text.count(")", scan, pos)
        scan = pos + len(sep)
        if depth <= 0:
            depth = 0  # unbalanced ')' in malformed text: recover instead of never splitting
            out.append(text[start:pos])
            start = scan


def parse_match(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for token in split_top(text):
        token = token.strip()
        if not token:
            continue
        name, paren, rest = token.partition("(")
        if paren and rest.endswith(")"):
            fields[name] = rest[:-1]
        else:
            fields[token] = ""  # a bare flag-like field; keep it rather than fail
    return fields


def action_outputs(actions: str) -> list[str]:
    """Output ports in an action list: bare tokens that are no keyword, also inside clone()."""
    outs: list[str] = []
    for token in split_top(actions):
        token = token.strip()
        if not token:
            continue
        name, paren, rest = token.partition("(")
        if paren:
            if name in _NESTED_ACTIONS and rest.endswith(")"):
                inner = rest[:-1]
                # check_pkt_len(size=..,gt(...),le(...)) and sample(sample=..,actions(...))
                outs.extend(action_outputs(inner))
            continue
        if "=" in token or token in _BARE_ACTIONS:
            continue
        outs.append(token)
    return outs


def classify(flow: DpFlow, assume_offloaded: bool = False) -> None:
    """Set `classification` and `reason` from what OVS printed (see the module docstring)."""
    off, dp = flow.offloaded, flow.dp
    if off == "yes":
        flow.classification = OFFLOADED
        where = f"dp:{dp}" if dp else "no dp field"
        flow.reason = f"offloaded:yes ({where})"
    elif off == "partial":
        flow.classification = PARTIAL
        flow.reason = f"offloaded:partial: match in the NIC, actions in software (dp:{dp or '?'})"
    elif off not in (None, "no"):
        flow.classification = UNKNOWN
        flow.reason = f"offloaded:{off} is not a value we know"
    elif dp is not None:
        flow.classification = SOFTWARE
        if dp == "ovs":
            flow.reason = "dp:ovs (OVS datapath, not in hardware)"
        elif dp in HARDWARE_LAYERS:
            flow.reason = f"dp:{dp} without offloaded:yes: the rule is not in hardware ({dp} software path)"
        else:
            flow.reason = f"dp:{dp} without offloaded:yes"
    elif off == "no":
        flow.classification = SOFTWARE
        flow.reason = "offloaded:no"
    elif assume_offloaded:
        flow.classification = OFFLOADED
        flow.reason = "listed by dump-flows type=offloaded"
    else:
        flow.classification = UNKNOWN
        flow.reason = "neither dp: nor offloaded: printed (dump without -m)"


def _parse_used(value: str) -> float | None:
    value = value.strip()
    if value == "never":
        return None
    if not value.endswith("s"):
        raise ValueError(f"used:{value}")
    return float(value[:-1])


def parse_flow_line(line: str, assume_offloaded: bool = False) -> DpFlow:
    """One flow line -> DpFlow; ValueError (with the reason) if it is not one."""
    text = line.strip()
    if not text:
        raise ValueError("empty line")
    sections = [s.strip() for s in split_top(text, ", ")]
    values: dict[str, str] = {}
    match_text: str | None = None
    extra: dict[str, str] = {}
    for section in sections:
        m = _KEY.match(section)
        # A match section starts `field(`: its first ':' (in a MAC) comes after a '('.
        if m and "(" not in m.group(1):
            key, value = m.group(1), m.group(2)
            if key in ("ufid", "packets", "bytes", "used", "flags", "offloaded", "dp", "actions",
                       "dp-extra-info"):
                values[key] = value
            else:
                extra[key] = value
        elif match_text is None:
            match_text = section
        else:
            raise ValueError(f"unexpected section {section[:40]!r}")
    for needed in ("packets", "bytes", "actions"):
        if needed not in values:
            raise ValueError(f"no {needed}: field")
    if match_text is None:
        raise ValueError("no match fields")
    try:
        packets, nbytes = int(values["packets"]), int(values["bytes"])
    except ValueError:
        raise ValueError("packets/bytes are not integers") from None
    if packets < 0 or nbytes < 0:
        raise ValueError("negative counters")
    used = _parse_used(values["used"]) if "used" in values else None
    in_port = _IN_PORT.search(match_text)
    if "dp-extra-info" in values:
        extra["dp-extra-info"] = values["dp-extra-info"]
    flow = DpFlow(
        match_text=match_text, packets=packets, bytes=nbytes, used=used, actions=values["actions"],
        outputs=action_outputs(values["actions"]), in_port=in_port.group(1) if in_port else None,
        ufid=values.get("ufid"), offloaded=values.get("offloaded"), dp=values.get("dp"),
        flags=values.get("flags"), extra=extra, line=text,
    )
    classify(flow, assume_offloaded)
    return flow


def parse_dump_flows(text: str, assume_offloaded: bool = False) -> FlowDump:
    """Every flow line of a dump; headers are ignored, other unreadable lines counted.

    `assume_offloaded`: the text came from `dump-flows type=offloaded` (its short form has
    no `offloaded:`/`dp:` fields, but OVS listed only flows in hardware)."""
    dump = FlowDump()
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or _HEADER.match(stripped):
            continue
        try:
            dump.flows.append(parse_flow_line(stripped, assume_offloaded))
        except ValueError as exc:
            dump.skipped.append(SkippedLine(number, stripped[:200], str(exc)))
    return dump


def parse_dump_dps(text: str) -> list[tuple[str, str]]:
    """`dpctl/dump-dps` lines `type@name` -> [(type, full name)]."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        kind, at, _name = line.partition("@")
        if at and kind and " " not in line:
            out.append((kind, line))
    return out


def parse_dpctl_show(text: str) -> dict[str, str]:
    """`dpctl/show DP` -> {datapath port number: port name}."""
    ports = {}
    for line in text.splitlines():
        m = _SHOW_PORT.match(line)
        if m:
            ports[m.group(1)] = m.group(2)
    return ports


def resolve_ports(flows: list[DpFlow], numbers: dict[str, str]) -> None:
    """Replace port numbers by names (the short form and `--no-names` print numbers)."""
    for flow in flows:
        if flow.in_port is not None and flow.in_port in numbers:
            flow.in_port = numbers[flow.in_port]
        flow.outputs = [numbers.get(o, o) for o in flow.outputs]
