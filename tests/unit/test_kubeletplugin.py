"""The DRA kubelet plugin (tenantnet/kube/kubeletplugin.py) and its generated stubs.

The oracle is the kubelet's own API: stubs generated here, at test time, with grpcio-tools
from the reference .proto files in /work/shared/k8s/protos (pluginregistration/v1,
dra/v1), never from ours. They run in a client subprocess: the reference and our stubs
define the same proto symbols, which one process's descriptor pool refuses to hold twice.

- Registration and the DRA service through the reference stubs against a plugin serving on
  sockets in a private directory: GetInfo (type, name, endpoint, versions), both verdicts
  of NotifyRegistrationStatus, NodePrepareResources (a claim with two devices and CDI IDs,
  one the handler refuses, one it leaves out, a handler that raises, a wrong answer type),
  NodeUnprepareResources; bad input (an empty, an uppercase UID, a bad namespace or name,
  a UID twice, 300 claims in one call) answered per claim; no traceback on stderr.
- The sockets: modes, parents made, the stale socket of a killed plugin replaced, a live
  socket, a regular file, a symlink and a directory refused; `stop` removes both sockets
  but never one that is no longer its own.
- The tree's generated stubs (the Makefile's): their descriptors equal what protoc makes of
  our .proto now (not stale), and agree with the reference on package, services, methods,
  messages and every kept field's number, type and label.
- Importing the module imports neither grpc nor protobuf (`start` does).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.kube import kubeletplugin as kp
from tenantnet.kube.kubeletplugin import (
    ClaimRef,
    KubeletPlugin,
    KubeletPluginError,
    PreparedDevice,
    PrepareResult,
)

REFERENCE = Path("/work/shared/k8s/protos")
REPO = Path(__file__).resolve().parents[2]
DRIVER = "tenantnet.io"

UID_OK = "0b6a5c2e-1d2f-4c3b-9a8e-7f6d5c4b3a21"
UID_REFUSED = "1c7b6d3f-2e30-4d4c-8b9f-806e7d6c5b32"
UID_MISSING = "2d8c7e40-3f41-4e5d-9ca0-917f8e7d6c43"
UID_BOOM = "3e9d8f51-4052-4f6e-8db1-a2809f8e7d54"
UID_WRONG = "4fae9062-5163-4a7f-9ec2-b391a09f8e65"

DEVICES_OK = (PreparedDevice(("rail",), "node-a", "rail-0", ("tenantnet.io/rail=rail-0",)),
              PreparedDevice(("rail", "spare"), "node-a", "rail-1",
                             ("tenantnet.io/rail=rail-1", "tenantnet.io/rdma=mlx5_1")))

# The client: reads [{socket, call, request}] as JSON on stdin, calls each through the
# reference stubs and prints one JSON answer per call (the message as a dict with the
# proto's field names, or the gRPC status code of a failed call).
CLIENT = r'''
import json, sys
import grpc
from google.protobuf import json_format
from pluginregistration.v1 import api_pb2 as reg, api_pb2_grpc as reg_grpc
from dra.v1 import api_pb2 as dra, api_pb2_grpc as dra_grpc

CALLS = {
    "GetInfo": (reg_grpc.RegistrationStub, reg.InfoRequest),
    "NotifyRegistrationStatus": (reg_grpc.RegistrationStub, reg.RegistrationStatus),
    "NodePrepareResources": (dra_grpc.DRAPluginStub, dra.NodePrepareResourcesRequest),
    "NodeUnprepareResources": (dra_grpc.DRAPluginStub, dra.NodeUnprepareResourcesRequest),
}
out = []
for c in json.load(sys.stdin):
    stub_class, request_class = CALLS[c["call"]]
    with grpc.insecure_channel("unix:" + c["socket"]) as channel:
        stub = stub_class(channel)
        request = json_format.ParseDict(c["request"], request_class())
        try:
            answer = getattr(stub, c["call"])(request, timeout=30)
        except grpc.RpcError as exc:
            out.append({"grpc_error": exc.code().name, "details": exc.details()})
            continue
    out.append(json_format.MessageToDict(answer, preserving_proto_field_name=True))
print(json.dumps(out))
'''


def _protoc(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference stubs and descriptor set, generated now from the kubelet's .proto files."""
    out = tmp_path_factory.mktemp("reference")
    protos = ["pluginregistration/v1/api.proto", "dra/v1/api.proto"]
    _protoc(f"-I{REFERENCE}", f"--python_out={out}", f"--grpc_python_out={out}",
            f"--descriptor_set_out={out / 'reference.pb'}", *(str(REFERENCE / p) for p in protos))
    (out / "client.py").write_text(CLIENT)
    return out


