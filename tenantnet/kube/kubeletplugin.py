"""A DRA kubelet plugin: the kubelet's plugin registration and the DRA node service over
gRPC on the kubelet's plugin sockets, for any DRA driver (the agent's `tenantnet.io`, the
lab's simulated GPUs). The driver's own logic is a `DraHandler`; this module is only the
wire, the sockets and the checks of what the kubelet sends.

Registration (the kubelet's plugin watcher, pkg/kubelet/pluginmanager/pluginwatcher): the
kubelet watches `<root>/plugins_registry/` for socket files, dials each one that appears,
asks `Registration.GetInfo` and answers with `NotifyRegistrationStatus`. We answer GetInfo
with type `DRAPlugin`, the driver name, the DRA service's socket
`<root>/plugins/<driver>/dra.sock` as endpoint and `v1.DRAPlugin` as the one service we
offer. Removing the registration socket is how a plugin goes away: the watcher sees the
file vanish and deregisters it.

Sockets: the DRA socket is served first and the registration socket last, so the kubelet
never dials an endpoint that is not served yet. Each is bound under a hidden name (the
watcher ignores names starting with "."), chmod-ed, then renamed into place: the kubelet
never sees a socket that does not answer or has the wrong mode. Mode 0600: the kubelet
runs as root, and nobody else may ask us to prepare a device (preparing moves VFs into
pods); 0660 would only open it to a group that has no business calling us. Missing parent
directories are made 0750 (existing ones are left as they are: they are the kubelet's).
At start a socket file already at the path that nobody answers on (ours, left by a killed
agent) is replaced; one that answers (another instance serving) and anything that is not
a socket (a regular file, a directory, a symlink) are refused with the reason. `stop`
removes a path only while it is still the socket this instance made (same device and
inode): a newer instance's socket is never taken down by an older one stopping.

Calls: each claim the kubelet sends is checked before the handler sees it (UID a lowercase
RFC 4122 UUID, as the API server makes them; namespace a DNS-1123 label; name a DNS-1123
subdomain; at most MAX_CLAIMS per call; one UID once); a claim that fails a check gets its
own error in the answer, the others go on. The handler answers per claim UID; a claim it
leaves out, an answer of the wrong type, a device without pool or name, or an exception of
the handler become that claim's error string, logged — the call itself never fails with a
gRPC error and nothing reaches stderr as a traceback (gRPC would print one for an exception
escaping a servicer). The kubelet retries a claim that got an error.

Threads: DRA calls run on a pool of `workers` threads, so the handler is called
concurrently and must be thread-safe (the kubelet sends one call per pod, several pods at
once). Registration has its own small server.

grpc and the generated stubs (tenantnet/kube/proto, generated at build time from the
project's own .proto files) are imported by `start` only: importing this module for its
dataclasses costs nothing, and no plugin call path ever imports it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# The kubelet's side, from Kubernetes' source (1.34 made DRA v1 GA; 1.36 unchanged):
# - type: pluginregistration.DRAPlugin = "DRAPlugin"
#   (staging/src/k8s.io/kubelet/pkg/apis/pluginregistration/v1/constants.go);
# - supported_versions: for DRA these name gRPC services, "<proto package tail>.<service>";
#   the kubelet takes the first entry it knows from servicesSupportedByKubelet =
#   [drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService] = ["v1.DRAPlugin",
#   "v1beta1.DRAPlugin"] (pkg/kubelet/cm/dra/plugin/dra_plugin.go; the string constant is in
#   staging/src/k8s.io/kubelet/pkg/apis/dra/v1/types.go) and refuses the plugin when none is
#   known. We implement only the v1 service (dra.proto), so we offer only "v1.DRAPlugin".
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)

MAX_CLAIMS = 256          # claims handled per call; more get an error each (the kubelet retries)
SOCKET_MODE = 0o600
DIR_MODE = 0o750
STOP_GRACE = 5.0          # seconds in-flight DRA calls get to finish at stop
SUN_PATH_MAX = 107        # sockaddr_un.sun_path is 108 bytes with the terminating NUL

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_LABEL)
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it (checked: see the module doc)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim: the requests it serves (empty: all of the claim's),
    its pool and name as published in the ResourceSlice, and the CDI device IDs the runtime
    injects."""

    requests: tuple[str, ...]     # request_names
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""              # non-empty: the kubelet gets this claim's error


class DraHandler(Protocol):
    """The driver. Called from several threads at once; each claim UID in the list once."""

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]: ...   # keyed by claim uid

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]: ...           # uid -> "" or error


