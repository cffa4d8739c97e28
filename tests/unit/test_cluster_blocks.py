"""Cluster mode pieces that need no etcd: block carving, ranges cut to owned blocks, the
`ipam.cluster` and node-config fields."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from cni.errors import CniError
from ipam.cluster import blocks_of, restrict
from ipam.config import ClusterSettings, parse_ipam
from ipam.etcd import prefix_end
from tenantnet.plugin import ipam_client, nodeconfig


def ipam(subnet: str, **cluster: object) -> dict[str, object]:
    return {"type": "tenantnet-ipam", "ranges": [[{"subnet": subnet}]], "dataDir": "/x", "cluster": cluster}


def test_blocks_are_carved_lazily_in_address_order() -> None:
    cfg = parse_ipam(ipam("10.1.0.0/24", blockSize=26))
    assert cfg.cluster == ClusterSettings(26, 122, 300.0)
    assert [str(b) for b in blocks_of(cfg.range_sets[0], cfg.cluster)] == \
        ["10.1.0.0/26", "10.1.0.64/26", "10.1.0.128/26", "10.1.0.192/26"]
    # A subnet smaller than a block is one block; an IPv6 /64 is never enumerated whole.
    small = parse_ipam(ipam("10.2.0.0/29"))
    assert [str(b) for b in blocks_of(small.range_sets[0], ClusterSettings())] == ["10.2.0.0/29"]
    v6 = parse_ipam(ipam("fd00::/64"))
    first = next(iter(blocks_of(v6.range_sets[0], ClusterSettings())))
    assert str(first) == "fd00::/122"


def test_ranges_are_cut_to_the_blocks_this_node_owns() -> None:
    cfg = parse_ipam({"type": "tenantnet-ipam", "dataDir": "/x", "cluster": {"blockSize": 26},
                      "ranges": [[{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "gateway": "10.1.0.1"}]]})
    mine = restrict(cfg, [ipaddress.ip_network("10.1.0.0/26"), ipaddress.ip_network("10.1.0.192/26")])
    (rs,) = mine.range_sets
    assert [r.describe() for r in rs.ranges] == ["10.1.0.0/24 (10.1.0.10-10.1.0.63)",
                                                 "10.1.0.0/24 (10.1.0.192-10.1.0.254)"]
    assert all(str(r.gateway) == "10.1.0.1" for r in rs.ranges)
    assert restrict(cfg, []).range_sets[0].ranges == ()


@pytest.mark.parametrize("cluster,needle", [
    ({"blockSize": 8}, "ipam.cluster.blockSize=8"), ({"blockSize": "26"}, "ipam.cluster.blockSize"),
    ({"blockSizeV6": 130}, "ipam.cluster.blockSizeV6"), ({"size": 26}, "ipam.cluster.size"),
    ({"allowOverlap": "yes"}, "ipam.cluster.allowOverlap='yes'"),
])
def test_bad_cluster_settings_are_named(cluster: dict[str, object], needle: str) -> None:
    with pytest.raises(CniError) as err:
        parse_ipam(ipam("10.1.0.0/24", **cluster))
    assert err.value.code == 7 and needle in err.value.msg


def test_prefix_end_covers_exactly_the_prefix() -> None:
    assert prefix_end("/tenantnet/ipam/") == b"/tenantnet/ipam0"
    assert prefix_end("a\xff") == b"a\xc3\xc0"  # the bytes of the key, not its characters


@pytest.mark.parametrize("text,needle", [
    ("etcdEndpoints: []\n", "etcdEndpoints"), ("etcdEndpoints: [127.0.0.1:2379]\n", "etcdEndpoints"),
    ("nodeName: Node_1\n", "nodeName"), ("etcdPrefix: tenantnet\n", "etcdPrefix"),
    ("etcdTimeout: 0\n", "etcdTimeout"), ("etcdCaFile: ca.pem\n", "etcdCaFile"),
])
def test_bad_cluster_store_settings_in_the_node_config(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "n.yaml"
    path.write_text(text)
    with pytest.raises(CniError) as err:
        nodeconfig.load(str(path))
    assert err.value.code == 7 and needle in err.value.msg


def test_the_node_config_gives_the_cluster_node(tmp_path: Path) -> None:
    path = tmp_path / "n.yaml"
    path.write_text("nodeName: worker-3\netcdEndpoints: [https://10.0.0.5:2379, 'http://[::1]:2379']\n"
                    "etcdCaFile: /etc/tenantnet/etcd-ca.pem\netcdPrefix: /prod/tenantnet/\n")
    who = ipam_client.cluster_node(nodeconfig.load(str(path)))
    assert who is not None and who.name == "worker-3" and who.prefix == "/prod/tenantnet/"
    assert who.etcd.endpoints == ("https://10.0.0.5:2379", "http://[::1]:2379")
    assert ipam_client.cluster_node(nodeconfig.NodeConfig()) is None


def test_allow_overlap_is_off_unless_said() -> None:
    assert parse_ipam(ipam("10.1.0.0/24")).cluster == ClusterSettings(allow_overlap=False)
    assert parse_ipam(ipam("10.1.0.0/24", allowOverlap=True)).cluster == ClusterSettings(allow_overlap=True)


def test_release_after_is_bounded() -> None:
    assert parse_ipam(ipam("10.1.0.0/24", releaseAfter=0)).cluster == ClusterSettings(release_after=0.0)
    for bad in (-1, 90000, "5", True):
        with pytest.raises(CniError) as err:
            parse_ipam(ipam("10.1.0.0/24", releaseAfter=bad))
        assert "ipam.cluster.releaseAfter" in err.value.msg


def test_the_node_default_for_an_omitted_data_dir(tmp_path: Path) -> None:
    """ipamDataDir: one NAD without dataDir, a store wherever each node's admin keeps it."""
    from cni.env import parse_env
    from cni.netconf import parse_netconf
    from ipam import plugin
    from tenantnet.plugin import settings

    store = tmp_path / "stores" / "node-1"
    path = tmp_path / "n.yaml"
    path.write_text(f"ipamDataDirs: [{tmp_path}/stores]\nipamDataDir: {store}\nstateDir: {tmp_path}/state\n"
                    "replaceDefaults: [ipamDataDirs]\n")
    node = nodeconfig.load(str(path))
    settings.ipam_paths({"type": "tenantnet-ipam"}, node)  # allowed: the node's default
    with pytest.raises(CniError):
        settings.ipam_paths({"type": "host-local"}, node)  # host-local's own default is not
    conf = parse_netconf({"cniVersion": "1.0.0", "name": "n", "type": "x",
                          "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.9.0.0/24"}]]}})
    env = parse_env({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "net1",
                     "CNI_NETNS": "/run/netns/x", "CNI_PATH": "/x"})
    plugin.add(env, conf, ipam_client.confinement(node))
    assert (store / "ipam.db").exists()
    path.write_text(f"ipamDataDirs: [{tmp_path}/stores]\nipamDataDir: /var/lib/elsewhere\n")
    with pytest.raises(CniError) as err:
        nodeconfig.load(str(path))
    assert "ipamDataDir" in err.value.msg and f"{tmp_path}/stores" in err.value.msg


