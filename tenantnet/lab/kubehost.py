"""What the Kubernetes lab does to the host outside its own directory, and how it undoes it.

The lab keeps everything it can inside its directory; what it cannot, this module creates,
records and removes:

- its daemons: started in sessions of their own, identified on teardown by pid *and* command
  line (a pid alone is no proof: pids wrap on a busy machine);
- a cgroup of its own (the kubelet's `cgroupRoot`) in every cgroup v1 hierarchy and in the
  hybrid `unified` one, cpuset's cpus/mems copied from the parent; removed deepest first once
  the processes in it are ended;
- the kubelet's fixed paths outside its root dir (`/var/lib/kubelet/device-plugins/kubelet.sock`,
  the pod-resources symlink Multus reads, `/var/log/containers` links) and libcni's result
  cache (`/var/lib/cni/results`, entries naming the lab's sandboxes): only
  entries of the lab are removed, and a directory only
  when the lab created it and it is empty; a socket some other live process serves is
  never touched;
- kernel settings the kubelet changes at start (`vm.overcommit_memory`, `kernel.panic`, …)
  and IPv4 forwarding, which the `bridge` plugin turns on: their values before are recorded
  and put back;
- mounts under the lab directory (pod volumes, sandbox /dev/shm, network namespaces,
  snapshots), unmounted deepest first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")
# The kubelet sets these at start (its "kernel tunables", protectKernelDefaults: false), and
# the `bridge` CNI plugin, as the pods' gateway, turns IPv4 forwarding on.
HOST_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward")
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
POD_RESOURCES_LINK = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
CONTAINER_LOG_LINKS = Path("/var/log/containers")
LIBCNI_RESULTS = Path("/var/lib/cni/results")
# Directories the lab's components create when they are missing, deepest first: removed at
# teardown if they were not there before and are empty.
FIXED_DIRS = ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/var/lib/kubelet",
              "/var/log/containers", "/var/lib/cni/results", "/var/lib/cni",
              "/usr/libexec/kubernetes/kubelet-plugins/volume/exec",
              "/usr/libexec/kubernetes/kubelet-plugins/volume", "/usr/libexec/kubernetes/kubelet-plugins",
              "/usr/libexec/kubernetes")


# -------------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Daemon:
    name: str
    pid: int
    exe: str  # argv[0] as started
    mark: str  # a string its command line holds (the lab's directory)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def is_ours(d: Daemon) -> bool:
    """Whether pid `d.pid` is still the process the lab started (not a zombie, not a reuse)."""
    args = cmdline(d.pid)
    return bool(args) and args[0] == d.exe and any(d.mark in a for a in args[1:])


def _reap(pid: int) -> None:
    # A daemon started by this very process (a `lab up` in the same process, as tests do)
    # stays a zombie until waited for.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(d: Daemon, grace: float = 15.0) -> bool:
    """SIGTERM, then SIGKILL after `grace` s; only if the pid is still ours. Whether it was."""
    _reap(d.pid)
    if not is_ours(d):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(d.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(d.pid)
        if not is_ours(d):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(d.pid, signal.SIGKILL)
    while is_ours(d):
        _reap(d.pid)
        time.sleep(0.05)
    return True


def processes_naming(mark: str, exe_suffix: str) -> list[int]:
    """Pids whose argv[0] ends with `exe_suffix` and whose command line names `mark` (the
    containerd shims of the lab: they outlive containerd by design)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            args = cmdline(int(entry))
            if args and args[0].endswith(exe_suffix) and any(mark in a for a in args[1:]):
                found.append(int(entry))
    return found


# -------------------------------------------------------------------------------- cgroups


