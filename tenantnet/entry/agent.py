"""The per-node agent (`tenantnetctl agent run`): serves the CNI verbs over a unix socket.

This module owns the server side of the shim protocol (framing in `tenantnet/entry/shim.py`),
admission (a bound on requests in flight, over it → CNI code 11 at once), serialisation of
requests for one attachment, the worker pool, per-request JSON log lines, and the health
report behind `tenantnetctl agent status`.

It adds no behaviour of its own: every request runs through the same `run_call` as the
in-process path (`tenantnet.entry.plugin`, `tenantnet.entry.ipam`), so an answer is byte
for byte what the executable would print without an agent. Its command line (`run`,
`status`) is `tenantnet/entry/agentctl.py`. What the agent keeps between requests is only what is expensive to
rebuild and never authoritative: imported modules, one OVSDB connection per endpoint, a
host netlink socket per worker thread, the open IPAM stores, parsed node configs. The
truth stays on disk (attachment records, the IPAM store) and in OVSDB, so the agent can be
SIGKILLed at any instant and a new one simply carries on (docs/agent.md).
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import json
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tenantnet.entry import shim

PLUGINS = ("tenantnet", "tenantnet-ipam")
STATUS_OP = "-status"
DEFAULT_MAX_INFLIGHT = 64
# Workers, and of them how many may run an ADD: an ADD is CPU work (the agent's and
# ovs-vswitchd's), a DEL mostly waits for the kernel to tear its veth down (RCU), and DELs
# that overlap share one wait (netlink's link-group reaper). Measured on 2 cores, 1,024
# attachments 16 at a time, interleaved: 8 workers — ADDs 5.2–5.8 s, DELs 5.8 s; 16 with at
# most 8 ADDs at once — ADDs 5.2–5.4 s, DELs 4.2–4.3 s (16 ADDs at once: slower ADDs).
DEFAULT_WORKERS = 16
DEFAULT_ADDS_AT_ONCE = 8
READ_TIMEOUT = 5.0  # a client that connects but does not send its request within this is dropped
# A request is env + stdin; stdin is bounded at 1 MiB (cni.netconf), so this bounds the
# memory 64 requests in flight can hold.
MAX_REQUEST_FRAME = 4 << 20
DEFAULT_WEDGED_AFTER = 120.0
REJECT_READ_TIMEOUT = 0.2  # reading an over-limit request, only to answer in its cniVersion
QUIET_AFTER = 2.0  # seconds without a CNI call before the agent counts as idle (busy())
DRA_CALL_SECONDS = 120.0  # one CNI call of the DRA driver's (a device's ADD or DEL)
QUEUED_NOTABLE_MS = 100.0  # a successful request that waited this long for a worker is logged


@dataclass
class Stats:
    started: float
    served: int = 0
    rejected: int = 0
    expired: int = 0
    protocol_errors: int = 0
    inflight: int = 0
    peak_inflight: int = 0


class _StderrCapture(logging.Handler):
    """What the in-process plugin would have written to stderr (warnings and errors), per
    request thread, so the shim can print it to the caller's stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._local = threading.local()

    def start(self) -> None:
        self._local.lines = []

    def stop(self) -> bytes:
        lines = getattr(self._local, "lines", None) or []
        self._local.lines = None
        return "".join(lines).encode()

    def emit(self, record: logging.LogRecord) -> None:
        lines = getattr(self._local, "lines", None)
        if lines is not None:
            try:
                lines.append(self.format(record) + "\n")
            except Exception:
                pass


class AgentError(Exception):
    """The agent cannot start (socket directory unsafe, another agent running, bad config)."""


def _rss_kb() -> tuple[int, int]:
    """(current, peak) resident set size of this process in kB."""
    rss = peak = 0
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1])
    except OSError:
        pass
    return rss, peak


