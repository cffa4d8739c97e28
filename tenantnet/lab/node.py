"""The lab: a whole node on one machine, with no special hardware.

`up` starts a private Open vSwitch — `ovsdb-server` and `ovs-vswitchd` from the distro,
userspace datapath (see DATAPATH), everything in one run directory, never the system OVS —
creates a bridge, and writes a node config that points tenantnet at it. `down` removes
every trace: pod namespaces made by the harness, leftover links of ours, both daemons
(stopped by their own pid files), the directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

from tenantnet.lab.ovs import LabError, daemon_pid, has_exited, paths, run, vsctl

DEFAULT_ROOT = "/run/tenantnet-lab"
DEFAULT_BRIDGE = "br-lab"
SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
# The userspace datapath (dpif-netdev) under the type name that `--enable-dummy` registers.
# Same forwarding code as `netdev`, real veth ports, real VLAN tags and datapath flows —
# but no kernel tap devices: `netdev` creates one tap called `ovs-netdev` per kernel, so two
# labs (or a lab beside a userspace system OVS) would break each other's forwarding.
DATAPATH = "dummy"


@dataclass
class LabInfo:
    root: str
    node_config: str
    ovsdb: str
    bridge: str
    state_dir: str
    log_file: str
    running: bool
    ovsdb_server_pid: int | None
    ovs_vswitchd_pid: int | None
    nics: list[dict[str, Any]]


def status(root: str = DEFAULT_ROOT) -> LabInfo:
    p = paths(root)
    meta: dict[str, Any] = {}
    try:
        with open(p["meta"]) as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        pass
    db_pid, vs_pid = daemon_pid(root, "ovsdb-server"), daemon_pid(root, "ovs-vswitchd")
    return LabInfo(
        root=root, node_config=p["node_config"], ovsdb=f"unix:{p['sock']}",
        bridge=meta.get("bridge", DEFAULT_BRIDGE), state_dir=p["state"], log_file=p["log"],
        running=bool(db_pid and vs_pid), ovsdb_server_pid=db_pid, ovs_vswitchd_pid=vs_pid,
        nics=_nics(root),
    )


def _nics(root: str) -> list[dict[str, Any]]:
    from tenantnet.lab.nic import LabNic

    return LabNic(root).describe()


def up(root: str = DEFAULT_ROOT, bridge: str = DEFAULT_BRIDGE, vfs: int = 0, dpdk_vfs: int = 0,
       refuse: list[str] | None = None, switchdev: bool = False, gpus: int = 0) -> LabInfo:
    """Start the lab; with `vfs` > 0 also a simulated SR-IOV NIC (PF `lpf0`) with that many VFs,
    the last `dpdk_vfs` of them bound to vfio-pci; `switchdev` puts it in switchdev mode
    (VF representors, the PF — then named `t<hash>p` — as uplink port of `bridge`). `refuse`
    names VF attributes the simulated NIC refuses (e.g. ["rate"]), to see how a NIC without
    that feature is handled. `gpus` = 8: instead, the simulated 8-GPU / 8-NIC server of
    `tenantnet.lab.gpuserver` (NICs `t<hash>g0` … `g7`, `vfs` VFs each, default 2) and its
    simulated kubelet."""
    if gpus not in (0, 8):
        raise LabError(f"--gpus {gpus}: the lab's simulated server has 8 GPUs and 8 NICs (--gpus 8)")
    p = paths(root)
    current = status(root)
    if current.running:
        return current
    if os.path.exists(root):
        down(root)  # a half-made or crashed lab: start clean
    os.makedirs(root, mode=0o700)
    os.makedirs(p["pods"], mode=0o700)
    with open(p["meta"], "w") as fh:
        json.dump({"bridge": bridge, "created": time.time()}, fh)
    try:
        run(["ovsdb-tool", "create", p["db"], SCHEMA], root, "creating the lab OVS database")
        run(["ovsdb-server", p["db"], f"--remote=punix:{p['sock']}",
              f"--pidfile={root}/ovsdb-server.pid", f"--unixctl={root}/ovsdb-server.ctl",
              f"--log-file={root}/ovsdb-server.log", "--detach", "--no-chdir"],
             root, "starting ovsdb-server")
        vsctl(root, "--no-wait", "init")
        run(["ovs-vswitchd", f"unix:{p['sock']}", f"--pidfile={root}/ovs-vswitchd.pid",
              f"--unixctl={root}/ovs-vswitchd.ctl", f"--log-file={root}/ovs-vswitchd.log",
              "--enable-dummy", "--detach", "--no-chdir"], root, "starting ovs-vswitchd")
        vsctl(root, "add-br", bridge, "--", "set", "Bridge", bridge, f"datapath_type={DATAPATH}",
              "external_ids:tenantnet-lab=true")
        if gpus:
            from tenantnet.lab import gpuserver

            tag = "t" + hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:5]
            gpuserver.build(root, vfs or 2, f"{tag}g", lambda *a: vsctl(root, *a), bridge)
            gpuserver.start(root)
        elif vfs:
            from tenantnet.lab.nic import LabNic
            from tenantnet.lab.nicsysfs import connectx_pf

            # VF netdevs (and in switchdev mode the PF and representors) are real links,
            # named per lab so that two labs never collide.
            digest = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()
            tag = "t" + digest[:5]
            pf = connectx_pf(f"{tag}p" if switchdev else "lpf0", vfs=vfs,
                             dpdk_vfs=range(vfs - dpdk_vfs, vfs))
            reps: dict[str, dict[int, str]] = {}
            if switchdev:
                pf.switch_id = digest[:16]
                reps[pf.netdev] = {i: f"{tag}r{i}" for i, vf in enumerate(pf.vfs) if vf.netdev}
            for index, vf in enumerate(pf.vfs):
                if vf.netdev:
                    vf.netdev = f"{tag}v{index}"
            LabNic(root).create([pf], lambda *a: vsctl(root, *a), refuse, reps, bridge)
    except (LabError, OSError, subprocess.CalledProcessError):
        down(root)
        raise
    with open(p["node_config"], "w") as fh:
        fh.write(node_config_text(root, gpus=gpus, vfs=vfs, bridge=bridge))
    return status(root)


def node_config_text(root: str, *, gpus: int = 0, vfs: int = 0, bridge: str = DEFAULT_BRIDGE) -> str:
    """The lab node's config: every directory it names lies inside the lab (the lab never
    writes to the host's own /var/lib, /etc), inside the lists that allow it, and the
    device-info directory is the one the lab's Multus (`tenantnetctl pod up`) writes to."""
    p = paths(root)
    text = (
        "# written by `tenantnetctl lab up`: points tenantnet at the lab's private OVS\n"
        f"ovsdb: unix:{p['sock']}\n"
        f"stateDir: {p['state']}\n"
        f"logFile: {p['log']}\n"
        "logLevel: info\n"
        "# what a NAD may name on this lab node (docs/security.md); the lists are given in full,\n"
        "# without the built-in host directories\n"
        f"deviceInfoDir: {root}/devinfo/cni\n"
        f"ipamDataDirs: [{root}/ipam, {root}/host-local, {p['state']}/ipam, {p['state']}/host-local]\n"
        f"ipamDataDir: {root}/ipam\n"
        f"resolvConfPaths: [{root}/resolv.d]\n"
        f"ovsConfigurationPaths: [{root}/ovs.d]\n"
        "replaceDefaults: [ipamDataDirs, resolvConfPaths, ovsConfigurationPaths]\n"
        "# pre-warm may run on the lab's bridge; its tests and demo name MACs and port numbers\n"
        "# there, which a production node grants no tenant where pre-warm runs (docs/security.md)\n"
        f"prewarmBridges: [{bridge}]\n"
        "prewarmGrants: [mac, ofport_request]\n"
    )
    if gpus:
        from tenantnet.lab import gpuserver

        text += (
            "# the simulated 8-GPU / 8-NIC server (tenantnet/lab/gpuserver.py): its kubelet and GPUs\n"
            f"podResourcesSocket: {gpuserver.socket_path(root)}\n"
            f"nvidiaProcRoot: {root}/proc\n"
        )
    if vfs or gpus:
        text += (
            "# the simulated SR-IOV NIC (tenantnet/lab/nic.py): fake sysfs + lab VF control\n"
            f"sysfsRoot: {root}/sys\n"
            f"vfControl: lab:{root}\n"
            "vfControlModules: [tenantnet.lab.nic]\n"
            "# its RDMA devices: the lab's simulated RDMA control (tenantnet/lab/rdma.py)\n"
            f"rdmaControl: lab-rdma:{root}\n"
            "rdmaControlModules: [tenantnet.lab.rdma]\n"
        )
    return text


