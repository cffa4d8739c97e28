"""Kernel link and address operations through pyroute2 — and the one place where netlink
errors become named exceptions.

Every call into pyroute2 goes through `_translated`, so callers deal with
`LinkNotFound`, `LinkExists`, `NotSupported` … instead of errno numbers. Deletes treat
"already gone" as success, so they can be repeated (DEL may come twice).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenantnet.system.netns import NETNS_THREAD, NamespaceNotFound, run_in_netns

T = TypeVar("T")


class NetlinkProblem(Exception):
    """A netlink request failed; `errno` says how."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.errno = err


class LinkNotFound(NetlinkProblem):
    pass


class LinkExists(NetlinkProblem):
    pass


class NotSupported(NetlinkProblem):
    pass


class AddressInUse(NetlinkProblem):
    pass


_ERRNO_CLASSES: dict[int, type[NetlinkProblem]] = {
    errno.ENODEV: LinkNotFound,
    errno.ENOENT: LinkNotFound,
    errno.EEXIST: LinkExists,
    errno.EOPNOTSUPP: NotSupported,
    errno.EADDRINUSE: AddressInUse,
}


@contextmanager
def _translated(what: str) -> Iterator[None]:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        yield
    except NetlinkError as exc:
        cls = _ERRNO_CLASSES.get(exc.code, NetlinkProblem)
        raise cls(f"{what}: {exc.args[1] if len(exc.args) > 1 else exc}", exc.code) from None
    except OSError as exc:
        if isinstance(exc, NamespaceNotFound):
            raise
        raise NetlinkProblem(f"{what}: {exc.strerror or exc}", exc.errno or 0) from None


# One host-namespace IPRoute per thread. pyroute2 0.9's sync IPRoute drives an asyncio
# loop and keeps socket/loop state in its own threading.local, so one object shared by the
# agent's worker threads is not safe to use concurrently; a socket per (long-lived) worker
# thread is, and costs ≈ 1 ms once. The in-process plugin has one thread: one socket, as before.
_host = threading.local()
_host_all: list[Any] = []
_host_lock = threading.Lock()


def _host_ipr() -> Any:
    """This thread's IPRoute socket in the host namespace (opened on first use)."""
    ipr = getattr(_host, "ipr", None)
    if ipr is None:
        # A netns worker thread has left the host namespace: a socket opened there would
        # silently act on the pod's namespace.
        if threading.current_thread().name == NETNS_THREAD:
            raise RuntimeError("host netlink socket requested from inside a pod namespace thread")
        from pyroute2 import IPRoute

        ipr = _host.ipr = IPRoute()
        with _host_lock:
            _host_all.append(ipr)
    return ipr


def close() -> None:
    with _host_lock:
        sockets = list(_host_all)
        _host_all.clear()
    _host.__dict__.pop("ipr", None)
    for ipr in sockets:
        try:
            ipr.close()
        except Exception:
            pass


@dataclass
class LinkState:
    name: str
    index: int
    mac: str
    mtu: int
    up: bool
    kind: str = ""
    addresses: list[str] = field(default_factory=list)  # "10.0.0.2/24"


def _link_state(ipr: Any, msg: Any, with_addresses: bool) -> LinkState:
    linkinfo = msg.get("IFLA_LINKINFO")
    kind = linkinfo.get("IFLA_INFO_KIND") if linkinfo else ""
    state = LinkState(
        name=msg.get("IFLA_IFNAME"),
        index=msg["index"],
        mac=(msg.get("IFLA_ADDRESS") or "").lower(),
        mtu=msg.get("IFLA_MTU") or 0,
        up=bool(msg["flags"] & 1),
        kind=kind or "",
    )
    if with_addresses:
        for a in ipr.get_addr(index=msg["index"]):
            state.addresses.append(f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}")
    return state


def _lookup(ipr: Any, name: str, with_addresses: bool = False) -> LinkState | None:
    idx = ipr.link_lookup(ifname=name)
    if not idx:
        return None
    return _link_state(ipr, ipr.get_links(idx[0])[0], with_addresses)


def host_link(name: str) -> LinkState | None:
    with _translated(f"reading link {name}"):
        return _lookup(_host_ipr(), name)


def delete_host_link(name: str) -> bool:
    """Delete a host link; False if it was already gone."""
    ipr = _host_ipr()
    with _translated(f"deleting link {name}"):
        idx = ipr.link_lookup(ifname=name)
        if not idx:
            return False
        try:
            ipr.link("del", index=idx[0])
        except Exception as exc:  # the pair's netns went away in between: already gone
            if getattr(exc, "code", None) in (errno.ENODEV, errno.ENOENT):
                return False
            raise
    return True


def create_veth_into_netns(
    host_name: str, pod_name: str, netns_path: str, *, mtu: int | None, pod_mac: str | None
) -> None:
    """A veth pair whose pod end is born inside the pod netns (no costly link move)."""
    peer: dict[str, Any] = {"ifname": pod_name, "net_ns_fd": netns_path}
    if mtu:
        peer["mtu"] = mtu
    if pod_mac:
        peer["address"] = pod_mac
    spec: dict[str, Any] = {"ifname": host_name, "kind": "veth", "peer": peer}
    if mtu:
        spec["mtu"] = mtu
    ipr = _host_ipr()
    with _translated(f"creating veth {host_name} with peer {pod_name} in {netns_path}"):
        ipr.link("add", **spec)
        idx = ipr.link_lookup(ifname=host_name)[0]
        ipr.link("set", index=idx, state="up")


