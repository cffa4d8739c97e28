"""Issue 27 on the lab's real Kubernetes node: TenantNetworks rendered and enforced.

The CRD (packaging/crds/tenantnetwork.yaml) applied to the real API server; the renderer
(`tenantnetctl renderer run`) and the agent with its watcher (`tenantnetctl agent run`, node
config `kubernetes: true`) run as processes of the test against it. Tenants by label, by
Capsule's label and through HNC's depth labels; NADs rendered into exactly the selected
namespaces, re-rendered when a label changes, a tenant's edit undone and counted, a
conflicting network reported in its status, a network naming a PF no node publishes refused
(UnknownPF), a deleted network's NADs removed, a schema violation refused by the API server
itself; a pod scheduled for real gets its TenantNetwork's VLAN through kubelet → containerd →
Multus → tenantnet, and a hand-written NAD is refused; an agent restart changes nothing for
running pods.
Fails (never skips) without the Kubernetes binaries, as tests/e2e/test_kube_lab.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import kube, kubeimages
from tenantnet.plugin import kubecache
from tests.atonce import at_once
from tests.e2e.test_kube_lab import Lab, klab  # noqa: F401  (the session's lab, tests/e2e/conftest.py)
from tests.polling import poll

CTL = str(Path(sys.executable).parent / "tenantnetctl")
CRD = Path(__file__).resolve().parents[2] / "packaging" / "crds" / "tenantnetwork.yaml"
RBAC = Path(__file__).resolve().parents[2] / "packaging" / "rbac.yaml"
NAMESPACES = {
    "team-a": {"tenantnet.io/tenant": "team-a"},
    "team-b": {"capsule.clastix.io/tenant": "team-b"},
    "acme-ml": {"acme.tree.hnc.x-k8s.io/depth": "1", "acme-ml.tree.hnc.x-k8s.io/depth": "0"},
    "stray": {},
}


def tenant_network(name: str, tenants: list[str], vlan: Any, subnet: str, bridge: str) -> dict[str, Any]:
    return {"apiVersion": "tenantnet.io/v1alpha1", "kind": "TenantNetwork", "metadata": {"name": name},
            "spec": {"tenants": tenants, "fabric": {"mode": "ovs", "bridge": bridge}, "vlan": vlan,
                     "ipam": {"ranges": [[{"subnet": subnet}]]}}}


class Cluster:
    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.procs: list[subprocess.Popen[str]] = []

    def kubectl(self, *args: str, **kw: Any) -> str:
        return kube.kubectl(self.lab.lab, *args, **kw)

    def get(self, *args: str) -> Any:
        try:
            return json.loads(self.kubectl("get", *args, "-o", "json"))
        except kube.KubeError:
            return None

    def nads(self) -> dict[tuple[str, str], dict[str, Any]]:
        got = self.get("network-attachment-definitions", "-A", "-l", "tenantnet.io/tenant-network")
        return {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in (got or {"items": []})["items"]}

    def status(self, name: str) -> dict[str, Any]:
        return (self.get("tenantnetwork", name) or {}).get("status") or {}

    def start(self, *args: str, log: str) -> subprocess.Popen[str]:
        fh = open(Path(self.lab.lab.root) / log, "w")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen([CTL, *args], stdout=fh, stderr=subprocess.STDOUT, text=True)
        self.procs.append(proc)
        return proc


@pytest.fixture(scope="module")
def cluster(klab: Lab) -> Iterator[Cluster]:  # noqa: F811
    c = Cluster(klab)
    lab = klab.lab
    # The lab node in Kubernetes mode: its watcher reads the lab's API server; tenants by
    # label, Capsule and HNC; the agent on a socket of its own (never the host's default).
    node_config = Path(lab.node_config)
    original = node_config.read_text()  # put back at the end: the session's lab is shared
    node_config.write_text(original + f"kubernetes: true\nkubeconfig: {lab.kubeconfig}\n"
                           f"nodeName: {lab.node_name}\ntenantSources: [label, capsule, hnc]\n"
                           f"agentSocket: {lab.root}/agent.sock\n")
    kube.apply(lab, CRD.read_text())
    c.kubectl("wait", "--for=condition=Established", "crd/tenantnetworks.tenantnet.io", "--timeout=60s")
    for ns, labels in NAMESPACES.items():
        kube.apply(lab, json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": ns, "labels": labels}}))
    # Each process as its ServiceAccount, under the packaged RBAC: least privilege, for real.
    kube.apply(lab, RBAC.read_text())
    agent_kc = kube.service_account_kubeconfig(c.lab.lab, "tenantnet", c.lab.lab.root)
    node_config.write_text(node_config.read_text().replace(f"kubeconfig: {lab.kubeconfig}\n",
                                                           f"kubeconfig: {agent_kc}\n"))
    c.start("--node-config", str(node_config), "agent", "run", log="agent.out")
    c.start("--node-config", str(node_config), "renderer", "run",
            "--kubeconfig", kube.service_account_kubeconfig(c.lab.lab, "tenantnet-renderer", c.lab.lab.root),
            "--auto-vlans", "3000-3009", "--identity", "e2e", log="renderer.out")
    try:
        yield c
    finally:
        for proc in c.procs:  # ours, by pid
            proc.send_signal(signal.SIGTERM)
        for proc in c.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        node_config.write_text(original)


def _renderer_log(c: Cluster) -> str:
    return (Path(c.lab.lab.root) / "renderer.out").read_text()[-3000:]


def test_nads_rendered_into_the_selected_namespaces(cluster: Cluster) -> None:
    bridge = cluster.lab.lab.bridge
    started = time.monotonic()
    kube.apply(cluster.lab.lab, json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        tenant_network("rail-1", ["team-a", "acme"], 100, "10.61.0.0/24", bridge),
        tenant_network("rail-2", ["team-b"], "auto", "10.62.0.0/24", bridge)]}))
    want = {("team-a", "rail-1"), ("acme-ml", "rail-1"), ("team-b", "rail-2")}
    assert poll(lambda: set(cluster.nads()) == want, 60, 0.1), f"{set(cluster.nads())}\n{_renderer_log(cluster)}"
    print(f"\nNADs rendered {time.monotonic() - started:.2f} s after the TenantNetworks were applied")
    nad = cluster.nads()[("team-a", "rail-1")]
    assert nad["metadata"]["finalizers"] == ["tenantnet.io/rendered-nad"]
    [owner] = nad["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TenantNetwork", "rail-1", True)
    config = json.loads(nad["spec"]["config"])
    assert (config["type"], config["tenantNetwork"], config["vlan"], config["bridge"]) == \
        ("tenantnet", "rail-1", 100, bridge)
    assert poll(lambda: cluster.status("rail-2").get("vlan") == 3000, 30, 0.1), cluster.status("rail-2")
    assert json.loads(cluster.nads()[("team-b", "rail-2")]["spec"]["config"])["vlan"] == 3000
    s = cluster.status("rail-1")
    assert s["renderedNamespaces"] == ["acme-ml", "team-a"] and s["conditions"][0]["status"] == "True"


def test_a_label_change_re_renders(cluster: Cluster) -> None:
    started = time.monotonic()
    cluster.kubectl("label", "namespace", "stray", "tenantnet.io/tenant=team-a")
    assert poll(lambda: ("stray", "rail-1") in cluster.nads(), 30, 0.05), _renderer_log(cluster)
    print(f"\nNAD rendered {time.monotonic() - started:.2f} s after the namespace's label changed")
    # Sources that disagree: no tenant, the NAD goes, the status names the conflict.
    cluster.kubectl("label", "namespace", "stray", "capsule.clastix.io/tenant=team-b")
    assert poll(lambda: ("stray", "rail-1") not in cluster.nads(), 30, 0.05), _renderer_log(cluster)
    assert poll(lambda: any("namespace stray: the tenant sources disagree" in c
                            for c in cluster.status("rail-1").get("conflicts", [])), 30, 0.1)


def test_a_tenants_edit_is_undone_and_counted(cluster: Cluster) -> None:
    nad = cluster.nads()[("team-a", "rail-1")]
    config = json.loads(nad["spec"]["config"])
    config.update(vlan=200, bridge="br-other")
    cluster.kubectl("patch", "network-attachment-definition", "rail-1", "-n", "team-a", "--type=merge",
                    "-p", json.dumps({"spec": {"config": json.dumps(config)}}))
    assert poll(lambda: json.loads(cluster.nads()[("team-a", "rail-1")]["spec"]["config"])["vlan"] == 100, 30,
                0.05), _renderer_log(cluster)
    assert poll(lambda: cluster.status("rail-1").get("restoredEdits", 0) >= 1, 30, 0.1)
    assert "render.restored" in _renderer_log(cluster)


def test_controller_and_schema_refusals(cluster: Cluster) -> None:
    bridge = cluster.lab.lab.bridge
    # One VLAN of one bridge for another tenant: refused in the status, nothing rendered.
    kube.apply(cluster.lab.lab, json.dumps(tenant_network("rail-3", ["team-b"], 100, "10.63.0.0/24", bridge)))
    assert poll(lambda: (cluster.status("rail-3").get("conditions") or [{}])[0].get("reason") == "Conflict", 30, 0.1)
    assert "VLAN 100 of bridge" in cluster.status("rail-3")["lastError"]
    assert not any(name == "rail-3" for _, name in cluster.nads())
    cluster.kubectl("delete", "tenantnetwork", "rail-3")
    # The API server itself refuses what the schema forbids.
    bad = tenant_network("rail-4", ["team-a"], 5000, "10.64.0.0/24", bridge)
    with pytest.raises(kube.KubeError) as info:
        kube.apply(cluster.lab.lab, json.dumps(bad))
    assert "vlan must be a VLAN id from 1 to 4094" in str(info.value)


def test_the_agent_publishes_its_pfs_and_an_unknown_pf_is_refused(cluster: Cluster) -> None:
    """The agent (under the packaged RBAC) publishes the PFs its node's sysfs shows on its Node;
    a TenantNetwork naming a PF that no node publishes is refused: UnknownPF, no NAD."""
    from tenantnet.kube.watch import discover_pfs
    from tenantnet.plugin import nodeconfig

    lab = cluster.lab.lab
    want = json.dumps(discover_pfs(nodeconfig.load(lab.node_config).sysfs_root), separators=(",", ":"))

    def published() -> Any:
        return ((cluster.get("node", lab.node_name) or {}).get("metadata", {}).get("annotations") or {}).get(
            "tenantnet.io/pfs")
    assert poll(lambda: published() == want, 60, 0.2), \
        f"{published()!r} != {want!r}\n{(Path(lab.root) / 'agent.out').read_text()[-2000:]}"
    sriov = {"apiVersion": "tenantnet.io/v1alpha1", "kind": "TenantNetwork", "metadata": {"name": "rail-9"},
             "spec": {"tenants": ["team-b"], "fabric": {"mode": "sriov", "pfs": ["tnx9f9"],
                                                      "resourceName": "example.com/rail9"},
                      "vlan": 900, "ipam": {"ranges": [[{"subnet": "10.69.0.0/24"}]]}}}
    kube.apply(lab, json.dumps(sriov))
    try:
        assert poll(lambda: (cluster.status("rail-9").get("conditions") or [{}])[0].get("reason") == "UnknownPF",
                    30, 0.1), f"{cluster.status('rail-9')}\n{_renderer_log(cluster)}"
        s = cluster.status("rail-9")
        assert s["conditions"][0]["status"] == "False" and s["renderedNamespaces"] == []
        assert f"PF tnx9f9 is on none of the nodes its fabric selects: {lab.node_name}" in s["lastError"], s
        assert not any(name == "rail-9" for _, name in cluster.nads())
    finally:
        cluster.kubectl("delete", "tenantnetwork", "rail-9")


def test_the_node_enforces_the_tenant_network(cluster: Cluster) -> None:
    state = Path(cluster.lab.lab.ovs_root) / "state"
    assert poll(lambda: kubecache.read_sync(str(state)) is not None, 60, 0.2), \
        (Path(cluster.lab.lab.root) / "agent.out").read_text()[-2000:]
    # The tenant's NAD text asks for another VLAN: the pod gets the TenantNetwork's.
    cluster.kubectl("patch", "tenantnetwork", "rail-1", "--type=merge", "-p", '{"spec": {"mtu": 1400}}')
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a1", "namespace": "team-a",
                                                          "annotations": {"k8s.v1.cni.cncf.io/networks": "rail-1"}},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
               "name": "main", "image": kubeimages.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
               "command": ["sleep", "3600"]}]}}
    hand = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "mine", "namespace": "team-b"},
            "spec": {"config": json.dumps({"cniVersion": "1.0.0", "name": "mine", "type": "tenantnet",
                                           "bridge": cluster.lab.lab.bridge, "vlan": 100})}}
    b1 = {**pod, "metadata": {"name": "b1", "namespace": "team-b",
                              "annotations": {"k8s.v1.cni.cncf.io/networks": "mine"}}}
    # A namespace's default ServiceAccount comes from the controller-manager, shortly after it.
    assert poll(lambda: cluster.get("serviceaccount", "default", "-n", "team-a") is not None and
                cluster.get("serviceaccount", "default", "-n", "team-b") is not None, 60, 0.2)
    kube.apply(cluster.lab.lab, json.dumps({"apiVersion": "v1", "kind": "List", "items": [hand, pod, b1]}))
    try:
        cluster.kubectl("wait", "--for=condition=Ready", "pod/a1", "-n", "team-a", "--timeout=180s", timeout=200)
        seen = cluster.kubectl("exec", "-n", "team-a", "a1", "--", "ip", "-o", "link", "show", "net1")
        assert "mtu 1400" in seen, seen
        out = subprocess.run([CTL, "--node-config", cluster.lab.lab.node_config, "ls", "--json"],
                             capture_output=True, text=True, check=True).stdout
        [record] = [r for r in json.loads(out) if r["pod"] == "team-a/a1"]
        assert record["vlan"] == 100, record

        def refused() -> str:
            events = cluster.get("events", "-n", "team-b", "--field-selector", "involvedObject.name=b1")
            return " ".join(e.get("message", "") for e in (events or {"items": []})["items"])
        assert poll(lambda: "names no tenantNetwork" in refused(), 120, 0.3), refused()
    finally:
        cluster.kubectl("delete", "pod", "-n", "team-a", "a1", "--wait=true", "--timeout=120s", timeout=150)
        cluster.kubectl("delete", "pod", "-n", "team-b", "b1", "--wait=true", "--timeout=120s", timeout=150)


def _pod(namespace: str, name: str, network: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {"k8s.v1.cni.cncf.io/networks": network}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": kubeimages.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"]}]}}


def test_an_agent_restart_changes_nothing_for_running_pods(cluster: Cluster) -> None:
    """Two pods on rail-1; the agent stopped (SIGTERM, by pid) and started again: the pods keep
    net1 and reach each other, their records and OVS ports are the same (same port rows), and a
    new pod's ADD is served by the new agent."""
    from tenantnet.lab import node as labnode

    lab = cluster.lab.lab
    env = {**os.environ, "TENANTNET_CONFIG": lab.node_config}

    def records() -> dict[str, dict[str, Any]]:
        out = subprocess.run([CTL, "ls", "--json"], capture_output=True, text=True, check=True, env=env,
                             timeout=60).stdout
        return {r["pod"]: r for r in json.loads(out) if r.get("pod", "").startswith("team-a/r")}

    def ports() -> str:
        return labnode.vsctl(lab.ovs_root, "--bare", "--columns=_uuid,name,tag", "find", "Port",
                             "external_ids:tenantnet-owner=tenantnet")

    def agent() -> dict[str, Any]:
        proc = subprocess.run([CTL, "agent", "status", "--json"], capture_output=True, text=True, timeout=60,
                              env=env, check=False)
        return dict(json.loads(proc.stdout)) if proc.returncode == 0 else {}

    def ip(pod: str) -> str:
        return records()[f"team-a/{pod}"]["ips"][0].split("/")[0]

    def reaches(src: str, dst: str) -> bool:
        try:
            cluster.kubectl("exec", "-n", "team-a", src, "--", "ping", "-c", "2", "-W", "2", ip(dst), timeout=60)
        except kube.KubeError:
            return False
        return True

    kube.apply(lab, json.dumps({"apiVersion": "v1", "kind": "List",
                                "items": [_pod("team-a", n, "rail-1") for n in ("r1", "r2")]}))
    try:
        for n in ("r1", "r2"):
            cluster.kubectl("wait", "--for=condition=Ready", f"pod/{n}", "-n", "team-a", "--timeout=180s",
                            timeout=200)
        assert reaches("r1", "r2")
        before, ports_before = records(), ports()
        assert sorted(before) == ["team-a/r1", "team-a/r2"] and all(r["vlan"] == 100 for r in before.values())
        old = cluster.procs[0]
        old.send_signal(signal.SIGTERM)
        old.wait(timeout=30)
        cluster.procs[0] = cluster.start("--node-config", lab.node_config, "agent", "run", log="agent-2.out")
        assert poll(lambda: (agent().get("kubernetes") or {}).get("synced"), 60, 0.2), \
            (Path(lab.root) / "agent-2.out").read_text()[-2000:]
        assert agent()["pid"] == cluster.procs[0].pid
        served = agent()["served"]
        assert records() == before and ports() == ports_before
        for n in ("r1", "r2"):
            seen = cluster.kubectl("exec", "-n", "team-a", n, "--", "ip", "-o", "-4", "addr", "show", "net1")
            assert ip(n) in seen, seen
        assert all(at_once(lambda: reaches("r1", "r2"), lambda: reaches("r2", "r1")))  # each waits its pings out
        kube.apply(lab, json.dumps(_pod("team-a", "r3", "rail-1")))
        cluster.kubectl("wait", "--for=condition=Ready", "pod/r3", "-n", "team-a", "--timeout=180s", timeout=200)
        assert agent()["served"] >= served + 1, agent()
        assert records()["team-a/r3"]["vlan"] == 100 and reaches("r3", "r1")
        assert {k: v for k, v in records().items() if k != "team-a/r3"} == before
    finally:
        cluster.kubectl("delete", "pod", "-n", "team-a", "r1", "r2", "r3", "--ignore-not-found", "--wait=true",
                        "--timeout=120s", timeout=150)


