"""The `ipam` section of a network config, validated into typed ranges, routes and DNS.

Accepts host-local's fields unchanged (`ranges`, `routes`, `dataDir`, `resolvConf`, and
host-local's legacy single-range `subnet`/`rangeStart`/`rangeEnd`/`gateway`) so a user can
swap `"type": "host-local"` for `"type": "tenantnet-ipam"` and nothing else; plus
whereabouts' `range` (`10.1.0.0/24` or `10.1.0.10-10.1.0.50/24`), `range_start`,
`range_end`, `exclude`, `gateway` and `ipRanges`, and a literal `dns` object.

Everything is checked here, before the store is opened, so bad input never leaves
anything recorded. Every error names the field, the value and what is allowed.

The value types are NamedTuples rather than dataclasses on purpose: a dataclass costs about
2 ms to build at import time, and this module is imported on every exec of the plugin.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

from cni.errors import CniError, Code, invalid_config
from cni.result import DNS, IPAddress, IPNetwork, Route

DEFAULT_DATA_DIR = "/var/lib/tenantnet/ipam"
# Range sets one network config may have. An ADD takes one address from every set, so this
# is also the most addresses one interface gets; real configs have one or two (IPv4, IPv6),
# host-local names no limit. Work that pairs range sets (the pool metrics compare every set
# with every other) grows with the square of the count, so a tenant's NAD must not choose it:
# 16 leaves room for unusual multi-homed configs and keeps that work at 256 pairs.
MAX_RANGE_SETS = 16
HOST_LOCAL_DATA_DIR = "/var/lib/cni/networks"  # host-local's own default dataDir


class Confinement(NamedTuple):
    """Where a config's `dataDir` and `resolvConf` may point (the node config's
    `ipamDataDirs` and `resolvConfPaths`, docs/security.md): the config is tenant input, and
    the store is written, the resolv.conf read, as root."""

    data_dirs: tuple[str, ...] = (DEFAULT_DATA_DIR, HOST_LOCAL_DATA_DIR)
    resolv_conf_paths: tuple[str, ...] = ("/etc/resolv.conf", "/etc/tenantnet/resolv.d")
    # tenantnet-ipam's store when a config names no dataDir (the node config's ipamDataDir):
    # one NAD, a store per node wherever the admin keeps it.
    default_data_dir: str = DEFAULT_DATA_DIR
    # Where the stores opened while allowed are listed (ipam/known_stores.py, the node's
    # <stateDir>/ipam-stores): a DEL releases there even after ipamDataDirs was narrowed.
    # "": no list (a DEL then releases only inside data_dirs).
    known_stores: str = ""


DEFAULT_CONFINEMENT = Confinement()


class Range(NamedTuple):
    """One contiguous range inside a subnet, minus the addresses it must never hand out."""

    subnet: IPNetwork
    start: int  # first address that may be handed out (inclusive, as an integer)
    end: int  # last one (inclusive)
    gateway: IPAddress | None = None
    exclude: tuple[IPNetwork, ...] = ()

    @property
    def family(self) -> int:
        return self.subnet.version

    def contains(self, address: IPAddress) -> bool:
        return address.version == self.family and self.start <= int(address) <= self.end

    def reserved_reason(self, address: IPAddress) -> str | None:
        """Why an address inside [start, end] must not be handed out, or None."""
        if self.gateway is not None and address == self.gateway:
            return "it is the gateway"
        for net in self.exclude:
            if address in net:
                return f"it is excluded ({net})"
        return None

    def segments(self) -> list[tuple[int, int]]:
        """The allocatable addresses as sorted, disjoint [lo, hi] integer intervals."""
        holes: list[tuple[int, int]] = [
            (int(n.network_address), int(n.broadcast_address)) for n in self.exclude
        ]
        if self.gateway is not None:
            holes.append((int(self.gateway), int(self.gateway)))
        holes.sort()
        out: list[tuple[int, int]] = []
        pos = self.start
        for lo, hi in holes:
            if hi < pos:
                continue
            if lo > self.end:
                break
            if lo > pos:
                out.append((pos, lo - 1))
            pos = max(pos, hi + 1)
        if pos <= self.end:
            out.append((pos, self.end))
        return out

    def describe(self) -> str:
        first = ipaddress.ip_address(self.start)
        last = ipaddress.ip_address(self.end)
        return f"{self.subnet} ({first}-{last})"


class RangeSet(NamedTuple):
    """Ranges of one family; an ADD gets exactly one address from each range set."""

    ranges: tuple[Range, ...]

    @property
    def family(self) -> int:
        return self.ranges[0].family

    def range_of(self, address: IPAddress) -> Range | None:
        for r in self.ranges:
            if r.contains(address):
                return r
        return None

    def describe(self) -> str:
        return ", ".join(r.describe() for r in self.ranges)


class ClusterSettings(NamedTuple):
    """`ipam.cluster`: the pool is shared by every node in per-node blocks (ipam/cluster.py)."""

    block_size: int = 26  # the prefix length of an IPv4 block
    block_size_v6: int = 122
    release_after: float = 300.0  # seconds a block stays empty before it goes back to the pool
    # This network's pool may overlap another cluster network's (it lives on its own L2
    # segment, e.g. another tenant's VLAN); without it an overlap is refused (ipam/cluster.py).
    allow_overlap: bool = False


class IpamConfig(NamedTuple):
    range_sets: tuple[RangeSet, ...]
    dns: DNS
    routes: tuple[Route, ...] = ()
    data_dir: str = DEFAULT_DATA_DIR
    resolv_conf: str = ""
    cluster: ClusterSettings | None = None


# ---- helpers -------------------------------------------------------------------------


def _address(where: str, value: Any) -> IPAddress:
    if not isinstance(value, str):
        raise invalid_config(where, value, "must be an IPv4 or IPv6 address string")
    try:
        return ipaddress.ip_address(value.strip())
    except ValueError:
        raise invalid_config(where, value, "must be an IPv4 or IPv6 address") from None


def _network(where: str, value: Any) -> IPNetwork:
    if not isinstance(value, str) or "/" not in value:
        raise invalid_config(where, value, "must be a CIDR such as 10.1.0.0/24 or fd00::/64")
    try:
        # host-local accepts host bits in the subnet (it uses the network part): so do we.
        return ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise invalid_config(
            where, value, "must be a CIDR such as 10.1.0.0/24 or fd00::/64"
        ) from None


def _list(where: str, value: Any, *, allow_empty: bool = False) -> list[Any]:
    if not isinstance(value, list):
        raise invalid_config(where, value, "must be a JSON list")
    if not value and not allow_empty:
        raise invalid_config(where, value, "must not be empty")
    return value


def _object(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid_config(where, value, "must be a JSON object")
    return value


def _excludes(where: str, value: Any) -> tuple[IPNetwork, ...]:
    if value is None:
        return ()
    items = _list(where, value, allow_empty=True)
    return tuple(_network(f"{where}[{i}]", v) for i, v in enumerate(items))


def _build_range(
    where: str,
    subnet: IPNetwork,
    start: IPAddress | None,
    end: IPAddress | None,
    gateway: IPAddress | None,
    exclude: tuple[IPNetwork, ...],
    *,
    start_field: str,
    end_field: str,
    gateway_field: str,
) -> Range:
    # host-local refuses networks that leave nothing between network and broadcast.
    if subnet.num_addresses < 4:
        raise invalid_config(
            f"{where}.subnet", str(subnet),
            f"is too small to allocate from; allowed: prefix length at most "
            f"/{subnet.max_prefixlen - 2}",
        )
    net = int(subnet.network_address)
    last = int(subnet.broadcast_address)
    lo = net + 1
    hi = last - 1 if subnet.version == 4 else last
    for fname, addr in ((start_field, start), (end_field, end), (gateway_field, gateway)):
        if addr is None:
            continue
        if addr.version != subnet.version:
            raise invalid_config(
                f"{where}.{fname}", str(addr), f"must be an IPv{subnet.version} address in {subnet}"
            )
        if addr not in subnet:
            raise invalid_config(f"{where}.{fname}", str(addr), f"must be inside subnet {subnet}")
    if start is not None:
        if not lo <= int(start) <= hi:
            raise invalid_config(
                f"{where}.{start_field}", str(start),
                f"must not be the network or broadcast address of {subnet}",
            )
        lo = int(start)
    if end is not None:
        if not int(subnet.network_address) < int(end) <= hi:
            raise invalid_config(
                f"{where}.{end_field}", str(end),
                f"must not be the network or broadcast address of {subnet}",
            )
        hi = int(end)
    if lo > hi:
        raise invalid_config(
            f"{where}.{start_field}", str(ipaddress.ip_address(lo)),
            f"must not be after {end_field} {ipaddress.ip_address(hi)}",
        )
    for i, ex in enumerate(exclude):
        if ex.version != subnet.version:
            raise invalid_config(
                f"{where}.exclude[{i}]", str(ex), f"must be an IPv{subnet.version} CIDR"
            )
    rng = Range(subnet=subnet, start=lo, end=hi, gateway=gateway, exclude=exclude)
    if not rng.segments():
        raise invalid_config(
            where, rng.describe(),
            "leaves no address to hand out after removing the gateway and excluded addresses",
        )
    return rng


def _hostlocal_range(where: str, raw: Any, extra_exclude: tuple[IPNetwork, ...]) -> Range:
    obj = _object(where, raw)
    if "subnet" not in obj:
        raise invalid_config(f"{where}.subnet", None, "is required (a CIDR such as 10.1.0.0/24)")
    subnet = _network(f"{where}.subnet", obj["subnet"])
    start = _address(f"{where}.rangeStart", obj["rangeStart"]) if obj.get("rangeStart") else None
    end = _address(f"{where}.rangeEnd", obj["rangeEnd"]) if obj.get("rangeEnd") else None
    if obj.get("gateway"):
        gateway: IPAddress | None = _address(f"{where}.gateway", obj["gateway"])
    else:
        # host-local's default: the first address of the subnet is the gateway.
        gateway = subnet.network_address + 1
    exclude = _excludes(f"{where}.exclude", obj.get("exclude")) + tuple(
        e for e in extra_exclude if e.version == subnet.version
    )
    return _build_range(
        where, subnet, start, end, gateway, exclude,
        start_field="rangeStart", end_field="rangeEnd", gateway_field="gateway",
    )


def _whereabouts_range(where: str, obj: dict[str, Any], extra_exclude: tuple[IPNetwork, ...],
                       gateway_raw: Any) -> Range:
    text = obj.get("range")
    if not isinstance(text, str):
        raise invalid_config(
            f"{where}.range", text, "must be a CIDR (10.1.0.0/24) or FIRST-LAST/PREFIX "
            "(10.1.0.10-10.1.0.50/24)",
        )
    start: IPAddress | None = None
    end: IPAddress | None = None
    if "-" in text:
        # whereabouts' short form: 10.1.0.10-10.1.0.50/24 — the subnet comes from FIRST/PREFIX.
        first, _, rest = text.partition("-")
        last, slash, prefix = rest.partition("/")
        if not slash:
            raise invalid_config(f"{where}.range", text, "FIRST-LAST form needs /PREFIX")
        subnet = _network(f"{where}.range", f"{first.strip()}/{prefix.strip()}")
        start = _address(f"{where}.range", first)
        end = _address(f"{where}.range", last)
    else:
        subnet = _network(f"{where}.range", text)
    if obj.get("range_start"):
        start = _address(f"{where}.range_start", obj["range_start"])
    if obj.get("range_end"):
        end = _address(f"{where}.range_end", obj["range_end"])
    gateway = _address("ipam.gateway", gateway_raw) if gateway_raw else None
    if gateway is not None and gateway.version != subnet.version:
        gateway = None  # a dual-stack whereabouts config names one gateway, for its family
    exclude = _excludes(f"{where}.exclude", obj.get("exclude")) + tuple(
        e for e in extra_exclude if e.version == subnet.version
    )
    return _build_range(
        where, subnet, start, end, gateway, exclude,
        start_field="range_start", end_field="range_end", gateway_field="gateway",
    )


def _range_sets(ipam: dict[str, Any]) -> list[RangeSet]:
    top_exclude = _excludes("ipam.exclude", ipam.get("exclude"))
    styles = [k for k in ("ranges", "range", "ipRanges", "subnet") if ipam.get(k) is not None]
    if not styles:
        raise invalid_config(
            "ipam.ranges", None,
            "no addresses configured; give host-local's ranges ([[{\"subnet\": \"10.1.0.0/24\"}]]),"
            " its legacy subnet, or whereabouts' range (\"10.1.0.0/24\")",
        )
    if len(styles) > 1 and not (set(styles) == {"range", "ipRanges"}):
        raise invalid_config(
            f"ipam.{styles[1]}", ipam[styles[1]],
            f"cannot be combined with ipam.{styles[0]}; use one way to give the ranges",
        )
    _check_set_count(ipam, styles)
    sets: list[RangeSet] = []
    if "ranges" in styles:
        for i, rs in enumerate(_list("ipam.ranges", ipam["ranges"])):
            items = _list(f"ipam.ranges[{i}]", rs)
            sets.append(RangeSet(tuple(
                _hostlocal_range(f"ipam.ranges[{i}][{j}]", r, top_exclude)
                for j, r in enumerate(items)
            )))
    elif "subnet" in styles:
        legacy = {k: ipam.get(k) for k in ("subnet", "rangeStart", "rangeEnd", "gateway")}
        sets.append(RangeSet((_hostlocal_range("ipam", legacy, top_exclude),)))
    else:
        if ipam.get("range") is not None:
            sets.append(RangeSet((_whereabouts_range("ipam", ipam, top_exclude,
                                                     ipam.get("gateway")),)))
        if ipam.get("ipRanges") is not None:
            for i, item in enumerate(_list("ipam.ipRanges", ipam["ipRanges"])):
                obj = _object(f"ipam.ipRanges[{i}]", item)
                sets.append(RangeSet((_whereabouts_range(f"ipam.ipRanges[{i}]", obj, top_exclude,
                                                         obj.get("gateway")),)))
    _check_sets(sets)
    return sets


def _check_set_count(ipam: dict[str, Any], styles: list[str]) -> None:
    """At most MAX_RANGE_SETS range sets, counted before any is parsed."""
    if "ranges" in styles:
        field, count = "ipam.ranges", len(ipam["ranges"]) if isinstance(ipam["ranges"], list) else 0
    else:
        ip_ranges = ipam.get("ipRanges")
        field = "ipam.ipRanges"
        count = (len(ip_ranges) if isinstance(ip_ranges, list) else 0) + (ipam.get("range") is not None)
    if count > MAX_RANGE_SETS:
        raise invalid_config(field, f"{count} range sets",
                             f"at most {MAX_RANGE_SETS} range sets per network (an ADD takes one address "
                             "from each; one per IP family is usual)")


def _check_sets(sets: list[RangeSet]) -> None:
    seen: list[tuple[str, Range]] = []
    for i, rs in enumerate(sets):
        for j, r in enumerate(rs.ranges):
            where = f"ipam.ranges[{i}][{j}]"
            if r.family != rs.family:
                raise invalid_config(
                    f"{where}.subnet", str(r.subnet),
                    f"must be IPv{rs.family} like the first range of its range set "
                    "(one family per range set; give IPv6 ranges their own set)",
                )
            for other_where, o in seen:
                if o.family == r.family and o.start <= r.end and r.start <= o.end:
                    raise invalid_config(
                        f"{where}.subnet", r.describe(),
                        f"overlaps {other_where} {o.describe()}; ranges must not overlap",
                    )
            seen.append((where, r))


def _routes(raw: Any) -> tuple[Route, ...]:
    if raw is None:
        return ()
    out = []
    for i, item in enumerate(_list("ipam.routes", raw, allow_empty=True)):
        obj = _object(f"ipam.routes[{i}]", item)
        dst = _network(f"ipam.routes[{i}].dst", obj.get("dst"))
        gw = _address(f"ipam.routes[{i}].gw", obj["gw"]) if obj.get("gw") else None
        if gw is not None and gw.version != dst.version:
            raise invalid_config(
                f"ipam.routes[{i}].gw", str(gw), f"must be an IPv{dst.version} address like dst"
            )
        out.append(Route(dst=dst, gw=gw))
    return tuple(out)


def _dns(raw: Any) -> DNS:
    if raw is None:
        return DNS()
    obj = _object("ipam.dns", raw)
    try:
        dns = DNS.from_dict(obj, "ipam.dns")
    except CniError as err:
        raise CniError(Code.INVALID_CONFIG, f"invalid network config: {err.msg}") from None
    for i, ns in enumerate(dns.nameservers):
        _address(f"ipam.dns.nameservers[{i}]", ns)
    return dns


def data_dir_of(ipam: dict[str, Any], default: str = DEFAULT_DATA_DIR) -> str:
    """`dataDir` (else `default`), checked: it becomes a path we create files in."""
    value = ipam.get("dataDir") or default
    if not isinstance(value, str):
        raise invalid_config("ipam.dataDir", value, "must be an absolute path string")
    if not os.path.isabs(value) or "\0" in value or ".." in value.split("/"):
        raise invalid_config(
            "ipam.dataDir", value, "must be an absolute path without '..' components"
        )
    return value


def parse_ipam(ipam: Any) -> IpamConfig:
    """Validate the `ipam` section; raises code 7 naming the field on any problem."""
    obj = _object("ipam", ipam)
    data_dir = data_dir_of(obj)
    resolv = obj.get("resolvConf") or ""
    if not isinstance(resolv, str) or (resolv and not os.path.isabs(resolv)):
        raise invalid_config("ipam.resolvConf", resolv, "must be an absolute path string")
    return IpamConfig(
        range_sets=tuple(_range_sets(obj)),
        routes=_routes(obj.get("routes")),
        dns=_dns(obj.get("dns")),
        data_dir=data_dir,
        resolv_conf=resolv,
        cluster=_cluster(obj.get("cluster")),
    )


def _cluster(raw: Any) -> ClusterSettings | None:
    if raw is None:
        return None
    obj = _object("ipam.cluster", raw)
    unknown = set(obj) - {"blockSize", "blockSizeV6", "releaseAfter", "allowOverlap"}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid_config(f"ipam.cluster.{name}", obj[name], "unknown field (known: blockSize, "
                             "blockSizeV6, releaseAfter, allowOverlap)")
    defaults = ClusterSettings()
    sizes = []
    for key, default, low, high in (("blockSize", defaults.block_size, 16, 30),
                                    ("blockSizeV6", defaults.block_size_v6, 64, 126)):
        value = obj.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise invalid_config(f"ipam.cluster.{key}", value,
                                 f"must be a prefix length from {low} to {high}")
        sizes.append(value)
    settings = defaults._replace(block_size=sizes[0], block_size_v6=sizes[1])
    after = obj.get("releaseAfter", settings.release_after)
    if not isinstance(after, int | float) or isinstance(after, bool) or not 0 <= after <= 86400:
        raise invalid_config("ipam.cluster.releaseAfter", after,
                             "must be a number of seconds from 0 to 86400")
    overlap = obj.get("allowOverlap", False)
    if not isinstance(overlap, bool):
        raise invalid_config("ipam.cluster.allowOverlap", overlap, "must be true or false")
    return settings._replace(release_after=float(after), allow_overlap=overlap)


# The widest range a cluster network may have: anything wider is no pool anyone meant (a
# /0 would make every other cluster network an overlap). The node config's clusterPools
# (tenantnet/plugin/nodeconfig.py) has the same bounds.
WIDEST_CLUSTER_PREFIX = {4: 8, 6: 16}


def check_cluster_pools(range_sets: tuple[RangeSet, ...], pools: tuple[IPNetwork, ...]) -> None:
    """Cluster mode: every range must lie inside one of the admin's pools (the node config's
    `clusterPools`). A NAD is a tenant's, and its ranges are recorded cluster-wide
    (ipam/cluster.py): without this, one NAD with a wide range would refuse every later
    overlapping cluster network on every node. Code 7 naming the range and the pools."""
    for i, rs in enumerate(range_sets):
        for j, r in enumerate(rs.ranges):
            where = f"ipam.ranges[{i}][{j}]"
            widest = WIDEST_CLUSTER_PREFIX[r.family]
            if r.subnet.prefixlen < widest:
                raise invalid_config(f"{where}.subnet", str(r.subnet),
                                     f"a cluster network's IPv{r.family} subnet must be /{widest} or longer")
            if not pools:
                raise CniError(Code.INVALID_CONFIG,
                               f"invalid network config: {where}: {r.describe()}: cluster networks take "
                               "their ranges from the admin's pools, and this node config names none",
                               "set clusterPools in the node config (a list of CIDRs the cluster networks' "
                               "ranges must lie inside)")
            first, last = ipaddress.ip_address(r.start), ipaddress.ip_address(r.end)
            if not any(p.version == r.family and first in p and last in p for p in pools):
                raise CniError(Code.INVALID_CONFIG,
                               f"invalid network config: {where}: {r.describe()} is not inside any of the "
                               f"cluster pools the admin allows ({', '.join(str(p) for p in pools)})",
                               "choose a range inside one of them, or ask the admin to add a pool "
                               "(clusterPools in the node config)")


def static_requests(sources: Iterator[tuple[str, Any]]) -> list[IPAddress]:
    """Requested addresses from (field name, value) pairs; the prefix, if given, is ignored.

    host-local reads `IP=` from CNI_ARGS, `args.cni.ips` and `runtimeConfig.ips` alike; a
    value may be "10.1.0.5" or "10.1.0.5/24".
    """
    out: list[IPAddress] = []
    for where, value in sources:
        if value is None:
            continue
        items = value if isinstance(value, list | tuple) else [value]
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise invalid_config(f"{where}[{i}]", item, "must be an IP address string")
            text = item.strip().split("/", 1)[0]
            try:
                addr = ipaddress.ip_address(text)
            except ValueError:
                raise invalid_config(
                    f"{where}[{i}]", item, "must be an IPv4 or IPv6 address (optionally /prefix)"
                ) from None
            if addr not in out:
                out.append(addr)
    return out
