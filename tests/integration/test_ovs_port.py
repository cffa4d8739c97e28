"""The OVS port of an `ovs` attachment: `ovsWait` (ADD returns once ovs-vswitchd applied the
port) and a host end without IPv6."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from tenantnet.plugin.drivers.ovs import host_ifname


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
    # Nor IPv6 at all: its multicast route alone makes ovs-vswitchd re-read the host's
    # routes and addresses on every new port.
    assert Path(f"/proc/sys/net/ipv6/conf/{host}/disable_ipv6").read_text().strip() == "1"
    assert host not in subprocess.run(["ip", "-6", "route", "show", "table", "all"], capture_output=True,
                                      text=True, check=True).stdout
    assert not Path("/proc/net/if_inet6").read_text().count(f" {host}\n")
    assert plugin.call("DEL", plugin.conf(), cid, ns.path).code == 0


def test_two_ovsdb_endpoints_in_one_process_stay_apart(lab: Any, nic_lab: Any) -> None:
    """Each endpoint gets a handle (and a connection) of its own."""
    from tenantnet.plugin.system import ovsdb

    plain, nic = ovsdb.connect(lab.ovsdb), ovsdb.connect(nic_lab.ovsdb)
    assert plain is not nic
    # Only the NIC lab has the emulated embedded switch's bridge.
    assert nic.bridge_exists("br-esw0") and not plain.bridge_exists("br-esw0")
    assert plain.bridge_exists(lab.bridge) and nic.bridge_exists(nic_lab.bridge)
    # A port written through one handle lands in that database only.
    name = "tnx" + uuid.uuid4().hex[:8]
    nic.add_port(ovsdb.PortSpec(bridge=nic_lab.bridge, name=name, tag=9))
    try:
        assert name in nic_lab.vsctl("list-ports", nic_lab.bridge).split()
        assert name not in lab.vsctl("list-ports", lab.bridge).split()
        assert plain.port(name) is None and nic.port(name) is not None
    finally:
        assert nic.delete_port(name) is True
    assert name not in nic_lab.vsctl("list-ports", nic_lab.bridge).split()
