"""The compiled trampoline (trampoline/trampoline.c) against its reference, the Python shim:
the same request on the wire, the same answer printed, the same refusals, and the hand-offs
(no agent, a failed agent, too much stdin, a missing -shim file). Stub agents in this
process or in a child; no root, no lab."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenantnet.entry import shim
from tenantnet.plugin import nodepath
from tests.shimways import BIN, ROOT, SOURCE, WAYS, cflags, compiler, executable, is_elf, require_trampoline
from tests.unit.test_shim import StubAgent, answering, node_config

BASE = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # a locale: Python would add LC_CTYPE otherwise


def run(way: str, env: dict, stdin: bytes | None, command: str = "tenantnet", timeout: float = 30,
        **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([executable(way, command)], input=stdin, env=env, capture_output=True,
                          timeout=timeout, check=False, **kw)  # type: ignore[call-overload]


@pytest.fixture
def answer(tmp_path: Path) -> Iterator[tuple[StubAgent, Path]]:
    """An answering stub agent and a node config naming it."""
    agent = StubAgent(str(tmp_path / "agent.sock"), lambda c: None)
    agent.behaviour = answering(stub_out=b'{"cniVersion": "1.0.0"}\n')(agent)
    yield agent, node_config(tmp_path, f"agentSocket: {agent.path}")
    agent.close()


def same_request(a: tuple, b: tuple) -> None:
    """Two decoded requests: equal but for the deadline (each exec has its own clock)."""
    assert (a[0], a[1], a[2]) == (b[0], b[1], b[2])


# ---- the build ---------------------------------------------------------------------------------

def test_compiles_warning_free_with_the_makefiles_flags(tmp_path):
    cc = compiler()
    assert cc, "no C compiler: install gcc and libc6-dev (scripts/install-deps.sh does)"
    flags = cflags()
    assert {"-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"} <= set(flags)
    out = tmp_path / "tenantnet"
    proc = subprocess.run([cc, *flags, "-static", "-o", str(out), str(SOURCE)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert is_elf(out)
    # a few hundred lines, and the standard headers only
    text = SOURCE.read_text()
    assert len(text.splitlines()) < 600
    headers = {line.split()[1] for line in text.splitlines() if line.startswith("#include")}
    assert all(h.startswith("<") for h in headers), headers


def test_the_venv_runs_the_trampoline_in_front_of_the_python_shims():
    require_trampoline()
    for command in ("tenantnet", "tenantnet-ipam"):
        text = (BIN / f"{command}-shim").read_text()
        assert text.startswith("#!") and "tenantnet.entry." in text


@pytest.mark.parametrize("with_compiler", [True, False])
def test_make_builds_the_trampoline_only_with_a_compiler(tmp_path, with_compiler):
    """The Makefile's plugin rule, run for real into a scratch venv directory (its python is
    this venv's): with a compiler, `tenantnet` is the static trampoline and `tenantnet-shim`
    the Python launcher; without one (CC names nothing), both are Python launchers. The
    decision is made when the rule runs, not when make reads the Makefile: on a fresh
    machine `make test` installs gcc after reading it."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(Path(sys.executable))
    (venv / ".installed").touch()
    cc = compiler() if with_compiler else "/nonexistent/cc"
    assert cc, "no C compiler: install gcc and libc6-dev (scripts/install-deps.sh does)"
    proc = subprocess.run(["make", "-C", str(ROOT), f"VENV={venv}", f"CC={cc}", "-o", f"{venv}/.installed",
                           f"{venv}/.plugins"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for command in ("tenantnet", "tenantnet-ipam"):
        assert not is_elf(venv / "bin" / f"{command}-shim")
        assert is_elf(venv / "bin" / command) is with_compiler, proc.stdout
    if not with_compiler:
        assert "no C compiler" in proc.stdout
        assert "tenantnet.entry.plugin" in (venv / "bin" / "tenantnet").read_text()


# ---- same request, same answer ---------------------------------------------------------------------

@pytest.mark.parametrize("code,out,err", [
    (0, b'{"cniVersion": "1.0.0", "ips": []}\n', b""),
    (1, b'{"cniVersion": "0.4.0", "code": 7, "msg": "bad \\u00e9"}\n', b'{"level": "warning"}\n'),
    (0, b"", b""),
    (255, b"x" * 300_000, b"e" * 70_000),  # more than a pipe holds
    (3, "un résumé\n".encode(), b""),
])
@pytest.mark.parametrize("command", ["tenantnet", "tenantnet-ipam"])
def test_same_answer_byte_for_byte(tmp_path, code, out, err, command):
    agent = StubAgent(str(tmp_path / "agent.sock"), lambda c: None)
    agent.behaviour = answering(stub_out=out, code=code, err=err)(agent)
    try:
        conf = node_config(tmp_path, f"agentSocket: {agent.path}")
        env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1"}
        stdin = b'{"cniVersion": "1.0.0", "name": "n"}'
        got = [run(way, env, stdin, command) for way in WAYS]
        assert got[0].returncode == got[1].returncode == code
        assert got[0].stdout == got[1].stdout == out
        assert got[0].stderr == got[1].stderr == err
        assert len(agent.requests) == 2 and agent.requests[0][0] == command
        same_request(*agent.requests)
    finally:
        agent.close()


KEY = st.binary(min_size=1, max_size=40).filter(
    lambda k: b"=" not in k and b"\0" not in k and not k.startswith((b"LC_", b"LANG", b"TENANTNET_"))
    and k not in (b"PATH",))
VALUE = st.binary(max_size=2000).filter(lambda v: b"\0" not in v)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.dictionaries(KEY, VALUE, max_size=40),
       size=st.one_of(st.sampled_from([0, 1, shim.MAX_STDIN]), st.integers(0, shim.MAX_STDIN)),
       seed=st.integers(0, 2**32), command=st.sampled_from(["tenantnet", "tenantnet-ipam"]))
def test_env_and_stdin_reach_the_agent_exactly_as_sent(answer, extra, size, seed, command):
    agent, conf = answer
    stdin = random.Random(seed).randbytes(size)  # any bytes, NUL included
    env_b: dict[bytes, bytes] = {k.encode(): v.encode() for k, v in BASE.items()}
    env_b.update(extra)
    env_b.update({b"TENANTNET_CONFIG": str(conf).encode(), b"CNI_COMMAND": b"ADD"})
    del agent.requests[:]
    for way in WAYS:
        proc = run(way, env_b, stdin, command)  # type: ignore[arg-type]
        assert proc.returncode == 0 and proc.stdout == b'{"cniVersion": "1.0.0"}\n', proc.stderr[-500:]
    tramp, python = agent.requests
    assert tramp[0] == command and tramp[1] == env_b and tramp[2] == stdin
    same_request(tramp, python)


def test_a_large_environment_and_the_largest_stdin(answer):
    agent, conf = answer
    rnd = random.Random(7)
    env = {**{f"V{i}".encode(): rnd.randbytes(100).replace(b"\0", b"x") for i in range(3000)},
           b"BIG": rnd.randbytes(120_000).replace(b"\0", b"y"),
           **{k.encode(): v.encode() for k, v in BASE.items()},
           b"TENANTNET_CONFIG": str(conf).encode(), b"CNI_COMMAND": b"ADD"}
    stdin = rnd.randbytes(shim.MAX_STDIN)
    for way in WAYS:
        assert run(way, env, stdin).returncode == 0  # type: ignore[arg-type]
    assert agent.requests[0][1] == env and agent.requests[0][2] == stdin
    same_request(*agent.requests)


DUPLICATES = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
def arr(items):
    a = (ctypes.c_char_p * (len(items) + 1))(*items, None)
    return a
env = [b"DUP=first", b"NOEQUALS", b"DUP=second", b"=empty-key", b"X=1", b"X=2"] + [a.encode() for a in sys.argv[2:]]
libc.execve(sys.argv[1].encode(), arr([sys.argv[1].encode()]), arr(env))
raise SystemExit(f"execve failed: {ctypes.get_errno()}")
"""


def test_duplicate_keys_the_first_wins_as_in_python(answer):
    agent, conf = answer
    for way in WAYS:
        proc = subprocess.run([sys.executable, "-c", DUPLICATES, executable(way), *(f"{k}={v}" for k, v in BASE.items()),
                               f"TENANTNET_CONFIG={conf}", "CNI_COMMAND=ADD"],
                              input=b"{}", capture_output=True, timeout=30, check=False)
        assert proc.returncode == 0, proc.stderr
    env = agent.requests[0][1]
    assert env[b"DUP"] == b"first" and env[b"X"] == b"1" and env[b""] == b"empty-key"
    assert list(env)[:3] == [b"DUP", b"", b"X"]
    same_request(*agent.requests)


def test_a_closed_stdin_is_empty(answer):
    agent, conf = answer
    env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD"}
    for way in WAYS:
        proc = subprocess.run([executable(way)], env=env, capture_output=True, timeout=30, check=False,
                              preexec_fn=lambda: os.close(0))
        assert proc.returncode == 0, proc.stderr
    assert agent.requests[0][2] == b""
    same_request(*agent.requests)


@pytest.mark.parametrize("value,expected", [
    ("2.5", 2.5), (" 7\n", 7.0), ("1_0", 10.0), ("1e1", 10.0), ("0x10", 60.0), ("nan", 60.0),
    ("inf", 60.0), ("-1", 60.0), ("0", 60.0), ("99999", 60.0), ("", 60.0), ("abc", 60.0), ("_1", 60.0),
    ("3600", 3600.0), ("1__0", 60.0),
])
def test_the_time_out_is_read_as_the_python_shim_reads_it(answer, value, expected):
    agent, conf = answer
    assert shim.timeout_of({b"TENANTNET_AGENT_TIMEOUT": value.encode()}) == expected
    env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD", "TENANTNET_AGENT_TIMEOUT": value}
    for way in WAYS:
        started = time.monotonic()
        assert run(way, env, b"{}").returncode == 0
        deadline = agent.requests[-1][3]
        assert started + expected - 0.01 <= deadline <= time.monotonic() + expected, (way, deadline - started)


@pytest.mark.parametrize("line", [
    "agentSocket: {p}", "agentSocket:{p}", "agentSocket: '{p}' # a comment", 'agentSocket: "{p}"',
    "agentSocket:\t{p}\r", "agentSocket: ''\nagentSocket: {p}", "agentSocket: {p}  #",
    "x: 1\nagentSocket: {p}\nagentSocket: /elsewhere",
])
def test_the_socket_is_found_as_nodepath_finds_it(tmp_path, line):
    agent = StubAgent(str(tmp_path / "a.sock"), lambda c: None)
    agent.behaviour = answering(stub_out=b"{}\n")(agent)
    try:
        conf = tmp_path / "node.yaml"
        conf.write_text(line.replace("{p}", agent.path) + "\n")
        assert nodepath.agent_socket_of(str(conf)) == (agent.path, True)
        proc = run("trampoline", {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD"}, b"{}")
        assert proc.stdout == b"{}\n" and len(agent.requests) == 1
    finally:
        agent.close()


# ---- refusals and failures: the same as the Python shim's ---------------------------------------

@pytest.mark.parametrize("size", [shim.MAX_STDIN + 1, 3 << 20])
def test_over_limit_stdin_is_refused_as_the_python_shim_refuses_it(answer, size):
    agent, conf = answer
    env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD"}
    got = [run(way, env, b"{" + b" " * (size - 1)) for way in WAYS]
    assert got[0].returncode == got[1].returncode == 1
    assert got[0].stdout == got[1].stdout
    err = json.loads(got[0].stdout)
    assert err["code"] == 6 and f"more than {shim.MAX_STDIN} bytes" in err["msg"] and "stdin" in err["msg"]
    assert agent.requests == []  # refused before any agent


@pytest.mark.parametrize("kind", ["stall", "vanish", "half-then-stall", "garbled", "huge-length"])
def test_a_failing_agent_gives_the_same_code_11_both_ways(tmp_path, kind):
    held: list[socket.socket] = []

    def behave(conn: socket.socket) -> None:
        shim.recv_frame(conn)
        whole = shim.frame(shim.encode_response(0, b'{"cniVersion": "1.0.0"}\n'))
        if kind == "vanish":
            conn.close()
        elif kind == "half-then-stall":
            conn.sendall(whole[:len(whole) // 2])
            held.append(conn)
        elif kind == "garbled":
            conn.sendall(shim.frame(b"tenantnet/2\x000\x003\x00abc"))
            conn.close()
        elif kind == "huge-length":
            conn.sendall((shim.MAX_FRAME + 1).to_bytes(4, "big") + b"x" * 100)
            conn.close()
        else:
            held.append(conn)

    agent = StubAgent(str(tmp_path / "agent.sock"), behave)
    try:
        conf = node_config(tmp_path, f"agentSocket: {agent.path}")
        env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD", "TENANTNET_AGENT_TIMEOUT": "0.4"}
        got = []
        for way in WAYS:
            started = time.monotonic()
            proc = run(way, env, b'{"cniVersion": "0.3.1"}')
            got.append((proc, time.monotonic() - started))
        for proc, elapsed in got:
            err = json.loads(proc.stdout)  # exactly one JSON document
            assert proc.returncode == 1 and err["code"] == 11 and err["cniVersion"] == "0.3.1", err
            assert err["details"] == "the request may still complete in the agent; retrying it is safe"
            # Rules out a hang (the stub holds a stalled connection forever): 20 s, far from the
            # 0.4 s time-out plus an exec on a loaded machine (2.4 s was within its jitter).
            assert elapsed < 20
            if kind in ("stall", "half-then-stall"):
                assert elapsed >= 0.4 and "did not answer within 0.4s" in err["msg"]
            else:
                assert "went away before answering" in err["msg"], err
        if kind in ("stall", "vanish", "half-then-stall"):  # the Python shim's own wording
            assert got[0][0].stdout == got[1][0].stdout
    finally:
        agent.close()
        for conn in held:
            conn.close()


HALF_AND_DIE = r"""
import os, signal, socket, sys
from tenantnet.entry import shim
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(4)
print("ready", flush=True)
conn, _ = s.accept()
shim.recv_frame(conn)
whole = shim.frame(shim.encode_response(0, b'{"cniVersion": "1.0.0", "interfaces": [{"name": "net1"}]}\n' * 400))
conn.sendall(whole[: len(whole) // 2])
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("way", WAYS)
def test_an_agent_killed_mid_answer_gives_one_error_never_a_partial_answer(tmp_path, way):
    path = str(tmp_path / "agent.sock")
    agent = subprocess.Popen([sys.executable, "-c", HALF_AND_DIE, path], stdout=subprocess.PIPE,
                             cwd=str(ROOT))
    try:
        assert agent.stdout is not None and agent.stdout.readline() == b"ready\n"
        conf = node_config(tmp_path, f"agentSocket: {path}")
        proc = run(way, {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD"}, b'{"cniVersion": "1.0.0"}')
        assert agent.wait(timeout=30) == -signal.SIGKILL
        err = json.loads(proc.stdout)
        assert proc.returncode == 1 and set(err) == {"cniVersion", "code", "msg", "details"}
        assert err["code"] == 11 and "went away" in err["msg"] and b"interfaces" not in proc.stdout
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_connect_errors_that_mean_no_agent_run_in_process(tmp_path):
    plain = tmp_path / "file"
    plain.write_text("")
    for sock in (plain, plain / "agent.sock", tmp_path / "missing" / "agent.sock"):  # refused, ENOTDIR, ENOENT
        conf = node_config(tmp_path, f"agentSocket: {sock}")
        proc = run("trampoline", {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "VERSION"}, b"")
        assert proc.returncode == 0 and json.loads(proc.stdout)["supportedVersions"], proc.stdout


def test_a_socket_path_too_long_is_a_failure_not_in_process(tmp_path):
    conf = node_config(tmp_path, f"agentSocket: /run/{'x' * 120}/agent.sock")
    proc = run("trampoline", {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "VERSION"}, b"")
    err = json.loads(proc.stdout)
    assert proc.returncode == 1 and err["code"] == 11 and "path too long" in err["msg"]


# ---- the hand-off -------------------------------------------------------------------------------

def test_the_failure_variable_makes_the_python_shim_answer_11_without_an_agent(answer):
    agent, conf = answer
    env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD",
           "TENANTNET_SHIM_FAILURE": "the tenantnet agent at /x did not answer within 1s"}
    proc = run("python", env, b'{"cniVersion": "0.4.0"}')
    assert proc.returncode == 1 and agent.requests == []
    assert json.loads(proc.stdout) == {
        "cniVersion": "0.4.0", "code": 11, "msg": "the tenantnet agent at /x did not answer within 1s",
        "details": "the request may still complete in the agent; retrying it is safe"}
    # The trampoline never takes a caller's variable for its own, nor forwards it.
    proc = run("trampoline", env, b"{}")
    assert proc.returncode == 0 and b"TENANTNET_SHIM_FAILURE" not in agent.requests[0][1]


def test_the_hand_off_gives_the_shim_the_same_stdin(tmp_path):
    # No agent: the trampoline execs tenantnet-ipam-shim, which runs in-process on the stdin
    # the trampoline had already read (the error is in the config's cniVersion).
    conf = node_config(tmp_path, f"agentSocket: {tmp_path}/none.sock")
    env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "DEL"}
    got = [run(way, env, b'{"cniVersion": "0.4.0"}' + b" " * 200_000, "tenantnet-ipam") for way in WAYS]
    assert got[0].stdout == got[1].stdout and got[0].returncode == got[1].returncode == 1
    assert json.loads(got[0].stdout)["cniVersion"] == "0.4.0"


def test_the_name_comes_from_argv0_else_from_the_binary(tmp_path, answer):
    agent, conf = answer
    require_trampoline()
    env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD"}
    link = tmp_path / "tenantnet-ipam"
    link.symlink_to(BIN / "tenantnet")  # /proc/self/exe says tenantnet, argv[0] tenantnet-ipam
    subprocess.run([str(link)], input=b"{}", env=env, capture_output=True, timeout=30, check=True)
    subprocess.run(["something-else"], executable=str(BIN / "tenantnet-ipam"), input=b"{}", env=env,
                   capture_output=True, timeout=30, check=True)
    assert [r[0] for r in agent.requests] == ["tenantnet-ipam", "tenantnet-ipam"]


def test_a_missing_shim_is_a_clear_error(tmp_path, answer):
    agent, conf = answer
    require_trampoline()
    lone = tmp_path / "bin" / "tenantnet"
    lone.parent.mkdir()
    lone.write_bytes((BIN / "tenantnet").read_bytes())
    lone.chmod(0o755)
    # With an agent the fast path needs no shim ...
    ok = subprocess.run([str(lone)], input=b"{}", env={**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD"},
                        capture_output=True, timeout=30, check=False)
    assert ok.returncode == 0 and ok.stdout == b'{"cniVersion": "1.0.0"}\n'
    # ... without one, nothing can answer: one CNI error naming the missing file.
    none = node_config(tmp_path, f"agentSocket: {tmp_path}/none.sock")
    proc = subprocess.run([str(lone)], input=b"{}", env={**BASE, "TENANTNET_CONFIG": str(none), "CNI_COMMAND": "ADD"},
                          capture_output=True, timeout=30, check=False)
    err = json.loads(proc.stdout)
    assert proc.returncode == 1 and err["code"] == 5
    assert f"{lone}-shim" in err["msg"] and "No such file or directory" in err["msg"] and "not installed" in err["msg"]


# ---- the exit status and who serves the socket (issue 26) -------------------------------------

@pytest.mark.parametrize("code", [256, -256, 512, -1, 65280, 10**11, -(10**11)])
def test_an_answer_code_no_exit_status_can_carry_exits_1_both_ways(tmp_path, code):
    """An exit status is the code's low 8 bits: 256 would exit 0. Any code outside 0..255 is
    a failure: exit 1 (shim.exit_status), the answer printed as it came."""
    agent = StubAgent(str(tmp_path / "agent.sock"), lambda c: None)
    agent.behaviour = answering(stub_out=b'{"code": 7}\n', code=code, err=b"e\n")(agent)
    try:
        conf = node_config(tmp_path, f"agentSocket: {agent.path}")
        env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD"}
        for way in WAYS:
            proc = run(way, env, b"{}")
            assert (proc.returncode, proc.stdout, proc.stderr) == (1, b'{"code": 7}\n', b"e\n"), way
        assert len(agent.requests) == 2
    finally:
        agent.close()


@pytest.mark.parametrize("code,length", [(b"1" * 13, b"0"), (b"+1", b"0"), (b" 1", b"0"), (b"1_0", b"0"),
                                         (b"-", b"0"), (b"", b"0"), (b"0", b"-0"), (b"0", b"5")])
def test_a_garbled_code_or_length_is_the_same_failure_both_ways(tmp_path, code, length):
    """The Python shim reads the answer's numbers as the trampoline does (int() alone took
    ' 1', '+1', '1_0' and any number of digits, and a length past the end)."""
    with pytest.raises(ValueError, match="garbled answer frame"):
        shim.decode_response(b"tenantnet/1\0" + code + b"\0" + length + b"\0ab")

    def behave(conn: socket.socket) -> None:
        shim.recv_frame(conn)
        conn.sendall(shim.frame(b"tenantnet/1\0" + code + b"\0" + length + b"\0ab"))
        conn.close()

    agent = StubAgent(str(tmp_path / "agent.sock"), behave)
    try:
        conf = node_config(tmp_path, f"agentSocket: {agent.path}")
        got = [run(way, {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "ADD"}, b"{}") for way in WAYS]
        assert got[0].stdout == got[1].stdout and got[0].returncode == got[1].returncode == 1
        err = json.loads(got[0].stdout)
        assert err["code"] == 11 and "(ValueError: garbled answer frame)" in err["msg"], err
    finally:
        agent.close()


NOBODY = 65534
# A listener that runs as `nobody` on a socket the test bound (SO_PEERCRED reports the uid
# at listen()); one line per connection: how many bytes it received. "END" stops it.
FOREIGN_AGENT = r"""
import os, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
s.listen(8)
print("ready", os.geteuid(), flush=True)
while True:
    conn, _ = s.accept()
    conn.settimeout(20)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    if data == b"END":
        break
    print(len(data), flush=True)
    conn.close()
"""


def test_a_socket_served_by_another_uid_is_sent_nothing_and_the_call_runs_in_process(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("needs root: the foreign listener runs as nobody", pytrace=False)
    path = str(tmp_path / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    foreign = subprocess.Popen([python, "-I", "-S", "-c", FOREIGN_AGENT, str(listener.fileno())],
                               pass_fds=(listener.fileno(),), user=NOBODY, group=NOBODY, extra_groups=[],
                               stdout=subprocess.PIPE, text=True)
    listener.close()
    try:
        assert foreign.stdout is not None and foreign.stdout.readline() == f"ready {NOBODY}\n"
        conf = node_config(tmp_path, f"agentSocket: {path}")
        env = {**BASE, "TENANTNET_CONFIG": str(conf), "CNI_COMMAND": "VERSION"}
        secret = b'{"cniVersion": "1.0.0", "secret": "s3cr3t"}'
        warning = f"tenantnet: warning: agent.untrusted_socket: the socket {path} is served by uid {NOBODY}, "
        for way in WAYS:
            proc = run(way, {**env, "CNI_ARGS": "K8S_POD_NAME=p"}, secret)
            assert proc.returncode == 0 and json.loads(proc.stdout)["supportedVersions"], (way, proc)
            assert proc.stderr.decode().startswith(warning) and proc.stderr.count(b"\n") == 1, proc.stderr
        # A node config that declares the agent: STATUS says it is not available (code 50).
        proc = run("trampoline", {**env, "CNI_COMMAND": "STATUS"}, b'{"cniVersion": "1.1.0", "name": "n", "type": "tenantnet"}')
        err = json.loads(proc.stdout)
        assert proc.returncode == 1 and err["code"] == 50 and f"served by uid {NOBODY}" in err["msg"], err
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as end:
            end.connect(path)
            end.sendall(b"END")
        assert foreign.wait(timeout=30) == 0
        received = foreign.stdout.read().split()
        # Connected to (each way, the trampoline then the shim it hands over to), sent nothing.
        assert len(received) == 5 and set(received) == {"0"}, received
    finally:
        if foreign.poll() is None:
            foreign.kill()
            foreign.wait()
