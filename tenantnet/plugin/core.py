"""The plugin core: the CNI verbs, in order, with the record as the source of truth.

ADD writes the attachment record before touching the kernel or OVS, then lets the driver
attach, asks IPAM for addresses, configures them in the pod and completes the record. Any
failure rolls back what was done. DEL, CHECK and GC start from the record — never from
what the caller remembers — so repeated DELs, DEL without netns or prevResult, and a
crash at any point all end with nothing left behind.

The core is a library: the `tenantnet` executable only turns env + stdin into a call here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any

from cni import version as cniversion
from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.netconf import NetConf, parse_netconf, valid_attachments
from cni.result import Interface, Result
from tenantnet.plugin import devinfo, draclaims, faults, ipam_client, modes, results, tnconf
from tenantnet.plugin.drivers import base as drivers
from tenantnet.plugin.log import get as get_log
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.records import (
    PHASE_READY,
    AttachmentRecord,
    CorruptRecord,
    Plan,
    PodRef,
    RecordStore,
)
from tenantnet.plugin.system import netlink, ovsdb
from tenantnet.plugin.system.netns import NamespaceNotFound, pod_netns_problem

RECORD_VERSION = "1.1.0"  # results are kept in the newest shape and converted on output
STEP_IPAM = "ipam"
STEP_DEVINFO = "devinfo"
# IPAM errors that say "this config is not acceptable" rather than "try again".
_IPAM_REFUSED_CONFIG = {Code.INCOMPATIBLE_VERSION, Code.UNSUPPORTED_FIELD, Code.DECODE_FAILURE,
                        Code.INVALID_CONFIG}


def system_error(exc: BaseException, doing: str) -> CniError:
    """Map adapter exceptions to CNI errors (one table for the whole core)."""
    if isinstance(exc, CniError):
        return exc
    if isinstance(exc, ovsdb.OvsdbUnavailable):
        return CniError(Code.TRY_AGAIN_LATER, f"{doing}: {exc}")
    if isinstance(exc, ovsdb.OvsdbFailure):
        return CniError(Code.OVSDB_FAILURE, f"{doing}: {exc}")
    if isinstance(exc, NamespaceNotFound):
        return CniError(Code.INVALID_ENV, f"invalid CNI_NETNS: {exc}")
    if isinstance(exc, netlink.NetlinkProblem):
        return CniError(Code.NETLINK_FAILURE, f"{doing}: {exc}")
    if isinstance(exc, OSError):
        return CniError(Code.IO_FAILURE, f"{doing}: {exc}")
    return CniError(Code.INTERNAL, f"{doing}: internal error: {type(exc).__name__}: {exc}")


class Plugin:
    def __init__(self, node: NodeConfig) -> None:
        self.node = node
        self.records = RecordStore(node.state_dir, modes.plan_type)
        self.log = get_log("tenantnet.plugin.core")
        # An ADD that failed after its record was written has its line (add.failed); the
        # entry layer logs every other refusal (tenantnet/entry/plugin.py).
        self.add_failure_logged = False

    # ---- ADD --------------------------------------------------------------------------
    def add(self, env: CniEnv, conf: NetConf) -> dict[str, Any]:
        conf = draclaims.bind(conf, env, self.node.state_dir)  # Multus's DRA path names a claim's device
        tconf = tnconf.settle(conf, env, self.node, self.log)
        if tconf.base.raw.get("tenantNetwork") is not None:
            conf = tconf.base  # rendered from the TenantNetwork: its IPAM and record, not the NAD's text
        if tconf.device_info_file:  # this attachment's name only; its directory made, before any change
            devinfo.accepted(tconf.device_info_file, env.container_id, env.ifname, self.node.device_info_dir)
            devinfo.ensure_directory(os.path.dirname(tconf.device_info_file), self.node.device_info_dir)
        driver = modes.for_mode(tconf.mode, self.node)
        _require_pod_netns(env)
        with self._locked(env):
            return self._add(env, conf, tconf, driver)

    @contextmanager
    def _locked(self, env: CniEnv) -> Iterator[None]:
        """Every call for this (container id, ifname) runs alone, across processes."""
        with ExitStack() as held:
            try:
                held.enter_context(self.records.lock(env.container_id, env.ifname))
            except OSError as exc:
                raise CniError(Code.IO_FAILURE, f"cannot take the attachment lock under "
                                                f"{self.records.state_dir}: {exc.strerror or exc}") from None
            yield

    def _add(self, env: CniEnv, conf: NetConf, tconf: tnconf.TenantnetConf,
             driver: drivers.Driver) -> dict[str, Any]:
        key = (conf.name, env.container_id, env.ifname)
        existing = self._load(*key, env=env, conf=conf)
        if existing is not None:
            if existing.phase == PHASE_READY and existing.netns == env.netns and existing.result \
                    and self._pod_link_present(existing):
                self.log.info("add.repeat", network=conf.name, container_id=env.container_id,
                              ifname=env.ifname)
                return Result.from_dict(existing.result).to_dict(conf.cni_version)
            # A half-made or stale attachment under the same key: undo it first.
            try:
                self._teardown(existing, env, modes.for_mode(existing.mode, self.node))
            except BaseException as exc:
                raise system_error(exc, f"undoing the earlier attempt of ADD {env.container_id}/"
                                        f"{env.ifname} on network {conf.name}") from None

        with driver.reserve():
            try:
                plan = driver.plan(tconf, env, self.records)
            except BaseException as exc:
                raise system_error(exc, f"ADD {env.container_id}/{env.ifname} on network "
                                        f"{conf.name}") from None
            record = AttachmentRecord(
                network=conf.name,
                container_id=env.container_id,
                ifname=env.ifname,
                mode=tconf.mode,
                netns=env.netns,
                pod=PodRef(env.args.pod_namespace, env.args.pod_name, env.args.pod_uid),
                plan=plan,
                conf={k: v for k, v in conf.raw.items() if k != "prevResult"},
            )
            plan.cni_args = ipam_client.call_for(env).cni_args
            plan.device_info_file = tconf.device_info_file  # DEL removes it, if ADD wrote it
            try:
                self.records.save(record)  # intent first: from here on a crash is recoverable
            except OSError as exc:
                raise CniError(Code.IO_FAILURE, f"cannot write the attachment record under "
                                                f"{self.records.root}: {exc.strerror or exc}") from None
        faults.step("add.recorded")
        started = time.perf_counter()
        record.progress = set()
        pending: drivers.Pending | None = None
        bound: drivers.Pending | None = None  # the driver's step once addressed
        # An IPAM that never looks at the pod's interface allocates while the driver makes
        # it; one that may (dhcp, anything unknown) runs after, as the spec's order has it.
        allocating: drivers.Pending | None = None
        if tconf.ipam_type in ipam_client.INTERFACE_BLIND:
            allocating = drivers.in_background(ipam_client.run, tconf.ipam_type,
                                               ipam_client.call_for(env, "ADD"), conf.raw, self.node)
        try:
            attached = driver.attach(record, tconf)
            pending = attached.pending
            faults.step("add.attached")
            if tconf.device_info_file and attached.device_info:
                self._write_devinfo(record, tconf.device_info_file, attached.device_info)
                faults.step("add.devinfo-written")
            ipam_result = Result()
            if allocating is not None:
                got, allocating = allocating.result(), None
                record.mark(STEP_IPAM)
                ipam_result = got or Result()
            elif tconf.ipam_type:
                got = ipam_client.run(tconf.ipam_type, ipam_client.call_for(env, "ADD"), conf.raw, self.node)
                # A failed IPAM ADD allocated nothing (the spec makes the plugin clean up).
                record.mark(STEP_IPAM)
                ipam_result = got or Result()
            faults.step("add.ipam-done")
            bound = driver.addressed(record, tconf, [str(ip.address) for ip in ipam_result.ips])
            if attached.has_netdev:
                pod_state = netlink.configure_pod_interface(
                    env.netns, attached.pod_ifname, results.address_plan(ipam_result),
                    tx_checksum_off=attached.tx_checksum_off,
                )
                pod = Interface(name=pod_state.name, mac=pod_state.mac, mtu=pod_state.mtu,
                                sandbox=env.netns, pci_id=attached.pci_id)
            else:
                pod = Interface(name=attached.pod_ifname, sandbox=env.netns, pci_id=attached.pci_id)
            faults.step("add.pod-configured")
            result = results.assemble(conf.prev_result, attached.host, pod, ipam_result, tconf.dns)
            if pending is not None:
                pending.result()  # the driver's background step: its failure fails the ADD
            if bound is not None:
                bound.result()  # the overlay's logical port: its failure fails the ADD
            record.phase = PHASE_READY
            record.result = result.to_dict(RECORD_VERSION)
            self.records.save(record, rewrite=True)
            faults.step("add.ready")
            self._ready(record, tconf, driver)
        except BaseException as exc:
            for step in (pending, bound):
                if step is not None:
                    step.wait()  # the rollback must not race the driver's background steps
            if allocating is not None:  # the driver failed while IPAM allocated: release it too
                allocating.wait()
                if allocating.exception() is None:
                    record.mark(STEP_IPAM)
            err = system_error(exc, f"ADD {env.container_id}/{env.ifname} on network {conf.name}")
            self.log.warning("add.failed", network=conf.name, container_id=env.container_id,
                             ifname=env.ifname, code=err.code, error=err.msg)
            self.add_failure_logged = True
            if not isinstance(exc, CniError):
                self.log.debug("add.failed.traceback", exc_info=exc)
            self._rollback(record, env, driver)
            raise err from None
        self.log.info("add.done", network=conf.name, container_id=env.container_id,
                      ifname=env.ifname, mode=tconf.mode, pod=f"{record.pod.namespace}/{record.pod.name}",
                      ms=round((time.perf_counter() - started) * 1000, 2))
        return result.to_dict(conf.cni_version)

    def _write_devinfo(self, record: AttachmentRecord, path: str, info: dict[str, str]) -> None:
        """The device-info file, written only where nothing is (devinfo.py): its identity is
        in the record on disk before the file has its name, so that DEL, GC or a retried ADD
        removes exactly that file, and nothing else, whenever this one stops."""
        staged = devinfo.stage(path, info, self.node.device_info_dir)
        record.plan.device_info_id = staged.identity
        record.mark(STEP_DEVINFO)
        try:
            self.records.save(record, rewrite=True)
        except OSError as exc:
            raise CniError(Code.IO_FAILURE, f"cannot write the attachment record under "
                                            f"{self.records.root}: {exc.strerror or exc}") from None
        if not devinfo.publish(staged):
            self.log.info("devinfo.kept", network=record.network, container_id=record.container_id,
                          ifname=record.ifname, path=path,
                          reason="a file tenantnet did not write is there already (Multus copies the "
                                 "device plugin's file there); kept as it is, and not removed on DEL")

    def _ready(self, record: AttachmentRecord, tconf: tnconf.TenantnetConf, driver: drivers.Driver) -> None:
        """The driver's after-ready work (pre-warm): it never fails the ADD, whose result the
        record already holds."""
        try:
            if driver.ready(record, tconf):
                self.records.save(record, rewrite=True)
        except Exception as exc:
            self.log.warning("add.ready_work_failed", network=record.network,
                             container_id=record.container_id, ifname=record.ifname,
                             error=f"{type(exc).__name__}: {exc}")

    def _pod_link_present(self, record: AttachmentRecord) -> bool:
        try:
            return netlink.pod_link(record.netns, record.ifname) is not None
        except (NamespaceNotFound, netlink.NetlinkProblem):
            return False

    def _rollback(self, record: AttachmentRecord, env: CniEnv, driver: drivers.Driver) -> None:
        # Nothing here needs room on disk (records are unlinked; the IPAM store keeps a
        # reserve for releases, ipam/sqlite_store.py), so a full disk undoes an ADD too.
        try:
            self._teardown(record, env, driver)
        except BaseException as exc:  # keep the record: DEL or GC will finish the job
            self.log.error("add.rollback_failed", network=record.network,
                           container_id=record.container_id, ifname=record.ifname, error=str(exc))

    # ---- DEL --------------------------------------------------------------------------
    def delete(self, env: CniEnv, conf: NetConf) -> None:
        with self._locked(env):
            self._delete(env, conf)

    def _delete(self, env: CniEnv, conf: NetConf) -> None:
        record = self._load(conf.name, env.container_id, env.ifname, env=env, conf=conf)
        if record is None:
            record = self._record_from_request(env, conf)
            if record is None:
                self.log.info("del.nothing", network=conf.name, container_id=env.container_id,
                              ifname=env.ifname)
                self.records.remove(conf.name, env.container_id, env.ifname)  # a crashed save's temp file
                return
        driver = modes.for_mode(record.mode, self.node)
        try:
            self._teardown(record, env, driver)
        except BaseException as exc:
            raise system_error(exc, f"DEL {env.container_id}/{env.ifname} on network {conf.name}") from None
        self.log.info("del.done", network=conf.name, container_id=env.container_id, ifname=env.ifname)

    def _record_from_request(self, env: CniEnv, conf: NetConf) -> AttachmentRecord | None:
        """No record (lost, or never written): rebuild what we would have made from the request."""
        try:
            tconf = tnconf.parse(conf, env, self.node)
            driver = modes.for_mode(tconf.mode, self.node)
        except CniError as err:
            # A config we cannot parse cannot have produced an attachment of ours.
            self.log.warning("del.unparsable_config", network=conf.name, error=err.msg)
            return None
        try:
            plan = driver.plan_without_record(tconf, env, self.records)
        except Exception as exc:  # DEL must succeed: what we cannot find, we cannot own
            self.log.warning("del.cannot_plan", network=conf.name, error=getattr(exc, "msg", str(exc)))
            return None
        if plan is None:
            # Nothing on the node provably belongs to this (container id, ifname): never
            # touch another pod's objects. Its addresses, if any, are released by owner.
            plan = Plan(nothing_owned=True)
        return AttachmentRecord(
            network=conf.name, container_id=env.container_id, ifname=env.ifname,
            mode=tconf.mode, netns=env.netns, plan=plan,
            conf={k: v for k, v in conf.raw.items() if k != "prevResult"},
        )

    def _teardown(self, record: AttachmentRecord, env: CniEnv | None, driver: drivers.Driver,
                  *, cni_path: tuple[str, ...] = ()) -> None:
        """IPAM release, driver detach, record removal — each step idempotent.

        A transient IPAM failure (a full disk, a store locked too long) does not stop the
        detach: the pod's interface, OVS port and VF are undone anyway, and only the record
        stays, so that the next DEL or GC retries the release."""
        # The IPAM release runs beside the detach (for a veth: ≈ 20 ms of the kernel waiting
        # for RCU); both are idempotent and touch different things. The detach stays on this
        # thread: it may itself hand steps to helper threads, which must never wait for a
        # helper thread of their own.
        releasing = drivers.in_background(self._release, record, env, cni_path)
        try:
            if not record.plan.nothing_owned:
                driver.detach(record)
                faults.step("del.detached")
        finally:
            releasing.wait()
        ipam_failure = releasing.result()
        devinfo_file = record.plan.device_info_file
        if devinfo_file:  # only the file ADD wrote, while it is still that file (devinfo.py)
            devinfo.remove(devinfo_file, record.plan.device_info_id, self.node.device_info_dir)
            faults.step("del.devinfo-removed")
        if ipam_failure is not None:
            raise ipam_failure
        try:
            self.records.remove(*record.key)
        except ValueError:
            pass  # a synthetic record for an orphan whose ids are not path-safe

    def _release(self, record: AttachmentRecord, env: CniEnv | None,
                 cni_path: tuple[str, ...]) -> CniError | None:
        """The IPAM release of a teardown: a transient failure is returned (the record stays
        for a later DEL or GC to retry); a config the IPAM plugin refuses outright is logged."""
        ipam_failure: CniError | None = None
        ipam_conf = record.conf.get("ipam")
        ipam_done = record.progress is None or STEP_IPAM in record.progress
        if ipam_done and isinstance(ipam_conf, dict) and ipam_conf.get("type"):
            call = ipam_client.IpamCall(
                command="DEL", container_id=record.container_id, ifname=record.ifname,
                netns="", cni_args=record.plan.cni_args,
                cni_path=env.path if env is not None else cni_path,
            )
            try:
                try:
                    ipam_client.run(ipam_conf["type"], call, record.conf, self.node)
                except CniError as err:
                    if err.code != Code.INCOMPATIBLE_VERSION or record.conf.get("cniVersion") == "1.0.0":
                        raise
                    # A release is the same operation in every version; an IPAM plugin that
                    # does not speak this one (GC's 1.1.0 to host-local 1.1.x) gets 1.0.0.
                    older = {**record.conf, "cniVersion": "1.0.0"}
                    ipam_client.run(ipam_conf["type"], call, older, self.node)
                faults.step("del.ipam-released")
            except CniError as err:
                if err.code not in _IPAM_REFUSED_CONFIG:
                    ipam_failure = err  # transient: keep the record so a later DEL or GC retries
                else:
                    # The IPAM plugin rejects this config outright, so it cannot hold an
                    # address for it either; refusing DEL forever would only leak the rest.
                    self.log.warning("del.ipam_refused_config", network=record.network,
                                     container_id=record.container_id, ifname=record.ifname,
                                     code=err.code, error=err.msg)
        return ipam_failure

    # ---- CHECK ------------------------------------------------------------------------
    def check(self, env: CniEnv, conf: NetConf) -> None:
        if not cniversion.at_least(conf.cni_version, "0.4.0"):
            raise CniError(Code.INCOMPATIBLE_VERSION,
                           f"config version {conf.cni_version} does not allow CHECK (needs 0.4.0 or later)")
        if conf.prev_result is None:
            raise CniError(Code.INVALID_CONFIG, "invalid network config: CHECK needs prevResult")
        # The same decision as ADD: resolves "vlan": "tenant", and fails an attachment the
        # current policy would no longer allow.
        conf = draclaims.bind(conf, env, self.node.state_dir)
        tconf = tnconf.settle(conf, env, self.node, self.log)
        if tconf.base.raw.get("tenantNetwork") is not None:
            # As ADD: the TenantNetwork's config (IPAM's CHECK reads prevResult from it too).
            conf = replace(tconf.base, raw={**tconf.base.raw, "prevResult": conf.raw["prevResult"]},
                           prev_result=conf.prev_result)
        _require_pod_netns(env)
        with self._locked(env):
            self._check(env, conf, tconf)

    def _check(self, env: CniEnv, conf: NetConf, tconf: tnconf.TenantnetConf) -> None:
        assert conf.prev_result is not None, "check() refuses a config without prevResult"
        record = self._load(conf.name, env.container_id, env.ifname, env=env, conf=conf)
        if record is None or record.phase != PHASE_READY:
            raise CniError(Code.UNKNOWN_CONTAINER,
                           f"no attachment recorded for container {env.container_id} ifname "
                           f"{env.ifname} on network {conf.name}")
        driver = modes.for_mode(record.mode, self.node)
        try:
            drift = driver.check(record, tconf)
            if driver.pod_netdev(record):
                drift += self._check_pod(env, conf.prev_result, tconf)
            if tconf.ipam_type:
                ipam_client.run(tconf.ipam_type, ipam_client.call_for(env, "CHECK"), conf.raw, self.node)
        except CniError:
            raise
        except BaseException as exc:
            raise system_error(exc, f"CHECK {env.container_id}/{env.ifname}") from None
        if drift:
            raise CniError(Code.CHECK_FAILED,
                           f"CHECK failed for {env.container_id}/{env.ifname} on network "
                           f"{conf.name}: " + "; ".join(drift))

    def _check_pod(self, env: CniEnv, prev: Result, tconf: tnconf.TenantnetConf) -> list[str]:
        drift: list[str] = []
        try:
            link = netlink.pod_link(env.netns, env.ifname)
        except NamespaceNotFound:
            return [f"network namespace {env.netns} is gone"]
        if link is None:
            return [f"interface {env.ifname} is missing in {env.netns}"]
        index = next((i for i, itf in enumerate(prev.interfaces)
                      if itf.name == env.ifname and itf.sandbox), None)
        if index is None:
            return [f"prevResult has no interface {env.ifname} with a sandbox"]
        expected = prev.interfaces[index]
        if expected.mac and expected.mac.lower() != link.mac:
            drift.append(f"{env.ifname} has MAC {link.mac}, expected {expected.mac.lower()}")
        want_mtu = expected.mtu or tconf.mtu
        if want_mtu and want_mtu != link.mtu:
            drift.append(f"{env.ifname} has MTU {link.mtu}, expected {want_mtu}")
        if not link.up:
            drift.append(f"{env.ifname} is down")
        live = set(link.addresses)
        for ip in prev.ips:
            if ip.interface == index and ip.address.with_prefixlen not in live:
                drift.append(f"{env.ifname} lacks address {ip.address.with_prefixlen}")
        return drift

    # ---- GC ---------------------------------------------------------------------------
    def gc(self, env: CniEnv, raw: dict[str, Any]) -> None:
        conf = parse_netconf(raw)
        keep = valid_attachments(raw)
        problems: list[CniError] = []
        recorded: set[tuple[str, str]] = set()
        doomed: list[AttachmentRecord] = []
        for item in self.records.list(conf.name):
            if isinstance(item, CorruptRecord):
                # Out of the way; what it described is found below as unrecorded objects.
                self._quarantine(item)
                continue
            recorded.add((item.container_id, item.ifname))
            if (item.container_id, item.ifname) not in keep:
                doomed.append(item)
        try:
            driver = modes.for_mode(tnconf.infer_mode(conf.raw), self.node)
            orphans = driver.orphans(conf, env, keep, recorded)
            # An unrecorded attachment's addresses are released with the network's own
            # IPAM config, which the GC call carries.
            ipam_conf = {k: v for k, v in conf.raw.items() if not k.startswith("cni.dev/")}
            for orphan in orphans:
                orphan.conf = orphan.conf or ipam_conf
            doomed += orphans
        except (CniError, ovsdb.OvsdbUnavailable, ovsdb.OvsdbFailure) as exc:
            problems.append(system_error(exc, "looking for unrecorded OVS ports"))
        for left in self.records.sweep_temp(conf.name):
            self.log.info("gc.temp_removed", path=left)
        faults.step("gc.listed")
        for record in doomed:
            try:
                self._teardown(record, None, modes.for_mode(record.mode, self.node),
                               cni_path=env.path)
                self.log.info("gc.released", network=conf.name, container_id=record.container_id,
                              ifname=record.ifname)
            except BaseException as exc:
                problems.append(system_error(exc, f"GC of {record.container_id}/{record.ifname}"))
        ipam_client.gc_own(conf, keep, self.node)
        if problems:
            raise CniError(problems[0].code, f"GC of network {conf.name} incomplete: "
                           + "; ".join(p.msg for p in problems))

    # ---- STATUS -----------------------------------------------------------------------
    def status(self, env: CniEnv, raw: dict[str, Any]) -> None:
        try:
            mode = tnconf.infer_mode(raw)
        except CniError:
            mode = "ovs"  # a config we cannot read: report on the node's own OVSDB
        try:
            driver = modes.for_mode(mode, self.node)
        except CniError as err:
            raise CniError(Code.NOT_AVAILABLE, f"tenantnet is not available: {err.msg}") from None
        driver.status(raw)  # what the mode needs: OVSDB, offload preconditions (none for sriov)
        try:
            os.makedirs(self.records.root, mode=0o700, exist_ok=True)
            if not os.access(self.records.root, os.W_OK):
                raise PermissionError(self.records.root)
        except OSError as exc:
            raise CniError(Code.NOT_AVAILABLE,
                           f"tenantnet is not available: state directory {self.records.root} "
                           f"is not writable: {exc}") from None

    # ---- helpers ----------------------------------------------------------------------
    def _quarantine(self, problem: CorruptRecord) -> None:
        try:
            moved = self.records.quarantine(problem)
        except OSError as exc:
            moved = None
            self.log.error("record.quarantine_failed", error=f"{problem}: {exc}")
        self.log.error("record.corrupt", error=str(problem), quarantined=moved)
    def _load(self, network: str, container_id: str, ifname: str, *, env: CniEnv | None = None,
              conf: NetConf | None = None) -> AttachmentRecord | None:
        """The record, or None; an unreadable one is quarantined and (given the request)
        replaced by what DEL without a record would undo, so that nothing it described
        is left behind and no call fails on it for ever."""
        try:
            return self.records.load(network, container_id, ifname)
        except CorruptRecord as exc:
            self._quarantine(exc)
            if env is None or conf is None or env.command == "CHECK":
                return None
            return self._record_from_request(replace(env, command="DEL"), conf)
        except OSError as exc:
            raise CniError(Code.IO_FAILURE, f"cannot read attachment records under "
                                            f"{self.records.root}: {exc.strerror or exc}") from None


def _require_pod_netns(env: CniEnv) -> None:
    """CNI_NETNS must be a pod's network namespace (not the host's, not some other file)."""
    problem = pod_netns_problem(env.netns)
    if problem:
        raise CniError(Code.INVALID_ENV, f"invalid CNI_NETNS={env.netns!r}: {problem}")
