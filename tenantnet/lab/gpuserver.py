"""The lab's simulated 8-GPU / 8-NIC server (`tenantnetctl lab up --gpus 8`): a simulation,
labelled as one. No GPU exists; what exists is what tenantnet reads of one:

- the PCIe tree of `tenantnet.lab.pcitree.hgx_8x8` in the lab's fake sysfs — two sockets,
  PCIe switches with one GPU and one ConnectX NIC each — the NICs' VFs made real as veths by
  the lab's simulated NIC (`tenantnet.lab.nic`), so they can be attached;
- the nvidia driver's `<lab>/proc/driver/nvidia/gpus/<pci>/information` files, naming each
  GPU's UUID (`GPU-5a1ab000-…-<n>`), which map the device plugin's ids to PCI addresses;
- a simulated kubelet answering the pod-resources API on `<lab>/kubelet/pod-resources.sock`
  from `<lab>/kubelet/pods.json` (`tenantnet.lab.podresources`), where `assign_gpus` plays
  the device plugin: it gives a pod the first free GPUs.

`start` runs the kubelet simulation as a background process (its pid in
`<lab>/kubelet/kubelet.pid`); `stop` ends it by that pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tenantnet.lab import kubehost

GPU_RESOURCE = "nvidia.com/gpu"


def gpu_uuid(index: int) -> str:
    return f"GPU-5a1ab000-0000-4000-8000-{index:012d}"


def kubelet_dir(root: str) -> Path:
    return Path(root) / "kubelet"


def socket_path(root: str) -> str:
    return str(kubelet_dir(root) / "pod-resources.sock")


def pods_file(root: str) -> str:
    return str(kubelet_dir(root) / "pods.json")


def build(root: str, vfs: int, netdev_prefix: str, vsctl: Callable[..., Any], bridge: str) -> list[str]:
    """Lay the server out under the lab `root`; the GPUs' PCI addresses, GPU 0 first."""
    from tenantnet.lab.nic import LabNic
    from tenantnet.lab.pcitree import hgx_8x8

    tree = hgx_8x8(vfs=vfs, netdev_prefix=netdev_prefix)
    tree.write(Path(root) / "sys")
    LabNic(root).create(tree.nics, vsctl, uplink_bridge=bridge)
    gpus = [g.address for g in tree.gpus]
    for i, address in enumerate(gpus):
        info = Path(root) / "proc" / "driver" / "nvidia" / "gpus" / address / "information"
        info.parent.mkdir(parents=True, exist_ok=True)
        info.write_text(f"Model: \t\t NVIDIA H100 80GB HBM3 (simulated by the tenantnet lab)\n"
                        f"GPU UUID: \t {gpu_uuid(i)}\nBus Location: \t {address}\n")
    return gpus


def start(root: str) -> int:
    """Start the simulated kubelet; its pid."""
    from tenantnet.lab import podresources

    kubelet_dir(root).mkdir(parents=True, exist_ok=True)
    if not os.path.exists(pods_file(root)):
        podresources.write_pods(pods_file(root), [])
    with open(kubelet_dir(root) / "kubelet.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tenantnet.lab.podresources", "--socket",
                                 socket_path(root), "--pods", pods_file(root)],
                                stdout=log, stderr=log, start_new_session=True)
    (kubelet_dir(root) / "kubelet.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 10
    # Until it accepts, not until its file exists (bound before it listens).
    while not kubehost.socket_is_live(Path(socket_path(root))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the simulated kubelet did not start "
                               f"(see {kubelet_dir(root) / 'kubelet.log'})")
        time.sleep(0.05)
    return proc.pid


def stop(root: str) -> bool:
    """End the simulated kubelet by its pid; whether one was running."""
    pidfile = kubelet_dir(root) / "kubelet.pid"
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    from tenantnet.lab.ovs import has_exited

    for _ in range(100):
        if has_exited(pid):
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return True


def assign_gpus(root: str, namespace: str, name: str, count: int, container: str = "main") -> list[str]:
    """Play the device plugin: give pod namespace/name `count` GPUs not held by another pod
    (their device ids, UUIDs as the NVIDIA device plugin reports them)."""
    from tenantnet.lab import podresources

    held = {d for p in podresources.read_pods(pods_file(root)) if (p.namespace, p.name) != (namespace, name)
            for c in p.containers for dev in c.devices for d in dev.device_ids}
    free = [gpu_uuid(i) for i in range(8) if gpu_uuid(i) not in held]
    if len(free) < count:
        raise ValueError(f"{count} GPUs asked for pod {namespace}/{name}, {len(free)} free on the lab server")
    chosen = free[:count]
    podresources.add_pod_devices(pods_file(root), namespace, name, container, GPU_RESOURCE, chosen)
    return chosen


def release_gpus(root: str, namespace: str, name: str) -> None:
    from tenantnet.lab import podresources

    podresources.remove_pod(pods_file(root), namespace, name)
