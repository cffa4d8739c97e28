"""Issue 6, "a real libcni client": Debian's podman 4.3 with its CNI backend runs containers
on a tenantnet network (conflist cniVersion 1.0.0, in-process tenantnet-ipam) on a private
OVS lab; `podman rm` releases everything.

Podman calls VERSION before every ADD and DEL, and drops a network whose plugin does not
support the conflist's version — so every container below that gets an address also proves
that VERSION works as libcni expects.
"""

from __future__ import annotations

import ipaddress
import json

from tests.atonce import at_once
from tests.e2e.conftest import IFNAME, SUBNET, VLAN, Container, Podman, link_exists, parse_ip_addr, wait_until


def _single_address(podman: Podman, c: Container) -> ipaddress.IPv4Interface:
    found = podman.addresses(c.name)
    assert IFNAME in found, f"{c.name}: no IPv4 address on {IFNAME}: {found}\n{podman.diagnostics()}"
    (addr,) = found[IFNAME]
    assert addr in SUBNET and addr.network == SUBNET, f"{c.name}: {addr} is not an address in {SUBNET}"
    return addr


def _assert_attached(podman: Podman, c: Container, addr: ipaddress.IPv4Interface) -> None:
    """What tenantnet, the lab's OVS and the IPAM store show for a running container."""
    records = [r for r in podman.attachments() if r["containerID"] == c.id]
    assert len(records) == 1, f"tenantnetctl ls shows {records} for {c.name}"
    (rec,) = records
    assert rec["network"] == podman.network and rec["ifname"] == IFNAME
    assert rec["phase"] == "ready" and rec["mode"] == "ovs"
    assert rec["hostIfname"] == c.host_link and rec["bridge"] == podman.lab.bridge and rec["vlan"] == VLAN
    assert rec["ips"] == [str(addr)]

    ports = podman.owned_ports()
    assert c.host_link in ports, f"no OVS port {c.host_link} of ours on the lab: {ports}"
    port = ports[c.host_link]
    assert port["bridge"] == podman.lab.bridge and port["tag"] == VLAN
    assert port["external_ids"]["tenantnet-container-id"] == c.id
    assert port["external_ids"]["tenantnet-network"] == podman.network
    assert port["external_ids"]["tenantnet-ifname"] == IFNAME
    assert link_exists(c.host_link), f"host link {c.host_link} missing"

    held = [a for a in podman.allocations() if a["containerID"] == c.id]
    assert [(a["network"], a["address"], a["ifname"]) for a in held] == [(podman.network, str(addr.ip), IFNAME)]
    # podman's CNI_ARGS carry K8S_POD_NAME=<container name>; tenantnet-ipam records it
    assert held[0]["podName"] == c.name

    # libcni (inside podman) cached the ADD result: podman, not a harness, ran the plugin
    cached = json.loads(c.libcni_cache.read_text())
    assert cached["result"]["ips"][0]["address"] == str(addr)


def test_podman_lists_the_network(podman: Podman) -> None:
    """libcni validated the conflist, VERSION included: otherwise podman drops the network."""
    proc = podman("network", "ls", "--format", "{{.Name}}")
    assert podman.network in proc.stdout.split(), (
        f"podman dropped {podman.network} (VERSION or validation failed): {proc.stdout}\n{proc.stderr}")


def test_container_gets_address_and_rm_releases_everything(podman: Podman) -> None:
    c = podman.start("tn-e2e-solo", "sleep", "300")
    addr = _single_address(podman, c)
    _assert_attached(podman, c, addr)
    assert c.netns and c.netns.startswith("/run/netns/"), c.netns

    podman.rm(c.name)
    podman.assert_nothing_left([c])


def test_foreground_run_is_released_when_the_container_exits(podman: Podman) -> None:
    """The DEL after exit comes from `podman container cleanup`, started by conmon: it gets the
    node config only through containers.conf's `[engine] env`."""
    out = podman.run_fg("tn-e2e-once", "ip", "-o", "-4", "addr", "show").stdout
    found = parse_ip_addr(out)
    assert IFNAME in found and all(a in SUBNET for a in found[IFNAME]) and found[IFNAME], (
        f"the container saw no address in {SUBNET}: {out}\n{podman.diagnostics()}")
    c = podman.container("tn-e2e-once")
    released = wait_until(lambda: podman.allocations() == [] and podman.owned_ports() == {})
    assert released, f"not released after the container exited\n{podman.diagnostics()}"

    podman("rm", c.name)
    podman.assert_nothing_left([c])


def test_two_containers_reach_each_other(podman: Podman) -> None:
    a = podman.start("tn-e2e-a", "sleep", "300")
    b = podman.start("tn-e2e-b", "sleep", "300")
    addr_a, addr_b = _single_address(podman, a), _single_address(podman, b)
    assert addr_a != addr_b
    _assert_attached(podman, a, addr_a)
    _assert_attached(podman, b, addr_b)

    pings = at_once(*(lambda src=src, dst=dst: podman.exec(src.name, "ping", "-c", "3", "-W", "2", str(dst.ip),
                                                           check=False)
                      for src, dst in ((a, addr_b), (b, addr_a))))  # both directions at once
    for (src, dst), ping in zip(((a, addr_b), (b, addr_a)), pings, strict=True):
        assert ping.returncode == 0, (
            f"{src.name} cannot reach {dst.ip}: {ping.stdout}{ping.stderr}\n{podman.diagnostics()}")

    podman.rm(a.name, b.name)
    podman.assert_nothing_left([a, b])
