"""tenantnet/entry/httpserve.py, the one HTTP server of /metrics and `offload --listen`: the
bounds hold before any handler runs, whatever a client sends.

What is asserted is the bounds themselves (connections refused beyond the cap, a request
that trickles in cut at its deadline, oversized headers answered 431, the token checked
before the handler), never a duration or a memory figure: those are bench/bench_metrics.py's.
Where a test waits, it waits for an event with a generous ceiling, so a loaded machine makes
it slower, not red.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenantnet.entry import httpserve
from tenantnet.entry.httpserve import HttpServer, Request, Response

CEILING = 60.0  # no test waits longer than this for anything the server should do


class App:
    """A route that counts its calls; `gate`, when set, holds each call until it is set."""

    def __init__(self) -> None:
        self.calls: list[Request] = []
        self.gate: threading.Event | None = None

    def __call__(self, request: Request) -> Response:
        self.calls.append(request)
        if self.gate is not None:
            self.gate.wait(CEILING)
        return Response(200, b"hello\n")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[HttpServer, App]]:
    app = App()
    server = HttpServer("127.0.0.1", 0, {"/metrics": app}, max_connections=4, request_deadline=1.0,
                        response_deadline=5.0).start()
    yield server, app
    server.stop()


def connect(server: HttpServer) -> socket.socket:
    s = socket.create_connection(server.address, timeout=CEILING)
    s.settimeout(CEILING)
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything until the server closes (b"" or what came before a reset)."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def status_of(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def get(server: HttpServer, path: str = "/metrics", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host, port = server.address
    request = urllib.request.Request(f"http://{host}:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=CEILING) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def wait_for(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    until = time.monotonic() + CEILING
    while not predicate():
        assert time.monotonic() < until, what
        time.sleep(0.01)


# ---- the packaged bounds ---------------------------------------------------------------------

def test_the_packaged_bounds_are_the_issues_and_both_servers_use_them(tmp_path):
    from tenantnet.entry.metrics import AgentMetrics
    from tenantnet.ops.flowreport.server import MetricsServer
    from tenantnet.plugin.nodeconfig import NodeConfig

    assert (httpserve.MAX_CONNECTIONS, httpserve.MAX_HEADER_BYTES, httpserve.REQUEST_DEADLINE) == (16, 8192, 5.0)
    node = NodeConfig(state_dir=str(tmp_path / "state"))
    agent = AgentMetrics(dict, lambda: node)
    agent.serve("127.0.0.1", 0)
    offload = MetricsServer("127.0.0.1", 0, lambda: "").start()
    try:
        for server in (agent._server, offload.http):
            assert isinstance(server, HttpServer)
            assert (server.max_connections, server.max_header_bytes, server.request_deadline,
                    server.response_deadline) == (httpserve.MAX_CONNECTIONS, httpserve.MAX_HEADER_BYTES,
                                                  httpserve.REQUEST_DEADLINE, httpserve.RESPONSE_DEADLINE)
    finally:
        agent.stop()
        offload.stop()


# ---- connections -----------------------------------------------------------------------------

def test_connections_beyond_the_cap_are_refused_at_once_and_served_again_when_one_ends(served):
    server, app = served
    held = [connect(server) for _ in range(server.max_connections)]
    try:
        wait_for(lambda: server.stats.accepted == server.max_connections, "the held connections accepted")
        # One more: answered by the accepting thread without waiting for any held one.
        extra = connect(server)
        answer = read_all(extra)
        extra.close()
        assert status_of(answer) in (503, None), answer  # 503, or closed before it could be read
        assert server.stats.refused["over_capacity"] >= 1
        assert app.calls == []
        # The held ones are idle: their deadline ends them (408), and a slot is free again.
        for s in held:
            assert status_of(read_all(s)) == 408
            s.close()
        wait_for(lambda: server.stats.active == 0, "the held connections' threads ended")
        assert get(server) == (200, b"hello\n")
    finally:
        for s in held:
            s.close()


def test_a_slow_handler_holds_one_slot_and_the_others_are_still_served(served):
    server, app = served
    gate = threading.Event()
    app.gate = gate
    slow = threading.Thread(target=get, args=(server,))
    slow.start()
    try:
        wait_for(lambda: len(app.calls) == 1, "the slow scrape's handler")
        app.gate = None
        assert get(server) == (200, b"hello\n")
        wait_for(lambda: server.stats.active == 1, "only the slow scrape left")
    finally:
        gate.set()
        slow.join(CEILING)


# ---- time ------------------------------------------------------------------------------------

def test_a_request_that_trickles_in_is_cut_at_its_deadline_not_at_an_idle_timeout(served):
    """A byte every 0.1 s never leaves the connection idle; the deadline runs from the accept
    regardless, so the request is answered 408 and closed while the client is still sending."""
    server, app = served
    request = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100_000  # 10,000 s at this pace
    s = connect(server)
    started = time.monotonic()
    sent = 0
    try:
        while not _readable(s):  # until the server answers or closes
            assert time.monotonic() - started < CEILING, "the server kept reading a request that never ends"
            try:
                s.send(request[sent:sent + 1])
            except OSError:
                break
            sent += 1
            time.sleep(0.1)
        ended = time.monotonic() - started
        assert status_of(read_all(s)) == 408
    finally:
        s.close()
    assert ended >= server.request_deadline - 0.05  # not cut before its deadline (from the accept)
    assert 0 < sent < len(request)
    assert server.stats.refused["deadline"] == 1 and app.calls == []


def _readable(s: socket.socket) -> bool:
    import select

    return bool(select.select([s], [], [], 0)[0])


def test_an_idle_connection_is_cut_at_the_deadline(served):
    server, app = served
    s = connect(server)
    try:
        started = time.monotonic()
        assert status_of(read_all(s)) == 408
        assert time.monotonic() - started >= server.request_deadline - 0.05
    finally:
        s.close()
    assert app.calls == []


def test_a_client_that_does_not_read_the_answer_is_cut_at_the_response_deadline(tmp_path):
    big = b"x" * (32 << 20)  # more than the socket buffers of both ends hold
    server = HttpServer("127.0.0.1", 0, {"/metrics": lambda r: Response(200, big)}, max_connections=2,
                        request_deadline=1.0, response_deadline=1.0).start()
    try:
        s = connect(server)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        wait_for(lambda: server.stats.answered == 1, "the request answered")
        # The connection's thread gives up within its deadline and frees its slot.
        # The client has read nothing: the connection's thread gives up at its deadline and
        # frees its slot (the kernel still holds what was sent; the client is not drained here).
        wait_for(lambda: server.stats.active == 0, "the connection given up, its slot freed")
        s.close()
    finally:
        server.stop()


# ---- size ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["one huge header", "many headers", "a request line without end"])
def test_oversized_headers_are_answered_431_and_not_read_further(served, shape):
    server, app = served
    if shape == "one huge header":
        data = b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    elif shape == "many headers":
        data = b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(100_000)) + b"\r\n"
    else:
        data = b"GET /" + b"a" * (1 << 20)
    s = connect(server)
    try:
        try:
            s.sendall(data)  # the server stops reading at its limit: this may fail midway
        except OSError:
            pass
        answer = read_all(s)
    finally:
        s.close()
    assert status_of(answer) in (431, None), answer[:200]
    assert server.stats.refused["headers_too_large"] == 1 and app.calls == []


def test_headers_just_under_the_limit_are_served(served):
    server, app = served
    line = b"GET /metrics HTTP/1.1\r\n"
    filler = b"X-Fill: " + b"a" * (server.max_header_bytes - len(line) - len(b"X-Fill: \r\n\r\n")) + b"\r\n\r\n"
    s = connect(server)
    try:
        s.sendall(line + filler)
        assert status_of(read_all(s)) == 200
    finally:
        s.close()
    assert len(app.calls) == 1


# ---- who, and what -----------------------------------------------------------------------------

def test_the_token_is_checked_before_the_handler_runs(tmp_path):
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    app = App()
    server = HttpServer("127.0.0.1", 0, {"/metrics": app}, token_file=str(token)).start()
    try:
        for headers in ({}, {"Authorization": "Bearer tok-"}, {"Authorization": "Basic tok-1"}):
            code, body = get(server, headers=headers)
            assert code == 401 and b"tok-1" not in body
        assert app.calls == [] and server.stats.refused["unauthorized"] == 3
        token.unlink()
        assert get(server, headers={"Authorization": "Bearer tok-1"})[0] == 503  # fails closed
        assert app.calls == []
        token.write_text("tok-1")
        assert get(server, headers={"Authorization": "Bearer tok-1"}) == (200, b"hello\n")
        assert len(app.calls) == 1
        assert get(server, "/nothing-here")[0] == 404  # no token needed to learn that; nothing is served
    finally:
        server.stop()


@pytest.mark.parametrize("request_line,status", [
    (b"POST /metrics HTTP/1.1", 405), (b"GET /metrics HTTP/2.0", 505), (b"GET metrics HTTP/1.1", 400),
    (b"GET /metrics", 400), (b"\x00\xff\xfe", 400), (b"GET /metrics HTTP/1.1\r\nno colon here", 400),
])
def test_requests_that_are_not_a_plain_get_are_refused_without_the_handler(served, request_line, status):
    server, app = served
    s = connect(server)
    try:
        s.sendall(request_line + b"\r\n\r\n")
        assert status_of(read_all(s)) == status
    finally:
        s.close()
    assert app.calls == []


def test_head_and_query_and_a_bare_lf_request(served):
    server, app = served
    s = connect(server)
    try:
        s.sendall(b"HEAD /metrics?x=1 HTTP/1.0\n\n")
        answer = read_all(s)
    finally:
        s.close()
    assert status_of(answer) == 200 and b"Content-Length: 6" in answer and answer.endswith(b"\r\n\r\n")
    assert app.calls[0].query == "x=1" and app.calls[0].method == "HEAD"


def test_a_failing_handler_is_a_500_answer(tmp_path):
    def broken(_: Request) -> Response:
        raise RuntimeError("boom")

    server = HttpServer("127.0.0.1", 0, {"/metrics": broken}).start()
    try:
        code, body = get(server)
        assert code == 500 and b"boom" in body
    finally:
        server.stop()


def test_stop_closes_the_port_and_the_cpu_counter_counts_connections(served):
    server, _ = served
    before = server.cpu_seconds()
    for _ in range(20):
        assert get(server)[0] == 200
    wait_for(lambda: server.cpu_seconds() > before, "CPU counted")
    host, port = server.address
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=5).close()


def test_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server = HttpServer("::1", 0, {"/metrics": App()}).start()
    except OSError:
        pytest.skip("no ::1 here")
    try:
        assert get(server)[0] == 200
    finally:
        server.stop()


# ---- rate ------------------------------------------------------------------------------------

def test_the_accept_pace_is_a_token_bucket():
    now = [100.0]
    pace = httpserve._Pace(10.0, 3, lambda: now[0])
    for _ in range(3):  # the burst
        assert pace.wait() == 0
        pace.took()
    assert pace.wait() == pytest.approx(0.1)
    now[0] += 0.05
    assert pace.wait() == pytest.approx(0.05)
    now[0] += 0.05
    assert pace.wait() == pytest.approx(0, abs=1e-9)
    now[0] += 1e-6
    assert pace.wait() == 0
    pace.took()
    now[0] += 1000  # a long quiet time refills the burst, not more
    for _ in range(3):
        assert pace.wait() == 0
        pace.took()
    assert pace.wait() > 0


def test_a_flood_of_connections_is_accepted_no_faster_than_the_pace():
    """Clients connecting in a loop: the server accepts at most the burst plus the rate for
    the time elapsed (an upper bound: a loaded machine accepts fewer, never more); the rest
    wait in the kernel's backlog, costing the agent nothing."""
    server = HttpServer("127.0.0.1", 0, {"/metrics": App()}, accepts_per_second=20.0, accept_burst=5,
                        max_connections=64).start()
    stop = threading.Event()
    served = [0]

    def client() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(server.address, timeout=2) as s:
                    s.settimeout(2)
                    s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                    served[0] += status_of(read_all(s)) == 200
            except OSError:
                pass

    started = time.monotonic()
    clients = [threading.Thread(target=client) for _ in range(8)]
    try:
        for c in clients:
            c.start()
        time.sleep(1.5)
    finally:
        stop.set()
        for c in clients:
            c.join(CEILING)
        elapsed = time.monotonic() - started
        server.stop()
    accepted = server.stats.accepted + server.stats.refused["over_capacity"]
    assert served[0] > 0 and accepted <= 5 + 20.0 * elapsed + 1, (accepted, elapsed)