def test_a_network_for_100_namespaces(cluster: Cluster) -> None:
    """A figure (docs/kubernetes.md), not a threshold: a TenantNetwork for a tenant of 100
    namespaces, rendered; then the agent's memory with them all watched."""
    names = [f"bulk-{i:03d}" for i in range(100)]
    kube.apply(cluster.lab.lab, json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": {"tenantnet.io/tenant": "bulk"}}}
        for n in names]}))
    started = time.monotonic()
    kube.apply(cluster.lab.lab, json.dumps(tenant_network("bulk", ["bulk"], 900, "10.65.0.0/24",
                                                          cluster.lab.lab.bridge)))
    assert poll(lambda: sum(1 for ns, n in cluster.nads() if n == "bulk") == 100, 120, 0.1), _renderer_log(cluster)
    took = time.monotonic() - started  # kubectl's own polling included
    events = [json.loads(line) for line in (Path(cluster.lab.lab.root) / "renderer.out").read_text().splitlines()
              if line.startswith("{")]
    rounds = [e["ms"] for e in events if e.get("event") == "render.reconciled" and e.get("created") == 100]
    print(f"\nNADs rendered into 100 namespaces {took:.2f} s after the TenantNetwork was applied "
          f"(the renderer's reconcile: {rounds[-1] if rounds else '?'} ms)")
    state = Path(cluster.lab.lab.ovs_root) / "state"
    assert poll(lambda: all(kubecache.read_object(str(state), "namespaces", n) for n in names[-3:]), 60, 0.2)
    agent = cluster.procs[0].pid
    rss = [line for line in Path(f"/proc/{agent}/status").read_text().splitlines() if line.startswith("VmRSS")]
    print(f"agent memory with {len(names) + len(NAMESPACES)} namespaces watched: {rss[0].split(':')[1].strip()}")
    cluster.kubectl("delete", "tenantnetwork", "bulk")
    assert poll(lambda: not any(n == "bulk" for _, n in cluster.nads()), 120, 0.2), _renderer_log(cluster)
    cluster.kubectl("delete", "namespace", *names, "--wait=false")


