"""The interface every attachment mode implements.

A driver owns the objects of one mode (for `ovs`: a veth pair and an OVS port) and
everything that depends on the mode: its typed plan, what STATUS probes, where GC finds
unrecorded objects, whether the pod has a netdev to check. The core owns everything shared:
records, IPAM, addresses in the pod, results, rollback. Which driver serves which mode is
`tenantnet/plugin/modes.py`.
"""

from __future__ import annotations

import contextvars
import threading
from _queue import SimpleQueue  # queue.SimpleQueue itself, without queue's other imports
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from cni.env import CniEnv
from cni.netconf import NetConf
from cni.result import Interface
from tenantnet.plugin import digest
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import AttachmentRecord, Plan, RecordStore
from tenantnet.plugin.tnconf import TenantnetConf


@dataclass
class Attached:
    """What a driver made: the host-side interface (if any) and the pod interface's name."""

    host: Interface | None
    pod_ifname: str
    pci_id: str = ""
    # False when there is no kernel netdev in the pod (a VF bound to vfio-pci for DPDK):
    # addresses are then allocated and reported but configured by the workload itself.
    has_netdev: bool = True
    # The NPWG device-info "pci" fields (pci-address, pf-pci-address, rdma-device, …).
    device_info: dict[str, str] | None = None
    # Driver work still running on a helper thread (ovs: the port's OVSDB transaction) while
    # the core does IPAM and the pod's addresses; the core waits for it before it reports
    # success, and before any rollback.
    pending: Pending | None = None
    # The pod end must compute its own TX checksums (an OVS userspace datapath): the core
    # switches the offload off while it configures the pod interface.
    tx_checksum_off: bool = False


MARK_PREFIX = "tenantnet:"


def owner_mark(network: str, container_id: str, ifname: str) -> str:
    """The ownership mark tenantnet writes into the interface alias (IFLA_IFALIAS, ≤ 255
    bytes) of the links it creates or takes: a host veth, a VF's netdev. The alias travels
    with the link between namespaces, so a DEL without a record can prove that a link is
    this attachment's before it touches it (docs/security.md). The network is hashed to keep
    the mark within the kernel's limit; container ids have no ':' and ifnames no '/'."""
    hashed = digest.sha256_hex(network.encode())[:16]
    return f"{MARK_PREFIX}{hashed}:{container_id}/{ifname}"


def mark_owner(alias: str, network: str) -> tuple[str, str] | None:
    """(container id, ifname) of a mark of `network`, or None if the alias is no such mark."""
    prefix = owner_mark(network, "", "")[:-1]
    if not alias.startswith(prefix):
        return None
    cid, sep, ifname = alias[len(prefix):].partition("/")
    return (cid, ifname) if sep and cid and ifname else None


