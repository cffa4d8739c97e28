"""Why OVS did not offload a flow: the ovs-vswitchd log and `dpctl/offload-stats-show` as records.

This module owns text formats (and one bounded, non-blocking file reader, `LogCursor` /
`read_tail`); it runs no process and knows nothing of attachments — the blame per pod is in
`tenantnet/ops/flowreport/attribution.py`.

A vswitchd log line is OVS's vlog file format (lib/vlog.c, default pattern
`%D{%Y-%m-%dT%H:%M:%S.###Z}|%05N|%c%T|%p|%m`):

    2026-11-30T10:01:02.345Z|00123|dpif_netlink(handler5)|DBG|failed to offload flow: ...: DEV

`parse_vswitchd_log` turns the offload refusals among them into `Refusal` records, each with
a stable reason code and a fix. The message strings are OVS's own (lib/netdev-offload-tc.c,
lib/dpif-netlink.c, lib/netdev-offload.c, lib/dpif-netdev.c, lib/tc.c; see
tests/fixtures/offload/README-refusals.md for which function prints which). Most of the
specific reasons are logged at DBG level only (e.g. `netdev_offload_tc`'s "unsupported put
action type"), and since OVS 2.15 so is dpif_netlink's "failed to offload flow" for
EOPNOTSUPP and ENOSPC: an operator has to `ovs-appctl vlog/set netdev_offload_tc:file:dbg
dpif_netlink:file:dbg` to see them (docs/offload.md says so).

OVS logs a refusal in two steps on the same thread: first the detail (from the tc flow
API: *what* it cannot do, no device), then dpif_netlink's summary (errno and the device).
They are joined into one refusal: the detail's reason with the summary's device. A line that
names a flow (`ufid:`, `in_port(...)`) gives its flow to the refusal that follows on that
thread, and `ufid -> match` is remembered so that a later line naming only the ufid (the
userspace datapath's "failed to add netdev flow UFID") can still be tied to a port.

Unknown lines from the offload modules that look like failures become reason `other`
(never dropped); lines that are not about offload are ignored.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

# ---- reason codes and their fixes ------------------------------------------------------------

CT_STATE = "ct-state-unsupported"
MATCH = "match-unsupported"
ACTION = "action-unsupported"
TUNNEL = "tunnel-unsupported"
RECIRC = "recirc-unsupported"
TABLE_FULL = "hw-table-full"
TC_NOT_SUPPORTED = "tc-not-supported"
INVALID = "invalid-argument"
DEVICE_MISSING = "device-missing"
NO_FLOW_API = "no-flow-api"
TC_MISMATCH = "tc-verify-mismatch"
NETDEV_FAILED = "netdev-offload-failed"
OTHER = "other"

# What the operator should do, per reason. Kept here (next to the patterns that produce the
# codes) so that a new code cannot exist without its fix.
FIXES: dict[str, str] = {
    CT_STATE: ("the NIC/driver (or this OVS version) cannot match on conntrack state: upgrade OVS "
               "(>= 2.15 offloads ct_state via tc) and the NIC driver/firmware, or keep stateful "
               "ACLs (ct()) off this network"),
    MATCH: ("the flow matches a field tc flower cannot offload (the log names it, e.g. pkt_mark, "
            "regs, metadata, IPv6 fragments): change the OpenFlow rules so the datapath flow does "
            "not need it"),
    ACTION: ("the flow has an action tc cannot do (e.g. type 2 = userspace: controller, sFlow/IPFIX "
             "sampling, a slow-path rule; or output to a port on another flow API): remove that "
             "action from the pipeline for this traffic, or accept that this flow runs in software"),
    TUNNEL: ("the tunnel match/encap uses attributes tc cannot express (e.g. a tunnel source port, "
             "non-UDPIF Geneve options): adjust the tunnel options, or upgrade OVS and the driver"),
    RECIRC: ("the flow recirculates (ct(), bonding, ...) and the previous stage is not in tc, or "
             "recirc_id sharing with tc is unavailable: offload the first stage too (same "
             "hw-offload settings on every port), or upgrade OVS"),
    TABLE_FULL: ("the NIC's flow table is full (ENOSPC/E2BIG): fewer datapath flows (coarser OpenFlow "
                 "rules, shorter max-idle), or more steering memory (NIC firmware profile, e.g. "
                 "mlxconfig FLEX_PARSER/steering settings), then check `ovs-appctl "
                 "dpctl/offload-stats-show`"),
    TC_NOT_SUPPORTED: ("tc/the NIC refused the rule as unsupported (EOPNOTSUPP); the DBG line before "
                       "it names the part it cannot do (`ovs-appctl vlog/set netdev_offload_tc:file:dbg`); "
                       "check `ethtool -k DEV | grep hw-tc-offload` and that the port is a switchdev "
                       "representor"),
    INVALID: ("the kernel or driver rejected the tc rule (EINVAL): often a device that cannot be "
              "offloaded in this layout (e.g. an uplink with an IP bridged into OVS, a bond not in "
              "switchdev); `dmesg` and `tc -s filter show dev DEV ingress` say more"),
    DEVICE_MISSING: ("the device of the rule is gone or has no ifindex (ENODEV): the port was removed or "
                     "renamed while OVS offloaded; check `ovs-vsctl show` against `ip link`"),
    NO_FLOW_API: ("OVS found no flow API for this port: it is not an offload-capable netdev (a veth, "
                  "or a NIC port without switchdev / hw-tc-offload); use a VF representor in "
                  "switchdev mode (mode ovs-offload)"),
    TC_MISMATCH: ("tc installed a different rule than OVS asked for (kernel/driver bug or version "
                  "skew): `ovs-appctl vlog/set dpif_netlink:file:dbg` shows the rule; upgrade the "
                  "kernel or OVS"),
    NETDEV_FAILED: ("the userspace datapath's offload (rte_flow for OVS-DPDK) refused the flow: check the "
                    "port's DPDK driver supports rte_flow for this match; in the lab (dummy datapath, "
                    "veth ports) this is expected — there is no NIC"),
    OTHER: "an offload message tenantnet does not know yet: read it; report it so the parser learns it",
}

SEVERITIES = ("DBG", "INFO", "WARN", "ERR", "EMER")

# errno text (as ovs_strerror prints it) -> reason, for the summary lines.
_ERRNO_REASONS = {
    os.strerror(errno.EOPNOTSUPP): TC_NOT_SUPPORTED,
    "Operation not supported": TC_NOT_SUPPORTED,
    os.strerror(errno.ENOSPC): TABLE_FULL,
    os.strerror(errno.E2BIG): TABLE_FULL,
    os.strerror(errno.EINVAL): INVALID,
    os.strerror(errno.ENODEV): DEVICE_MISSING,
    os.strerror(errno.ENOENT): DEVICE_MISSING,
}

# ---- vlog lines ------------------------------------------------------------------------------

# timestamp|sequence|module(thread)|LEVEL|message — the thread part is optional (main thread).
_VLOG = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT[\d:.]+Z?)\|(?P<seq>\d+)\|(?P<module>[A-Za-z0-9_]+)"
    r"(?:\((?P<thread>[^)]*)\))?\|(?P<level>[A-Z]+)\|(?P<msg>.*)$")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UFID = re.compile(r"(?<![\w-])ufid:(" + _UUID + ")")
_MEGA_UFID = re.compile(r"mega_ufid:(" + _UUID + ")")
_IN_PORT = re.compile(r"(?:^|[,\s])in_port\(([^()]*)\)")
_DEV = re.compile(r"\(dev ([^\s()]+)")


@dataclass(frozen=True)
class LogRecord:
    timestamp: str
    module: str
    thread: str           # "" for the main thread
    severity: str         # DBG, INFO, WARN, ERR, EMER
    message: str
    line: str


def parse_log_line(line: str) -> LogRecord | None:
    """One vlog line -> LogRecord; None if it is not in the vlog file format."""
    m = _VLOG.match(line.rstrip("\r\n"))
    if not m:
        return None
    return LogRecord(m["ts"], m["module"], m["thread"] or "", m["level"], m["msg"], line.rstrip("\r\n"))


@dataclass
class Refusal:
    """One flow OVS did not put into hardware, as its log said it."""

    timestamp: str
    module: str
    severity: str
    reason: str                 # one of FIXES
    fix: str
    message: str                # the message part of the (first) line
    port: str | None = None     # the netdev the message names ("dev X", ": X" at the end)
    in_port: str | None = None  # the flow's in_port(...) (a name or a datapath port number)
    ufid: str | None = None
    match_text: str | None = None
    errno_text: str | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def example(self) -> str:
        return " / ".join(self.lines)


# (pattern on the message, reason, group index of a device name or 0). Order matters: the first
# match wins, so specific patterns come before generic ones.
_PATTERNS: list[tuple[re.Pattern[str], str, int]] = [
    # lib/netdev-offload-tc.c test_key_and_mask (OVS <= 2.14 for ct_*), ct matches
    (re.compile(r"^offloading attribute (ct_state|ct_zone|ct_mark|ct_label) isn't supported"), CT_STATE, 0),
    (re.compile(r"^offloading attribute \S+ isn't supported"), MATCH, 0),
    (re.compile(r"^offloading (?:of non-ethernet packets|of IPv6 fragments|multiple mpls_lses) "
                r"isn't supported"), MATCH, 0),
    (re.compile(r"^offloading isn't supported, unknown attribute"), MATCH, 0),
    # netdev_tc_parse_nl_actions / parse_put_flow_set_masked_action / nl_msg_put_flower_rewrite_pedits
    (re.compile(r"^unsupported put action type: \d+"), ACTION, 0),
    (re.compile(r"^unsupported (?:set action type|sub attribute of set action type)"), ACTION, 0),
    (re.compile(r"^Can only support \d+ actions"), ACTION, 0),
    (re.compile(r"^Can't find (?:offloaded )?netdev for output port"), ACTION, 0),
    (re.compile(r"^Flow API provider mismatch between ingress \((\S+)\)"), ACTION, 1),
    (re.compile(r"^reached too many pedit offsets"), ACTION, 0),
    # parse_put_flow_set_action, flower_match_to_tun_opt, netdev_offload_tc_flow_put
    (re.compile(r"^unsupported tunnel key attribute"), TUNNEL, 0),
    (re.compile(r"^Tunnel options are in the wrong format"), TUNNEL, 0),
    (re.compile(r"^Unable to parse geneve options"), TUNNEL, 0),
    (re.compile(r"^error parsing VXLAN options"), TUNNEL, 0),
    (re.compile(r"^(?:flow_put: )?recirc_id sharing not supported"), RECIRC, 0),
    (re.compile(r"^match for chain \d+ failed due to non-existing goto chain action"), RECIRC, 0),
    (re.compile(r"^flow recirc_id \d+ exceeds the chain id upper limit"), RECIRC, 0),
    (re.compile(r"^couldn't get tc prio"), TABLE_FULL, 0),
    (re.compile(r"^flow_put: failed to get ifindex for (\S+):"), DEVICE_MISSING, 1),
    (re.compile(r"^failed adding ingress qdisc required for offloading"), TC_NOT_SUPPORTED, 0),
    # lib/netdev-offload.c netdev_assign_flow_api
    (re.compile(r"^(\S+): No suitable flow API found"), NO_FLOW_API, 1),
    # lib/tc.c (the rule tc echoed back differs from the request)
    (re.compile(r"^Kernel flower acknowledgment does not match request"), TC_MISMATCH, 0),
    # lib/dpif-netdev.c dp_offload_flow (userspace datapath's offload thread)
    (re.compile(r"^failed to (?:add|modify) netdev flow (" + _UUID + ")"), NETDEV_FAILED, 0),
]
# lib/dpif-netlink.c parse_flow_put: "failed to offload flow: %s: %s" (errno text, device);
# before OVS 2.15 "failed to offload flow: %s" (errno only).
_SUMMARY = re.compile(r"^failed to offload flow: (?P<err>[^:]+?)(?:: (?P<dev>\S+))?\s*$")
# Lines that are about offload but are not refusals: probes, assignments, successes, and the
# userspace datapath's "failed to delete netdev flow" (removing a flow that never got into
# hardware — its refusal was the "failed to add" line before).
_BENIGN = re.compile(
    r"^(?:probe tc:|failed to delete netdev flow |added ingress qdisc to |\S+: Assigned flow API "
    r"|\S+: flow API '[^']*' is not suitable"
    r"|netdev: Flow API Enabled|succeed to \S+ netdev flow|Mark id for ufid \S+ was not found"
    r"|flow get \(dev |updating old handle:|vlan_(?:id|prio)\[\d\]:|tunnel: id )")
_OFFLOAD_MODULES = frozenset({"netdev_offload", "netdev_offload_tc", "netdev_offload_dpdk", "tc",
                              "dpif_offload", "dpif_offload_tc", "dpif_offload_dpdk", "dpif_offload_rte"})
# Modules whose refusals are details that dpif_netlink's summary (with the device) follows.
_DETAIL_MODULES = frozenset({"netdev_offload_tc", "tc"})
_FAILURE_WORDS = re.compile(r"fail|unsupported|not supported|isn't supported|error|refus|can't|cannot",
                            re.I)


def _is_offload_context(rec: LogRecord) -> bool:
    return rec.module in _OFFLOAD_MODULES or rec.thread.startswith("hw_offload")


def _flow_of(message: str) -> tuple[str | None, str | None, str | None]:
    """(ufid, in_port, match text) named in a message, if any."""
    ufid = _UFID.search(message)
    in_port = _IN_PORT.search(message)
    match_text = None
    if in_port:
        # the match is the comma-joined token run that contains in_port(...)
        start = message.rfind(" ", 0, in_port.start() + 1) + 1
        end = message.find(" ", in_port.end())
        match_text = message[start:end if end >= 0 else None].rstrip(",")
    return (ufid.group(1) if ufid else None, in_port.group(1) if in_port else None, match_text)


def classify(rec: LogRecord) -> Refusal | None:
    """A refusal from one log record, or None if the record is not one."""
    msg = rec.message.strip()
    ufid, in_port, match_text = _flow_of(msg)
    summary = _SUMMARY.match(msg)
    if summary:
        err = summary["err"].strip()
        reason = _ERRNO_REASONS.get(err, OTHER)
        return Refusal(rec.timestamp, rec.module, rec.severity, reason, FIXES[reason], msg,
                       port=summary["dev"], in_port=in_port, ufid=ufid, match_text=match_text,
                       errno_text=err, lines=[rec.line])
    for pattern, reason, dev_group in _PATTERNS:
        m = pattern.search(msg)
        if m:
            port = m.group(dev_group) if dev_group else None
            if reason == NETDEV_FAILED:
                ufid = m.group(1)
            return Refusal(rec.timestamp, rec.module, rec.severity, reason, FIXES[reason], msg,
                           port=port, in_port=in_port, ufid=ufid, match_text=match_text,
                           lines=[rec.line])
    if _BENIGN.search(msg):
        return None
    offload_ctx = _is_offload_context(rec)
    looks_failed = bool(_FAILURE_WORDS.search(msg))
    if (offload_ctx and (rec.severity in ("WARN", "ERR", "EMER") or looks_failed)) or (
            "offload" in msg.lower() and looks_failed):
        dev = _DEV.search(msg)
        return Refusal(rec.timestamp, rec.module, rec.severity, OTHER, FIXES[OTHER], msg,
                       port=dev.group(1) if dev else None, in_port=in_port, ufid=ufid,
                       match_text=match_text, lines=[rec.line])
    return None


@dataclass
class LogParse:
    refusals: list[Refusal] = field(default_factory=list)
    # ufid (and mega_ufid) -> (in_port, match text) of flows the log named
    flows: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    lines: int = 0
    unparsed: int = 0      # lines not in the vlog format (continuations of multi-line messages)


@dataclass
class _Thread:
    flow: tuple[str | None, str | None, str | None] = (None, None, None)  # ufid, in_port, match
    detail: Refusal | None = None


def _rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


def _with_flow(ref: Refusal, flow: tuple[str | None, str | None, str | None]) -> Refusal:
    ufid, in_port, match_text = flow
    return replace(ref, ufid=ref.ufid or ufid, in_port=ref.in_port or in_port,
                   match_text=ref.match_text or match_text)


def parse_vswitchd_log(lines: Iterable[str]) -> LogParse:
    """Every refusal in these log lines (see the module docstring for how lines are joined)."""
    out = LogParse()
    threads: dict[str, _Thread] = {}

    def flush(state: _Thread) -> None:
        if state.detail is not None:
            out.refusals.append(state.detail)
            state.detail = None

    for raw in lines:
        out.lines += 1
        rec = parse_log_line(raw)
        if rec is None:
            if raw.strip():
                out.unparsed += 1
            continue
        # dpif_netlink's summary and netdev_offload_tc's detail come from the same thread
        # (handlerN / revalidatorN); the main thread has no name in the line.
        state = threads.setdefault(rec.thread, _Thread())
        ufid, in_port, match_text = _flow_of(rec.message)
        mega = _MEGA_UFID.search(rec.message)
        if in_port is not None:
            for key in filter(None, (ufid, mega.group(1) if mega else None)):
                out.flows[key] = (in_port, match_text)
        ref = classify(rec)
        if ref is None:
            if in_port is not None or ufid is not None:
                flush(state)           # a new flow on this thread: an older detail stays alone
                state.flow = (ufid, in_port, match_text)
            continue
        if ref.errno_text is not None:                 # the summary line
            if state.detail is not None:
                d = state.detail
                state.detail = None
                ref = replace(d, port=ref.port or d.port, errno_text=ref.errno_text,
                              severity=max(d.severity, ref.severity, key=_rank),
                              lines=d.lines + ref.lines)
            out.refusals.append(_with_flow(ref, state.flow))
            state.flow = (None, None, None)
        elif ref.module in _DETAIL_MODULES and ref.port is None and ref.reason != OTHER:
            flush(state)                               # a known detail waits for its summary
            state.detail = _with_flow(ref, state.flow)
        else:
            out.refusals.append(_with_flow(ref, state.flow))
    for state in threads.values():
        flush(state)
    return out


def resolve_refusals(parse: LogParse, numbers: dict[str, str]) -> None:
    """Fill in_port from the log's own ufid index, and port numbers -> names (dpctl/show)."""
    for ref in parse.refusals:
        if ref.in_port is None and ref.ufid and ref.ufid in parse.flows:
            ref.in_port, text = parse.flows[ref.ufid]
            ref.match_text = ref.match_text or text
        if ref.in_port is not None and ref.in_port in numbers:
            ref.in_port = numbers[ref.in_port]


