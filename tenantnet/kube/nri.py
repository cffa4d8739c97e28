"""tenantnet's NRI plugin: containerd's pod sandbox events delivered to a Python handler.

The DRA driver prepares a claim's VFs before the pod's sandbox exists (NodePrepareResources);
they move into the pod's network namespace when containerd runs the sandbox, through NRI
(Node Resource Interface). This module is the plugin side of NRI, written against the versions
containerd v2.3.4 vendors — github.com/containerd/nri v0.12.0 and github.com/containerd/ttrpc
v1.2.8 (its go.mod) — read for facts only:

Connection (nri pkg/stub/stub.go Start, pkg/net/multiplex). The plugin dials containerd's NRI
socket (`[plugins.'io.containerd.nri.v1.nri'] socket_path`, /var/run/nri/nri.sock by default;
external connections are on unless `disable_connections = true`). The one stream carries two
logical connections, each frame `conn id (u32 BE) | length (u32 BE) | payload`: id 1
(PluginServiceConn) carries the ttrpc service the plugin serves (the runtime is the client),
id 2 (RuntimeServiceConn) the runtime's service (the plugin is the client). Frames for other
ids are dropped, as NRI's mux does. A frame holds at most 10 + 4 MiB (a ttrpc header and its
largest message); a bigger one is a broken peer and ends the connection.

ttrpc (ttrpc channel.go, request.proto). Each logical connection is a byte stream of
messages `length (u32 BE) | stream id (u32 BE) | type (u8) | flags (u8) | body`, at most
4 MiB of body: a longer one is skipped and answered with ResourceExhausted, as ttrpc's
server does. Type 1 is a request (body: ttrpc.Request, service/method/payload/timeout),
2 its response (ttrpc.Response: a google.rpc.Status and the payload), both on the stream id
the client picked (odd, increasing). Bodies are encoded with the protobuf messages generated
from tenantnet/kube/proto/{nri,ttrpc}.proto; only the framing is written here.

Start sequence. Plugin → Runtime.RegisterPlugin(name, two-digit index); the runtime then
calls Plugin.Configure (we answer the events mask: RunPodSandbox, StopPodSandbox,
RemovePodSandbox), then Plugin.Synchronize with the pods it already runs (`more` set while
more batches follow; each partial answer echoes `more`, the last one is answered after the
handler has seen all pods), and from then on the pod events as they happen, each as its own
RPC (v0.12.0; StateChange is the deprecated form, also accepted). Shutdown tells us the
runtime is going down. A plugin that has not registered within the registration timeout is
dropped (NRI's default 5 s, `plugin_registration_timeout`); every request has the request
timeout (default 2 s, `plugin_request_timeout`; both sent to us in ConfigureRequest).

What containerd does with our answers (containerd v2.3.4 internal/cri/server/sandbox_run.go,
internal/cri/nri/nri_api_linux.go; nri pkg/adaptation/plugin.go):
- RunPodSandbox is called after the sandbox started and after its CNI setup; an error status
  fails the sandbox ("NRI RunPodSandbox failed: rpc error: code = Unknown desc = <ours>"):
  containerd relays StopPodSandbox and RemovePodSandbox to the plugins, tears the sandbox
  down, and the kubelet records FailedCreatePodSandBox and retries with a new sandbox.
- A timeout (the request timeout passed) or a broken connection is "fatal" for NRI: it closes
  the plugin's connection and lets the pod start WITHOUT us. We reconnect and Synchronize
  shows the pod; the agent must reconcile there. The same holds for pods started while no
  plugin is connected (NRI calls only the plugins it has).
- The runtime serialises NRI calls (one lock in the adaptation), so concurrency here is a
  safeguard; still, handler calls for different sandboxes may run in parallel, calls for one
  sandbox id always in order.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

PLUGIN_SERVICE_CONN = 1  # multiplex.PluginServiceConn: we serve the Plugin service here
RUNTIME_SERVICE_CONN = 2  # multiplex.RuntimeServiceConn: we call the Runtime service here
MUX_HEADER = struct.Struct(">II")  # conn id, payload length
TTRPC_HEADER = struct.Struct(">IIBB")  # body length, stream id, type, flags
TTRPC_MESSAGE_MAX = 4 << 20  # ttrpc messageLengthMax
MUX_PAYLOAD_MAX = TTRPC_HEADER.size + TTRPC_MESSAGE_MAX  # multiplex maxPayloadSize
# What we write goes out in frames of at most 4 KiB: the runtime's ttrpc reads its mux
# connection through a 4 KiB bufio.Reader, and the mux refuses (ENOMEM) a Read into a smaller
# buffer than the frame; Go's own plugins write through a 4 KiB bufio.Writer, so do we.
SEND_CHUNK = 4096
MSG_REQUEST, MSG_RESPONSE, MSG_DATA = 1, 2, 3
# gRPC status codes, as ttrpc uses them
OK, UNKNOWN, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNIMPLEMENTED = 0, 2, 3, 8, 12
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
EVENT_RUN_POD_SANDBOX, EVENT_STOP_POD_SANDBOX, EVENT_REMOVE_POD_SANDBOX = 1, 2, 3
# ConfigureResponse.events: bit (event - 1) per event (nri pkg/api/event.go EventMask.Set)
SUBSCRIBED = sum(1 << (e - 1) for e in (EVENT_RUN_POD_SANDBOX, EVENT_STOP_POD_SANDBOX,
                                       EVENT_REMOVE_POD_SANDBOX))
REGISTRATION_TIMEOUT = 5.0  # nri api.DefaultPluginRegistrationTimeout, the stub's own wait too
FRAME_STALL_TIMEOUT = 10.0  # a peer silent this long in the middle of a frame is broken
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
WORKERS = 4
NRI_VERSION = "v0.12.0"  # the API version this plugin speaks, sent at registration


@dataclass(frozen=True)
class PodSandbox:
    id: str  # sandbox id
    uid: str  # the pod's UID
    name: str
    namespace: str
    netns: str  # path of the pod's network namespace ("" when NRI gave none)


class NriRefusal(Exception):
    """Raised by a handler's run_pod_sandbox to fail the pod's start with this message."""


class NriHandler(Protocol):
    """What the plugin calls. Calls for one sandbox id come in order; for different ones they
    may overlap (a small thread pool).

    run_pod_sandbox fails closed: NriRefusal, and any other exception (logged), is answered
    as an error, so containerd fails the sandbox and the kubelet retries it — a pod whose
    rails did not arrive must not run without them. It must return within the runtime's
    request timeout (2 s by default): past it NRI drops the plugin and the pod runs anyway.
    stop_pod_sandbox and remove_pod_sandbox errors are logged and answered OK: containerd
    must always be able to tear a pod down; what the handler could not undo is its own to
    retry. synchronize errors are answered as an error: NRI then drops the connection, and
    the plugin reconnects (with its backoff) and is synchronized again. synchronize has the
    same request timeout: record what it needs and reconcile afterwards, not within the call."""

    def synchronize(self, pods: list[PodSandbox]) -> None: ...
    def run_pod_sandbox(self, pod: PodSandbox) -> None: ...
    def stop_pod_sandbox(self, pod: PodSandbox) -> None: ...
    def remove_pod_sandbox(self, pod: PodSandbox) -> None: ...


class NriProtocolError(Exception):
    """The runtime broke the framing: the connection is dropped and made again."""


class ConnectionLost(Exception):
    """The connection ended (EOF, a reset, a peer stalled mid-frame, stop())."""


# ------------------------------------------------------------------ framing (pure)


def mux_frames(conn_id: int, data: bytes) -> bytes:
    """`data` as mux frames for `conn_id`, each at most SEND_CHUNK bytes of payload."""
    if not data:
        return MUX_HEADER.pack(conn_id, 0)
    out = bytearray()
    for at in range(0, len(data), SEND_CHUNK):
        chunk = data[at:at + SEND_CHUNK]
        out += MUX_HEADER.pack(conn_id, len(chunk)) + chunk
    return bytes(out)


def ttrpc_message(stream_id: int, kind: int, body: bytes, flags: int = 0) -> bytes:
    if len(body) > TTRPC_MESSAGE_MAX:
        raise ValueError(f"ttrpc message of {len(body)} bytes: at most {TTRPC_MESSAGE_MAX} allowed")
    return TTRPC_HEADER.pack(len(body), stream_id, kind, flags) + body


@dataclass(frozen=True)
class TtrpcMessage:
    stream_id: int
    kind: int
    flags: int
    body: bytes
    oversized: int = 0  # the announced length of a message skipped for its size (body empty)


class TtrpcReader:
    """One logical connection's byte stream cut into ttrpc messages, whatever the mux frames'
    boundaries. Holds at most one incomplete message (≤ 10 + 4 MiB) beyond what it was fed: a
    longer message is skipped as its bytes arrive and reported once, with `oversized` set."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized message still to drop

    def feed(self, data: bytes) -> list[TtrpcMessage]:
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        self._buf += data
        out: list[TtrpcMessage] = []
        while len(self._buf) >= TTRPC_HEADER.size:
            length, stream_id, kind, flags = TTRPC_HEADER.unpack_from(self._buf)
            if length > TTRPC_MESSAGE_MAX:
                out.append(TtrpcMessage(stream_id, kind, flags, b"", oversized=length))
                del self._buf[:TTRPC_HEADER.size]
                dropped = min(length, len(self._buf))
                del self._buf[:dropped]
                self._skip = length - dropped
                continue
            end = TTRPC_HEADER.size + length
            if len(self._buf) < end:
                break
            out.append(TtrpcMessage(stream_id, kind, flags, bytes(self._buf[TTRPC_HEADER.size:end])))
            del self._buf[:end]
        return out


