"""Fixtures for the end-to-end tier: Debian's podman 4.3 (CNI backend) runs real containers
on a tenantnet network.

Everything podman uses is private to the session and removed afterwards, also on failure:

* `containers.conf` (given by `CONTAINERS_CONF`): runc, cgroupfs, file locks, file events and
  its tmp dir in our directory; the CNI backend with our own `network_config_dir` (holding only
  our conflist) and `cni_plugin_dirs` = this venv's bin dir + `/usr/lib/cni`. Its `[engine] env`
  sets `TENANTNET_CONFIG` (the lab's node config) in every podman process that reads this file:
  the one we start (ADD, DEL on `rm`) and the `podman container cleanup` that conmon starts when
  a container exits (DEL) — conmon passes `CONTAINERS_CONF` on but not the rest of our
  environment, so a plain environment variable would not reach that DEL.
* `storage.conf` (given by `CONTAINERS_STORAGE_CONF`): graphroot and runroot in our directory,
  driver `vfs` (no overlay mounts to clean up).
* No image store at all: containers run from a busybox rootfs directory (`--rootfs`), so
  nothing is written to `/var/lib/containers` (`podman import` would create its blob-info
  cache there).
* Every container gets `--cgroup-parent=/tenantnet-e2e-<random>` (the default, `libpod_parent`,
  would stay behind in every controller); we remove those cgroup directories at the end.
* The OVS lab (`tenantnet.lab.node.up`) lives in our directory too.

What podman 4.3 cannot be told to put elsewhere: libcni's result cache in
`/var/lib/cni/results` (`libcni.NewCNIConfig` with no cache dir) and the pod netns under
`/run/netns`. The tests check that our entries there are gone after `podman rm`; directories
podman created because they did not exist before are removed when empty.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import node as labmod
from tenantnet.plugin.drivers.ovs import host_ifname
from tests.polling import poll

BIN = Path(sys.executable).parent
CTL = str(BIN / "tenantnetctl")
GO_PLUGINS = "/usr/lib/cni"
BUSYBOX = "/bin/busybox"  # Debian's busybox-static
APPLETS = ("sh", "ip", "ping", "sleep", "cat")
SUBNET = ipaddress.ip_network("10.99.0.0/24")
VLAN = 100
IFNAME = "eth0"  # podman's name for the first interface
LIBCNI_CACHE = Path("/var/lib/cni/results")
# System places podman must not create (it would, without our private configuration).
MUST_NOT_APPEAR = ("/var/lib/containers", "/run/containers", "/run/libpod", "/var/lib/cni/networks")
# Directories podman creates for lack of a setting; removed at the end if we made them and empty.
REMOVE_IF_CREATED = ("/var/lib/cni/results", "/var/lib/cni")


def _fail_unless_usable() -> None:
    """Fail loudly — never skip — when this machine cannot run the tier."""
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (podman with the CNI backend, OVS lab, network namespaces)")
    for tool in ("podman", "runc", "conmon", "ovs-vsctl"):
        if not shutil.which(tool):
            problems.append(f"{tool} is not installed (bash scripts/install-deps.sh)")
    if not Path(BUSYBOX).exists():
        problems.append(f"{BUSYBOX} is missing (apt-get install busybox-static)")
    else:
        ldd = subprocess.run(["ldd", BUSYBOX], capture_output=True, text=True, check=False)
        if ldd.returncode == 0 and "=>" in ldd.stdout:
            problems.append(f"{BUSYBOX} is dynamically linked; the container rootfs needs busybox-static")
    for plugin in ("tenantnet", "tenantnet-ipam"):
        if not (BIN / plugin).exists():
            problems.append(f"{BIN / plugin} is missing (pip install -e .)")
    if problems:
        pytest.fail("e2e tier cannot run here:\n  " + "\n  ".join(problems), pytrace=False)


@dataclass
class Container:
    name: str
    id: str
    netns: str  # podman's SandboxKey, /run/netns/netns-…
    network: str

    @property
    def host_link(self) -> str:
        """tenantnet's host end of the veth for this container's eth0."""
        return host_ifname(self.id, IFNAME)

    @property
    def libcni_cache(self) -> Path:
        return LIBCNI_CACHE / f"{self.network}-{self.id}-{IFNAME}"


@dataclass
class Podman:
    """Podman with a private configuration, plus views of what tenantnet left on the lab."""

    root: Path
    env: dict[str, str]
    network: str
    cgroup_parent: str
    rootfs: Path
    ipam_dir: Path
    lab: labmod.LabInfo
    names: list[str] = field(default_factory=list)

    # -- podman -------------------------------------------------------------------------

    def __call__(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            pytest.fail(f"podman {' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\n"
                        f"stderr: {proc.stderr}\n{self.diagnostics()}", pytrace=False)
        return proc

    def _run(self, name: str, *opts: str) -> list[str]:
        self.names.append(name)
        return ["run", *opts, "--name", name, "--network", self.network,
                "--cgroup-parent", self.cgroup_parent, "--rootfs", str(self.rootfs)]

    def start(self, name: str, *cmd: str) -> Container:
        """`podman run -d`: the container keeps running `cmd`."""
        self(*self._run(name, "--detach"), *cmd)
        return self.container(name)

    def run_fg(self, name: str, *cmd: str) -> subprocess.CompletedProcess[str]:
        """`podman run` in the foreground: returns when the container's process has exited."""
        return self(*self._run(name), *cmd)

    def container(self, name: str) -> Container:
        out = self("inspect", "--format", "{{.Id}} {{.NetworkSettings.SandboxKey}}", name).stdout.split()
        return Container(name=name, id=out[0], netns=out[1] if len(out) > 1 else "", network=self.network)

    def exec(self, name: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self("exec", name, *cmd, check=check)

    def rm(self, *names: str) -> None:
        self("rm", "--force", "--time", "0", *names)

    # -- what the container sees ----------------------------------------------------------

    def addresses(self, name: str) -> dict[str, list[ipaddress.IPv4Interface]]:
        out = self.exec(name, "ip", "-o", "-4", "addr", "show").stdout
        return parse_ip_addr(out)

    # -- what tenantnet and the lab hold -----------------------------------------------------

    def ctl(self, *args: str) -> Any:
        proc = subprocess.run([CTL, "--node-config", self.lab.node_config, *args, "--json"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, f"tenantnetctl {' '.join(args)}: {proc.stderr}"
        return json.loads(proc.stdout)

    def attachments(self) -> list[dict[str, Any]]:
        """`tenantnetctl ls`: the attachment records on the lab node."""
        return self.ctl("ls")

    def allocations(self) -> list[dict[str, Any]]:
        """`tenantnetctl ipam ls --data-dir`: the addresses held in our IPAM store."""
        return self.ctl("ipam", "ls", "--data-dir", str(self.ipam_dir))

    def record_files(self) -> list[Path]:
        return sorted((Path(self.lab.state_dir) / "attachments").rglob("*.json"))

    def owned_ports(self) -> dict[str, dict[str, Any]]:
        """OVS ports with external_ids:tenantnet-owner=tenantnet → {tag, external_ids, bridge}."""
        out = labmod.vsctl(self.lab.root, "--format=json", "--columns=name,tag,external_ids", "list", "Port")
        ports = {}
        for name, tag, ids in json.loads(out)["data"]:
            ext = dict(ids[1])
            if ext.get("tenantnet-owner") == "tenantnet":
                ports[name] = {"tag": tag if isinstance(tag, int) else None, "external_ids": ext}
        for name in ports:
            ports[name]["bridge"] = labmod.vsctl(self.lab.root, "port-to-br", name).strip()
        return ports

    def diagnostics(self) -> str:
        try:
            log = Path(self.lab.log_file).read_text().splitlines()[-15:]
        except OSError:
            log = ["(no tenantnet log)"]
        return "tenantnet log (last lines):\n  " + "\n  ".join(log)

    def assert_nothing_left(self, containers: list[Container]) -> None:
        """After `podman rm`: no OVS port of ours, no record, no allocation, no host link,
        no libcni cache entry, no pod netns."""
        diag = self.diagnostics()
        assert self.owned_ports() == {}, f"OVS ports of ours left behind\n{diag}"
        assert self.record_files() == [], f"attachment records left behind\n{diag}"
        assert self.attachments() == [], f"tenantnetctl ls still lists attachments\n{diag}"
        assert self.allocations() == [], f"IP allocations left behind\n{diag}"
        for c in containers:
            assert not link_exists(c.host_link), f"host link {c.host_link} of {c.name} left behind\n{diag}"
            assert not c.libcni_cache.exists(), f"libcni cache {c.libcni_cache} left behind"
            assert not c.netns or not os.path.exists(c.netns), f"netns {c.netns} of {c.name} left behind"


def parse_ip_addr(out: str) -> dict[str, list[ipaddress.IPv4Interface]]:
    """busybox `ip -o -4 addr show` → {ifname: [addresses]}."""
    found: dict[str, list[ipaddress.IPv4Interface]] = {}
    for line in out.splitlines():
        m = re.match(r"\s*\d+:\s+(\S+)\s+inet\s+(\S+)", line)
        if m:
            found.setdefault(m.group(1).split("@")[0], []).append(ipaddress.IPv4Interface(m.group(2)))
    return found


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True,
                          check=False).returncode == 0


def _write_configs(root: Path, lab: labmod.LabInfo, network: str, ipam_dir: Path) -> dict[str, str]:
    conf_dir, tmp = root / "cni", root / "tmp"
    for d in (conf_dir, tmp, root / "storage" / "graph", root / "storage" / "run"):
        d.mkdir(parents=True)
    conflist = {
        "cniVersion": "1.0.0",  # podman 4.3's libcni rejects 1.1.0
        "name": network,
        "plugins": [{
            "type": "tenantnet",
            "bridge": lab.bridge,
            "vlan": VLAN,
            "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": str(SUBNET)}]],
                     "dataDir": str(ipam_dir)},
        }],
    }
    (conf_dir / f"{network}.conflist").write_text(json.dumps(conflist, indent=2))
    q = json.dumps  # TOML basic strings accept JSON string syntax for these paths
    (root / "containers.conf").write_text(
        "[containers]\n"
        'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'lock_type = "file"\n'
        'events_logger = "file"\n'
        f"events_logfile_path = {q(str(tmp / 'events.log'))}\n"
        f"tmp_dir = {q(str(tmp / 'libpod'))}\n"
        f"image_copy_tmp_dir = {q(str(tmp))}\n"
        f"volume_path = {q(str(root / 'storage' / 'volumes'))}\n"
        f"env = [{q('TENANTNET_CONFIG=' + lab.node_config)}]\n"
        "[network]\n"
        'network_backend = "cni"\n'
        f"network_config_dir = {q(str(conf_dir))}\n"
        f"cni_plugin_dirs = [{q(str(BIN))}, {q(GO_PLUGINS)}]\n"
        f"default_network = {q(network)}\n"
    )
    (root / "storage.conf").write_text(
        "[storage]\n"
        'driver = "vfs"\n'
        f"graphroot = {q(str(root / 'storage' / 'graph'))}\n"
        f"runroot = {q(str(root / 'storage' / 'run'))}\n"
    )
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONTAINERS_", "CNI_", "TENANTNET_"))}
    env.update(CONTAINERS_CONF=str(root / "containers.conf"),
               CONTAINERS_STORAGE_CONF=str(root / "storage.conf"), TMPDIR=str(tmp))
    return env


