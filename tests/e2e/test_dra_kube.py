"""Issue 28 end to end on a real Kubernetes node: tenantnet as the DRA driver `tenantnet.io`.

One lab, `tenantnetctl lab up --kubernetes --gpus 8 --vfs 2` (the simulated 8-GPU / 8-NIC
server as the node, the lab's simulated GPU driver publishing the GPUs; shared with
test_gpudra_kube, tests/e2e/conftest.py), the packaged TenantNetwork CRD, DeviceClasses and
RBAC applied, eight TenantNetworks `rail-0` …
`rail-7` for tenant team-a (one NIC, VLAN and subnet each), and tenantnet's agent run by the
test with `dra: true` under its ServiceAccount. Checked:

- the agent registers with the kubelet, and its ResourceSlices offer the 16 VFs; a VF a pod
  takes through Multus + CNI leaves the slices until its DEL;
- a pod asking for 8 GPUs and 8 rails with one `matchAttribute: resource.kubernetes.io/pcieRoot`
  per GPU/rail pair is placed by the real kube-scheduler with every rail behind its GPU's PCIe
  switch (PIX, `tenantnetctl rails --claims`); the kubelet has tenantnet prepare the claim,
  containerd's NRI moves the 8 VFs into the pod at its start; the claim's status carries each
  rail's address; a second pod (8 rails, no GPU) reaches the first on every rail;
- a pod of tenant team-b whose claim names rail-0 is refused at prepare with the reason, and
  never starts; a claim that cannot be aligned stays Pending with the scheduler's reason;
- `tenantnetctl rails --claims` shows the 8 pairs, all PIX;
- deleting the pods unprepares everything: no claim record, no CDI spec, every VF back on the
  host, the slices offer all 16 VFs again.
Fails (never skips) without the Kubernetes binaries.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.lab import kube, kubeimages
from tenantnet.lab.nic import LabNic
from tenantnet.plugin import draclaims, nodeconfig
from tests.atonce import at_once
from tests.polling import poll

REPO = Path(__file__).resolve().parents[2]
CTL = str(Path(sys.executable).parent / "tenantnetctl")
RAILS = 8
GPU_CLASS = "gpu.lab.tenantnet.io"
RAIL_CLASS = "rail.tenantnet.io"


@dataclass
class DraLab:
    lab: kube.KubeLab
    node_config: str
    env: dict[str, str]
    pfs: list[str]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def kubectl(self, *args: str, **kw: Any) -> str:
        return kube.kubectl(self.lab, *args, **kw)

    def get(self, *args: str) -> Any:
        try:
            return json.loads(self.kubectl("get", *args, "-o", "json"))
        except kube.KubeError:
            return None

    def apply(self, *docs: dict[str, Any]) -> None:
        kube.apply(self.lab, yaml.safe_dump_all(docs))

    def agent(self) -> dict[str, Any]:
        proc = subprocess.run([CTL, "agent", "status", "--json"], capture_output=True, text=True, timeout=60,
                              env=self.env, check=False)
        return dict(json.loads(proc.stdout)) if proc.returncode == 0 else {}

    def agent_log(self) -> str:
        return (Path(self.lab.root) / "agent.out").read_text()[-4000:]

    def events(self, namespace: str, name: str) -> str:
        got = self.get("events", "-n", namespace, f"--field-selector=involvedObject.name={name}")
        return " | ".join(f"{e.get('reason')}: {e.get('message', '')}" for e in (got or {"items": []})["items"])


def tenant_network(i: int, pf: str) -> dict[str, Any]:
    return {"apiVersion": "tenantnet.io/v1alpha1", "kind": "TenantNetwork", "metadata": {"name": f"rail-{i}"},
            "spec": {"tenants": ["team-a"], "fabric": {"mode": "sriov", "pfs": [pf]}, "vlan": 600 + i,
                     "rdma": "off", "ipam": {"ranges": [[{"subnet": f"10.90.{i}.0/24"}]]}}}


@pytest.fixture(scope="module")
def dra(gpu_kube_session: Any) -> Iterator[DraLab]:
    """The simulated 8-GPU server's lab (tests/e2e/conftest.py's GpuKubeSession, shared with
    test_gpudra_kube, which runs after this module and takes it down); what the agent changed
    on it (its node config, its slices) is put back at the end."""
    lab = gpu_kube_session.lab()
    node_config = lab.node_config
    original = Path(node_config).read_text()
    d: DraLab | None = None
    try:
        cards = sorted(LabNic(lab.ovs_root).describe(), key=lambda c: c["pfAddress"])
        env = {**os.environ, "TENANTNET_CONFIG": node_config}
        d = DraLab(lab, node_config, env, [c["pf"] for c in cards])
        for manifest in ("packaging/crds/tenantnetwork.yaml", "packaging/dra/deviceclasses.yaml",
                         "packaging/rbac.yaml"):
            kube.apply(lab, (REPO / manifest).read_text())
        d.kubectl("wait", "--for=condition=Established", "crd/tenantnetworks.tenantnet.io", "--timeout=60s")
        d.apply(*[{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
            "tenantnet.io/tenant": ns}}} for ns in ("team-a", "team-b")],
            *[tenant_network(i, pf) for i, pf in enumerate(d.pfs)])
        text = Path(node_config).read_text()
        Path(node_config).write_text(
            text.replace(f"kubeconfig: {lab.kubeconfig}\n",
                         f"kubeconfig: {kube.service_account_kubeconfig(lab, 'tenantnet', lab.root, bound_to_node=True)}\n")
            + f"nodeName: {lab.node_name}\nagentSocket: {lab.root}/agent.sock\n")
        out = open(Path(lab.root) / "agent.out", "w")  # noqa: SIM115 (closed with the process)
        d.procs.append(subprocess.Popen([CTL, "--node-config", node_config, "agent", "run"], stdout=out,
                                        stderr=subprocess.STDOUT, text=True))
        assert poll(lambda: (d.agent().get("dra") or {}).get("registered")
                    and (d.agent().get("kubernetes") or {}).get("synced"), 90, 0.2), d.agent_log()
        for ns in ("team-a", "team-b"):
            assert poll(lambda n=ns: d.get("serviceaccount", "default", "-n", n) is not None, 60, 0.2)
        yield d
    finally:
        if d is not None:
            for p in d.procs:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        Path(node_config).write_text(original)
        if kube.status(lab.root).running:
            # The agent leaves its slices for the next agent to take over: none comes here.
            kube.kubectl(lab, "delete", "resourceslices", "--ignore-not-found",
                         f"--field-selector=spec.driver=tenantnet.io,spec.nodeName={lab.node_name}")


def claim_template(name: str, namespace: str, gpus: bool, networks: list[str] | None = None,
                   aligned: bool = True, rails: int = RAILS) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    constraints = []
    config = []
    for i in range(rails):
        # Network rail-i is on NIC i's PF: the request selects that rail (the node would refuse a
        # VF of another PF for it at prepare, naming both).
        requests.append({"name": f"rail-{i}", "exactly": {"deviceClassName": RAIL_CLASS, "count": 1, "selectors": [
            {"cel": {"expression": f'device.attributes["tenantnet.io"].rail == "rail-{i}"'}}]}})
        net = (networks or [f"rail-{j}" for j in range(RAILS)])[i]
        config.append({"requests": [f"rail-{i}"], "opaque": {"driver": "tenantnet.io",
                                                            "parameters": {"network": net}}})
        if gpus:
            requests.append({"name": f"gpu-{i}", "exactly": {"deviceClassName": GPU_CLASS, "count": 1}})
            if aligned:
                constraints.append({"requests": [f"gpu-{i}", f"rail-{i}"],
                                    "matchAttribute": "resource.kubernetes.io/pcieRoot"})
    spec: dict[str, Any] = {"requests": requests, "config": config}
    if constraints:
        spec["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": {"devices": spec}}}


def pod(name: str, namespace: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "net", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "main", "image": kubeimages.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"], "resources": {"claims": [{"name": "net"}]}}]}}


def claim_of(d: DraLab, namespace: str, name: str) -> dict[str, Any]:
    p = d.get("pod", "-n", namespace, name)
    [status] = p["status"]["resourceClaimStatuses"]
    return dict(d.get("resourceclaim", "-n", namespace, status["resourceClaimName"]))


def slice_devices(d: DraLab, driver: str) -> dict[str, dict[str, Any]]:
    got = d.get("resourceslices", f"--field-selector=spec.driver={driver}")
    return {dev["name"]: {k: next(iter(v.values())) for k, v in dev.get("attributes", {}).items()}
            for s in got["items"] for dev in s["spec"].get("devices") or []}


def test_the_agent_offers_every_vf(dra: DraLab) -> None:
    assert poll(lambda: len(slice_devices(dra, "tenantnet.io")) == 2 * RAILS, 60, 0.5), dra.agent_log()
    devices = slice_devices(dra, "tenantnet.io")
    rails = sorted({a.get("rail") for a in devices.values()})
    assert rails == [f"rail-{i}" for i in range(RAILS)], devices


def test_a_vf_the_cni_path_takes_is_not_offered(dra: DraLab) -> None:
    """A pod of team-a on rail-0 through Multus (its NAD as the renderer writes it: the
    TenantNetwork decides, a free VF of its PF is picked): that VF leaves the slices while the
    pod runs, and is offered again after its DEL."""
    nad = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
           "metadata": {"name": "rail-0", "namespace": "team-a"},
           "spec": {"config": json.dumps({"cniVersion": "1.0.0", "name": "rail-0", "type": "tenantnet",
                                          "tenantNetwork": "rail-0"})}}
    p = pod("multus", "team-a", "unused")
    del p["spec"]["resourceClaims"], p["spec"]["containers"][0]["resources"]
    p["metadata"]["annotations"] = {"k8s.v1.cni.cncf.io/networks": "rail-0"}
    dra.apply(nad, p)
    try:
        try:
            dra.kubectl("wait", "-n", "team-a", "pod/multus", "--for=condition=Ready", "--timeout=120s", timeout=140)
        except kube.KubeError:
            pytest.fail(f"not Ready: {dra.events('team-a', 'multus')}\n{dra.agent_log()}")
        out = subprocess.run([CTL, "ls", "--json"], capture_output=True, text=True, timeout=60, env=dra.env,
                             check=True).stdout
        [taken] = [r["hostIfname"] for r in json.loads(out) if r.get("pod") == "team-a/multus"]  # the VF's PCI address
        assert poll(lambda: len(slice_devices(dra, "tenantnet.io")) == 2 * RAILS - 1, 60, 0.2), dra.agent_log()
        assert draclaims.device_name(taken) not in slice_devices(dra, "tenantnet.io")
    finally:
        dra.kubectl("delete", "pod", "-n", "team-a", "multus", "--wait=true", "--timeout=120s", timeout=150)
        dra.kubectl("delete", "network-attachment-definition", "-n", "team-a", "rail-0", "--ignore-not-found")
    assert poll(lambda: len(slice_devices(dra, "tenantnet.io")) == 2 * RAILS, 60, 0.2), dra.agent_log()


def test_another_tenants_claim_is_refused_at_prepare(dra: DraLab) -> None:
    """A pod of team-b whose claim names TenantNetwork rail-0 (team-a's): scheduled (the
    scheduler knows no tenants), refused by the node at prepare with the reason, never started,
    and nothing of it stays on the node."""
    dra.apply(claim_template("steal", "team-b", gpus=False, rails=1), pod("thief", "team-b", "steal"))
    try:
        assert poll(lambda: "tenant isolation" in dra.events("team-b", "thief"), 120, 0.3), \
            dra.events("team-b", "thief") + dra.agent_log()
        assert "may not use TenantNetwork rail-0" in dra.events("team-b", "thief")
        assert dra.get("pod", "-n", "team-b", "thief")["status"]["phase"] == "Pending"
        assert not (dra.agent().get("dra") or {}).get("claims")
    finally:
        dra.kubectl("delete", "pod", "-n", "team-b", "thief", "--wait=true", "--timeout=120s", timeout=150)


def test_a_pod_with_8_gpus_and_8_rails_aligned_traffic_and_unprepare(dra: DraLab) -> None:
    a = "team-a"
    started = time.monotonic()
    dra.apply(claim_template("train", a, gpus=True), pod("trainer", a, "train"),
              claim_template("peer", a, gpus=False), pod("peer", a, "peer"))
    try:
        for name in ("trainer", "peer"):
            try:
                dra.kubectl("wait", "-n", a, f"pod/{name}", "--for=condition=Ready", "--timeout=120s", timeout=140)
            except kube.KubeError:
                pytest.fail(f"{name} not Ready: {dra.events(a, name)}\n{dra.agent_log()}")
        print(f"\n2 pods (8 GPUs + 8 rails, and 8 rails) Ready {time.monotonic() - started:.1f} s after apply")
        claim = claim_of(dra, a, "trainer")
        results = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
        gpus, vfs = slice_devices(dra, GPU_CLASS), slice_devices(dra, "tenantnet.io")
        root = "resource.kubernetes.io/pcieRoot"
        for i in range(RAILS):
            assert gpus[results[f"gpu-{i}"]["device"]][root] == vfs[results[f"rail-{i}"]["device"]][root], results
        # The addresses, from the claim's status (networkData), and traffic on every rail.
        peer_claim = claim_of(dra, a, "peer")

        def addresses(c: dict[str, Any]) -> dict[str, str]:
            return {e["networkData"]["interfaceName"]: e["networkData"]["ips"][0].split("/")[0]
                    for e in c["status"].get("devices") or [] if e["driver"] == "tenantnet.io"}
        assert poll(lambda: len(addresses(claim_of(dra, a, "peer"))) == RAILS, 30, 0.5), \
            f"{peer_claim['status']}\n{dra.agent_log()}"
        mine, theirs = addresses(claim_of(dra, a, "trainer")), addresses(claim_of(dra, a, "peer"))
        assert sorted(mine) == [f"rail-{i}" for i in range(RAILS)], mine
        links = dra.kubectl("exec", "-n", a, "trainer", "--", "ip", "-o", "-4", "addr", "show")
        for i in range(RAILS):
            assert f"rail-{i}" in links and mine[f"rail-{i}"] in links, links
        # a ping on every rail, the eight at once (a failed one raises, naming its rail)
        at_once(*(lambda i=i: dra.kubectl("exec", "-n", a, "trainer", "--", "ping", "-c", "1", "-W", "2", "-I",
                                          f"rail-{i}", theirs[f"rail-{i}"], timeout=30) for i in range(RAILS)))
        # `tenantnetctl rails --claims`: every pair the scheduler made, PIX.
        shown = subprocess.run([CTL, "--node-config", dra.node_config, "rails", "--claims", "--json"],
                               capture_output=True, text=True, timeout=60, env=dra.env, check=False)
        assert shown.returncode == 0, shown.stderr
        [listed] = [c for c in json.loads(shown.stdout) if c["claim"] == f"{a}/{claim['metadata']['name']}"]
        assert sorted(p["distance"] for p in listed["pairs"]) == ["PIX"] * RAILS, listed
    finally:
        dra.kubectl("delete", "pod", "-n", a, "trainer", "peer", "--wait=true", "--timeout=120s",
                    "--ignore-not-found", timeout=150)
    # Unprepared: nothing of the claims is left on the node, and every VF is offered again.
    node = nodeconfig.load(dra.node_config)
    assert poll(lambda: not (dra.agent().get("dra") or {}).get("claims"), 90, 0.5), dra.agent()
    assert list(Path(node.cdi_dir).glob("tenantnet.io-*")) == []
    assert list((Path(node.state_dir) / "dra" / "claims").glob("*.json")) == []
    host = set(os.listdir("/sys/class/net"))
    for card in LabNic(dra.lab.ovs_root).describe():
        for vf in card["vfs"]:
            assert vf["netdev"] in host, vf
    assert poll(lambda: len(slice_devices(dra, "tenantnet.io")) == 2 * RAILS, 60, 0.5)


def test_a_claim_that_cannot_be_aligned_stays_pending_with_the_reason(dra: DraLab) -> None:
    """Two GPUs and their rails, all four on one PCIe root: no node has that (one GPU a root)."""
    tpl = claim_template("impossible", "team-a", gpus=True)
    devices = tpl["spec"]["spec"]["devices"]
    devices["requests"] = [r for r in devices["requests"] if r["name"] in ("gpu-0", "gpu-1", "rail-0", "rail-1")]
    devices["config"] = [c for c in devices["config"] if c["requests"][0] in ("rail-0", "rail-1")]
    devices["constraints"] = [{"requests": ["gpu-0", "gpu-1", "rail-0", "rail-1"],
                               "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    dra.apply(tpl, pod("stuck", "team-a", "impossible"))
    try:
        def reason() -> str:
            p = dra.get("pod", "-n", "team-a", "stuck")
            cond = next((c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})
            return str(cond.get("message", "")) if cond.get("reason") == "Unschedulable" else ""
        assert poll(lambda: "cannot allocate all claims" in reason(), 60, 0.5), dra.get("pod", "-n", "team-a", "stuck")
        assert dra.get("pod", "-n", "team-a", "stuck")["status"]["phase"] == "Pending"
        assert not (dra.agent().get("dra") or {}).get("claims")  # nothing reached the node
    finally:
        dra.kubectl("delete", "pod", "-n", "team-a", "stuck", "--wait=true", "--timeout=60s", timeout=90)