def _recv_exact(sock: socket.socket, n: int, at_boundary: bool, stopping: threading.Event) -> bytes:
    """Exactly n bytes. The socket's timeout is the stall limit: silence is fine between
    frames (`at_boundary` and nothing read yet), fatal inside one."""
    buf = bytearray()
    while len(buf) < n:
        try:
            got = sock.recv(n - len(buf))
        except TimeoutError:
            if at_boundary and not buf and not stopping.is_set():
                continue
            raise ConnectionLost("the runtime stopped in the middle of a frame") from None
        except OSError as exc:
            raise ConnectionLost(f"{type(exc).__name__}: {exc}") from None
        if not got:
            raise ConnectionLost("the runtime closed the connection" + (" mid-frame" if buf else ""))
        buf += got
    return bytes(buf)


def read_mux_frame(sock: socket.socket, stopping: threading.Event) -> tuple[int, bytes]:
    conn_id, length = MUX_HEADER.unpack(_recv_exact(sock, MUX_HEADER.size, True, stopping))
    if length > MUX_PAYLOAD_MAX:
        raise NriProtocolError(f"mux frame of {length} bytes: at most {MUX_PAYLOAD_MAX} allowed")
    return conn_id, _recv_exact(sock, length, False, stopping) if length else b""


def pod_from_nri(pod: Any) -> PodSandbox:
    netns = ""
    for ns in pod.linux.namespaces:
        if ns.type == "network":  # OCI's name; containerd drops one whose path is gone
            netns = ns.path
    return PodSandbox(id=pod.id, uid=pod.uid, name=pod.name, namespace=pod.namespace, netns=netns)