@dataclass
class AddressPlan:
    """What to configure on the pod interface: addresses, routes (dst, gw)."""

    addresses: Sequence[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = ()
    routes: Sequence[tuple[str, str | None]] = ()


def configure_pod_interface(netns_path: str, ifname: str, plan: AddressPlan) -> LinkState:
    """Bring the pod interface up, add addresses and routes; return its state."""

    def work(ipr: Any) -> LinkState:
        with _translated(f"configuring {ifname} in {netns_path}"):
            idx = ipr.link_lookup(ifname=ifname)
            if not idx:
                raise LinkNotFound(f"interface {ifname} not found in {netns_path}", errno.ENODEV)
            index = idx[0]
            lo = ipr.link_lookup(ifname="lo")
            if lo:
                ipr.link("set", index=lo[0], state="up")
            ipr.link("set", index=index, state="up")
            for addr in plan.addresses:
                try:
                    ipr.addr("add", index=index, address=str(addr.ip), prefixlen=addr.network.prefixlen)
                except Exception as exc:
                    if getattr(exc, "code", None) != errno.EEXIST:
                        raise
            for dst, gw in plan.routes:
                spec: dict[str, Any] = {"dst": dst, "oif": index}
                if gw:
                    spec["gateway"] = gw
                try:
                    ipr.route("add", **spec)
                except Exception as exc:
                    if getattr(exc, "code", None) != errno.EEXIST:
                        raise
            state = _lookup(ipr, ifname, with_addresses=True)
            assert state is not None
            return state

    return run_in_netns(netns_path, work)


def pod_link(netns_path: str, ifname: str) -> LinkState | None:
    """The pod interface as the kernel sees it, with addresses; None if absent."""

    def work(ipr: Any) -> LinkState | None:
        with _translated(f"reading {ifname} in {netns_path}"):
            return _lookup(ipr, ifname, with_addresses=True)

    return run_in_netns(netns_path, work)


def pod_routes(netns_path: str) -> list[tuple[str, str | None]]:
    def work(ipr: Any) -> list[tuple[str, str | None]]:
        out = []
        with _translated(f"reading routes in {netns_path}"):
            for family in (2, 10):
                for r in ipr.get_routes(family=family, table=254):
                    dst = r.get("RTA_DST")
                    dst = f"{dst}/{r['dst_len']}" if dst else ("0.0.0.0/0" if family == 2 else "::/0")
                    out.append((dst, r.get("RTA_GATEWAY")))
        return out

    return run_in_netns(netns_path, work)


def in_netns(netns_path: str, fn: Callable[[Any], T]) -> T:
    """Run `fn(ipr)` in a netns with netlink errors translated (for callers with special needs)."""

    def work(ipr: Any) -> T:
        with _translated(f"netlink in {netns_path}"):
            return fn(ipr)

    return run_in_netns(netns_path, work)


def move_to_netns(name: str, netns_path: str) -> None:
    """Move a host link into a namespace (≈ 19 ms here; only for devices we cannot create there)."""
    ipr = _host_ipr()
    with _translated(f"moving {name} into {netns_path}"):
        idx = ipr.link_lookup(ifname=name)
        if not idx:
            raise LinkNotFound(f"link {name} not found in the host namespace", errno.ENODEV)
        ipr.link("set", index=idx[0], net_ns_fd=netns_path)


def _set(ipr: Any, index: int, *, new_name: str | None = None, mac: str | None = None,
         mtu: int | None = None, up: bool | None = None) -> None:
    if new_name is not None or mac is not None:
        ipr.link("set", index=index, state="down")  # renaming needs the link down
    if new_name is not None:
        ipr.link("set", index=index, ifname=new_name)
    if mac is not None:
        ipr.link("set", index=index, address=mac)
    if mtu is not None:
        ipr.link("set", index=index, mtu=mtu)
    if up is not None:
        ipr.link("set", index=index, state="up" if up else "down")


def set_pod_link(netns_path: str, name: str, *, new_name: str | None = None, mac: str | None = None,
                 mtu: int | None = None, up: bool | None = None) -> None:
    def work(ipr: Any) -> None:
        with _translated(f"configuring {name} in {netns_path}"):
            idx = ipr.link_lookup(ifname=name)
            if not idx:
                raise LinkNotFound(f"interface {name} not found in {netns_path}", errno.ENODEV)
            _set(ipr, idx[0], new_name=new_name, mac=mac, mtu=mtu, up=up)

    run_in_netns(netns_path, work)


def set_host_link(name: str, *, new_name: str | None = None, mac: str | None = None,
                  mtu: int | None = None, up: bool | None = None) -> None:
    ipr = _host_ipr()
    with _translated(f"configuring host link {name}"):
        idx = ipr.link_lookup(ifname=name)
        if not idx:
            raise LinkNotFound(f"link {name} not found in the host namespace", errno.ENODEV)
        _set(ipr, idx[0], new_name=new_name, mac=mac, mtu=mtu, up=up)


def return_to_host(netns_path: str, name: str, host_name: str) -> bool:
    """Move `name` out of the pod back to the host as `host_name`; False if it is not there."""
    host_pid = os.getpid()  # the main thread stays in the host namespace

    def work(ipr: Any) -> bool:
        with _translated(f"returning {name} from {netns_path} to the host as {host_name}"):
            idx = ipr.link_lookup(ifname=name)
            if not idx:
                return False
            ipr.link("set", index=idx[0], state="down")
            if name != host_name:
                ipr.link("set", index=idx[0], ifname=host_name)
            ipr.link("set", index=idx[0], net_ns_pid=host_pid)
            return True

    return run_in_netns(netns_path, work)