# ---- dpctl/offload-stats-show --------------------------------------------------------------

# lib/dpctl.c prints "HW Offload stats:" then "   %s: %6"PRIu64 per counter; the names come
# from the provider (lib/dpif-netdev.c): "  Total <name>" and "  [%3u] <name>" per offload thread.
_STAT = re.compile(r"^\s*(?:(?P<total>Total)|\[\s*(?P<tid>\d+)\])\s+(?P<name>.+?):\s+(?P<value>\d+)\s*$")
_STAT_PLAIN = re.compile(r"^\s*(?P<name>[A-Za-z][^:]*?):\s+(?P<value>\d+)\s*$")


@dataclass
class OffloadStats:
    totals: dict[str, int] = field(default_factory=dict)                  # name -> value
    threads: dict[int, dict[str, int]] = field(default_factory=dict)      # thread id -> name -> value
    skipped: list[str] = field(default_factory=list)


def parse_offload_stats(text: str) -> OffloadStats:
    """`ovs-appctl dpctl/offload-stats-show` -> counters (names as OVS prints them, trimmed)."""
    out = OffloadStats()
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.endswith(":") and ":" not in stripped[:-1]:
            continue  # blank, or a header ("HW Offload stats:", a provider label)
        m = _STAT.match(line)
        if m:
            name, value = " ".join(m["name"].split()), int(m["value"])
            if m["total"]:
                out.totals[name] = value
            else:
                out.threads.setdefault(int(m["tid"]), {})[name] = value
            continue
        p = _STAT_PLAIN.match(line)
        if p:
            out.totals[" ".join(p["name"].split())] = int(p["value"])
        else:
            out.skipped.append(stripped[:200])
    return out


