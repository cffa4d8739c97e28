"""The OVS port of an `ovs` attachment: `ovsWait` (ADD returns once ovs-vswitchd applied the
port) and a host end without IPv6 addresses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tenantnet.drivers.ovs import host_ifname


def test_ovs_wait_returns_with_the_port_in_the_datapath(lab: Any, plugin: Any, netns_factory: Any,
                                                        no_leftovers: None, tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(lab.node_config.read_text() + "ovsWait: true\n")
    plugin.extra_env["TENANTNET_CONFIG"] = str(node)
    ns = netns_factory()
    cid = "a" * 64
    inv = plugin.add(plugin.conf(), ns, cid)
    assert inv.code == 0, inv.stdout
    port = host_ifname(cid, "net1")
    # Read at once: with ovsWait the ADD came back only after vswitchd numbered the port.
    ofport = json.loads(lab.vsctl("--format=json", "--columns=ofport,error", "list", "Interface", port))
    (number, error), = ofport["data"]
    assert isinstance(number, int) and number > 0 and error == ["set", []]
    assert plugin.call("DEL", plugin.conf(), cid, ns.path).code == 0


def test_host_end_has_no_ipv6_address(lab: Any, plugin: Any, netns_factory: Any, no_leftovers: None) -> None:
    ns = netns_factory()
    cid = "b" * 64
    assert plugin.add(plugin.conf(), ns, cid).code == 0
    host = host_ifname(cid, "net1")
    # A switch port needs no address; one would add the host's own IPv6 chatter to the VLAN.
    assert Path(f"/proc/sys/net/ipv6/conf/{host}/addr_gen_mode").read_text().strip() == "1"
    assert not Path("/proc/net/if_inet6").read_text().count(f" {host}\n")
    assert plugin.call("DEL", plugin.conf(), cid, ns.path).code == 0
