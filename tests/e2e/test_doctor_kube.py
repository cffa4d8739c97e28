"""`tenantnetctl doctor` on the lab's real Kubernetes node (tenantnet/lab/kube.py): Multus
thin found as the kubelet's CNI with its version, tenantnet's executables answering, the NAD
CRD present; the RBAC checks really asked the API server (SelfSubjectAccessReviews
impersonating the ServiceAccount) — and once the grant the doctor prints is applied, they
PASS. Through kubectl, and through the built-in client (TLS, client certificates).

On the session's lab (tests/e2e/conftest.py). Without the Kubernetes binaries this module fails
(never skips), as test_kube_lab does.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from tenantnet.lab import kube, kubebin

CTL = str(Path(sys.executable).parent / "tenantnetctl")
REPO = Path(__file__).resolve().parents[2]
SA = "kube-system/tn-doctor-e2e"


@pytest.fixture(scope="module")
def klab(kube_session: Any) -> kube.KubeLab:
    """The session's lab (tests/e2e/conftest.py); what this module grants its ServiceAccount
    is its own."""
    return cast(kube.KubeLab, kube_session.lab().lab)


def doctor(lab: kube.KubeLab, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    env = {"PATH": f"{Path(lab.kubectl).parent}{os.pathsep}/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/nonexistent"}
    run = subprocess.run([CTL, "doctor", "--node-config", lab.node_config, "--kubeconfig", lab.kubeconfig,
                          "--cni-conf-dir", lab.cni_conf_dir, "--cni-bin-dir", lab.cni_bin_dir,
                          "--agent-service-account", SA, "--renderer-service-account", SA, "--json", *args],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert run.stderr == "", run.stderr
    return run.returncode, {c["name"]: c for c in json.loads(run.stdout)["checks"]}


@pytest.mark.parametrize("client", ["kubectl", "builtin"])
def test_doctor_finds_multus_and_the_nad_crd(klab: kube.KubeLab, client: str) -> None:
    _, checks = doctor(klab, "--kube-client", client)
    for name in ("node config", "CNI conf dir", "CNI bin dir", "Multus config", "Multus kubeconfig",
                 "Multus version", "tenantnet", "tenantnet-ipam", "NAD CRD", f"bridge {klab.bridge}"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert "thin (type multus)" in checks["Multus config"]["detail"]
    assert kubebin.VERSIONS["multus"] in checks["Multus version"]["detail"]
    assert "network-attachment-definitions.k8s.cni.cncf.io established" in checks["NAD CRD"]["detail"]
    # The reviews reached the API server: an answer, not "cannot be told".
    for name in ("RBAC agent", "RBAC renderer"):
        assert checks[name]["status"] in ("PASS", "FAIL"), checks[name]


def run_fix(lab: kube.KubeLab, fix: str) -> None:
    """The fix exactly as printed: kubectl commands joined by &&, run from the repository."""
    for command in fix.split(" && "):
        argv = shlex.split(command)
        assert argv[0] == "kubectl", command
        proc = subprocess.run([lab.kubectl, f"--kubeconfig={lab.kubeconfig}", *argv[1:]], capture_output=True,
                              text=True, timeout=120, cwd=REPO, check=False)
        assert proc.returncode == 0, f"{command}: {proc.stderr}"


def test_the_printed_fixes_make_the_crd_and_rbac_checks_pass(klab: kube.KubeLab) -> None:
    _, checks = doctor(klab)
    crd = checks["TenantNetwork CRD"]
    if crd["status"] == "FAIL":  # the lab applies only the NAD CRD
        assert crd["fix"] == "kubectl apply -f packaging/crds/", crd
        run_fix(klab, crd["fix"])
        kube.kubectl(klab, "wait", "--for=condition=Established", "crd/tenantnetworks.tenantnet.io",
                     "--timeout=60s", timeout=90)
        _, checks = doctor(klab)
    assert checks["TenantNetwork CRD"]["status"] == "PASS", checks["TenantNetwork CRD"]
    for name in ("RBAC agent", "RBAC renderer"):
        c = checks[name]
        assert c["status"] == "FAIL" and "ServiceAccount kube-system/tn-doctor-e2e may not" in c["detail"], c
        run_fix(klab, c["fix"])
    _, checks = doctor(klab)
    assert checks["RBAC agent"]["status"] == "PASS", checks["RBAC agent"]
    assert checks["RBAC renderer"]["status"] == "PASS", checks["RBAC renderer"]
