"""Kernel link and address operations through pyroute2 — and the one place where netlink
errors become named exceptions.

Every call into pyroute2 goes through `translated`, so callers deal with
`LinkNotFound`, `LinkExists`, `NotSupported` … instead of errno numbers. Deletes treat
"already gone" as success, so they can be repeated (DEL may come twice).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from tenantnet.plugin.system import rtnl
from tenantnet.plugin.system.groupcommit import GroupCommit, Pending
from tenantnet.plugin.system.netns import (
    NETNS_THREAD,
    NamespaceNotFound,
    open_netns_fd,
    open_rtnl,
    run_in_netns,
)

# What a link move sets on the link: the drivers name it through this module, the one they call.
from tenantnet.plugin.system.rtnl import LinkChange as LinkChange

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


class NameTakenInPod(LinkExists):
    """`move_into_pod`: the link moved, and the name it was to take in the pod is another
    link's there; it stays in the pod under the name it had on the host."""


_ERRNO_CLASSES: dict[int, type[NetlinkProblem]] = {
    errno.ENODEV: LinkNotFound,
    errno.ENOENT: LinkNotFound,
    errno.EEXIST: LinkExists,
    errno.EOPNOTSUPP: NotSupported,
    errno.EADDRINUSE: AddressInUse,
}


@contextmanager
def translated(what: str) -> Iterator[None]:
    """The one place netlink errors become ours: an errno-named NetlinkProblem subclass
    whose message says what was being done (`what`)."""
    try:
        yield
    except OSError as exc:  # tenantnet.plugin.system.rtnl's RtnlError, socket errors
        if isinstance(exc, NamespaceNotFound):
            raise
        cls = _ERRNO_CLASSES.get(exc.errno or 0, NetlinkProblem)
        raise cls(f"{what}: {exc.strerror or exc}", exc.errno or 0) from None
    except Exception as exc:
        # pyroute2's NetlinkError. Looked up, not imported: the hot path does not use
        # pyroute2, and importing it costs ≈ 130 ms in a fresh process.
        errors = sys.modules.get("pyroute2.netlink.exceptions")
        if errors is None or not isinstance(exc, errors.NetlinkError):
            raise
        cls = _ERRNO_CLASSES.get(exc.code, NetlinkProblem)
        raise cls(f"{what}: {exc.args[1] if len(exc.args) > 1 else exc}", exc.code) from None


# One host-namespace IPRoute per thread. pyroute2 0.9's sync IPRoute drives an asyncio
# loop and keeps socket/loop state in its own threading.local, so one object shared by the
# agent's worker threads is not safe to use concurrently; a socket per (long-lived) worker
# thread is, and costs ≈ 1 ms once. The in-process plugin has one thread: one socket, as before.
_host = threading.local()
_host_all: list[Any] = []
_host_lock = threading.Lock()


def host_ipr() -> Any:
    """This thread's IPRoute socket in the host namespace (opened on first use)."""
    ipr = getattr(_host, "ipr", None)
    if ipr is None:
        _require_host_thread()
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
    """A link as the kernel reports it (a pod's interface after it is configured)."""

    name: str
    index: int
    mac: str
    mtu: int
    up: bool
    kind: str = ""
    addresses: list[str] = field(default_factory=list)  # "10.0.0.2/24"
    alias: str = ""  # IFLA_IFALIAS: where tenantnet marks the links it owns


def _state(rt: Any, name: str, with_addresses: bool = False) -> LinkState | None:
    """A link by name through a plain rtnetlink socket (tenantnet.plugin.system.rtnl)."""
    link = rt.link(name)
    if link is None:
        return None
    return LinkState(name=link.name, index=link.index, mac=link.mac, mtu=link.mtu, up=link.up,
                     kind=link.kind, addresses=rt.addresses(link.index) if with_addresses else [],
                     alias=link.alias)


def _require_host_thread() -> None:
    # A netns worker thread has left the host namespace: a socket opened there would
    # silently act on the pod's namespace.
    if threading.current_thread().name == NETNS_THREAD:
        raise RuntimeError("host netlink socket requested from inside a pod namespace thread")


def _host_rtnl() -> Any:
    """This thread's plain rtnetlink socket in the host namespace."""
    _require_host_thread()
    return rtnl.host()


def host_link(name: str) -> LinkState | None:
    with translated(f"reading link {name}"):
        return _state(_host_rtnl(), name)


def host_links() -> list[LinkState]:
    """Every link of the host namespace (a dump, for GC)."""
    with translated("listing host links"):
        return [LinkState(name=li.name, index=li.index, mac=li.mac, mtu=li.mtu, up=li.up, kind=li.kind,
                          alias=li.alias) for li in _host_rtnl().links()]


def delete_host_link(name: str) -> bool:
    """Delete a host link; False if it was already gone (also when its pair's netns went
    away in between). Answers once the kernel has unregistered it; deletions that arrive
    while others are under way are done together (`_Reaper`)."""
    with translated(f"deleting link {name}"):
        return _reaper.delete(name)


# Link groups tenantnet uses, for the moment of a batched delete only: "tn" in the high
# half. A link found in one of them is ours and already being deleted.
REAP_GROUP_BASE = 0x746E0000
REAP_GROUPS = 0x10000


