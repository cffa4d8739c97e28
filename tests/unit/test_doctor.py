"""`tenantnetctl doctor` against a node made of fakes: a healthy one (every check PASS, so a
check that cannot pass would show), then one thing broken at a time — each breaks exactly
its check, which FAILs (or WARNs) with its fix.

The fakes are real servers on real sockets in tmp_path: an OVSDB answering list_dbs and
selects, the agent's protocol (tenantnet.entry.shim framing), the lab's simulated kubelet
pod-resources server, an etcd JSON gateway, a Kubernetes API server (CRDs and
SelfSubjectAccessReviews); a sysfs tree from tenantnet.lab.nicsysfs; shell scripts for
Multus's and tenantnet's executables.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.entry import shim
from tenantnet.entry.agent import STATUS_OP
from tenantnet.lab import nicsysfs
from tenantnet.lab import podresources as labkubelet
from tenantnet.ops import doctor
from tenantnet.ops.doctor import Doctor, Options, Status
from tenantnet.plugin.system import vfcontrol
from tenantnet.plugin.system.vfcontrol import VfControl

BIN = Path(sys.executable).parent


# ---- fakes -----------------------------------------------------------------------------------

class Server:
    """A unix-socket server thread: accepts until closed, hands each connection to `serve`."""

    def __init__(self, path: str, serve: Any) -> None:
        self.path = path
        self.serve = serve
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.serve(conn)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


@dataclass
class FakeOvsdb:
    bridges: set[str] = field(default_factory=set)
    other_config: dict[str, str] = field(default_factory=dict)
    silent: bool = False  # accepts, never answers
    databases: tuple[str, ...] = ("Open_vSwitch",)  # what list_dbs names (OVN_Northbound for an NB)
    external_ids: dict[str, str] = field(default_factory=dict)  # the Open_vSwitch row's (ovn-controller's keys)
    datapaths: dict[str, str] = field(default_factory=dict)  # bridge -> datapath_type ("" = system)
    interfaces: dict[str, dict[str, tuple[str, int | None]]] = field(default_factory=dict)  # bridge -> {iface: (type, mtu)}

    def serve(self, conn: socket.socket) -> None:
        buf = ""
        decoder = json.JSONDecoder()
        while True:
            data = conn.recv(65536)
            if not data:
                return
            if self.silent:
                continue
            buf += data.decode()
            while buf.strip():
                try:
                    msg, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break
                buf = buf.lstrip()[end:]
                conn.sendall(json.dumps({"id": msg["id"], "error": None, "result": self.answer(msg)}).encode())

    def answer(self, msg: dict[str, Any]) -> Any:
        if msg["method"] == "list_dbs":
            return list(self.databases)
        return [{"rows": self.select(op)} for op in msg["params"][1:]]

    def select(self, op: dict[str, Any]) -> list[dict[str, Any]]:
        """A select, as OVSDB answers it (RFC 7047 notation): Bridge by name (or all), every
        Port and Interface (one port per interface: a one-element set as its bare atom), the
        Open_vSwitch row."""
        table = op["table"]
        if table == "Bridge":
            names = [w[2] for w in op["where"] if w[0] == "name"] or sorted(self.bridges)
            return [{"_uuid": ["uuid", f"b-{n}"], "name": n, "datapath_type": self.datapaths.get(n, ""),
                     "ports": ["set", [["uuid", f"p-{n}-{i}"] for i in self.interfaces.get(n, {})]]}
                    for n in names if n in self.bridges]
        if table == "Port":
            return [{"_uuid": ["uuid", f"p-{b}-{i}"], "interfaces": ["uuid", f"i-{b}-{i}"]}
                    for b, ifaces in self.interfaces.items() for i in ifaces]
        if table == "Interface":
            return [{"_uuid": ["uuid", f"i-{b}-{i}"], "name": i, "type": kind,
                     "mtu": mtu if mtu is not None else ["set", []]}
                    for b, ifaces in self.interfaces.items() for i, (kind, mtu) in ifaces.items()]
        return [{"other_config": ["map", [[k, v] for k, v in self.other_config.items()]],
                 "external_ids": ["map", [[k, v] for k, v in self.external_ids.items()]]}]


@dataclass
class FakeAgent:
    report: dict[str, Any] = field(default_factory=lambda: {
        "pid": 4242, "uptimeS": 12, "served": 3, "oldestRunningS": 0,
        "dra": {"registered": True, "registrationError": "", "nriConnected": True, "claims": []}})
    asked: list[str] = field(default_factory=list)

    def serve(self, conn: socket.socket) -> None:
        plugin, environ, _, _ = shim.decode_request(shim.recv_frame(conn))
        self.asked.append(plugin)
        # The trampoline forwards VERSION to the agent too.
        out = VERSION_JSON.encode() if environ.get(b"CNI_COMMAND") == b"VERSION" else json.dumps(self.report).encode()
        conn.sendall(shim.frame(shim.encode_response(0, out)))


class TestVfControl(VfControl):
    """Answers only the eswitch mode: the one the node config's `vfControl: doctortest:<mode>` gives."""

    __test__ = False

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def eswitch_mode(self, pf_netdev: str, pf_address: str) -> str | None:
        return None if self.mode == "unknown" else self.mode

    def read(self, *a: Any) -> Any:
        raise NotImplementedError

    set_mac = set_vlan = set_spoofchk = set_trust = set_link_state = set_rate = read


vfcontrol.register("doctortest", TestVfControl)


class HttpFake(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: Any) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        # shutdown() waits for serve_forever to look at its flag again, which it does every
        # poll_interval (0.5 s by default): two fakes per test made each teardown take a second.
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def etcd_handler() -> Any:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"version": "3.4.23"} if self.path == "/v3/maintenance/status" else {}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@dataclass
class FakeApi:
    """CRDs it has, and (user, verb, resource) it allows; `impersonation` False: 403 to any
    request asking as someone else."""

    crds: set[str] = field(default_factory=lambda: {doctor.NAD_CRD, doctor.TENANTNET_CRD})
    allowed: set[tuple[str, str, str]] = field(default_factory=set)
    impersonation: bool = True
    seen: list[dict[str, Any]] = field(default_factory=list)

    def handler(self) -> Any:
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]  # kubectl adds ?timeout=
                name = path.rsplit("/", 1)[-1]
                api.seen.append({"method": "GET", "path": path})
                if path.startswith("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/") and \
                        name in api.crds:
                    self.reply(200, {"kind": "CustomResourceDefinition", "metadata": {"name": name},
                                     "spec": {"versions": [{"name": "v1", "served": True}]},
                                     "status": {"conditions": [{"type": "Established", "status": "True"}]}})
                else:
                    self.reply(404, {"kind": "Status", "reason": "NotFound", "code": 404,
                                     "message": f'customresourcedefinitions "{name}" not found'})

            def body(self) -> bytes:
                if self.headers.get("Transfer-Encoding") != "chunked":  # kubectl streams its -f -
                    return self.rfile.read(int(self.headers.get("Content-Length", 0)))
                data = b""
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    data += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
                return data

            def do_POST(self) -> None:  # noqa: N802
                review = json.loads(self.body())
                user = self.headers.get("Impersonate-User", "admin")
                api.seen.append({"method": "POST", "path": self.path, "user": user,
                                 "groups": self.headers.get_all("Impersonate-Group") or []})
                if user != "admin" and not api.impersonation:
                    self.reply(403, {"kind": "Status", "reason": "Forbidden", "code": 403,
                                     "message": f'users "{user}" is forbidden: User "admin" cannot impersonate '
                                                'resource "users" in API group "" at the cluster scope'})
                    return
                attrs = review["spec"]["resourceAttributes"]
                resource = f"{attrs['resource']}.{attrs['group']}" if attrs["group"] else attrs["resource"]
                resource += f"/{attrs['subresource']}" if attrs.get("subresource") else ""
                resource += f" named {attrs['name']}" if attrs.get("name") else ""
                allowed = (user, attrs["verb"], resource) in api.allowed
                self.reply(201, {**review, "status": {"allowed": allowed}})

        return Handler


