"""Which network namespace holds a VF's RDMA device, and moving it between the host and a pod.

This module owns the interface the VF drivers use for RDMA devices (`RdmaControl`), its
errors, the identity of a network namespace (`NetnsId`), the real implementation over RDMA
netlink (`NetlinkRdmaControl`, on `rdmanl`), and the registry by scheme at the end — the
same arrangement as `vfcontrol` for VFs. Finding a VF's RDMA device (`infiniband/` under
its PCI device) is `sysfs.py`'s.

The node config is expected to choose the implementation (not read yet; nodeconfig.py owns
the keys):

    rdmaControl: netlink                        # the default: the kernel's RDMA netlink
    rdmaControl: lab-rdma:<lab dir>             # the lab's simulation (tenantnet.lab.rdma)
    rdmaControlModules: [tenantnet.lab.rdma]    # imported when the scheme is not registered yet

What the kernel does, and so what every implementation promises:
- In `shared` netns mode (ib_core's default) every RDMA device is visible from every
  namespace and none can be moved (EOPNOTSUPP → `RdmaSharedMode`). Only `exclusive` mode
  isolates; the mode can be changed only while no namespace but init_net exists (EBUSY
  otherwise), so in practice it is the ib_core module parameter `netns_mode=0` at boot.
- In exclusive mode a device belongs to one namespace and is seen (netlink, and sysfs: the
  `infiniband` class is namespace-tagged) only from there. It is moved by a request sent
  from inside the namespace that holds it.
- When a namespace is destroyed the kernel moves its RDMA devices back to init_net itself
  (rdma_dev_exit_net in drivers/infiniband/core/device.c). So `return_to_host` of a device
  whose pod namespace is gone has nothing to move: it checks that the device is back. The
  teardown runs asynchronously once the last reference to the namespace is dropped, so the
  netlink implementation waits for it a bounded time (`settle`).

Errors are `RdmaProblem`s, a kind of `netlink.NetlinkProblem` (the core maps those to code
101), with the errno the kernel gave.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from tenantnet.plugin.system import rdmanl
from tenantnet.plugin.system.netlink import NetlinkProblem
from tenantnet.plugin.system.netns import CLONE_NEWNET, NS_GET_NSTYPE, NamespaceNotFound, open_netns_fd
from tenantnet.plugin.system.providers import Providers

SHARED, EXCLUSIVE = "shared", "exclusive"
SHARED_MODE_FIX = ("switch the RDMA subsystem to exclusive mode: `rdma system set netns exclusive` "
                   "(refused while any other network namespace exists, so in practice the ib_core "
                   "module parameter netns_mode=0 at boot)")
THREAD_NETNS = "/proc/thread-self/ns/net"  # the calling thread's own namespace: the host, for the plugin


class RdmaProblem(NetlinkProblem):
    """An RDMA device could not be read or moved; `errno` says how."""


class RdmaUnavailable(RdmaProblem):
    """No RDMA netlink in this kernel (ib_core not loaded): there are no RDMA devices to move."""


class RdmaDeviceNotFound(RdmaProblem):
    """The RDMA device is not where it was looked for (ENODEV)."""


class RdmaSharedMode(RdmaProblem):
    """The RDMA subsystem is in shared netns mode: devices cannot be moved (EOPNOTSUPP)."""


@dataclass(frozen=True)
class NetnsId:
    """A network namespace, as the (st_dev, st_ino) of its nsfs file: the same for every path
    naming it (/run/netns/NAME, /proc/PID/ns/net)."""

    dev: int
    ino: int

    def __str__(self) -> str:
        return f"net:[{self.ino}]"  # as /proc/PID/ns/net links read

    def to_dict(self) -> dict[str, int]:
        return {"dev": self.dev, "ino": self.ino}

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> NetnsId:
        return cls(int(data["dev"]), int(data["ino"]))


def netns_identity(path: str) -> NetnsId | None:
    """The namespace at `path`; None when there is none (no such file, or a file that is not
    a network namespace — a runtime may leave /run/netns/NAME behind, unmounted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        try:
            if fcntl.ioctl(fd, NS_GET_NSTYPE) != CLONE_NEWNET:
                return None
        except OSError:
            return None
        st = os.fstat(fd)
        return NetnsId(st.st_dev, st.st_ino)
    finally:
        os.close(fd)


class RdmaControl(ABC):
    """Where RDMA devices are and moving them (RDMA netlink on a real node, the lab's simulation).

    "The host" is the caller's own network namespace (the plugin's, the agent's)."""

    @abstractmethod
    def netns_mode(self) -> str:
        """`shared` or `exclusive`; RdmaUnavailable when the node has no RDMA subsystem."""

    @abstractmethod
    def where(self, device: str, candidates: Sequence[str] = ()) -> NetnsId | None:
        """None when the host holds `device`; else the namespace that does. The kernel does not
        say where a device is, so the netlink implementation finds it only in the namespaces
        at the paths in `candidates`. RdmaDeviceNotFound when it is found nowhere."""

    @abstractmethod
    def move(self, device: str, netns_path: str) -> None:
        """Move `device` from the host into the namespace at `netns_path`. Already there: nothing
        to do. RdmaSharedMode in shared mode; RdmaDeviceNotFound when the host does not hold
        it (another namespace does); NamespaceNotFound when `netns_path` is no namespace."""

    @abstractmethod
    def return_to_host(self, device: str, from_netns_path: str | None) -> bool:
        """Bring `device` back from the namespace at `from_netns_path` (pass the recorded netns
        path, also when CNI_NETNS is empty). True when the host holds it afterwards (also when
        it did already); False when it is in a namespace this cannot address (neither the
        host nor `from_netns_path`) — the kernel returns it when that namespace dies.

        Works when the pod namespace is gone (`from_netns_path` missing or no longer a
        namespace): the kernel has handed the device back to init_net itself, and this only
        checks that it arrived. Repeating it is harmless."""


# -- the real implementation ----------------------------------------------------------------------


class RdmaNetlinkCalls(Protocol):
    """What NetlinkRdmaControl uses of `rdmanl` (tests pass a stand-in)."""

    def system_netns_mode(self, netns: str | None = None) -> str: ...

    def index_of(self, name: str, netns: str | None = None) -> int | None: ...

    def move_to_netns(self, device: str | int, netns_fd: int, *, netns: str | None = None) -> None: ...


@contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except rdmanl.RdmaNlError as exc:
        cls: type[RdmaProblem] = RdmaProblem
        if exc.errno == errno.EPROTONOSUPPORT:
            cls = RdmaUnavailable
        elif exc.errno == errno.ENODEV:
            cls = RdmaDeviceNotFound
        raise cls(f"{what}: {exc.strerror or exc}", exc.errno or 0) from None


class NetlinkRdmaControl(RdmaControl):
    """RDMA control with RDMA netlink (`rdmanl`): requests about the host from the calling
    thread, requests about a pod from a short-lived thread inside the pod's namespace.

    `host_netns` names the namespace devices return to (by default the calling thread's own);
    `settle` bounds the wait for the kernel's own return of a device whose namespace is gone.
    """

    def __init__(self, calls: RdmaNetlinkCalls | None = None, host_netns: str = THREAD_NETNS,
                 settle: float = 2.0) -> None:
        self.calls: RdmaNetlinkCalls = calls if calls is not None else rdmanl
        self.host_netns = host_netns
        self.settle = settle

    def netns_mode(self) -> str:
        with _translated("reading the RDMA subsystem's netns mode"):
            return self.calls.system_netns_mode()

    def where(self, device: str, candidates: Sequence[str] = ()) -> NetnsId | None:
        with _translated(f"looking for RDMA device {device}"):
            if self.calls.index_of(device) is not None:
                return None
            for path in candidates:
                found = netns_identity(path)
                if found is None:
                    continue
                try:
                    if self.calls.index_of(device, netns=path) is not None:
                        return found
                except NamespaceNotFound:
                    continue  # gone meanwhile
        looked = f" nor in {', '.join(candidates)}" if candidates else ""
        raise RdmaDeviceNotFound(f"RDMA device {device} is not in the host network namespace{looked}",
                                 errno.ENODEV)

    def move(self, device: str, netns_path: str) -> None:
        fd = open_netns_fd(netns_path)  # NamespaceNotFound for a path that is none
        try:
            with _translated(f"moving RDMA device {device} into {netns_path}"):
                try:
                    self.calls.move_to_netns(device, fd)
                except rdmanl.RdmaNlError as exc:
                    if exc.errno == errno.ENODEV and self._holds(netns_path, device):
                        return  # a repeated ADD: it is there already
                    if exc.errno == errno.EOPNOTSUPP and self.calls.system_netns_mode() == SHARED:
                        raise RdmaSharedMode(f"cannot move RDMA device {device} into {netns_path}: the RDMA "
                                             f"subsystem is in shared netns mode; {SHARED_MODE_FIX}",
                                             errno.EOPNOTSUPP) from None
                    raise
        finally:
            os.close(fd)

    def _holds(self, netns_path: str, device: str) -> bool:
        return self.calls.index_of(device, netns=netns_path) is not None

    def return_to_host(self, device: str, from_netns_path: str | None) -> bool:
        gone = False
        if from_netns_path:
            outcome = self._move_back(device, from_netns_path)
            if outcome == "moved":
                return True
            gone = outcome == "gone"
        # The host should hold it now (or soon, when the kernel is still tearing the pod's
        # namespace down); a single look when no namespace was named.
        deadline = time.monotonic() + (self.settle if gone else 0.0)
        with _translated(f"looking for RDMA device {device} in the host network namespace"):
            while True:
                if self.calls.index_of(device) is not None:
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)

    def _move_back(self, device: str, from_netns_path: str) -> str:
        """Move it from inside `from_netns_path` to the host: "moved", "absent" (that namespace
        does not hold it) or "gone" (there is no namespace at that path, or no longer)."""
        if netns_identity(from_netns_path) is None:
            return "gone"
        host_fd = os.open(self.host_netns, os.O_RDONLY | os.O_CLOEXEC)  # before entering the pod's
        try:
            with _translated(f"returning RDMA device {device} from {from_netns_path} to the host"):
                try:
                    self.calls.move_to_netns(device, host_fd, netns=from_netns_path)
                except NamespaceNotFound:
                    return "gone"  # destroyed meanwhile
                except rdmanl.RdmaNlError as exc:
                    if exc.errno != errno.ENODEV:
                        raise
                    return "absent"
        finally:
            os.close(host_fd)
        return "moved"


# ---- which RDMA control a node uses -------------------------------------------------------
# The node config's `rdmaControl` is `netlink` (the kernel's RDMA netlink) or
# `<scheme>:<argument>`, served by an RDMA control registered under that scheme. Providers
# outside the plugin wing — the lab's simulation — register themselves when imported; the
# node config's `rdmaControlModules` names the modules to import. So the plugin never
# imports the lab, and the simulation is used only where the admin's node config says so.
_PROVIDERS = Providers[RdmaControl]("rdmaControl", "RDMA control", NetlinkRdmaControl)


def register(scheme: str, factory: Callable[[str], RdmaControl]) -> None:
    """Serve `rdmaControl: <scheme>:<argument>` with `factory(argument)`."""
    _PROVIDERS.register(scheme, factory)


def control_for(spec: str, modules: Iterable[str] = ()) -> RdmaControl:
    """The RDMA control the node config's `rdmaControl` names (see `providers.py`)."""
    return _PROVIDERS.control_for(spec, modules)
