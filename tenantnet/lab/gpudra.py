"""The lab's simulated GPU DRA driver, `gpu.lab.tenantnet.io` — a simulation of the tenantnet
lab, labelled as one everywhere: no GPU exists, and nothing here touches a real one.

Why it exists: tenantnet's own DRA driver (`tenantnet.io`, docs/dra.md) publishes the node's
VFs with `resource.kubernetes.io/pcieRoot`, so that the real kube-scheduler can pair each rail
with the GPU behind the same PCIe switch through a `matchAttribute` constraint. That needs a
second driver publishing GPUs with the same standard attribute, and the lab has no GPU: this
module plays the GPU vendor's driver for the lab's simulated 8-GPU server
(`tenantnet.lab.gpuserver`, `tenantnet.lab.pcitree.hgx_8x8`, in the fake sysfs of
`tenantnetctl lab up --kubernetes --gpus 8`). Only the lab starts it.

What it does, as a real DRA driver would:

- **A ResourceSlice** for the node (pool = node name): one device per simulated GPU, `gpu-0` …
  `gpu-7` in PCI address order, with `resource.kubernetes.io/pcieRoot` (the host bridge, from
  the same function tenantnet's slices use, `tenantnet.kube.slices.pcie_root`),
  `resource.kubernetes.io/pciBusID`, `numaNode`, `uuid` (the lab's `gpuserver.gpu_uuid`, read
  from the simulated nvidia proc files), `productName` "NVIDIA H100 80GB HBM3 (simulated)" and
  `simulated: true`. tenantnet's `SlicePublisher` keeps it current (created when missing,
  rewritten when it differs); the slice carries the label `tenantnet.io/simulated=true`.
- **A kubelet plugin** (`tenantnet.kube.kubeletplugin.KubeletPlugin`) whose prepare reads the
  claim from the API, checks each device allocated to it from this driver is one of this
  node's simulated GPUs (else a clear error, the pod stays ContainerCreating with it), and
  writes one CDI spec per claim into the lab containerd's CDI dir: for each GPU an env edit
  `LAB_SIMULATED_GPU_<index>=<uuid>`, nothing else (no device node, no mount: there is no
  GPU). It returns the CDI ids; the kubelet hands them to containerd, which injects the env.
  Unprepare removes the claim's spec. Both are idempotent (the kubelet retries): the spec is
  written whole under a temporary name and renamed, and a missing spec is already removed.
- `DEVICE_CLASS`, the DeviceClass `gpu.lab.tenantnet.io` (all devices of this driver), which
  the lab applies.

Run: `python -m tenantnet.lab.gpudra --lab DIR` (the Kubernetes lab's `up` does, after the
kubelet is Ready, and `down` ends it by pid and command line).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Only dataclasses (grpc is imported by KubeletPlugin.start): cheap for the lab that imports us.
from tenantnet.kube.kubeletplugin import ClaimRef, PreparedDevice, PrepareResult

DRIVER = "gpu.lab.tenantnet.io"
CDI_KIND = f"{DRIVER}/gpu"
CDI_VERSION = "0.6.0"  # the first with spec-level annotations
PRODUCT = "NVIDIA H100 80GB HBM3 (simulated)"
SIMULATED_LABEL = "tenantnet.io/simulated"
SIMULATION = "a simulation of the tenantnet lab (tenantnet/lab/gpudra.py): no GPU exists"
DEFAULT_NODE = "tenantnet-lab"  # tenantnet.lab.kube.NODE_NAME (kube imports this module, not the reverse)
ENV_PREFIX = "LAB_SIMULATED_GPU_"

DEVICE_CLASS = f"""\
# {SIMULATION}
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {DRIVER}
  labels: {{{SIMULATED_LABEL}: "true"}}
  annotations: {{tenantnet.io/description: "{SIMULATION}"}}
spec:
  selectors:
  - cel:
      expression: device.driver == "{DRIVER}"
"""


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU as this driver publishes it."""

    name: str  # the device's name in the slice: gpu-<index>
    index: int
    pci_address: str
    pcie_root: str | None
    numa_node: int | None
    uuid: str


def discover(sysfs_root: str, proc_root: str) -> list[SimGpu]:
    """The simulated server's GPUs: from the fake sysfs (where they sit) and the simulated
    nvidia proc files (their UUIDs, as `gpuserver.build` wrote them)."""
    from tenantnet.kube.slices import pcie_root
    from tenantnet.plugin.system.pcitree import PcieTree

    uuids = _uuids(proc_root)
    gpus = []
    for index, dev in enumerate(sorted(PcieTree(sysfs_root).gpus(), key=lambda d: d.address)):
        uuid = uuids.get(dev.address)
        if uuid is None:
            raise ValueError(f"GPU {dev.address} in {sysfs_root} has no {proc_root}/driver/nvidia/gpus/"
                             f"{dev.address}/information with its UUID (not the lab's simulated server?)")
        gpus.append(SimGpu(f"gpu-{index}", index, dev.address, pcie_root(sysfs_root, dev.address),
                           dev.position.numa_node, uuid))
    return gpus


