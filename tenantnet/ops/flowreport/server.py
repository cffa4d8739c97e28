"""`/metrics` over HTTP for a Prometheus scrape: a small threaded `http.server`.

This module owns the serving only: every GET /metrics builds a fresh report through the
callable it is given (so each scrape reads OVS once, and nothing is cached that could go
stale). A lock keeps concurrent scrapes from running ovs-appctl in parallel: two scrapers
of one node would otherwise double the load on ovs-vswitchd for the same answer.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tenantnet.ops.flowreport.render import CONTENT_TYPE

CLIENT_TIMEOUT = 10.0  # a client that connects and sends nothing is dropped


class MetricsServer:
    def __init__(self, host: str, port: int, produce: Callable[[], str], token_file: str = "") -> None:
        """`token_file`: scrapes must present its bearer token (the node config's
        metricsTokenFile: the families name every tenant's pods), as the agent's do."""
        from tenantnet.entry.metrics import BearerToken

        self._produce = produce
        self._lock = threading.Lock()
        token = BearerToken(token_file) if token_file else None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            timeout = CLIENT_TIMEOUT

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                refusal = None
                if token is not None and path == "/metrics":
                    refusal = token.refusal(self.headers.get("Authorization"))
                if refusal is not None:
                    status, why = refusal
                    body = why.encode() + b"\n"
                    self.send_response(int(status.split()[0]))
                    if status.startswith("401"):
                        self.send_header("WWW-Authenticate", 'Bearer realm="tenantnet-metrics"')
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if path == "/metrics":
                    try:
                        with outer._lock:
                            body, code, ctype = outer._produce().encode(), 200, CONTENT_TYPE
                    except Exception as exc:  # answer 500 rather than drop the connection
                        body, code, ctype = f"error: {exc}\n".encode(), 500, "text/plain; charset=utf-8"
                elif path == "/":
                    body, code, ctype = b"tenantnet offload exporter: see /metrics\n", 200, "text/plain"
                else:
                    body, code, ctype = b"not found\n", 404, "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # stdout/stderr belong to the CLI; scrapes every 15 s would flood them

        server_class = ThreadingHTTPServer
        if ":" in host:  # an IPv6 literal needs an AF_INET6 socket
            server_class = type("V6Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        self.httpd = server_class((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> MetricsServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="offload-metrics", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def parse_listen(value: str) -> tuple[str, int]:
    """`ADDR:PORT`, `[v6]:PORT` or `:PORT` (all addresses) -> (host, port); ValueError if not."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--listen {value!r}: expected ADDR:PORT, e.g. 127.0.0.1:9477")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