AGENT_SA = "system:serviceaccount:kube-system:tenantnet"
RENDERER_SA = "system:serviceaccount:kube-system:tenantnet-renderer"  # packaging/rbac.yaml's
ALL_ALLOWED = {(AGENT_SA, v, r) for v in ("list", "watch") for r in ("tenantnetworks.tenantnet.io", "namespaces")} \
    | {(AGENT_SA, "patch", "nodes")} | {(RENDERER_SA, v, "nodes") for v in ("list", "watch")} \
    | {(RENDERER_SA, "create", "network-attachment-definitions.k8s.cni.cncf.io")} \
    | {(AGENT_SA, a.verb, str(a).removeprefix(f"{a.verb} ")) for a in doctor.DRA_ACCESS}


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": server}}],
        "users": [{"name": "admin", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "admin"}}]}))
    return path


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


VERSION_JSON = '{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}'


# ---- the healthy node --------------------------------------------------------------------------

@dataclass
class Node:
    root: Path
    opts: Options
    config: dict[str, Any]
    ovsdb: FakeOvsdb
    agent: FakeAgent
    api: FakeApi
    servers: list[Any]
    nb: FakeOvsdb
    # This node's addresses as the OVN checks see them (Doctor.local_addresses is patched to
    # these: the lab's encap IPs cannot be put on a unit test's interfaces).
    addresses: dict[str, str] = field(default_factory=dict)

    def write_config(self, **changes: Any) -> None:
        """The node config with `changes` (None removes a key)."""
        merged = {**self.config, **changes}
        text = yaml.safe_dump({k: v for k, v in merged.items() if v is not None}, sort_keys=False)
        Path(self.opts.node_config or "").write_text(text)

    def run(self, **opts: Any) -> dict[str, doctor.Check]:
        checks = Doctor(replace(self.opts, **opts)).run()
        names = [c.name for c in checks]
        assert len(names) == len(set(names)), f"check names repeat: {names}"
        return {c.name: c for c in checks}


POLICY = {
    "networks": {"rail-1": {"bridge": "br-t"}, "rail-2": {"pfs": ["lpf0"]},
                 "rail-3": {"bridge": "br-off", "pfs": ["lpf0"]}},
    "tenants": {"a": {"namespaces": ["a"], "networks": {"rail-1": {"vlans": [100]}}}},
}


# Two rails, as the overlay lab makes them: rail0 is the plain-keyed chassis node-1 on br-int,
# rail1 the chassis node-1-rail1 with its chassis-specific keys (ovn-controller(8)).
OVN = {
    "rails": {
        "rail0": {"integrationBridge": "br-int", "underlayMtu": 1500, "underlayBridge": "br-rail0",
                  "chassis": "node-1", "userspaceDatapath": True},
        "rail1": {"integrationBridge": "br-int-rail1", "underlayMtu": 9000, "underlayBridge": "br-rail1",
                  "chassis": "node-1-rail1", "userspaceDatapath": True},
    },
    "defaultRail": "rail0",
}
OVN_IDS = {"system-id": "node-1", "ovn-bridge": "br-int", "ovn-encap-ip": "192.0.2.10",
           "ovn-bridge-node-1-rail1": "br-int-rail1", "ovn-encap-ip-node-1-rail1": "192.0.2.11"}
OVN_INTERFACES: dict[str, dict[str, tuple[str, int | None]]] = {
    "br-int": {"br-int": ("internal", 1500), "patch-br-int-to-x": ("patch", None)},
    "br-int-rail1": {"br-int-rail1": ("internal", 1500)},
    "br-rail0": {"br-rail0": ("internal", 1500), "eth-r0": ("", 1500)},
    "br-rail1": {"br-rail1": ("internal", 9000), "eth-r1": ("", 9000)},
}
RAIL_CHECKS = ("bridge", "chassis", "encap IP", "underlay MTU", "datapath")


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    # Unix socket paths must stay under 108 bytes: a short directory of its own.
    short = Path(tempfile.mkdtemp(prefix="tnd-"))
    conf_dir, bin_dir = tmp_path / "net.d", tmp_path / "bin"
    conf_dir.mkdir()
    bin_dir.mkdir()
    (conf_dir / "00-multus.conf").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus",
         "kubeconfig": str(conf_dir / "multus.d" / "multus.kubeconfig"), "delegates": []}))
    (conf_dir / "multus.d").mkdir()
    (conf_dir / "multus.d" / "multus.kubeconfig").write_text("{}")
    (conf_dir / "10-bridge.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "cbr0",
                                                             "plugins": [{"type": "bridge"}]}))
    script(bin_dir / "multus", """\
        echo "multus: version:v4.3.0(clean,released), commit:db307415, date:2026-05-29T15:05:10+00:00"
        """)
    for name in ("tenantnet", "tenantnet-ipam"):
        script(bin_dir / name, f"""\
            test "$CNI_COMMAND" = VERSION || exit 4
            cat >/dev/null
            echo '{VERSION_JSON}'
            """)
    nicsysfs.write_tree(tmp_path / "sys", [nicsysfs.connectx_pf("lpf0", vfs=2)])
    (tmp_path / "devinfo" / "cni").mkdir(parents=True)
    fake_db = FakeOvsdb({"br-t", "br-off", *OVN_INTERFACES}, {"hw-offload": "true"},
                        external_ids=dict(OVN_IDS), datapaths={"br-int": "netdev", "br-int-rail1": "netdev"},
                        interfaces={b: dict(i) for b, i in OVN_INTERFACES.items()})
    nb = FakeOvsdb(databases=("OVN_Northbound",))
    agent = FakeAgent()
    servers: list[Any] = [Server(str(short / "db.sock"), fake_db.serve), Server(str(short / "agent.sock"), agent.serve),
                          Server(str(short / "nb.sock"), nb.serve)]
    labkubelet.write_pods(short / "pods.json", [])
    (short / "pod-resources").mkdir()
    servers.append(labkubelet.start(short / "pod-resources" / "kubelet.sock", short / "pods.json"))
    (short / "device-plugins").mkdir()  # the kubelet's root is `short`: its checkpoint names a resource
    for d in ("pods", "plugins_registry"):  # what the kubelet makes at its start
        (short / d).mkdir()
    (tmp_path / "cdi").mkdir()
    servers.append(Server(str(short / "nri.sock"), lambda conn: None))  # containerd's NRI socket
    (short / "device-plugins" / "kubelet_internal_checkpoint").write_text(json.dumps(
        {"Data": {"PodDeviceEntries": None, "RegisteredDevices": {"example.com/rail": ["0000:3b:00.2"]}},
         "Checksum": 1}))
    etcd = HttpFake(etcd_handler())
    api = FakeApi(allowed=set(ALL_ALLOWED))
    kube = HttpFake(api.handler())
    servers += [etcd, kube]
    config = {
        "ovsdb": f"unix:{short}/db.sock", "ovsdbTimeout": 2, "stateDir": str(tmp_path / "state"),
        "logFile": str(tmp_path / "log" / "tenantnet.log"), "agentSocket": str(short / "agent.sock"),
        "sysfsRoot": str(tmp_path / "sys"), "vfControl": "doctortest:switchdev",
        "podResourcesSocket": str(short / "pod-resources" / "kubelet.sock"), "deviceInfoDir": str(tmp_path / "devinfo" / "cni"),
        "etcdEndpoints": [etcd.url], "etcdTimeout": 2, "nodeName": "node-1",
        "prewarmBridges": ["br-t"], "tenancy": POLICY,
        "kubernetes": True, "dra": True, "kubeletRootDir": str(short), "nriSocket": str(short / "nri.sock"),
        "cdiDir": str(tmp_path / "cdi"),
        "ovn": {"northbound": f"unix:{short}/nb.sock", **OVN},
    }
    opts = Options(node_config=str(tmp_path / "tenantnet.yaml"), kubeconfig=str(kubeconfig(tmp_path / "kc", kube.url)),
                   cni_conf_dir=str(conf_dir), cni_bin_dir=str(bin_dir), timeout=2, kube_client="builtin",
                   environ={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)})
    n = Node(tmp_path, opts, config, fake_db, agent, api, servers, nb,
             {"192.0.2.10": "br-rail0", "192.0.2.11": "br-rail1", "127.0.0.1": "lo"})
    monkeypatch.setattr(Doctor, "local_addresses", lambda self: n.addresses)
    n.write_config()
    try:
        yield n
    finally:
        for s in servers:
            s.stop() if isinstance(s, labkubelet.SimulatedKubelet) else s.close()
        shutil.rmtree(short, ignore_errors=True)