def _make_rootfs(rootfs: Path) -> None:
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1].replace("\\040", " ") for line in fh]
    return [p for p in points if p.startswith(prefix)]


def _remove_cgroups(parent: str) -> None:
    """rmdir our cgroup parent (and the `conmon` child podman makes) in every hierarchy;
    rmdir of a cgroup only succeeds once it has no processes."""
    for base in [Path("/sys/fs/cgroup"), *Path("/sys/fs/cgroup").iterdir()]:
        top = base / parent.lstrip("/")
        if top.is_dir():
            for dirpath, _dirs, _files in os.walk(top, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    _fail_unless_usable()
    preexisting = {p: os.path.exists(p) for p in (*MUST_NOT_APPEAR, *REMOVE_IF_CREATED)}
    root = tmp_path_factory.mktemp("e2e")
    tag = uuid.uuid4().hex[:8]
    network = f"tn-e2e-{tag}"
    lab = labmod.up(str(root / "lab"))
    pm: Podman | None = None
    try:
        ipam_dir = Path(lab.root) / "ipam" / "e2e"  # inside the lab node's ipamDataDirs
        env = _write_configs(root, lab, network, ipam_dir)
        _make_rootfs(root / "rootfs")
        pm = Podman(root=root, env=env, network=network, cgroup_parent=f"/tenantnet-e2e-{tag}",
                    rootfs=root / "rootfs", ipam_dir=ipam_dir, lab=lab)
        yield pm
    finally:
        if pm is not None:
            # Containers of a failed test: podman's own DEL runs with the lab still up.
            subprocess.run(["podman", "rm", "--all", "--force", "--time", "0"], env=pm.env,
                           capture_output=True, timeout=120, check=False)
            _remove_cgroups(pm.cgroup_parent)
        leftover_mounts = _mounts_under(root)
        for point in sorted(leftover_mounts, key=len, reverse=True):
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
        labmod.down(lab.root)
        shutil.rmtree(root, ignore_errors=True)
        for p in REMOVE_IF_CREATED:  # deepest first; rmdir only removes an empty directory
            if not preexisting[p]:
                with contextlib.suppress(OSError):
                    os.rmdir(p)
    appeared = [p for p in MUST_NOT_APPEAR if not preexisting[p] and os.path.exists(p)]
    assert not appeared, f"podman wrote outside its private directories: {appeared}"
    assert not leftover_mounts, f"mounts left under {root} (unmounted now): {leftover_mounts}"


@pytest.fixture
def podman(podman_env: Podman) -> Iterator[Podman]:
    """The session's podman; containers a test leaves behind (on failure) are removed after it."""
    podman_env.names = []
    yield podman_env
    if podman_env.names:
        podman_env("rm", "--force", "--time", "0", "--ignore", *podman_env.names, check=False)


def wait_until(predicate: Any, timeout: float = 15.0, interval: float = 0.2) -> bool:
    """tests/polling.py's poller, with the e2e tier's patience (podman is slow)."""
    return poll(predicate, timeout, interval)


# ------------------------------------------------------------------ the Kubernetes lab, shared

# The test that kills the lab's kubelet and containerd and takes the lab down runs last, so the
# Kubernetes modules share one bring-up (a module after it would bring a new one up).
KUBE_LAB_LAST = ("test_down_after_a_crash_leaves_nothing_behind",)
# The DaemonSet's module runs after the other modules on the session's lab, just before that
# test. A kubelet started less than a probe's period ago first sleeps a random part of that
# period before the probe's first run (pkg/kubelet/prober/worker.go), and the installer
# container's readiness probe has periodSeconds 60 (packaging/daemonset.yaml): deployed right
# after the bring-up, the rollout waited 0-60 s for it (4 to 57 s seen). Later,
# the kubelet has run longer than that and the probe runs at once.
DEPLOY_LATE = ("test_daemonset_kube.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # stable: the rest keep their order
    items.sort(key=lambda item: (item.name in KUBE_LAB_LAST, item.path.name in DEPLOY_LATE))


class KubeSession:
    """The session's Kubernetes lab (tests/e2e/test_kube_lab.py's `Lab`), brought up on first
    use — again if a test took it down. A module that changes the lab node (its node config,
    the CNI bin dir's plugins, an agent of its own) puts it back when it ends."""

    def __init__(self) -> None:
        self.root = f"/run/tnk-e2e-{os.getpid()}"  # short: containerd's shim sockets live under it
        self.before: dict[str, Any] | None = None
        self.others_before = False
        self.current: Any = None

    def lab(self) -> Any:
        from tenantnet.lab import kube
        from tests.e2e.test_kube_lab import Lab, _ctl, _fail_unless_usable, _fixed_state

        if self.current is not None and kube.status(self.root).running:
            return self.current
        _fail_unless_usable()
        if self.before is None:
            self.before = _fixed_state(self.root)
            self.others_before = bool(kube.other_labs(self.root))
        started = time.monotonic()
        proc = _ctl("lab", "up", "--kubernetes", "--dir", self.root, "--json")
        took = time.monotonic() - started
        if proc.returncode != 0:
            kube.down(self.root)
            pytest.fail(f"lab up --kubernetes failed:\n{proc.stderr}", pytrace=False)
        shown = json.loads(proc.stdout)
        lab = Lab(kube.status(self.root), self.before, self.others_before, took)
        assert shown["kubeconfig"] == lab.lab.kubeconfig and shown["running"]
        self.current = lab
        return lab


@pytest.fixture(scope="session")
def kube_session() -> Iterator[KubeSession]:
    from tenantnet.lab import kube

    session = KubeSession()
    try:
        yield session
    finally:
        kube.down(session.root)


class GpuKubeSession:
    """The simulated 8-GPU server as a Kubernetes lab of its own (`tenantnetctl lab up
    --kubernetes --gpus 8 --vfs 2`, in /run/tnk-gpu-<pid>: not the shared lab above), for
    test_dra_kube and test_gpudra_kube, which both asked for this same lab (`--gpus 8` alone
    means 2 VFs a NIC) and brought it up once each (≈ 15 s apiece). Brought up on first use,
    again if a test took it down. test_dra_kube runs first and puts back what its agent changed
    (node config, slices); test_gpudra_kube's last test takes the lab down and checks that
    nothing of it is left."""

    def __init__(self) -> None:
        self.root = f"/run/tnk-gpu-{os.getpid()}"
        self.current: Any = None

    def lab(self) -> Any:
        from tenantnet.lab import kube, kubebin

        if self.current is not None and kube.status(self.root).running:
            return self.current
        why = kubebin.available()
        if why:
            pytest.fail(why, pytrace=False)
        up = subprocess.run([CTL, "lab", "up", "--kubernetes", "--gpus", "8", "--vfs", "2", "--dir", self.root,
                             "--json"], capture_output=True, text=True, timeout=900, check=False)
        if up.returncode != 0:
            kube.down(self.root)
            pytest.fail(f"lab up --kubernetes --gpus 8 failed:\n{up.stderr}", pytrace=False)
        info = kube.status(self.root)
        info.kubectl = json.loads(up.stdout)["kubectl"]
        self.current = info
        return info


@pytest.fixture(scope="session")
def gpu_kube_session() -> Iterator[GpuKubeSession]:
    from tenantnet.lab import kube

    session = GpuKubeSession()
    try:
        yield session
    finally:
        kube.down(session.root)
