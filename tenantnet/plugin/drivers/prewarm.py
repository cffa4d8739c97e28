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
16 bits are "tn" (0x746e), the next 16 a hash of the network, the low 32 a hash of the
attachment whose port the rule's packets come *in* on. Every delete names our cookie and a
mask, so it can only match our rules; every add is `check_overlap`, so a rule of anyone
else's at priority 1 with an overlapping match makes ours fail (state `conflict`) instead
of replacing it. All rules of one warm go in one OpenFlow bundle (all or none).

Peers on other nodes (cluster mode: the node config names an etcd): each pre-warming
attachment is published under `<etcdPrefix>prewarm/<network>/<node>/<container id>/<ifname>`
(its MAC and VLAN). There is no rule for those pairs — the path to another node is an uplink
that NORMAL learns, and which one it is only NORMAL knows — only the frames: each node sends
from its own pods to every remote peer of the same network and VLAN, at the pod's ADD and,
for peers that appear later, from the agent's heartbeat (`sync_remote`). Since every node
does the same for its own pods, both directions end up warm, and the frames teach the
bridges and the top-of-rack switch where each MAC is.

Ports are numbers in OpenFlow: a rule left behind after its port is deleted would send
traffic to whichever port reuses the number. So DEL removes the rules before the port, and
under a per-bridge lock marks the record `removing` first, so that a concurrent warm of a
peer never pairs with an attachment on its way out.
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
from tenantnet.plugin.records import PHASE_READY, AttachmentRecord, Plan, RecordStore
from tenantnet.plugin.system import dpctl, openflow, ovsdb, warmframes
from tenantnet.plugin.system.netns import NamespaceNotFound
from tenantnet.plugin.system.openflow import OFPVID_NONE, AddRule, DeleteStrict, Op, Rule

PRIORITY = 1
TN = 0x746E << 48
TN_MASK = 0xFFFF << 48
NETWORK_MASK = 0xFFFFFFFF << 32
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
# rules are ours all the same (cookie), go with DEL and GC as before, and `reconcile`
# rewrites them with the match.
LEGACY_VLAN: int | None = None

OFPORT_WAIT = 2.0   # vswitchd numbers a new port within milliseconds; a bound, not a pause
FLOW_WAIT = 0.5     # for the frames' upcalls to become datapath flows (ms here; a bound)
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


def network_bits(network: str) -> int:
    return int.from_bytes(hashlib.sha256(network.encode()).digest()[:2], "big") << 32


def cookie_of(network: str, container_id: str, ifname: str) -> int:
    low = int.from_bytes(hashlib.sha256(f"{network}/{container_id}/{ifname}".encode()).digest()[:4], "big")
    return TN | network_bits(network) | low


def network_cookie(network: str) -> tuple[int, int]:
    """(cookie, mask) selecting our rules of `network`."""
    return TN | network_bits(network), TN_MASK | NETWORK_MASK


