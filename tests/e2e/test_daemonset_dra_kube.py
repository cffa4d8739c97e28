"""The packaged DaemonSet with the ConfigMap's `dra: true` on the lab's real Kubernetes node
(tenantnet/lab/kubedeploy.py; docs/dra.md, docs/kubernetes.md "The DaemonSet on the lab node").

The plain lab has no VFs, so the driver has nothing to offer; what is checked is that the
DaemonSet as packaged makes its agent the DRA driver `tenantnet.io` through its mounts alone
and that turning DRA on breaks nothing: the lab's kubelet registered the driver (its
registration socket in the kubelet's plugins_registry, at the same path in the pod as on the
host), the agent is connected to the lab containerd's NRI socket, it published its node's
(empty) ResourceSlice through its ServiceAccount, pods of two tenants still start with net1
through the NRI plugin in their path, and `tenantnetctl doctor` passes every DRA check. Pod
deleted, a new agent registers again; the DaemonSet deleted, the agent took its sockets away.

On the session's lab (tests/e2e/conftest.py), put back as it was afterwards, the slice the
agent leaves for its successor deleted. Fails (never skips) without the Kubernetes binaries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import kube, kubedeploy
from tests.polling import poll

CTL = str(Path(sys.executable).parent / "tenantnetctl")
DRIVER = "tenantnet.io"


@pytest.fixture(scope="module")
def dra_lab(kube_session: Any) -> Iterator[kube.KubeLab]:
    """The session's lab with the DaemonSet deployed and `dra: true` in its ConfigMap's node
    config (the line the ConfigMap ships commented out)."""
    lab = kube_session.lab().lab
    packaged = kubedeploy.node_config
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kubedeploy, "node_config", lambda lab: packaged(lab) + "dra: true\n")
        done = kubedeploy.deploy(lab)
    print(f"\nthe DaemonSet (dra: true) and the renderer ready {done['timings']}")
    try:
        yield lab
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


def agent_status(lab: kube.KubeLab) -> dict[str, Any]:
    proc = subprocess.run([CTL, "agent", "status", "--json"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TENANTNET_CONFIG": lab.node_config}, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout))


def test_the_daemonsets_agent_is_the_dra_driver_and_pods_still_start(dra_lab: kube.KubeLab) -> None:
    lab = dra_lab

    def dra() -> dict[str, Any]:
        return agent_status(lab)["dra"] or {}

    assert poll(lambda: dra().get("registered") and dra().get("nriConnected"), 60, 0.5), dra()
    assert dra()["registrationError"] == ""
    registration = Path(lab.kubelet_root) / "plugins_registry" / f"{DRIVER}-reg.sock"
    assert registration.is_socket() and (Path(lab.kubelet_root) / "plugins" / DRIVER / "dra.sock").is_socket()
    # Its node's slice, written with the ServiceAccount's token: no VF on the plain lab.
    assert poll(lambda: dra()["slices"]["writes"] >= 1, 60, 0.5), dra()
    slices = json.loads(kube.kubectl(lab, "get", "resourceslices", "-o", "json",
                                     f"--field-selector=spec.driver={DRIVER},spec.nodeName={lab.node_name}"))
    assert [s["spec"]["pool"]["name"] for s in slices["items"]] == [lab.node_name], slices
    assert dra()["slices"]["devices"] == 0 and dra()["slices"]["failures"] == 0, dra()
    # Pods start through the NRI plugin (RunPodSandbox of a pod with no claim: nothing to do).
    addrs = kubedeploy.run_tenants(lab)
    try:
        assert kubedeploy.reaches(lab, "tenant-a/p1", addrs["tenant-a/p2"])
        assert not kubedeploy.reaches(lab, "tenant-a/p1", addrs["tenant-b/p1"])
    finally:
        kubedeploy.remove_tenants(lab)
    assert dra()["attachFailed"] == 0 and dra()["claims"] == [], dra()


def test_doctor_passes_every_dra_check(dra_lab: kube.KubeLab) -> None:
    lab = dra_lab
    env = {"PATH": f"{Path(lab.kubectl).parent}{os.pathsep}/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/nonexistent"}
    run = subprocess.run([CTL, "doctor", "--node-config", lab.node_config, "--kubeconfig", lab.kubeconfig,
                          "--cni-conf-dir", lab.cni_conf_dir, "--cni-bin-dir", lab.cni_bin_dir, "--json"],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert run.stderr == "", run.stderr
    checks = {c["name"]: c for c in json.loads(run.stdout)["checks"]}
    for name in ("DRA plugins_registry", "DRA registration", "DRA NRI", "DRA CDI dir", "RBAC agent DRA"):
        assert checks[name]["status"] == "PASS", checks[name]


def test_a_new_agent_pod_registers_again(dra_lab: kube.KubeLab) -> None:
    lab = dra_lab
    registration = Path(lab.kubelet_root) / "plugins_registry" / f"{DRIVER}-reg.sock"
    before = (agent_status(lab)["pid"], registration.stat().st_ino)
    kube.kubectl(lab, "-n", "kube-system", "delete", "pods", "-l", "app.kubernetes.io/name=tenantnet",
                 "--wait=true", "--timeout=120s", timeout=150)

    def registered_again() -> bool:
        status = agent_status_or_none(lab)
        return bool(status and status["pid"] != before[0] and (status.get("dra") or {}).get("registered"))

    # The DaemonSet's new pod: a new agent, its own registration socket, registered anew.
    assert poll(registered_again, 120, 0.5), agent_status_or_none(lab)
    assert registration.stat().st_ino != before[1]


def agent_status_or_none(lab: kube.KubeLab) -> dict[str, Any] | None:
    proc = subprocess.run([CTL, "agent", "status", "--json"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TENANTNET_CONFIG": lab.node_config}, check=False)
    return dict(json.loads(proc.stdout)) if proc.returncode == 0 else None