class Pending:
    """The outcome of a step handed to a helper thread (`in_background`).

    What the core needs of concurrent.futures.Future — wait, result, exception — without
    importing concurrent.futures, which imports `logging` with it: ≈ 4 ms of every
    one-shot exec of the plugin (tenantnet/entry/oneshotlog.py says why that matters)."""

    __slots__ = ("_done", "_value", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def _settle(self, value: Any, error: BaseException | None) -> None:
        self._value, self._error = value, error
        self._done.set()

    def wait(self) -> None:
        """Until the step has returned or raised."""
        self._done.wait()

    def exception(self) -> BaseException | None:
        """What the step raised (None if it returned); waits for it."""
        self._done.wait()
        return self._error

    def result(self) -> Any:
        """What the step returned; re-raises what it raised. Waits for it."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


HELPERS = 16  # at most this many helper threads; more steps wait for one to be free
_Job = tuple[Pending, contextvars.Context, Callable[..., Any], tuple[Any, ...], bool]
_jobs: SimpleQueue[_Job] = SimpleQueue()
_helpers_lock = threading.Lock()
_helpers = 0  # threads started
# Helpers waiting for a step, less the steps queued for them: a step that finds one > 0
# claims one, else it starts a thread (up to HELPERS) or waits in the queue for a free one.
_idle = 0


def _serve() -> None:
    global _idle
    while True:
        pending, context, work, args, claimed = _jobs.get()
        if not claimed:  # this helper was counted idle and no step had claimed it
            with _helpers_lock:
                _idle -= 1
        try:
            value, error = context.run(work, *args), None
        except BaseException as exc:  # delivered to whoever waits for the step
            value, error = None, exc
        pending._settle(value, error)
        del pending, context, work, args, value, error  # nothing of a step outlives it
        with _helpers_lock:
            _idle += 1


def in_background(work: Callable[..., Any], *args: Any) -> Pending:
    """Run `work(*args)` on a helper thread of the host namespace, for steps that mostly wait
    (an OVSDB round trip, the kernel tearing a veth down, an IPAM release) while the caller
    goes on; in the caller's context, so its log lines still name the request. The threads
    live as long as the process (the agent reuses them; a one-shot exec waits for its steps
    before it exits)."""
    global _helpers, _idle
    pending = Pending()
    with _helpers_lock:
        claimed = _idle > 0
        start = not claimed and _helpers < HELPERS
        _idle -= claimed
        _helpers += start
    # A started thread is not idle yet: its first step is this one, taken as claimed.
    _jobs.put((pending, contextvars.copy_context(), work, args, claimed or start))
    if start:
        threading.Thread(target=_serve, name=f"tenantnet-helper-{_helpers}", daemon=True).start()
    return pending


class Driver(ABC):
    mode: ClassVar[str]
    plan_type: ClassVar[type[Plan]] = Plan

    def __init__(self, node: NodeConfig) -> None:
        self.node = node

    @contextmanager
    def reserve(self) -> Iterator[None]:
        """Held while the core plans and writes the intent record (e.g. to pick a free VF)."""
        yield

    @abstractmethod
    def plan(self, conf: TenantnetConf, env: CniEnv, records: RecordStore | None = None) -> Plan:
        """Names and settings fixed *before* anything is created; stored in the record.

        `records` lets a driver see what other attachments hold.
        """

    def plan_without_record(self, conf: TenantnetConf, env: CniEnv,
                            records: RecordStore | None = None) -> Plan | None:
        """The plan DEL uses when there is no record: only objects that provably belong to
        this (container id, ifname) — None when there are none to undo."""
        return self.plan(conf, env, None)

    @abstractmethod
    def attach(self, record: AttachmentRecord, conf: TenantnetConf) -> Attached:
        """Create the interface inside the pod netns and wire its host side."""

    def addressed(self, record: AttachmentRecord, conf: TenantnetConf, ips: list[str]) -> Pending | None:
        """Once IPAM has answered (`ips`: "address/prefix"): work that needs the addresses
        (an overlay's logical port and its port security), started on a helper thread while
        the core configures the pod; the ADD fails if it fails. None: nothing to do."""
        return None

    def ready(self, record: AttachmentRecord, conf: TenantnetConf) -> bool:
        """After the ADD is recorded ready: work that makes the attachment better but whose
        failure must not fail it (pre-warm). True if it changed the record."""
        return False

    @abstractmethod
    def detach(self, record: AttachmentRecord) -> None:
        """Undo `attach`; idempotent, works with the netns already gone."""

    @abstractmethod
    def check(self, record: AttachmentRecord, conf: TenantnetConf) -> list[str]:
        """Differences between the record (and the config it was made from) and what is live,
        on the host side; the core checks the pod's interface when `pod_netdev` says so."""

    def pod_netdev(self, record: AttachmentRecord) -> bool:
        """Whether the attachment has a kernel netdev in the pod (CHECK looks at it)."""
        return True

    def status(self, raw: dict[str, Any]) -> None:
        """Is what this mode needs on the node ready? CniError 50 when it is not."""
        return None

    def orphans(self, conf: NetConf, env: CniEnv, keep: set[tuple[str, str]],
                recorded: set[tuple[str, str]]) -> list[AttachmentRecord]:
        """Objects of ours for network `conf` (a GC call's) that have no record and are not
        in `keep`. Returned as synthetic records so that GC can pass them to `detach`."""
        return []


def gc_env(env: CniEnv) -> CniEnv:
    """GC names no container; a plan computed for it only serves as a hint (endpoint, bridge)."""
    from dataclasses import replace

    return replace(env, container_id="gc", ifname="gc")
