"""The DRA driver (tenantnet/kube/dra.py) on the lab's simulated SR-IOV NIC, without Kubernetes:
the claims come from a file (as the API would give them), the TenantNetwork cache is written
by hand (as the agent's watcher would), and each "agent" is a child process
(tests/integration/dra_child.py) so that a crash point can SIGKILL it.

- prepare is idempotent and writes a record and a CDI spec; the pod's start moves every
  device of its claims into its namespace with the network's VLAN and an address from
  tenantnet-ipam; traffic flows between two claims' pods on the rail; the addresses reach
  the claim's status; stop and unprepare leave the node as it was;
- each request on its own TenantNetwork; the VF's RDMA device in the pod and back (rdma:
  exclusive); mode ovs-offload: the representor on the bridge with the network's VLAN;
- a namespace the TenantNetwork does not grant is refused with the reason, and nothing is
  written; a CNI ADD (Multus) for another pod naming a claimed VF is refused (code 120);
- the agent SIGKILLed at every `dra.*` step (the list comes from the code) and the kubelet's
  and containerd's retries run by a new agent: nothing is left;
- the pod deleted while the agent is down: the next agent's NRI synchronize and the
  kubelet's unprepare leave nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import node as labmod
from tenantnet.lab.nic import LabNic, LabVfControl
from tenantnet.plugin import draclaims, kubecache
from tenantnet.plugin.tenants import TENANT_LABEL
from tests.integration import nodestate
from tests.integration.conftest import Lab, Netns, new_cid
from tests.integration.test_faults import dra_steps

NODE = "lab-node"
NETWORK = "rail-dra"
NETWORK2 = "rail-dra2"
NETWORK_RDMA = "rail-rdma"
VLAN = 310


@dataclass
class DraLab:
    lab: Lab
    node_config: Path
    claims: Path
    cdi: Path
    pf: str
    vfs: list[str]

    def claim(self, name: str, namespace: str, vfs: list[str], pod_uid: str, *, attach: str = "nri",
              network: str = NETWORK, requests: list[str] | None = None,
              per_request: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> dict[str, str]:
        uid = str(uuid.uuid4())
        requests = requests or [f"rail{i}" for i in range(len(vfs))]
        params: dict[str, Any] = {"network": network, "attach": attach, **(extra or {})}
        config = [{"source": "FromClaim", "opaque": {"driver": "tenantnet.io", "parameters": params}}]
        for request, net in (per_request or {}).items():
            config.append({"source": "FromClaim", "requests": [request],
                           "opaque": {"driver": "tenantnet.io", "parameters": {"network": net}}})
        obj = {"metadata": {"name": name, "namespace": namespace, "uid": uid}, "status": {
            "allocation": {"devices": {
                "results": [{"request": r, "driver": "tenantnet.io", "pool": NODE,
                             "device": draclaims.device_name(vf)} for r, vf in zip(requests, vfs, strict=True)],
                "config": config}},
            "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": pod_uid}]}}
        claims = json.loads(self.claims.read_text()) if self.claims.exists() else {}
        claims[f"{namespace}/{name}"] = obj
        self.claims.write_text(json.dumps(claims))
        return {"namespace": namespace, "name": name, "uid": uid}

    def run(self, *ops: list[Any], fault: str = "") -> tuple[int, list[dict[str, Any]]]:
        spec = self.claims.parent / f"spec-{uuid.uuid4().hex[:8]}.json"
        spec.write_text(json.dumps({"nodeConfig": str(self.node_config), "nodeName": NODE,
                                    "claims": str(self.claims), "ops": list(ops)}))
        env = {**os.environ, "TENANTNET_CONFIG": str(self.node_config)}
        env.pop("TENANTNET_TEST_FAULT", None)
        if fault:
            env["TENANTNET_TEST_FAULT"] = fault
        proc = subprocess.run([sys.executable, "-m", "tests.integration.dra_child", str(spec)], env=env,
                              capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
        spec.unlink()
        if proc.returncode not in (0, -9):
            raise AssertionError(f"dra_child exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    def left(self) -> list[str]:
        """What the DRA driver itself keeps: claim records, locks, CDI specs."""
        dra = self.lab.state_dir / "dra"
        return sorted(str(p) for p in [*dra.rglob("*.json*"), *self.cdi.glob("*")] if p.is_file())


@pytest.fixture(scope="module")
def dra_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraLab]:
    root = tmp_path_factory.mktemp("dralab")
    info = labmod.up(str(root / "run"), vfs=4)
    try:
        lab = Lab(root=Path(info.root), node_config=Path(info.node_config), state_dir=Path(info.state_dir),
                  ovsdb=info.ovsdb, bridge=info.bridge, hostlocal_dir=Path(info.root) / "host-local")
        [card] = LabNic(info.root).describe()
        cache = kubecache.CacheWriter(str(lab.state_dir))
        cache.put("tenantnetworks", NETWORK, {"metadata": {"name": NETWORK, "uid": "u-dra"}, "spec": {
            "tenants": ["team-a"], "fabric": {"mode": "sriov", "pfs": [card["pf"]]}, "vlan": VLAN, "rdma": "off",
            "ipam": {"ranges": [[{"subnet": "10.83.0.0/24"}]]}}})
        cache.put("tenantnetworks", NETWORK2, {"metadata": {"name": NETWORK2, "uid": "u-dra2"}, "spec": {
            "tenants": ["team-a"], "fabric": {"mode": "sriov", "pfs": [card["pf"]]}, "vlan": VLAN + 1,
            "rdma": "off", "ipam": {"ranges": [[{"subnet": "10.84.0.0/24"}]]}}})
        cache.put("tenantnetworks", NETWORK_RDMA, {"metadata": {"name": NETWORK_RDMA, "uid": "u-dra3"}, "spec": {
            "tenants": ["team-a"], "fabric": {"mode": "sriov", "pfs": [card["pf"]]}, "vlan": VLAN + 2,
            "rdma": "exclusive", "ipam": {"ranges": [[{"subnet": "10.85.0.0/24"}]]}}})
        for ns in ("team-a", "team-b"):
            cache.put("namespaces", ns, kubecache.namespace_doc(ns, {TENANT_LABEL: ns}))
        cache.mark_synced(1.0, NODE, {})
        cdi = root / "cdi"
        node = root / "node.yaml"
        node.write_text(lab.node_config.read_text() + f"kubernetes: true\ndra: true\ncdiDir: {cdi}\n"
                        f"nodeName: {NODE}\n")
        yield DraLab(lab, node, root / "claims.json", cdi, card["pf"], [v["address"] for v in card["vfs"]])
    finally:
        labmod.down(info.root)


def _pod(ns: Netns, name: str, namespace: str = "team-a", uid: str = "") -> dict[str, str]:
    return {"id": new_cid(), "uid": uid or str(uuid.uuid4()), "name": name, "namespace": namespace,
            "netns": ns.path}


def _ok(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["ok"], r
        if r["op"] == "prepare":
            assert r["result"]["error"] == "", r
        if r["op"] == "unprepare":
            assert r["result"] == "", r


def test_prepare_attach_traffic_and_a_clean_unprepare(dra_lab: DraLab, netns_factory: Any) -> None:
    before = nodestate.snapshot(dra_lab.lab)
    ns1, ns2 = netns_factory(), netns_factory()
    p1, p2 = _pod(ns1, "pod-a"), _pod(ns2, "pod-b")
    a = dra_lab.claim("a", "team-a", dra_lab.vfs[:2], p1["uid"])
    b = dra_lab.claim("b", "team-a", dra_lab.vfs[2:3], p2["uid"])
    code, got = dra_lab.run(["prepare", a], ["prepare", a], ["prepare", b])
    assert code == 0
    _ok(got)
    first, again = got[0]["result"]["devices"], got[1]["result"]["devices"]
    assert first == again  # the kubelet's retry gets the same answer
    assert [d["cdi"] for d in first] == [[f"tenantnet.io/vf=claim-{a['uid']}-{draclaims.device_name(v)}"]
                                         for v in dra_lab.vfs[:2]]
    spec = json.loads((dra_lab.cdi / f"tenantnet.io-claim_{a['uid']}.json").read_text())
    assert spec["kind"] == "tenantnet.io/vf" and len(spec["devices"]) == 2
    # Nothing moved yet: the VFs are still on the host until the pod's sandbox runs.
    assert ns1.run("ip", "-o", "link").stdout.count("rail") == 0
    code, got = dra_lab.run(["run", p1], ["run", p2])
    _ok(got)
    links = ns1.run("ip", "-o", "addr", "show").stdout
    assert "rail0" in links and "rail1" in links and "10.83.0." in links, links
    control = LabVfControl(str(dra_lab.lab.root))
    [card] = LabNic(str(dra_lab.lab.root)).describe()
    for vf in card["vfs"][:3]:
        assert control.read(dra_lab.pf, vf["index"]).to_dict()["vlan"] == VLAN
    peer = ns2.run("ip", "-o", "-4", "addr", "show", "dev", "rail0").stdout.split()[3].split("/")[0]
    assert ns1.run("ping", "-c", "2", "-i", "0.2", "-W", "2", "-I", "rail0", peer).returncode == 0
    status = json.loads(Path(str(dra_lab.claims) + ".status.json").read_text())
    assert {e["device"] for e in status["team-a/a"]} == {draclaims.device_name(v) for v in dra_lab.vfs[:2]}
    assert all(e["networkData"]["ips"][0].startswith("10.83.0.") for e in status["team-a/a"])
    # Running the sandbox again (containerd retrying) changes nothing.
    _ok(dra_lab.run(["run", p1])[1])
    code, got = dra_lab.run(["stop", p1], ["remove", p1], ["unprepare", a], ["unprepare", a],
                            ["stop", p2], ["unprepare", b])
    _ok(got)
    assert dra_lab.left() == []
    assert nodestate.diff(before, nodestate.snapshot(dra_lab.lab)) == ""


def test_each_request_its_own_network(dra_lab: DraLab, netns_factory: Any) -> None:
    """One claim, two rails on two TenantNetworks (a config naming its request): each VF gets
    its network's VLAN and subnet."""
    before = nodestate.snapshot(dra_lab.lab)
    ns = netns_factory()
    pod = _pod(ns, "two")
    c = dra_lab.claim("two", "team-a", dra_lab.vfs[:2], pod["uid"], per_request={"rail1": NETWORK2})
    _ok(dra_lab.run(["prepare", c], ["run", pod])[1])
    control = LabVfControl(str(dra_lab.lab.root))
    [card] = LabNic(str(dra_lab.lab.root)).describe()
    assert [control.read(dra_lab.pf, vf["index"]).to_dict()["vlan"] for vf in card["vfs"][:2]] == [VLAN, VLAN + 1]
    addrs = ns.run("ip", "-o", "-4", "addr", "show").stdout
    assert "10.83.0." in addrs and "10.84.0." in addrs, addrs
    _ok(dra_lab.run(["stop", pod], ["unprepare", c])[1])
    assert dra_lab.left() == []
    assert nodestate.diff(before, nodestate.snapshot(dra_lab.lab)) == ""