def prepare_socket_dir(path: str) -> None:
    """The socket's directory: created 0700, or refused if others could reach into it."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)  # makedirs' mode is filtered by the umask
    st = os.stat(directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise AgentError(f"socket directory {directory} must be owned by uid {os.getuid()} with mode "
                         f"0700 (it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): "
                         "anyone who can connect to the agent can attach pods")


# Makes an extra /metrics collector from (current node config, "are CNI calls in flight?").
CollectorMaker = Callable[[Callable[[], Any], Callable[[], bool]], Any]


class Agent:
    def __init__(self, socket_path: str, node_config: str, *, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                 workers: int = DEFAULT_WORKERS, adds_at_once: int = DEFAULT_ADDS_AT_ONCE,
                 collectors: Sequence[CollectorMaker] = ()) -> None:
        """`collectors`: makers of extra /metrics collectors, each given a function returning
        the current node config and one saying whether CNI calls are in flight (`tenantnetctl
        agent run` passes the offload report's, which this layer cannot import)."""
        self.socket_path = socket_path
        self.node_config = node_config
        self.max_inflight = max_inflight
        self.workers = workers
        self.adds_at_once = min(adds_at_once, workers)
        # Taken by an ADD before it gets a worker, so ADDs waiting for their turn hold a
        # connection thread, never a worker a DEL could use.
        self._add_slots = threading.BoundedSemaphore(self.adds_at_once)
        self.stats = Stats(started=time.time())
        self._lock = threading.Lock()  # stats and admission
        self._keys: dict[tuple[bytes, ...], list[Any]] = {}  # key -> [lock, users]
        self._keys_lock = threading.Lock()
        self._nodes: dict[str, tuple[tuple[int, int, int], Any]] = {}
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tenantnet-worker")
        # One thread per admitted connection (reading it, waiting for its worker, answering),
        # reused: starting a thread per request cost ≈ 5 % of the agent's CPU in a burst.
        self._conns = ThreadPoolExecutor(max_inflight, thread_name_prefix="tenantnet-conn")
        self._capture = _StderrCapture()
        self._running: dict[int, float] = {}  # request id -> when its worker started it
        self._listener: socket.socket | None = None
        self._lock_fd = -1
        self._inode = 0
        self.log: Any = None
        self._heartbeat: Any = None
        self._keeper: Any = None
        self._kube_watch: Any = None
        self._dra: Any = None  # (DraDriver, SlicePublisher, KubeletPlugin, NriPlugin) with node config dra
        self._cni_changed: Any = None  # the slice publisher's refresh: a CNI ADD/DEL changed what is free
        self._last_call = float("-inf")  # when the last CNI call ended (busy())
        self._collectors = tuple(collectors)
        self.metrics: Any = None  # entry/metrics.AgentMetrics while /metrics is served
        self.metrics_address: tuple[str, int] | None = None
        self.metrics_token = False  # scrapes must present metricsTokenFile's token

    # ---- start / stop ---------------------------------------------------------------------
    def start(self, log_file: str, log_level: str) -> None:
        from tenantnet.entry import logsetup
        from tenantnet.plugin import log

        logsetup.setup(log_file, log_level)
        root = logging.getLogger()
        self._capture.setFormatter(logsetup.stderr_formatter())
        root.addHandler(self._capture)
        self.log = log.get("tenantnet.agent")
        prepare_socket_dir(self.socket_path)
        # One agent per socket: the lock dies with its holder, even on SIGKILL, so a stale
        # socket file left by a killed agent can be replaced safely.
        self._lock_fd = os.open(self.socket_path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise AgentError(f"another tenantnet agent serves {self.socket_path}") from None
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            listener.bind(self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)
        self._inode = os.stat(self.socket_path).st_ino
        listener.listen(socket.SOMAXCONN)
        listener.settimeout(0.5)  # wake up to notice a stop request
        self._listener = listener
        self._warm_up()
        from tenantnet.entry.heartbeat import Heartbeat, PrewarmKeeper

        node = self._node(self.node_config)
        self._heartbeat = Heartbeat(node, self.log)
        self._heartbeat.start()
        self._keeper = PrewarmKeeper(node, self.log, node.prewarm_reconcile_interval)
        self._keeper.start()
        if node.kubernetes:  # the TenantNetwork cache every ADD reads (docs/kubernetes.md)
            from tenantnet.kube.watch import NodeWatch  # lightkube: imported by the agent only

            self._kube_watch = NodeWatch(node, self.log)
            try:
                self._kube_watch.start()
            except Exception as exc:  # lightkube's ConfigError: no kubeconfig, no in-cluster account
                raise AgentError(f"Kubernetes mode (node config kubernetes: true): no API client: "
                                 f"{exc}") from None
        if node.dra:  # the DRA driver tenantnet.io (docs/dra.md)
            self._start_dra(node)
        if node.metrics_port:
            self._serve_metrics(node)
        self.log.info("agent.started", pid=os.getpid(), socket=self.socket_path,
                      max_inflight=self.max_inflight, workers=self.workers, adds_at_once=self.adds_at_once)

    def _start_dra(self, node: Any) -> None:
        """The kubelet plugin, the NRI plugin and the ResourceSlice publisher, all over one
        DraDriver whose CNI calls are this agent's own in-process calls (counted, logged and
        serialised per attachment like a shim's)."""
        import sys

        from tenantnet.kube.dra import DraDriver, LightkubeClaimApi
        from tenantnet.kube.kubeletplugin import KubeletPlugin, KubeletPluginError
        from tenantnet.kube.nri import NriPlugin
        from tenantnet.kube.slices import LightkubeSliceApi, SlicePublisher, node_devices
        from tenantnet.plugin.draclaims import DRIVER
        from tenantnet.plugin.nodeconfig import node_name_of

        name = node_name_of(node)
        try:
            api = LightkubeClaimApi(node.kubeconfig)
        except Exception as exc:  # lightkube's ConfigError and the OSErrors under it
            raise AgentError(f"DRA (node config dra: true): no Kubernetes API client: {exc}") from None
        driver = DraDriver(node, name, api, self._dra_cni, self.log, cni_path=os.path.dirname(sys.executable))
        publisher = SlicePublisher(LightkubeSliceApi(node.kubeconfig), DRIVER, name,
                                   lambda: node_devices(node, driver.held_by_cni()), self.log)
        driver.on_change = publisher.refresh
        self._cni_changed = publisher.refresh
        kubelet = KubeletPlugin(DRIVER, driver, kubelet_root_dir=node.kubelet_root_dir, log=self.log)
        nri = NriPlugin(node.nri_socket, driver, log=self.log)
        try:
            kubelet.start()
        except KubeletPluginError as exc:
            # The node config asks for a DRA driver: an agent that silently is none would
            # leave the node's claims unprepared with no one saying why.
            driver.close()
            raise AgentError(f"DRA (node config dra: true): {exc}") from None
        publisher.start()
        nri.start()
        self._dra = (driver, publisher, kubelet, nri)

    def _dra_cni(self, environ: dict[str, str], stdin: bytes) -> tuple[int, str]:
        now = time.monotonic()
        environ = {**environ, "TENANTNET_CONFIG": self.node_config}
        environ_b = {os.fsencode(k): os.fsencode(v) for k, v in environ.items()}
        code, out, _ = self._execute("tenantnet", environ_b, stdin, now, now + DRA_CALL_SECONDS)
        return code, out.decode(errors="replace")

    def _warm_up(self) -> None:
        """Pay the imports and the OVSDB connect once, before the first request."""
        import pyroute2  # noqa: F401

        from cni import skel  # noqa: F401
        from ipam import plugin as ipam_plugin  # noqa: F401
        from tenantnet.entry import ipam as ipam_main  # noqa: F401
        from tenantnet.entry import plugin as tn_main  # noqa: F401
        from tenantnet.plugin.core import Plugin  # noqa: F401
        from tenantnet.plugin.drivers import ovs, ovsport  # noqa: F401

        try:
            node = self._node(self.node_config)
            ovsport.ovsdb_for(node).other_config()  # connects
        except Exception as exc:  # not fatal: the first request retries and reports it
            self.log.warning("agent.ovsdb_unavailable", error=str(exc))

    def _serve_metrics(self, node: Any) -> None:
        from tenantnet.entry.metrics import AgentMetrics

        def current() -> Any:
            return self._node(self.node_config)

        metrics = AgentMetrics(lambda: self.status(asking=False), current,
                               [make(current, self.busy) for make in self._collectors])
        try:
            self.metrics_address = metrics.serve(node.metrics_address, node.metrics_port,
                                                 node.metrics_token_file)
        except OSError as exc:
            # The CNI calls matter more than their figures: serve them, say why there are none.
            self.log.error("agent.metrics_unavailable", address=node.metrics_address,
                           port=node.metrics_port, error=exc.strerror or str(exc))
            return
        self.metrics = metrics
        self.metrics_token = bool(node.metrics_token_file)
        self.log.info("agent.metrics", address=self.metrics_address[0], port=self.metrics_address[1],
                      token=self.metrics_token)
        if not self.metrics_token and not ipaddress.ip_address(node.metrics_address).is_loopback:
            # Served, as the admin asked; but the series name every tenant's pods.
            self.log.warning("agent.metrics_without_token", address=node.metrics_address,
                             port=node.metrics_port,
                             hint="anyone who reaches this address reads the pod names of every tenant "
                                  "on the node: set metricsTokenFile, or firewall the port")

    def busy(self) -> bool:
        """CNI calls in flight, or one ended less than QUIET_AFTER seconds ago: work that can
        wait (the offload report) waits for a quiet moment, not for a gap between two calls
        of a burst."""
        return self.stats.inflight > 0 or time.monotonic() - self._last_call < QUIET_AFTER

    def stop(self) -> None:
        self._stop.set()
        # Wake a blocked accept now (the listener's 0.5 s timeout is only the fallback): a
        # connection to our own socket, which the loop closes unread. Safe in a signal
        # handler: a unix connect completes in the backlog without anyone accepting it.
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                wake.setblocking(False)
                wake.connect(self.socket_path)
        except OSError:
            pass

    def serve_forever(self) -> None:
        assert self._listener is not None
        try:
            while not self._stop.is_set():
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError as exc:
                    self.log.error("agent.accept_failed", error=str(exc))
                    time.sleep(0.05)
                    continue
                if self._stop.is_set():  # stop()'s wake-up, or a caller racing the stop
                    conn.close()
                    break
                self._admit(conn)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._listener is not None:
            self._listener.close()
        try:
            if os.stat(self.socket_path).st_ino == self._inode:
                os.unlink(self.socket_path)
        except OSError:
            pass
        deadline = time.monotonic() + 30
        while self.stats.inflight and time.monotonic() < deadline:
            time.sleep(0.02)
        self._pool.shutdown(wait=True)
        # A request leaves the count just before its answer is sent (_serve): with none left,
        # wait for those answers (each send bounded by READ_TIMEOUT); past the deadline, don't.
        self._conns.shutdown(wait=not self.stats.inflight)
        if self._heartbeat is not None:
            self._heartbeat.stop()  # deregistered: the node is no longer serving
        if self._keeper is not None:
            self._keeper.stop()
        if self._kube_watch is not None:
            self._kube_watch.stop()  # the cache stays: the next agent starts from it
        if self._dra is not None:
            driver, publisher, kubelet, nri = self._dra
            kubelet.stop()  # unregistered first: the kubelet sends no new claim to a leaving agent
            nri.stop()
            publisher.stop()  # the slices stay: the next agent takes them over
            driver.close()
        if self.metrics is not None:
            self.metrics.stop()
        # No OVSDB close: exiting closes the connection just as well.
        self.log.info("agent.stopped", served=self.stats.served, rejected=self.stats.rejected)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)

    # ---- admission ------------------------------------------------------------------------
    def _admit(self, conn: socket.socket) -> None:
        if not self._peer_allowed(conn):
            conn.close()
            return
        with self._lock:
            admitted = self.stats.inflight < self.max_inflight
            if admitted:
                self.stats.inflight += 1
                self.stats.peak_inflight = max(self.stats.peak_inflight, self.stats.inflight)
            else:
                self.stats.rejected += 1
        if admitted:
            # Never queues: admission keeps the connections in service within its threads.
            self._conns.submit(self._serve, conn)
        else:
            self._reject(conn)

    def _peer_allowed(self, conn: socket.socket) -> bool:
        # The 0600 socket in a 0700 directory is the gate; the peer's uid is checked too so
        # a socket path misconfigured into a shared directory still serves only root.
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
        except OSError:
            return False
        return uid in (0, os.getuid())

    def _reject(self, conn: socket.socket) -> None:
        """Over the limit: answer code 11 now, in the request's cniVersion if it is at hand."""
        stdin = b""
        try:
            conn.settimeout(REJECT_READ_TIMEOUT)
            stdin = shim.decode_request(shim.recv_frame(conn))[2]
        except Exception:
            pass  # answer anyway, in the current version
        msg = (f"tenantnet agent is busy: {self.max_inflight} requests in flight (the limit); "
               "try again later")
        self._reply(conn, 1, shim.error_json(stdin, shim.TRY_AGAIN_LATER, msg))
        self.log.warning("request.rejected", limit=self.max_inflight)

    def _reply(self, conn: socket.socket, code: int, out: bytes, err: bytes = b"") -> None:
        try:
            conn.settimeout(READ_TIMEOUT)
            conn.sendall(shim.frame(shim.encode_response(code, out, err)))
        except OSError:
            pass  # the caller gave up (its time-out): the request itself is done or dropped
        finally:
            conn.close()

    # ---- one request ----------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        answer: tuple[int, bytes, bytes] | None = None
        try:
            answer = self._answer(conn, time.monotonic())
        finally:
            # The slot is given back before the answer is sent: a caller that has its answer
            # may call again at once (the runtime's next CNI call, a retry) and must not be
            # refused as busy by its own finished request still counted in flight.
            with self._lock:
                self.stats.inflight -= 1
                self._last_call = time.monotonic()
            if answer is None:
                conn.close()
            else:
                self._reply(conn, *answer)

    def _answer(self, conn: socket.socket, arrived: float) -> tuple[int, bytes, bytes] | None:
        """Read one request and run it: (exit code, stdout, stderr) to answer, or None when
        it was unreadable (the connection is then closed unanswered)."""
        try:
            conn.settimeout(READ_TIMEOUT)
            frame = shim.recv_frame(conn, MAX_REQUEST_FRAME)
            plugin, environ, stdin, deadline = shim.decode_request(frame)
        except Exception as exc:
            with self._lock:
                self.stats.protocol_errors += 1
            self.log.warning("request.unreadable", error=f"{type(exc).__name__}: {exc}")
            return None
        if plugin == STATUS_OP:
            return 0, json.dumps(self.status()).encode() + b"\n", b""
        if plugin not in PLUGINS:
            return 1, shim.error_json(stdin, 100, f"tenantnet agent: unknown plugin {plugin!r}"), b""
        if environ.get(b"CNI_COMMAND") == b"VERSION":
            # Needs no worker: answered even when every worker is busy.
            from cni import skel

            code, text = skel.run(lambda *_: None, {"CNI_COMMAND": "VERSION"}, b"")
            with self._lock:
                self.stats.served += 1
            return code, text.encode() + b"\n", b""
        cid, ifname = environ.get(b"CNI_CONTAINERID", b""), environ.get(b"CNI_IFNAME", b"")
        # The shim's deadline, on the host-wide monotonic clock; bounded in case of garbage.
        deadline = min(deadline, arrived + 3600)
        release = self._serialise((plugin.encode(), cid, ifname) if cid and ifname else None, deadline)
        if release is None:
            return 1, shim.error_json(
                stdin, shim.TRY_AGAIN_LATER,
                "tenantnet agent: an earlier request for this attachment is still running; "
                "try again later"), b""
        adding = plugin == "tenantnet" and environ.get(b"CNI_COMMAND") == b"ADD"
        if adding and not self._add_slots.acquire(timeout=max(deadline - time.monotonic(), 0)):
            release()
            with self._lock:
                self.stats.expired += 1
            return 1, shim.error_json(
                stdin, shim.TRY_AGAIN_LATER,
                f"tenantnet agent: {self.adds_at_once} ADDs were running until this request's "
                "deadline; try again later"), b""
        done = (lambda _: (release(), self._add_slots.release())) if adding else (lambda _: release())
        try:
            work = self._pool.submit(self._execute, plugin, environ, stdin, arrived, deadline)
        except BaseException:
            done(None)
            raise
        # The key (and an ADD's slot) stays taken until the work itself ends, even if its
        # caller is answered first (deadline): a retry must never run beside the attempt
        # still in a worker.
        work.add_done_callback(done)
        try:
            code, out, err = work.result(timeout=max(deadline - time.monotonic(), 0.001))
        except futures.TimeoutError:
            with self._lock:
                self.stats.expired += 1
            code, out, err = 1, shim.error_json(stdin, shim.TRY_AGAIN_LATER,
                                                "tenantnet agent: the request did not finish before "
                                                "its deadline; try again later"), b""
        return code, out, err

    def _serialise(self, key: tuple[bytes, ...] | None, deadline: float) -> Any:
        """Take the turn of one (plugin, container id, ifname): a function that gives it
        back, or None if an earlier request still holds it at `deadline`.

        The runtime normally never overlaps them, but a retry after a shim time-out can
        arrive while the first attempt still runs; serialising turns that into "the retry
        sees the finished record" instead of two ADDs racing on one veth name. (The plugin
        also locks the attachment on disk, across processes; this keeps the wait out of the
        worker pool.)
        """
        if key is None:
            return lambda: None
        with self._keys_lock:
            entry = self._keys.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        got = entry[0].acquire(timeout=max(deadline - time.monotonic(), 0))

        def release() -> None:
            if got:
                entry[0].release()
            with self._keys_lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._keys[key]

        if not got:
            release()
            return None
        return release

    def _node(self, path: str) -> Any:
        """The node config at `path`, re-read whenever the file changes (as each exec would)."""
        from tenantnet.plugin import nodeconfig as config

        try:
            st = os.stat(path)
        except OSError:
            return config.load(path)  # missing → defaults, unreadable → the same CniError
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        hit = self._nodes.get(path)
        if hit is not None and hit[0] == sig:
            return hit[1]
        node = config.load(path)
        self._nodes[path] = (sig, node)
        return node

    def _execute(self, plugin: str, environ_b: dict[bytes, bytes], stdin: bytes, arrived: float,
                 deadline: float) -> tuple[int, bytes, bytes]:
        """Run one request on a worker thread; (exit code, stdout, stderr)."""
        import structlog

        from tenantnet.plugin import nodepath

        started = time.monotonic()
        if started > deadline:
            # The caller gave up while this waited; it will retry. Doing it now would only
            # load the node for an answer nobody reads.
            with self._lock:
                self.stats.expired += 1
            return 1, shim.error_json(stdin, shim.TRY_AGAIN_LATER, "tenantnet agent: request expired "
                                                                   "in the queue; try again later"), b""
        environ = {os.fsdecode(k): os.fsdecode(v) for k, v in environ_b.items()}
        rid = next(self._ids)
        with self._lock:
            self._running[rid] = started
        structlog.contextvars.bind_contextvars(
            request=rid, plugin=plugin, command=environ.get("CNI_COMMAND", ""),
            container_id=environ.get("CNI_CONTAINERID", ""), ifname=environ.get("CNI_IFNAME", ""))
        self._capture.start()
        node_path = nodepath.node_config_path(environ=environ)
        try:
            if plugin == "tenantnet":
                from tenantnet.entry import plugin as entry

                code, text = entry.run_call(environ, stdin, lambda: self._node(node_path),
                                            set_up_logging=False)
            else:
                from tenantnet.entry import ipam as ipam_entry

                code, text = ipam_entry.run_call(environ, stdin, lambda: self._node(node_path))
        finally:
            err = self._capture.stop()
            with self._lock:
                self._running.pop(rid, None)
        with self._lock:
            self.stats.served += 1
        if self._cni_changed is not None and code == 0 and plugin == "tenantnet" and \
                environ.get("CNI_COMMAND") in ("ADD", "DEL"):
            self._cni_changed()  # what is free to offer in the ResourceSlices may have changed
        if self.metrics is not None:
            self.metrics.observe(plugin, environ.get("CNI_COMMAND", ""), time.monotonic() - arrived, code,
                                 _error_code(text) if code else None)
        # A failure, or a request that waited, gets its own line; a plain success has its
        # line from the plugin already (add.done, del.done …), and a second one per call
        # cost a tenth of the agent's CPU in a burst.
        queued_ms = round((started - arrived) * 1000, 2)
        report = self.log.info if code or queued_ms >= QUEUED_NOTABLE_MS else self.log.debug
        report("request.done", code=code, ms=round((time.monotonic() - started) * 1000, 2),
               queued_ms=queued_ms, error=text if code else None)
        structlog.contextvars.clear_contextvars()
        return code, (text + "\n").encode() if text else b"", err

    def status(self, *, asking: bool = True) -> dict[str, Any]:
        """`asking`: called for a STATUS request, which is itself in flight and not counted."""
        rss, peak = _rss_kb()
        with self._lock:
            s = self.stats
            now = time.monotonic()
            oldest = max((now - t for t in self._running.values()), default=0.0)
            return {"busyWorkers": len(self._running), "oldestRunningS": round(oldest, 3),
                    "pid": os.getpid(), "socket": self.socket_path, "nodeConfig": self.node_config,
                    "uptimeS": round(time.time() - s.started, 1), "inflight": s.inflight - asking,
                    "peakInflight": s.peak_inflight, "maxInflight": self.max_inflight,
                    "workers": self.workers, "addsAtOnce": self.adds_at_once,
                    "served": s.served, "rejected": s.rejected,
                    "expired": s.expired, "protocolErrors": s.protocol_errors,
                    "rssKb": rss, "peakRssKb": peak,
                    "metrics": "{}:{}".format(*self.metrics_address) if self.metrics_address else None,
                    "metricsToken": self.metrics_token,
                    "kubernetes": self._kube_watch.report() if self._kube_watch is not None else None,
                    "dra": self._dra_report()}

    def _dra_report(self) -> dict[str, Any] | None:
        if self._dra is None:
            return None
        driver, publisher, kubelet, nri = self._dra
        return {**driver.report(), "registered": kubelet.registered,
                "registrationError": kubelet.registration_error, "nriConnected": nri.connected,
                "slices": publisher.report()}


def _error_code(text: str) -> int | None:
    """The `code` of a CNI error answer, for the errors-by-code counter."""
    try:
        code = json.loads(text).get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, int) else None
