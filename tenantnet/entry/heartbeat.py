"""The agent's part in cluster mode. Its heartbeat: while the agent runs, its node is registered
(name, underlay address) under a lease renewed every third of its TTL (`ipam.nodes.Liveness`),
and its cluster allocations are published for operators on other nodes, its pending release
requests carried out (`ipam.holdings.Publisher`).
An operator can then see the cluster (`tenantnetctl cluster nodes`). A node that is alive —
or only cut off — never has its address blocks taken over without `--force` (a plain
`ipam release-node` needs the node's own `ipam leave`), and each beat first verifies that
etcd still names this node as the owner of every block it allocates from: a block found
gone (released with `--force`, another node's now) is revoked locally, so no ADD allocates
from it again, and the operator is told (`cluster.blocks_revoked`). That read is sent
before the lease is renewed, so an ADD trusts it (ipam.cluster.VERIFY_FRESH) no longer than
etcd keeps the node registered; past that an ADD verifies with etcd itself. The heartbeat
also gives tenantnet-ipam a background runner, so that the next block is claimed ahead of need.

Each beat also keeps pre-warm's part of the store right (drivers/prewarm.py, `sync_remote`):
a pod's ADD and DEL give etcd a short bound only (prewarm.CLUSTER_WAIT), so what they could
not publish or remove while etcd was away is done here, at the first beat that reaches it.
"""

from __future__ import annotations

import threading
from typing import Any


class PrewarmKeeper:
    """At start and every `interval` seconds: remove the pre-warm rules that no longer send
    to their attachment's live port (a process killed between writing rules and checking
    its peers), and re-warm attachments whose rules are gone (an ovs-vswitchd restart
    empties its OpenFlow tables): tenantnet/plugin/drivers/prewarm.py, `reconcile`. A round
    reads the records and, on each bridge pre-warm has written to, its rules of ours and
    the port numbers of its pre-warming attachments."""

    def __init__(self, node_config: Any, log: Any, interval: float = 30.0) -> None:
        self.node_config = node_config
        self.log = log
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tenantnet-prewarm-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from tenantnet.plugin import modes
        from tenantnet.plugin.drivers import prewarm

        while True:
            try:
                rewarmed = prewarm.reconcile(self.node_config, modes.plan_type)
                if rewarmed:
                    self.log.info("prewarm.rewarmed", attachments=rewarmed)
            except Exception as exc:  # OVS or the state dir unreadable: next round retries
                self.log.warning("prewarm.reconcile_failed", error=f"{type(exc).__name__}: {exc}")
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class Heartbeat:
    def __init__(self, node_config: Any, log: Any) -> None:
        from ipam.nodes import NODE_TTL, Liveness
        from tenantnet.plugin import ipam_client

        cluster_node = ipam_client.cluster_node(node_config)
        self.liveness = Liveness(cluster_node, node_config.node_address) if cluster_node else None
        self.publisher: Any = None
        self.cluster_node = cluster_node
        self.data_dirs: Any = list
        if cluster_node is not None:
            from ipam import cluster, holdings, plugin

            fixed = (node_config.ipam_data_dir, *node_config.ipam_data_dirs)
            # The stores of the node config, and every store this agent has served a cluster
            # network from: their blocks are verified, their allocations shown to operators.
            self.data_dirs = lambda: list(dict.fromkeys([*fixed, *sorted(cluster.data_dirs_seen)]))
            self.publisher = holdings.Publisher(cluster_node, self.data_dirs,
                                                lambda d: plugin.open_store(d, create=False))
        self.interval = NODE_TTL / 3
        self.log = log
        self.node_config = node_config
        self._greeted: set[str] = set()  # remote pre-warm peers this node's pods have greeted
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.liveness is None:
            return  # no cluster store in the node config
        from ipam import cluster

        # Claims of the next address block ahead of need run beside the requests, never in them.
        cluster.set_background(lambda work: threading.Thread(target=work, name="tenantnet-block-claim",
                                                             daemon=True).start())
        self._thread = threading.Thread(target=self._run, name="tenantnet-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ipam.etcd import EtcdError, EtcdUnavailable

        assert self.liveness is not None
        failing = False
        while not self._stop.is_set():
            try:
                self._verify_blocks()  # before the lease is renewed (see the module's docstring)
                self.liveness.beat()
                self.publisher.beat()
                self._sync_prewarm()
                if failing:
                    self.log.info("cluster.heartbeat_restored", node=self.liveness.node.name)
                failing = False
            except (EtcdUnavailable, EtcdError) as exc:
                if not failing:  # once per outage, not every beat
                    self.log.warning("cluster.heartbeat_failed", node=self.liveness.node.name, error=str(exc))
                failing = True
            self._stop.wait(self.interval)

    def _verify_blocks(self) -> None:
        """Every cluster network's blocks in every store: still this node's in etcd?"""
        from ipam import cluster, holdings
        from ipam.config import ClusterSettings

        for data_dir in self.data_dirs():
            for network in holdings.cluster_networks(data_dir):
                try:
                    gone = cluster.Ledger(self.cluster_node, network, data_dir, ClusterSettings()).verify()
                except OSError as exc:  # this store's files: the others, and the lease, still count
                    self.log.warning("cluster.verify_failed", network=network, data_dir=data_dir,
                                     error=str(exc))
                    continue
                if gone:
                    self.log.warning("cluster.blocks_revoked", node=self.cluster_node.name, network=network,
                                     data_dir=data_dir, blocks=[str(b) for b in gone],
                                     reason="etcd no longer names this node as their owner (released with "
                                            "ipam release-node --force, or claimed by another node): no ADD "
                                            "allocates from them again; addresses already given stay until "
                                            "their DEL")

    def _sync_prewarm(self) -> None:
        """Pre-warm towards peers on other nodes that appeared since the last beat, and
        publish or remove this node's keys that an ADD or DEL could not
        (tenantnet/plugin/drivers/prewarm.py, "Peers on other nodes")."""
        from tenantnet.plugin import modes
        from tenantnet.plugin.drivers import prewarm

        try:
            self._greeted = prewarm.sync_remote(self.node_config, self._greeted, modes.plan_type)
        except Exception as exc:  # never the liveness beat's problem: the next beat retries
            self.log.warning("prewarm.sync_failed", error=f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.liveness is not None:
            self.liveness.stop()