class _Reaper:
    """Host link deletions of concurrent requests as one unregistration.

    Deleting a veth makes the kernel wait for RCU grace periods (≈ 15–25 ms here) while it
    holds the rtnl lock, so N concurrent DELs wait N times in a row. A group commit
    (tenantnet.plugin.system.groupcommit): the first deletion runs at once, as a plain
    RTM_DELLINK; the ones arriving meanwhile queue, and the next of them to run puts them all
    in a link group of its own and deletes the group with one RTM_DELLINK: one wait for all
    (rtnl_group_dellink → unregister_netdevice_many). Each caller returns only once its own
    link is gone — DEL is never answered before.
    """

    def __init__(self) -> None:
        self._deletions: GroupCommit[str, bool] = GroupCommit(self._delete_together,
                                                              interrupted=self._interrupted)
        self._group = REAP_GROUP_BASE + (os.getpid() % REAP_GROUPS)

    def delete(self, name: str) -> bool:
        if not self._deletions.idle and _host_rtnl().link(name) is None:
            return False  # nothing to wait for (an ADD clearing a leftover that is not there)
        return self._deletions.submit(name)

    @staticmethod
    def _interrupted(name: str) -> Exception:
        # OSError, as the kernel's own errors: `translated` names the link being deleted.
        return OSError(errno.EINTR, "interrupted before the link was deleted")

    def _delete_together(self, batch: list[Pending[str, bool]]) -> None:
        """Each deletion settled: True once its link is gone, False if it was already gone,
        or the kernel's error (for a failed group deletion: every link of the group's)."""
        rt = _host_rtnl()
        if len(batch) == 1:
            (deletion,) = batch
            try:
                deletion.succeed(rt.delete_link(deletion.request))
            except OSError as exc:
                deletion.fail(exc)
            return
        # Only the leader of a batch is here (one at a time): the group is its own.
        self._group = REAP_GROUP_BASE + (self._group + 1 - REAP_GROUP_BASE) % REAP_GROUPS
        grouped = []
        for deletion in batch:
            try:
                if rt.set_group(deletion.request, self._group):
                    grouped.append(deletion)
                else:
                    deletion.succeed(False)
            except OSError as exc:
                deletion.fail(exc)
        if not grouped:
            return
        try:
            rt.delete_group(self._group)
        except OSError as exc:
            for deletion in grouped:
                deletion.fail(exc)
        else:
            for deletion in grouped:
                deletion.succeed(True)


_reaper = _Reaper()


def create_veth_into_netns(
    host_name: str, pod_name: str, netns_path: str, *, mtu: int | None, pod_mac: str | None,
    host_alias: str | None = None,
) -> LinkState:
    """A veth pair whose pod end is born inside the pod netns (no costly link move); the
    host end comes up with it, without IPv6: it is a switch port. An address there would
    only add the host's own neighbour discovery and MLD chatter, flooded to every port of
    the VLAN (measured: most of a userspace vswitchd's work in a burst of 1,000 attachments
    on one VLAN); and IPv6 merely enabled on it adds its multicast route, whose event makes
    ovs-vswitchd re-read every route and address of the host (with IPv6 off: 3.2 instead
    of 7.3 ms of vswitchd CPU per port, 512 ports here). Returns the host end."""
    fd = open_netns_fd(netns_path)
    try:
        with translated(f"creating veth {host_name} with peer {pod_name} in {netns_path}"):
            rt = _host_rtnl()
            link = rt.create_veth(host_name, pod_name, fd, mtu=mtu, peer_mac=pod_mac,
                                  ipv6_link_local=False, alias=host_alias, up=False)
            assert link is not None  # read back without ipv6_link_local
            _disable_ipv6(host_name)
            rt.set_link(link.index, up=True)
    finally:
        os.close(fd)
    return LinkState(name=link.name, index=link.index, mac=link.mac, mtu=link.mtu, up=True, kind=link.kind,
                     alias=host_alias or "")


