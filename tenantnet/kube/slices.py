"""This node's SR-IOV VFs as DRA ResourceSlices of driver `tenantnet.io` (docs/dra.md).

Two parts:

- `node_devices(node, held)`: what the node offers, read from its sysfs — one device per VF
  of every SR-IOV PF, minus the VFs the CNI path holds (a device is never offered twice).
  Each device carries the standard attributes the scheduler can match across drivers
  (`resource.kubernetes.io/pcieRoot`, `…/pciBusID`, `…/numaNode`), where it sits (`pf`,
  `pfPciAddress`, `numaNode`, `eswitchMode`, `rail`) and `k8s.cni.cncf.io/deviceID`, which
  Multus's DRA path reads to hand the VF to a CNI plugin. Unqualified names belong to the
  driver's domain (the API qualifies them with `tenantnet.io/` in CEL:
  `device.attributes["tenantnet.io"].rail`).
- `SlicePublisher`: keeps the node's pool in the API equal to that list. Pool name = node
  name; the devices sorted by name and cut into slices of at most 128 (resource.k8s.io/v1's
  limit per slice), named `<node>-<driver>-<i>` so that the next agent finds and takes over
  the same objects; each slice owned by the Node (the garbage collector removes them with
  it). Every pass lists the pool's slices and compares them with what is wanted: equal →
  no write at all; different → every slice written at the pool's generation + 1 (consumers
  use only the highest generation and `resourceSliceCount` to see a pool complete), then
  the slices no longer wanted deleted. A failure (the API away, a conflict) is retried with
  a growing, jittered backoff; the wanted state is recomputed from sysfs at each pass, so
  nothing is lost meanwhile.

Nothing here imports lightkube at module level: only `LightkubeSliceApi` needs it.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from tenantnet.plugin import draclaims
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.pci import normalise_pci_address
from tenantnet.plugin.system.pcitree import PcieTree
from tenantnet.plugin.system.sysfs import Sysfs, SysfsError, VirtualFunction

DRIVER = "tenantnet.io"
API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128  # resource.k8s.io/v1: ResourceSliceSpec.devices, at most 128 entries
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
COALESCE = 0.2  # refresh() bursts (a pod's eight rails) become one pass

# Standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute and
# kubernetes.io/docs/reference/node/dra-standard-device-attributes): the same name and meaning
# in every driver, so a claim's `matchAttribute` can pair a tenantnet VF with a GPU of another
# driver.
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
STD_NUMA_NODE = "resource.kubernetes.io/numaNode"
# Multus's DRA path takes the PCI address of the device to hand to the CNI plugin from here.
MULTUS_DEVICE_ID = "k8s.cni.cncf.io/deviceID"


# -- what the node offers ----------------------------------------------------------------------


def pcie_root(sysfs_root: str, pci_address: str) -> str | None:
    """The PCIe root complex of a PCI device (a VF: its PF's) as `resource.kubernetes.io/pcieRoot`
    defines it: `pci<domain>:<bus>`, the host bridge the device's sysfs path passes through
    (`/sys/bus/pci/devices/<bdf>` → `../../../devices/pci0000:3a/…/<bdf>`), the value
    Kubernetes' own helper `GetPCIeRootAttributeByPCIBusID` derives the same way. None when
    it cannot be told (no such device, a device behind a nested VMD host bridge)."""
    try:
        return PcieTree(sysfs_root).position(pci_address).host_bridge
    except SysfsError:
        return None


def device_name(pci_address: str) -> str:
    """The device's name in the slice, a DNS label from its PCI address: 0000:1b:00.2 →
    vf-0000-1b-00-2 (stable across restarts, so an allocation names the same VF)."""
    addr = normalise_pci_address(pci_address)
    if addr is None:
        raise ValueError(f"{pci_address!r} is not a PCI address (DDDD:BB:DD.F)")
    return draclaims.device_name(addr)  # the one naming, which the claims' side reads back


def _attr(value: str | int | bool) -> dict[str, Any]:
    # bool before int: a bool is an int in Python, and the API keeps them apart.
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def _default_eswitch_mode(node: NodeConfig) -> Callable[[str, str], str | None]:
    from tenantnet.plugin.system import vfcontrol

    control = vfcontrol.control_for(node.vf_control, node.vf_control_modules)
    return control.eswitch_mode


def node_rails(sysfs_root: str) -> dict[str, str]:
    """{PF address: rail name} for the NICs that are rails: the node's NICs and GPUs paired 1:1
    as closely as they go (`rails.pair_rails`, the pairing tenantnet's CNI path aims for), a
    NIC a rail when its GPU shares its PCIe switch (PIX). Named `rail-<i>`, i the GPU's index
    in PCI address order (the order nvidia-smi numbers GPUs in by default), so rail i is the
    one beside GPU i on every node of the same build. {} without GPUs."""
    from tenantnet.plugin import rails

    tree = PcieTree(sysfs_root)
    try:
        gpus, nics = tree.gpus(), tree.nics()
    except SysfsError:
        return {}
    if not gpus or not nics:
        return {}
    order = sorted(g.address for g in gpus)
    table = rails.distance_table([g.position for g in gpus], [n.position for n in nics])
    assignment = rails.pair_rails(len(nics), order, {n.address: [n.address] for n in nics}, table,
                                  limit=rails.Distance.PIX)
    return {p.nic: f"rail-{order.index(p.gpu)}" for p in assignment.pairings
            if p.gpu is not None and p.distance is rails.Distance.PIX}


def _pfs(sysfs: Sysfs) -> list[str]:
    """Every SR-IOV PF under the root (by PCI address): a NIC tree written by nicsysfs alone
    has no `class` files, so PFs are found by their SR-IOV links, not by PcieTree.nics()."""
    base = os.path.join(sysfs.root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in names:
        if normalise_pci_address(name) != name:
            continue
        try:
            out.append(sysfs.pf_address(name))
        except SysfsError:
            continue
    return out


def node_devices(node: NodeConfig, held: frozenset[str],
                 eswitch_mode: Callable[[str, str], str | None] | None = None) -> list[dict[str, Any]]:
    """This node's devices for a ResourceSlice (resource.k8s.io/v1 `Device`: name, attributes),
    one per VF not in `held` (PCI addresses the CNI path holds), sorted by name.

    `eswitch_mode(pf_netdev, pf_address)`: "legacy", "switchdev" or None (not told: no
    attribute); default the node's VF control (devlink on a real node, the lab's state).
    """
    sysfs = Sysfs(node.sysfs_root)
    mode_of = eswitch_mode or _default_eswitch_mode(node)
    rail_of = node_rails(node.sysfs_root)
    held_norm = {normalise_pci_address(a) or a for a in held}
    devices = []
    for pf in _pfs(sysfs):
        try:
            vfs = sysfs.vfs_of_pf(pf)
        except SysfsError:
            continue
        root = pcie_root(node.sysfs_root, pf)
        pf_netdev = next((vf.pf_netdev for vf in vfs if vf.pf_netdev), None)
        mode = mode_of(pf_netdev or "", pf) if vfs else None
        for vf in vfs:
            if vf.address in held_norm:
                continue
            devices.append(_device(vf, pf_netdev, root, mode, rail_of.get(pf)))
    return sorted(devices, key=lambda d: d["name"])


def _device(vf: VirtualFunction, pf_netdev: str | None, root: str | None, mode: str | None,
            rail: str | None) -> dict[str, Any]:
    attrs: dict[str, str | int | bool] = {PCI_BUS_ID: vf.address, MULTUS_DEVICE_ID: vf.address,
                                          "pfPciAddress": vf.pf_address}
    if root is not None:
        attrs[PCIE_ROOT] = root
    if vf.numa_node is not None:  # -1 (no affinity): no attribute, as the standard asks
        attrs["numaNode"] = vf.numa_node
        attrs[STD_NUMA_NODE] = vf.numa_node
    if pf_netdev:
        attrs["pf"] = pf_netdev
    if mode in ("legacy", "switchdev"):
        attrs["eswitchMode"] = mode
    if rail is not None:
        attrs["rail"] = rail
    return {"name": device_name(vf.address), "attributes": {k: _attr(v) for k, v in sorted(attrs.items())}}


# -- the API -----------------------------------------------------------------------------------


class SliceApi(Protocol):
    """What the publisher asks of the API server (lightkube in the agent, a fake in tests).
    Slices are resource.k8s.io/v1 ResourceSlice objects as JSON dicts."""

    def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        """Every ResourceSlice with spec.nodeName `node_name` and spec.driver `driver`."""
        ...

    def create_slice(self, body: dict[str, Any]) -> None: ...

    def replace_slice(self, body: dict[str, Any]) -> None:
        """Replace the slice `body.metadata.name`, at `body.metadata.resourceVersion`."""
        ...

    def delete_slice(self, name: str) -> None: ...

    def node_uid(self, node_name: str) -> str: ...


class LightkubeSliceApi:
    """`SliceApi` over lightkube (its resource.k8s.io/v1 models)."""

    def __init__(self, kubeconfig: str = "", field_manager: str = "tenantnet-agent") -> None:
        from tenantnet.kube import api

        self.client = api.client(kubeconfig, field_manager=field_manager)

    def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        from lightkube.resources.resource_v1 import ResourceSlice

        from tenantnet.kube import api

        got = self.client.list(ResourceSlice, fields={"spec.nodeName": node_name, "spec.driver": driver})
        return [api.as_dict(o) for o in got]

    def create_slice(self, body: dict[str, Any]) -> None:
        from lightkube.resources.resource_v1 import ResourceSlice

        self.client.create(cast(ResourceSlice, ResourceSlice.from_dict(body)))

    def replace_slice(self, body: dict[str, Any]) -> None:
        from lightkube.resources.resource_v1 import ResourceSlice

        self.client.replace(cast(ResourceSlice, ResourceSlice.from_dict(body)))

    def delete_slice(self, name: str) -> None:
        from lightkube.resources.resource_v1 import ResourceSlice

        self.client.delete(ResourceSlice, name)

    def node_uid(self, node_name: str) -> str:
        from lightkube.resources.core_v1 import Node

        node = self.client.get(Node, node_name)
        assert node.metadata is not None and node.metadata.uid is not None
        return str(node.metadata.uid)


# -- the publisher -----------------------------------------------------------------------------


def slice_base_name(node_name: str, driver: str) -> str:
    """`<node>-<driver>`, the prefix of the pool's slice names; shortened with a hash when a
    long node name would make a name over 253 characters (a DNS subdomain's limit)."""
    base = f"{node_name}-{driver}"
    if len(base) <= 240:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[:229].rstrip('-.')}-{digest}"


def _spec_view(obj: dict[str, Any]) -> dict[str, Any]:
    """The part of a slice the publisher owns, for comparison (the server may add fields)."""
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    return {
        "driver": spec.get("driver"),
        "nodeName": spec.get("nodeName"),
        "pool": {k: (spec.get("pool") or {}).get(k) for k in ("name", "resourceSliceCount")},
        "devices": [{"name": d.get("name"), "attributes": d.get("attributes") or {}}
                    for d in spec.get("devices") or []],
        "owners": [(o.get("kind"), o.get("name"), o.get("uid")) for o in meta.get("ownerReferences") or []],
    }


def _meta_covers(have: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether `have` carries the labels and annotations `want` sets (a subclass may set some;
    others' additions are left alone)."""
    for key in ("labels", "annotations"):
        mine = (want.get("metadata") or {}).get(key) or {}
        theirs = (have.get("metadata") or {}).get(key) or {}
        if any(theirs.get(k) != v for k, v in mine.items()):
            return False
    return True


class SlicePublisher:
    """Keeps this node's ResourceSlices of `driver` equal to `devices()` (module docstring).

    `stop()` leaves the slices in place, on purpose: an agent stops to be restarted or
    upgraded, and the next one takes the same slices over by name and writes nothing if the
    node did not change. Deleting them would make the scheduler see the node without devices
    in between (pods with claims Pending, or placed elsewhere) and churn the pool's
    generation at every restart. They go with the Node (ownerReference), and the kubelet
    removes a driver's slices itself when its plugin unregisters for good.
    """

    def __init__(self, api: SliceApi, driver: str, node_name: str,
                 devices: Callable[[], list[dict[str, Any]]], log: Any, interval: float = 30.0) -> None:
        self.api = api
        self.driver = driver
        self.node_name = node_name
        self.devices = devices
        self.log = log
        self.interval = interval
        self.backoff_first = BACKOFF_FIRST
        self.backoff_max = BACKOFF_MAX
        self.coalesce = COALESCE
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._node_uid: str | None = None
        # For report(): what the API holds as last seen or written.
        self.generation = 0
        self.device_count = 0
        self.slice_count = 0
        self.passes = 0
        self.writes = 0
        self.failures = 0
        self.last_error = ""
        self.last_sync: float | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tenantnet-dra-slices", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """End the thread (the slices stay: class docstring). A pass blocked in a request ends
        with the request's own timeout; the thread is a daemon, so the agent's exit does not
        wait for it beyond `timeout`."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def refresh(self) -> None:
        """Ask for a pass soon (what is held changed); calls in a burst make one pass."""
        self._wake.set()

    def report(self) -> dict[str, Any]:
        """For `tenantnetctl agent status`."""
        with self._lock:
            return {"driver": self.driver, "pool": self.node_name, "generation": self.generation,
                    "devices": self.device_count, "slices": self.slice_count, "passes": self.passes,
                    "writes": self.writes, "failures": self.failures,
                    "lastSync": self.last_sync, "lastError": self.last_error or None}

    def _run(self) -> None:
        delay = self.backoff_first
        while not self._stop.is_set():
            self._wake.clear()  # a refresh() during the pass sets it again: one more pass
            try:
                self.sync()
            except Exception as exc:  # the API away, a conflict, RBAC, sysfs: retry, keep nothing stale
                self._node_uid = None  # a Node deleted and created again has another uid
                with self._lock:
                    self.failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                self.log.warning("dra.publish_failed", node=self.node_name, error=self.last_error,
                                 retry_in=round(delay, 2))
                # Not woken by refresh(): a burst of ADDs must not hammer an API that is away.
                self._stop.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.backoff_max)
                continue
            delay = self.backoff_first
            if self._wake.wait(self.interval) and not self._stop.is_set():
                self._stop.wait(self.coalesce)

    # -- one pass ----------------------------------------------------------------------------

    def wanted(self, devices: list[dict[str, Any]], generation: int, uid: str) -> list[dict[str, Any]]:
        """The pool's slices for `devices` at `generation` (at least one slice: an empty pool
        is published as one slice without devices, so consumers see the node has none)."""
        ordered = sorted(devices, key=lambda d: d["name"])
        chunks = [ordered[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(ordered), MAX_DEVICES_PER_SLICE)]
        chunks = chunks or [[]]
        base = slice_base_name(self.node_name, self.driver)
        return [{
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": f"{base}-{i}",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid,
                                     "controller": True}],
            },
            "spec": {
                "driver": self.driver,
                "nodeName": self.node_name,
                "pool": {"name": self.node_name, "generation": generation, "resourceSliceCount": len(chunks)},
                "devices": chunk,
            },
        } for i, chunk in enumerate(chunks)]

    def sync(self) -> bool:
        """One pass: make the API's slices what is wanted. True if anything was written or
        deleted; raises whatever the API or sysfs raised (the caller retries)."""
        devices = self.devices()
        names = [d["name"] for d in devices]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"devices with the same name: {twice}")
        if self._node_uid is None:
            self._node_uid = self.api.node_uid(self.node_name)
        uid = self._node_uid
        existing = {(s.get("metadata") or {}).get("name", ""): s
                    for s in self.api.list_slices(self.node_name, self.driver)}
        generations = {int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)
                       for s in existing.values()}
        current = max(generations, default=0)
        wanted = self.wanted(devices, current, uid)
        same = (
            len(generations) == 1
            and set(existing) == {w["metadata"]["name"] for w in wanted}
            and all(_spec_view(existing[w["metadata"]["name"]]) == _spec_view(w)
                    and _meta_covers(existing[w["metadata"]["name"]], w) for w in wanted)
        )
        wrote = False
        if not same:
            generation = current + 1
            for body in self.wanted(devices, generation, uid):
                name = body["metadata"]["name"]
                have = existing.get(name)
                if have is None:
                    self.api.create_slice(body)
                else:
                    body["metadata"]["resourceVersion"] = (have.get("metadata") or {}).get("resourceVersion")
                    self.api.replace_slice(body)
            wanted_names = {w["metadata"]["name"] for w in wanted}
            for name in sorted(set(existing) - wanted_names):
                self.api.delete_slice(name)
            wrote = True
            current = generation
            self.log.info("dra.published", node=self.node_name, driver=self.driver, generation=generation,
                          devices=len(devices), slices=len(wanted))
        with self._lock:
            self.generation = current
            self.device_count = len(devices)
            self.slice_count = len(wanted)
            self.passes += 1
            self.writes += int(wrote)
            self.last_error = ""
            self.last_sync = time.time()
        return wrote
