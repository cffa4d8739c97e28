"""The agent's metrics endpoint: one `/metrics` per node, in Prometheus' text format
(docs/metrics.md), built with prometheus-client.

What is measured where:
- the request path only updates prometheus-client's own counters and histograms (a lock
  each, held for a few microseconds), so a scrape never waits for a CNI call nor a CNI
  call for a scrape;
- everything else is read when scraped, on a thread of the HTTP server (never one of the
  agent's CNI workers): the agent's admission figures, the attachment records (parsed once
  per file version: a scrape during a burst of a thousand ADDs stats the files and parses
  only the new ones), the tenantnet-ipam stores' use (a read snapshot per store: no lock a
  CNI call waits for; work linear in the range sets and addresses read), and whatever
  collectors the caller hands in (`tenantnetctl agent run` adds the offload report's,
  tenantnet/ops/flowreport/collector.py, which keeps the datapath reads off the scrape's
  critical path on its own).

The HTTP side is tenantnet/entry/httpserve.py, the one server of the agent and of
`tenantnetctl offload --listen`: whatever a client sends, it holds a bounded number of
connections, header bytes and seconds, and checks the token before this module runs.

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
# What any client that reaches the port can make the agent hold is bounded by the HTTP
# server itself (entry/httpserve.py: connections, header bytes, time, the token first); what
# an authorised scrape can make it do, here: at most SCRAPES_AT_ONCE scrapes run at once
# (more get 503), and a body younger than BODY_REUSE seconds is sent again rather than rebuilt.
SCRAPES_AT_ONCE = 4
BODY_REUSE = 0.5
# From a cached CHECK (≈ 1 ms) to an ADD that waits for a slow OVSDB (the shim's 30 s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0)
# tenantnet-ipam stores the pool collector keeps open between scrapes (data dirs are the
# tenants' choice, within ipamDataDirs; each open store holds a few descriptors: the
# database, its WAL and shared-memory index, the store's lock).
MAX_OPEN_STORES = 8


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
        self.pools = IpamPoolCollector(node, records)
        self.registry.register(self.pools)
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
        """Start serving GET /metrics on tenantnet's one HTTP server (entry/httpserve.py: its
        own threads, at most 16 connections, bounded headers and time, the token checked
        before any of this module's code runs); (host, port) actually bound (port 0: any
        free). `token_file`: scrapes must present its token."""
        from tenantnet.entry.httpserve import HttpServer

        self._server = HttpServer(address, port, {"/metrics": self._scrape, "/": self._scrape},
                                  token_file=token_file, name="tenantnet-metrics").start()
        return self._server.address  # type: ignore[no-any-return]

    def _scrape(self, request: Any) -> Any:
        """One authorised GET: the body (built or reused), or 503 beyond SCRAPES_AT_ONCE."""
        from prometheus_client import CONTENT_TYPE_LATEST

        from tenantnet.entry.httpserve import Response

        if not self._slots.acquire(blocking=False):
            return Response(503, f"more than {SCRAPES_AT_ONCE} scrapes at once\n".encode(),
                            headers=(("Retry-After", "1"),))
        started = time.thread_time()
        try:
            response = Response(200, self._current_body(), CONTENT_TYPE_LATEST)
        except Exception as exc:  # an answer, not a traceback on the agent's stderr
            response = Response(500, f"error: {exc}\n".encode())
        finally:
            self._slots.release()
        with self._cost_lock:
            self.scrapes += 1
            self.scrape_cpu += time.thread_time() - started
        return response

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.pools.close()


class _CostCollector(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterable[Metric]:
        from tenantnet.entry.httpserve import REFUSALS

        m = self._m
        server = m._server
        with m._cost_lock:
            scrapes, cpu = m.scrapes, m.scrape_cpu
        refused = dict.fromkeys(REFUSALS, 0)
        if server is not None:  # every connection's thread, hostile ones and scrapes alike
            cpu = server.cpu_seconds()
            with server.stats.lock:
                refused.update(server.stats.refused)
        cpu += sum(cost() for cost in m._costs)
        yield CounterMetricFamily("tenantnet_metrics_scrapes", "scrapes of this endpoint answered",
                                  value=float(scrapes))
        yield CounterMetricFamily("tenantnet_metrics_cpu_seconds", "CPU this endpoint cost the agent: "
                                  "its HTTP server's threads and the offload report's rebuilds", value=cpu)
        family = CounterMetricFamily("tenantnet_metrics_requests_refused",
                                     "requests to this endpoint refused before a scrape ran, by reason",
                                     labels=["reason"])
        for reason, n in refused.items():
            family.add_metric([reason], float(n))
        yield family


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


class _Pool:
    """One network's range sets as a scrape needs them, built once per version of its ipam
    section: each set's family and size, and its ranges sorted by start, so an address is
    placed in its set by one binary search (the ranges of a network never overlap:
    ipam/config.py refuses that), not by a pass over every set."""

    def __init__(self, conf: Any) -> None:
        self.sets: list[tuple[int, int]] = []  # (family, addresses it can hand out) per set
        ranges: dict[int, list[tuple[int, int, int]]] = {}
        for i, rs in enumerate(conf.range_sets):
            self.sets.append((rs.family, sum(hi - lo + 1 for r in rs.ranges for lo, hi in r.segments())))
            for r in rs.ranges:
                ranges.setdefault(r.family, []).append((r.start, r.end, i))
        self._ranges = {family: ([s for s, _, _ in rows], [e for _, e, _ in rows], [i for _, _, i in rows])
                        for family, rows in ((f, sorted(v)) for f, v in ranges.items())}
        self.lookups = 0  # addresses placed so far (the work a scrape does per held address)

    def used(self, addresses: Iterable[Any]) -> list[int]:
        """How many of `addresses` fall in each range set."""
        from bisect import bisect_right

        counts = [0] * len(self.sets)
        for address in addresses:
            self.lookups += 1
            found = self._ranges.get(address.version)
            if found is None:
                continue
            starts, ends, sets = found
            value = int(address)
            k = bisect_right(starts, value) - 1
            if k >= 0 and value <= ends[k]:
                counts[sets[k]] += 1
        return counts


class IpamPoolCollector(Collector):
    """Addresses in use and pool sizes of tenantnet-ipam networks that have attachments here.

    The pool is read from the network config kept in the records (the NAD as it was when
    the attachment was made) and the use from the node's store. Cluster-mode networks show
    this node's addresses only: the cluster-wide view is `tenantnetctl ipam cluster ls`.

    What a scrape costs grows linearly with what it reads: each network's ipam section is
    parsed once per version (not per scrape), each store is read once per scrape (one read
    transaction for all its networks: a WAL snapshot, which takes no lock a CNI call's write
    waits for), and each held address is placed in its range set by one binary search.

    Data dirs are the tenants' choice (within ipamDataDirs), so open stores are bounded: at
    most MAX_OPEN_STORES stay open between scrapes, least recently read closed first, and a
    store is closed at once when it holds nothing of the networks read from it, or when no
    record names it any more."""

    def __init__(self, node: Callable[[], Any], index: RecordIndex | None = None,
                 max_open: int = MAX_OPEN_STORES) -> None:
        self._node = node
        self.index = index or RecordIndex()
        self.max_open = max_open
        self._lock = threading.Lock()  # one collect at a time: the open stores are shared
        self._stores: dict[str, Any] = {}  # data dir -> open store, least recently read first
        self._pools: dict[str, _Pool | None] = {}  # ipam section (JSON) -> pool; None: invalid

    @property
    def open_stores(self) -> list[str]:
        with self._lock:
            return list(self._stores)

    def _store(self, data_dir: str) -> Any:
        from ipam.sqlite_store import SqliteStore

        store = self._stores.pop(data_dir, None)
        if store is None:
            store = SqliteStore(data_dir, create=False)
        self._stores[data_dir] = store  # now the most recently read
        return store

    def _keep(self, data_dir: str, holds: bool) -> None:
        """After a store was read: closed if it holds nothing (it need not stay open until
        it does), else kept, and the least recently read closed beyond max_open."""
        if not holds:
            self._close(data_dir)
        while len(self._stores) > self.max_open:
            self._close(next(iter(self._stores)))

    def _close(self, data_dir: str) -> None:
        store = self._stores.pop(data_dir, None)
        if store is not None:
            store.close()

    def _pool(self, key: str, raw: dict[str, Any], pools: dict[str, _Pool | None]) -> _Pool | None:
        from ipam.config import parse_ipam

        if key not in pools:
            pool = self._pools.get(key, _UNSEEN)
            if pool is _UNSEEN:
                try:
                    pool = _Pool(parse_ipam(raw))
                except Exception:  # an invalid config: no series rather than a failed scrape
                    pool = None
            pools[key] = pool
        return pools[key]

    def collect(self) -> Iterable[Metric]:
        import json

        from hostfiles.confined import within
        from ipam.config import data_dir_of

        node = self._node()
        size = GaugeMetricFamily("tenantnet_ipam_pool_addresses",
                                 "addresses the network's range set can hand out (tenantnet-ipam)",
                                 labels=["network", "range_set", "family"])
        used = GaugeMetricFamily("tenantnet_ipam_pool_used_addresses",
                                 "addresses of the range set held on this node (tenantnet-ipam)",
                                 labels=["network", "range_set", "family"])
        networks: dict[str, tuple[str, dict[str, Any]]] = {}
        for s in self.index.snapshot(node):
            if s.ipam and s.ipam.get("type") == "tenantnet-ipam" and s.network not in networks:
                try:
                    networks[s.network] = (data_dir_of(s.ipam, node.ipam_data_dir), s.ipam)
                except Exception:
                    continue
        by_dir: dict[str, list[tuple[str, _Pool]]] = {}
        figures: dict[str, list[tuple[tuple[int, int], int]]] = {}
        with self._lock:
            pools: dict[str, _Pool | None] = {}
            for network, (data_dir, raw) in sorted(networks.items()):
                # The dir was confined when the ADD was made; the node config may have changed since.
                if not within(data_dir, node.ipam_data_dirs):
                    continue
                pool = self._pool(json.dumps(raw, sort_keys=True, default=str), raw, pools)
                if pool is not None:
                    by_dir.setdefault(data_dir, []).append((network, pool))
            self._pools = pools  # the sections of this scrape's records only
            for data_dir in [d for d in self._stores if d not in by_dir]:
                self._close(data_dir)  # no record names it any more
            for data_dir, entries in sorted(by_dir.items()):
                try:
                    store = self._store(data_dir)
                    with store.snapshot() as txn:
                        held = {network: [a.address for a in txn.allocations(network)]
                                for network, _ in entries}
                except Exception:  # an unreadable store: no series rather than a failed scrape
                    self._close(data_dir)
                    continue
                self._keep(data_dir, any(held.values()))
                for network, pool in entries:
                    figures[network] = list(zip(pool.sets, pool.used(held[network]), strict=True))
        for network, sets in sorted(figures.items()):
            for i, ((family, total), mine) in enumerate(sets):
                labels = [network, str(i), f"ipv{family}"]
                size.add_metric(labels, total)
                used.add_metric(labels, mine)
        yield size
        yield used

    def close(self) -> None:
        with self._lock:
            for data_dir in list(self._stores):
                self._close(data_dir)


_UNSEEN: Any = object()
