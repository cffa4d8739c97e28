"""Pre-warm on the lab OVS (root): datapath flows between pods exist before any traffic, our
OpenFlow rules go with DEL and GC, and rules of anyone else are never changed.

The lab's datapath is OVS's userspace one, so "the datapath flow" here is a flow of
dpif-netdev, shown by `dpctl/dump-flows` like a kernel one (docs/offload.md says what a NIC
with tc flower adds).
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipam.etcd import Etcd, EtcdConfig
from tenantnet.plugin import modes
from tenantnet.plugin import nodeconfig as config
from tenantnet.plugin.drivers import prewarm
from tenantnet.plugin.records import RecordStore
from tenantnet.plugin.system import dpctl, warmframes
from tests.integration.conftest import new_cid
from tests.integration.etcdsupport import EtcdServer, free_port
from tests.polling import poll
from tests.silentpeer import SilentEtcd

NET = "warm100"
PLUGIN_DIR = str(Path(sys.executable).parent)
FOREIGN = "0x1234"
UNTAGGED = "vlan_tci=0x0000/0x1fff"  # how ovs-ofctl shows OXM VLAN_VID = OFPVID_NONE


def ofctl(lab, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow14", *args[:1], f"unix:{lab.root}/{lab.bridge}.mgmt",
                           *args[1:]], capture_output=True, text=True, timeout=20, check=check)


def rules(lab, match: str = prewarm.OURS) -> list[str]:
    out = ofctl(lab, "dump-flows", match).stdout
    return [line.strip() for line in out.splitlines() if "cookie=" in line]


def dp_flows(lab) -> str:
    return dpctl.appctl(str(lab.root / "ovs-vswitchd.ctl"), "dpctl/dump-flows")


def no_ipv6(ns) -> None:
    # The pods' own IPv6 chatter (DAD, router solicitations) is not what this test is about.
    ns.run("sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", check=True)
    ns.run("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", check=True)


@pytest.fixture
def warm_conf(plugin, lab):
    return plugin.conf(name=NET, vlan=100, prewarm=True, ipam={
        "type": "host-local", "dataDir": str(lab.hostlocal_dir),
        "ranges": [[{"subnet": "10.91.0.0/24", "rangeStart": "10.91.0.10", "rangeEnd": "10.91.0.60"}]]})


def _add_pods(plugin, netns_factory, conf, names):
    pods = {}
    for name in names:
        ns, cid = netns_factory(), new_cid()
        no_ipv6(ns)
        inv = plugin.add(conf, ns, cid, cni_args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=warm;K8S_POD_NAME={name}")
        assert inv.code == 0, inv.stdout + inv.stderr
        mac = next(i["mac"] for i in inv.out["interfaces"] if i.get("sandbox"))
        pods[name] = {"ns": ns, "cid": cid, "mac": mac, "ip": inv.out["ips"][0]["address"].split("/")[0]}
    return pods


def _records(lab):
    node = config.load(str(lab.node_config))
    return {r.pod.name: r for r in RecordStore(node.state_dir, modes.plan_type).list(NET)}


def _pair_flow(text: str, src: str, dst: str) -> list[str]:
    return [line for line in text.splitlines()
            if f"eth(src={src},dst={dst})" in line and "eth_type(0x0800)" in line]


def test_flows_exist_before_traffic_and_go_with_del(lab, plugin, netns_factory, warm_conf, no_leftovers):
    pods = _add_pods(plugin, netns_factory, warm_conf, ["a", "b", "c"])
    recs = _records(lab)
    # The first pod had no peer when it was made; each later one paired with all before it.
    assert recs["a"].plan.prewarm == prewarm.NO_PEERS
    assert recs["b"].plan.prewarm == prewarm.WARM and recs["b"].plan.prewarm_rules == 2
    assert recs["c"].plan.prewarm == prewarm.WARM and recs["c"].plan.prewarm_rules == 4
    listed = subprocess.run([f"{PLUGIN_DIR}/tenantnetctl", "--node-config", str(lab.node_config), "ls", "--json",
                             "--network", NET], capture_output=True, text=True, check=True, timeout=30)
    assert sorted(r["prewarm"] for r in json.loads(listed.stdout)) == ["no-peers", "warm", "warm"]
    ours = rules(lab)
    assert len(ours) == 6, ours  # 3 pairs × 2 directions
    text = dp_flows(lab)
    for x, y in (("a", "b"), ("a", "c"), ("b", "c")):
        for src, dst in ((x, y), (y, x)):
            found = _pair_flow(text, pods[src]["mac"], pods[dst]["mac"])
            # Made by the warm frames, before any packet of the workload: none counted yet.
            assert found, f"no datapath flow {src}->{dst} before traffic:\n{text}"
            assert all("packets:0" in line for line in found), found
    # The workload's packets then hit exactly those rules.
    res = pods["a"]["ns"].run("ping", "-c", "2", "-i", "0.05", "-W", "1", pods["b"]["ip"])
    assert res.returncode == 0, res.stdout
    hit = [line for line in rules(lab) if f"dl_src={pods['a']['mac']},dl_dst={pods['b']['mac']}" in line]
    assert len(hit) == 1
    assert int(ofctl(lab, "dump-flows", f"cookie={hit[0].split(',')[0].split('=')[1]}/-1")
               .stdout.split("n_packets=")[1].split(",")[0]) >= 2

    # DEL of b: every rule into or out of b goes, the a<->c pair stays.
    assert plugin.call("DEL", warm_conf, pods["b"]["cid"], "", "net1").code == 0
    left = rules(lab)
    assert len(left) == 2 and not any(pods["b"]["mac"] in line for line in left), left
    for name in ("a", "c"):
        assert plugin.call("DEL", warm_conf, pods[name]["cid"], "", "net1").code == 0
    assert rules(lab) == []


def test_rules_of_others_are_never_replaced_or_removed(lab, plugin, netns_factory, warm_conf, no_leftovers):
    pods = _add_pods(plugin, netns_factory, warm_conf, ["a"])
    a = _records(lab)["a"]
    ofport = json.loads(lab.vsctl("--format=json", "--columns=ofport", "list", "Interface",
                                  a.plan.host_ifname))["data"][0][0]
    # Somebody else's rules: one at our priority overlapping what the next pod's pair needs
    # (from a's port to any destination), one elsewhere in the table.
    theirs = [f"cookie={FOREIGN},priority=1,in_port={ofport},actions=drop",
              f"cookie={FOREIGN},priority=500,dl_type=0x88cc,actions=drop"]
    for rule in theirs:
        ofctl(lab, "add-flow", rule)
    try:
        pods.update(_add_pods(plugin, netns_factory, warm_conf, ["b"]))
        b = _records(lab)["b"]
        assert b.plan.prewarm == prewarm.CONFLICT, b.plan.prewarm  # refused, not replaced
        assert rules(lab) == []  # all or nothing: the bundle wrote none of the pair
        foreign = rules(lab, f"cookie={FOREIGN}/-1")
        assert len(foreign) == 2, foreign
        # GC and DEL of ours remove nothing of theirs.
        gc = plugin.call("GC", {**warm_conf, "cni.dev/valid-attachments": [
            {"containerID": p["cid"], "ifname": "net1"} for p in pods.values()]}, "", "", "")
        assert gc.code == 0, gc.stdout
        for p in pods.values():
            assert plugin.call("DEL", warm_conf, p["cid"], "", "net1").code == 0
        assert len(rules(lab, f"cookie={FOREIGN}/-1")) == 2
    finally:
        ofctl(lab, "del-flows", f"cookie={FOREIGN}/-1")


def test_gc_removes_rules_of_attachments_that_are_gone(lab, plugin, netns_factory, warm_conf, no_leftovers):
    pods = _add_pods(plugin, netns_factory, warm_conf, ["a", "b"])
    assert len(rules(lab)) == 2
    # What a crash between a rule's write and its record's removal leaves: a rule of ours on
    # this network for an attachment with no record, and one sending to a MAC nobody has.
    ghost = prewarm.ident_of(NET, "f" * 64, "net1")
    ofctl(lab, "add-flow", f"cookie={ghost:#x},priority=1,in_port=9999,dl_src=02:00:00:00:00:01,"
                           f"dl_dst={pods['a']['mac']},actions=drop")
    live_cookie = prewarm.ident_of(NET, pods["a"]["cid"], "net1")
    ofctl(lab, "add-flow", f"cookie={live_cookie:#x},priority=1,in_port=9998,dl_src={pods['a']['mac']},"
                           "dl_dst=02:00:00:00:00:02,actions=drop")
    # The same in today's shape (no VLAN tag): GC's strict delete must name that match too.
    ofctl(lab, "add-flow", f"cookie={ghost:#x},priority=1,in_port=9997,{UNTAGGED},dl_src=02:00:00:00:00:01,"
                           f"dl_dst={pods['a']['mac']},actions=output:9996")
    assert len(rules(lab)) == 5
    gc = plugin.call("GC", {**warm_conf, "cni.dev/valid-attachments": [
        {"containerID": p["cid"], "ifname": "net1"} for p in pods.values()]}, "", "", "")
    assert gc.code == 0, gc.stdout
    left = rules(lab)
    assert len(left) == 2 and not any(p in r for r in left for p in ("9999", "9998", "9997")), left
    for p in pods.values():
        assert plugin.call("DEL", warm_conf, p["cid"], "", "net1").code == 0
    assert rules(lab) == []


def test_networks_without_prewarm_write_no_rules(lab, plugin, netns_factory, no_leftovers):
    conf = plugin.conf(name="cold100", vlan=100)
    pods = _add_pods(plugin, netns_factory, conf, ["a", "b"])
    assert rules(lab) == []
    for p in pods.values():
        assert plugin.call("DEL", conf, p["cid"], "", "net1").code == 0


def test_prewarm_is_refused_where_there_is_no_ovs(lab, plugin, netns_factory):
    conf = plugin.conf(name="nowarm", vlan=None, bridge=None, type="tenantnet", mode="sriov", prewarm=True,
                       deviceID="0000:00:00.0")
    inv = plugin.add(conf, netns_factory(), new_cid())
    assert inv.code != 0 and inv.out["code"] == 2  # an unsupported field value
    assert "prewarm" in inv.out["msg"]
    bad = plugin.conf(name=NET, prewarm="yes")
    inv = plugin.add(bad, netns_factory(), new_cid())
    assert inv.out["code"] == 7 and "prewarm" in inv.out["msg"] and "true or false" in inv.out["msg"]


def test_node_config_sets_the_datapath_idle_time(lab, plugin, netns_factory, warm_conf, tmp_path, no_leftovers):
    node = tmp_path / "node.yaml"
    node.write_text(lab.node_config.read_text() + "prewarmMaxIdleMs: 60000\n")
    plugin.extra_env["TENANTNET_CONFIG"] = str(node)
    try:
        pods = _add_pods(plugin, netns_factory, warm_conf, ["a", "b"])
        assert lab.vsctl("get", "Open_vSwitch", ".", "other_config:max-idle").strip() == '"60000"'
        for p in pods.values():
            assert plugin.call("DEL", warm_conf, p["cid"], "", "net1").code == 0
    finally:
        lab.vsctl("remove", "Open_vSwitch", ".", "other_config", "max-idle")
        del plugin.extra_env["TENANTNET_CONFIG"]


def test_peers_on_other_nodes_are_warmed_through_the_cluster_store(tmp_path):
    """The multi-node lab (a simulation: two OVS instances joined by a trunk top-of-rack
    switch, one etcd). Pod a on node1, pod b on node2, one pre-warming network: b's ADD sends
    b's frames to a; node1's heartbeat step (`sync_remote`, what its agent runs every few
    seconds) then sends a's to b. Both nodes' datapaths then hold both directions of the pair
    before any workload packet; DEL removes the published keys."""
    from ipam import cluster as ipam_cluster
    from ipam.etcd import EtcdConfig
    from tenantnet.lab import cluster

    meta = cluster.up(str(tmp_path / "cluster"), 2)
    made: list[tuple[dict, str, str]] = []
    conf = {"cniVersion": "1.0.0", "name": "warmrail", "type": "tenantnet", "bridge": "br-lab", "vlan": 100,
            "prewarm": True, "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28, "releaseAfter": 0},
                                      "ranges": [[{"subnet": "10.97.0.0/24"}]]}}

    def call(node, verb, ns, cid):
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TENANTNET_CONFIG": node["node_config"],
               "CNI_COMMAND": verb, "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{ns}" if verb == "ADD" else "",
               "CNI_IFNAME": "net1", "CNI_PATH": f"{PLUGIN_DIR}:/usr/lib/cni"}
        return subprocess.run([f"{PLUGIN_DIR}/tenantnet"], input=json.dumps(conf).encode(), env=env,
                              capture_output=True, timeout=60, check=False)

    try:
        node1, node2 = meta["nodes"]
        macs = {}
        for name, node in (("a", node1), ("b", node2)):
            ns, cid = f"tnpw{name}{new_cid()[:6]}", new_cid()
            subprocess.run(["ip", "netns", "add", ns], check=True)
            for key in ("default", "all"):
                subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"],
                               check=True)
            made.append((node, ns, cid))
            proc = call(node, "ADD", ns, cid)
            assert proc.returncode == 0, proc.stdout
            macs[name] = next(i["mac"] for i in json.loads(proc.stdout)["interfaces"] if i.get("sandbox"))
        n1 = config.load(node1["node_config"])
        recs = {r.network: r for r in RecordStore(n1.state_dir, modes.plan_type).list("warmrail")}
        assert recs["warmrail"].plan.prewarm == prewarm.NO_PEERS  # a came first, alone
        n2 = config.load(node2["node_config"])
        (b_rec,) = list(RecordStore(n2.state_dir, modes.plan_type).list("warmrail"))
        assert b_rec.plan.prewarm == prewarm.REMOTE_ONLY
        greeted = prewarm.sync_remote(n1, set(), modes.plan_type)
        assert len(greeted) == 1
        assert prewarm.sync_remote(n1, greeted, modes.plan_type) == greeted  # nothing new: nothing sent

        def flows(node) -> str:
            return dpctl.appctl(str(Path(node["root"]) / "ovs-vswitchd.ctl"), "dpctl/dump-flows")

        # The frames cross three userspace switches (node, top of rack, node), an upcall each:
        # milliseconds when the machine is idle, longer under load — so wait, within a bound.
        for node in (node1, node2):
            deadline = time.monotonic() + 5
            while True:
                text = flows(node)
                missing = [(s, d) for s, d in (("a", "b"), ("b", "a")) if not _pair_flow(text, macs[s], macs[d])]
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert not missing, f"{node['name']}: no flow {missing}:\n{text}"
        etcd = ipam_cluster.client(EtcdConfig(n1.etcd_endpoints))
        assert len(etcd.range(f"{n1.etcd_prefix}prewarm/warmrail/")) == 2
        for node, ns, cid in made:
            assert call(node, "DEL", ns, cid).returncode == 0
        assert etcd.range(f"{n1.etcd_prefix}prewarm/") == []
    finally:
        for _, ns, _ in made:
            subprocess.run(["ip", "netns", "delete", ns], check=False)
        cluster.down(str(tmp_path / "cluster"))


def test_rules_lost_with_the_switch_are_written_again(lab, plugin, netns_factory, warm_conf, no_leftovers):
    """What an ovs-vswitchd restart does to OpenFlow tables (they are not persistent),
    simulated by deleting our rules: the agent's periodic `reconcile` writes them again."""
    def bare() -> list[str]:  # the rules without their counters
        return sorted(re.sub(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]*, ", "", r) for r in rules(lab))

    pods = _add_pods(plugin, netns_factory, warm_conf, ["a", "b"])
    before = bare()
    assert len(before) == 2
    ofctl(lab, "del-flows", prewarm.OURS)
    assert rules(lab) == []
    node = config.load(str(lab.node_config))
    assert prewarm.reconcile(node, modes.plan_type) == 1  # b (warm) re-pairs with a
    assert bare() == before
    assert prewarm.reconcile(node, modes.plan_type) == 0  # nothing missing: nothing written
    for p in pods.values():
        assert plugin.call("DEL", warm_conf, p["cid"], "", "net1").code == 0


@pytest.mark.parametrize("vlan", ["", f"{UNTAGGED},"], ids=["no-vlan-match", "untagged-match"])
def test_a_rule_of_others_with_exactly_our_match_is_not_taken_over(lab, plugin, netns_factory, warm_conf,
                                                                   no_leftovers, vlan):
    """OpenFlow lets an ADD with an identical match and priority replace a rule (and its
    cookie) without an error; pre-warm looks first and leaves such a pair alone — with our
    match exactly ("no VLAN tag" too), or without the VLAN part (which overlaps ours)."""
    pods = _add_pods(plugin, netns_factory, warm_conf, ["a"])
    a = _records(lab)["a"]
    ofport = json.loads(lab.vsctl("--format=json", "--columns=ofport", "list", "Interface",
                                  a.plan.host_ifname))["data"][0][0]
    # The next pod's MAC is chosen by the NAD here, so the foreign rule can match it exactly.
    mac_b = "0a:58:0a:5b:00:99"
    ofctl(lab, "add-flow", f"cookie={FOREIGN},priority=1,in_port={ofport},{vlan}dl_src={pods['a']['mac']},"
                           f"dl_dst={mac_b},actions=drop")
    try:
        pods.update(_add_pods(plugin, netns_factory, {**warm_conf, "mac": mac_b}, ["b"]))
        assert _records(lab)["b"].plan.prewarm == prewarm.CONFLICT
        foreign = rules(lab, f"cookie={FOREIGN}/-1")
        assert len(foreign) == 1 and "actions=drop" in foreign[0], foreign
        assert rules(lab) == []
        for p in pods.values():
            assert plugin.call("DEL", warm_conf, p["cid"], "", "net1").code == 0
        assert len(rules(lab, f"cookie={FOREIGN}/-1")) == 1
    finally:
        ofctl(lab, "del-flows", f"cookie={FOREIGN}/-1")


def _rx_packets(ns) -> int:
    return int(ns.run("cat", "/sys/class/net/net1/statistics/rx_packets", check=True).stdout)


def _pair_rule(lab, src: dict, dst: dict) -> str:
    (line,) = [r for r in rules(lab) if f"dl_src={src['mac']},dl_dst={dst['mac']}" in r]
    return line


def _counted(line: str) -> int:
    return int(line.split("n_packets=")[1].split(",")[0])


def _tagged(src: dict, dst: dict, vid: int) -> bytes:
    """An IPv4 frame with an 802.1Q header (VLAN `vid`), as a pod could send on its access port."""
    untagged = warmframes.frame(src["mac"], dst["mac"], warmframes.ETH_P_IP)
    return untagged[:12] + struct.pack("!HH", 0x8100, vid) + untagged[12:]


def _forwarded(lab, pods, frame: bytes) -> int:
    """Send `frame` from pod a, then an untagged frame a->b as a marker; once the marker has
    reached b (and the a->b rule has counted it: it went by the pre-warm rule), how many of
    the two b received. b's counter is the veth's own, raised as OVS outputs to it; OVS
    credits a rule's counters from the datapath in batches, so those are only waited for."""
    a, b = pods["a"], pods["b"]
    rx, hits = _rx_packets(b["ns"]), _counted(_pair_rule(lab, a, b))
    warmframes.send(a["ns"].path, "net1", [frame, warmframes.frame(a["mac"], b["mac"], warmframes.ETH_P_IP)])
    assert poll(lambda: _rx_packets(b["ns"]) > rx, timeout=5), "the untagged marker frame did not reach b"
    assert poll(lambda: _counted(_pair_rule(lab, a, b)) > hits, timeout=5), \
        "the untagged marker frame was not forwarded by the pre-warm rule"
    # A frame that missed the datapath went by an upcall and may land after the marker
    # (which hit the flow the warm frames made); an upcall takes milliseconds, and the
    # marker's credit on the rule came after at least one revalidation round.
    time.sleep(0.2)
    return _rx_packets(b["ns"]) - rx


def test_tagged_frames_are_not_forwarded_by_the_prewarm_rules(lab, plugin, netns_factory, warm_conf,
                                                                no_leftovers):
    """A pod on an access port that sends a frame with an 802.1Q header: NORMAL drops it,
    so pre-warm's rule must not forward it (its match says "no VLAN tag"). Rules an older
    version wrote without that match do forward it (shown below, which is also what makes
    this test able to fail); the agent's `reconcile` replaces them, and DEL removes them."""
    pods = _add_pods(plugin, netns_factory, warm_conf, ["a", "b"])
    assert _records(lab)["b"].plan.prewarm == prewarm.WARM
    ours = rules(lab)
    assert len(ours) == 2 and all(UNTAGGED in r for r in ours), ours
    for vid in (100, 200):  # its own access VLAN's id, and another
        assert _forwarded(lab, pods, _tagged(pods["a"], pods["b"], vid)) == 1  # the marker only

    # The a->b rule as a version before the VLAN_VID match wrote it: same cookie, no VLAN match.
    line = _pair_rule(lab, pods["a"], pods["b"])
    cookie = line.split(",")[0].split("=")[1]
    match = re.search(r"priority=1,(in_port=\d+),vlan_tci=0x0000/0x1fff,(dl_src=\S+,dl_dst=\S+) "
                      r"actions=(output:\d+)", line)
    assert match, line
    in_port, macs, output = match.groups()
    ofctl(lab, "del-flows", "--strict", f"cookie={cookie}/-1,priority=1,{in_port},{UNTAGGED},{macs}")
    ofctl(lab, "add-flow", f"cookie={cookie},priority=1,{in_port},{macs},actions={output}")
    assert UNTAGGED not in _pair_rule(lab, pods["a"], pods["b"])
    assert _forwarded(lab, pods, _tagged(pods["a"], pods["b"], 200)) == 2  # the old shape forwards it

    node = config.load(str(lab.node_config))
    # The old shape is backed by nothing (sweep removes it), so a has no rule left and is
    # re-warmed: written anew, in today's shape.
    assert prewarm.reconcile(node, modes.plan_type) == 1
    upgraded = rules(lab)
    assert len(upgraded) == 2 and all(UNTAGGED in r for r in upgraded), upgraded
    assert cookie in _pair_rule(lab, pods["a"], pods["b"])  # still the pair's own cookie
    assert _forwarded(lab, pods, _tagged(pods["a"], pods["b"], 200)) == 1

    # DEL takes rules of the old shape too (by cookie and by output port).
    ofctl(lab, "del-flows", "--strict", f"cookie={cookie}/-1,priority=1,{in_port},{UNTAGGED},{macs}")
    ofctl(lab, "add-flow", f"cookie={cookie},priority=1,{in_port},{macs},actions={output}")
    assert plugin.call("DEL", warm_conf, pods["a"]["cid"], "", "net1").code == 0
    assert rules(lab) == []
    assert plugin.call("DEL", warm_conf, pods["b"]["cid"], "", "net1").code == 0


def _cluster_node_config(lab, path: Path, port: int) -> Path:
    path.write_text(lab.node_config.read_text() + f"etcdEndpoints: [http://127.0.0.1:{port}]\n"
                    f"nodeName: warm-node\netcdTimeout: {ETCD_TIMEOUT}\n")
    return path


# The node config's etcdTimeout at its largest: an ADD that waited for it would take 30 s,
# one that gives etcd prewarm.CLUSTER_WAIT takes ≈ 0.3 s plus that — told apart whatever else
# the machine is doing (the figures are printed; bounds on time belong to `make bench`).
ETCD_TIMEOUT = 30.0
ADD_BOUND = ETCD_TIMEOUT


def test_an_add_does_not_wait_for_an_etcd_that_does_not_answer(lab, plugin, netns_factory, warm_conf, tmp_path,
                                                             no_leftovers):
    """Cluster mode with etcd hung: a pre-warming ADD publishes and greets within a short
    bound of its own (prewarm.CLUSTER_WAIT), not the node's etcdTimeout, and nothing is
    lost — once etcd answers again, the heartbeat's `sync_remote` publishes what the ADDs
    could not, and removes a key that a DEL could not."""
    started = time.monotonic()  # for comparison: the same ADD without a cluster store
    alone = _add_pods(plugin, netns_factory, warm_conf, ["z"])["z"]
    print(f"\nADD without a cluster store: {(time.monotonic() - started) * 1000:.0f} ms")
    assert plugin.call("DEL", warm_conf, alone["cid"], "", "net1").code == 0
    silent = SilentEtcd()
    plugin.extra_env["TENANTNET_CONFIG"] = str(_cluster_node_config(lab, tmp_path / "node.yaml", silent.port))
    pods: dict = {}
    server = None
    try:
        times = []
        for name in ("a", "b"):  # alone, then with a local peer
            started = time.monotonic()
            pods.update(_add_pods(plugin, netns_factory, warm_conf, [name]))
            times.append(time.monotonic() - started)
        print(f"ADD with etcd not answering (etcdTimeout {ETCD_TIMEOUT:g} s): "
              + ", ".join(f"{t * 1000:.0f} ms" for t in times))
        assert silent.held, "the ADDs never tried the cluster store: this test shows nothing"
        recs = _records(lab)
        assert recs["a"].plan.prewarm == prewarm.NO_PEERS and recs["b"].plan.prewarm == prewarm.WARM
        assert max(times) < ADD_BOUND, f"an ADD waited for etcd: {times}"
        # A DEL too (its key's removal is the heartbeat's then: c's was never published).
        pods.update(_add_pods(plugin, netns_factory, warm_conf, ["c"]))
        gone = pods["c"]
        started = time.monotonic()
        assert plugin.call("DEL", warm_conf, gone["cid"], "", "net1").code == 0
        del pods["c"]
        took = time.monotonic() - started
        print(f"DEL with etcd not answering: {took * 1000:.0f} ms")
        assert took < ADD_BOUND, f"a DEL waited for etcd: {took}"
        # etcd comes back, on the same address: the heartbeat publishes a and b, and removes
        # a key of this node that no record backs (what a DEL leaves when it cannot reach etcd).
        silent.close()
        server = EtcdServer(tmp_path / "etcd")
        server.client_port, server.peer_port = silent.port, free_port()
        server.start()
        node = config.load(plugin.extra_env["TENANTNET_CONFIG"])
        etcd = Etcd(EtcdConfig((server.endpoint,)))
        etcd.put(f"{node.etcd_prefix}prewarm/{NET}/warm-node/{'f' * 64}/net1",
                 json.dumps({"mac": "0a:58:0a:00:00:99", "vlan": 100}).encode())
        assert prewarm.sync_remote(node, set(), modes.plan_type) == set()  # no peer on another node
        published = {kv.key: json.loads(kv.value) for kv in etcd.range(f"{node.etcd_prefix}prewarm/{NET}/")}
        assert published == {f"{node.etcd_prefix}prewarm/{NET}/warm-node/{p['cid']}/net1": {"mac": p["mac"], "vlan": 100}
                             for p in pods.values()}
        for name in list(pods):
            assert plugin.call("DEL", warm_conf, pods.pop(name)["cid"], "", "net1").code == 0
        assert etcd.range(f"{node.etcd_prefix}prewarm/") == []
    finally:
        for p in pods.values():  # a failure above: leave nothing behind for the next tests
            plugin.call("DEL", warm_conf, p["cid"], "", "net1")
        silent.close()
        if server is not None:
            server.remove()
        del plugin.extra_env["TENANTNET_CONFIG"]