# ------------------------------------------------------------------ dispatch


class _OrderedPool:
    """A small thread pool running the calls of one key (a sandbox id) one after another."""

    def __init__(self, workers: int, log: Any) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tenantnet-nri")
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Callable[[], None]]] = {}
        self._log = log

    def submit(self, key: str, call: Callable[[], None]) -> None:
        with self._lock:
            queue = self._queues.get(key)
            if queue is not None:
                queue.append(call)
                return
            self._queues[key] = deque()
        self._pool.submit(self._drain, key, call)

    def _drain(self, key: str, call: Callable[[], None]) -> None:
        while True:
            try:
                call()
            except Exception as exc:  # a bug of ours: the call answers its own errors
                self._log.error("nri.dispatch_failed", key=key, error=f"{type(exc).__name__}: {exc}")
            with self._lock:
                queue = self._queues[key]
                if not queue:
                    del self._queues[key]
                    return
                call = queue.popleft()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Call:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: Any = None
        self.error = ""


class _Session:
    """One connection to the runtime: its reader, its writes, its calls in flight."""

    def __init__(self, plugin: NriPlugin, sock: socket.socket) -> None:
        self.plugin = plugin
        self.sock = sock
        self.log = plugin.log
        self._write_lock = threading.Lock()
        self._readers = {PLUGIN_SERVICE_CONN: TtrpcReader(), RUNTIME_SERVICE_CONN: TtrpcReader()}
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        self._next_stream = 1  # ttrpc: client streams are odd and increase
        self._sync: list[PodSandbox] = []  # pods of a Synchronize sent in parts (`more`)
        self.registered = False
        self.synchronized = False
        self.ended = threading.Event()
        self.reason = ""

    # ---- writing
    def send(self, conn_id: int, data: bytes) -> None:
        frames = mux_frames(conn_id, data)
        with self._write_lock:
            try:
                self.sock.sendall(frames)  # the socket timeout bounds a runtime that stops reading
            except OSError as exc:
                self.close(f"write failed: {type(exc).__name__}: {exc}")

    def respond(self, stream_id: int, payload: bytes = b"", code: int = OK, message: str = "") -> None:
        from tenantnet.kube.proto import ttrpc_pb2

        response = ttrpc_pb2.Response(payload=payload)
        if code != OK:
            response.status.code, response.status.message = code, message
        self.send(PLUGIN_SERVICE_CONN, ttrpc_message(stream_id, MSG_RESPONSE, response.SerializeToString()))

    def call(self, method: str, request: Any, timeout: float) -> Any:
        """Call the runtime's service; its ttrpc.Response (a timeout or a lost connection raise)."""
        from tenantnet.kube.proto import ttrpc_pb2

        pending = _Call()
        with self._calls_lock:
            stream_id = self._next_stream
            self._next_stream += 2
            self._calls[stream_id] = pending
        body = ttrpc_pb2.Request(service=RUNTIME_SERVICE, method=method, payload=request.SerializeToString(),
                                 timeout_nano=int(timeout * 1e9)).SerializeToString()
        self.send(RUNTIME_SERVICE_CONN, ttrpc_message(stream_id, MSG_REQUEST, body))
        if not pending.done.wait(timeout):
            with self._calls_lock:
                self._calls.pop(stream_id, None)
            raise ConnectionLost(f"{RUNTIME_SERVICE}/{method}: no answer within {timeout:g} s")
        if pending.error:
            raise ConnectionLost(f"{RUNTIME_SERVICE}/{method}: {pending.error}")
        return pending.response

    # ---- reading
    def read_loop(self) -> None:
        try:
            while not self.ended.is_set():
                conn_id, payload = read_mux_frame(self.sock, self.plugin._stopping)
                reader = self._readers.get(conn_id)
                if reader is None:
                    continue  # nobody opened that id: NRI's mux drops such frames too
                for message in reader.feed(payload):
                    if conn_id == PLUGIN_SERVICE_CONN:
                        self._on_request(message)
                    else:
                        self._on_response(message)
        except (ConnectionLost, NriProtocolError) as exc:
            self.close(str(exc))
        except Exception as exc:  # a bug of ours must not leave the connection half-served
            self.close(f"{type(exc).__name__}: {exc}")
            raise

    def _on_response(self, message: TtrpcMessage) -> None:
        from google.protobuf.message import DecodeError

        from tenantnet.kube.proto import ttrpc_pb2

        with self._calls_lock:
            pending = self._calls.pop(message.stream_id, None)
        if pending is None:
            self.log.warning("nri.unknown_stream", stream=message.stream_id, type=message.kind)
            return
        if message.oversized:
            pending.error = f"answer of {message.oversized} bytes: at most {TTRPC_MESSAGE_MAX} allowed"
        elif message.kind != MSG_RESPONSE:
            pending.error = f"answer of ttrpc type {message.kind}, not a response"
        else:
            try:
                pending.response = ttrpc_pb2.Response.FromString(message.body)
            except DecodeError as exc:
                pending.error = f"undecodable answer: {exc}"
        pending.done.set()

    def _on_request(self, message: TtrpcMessage) -> None:
        from google.protobuf.message import DecodeError

        from tenantnet.kube.proto import ttrpc_pb2

        sid = message.stream_id
        if message.oversized:
            self.respond(sid, code=RESOURCE_EXHAUSTED, message=f"message length {message.oversized} "
                         f"exceed maximum message size of {TTRPC_MESSAGE_MAX}")  # ttrpc's own words
            return
        if message.kind != MSG_REQUEST:
            self.respond(sid, code=INVALID_ARGUMENT,
                         message=f"ttrpc type {message.kind}: only requests are served")
            return
        if sid % 2 != 1:
            self.respond(sid, code=INVALID_ARGUMENT,
                         message="StreamID must be odd for client initiated streams")
            return
        try:
            request = ttrpc_pb2.Request.FromString(message.body)
        except DecodeError as exc:
            self.respond(sid, code=INVALID_ARGUMENT, message=f"unmarshal request error: {exc}")
            return
        if request.service != PLUGIN_SERVICE:
            self.respond(sid, code=UNIMPLEMENTED, message=f"service {request.service}")
            return
        serve = self.plugin._methods.get(request.method)
        if serve is None:
            self.respond(sid, code=UNIMPLEMENTED, message=f"method {request.method}")
            return
        try:
            decoded, key = serve.decode(request.payload)
        except DecodeError as exc:
            self.respond(sid, code=INVALID_ARGUMENT, message=f"unmarshal {request.method} error: {exc}")
            return
        self.plugin._pool.submit(key, lambda: self._serve(sid, request.method, serve, decoded))

    def _serve(self, sid: int, method: str, serve: _Method, decoded: Any) -> None:
        if self.ended.is_set():
            return  # the runtime is gone; a new connection is synchronized afresh
        try:
            payload = serve.run(self, decoded)
        except NriRefusal as exc:
            self.respond(sid, code=UNKNOWN, message=str(exc))
            return
        except Exception as exc:
            self.log.error("nri.handler_failed", method=method, error=f"{type(exc).__name__}: {exc}")
            self.respond(sid, code=UNKNOWN,
                         message=f"tenantnet NRI plugin: {method} failed: {type(exc).__name__}: {exc}")
            return
        self.respond(sid, payload)

    def close(self, reason: str) -> None:
        if self.ended.is_set():
            return
        self.reason = reason
        self.ended.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._calls_lock:
            calls, self._calls = self._calls, {}
        for pending in calls.values():
            pending.error = f"connection ended: {reason}"
            pending.done.set()


