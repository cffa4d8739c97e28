"""The CNI result model and its shape in each specification version.

Results are held in one typed form and emitted in whatever `cniVersion` the caller's
config names: 0.3.x/0.4.0 carry `ips[].version`; 1.0.0 drops it; 1.1.0 adds interface
`mtu`/`socketPath`/`pciID` and the extra route attributes. Empty fields are omitted,
as libcni does.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from cni import version as cniversion
from cni.errors import CniError, Code

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass
class Interface:
    """An interface of a CNI result (host side, or in the sandbox when `sandbox` is set)."""

    name: str
    mac: str = ""
    mtu: int = 0
    sandbox: str = ""
    socket_path: str = ""
    pci_id: str = ""


@dataclass
class IPConfig:
    """An address of a CNI result, with its gateway and the index of its interface."""

    address: IPInterface
    gateway: IPAddress | None = None
    interface: int | None = None


@dataclass
class Route:
    """A route of a CNI result (or of an IPAM config's `routes`)."""

    dst: IPNetwork
    gw: IPAddress | None = None
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None


@dataclass
class DNS:
    """The DNS settings of a CNI result."""

    nameservers: list[str] = field(default_factory=list)
    domain: str = ""
    search: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.nameservers or self.domain or self.search or self.options)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.nameservers:
            out["nameservers"] = list(self.nameservers)
        if self.domain:
            out["domain"] = self.domain
        if self.search:
            out["search"] = list(self.search)
        if self.options:
            out["options"] = list(self.options)
        return out

    @classmethod
    def from_dict(cls, raw: Any, where: str = "dns") -> DNS:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise CniError(Code.DECODE_FAILURE, f"{where} must be an object, got {raw!r}")

        def strings(key: str) -> list[str]:
            value = raw.get(key)
            if value is None:
                return []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise CniError(Code.DECODE_FAILURE, f"{where}.{key} must be a list of strings")
            return list(value)

        domain = raw.get("domain")
        domain = "" if domain is None else domain
        if not isinstance(domain, str):
            raise CniError(Code.DECODE_FAILURE, f"{where}.domain must be a string")
        return cls(strings("nameservers"), domain, strings("search"), strings("options"))


