"""Issue 27: the packaged DaemonSet on the lab's real Kubernetes node (tenantnet/lab/kubedeploy.py).

tenantnet's image built here from the relocatable runtime (packaging/build_runtime.py) with no
registry and no container engine, imported into the lab's containerd; packaging/'s CRDs, RBAC,
ConfigMap, DaemonSet and renderer Deployment applied with only the lab's paths substituted.
The DaemonSet's init container installs `tenantnet` and `tenantnet-ipam` (the compiled
trampoline and its -shim, over the venv's links the lab started with) into the kubelet's CNI
bin dir; the agent and the renderer run under their ServiceAccounts; the real RBAC grants them
exactly what packaging/rbac.yaml says (`kubectl auth can-i --as`). Two tenants, a
TenantNetwork each: their pods get net1 from Multus → the *installed* trampoline → the agent in
the DaemonSet's pod (its served count), reach their own tenant's pods and not the other's even
with a route across (only the VLAN separates them). All of it with the ConfigMap's `dra: true`
uncommented: the agent is the DRA driver through the DaemonSet's mounts alone (registered by the
kubelet, connected to containerd's NRI, its node's slice published, every doctor DRA check
passing, a new agent pod registering again). On the session's lab (tests/e2e/conftest.py),
put back as it was afterwards; the crash test, last, checks `lab down` leaves nothing of it.

Fails (never skips) without the Kubernetes binaries, as tests/e2e/test_kube_lab.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.lab import kube, kubedeploy
from tenantnet.lab import node as labnode
from tenantnet.ops import runtime as rtmod
from tenantnet.plugin import kubecache
from tests.atonce import at_once
from tests.polling import poll

CTL = str(Path(sys.executable).parent / "tenantnetctl")
AGENT_SA = "system:serviceaccount:kube-system:tenantnet"
RENDERER_SA = "system:serviceaccount:kube-system:tenantnet-renderer"
DRIVER = "tenantnet.io"


@dataclass
class Deployed:
    lab: kube.KubeLab
    image: str
    timings: dict[str, float]

    def kubectl(self, *args: str, timeout: float = 120) -> str:
        return kube.kubectl(self.lab, *args, timeout=timeout)

    def agent_status(self) -> dict[str, Any]:
        proc = subprocess.run([CTL, "agent", "status", "--json"], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "TENANTNET_CONFIG": self.lab.node_config}, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return dict(json.loads(proc.stdout))

    def pod(self, label: str) -> dict[str, Any]:
        [pod] = json.loads(self.kubectl("-n", "kube-system", "get", "pods", "-l", f"app.kubernetes.io/name={label}",
                                        "-o", "json"))["items"]
        return dict(pod)


@pytest.fixture(scope="module")
def deployed(kube_session: Any) -> Iterator[Deployed]:
    """The session's lab (tests/e2e/conftest.py) with the DaemonSet deployed; put back as it was
    for the modules after this one (kubedeploy.undeploy). The crash test, last, checks that
    `lab down` leaves nothing of it either."""
    lab = kube_session.lab().lab
    # DRA on: the ConfigMap's `dra: true` line (shipped commented out) uncommented, so the
    # DaemonSet's agent is the DRA driver through its mounts alone — and everything else here
    # runs with it on (the plain lab has no VFs: its slice is empty; the DRA e2e runs the
    # driver with devices on a lab of its own).
    packaged = kubedeploy.node_config
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kubedeploy, "node_config", lambda lab: packaged(lab) + "dra: true\n")
        done = kubedeploy.deploy(lab)
    print(f"\nthe DaemonSet (dra: true) and the renderer ready {done['timings']}")
    try:
        yield Deployed(lab, done["image"], done["timings"])
    finally:
        if kube.status(lab.root).running:
            kubedeploy.undeploy(lab, done)
            # The agent leaves its slices for the next agent to take over: none comes here.
            kube.kubectl(lab, "delete", "resourceslices", "--ignore-not-found",
                         f"--field-selector=spec.driver={DRIVER},spec.nodeName={lab.node_name}")
            # Its pod gone, the agent took its sockets away (the kubelet deregistered it).
            left = [p for p in (Path(lab.kubelet_root) / "plugins_registry" / f"{DRIVER}-reg.sock",
                                Path(lab.kubelet_root) / "plugins" / DRIVER / "dra.sock") if os.path.lexists(p)]
            assert left == [], left


def test_the_daemonset_installed_the_plugin_and_runs_the_agent(deployed: Deployed) -> None:
    lab = deployed.lab
    ds = deployed.pod("tenantnet")
    assert ds["spec"]["serviceAccountName"] == "tenantnet" and ds["spec"]["nodeName"] == lab.node_name
    assert {c["image"] for c in ds["spec"]["containers"] + ds["spec"]["initContainers"]} == {deployed.image}
    installed = deployed.kubectl("-n", "kube-system", "logs", ds["metadata"]["name"], "-c", "install")
    assert f"{lab.cni_bin_dir}/tenantnet: written (the compiled trampoline)" in installed, installed
    assert f"{lab.node_config}: written from" in installed, installed
    # In the CNI bin dir the kubelet's Multus reads: the trampolines and shims of the runtime
    # the installer copied into the lab (no longer the venv's links).
    runtimes = list((Path(lab.root) / "tenantnet").iterdir())
    assert len(runtimes) == 1 and rtmod.verify(rtmod.load_runtime(runtimes[0]))
    for command in rtmod.PLUGINS:
        exe = Path(lab.cni_bin_dir) / command
        assert not exe.is_symlink() and rtmod.is_trampoline(exe)
        assert str(runtimes[0]) in (Path(lab.cni_bin_dir) / f"{command}-shim").read_text()
        proc = subprocess.run([str(exe)], env={"CNI_COMMAND": "VERSION"}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0 and "1.0.0" in json.loads(proc.stdout)["supportedVersions"], proc.stderr
    # The node config the init container wrote (the ConfigMap's): the lab's OVS, Kubernetes mode.
    written = yaml.safe_load(Path(lab.node_config).read_text())
    assert written["ovsdb"] == f"unix:{lab.ovs_root}/db.sock" and written["kubernetes"] is True
    # The agent in the pod serves the socket the node config names, its watcher synced
    # through its own ServiceAccount's token.
    status = deployed.agent_status()
    assert status["socket"] == written["agentSocket"]
    cmdline = Path(f"/proc/{status['pid']}/cmdline").read_bytes().split(b"\0")  # hostPID: the host's pid
    assert f"{kubedeploy.IMAGE_RUNTIME}/libexec/tenantnetctl".encode() in cmdline, cmdline
    assert poll(lambda: deployed.agent_status()["kubernetes"]["synced"], 60, 0.5), deployed.agent_status()
    # It watches its own Node, named by the DaemonSet (spec.nodeName): not the machine's host name.
    assert "nodeName" not in written and socket.gethostname() != lab.node_name
    synced = kubecache.read_sync(written["stateDir"])
    assert synced is not None and synced.node_name == lab.node_name, synced
    assert synced.node_labels.get("kubernetes.io/hostname") == lab.node_name, synced
    # It publishes the PFs its sysfs shows on its Node, through the ServiceAccount's patch.
    assert poll(lambda: deployed.agent_status()["kubernetes"].get("pfs") is not None, 60, 0.5), \
        deployed.agent_status()
    node = json.loads(deployed.kubectl("get", "node", lab.node_name, "-o", "json"))
    assert json.loads(node["metadata"]["annotations"]["tenantnet.io/pfs"]) == \
        deployed.agent_status()["kubernetes"]["pfs"], node["metadata"]["annotations"]
    renderer = deployed.pod("tenantnet-renderer")
    assert renderer["spec"]["serviceAccountName"] == "tenantnet-renderer"
    logs = deployed.kubectl("-n", "kube-system", "logs", renderer["metadata"]["name"])
    assert poll(lambda: "render.leader" in deployed.kubectl("-n", "kube-system", "logs",
                                                           renderer["metadata"]["name"]), 60, 0.5), logs


@pytest.mark.parametrize(("account", "verb", "resource", "allowed"), [
    (AGENT_SA, "list", "tenantnetworks.tenantnet.io", True),
    (AGENT_SA, "watch", "tenantnetworks.tenantnet.io", True),
    (AGENT_SA, "watch", "namespaces", True),
    (AGENT_SA, "get", "nodes", True),
    (AGENT_SA, "patch", "nodes", True),  # its PFs' annotation (docs/kubernetes.md)
    (AGENT_SA, "delete", "nodes", False),
    (AGENT_SA, "create", "network-attachment-definitions.k8s.cni.cncf.io", False),
    (AGENT_SA, "patch", "tenantnetworks.tenantnet.io", False),
    (AGENT_SA, "get", "secrets", False),
    (RENDERER_SA, "create", "network-attachment-definitions.k8s.cni.cncf.io", True),
    (RENDERER_SA, "delete", "network-attachment-definitions.k8s.cni.cncf.io", True),
    (RENDERER_SA, "patch", "tenantnetworks.tenantnet.io/status", True),
    (RENDERER_SA, "patch", "tenantnetworks.tenantnet.io", False),
    (RENDERER_SA, "create", "tenantnetworks.tenantnet.io", False),
    (RENDERER_SA, "get", "secrets", False),
    (RENDERER_SA, "watch", "nodes", True),
    (RENDERER_SA, "patch", "nodes", False),
    (RENDERER_SA, "update", "leases.coordination.k8s.io -n kube-system", True),
    (RENDERER_SA, "update", "leases.coordination.k8s.io -n default", False),
])
def test_least_privilege_by_the_real_rbac(deployed: Deployed, account: str, verb: str, resource: str,
                                          allowed: bool) -> None:
    resource, *ns = resource.split()
    if resource.endswith("/status"):
        resource, sub = resource.rsplit("/", 1)
        ns += ["--subresource", sub]
    lab = deployed.lab
    # (exits 1 for "no", with a warning on stderr for a cluster-scoped resource: the answer is stdout)
    proc = subprocess.run([lab.kubectl, f"--kubeconfig={lab.kubeconfig}", "auth", "can-i", verb, resource,
                           f"--as={account}", *ns], capture_output=True, text=True, timeout=60, check=False)
    answer = proc.stdout.strip()
    assert answer == ("yes" if allowed else "no"), (account, verb, resource, proc.stdout, proc.stderr)


def test_two_tenants_through_the_installed_plugin_and_agent(deployed: Deployed) -> None:
    lab = deployed.lab
    served = deployed.agent_status()["served"]
    started = time.monotonic()
    addrs = kubedeploy.run_tenants(lab)
    print(f"\nfour pods of two tenants Ready with net1 {time.monotonic() - started:.1f} s after apply")
    # Every ADD went through the DaemonSet's agent (the trampoline's fast path).
    assert deployed.agent_status()["served"] >= served + len(addrs)
    out = subprocess.run([CTL, "--node-config", lab.node_config, "ls", "--json"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    vlans = {r["pod"]: r["vlan"] for r in json.loads(out)}
    assert vlans == {pod: kubedeploy.TENANTS[pod.split("/")[0]][0] for pod in addrs}, vlans
    tags = labnode.vsctl(lab.ovs_root, "--bare", "--columns=tag", "find", "Port",
                         "external_ids:tenantnet-owner=tenantnet").split()
    assert sorted(tags) == ["101", "101", "102", "102"], tags
    a1, a2, b1, b2 = (addrs[f"tenant-{t}/p{i}"] for t in "ab" for i in (1, 2))
    # at once: the two that must fail each wait out their deadline
    a_a, b_b, a_b, b_a = at_once(*(lambda src=src, ip=ip: kubedeploy.reaches(lab, src, ip) for src, ip in (
        ("tenant-a/p1", a2), ("tenant-b/p2", b1), ("tenant-a/p1", b1), ("tenant-b/p2", a2))))
    assert a_a and b_b
    assert not a_b, "tenant A reached tenant B"
    assert not b_a, "tenant B reached tenant A"
    kubedeploy.remove_tenants(lab)  # (the session's lab goes on)
    gone = subprocess.run([CTL, "--node-config", lab.node_config, "ls", "--json"], capture_output=True,
                          text=True, check=True, timeout=60).stdout
    assert json.loads(gone) == [], gone


def test_the_daemonsets_agent_is_the_dra_driver_through_its_mounts(deployed: Deployed) -> None:
    """The DaemonSet's DRA mounts are the lab kubelet's and containerd's directories themselves,
    at the same paths in the agent's container as on the host, as the node config names them;
    through them the lab's kubelet registered the driver, the agent is connected to containerd's
    NRI socket, and it published its node's (empty: no VF on the plain lab) ResourceSlice with
    its ServiceAccount's token; the pods of the tests above started with its NRI plugin in their
    path and nothing failed."""
    lab = deployed.lab
    written = yaml.safe_load(Path(lab.node_config).read_text())
    containerd = os.path.dirname(lab.containerd_socket)
    assert (written["kubeletRootDir"], written["nriSocket"], written["cdiDir"]) == \
        (lab.kubelet_root, f"{containerd}/nri/nri.sock", f"{containerd}/cdi"), written
    assert written["dra"] is True

    def dra() -> dict[str, Any]:
        return deployed.agent_status()["dra"] or {}

    assert poll(lambda: dra().get("registered") and dra().get("nriConnected"), 60, 0.5), dra()
    assert dra()["registrationError"] == ""
    assert (Path(lab.kubelet_root) / "plugins_registry" / f"{DRIVER}-reg.sock").is_socket()
    assert (Path(lab.kubelet_root) / "plugins" / DRIVER / "dra.sock").is_socket()
    assert poll(lambda: dra()["slices"]["writes"] >= 1, 60, 0.5), dra()
    slices = json.loads(deployed.kubectl("get", "resourceslices", "-o", "json",
                                         f"--field-selector=spec.driver={DRIVER},spec.nodeName={lab.node_name}"))
    assert [s["spec"]["pool"]["name"] for s in slices["items"]] == [lab.node_name], slices
    assert dra()["slices"]["devices"] == 0 and dra()["slices"]["failures"] == 0, dra()
    assert dra()["attachFailed"] == 0 and dra()["claims"] == [], dra()
    ds = deployed.pod("tenantnet")
    volumes = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["volumes"] if "hostPath" in v}
    [agent] = [c for c in ds["spec"]["containers"] if c["name"] == "agent"]
    mounts = {m["mountPath"]: volumes[m["name"]] for m in agent["volumeMounts"] if m["name"] in volumes}
    wanted = [f"{lab.kubelet_root}/plugins_registry", f"{lab.kubelet_root}/plugins/tenantnet.io",
              f"{containerd}/nri", f"{containerd}/cdi"]
    for path in wanted:
        assert mounts.get(path) == path, (path, mounts)
    # The same directories, not empty ones of the container's: their inodes as the host has them
    # (the lab image's busybox; packaging/Containerfile's image has coreutils' stat).
    out = deployed.kubectl("-n", "kube-system", "exec", ds["metadata"]["name"], "-c", "agent", "--",
                           "/bin/busybox", "stat", "-c", "%i %n", *wanted)
    seen = {name: int(inode) for inode, name in (line.split(" ", 1) for line in out.splitlines())}
    assert seen == {path: os.stat(path).st_ino for path in wanted}, out


def test_doctor_passes_every_dra_check_with_the_packaged_rbac(deployed: Deployed, tmp_path: Path) -> None:
    """`tenantnetctl doctor` on the deployed node: the real kubelet's root dir, its registration
    of tenantnet.io, containerd's NRI socket and the agent's connection, the CDI dir, and the
    packaged RBAC (SelfSubjectAccessReviews answered by the real API server, resourceclaims/
    driver's associated-node:patch included)."""
    lab = deployed.lab
    env = {"PATH": f"{Path(lab.kubectl).parent}{os.pathsep}/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run([CTL, "doctor", "--node-config", lab.node_config, "--kubeconfig", lab.kubeconfig,
                          "--cni-conf-dir", lab.cni_conf_dir, "--cni-bin-dir", lab.cni_bin_dir, "--json"],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert run.stderr == "", run.stderr
    checks = {c["name"]: c for c in json.loads(run.stdout)["checks"]}
    for name in ("DRA plugins_registry", "DRA registration", "DRA NRI", "DRA CDI dir", "RBAC agent DRA"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert "associated-node:patch resourceclaims.resource.k8s.io/driver named tenantnet.io" in \
        checks["RBAC agent DRA"]["detail"]


def test_a_new_agent_pod_registers_again(deployed: Deployed) -> None:
    lab = deployed.lab
    registration = Path(lab.kubelet_root) / "plugins_registry" / f"{DRIVER}-reg.sock"
    before = (deployed.agent_status()["pid"], registration.stat().st_ino)
    deployed.kubectl("-n", "kube-system", "delete", "pods", "-l", "app.kubernetes.io/name=tenantnet",
                     "--wait=true", "--timeout=120s", timeout=150)

    def registered_again() -> bool:
        proc = subprocess.run([CTL, "agent", "status", "--json"], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "TENANTNET_CONFIG": lab.node_config}, check=False)
        status = json.loads(proc.stdout) if proc.returncode == 0 else {}
        return bool(status and status["pid"] != before[0] and (status.get("dra") or {}).get("registered"))

    # The DaemonSet's new pod: a new agent, its own registration socket, registered anew.
    assert poll(registered_again, 120, 0.5)
    assert registration.stat().st_ino != before[1]