def _disable_ipv6(name: str) -> None:
    """IPv6 off on a host link that is down (this thread is in the host namespace, which is
    the one /proc/sys/net shows it). A kernel without IPv6 has nothing to turn off."""
    try:
        fd = os.open(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6", os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)


@dataclass
class AddressPlan:
    """What to configure on the pod interface: addresses, routes (dst, gw)."""

    addresses: Sequence[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = ()
    routes: Sequence[tuple[str, str | None]] = ()


def configure_pod_interface(netns_path: str, ifname: str, plan: AddressPlan,
                            tx_checksum_off: bool = False) -> LinkState:
    """Bring the pod interface up, add addresses and routes; return its state. With
    `tx_checksum_off`, its TX checksum offload is switched off first (an OVS userspace
    datapath, tenantnet/plugin/system/ethtool.py), on the socket this already holds in the
    pod's namespace (the ioctl acts in the socket's namespace; no second thread enters it)."""
    with open_rtnl(netns_path) as rt, translated(f"configuring {ifname} in {netns_path}"):
        link = rt.link(ifname)
        if link is None:
            raise LinkNotFound(f"interface {ifname} not found in {netns_path}", errno.ENODEV)
        if tx_checksum_off:
            from tenantnet.plugin.system import ethtool

            ethtool.set_tx_checksum(rt.sock, ifname, False)
        lo = rt.link("lo")
        if lo is not None and not lo.up:
            rt.set_link(lo.index, up=True)
        rt.set_link(link.index, up=True)
        for addr in plan.addresses:
            _unless_exists(rt.add_address, link.index, addr)
        for dst, gw in plan.routes:
            _unless_exists(rt.add_route, dst, oif=link.index, gateway=gw)
        state = _state(rt, ifname, with_addresses=True)
        assert state is not None
        return state


def _unless_exists(request: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """A request whose EEXIST means "already done" (a repeated ADD)."""
    try:
        request(*args, **kwargs)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise


def pod_link(netns_path: str, ifname: str) -> LinkState | None:
    """The pod interface as the kernel sees it, with addresses; None if absent."""
    with open_rtnl(netns_path) as rt, translated(f"reading {ifname} in {netns_path}"):
        return _state(rt, ifname, with_addresses=True)


def pod_routes(netns_path: str) -> list[tuple[str, str | None]]:
    def work(ipr: Any) -> list[tuple[str, str | None]]:
        out = []
        with translated(f"reading routes in {netns_path}"):
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
        with translated(f"netlink in {netns_path}"):
            return fn(ipr)

    return run_in_netns(netns_path, work)


def _set(rt: Any, index: int, *, new_name: str | None = None, mac: str | None = None,
         mtu: int | None = None, up: bool | None = None, alias: str | None = None) -> None:
    if new_name is not None or mac is not None:
        rt.set_link(index, up=False)  # renaming needs the link down
    if new_name is not None:
        rt.set_link(index, name=new_name)
    if mac is not None:
        rt.set_link(index, mac=mac)
    if mtu is not None:
        rt.set_link(index, mtu=mtu)
    if alias is not None:
        rt.set_link(index, alias=alias)
    if up is not None:
        rt.set_link(index, up=up)


def set_host_link(name: str, *, new_name: str | None = None, mac: str | None = None,
                  mtu: int | None = None, up: bool | None = None, alias: str | None = None) -> None:
    rt = _host_rtnl()
    with translated(f"configuring host link {name}"):
        link = rt.link(name)
        if link is None:
            raise LinkNotFound(f"link {name} not found in the host namespace", errno.ENODEV)
        _set(rt, link.index, new_name=new_name, mac=mac, mtu=mtu, up=up, alias=alias)


def move_into_pod(name: str, netns_path: str, pod_side: LinkChange) -> None:
    """Move the host link `name` into the pod and configure it there (`pod_side`: its name in
    the pod, MAC, MTU, ownership mark) with one request on the host socket: no namespace
    socket, and no separate down, rename, MAC, MTU and alias requests after the move
    (rtnl.Rtnl.move_link). It stays down: the core brings it up with its addresses.

    A refusal is worded as the move's or as the configuration's, whichever part the kernel
    refused; after the move only the rename can find its name taken (NameTakenInPod)."""
    fd = open_netns_fd(netns_path)
    try:
        link = host_link(name)  # which also makes sure this thread is in the host namespace
        if link is None:
            raise LinkNotFound(f"link {name} not found in the host namespace", errno.ENODEV)
        with translated(f"moving {name} into {netns_path}"):
            try:
                _host_rtnl().move_link(link.index, pod_side, netns_fd=fd)
                return
            except rtnl.MovedUnconfigured as exc:
                refused = exc
    finally:
        os.close(fd)
    configuring = f"configuring {name} in {netns_path}"
    if refused.errno == errno.EEXIST:
        raise NameTakenInPod(f"{configuring}: {refused.strerror}", refused.errno)
    with translated(configuring):
        raise refused


def return_from_pod(netns_path: str, ifname: str, host_name: str, home: LinkChange, mark: str) -> bool:
    """Send a link `move_into_pod` moved from the pod back to the host as `host_name`, put
    back as it was there (`home`), with one request on a socket in the pod
    (rtnl.Rtnl.move_link: the move closes it, so the rename needs no down of its own); False
    if it is not in the pod.

    The link is `ifname` when that carries the attachment's `mark`. Otherwise a link still
    named `host_name` in the pod is it: its rename into `ifname` was refused (NameTakenInPod:
    the name was the pod's own interface's, which must stay where it is). An unmarked
    `ifname` alone is taken, as ever (its mark can be cleared from inside the pod)."""
    with open_rtnl(netns_path) as rt, \
            translated(f"returning {ifname} from {netns_path} to the host as {host_name}"):
        link = rt.link(ifname)
        if (link is None or link.alias != mark) and host_name != ifname:
            link = rt.link(host_name) or link
        if link is None:
            return False
        try:
            # The process's namespace is the host's: its main thread never leaves it.
            rt.move_link(link.index, replace(home, name=host_name), netns_pid=os.getpid())
            return True
        except rtnl.MovedUnconfigured as exc:
            refused = exc
    with translated(f"configuring host link {host_name}"):
        raise refused