@dataclass
class Result:
    """A CNI result: interfaces, addresses, routes, DNS (written in any supported version)."""

    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)

    # ---- output -------------------------------------------------------------------
    def to_dict(self, cni_version: str, *, ipam: bool = False) -> dict[str, Any]:
        """The result as the spec's `cni_version` shapes it (an IPAM result if `ipam`)."""
        legacy = not cniversion.at_least(cni_version, "1.0.0")
        v11 = cniversion.at_least(cni_version, "1.1.0")
        out: dict[str, Any] = {"cniVersion": cni_version}
        if self.interfaces and not ipam:
            ifaces = []
            for i in self.interfaces:
                d: dict[str, Any] = {"name": i.name}
                if i.mac:
                    d["mac"] = i.mac
                if v11 and i.mtu:
                    d["mtu"] = i.mtu
                if i.sandbox:
                    d["sandbox"] = i.sandbox
                if v11 and i.socket_path:
                    d["socketPath"] = i.socket_path
                if v11 and i.pci_id:
                    d["pciID"] = i.pci_id
                ifaces.append(d)
            out["interfaces"] = ifaces
        if self.ips:
            ips = []
            for ip in self.ips:
                d = {}
                if legacy:
                    d["version"] = str(ip.address.version)
                d["address"] = ip.address.with_prefixlen
                if ip.gateway is not None:
                    d["gateway"] = str(ip.gateway)
                if ip.interface is not None and not ipam:
                    d["interface"] = ip.interface
                ips.append(d)
            out["ips"] = ips
        if self.routes:
            routes = []
            for r in self.routes:
                d = {"dst": r.dst.with_prefixlen}
                if r.gw is not None:
                    d["gw"] = str(r.gw)
                if v11:
                    for key, value in (("mtu", r.mtu), ("advmss", r.advmss), ("priority", r.priority)):
                        if value:
                            d[key] = value
                    if r.table is not None:
                        d["table"] = r.table
                    if r.scope is not None:
                        d["scope"] = r.scope
                routes.append(d)
            out["routes"] = routes
        if not self.dns.empty():
            out["dns"] = self.dns.to_dict()
        elif legacy:
            out["dns"] = {}
        return out

    # ---- input --------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Any, where: str = "result") -> Result:
        """Parse a result of any supported version (a prevResult, an IPAM plugin's output)."""
        if not isinstance(raw, dict):
            raise CniError(Code.DECODE_FAILURE, f"{where} must be a JSON object")
        try:
            return cls._parse(raw, where)
        except CniError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise CniError(Code.DECODE_FAILURE, f"cannot decode {where}: {exc}") from None

    @classmethod
    def _parse(cls, raw: dict[str, Any], where: str) -> Result:
        if raw.get("cniVersion") is not None and not isinstance(raw["cniVersion"], str):
            raise ValueError(f"cniVersion must be a string, got {raw['cniVersion']!r}")
        interfaces = []
        for i in _items(raw, "interfaces"):
            name = i["name"]
            if not isinstance(name, str):
                raise ValueError(f"interfaces[].name must be a string, got {name!r}")
            interfaces.append(
                Interface(
                    name=name,
                    mac=_hardware_address(_text(i, "mac")),
                    mtu=_count(i, "mtu"),
                    sandbox=_text(i, "sandbox"),
                    socket_path=_text(i, "socketPath"),
                    pci_id=_text(i, "pciID"),
                )
            )
        ips = []
        for ip in _items(raw, "ips"):
            iface = ip.get("interface")
            # bool is an int to Python, not to JSON: `"interface": false` is no index.
            if iface is not None and (not isinstance(iface, int) or isinstance(iface, bool) or iface < 0):
                raise ValueError(f"ips[].interface must be a non-negative integer, got {iface!r}")
            if ip.get("version") is not None and not isinstance(ip["version"], str):
                raise ValueError(f"ips[].version must be a string (\"4\" or \"6\"), got {ip['version']!r}")
            gw = ip.get("gateway")
            if not isinstance(ip.get("address"), str) or (gw is not None and not isinstance(gw, str)):
                raise ValueError("ips[].address and ips[].gateway must be address strings")
            ips.append(
                IPConfig(
                    address=ipaddress.ip_interface(ip["address"]),
                    gateway=ipaddress.ip_address(gw) if gw else None,
                    interface=iface,
                )
            )
        routes = []
        for r in _items(raw, "routes"):
            gw = r.get("gw")
            if not isinstance(r.get("dst"), str) or (gw is not None and not isinstance(gw, str)):
                raise ValueError("routes[].dst and routes[].gw must be address strings")
            routes.append(
                Route(
                    dst=ipaddress.ip_network(r["dst"], strict=False),
                    gw=ipaddress.ip_address(gw) if gw else None,
                    mtu=_count(r, "mtu"),
                    advmss=_count(r, "advmss"),
                    priority=_count(r, "priority"),
                    table=_count(r, "table") if r.get("table") is not None else None,
                    scope=_count(r, "scope") if r.get("scope") is not None else None,
                )
            )
        return cls(interfaces, ips, routes, DNS.from_dict(raw.get("dns"), f"{where}.dns"))


def _items(raw: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """A result's list of objects (interfaces, ips, routes): type-checked, it is caller input."""
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{key} must be a list of objects")
    return value


def _text(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def _count(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 32:
        raise ValueError(f"{key} must be an integer from 0 to 4294967295, got {value!r}")
    return value


_HW_ADDRESS = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2})*")


def _hardware_address(value: str) -> str:
    """An interface's `mac`: colon-separated hex octets (Ethernet, or longer: InfiniBand)."""
    if value and not _HW_ADDRESS.fullmatch(value):
        raise ValueError(f"interfaces[].mac must be a hardware address like 02:00:00:00:00:01, got {value!r}")
    return value
