"""The stdlib-only shim: what it imports, how it finds the agent, its protocol, and how it
gives up — against a stub agent in this process (no root, no lab). The tests that exec the
plugin run both ways in: through the compiled trampoline and through the Python shim
(tests/shimways.py); tests/unit/test_trampoline.py compares the two byte for byte."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cni import version as cniversion
from tenantnet.entry import shim
from tenantnet.plugin import nodepath
from tests.shimways import WAYS, executable


class StubAgent:
    """A unix socket server speaking the shim protocol with a canned behaviour."""

    def __init__(self, path: str, behaviour: Callable[[socket.socket], None]) -> None:
        self.path = path
        self.behaviour = behaviour
        self.requests: list[tuple[str, dict[bytes, bytes], bytes, float]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.behaviour(conn)

    def close(self) -> None:
        self.sock.close()


def answering(stub_out: bytes, code: int = 0, err: bytes = b"") -> Callable[[StubAgent], Callable]:
    def make(agent: StubAgent) -> Callable[[socket.socket], None]:
        def behaviour(conn: socket.socket) -> None:
            agent.requests.append(shim.decode_request(shim.recv_frame(conn)))
            conn.sendall(shim.frame(shim.encode_response(code, stub_out, err)))
            conn.close()
        return behaviour
    return make


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[Callable[..., StubAgent]]:
    made: list[StubAgent] = []
    held: list[socket.socket] = []

    def start(kind: str = "answer", **kw: object) -> StubAgent:
        path = str(tmp_path / "agent.sock")
        agent = StubAgent(path, lambda c: None)
        if kind == "answer":
            agent.behaviour = answering(**kw)(agent)  # type: ignore[arg-type]
        elif kind == "stall":
            agent.behaviour = held.append  # accept, read nothing, never answer
        elif kind == "vanish":
            agent.behaviour = lambda c: (shim.recv_frame(c), c.close())
        made.append(agent)
        return agent

    yield start
    for agent in made:
        agent.close()
    for conn in held:
        conn.close()


def node_config(tmp_path: Path, socket_line: str | None) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text("logLevel: info\n" + (socket_line + "\n" if socket_line else ""))
    return path


def run_shim(cmd: str, env: dict[str, str], stdin: bytes, timeout: float = 20, way: str = "trampoline"
             ) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin"}
    return subprocess.run([executable(way, cmd)], input=stdin, env={**base, **env}, capture_output=True,
                          timeout=timeout, check=False)


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> str:
    """The trampoline, or the Python shim it falls back to."""
    return str(request.param)


# ---- what the fast path imports --------------------------------------------------------------

PROBE = """
import sys
before = set(sys.modules)
import io, os
sys.stdin = io.TextIOWrapper(io.BytesIO(b'{"cniVersion": "1.0.0", "name": "n", "type": "tenantnet"}'))
import posix
def fast_exit(code):  # the real one would end the probe before it reports
    sys.stderr.write("FAST-EXIT ")
    raise SystemExit(code)
posix._exit = fast_exit
from {module} import main
try:
    main()
except SystemExit:
    pass
new = sorted(set(sys.modules) - before)
outside = [m for m in new if m.split(".")[0] not in sys.stdlib_module_names
           and m not in ("tenantnet", "tenantnet.entry", "tenantnet.entry.plugin", "tenantnet.entry.shim",
                                          "tenantnet.plugin", "tenantnet.plugin.nodepath",
                                          "tenantnet.entry.ipam")]