def _stop(root: str, daemon: str) -> None:
    pid = daemon_pid(root, daemon)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if has_exited(pid):
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)


def _our_host_links(root: str) -> list[str]:
    """Host ends of ports tenantnet made on the lab OVS (left over if a pod was not detached)."""
    try:
        out = vsctl(root, "--format=json", "--columns=name,external_ids", "list", "Port")
    except LabError:
        return []
    names = []
    for name, ids in json.loads(out).get("data", []):
        pairs = dict(ids[1]) if isinstance(ids, list) and ids and ids[0] == "map" else {}
        if pairs.get("tenantnet-owner") == "tenantnet":
            names.append(name)
    return names


def down(root: str = DEFAULT_ROOT) -> list[str]:
    """Remove the lab; returns what was cleaned up (for the operator to see)."""
    removed: list[str] = []
    p = paths(root)
    for pod in sorted(os.listdir(p["pods"])) if os.path.isdir(p["pods"]) else []:
        if os.path.exists(f"/run/netns/{pod}"):
            subprocess.run(["ip", "netns", "delete", pod], capture_output=True, check=False)
            removed.append(f"netns {pod}")
    if daemon_pid(root, "ovsdb-server"):
        for link in _our_host_links(root):
            if subprocess.run(["ip", "link", "delete", link], capture_output=True,
                              check=False).returncode == 0:
                removed.append(f"link {link}")
    from tenantnet.lab import gpuserver
    from tenantnet.lab.nic import LabNic

    if gpuserver.stop(root):
        removed.append("simulated kubelet")
    removed += LabNic(root).destroy()
    if daemon_pid(root, "ovs-vswitchd"):
        # `exit --cleanup` deletes the datapath and its ports before the process ends.
        try:
            run(["ovs-appctl", "-t", f"{root}/ovs-vswitchd.ctl", "exit", "--cleanup"], root,
                 "stopping ovs-vswitchd")
        except LabError:
            pass
        _stop(root, "ovs-vswitchd")
        removed.append("ovs-vswitchd")
    if daemon_pid(root, "ovsdb-server"):
        _stop(root, "ovsdb-server")
        removed.append("ovsdb-server")
    shutil.rmtree(root, ignore_errors=True)
    return removed


def as_dict(info: LabInfo) -> dict[str, object]:
    return asdict(info)
