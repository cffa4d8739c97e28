"""The result of an ADD: the pod's addresses and routes as netlink applies them, and the CNI
result assembled from the driver's interfaces, IPAM's answer and a chained prevResult.
"""

from __future__ import annotations

from cni.result import DNS, Interface, IPConfig, Result, Route
from tenantnet.plugin.system import netlink


def address_plan(result: Result) -> netlink.AddressPlan:
    v4gw = next((ip.gateway for ip in result.ips if ip.gateway and ip.address.version == 4), None)
    v6gw = next((ip.gateway for ip in result.ips if ip.gateway and ip.address.version == 6), None)
    routes = []
    for r in result.routes:
        gw = r.gw or (v4gw if r.dst.version == 4 else v6gw)
        routes.append((r.dst.with_prefixlen, str(gw) if gw else None))
    return netlink.AddressPlan(addresses=[ip.address for ip in result.ips], routes=routes)


def assemble(prev: Result | None, host: Interface | None, pod: Interface, ipam: Result,
              dns: DNS) -> Result:
    """Our result, appended to a chained prevResult when there is one."""
    base = prev or Result()
    interfaces = list(base.interfaces)
    if host is not None:
        interfaces.append(host)
    pod_index = len(interfaces)
    interfaces.append(pod)
    ips = list(base.ips) + [IPConfig(address=ip.address, gateway=ip.gateway, interface=pod_index)
                            for ip in ipam.ips]
    routes: list[Route] = list(base.routes) + list(ipam.routes)
    chosen_dns = dns if not dns.empty() else (ipam.dns if not ipam.dns.empty() else base.dns)
    return Result(interfaces=interfaces, ips=ips, routes=routes, dns=chosen_dns)

