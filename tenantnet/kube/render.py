"""The renderer: TenantNetworks -> one NAD per selected namespace, and each network's status.

One replica at a time writes: replicas elect a leader through a Lease (`tenantnet-renderer`
in the renderer's namespace; 15 s, renewed every 5 s, taken over once expired). The leader
watches TenantNetworks, Namespaces and the NADs it rendered; any event wakes one full,
level-based reconcile (events arriving together are folded into one):

- every TenantNetwork is parsed (tenantnetworks.py) and checked against the others
  (tnrender.cluster_conflicts: overlapping pools, one VLAN of one fabric for two tenants);
  `vlan: auto` gets the lowest free VLAN of the renderer's range on its fabrics, kept in
  `status.vlan`;
- a network whose fabric names a PF that none of the nodes it would be used on publishes
  (their `tenantnet.io/pfs` annotation, tenantnet/kube/watch.py) is refused (UnknownPF) and
  rendered nowhere: its NADs, if any, are removed, as for Invalid and Conflict;
- the namespaces each network selects (tenants through the one resolver, tenants.py, or
  its namespaceSelector) get its NAD (tnrender.render_nad: `type: tenantnet`, labelled,
  owned, with the finalizer `tenantnet.io/rendered-nad`), written by server-side apply with
  force — a tenant's edit of it is undone at its next event, and counted
  (`status.restoredEdits`, log `render.restored`);
- a NAD no longer wanted (network deleted, invalid or in conflict; namespace no longer
  selected) loses the finalizer and is deleted;
- `status`: renderedNamespaces, conflicts (namespaces whose tenant sources disagree), the
  last error and a Ready condition whose reason says why not (Invalid, Conflict,
  NoVlanLeft, UnknownPF);
- with an OVN northbound endpoint (`--ovn-northbound`), every accepted overlay network's
  logical switch `tn-<name>.<segment>` with its tunnel key = the segment, and the removal of
  the switches of networks gone or refused once no logical port is left on them
  (tenantnet/kube/nbswitches.py); `status.overlay` says the switch, its tunnel key and its
  state. After NADs are written: an unreachable NB delays nothing else, is said in
  `status.overlay`, and is tried again every NB_RETRY seconds.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tenantnet.plugin import tnrender
from tenantnet.plugin.tenantnetworks import (
    FINALIZER,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    InvalidTenantNetwork,
    TenantNetwork,
    parse_tenant_network,
)
from tenantnet.plugin.tenants import TenantResolver

FIELD_MANAGER = "tenantnet-renderer"
LEASE_NAME = "tenantnet-renderer"
LEASE_SECONDS = 15
RENEW_EVERY = 5.0
FOLD_EVENTS = 0.05  # events within this are one reconcile
RESYNC_EVERY = 60.0  # a full reconcile even without events (a lost watch event is repaired)
WRITERS = 8  # NAD writes in flight at once
NB_RETRY = 5.0  # the next reconcile after the OVN northbound database could not be reached


@dataclass
class Outcome:
    """What one reconcile did, for logs and tests."""

    created: int = 0
    restored: int = 0
    deleted: int = 0
    statuses: int = 0
    errors: list[str] = field(default_factory=list)
    switches: Any = None  # nbswitches.SyncResult, with an OVN northbound endpoint


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return meta if isinstance(meta, dict) else {}


class Renderer:
    def __init__(
        self,
        client: Any,
        resolver: TenantResolver,
        log: Any,
        *,
        auto_vlans: tuple[int, int] | None = None,
        namespace: str = "kube-system",
        identity: str = "",
        ovn_northbound: str = "",
        ovn_timeout: float = 5.0,
    ) -> None:
        from lightkube.resources.core_v1 import Namespace, Node

        from tenantnet.kube import api

        self.client = client
        self.resolver = resolver
        self.log = log
        self.auto_vlans = auto_vlans
        self.namespace = namespace
        self.identity = identity or f"{socket.gethostname()}-{id(self):x}"
        self.TN, self.NAD, self.Namespace = api.TenantNetwork, api.NetworkAttachmentDefinition, Namespace
        self.Node = Node
        self.wake: queue.Queue[str] = queue.Queue()
        self._stop = threading.Event()
        self.leader = False
        self.switches = None
        if ovn_northbound:
            from tenantnet.kube.nbswitches import SwitchKeeper

            self.switches = SwitchKeeper(ovn_northbound, ovn_timeout)
        self.nb_pending = False  # the last round could not reach the NB: retry soon

    # ---- leader election ------------------------------------------------------------------
    def try_lead(self) -> bool:
        """Take or renew the Lease; False while another replica holds an unexpired one."""
        from lightkube import codecs
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.coordination_v1 import Lease

        from tenantnet.kube import api

        now = _now()
        try:
            lease = api.as_dict(self.client.get(Lease, LEASE_NAME, namespace=self.namespace))
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": LEASE_NAME, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": LEASE_SECONDS,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                self.client.create(codecs.from_dict(body))
            except ApiError:
                return False  # another replica created it first
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = spec.get("renewTime")
        expired = True
        if renewed:
            when = (
                renewed
                if isinstance(renewed, datetime)
                else datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
            )
            expired = (datetime.now(UTC) - when).total_seconds() > float(
                spec.get("leaseDurationSeconds") or LEASE_SECONDS
            )
        if holder not in (None, "", self.identity) and not expired:
            return False
        spec = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": now,
        }
        if holder != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        for key in ("acquireTime", "renewTime"):
            if isinstance(spec.get(key), datetime):
                spec[key] = spec[key].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease["spec"] = spec
        try:  # replace carries the resourceVersion read: a concurrent taker makes this fail (409)
            self.client.replace(codecs.from_dict(lease))
        except ApiError:
            return False
        return True

    def release(self) -> None:
        """Give the Lease up on a clean stop, so another replica leads at its next round
        instead of after the Lease's 15 s."""
        from lightkube import codecs
        from lightkube.resources.coordination_v1 import Lease

        from tenantnet.kube import api

        lease = api.as_dict(self.client.get(Lease, LEASE_NAME, namespace=self.namespace))
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        held = ("holderIdentity", "acquireTime", "renewTime")
        lease["spec"] = {k: v for k, v in spec.items() if k not in held}
        self.client.replace(codecs.from_dict(lease))
        self.leader = False
        self.log.info("render.released", identity=self.identity)

    # ---- reconcile ------------------------------------------------------------------------
    def reconcile(self) -> Outcome:
        from tenantnet.kube import api

        out = Outcome()
        namespaces = {
            _meta(o)["name"]: dict(_meta(o).get("labels") or {})
            for o in map(api.as_dict, self.client.list(self.Namespace))
        }
        objects = [api.as_dict(o) for o in self.client.list(self.TN)]
        existing = {
            (_meta(o)["namespace"], _meta(o)["name"]): o
            for o in map(
                api.as_dict, self.client.list(self.NAD, namespace="*", labels={MANAGED_BY_LABEL: MANAGED_BY})
            )
        }
        parsed: dict[str, TenantNetwork] = {}
        status: dict[str, dict[str, Any]] = {}
        for obj in objects:
            name = _meta(obj).get("name", "?")
            try:
                parsed[name] = parse_tenant_network(obj)
            except InvalidTenantNetwork as exc:
                status[name] = self._status(obj, [], [], str(exc), "Invalid")
        self._assign_vlans(parsed, objects, status)
        if any(tn.fabric.mode != "ovs" for n, tn in parsed.items() if n not in status):
            nodes = {
                _meta(o)["name"]: (dict(_meta(o).get("labels") or {}),
                                   tnrender.published_pfs(_meta(o).get("annotations")))
                for o in map(api.as_dict, self.client.list(self.Node))
            }
            for name in sorted(parsed):
                why = None if name in status else tnrender.unknown_pfs(parsed[name], nodes)
                if why:
                    obj = next(o for o in objects if _meta(o).get("name") == name)
                    status[name] = self._status(obj, [], [], why, "UnknownPF")
        selections = {
            n: tnrender.selected(tn, self.resolver, namespaces) for n, tn in parsed.items() if n not in status
        }
        tenants = {
            n: frozenset(tn.tenants)
            | frozenset(
                t for ns in selections[n][0] for t in [self.resolver.resolve(ns, namespaces[ns]).tenant] if t
            )
            for n, tn in parsed.items()
            if n in selections
        }
        refused = tnrender.cluster_conflicts([parsed[n] for n in selections], tenants)
        by_name = {_meta(o).get("name"): o for o in objects}
        desired: dict[tuple[str, str], dict[str, Any]] = {}
        overlays: dict[str, int] = {}  # accepted overlay networks -> segment: their switches
        for name, (chosen, conflicts) in selections.items():
            if name in refused:
                status[name] = self._status(by_name[name], [], conflicts, refused[name], "Conflict")
                continue
            segment = parsed[name].segment
            if parsed[name].fabric.overlay and segment is not None:
                overlays[name] = segment
            for ns in chosen:
                desired[(ns, name)] = tnrender.render_nad(parsed[name], ns)
            status[name] = self._status(by_name[name], chosen, conflicts, "", "")
        restored: dict[str, int] = {}

        def write(key: tuple[str, str]) -> str:
            try:
                return self._write_nad(key, desired[key], existing.get(key))
            except Exception as exc:
                return f"error: {exc}"

        # Writes in parallel (each is one API round trip; 100 namespaces one after the
        # other took about 2 s on the lab), their outcomes counted here, in one thread.
        keys = list(desired)
        with ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="tenantnet-render-write") as pool:
            results = list(pool.map(write, keys))
        for key, result in zip(keys, results, strict=True):
            if result == "created":
                out.created += 1
            elif result == "restored":
                out.restored += 1
                restored[key[1]] = restored.get(key[1], 0) + 1
            elif result.startswith("error: "):
                out.errors.append(f"NAD {key[0]}/{key[1]}: {result[7:]}")
                status[key[1]]["lastError"] = f"NAD {key[0]}/{key[1]}: {result[7:]}"[:4096]
        for key in existing:
            if key not in desired:
                self._remove_nad(key, out)
        if self.switches is not None:
            self._sync_switches(overlays, status, out)
        for obj in objects:
            name = _meta(obj).get("name", "")
            if name in status:
                new = status[name]
                if name in parsed and parsed[name].vlan_auto and parsed[name].segment is not None:
                    new["vlan"] = parsed[name].segment  # kept: nodes read the VLAN from here
                new["restoredEdits"] = int(
                    (obj.get("status") or {}).get("restoredEdits") or 0
                ) + restored.get(name, 0)
                self._write_status(obj, new, out)
        return out

    def _sync_switches(self, overlays: dict[str, int], status: dict[str, dict[str, Any]],
                       out: Outcome) -> None:
        """The overlay networks' logical switches (after the NADs: an NB away delays no NAD)."""
        assert self.switches is not None
        result = self.switches.sync(overlays)
        out.switches = result
        self.nb_pending = bool(result.unreachable)
        if result.unreachable:
            out.errors.append(f"OVN northbound: {result.unreachable}")
            self.log.warning("render.nb_unreachable", error=result.unreachable[:300], retry_s=NB_RETRY)
        for switch in result.created:
            self.log.info("render.switch_created", switch=switch)
        for switch in result.updated:
            self.log.info("render.switch_updated", switch=switch)
        for switch in result.deleted:
            self.log.info("render.switch_deleted", switch=switch)
        for switch, ports in result.kept.items():
            self.log.info("render.switch_kept", switch=switch, ports=ports,
                          reason="logical ports remain (the nodes' agents')")
        for name, st in status.items():
            found = result.statuses.get(name)
            # None clears a status.overlay that no longer applies (merge patch).
            st["overlay"] = found.as_status() if found is not None else None

    def _assign_vlans(
        self,
        parsed: dict[str, TenantNetwork],
        objects: list[dict[str, Any]],
        status: dict[str, dict[str, Any]],
    ) -> None:
        """`vlan: auto` networks without status.vlan get the lowest VLAN of the range free on
        their fabrics (in name order, so two renderers would agree)."""
        taken: dict[str, set[int]] = {}
        for tn in parsed.values():
            if tn.segment is not None:
                for f in tnrender._fabrics(tn):
                    taken.setdefault(f, set()).add(tn.segment)
        by_name = {_meta(o).get("name"): o for o in objects}
        for name in sorted(parsed):
            tn = parsed[name]
            if not tn.vlan_auto or tn.segment is not None:
                continue
            got = tnrender.auto_vlan(tn, taken, *self.auto_vlans) if self.auto_vlans is not None else None
            if got is None:
                why = (
                    "vlan: auto, and the renderer has no --auto-vlans range"
                    if self.auto_vlans is None
                    else f"vlan: auto, and every VLAN of {self.auto_vlans[0]}-{self.auto_vlans[1]} "
                    "is taken on its fabric"
                )
                status[name] = self._status(by_name[name], [], [], why, "NoVlanLeft")
                continue
            from dataclasses import replace

            parsed[name] = replace(tn, assigned_vlan=got)
            for f in tnrender._fabrics(tn):
                taken.setdefault(f, set()).add(got)

    def _status(
        self, obj: dict[str, Any], chosen: list[str], conflicts: list[str], error: str, reason: str
    ) -> dict[str, Any]:
        old = obj.get("status") or {}
        ready = "False" if reason else "True"
        condition = {
            "type": "Ready",
            "status": ready,
            "reason": reason or "Rendered",
            "message": error or f"rendered into {len(chosen)} namespaces",
            "observedGeneration": _meta(obj).get("generation", 0),
        }
        before = [c for c in old.get("conditions") or [] if c.get("type") == "Ready"]
        same = before and all(before[0].get(k) == condition[k] for k in ("status", "reason", "message"))
        condition["lastTransitionTime"] = (
            before[0].get("lastTransitionTime") if same else datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        new: dict[str, Any] = {
            "observedGeneration": _meta(obj).get("generation", 0),
            "renderedNamespaces": chosen,
            "renderedCount": len(chosen),
            "conflicts": conflicts[:100],
            "lastError": error[:4096],
            "conditions": [condition],
        }
        return new

    def _write_nad(self, key: tuple[str, str], nad: dict[str, Any], seen: dict[str, Any] | None) -> str:
        """Write the NAD where it is missing or differs: "same", "created", "restored" (it was
        there and differed: a tenant's edit undone)."""
        from lightkube import codecs
        from lightkube.core.exceptions import ApiError
        from lightkube.types import PatchType

        if seen is not None and self._same(seen, nad):
            return "same"
        if seen is None:
            try:
                self.client.create(codecs.from_dict(nad), field_manager=FIELD_MANAGER)
                return "created"
            except ApiError as exc:
                if exc.status.code != 409:
                    raise
                # One of that name without our label: a tenant's, overwritten below.
        self.client.patch(
            self.NAD,
            key[1],
            nad,
            namespace=key[0],
            patch_type=PatchType.APPLY,
            field_manager=FIELD_MANAGER,
            force=True,
        )
        self.log.warning(
            "render.restored",
            namespace=key[0],
            network=key[1],
            reason="the NAD differed from its TenantNetwork's rendering (a tenant's edit)",
        )
        return "restored"

    @staticmethod
    def _same(seen: dict[str, Any], nad: dict[str, Any]) -> bool:
        meta, want = _meta(seen), nad["metadata"]
        owners = [
            {k: r.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")}
            for r in meta.get("ownerReferences") or []
        ]
        labels = meta.get("labels") or {}
        return (
            (seen.get("spec") or {}).get("config") == nad["spec"]["config"]
            and all(labels.get(k) == v for k, v in want["labels"].items())
            and FINALIZER in (meta.get("finalizers") or [])
            and owners == want["ownerReferences"]
            and all(
                (meta.get("annotations") or {}).get(k) == v
                for k, v in (want.get("annotations") or {}).items()
            )
        )

    def _remove_nad(self, key: tuple[str, str], out: Outcome) -> None:
        from lightkube.core.exceptions import ApiError
        from lightkube.types import PatchType

        try:
            current = self.client.get(self.NAD, key[1], namespace=key[0])
            from tenantnet.kube import api

            finalizers = [f for f in _meta(api.as_dict(current)).get("finalizers") or [] if f != FINALIZER]
            self.client.patch(
                self.NAD,
                key[1],
                {"metadata": {"finalizers": finalizers or None}},
                namespace=key[0],
                patch_type=PatchType.MERGE,
            )
            self.client.delete(self.NAD, key[1], namespace=key[0])
            out.deleted += 1
            self.log.info("render.removed", namespace=key[0], network=key[1])
        except ApiError as exc:
            if exc.status.code != 404:
                out.errors.append(f"removing NAD {key[0]}/{key[1]}: {exc}")

    def _write_status(self, obj: dict[str, Any], new: dict[str, Any], out: Outcome) -> None:
        from lightkube.types import PatchType

        old = obj.get("status") or {}
        if all(old.get(k) == v for k, v in new.items()):
            return
        name = _meta(obj)["name"]
        self.client.patch(self.TN.Status, name, {"status": new}, patch_type=PatchType.MERGE)
        out.statuses += 1

    # ---- running ----------------------------------------------------------------------------
    def _watch(self, res: Any, **kw: Any) -> None:
        from tenantnet.kube import api

        delay = 0.5
        while not self._stop.is_set():
            try:
                # From "0": served from the watch cache at once (tenantnet/kube/watch.py says
                # why not from "now"); the objects already there come as ADDED, one reconcile.
                for _event, _obj in self.client.watch(
                    res, resource_version="0", server_timeout=api.WATCH_SECONDS, **kw
                ):
                    self.wake.put("event")
                    delay = 0.5
            except Exception as exc:
                self.log.warning(
                    "render.watch_failed", resource=getattr(res, "__name__", str(res)), error=str(exc)[:300]
                )
                time.sleep(delay)
                delay = min(delay * 2, 30.0)

    def run(self) -> None:
        """Elect, watch, reconcile — until stopped."""
        for res, kw in (
            (self.TN, {}),
            (self.Namespace, {}),
            (self.Node, {}),  # a node's PFs (UnknownPF)
            (self.NAD, {"namespace": "*", "labels": {MANAGED_BY_LABEL: MANAGED_BY}}),
        ):
            threading.Thread(
                target=self._watch,
                args=(res,),
                kwargs=kw,
                daemon=True,
                name=f"tenantnet-render-watch-{getattr(res, '__name__', 'x')}",
            ).start()
        next_renew = 0.0
        next_resync = 0.0
        waiting_said = False
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_renew:
                try:
                    lead = self.try_lead()
                except Exception as exc:
                    self.log.warning("render.lease_failed", error=str(exc)[:300])
                    lead = False
                if lead != self.leader or not (lead or waiting_said):
                    # A follower says so once, at its first round: who watches a replica's log
                    # sees it is alive and waiting, not stuck.
                    self.log.info("render.leader" if lead else "render.follower", identity=self.identity)
                    waiting_said = waiting_said or not lead
                    self.leader = lead
                    next_resync = 0.0
                next_renew = now + RENEW_EVERY
            if self.leader and now >= next_resync:
                self._reconcile_logged()
                next_resync = time.monotonic() + (NB_RETRY if self.nb_pending else RESYNC_EVERY)
            try:
                self.wake.get(timeout=max(0.05, min(next_renew, next_resync) - time.monotonic()))
            except queue.Empty:
                continue
            time.sleep(FOLD_EVENTS)
            while not self.wake.empty():
                self.wake.get_nowait()
            if self.leader and not self._stop.is_set():
                self._reconcile_logged()
                if self.nb_pending:
                    next_resync = min(next_resync, time.monotonic() + NB_RETRY)
        if self.switches is not None:
            self.switches.close()
        if self.leader:
            try:
                self.release()
            except Exception as exc:  # the API away: the Lease simply expires
                self.log.warning("render.release_failed", error=str(exc)[:300])

    def _reconcile_logged(self) -> None:
        started = time.monotonic()
        try:
            out = self.reconcile()
        except Exception as exc:
            self.log.warning("render.failed", error=f"{type(exc).__name__}: {exc}"[:500])
            return
        if out.created or out.restored or out.deleted or out.statuses or out.errors:
            self.log.info(
                "render.reconciled",
                created=out.created,
                restored=out.restored,
                deleted=out.deleted,
                statuses=out.statuses,
                errors=out.errors[:5] or None,
                ms=round((time.monotonic() - started) * 1000, 1),
            )

    def stop(self) -> None:
        self._stop.set()
        self.wake.put("stop")


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    a, b = int(lo), int(hi or lo)
    if not 1 <= a <= b <= 4094:
        raise ValueError(f"--auto-vlans {text!r}: must be lo-hi within 1-4094")
    return a, b
