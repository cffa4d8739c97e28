"""tenantnet/kube/nri.py against a fake runtime written here: the NRI multiplexer and ttrpc
framing (bounded frames, fragments, malformed and oversized messages, unknown ids, a peer that
drops or stalls mid-frame → reconnect), the start sequence and the handler semantics.

The fake's framing is its own few lines of `struct` (not the module's), so a change to one
side shows; still, both were written from the same reading of NRI v0.12.0 and ttrpc v1.2.8,
so the independent oracle is the real containerd: tests/e2e/test_nri_kube.py.
"""

from __future__ import annotations

import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.kube import nri
from tenantnet.kube.proto import nri_pb2, ttrpc_pb2
from tests.polling import poll

WAIT = 10.0  # generous: these only bound a hang, they are not measured


class _Quiet:
    """A logger that says nothing: the disconnections these tests cause on purpose would
    print from the plugin's thread after pytest stopped capturing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Recorder:
    """A handler recording its calls; `refuse`/`explode` make run_pod_sandbox fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.refuse = ""
        self.explode = False
        self.gates: dict[str, threading.Event] = {}  # sandbox id -> released when set
        self.lock = threading.Lock()

    def _record(self, what: str, arg: Any) -> None:
        with self.lock:
            self.calls.append((what, arg))

    def synchronize(self, pods: list[nri.PodSandbox]) -> None:
        self._record("synchronize", pods)

    def run_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        gate = self.gates.get(pod.id)
        if gate is not None:
            assert gate.wait(WAIT)
        self._record("run", pod)
        if self.refuse:
            raise nri.NriRefusal(self.refuse)
        if self.explode:
            raise KeyError("no such claim")

    def stop_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self._record("stop", pod)
        if self.explode:
            raise OSError("netns gone")

    def remove_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self._record("remove", pod)

    def seen(self, what: str) -> list[Any]:
        with self.lock:
            return [a for w, a in self.calls if w == what]


class FakeRuntimeConn:
    """One accepted plugin connection, seen from the runtime: the mux and ttrpc by hand."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(WAIT)
        self.streams: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.next_stream = 1

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise EOFError("plugin closed")
            buf += got
        return buf

    def frame(self) -> tuple[int, bytes]:
        cid, length = struct.unpack(">II", self._exact(8))
        return cid, self._exact(length) if length else b""

    def message(self, cid: int) -> tuple[int, int, bytes]:
        """The next whole ttrpc message on `cid`: (stream id, type, body)."""
        while True:
            buf = self.streams[cid]
            if len(buf) >= 10:
                length, sid, kind, _flags = struct.unpack(">IIBB", buf[:10])
                if len(buf) >= 10 + length:
                    body = bytes(buf[10:10 + length])
                    del buf[:10 + length]
                    return sid, kind, body
            got_cid, payload = self.frame()
            assert len(payload) <= 4096, "the plugin must write frames of at most 4 KiB"
            self.streams[got_cid] += payload

    def send(self, cid: int, data: bytes) -> None:
        self.sock.sendall(struct.pack(">II", cid, len(data)) + data)

    @staticmethod
    def ttrpc(sid: int, kind: int, body: bytes) -> bytes:
        return struct.pack(">IIBB", len(body), sid, kind, 0) + body

    def register(self) -> ttrpc_pb2.Request:
        """Accept the plugin's RegisterPlugin, then Configure it and check its subscription."""
        sid, kind, body = self.message(2)
        request = ttrpc_pb2.Request.FromString(body)
        assert (kind, sid % 2) == (1, 1)
        assert (request.service, request.method) == ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
        self.send(2, self.ttrpc(sid, 2, ttrpc_pb2.Response(payload=b"").SerializeToString()))
        got = self.call("Configure", nri_pb2.ConfigureRequest(runtime_name="fake", request_timeout=2000))
        assert got.status.code == 0
        # RunPodSandbox, StopPodSandbox, RemovePodSandbox: bits 0, 1 and 2
        assert nri_pb2.ConfigureResponse.FromString(got.payload).events == 0b111
        return request

    def call(self, method: str, msg: Any, service: str = "nri.pkg.api.v1alpha1.Plugin") -> ttrpc_pb2.Response:
        sid = self.next_stream
        self.next_stream += 2
        body = ttrpc_pb2.Request(service=service, method=method, payload=msg.SerializeToString())
        self.send(1, self.ttrpc(sid, 1, body.SerializeToString()))
        return self.answer(sid)

    def answer(self, sid: int) -> ttrpc_pb2.Response:
        got_sid, kind, body = self.message(1)
        assert (got_sid, kind) == (sid, 2)
        return ttrpc_pb2.Response.FromString(body)

    def sync(self, *batches: list[Any]) -> None:
        for i, pods in enumerate(batches):
            more = i < len(batches) - 1
            got = self.call("Synchronize", nri_pb2.SynchronizeRequest(pods=pods, more=more))
            assert got.status.code == 0, got.status.message
            assert nri_pb2.SynchronizeResponse.FromString(got.payload).more == more