def call(reference: Path, *calls: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    """(socket, call, request as a dict) through the reference stubs; the answers."""
    proc = subprocess.run([sys.executable, str(reference / "client.py")], cwd=reference,
                          env={**os.environ, "PYTHONPATH": str(reference)}, capture_output=True, text=True,
                          input=json.dumps([{"socket": s, "call": c, "request": r} for s, c, r in calls]),
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


def claim(uid: str, namespace: str = "tenant-a", name: str = "rails") -> dict[str, str]:
    return {"namespace": namespace, "name": name, "uid": uid}


class Log:
    """A structlog-like logger that keeps what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _log(self, level: str, event: str, **kw: Any) -> None:
        self.events.append((level, event, kw))

    def info(self, event: str, **kw: Any) -> None:
        self._log("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._log("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._log("error", event, **kw)


class Handler:
    """Answers by UID: UID_OK two devices, UID_REFUSED an error, UID_MISSING nothing,
    UID_WRONG a string instead of a PrepareResult; any call with UID_BOOM raises."""

    def __init__(self) -> None:
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        self.prepared.append(claims)
        if any(c.uid == UID_BOOM for c in claims):
            raise RuntimeError("the PF vanished")
        out: dict[str, Any] = {}
        for c in claims:
            if c.uid == UID_REFUSED:
                out[c.uid] = PrepareResult(error="tenant-b may not use TenantNetwork rails-a")
            elif c.uid == UID_WRONG:
                out[c.uid] = "ok"
            elif c.uid != UID_MISSING:
                out[c.uid] = PrepareResult(devices=DEVICES_OK if c.uid == UID_OK else ())
        return out

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        self.unprepared.append(claims)
        if any(c.uid == UID_BOOM for c in claims):
            raise OSError(16, "Device or resource busy")
        return {c.uid: ("still in use" if c.uid == UID_REFUSED else "") for c in claims if c.uid != UID_MISSING}


@pytest.fixture
def root() -> Iterator[str]:
    # Short: a unix socket path has at most 107 bytes (pytest's tmp_path can be longer).
    d = tempfile.mkdtemp(prefix="kp", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def plugin(root: str) -> Iterator[KubeletPlugin]:
    p = KubeletPlugin(DRIVER, Handler(), kubelet_root_dir=root, log=Log(), workers=4)
    p.start()
    try:
        yield p
    finally:
        p.stop()


# ---------------------------------------------------------------------------- registration


def test_get_info_names_the_driver_its_dra_socket_and_v1(reference: Path, plugin: KubeletPlugin,
                                                         root: str) -> None:
    [info] = call(reference, (plugin.registration_socket, "GetInfo", {}))
    assert info == {"type": "DRAPlugin", "name": DRIVER, "endpoint": f"{root}/plugins/{DRIVER}/dra.sock",
                    "supported_versions": ["v1.DRAPlugin"]}
    assert plugin.registration_socket == f"{root}/plugins_registry/{DRIVER}-reg.sock"


def test_notify_registration_status_both_verdicts(reference: Path, plugin: KubeletPlugin) -> None:
    assert not plugin.registered and plugin.registration_error == ""
    [ok] = call(reference, (plugin.registration_socket, "NotifyRegistrationStatus", {"plugin_registered": True}))
    assert ok == {} and plugin.registered and plugin.registration_error == ""
    [refused] = call(reference, (plugin.registration_socket, "NotifyRegistrationStatus",
                                 {"plugin_registered": False, "error": "version check failed"}))
    assert refused == {} and not plugin.registered
    assert plugin.registration_error == "version check failed"
    assert ("error", "dra.registration_refused", {"driver": DRIVER, "error": "version check failed"}) \
        in plugin.log.events


# ---------------------------------------------------------------------------- prepare / unprepare


def test_prepare_answers_each_claim(reference: Path, plugin: KubeletPlugin,
                                    capfd: pytest.CaptureFixture[str]) -> None:
    sock = plugin.dra_socket
    mixed, boom = call(reference,
                       (sock, "NodePrepareResources", {"claims": [claim(UID_OK), claim(UID_REFUSED, "tenant-b"),
                                                                  claim(UID_MISSING), claim(UID_WRONG)]}),
                       (sock, "NodePrepareResources", {"claims": [claim(UID_BOOM)]}))
    claims = mixed["claims"]
    assert set(claims) == {UID_OK, UID_REFUSED, UID_MISSING, UID_WRONG}
    assert claims[UID_OK] == {"devices": [
        {"request_names": ["rail"], "pool_name": "node-a", "device_name": "rail-0",
         "cdi_device_ids": ["tenantnet.io/rail=rail-0"]},
        {"request_names": ["rail", "spare"], "pool_name": "node-a", "device_name": "rail-1",
         "cdi_device_ids": ["tenantnet.io/rail=rail-1", "tenantnet.io/rdma=mlx5_1"]}]}
    assert claims[UID_REFUSED] == {"error": "tenant-b may not use TenantNetwork rails-a"}
    assert claims[UID_MISSING] == {"error": f"{DRIVER}: the driver gave no answer for claim {UID_MISSING}"}
    assert "not PrepareResult" in claims[UID_WRONG]["error"]
    assert boom == {"claims": {UID_BOOM: {"error": f"{DRIVER}: preparing failed: RuntimeError: the PF vanished"}}}
    # The handler saw the checked claims, as ClaimRefs, in order.
    handler = plugin.handler
    assert isinstance(handler, Handler)
    assert handler.prepared[0] == [ClaimRef("tenant-a", "rails", UID_OK), ClaimRef("tenant-b", "rails", UID_REFUSED),
                                   ClaimRef("tenant-a", "rails", UID_MISSING),
                                   ClaimRef("tenant-a", "rails", UID_WRONG)]
    # The exception is logged with its traceback, not printed.
    [failed] = [kw for level, event, kw in plugin.log.events if event == "dra.prepare_failed"]
    assert isinstance(failed["exc_info"], RuntimeError) and failed["claims"] == [UID_BOOM]
    assert "Traceback" not in capfd.readouterr().err


def test_unprepare_answers_every_claim(reference: Path, plugin: KubeletPlugin,
                                       capfd: pytest.CaptureFixture[str]) -> None:
    sock = plugin.dra_socket
    mixed, boom = call(reference,
                       (sock, "NodeUnprepareResources", {"claims": [claim(UID_OK), claim(UID_REFUSED),
                                                                    claim(UID_MISSING)]}),
                       (sock, "NodeUnprepareResources", {"claims": [claim(UID_BOOM)]}))
    # proto3: an empty error is not on the wire, so the entry is an empty message.
    assert mixed == {"claims": {UID_OK: {}, UID_REFUSED: {"error": "still in use"},
                                UID_MISSING: {"error": f"{DRIVER}: the driver gave no answer for claim {UID_MISSING}"}}}
    assert boom == {"claims": {UID_BOOM: {
        "error": f"{DRIVER}: unpreparing failed: OSError: [Errno 16] Device or resource busy"}}}
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("bad, message", [
    (claim(""), "claim uid '' is not a lowercase RFC 4122 UUID"),
    (claim(UID_OK.upper()), "is not a lowercase RFC 4122 UUID"),
    (claim("../../etc"), "is not a lowercase RFC 4122 UUID"),
    (claim(UID_OK, namespace=""), "namespace '' is not a DNS-1123 label"),
    (claim(UID_OK, namespace="Tenant_A"), "namespace 'Tenant_A' is not a DNS-1123 label"),
    (claim(UID_OK, namespace="a" * 64), "is not a DNS-1123 label"),
    (claim(UID_OK, name="rails/../x"), "name 'rails/../x' is not a DNS-1123 subdomain"),
    (claim(UID_OK, name="x" * 254), "is not a DNS-1123 subdomain"),
])
def test_a_bad_claim_gets_its_own_error_and_never_reaches_the_handler(
        reference: Path, plugin: KubeletPlugin, bad: dict[str, str], message: str) -> None:
    good = claim(UID_REFUSED, "tenant-b")
    prepared, unprepared = call(reference, (plugin.dra_socket, "NodePrepareResources", {"claims": [bad, good]}),
                                (plugin.dra_socket, "NodeUnprepareResources", {"claims": [bad, good]}))
    assert message in prepared["claims"][bad["uid"]]["error"]
    assert message in unprepared["claims"][bad["uid"]]["error"]
    assert prepared["claims"][UID_REFUSED] == {"error": "tenant-b may not use TenantNetwork rails-a"}
    handler = plugin.handler
    assert isinstance(handler, Handler)
    assert handler.prepared == [[ClaimRef("tenant-b", "rails", UID_REFUSED)]]
    assert handler.unprepared == [[ClaimRef("tenant-b", "rails", UID_REFUSED)]]


def test_more_than_max_claims_in_one_call(reference: Path, plugin: KubeletPlugin) -> None:
    uids = [f"00000000-0000-4000-8000-{i:012x}" for i in range(300)]
    [answer] = call(reference, (plugin.dra_socket, "NodePrepareResources", {"claims": [claim(u) for u in uids]}))
    assert set(answer["claims"]) == set(uids)
    assert all(answer["claims"][u] == {} for u in uids[:kp.MAX_CLAIMS])   # prepared, no devices
    for u in uids[kp.MAX_CLAIMS:]:
        assert answer["claims"][u]["error"] == (f"claim {u} not handled: more than {kp.MAX_CLAIMS} claims "
                                                "in one call (the kubelet retries it)")
    handler = plugin.handler
    assert isinstance(handler, Handler)
    assert [c.uid for c in handler.prepared[0]] == uids[:kp.MAX_CLAIMS]


def test_one_uid_twice() -> None:
    same = ClaimRef("tenant-a", "rails", UID_OK)
    assert kp.admit([same, same]) == ([same], {})
    admitted, errors = kp.admit([same, ClaimRef("tenant-b", "other", UID_OK)])
    assert admitted == [] and "sent twice in one call, as tenant-a/rails and as tenant-b/other" in errors[UID_OK]


def test_a_device_without_pool_or_name_fails_its_claim(root: str) -> None:
    class Sloppy:
        def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
            return {c.uid: PrepareResult(devices=(PreparedDevice((), "", "rail-0"),)) for c in claims}

        def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
            return {}

    p = KubeletPlugin(DRIVER, Sloppy(), kubelet_root_dir=root, log=Log())
    [(devices, error)] = p.prepare([ClaimRef("tenant-a", "rails", UID_OK)]).values()
    assert devices == () and "device without pool or name" in error


# ---------------------------------------------------------------------------- the sockets


def test_sockets_modes_and_directories(plugin: KubeletPlugin, root: str) -> None:
    for path in (plugin.dra_socket, plugin.registration_socket):
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, path
    for d in (f"{root}/plugins", f"{root}/plugins/{DRIVER}", f"{root}/plugins_registry"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o750, d
    # Nothing hidden left over from the bind-then-rename.
    assert os.listdir(f"{root}/plugins_registry") == [f"{DRIVER}-reg.sock"]
    assert os.listdir(f"{root}/plugins/{DRIVER}") == ["dra.sock"]


def test_stop_removes_both_sockets_and_serves_no_more(reference: Path, root: str) -> None:
    p = KubeletPlugin(DRIVER, Handler(), kubelet_root_dir=root, log=Log())
    p.start()
    reg, dra = p.registration_socket, p.dra_socket
    p.stop()
    assert not os.path.lexists(reg) and not os.path.lexists(dra)
    assert not p.registered
    p.stop()   # twice: harmless


def test_stop_leaves_a_socket_that_is_no_longer_its_own(root: str) -> None:
    p = KubeletPlugin(DRIVER, Handler(), kubelet_root_dir=root, log=Log())
    p.start()
    # Another instance took the registration path over (a new socket, another inode).
    os.unlink(p.registration_socket)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        other.bind(p.registration_socket)
        p.stop()
        assert stat.S_ISSOCK(os.lstat(p.registration_socket).st_mode)
        assert not os.path.lexists(p.dra_socket)
    finally:
        other.close()


def test_a_stale_socket_is_replaced(root: str, reference: Path) -> None:
    """A killed plugin's socket file: still there, nobody listening."""
    path = f"{root}/plugins_registry/{DRIVER}-reg.sock"
    os.makedirs(os.path.dirname(path))
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.close()
    p = KubeletPlugin(DRIVER, Handler(), kubelet_root_dir=root, log=Log())
    p.start()   # (the inode number may well be the same again: the old one was freed)
    try:
        [info] = call(reference, (path, "GetInfo", {}))
        assert info["name"] == DRIVER
    finally:
        p.stop()


def test_a_live_socket_is_refused(root: str) -> None:
    first = KubeletPlugin(DRIVER, Handler(), kubelet_root_dir=root, log=Log())
    first.start()
    try:
        second = KubeletPlugin(DRIVER, Handler(), kubelet_root_dir=root, log=Log())
        with pytest.raises(KubeletPluginError, match=r"dra.sock is served by another process"):
            second.start()
        # The refusal took nothing of the first one's.
        assert stat.S_ISSOCK(os.lstat(first.dra_socket).st_mode)
        assert stat.S_ISSOCK(os.lstat(first.registration_socket).st_mode)
    finally:
        first.stop()


@pytest.mark.parametrize("kind", ["regular file", "symlink", "directory"])
def test_anything_else_at_the_path_is_refused(root: str, kind: str) -> None:
    path = Path(root) / "plugins_registry" / f"{DRIVER}-reg.sock"
    path.parent.mkdir()
    if kind == "regular file":
        path.write_text("not a socket")
    elif kind == "symlink":
        path.symlink_to("/run/elsewhere.sock")
    else:
        path.mkdir()
    p = KubeletPlugin(DRIVER, Handler(), kubelet_root_dir=root, log=Log())
    with pytest.raises(KubeletPluginError, match=rf"reg.sock exists and is a {kind}, not a socket: refusing"):
        p.start()
    assert os.path.lexists(path)
    # The DRA socket made before the refusal is gone again.
    assert not os.path.lexists(p.dra_socket)


def test_bad_driver_names_and_paths(root: str) -> None:
    for name in ("", "Tenantnet.io", "a/b", "../x", "x" * 64):
        with pytest.raises(ValueError, match="is not a DNS-1123 subdomain"):
            KubeletPlugin(name, Handler(), kubelet_root_dir=root)
    with pytest.raises(ValueError, match="must be an absolute path"):
        KubeletPlugin(DRIVER, Handler(), kubelet_root_dir="var/lib/kubelet")
    long_root = os.path.join(root, "k" * 80)
    with pytest.raises(KubeletPluginError, match=r"a unix socket path has at most 107"):
        KubeletPlugin(DRIVER, Handler(), kubelet_root_dir=long_root, log=Log()).start()


# ---------------------------------------------------------------------------- the generated stubs


def _descriptors(path: Path) -> dict[str, Any]:
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(path.read_bytes())
    return {f.name: f for f in fds.file}


def _ours(module: Any) -> Any:
    from google.protobuf import descriptor_pb2

    return descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)


def _without_json_names(fd: Any) -> Any:
    """protoc's --descriptor_set_out writes each field's json_name; the descriptor it embeds in
    generated code leaves the default ones out. Nothing else differs."""
    fd = type(fd).FromString(fd.SerializeToString())

    def walk(msgs: Any) -> None:
        for m in msgs:
            for f in m.field:
                f.ClearField("json_name")
            walk(m.nested_type)

    walk(fd.message_type)
    return fd


def _messages(fd: Any) -> dict[str, Any]:
    """Every message of a file, nested ones included, by fully qualified name."""
    out: dict[str, Any] = {}

    def walk(prefix: str, msgs: Any) -> None:
        for m in msgs:
            out[f"{prefix}.{m.name}"] = m
            walk(f"{prefix}.{m.name}", m.nested_type)

    walk(f".{fd.package}", fd.message_type)
    return out


@pytest.mark.parametrize("ours_name, reference_name, left_out", [
    ("pluginregistration", "pluginregistration/v1/api.proto", set()),
    ("dra", "dra/v1/api.proto", {".k8s.io.kubelet.pkg.apis.dra.v1.Device.share_id"}),
])
def test_generated_stubs_agree_with_the_reference(reference: Path, ours_name: str, reference_name: str,
                                                  left_out: set[str]) -> None:
    import importlib

    module = importlib.import_module(f"tenantnet.kube.proto.{ours_name}_pb2")
    assert Path(module.__file__).resolve() == REPO / "tenantnet" / "kube" / "proto" / f"{ours_name}_pb2.py"
    ours = _ours(module)
    ref = _descriptors(reference / "reference.pb")[reference_name]
    assert ours.package == ref.package and ours.syntax == ref.syntax == "proto3"

    def services(fd: Any) -> dict[str, Any]:
        return {s.name: {m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                         for m in s.method} for s in fd.service}

    assert services(ours) == services(ref)
    ours_msgs, ref_msgs = _messages(ours), _messages(ref)
    assert set(ours_msgs) == set(ref_msgs)
    dropped = set()
    for name, ref_msg in ref_msgs.items():
        kept = {f.name: f for f in ours_msgs[name].field}
        assert ours_msgs[name].options.map_entry == ref_msg.options.map_entry, name
        for f in ref_msg.field:
            if f.name not in kept:
                dropped.add(f"{name}.{f.name}")
                continue
            mine = kept.pop(f.name)
            assert (mine.number, mine.type, mine.label, mine.type_name) == \
                   (f.number, f.type, f.label, f.type_name), f"{name}.{f.name}"
        assert not kept, f"{name}: fields the reference does not have: {sorted(kept)}"
    assert dropped == left_out


@pytest.mark.parametrize("name", ["pluginregistration", "dra"])
def test_the_tree_uses_stubs_of_the_current_proto(tmp_path: Path, name: str) -> None:
    """The stubs the tree imports are what protoc makes of our .proto now (`make` regenerated them)."""
    import importlib

    _protoc("-I", str(REPO), f"--descriptor_set_out={tmp_path / 'ours.pb'}",
            str(REPO / "tenantnet" / "kube" / "proto" / f"{name}.proto"))
    [now] = _descriptors(tmp_path / "ours.pb").values()
    assert _ours(importlib.import_module(f"tenantnet.kube.proto.{name}_pb2")) == _without_json_names(now)


def test_importing_the_module_imports_neither_grpc_nor_protobuf() -> None:
    """The dataclasses are imported by driver code that may sit near a plugin call's path;
    grpc and protobuf come with `start` only."""
    probe = ("import sys; import tenantnet.kube.kubeletplugin; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google', 'structlog') "
             "or m.startswith('tenantnet.kube.proto')))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert proc.stdout.strip() == "[]"