class KubeletPluginError(Exception):
    """The plugin cannot serve (a socket path taken, too long, a directory not creatable)."""


def claim_problem(namespace: str, name: str, uid: str) -> str:
    """What is wrong with a claim as the kubelet sent it; "" when nothing is."""
    if not _UUID.fullmatch(uid):
        return (f"claim uid {uid[:80]!r} is not a lowercase RFC 4122 UUID "
                "(8-4-4-4-12 hex digits, as the API server makes them)")
    if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        return (f"claim {uid}: namespace {namespace[:80]!r} is not a DNS-1123 label "
                "(at most 63 of a-z, 0-9 and '-', starting and ending alphanumeric)")
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return (f"claim {uid}: name {name[:80]!r} is not a DNS-1123 subdomain "
                "(at most 253 of a-z, 0-9, '-' and '.', labels starting and ending alphanumeric)")
    return ""


def admit(claims: Sequence[Any]) -> tuple[list[ClaimRef], dict[str, str]]:
    """The claims of one call (objects with namespace, name and uid) the handler may see,
    in order, each UID once, at most MAX_CLAIMS; the refused ones' errors by UID."""
    admitted: dict[str, ClaimRef] = {}
    errors: dict[str, str] = {}
    for i, c in enumerate(claims):
        ref = ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid)
        seen = admitted.get(ref.uid)
        if seen is not None or ref.uid in errors:
            if seen is not None and seen != ref:
                del admitted[ref.uid]
                errors[ref.uid] = (f"claim {ref.uid} sent twice in one call, as {seen.namespace}/{seen.name} "
                                   f"and as {ref.namespace}/{ref.name}")
            continue
        if i >= MAX_CLAIMS:
            errors[ref.uid] = (f"claim {ref.uid[:80]} not handled: more than {MAX_CLAIMS} claims in one "
                               "call (the kubelet retries it)")
            continue
        problem = claim_problem(ref.namespace, ref.name, ref.uid)
        if problem:
            errors[ref.uid] = problem
        else:
            admitted[ref.uid] = ref
    return list(admitted.values()), errors


def _text(s: str) -> str:
    """`s` as a proto3 string may carry it (valid UTF-8: no lone surrogates)."""
    return s.encode("utf-8", "replace").decode("utf-8")


def _device_problem(d: Any) -> str:
    if not isinstance(d, PreparedDevice):
        return f"the driver answered a device of type {type(d).__name__}, not PreparedDevice"
    if not d.pool or not d.device:
        return f"the driver answered a device without pool or name ({d.pool!r}, {d.device!r})"
    return ""