def test_with_the_api_server_stopped_the_node_serves_from_its_cache(cluster: Cluster) -> None:
    """The API server frozen (SIGSTOP to the lab's own kube-apiserver, by its pid): an ADD on
    the node — the exec'd plugin, through the agent, as Multus would call it — still gets
    rail-1's settings from the cache; a namespace the cache never saw fails closed."""
    import uuid

    lab = cluster.lab.lab
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_PATH": f"{Path(sys.executable).parent}:/usr/lib/cni",
           "TENANTNET_CONFIG": lab.node_config, "CNI_IFNAME": "net1"}
    conf = json.dumps({"cniVersion": "1.0.0", "name": "rail-1", "type": "tenantnet", "tenantNetwork": "rail-1",
                       "vlan": 200})
    plugin = str(Path(sys.executable).parent / "tenantnet")
    netns = f"tnk-{uuid.uuid4().hex[:8]}"
    cid = uuid.uuid4().hex
    subprocess.run(["ip", "netns", "add", netns], check=True)
    apiserver = lab.pids["kube-apiserver"]
    os.kill(apiserver, signal.SIGSTOP)
    try:
        def call(command: str, namespace: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([plugin], input=conf, capture_output=True, text=True, timeout=60, env={
                **env, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{netns}",
                "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=p"})
        added = call("ADD", "team-a")
        assert added.returncode == 0, added.stdout + added.stderr
        host = json.loads(added.stdout)["interfaces"][0]["name"]
        from tenantnet.lab import node as labnode

        assert labnode.vsctl(lab.ovs_root, "get", "Port", host, "tag").strip() == "100"
        assert call("DEL", "team-a").returncode == 0
        unknown = call("ADD", "never-seen")
        assert json.loads(unknown.stdout)["code"] == 11 and "not yet known to this node" in unknown.stdout
    finally:
        os.kill(apiserver, signal.SIGCONT)
        subprocess.run(["ip", "netns", "delete", netns], check=False)


def test_one_leader_and_a_takeover(cluster: Cluster) -> None:
    """A second renderer waits while the first holds the Lease; the first stopped, the second
    takes over once the Lease expires and goes on rendering."""
    lab = cluster.lab.lab
    second = cluster.start("--node-config", lab.node_config, "renderer", "run",
                           "--kubeconfig", kube.service_account_kubeconfig(cluster.lab.lab, "tenantnet-renderer", cluster.lab.lab.root),
                           "--auto-vlans", "3000-3009", "--identity", "e2e-2", log="renderer-2.out")
    second_log = Path(lab.root) / "renderer-2.out"

    def holder() -> str:
        lease = cluster.get("lease", "tenantnet-renderer", "-n", "kube-system") or {}
        return str((lease.get("spec") or {}).get("holderIdentity"))
    # Its first round found the Lease held: it says it follows, and the Lease stays the first's.
    assert poll(lambda: second_log.exists() and "render.follower" in second_log.read_text(), 60, 0.2)
    assert holder() == "e2e" and "render.leader" not in second_log.read_text()
    first = cluster.procs[1]
    first.send_signal(signal.SIGTERM)  # a clean stop gives the Lease up
    first.wait(timeout=30)
    assert "render.released" in _renderer_log(cluster)
    started = time.monotonic()
    assert poll(lambda: holder() == "e2e-2", 60, 0.5), second_log.read_text()[-2000:]
    print(f"\nthe second renderer led {time.monotonic() - started:.1f} s after the first stopped")
    cluster.kubectl("label", "namespace", "team-b", "tenantnet.io/tenant=team-b", "--overwrite")
    assert poll(lambda: "render.leader" in second_log.read_text(), 30, 0.2)
    assert second.poll() is None


def test_a_deleted_tenant_network_removes_its_nads(cluster: Cluster) -> None:
    cluster.kubectl("delete", "tenantnetwork", "rail-2", "--wait=false")
    assert poll(lambda: ("team-b", "rail-2") not in cluster.nads(), 60, 0.1), _renderer_log(cluster)
    assert poll(lambda: cluster.get("tenantnetwork", "rail-2") is None, 60, 0.2)
    assert os.path.exists(cluster.lab.lab.kubeconfig)