HEALTHY = ["node config", "tenancy policy", "CNI conf dir", "CNI bin dir", "Multus config", "Multus kubeconfig",
           "Multus version", "tenantnet", "tenantnet-ipam", "agent"]


def test_a_healthy_node_passes_every_check(node: Node) -> None:
    checks = node.run()
    bad = {n: (c.status, c.detail) for n, c in checks.items() if c.status != Status.PASS}
    assert bad == {}
    assert list(checks)[:len(HEALTHY)] == HEALTHY
    db = f"OVSDB unix:{Path(node.config['agentSocket']).parent}/db.sock"
    etcd = f"etcd {node.config['etcdEndpoints'][0]}"
    assert set(checks) - set(HEALTHY) == {db, "bridge br-t", "bridge br-off", "OVS hw-offload", "PF lpf0",
                                          "eswitch lpf0", "pod-resources", "device plugin", etcd, "device-info dir", "NAD CRD",
                                          "TenantNetwork CRD", "RBAC agent", "RBAC renderer", "RBAC agent DRA",
                                          "DRA plugins_registry", "DRA registration", "DRA NRI", "DRA CDI dir",
                                          "OVN northbound",
                                          *(f"rail {r} {c}" for r in ("rail0", "rail1") for c in RAIL_CHECKS)}
    assert "thin" in checks["Multus config"].detail and "v4.3.0" in checks["Multus version"].detail
    assert "0000:3b:00.0, 2 VFs" in checks["PF lpf0"].detail
    assert "pid 4242 (root)" in checks["agent"].detail
    assert node.agent.asked == [STATUS_OP]  # once, for the agent and the DRA checks
    assert os.listdir(node.config["cdiDir"]) == []  # the write probe left nothing
    # The RBAC questions were asked as each ServiceAccount, with its groups.
    posts = [s for s in node.api.seen if s["method"] == "POST"]
    assert posts and {s["user"] for s in posts} == {AGENT_SA, RENDERER_SA}
    assert "system:serviceaccounts:kube-system" in posts[0]["groups"]
    assert doctor.exit_code(list(checks.values())) == 0


def fails(checks: dict[str, doctor.Check], name: str, *in_fix: str) -> doctor.Check:
    """The check `name` FAILed, with a fix saying each of `in_fix`; and it is the only FAIL."""
    check = checks[name]
    assert check.status == Status.FAIL, (check.status, check.detail)
    assert check.fix and all(word in check.fix for word in in_fix), check.fix
    others = [n for n, c in checks.items() if c.status == Status.FAIL and n != name]
    assert others == [], f"other checks failed too: {others}"
    assert doctor.exit_code(list(checks.values())) == 1
    return check


# ---- node config --------------------------------------------------------------------------------

def test_a_node_config_that_does_not_load_fails_and_the_checks_needing_it_skip(node: Node) -> None:
    Path(node.opts.node_config or "").write_text("ovsdbTimeout: forever\n")
    checks = node.run()
    c = checks["node config"]
    assert c.status == Status.FAIL and "ovsdbTimeout" in c.detail and node.opts.node_config in c.fix
    for name in ("agent", "OVSDB", "SR-IOV", "pod-resources", "etcd", "device-info dir"):
        assert checks[name].status == Status.SKIP and "node config did not load" in checks[name].detail


def test_a_node_config_or_tenancy_file_that_is_a_fifo_fails_without_blocking(node: Node) -> None:
    fifo = node.root / "fifo.yaml"
    os.mkfifo(fifo)
    c = node.run(node_config=str(fifo))["node config"]
    assert c.status == Status.FAIL and "not a regular file" in c.detail
    node.write_config(tenancy=None, tenancyFile=str(fifo))
    c = node.run()["tenancy policy"]
    assert c.status == Status.FAIL and "not a regular file" in c.detail


def test_a_tenancy_policy_that_does_not_load_fails(node: Node) -> None:
    node.write_config(tenancy={"networks": {"n": {}}, "tenants": {}})
    checks = node.run()
    c = checks["tenancy policy"]
    assert c.status == Status.FAIL and "docs/tenancy.md" in c.fix
    for name in ("SR-IOV", "tenancy bridges"):  # its networks are unknown: not checked as if there were none
        assert checks[name].status == Status.SKIP and "tenancy policy did not load" in checks[name].detail


# ---- CNI dirs and Multus ------------------------------------------------------------------------

def test_missing_cni_dirs_fail_naming_the_flag(node: Node) -> None:
    checks = node.run(cni_conf_dir=str(node.root / "nope"), cni_bin_dir=str(node.root / "nobin"))
    assert checks["CNI conf dir"].status == Status.FAIL and "--cni-conf-dir" in checks["CNI conf dir"].fix
    assert checks["CNI bin dir"].status == Status.FAIL and "--cni-bin-dir" in checks["CNI bin dir"].fix
    assert checks["Multus config"].status == Status.SKIP
    assert checks["tenantnet executables"].status == Status.SKIP


def test_a_symlinked_cni_dir_fails(node: Node) -> None:
    link = node.root / "link"
    link.symlink_to(node.opts.cni_conf_dir)
    c = fails(node.run(cni_conf_dir=str(link)), "CNI conf dir", "real directory")
    assert "symlink" in c.detail


def test_no_multus_config_fails_naming_what_the_runtime_uses(node: Node) -> None:
    (Path(node.opts.cni_conf_dir) / "00-multus.conf").unlink()
    c = fails(node.run(), "Multus config", "install Multus")
    assert "10-bridge.conflist (type bridge)" in c.detail