def test_the_vfs_rdma_device_follows_it_into_the_pod_and_back(dra_lab: DraLab, netns_factory: Any) -> None:
    """On an rdma: exclusive network the VF's (simulated) RDMA device is in the pod's namespace
    while the sandbox runs, and on the host again after its stop."""
    from tenantnet.lab.rdma import LabRdmaControl
    from tenantnet.plugin.system.rdmacontrol import netns_identity

    rdma = LabRdmaControl(str(dra_lab.lab.root))
    rdma.set_netns_mode("exclusive")
    device = {d["pciAddress"]: d["device"] for d in rdma.describe()}[dra_lab.vfs[0]]

    def holder() -> str | None:
        return {d["device"]: d["netns"] for d in rdma.describe()}[device]
    before = nodestate.snapshot(dra_lab.lab)
    ns = netns_factory()
    pod = _pod(ns, "rdma")
    c = dra_lab.claim("rdma", "team-a", dra_lab.vfs[:1], pod["uid"], network=NETWORK_RDMA)
    _ok(dra_lab.run(["prepare", c], ["run", pod])[1])
    assert holder() == str(netns_identity(ns.path))
    _ok(dra_lab.run(["stop", pod])[1])
    assert holder() is None
    _ok(dra_lab.run(["unprepare", c])[1])
    assert dra_lab.left() == []
    assert nodestate.diff(before, nodestate.snapshot(dra_lab.lab)) == ""