def _hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, name=systemd, the hybrid unified)."""
    points = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            parts = line.split()
            if parts[2] in ("cgroup", "cgroup2") and parts[1].startswith(str(CGROUP_FS)):
                points.append(Path(parts[1]))
    return points


def create_cgroup(name: str) -> list[str]:
    """Create `/<name>` in every hierarchy (cpuset's cpus and mems copied from its parent);
    returns the directories made."""
    made = []
    for h in _hierarchies():
        d = h / name
        if not d.exists():
            d.mkdir()
            made.append(str(d))
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (h / knob).exists() and not (d / knob).read_text().strip():
                (d / knob).write_text((h / knob).read_text())
    return made


def remove_cgroup(name: str, timeout: float = 20.0) -> list[str]:
    """End every process left in `/<name>` (all hierarchies) and remove its directories,
    deepest first; returns what could not be removed."""
    tops = [h / name for h in _hierarchies() if (h / name).is_dir()]
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for top in tops:
            for dirpath, _dirs, _files in os.walk(top, topdown=False):
                procs = Path(dirpath) / "cgroup.procs"
                with contextlib.suppress(OSError):
                    for pid in procs.read_text().split():
                        with contextlib.suppress(ProcessLookupError, ValueError):
                            os.kill(int(pid), signal.SIGKILL)
                try:
                    os.rmdir(dirpath)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(dirpath)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


# -------------------------------------------------------------------------------- mounts


def mounts_under(root: str) -> list[str]:
    prefix = os.path.abspath(root).rstrip("/") + "/"
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1].replace("\\040", " ") for line in fh]
    return [p for p in points if p.startswith(prefix) or p == prefix.rstrip("/")]


def unmount_all_under(root: str) -> list[str]:
    """Unmount every mount under `root`, deepest (longest) first; returns what was unmounted."""
    done = []
    for _ in range(5):  # a mount may hide another at the same point
        points = sorted(set(mounts_under(root)), key=len, reverse=True)
        if not points:
            break
        for p in points:
            if subprocess.run(["umount", "--lazy", p], capture_output=True, check=False).returncode == 0:
                done.append(p)
    return done


# -------------------------------------------------------------------------------- sysctls


def read_sysctls() -> dict[str, str]:
    found = {}
    for key in HOST_SYSCTLS:
        with contextlib.suppress(OSError):
            found[key] = Path("/proc/sys", key).read_text().strip()
    return found


def restore_sysctls(before: dict[str, str]) -> list[str]:
    restored = []
    for key, value in before.items():
        path = Path("/proc/sys", key)
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")
                restored.append(key.replace("/", "."))
    return restored


# -------------------------------------------------------------------------------- fixed paths


def socket_is_live(path: Path) -> bool:
    """Whether some process accepts connections on the unix socket at `path`."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def existing_fixed_dirs() -> list[str]:
    return [d for d in FIXED_DIRS if os.path.isdir(d)]


def link_pod_resources(target: str) -> bool:
    """Point the pod-resources path Multus reads at the lab kubelet's socket, unless something
    else's is there (a dangling link, left by a crashed lab, is replaced). Whether it did."""
    link = POD_RESOURCES_LINK
    if link.is_symlink() and not link.exists():
        link.unlink()
    if os.path.lexists(link):
        return False
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return True


def remove_fixed_paths(root: str, own_device_socket: bool, dirs_before: list[str],
                       sandboxes: list[str]) -> list[str]:
    """Remove what the lab left at the fixed paths (see the module doc); what was removed."""
    removed = []
    prefix = os.path.abspath(root).rstrip("/") + "/"
    link = POD_RESOURCES_LINK
    if link.is_symlink() and os.readlink(link).startswith(prefix):
        link.unlink()
        removed.append(str(link))
    if own_device_socket and DEVICE_PLUGIN_SOCKET.is_socket() and not socket_is_live(DEVICE_PLUGIN_SOCKET):
        DEVICE_PLUGIN_SOCKET.unlink()
        removed.append(str(DEVICE_PLUGIN_SOCKET))
    if CONTAINER_LOG_LINKS.is_dir():
        for entry in CONTAINER_LOG_LINKS.iterdir():
            if entry.is_symlink() and os.readlink(entry).startswith(prefix):
                entry.unlink()
                removed.append(str(entry))
    if LIBCNI_RESULTS.is_dir():
        for entry in LIBCNI_RESULTS.iterdir():
            # <network>-<sandbox id>-<ifname>, of Multus's network and of containerd's own
            # loopback one (`cni-loopback`): those of the lab's sandboxes (a DEL that never
            # came), never another lab's
            if any(f"-{sandbox}-" in entry.name for sandbox in sandboxes):
                entry.unlink()
                removed.append(str(entry))
    for d in FIXED_DIRS:
        if d not in dirs_before:
            with contextlib.suppress(OSError):
                os.rmdir(d)
                removed.append(d)
    return removed