sys.stderr.write("OUTSIDE=" + repr(outside))
"""


@pytest.mark.parametrize("module", ["tenantnet.entry.plugin", "tenantnet.entry.ipam"])
@pytest.mark.parametrize("kind", ["answer", "stall"])
def test_shim_imports_nothing_outside_the_standard_library(tmp_path, stub, module, kind):
    stub(kind, stub_out=b'{"ok": true}\n') if kind == "answer" else stub(kind)
    conf = node_config(tmp_path, f"agentSocket: {tmp_path}/agent.sock")
    env = {"PATH": "/usr/bin:/bin", "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD",
           "TENANTNET_AGENT_TIMEOUT": "0.3"}
    proc = subprocess.run([sys.executable, "-c", PROBE.replace("{module}", module)], env=env,
                          capture_output=True, text=True, timeout=20, check=False)
    assert "OUTSIDE=[]" in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"ok": True} if kind == "answer" else out["code"] == 11
    # An agent's answer ends the process at once (no interpreter shutdown); a shim that
    # had to answer by itself exits the normal way.
    assert ("FAST-EXIT" in proc.stderr) == (kind == "answer")


def test_shim_constants_follow_cni_version():
    assert shim.SUPPORTED == cniversion.SUPPORTED and shim.CURRENT == cniversion.CURRENT
    # the shim refuses oversize stdin itself, with the bound the decoder applies
    from cni.netconf import MAX_STDIN_BYTES

    assert shim.MAX_STDIN == MAX_STDIN_BYTES


# ---- finding the agent -----------------------------------------------------------------------

@pytest.mark.parametrize("line,expected", [
    (None, (nodepath.DEFAULT_AGENT_SOCKET, False)),
    ("agentSocket: /run/x/a.sock", ("/run/x/a.sock", True)),
    ("agentSocket: '/run/x/a.sock'  # quoted, with a comment", ("/run/x/a.sock", True)),
    ('agentSocket: "/run/x/a.sock"', ("/run/x/a.sock", True)),
    ("  agentSocket: /nested/is/not/top-level", (nodepath.DEFAULT_AGENT_SOCKET, False)),
])
def test_agent_socket_is_read_from_the_node_config(tmp_path, line, expected):
    assert nodepath.agent_socket_of(str(node_config(tmp_path, line))) == expected


def test_agent_socket_agrees_with_the_yaml_reading(tmp_path):
    from tenantnet.plugin import nodeconfig as config

    path = node_config(tmp_path, "agentSocket: '/run/y/agent.sock' # note")
    assert config.load(str(path)).agent_socket == nodepath.agent_socket_of(str(path))[0] == "/run/y/agent.sock"
    assert config.load(str(node_config(tmp_path, None))).agent_socket == nodepath.DEFAULT_AGENT_SOCKET


def test_agent_socket_must_be_absolute(tmp_path):
    from cni.errors import CniError
    from tenantnet.plugin import nodeconfig as config

    with pytest.raises(CniError) as err:
        config.load(str(node_config(tmp_path, "agentSocket: relative.sock")))
    assert err.value.code == 7 and "agentSocket" in err.value.msg


# ---- protocol --------------------------------------------------------------------------------

def test_request_and_response_frames_round_trip_any_bytes():
    env = {b"CNI_ARGS": b"A=1;B=2", b"X": b"=\xff\n", b"EMPTY": b""}
    stdin = b"\x00\xff{not json\n"
    assert shim.decode_request(shim.encode_request("tenantnet", env, stdin, 1.5)) == ("tenantnet", env, stdin, 1.5)
    assert shim.decode_response(shim.encode_response(1, b"out\x00", b"err")) == (1, b"out\x00", b"err")
    with pytest.raises(ValueError):
        shim.decode_request(b"other/1\0x\x001\x000\0")


def test_shim_forwards_env_and_stdin_and_prints_the_answer_verbatim(tmp_path, stub, way):
    agent = stub("answer", stub_out=b'{"cniVersion": "1.0.0"}\n', code=1, err=b"a warning\n")
    conf = node_config(tmp_path, f"agentSocket: {agent.path}")
    stdin = b'{"cniVersion": "1.0.0", "name": "n"}'
    proc = run_shim("tenantnet", {"TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD",
                                  "CNI_CONTAINERID": "c1"}, stdin, way=way)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, b'{"cniVersion": "1.0.0"}\n', b"a warning\n")
    plugin, env, got_stdin, deadline = agent.requests[0]
    assert plugin == "tenantnet" and got_stdin == stdin
    assert 0 < deadline - time.monotonic() <= shim.DEFAULT_TIMEOUT
    assert env[b"CNI_CONTAINERID"] == b"c1" and env[b"TENANTNET_CONFIG"] == str(conf).encode()
    run_shim("tenantnet-ipam", {"TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "DEL"}, stdin, way=way)
    assert agent.requests[1][0] == "tenantnet-ipam"


# ---- giving up -------------------------------------------------------------------------------

def test_stalled_agent_gives_code_11_after_the_time_out(tmp_path, stub, way):
    agent = stub("stall")
    conf = node_config(tmp_path, f"agentSocket: {agent.path}")
    started = time.monotonic()
    proc = run_shim("tenantnet", {"TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD",
                                  "TENANTNET_AGENT_TIMEOUT": "0.5"}, b'{"cniVersion": "0.4.0"}', way=way)
    elapsed = time.monotonic() - started
    err = json.loads(proc.stdout)
    assert proc.returncode == 1 and err["code"] == 11 and err["cniVersion"] == "0.4.0"
    # Not before the time-out; 20 s only rules out a hang (the stub never answers).
    assert "did not answer within 0.5s" in err["msg"] and 0.5 <= elapsed < 20


def test_agent_vanishing_mid_request_gives_code_11(tmp_path, stub, way):
    agent = stub("vanish")
    conf = node_config(tmp_path, f"agentSocket: {agent.path}")
    proc = run_shim("tenantnet", {"TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "DEL"}, b"{}", way=way)
    err = json.loads(proc.stdout)
    assert proc.returncode == 1 and err["code"] == 11 and err["cniVersion"] == "1.1.0"
    assert "went away" in err["msg"]


# ---- no agent: in-process, same answers ------------------------------------------------------

@pytest.mark.parametrize("stale_socket", [False, True])
def test_no_agent_runs_in_process(tmp_path, stale_socket, way):
    sock_path = tmp_path / "agent.sock"
    if stale_socket:  # a socket file nobody listens on (a SIGKILLed agent's)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(sock_path))
        s.close()
    conf = node_config(tmp_path, f"agentSocket: {sock_path}")
    proc = run_shim("tenantnet", {"TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "VERSION"}, b"", way=way)
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == cniversion.version_info()
    proc = run_shim("tenantnet-ipam", {"TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "DEL"},
                    b'{"cniVersion": "1.0.0"}', way=way)
    assert proc.returncode == 1 and proc.stdout == (
        b'{"cniVersion": "1.0.0", "code": 4, "msg": "missing environment variable CNI_CONTAINERID '
        b'(required for DEL)"}\n')


def test_status_reports_a_declared_agent_that_is_missing(tmp_path, way):
    conf = node_config(tmp_path, f"agentSocket: {tmp_path}/nothing/agent.sock")
    proc = run_shim("tenantnet", {"TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "STATUS"},
                    b'{"cniVersion": "1.1.0", "name": "n", "type": "tenantnet"}', way=way)
    err = json.loads(proc.stdout)
    assert proc.returncode == 1 and err["code"] == 50 and "agent" in err["msg"]


def test_timeout_env_is_bounded():
    assert shim.timeout_of({b"TENANTNET_AGENT_TIMEOUT": b"2.5"}) == 2.5
    for bad in (b"0", b"-1", b"x", b"99999"):
        assert shim.timeout_of({b"TENANTNET_AGENT_TIMEOUT": bad}) == shim.DEFAULT_TIMEOUT