class FakeRuntime:
    def __init__(self, path: str) -> None:
        self.path = path
        self.listener: socket.socket | None = None

    def listen(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.listener.settimeout(WAIT)

    def accept(self) -> FakeRuntimeConn:
        assert self.listener is not None
        sock, _ = self.listener.accept()
        return FakeRuntimeConn(sock)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


def nri_pod(sid: str, uid: str = "uid-1", netns: str = "/run/netns/cni-1") -> nri_pb2.PodSandbox:
    pod = nri_pb2.PodSandbox(id=sid, uid=uid, name="p-" + sid, namespace="team-a")
    pod.linux.namespaces.add(type="ipc", path="")
    if netns:
        pod.linux.namespaces.add(type="network", path=netns)
    return pod


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeRuntime, Recorder, nri.NriPlugin]]:
    monkeypatch.setattr(nri, "BACKOFF_FIRST", 0.01)
    monkeypatch.setattr(nri, "BACKOFF_MAX", 0.05)
    tmp = tempfile.mkdtemp(prefix="nri-", dir="/tmp")  # short: unix socket paths are 108 bytes at most
    runtime = FakeRuntime(str(Path(tmp) / "nri.sock"))
    handler = Recorder()
    plugin = nri.NriPlugin(runtime.path, handler, name="tenantnet", index="50", log=_Quiet())
    try:
        yield runtime, handler, plugin
    finally:
        plugin.stop()
        runtime.close()
        shutil.rmtree(tmp)


def connected(runtime: FakeRuntime, plugin: nri.NriPlugin, *batches: list[Any]) -> FakeRuntimeConn:
    conn = runtime.accept()
    conn.register()
    conn.sync(*(batches or ([],)))
    assert poll(lambda: plugin.connected, WAIT)
    return conn


# ------------------------------------------------------------------ pure framing


def test_mux_frames_are_cut_at_4k_and_a_reader_rebuilds_messages_from_any_cuts() -> None:
    body = bytes(range(256)) * 40  # 10 KiB
    wire = nri.mux_frames(1, nri.ttrpc_message(7, nri.MSG_REQUEST, body) + nri.ttrpc_message(9, 2, b"x"))
    sizes, at, stream = [], 0, b""
    while at < len(wire):
        cid, length = struct.unpack_from(">II", wire, at)
        assert cid == 1
        sizes.append(length)
        stream += wire[at + 8:at + 8 + length]
        at += 8 + length
    assert max(sizes) == 4096 and sum(sizes) == len(stream)
    reader = nri.TtrpcReader()
    got = [m for b in stream for m in reader.feed(bytes([b]))]  # one byte at a time
    assert [(m.stream_id, m.kind, m.body) for m in got] == [(7, 1, body), (9, 2, b"x")]
    both = nri.TtrpcReader().feed(stream)  # two messages in one piece
    assert [m.stream_id for m in both] == [7, 9]


def test_an_oversized_ttrpc_message_is_skipped_and_reported_once() -> None:
    reader = nri.TtrpcReader()
    big = nri.TTRPC_MESSAGE_MAX + 1
    got = reader.feed(struct.pack(">IIBB", big, 5, 1, 0) + b"a" * 1000)
    assert [(m.stream_id, m.oversized, m.body) for m in got] == [(5, big, b"")]
    left = big - 1000
    assert reader.feed(b"b" * (left - 1)) == []
    after = reader.feed(b"b" + nri.ttrpc_message(7, 1, b"next"))  # the rest, then a good one
    assert [(m.stream_id, m.body) for m in after] == [(7, b"next")]
    with pytest.raises(ValueError, match="at most 4194304"):
        nri.ttrpc_message(1, 1, b"x" * big)


def test_name_and_index_are_checked_as_nri_does() -> None:
    with pytest.raises(ValueError, match="two digits"):
        nri.NriPlugin("/nowhere", Recorder(), index="5")
    with pytest.raises(ValueError, match="letters, digits"):
        nri.NriPlugin("/nowhere", Recorder(), name="tenant net")


# ------------------------------------------------------------------ against the fake runtime


