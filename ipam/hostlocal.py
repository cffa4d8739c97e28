"""Taking over host-local's on-disk state so that switching plugins moves no address.

host-local keeps, per network, `<dataDir>/<network>/<address>` files containing
`<containerID>\\r\\n<ifname>` (older releases: the container id alone) and
`last_reserved_ip.<rangeSetIndex>` with the cursor. Reading is separate from recording so
the CLI can show a dry run; recording is one transaction that refuses any conflict.
"""

from __future__ import annotations

import ipaddress
import os
from typing import NamedTuple

from cni.errors import CniError, Code
from cni.names import network_name_problem
from cni.result import IPAddress
from ipam.store import Allocation, Store

_CURSOR_PREFIX = "last_reserved_ip."


class HostLocalNetwork(NamedTuple):
    name: str
    allocations: list[Allocation]
    cursors: dict[int, IPAddress]


class ImportReport(NamedTuple):
    imported: list[Allocation]  # recorded (or, if not `recorded`, would have been)
    already: list[Allocation]  # the store already had them, for the same attachment
    conflicts: list[tuple[Allocation, Allocation]]  # (host-local's, the store's holder)
    recorded: bool


def _address_of(filename: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(filename)
    except ValueError:
        return None


def _is_network_dir(path: str) -> bool:
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(_address_of(n) or n.startswith(_CURSOR_PREFIX) for n in names)


def read_network(path: str, name: str, default_ifname: str = "eth0") -> HostLocalNetwork:
    problem = network_name_problem(name)
    if problem:
        raise CniError(Code.INVALID_CONFIG, f"host-local network directory {path!r}: name "
                                            f"{name!r} {problem}")
    allocations: list[Allocation] = []
    cursors: dict[int, IPAddress] = {}
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        if not os.path.isfile(full):
            continue
        if entry.startswith(_CURSOR_PREFIX):
            index = entry[len(_CURSOR_PREFIX):]
            with open(full, encoding="utf-8") as fh:
                cursor = _address_of(fh.read().strip())
            if index.isdigit() and cursor is not None:
                cursors[int(index)] = cursor
            continue
        address = _address_of(entry)
        if address is None:
            continue  # `lock` and anything else host-local keeps there
        with open(full, encoding="utf-8") as fh:
            lines = [line.strip() for line in fh.read().splitlines()]
        container_id = lines[0] if lines else ""
        if not container_id:
            continue
        # Releases before CNI 0.7 wrote the container id only; their interface is unknown,
        # so the caller chooses (the usual eth0 by default).
        ifname = lines[1] if len(lines) > 1 and lines[1] else default_ifname
        allocations.append(Allocation(
            network=name,
            address=address,
            container_id=container_id,
            ifname=ifname,
            created=os.path.getmtime(full),
        ))
    return HostLocalNetwork(name, allocations, cursors)


def read_dir(path: str, only: str | None = None, default_ifname: str = "eth0") -> list[HostLocalNetwork]:
    """host-local's dataDir (one sub-directory per network) or one network's directory."""
    if not os.path.isdir(path):
        raise CniError(Code.IO_FAILURE, f"{path!r} is not a directory")
    if _is_network_dir(path):
        name = only or os.path.basename(os.path.normpath(path))
        return [read_network(path, name, default_ifname)]
    out = []
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        if os.path.isdir(full) and (only is None or entry == only) and _is_network_dir(full):
            out.append(read_network(full, entry, default_ifname))
    if only is not None and not out:
        raise CniError(Code.IO_FAILURE, f"no host-local network {only!r} under {path!r}")
    return out


def import_networks(store: Store, networks: list[HostLocalNetwork], *,
                    dry_run: bool = False) -> ImportReport:
    """Record host-local's allocations in one transaction; with any conflict, record nothing."""
    imported: list[Allocation] = []
    already: list[Allocation] = []
    conflicts: list[tuple[Allocation, Allocation]] = []
    with store.transaction() as txn:
        for net in networks:
            for a in net.allocations:
                holder = txn.holder(a.network, a.address)
                if holder is None:
                    imported.append(a)
                elif holder.attachment == a.attachment:
                    already.append(a)
                else:
                    conflicts.append((a, holder))
        if conflicts or dry_run:
            return ImportReport(imported, already, conflicts, recorded=False)
        for a in imported:
            txn.insert(a)
        for net in networks:
            for index, cursor in net.cursors.items():
                # Our own cursor, if we already allocated on this network, stays.
                if txn.last_reserved(net.name, index) is None:
                    txn.set_last_reserved(net.name, index, cursor)
    return ImportReport(imported, already, conflicts, recorded=True)


def import_dir(store: Store, path: str, only: str | None = None, *, default_ifname: str = "eth0",
               dry_run: bool = False) -> ImportReport:
    return import_networks(store, read_dir(path, only, default_ifname), dry_run=dry_run)