def test_each_node_starts_its_search_at_a_point_of_its_own() -> None:
    """Review of issue 26: nodes do not all race for the first free block. Each node's order
    is stable, covers every block once, and begins at a point seeded from its name."""
    from ipam.cluster import blocks_from

    cfg = parse_ipam({"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.2.0.0/25"}]],
                      "cluster": {"blockSize": 28}})
    rs = cfg.range_sets[0]._replace(ranges=cfg.range_sets[0].ranges + cfg.range_sets[1].ranges)
    every = list(blocks_of(rs, ClusterSettings(block_size=28)))
    firsts = set()
    for name in (f"node-{i}" for i in range(8)):
        order = list(blocks_from(rs, ClusterSettings(block_size=28), name))
        assert sorted(order) == sorted(every) and len(order) == len(every) == 24
        assert order == list(blocks_from(rs, ClusterSettings(block_size=28), name))  # stable
        start = every.index(order[0])
        assert order == every[start:] + every[:start]  # onwards from its point, wrapping around
        firsts.add(order[0])
    assert len(firsts) > 4  # 8 nodes, 24 blocks: spread out, not all at the first block
    v6 = parse_ipam(ipam("fd00::/64")).range_sets[0]
    assert next(iter(blocks_from(v6, ClusterSettings(), "node-0"))) != ipaddress.ip_network("fd00::/122")


