"""DRA claim records: what the DRA driver (tenantnet/kube/dra.py, docs/dra.md) prepared for a
ResourceClaim, one file per claim UID, written before anything else happens for the claim:

    <stateDir>/dra/claims/<claim uid>.json

The kubelet retries NodePrepareResources and NodeUnprepareResources, the agent may be killed
between a prepare and the pod's start, and a pod may be deleted while the agent is down; so
the record, not the agent's memory, says which VF a claim holds, for which pod, on which
TenantNetwork, and which of its devices sit in which pod sandbox. Atomic writes (temp file,
rename, 0600), as attachment records (records.py; the same durability argument).

The plugin layer reads these records too, which is why they live here and not in
tenantnet/kube: a VF a claim holds is not the CNI path's to take (`claimed_vfs`), and Multus's
DRA path names a claim's device by its CDI name `claim-<uid>-<device>` instead of a PCI
address (`bind`): the CNI ADD then gets that VF only for a pod the claim is reserved for,
in the claim's namespace.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from hostfiles.confined import ensure_private_dir, replace_file

DRIVER = "tenantnet.io"
CDI_KIND = f"{DRIVER}/vf"
FORMAT = 1
MAX_RECORD_BYTES = 1 << 20
PHASE_PREPARED = "prepared"
_UID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UID_RE = re.compile(_UID)
_DEVICE = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
# The CDI device name of a claim's device (the part after `tenantnet.io/vf=`), which Multus
# v4.3 passes as `deviceID` / `pciBusID`: "claim-" + the claim's UID + "-" + the device.
CDI_NAME_RE = re.compile(rf"claim-({_UID})-({_DEVICE})")


@dataclass
class ClaimDevice:
    """One allocated device of a claim: the slice's device name, the VF behind it, the pod
    interface it becomes, and where it is now (the sandbox holding it, "" when on the host)."""

    request: str
    device: str
    vf: str
    ifname: str
    network: str = ""                # the TenantNetwork of this device's request
    sandbox: str = ""
    netns: str = ""
    result: dict[str, Any] | None = None


@dataclass
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    network: str
    tenant: str
    attach: str                      # "nri": moved at the pod's start; "cni": Multus's DRA path
    pod_uid: str
    pod_name: str
    devices: list[ClaimDevice] = field(default_factory=list)
    phase: str = PHASE_PREPARED
    created: float = 0.0
    format: int = FORMAT

    def cdi_name(self, dev: ClaimDevice) -> str:
        return f"claim-{self.uid}-{dev.device}"

    def cdi_id(self, dev: ClaimDevice) -> str:
        return f"{CDI_KIND}={self.cdi_name(dev)}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClaimRecord:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a claim record of this format")
        devices = [ClaimDevice(**d) for d in data.pop("devices")]
        return cls(**data, devices=devices)


class ClaimStore:
    def __init__(self, state_dir: str) -> None:
        self.root = os.path.join(state_dir, "dra", "claims")
        self.lock_dir = os.path.join(state_dir, "dra", "locks")

    def path(self, uid: str) -> str:
        if not _UID_RE.fullmatch(uid):
            raise ValueError(f"not a claim UID: {uid!r}")
        return os.path.join(self.root, uid + ".json")

    @contextmanager
    def lock(self, uid: str) -> Iterator[None]:
        """Serialise every prepare/unprepare/attach of one claim, across threads and processes
        (flock on one file per claim; removed with the claim's record by `remove`)."""
        ensure_private_dir(self.lock_dir)
        self.path(uid)  # validates the uid before it names a file
        fd = os.open(os.path.join(self.lock_dir, uid + ".lock"),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def load(self, uid: str) -> ClaimRecord | None:
        try:
            fd = os.open(self.path(uid), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(MAX_RECORD_BYTES + 1)
        if len(text) > MAX_RECORD_BYTES:
            raise ValueError(f"claim record {uid} is larger than {MAX_RECORD_BYTES} bytes")
        return ClaimRecord.from_json(text.decode())

    def save(self, record: ClaimRecord) -> None:
        ensure_private_dir(self.root)
        replace_file(self.path(record.uid), record.to_json().encode(), 0o600)

    def remove(self, uid: str) -> None:
        for p in (self.path(uid), os.path.join(self.lock_dir, uid + ".lock")):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def uids(self) -> list[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and _UID_RE.fullmatch(n[:-5]))

    def all(self) -> Iterator[ClaimRecord]:
        """Every readable record (an unreadable one is skipped: `tenantnetctl dra ls` shows it)."""
        for uid in self.uids():
            try:
                rec = self.load(uid)
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if rec is not None:
                yield rec


def claimed_vfs(state_dir: str) -> dict[str, ClaimRecord]:
    """Every VF some claim holds, with its claim."""
    if not os.path.isdir(os.path.join(state_dir, "dra", "claims")):
        return {}
    return {dev.vf: rec for rec in ClaimStore(state_dir).all() for dev in rec.devices}


def admits(rec: ClaimRecord, pod_namespace: str, pod_uid: str) -> str | None:
    """None when a CNI call for this pod may use the claim's devices; else why not."""
    if pod_namespace != rec.namespace:
        return (f"it is held by ResourceClaim {rec.namespace}/{rec.name} (tenant {rec.tenant}), and the pod "
                f"is in namespace {pod_namespace or '(none given)'}")
    if pod_uid and rec.pod_uid and pod_uid != rec.pod_uid:
        return (f"it is held by ResourceClaim {rec.namespace}/{rec.name}, reserved for pod "
                f"{rec.namespace}/{rec.pod_name} (uid {rec.pod_uid}), not this pod (uid {pod_uid})")
    if not pod_uid:
        return (f"it is held by ResourceClaim {rec.namespace}/{rec.name}, and the call names no "
                "K8S_POD_UID to check it against the pod the claim is reserved for")
    return None


def _cdi_name_match(value: object) -> re.Match[str] | None:
    """`claim-<uid>-<device>` (the `tenantnet.io/vf=` kind before it allowed) parsed, or None."""
    if not isinstance(value, str):
        return None
    if value.startswith(CDI_KIND + "="):
        value = value[len(CDI_KIND) + 1:]
    return CDI_NAME_RE.fullmatch(value)


def resolve_cdi_name(state_dir: str, name: str) -> tuple[ClaimRecord, ClaimDevice] | None:
    """The claim and device a CDI device name (`claim-<uid>-<device>`, optionally with the
    `tenantnet.io/vf=` kind before it) stands for; None when it is not such a name or no
    claim of this node has it."""
    m = _cdi_name_match(name)
    if m is None:
        return None
    try:
        rec = ClaimStore(state_dir).load(m.group(1))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if rec is None:
        return None
    for dev in rec.devices:
        if dev.device == m.group(2):
            return rec, dev
    return None


def looks_like_cdi_name(value: object) -> bool:
    return _cdi_name_match(value) is not None


def bind(conf: Any, env: Any, state_dir: str) -> Any:
    """Multus's DRA path (docs/dra.md): a `deviceID`, `pciBusID` or `runtimeConfig.deviceID`
    that is a claim's CDI device name is replaced by the VF's PCI address — for a pod the
    claim is reserved for, in the claim's namespace, on the claim's network, and only when
    the claim was prepared for this path (`attach: cni`). Anything else is refused here, by
    name, before the config is read further. `conf` unchanged when no field is such a name."""
    from cni.errors import CniError, Code
    from cni.netconf import ci_get, parse_netconf

    runtime = conf.raw.get("runtimeConfig")
    fields = (("runtimeConfig.deviceID", ci_get(runtime, "deviceID") if isinstance(runtime, dict) else None),
              ("deviceID", conf.raw.get("deviceID")), ("pciBusID", conf.raw.get("pciBusID")))
    named = [(where, value) for where, value in fields if looks_like_cdi_name(value)]
    if not named:
        return conf
    raw = json.loads(json.dumps(conf.raw))
    network = conf.raw.get("tenantNetwork") or conf.name
    for where, value in named:
        found = resolve_cdi_name(state_dir, str(value))
        if found is None:
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid network config: {where}={value!r}: no ResourceClaim prepared on this "
                           f"node has that device (a CDI device name of driver {DRIVER}: "
                           "claim-<claim uid>-<device>)")
        rec, dev = found
        why = admits(rec, env.args.pod_namespace, env.args.pod_uid)
        if why is not None:
            raise CniError(Code.TENANT_DENIED, f"tenant isolation: {where}={value!r}: {why}")
        wanted = dev.network or rec.network
        if wanted and wanted != network:
            raise CniError(Code.TENANT_DENIED,
                           f"tenant isolation: {where}={value!r}: ResourceClaim {rec.namespace}/{rec.name} "
                           f"was prepared for TenantNetwork {wanted}, and this is network {network}")
        if rec.attach != "cni":
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid network config: {where}={value!r}: ResourceClaim "
                           f"{rec.namespace}/{rec.name} has its devices moved into the pod at its start "
                           "(attach: nri); give the claim's "
                           f"{DRIVER} config attach: cni to attach them through Multus instead")
        if where == "runtimeConfig.deviceID":
            for key in list(raw["runtimeConfig"]):
                if key.lower() == "deviceid":
                    raw["runtimeConfig"][key] = dev.vf
        else:
            raw[where] = dev.vf
    return parse_netconf(raw)


_DEVICE_PCI_RE = re.compile(r"vf-([0-9a-f]{4})-([0-9a-f]{2})-([0-9a-f]{2})-([0-7])")


def device_name(pci: str) -> str:
    """A VF's device name in this node's ResourceSlices (a DNS label): 0000:1b:00.2 ->
    vf-0000-1b-00-2."""
    return "vf-" + pci.lower().replace(":", "-").replace(".", "-")


def vf_of_device(name: str) -> str | None:
    """The PCI address a device name stands for; None when it is not a VF device name."""
    m = _DEVICE_PCI_RE.fullmatch(name)
    return f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4)}" if m else None
