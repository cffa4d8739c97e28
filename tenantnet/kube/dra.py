"""tenantnet as a DRA driver (`tenantnet.io`, docs/dra.md): the agent's handler of the
kubelet's NodePrepareResources / NodeUnprepareResources (tenantnet/kube/kubeletplugin.py)
and of containerd's pod sandbox events through NRI (tenantnet/kube/nri.py).

**Prepare** (per claim UID, idempotent: the kubelet retries) reads the ResourceClaim from the
API, takes this node's devices of its allocation, and decides before anything is written:

- the network: the `network` parameter of the driver's opaque config — the claim's own
  (`FromClaim`, the tenant's choice) over the DeviceClass's (`FromClass`, the admin's) —
  names a TenantNetwork;
- the tenant: the claim's namespace resolves to a tenant (the node's tenant sources), and
  the TenantNetwork must grant it, exactly as at a CNI ADD (tnadmit) — a claim does not
  widen what a namespace may use: refused with the grant and the tenant named;
- the devices: every allocated VF exists, sits on one of the network's PFs on this node, is
  held by no CNI attachment and no other claim, and the claim is reserved for one pod.

Then the claim record (tenantnet/plugin/draclaims.py) is written first, the CDI spec
second, and the answer names the CDI devices (`tenantnet.io/vf=claim-<uid>-<device>`).

**Attach**: the pod's sandbox does not exist at prepare time. When containerd runs it, the
NRI event `run_pod_sandbox` moves every device of every claim reserved for that pod into
its network namespace *at once* (one thread per device): each is a CNI ADD of the claim's
TenantNetwork with the VF as `deviceID`, run through the agent's own in-process plugin call
— the same admission, VF configuration (VLAN, MAC, spoofchk, trust, RDMA device), IPAM
(tenantnet-ipam), intent records and crash points as a Multus call. One failure undoes the
others and fails the sandbox (a pod must not run without its rails); the addresses are
then written to the claim's `status.devices[].networkData`. `stop_pod_sandbox` /
`remove_pod_sandbox` run the DELs (the VF back on the host, its addresses released).
When the agent was down at the pod's start or stop, NRI's `synchronize` on reconnect
attaches what is missing and detaches what belongs to sandboxes that are gone.

**Unprepare** detaches whatever is still attached (the pod or the agent may be gone: the
DEL works from the records, as a CNI DEL without a netns does), then removes the CDI spec
and the record. A claim with `attach: cni` is attached by Multus's DRA path instead
(draclaims.bind in the CNI ADD); then only Multus's calls touch the VF.

Every step between two writes is a named crash point (`dra.*`, tests/integration/test_dra.py
kills the agent at each and checks nothing leaks).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from tenantnet.kube.kubeletplugin import ClaimRef, PreparedDevice, PrepareResult
from tenantnet.kube.nri import NriRefusal, PodSandbox
from tenantnet.plugin import draclaims, faults, kubecache, tenantnetworks
from tenantnet.plugin.draclaims import DRIVER, ClaimDevice, ClaimRecord, ClaimStore
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import CorruptRecord, RecordStore

CNI_VERSION = "1.0.0"
ATTACH_MODES = ("nri", "cni")
CONFIG_KEYS = ("network", "attach", "interfaceNames")
_IFNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
_VF_MODES = ("sriov", "ovs-offload")

# (environ, stdin) -> (exit code, stdout text): the agent's in-process CNI call.
CniRunner = Callable[[dict[str, str], bytes], tuple[int, str]]


class ClaimApi(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    def set_network_data(self, namespace: str, name: str, uid: str,
                         entries: list[dict[str, Any]]) -> None: ...


class Refused(Exception):
    """A claim this node will not prepare: the message goes to the kubelet (the pod's events)."""


class LightkubeClaimApi:
    def __init__(self, kubeconfig: str) -> None:
        from tenantnet.kube import api

        self.client = api.client(kubeconfig, field_manager=DRIVER)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceClaim

        from tenantnet.kube import api

        return api.as_dict(self.client.get(ResourceClaim, name, namespace=namespace))

    def set_network_data(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Our entries of `status.devices` (keyed by driver, pool, device) replaced, everyone
        else's kept; optimistic concurrency on the resourceVersion, retried on a conflict."""
        from lightkube import ApiError
        from lightkube.resources.resource_v1 import ResourceClaim
        from lightkube.types import PatchType

        from tenantnet.kube import api

        for _ in range(5):
            claim = api.as_dict(self.client.get(ResourceClaim, name, namespace=namespace))
            meta = claim.get("metadata") or {}
            if meta.get("uid") != uid:
                return  # another claim of that name now: ours is gone
            ours = {(e["driver"], e["pool"], e["device"]) for e in entries}
            kept = [d for d in (claim.get("status") or {}).get("devices") or []
                    if (d.get("driver"), d.get("pool"), d.get("device")) not in ours]
            patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")},
                     "status": {"devices": kept + entries}}
            try:
                self.client.patch(ResourceClaim.Status, name, patch, namespace=namespace,
                                  patch_type=PatchType.MERGE)
                return
            except ApiError as exc:
                if exc.status.code != 409:
                    raise


@dataclass
class DraStats:
    prepared: int = 0
    refused: int = 0
    unprepared: int = 0
    attached: int = 0
    attach_failed: int = 0
    detached: int = 0
    last_error: str = ""
    recent: list[dict[str, Any]] = field(default_factory=list)


class DraDriver:
    """The DRA handler (kubelet) and NRI handler (containerd) of one node; see the module doc."""

    def __init__(self, node: NodeConfig, node_name: str, api: ClaimApi, cni: CniRunner, log: Any,
                 *, cni_path: str = "", workers: int = 16) -> None:
        self.node = node
        self.node_name = node_name
        self.api = api
        self.cni = cni
        self.log = log
        self.cni_path = cni_path
        self.store = ClaimStore(node.state_dir)
        self.stats = DraStats()
        # Claims (prepare, unprepare, reconcile) and devices (one CNI call each) on pools of
        # their own: a claim's work waits for its devices', which must never queue behind it.
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tenantnet-dra")
        self._devices = ThreadPoolExecutor(workers, thread_name_prefix="tenantnet-dra-dev")
        self._lock = threading.Lock()
        self.on_change: Callable[[], None] = lambda: None  # the slice publisher's refresh

    def close(self, wait: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        self._devices.shutdown(wait=wait, cancel_futures=not wait)

    # ---- kubelet: prepare / unprepare ---------------------------------------------------
    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        futures = {c.uid: self._pool.submit(self._prepare_one, c) for c in claims}
        return {uid: f.result() for uid, f in futures.items()}

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        futures = {c.uid: self._pool.submit(self._unprepare_one, c) for c in claims}
        return {uid: f.result() for uid, f in futures.items()}

    def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        started = time.monotonic()
        try:
            with self.store.lock(ref.uid):
                rec = self.store.load(ref.uid)
                if rec is None:
                    rec = self._decide(ref)
                    faults.step("dra.prepare.decided")
                    self.store.save(rec)  # first: from here on a crash is recoverable
                    faults.step("dra.prepare.recorded")
                    self._write_cdi(rec)
                    faults.step("dra.prepare.cdi-written")
                    with self._lock:
                        self.stats.prepared += 1
                    self.log.info("dra.prepared", ms=round((time.monotonic() - started) * 1000, 2),
                                  claim=f"{rec.namespace}/{rec.name}", uid=rec.uid,
                                  network=rec.network, tenant=rec.tenant, pod=rec.pod_name,
                                  devices=[d.vf for d in rec.devices], attach=rec.attach)
                    self.on_change()
                elif rec.namespace != ref.namespace or rec.name != ref.name:
                    raise Refused(f"claim uid {ref.uid} was prepared as {rec.namespace}/{rec.name}, "
                                  f"not {ref.namespace}/{ref.name}")
                else:
                    self._write_cdi(rec)  # a retry: the same answer (and the spec, if it went)
                return PrepareResult(devices=tuple(
                    PreparedDevice(requests=(d.request,), pool=self.node_name, device=d.device,
                                   cdi_ids=(rec.cdi_id(d),)) for d in rec.devices))
        except Refused as exc:
            with self._lock:
                self.stats.refused += 1
                self.stats.last_error = str(exc)
            self.log.warning("dra.prepare.refused", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid,
                             error=str(exc))
            return PrepareResult(error=f"{DRIVER}: ResourceClaim {ref.namespace}/{ref.name}: {exc}")
        except Exception as exc:  # noqa: BLE001 - the kubelet gets it as this claim's error
            self.log.error("dra.prepare.failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid,
                           error=repr(exc))
            return PrepareResult(error=f"{DRIVER}: ResourceClaim {ref.namespace}/{ref.name}: {exc}")

    def _decide(self, ref: ClaimRef) -> ClaimRecord:
        """The claim's record, or Refused: everything checked, nothing written."""
        try:
            claim = self.api.get_claim(ref.namespace, ref.name)
        except Exception as exc:  # noqa: BLE001 - unreachable API, 404, 403: the kubelet retries
            raise Refused(f"cannot read the claim from the API server: {exc}") from None
        meta = claim.get("metadata") or {}
        if meta.get("uid") != ref.uid:
            raise Refused(f"the API's claim of that name has uid {meta.get('uid')}, not {ref.uid}")
        status = claim.get("status") or {}
        allocation = (status.get("allocation") or {}).get("devices") or {}
        results = [r for r in allocation.get("results") or []
                   if r.get("driver") == DRIVER and r.get("pool") == self.node_name]
        if not results:
            raise Refused(f"no device of driver {DRIVER} in pool {self.node_name} is allocated to it")
        pods = [r for r in status.get("reservedFor") or [] if r.get("resource") == "pods"]
        if len(pods) != 1:
            raise Refused(f"it is reserved for {len(pods)} pods; a VF can be in one pod only "
                          "(a claim of driver tenantnet.io cannot be shared)")
        configs = allocation.get("config") or []
        # Each request has its parameters (a config may name requests): a pod's 8 rails may be
        # 8 TenantNetworks, one subnet and VLAN per rail, in one claim.
        per_request = {str(r.get("request", "")): self._parameters(configs, str(r.get("request", "")))
                       for r in results}
        attaches = {p.get("attach", "nri") for p in per_request.values()}
        if len(attaches) != 1 or not attaches <= set(ATTACH_MODES):
            raise Refused(f"parameters.attach={sorted(map(str, attaches))}: must be one of "
                          f"{', '.join(ATTACH_MODES)}, the same for all the claim's requests")
        attach = attaches.pop()
        admitted: dict[str, tuple[str, tuple[str, ...]]] = {}
        names: dict[str, Any] = {}
        for request, params in per_request.items():
            network = params.get("network")
            if not isinstance(network, str) or not kubecache.valid_name(network):
                raise Refused(f"request {request}: the {DRIVER} config names no TenantNetwork "
                              f"(parameters.network={network!r}; set it in the claim's or its DeviceClass's "
                              f"opaque config of driver {DRIVER})")
            if network not in admitted:
                _, tenant, pfs = self._admit(ref.namespace, network)
                admitted[network] = (tenant, pfs)
            given = params.get("interfaceNames") or {}
            if not isinstance(given, dict) or not all(isinstance(v, str) and _IFNAME_RE.fullmatch(v)
                                                      for v in given.values()):
                raise Refused(f"parameters.interfaceNames={given!r}: must map request names to interface "
                              "names (1-15 characters: letters, digits, _ . -)")
            names.update(given)
        claimed = draclaims.claimed_vfs(self.node.state_dir)
        held = self._cni_held(claimed)
        from tenantnet.plugin.system.sysfs import Sysfs, SysfsError

        sysfs = Sysfs(self.node.sysfs_root)
        devices: list[ClaimDevice] = []
        counts: dict[str, int] = {}
        for r in results:
            request, device = str(r.get("request", "")), str(r.get("device", ""))
            network = per_request[request]["network"]
            pfs = admitted[network][1]
            vf_address = draclaims.vf_of_device(device)
            if vf_address is None:
                raise Refused(f"device {device!r} is not a VF device of this driver")
            try:
                vf = sysfs.vf(vf_address)
            except SysfsError as exc:
                raise Refused(f"device {device} (VF {vf_address}): {exc}") from None
            if pfs and vf.pf_netdev not in pfs and vf.pf_address not in pfs:
                raise Refused(f"device {device} is a VF of PF {vf.pf_netdev or vf.pf_address}, and "
                              f"TenantNetwork {network} is on PFs {', '.join(pfs)} on this node")
            if vf_address in held:
                raise Refused(f"device {device} (VF {vf_address}) is taken by a CNI attachment "
                              f"({held[vf_address]})")
            other = claimed.get(vf_address)
            if other is not None and other.uid != ref.uid:
                raise Refused(f"device {device} (VF {vf_address}) is held by ResourceClaim "
                              f"{other.namespace}/{other.name}")
            n = counts.get(request, 0)
            counts[request] = n + 1
            devices.append(ClaimDevice(request=request, device=device, vf=vf_address,
                                       ifname=self._ifname(request, n, names), network=network))
        ifnames = [d.ifname for d in devices]
        if len(set(ifnames)) != len(ifnames):
            raise Refused(f"interface names {ifnames} are not distinct (parameters.interfaceNames)")
        tenants = {t for t, _ in admitted.values()}
        return ClaimRecord(uid=ref.uid, namespace=ref.namespace, name=ref.name,
                           network=",".join(sorted(admitted)), tenant=",".join(sorted(tenants)),
                           attach=attach, pod_uid=str(pods[0].get("uid", "")),
                           pod_name=str(pods[0].get("name", "")),
                           devices=devices, created=time.time())

    @staticmethod
    def _ifname(request: str, index: int, names: dict[str, Any]) -> str:
        given = names.get(request)
        if isinstance(given, str):
            return given if index == 0 else f"{given[:13]}{index}"
        base = request if _IFNAME_RE.fullmatch(request) else \
            re.sub(r"[^A-Za-z0-9_.-]", "", request)[:13] or "dra"
        return base if index == 0 and len(base) <= 15 else f"{base[:13]}{index}"

    @staticmethod
    def _parameters(configs: list[dict[str, Any]], request: str) -> dict[str, Any]:
        """The driver's opaque parameters for one request (`req` or a subrequest `req/sub`):
        the DeviceClass's first, the claim's over them (each config is tagged with its
        source), a config naming no requests applying to all."""
        out: dict[str, Any] = {}
        for source in ("FromClass", "FromClaim"):
            for c in configs:
                opaque = c.get("opaque") or {}
                if c.get("source") != source or opaque.get("driver") != DRIVER:
                    continue
                named = c.get("requests") or []
                if named and not any(request == q or request.startswith(f"{q}/") for q in named):
                    continue
                params = opaque.get("parameters")
                if not isinstance(params, dict):
                    raise Refused(f"the {DRIVER} config's parameters must be an object")
                unknown = sorted(set(params) - set(CONFIG_KEYS) - {"apiVersion", "kind"})
                if unknown:
                    raise Refused(f"unknown {DRIVER} config parameter {unknown[0]!r}; known: "
                                  f"{', '.join(CONFIG_KEYS)}")
                out.update({k: v for k, v in params.items() if k in CONFIG_KEYS})
        return out

    def _admit(self, namespace: str, network: str) -> tuple[Any, str, tuple[str, ...]]:
        """(TenantNetwork, tenant, its PFs on this node), or Refused — tnadmit's rule."""
        from tenantnet.plugin.tnadmit import resolver_for

        try:
            sync = kubecache.read_sync(self.node.state_dir)
            if sync is None:
                raise Refused("this node has not synced TenantNetworks from the API server yet; the "
                              "kubelet retries")
            obj = kubecache.read_object(self.node.state_dir, "tenantnetworks", network)
            ns = kubecache.read_object(self.node.state_dir, "namespaces", namespace)
        except kubecache.CacheUnreadable as exc:
            raise Refused(f"this node's TenantNetwork cache is unreadable: {exc}") from None
        if obj is None:
            raise Refused(f"no TenantNetwork {network} is known to this node")
        if ns is None:
            raise Refused(f"namespace {namespace} is not yet known to this node; the kubelet retries")
        try:
            tn = tenantnetworks.parse_tenant_network(obj)
            labels = tenantnetworks.checked_labels(ns.get("labels"), f"namespace {namespace} labels", network)
        except tenantnetworks.InvalidTenantNetwork as exc:
            raise Refused(str(exc)) from None
        resolution = resolver_for(self.node).resolve(namespace, labels)
        if not tn.grants(namespace, resolution, labels):
            self.log.warning("security.denied", event_type="tenant_isolation", path="dra", network=network,
                             tenant=resolution.tenant, pod_namespace=namespace, reason=resolution.reason)
            why = resolution.reason if resolution.conflict or resolution.tenant is None else \
                f"tenant {resolution.tenant}"
            raise Refused(f"tenant isolation: namespace {namespace} may not use TenantNetwork {network}: "
                          f"it grants "
                          f"{tn.describe_grant()}; {why}")
        if tn.fabric.mode not in _VF_MODES:
            raise Refused(f"TenantNetwork {network} is mode {tn.fabric.mode}; DRA devices of {DRIVER} "
                          f"are VFs "
                          f"(modes {', '.join(_VF_MODES)})")
        return tn, resolution.tenant or "", tn.fabric.on(sync.node_labels)[1]

    def _cni_held(self, claimed: dict[str, ClaimRecord]) -> dict[str, str]:
        """VFs the CNI path holds (records of Multus's calls), not those of claims' own attaches."""
        from tenantnet.plugin import modes
        from tenantnet.plugin.drivers.vf import VfPlan

        out: dict[str, str] = {}
        for rec in RecordStore(self.node.state_dir, modes.plan_type).list():
            if isinstance(rec, CorruptRecord) or not isinstance(rec.plan, VfPlan) or not rec.plan.device_id:
                continue
            if rec.plan.device_id in claimed:
                continue
            out[rec.plan.device_id] = f"pod {rec.pod.namespace}/{rec.pod.name}, network {rec.network}"
        return out

    def held_by_cni(self) -> frozenset[str]:
        return frozenset(self._cni_held(draclaims.claimed_vfs(self.node.state_dir)))

    def _unprepare_one(self, ref: ClaimRef) -> str:
        try:
            with self.store.lock(ref.uid):
                rec = self.store.load(ref.uid)
                if rec is None:
                    # Unprepared already (a retry), or never prepared here: nothing of ours is left
                    # (the spec is written after the record and removed before it); removing a spec
                    # of that name anyway costs one unlink.
                    self._remove_cdi(ref.uid)
                    return ""
                errors = self._detach(rec, [d for d in rec.devices if d.sandbox])
                if errors:
                    return f"{DRIVER}: ResourceClaim {ref.namespace}/{ref.name}: " + "; ".join(errors)
                faults.step("dra.unprepare.detached")
                self._remove_cdi(rec.uid)
                faults.step("dra.unprepare.cdi-removed")
                self.store.remove(rec.uid)
                with self._lock:
                    self.stats.unprepared += 1
                self.log.info("dra.unprepared", claim=f"{rec.namespace}/{rec.name}", uid=rec.uid)
                self.on_change()
                return ""
        except Exception as exc:  # noqa: BLE001 - the kubelet retries
            self.log.error("dra.unprepare.failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid,
                           error=repr(exc))
            return f"{DRIVER}: ResourceClaim {ref.namespace}/{ref.name}: {exc}"

    # ---- CDI ------------------------------------------------------------------------------
    def _cdi_path(self, uid: str) -> str:
        return os.path.join(self.node.cdi_dir, f"{DRIVER}-claim_{uid}.json")

    def _write_cdi(self, rec: ClaimRecord) -> None:
        """The claim's CDI spec: each device's container edits name its interface and VF
        (environment variables), which is also what makes the CDI names resolvable."""
        devices = []
        for d in rec.devices:
            key = re.sub(r"[^A-Z0-9_]", "_", d.ifname.upper())
            devices.append({"name": rec.cdi_name(d), "containerEdits": {"env": [
                f"TENANTNET_{key}_VF={d.vf}", f"TENANTNET_{key}_NETWORK={d.network or rec.network}"]}})
        spec = {"cdiVersion": "0.6.0", "kind": draclaims.CDI_KIND, "devices": devices}
        from hostfiles.confined import ensure_private_dir, replace_file

        ensure_private_dir(self.node.cdi_dir)
        # 0644: the runtime reads it (as root, but CDI tools as others too); it names no secret.
        replace_file(self._cdi_path(rec.uid), json.dumps(spec, sort_keys=True).encode(), 0o644)

    def _remove_cdi(self, uid: str) -> None:
        for p in (self._cdi_path(uid),):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    # ---- NRI: the pod's sandbox -----------------------------------------------------------
    def _records_of(self, pod_uid: str) -> list[ClaimRecord]:
        return [r for r in self.store.all() if r.pod_uid == pod_uid and r.attach == "nri"]

    def run_pod_sandbox(self, pod: PodSandbox) -> None:
        records = self._records_of(pod.uid)
        if not records:
            return
        if not pod.netns:
            raise NriRefusal(f"{DRIVER}: pod {pod.namespace}/{pod.name} has no network namespace of its own "
                             "(hostNetwork?); its claims' VFs need one")
        errors = self._attach(pod, records)
        if errors:
            raise NriRefusal(f"{DRIVER}: pod {pod.namespace}/{pod.name}: " + "; ".join(errors))

    def stop_pod_sandbox(self, pod: PodSandbox) -> None:
        self._detach_sandbox(pod.id)

    def remove_pod_sandbox(self, pod: PodSandbox) -> None:
        self._detach_sandbox(pod.id)

    def synchronize(self, pods: list[PodSandbox]) -> None:
        """After a (re)connect: attach what running pods miss, detach what dead sandboxes held.
        Answered at once, the work done after: containerd gives Synchronize the same short
        request timeout as an event, and these pods run already (nothing to fail closed)."""
        self._pool.submit(self._reconcile, list(pods))

    def _reconcile(self, pods: list[PodSandbox]) -> None:
        try:
            self.reconcile(pods)
        except Exception as exc:  # noqa: BLE001 - a thread of the pool: logged, retried at the next sync
            self.log.error("dra.synchronize.failed", error=repr(exc))

    def reconcile(self, pods: list[PodSandbox]) -> None:
        """What synchronize does, here and now."""
        alive = {p.id for p in pods}
        for rec in self.store.all():
            gone = [d for d in rec.devices if d.sandbox and d.sandbox not in alive]
            if gone:
                with self.store.lock(rec.uid):
                    current = self.store.load(rec.uid)
                    if current is not None:
                        self._detach(current, [d for d in current.devices
                                               if d.sandbox and d.sandbox not in alive])
        for pod in pods:
            records = self._records_of(pod.uid)
            if records and pod.netns:
                errors = self._attach(pod, records)
                for e in errors:
                    self.log.error("dra.attach.failed", pod=f"{pod.namespace}/{pod.name}", error=e,
                                   when="synchronize")

    def _attach(self, pod: PodSandbox, records: list[ClaimRecord]) -> list[str]:
        started = time.monotonic()
        # Every device, whatever its record says: the ADD of one already in this sandbox is a
        # repeat that answers its result (a record saved before a crash may say "attached"
        # of a device whose DEL had run). One still in an older sandbox of the pod leaves it first.
        for rec in records:
            stale = [d for d in rec.devices if d.sandbox and d.sandbox != pod.id]
            if stale:
                with self.store.lock(rec.uid):
                    current = self.store.load(rec.uid)
                    if current is not None:
                        errors = self._detach(current, [d for d in current.devices
                                                        if d.sandbox and d.sandbox != pod.id])
                        if errors:
                            return errors
        records = [r for r in (self.store.load(rec.uid) for rec in records) if r is not None]
        jobs = [(rec, dev) for rec in records for dev in rec.devices]
        if not jobs:
            return []
        futures = [(rec, dev, self._devices.submit(self._cni, "ADD", rec, dev, pod.id, pod.netns, pod))
                   for rec, dev in jobs]
        done: list[tuple[ClaimRecord, ClaimDevice, dict[str, Any]]] = []
        errors: list[str] = []
        for rec, dev, fut in futures:
            try:
                done.append((rec, dev, fut.result()))
            except Exception as exc:  # noqa: BLE001 - reported per device
                errors.append(f"{dev.ifname} ({dev.vf}, claim {rec.name}): {exc}")
        if errors:  # all or nothing: undo the devices that arrived
            with self._lock:
                self.stats.attach_failed += 1
                self.stats.last_error = "; ".join(errors)
            for rec, dev, _ in done:
                try:
                    self._cni("DEL", rec, dev, pod.id, pod.netns, pod)
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"undoing {dev.ifname}: {exc}")
            return errors
        faults.step("dra.attach.added")
        by_claim: dict[str, list[tuple[ClaimDevice, dict[str, Any]]]] = {}
        for rec, dev, result in done:
            by_claim.setdefault(rec.uid, []).append((dev, result))
        for uid, items in by_claim.items():
            with self.store.lock(uid):
                current = self.store.load(uid)
                if current is None:
                    continue
                for dev, result in items:
                    for d in current.devices:
                        if d.device == dev.device:
                            d.sandbox, d.netns, d.result = pod.id, pod.netns, result
                self.store.save(current)
            faults.step("dra.attach.recorded")
            with self._lock:
                self.stats.attached += len(items)
            # The status is the API's to carry, not the pod's start to wait for.
            self._devices.submit(self._publish_network_data, current)
        self.log.info("dra.attached", ms=round((time.monotonic() - started) * 1000, 2),
                      pod=f"{pod.namespace}/{pod.name}", sandbox=pod.id,
                      devices=[f"{dev.ifname}={dev.vf}" for _, dev, _ in done])
        return []

    def _detach_sandbox(self, sandbox: str) -> None:
        for rec in self.store.all():
            if any(d.sandbox == sandbox for d in rec.devices):
                with self.store.lock(rec.uid):
                    current = self.store.load(rec.uid)
                    if current is not None:
                        for e in self._detach(current, [d for d in current.devices if d.sandbox == sandbox]):
                            self.log.error("dra.detach.failed", claim=f"{rec.namespace}/{rec.name}", error=e)

    def _detach(self, rec: ClaimRecord, devices: Iterable[ClaimDevice]) -> list[str]:
        """DEL each device (in parallel), then the record says they are on the host. The
        caller holds the claim's lock."""
        devices = list(devices)
        if not devices:
            return []
        futures = [(d, self._devices.submit(self._cni, "DEL", rec, d, d.sandbox, d.netns, None))
                   for d in devices]
        errors = []
        for d, fut in futures:
            try:
                fut.result()
                d.sandbox, d.netns, d.result = "", "", None
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{d.ifname} ({d.vf}): {exc}")
        faults.step("dra.detach.deleted")
        self.store.save(rec)
        with self._lock:
            self.stats.detached += len(devices) - len(errors)
        return errors

    def _cni(self, command: str, rec: ClaimRecord, dev: ClaimDevice, sandbox: str, netns: str,
             pod: PodSandbox | None) -> dict[str, Any]:
        """One CNI call for one device, through the agent's in-process plugin."""
        netns_path = netns if command == "ADD" or (netns and os.path.exists(netns)) else ""
        args = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={rec.namespace};K8S_POD_NAME={rec.pod_name};"
                f"K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID={rec.pod_uid}")
        environ = {"CNI_COMMAND": command, "CNI_CONTAINERID": sandbox, "CNI_NETNS": netns_path,
                   "CNI_IFNAME": dev.ifname, "CNI_ARGS": args, "CNI_PATH": self.cni_path}
        network = dev.network or rec.network
        conf = {"cniVersion": CNI_VERSION, "name": network, "type": "tenantnet",
                tenantnetworks.NETWORK_FIELD: network, "deviceID": dev.vf}
        code, out = self.cni(environ, json.dumps(conf).encode())
        if code != 0:
            try:
                msg = json.loads(out).get("msg") or out
            except ValueError:
                msg = out
            raise RuntimeError(f"CNI {command} failed: {msg}")
        if command != "ADD":
            return {}
        result = json.loads(out) if out else {}
        return result if isinstance(result, dict) else {}

    def _publish_network_data(self, rec: ClaimRecord) -> None:
        entries = []
        for d in rec.devices:
            if not d.result:
                continue
            ifaces = d.result.get("interfaces") or []
            mac = next((i.get("mac") for i in ifaces if i.get("sandbox")), None) or \
                (ifaces[0].get("mac") if ifaces else None)
            data: dict[str, Any] = {"interfaceName": d.ifname,
                                    "ips": [ip["address"] for ip in d.result.get("ips") or []
                                            if ip.get("address")]}
            if mac:
                data["hardwareAddress"] = mac
            entries.append({"driver": DRIVER, "pool": self.node_name, "device": d.device,
                            "networkData": data})
        if not entries:
            return
        try:
            self.api.set_network_data(rec.namespace, rec.name, rec.uid, entries)
        except Exception as exc:  # noqa: BLE001 - the pod runs; the status is advisory
            self.log.warning("dra.status_failed", claim=f"{rec.namespace}/{rec.name}", error=str(exc))

    # ---- agent status ---------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        claims = []
        for rec in self.store.all():
            claims.append({"claim": f"{rec.namespace}/{rec.name}", "uid": rec.uid, "network": rec.network,
                           "tenant": rec.tenant, "pod": f"{rec.namespace}/{rec.pod_name}", "attach":
                           rec.attach,
                           "devices": [{"device": d.device, "vf": d.vf, "ifname": d.ifname,
                                        "network": d.network,
                                        "sandbox": d.sandbox[:12]} for d in rec.devices]})
        with self._lock:
            s = self.stats
            return {"prepared": s.prepared, "refused": s.refused, "unprepared": s.unprepared,
                    "attached": s.attached, "attachFailed": s.attach_failed, "detached": s.detached,
                    "lastError": s.last_error, "claims": claims}
