"""The agent's metrics endpoint: one `/metrics` per node, in Prometheus' text format
(docs/metrics.md), built with prometheus-client.

What is measured where:
- the request path only updates prometheus-client's own counters and histograms (a lock
  each, held for a few microseconds), so a scrape never waits for a CNI call nor a CNI
  call for a scrape;
- everything else is read when scraped, on the HTTP server's thread: the agent's
  admission figures, the attachment records (parsed once per file version: a scrape during
  a burst of a thousand ADDs stats the files and parses only the new ones), the
  tenantnet-ipam stores' use, and whatever collectors the caller hands in (`tenantnetctl
  agent run` adds the offload report's, tenantnet/ops/flowreport/collector.py, which
  keeps the datapath reads off the scrape's critical path on its own).

The metrics name pods, namespaces and tenants, so who may read them matters in a
multi-tenant cluster: with `metricsTokenFile` a scrape must present that file's token as
`Authorization: Bearer <token>` (Prometheus' `authorization.credentials_file`), else 401;
without one the endpoint is open to whoever reaches the address (127.0.0.1 by default).

Label values that come from tenants (network names, pod namespaces) are the validated
names of records that exist; the CNI command label is one of a fixed set, so a hostile
`CNI_COMMAND` cannot grow the series without bound.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

COMMANDS = frozenset({"ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"})
# From a cached CHECK (≈ 1 ms) to an ADD that waits for a slow OVSDB (the shim's 30 s).
# What any client that reaches the port can make the agent do is bounded: at most
# SCRAPES_AT_ONCE scrapes run at once (more get 503), a body younger than BODY_REUSE seconds
# is sent again rather than rebuilt, and a connection idle for CLIENT_TIMEOUT is dropped.
SCRAPES_AT_ONCE = 4
BODY_REUSE = 0.5
CLIENT_TIMEOUT = 10.0
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0)


MAX_TOKEN_BYTES = 4096


def command_label(command: str) -> str:
    return command if command in COMMANDS else "other"


class AgentMetrics:
    """The registry the agent serves, and the two things the request path records."""

    def __init__(self, status: Callable[[], dict[str, Any]], node: Callable[[], Any],
                 collectors: Sequence[Any] = ()) -> None:
        """`collectors`: prometheus-client collectors, or objects with `exposition() -> bytes`
        (families already in text form, appended to each scrape as they are: the offload
        report's, rendered once per rebuild rather than at every scrape)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "tenantnet_cni_request_duration_seconds",
            "time from the agent reading a CNI call to its answer, by plugin and command",
            ["plugin", "command"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.errors = Counter(
            "tenantnet_cni_errors", "CNI calls answered with an error, by plugin, command and CNI "
            "error code (docs/errors.md)", ["plugin", "command", "code"], registry=self.registry)
        self.registry.register(_AdmissionCollector(status))
        records = RecordIndex()  # one for both: each record version is parsed once, not twice
        self.registry.register(AttachmentCollector(node, records))
        self.registry.register(IpamPoolCollector(node, records))
        # CPU the endpoint itself costs the agent (scrape threads, and what collectors report
        # of their own threads): what a scrape takes from the CNI calls, measured, not guessed.
        self._cost_lock = threading.Lock()
        self.scrapes = 0
        self.scrape_cpu = 0.0
        self._costs: list[Callable[[], float]] = []
        self.registry.register(_CostCollector(self))
        self._texts: list[Callable[[], bytes]] = []
        self._slots = threading.BoundedSemaphore(SCRAPES_AT_ONCE)
        self._body: tuple[float, bytes] = (float("-inf"), b"")
        for collector in collectors:
            if callable(getattr(collector, "cpu_seconds", None)):
                self._costs.append(collector.cpu_seconds)
            if callable(getattr(collector, "exposition", None)):
                self._texts.append(collector.exposition)
            else:
                self.registry.register(collector)
        self._server: Any = None

    def observe(self, plugin: str, command: str, seconds: float, code: int, error_code: int | None) -> None:
        label = command_label(command)
        self.latency.labels(plugin, label).observe(seconds)
        if code:
            self.errors.labels(plugin, label, str(error_code if error_code is not None else "unknown")).inc()

    def _current_body(self) -> bytes:
        """The last body if younger than BODY_REUSE seconds (two Prometheus servers, or a
        client in a loop, cost one build per half second), else a new one."""
        built, body = self._body
        if time.monotonic() - built < BODY_REUSE:
            return body
        body = self.exposition()
        self._body = (time.monotonic(), body)
        return body

    def exposition(self) -> bytes:
        """One scrape's body."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry) + b"".join(text() for text in self._texts)

    def serve(self, address: str, port: int, token_file: str = "") -> tuple[str, int]:
        """Start serving GET /metrics on a daemon thread (a thread per scrape); (host, port)
        actually bound (port 0: any free). `token_file`: scrapes must present its token."""
        import socket
        from socketserver import ThreadingMixIn
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        from prometheus_client import CONTENT_TYPE_LATEST

        token = BearerToken(token_file) if token_file else None

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
            if environ.get("PATH_INFO", "/") not in ("/metrics", "/"):
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not found: see /metrics\n"]
            if token is not None:
                refusal = token.refusal(environ.get("HTTP_AUTHORIZATION"))
                if refusal is not None:
                    status, why = refusal
                    headers = [("Content-Type", "text/plain")]
                    if status.startswith("401"):
                        headers.append(("WWW-Authenticate", 'Bearer realm="tenantnet-metrics"'))
                    start_response(status, headers)
                    return [why.encode() + b"\n"]
            if not self._slots.acquire(blocking=False):
                start_response("503 Service Unavailable",
                               [("Content-Type", "text/plain"), ("Retry-After", "1")])
                return [f"more than {SCRAPES_AT_ONCE} scrapes at once\n".encode()]
            started = time.thread_time()
            try:
                body, status, kind = self._current_body(), "200 OK", CONTENT_TYPE_LATEST
            except Exception as exc:  # an answer, not a traceback on the agent's stderr
                body, status, kind = f"error: {exc}\n".encode(), "500 Internal Server Error", "text/plain"
            finally:
                self._slots.release()
            with self._cost_lock:
                self.scrapes += 1
                self.scrape_cpu += time.thread_time() - started
            start_response(status, [("Content-Type", kind), ("Content-Length", str(len(body)))])
            return [body]

        class Quiet(WSGIRequestHandler):
            timeout = CLIENT_TIMEOUT  # a client that connects and sends nothing is dropped

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (wsgiref's name)
                pass  # a line per scrape would flood the agent's stderr

        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        server = type("MetricsServer", (ThreadingMixIn, WSGIServer),
                      {"daemon_threads": True, "address_family": family})
        self._server = make_server(address, port, app, server, handler_class=Quiet)
        threading.Thread(target=self._server.serve_forever, name="tenantnet-metrics", daemon=True).start()
        host, bound = self._server.server_address[:2]
        return str(host), int(bound)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def read_token(path: str) -> tuple[bytes | None, str]:
    """(the token in `path`, "") or (None, why not): opened without blocking, read only if a
    regular file of at most MAX_TOKEN_BYTES; surrounding whitespace is not part of it."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        return None, exc.strerror or str(exc)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        data = os.read(fd, MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        return None, exc.strerror or str(exc)
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_BYTES:
        return None, f"larger than {MAX_TOKEN_BYTES} bytes"
    return (data.strip(), "") if data.strip() else (None, "empty")


class BearerToken:
    """The token a scrape must present, read from the node's `metricsTokenFile`.

    The file is read again whenever it changes (a rotated Kubernetes Secret), so a new token
    applies without restarting the agent. The path is the node admin's, not a tenant's, and
    is followed through symbolic links: kubelet projects a Secret's keys as links into a
    timestamped directory. It is still opened without blocking and read only if it is a
    regular file of at most MAX_TOKEN_BYTES. Fails closed: a missing, unreadable or empty
    file refuses every scrape (503) rather than serving the metrics to anyone."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int, int] | None = None
        self._token: bytes | None = None
        self._problem = "not read yet"

    def _current(self) -> bytes | None:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._seen, self._token, self._problem = None, None, exc.strerror or str(exc)
            return None
        sig = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if sig != self._seen:
                self._token, self._problem = read_token(self.path)
                self._seen = sig
            return self._token

    def refusal(self, header: str | None) -> tuple[str, str] | None:
        """None if `header` (the request's Authorization) carries the token; else the HTTP
        status and the reason, which names no part of the token."""
        import hmac

        token = self._current()
        if token is None:
            return ("503 Service Unavailable",
                    f"metricsTokenFile {self.path}: {self._problem}; no scrape is served without a token")
        scheme, _, given = (header or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return "401 Unauthorized", "a bearer token is required (Authorization: Bearer <token>)"
        if not hmac.compare_digest(given.strip().encode("latin-1", "replace"), token):
            return "401 Unauthorized", "the bearer token is not this node's metrics token"
        return None


class _CostCollector(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterable[Metric]:
        m = self._m
        with m._cost_lock:
            scrapes, cpu = m.scrapes, m.scrape_cpu
        cpu += sum(cost() for cost in m._costs)
        yield CounterMetricFamily("tenantnet_metrics_scrapes", "scrapes of this endpoint answered",
                                  value=float(scrapes))
        yield CounterMetricFamily("tenantnet_metrics_cpu_seconds", "CPU this endpoint cost the agent: "
                                  "its scrape threads and the offload report's rebuilds", value=cpu)


class _AdmissionCollector(Collector):
    """The agent's own figures (the same ones `tenantnetctl agent status` prints)."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterable[Metric]:
        s = self._status()
        for name, key, text in (
            ("tenantnet_agent_inflight", "inflight", "CNI calls admitted and not yet answered"),
            ("tenantnet_agent_busy_workers", "busyWorkers", "worker threads running a call now"),
            ("tenantnet_agent_max_inflight", "maxInflight", "admission limit (--max-inflight)"),
            ("tenantnet_agent_oldest_running_seconds", "oldestRunningS",
             "age of the longest-running call (a wedged one shows here)"),
        ):
            yield GaugeMetricFamily(name, text, value=float(s[key]))
        yield GaugeMetricFamily("tenantnet_agent_resident_memory_bytes", "the agent's resident set size",
                                value=float(s["rssKb"]) * 1024)
        for name, key, text in (
            ("tenantnet_agent_served", "served", "CNI calls answered by a worker"),
            ("tenantnet_agent_rejected", "rejected", "calls refused at admission (over --max-inflight): "
                                                     "the shim answered code 11, try again later"),
            ("tenantnet_agent_expired", "expired", "calls whose deadline passed before they finished"),
            ("tenantnet_agent_protocol_errors", "protocolErrors", "connections whose request was unreadable"),
        ):
            yield CounterMetricFamily(name, text, value=float(s[key]))


@dataclass(frozen=True)
class _Seen:
    """What the metrics need of one record file, kept until the file changes."""

    mode: str
    network: str
    namespace: str
    phase: str
    prewarm: str        # the pre-warm state in its plan ("" when the network does not pre-warm)
    prewarm_rules: int
    ipam: Any           # the network's ipam section (a dict) or None
    container_id: str
    ifname: str


class RecordIndex:
    """The node's attachment records, re-read per file only when the file changed. A
    snapshot younger than `max_age` seconds is handed out again: the collectors of one
    scrape share one walk of the directories (≈ 10 ms at a thousand records), so a scrape
    may show the records as they were up to that long ago."""

    def __init__(self, max_age: float = 0.1) -> None:
        self._lock = threading.Lock()  # two scrapers at once share the work, not the race
        self._files: dict[str, tuple[tuple[int, int, int], _Seen | None]] = {}
        self.max_age = max_age
        self._last: tuple[float, str, list[_Seen]] = (float("-inf"), "", [])

    def snapshot(self, node: Any) -> list[_Seen]:
        from tenantnet.plugin import modes
        from tenantnet.plugin.records import AttachmentRecord, RecordStore

        store = RecordStore(node.state_dir, modes.plan_type)
        with self._lock:
            taken, state_dir, cached = self._last
            if state_dir == node.state_dir and time.monotonic() - taken < self.max_age:
                return list(cached)
            fresh: dict[str, tuple[tuple[int, int, int], _Seen | None]] = {}
            for path in store.files():
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                sig = (st.st_mtime_ns, st.st_size, st.st_ino)
                hit = self._files.get(path)
                if hit is None or hit[0] != sig:
                    rec = store.read(path)
                    seen = None
                    if isinstance(rec, AttachmentRecord):
                        plan = rec.plan
                        ipam = rec.conf.get("ipam") if isinstance(rec.conf, dict) else None
                        seen = _Seen(rec.mode, rec.network, rec.pod.namespace, rec.phase,
                                     str(getattr(plan, "prewarm", "") or ""),
                                     int(getattr(plan, "prewarm_rules", 0) or 0),
                                     ipam if isinstance(ipam, dict) else None, rec.container_id, rec.ifname)
                    hit = (sig, seen)
                fresh[path] = hit
            self._files = fresh
            out = [seen for _, seen in fresh.values() if seen is not None]
            self._last = (time.monotonic(), node.state_dir, out)
            return list(out)


def _tenant_of(policy: Any, namespace: str) -> str:
    if policy is None or not namespace:
        return ""
    tenant = policy.tenant_of(namespace)
    return str(tenant.name) if tenant else ""


class AttachmentCollector(Collector):
    """Attachments by mode, network, tenant and phase; pre-warm state per network."""

    def __init__(self, node: Callable[[], Any], index: RecordIndex | None = None) -> None:
        self._node = node
        self.index = index or RecordIndex()

    def collect(self) -> Iterable[Metric]:
        from tenantnet.plugin import tenancy

        node = self._node()
        seen = self.index.snapshot(node)
        try:
            policy = tenancy.load(node)
        except Exception:  # a broken policy file is the plugin's error to report, not a scrape's
            policy = None
        attachments = GaugeMetricFamily("tenantnet_attachments", "attachment records on this node",
                                        labels=["mode", "network", "tenant", "phase"])
        counts: dict[tuple[str, str, str, str], int] = {}
        warm: dict[tuple[str, str], int] = {}
        rules: dict[str, int] = {}
        for s in seen:
            key = (s.mode, s.network, _tenant_of(policy, s.namespace), s.phase)
            counts[key] = counts.get(key, 0) + 1
            if s.prewarm:
                warm[(s.network, s.prewarm)] = warm.get((s.network, s.prewarm), 0) + 1
                rules[s.network] = rules.get(s.network, 0) + s.prewarm_rules
        for key, n in sorted(counts.items()):
            attachments.add_metric(list(key), n)
        yield attachments
        state = GaugeMetricFamily("tenantnet_prewarm_attachments",
                                  "attachments of pre-warming networks by pre-warm state (docs/offload.md)",
                                  labels=["network", "state"])
        for (network, st), n in sorted(warm.items()):
            state.add_metric([network, st], n)
        yield state
        installed = GaugeMetricFamily("tenantnet_prewarm_rules",
                                      "OpenFlow rules the ADDs of the network's attachments wrote when "
                                      "they were made (not a count of rules present now)",
                                      labels=["network"])
        for network, n in sorted(rules.items()):
            installed.add_metric([network], n)
        yield installed


class IpamPoolCollector(Collector):
    """Addresses in use and pool sizes of tenantnet-ipam networks that have attachments here.

    The pool is read from the network config kept in the records (the NAD as it was when
    the attachment was made) and the use from the node's store. Cluster-mode networks show
    this node's addresses only: the cluster-wide view is `tenantnetctl ipam cluster ls`."""

    def __init__(self, node: Callable[[], Any], index: RecordIndex | None = None) -> None:
        self._node = node
        self.index = index or RecordIndex()
        self._stores: dict[str, Any] = {}

    def _store(self, data_dir: str) -> Any:
        from ipam.sqlite_store import SqliteStore

        store = self._stores.get(data_dir)
        if store is None:
            store = SqliteStore(data_dir, create=False)
            self._stores[data_dir] = store
        return store

    def collect(self) -> Iterable[Metric]:
        from hostfiles.confined import within
        from ipam.config import data_dir_of, parse_ipam

        node = self._node()
        size = GaugeMetricFamily("tenantnet_ipam_pool_addresses",
                                 "addresses the network's range set can hand out (tenantnet-ipam)",
                                 labels=["network", "range_set", "family"])
        used = GaugeMetricFamily("tenantnet_ipam_pool_used_addresses",
                                 "addresses of the range set held on this node (tenantnet-ipam)",
                                 labels=["network", "range_set", "family"])
        pools: dict[str, tuple[str, Any]] = {}
        for s in self.index.snapshot(node):
            if s.ipam and s.ipam.get("type") == "tenantnet-ipam" and s.network not in pools:
                pools[s.network] = (data_dir_of(s.ipam, node.ipam_data_dir), s.ipam)
        for network, (data_dir, raw) in sorted(pools.items()):
            # The dir was confined when the ADD was made; the node config may have changed since.
            if not within(data_dir, node.ipam_data_dirs):
                continue
            try:
                conf = parse_ipam(raw)
                held = self._store(data_dir).allocations(network)
            except Exception:  # an unreadable store or config: no series rather than a failed scrape
                continue
            for i, rs in enumerate(conf.range_sets):
                total = sum(hi - lo + 1 for r in rs.ranges for lo, hi in r.segments())
                mine = sum(1 for a in held if rs.range_of(a.address) is not None)
                labels = [network, str(i), f"ipv{rs.family}"]
                size.add_metric(labels, total)
                used.add_metric(labels, mine)
        yield size
        yield used