@dataclass(frozen=True)
class End:
    """One attachment as a pre-warm pair sees it."""

    cookie: int
    port: str      # its OVS port
    ofport: int
    mac: str       # the pod interface's
    netns: str
    ifname: str    # in the pod
    ipv6: bool

    def rule(self, to: End) -> Rule:
        return Rule(self.cookie, PRIORITY, self.ofport, self.mac, to.mac, to.ofport, OFPVID_NONE)

    def ops(self, to: End) -> list[Op]:
        # The strict deletes first (a cookie of ours only), so a pair warmed twice (two ADDs
        # racing) ends with one rule, and `check_overlap` then only sees other people's. Two:
        # a strict delete needs the whole match, and a rule written before the VLAN_VID
        # match (LEGACY_VLAN) would otherwise overlap the new one and fail it as a conflict.
        return [DeleteStrict(self.cookie, PRIORITY, self.ofport, self.mac, to.mac, LEGACY_VLAN),
                DeleteStrict(self.cookie, PRIORITY, self.ofport, self.mac, to.mac, OFPVID_NONE),
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
    return End(cookie_of(record.network, record.container_id, record.ifname), port, state.ofport,
               pod[0], record.netns, record.ifname, pod[1])


LOCK_WAIT = 5.0  # a warm or unwarm holds the bridge for milliseconds; a stuck holder is not waited for


@contextmanager
def _bridge_lock(node: NodeConfig, bridge: str) -> Iterator[None]:
    """One warm or unwarm at a time per bridge (across the agent's threads and processes);
    OSError if another holds it for more than LOCK_WAIT seconds."""
    path = os.path.join(node.state_dir, f"prewarm-{hashlib.sha256(bridge.encode()).hexdigest()[:16]}.lock")
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
        yield
    finally:
        os.close(fd)


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
        with _bridge_lock(node, plan.bridge or ""):
            pairs = [(p, e) for p in peers(records_of(node, record), record, node.prewarm_max_peers)
                     if (e := _end(db, p, 0)) is not None]
            written, conflicts = _write(target, me, [e for _, e in pairs]) if pairs else ([], 0)
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
    its port. Runs before the port is deleted. Never fails the DEL: what it cannot remove
    now (OVS unreachable, the bridge gone) GC removes later, and a rule whose port is gone
    sends nowhere until then."""
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
    with _bridge_lock(node, plan.bridge or ""):
        if record.phase == PHASE_READY and plan.prewarm != REMOVING:
            try:
                records = records_of(node, record)
                if records.load(*record.key) is not None:
                    plan.prewarm = REMOVING
                    records.save(record, rewrite=True)
            except (OSError, ValueError):
                pass  # the rules go anyway; a peer warm meanwhile is undone by GC
        switch.delete(cookie_of(record.network, record.container_id, record.ifname), (1 << 64) - 1)
        if ofport is not None:
            # Only rules of ours that output to this very port: a MAC alone could be another
            # tenant's pod, given the same MAC by its NAD.
            switch.delete(TN, TN_MASK, out_port=ofport)


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
    """Re-warm attachments whose rules are gone while they still have peers here — what an
    ovs-vswitchd restart does (OpenFlow tables are not persistent) — and rewrite our rules
    written before the VLAN_VID match (`_upgrade`). The agent runs it periodically; it only
    ever adds our own rules. Returns how many attachments were re-warmed."""
    from tenantnet.plugin.drivers import ovsport

    records = RecordStore(node.state_dir, plan_type)
    mine = [r for r in records.list() if isinstance(r, AttachmentRecord) and r.phase == PHASE_READY
            and enabled(r.plan) and getattr(r.plan, "prewarm", "") in (WARM, RULES_ONLY, FAILED)]
    rewarmed = 0
    present: dict[tuple[str, str], set[int]] = {}
    for r in mine:
        plan = r.plan
        assert isinstance(plan, PortPlan)
        db = ovsport.ovsdb_for(node, plan.ovsdb)
        where = (db.endpoint, plan.bridge or "")
        if where not in present:
            try:
                switch = switch_for(openflow.mgmt_target(*where))
                ours = switch.rules(TN, TN_MASK)
                if any(_legacy(x) for x in ours):
                    _upgrade(node, switch, where[1])
                present[where] = {x.cookie for x in ours}
            except (openflow.OpenflowError, OSError):  # OSError: the bridge lock; next round retries
                continue
        if cookie_of(r.network, r.container_id, r.ifname) in present[where]:
            continue
        # Under the attachment's own lock, and only if it is still there and ready: a DEL
        # running meanwhile must not see its record written back or re-paired.
        with records.lock(r.container_id, r.ifname):
            now = records.load(*r.key)
            if now is None or now.phase != PHASE_READY or getattr(now.plan, "prewarm", "") == REMOVING:
                continue
            if warm(node, db, now):
                records.save(now, rewrite=True)
                rewarmed += 1
                present.pop(where, None)  # its warm wrote peers' rules too: read again
    return rewarmed


def _legacy(rule: Rule) -> bool:
    """A rule of pre-warm's shape (read back with our cookie) without the VLAN_VID match."""
    return rule.output > 0 and rule.vlan_vid is LEGACY_VLAN


def _upgrade(node: NodeConfig, switch: openflow.Switch, bridge: str) -> int:
    """Rewrite our legacy-shape rules on `bridge` with the VLAN_VID match, each in a bundle
    of its own (its strict delete, then the add). Read again under the bridge lock: a rule
    that a DEL removed after the caller's read must not come back. A rule whose new shape
    somebody else's rule has or overlaps stays as it was. Returns how many were rewritten."""
    done = 0
    with _bridge_lock(node, bridge):
        for old in [r for r in switch.rules(TN, TN_MASK) if _legacy(r)]:
            new = replace(old, vlan_vid=OFPVID_NONE)
            if _taken(switch, new):
                continue
            try:
                switch.bundle([DeleteStrict(old.cookie, old.priority, old.in_port, old.eth_src, old.eth_dst,
                                            LEGACY_VLAN), AddRule(new)])
                done += 1
            except openflow.OpenflowError as exc:
                if not exc.overlap:
                    raise
    if done:
        log.get("tenantnet.prewarm").info("prewarm.rules_upgraded", bridge=bridge, rules=done)
    return done


def collect_garbage(node: NodeConfig, db_endpoint: str, network: str, bridges: set[str],
                    record_type: type[Plan]) -> int:
    """GC: remove our rules of `network` on `bridges` that belong to no recorded attachment —
    by their cookie (the attachment they come in on) or their destination MAC (the one they
    send to). Returns how many went."""
    records = RecordStore(node.state_dir, lambda mode: record_type)
    removed = 0
    for bridge in sorted(b for b in bridges if b):
        switch = switch_for(openflow.mgmt_target(db_endpoint, bridge))
        with _bridge_lock(node, bridge):
            # Rules first, records second: a rule written after the listing belongs to a
            # record saved before it, which the listing below then sees.
            rules = switch.rules(*network_cookie(network))
            live, macs = set(), set()
            # Every record of the node, not only this network's: two networks' 16-bit hashes
            # may be equal, and neither's GC may take the other's rules for stale.
            for r in records.list():
                if isinstance(r, AttachmentRecord):
                    live.add(cookie_of(r.network, r.container_id, r.ifname))
                    pod = _pod_interface(r)
                    if pod is not None and getattr(r.plan, "prewarm", "") != REMOVING:
                        macs.add(pod[0])
            doomed = [r for r in rules if r.cookie not in live or r.eth_dst not in macs]
            if doomed:
                switch.bundle([DeleteStrict(r.cookie, r.priority, r.in_port, r.eth_src, r.eth_dst, r.vlan_vid)
                               for r in doomed])
                removed += len(doomed)
    return removed
