"""Real traffic through the lab OVS: same VLAN reaches, different VLAN does not.

Both VLANs use the same IP subnet, so without the VLAN tags every pod would reach every
other one: a blocked ping here is the OVS VLAN isolation and nothing else.
"""

from __future__ import annotations

from tests.atonce import at_once
from tests.integration.conftest import new_cid


def ping(ns, address):
    # 3 probes, 2 s each: a loaded 2-core machine can be slow to answer the first ARP
    return ns.run("ping", "-c", "3", "-i", "0.3", "-W", "2", address).returncode == 0


def test_same_vlan_reaches_other_vlan_does_not(lab, plugin, netns_factory, no_leftovers):
    def conf(vlan, lo, hi):
        return plugin.conf(name=f"iso{vlan}", vlan=vlan, ipam={
            "type": "host-local", "dataDir": str(lab.hostlocal_dir),
            "ranges": [[{"subnet": "10.88.0.0/24", "rangeStart": lo, "rangeEnd": hi}]]})

    v100, v200 = conf(100, "10.88.0.10", "10.88.0.99"), conf(200, "10.88.0.100", "10.88.0.199")
    pods = {}
    for name, c in (("a", v100), ("b", v100), ("c", v200), ("d", v200)):
        ns = netns_factory()
        cid = new_cid()
        inv = plugin.add(c, ns, cid)
        assert inv.code == 0, inv.stdout
        pods[name] = (ns, cid, c, inv.out["ips"][0]["address"].split("/")[0])
    a, b, c, d = (pods[k] for k in "abcd")
    # at once: the two that must fail each wait out their deadline
    ab, ba, cd, ac, db = at_once(lambda: ping(a[0], b[3]), lambda: ping(b[0], a[3]), lambda: ping(c[0], d[3]),
                                 lambda: ping(a[0], c[3]), lambda: ping(d[0], b[3]))
    assert ab and ba
    assert cd
    assert not ac
    assert not db
    for ns, cid, c_conf, _ in pods.values():
        assert plugin.call("DEL", c_conf, cid, ns.path).code == 0
