"""Pre-warm (docs/offload.md): the datapath flows between an attachment and its known peers
exist before the workload sends its first packet. Shared by the two OVS modes (ovs,
ovs-offload), each of which calls `warm` once its ADD is ready and `unwarm` first thing in
its DEL.

For each pair of attachments of one network, one bridge and one access VLAN on this node:
1. a static OpenFlow rule per direction, `in_port=<a>, dl_src=<mac a>, dl_dst=<mac b>,
   no VLAN tag → output:<b>`, at priority 1 — above the bridge's default NORMAL rule
   (priority 0) and below any rule anyone else wrote, so pre-warm never overrides somebody's
   policy, only the MAC learning of NORMAL for frames that NORMAL would forward anyway (same
   L2 segment). "No VLAN tag" (OXM VLAN_VID = OFPVID_NONE) because NORMAL drops a tagged
   frame that a pod sends on its access port, and `output:<b>` would not: such a frame
   misses the rule and meets NORMAL. Trunk ports are not pre-warmed at all;
2. one frame per EtherType (IPv4, ARP, and IPv6 when either end has an IPv6 address) and
   direction, sent from inside each pod's namespace (system/warmframes.py): its miss makes
   OVS install the datapath flow — on a NIC with hw-offload, the flow OVS offloads to tc
   flower; in the lab, a flow of the userspace datapath.

Ownership, so that nothing of anyone else is touched: every rule carries a cookie whose top
16 bits are "tn" (0x746e), the next 16 a hash of the network, then 16 bits naming the
attachment whose port the rule's packets come *in* on (its source) and 16 naming the one it
sends them to (its destination). Every delete names our cookie and a mask, so it can only
match our rules; every add is `check_overlap`, so a rule of anyone else's at priority 1 with
an overlapping match makes ours fail (state `conflict`) instead of replacing it. All rules
of one warm go in one OpenFlow bundle (all or none).

Peers on other nodes (cluster mode: the node config names an etcd): each pre-warming
attachment is published under `<etcdPrefix>prewarm/<network>/<node>/<container id>/<ifname>`
(its MAC and VLAN). There is no rule for those pairs — the path to another node is an uplink
that NORMAL learns, and which one it is only NORMAL knows — only the frames: each node sends
from its own pods to every remote peer of the same network and VLAN, at the pod's ADD and,
for peers that appear later, from the agent's heartbeat (`sync_remote`). Since every node
does the same for its own pods, both directions end up warm, and the frames teach the
bridges and the top-of-rack switch where each MAC is.

Ports are numbers in OpenFlow: a rule left behind after its port is deleted would send
traffic to whichever port reuses the number — another tenant's, if it could choose the
number. So no rule of ours may outlive the port it was written for, and three things see to
it, none of which waits for another:
- DEL marks the record `removing`, then removes every rule from or to the attachment (by
  the cookie's source and destination bits, and by its port number both ways), and only
  then is the port deleted. It takes no lock: a DEL never waits behind warms.
- A warm that has written its rules reads its peers' records again: a peer that is now
  `removing` or gone may have removed its rules before this warm wrote them, so the warm
  removes them itself. (A DEL marks before it removes, and the warm re-reads after OVS has
  committed: one of the two always sees the other.)
- `sweep` (the agent every prewarmReconcileInterval and at start, and GC) removes every rule
  of ours that is not backed by the live state: its source and destination attachments
  recorded, not `removing`, with these MACs, on ports that have these numbers *now*. It is
  what catches a process killed between its write and its re-read.
And OVS itself does not give a freed number to a new port for an hour unless asked to with
`ofport_request` — which, on a bridge that pre-warms, is the admin's to grant
(prewarmGrants), as is the MAC a rule matches on.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from tenantnet.plugin import log
from tenantnet.plugin.drivers.ovsport import PREWARM_PENDING, PortPlan
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import PHASE_READY, AttachmentRecord, CorruptRecord, Plan, RecordStore
from tenantnet.plugin.system import dpctl, openflow, ovsdb, warmframes
from tenantnet.plugin.system.netns import NamespaceNotFound
from tenantnet.plugin.system.openflow import OFPVID_NONE, AddRule, DeleteStrict, Op, Rule

PRIORITY = 1
TN = 0x746E << 48
TN_MASK = 0xFFFF << 48
NETWORK_MASK = 0xFFFFFFFF << 32  # "tn" and the network's 16 bits
SOURCE_MASK = 0xFFFF << 16       # the attachment whose port the rule's packets come in on
DESTINATION_MASK = 0xFFFF        # the attachment whose port the rule sends them to
OURS = f"cookie={TN:#x}/{TN_MASK:#x}"  # in ovs-ofctl's words: `ovs-ofctl dump-flows BR "$OURS"`

# States kept in the plan (`prewarm`), shown by `tenantnetctl ls` and in /metrics.
PENDING = PREWARM_PENDING  # the network pre-warms; this ADD has not got to it (yet)
WARM = "warm"            # rules in, and every pair's datapath flow seen after the frames
RULES_ONLY = "rules"     # rules in; a datapath flow did not show within the wait
NO_PEERS = "no-peers"    # nothing to pair with when it was made (later peers pair with it)
REMOTE_ONLY = "remote"   # no peer on this node; frames sent to the peers on other nodes
CONFLICT = "conflict"    # a rule of somebody else's overlaps ours: ours were not written
FAILED = "failed"        # OVS refused or could not be reached; the reason is in the log
TRUNK = "trunk"          # a trunk port: its traffic is tagged, so per-pair rules do not apply
REMOVING = "removing"    # DEL has begun: peers must not pair with it any more

# The VLAN_VID match of rules written before pre-warm matched on "no VLAN tag": none. Such
# rules (and rules whose cookie has the layout before source and destination bits) are not
# backed by `sweep`, which removes them; `reconcile` then writes them anew.
LEGACY_VLAN: int | None = None

OFPORT_WAIT = 2.0   # vswitchd numbers a new port within milliseconds; a bound, not a pause
FLOW_WAIT = 0.5     # for the frames' upcalls to become datapath flows (ms here; a bound)
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


def network_bits(network: str) -> int:
    return int.from_bytes(hashlib.sha256(network.encode()).digest()[:2], "big") << 32


def ident_of(network: str, container_id: str, ifname: str) -> int:
    """An attachment's identity in our cookies: "tn", its network's bits, and its own 16
    bits where a rule's source goes. Two attachments of a network may share the 16 bits (a
    hash): a delete by them may take a stranger's rules too (which `reconcile` writes
    again), and `sweep` never keeps a rule for them alone (it checks ports and MACs)."""
    own = int.from_bytes(hashlib.sha256(f"{network}/{container_id}/{ifname}".encode()).digest()[:2], "big")
    return TN | network_bits(network) | own << 16


def from_ident(ident: int) -> tuple[int, int]:
    """(cookie, mask) of our rules whose packets come in on the attachment `ident`."""
    return ident, NETWORK_MASK | SOURCE_MASK


def to_ident(ident: int) -> tuple[int, int]:
    """(cookie, mask) of our rules that send to the attachment `ident`."""
    return (ident & NETWORK_MASK) | (ident & SOURCE_MASK) >> 16, NETWORK_MASK | DESTINATION_MASK


def pair_cookie(source: int, destination: int) -> int:
    return source | (destination & SOURCE_MASK) >> 16


def source_ident(cookie: int) -> int:
    return cookie & (NETWORK_MASK | SOURCE_MASK)


def destination_ident(cookie: int) -> int:
    return (cookie & NETWORK_MASK) | (cookie & DESTINATION_MASK) << 16


def network_cookie(network: str) -> tuple[int, int]:
    """(cookie, mask) selecting our rules of `network`."""
    return TN | network_bits(network), TN_MASK | NETWORK_MASK


@dataclass(frozen=True)
class End:
    """One attachment as a pre-warm pair sees it."""

    ident: int     # ident_of(network, container id, ifname)
    port: str      # its OVS port
    ofport: int
    mac: str       # the pod interface's
    netns: str
    ifname: str    # in the pod
    ipv6: bool

    def rule(self, to: End) -> Rule:
        return Rule(pair_cookie(self.ident, to.ident), PRIORITY, self.ofport, self.mac, to.mac, to.ofport,
                    OFPVID_NONE)

    def ops(self, to: End) -> list[Op]:
        # The strict deletes first (any cookie of ours: the same match is the same pair), so
        # a pair warmed twice (two ADDs racing) ends with one rule, and `check_overlap` then
        # only sees other people's. Two: a strict delete needs the whole match, and a rule
        # written before the VLAN_VID match (LEGACY_VLAN) would otherwise overlap the new
        # one and fail it as a conflict.
        return [DeleteStrict(TN, PRIORITY, self.ofport, self.mac, to.mac, LEGACY_VLAN, TN_MASK),
                DeleteStrict(TN, PRIORITY, self.ofport, self.mac, to.mac, OFPVID_NONE, TN_MASK),
                AddRule(self.rule(to))]


def enabled(plan: Plan) -> bool:
    return isinstance(plan, PortPlan) and plan.prewarms()


def _pod_interface(record: AttachmentRecord) -> tuple[str, bool] | None:
    """(MAC, has an IPv6 address) of the pod's interface, from the record's result."""
    result = record.result or {}
    mac, index = None, -1
    for i, iface in enumerate(result.get("interfaces") or []):
        if isinstance(iface, dict) and iface.get("sandbox") and iface.get("name") == record.ifname:
            mac, index = iface.get("mac"), i
            break
    if not isinstance(mac, str) or not mac:
        return None
    ipv6 = any(":" in str(ip.get("address", "")) for ip in result.get("ips") or []
               if isinstance(ip, dict) and ip.get("interface", index) == index)
    return mac.lower(), ipv6


def _end(db: ovsdb.Ovsdb, record: AttachmentRecord, wait: float) -> End | None:
    plan = record.plan
    assert isinstance(plan, PortPlan)
    port = plan.port_name()
    pod = _pod_interface(record)
    if not port or pod is None:
        return None
    deadline = time.monotonic() + wait
    while True:
        state = db.port(port)
        if state is None:
            return None
        if state.ofport and state.ofport > 0:
            break
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)
    return End(ident_of(record.network, record.container_id, record.ifname), port, state.ofport,
               pod[0], record.netns, record.ifname, pod[1])


LOCK_WAIT = 5.0  # a warm holds the bridge for milliseconds; a stuck holder is not waited for
LOCK_PREFIX = "prewarm-"
MAX_LOCK_NOTE = 4096  # what a bridge's lock file says: {"ovsdb": endpoint, "bridge": name}


@contextmanager
def _bridge_lock(node: NodeConfig, endpoint: str, bridge: str) -> Iterator[None]:
    """One warm (or sweep) at a time per bridge, across the agent's threads and processes;
    OSError if another holds it for more than LOCK_WAIT seconds. DEL takes no lock (module
    docstring). The file names its bridge, so that `bridges_used` finds every bridge pre-warm
    ever wrote to, also one whose last attachment is gone."""
    name = f"{LOCK_PREFIX}{hashlib.sha256(bridge.encode()).hexdigest()[:16]}.lock"
    path = os.path.join(node.state_dir, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise OSError(f"pre-warm lock {path} held for more than {LOCK_WAIT:g} s") from None
                time.sleep(0.005)
        if os.fstat(fd).st_size == 0:
            os.write(fd, json.dumps({"ovsdb": endpoint, "bridge": bridge}).encode())
        yield
    finally:
        os.close(fd)


def bridges_used(node: NodeConfig) -> set[tuple[str, str]]:
    """(OVSDB endpoint, bridge) of every bridge pre-warm has written to on this node."""
    found: set[tuple[str, str]] = set()
    try:
        names = [n for n in os.listdir(node.state_dir) if n.startswith(LOCK_PREFIX) and n.endswith(".lock")]
    except OSError:
        return found
    for name in names:
        try:
            fd = os.open(os.path.join(node.state_dir, name),
                         os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            note = json.loads(os.read(fd, MAX_LOCK_NOTE) or b"{}")
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        if isinstance(note, dict) and all(isinstance(note.get(k), str) for k in ("ovsdb", "bridge")):
            found.add((note["ovsdb"], note["bridge"]))
    return found


def _same_segment(a: PortPlan, b: Plan) -> bool:
    return isinstance(b, PortPlan) and bool(b.prewarm) and b.prewarm != REMOVING and not b.trunks \
        and b.bridge == a.bridge and b.ovsdb == a.ovsdb and b.vlan == a.vlan


def peers(records: RecordStore, record: AttachmentRecord, limit: int) -> list[AttachmentRecord]:
    """The ready attachments of the same network, bridge and VLAN, newest first, at most `limit`."""
    plan = record.plan
    assert isinstance(plan, PortPlan)
    found = [r for r in records.list(record.network)
             if isinstance(r, AttachmentRecord) and r.key != record.key and r.phase == PHASE_READY
             and _same_segment(plan, r.plan)]
    found.sort(key=lambda r: r.created, reverse=True)
    return found[:limit]


def records_of(node: NodeConfig, record: AttachmentRecord) -> RecordStore:
    """The node's records, read with `record`'s plan type (a network has one mode)."""
    return RecordStore(node.state_dir, lambda mode: type(record.plan) if mode == record.mode else Plan)


def warm(node: NodeConfig, db: ovsdb.Ovsdb, record: AttachmentRecord) -> bool:
    """Pre-warm a ready attachment with its peers; sets the plan's state. Never raises for
    what OVS or a peer does: pre-warm is an optimisation, and the ADD has succeeded."""
    plan = record.plan
    if not enabled(plan):
        return False
    assert isinstance(plan, PortPlan)
    logger = log.get("tenantnet.prewarm")
    if plan.trunks:
        plan.prewarm = TRUNK
        return True
    if not node.prewarm_bridge(plan.bridge or ""):
        # ovs-offload finds its bridge at ADD: one the admin did not name gets no rules.
        plan.prewarm = FAILED
        logger.warning("prewarm.failed", port=plan.port_name(),
                       error=f"bridge {plan.bridge!r} is not one pre-warm may run on "
                             "(node config prewarmBridges)")
        return True
    started = time.monotonic()
    target = openflow.mgmt_target(db.endpoint, plan.bridge or "")
    try:
        _keep_flows(node, db)
        me = _end(db, record, OFPORT_WAIT)
        if me is None:
            plan.prewarm = FAILED
            logger.warning("prewarm.failed", port=plan.port_name(),
                           error="the port has no OpenFlow number or the pod interface no MAC")
            return True
        with _bridge_lock(node, db.endpoint, plan.bridge or ""):
            records = records_of(node, record)
            pairs = [(p, e) for p in peers(records, record, node.prewarm_max_peers)
                     if (e := _end(db, p, 0)) is not None]
            written, conflicts = _write(target, me, [e for _, e in pairs]) if pairs else ([], 0)
            if written:
                written = _still_there(records, switch_for(target),
                                       [(p, e) for p, e in pairs if e in written])
    except (ovsdb.OvsdbUnavailable, ovsdb.OvsdbFailure, openflow.OpenflowError, OSError) as exc:
        plan.prewarm = FAILED
        logger.warning("prewarm.failed", port=plan.port_name(), error=str(exc))
        return True
    plan.prewarm_rules = 2 * len(written)
    for peer in written:
        _send(me, peer)
        _send(peer, me)
    remote = _publish_and_greet(node, record, me)  # bounded: CLUSTER_WAIT
    seen = False
    if pairs and not written:
        plan.prewarm = CONFLICT
        logger.warning("prewarm.conflict", port=me.port, peers=len(pairs),
                       error="every pair's rule overlaps a rule of somebody else's at priority "
                             f"{PRIORITY}; nothing was written")
    elif not pairs:
        plan.prewarm = REMOTE_ONLY if remote else NO_PEERS
    else:
        seen = _flows_seen(db.endpoint, me, written)
        plan.prewarm = CONFLICT if conflicts else WARM if seen else RULES_ONLY
    logger.info("prewarm.done", port=me.port, pairs=len(written), remote_peers=remote, conflicts=conflicts,
                flows_seen=seen, state=plan.prewarm, ms=round((time.monotonic() - started) * 1000, 2))
    return True


def _still_there(records: RecordStore, switch: openflow.Switch,
                 written: list[tuple[AttachmentRecord, End]]) -> list[End]:
    """After the rules are in: the peers whose DEL has not begun meanwhile. A DEL marks its
    record `removing` (or it is gone), then removes its rules without a lock — possibly
    before this warm wrote rules to it: those go here (module docstring)."""
    kept = []
    for peer, end in written:
        try:
            now = records.load(*peer.key)
        except CorruptRecord:
            now = None
        if now is not None and now.phase == PHASE_READY and getattr(now.plan, "prewarm", "") != REMOVING:
            kept.append(end)
            continue
        _remove(switch, end.ident, end.ofport)
        log.get("tenantnet.prewarm").info("prewarm.peer_left", port=end.port,
                                          error="its DEL began while this pair was written: "
                                                "its rules removed")
    return kept


def _remove(switch: openflow.Switch, ident: int, ofport: int | None) -> None:
    """Every rule of ours from or to the attachment `ident` (on port `ofport`, if known)."""
    switch.delete(*from_ident(ident))
    switch.delete(*to_ident(ident))
    if ofport is not None:
        # By number too: whatever cookie a rule has (an older layout, another hash), ours
        # that send to this port or take packets from it go with it. A MAC alone would not
        # do: a NAD may give another tenant's pod the same MAC.
        switch.delete(TN, TN_MASK, out_port=ofport)
        switch.delete(TN, TN_MASK, in_port=ofport)


def _keep_flows(node: NodeConfig, db: ovsdb.Ovsdb) -> None:
    """The datapath idle time the node config asks for (OVS's default is 10 s: a pair
    quiet for longer loses its flow, and its next packet is a first packet again)."""
    if node.prewarm_max_idle_ms is not None:
        wanted = str(node.prewarm_max_idle_ms)
        if db.other_config().get("max-idle") != wanted:
            db.set_other_config("max-idle", wanted)


def _write(target: str, me: End, others: list[End]) -> tuple[list[End], int]:
    """Write the rules of every pair in one bundle; pairs that would touch a rule of somebody
    else's are left out (conflicts: how many)."""
    switch = switch_for(target)
    free = [o for o in others if not _taken(switch, me.rule(o)) and not _taken(switch, o.rule(me))]
    if not free:
        return [], len(others)
    try:
        switch.bundle([op for o in free for op in me.ops(o) + o.ops(me)])
        return free, len(others) - len(free)
    except openflow.OpenflowError as exc:
        if not exc.overlap:
            raise
    written = []
    for o in free:  # one overlapping pair failed the bundle: the others alone
        try:
            switch.bundle(me.ops(o) + o.ops(me))
            written.append(o)
        except openflow.OpenflowError as exc:
            if not exc.overlap:
                raise
    return written, len(others) - len(written)