def test_losing_every_race_is_try_again_not_pool_exhausted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Review of issue 26: after 64 blocks lost to other nodes' claims, with free blocks
    left, the claim says code 11 (try again), not 110 (pool exhausted)."""
    import json

    from ipam import cluster
    from ipam.etcd import EtcdConfig, KeyValue

    class Racing:
        """An etcd where another node wins every block this one tries."""

        def __init__(self) -> None:
            self.tried = 0

        def range(self, prefix: str) -> list[KeyValue]:
            return []

        def range_at(self, prefix: str) -> tuple[list[KeyValue], int]:
            return [], 1

        def get(self, key: str) -> KeyValue | None:
            if "/blocks/" in key:
                return KeyValue(key, json.dumps({"node": "someone-else"}).encode(), 2, 2)
            if key.endswith("pools/rail-0"):
                return KeyValue(key, json.dumps({"blockSize": 30, "blockSizeV6": 122}, sort_keys=True).encode(),
                                1, 1)
            return None

        def txn(self, compare: object, success: object) -> bool:
            self.tried += 1
            return False

    racing = Racing()
    monkeypatch.setattr(cluster, "client", lambda config: racing)
    node = cluster.ClusterNode("node-a", EtcdConfig(("http://127.0.0.1:1",)), "/t/",
                               (ipaddress.ip_network("10.0.0.0/8"),))
    cfg = parse_ipam(ipam("10.1.0.0/23", blockSize=30))  # 128 blocks
    assert cfg.cluster is not None
    ledger = cluster.Ledger(node, "rail-0", str(tmp_path), cfg.cluster, cfg.range_sets)
    with pytest.raises(CniError) as err:
        ledger.claim(cfg.range_sets[0])
    assert err.value.code == 11 and "other nodes claimed each of the 64" in err.value.msg, err.value.msg
    assert racing.tried == 64


@pytest.mark.parametrize("subnet,pools,needle", [
    ("172.16.0.0/12", ("10.0.0.0/8",), "172.16.0.0/12 (172.16.0.1-172.31.255.254) is not inside any of the "
                                       "cluster pools the admin allows (10.0.0.0/8)"),
    ("0.0.0.0/0", ("10.0.0.0/8",), "ipam.ranges[0][0].subnet='0.0.0.0/0': a cluster network's IPv4 subnet must "
                                   "be /8 or longer"),
    ("::/0", (), "IPv6 subnet must be /16 or longer"),
    ("10.1.0.0/24", (), "this node config names none"),
    ("10.1.0.0/24", ("fd00::/16",), "is not inside any of the cluster pools"),
])
def test_a_cluster_range_must_lie_in_the_admins_pools(subnet: str, pools: tuple[str, ...], needle: str) -> None:
    """Issue 26, defect 6: a NAD (a tenant's) cannot squat a range cluster-wide."""
    from ipam.config import check_cluster_pools

    cfg = parse_ipam(ipam(subnet))
    with pytest.raises(CniError) as err:
        check_cluster_pools(cfg.range_sets, tuple(ipaddress.ip_network(p) for p in pools))
    assert err.value.code == 7 and needle in err.value.msg, err.value.msg
    if not pools:
        assert "set clusterPools in the node config" in err.value.details or "subnet must" in err.value.msg
    check_cluster_pools(parse_ipam(ipam("10.1.0.0/24")).range_sets, (ipaddress.ip_network("10.0.0.0/8"),))
    # Node-local mode is the node's own business: any range it parses is fine.
    assert parse_ipam({"ranges": [[{"subnet": "172.16.0.0/12"}]]}).cluster is None


def test_cluster_pools_in_the_node_config(tmp_path: Path) -> None:
    path = tmp_path / "n.yaml"
    path.write_text("nodeName: w1\netcdEndpoints: [http://127.0.0.1:2379]\nclusterPools: [10.90.0.0/16, 'fd00:90::/48']\n")
    who = ipam_client.cluster_node(nodeconfig.load(str(path)))
    assert who.pools == (ipaddress.ip_network("10.90.0.0/16"), ipaddress.ip_network("fd00:90::/48"))
    for bad in ("[0.0.0.0/0]", "[10.0.0.0/7]", "[nonsense]", "['::/8']", "10.0.0.0/8"):
        path.write_text(f"clusterPools: {bad}\n")
        with pytest.raises(CniError) as err:
            nodeconfig.load(str(path))
        assert err.value.code == 7 and "clusterPools" in err.value.msg and "/8 or longer" in err.value.msg