def test_start_sequence_synchronize_in_parts_and_pod_events(env: Any) -> None:
    runtime, handler, plugin = env
    runtime.listen()
    plugin.start()
    conn = runtime.accept()
    request = conn.register()
    reg = nri_pb2.RegisterPluginRequest.FromString(request.payload)
    assert (reg.plugin_name, reg.plugin_idx) == ("tenantnet", "50")
    assert not plugin.connected  # configured, not yet synchronized
    conn.sync([nri_pod("s1", "u1")], [nri_pod("s2", "u2", netns="")])
    assert poll(lambda: plugin.connected, WAIT)
    assert handler.seen("synchronize") == [[
        nri.PodSandbox(id="s1", uid="u1", name="p-s1", namespace="team-a", netns="/run/netns/cni-1"),
        nri.PodSandbox(id="s2", uid="u2", name="p-s2", namespace="team-a", netns="")]]  # once, whole

    got = conn.call("RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=nri_pod("s3", "u3")))
    assert got.status.code == 0
    assert handler.seen("run") == [nri.PodSandbox("s3", "u3", "p-s3", "team-a", "/run/netns/cni-1")]
    assert conn.call("StopPodSandbox", nri_pb2.StopPodSandboxRequest(pod=nri_pod("s3"))).status.code == 0
    assert conn.call("RemovePodSandbox", nri_pb2.RemovePodSandboxRequest(pod=nri_pod("s3"))).status.code == 0
    assert [p.id for p in handler.seen("stop") + handler.seen("remove")] == ["s3", "s3"]
    # the deprecated StateChange form reaches the same handler
    event = nri_pb2.StateChangeEvent(event=nri_pb2.RUN_POD_SANDBOX, pod=nri_pod("s4"))
    assert conn.call("StateChange", event).status.code == 0
    assert [p.id for p in handler.seen("run")] == ["s3", "s4"]
    assert conn.call("Shutdown", nri_pb2.Empty()).status.code == 0


def test_refusal_and_handler_errors_fail_the_start_but_never_the_teardown(env: Any) -> None:
    runtime, handler, plugin = env
    runtime.listen()
    plugin.start()
    conn = connected(runtime, plugin)
    handler.refuse = "claim c1: namespace team-b is not a tenant of rail-a"
    got = conn.call("RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=nri_pod("s1")))
    assert (got.status.code, got.status.message) == (2, handler.refuse)
    handler.refuse, handler.explode = "", True
    got = conn.call("RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=nri_pod("s2")))
    assert got.status.code == 2
    assert "RunPodSandbox failed: KeyError" in got.status.message and "no such claim" in got.status.message
    got = conn.call("StopPodSandbox", nri_pb2.StopPodSandboxRequest(pod=nri_pod("s2")))
    assert got.status.code == 0  # logged, answered OK
    assert plugin.connected


def test_malformed_requests_get_ttrpc_statuses_and_the_connection_stays(env: Any) -> None:
    runtime, handler, plugin = env
    runtime.listen()
    plugin.start()
    conn = connected(runtime, plugin)
    assert conn.call("CreateContainer", nri_pb2.Empty()).status.code == 12  # Unimplemented
    assert conn.call("Configure", nri_pb2.Empty(), service="nri.pkg.api.v1alpha1.Other").status.code == 12
    conn.send(1, conn.ttrpc(4, 1, b""))  # an even stream id
    assert conn.answer(4).status.code == 3
    conn.send(1, conn.ttrpc(5, 1, b"\xff\xff\xff"))  # not a ttrpc.Request
    assert conn.answer(5).status.code == 3
    bad = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method="RunPodSandbox", payload=b"\x0a\x05ab")
    conn.send(1, conn.ttrpc(7, 1, bad.SerializeToString()))  # a truncated RunPodSandboxRequest
    assert conn.answer(7).status.code == 3
    conn.send(1, conn.ttrpc(9, 3, b"data"))  # a data message: NRI has no streams
    assert conn.answer(9).status.code == 3
    conn.send(9, b"frame for a connection nobody opened")
    conn.send(2, conn.ttrpc(41, 2, b""))  # a response to a call never made
    # an oversized request, sent in mux frames of the largest size: skipped, answered
    size = nri.TTRPC_MESSAGE_MAX + 100
    data = struct.pack(">IIBB", size, 11, 1, 0) + b"z" * size
    for at in range(0, len(data), nri.MUX_PAYLOAD_MAX):
        conn.send(1, data[at:at + nri.MUX_PAYLOAD_MAX])
    conn.next_stream = 11
    assert conn.answer(11).status.code == 8  # ResourceExhausted
    conn.next_stream = 13
    assert conn.call("RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=nri_pod("ok"))).status.code == 0
    assert [p.id for p in handler.seen("run")] == ["ok"] and plugin.connected


def test_fragmented_frames_and_byte_by_byte_writes_are_read_whole(env: Any) -> None:
    runtime, handler, plugin = env
    runtime.listen()
    plugin.start()
    conn = connected(runtime, plugin)
    body = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method="RunPodSandbox",
                             payload=nri_pb2.RunPodSandboxRequest(pod=nri_pod("frag")).SerializeToString())
    message = conn.ttrpc(conn.next_stream, 1, body.SerializeToString())
    wire = b"".join(struct.pack(">II", 1, len(message[i:i + 3])) + message[i:i + 3]
                    for i in range(0, len(message), 3))  # 3-byte frames
    for i in range(len(wire)):
        conn.sock.sendall(wire[i:i + 1])  # and the frames themselves dribbled
    assert conn.answer(conn.next_stream).status.code == 0
    assert [p.id for p in handler.seen("run")] == ["frag"]


@pytest.mark.parametrize("breakage", ["too-big-frame", "dropped-mid-frame", "stalled-mid-frame", "eof"])
def test_a_broken_connection_is_dropped_and_made_again(env: Any, breakage: str) -> None:
    runtime, handler, plugin = env
    plugin.stall_timeout = 0.3
    runtime.listen()
    plugin.start()
    conn = connected(runtime, plugin)
    if breakage == "too-big-frame":
        conn.sock.sendall(struct.pack(">II", 1, nri.MUX_PAYLOAD_MAX + 1))
    elif breakage == "dropped-mid-frame":
        conn.sock.sendall(struct.pack(">II", 1, 100) + b"half")
        conn.sock.close()
    elif breakage == "stalled-mid-frame":
        conn.sock.sendall(struct.pack(">II", 1, 100) + b"half")  # and then nothing, connection open
    else:
        conn.sock.close()
    again = runtime.accept()  # the plugin comes back, registers and is synchronized afresh
    again.register()
    assert not plugin.connected
    again.sync([nri_pod("s9")])
    assert poll(lambda: plugin.connected, WAIT)
    assert [len(pods) for pods in handler.seen("synchronize")] == [0, 1]
    if breakage != "dropped-mid-frame" and breakage != "eof":
        with pytest.raises((EOFError, ConnectionError)):  # the plugin closed the old one
            conn.frame()


def test_a_missing_socket_is_waited_for_and_a_refused_registration_retried(env: Any) -> None:
    runtime, handler, plugin = env
    plugin.start()  # nothing listens yet
    assert not poll(lambda: plugin.connected, 0.2)
    runtime.listen()
    conn = runtime.accept()
    sid, _, _ = conn.message(2)
    refused = ttrpc_pb2.Response()
    refused.status.code, refused.status.message = 3, "invalid plugin index"
    conn.send(2, conn.ttrpc(sid, 2, refused.SerializeToString()))
    with pytest.raises((EOFError, ConnectionError)):
        conn.frame()  # the plugin hangs up...
    connected(runtime, plugin)  # ...and comes back


def test_calls_for_one_sandbox_run_in_order_while_others_proceed(env: Any) -> None:
    runtime, handler, plugin = env
    runtime.listen()
    plugin.start()
    conn = connected(runtime, plugin)
    handler.gates["slow"] = gate = threading.Event()

    def send(sid: int, method: str, msg: Any) -> None:
        body = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method=method,
                                 payload=msg.SerializeToString())
        conn.send(1, conn.ttrpc(sid, 1, body.SerializeToString()))

    send(21, "RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=nri_pod("slow")))
    send(23, "StopPodSandbox", nri_pb2.StopPodSandboxRequest(pod=nri_pod("slow")))
    send(25, "RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=nri_pod("fast")))
    assert conn.answer(25).status.code == 0  # another sandbox does not wait for "slow"
    assert handler.seen("stop") == []  # "slow"'s stop waits for its run
    gate.set()
    answers = {conn.message(1)[0] for _ in range(2)}
    assert answers == {21, 23}
    assert [(w, a.id) for w, a in handler.calls if a != [] and w != "synchronize"] == [
        ("run", "fast"), ("run", "slow"), ("stop", "slow")]


def test_stop_hangs_up(env: Any) -> None:
    runtime, handler, plugin = env
    runtime.listen()
    plugin.start()
    conn = connected(runtime, plugin)
    plugin.stop()
    assert not plugin.connected
    with pytest.raises((EOFError, ConnectionError)):
        conn.frame()