def _taken(switch: openflow.Switch, rule: Rule) -> bool:
    """Whether somebody else has a rule at our priority whose match has our rule's in_port
    and MACs: one with exactly our match (VLAN_VID too) our ADD would replace silently
    (check_overlap only refuses a partial overlap); one without VLAN_VID, or with more
    fields, overlaps ours, which check_overlap would refuse anyway — either way the pair is
    left alone."""
    return any(r.priority == rule.priority and r.cookie & TN_MASK != TN
               and (r.in_port, r.eth_src, r.eth_dst) == (rule.in_port, rule.eth_src, rule.eth_dst)
               for r in switch.rules(0, 0, in_port=rule.in_port, eth_src=rule.eth_src, eth_dst=rule.eth_dst))


_switches: dict[str, openflow.Switch] = {}
_switches_lock = threading.Lock()


def switch_for(target: str) -> openflow.Switch:
    """One OpenFlow connection per bridge and process, made on first use (like OVSDB's)."""
    with _switches_lock:
        switch = _switches.get(target)
        if switch is None:
            switch = _switches[target] = openflow.Switch(target)
        return switch


def _send(src: End, dst: End) -> None:
    types = [warmframes.ETH_P_IP, warmframes.ETH_P_ARP]
    if src.ipv6 or dst.ipv6:
        types.append(warmframes.ETH_P_IPV6)
    try:
        warmframes.send(src.netns, src.ifname, [warmframes.frame(src.mac, dst.mac, t) for t in types])
    except (NamespaceNotFound, OSError) as exc:  # a pod going away meanwhile: its flows do not matter
        log.get("tenantnet.prewarm").info("prewarm.frame_not_sent", port=src.port, error=str(exc))


