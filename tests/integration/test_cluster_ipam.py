"""Cluster mode of tenantnet-ipam on a real etcd: per-node blocks, no address twice across
nodes, no etcd round trip while a block has room, code 11 when a block is needed and etcd is
gone, DEL always local. (The first part of issue 14; the multi-node lab comes later.)"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni.env import parse_env
from cni.errors import CniError
from cni.netconf import parse_netconf
from ipam import cluster, plugin
from ipam import nodes as ipam_nodes
from ipam.cluster import ClusterNode
from ipam.config import ClusterSettings, Confinement, parse_ipam
from ipam.etcd import Etcd, EtcdConfig
from tests.integration.etcdsupport import EtcdServer

pytestmark = pytest.mark.root


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd").start()
    try:
        yield server
    finally:
        server.remove()


def conf(tmp: Path, node: str, subnet: str = "10.90.0.0/24", block: int = 28, **cluster: Any) -> Any:
    return parse_netconf({"cniVersion": "1.0.0", "name": "rail-0", "type": "tenantnet",
                          "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": subnet}]],
                                   "dataDir": str(tmp / node), "cluster": {"blockSize": block, **cluster}}})


def env(cid: str, command: str = "ADD", args: str = "") -> Any:
    return parse_env({"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "net1",
                      "CNI_NETNS": "/run/netns/x", "CNI_PATH": "/usr/lib/cni", "CNI_ARGS": args})


POOLS = (ipaddress.ip_network("10.0.0.0/8"),)  # the admin's cluster pools (clusterPools)


def node(name: str, server: EtcdServer, timeout: float = 2.0) -> ClusterNode:
    return ClusterNode(name, EtcdConfig((server.endpoint,), timeout=timeout), "/tn-test/", POOLS)


def first_block(name: str, subnet: str = "10.90.0.0/24", block: int = 28, taken: tuple[str, ...] = ()) -> str:
    """The block node `name` claims first in `subnet` (its search starts at a point seeded
    from its name), skipping `taken`."""
    rs = parse_ipam({"ranges": [[{"subnet": subnet}]], "cluster": {"blockSize": block}}).range_sets[0]
    return next(str(b) for b in cluster.blocks_from(rs, ClusterSettings(block_size=block), name)
                if str(b) not in taken)


def room_of(block: str, subnet: str = "10.90.0.0/24") -> list[str]:
    """The addresses of `block` a config of just `subnet` hands out (in order)."""
    net, sub = ipaddress.ip_network(block), ipaddress.ip_network(subnet)
    reserved = {sub.network_address, sub.network_address + 1, sub.broadcast_address}  # .1: the gateway
    return [str(a) for a in net if a not in reserved]


def add(tmp: Path, who: ClusterNode, cid: str, **kw: Any) -> str:
    limits = Confinement((str(tmp),), ())
    result = plugin.add(env(cid), conf(tmp, who.name, **kw), limits, who)
    return str(result.ips[0].address.ip)


def blocks_in_etcd(server: EtcdServer) -> dict[str, str]:
    kvs = Etcd(EtcdConfig((server.endpoint,))).range("/tn-test/ipam/rail-0/blocks/")
    return {kv.key.rsplit("/", 1)[1]: json.loads(kv.value)["node"] for kv in kvs}


def test_two_nodes_never_hand_out_one_address(tmp_path: Path, etcd: EtcdServer) -> None:
    nodes = [node("node-a", etcd), node("node-b", etcd)]
    got: dict[str, list[str]] = {n.name: [] for n in nodes}
    errors: list[BaseException] = []

    def run(who: ClusterNode, thread: int) -> None:
        try:
            for i in range(40):
                got[who.name].append(add(tmp_path, who, f"{who.name}-{thread}-{i}"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n, t)) for n in nodes for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    every = got["node-a"] + got["node-b"]
    assert len(every) == len(set(every)) == 160  # 2 nodes × 2 threads × 40, each address once
    owners = blocks_in_etcd(etcd)
    for name, addresses in got.items():
        for a in addresses:
            block = str(ipaddress.ip_network(f"{a}/28", strict=False)).replace("/", "_")
            assert owners[block] == name, (a, owners)
    # The node's own list matches what etcd says it owns.
    for n in nodes:
        ledger = cluster.Ledger(n, "rail-0", str(tmp_path / n.name), ClusterSettings(block_size=28))
        local = {str(b).replace("/", "_") for b in ledger.owned()}
        assert local == {b for b, o in owners.items() if o == n.name}


def unavailable_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The etcd calls that ran out their deadline (EtcdUnavailable), by path, from now on."""
    spent: list[str] = []
    real = Etcd.call

    def call(self: Etcd, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return real(self, path, body)
        except cluster.EtcdUnavailable:
            spent.append(path)
            raise

    monkeypatch.setattr(Etcd, "call", call)
    return spent


def test_room_in_a_block_needs_no_etcd_and_a_new_block_fails_fast(tmp_path: Path, etcd: EtcdServer,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    who = node("node-a", etcd, timeout=1.0)
    room = room_of(first_block("node-a"))
    first = add(tmp_path, who, "c0")  # claims a /28
    etcd.stop()
    more = [add(tmp_path, who, f"c{i}") for i in range(1, len(room))]  # the rest of the block, no etcd
    assert [first, *more] == room
    spent = unavailable_calls(monkeypatch)
    started = time.monotonic()
    with pytest.raises(CniError) as err:
        add(tmp_path, who, "c-next")
    assert err.value.code == 11 and "cluster store is unreachable" in err.value.msg
    # Promptly: after one etcd deadline (1 s), not one per block or per retry. Counted; the
    # clock only rules out a hang (15 s against the 1 s deadline, on any load).
    assert len(spent) == 1, spent
    assert time.monotonic() - started < 15, "a needed block with etcd down must fail promptly"
    # DEL is local: it works with etcd down, and the freed address is handed out again.
    plugin.delete(env("c3", "DEL"), conf(tmp_path, "node-a"), Confinement((str(tmp_path),), ()))
    assert add(tmp_path, who, "c-again") == more[2]


def test_many_adds_needing_a_block_with_etcd_silent_all_fail_fast(tmp_path: Path) -> None:
    """Claims of one network queue on the node's ledger lock; with etcd not answering (no
    quorum: connections accepted, requests never answered), the queued ones must not each
    spend a deadline of their own after the previous one's."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes the handshakes; nothing ever answers
    who = ClusterNode("node-a", EtcdConfig((f"http://127.0.0.1:{silent.getsockname()[1]}",), timeout=1.0),
                      "/tn-test/", POOLS)

    def one(i: int) -> tuple[int, float]:
        t0 = time.monotonic()
        try:
            add(tmp_path, who, f"c{i}")
        except CniError as err:
            return err.code, time.monotonic() - t0
        return 0, time.monotonic() - t0

    try:
        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(one, range(6)))
    finally:
        silent.close()
    assert [code for code, _ in got] == [11] * 6
    assert max(t for _, t in got) < 2.5, got  # one deadline (1 s) and the lock, not six


def test_a_pool_whose_blocks_all_belong_to_another_node_is_exhausted(tmp_path: Path, etcd: EtcdServer) -> None:
    add(tmp_path, node("node-a", etcd), "a0", subnet="10.91.0.0/28")
    with pytest.raises(CniError) as err:
        add(tmp_path, node("node-b", etcd), "b0", subnet="10.91.0.0/28")
    assert err.value.code == 110 and "every block belongs to a node" in err.value.msg  # POOL_EXHAUSTED


def test_a_crash_between_claim_and_memory_is_adopted(tmp_path: Path, etcd: EtcdServer) -> None:
    who = node("node-a", etcd)
    add(tmp_path, who, "a0")
    blocks = tmp_path / "node-a" / "cluster" / "rail-0.blocks"
    blocks.unlink()  # as if the process died after etcd committed the claim
    add(tmp_path, who, "a1")
    assert list(blocks_in_etcd(etcd).values()) == ["node-a"]  # the same block, adopted


def test_a_static_address_is_served_by_the_owner_of_its_block(tmp_path: Path, etcd: EtcdServer) -> None:
    limits = Confinement((str(tmp_path),), ())
    a, b = node("node-a", etcd), node("node-b", etcd)

    def static(who: ClusterNode, cid: str, address: str) -> str:
        result = plugin.add(env(cid, args=f"IgnoreUnknown=1;IP={address}"), conf(tmp_path, who.name), limits, who)
        return str(result.ips[0].address.ip)

    assert static(a, "s0", "10.90.0.37") == "10.90.0.37"  # claims 10.90.0.32/28 for node-a
    assert blocks_in_etcd(etcd) == {"10.90.0.32_28": "node-a"}
    with pytest.raises(CniError) as err:  # node-b may not serve an address of node-a's block
        static(b, "s1", "10.90.0.40")
    assert err.value.code == 111 and "node 'node-a' owns" in err.value.msg  # ADDRESS_UNAVAILABLE
    # node-a's dynamic allocations never give out its static address, and node-b's blocks
    # never include node-a's: every address once.
    got = {add(tmp_path, a, f"d{i}") for i in range(20)} | {add(tmp_path, b, f"e{i}") for i in range(20)}
    assert len(got) == 40 and "10.90.0.37" not in got


def test_a_missing_store_is_refused_clearly(tmp_path: Path, etcd: EtcdServer) -> None:
    limits = Confinement((str(tmp_path),), ())
    with pytest.raises(CniError) as err:
        plugin.add(env("s1"), conf(tmp_path, "node-a"), limits, None)
    assert err.value.code == 7 and "etcdEndpoints" in err.value.msg


def test_the_executable_reads_the_cluster_store_from_the_node_config(tmp_path: Path, etcd: EtcdServer) -> None:
    node_config = tmp_path / "tenantnet.yaml"
    node_config.write_text(f"stateDir: {tmp_path}/state\nlogFile: {tmp_path}/log/tn.log\nipamDataDirs: [{tmp_path}]\n"
                           "nodeName: node-x\n"
                           f"etcdEndpoints: [{etcd.endpoint}]\netcdPrefix: /tn-test/\nclusterPools: [10.92.0.0/16]\n"
                           f"agentSocket: {tmp_path}/nobody.sock\n")
    raw = {"cniVersion": "1.0.0", "name": "rail-0", "type": "tenantnet-ipam",
           "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.92.0.0/24"}]],
                    "dataDir": str(tmp_path / "x"), "cluster": {"blockSize": 27}}}
    ipam_exe = Path(sys.executable).parent / "tenantnet-ipam"
    proc = subprocess.run([str(ipam_exe)], input=json.dumps(raw).encode(), capture_output=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "TENANTNET_CONFIG": str(node_config),
                               "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "exe0", "CNI_IFNAME": "net1",
                               "CNI_NETNS": "/run/netns/x", "CNI_PATH": "/usr/lib/cni"})
    assert proc.returncode == 0, proc.stdout
    address = json.loads(proc.stdout)["ips"][0]["address"]
    block = first_block("node-x", "10.92.0.0/24", 27)
    assert ipaddress.ip_interface(address) in ipaddress.ip_network(block)
    assert blocks_in_etcd(etcd) == {block.replace("/", "_"): "node-x"}


def test_empty_blocks_go_back_to_the_pool_after_the_grace(tmp_path: Path, etcd: EtcdServer) -> None:
    limits = Confinement((str(tmp_path),), ())
    a, b = node("node-a", etcd), node("node-b", etcd)
    small = {"subnet": "10.93.0.0/28"}  # one /28 block: whoever holds it holds the pool

    def delete(who: ClusterNode, cid: str, **cluster: Any) -> None:
        c = conf(tmp_path, who.name, subnet=small["subnet"], block=28)
        c.ipam["cluster"].update(cluster)
        plugin.delete(env(cid, "DEL"), c, limits, who)

    add(tmp_path, a, "a0", subnet=small["subnet"])
    delete(a, "a0", releaseAfter=60)  # empty now: returned only after 60 s
    assert blocks_in_etcd(etcd) == {"10.93.0.0_28": "node-a"}
    with pytest.raises(CniError):
        add(tmp_path, b, "b0", subnet=small["subnet"])
    add(tmp_path, a, "a1", subnet=small["subnet"])
    delete(a, "a1", releaseAfter=0)  # no grace: back to the pool at once
    assert blocks_in_etcd(etcd) == {}
    assert (tmp_path / "node-a" / "cluster" / "rail-0.blocks").read_text() == ""
    assert add(tmp_path, b, "b0", subnet=small["subnet"]) == "10.93.0.2"  # node-b has it now (.1: the gateway)
    assert blocks_in_etcd(etcd) == {"10.93.0.0_28": "node-b"}
    # A DEL with etcd gone still succeeds (the block stays until a later DEL or GC).
    etcd.stop()
    delete(b, "b0", releaseAfter=0)


def ctl(node_config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tenantnet.ops.ctl", "--node-config", str(node_config), *args],
                          capture_output=True, text=True, timeout=60)


def cluster_node_config(tmp: Path, server: EtcdServer, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    (tmp / name / "log").mkdir(parents=True, exist_ok=True)
    path.write_text(f"stateDir: {tmp}/{name}/state\nlogFile: {tmp}/{name}/log/tn.log\nipamDataDirs: [{tmp}]\n"
                    f"nodeName: {name}\nnodeAddress: 192.0.2.7\netcdEndpoints: [{server.endpoint}]\n"
                    f"etcdPrefix: /tn-test/\nagentSocket: {tmp}/{name}/sock/agent.sock\nclusterPools: [10.0.0.0/8]\n")
    return path


def test_a_plain_release_node_needs_the_nodes_own_leave(tmp_path: Path, etcd: EtcdServer) -> None:
    """A lapsed lease does not prove a node dead (issue 26, defect 4): a plain release-node
    is refused until the node itself declared it is leaving (`ipam leave`, which first stops
    it allocating and claiming); --force for a node known to be gone, with the risk named."""
    who = node("node-a", etcd)
    add(tmp_path, who, "a0")
    live = ipam_nodes.Liveness(who, "192.0.2.7", ttl=30)
    live.beat()
    live.beat()  # a refresh keeps the same lease
    config = cluster_node_config(tmp_path, etcd, "ops")
    shown = json.loads(ctl(config, "cluster", "nodes", "--json").stdout)
    assert shown == [{"name": "node-a", "alive": True, "address": "192.0.2.7", "blocks": 1,
                      "networks": ["rail-0"]}]
    refused = ctl(config, "ipam", "release-node", "node-a")
    assert refused.returncode == 1 and "has not declared it is leaving" in refused.stderr, refused.stderr
    assert "renews its lease" in refused.stderr and "--force" in refused.stderr and blocks_in_etcd(etcd)
    live.stop()  # the lease gone (an agent stopped, or a node cut off for 15 s): still refused
    assert json.loads(ctl(config, "ipam", "nodes", "--json").stdout)[0]["alive"] is False
    refused = ctl(config, "ipam", "release-node", "node-a")
    assert refused.returncode == 1 and "only cut off" in refused.stderr, refused.stderr
    assert "the same addresses the blocks' next owner gives out" in refused.stderr and blocks_in_etcd(etcd)
    # The node leaves: it allocates from its blocks no more, and claims none.
    own = cluster_node_config(tmp_path, etcd, "node-a")
    own.write_text(own.read_text() + f"ipamDataDir: {tmp_path}/node-a\n")
    left = ctl(own, "ipam", "leave")
    block = first_block("node-a")
    assert left.returncode == 0 and f"stopped allocating from block {block} of network rail-0" in left.stdout
    with pytest.raises(CniError) as err:
        add(tmp_path, who, "a1")
    assert err.value.code == 11 and "declared it is leaving" in err.value.msg
    released = ctl(config, "ipam", "release-node", "node-a")
    assert released.returncode == 0 and f"released block {block} of network rail-0" in released.stdout
    assert blocks_in_etcd(etcd) == {} and not Etcd(EtcdConfig((etcd.endpoint,))).range("/tn-test/leaving/")
    # --force for a node whose lease is still alive (known to be gone for good)
    add(tmp_path, node("node-b", etcd), "b0")
    ipam_nodes.Liveness(node("node-b", etcd), ttl=30).beat()
    assert ctl(config, "ipam", "release-node", "node-b", "--force").returncode == 0
    assert blocks_in_etcd(etcd) == {}
    # A node that owns no block needs neither.
    assert ctl(config, "ipam", "release-node", "node-c").returncode == 0


def test_a_node_whose_block_was_taken_stops_allocating_from_it(tmp_path: Path, etcd: EtcdServer,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The node side of defect 4: node-a's only block is released with --force while node-a
    is cut off, node-b claims it. When node-a runs ADDs again without a recent verification
    (no agent, or cut off longer than its lease) it asks etcd first: cut off, code 11; back,
    it finds the block gone, revokes it, and never hands out an address of node-b's block."""
    small = "10.93.0.0/28"  # one block: whoever holds it holds the pool
    a, b = node("node-a", etcd), node("node-b", etcd)
    given = add(tmp_path, a, "a0", subnet=small)
    assert ipam_nodes.release_node(client_of(etcd), "/tn-test/", "node-a", force=True) == [("rail-0", small)]
    taken_by_b = [add(tmp_path, b, f"b{i}", subnet=small) for i in range(3)]
    assert given in taken_by_b  # the same address: node-a must not give out any of these now
    monkeypatch.setattr(cluster, "VERIFY_FRESH", 0.0)  # node-a's last verification is too old
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))  # nothing listens: refused at once
    try:
        cut_off = ClusterNode("node-a", EtcdConfig((f"http://127.0.0.1:{hole.getsockname()[1]}",), timeout=0.3),
                              "/tn-test/", POOLS)
        with pytest.raises(CniError) as err:
            add(tmp_path, cut_off, "a1", subnet=small)
        assert err.value.code == 11 and "has not verified" in err.value.msg, err.value.msg
    finally:
        hole.close()
    with pytest.raises(CniError) as err:
        add(tmp_path, a, "a2", subnet=small)  # back: the block is node-b's now
    assert err.value.code == 110, err.value.msg
    blocks = tmp_path / "node-a" / "cluster"
    assert (blocks / "rail-0.blocks").read_text() == ""
    assert (blocks / "rail-0.revoked").read_text().split()[0] == small.replace("/", "_")
    store = plugin.open_store(str(tmp_path / "node-a"), create=False)
    assert store is not None and [x.container_id for x in store.allocations("rail-0")] == ["a0"]  # kept