# ---- reading the log file --------------------------------------------------------------------

class LogFileError(OSError):
    """The log cannot be read safely (not a regular file, a symlink, unreadable)."""

    def __str__(self) -> str:
        return str(self.strerror)


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    # O_NONBLOCK: opening a FIFO (or a device) never waits for a writer; O_NOFOLLOW: a symlink
    # planted at the log path is refused rather than followed. Then only regular files.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LogFileError(errno.ELOOP, f"{path} is a symbolic link; give the log file itself") from None
        raise LogFileError(exc.errno or 0, f"cannot open {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise LogFileError(errno.EINVAL, f"{path} is not a regular file")
    return fd, st


def _decode(chunk: bytes) -> list[str]:
    return chunk.decode("utf-8", "replace").splitlines()


class LogCursor:
    """Complete new lines of a growing log file, call after call.

    Remembers (device, inode) and the offset after the last complete line: a partial last
    line is not consumed (the next call reads it again, whole); a new inode (rotation) or a
    file shorter than the offset (truncation, copytruncate) restarts at 0. Lines still unread
    in a rotated-away file are lost — the cursor keeps no file open between calls. A line
    longer than `max_bytes` is skipped (counted in `skipped_bytes`), so the cursor never gets
    stuck on it."""

    def __init__(self, path: str, start_at_end: bool = False) -> None:
        self.path = path
        self.start_at_end = start_at_end
        self.identity: tuple[int, int] | None = None
        self.offset = 0
        self.skipping = False      # inside an over-long line: drop bytes up to its newline
        self.skipped_bytes = 0
        self.restarts = 0          # rotations and truncations seen

    def read_new(self, max_bytes: int = 1 << 20) -> list[str]:
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        fd, st = _open_regular(self.path)
        try:
            identity = (st.st_dev, st.st_ino)
            if self.identity is None:
                self.identity = identity
                self.offset = st.st_size if self.start_at_end else 0
            elif identity != self.identity or st.st_size < self.offset:
                self.identity, self.offset, self.skipping = identity, 0, False
                self.restarts += 1
            chunk = os.pread(fd, max_bytes, self.offset)
        finally:
            os.close(fd)
        if self.skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                self.offset += len(chunk)
                self.skipped_bytes += len(chunk)
                return []
            self.offset += nl + 1
            self.skipped_bytes += nl + 1
            self.skipping = False
            chunk = chunk[nl + 1:]
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) >= max_bytes:       # one line longer than the bound
                self.offset += len(chunk)
                self.skipped_bytes += len(chunk)
                self.skipping = True
            return []
        self.offset += end + 1
        return _decode(chunk[:end + 1])


def read_tail(path: str, max_bytes: int = 4 << 20) -> list[str]:
    """The complete lines among the last `max_bytes` of a log file (same safety as LogCursor):
    the first line is dropped when the window starts inside it, and so is an unfinished last
    line."""
    fd, st = _open_regular(path)
    try:
        start = max(0, st.st_size - max_bytes)
        chunk = os.pread(fd, min(max_bytes, st.st_size), start)
    finally:
        os.close(fd)
    if start > 0:
        nl = chunk.find(b"\n")
        chunk = chunk[nl + 1:] if nl >= 0 else b""
    end = chunk.rfind(b"\n")
    return _decode(chunk[:end + 1]) if end >= 0 else []