def _flows_seen(endpoint: str, me: End, others: list[End]) -> bool:
    """Whether the IPv4 datapath flow of every pair, both ways, is in the datapath now."""
    wanted = {f"eth(src={a.mac},dst={b.mac})" for o in others for a, b in ((me, o), (o, me))}
    target = dpctl.find_target(endpoint).path
    deadline = time.monotonic() + FLOW_WAIT
    while True:
        try:
            text = dpctl.appctl(target, "dpctl/dump-flows", timeout=2.0)
        except dpctl.OffloadError:
            return False
        found = {w for w in wanted if any(w in line and "eth_type(0x0800)" in line
                                          for line in text.splitlines())}
        if found == wanted:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)  # an upcall is handled within a millisecond or two


def unwarm(node: NodeConfig, db: ovsdb.Ovsdb, record: AttachmentRecord) -> None:
    """Remove every rule of ours that this attachment's packets come in on, or that sends to
    its port. Runs before the port is deleted, and waits for no lock. Never fails the DEL:
    what it cannot remove now (OVS unreachable, the bridge gone) `sweep` removes later, and
    a rule whose port is gone sends nowhere until then (OVS gives the number to no new port
    for an hour, and no tenant may ask for it on a bridge that pre-warms)."""
    plan = record.plan
    if not enabled(plan):
        return
    assert isinstance(plan, PortPlan)
    _unpublish(node, record)
    try:
        _unwarm(node, db, record, plan)
    except (openflow.OpenflowError, ovsdb.OvsdbUnavailable, ovsdb.OvsdbFailure, OSError) as exc:
        log.get("tenantnet.prewarm").warning("prewarm.rules_left", port=plan.port_name(),
                                             error=f"{exc}; GC removes them")