class KubeletPlugin:
    """A DRA driver's kubelet plugin: `start` serves, `stop` ends (see the module doc)."""

    def __init__(self, driver: str, handler: DraHandler, *, kubelet_root_dir: str, log: Any = None,
                 workers: int = 16) -> None:
        # The driver name is a DNS subdomain of at most 63 characters (ResourceSlice's
        # spec.driver); it also makes two path components, so nothing else may pass.
        if len(driver) > 63 or not _DNS_SUBDOMAIN.fullmatch(driver):
            raise ValueError(f"DRA driver name {driver!r} is not a DNS-1123 subdomain of at most 63 "
                             "characters (a-z, 0-9, '-', '.'), e.g. tenantnet.io")
        if workers < 1:
            raise ValueError(f"workers {workers} must be at least 1")
        if not os.path.isabs(kubelet_root_dir):
            raise ValueError(f"kubelet_root_dir {kubelet_root_dir!r} must be an absolute path")
        if log is None:
            from tenantnet.plugin import log as plog

            log = plog.get("tenantnet.kube.kubeletplugin")
        self.driver = driver
        self.handler = handler
        self.log = log
        self.workers = workers
        root = os.path.normpath(kubelet_root_dir)
        self.dra_socket = os.path.join(root, "plugins", driver, "dra.sock")
        self.registration_socket = os.path.join(root, "plugins_registry", f"{driver}-reg.sock")
        self._lock = threading.Lock()
        self._registered = False
        self._registration_error = ""
        self._servers: list[tuple[Any, str, tuple[int, int]]] = []   # (server, path, (dev, ino))

    # ------------------------------------------------------------------ registration state

    @property
    def registered(self) -> bool:
        with self._lock:
            return self._registered

    @property
    def registration_error(self) -> str:
        with self._lock:
            return self._registration_error

    def _notified(self, registered: bool, error: str) -> None:
        with self._lock:
            self._registered, self._registration_error = registered, error
        if registered:
            self.log.info("dra.registered", driver=self.driver, endpoint=self.dra_socket)
        else:
            self.log.error("dra.registration_refused", driver=self.driver, error=error)

    # ------------------------------------------------------------------ serving

    def start(self) -> None:
        if self._servers:
            raise KubeletPluginError(f"the {self.driver} kubelet plugin is already started")
        from tenantnet.kube.proto import (
            dra_pb2,
            dra_pb2_grpc,
            pluginregistration_pb2,
            pluginregistration_pb2_grpc,
        )

        try:
            self._serve(self.dra_socket, self.workers,
                        lambda server: dra_pb2_grpc.add_DRAPluginServicer_to_server(
                            _DraService(self, dra_pb2), server))
            self._serve(self.registration_socket, 2,
                        lambda server: pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
                            _RegistrationService(self, pluginregistration_pb2), server))
        except BaseException:
            self.stop()
            raise
        self.log.info("dra.serving", driver=self.driver, dra_socket=self.dra_socket,
                      registration_socket=self.registration_socket, versions=list(SUPPORTED_VERSIONS))

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Registration first (its socket gone, the kubelet deregisters us), then the DRA
        service, whose calls in flight get `grace` seconds."""
        servers, self._servers = self._servers, []
        for server, path, ident in reversed(servers):
            _remove_if_ours(path, ident)
            server.stop(grace if path == self.dra_socket else 0).wait()
        with self._lock:
            self._registered = False

    def _serve(self, path: str, workers: int, add: Any) -> None:
        import concurrent.futures

        import grpc

        parent = os.path.dirname(path)
        hidden = os.path.join(parent, f".{os.path.basename(path)}.{os.getpid()}")
        for p in (path, hidden):
            if len(os.fsencode(p)) > SUN_PATH_MAX:
                raise KubeletPluginError(
                    f"socket path {p} is {len(os.fsencode(p))} bytes long; a unix socket path has at most "
                    f"{SUN_PATH_MAX}: use a shorter kubelet root dir")
        _make_dirs(parent)
        _clear(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(hidden)   # our own pid's leftover: nobody else uses the name
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                     thread_name_prefix=f"dra-{os.path.basename(path)}")
        server = grpc.server(pool)
        add(server)
        try:
            server.add_insecure_port(f"unix:{hidden}")
        except RuntimeError as exc:
            pool.shutdown(wait=False)
            raise KubeletPluginError(f"cannot listen on {hidden}: {exc}") from None
        server.start()
        try:
            os.chmod(hidden, SOCKET_MODE)
            os.rename(hidden, path)
            st = os.lstat(path)
        except OSError as exc:
            server.stop(0).wait()
            with contextlib.suppress(OSError):
                os.unlink(hidden)
            raise KubeletPluginError(f"cannot put the socket in place at {path}: {exc}") from None
        self._servers.append((server, path, (st.st_dev, st.st_ino)))

    # ------------------------------------------------------------------ the calls

    def prepare(self, claims: Sequence[Any]) -> dict[str, tuple[tuple[PreparedDevice, ...], str]]:
        """One NodePrepareResources call: (devices, error) by claim UID, for every UID sent."""
        admitted, errors = admit(claims)
        answers, failure = self._ask("prepare", admitted)
        out: dict[str, tuple[tuple[PreparedDevice, ...], str]] = {uid: ((), e) for uid, e in errors.items()}
        for c in admitted:
            r = answers.get(c.uid)
            if r is None:
                error = failure or f"{self.driver}: the driver gave no answer for claim {c.uid}"
            elif not isinstance(r, PrepareResult):
                error = (f"{self.driver}: the driver answered {type(r).__name__} for claim {c.uid}, "
                         "not PrepareResult")
            elif r.error:
                error = r.error
            else:
                bad = next(filter(None, map(_device_problem, r.devices)), "")
                error = f"{self.driver}: claim {c.uid}: {bad}" if bad else ""
            out[c.uid] = ((), error) if error else (tuple(r.devices), "")
        refused = {uid: e for uid, (_, e) in out.items() if e}
        self.log.info("dra.prepare", driver=self.driver, claims=len(out), refused=refused or None)
        return out

    def unprepare(self, claims: Sequence[Any]) -> dict[str, str]:
        """One NodeUnprepareResources call: the error ("" if none) by claim UID, for every UID sent."""
        admitted, errors = admit(claims)
        answers, failure = self._ask("unprepare", admitted)
        out = dict(errors)
        for c in admitted:
            r = answers.get(c.uid)
            if r is None:
                out[c.uid] = failure or f"{self.driver}: the driver gave no answer for claim {c.uid}"
            elif not isinstance(r, str):
                out[c.uid] = (f"{self.driver}: the driver answered {type(r).__name__} for claim {c.uid}, "
                              "not str")
            else:
                out[c.uid] = r
        refused = {uid: e for uid, e in out.items() if e}
        self.log.info("dra.unprepare", driver=self.driver, claims=len(out), refused=refused or None)
        return out

    def _ask(self, verb: str, admitted: list[ClaimRef]) -> tuple[dict[str, Any], str]:
        """The handler's answers by UID, and what every claim it left out gets: its
        exception, or an answer that is not a dict, as one error ("" when neither)."""
        if not admitted:
            return {}, ""
        try:
            answers = getattr(self.handler, verb)(list(admitted))
        except Exception as exc:
            failure = f"{self.driver}: {verb[:-1]}ing failed: {type(exc).__name__}: {exc}"
            self.log.error(f"dra.{verb}_failed", driver=self.driver, claims=[c.uid for c in admitted],
                           error=failure, exc_info=exc)
            return {}, failure
        if not isinstance(answers, dict):
            return {}, f"{self.driver}: the driver answered {type(answers).__name__}, not a dict by claim uid"
        return answers, ""


class _DraService:
    """The DRAPlugin servicer: protobuf in and out, `KubeletPlugin.prepare/unprepare` between."""

    def __init__(self, plugin: KubeletPlugin, pb: Any) -> None:
        self.plugin, self.pb = plugin, pb

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 (the gRPC name)
        pb = self.pb
        answer = pb.NodePrepareResourcesResponse()
        try:
            results = self.plugin.prepare(request.claims)
        except Exception as exc:   # a bug here: each claim gets it, the kubelet retries
            self.plugin.log.error("dra.prepare_bug", driver=self.plugin.driver, exc_info=exc)
            for c in request.claims:
                answer.claims[c.uid].error = _text(f"{self.plugin.driver}: internal error: {exc!r}")
            return answer
        for uid, (devices, error) in results.items():
            entry = answer.claims[uid]
            entry.error = _text(error)
            for d in devices:
                entry.devices.append(pb.Device(request_names=[_text(r) for r in d.requests],
                                               pool_name=_text(d.pool), device_name=_text(d.device),
                                               cdi_device_ids=[_text(i) for i in d.cdi_ids]))
        return answer

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        answer = self.pb.NodeUnprepareResourcesResponse()
        try:
            results = self.plugin.unprepare(request.claims)
        except Exception as exc:
            self.plugin.log.error("dra.unprepare_bug", driver=self.plugin.driver, exc_info=exc)
            results = {c.uid: f"{self.plugin.driver}: internal error: {exc!r}" for c in request.claims}
        for uid, error in results.items():
            answer.claims[uid].error = _text(error)
        return answer


class _RegistrationService:
    def __init__(self, plugin: KubeletPlugin, pb: Any) -> None:
        self.plugin, self.pb = plugin, pb

    def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.pb.PluginInfo(type=PLUGIN_TYPE, name=self.plugin.driver, endpoint=self.plugin.dra_socket,
                                  supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            self.plugin._notified(request.plugin_registered, request.error)
        except Exception as exc:
            self.plugin.log.error("dra.registration_status_bug", driver=self.plugin.driver, exc_info=exc)
        return self.pb.RegistrationStatusResponse()


# ---------------------------------------------------------------------------- the sockets


def _make_dirs(path: str) -> None:
    """`path` and its missing parents, each made DIR_MODE (umask aside); existing ones untouched."""
    from hostfiles.confined import ensure_private_dir

    try:
        ensure_private_dir(path, mode=DIR_MODE)
    except FileExistsError as exc:
        raise KubeletPluginError(f"{exc.filename} exists and is not a directory") from None
    except OSError as exc:
        raise KubeletPluginError(f"cannot create the directory {exc.filename or path}: "
                                 f"{exc.strerror}") from None


def _clear(path: str) -> None:
    """Make room at `path`: nothing there, or a socket nobody answers on (removed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = ("a symlink" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                else "a regular file" if stat.S_ISREG(st.st_mode) else "not a socket")
        raise KubeletPluginError(f"{path} exists and is {kind}, not a socket: refusing to replace it "
                                 "(remove it if it is a leftover)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise KubeletPluginError(f"cannot tell whether {path} is served ({exc.strerror}): "
                                     "refusing to replace it") from None
    else:
        raise KubeletPluginError(f"{path} is served by another process (another instance of this "
                                 "driver?): refusing to take it over")
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _remove_if_ours(path: str, ident: tuple[int, int]) -> None:
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == ident:
            os.unlink(path)
