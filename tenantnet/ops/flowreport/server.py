"""`/metrics` over HTTP for a Prometheus scrape, for `tenantnetctl offload --listen` on nodes
without the agent: served by tenantnet's one HTTP server (tenantnet/entry/httpserve.py), with
the same bounds as the agent's endpoint (connections, header bytes and time per request, the
token checked before any report is built).

This module owns the route only: every GET /metrics builds a fresh report through the
callable it is given (so each scrape reads OVS once, and nothing is cached that could go
stale). A lock keeps concurrent scrapes from running ovs-appctl in parallel: two scrapers
of one node would otherwise double the load on ovs-vswitchd for the same answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tenantnet.entry.httpserve import HttpServer, Request, Response
from tenantnet.ops.flowreport.render import CONTENT_TYPE


class MetricsServer:
    def __init__(self, host: str, port: int, produce: Callable[[], str], token_file: str = "") -> None:
        """`token_file`: scrapes must present its bearer token (the node config's
        metricsTokenFile: the families name every tenant's pods), as the agent's do."""
        self._produce = produce
        self._lock = threading.Lock()
        self.http = HttpServer(host, port, {"/metrics": self._metrics, "/": self._index},
                               token_file=token_file, name="offload-metrics")

    def _metrics(self, request: Request) -> Response:
        try:
            with self._lock:
                return Response(200, self._produce().encode(), CONTENT_TYPE)
        except Exception as exc:  # answer 500 rather than drop the connection
            return Response(500, f"error: {exc}\n".encode())

    @staticmethod
    def _index(request: Request) -> Response:
        return Response(200, b"tenantnet offload exporter: see /metrics\n")

    @property
    def address(self) -> tuple[str, int]:
        return self.http.address

    def start(self) -> MetricsServer:
        self.http.start()
        return self

    def serve_forever(self) -> None:
        self.http.serve_forever()

    def stop(self) -> None:
        self.http.stop()

    def close(self) -> None:
        self.http.close()


def parse_listen(value: str) -> tuple[str, int]:
    """`ADDR:PORT`, `[v6]:PORT` or `:PORT` (all addresses) -> (host, port); ValueError if not."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--listen {value!r}: expected ADDR:PORT, e.g. 127.0.0.1:9477")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