def test_a_healthy_heartbeat_keeps_adds_off_etcd_and_revokes_lost_blocks(tmp_path: Path, etcd: EtcdServer,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's heartbeat verifies the node's blocks each beat: with a fresh verification an
    ADD with room makes no etcd call (etcd may be down); a block found gone is revoked and
    the operator told (cluster.blocks_revoked)."""
    from tenantnet.entry.heartbeat import Heartbeat
    from tenantnet.plugin import nodeconfig

    class Log:
        def __init__(self) -> None:
            self.events: list[tuple[str, dict[str, Any]]] = []

        def warning(self, event: str, **kw: Any) -> None:
            self.events.append((event, kw))

        info = warning

    monkeypatch.setattr(cluster, "data_dirs_seen", set())  # only this test's stores (all node-a's)
    config = cluster_node_config(tmp_path, etcd, "node-a")
    config.write_text(config.read_text() + f"ipamDataDir: {tmp_path}/node-a\n")
    log = Log()
    beat = Heartbeat(nodeconfig.load(str(config)), log)
    a = node("node-a", etcd)
    add(tmp_path, a, "a0")
    block = first_block("node-a")
    beat._verify_blocks()
    assert log.events == []
    ipam_nodes.release_node(client_of(etcd), "/tn-test/", "node-a", force=True)
    beat._verify_blocks()
    assert [(e, kw["network"], kw["blocks"]) for e, kw in log.events] == [("cluster.blocks_revoked", "rail-0",
                                                                           [block])]
    add(tmp_path, a, "a1")  # a new block
    beat._verify_blocks()
    etcd.stop()
    assert add(tmp_path, a, "a2")  # room, a fresh verification: no etcd call


def client_of(server: EtcdServer) -> Etcd:
    return Etcd(EtcdConfig((server.endpoint,)))


def test_the_agent_keeps_its_node_registered(tmp_path: Path, etcd: EtcdServer) -> None:
    from tests.integration.test_agent import start_agent
    from tests.polling import poll

    config = cluster_node_config(tmp_path, etcd, "node-agent")
    agent = start_agent(config)
    try:
        etcd_client = Etcd(EtcdConfig((etcd.endpoint,)))
        assert poll(lambda: bool(ipam_nodes.alive_nodes(etcd_client, "/tn-test/")), timeout=10)
        assert ipam_nodes.alive_nodes(etcd_client, "/tn-test/")["node-agent"]["address"] == "192.0.2.7"
        # Its allocations are published for operators on other nodes (`ipam ls --cluster`).
        from ipam import holdings

        plugin.add(env("pub0"), conf(tmp_path, "", block=28), Confinement((str(tmp_path),), ()),
                   node("node-agent", etcd))
        assert poll(lambda: [h.node for h in holdings.published(etcd_client, "/tn-test/")] == ["node-agent"],
                    timeout=12)
    finally:
        agent.stop()
    assert ipam_nodes.alive_nodes(etcd_client, "/tn-test/") == {}  # revoked on an orderly stop


def test_the_next_block_is_claimed_ahead_of_need(tmp_path: Path, etcd: EtcdServer) -> None:
    """With a background runner (the agent's), an ADD in the last quarter of the node's top
    block claims the next block beside it; the ADD that then needs it makes no etcd call."""
    ran: list[threading.Thread] = []

    def background(work: Any) -> None:
        t = threading.Thread(target=work)
        ran.append(t)
        t.start()

    cluster.set_background(background)
    try:
        who = node("node-a", etcd)
        block = ipaddress.ip_network(first_block("node-a"))
        room = room_of(str(block))
        low = next(i for i, a in enumerate(room) if int(ipaddress.ip_address(a)) - int(block.network_address) >= 12)
        first = [add(tmp_path, who, f"c{i}") for i in range(low)]  # up to offset 11 of the /28
        assert not ran and len(blocks_in_etcd(etcd)) == 1
        first.append(add(tmp_path, who, "c-low"))  # offset 12 of 16: the last quarter
        for t in ran:
            t.join(10)
        assert len(ran) == 1 and len(blocks_in_etcd(etcd)) == 2
        etcd.stop()  # the blocks in hand now carry the next ADDs without etcd
        more = [add(tmp_path, who, f"d{i}") for i in range(8)]
        assert len(set(first + more)) == len(first) + 8
    finally:
        cluster.set_background(None)


def test_a_three_member_etcd_losing_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One member killed mid-burst: no ADD fails. Two killed (no quorum): ADDs with room in
    the node's blocks succeed, the others get code 11 promptly. After recovery: everything
    converges, each address once."""
    from tests.integration.etcdsupport import EtcdCluster
    from tests.polling import poll

    members = EtcdCluster(tmp_path / "etcd").start()
    try:
        who = ClusterNode("node-a", EtcdConfig(members.endpoints), "/tn-test/", POOLS)  # the default deadline
        other = ClusterNode("node-b", EtcdConfig(members.endpoints), "/tn-test/", POOLS)
        got = [add(tmp_path, who, f"a{i}") for i in range(20)]
        members.members[0].stop()  # mid-burst: the client moves to the next member
        got += [add(tmp_path, who, f"a{i}") for i in range(20, 60)]
        got += [add(tmp_path, other, f"b{i}") for i in range(30)]
        members.members[1].stop()  # no quorum left
        # What node-a's blocks have left after its 60 addresses (no claim without quorum).
        owned = cluster.Ledger(who, "rail-0", str(tmp_path / "node-a"), ClusterSettings(block_size=28)).owned()
        left = sum(len(room_of(str(b))) for b in owned) - 60
        room = [add(tmp_path, who, f"q{i}") for i in range(left)]
        spent = unavailable_calls(monkeypatch)
        started = time.monotonic()
        with pytest.raises(CniError) as err:
            add(tmp_path, who, "q-next")
        # Within the deadline: one etcd call ran out its 5 s, not one per block or retry
        # (counted); the clock only rules out a hang (30 s against 5 s, on any load).
        assert err.value.code == 11 and len(spent) == 1, spent
        assert time.monotonic() - started < 30, "no quorum must fail within the deadline"
        monkeypatch.undo()
        got += room
        for m in members.members[:2]:
            m.start(wait=False)
        for m in members.members:
            assert poll(m._healthy, timeout=20), f"member {m.name} did not recover"
        got += [add(tmp_path, who, f"r{i}") for i in range(30)]
        assert len(got) == len(set(got))
        owners = blocks_in_etcd_at(members.endpoints)
        for a in got:
            assert ipaddress.ip_address(a) in ipaddress.ip_network("10.90.0.0/24")
        assert set(owners.values()) == {"node-a", "node-b"}
    finally:
        members.remove()


def blocks_in_etcd_at(endpoints: tuple[str, ...]) -> dict[str, str]:
    kvs = Etcd(EtcdConfig(endpoints)).range("/tn-test/ipam/rail-0/blocks/")
    return {kv.key.rsplit("/", 1)[1]: json.loads(kv.value)["node"] for kv in kvs}


def test_tls_to_etcd_with_a_client_certificate(tmp_path: Path) -> None:
    from tests.integration.etcdsupport import make_test_ca

    tls = make_test_ca(tmp_path / "ca")
    server = EtcdServer(tmp_path / "etcd")
    server.tls = tls
    server.start()
    try:
        good = EtcdConfig((server.endpoint,), str(tls["ca"]), str(tls["client_cert"]), str(tls["client_key"]))
        who = ClusterNode("node-a", good, "/tn-test/", POOLS)
        assert add(tmp_path, who, "t0") == room_of(first_block("node-a"))[0]
        # Without a client certificate, or trusting another CA: a clear error, code 11, no hang.
        other = make_test_ca(tmp_path / "other-ca")
        for i, (config, needle) in enumerate((
                (EtcdConfig((server.endpoint,), str(tls["ca"]), timeout=1.0), "set etcdCertFile/etcdKeyFile"),
                               (EtcdConfig((server.endpoint,), str(other["ca"]), str(tls["client_cert"]),
                                           str(tls["client_key"]), timeout=1.0), "CERTIFICATE_VERIFY_FAILED"))):
            with pytest.raises(CniError) as err:
                add(tmp_path / f"refused{i}", ClusterNode("node-x", config, "/tn-test/", POOLS), "t1")
            assert err.value.code == 11 and needle in err.value.msg, err.value.msg
    finally:
        server.remove()


def test_many_nodes_at_once_then_all_released(tmp_path: Path, etcd: EtcdServer) -> None:
    """4 nodes × 32 ADDs, 8 at a time per node, on one NAD: no duplicate, no failure; then
    every DEL (releaseAfter 0): no address and no block left."""
    from concurrent.futures import ThreadPoolExecutor

    limits = Confinement((str(tmp_path),), ())
    nodes = [node(f"node-{n}", etcd) for n in range(4)]

    def c(who: ClusterNode) -> Any:
        return conf(tmp_path, who.name, subnet="10.94.0.0/22", block=27, releaseAfter=0)

    pools = [ThreadPoolExecutor(8) for _ in nodes]
    try:
        adds = [(pools[n].submit(plugin.add, env(f"{who.name}-{i}"), c(who), limits, who))
                for i in range(32) for n, who in enumerate(nodes)]
        got = [str(f.result().ips[0].address.ip) for f in adds]
        assert len(got) == len(set(got)) == 128
        owners = blocks_in_etcd(etcd)
        assert set(owners.values()) == {n.name for n in nodes}
        dels = [pools[n].submit(plugin.delete, env(f"{who.name}-{i}", "DEL"), c(who), limits, who)
                for i in range(32) for n, who in enumerate(nodes)]
        for f in dels:
            f.result()
    finally:
        for pool in pools:
            pool.shutdown()
    assert blocks_in_etcd(etcd) == {}
    for who in nodes:
        store = plugin.open_store(str(tmp_path / who.name), create=False)
        assert store is not None and store.allocations("rail-0") == []