def _unwarm(node: NodeConfig, db: ovsdb.Ovsdb, record: AttachmentRecord, plan: PortPlan) -> None:
    switch = switch_for(openflow.mgmt_target(db.endpoint, plan.bridge or ""))
    port = plan.port_name()
    state = db.port(port) if port else None
    ofport = state.ofport if state is not None and state.ofport and state.ofport > 0 else None
    # The mark first, the removal second: a peer's warm that writes after this removal reads
    # the mark afterwards, and removes what it wrote (`_still_there`).
    if record.phase == PHASE_READY and plan.prewarm != REMOVING:
        try:
            records = records_of(node, record)
            if records.load(*record.key) is not None:
                plan.prewarm = REMOVING
                records.save(record, rewrite=True)
        except (OSError, ValueError):
            pass  # the rules go anyway; a peer's warm meanwhile is undone by `sweep`
    _remove(switch, ident_of(record.network, record.container_id, record.ifname), ofport)


# ---- peers on other nodes (cluster mode) ------------------------------------------------

@dataclass(frozen=True)
class Published:
    """A pre-warming attachment as the cluster store shows it."""

    key: str
    network: str
    node: str
    mac: str
    vlan: int | None


# A pod's ADD and DEL give the cluster store CLUSTER_WAIT seconds per call, not the node's
# etcdTimeout (5 s by default): an answering etcd takes milliseconds, and what a pod's path
# could not do the agent's heartbeat does (`sync_remote`, every 5 s, with etcdTimeout):
# publish a pre-warmed attachment whose key is missing (greeting the remote peers from it
# first), delete a key no record backs. After a call that failed, this process leaves the
# store to the heartbeat for CLUSTER_RETRY_AFTER seconds (the agent serves many ADDs: during
# an outage only the first pays the wait; an exec'd plugin is a new process each time, and
# pays CLUSTER_WAIT at most).
CLUSTER_WAIT = 0.5
CLUSTER_RETRY_AFTER = 5.0
_cluster_failed_at: dict[Any, float] = {}  # etcd configuration -> when a pod's call failed (monotonic)