@dataclass(frozen=True)
class _Method:
    decode: Callable[[bytes], tuple[Any, str]]  # payload -> (request, ordering key)
    run: Callable[[_Session, Any], bytes]  # -> the response payload


# ------------------------------------------------------------------ the plugin


class NriPlugin:
    """An external NRI plugin on `socket_path`, delivering pod sandbox events to `handler`.

    `start()` runs a background thread: connect, register, serve; when the socket is missing,
    registration fails or the connection ends, it tries again after a growing, jittered
    backoff (0.5 s doubling up to 30 s; back to 0.5 s after a connection that got synchronized).
    """

    def __init__(self, socket_path: str, handler: NriHandler, *, name: str = "tenantnet",
                 index: str = "50", log: Any = None) -> None:
        if not (len(index) == 2 and index.isdigit() and index.isascii()):
            raise ValueError(f"NRI plugin index {index!r}: two digits allowed (00..99)")
        if not name or any(not (c.isascii() and (c.isalnum() or c in "-_.+")) for c in name):
            raise ValueError(f"NRI plugin name {name!r}: letters, digits and -_.+ allowed")
        if log is None:  # the project's logger (its configured sink), not structlog's stdout default
            from tenantnet.plugin import log as plog

            log = plog.get("tenantnet.kube.nri")
        self.socket_path = socket_path
        self.handler = handler
        self.name = name
        self.index = index
        self.log = log
        self.stall_timeout = FRAME_STALL_TIMEOUT
        self.registration_timeout = REGISTRATION_TIMEOUT
        self.request_timeout_ms = 0  # as the runtime announced it in Configure
        self.connections = 0  # sessions that got synchronized, for status and tests
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._session: _Session | None = None
        self._lock = threading.Lock()
        self._pool = _OrderedPool(WORKERS, log)
        self._methods = self._method_table()

    @property
    def connected(self) -> bool:
        """Registered, configured and synchronized: the runtime sends us its pod events."""
        session = self._session
        return bool(session and session.registered and session.synchronized and not session.ended.is_set())

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("NriPlugin already started")
        self._thread = threading.Thread(target=self._run, name="tenantnet-nri", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            session = self._session
        if session is not None:
            session.close("stopped")
        if self._thread is not None:
            self._thread.join()
        self._pool.shutdown()

    # ---- the connection loop
    def _run(self) -> None:
        delay = BACKOFF_FIRST
        while not self._stopping.is_set():
            reason, synced = self._connect_once()
            if self._stopping.is_set():
                break
            if synced:
                delay = BACKOFF_FIRST
            self.log.warning("nri.disconnected", socket=self.socket_path, reason=reason,
                             retry_in=round(delay, 2))
            self._stopping.wait(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, BACKOFF_MAX)

    def _connect_once(self) -> tuple[str, bool]:
        from tenantnet.kube.proto import nri_pb2

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.stall_timeout)
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            return f"connect: {type(exc).__name__}: {exc}", False
        session = _Session(self, sock)
        with self._lock:
            if self._stopping.is_set():
                sock.close()
                return "stopped", False
            self._session = session
        reader = threading.Thread(target=session.read_loop, name="tenantnet-nri-read", daemon=True)
        reader.start()
        try:
            request = nri_pb2.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index,
                                                    NRI_version=NRI_VERSION)
            answer = session.call("RegisterPlugin", request, self.registration_timeout)
            if answer.status.code != OK:
                session.close(f"registration refused: code {answer.status.code}: {answer.status.message}")
            else:
                session.registered = True
                self.log.info("nri.registered", socket=self.socket_path, plugin=f"{self.index}-{self.name}")
        except ConnectionLost as exc:
            session.close(str(exc))
        session.ended.wait()
        reader.join()
        sock.close()
        with self._lock:
            self._session = None
        return session.reason, session.synchronized

    # ---- the Plugin service
    def _method_table(self) -> dict[str, _Method]:
        from tenantnet.kube.proto import nri_pb2

        def lifecycle(cls: Any) -> Callable[[bytes], tuple[Any, str]]:
            return lambda payload: (cls.FromString(payload), "")  # one key: in order, among themselves

        def per_pod(cls: Any) -> Callable[[bytes], tuple[Any, str]]:
            def decode(payload: bytes) -> tuple[Any, str]:
                request = cls.FromString(payload)
                return request, "pod:" + request.pod.id
            return decode

        empty = nri_pb2.Empty().SerializeToString()

        def event(fixed: int) -> Callable[[_Session, Any], bytes]:
            def run(session: _Session, request: Any) -> bytes:
                self._pod_event(fixed or request.event, request.pod)
                return empty
            return run

        return {
            "Configure": _Method(lifecycle(nri_pb2.ConfigureRequest), self._configure),
            "Synchronize": _Method(lifecycle(nri_pb2.SynchronizeRequest), self._synchronize),
            "Shutdown": _Method(lifecycle(nri_pb2.Empty), self._shutdown),
            "RunPodSandbox": _Method(per_pod(nri_pb2.RunPodSandboxRequest), event(EVENT_RUN_POD_SANDBOX)),
            "StopPodSandbox": _Method(per_pod(nri_pb2.StopPodSandboxRequest), event(EVENT_STOP_POD_SANDBOX)),
            "RemovePodSandbox": _Method(per_pod(nri_pb2.RemovePodSandboxRequest),
                                        event(EVENT_REMOVE_POD_SANDBOX)),
            "StateChange": _Method(per_pod(nri_pb2.StateChangeEvent), event(0)),  # the deprecated form
        }

    def _configure(self, session: _Session, request: Any) -> bytes:
        from tenantnet.kube.proto import nri_pb2

        self.request_timeout_ms = request.request_timeout
        self.log.info("nri.configured", runtime=f"{request.runtime_name} {request.runtime_version}",
                      nri=request.NRI_version, registration_timeout_ms=request.registration_timeout,
                      request_timeout_ms=request.request_timeout)
        return nri_pb2.ConfigureResponse(events=SUBSCRIBED).SerializeToString()

    def _synchronize(self, session: _Session, request: Any) -> bytes:
        from tenantnet.kube.proto import nri_pb2

        session._sync.extend(pod_from_nri(p) for p in request.pods)
        if request.more:  # a part: the runtime checks that we echo `more` and ask for nothing
            return nri_pb2.SynchronizeResponse(more=True).SerializeToString()
        pods, session._sync = session._sync, []
        self.handler.synchronize(pods)
        session.synchronized = True
        self.connections += 1
        self.log.info("nri.synchronized", pods=len(pods))
        return nri_pb2.SynchronizeResponse(more=False).SerializeToString()

    def _shutdown(self, session: _Session, request: Any) -> bytes:
        self.log.info("nri.runtime_shutdown", socket=self.socket_path)
        return request.SerializeToString()  # Empty; the connection ends next and we reconnect

    def _pod_event(self, event: int, nri_pod: Any) -> None:
        pod = pod_from_nri(nri_pod)
        if event == EVENT_RUN_POD_SANDBOX:
            self.handler.run_pod_sandbox(pod)  # raises: the sandbox fails (fail closed)
            return
        call = {EVENT_STOP_POD_SANDBOX: self.handler.stop_pod_sandbox,
                EVENT_REMOVE_POD_SANDBOX: self.handler.remove_pod_sandbox}.get(event)
        if call is None:
            return  # a StateChange we did not subscribe to
        try:
            call(pod)
        except Exception as exc:  # teardown must go on: logged, answered OK
            self.log.error("nri.teardown_failed", handler=call.__name__, sandbox=pod.id,
                           pod=f"{pod.namespace}/{pod.name}", error=f"{type(exc).__name__}: {exc}")