def test_a_foreign_tenant_is_refused_and_nothing_is_written(dra_lab: DraLab, netns_factory: Any) -> None:
    ns = netns_factory()
    pod = _pod(ns, "intruder", namespace="team-b")
    c = dra_lab.claim("x", "team-b", dra_lab.vfs[:1], pod["uid"])
    _, [got] = dra_lab.run(["prepare", c])
    err = got["result"]["error"]
    assert "tenant isolation" in err and "team-b" in err and NETWORK in err, err
    assert dra_lab.left() == []
    unknown = dra_lab.claim("y", "team-a", dra_lab.vfs[:1], pod["uid"], network="nope")
    _, [got] = dra_lab.run(["prepare", unknown])
    assert "no TenantNetwork nope" in got["result"]["error"]
    assert dra_lab.left() == []


@pytest.mark.parametrize(("extra", "words"), [
    ({"bogus": 1}, "unknown tenantnet.io config parameter 'bogus'"),
    ({"attach": "sideways"}, "parameters.attach=['sideways']"),
    ({"interfaceNames": {"rail0": "no such name!"}}, "parameters.interfaceNames="),
    ({"network": "Not_A_Label"}, "names no TenantNetwork"),
])
def test_a_claims_parameters_are_checked_at_the_edge(dra_lab: DraLab, netns_factory: Any,
                                                      extra: dict[str, Any], words: str) -> None:
    """The opaque parameters are the tenant's (a claim's config): each bad one refused by name at
    prepare, before anything is written."""
    pod = _pod(netns_factory(), "bad")
    c = dra_lab.claim("bad", "team-a", dra_lab.vfs[:1], pod["uid"], extra=extra)
    _, [got] = dra_lab.run(["prepare", c])
    assert words in got["result"]["error"], got
    assert dra_lab.left() == []