# The states `warm` leaves after it has tried to publish: the attachments whose key belongs in
# the store (not FAILED or TRUNK, which stop before; not PENDING or REMOVING).
PUBLISHED_STATES = (WARM, RULES_ONLY, NO_PEERS, REMOTE_ONLY, CONFLICT)


@dataclass(frozen=True)
class ClusterStore:
    """The cluster store as pre-warm uses it."""

    etcd: Any    # ipam.etcd.Etcd (imported only in cluster mode)
    node: str    # this node's name
    base: str    # key prefix of pre-warm: `<etcdPrefix>prewarm/`

    def key(self, record: AttachmentRecord) -> str:
        return f"{self.base}{record.network}/{self.node}/{record.container_id}/{record.ifname}"


def _cluster(node: NodeConfig, wait: float | None = None) -> ClusterStore | None:
    """The cluster store, or None without one; `wait`: seconds per call, if shorter than the
    node's etcdTimeout."""
    from ipam import cluster
    from tenantnet.plugin import ipam_client

    me = ipam_client.cluster_node(node)
    if me is None:
        return None
    config = me.etcd
    if wait is not None and wait < config.timeout:
        config = replace(config, timeout=wait)
    return ClusterStore(cluster.client(config), me.name, f"{me.prefix}prewarm/")