def _uuids(proc_root: str) -> dict[str, str]:
    found = {}
    base = Path(proc_root) / "driver" / "nvidia" / "gpus"
    for info in sorted(base.glob("*/information")):
        m = re.search(r"^GPU UUID:\s*(\S+)", info.read_text(), re.MULTILINE)
        if m:
            found[info.parent.name] = m.group(1)
    return found


def device(gpu: SimGpu) -> dict[str, Any]:
    """The ResourceSlice device (resource.k8s.io/v1) of one GPU."""
    attributes: dict[str, Any] = {
        "resource.kubernetes.io/pciBusID": {"string": gpu.pci_address},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": PRODUCT},
        "simulated": {"bool": True},
    }
    if gpu.pcie_root is not None:
        attributes["resource.kubernetes.io/pcieRoot"] = {"string": gpu.pcie_root}
    if gpu.numa_node is not None:
        attributes["numaNode"] = {"int": gpu.numa_node}
    return {"name": gpu.name, "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}


# -- prepare / unprepare -------------------------------------------------------------------------


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    return f"claim-{claim_uid}-{device_name}"


def cdi_spec_path(cdi_dir: str | Path, claim_uid: str) -> Path:
    return Path(cdi_dir) / f"{DRIVER}-{claim_uid}.json"


def cdi_spec(claim_uid: str, claim: str, gpus: list[SimGpu]) -> dict[str, Any]:
    """The CDI spec of one claim: a device per GPU whose only edit is the env var naming it."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "annotations": {SIMULATED_LABEL: "true", "tenantnet.io/claim": claim,
                        "tenantnet.io/description": SIMULATION},
        "devices": [{"name": cdi_device_name(claim_uid, g.name),
                     "containerEdits": {"env": [f"{ENV_PREFIX}{g.index}={g.uuid}"]}} for g in gpus],
    }


class GpuClaims:
    """The kubelet plugin's handler (`tenantnet.kube.kubeletplugin.DraHandler`): prepare writes
    a claim's CDI spec, unprepare removes it. `get_claim(namespace, name)` returns the
    ResourceClaim as the API's JSON (raises if it cannot)."""

    def __init__(self, gpus: list[SimGpu], pool: str, cdi_dir: str,
                 get_claim: Callable[[str, str], dict[str, Any]], log: Any = None) -> None:
        self.gpus = {g.name: g for g in gpus}
        self.pool = pool
        self.cdi_dir = cdi_dir
        self.get_claim = get_claim
        self.log = log

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        return {c.uid: self._prepare(c) for c in claims}

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        out = {}
        for c in claims:
            try:
                cdi_spec_path(self.cdi_dir, c.uid).unlink(missing_ok=True)  # gone already: done
                out[c.uid] = ""
            except OSError as exc:
                out[c.uid] = f"claim {c.namespace}/{c.name}: cannot remove its CDI spec: {exc}"
            self._log("gpudra.unprepared", claim=f"{c.namespace}/{c.name}", uid=c.uid,
                      error=out[c.uid] or None)
        return out

    def _prepare(self, c: ClaimRef) -> PrepareResult:
        who = f"claim {c.namespace}/{c.name}"
        try:
            claim = self.get_claim(c.namespace, c.name)
        except Exception as exc:  # the API away, the claim gone: the kubelet retries
            return self._failed(c, f"{who}: cannot read it from the API: {exc}")
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != c.uid:
            return self._failed(c, f"{who}: the API has uid {uid}, the kubelet asked for {c.uid} "
                                   "(deleted and made again?)")
        results = [r for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                   .get("results") or [] if r.get("driver") == DRIVER]
        if not results:
            return self._failed(c, f"{who}: no device of driver {DRIVER} is allocated to it")
        chosen = []
        for r in results:
            gpu = self.gpus.get(r.get("device", "")) if r.get("pool") == self.pool else None
            if gpu is None:
                return self._failed(c, f"{who}: device {r.get('pool')}/{r.get('device')} (request "
                                       f"{r.get('request')}) is not one of this node's simulated GPUs (pool "
                                       f"{self.pool}: {', '.join(sorted(self.gpus))})")
            chosen.append((r, gpu))
        spec = cdi_spec(c.uid, f"{c.namespace}/{c.name}", [g for _, g in chosen])
        path = cdi_spec_path(self.cdi_dir, c.uid)
        try:
            _write_atomically(path, json.dumps(spec, indent=2) + "\n")
        except OSError as exc:
            return self._failed(c, f"{who}: cannot write its CDI spec {path}: {exc}")
        self._log("gpudra.prepared", claim=f"{c.namespace}/{c.name}", uid=c.uid,
                  devices=[g.name for _, g in chosen], cdi_spec=str(path))
        return PrepareResult(devices=tuple(
            PreparedDevice(requests=(str(r.get("request", "")),), pool=self.pool, device=g.name,
                           cdi_ids=(f"{CDI_KIND}={cdi_device_name(c.uid, g.name)}",)) for r, g in chosen))

    def _failed(self, c: ClaimRef, error: str) -> PrepareResult:
        self._log("gpudra.prepare_failed", claim=f"{c.namespace}/{c.name}", uid=c.uid, error=error)
        return PrepareResult(error=error)

    def _log(self, event: str, **kw: Any) -> None:
        if self.log is not None:
            self.log.info(event, **kw)


def _write_atomically(path: Path, text: str) -> None:
    from hostfiles.confined import replace_file

    replace_file(str(path), text.encode(), 0o644)


# -- the process -----------------------------------------------------------------------------------


def publisher(api: Any, node: str, gpus: list[SimGpu], log: Any) -> Any:
    """tenantnet's `SlicePublisher` for this driver's pool on `node` over `api` (a `SliceApi`)."""
    from tenantnet.kube.slices import SlicePublisher

    class LabelledPublisher(SlicePublisher):
        """tenantnet's publisher, its slices labelled as a simulation."""

        def wanted(self, devices: list[dict[str, Any]], generation: int, uid: str) -> list[dict[str, Any]]:
            slices = super().wanted(devices, generation, uid)
            for s in slices:
                s["metadata"]["labels"] = {SIMULATED_LABEL: "true"}
                s["metadata"]["annotations"] = {"tenantnet.io/description": SIMULATION}
            return slices

    devices = [device(g) for g in gpus]
    return LabelledPublisher(api, DRIVER, node, lambda: devices, log, interval=10.0)


def _claim_getter(kubeconfig: str) -> Callable[[str, str], dict[str, Any]]:
    from lightkube.resources.resource_v1 import ResourceClaim

    from tenantnet.kube import api

    client = api.client(kubeconfig, field_manager="tenantnet-lab-gpudra")

    def get(namespace: str, name: str) -> dict[str, Any]:
        return api.as_dict(client.get(ResourceClaim, name, namespace=namespace))
    return get


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tenantnet.lab.gpudra",
        description=f"The tenantnet lab's simulated GPU DRA driver ({DRIVER}; {SIMULATION}). Publishes the "
                    "simulated 8-GPU server's GPUs of a Kubernetes lab (tenantnetctl lab up --kubernetes "
                    "--gpus 8) in a ResourceSlice with their PCIe root, and prepares claims on them with CDI "
                    "specs that set LAB_SIMULATED_GPU_<index>=<uuid> in the container. The lab starts and "
                    "ends it; run by hand only against a lab.")
    p.add_argument("--lab", required=True, metavar="DIR",
                   help="the Kubernetes lab's directory (lab up --dir)")
    p.add_argument("--kubeconfig", help="kubeconfig to publish slices and read claims with (default: "
                                        "the lab's admin kubeconfig, DIR/kubeconfig/admin.kubeconfig)")
    p.add_argument("--node-name", default=DEFAULT_NODE, help=f"the lab's Node (default {DEFAULT_NODE})")
    p.add_argument("--sysfs-root", help="the fake sysfs of the simulated server (default DIR/ovs/sys)")
    p.add_argument("--proc-root", help="its simulated nvidia proc root (default DIR/ovs/proc)")
    p.add_argument("--cdi-dir", help="where containerd reads CDI specs (default DIR/containerd/cdi)")
    p.add_argument("--kubelet-root-dir", help="the kubelet's root dir (default DIR/kubelet)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from tenantnet.lab.kubeconf import LabPaths

    args = parse_args(argv)
    p = LabPaths(args.lab)
    sysfs = args.sysfs_root or str(p.ovs / "sys")
    proc = args.proc_root or str(p.ovs / "proc")
    cdi_dir = args.cdi_dir or str(p.containerd / "cdi")
    kubelet_root = args.kubelet_root_dir or str(p.kubelet)
    kubeconfig = args.kubeconfig or str(p.admin_kubeconfig)
    from tenantnet.plugin import log as logmod

    log = logmod.get("tenantnet.lab.gpudra")
    try:
        gpus = discover(sysfs, proc)
    except Exception as exc:
        print(f"gpudra: cannot read the simulated GPUs: {exc}", file=sys.stderr)
        return 1
    if not gpus:
        print(f"gpudra: no simulated GPU in {sysfs} (lab up --kubernetes --gpus 8)", file=sys.stderr)
        return 1
    log.info("gpudra.starting", driver=DRIVER, node=args.node_name, simulated=True,
             gpus=[{"name": g.name, "pci": g.pci_address, "pcieRoot": g.pcie_root, "uuid": g.uuid}
                   for g in gpus])
    from tenantnet.kube.kubeletplugin import KubeletPlugin

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    from tenantnet.kube.slices import LightkubeSliceApi

    slices = publisher(LightkubeSliceApi(kubeconfig, field_manager="tenantnet-lab-gpudra"), args.node_name,
                       gpus, log)
    handler = GpuClaims(gpus, args.node_name, cdi_dir, _claim_getter(kubeconfig), log)
    plugin = KubeletPlugin(DRIVER, handler, kubelet_root_dir=kubelet_root, log=log)
    slices.start()
    plugin.start()
    try:
        done.wait()
    finally:
        # The slice stays (as tenantnet's do): the kubelet removes it when the plugin is gone.
        plugin.stop()
        slices.stop()
    log.info("gpudra.stopped", driver=DRIVER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