def test_a_claimed_vf_is_refused_to_any_other_pod(dra_lab: DraLab, netns_factory: Any) -> None:
    """The CNI path (Multus) cannot take a claim's VF, by PCI address or by CDI name, for a pod
    other than the claim's; the claim's own pod gets it through Multus with attach: cni."""
    before = nodestate.snapshot(dra_lab.lab)
    ns, other = netns_factory(), netns_factory()
    pod = _pod(ns, "owner")
    c = dra_lab.claim("m", "team-a", dra_lab.vfs[:1], pod["uid"], attach="cni")
    _ok(dra_lab.run(["prepare", c])[1])
    cdi_name = f"claim-{c['uid']}-{draclaims.device_name(dra_lab.vfs[0])}"
    plugin = str(Path(sys.executable).parent / "tenantnet")

    def add(netns: Netns, device: str, pod_uid: str, cid: str) -> dict[str, Any]:
        conf = {"cniVersion": "1.0.0", "name": NETWORK, "type": "tenantnet", "tenantNetwork": NETWORK,
                "deviceID": device}
        env = {**os.environ, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": netns.path,
               "CNI_IFNAME": "net1", "CNI_PATH": str(Path(sys.executable).parent),
               "TENANTNET_CONFIG": str(dra_lab.node_config),
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=p;K8S_POD_UID={pod_uid}"}
        proc = subprocess.run([plugin], input=json.dumps(conf), env=env, capture_output=True, text=True,
                              timeout=60)
        out: dict[str, Any] = json.loads(proc.stdout)
        return out

    for device in (dra_lab.vfs[0], cdi_name):
        out = add(other, device, str(uuid.uuid4()), new_cid())
        assert out.get("code") == 120, out
    cid = new_cid()
    out = add(ns, cdi_name, pod["uid"], cid)
    assert out.get("ips"), out
    env = {**os.environ, "CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": ns.path, "CNI_IFNAME": "net1",
           "CNI_PATH": str(Path(sys.executable).parent), "TENANTNET_CONFIG": str(dra_lab.node_config),
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=p;K8S_POD_UID={pod['uid']}"}
    conf = {"cniVersion": "1.0.0", "name": NETWORK, "type": "tenantnet", "tenantNetwork": NETWORK,
            "deviceID": cdi_name}
    assert subprocess.run([plugin], input=json.dumps(conf), env=env, capture_output=True, text=True,
                          timeout=60).returncode == 0
    _ok(dra_lab.run(["unprepare", c])[1])
    assert dra_lab.left() == []
    assert nodestate.diff(before, nodestate.snapshot(dra_lab.lab)) == ""


STEPS = dra_steps()


def test_the_sweep_knows_the_drivers_steps() -> None:
    assert {"dra.prepare.recorded", "dra.attach.added", "dra.unprepare.detached"} <= set(STEPS), STEPS


@pytest.mark.parametrize("step", STEPS)
def test_agent_killed_at_each_step_leaves_nothing(dra_lab: DraLab, netns_factory: Any, step: str) -> None:
    """The whole life of a 2-device claim in one agent killed at `step`; then a new agent gets
    what the kubelet and containerd would send again (prepare, the sandbox's run, its stop,
    unprepare): the node is as before, the claim's VFs were in the pod in between."""
    before = nodestate.snapshot(dra_lab.lab)
    ns = netns_factory()
    pod = _pod(ns, "k")
    c = dra_lab.claim(f"k{STEPS.index(step)}", "team-a", dra_lab.vfs[:2], pod["uid"])
    life = [["prepare", c], ["run", pod], ["stop", pod], ["unprepare", c]]
    code, _ = dra_lab.run(*life, fault=step)
    assert code == -9, f"the agent was not killed at {step}"
    code, got = dra_lab.run(["prepare", c], ["run", pod])
    _ok(got)
    assert "rail1" in ns.run("ip", "-o", "link").stdout
    code, got = dra_lab.run(["stop", pod], ["unprepare", c])
    _ok(got)
    assert dra_lab.left() == []
    assert nodestate.diff(before, nodestate.snapshot(dra_lab.lab)) == "", step


def test_pod_deleted_while_the_agent_is_down(dra_lab: DraLab, netns_factory: Any) -> None:
    before = nodestate.snapshot(dra_lab.lab)
    ns = netns_factory()
    pod = _pod(ns, "gone")
    c = dra_lab.claim("gone", "team-a", dra_lab.vfs[:2], pod["uid"])
    _ok(dra_lab.run(["prepare", c], ["run", pod])[1])
    ns.delete()  # the pod went while no agent ran: no stop, no remove
    code, got = dra_lab.run(["sync", []], ["unprepare", c])
    _ok(got)
    assert dra_lab.left() == []
    assert nodestate.diff(before, nodestate.snapshot(dra_lab.lab)) == ""


def test_an_offload_claim_puts_the_representor_on_the_bridge(switchdev_lab: Lab, netns_factory: Any,
                                                            tmp_path: Path) -> None:
    """Mode ovs-offload through DRA (the lab's simulated switchdev NIC): the pod gets the VF,
    its representor is an OVS port of ours with the network's VLAN while the sandbox runs, and
    everything is gone after stop and unprepare."""
    [card] = LabNic(str(switchdev_lab.root)).describe()
    cache = kubecache.CacheWriter(str(switchdev_lab.state_dir))
    cache.put("tenantnetworks", "rail-off", {"metadata": {"name": "rail-off", "uid": "u-off"}, "spec": {
        "tenants": ["team-a"], "fabric": {"mode": "ovs-offload", "bridge": switchdev_lab.bridge, "pfs": [card["pf"]]},
        "vlan": 320, "rdma": "off", "ipam": {"ranges": [[{"subnet": "10.86.0.0/24"}]]}}})
    cache.put("namespaces", "team-a", kubecache.namespace_doc("team-a", {TENANT_LABEL: "team-a"}))
    cache.mark_synced(1.0, NODE, {})
    node = tmp_path / "node.yaml"
    node.write_text(switchdev_lab.node_config.read_text() + f"kubernetes: true\ndra: true\ncdiDir: {tmp_path / 'cdi'}\n"
                    f"nodeName: {NODE}\n")
    d = DraLab(switchdev_lab, node, tmp_path / "claims.json", tmp_path / "cdi", card["pf"],
               [v["address"] for v in card["vfs"]])
    try:
        before = nodestate.snapshot(switchdev_lab)
        ns = netns_factory()
        pod = _pod(ns, "off")
        c = d.claim("off", "team-a", d.vfs[:1], pod["uid"], network="rail-off")
        _ok(d.run(["prepare", c], ["run", pod])[1])
        assert "rail0" in ns.run("ip", "-o", "link").stdout
        [rep] = [v["representor"] for v in card["vfs"] if v["address"] == d.vfs[0]]
        assert switchdev_lab.vsctl("get", "Port", rep, "tag").strip() == "320"
        assert rep in switchdev_lab.owned_ports()
        _ok(d.run(["stop", pod], ["unprepare", c])[1])
        assert d.left() == []
        assert nodestate.diff(before, nodestate.snapshot(switchdev_lab)) == ""
    finally:
        import shutil

        shutil.rmtree(kubecache.cache_dir(str(switchdev_lab.state_dir)), ignore_errors=True)
