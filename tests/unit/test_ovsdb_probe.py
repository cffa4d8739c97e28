"""ovsdb.probe (STATUS's OVSDB health check) against stub servers: the OVSDB client's own
connect and read, so every answer is bounded by the time-out and by MAX_REPLY, and every way a
server can fail is OvsdbUnavailable with the endpoint named; STATUS's message (ovsport.probe)
names the bound that ran out."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni.errors import CniError, Code
from tenantnet.plugin.drivers import ovsport
from tenantnet.plugin.nodeconfig import NodeConfig
from tenantnet.plugin.system import ovsdb

Serve = Callable[[socket.socket, dict[str, Any]], None]


class Stub:
    """A server on `endpoint` that reads one JSON-RPC request and hands it to `serve`; what
    it read is in `requests`, and `closed_by_client` says the client hung up afterwards."""

    def __init__(self, sock: socket.socket, endpoint: str, serve: Serve) -> None:
        self.sock, self.endpoint, self.serve = sock, endpoint, serve
        self.requests: list[dict[str, Any]] = []
        self.closed_by_client = threading.Event()
        sock.listen(1)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            data = b""
            decoder = json.JSONDecoder()
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
                try:
                    request, _ = decoder.raw_decode(data.decode())
                    break
                except ValueError:
                    continue
            self.requests.append(request)
            try:
                self.serve(conn, request)
                conn.settimeout(5)
                while conn.recv(65536):
                    pass
                self.closed_by_client.set()
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[Callable[..., Stub]]:
    made: list[Stub] = []

    def make(serve: Serve, tcp: bool = False) -> Stub:
        if tcp:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            endpoint = f"tcp:127.0.0.1:{sock.getsockname()[1]}"
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(tmp_path / "db.sock"))
            endpoint = f"unix:{tmp_path}/db.sock"
        made.append(s := Stub(sock, endpoint, serve))
        return s

    yield make
    for s in made:
        s.close()


def answer(result: Any = None, error: Any = None) -> Serve:
    def serve(conn: socket.socket, request: dict[str, Any]) -> None:
        conn.sendall(json.dumps({"id": request["id"], "result": result, "error": error}).encode())

    return serve


@pytest.mark.parametrize("tcp", [False, True])
def test_an_open_vswitch_server_passes_and_the_connection_is_closed(stub: Any, tcp: bool) -> None:
    s = stub(answer(["_Server", "Open_vSwitch"]), tcp=tcp)
    ovsdb.probe(s.endpoint, timeout=2)
    assert s.requests[0]["method"] == "list_dbs" and s.requests[0]["params"] == []
    assert s.closed_by_client.wait(5)


def test_a_keepalive_echo_before_the_answer_is_answered(stub: Any) -> None:
    echoed: list[Any] = []

    def serve(conn: socket.socket, request: dict[str, Any]) -> None:
        conn.sendall(b'{"method":"echo","params":["ka"],"id":"echo"}')
        echoed.append(json.loads(conn.recv(65536)))
        answer(["Open_vSwitch"])(conn, request)

    s = stub(serve)
    ovsdb.probe(s.endpoint, timeout=2)
    assert echoed == [{"result": ["ka"], "error": None, "id": "echo"}]


@pytest.mark.parametrize("serve", [answer(["OVN_Northbound"]), answer(error="unknown method"),
                                   answer({"Open_vSwitch": True})],
                         ids=["other-databases", "error", "not-a-list"])
def test_a_server_without_open_vswitch_is_unavailable(stub: Any, serve: Serve) -> None:
    s = stub(serve)
    with pytest.raises(ovsdb.OvsdbUnavailable, match=f"{s.endpoint} answered, but serves no Open_vSwitch"):
        ovsdb.probe(s.endpoint, timeout=2)


def test_a_silent_server_is_unavailable_within_the_timeout(stub: Any) -> None:
    s = stub(lambda conn, request: conn.recv(1))  # reads on, answers nothing, until the client goes
    start = time.monotonic()
    with pytest.raises(ovsdb.OvsdbUnavailable, match=f"OVSDB at {s.endpoint} did not answer within 0.3s"):
        ovsdb.probe(s.endpoint, timeout=0.3)
    assert time.monotonic() - start < 10  # the message names the 0.3 s; this rules out a hang


@pytest.mark.parametrize(("ovsdb_timeout", "within"), [
    (5.0, "within 2s (STATUS's bound; ovsdbTimeout is 5s)"),  # the default node config
    (0.3, "within 0.3s (ovsdbTimeout)"),
])
def test_status_names_the_bound_that_ran_out(stub: Any, ovsdb_timeout: float, within: str) -> None:
    # STATUS bounds its probe tighter than ovsdbTimeout: the message must not blame that
    # setting for a bound it did not set.
    s = stub(lambda conn, request: conn.recv(1))
    with pytest.raises(CniError) as exc:
        ovsport.probe(NodeConfig(ovsdb_timeout=ovsdb_timeout), s.endpoint)
    assert exc.value.code == Code.NOT_AVAILABLE
    assert exc.value.msg == (f"tenantnet is not available: listing databases: OVSDB at {s.endpoint} "
                             f"did not answer {within}")


def test_a_server_that_streams_forever_is_cut_at_max_reply(stub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ovsdb, "MAX_REPLY", 64 << 10)

    def flood(conn: socket.socket, request: dict[str, Any]) -> None:
        conn.sendall(b'{"id": 0, "result": ["')
        while True:  # never a whole message: only the size bound ends it (then a broken pipe)
            conn.sendall(b"x" * 4096)

    s = stub(flood)
    start = time.monotonic()
    with pytest.raises(ovsdb.OvsdbUnavailable, match=f"sent a reply larger than {64 << 10} bytes"):
        ovsdb.probe(s.endpoint, timeout=60)
    assert time.monotonic() - start < 30  # the size ended it, not the 60 s time-out


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"[1, 2]", b"\xff{}"])
def test_a_server_that_is_not_ovsdb_is_unavailable_at_once(stub: Any, reply: bytes) -> None:
    s = stub(lambda conn, request: conn.sendall(reply))
    start = time.monotonic()
    with pytest.raises(ovsdb.OvsdbUnavailable, match="answered, but not as an OVSDB server"):
        ovsdb.probe(s.endpoint, timeout=60)
    assert time.monotonic() - start < 30  # at once, not at the 60 s time-out


def test_a_server_that_hangs_up_is_unavailable(stub: Any) -> None:
    s = stub(lambda conn, request: conn.shutdown(socket.SHUT_WR))
    with pytest.raises(ovsdb.OvsdbUnavailable, match="closed the connection without answering"):
        ovsdb.probe(s.endpoint, timeout=2)


def test_no_server_is_unavailable_with_the_endpoint_named(tmp_path: Path) -> None:
    endpoint = f"unix:{tmp_path}/nothing.sock"
    with pytest.raises(ovsdb.OvsdbUnavailable, match=f"cannot connect to OVSDB at {endpoint}: No such file"):
        ovsdb.probe(endpoint)


@pytest.mark.parametrize("endpoint", ["ssl:127.0.0.1:6640", "tcp:127.0.0.1:port"])
def test_an_endpoint_it_cannot_use_is_unavailable(endpoint: str) -> None:
    with pytest.raises(ovsdb.OvsdbUnavailable, match=endpoint):
        ovsdb.probe(endpoint)