def _pod_path_store(node: NodeConfig, record: AttachmentRecord) -> ClusterStore | None:
    """The store for an ADD or DEL (CLUSTER_WAIT per call), or None: no store, or a call of
    this process failed less than CLUSTER_RETRY_AFTER seconds ago (left to the heartbeat)."""
    store = _cluster(node, CLUSTER_WAIT)
    if store is None:
        return None
    failed = _cluster_failed_at.get(store.etcd.config)
    ago = time.monotonic() - failed if failed is not None else None
    if ago is not None and ago < CLUSTER_RETRY_AFTER:
        log.get("tenantnet.prewarm").info("prewarm.cluster_deferred", network=record.network,
                                          container_id=record.container_id, ifname=record.ifname,
                                          error=f"the cluster store failed a call {ago:.1f} s ago; the "
                                                "agent's heartbeat publishes or removes the key")
        return None
    return store


def _pod_path_failed(store: ClusterStore, exc: Exception) -> None:
    _cluster_failed_at[store.etcd.config] = time.monotonic()
    log.get("tenantnet.prewarm").warning("prewarm.cluster_unavailable",
                                         error=f"{exc}; the agent's heartbeat retries")


def _published(value: bytes, key: str, base: str) -> Published | None:
    parts = key[len(base):].split("/")
    try:
        data = json.loads(value)
        mac, vlan = str(data["mac"]).lower(), data.get("vlan")
    except (ValueError, KeyError, TypeError):
        return None  # not ours to judge: somebody else's key under the prefix is skipped
    vlan_ok = vlan is None or (isinstance(vlan, int) and not isinstance(vlan, bool) and 0 <= vlan <= 4094)
    if len(parts) != 4 or not _MAC.fullmatch(mac) or int(mac[:2], 16) & 1 or not vlan_ok:
        return None  # a group (multicast/broadcast) MAC is no peer; a VLAN must be an id
    return Published(key, parts[0], parts[1], mac, vlan)


def _value(mac: str, plan: PortPlan) -> bytes:
    return json.dumps({"mac": mac, "vlan": plan.vlan}).encode()


def _greet(me: End, peers: list[Published], limit: int) -> int:
    """Send `me`'s frames to remote `peers` (at most `limit`); how many."""
    for peer in peers[:limit]:
        _send(me, End(0, "", 0, peer.mac, "", "", False))
    return min(len(peers), limit)