def test_multus_config_not_first_fails(node: Node) -> None:
    (Path(node.opts.cni_conf_dir) / "00-calico.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [{"type": "calico"}]}))
    c = fails(node.run(), "Multus config", "sort first")
    assert "00-calico.conflist" in c.detail


def test_thin_multus_kubeconfig_missing_fails(node: Node) -> None:
    (Path(node.opts.cni_conf_dir) / "multus.d" / "multus.kubeconfig").unlink()
    fails(node.run(), "Multus kubeconfig", "restart Multus")


def test_thick_multus_passes_with_its_daemon_and_fails_without(node: Node) -> None:
    conf = Path(node.opts.cni_conf_dir)
    sock_dir = Path(node.config["agentSocket"]).parent / "multus"
    sock_dir.mkdir()
    (conf / "00-multus.conf").write_text(json.dumps({"cniVersion": "0.3.1", "name": "multus-cni-network",
                                                     "type": "multus-shim", "daemonSocketDir": str(sock_dir)}))
    script(Path(node.opts.cni_bin_dir) / "multus-shim", 'echo "multus-shim: version:v4.3.0(clean,released)"\n')
    checks = node.run()
    assert checks["Multus daemon"].status == Status.FAIL and "multus-daemon" in checks["Multus daemon"].fix
    assert "thick" in checks["Multus config"].detail and "multus-shim" in checks["Multus version"].detail
    daemon = Server(str(sock_dir / "multus.sock"), lambda conn: None)
    try:
        checks = node.run()
    finally:
        daemon.close()
    assert checks["Multus daemon"].status == Status.PASS, checks["Multus daemon"].detail


def test_multus_binary_missing_or_hanging_fails(node: Node) -> None:
    binary = Path(node.opts.cni_bin_dir) / "multus"
    binary.unlink()
    fails(node.run(), "Multus version", "restart Multus")
    script(binary, "exec sleep 30\n")
    c = fails(node.run(timeout=0.5), "Multus version", "replace")
    assert "did not answer within 0.5s" in c.detail


# ---- tenantnet's executables --------------------------------------------------------------------

def test_tenantnet_missing_not_executable_or_failing_fails_with_the_install_command(node: Node) -> None:
    bin_dir = Path(node.opts.cni_bin_dir)
    (bin_dir / "tenantnet").unlink()
    c = fails(node.run(), "tenantnet", "tenantnetctl install --cni-bin-dir")
    assert "missing" in c.detail
    script(bin_dir / "tenantnet", "exit 1\n")
    (bin_dir / "tenantnet").chmod(0o644)
    assert "not executable" in fails(node.run(), "tenantnet", "install").detail
    script(bin_dir / "tenantnet", 'echo \'{"code":5,"msg":"broken"}\'; exit 1\n')
    assert "exit 1" in fails(node.run(), "tenantnet", "install").detail


def test_the_real_plugin_answers_version(node: Node) -> None:
    """The venv's own executables (the trampoline and its shim, when built) pass."""
    bin_dir = Path(node.opts.cni_bin_dir)
    for name in ("tenantnet", "tenantnet-ipam"):
        (bin_dir / name).unlink()
        for suffix in ("", "-shim"):
            if (BIN / (name + suffix)).exists():
                (bin_dir / (name + suffix)).symlink_to(BIN / (name + suffix))
    checks = node.run(timeout=10)
    assert checks["tenantnet"].status == Status.PASS, checks["tenantnet"].detail
    assert checks["tenantnet-ipam"].status == Status.PASS, checks["tenantnet-ipam"].detail


# ---- the agent ----------------------------------------------------------------------------------

def test_no_agent_warns_a_wedged_one_fails(node: Node) -> None:
    node.write_config(agentSocket=str(node.root / "none.sock"))
    c = node.run()["agent"]
    assert c.status == Status.WARN and "in-process" in c.detail and "agent run" in c.fix
    node.write_config()
    node.agent.report["oldestRunningS"] = 10_000
    assert "wedged" in fails(node.run(), "agent", "restart").detail


def test_a_socket_that_does_not_answer_fails(node: Node) -> None:
    sock_dir = Path(node.config["agentSocket"]).parent
    mute = Server(str(sock_dir / "mute.sock"), lambda conn: conn.recv(1 << 20) and __import__("time").sleep(5))
    try:
        node.write_config(agentSocket=mute.path)
        c = fails(node.run(timeout=0.5), "agent", "restart the agent")
    finally:
        mute.close()
    assert "did not answer" in c.detail


@pytest.mark.skipif(os.geteuid() != 0, reason="serving a socket as another uid needs root")
def test_an_agent_socket_served_by_another_uid_fails_and_is_sent_nothing(node: Node) -> None:
    path = str(Path(node.config["agentSocket"]).parent / "other.sock")
    # Bound as root, listening as nobody: SO_PEERCRED reports the listener's uid at listen().
    code = textwrap.dedent(f"""\
        import os, socket, sys
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind({path!r})
        os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
        s.listen(4)
        print("ready", flush=True)
        conn, _ = s.accept()
        conn.settimeout(3)
        try:
            got = conn.recv(100)
        except OSError:
            got = b""
        print("got", len(got), flush=True)
        """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        node.write_config(agentSocket=path)
        c = fails(node.run(), "agent", "as root")
        assert "uid 65534, not root" in c.detail
        assert proc.stdout.readline().strip() == "got 0"  # nothing was sent to it
    finally:
        proc.kill()
        proc.wait()
        if os.path.exists(path):
            os.unlink(path)


# ---- OVS ----------------------------------------------------------------------------------------

def test_a_declared_bridge_missing_fails_naming_it_and_who_declares_it(node: Node) -> None:
    node.ovsdb.bridges.discard("br-t")
    c = fails(node.run(), "bridge br-t", "add-br br-t")
    assert "network rail-1, prewarmBridges" in c.detail and "--db=unix:" in c.fix


def test_ovsdb_not_answering_fails_and_its_bridges_skip(node: Node) -> None:
    node.write_config(ovsdb=f"unix:{node.root}/no-db.sock")
    checks = node.run()
    c = checks[f"OVSDB unix:{node.root}/no-db.sock"]
    assert c.status == Status.FAIL and "start Open vSwitch" in c.fix
    assert checks["bridge br-t"].status == Status.SKIP and checks["bridge br-off"].status == Status.SKIP


def test_ovsdb_not_answering_only_warns_where_no_bridge_is_declared(node: Node) -> None:
    node.write_config(ovsdb=f"unix:{node.root}/no-db.sock", tenancy=None, prewarmBridges=None)
    checks = node.run()
    assert checks[f"OVSDB unix:{node.root}/no-db.sock"].status == Status.WARN
    assert checks["OVS bridges"].status == Status.SKIP


def test_an_ovsdb_that_accepts_and_never_answers_fails_within_the_timeout(node: Node) -> None:
    node.ovsdb.silent = True
    checks = node.run(timeout=0.5)
    name = next(n for n in checks if n.startswith("OVSDB"))
    assert checks[name].status == Status.FAIL and "did not answer" in checks[name].detail


def test_hw_offload_off_fails_where_a_network_is_ovs_offload(node: Node) -> None:
    node.ovsdb.other_config.clear()
    c = fails(node.run(), "OVS hw-offload", "other_config:hw-offload=true")
    assert "rail-3" in c.detail


# ---- SR-IOV -------------------------------------------------------------------------------------

def test_a_declared_pf_absent_fails(node: Node) -> None:
    node.write_config(tenancy={**POLICY, "networks": {**POLICY["networks"], "rail-2": {"pfs": ["lpf9"]}}})
    c = fails(node.run(), "PF lpf9", "networks.rail-2.pfs")
    assert "lpf9" in c.detail


def test_a_pf_without_vfs_fails_with_sriov_numvfs(node: Node) -> None:
    (node.root / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0" / "sriov_numvfs").write_text("0\n")
    c = fails(node.run(), "PF lpf0", "sriov_numvfs")
    assert "no VFs" in c.detail


def test_eswitch_legacy_fails_unknown_warns(node: Node) -> None:
    node.write_config(vfControl="doctortest:legacy")
    c = fails(node.run(), "eswitch lpf0", "devlink dev eswitch set pci/0000:3b:00.0 mode switchdev")
    assert "legacy" in c.detail
    node.write_config(vfControl="doctortest:unknown")
    assert node.run()["eswitch lpf0"].status == Status.WARN


def test_no_declared_pf_skips_sriov_and_pod_resources(node: Node) -> None:
    node.write_config(tenancy={"networks": {"rail-1": {"bridge": "br-t"}}, "tenants": POLICY["tenants"]},
                      podResourcesSocket=None)
    checks = node.run()
    assert checks["SR-IOV PFs"].status == Status.SKIP and checks["device plugin"].status == Status.SKIP
    assert checks["pod-resources"].status == Status.SKIP and "no rail alignment" in checks["pod-resources"].detail


# ---- pod-resources, etcd, device-info -----------------------------------------------------------

def test_pod_resources_socket_absent_fails(node: Node) -> None:
    node.write_config(podResourcesSocket=str(node.root / "kubelet.sock"))
    fails(node.run(), "pod-resources", "podResourcesSocket")


def test_no_device_plugin_warns_a_plugin_socket_alone_passes(node: Node) -> None:
    directory = Path(node.config["agentSocket"]).parent / "device-plugins"
    (directory / "kubelet_internal_checkpoint").unlink()
    c = node.run()["device plugin"]
    assert c.status == Status.WARN and "resourceName" in c.detail and "SR-IOV network device plugin" in c.fix
    plugin = Server(str(directory / "sriovNet.sock"), lambda conn: None)
    try:
        c = node.run()["device plugin"]
    finally:
        plugin.close()
    assert c.status == Status.PASS and "sriovNet.sock" in c.detail


def test_etcd_one_endpoint_down_warns_all_down_fails(node: Node) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    node.write_config(etcdEndpoints=[*node.config["etcdEndpoints"], dead], etcdTimeout=0.5)
    checks = node.run()
    assert checks[f"etcd {dead}"].status == Status.WARN and "etcdEndpoints" in checks[f"etcd {dead}"].fix
    assert checks[f"etcd {node.config['etcdEndpoints'][0]}"].status == Status.PASS
    node.write_config(etcdEndpoints=[dead], etcdTimeout=0.5)
    fails(node.run(), f"etcd {dead}", "etcdEndpoints")


# ---- OVN (overlay networks) -----------------------------------------------------------------------

def rails(**changes: dict[str, Any] | None) -> dict[str, Any]:
    """OVN's rails with some changed (None removes a rail's key given as None)."""
    out = {}
    for name, spec in OVN["rails"].items():
        merged = {**spec, **(changes.get(name) or {})}
        out[name] = {k: v for k, v in merged.items() if v is not None}
    return out


def test_overlay_checks_say_what_they_found(node: Node) -> None:
    checks = node.run()
    assert "answers (OVN_Northbound database)" in checks["OVN northbound"].detail
    r0, r1 = checks["rail rail0 chassis"].detail, checks["rail rail1 chassis"].detail
    assert r0.startswith("chassis node-1: ovn-bridge=br-int, ovn-encap-ip=192.0.2.10"), r0
    assert r1.startswith("chassis node-1-rail1: ovn-bridge-node-1-rail1=br-int-rail1, "
                         "ovn-encap-ip-node-1-rail1=192.0.2.11"), r1
    assert checks["rail rail1 encap IP"].detail == "192.0.2.11 on br-rail1 (this node's)"
    assert checks["rail rail1 underlay MTU"].detail == ("underlayMtu 9000 fits br-rail1 (br-rail1 9000, eth-r1 9000); "
                                                        "pods get MTU 8942")
    assert "patch" not in checks["rail rail0 underlay MTU"].detail
    assert checks["rail rail0 datapath"].detail.startswith("br-int is datapath_type netdev")


def test_without_ovn_one_skip_says_overlays_are_not_configured(node: Node) -> None:
    node.write_config(ovn=None)
    checks = node.run()
    assert checks["OVN"].status == Status.SKIP and "overlays are not configured" in checks["OVN"].detail
    assert [n for n in checks if n.startswith(("rail ", "OVN "))] == []
    assert doctor.exit_code(list(checks.values())) == 0


def test_a_northbound_that_does_not_answer_fails_naming_the_key_and_rails_are_still_checked(node: Node) -> None:
    short = Path(node.config["agentSocket"]).parent
    node.write_config(ovn={**node.config["ovn"], "northbound": f"unix:{short}/gone.sock"})
    checks = node.run()
    c = fails(checks, "OVN northbound", "ovn.northbound", f"unix:{short}/gone.sock")
    assert "no overlay attachment can be made" in c.detail
    assert checks["rail rail1 encap IP"].status == Status.PASS


def test_an_ovsdb_without_the_northbound_database_fails(node: Node) -> None:
    node.nb.databases = ("Open_vSwitch",)
    c = fails(node.run(), "OVN northbound", "ovn-central")
    assert "serves no OVN_Northbound database" in c.detail


def test_an_ssl_northbound_skips_saying_why(node: Node) -> None:
    node.write_config(ovn={**node.config["ovn"], "northbound": "ssl:192.0.2.1:6641"})
    c = node.run()["OVN northbound"]
    assert c.status == Status.SKIP and "unix: and tcp: endpoints only" in c.detail, c


def test_a_missing_integration_bridge_fails_naming_it(node: Node) -> None:
    node.ovsdb.bridges.discard("br-int-rail1")
    checks = node.run()
    c = fails(checks, "rail rail1 bridge", "external_ids:ovn-bridge-node-1-rail1=br-int-rail1",
              f"ovs-vsctl --db={node.config['ovsdb']} add-br br-int-rail1", "ovn.rails.rail1.integrationBridge")
    assert "br-int-rail1" in c.detail and "does not exist" in c.detail
    assert checks["rail rail1 datapath"].status == Status.SKIP
    assert checks["rail rail0 bridge"].status == Status.PASS


def test_a_chassis_without_its_own_bridge_key_falls_back_to_the_plain_one_and_fails(node: Node) -> None:
    # ovn-controller(8): without ovn-bridge-<chassis>, the chassis reads the plain ovn-bridge.
    del node.ovsdb.external_ids["ovn-bridge-node-1-rail1"]
    checks = node.run()
    c = fails(checks, "rail rail1 chassis", "external_ids:ovn-bridge-node-1-rail1=br-int-rail1")
    assert "chassis node-1-rail1's ovn-controller uses br-int (ovn-bridge=br-int" in c.detail
    assert "integrationBridge br-int-rail1" in c.detail
    assert checks["rail rail1 encap IP"].status == Status.SKIP


def test_no_ovn_bridge_key_is_br_int(node: Node) -> None:
    del node.ovsdb.external_ids["ovn-bridge"]
    checks = node.run()
    assert checks["rail rail0 chassis"].status == Status.PASS
    assert "ovn-bridge unset (br-int)" in checks["rail rail0 chassis"].detail


def test_a_chassis_named_by_system_id_reads_its_specific_keys(node: Node) -> None:
    # rail1 gives no chassis: its ovn-controller is the node's system-id, here node-1-rail1.
    node.ovsdb.external_ids["system-id"] = "node-1-rail1"
    node.write_config(ovn={**node.config["ovn"], "rails": rails(rail1={"chassis": None})})
    checks = node.run()
    assert checks["rail rail1 chassis"].status == Status.PASS
    assert "ovn-encap-ip-node-1-rail1=192.0.2.11" in checks["rail rail1 chassis"].detail
    assert checks["rail rail0 chassis"].status == Status.PASS  # node-1 given: plain keys


def test_a_rail_falling_back_to_another_rails_encap_ip_fails(node: Node) -> None:
    del node.ovsdb.external_ids["ovn-encap-ip-node-1-rail1"]
    c = fails(node.run(), "rail rail1 encap IP", "external_ids:ovn-encap-ip-node-1-rail1=")
    assert c.detail.startswith("192.0.2.10 is also rail rail0's encap IP"), c.detail


def test_no_encap_ip_fails(node: Node) -> None:
    del node.ovsdb.external_ids["ovn-encap-ip"]
    c = fails(node.run(), "rail rail0 chassis", "external_ids:ovn-encap-ip=")
    assert "no encap IP (ovn-encap-ip unset" in c.detail


def test_an_encap_ip_that_is_not_this_nodes_fails(node: Node) -> None:
    del node.addresses["192.0.2.11"]
    c = fails(node.run(), "rail rail1 encap IP", "put 192.0.2.11 on rail rail1's NIC")
    assert c.detail.startswith("192.0.2.11 (ovn-encap-ip-node-1-rail1) is not an address of this node"), c.detail


def test_an_underlay_mtu_larger_than_the_rails_interface_warns(node: Node) -> None:
    node.ovsdb.interfaces["br-rail1"]["eth-r1"] = ("", 1500)
    checks = node.run()
    c = checks["rail rail1 underlay MTU"]
    assert c.status == Status.WARN, c
    assert "underlayMtu 9000 is larger than eth-r1's MTU 1500" in c.detail and "MTU 8942" in c.detail
    assert c.fix.startswith("set ovn.rails.rail1.underlayMtu to 1500 (pods then get 1442)")
    assert doctor.exit_code(list(checks.values())) == 0


def test_underlay_mtu_skips_without_an_underlay_bridge_and_fails_for_a_missing_one(node: Node) -> None:
    node.write_config(ovn={**node.config["ovn"], "rails": rails(rail0={"underlayBridge": None},
                                                                 rail1={"underlayBridge": "br-nope"})})
    checks = node.run()
    assert checks["rail rail0 underlay MTU"].status == Status.SKIP
    assert "no ovn.rails.rail0.underlayBridge" in checks["rail rail0 underlay MTU"].detail
    c = fails(checks, "rail rail1 underlay MTU", "ovn.rails.rail1.underlayBridge")
    assert "br-nope" in c.detail


def test_userspace_datapath_mismatches_warn(node: Node) -> None:
    node.ovsdb.datapaths["br-int"] = ""  # the kernel datapath
    node.write_config(ovn={**node.config["ovn"], "rails": rails(rail1={"userspaceDatapath": False})})
    checks = node.run()
    r0, r1 = checks["rail rail0 datapath"], checks["rail rail1 datapath"]
    assert r0.status == Status.WARN and "datapath_type system" in r0.detail and "for nothing" in r0.detail
    assert "userspaceDatapath: false" in r0.fix
    assert r1.status == Status.WARN and "TX checksum offload would not be switched off" in r1.detail
    assert r1.fix == "set ovn.rails.rail1.userspaceDatapath: true"
    assert doctor.exit_code(list(checks.values())) == 0


def test_a_rails_ovsdb_that_does_not_answer_fails_and_its_checks_skip(node: Node) -> None:
    short = Path(node.config["agentSocket"]).parent
    gone = f"unix:{short}/gone.sock"
    node.write_config(ovn={**node.config["ovn"], "rails": rails(rail0={"ovsdb": gone}, rail1={"ovsdb": gone})})
    checks = node.run()
    failing = sorted(n for n, c in checks.items() if c.status == Status.FAIL)
    assert failing == ["rail rail0 bridge", "rail rail1 bridge"]
    assert gone in checks["rail rail1 bridge"].detail and "ovn.rails.rail1.ovsdb" in checks["rail rail1 bridge"].fix
    assert {checks[f"rail {r} {c}"].status for r in ("rail0", "rail1") for c in RAIL_CHECKS[1:]} == {Status.SKIP}


def test_local_addresses_come_from_the_kernel() -> None:
    addresses = Doctor(Options()).local_addresses()
    assert isinstance(addresses, dict) and addresses.get("127.0.0.1") == "lo", addresses


def test_device_info_dir_missing_warns_symlink_or_file_fails(node: Node) -> None:
    path = node.root / "devinfo" / "cni"
    path.rmdir()
    c = node.run()["device-info dir"]
    assert c.status == Status.WARN and "creates it" in c.detail
    path.symlink_to(node.root)
    assert "symlink" in fails(node.run(), "device-info dir", "real directory").detail
    path.unlink()
    path.write_text("")
    assert "not a directory" in fails(node.run(), "device-info dir", "deviceInfoDir").detail


# ---- Kubernetes ---------------------------------------------------------------------------------

KUBE = ("NAD CRD", "TenantNetwork CRD", "RBAC agent", "RBAC renderer")


def test_without_a_kubeconfig_the_kubernetes_checks_skip_saying_why(node: Node) -> None:
    checks = node.run(kubeconfig=None, kube_client="auto")
    for name in KUBE:
        assert checks[name].status == Status.SKIP and "no kubeconfig" in checks[name].detail


def test_an_unreachable_api_server_skips(node: Node) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = kubeconfig(node.root / "dead-kc", f"http://127.0.0.1:{port}")
    checks = node.run(kubeconfig=str(kc))
    for name in KUBE:
        assert checks[name].status == Status.SKIP and "cannot reach the API server" in checks[name].detail


def test_a_kubeconfig_with_an_exec_plugin_skips_naming_kubectl(node: Node) -> None:
    kc = node.root / "exec-kc"
    data = yaml.safe_load(Path(node.opts.kubeconfig or "").read_text())
    data["users"][0]["user"] = {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}}
    kc.write_text(yaml.safe_dump(data))
    c = node.run(kubeconfig=str(kc))["NAD CRD"]
    assert c.status == Status.SKIP and "kubectl" in c.detail


def test_crds_missing_fail_with_their_install(node: Node) -> None:
    node.api.crds.discard(doctor.TENANTNET_CRD)
    c = fails(node.run(), "TenantNetwork CRD", "packaging/crds/")
    assert doctor.TENANTNET_CRD in c.detail
    node.api.crds.discard(doctor.NAD_CRD)
    checks = node.run()
    assert checks["NAD CRD"].status == Status.FAIL and "NetworkAttachmentDefinition" in checks["NAD CRD"].fix


def test_rbac_denied_fails_with_the_grant(node: Node) -> None:
    node.api.allowed.discard((AGENT_SA, "watch", "namespaces"))
    c = fails(node.run(), "RBAC agent", "kubectl create clusterrole", "--serviceaccount=kube-system:tenantnet")
    assert "may not watch namespaces" in c.detail and "--verb=watch" in c.fix


@pytest.mark.parametrize(("sa", "check", "verb"), [(AGENT_SA, "RBAC agent", "patch"),
                                                  (RENDERER_SA, "RBAC renderer", "watch")])
def test_rbac_covers_the_nodes_pfs(node: Node, sa: str, check: str, verb: str) -> None:
    # The agent publishes its node's PFs on its Node; the renderer reads them (UnknownPF).
    node.api.allowed.discard((sa, verb, "nodes"))
    c = fails(node.run(), check, "kubectl create clusterrole", f"--verb={verb}")
    assert f"may not {verb} nodes" in c.detail and "--resource=nodes" in c.fix


def test_rbac_of_another_service_account(node: Node) -> None:
    c = fails(node.run(renderer_service_account="tn/renderer"), "RBAC renderer",
              "--serviceaccount=tn:renderer")
    assert "create network-attachment-definitions.k8s.cni.cncf.io" in c.detail


def test_rbac_skips_when_the_admin_may_not_impersonate(node: Node) -> None:
    node.api.impersonation = False
    checks = node.run()
    assert checks["RBAC agent"].status == Status.SKIP and "impersonate" in checks["RBAC agent"].detail
    assert checks["NAD CRD"].status == Status.PASS


@pytest.mark.skipif(not __import__("shutil").which("kubectl"), reason="kubectl is not on PATH")
def test_through_kubectl(node: Node) -> None:
    """The same API questions through kubectl (get --raw, create --raw with --as/--as-group)."""
    node.api.allowed.discard((AGENT_SA, "list", "tenantnetworks.tenantnet.io"))
    node.api.crds.discard(doctor.TENANTNET_CRD)
    checks = node.run(kube_client="kubectl")
    assert checks["NAD CRD"].status == Status.PASS, checks["NAD CRD"].detail
    assert checks["TenantNetwork CRD"].status == Status.FAIL
    assert checks["RBAC agent"].status == Status.FAIL, checks["RBAC agent"].detail
    assert "may not list tenantnetworks.tenantnet.io" in checks["RBAC agent"].detail
    assert checks["RBAC renderer"].status == Status.PASS
    posts = [s for s in node.api.seen if s["method"] == "POST"]
    assert posts and all(s["user"] in (AGENT_SA, RENDERER_SA) and "system:serviceaccounts" in s["groups"]
                         for s in posts)


# ---- DRA ---------------------------------------------------------------------------------------

def test_dra_off_is_one_skip_saying_so(node: Node) -> None:
    node.write_config(dra=None)
    checks = node.run()
    assert checks["DRA"].status == Status.SKIP and "dra is off" in checks["DRA"].detail
    assert not [n for n in checks if n.startswith("DRA ") or n == "RBAC agent DRA"]


def test_no_plugins_registry_fails_naming_kubelet_root_dir(node: Node) -> None:
    root = Path(node.config["kubeletRootDir"])
    (root / "plugins_registry").rmdir()
    c = fails(node.run(), "DRA plugins_registry", "kubeletRootDir", str(root), "hostPaths")
    assert f"{root}/plugins_registry does not exist" in c.detail


def test_a_plugins_registry_outside_a_kubelets_root_dir_fails(node: Node) -> None:
    # What a DaemonSet's DirectoryOrCreate leaves where the kubelet keeps no root dir.
    (Path(node.config["kubeletRootDir"]) / "pods").rmdir()
    c = fails(node.run(), "DRA plugins_registry", "kubeletRootDir")
    assert "no pods/" in c.detail and "not a running kubelet's root dir" in c.detail


def test_a_refused_registration_fails_with_the_kubelets_reason(node: Node) -> None:
    node.agent.report["dra"] = {"registered": False, "nriConnected": True,
                                "registrationError": "no supported DRA gRPC API is implemented"}
    c = fails(node.run(), "DRA registration", "Kubernetes 1.34")
    assert "refused the driver tenantnet.io: no supported DRA gRPC API is implemented" in c.detail


def test_a_registration_the_kubelet_never_made_fails_naming_kubelet_root_dir(node: Node) -> None:
    node.agent.report["dra"] = {"registered": False, "registrationError": "", "nriConnected": True}
    c = fails(node.run(), "DRA registration", "kubeletRootDir", "packaging/daemonset.yaml")
    assert f"never called {node.config['kubeletRootDir']}/plugins_registry/tenantnet.io-reg.sock" in c.detail


def test_an_agent_without_dra_fails_with_its_restart(node: Node) -> None:
    del node.agent.report["dra"]
    c = fails(node.run(), "DRA registration", "rollout restart daemonset/tenantnet")
    assert "runs without DRA" in c.detail
    # and the NRI connection cannot be told from it
    assert node.run()["DRA NRI"].status == Status.SKIP


def test_no_agent_fails_dra_registration_but_only_warns_for_cni(node: Node) -> None:
    Path(node.config["agentSocket"]).unlink()
    checks = node.run()
    fails(checks, "DRA registration", "agent run")
    assert checks["agent"].status == Status.WARN
    assert checks["DRA NRI"].status == Status.SKIP and "nothing serves" in checks["DRA NRI"].detail


def test_no_nri_socket_fails_naming_containerds_nri_and_the_key(node: Node) -> None:
    Path(node.config["nriSocket"]).unlink()
    c = fails(node.run(), "DRA NRI", "io.containerd.nri.v1.nri", "disable = false",
              "plugin_request_timeout = '15s'", "nriSocket")
    assert f"nothing at {node.config['nriSocket']}" in c.detail


def test_an_agent_not_connected_to_nri_fails(node: Node) -> None:
    node.agent.report["dra"]["nriConnected"] = False
    c = fails(node.run(), "DRA NRI", "io.containerd.nri.v1.nri", "socket_path", "nriSocket")
    assert "not connected" in c.detail


def test_a_cdi_dir_missing_or_a_file_fails(node: Node) -> None:
    cdi = Path(node.config["cdiDir"])
    cdi.rmdir()
    c = fails(node.run(), "DRA CDI dir", "cdiDir", "cdi_spec_dirs")
    assert f"{cdi} does not exist" in c.detail
    cdi.write_text("")
    c = fails(node.run(), "DRA CDI dir", "cdiDir")
    assert "not a directory" in c.detail


def test_a_cdi_dir_that_takes_no_file_fails(node: Node) -> None:
    # procfs: a directory in which even root cannot create a file.
    node.write_config(cdiDir="/proc/1")
    c = fails(node.run(), "DRA CDI dir", "writable", "cdiDir")
    assert "cannot create a file in /proc/1" in c.detail


def test_dra_rbac_asks_subresources_and_the_drivers_name_and_grants_exactly_what_is_denied(node: Node) -> None:
    for access in (doctor.Access("associated-node:patch", "resource.k8s.io", "resourceclaims", "driver",
                                 "tenantnet.io"),
                   doctor.Access("patch", "resource.k8s.io", "resourceclaims", "status")):
        node.api.allowed.discard((AGENT_SA, access.verb, str(access).removeprefix(f"{access.verb} ")))
    c = fails(node.run(), "RBAC agent DRA", "--serviceaccount=kube-system:tenantnet")
    assert c.detail.startswith("ServiceAccount kube-system/tenantnet may not patch "
                               "resourceclaims.resource.k8s.io/status, associated-node:patch "
                               "resourceclaims.resource.k8s.io/driver named tenantnet.io"), c.detail
    assert c.fix.split(" && ") == [
        "kubectl create clusterrole tenantnet-agent-dra-patch --verb=patch "
        "--resource=resourceclaims.resource.k8s.io/status",
        "kubectl create clusterrolebinding tenantnet-agent-dra-patch --clusterrole=tenantnet-agent-dra-patch "
        "--serviceaccount=kube-system:tenantnet",
        "kubectl create clusterrole tenantnet-agent-dra-associated-node-patch --verb=associated-node:patch "
        "--resource=resourceclaims.resource.k8s.io/driver --resource-name=tenantnet.io",
        "kubectl create clusterrolebinding tenantnet-agent-dra-associated-node-patch "
        "--clusterrole=tenantnet-agent-dra-associated-node-patch --serviceaccount=kube-system:tenantnet"]
    assert checks_ok_without_dra(node)


def checks_ok_without_dra(node: Node) -> bool:
    """With dra off, the DRA RBAC is not asked (its denial FAILs nothing)."""
    node.write_config(dra=None)
    checks = node.run()
    return "RBAC agent DRA" not in checks and doctor.exit_code(list(checks.values())) == 0


# ---- bounds, output, the command line -----------------------------------------------------------

def test_a_family_that_hangs_fails_at_the_bound(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(Doctor, "family_bound", lambda self: 0.5)
    monkeypatch.setattr(Doctor, "check_etcd", lambda self: [release.wait(30), []][1])
    try:
        checks = node.run()
    finally:
        release.set()
    c = checks["etcd"]
    assert c.status == Status.FAIL and "did not finish within 0.5s" in c.detail


def test_a_check_that_raises_is_its_family_fail_not_a_traceback(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: Doctor) -> list[doctor.Check]:
        raise RuntimeError("kaput")

    monkeypatch.setattr(Doctor, "check_sriov", boom)
    c = node.run()["SR-IOV"]
    assert c.status == Status.FAIL and "RuntimeError: kaput" in c.detail


def test_table_shows_fix_lines_and_a_summary() -> None:
    checks = [doctor.passed("a", "fine"), doctor.failed("bb", "broken", "mend it"),
              doctor.skipped("c", "cannot tell"), doctor.warned("d", "meh", "tune it")]
    text = doctor.render_table(checks).splitlines()
    assert text[0].split() == ["PASS", "a", "fine"]
    assert text[1].split()[:2] == ["FAIL", "bb"] and text[2].strip() == "fix: mend it"
    assert text[3].split()[:2] == ["SKIP", "c"] and "fix" not in text[3]
    assert text[5].strip() == "fix: tune it"
    assert text[-1] == "1 passed, 1 failed, 1 warnings, 1 skipped"


def ctl(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    o = node.opts
    argv = [str(BIN / "tenantnetctl"), "--node-config", o.node_config or "", "doctor", "--cni-conf-dir",
            o.cni_conf_dir, "--cni-bin-dir", o.cni_bin_dir, "--kubeconfig", o.kubeconfig or "",
            "--kube-client", "builtin", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=o.environ, check=False)


def test_cli_exit_codes_and_json(node: Node) -> None:
    # No ovs-offload network: the eswitch's test VF control exists in this process only.
    # Doctor.local_addresses is not patched in the child: one rail, its encap IP one this
    # process's namespace surely has (so the real rtnetlink read is exercised too).
    node.ovsdb.external_ids["ovn-encap-ip"] = "127.0.0.1"
    node.write_config(tenancy={**POLICY, "networks": {k: v for k, v in POLICY["networks"].items() if k != "rail-3"}},
                      ovn={**node.config["ovn"], "rails": {"rail0": OVN["rails"]["rail0"]}})
    run = ctl(node, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] is True and {c["status"] for c in report["checks"]} == {"PASS"}
    assert set(report["checks"][0]) == {"name", "status", "detail", "fix"}
    node.ovsdb.bridges.discard("br-t")
    run = ctl(node)
    assert run.returncode == 1
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("FAIL"))
    assert "bridge br-t" in line
    assert "fix: ovs-vsctl" in run.stdout and run.stderr == ""


def test_cli_node_config_after_the_subcommand_and_usage_errors(node: Node) -> None:
    o = node.opts
    run = subprocess.run([str(BIN / "tenantnetctl"), "doctor", "--node-config", o.node_config or "",
                          "--cni-conf-dir", o.cni_conf_dir, "--cni-bin-dir", o.cni_bin_dir, "--json"],
                         capture_output=True, text=True, timeout=120, env=o.environ, check=False)
    assert json.loads(run.stdout)["checks"][0]["detail"] == f"loaded {o.node_config}"
    bad = ctl(node, "--agent-service-account", "tenantnet")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "NAMESPACE/NAME" in bad.stderr
    assert "Traceback" not in bad.stderr


# ---- the built-in client's reading of kubeconfigs --------------------------------------------

def test_kubeconfig_data_fields_relative_files_and_a_lone_context(tmp_path: Path) -> None:
    import base64

    from tenantnet.ops import kubeclient

    (tmp_path / "token").write_text("s3cret\n")
    (tmp_path / "ca.pem").write_text("CA PEM")
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443/", "certificate-authority": "ca.pem"}}],
        "users": [{"name": "u", "user": {"tokenFile": "token",
                                         "client-certificate-data": base64.b64encode(b"CERT").decode(),
                                         "client-key-data": base64.b64encode(b"KEY").decode()}}],
        "contexts": [{"name": "only", "context": {"cluster": "c", "user": "u"}}]}))
    creds = kubeclient.credentials_from_kubeconfig(str(kc))
    assert creds == kubeclient.Credentials("https://10.0.0.1:6443", ca_pem="CA PEM", cert_pem=b"CERT",
                                           key_pem=b"KEY", token="s3cret")