def _publish_and_greet(node: NodeConfig, record: AttachmentRecord, me: End) -> int:
    """Send `record`'s frames to the network's peers on other nodes, then publish it; how
    many peers. In that order, so that a key in the store means its pod has greeted the
    peers there were: the heartbeat, which publishes a missing key, greets from it first."""
    store = _pod_path_store(node, record)
    if store is None:
        return 0
    plan = record.plan
    assert isinstance(plan, PortPlan)
    try:
        remote = [p for kv in store.etcd.range(f"{store.base}{record.network}/")
                  if (p := _published(kv.value, kv.key, store.base)) is not None
                  and p.node != store.node and p.vlan == plan.vlan]
    except Exception as exc:  # the cluster store is down: the local pairs are warm anyway
        _pod_path_failed(store, exc)
        return 0
    greeted = _greet(me, remote, node.prewarm_max_peers)
    try:
        store.etcd.put(store.key(record), _value(me.mac, plan))
    except Exception as exc:
        _pod_path_failed(store, exc)
    return greeted


def _unpublish(node: NodeConfig, record: AttachmentRecord) -> None:
    store = _pod_path_store(node, record)
    if store is None:
        return
    try:
        store.etcd.delete(store.key(record))
    except Exception as exc:  # left for sync_remote on this node to remove later
        _pod_path_failed(store, exc)


def sync_remote(node: NodeConfig, greeted: set[str], plan_type: Callable[[str], type[Plan]]) -> set[str]:
    """The agent's heartbeat: greet remote peers that appeared since the last call (send
    frames from this node's pre-warmed pods of the same network and VLAN to them), publish
    this node's pre-warmed attachments whose key is missing (an ADD that could not reach the
    store: greeting every remote peer from them first, as their ADD would have), and drop
    this node's published keys that no record backs any more (a DEL that could not reach the
    store). `greeted`: the remote keys handled so far; returns the new set."""
    store = _cluster(node)
    if store is None:
        return greeted
    entries = [p for kv in store.etcd.range(store.base)
               if (p := _published(kv.value, kv.key, store.base)) is not None]
    remote = [p for p in entries if p.node != store.node]
    fresh = {p.key for p in remote if p.key not in greeted}
    own = {p.key for p in entries if p.node == store.node}
    records = [r for r in RecordStore(node.state_dir, plan_type).list() if isinstance(r, AttachmentRecord)]
    for r in records:
        plan = r.plan
        if r.phase != PHASE_READY or not enabled(plan) or \
                getattr(plan, "prewarm", "") not in PUBLISHED_STATES:
            continue
        assert isinstance(plan, PortPlan)
        pod = _pod_interface(r)
        if pod is None:
            continue
        missing = store.key(r) not in own
        segment = [p for p in remote if p.network == r.network and p.vlan == plan.vlan
                   and (missing or p.key in fresh)]
        _greet(End(0, plan.port_name() or "", 0, pod[0], r.netns, r.ifname, pod[1]), segment,
               node.prewarm_max_peers)  # the same bound as at ADD
        if missing:
            store.etcd.put(store.key(r), _value(pod[0], plan))
    backed = {store.key(r) for r in records}
    for key in own - backed:
        store.etcd.delete(key)
    return {p.key for p in remote}


def reconcile(node: NodeConfig, plan_type: Callable[[str], type[Plan]]) -> int:
    """The agent's round, every prewarmReconcileInterval (and at its start): `sweep` every
    bridge pre-warm has written to, then re-warm the attachments whose rules are gone while
    they still have peers here — what an ovs-vswitchd restart does (OpenFlow tables are not
    persistent), and what the sweep does to a rule of an older shape. It adds rules only
    through `warm`. Returns how many attachments were re-warmed."""
    from tenantnet.plugin.drivers import ovsport

    records = RecordStore(node.state_dir, plan_type)
    listed = [r for r in records.list() if isinstance(r, AttachmentRecord)]
    where_of = {r.key: (ovsport.ovsdb_for(node, r.plan.ovsdb).endpoint, r.plan.bridge or "")
                for r in listed if enabled(r.plan) and isinstance(r.plan, PortPlan)}
    present: dict[tuple[str, str], tuple[set[int], set[int]]] = {}
    for where in sorted(bridges_used(node) | set(where_of.values())):
        try:
            present[where] = sweep(node, where[0], where[1], plan_type)
        except (openflow.OpenflowError, ovsdb.OvsdbUnavailable, ovsdb.OvsdbFailure, OSError) as exc:
            # OSError: the bridge lock, or the bridge's socket gone with it; the next round retries.
            log.get("tenantnet.prewarm").info("prewarm.sweep_skipped", bridge=where[1], error=str(exc))
    rewarmed = 0
    for r in listed:
        plan = r.plan
        if r.phase != PHASE_READY or not enabled(plan) or \
                getattr(plan, "prewarm", "") not in (WARM, RULES_ONLY, FAILED):
            continue
        assert isinstance(plan, PortPlan)
        where = where_of[r.key]
        ident = ident_of(r.network, r.container_id, r.ifname)
        # Both ways: a pair's rules are written by the newer of the two, and either may go.
        if where not in present or (ident in present[where][0] and ident in present[where][1]):
            continue
        # Under the attachment's own lock, and only if it is still there and ready: a DEL
        # running meanwhile must not see its record written back or re-paired.
        with records.lock(r.container_id, r.ifname):
            now = records.load(*r.key)
            if now is None or now.phase != PHASE_READY or getattr(now.plan, "prewarm", "") == REMOVING:
                continue
            if warm(node, ovsport.ovsdb_for(node, plan.ovsdb), now):
                records.save(now, rewrite=True)
                rewarmed += 1
    return rewarmed


@dataclass(frozen=True)
class _Live:
    """An attachment as `sweep` finds it now: its port's number in OVS, its MAC, its segment."""

    ofport: int
    mac: str
    network: str
    vlan: int | None


def sweep(node: NodeConfig, endpoint: str, bridge: str,
          plan_type: Callable[[str], type[Plan]]) -> tuple[set[int], set[int]]:
    """Remove every rule of ours on `bridge` that is not backed by the live state: a rule
    `in_port=A, dl_src=a, dl_dst=b, untagged → output:B` stays only while the attachments its
    cookie names as source and destination are recorded on this bridge, neither `removing`,
    with MACs a and b, on ports whose numbers in OVS are A and B now, of one network and
    VLAN. Anything else — a departed attachment's, one whose port was deleted and its
    number given to another, an older rule shape — goes. Rules, records and port numbers
    are all read under the bridge lock, so that no warm is between its write and its
    re-read, and no attachment warmed after a listing is taken for a stranger. Returns the
    identities of the attachments with rules left, as source and as destination."""
    from tenantnet.plugin.drivers import ovsport

    switch = switch_for(openflow.mgmt_target(endpoint, bridge))
    with _bridge_lock(node, endpoint, bridge):
        rules = switch.rules(TN, TN_MASK)
        if not rules:
            return set(), set()
        live: dict[int, list[_Live]] = {}
        for r in RecordStore(node.state_dir, plan_type).list():
            if not isinstance(r, AttachmentRecord):
                continue
            plan = r.plan
            if not isinstance(plan, PortPlan) or (plan.bridge or "") != bridge or plan.prewarm == REMOVING \
                    or ovsport.ovsdb_for(node, plan.ovsdb).endpoint != endpoint:
                continue
            pod, port = _pod_interface(r), plan.port_name()
            state = ovsport.ovsdb_for(node, plan.ovsdb).port(port) if pod is not None and port else None
            if pod is not None and state is not None and state.ofport and state.ofport > 0:
                live.setdefault(ident_of(r.network, r.container_id, r.ifname), []).append(
                    _Live(state.ofport, pod[0], r.network, plan.vlan))
        kept = [rule for rule in rules if _backed(rule, live)]
        doomed = [rule for rule in rules if rule not in set(kept)] if len(kept) < len(rules) else []
        strict: list[Op] = [DeleteStrict(d.cookie, d.priority, d.in_port, d.eth_src, d.eth_dst, d.vlan_vid)
                  for d in doomed if d.output > 0]
        if strict:
            switch.bundle(strict)
        for d in doomed:
            if d.output <= 0:
                # A rule of ours of another shape (other match fields or actions) has no
                # strict match to name: by its exact cookie.
                switch.delete(d.cookie, (1 << 64) - 1)
        if doomed:
            log.get("tenantnet.prewarm").info("prewarm.swept", bridge=bridge, rules=len(doomed))
        return {source_ident(rule.cookie) for rule in kept}, {destination_ident(rule.cookie) for rule in kept}


def _backed(rule: Rule, live: dict[int, list[_Live]]) -> bool:
    if rule.priority != PRIORITY or rule.output <= 0 or rule.vlan_vid != OFPVID_NONE:
        return False
    sources = [s for s in live.get(source_ident(rule.cookie), [])
               if (s.ofport, s.mac) == (rule.in_port, rule.eth_src)]
    targets = [d for d in live.get(destination_ident(rule.cookie), [])
               if (d.ofport, d.mac) == (rule.output, rule.eth_dst)]
    return any((s.network, s.vlan) == (d.network, d.vlan) for s in sources for d in targets)


def collect_garbage(node: NodeConfig, db_endpoint: str, network: str, bridges: set[str],
                    record_type: type[Plan]) -> int:
    """GC: `sweep` the network's bridges (every rule of ours there that no live attachment
    backs goes, whatever its network). Records of another mode read as plain plans here, so
    their rules on these bridges go too — `reconcile` writes them again. Returns how many
    attachments have rules left."""
    return sum(len(sweep(node, db_endpoint, bridge, lambda mode: record_type)[0])
               for bridge in sorted(b for b in bridges if b))