@pytest.mark.parametrize("change, words", [
    ({"current-context": "gone"}, "no context named 'gone'"),
    ({"clusters": [{"name": "c", "cluster": {"server": "10.0.0.1"}}]}, "no https:// server"),
    ({"users": [{"name": "u", "user": {"auth-provider": {"name": "oidc"}}}]}, "auth-provider plugin"),
    ({"users": [{"name": "u", "user": {"client-certificate": "/nonexistent/cert"}}]}, "cannot read client-certificate"),
])
def test_kubeconfig_problems_are_named(tmp_path: Path, change: dict[str, Any], words: str) -> None:
    from tenantnet.ops import kubeclient

    base = {"current-context": "x", "clusters": [{"name": "c", "cluster": {"server": "https://h"}}],
            "users": [{"name": "u", "user": {}}], "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump({**base, **change}))
    with pytest.raises(kubeclient.KubeUnavailable, match=words.replace("(", r"\(")):
        kubeclient.credentials_from_kubeconfig(str(kc))


def test_kubeconfig_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    from tenantnet.ops import kubeclient

    os.mkfifo(tmp_path / "kc")
    with pytest.raises(kubeclient.KubeUnavailable, match="not a regular file"):
        kubeclient.credentials_from_kubeconfig(str(tmp_path / "kc"))


def test_kubeconfig_search_order(tmp_path: Path) -> None:
    from tenantnet.ops import kubeclient

    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    (tmp_path / "env-kc").write_text("{}")
    env = {"HOME": str(tmp_path), "KUBECONFIG": f"{tmp_path}/missing:{tmp_path}/env-kc"}
    assert kubeclient.find_kubeconfig("/given", env) == ("/given", "--kubeconfig")
    assert kubeclient.find_kubeconfig(None, env) == (f"{tmp_path}/env-kc", "$KUBECONFIG")
    assert kubeclient.find_kubeconfig(None, {"HOME": str(tmp_path)}) == (f"{tmp_path}/.kube/config", "found")
