"""The `tenantnet` / `tenantnet-ipam` fast path: forward one CNI call to the node's agent.

This module owns the client side of the agent protocol and the decision "agent or
in-process". It imports **only the standard library**, and only cheap parts of it (no
`json`, `re`, `typing`, not even `socket`'s enum wrappers on the fast path): an exec that
reaches the agent costs the interpreter start plus a few hundred microseconds, instead of
the ≈ 180 ms of imports and the OVSDB connect of the in-process plugin (docs/agent.md).

    agent answers              → print its stdout/stderr, exit with its code (`exit_status`:
                                 a code outside 0..255 exits 1, never 0 by truncation)
    no agent (no socket file,
      connection refused), or
      the socket served by a
      uid neither root nor ours → run the same request in-process (slower, same result);
                                 for the wrong uid nothing is sent, and one line on stderr
    agent stalls / goes away   → CNI error 11 (try again later) after a bounded time-out;
                                 never a hang, never a second execution next to a live agent

The compiled trampoline (trampoline/trampoline.c, installed as `tenantnet` with this shim as
`tenantnet-shim`) does the first row itself and execs this shim for the others, with the
stdin it read on fd 0 again; when the agent failed it sets TENANTNET_SHIM_FAILURE to the
reason, and this shim then answers code 11 with it without going to any agent.

Protocol (unix stream socket, one request per connection; both frames are a 4-byte
big-endian length followed by the payload; NUL can appear in neither an env string nor a
field, so it separates them):

    request  = "tenantnet/1" NUL plugin NUL deadline_ms NUL n NUL env_1 NUL … env_n NUL stdin
    response = "tenantnet/1" NUL code NUL len(stdout) NUL stdout stderr

`plugin` is `tenantnet`, `tenantnet-ipam`, or `-status` (the agent's health report as JSON
on stdout). `deadline_ms` is when the shim stops waiting, on CLOCK_MONOTONIC (one clock for
all processes of the host), so the agent can drop work whose caller has already gone.
`env_i` are `KEY=VALUE` bytes of the caller's environment; stdin is passed as bytes,
untouched. See docs/agent.md.
"""

from __future__ import annotations

import _socket  # the C module: `socket` would pull in enum & co. for nothing we use here
import posix  # builtin, already loaded by the interpreter's start: free
import sys
import time  # built into the interpreter: free

from tenantnet.plugin.nodepath import agent_socket_of, environb, node_config_path

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are strings here
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    InProcess = Callable[[Mapping[str, str], bytes], tuple[int, str]]
    # Told of a call the shim refuses itself (env as bytes, the error document it prints).
    Refused = Callable[[Mapping[bytes, bytes], bytes], None]

MAGIC = b"tenantnet/1"
# Seconds the shim waits for the agent's answer (connect + send + answer). An answer later
# than this is lost, never half-printed; the runtime retries and the agent's per-attachment
# serialisation plus the records make the retry idempotent.
TIMEOUT_ENV = "TENANTNET_AGENT_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
MAX_FRAME = 64 << 20  # a CNI answer is a few kB; this only bounds a corrupt length
# Kept equal to cni.version (tests/unit/test_shim.py checks): errors the shim writes itself
# must be in the config's cniVersion exactly as cni.skel would write them.
CURRENT = "1.1.0"
SUPPORTED = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50
DECODE_FAILURE = 6
MAX_STDIN = 1 << 20  # = cni.netconf.MAX_STDIN_BYTES: larger stdin is refused before the agent
# Set by the trampoline when the agent took (or may have taken) the request and failed: the
# one-line reason. Never forwarded; with it, the shim answers code 11 and goes to no agent.
FAILURE_ENV = b"TENANTNET_SHIM_FAILURE"
RETRY_DETAILS = "the request may still complete in the agent; retrying it is safe"

# connect() errors meaning "nobody serves this socket": fall back to in-process.
_NO_AGENT = {2, 20, 111, 13}  # ENOENT, ENOTDIR, ECONNREFUSED, EACCES


class AgentUnavailable(Exception):
    """No agent listens on the socket (the caller may run the request in-process)."""


class AgentUntrusted(AgentUnavailable):
    """The socket is served by a process whose uid is neither root nor ours: not our agent
    (a socket path misconfigured into a shared directory, a squatter). Nothing was sent.
    `uid`: the serving process's, when it could be read."""

    def __init__(self, msg: str, uid: int | None = None) -> None:
        super().__init__(msg)
        self.uid = uid


class AgentFailed(Exception):
    """An agent took the request but gave no complete answer (stall or crash)."""


def timeout_of(environ: dict[bytes, bytes]) -> float:
    try:
        value = float(environ.get(b"TENANTNET_AGENT_TIMEOUT", b"") or DEFAULT_TIMEOUT)
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if 0 < value <= 3600 else DEFAULT_TIMEOUT


# ---- framing (shared with tenantnet/entry/agent.py) -----------------------------------------------

def encode_request(plugin: str, environ: dict[bytes, bytes], stdin: bytes, deadline: float) -> bytes:
    """`deadline` in time.monotonic() seconds."""
    items = [k + b"=" + v for k, v in environ.items()]
    head = [MAGIC, plugin.encode(), str(int(deadline * 1000)).encode(), str(len(items)).encode(), *items]
    return b"\0".join(head) + b"\0" + stdin


def decode_request(payload: bytes) -> tuple[str, dict[bytes, bytes], bytes, float]:
    """(plugin, env, stdin, caller's deadline in time.monotonic() s); ValueError if malformed."""
    magic, plugin, deadline_ms, count, rest = payload.split(b"\0", 4)
    if magic != MAGIC:
        raise ValueError(f"unknown protocol {magic[:20]!r}")
    n = int(count)
    parts = rest.split(b"\0", n)
    if len(parts) != n + 1:
        raise ValueError("truncated environment")
    environ: dict[bytes, bytes] = {}
    for item in parts[:n]:
        key, sep, value = item.partition(b"=")
        if not sep:
            raise ValueError(f"environment item without '=': {item[:40]!r}")
        environ[key] = value
    return plugin.decode(), environ, parts[n], int(deadline_ms) / 1000


def encode_response(code: int, stdout: bytes, stderr: bytes = b"") -> bytes:
    return b"\0".join([MAGIC, str(code).encode(), str(len(stdout)).encode()]) + b"\0" + stdout + stderr


def decode_response(payload: bytes) -> tuple[int, bytes, bytes]:
    """(code, stdout, stderr); ValueError if malformed. The numbers are read as the
    trampoline reads them: ASCII digits only (at most 12), a '-' allowed before the code."""
    magic, code, length, rest = payload.split(b"\0", 3)
    if magic != MAGIC:
        raise ValueError(f"unknown protocol {magic[:20]!r}")
    n = _decimal(length, signed=False)
    if n > len(rest):
        raise ValueError("garbled answer frame")
    return _decimal(code, signed=True), rest[:n], rest[n:]


def _decimal(field: bytes, *, signed: bool) -> int:
    digits = field[1:] if signed and field[:1] == b"-" else field
    if not 0 < len(digits) <= 12 or not digits.isdigit():  # bytes.isdigit: ASCII only
        raise ValueError("garbled answer frame")
    return int(field)


def exit_status(code: int) -> int:
    """The exit status for an answer's `code`: the code itself in 0..255, else 1. An exit
    status is the code's low 8 bits, so 256 or -256 would exit 0 — a failure must never
    read as a success. The trampoline applies the same rule."""
    return code if 0 <= code <= 255 else 1


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def recv_frame(sock: object, limit: int = MAX_FRAME) -> bytes:
    """One length-prefixed frame of at most `limit` bytes; EOFError if the peer closed first."""
    head = _recv_exact(sock, 4)
    n = int.from_bytes(head, "big")
    if n > limit:
        raise ValueError(f"frame of {n} bytes exceeds {limit}")
    return _recv_exact(sock, n)


def _recv_exact(sock: object, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))  # type: ignore[attr-defined]
        if not chunk:
            raise EOFError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# ---- the client -----------------------------------------------------------------------------

def ask(socket_path: str, plugin: str, environ: dict[bytes, bytes], stdin: bytes,
        timeout: float, trusted: tuple[int, ...] | None = None) -> tuple[int, bytes, bytes]:
    """Send one request; (code, stdout, stderr) of the agent's answer.

    Raises AgentUnavailable before anything was sent (AgentUntrusted when the socket is
    served by a uid not in `trusted`: by default root and ours), AgentFailed after.
    """
    deadline = time.monotonic() + timeout
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except TimeoutError:
            raise AgentFailed(f"the tenantnet agent at {socket_path} did not accept the "
                              f"connection within {timeout:g}s") from None
        except OSError as exc:
            if exc.errno in _NO_AGENT:
                raise AgentUnavailable(f"no tenantnet agent at {socket_path}: {exc.strerror}") from None
            raise AgentFailed(f"cannot reach the tenantnet agent at {socket_path}: {exc.strerror}") from None
        _check_peer(sock, socket_path, trusted)
        try:
            sock.sendall(frame(encode_request(plugin, environ, stdin, deadline)))
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            return decode_response(recv_frame(sock))
        except TimeoutError:
            raise AgentFailed(f"the tenantnet agent at {socket_path} did not answer within "
                              f"{timeout:g}s") from None
        except (OSError, EOFError, ValueError) as exc:
            raise AgentFailed(f"the tenantnet agent at {socket_path} went away before answering "
                              f"({type(exc).__name__}: {exc})") from None
    finally:
        sock.close()


def _check_peer(sock: object, socket_path: str, trusted: tuple[int, ...] | None = None) -> None:
    """AgentUntrusted unless the process serving the socket (SO_PEERCRED: its uid when it
    called listen) is root or runs as our own uid — the agent's rule for its callers, turned
    around — or, given `trusted`, one of those uids. The environment and stdin are not sent
    anywhere else."""
    own = posix.geteuid()
    try:
        creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # type: ignore[attr-defined]
        uid = int.from_bytes(creds[4:8], sys.byteorder)  # struct ucred {pid, uid, gid}
    except (OSError, ValueError) as exc:
        raise AgentUntrusted(f"cannot tell who serves {socket_path} ({exc}): "
                             "nothing was sent to it") from None
    if trusted is not None and uid not in trusted:
        raise AgentUntrusted(f"the socket {socket_path} is served by uid {uid}, not one of "
                             f"{', '.join(map(str, trusted))}: nothing was sent to it", uid)
    if trusted is None and uid not in (0, own):
        raise AgentUntrusted(f"the socket {socket_path} is served by uid {uid}, neither root nor uid {own} "
                             "(not the tenantnet agent): nothing was sent to it", uid)


def error_json(stdin: bytes, code: int, msg: str, details: str = "") -> bytes:
    """A CNI error document in the config's version, exactly as cni.skel writes one."""
    import json  # only on this (rare) path

    try:
        raw = json.loads(stdin)
    except ValueError:
        raw = None
    version = raw.get("cniVersion") if isinstance(raw, dict) else None
    out: dict[str, object] = {"cniVersion": version if version in SUPPORTED else CURRENT,
                              "code": code, "msg": msg}
    if details:
        out["details"] = details
    return json.dumps(out).encode() + b"\n"


def _load_site() -> None:
    if sys.flags.no_site and "site" not in sys.modules:
        # Started with -S (the fast path needs only the standard library): the libraries
        # of a venv or system install are found through site, so run it now. The installed
        # runtime puts its own libraries on sys.path and finds nothing more here.
        import site

        site.main()


def _in_process(in_process: InProcess, stdin: bytes) -> tuple[int, bytes]:
    """The same request without an agent: the full plugin in this process."""
    _load_site()
    import os

    code, text = in_process(os.environ, stdin)
    return code, (text + "\n").encode() if text else b""


def main(plugin: str, in_process: InProcess, on_refused: Refused | None = None) -> None:
    """The executable: serve one exec of `plugin` (falling back to `in_process`) and exit.
    When the agent answered, exit at once: the answer is written and flushed, and the
    interpreter's orderly shutdown (module teardown, ≈ 2–3 ms here) would only delay the
    runtime. After the in-process fallback, exit normally so that its libraries can finish."""
    code = run(plugin, in_process, on_refused)
    if _served_by_agent:
        import posix

        posix._exit(code)
    sys.exit(code)


_served_by_agent = False


def run(plugin: str, in_process: InProcess, on_refused: Refused | None = None) -> int:
    """Serve one exec of `plugin`: forward to the agent, or fall back to `in_process` (the
    entry module's, which passes itself: the shim never imports the plugin); returns the
    exit code."""
    global _served_by_agent
    # Bounded: one byte over the limit is enough to refuse, whatever the caller sends.
    stdin = b"" if sys.stdin is None or sys.stdin.closed else sys.stdin.buffer.read(MAX_STDIN + 1)
    environ = environb()
    failure = environ.get(FAILURE_ENV)
    if failure is not None:
        # The trampoline's request failed in the agent: the same answer as an AgentFailed here.
        reason = failure.decode(sys.getfilesystemencoding(), "surrogateescape")
        return _print(1, error_json(stdin, TRY_AGAIN_LATER, reason, RETRY_DETAILS), b"")
    if len(stdin) > MAX_STDIN:
        answer = error_json(b"", DECODE_FAILURE, f"network config on stdin is more than {MAX_STDIN} "
                                                 f"bytes; at most {MAX_STDIN} (1 MiB) allowed")
        if on_refused is not None:  # the entry module logs it (this module imports no logger)
            _load_site()
            on_refused(environ, answer)
        return _print(1, answer, b"")
    socket_path, declared = agent_socket_of(node_config_path(environ=environ))
    forwarded = dict(environ)
    forwarded.pop(FAILURE_ENV, None)
    try:
        code, out, err = ask(socket_path, plugin, forwarded, stdin, timeout_of(environ))
        code = exit_status(code)
        _served_by_agent = True
    except AgentFailed as exc:
        code, out, err = 1, error_json(stdin, TRY_AGAIN_LATER, str(exc), RETRY_DETAILS), b""
    except AgentUnavailable as exc:
        if isinstance(exc, AgentUntrusted):
            # The one line a warning gets on stderr (as oneshotlog.one_line writes it).
            sys.stderr.write(f"tenantnet: warning: agent.untrusted_socket: {exc}\n")
            sys.stderr.flush()
        if declared and environ.get(b"CNI_COMMAND") == b"STATUS":
            # The node config declares an agent: its absence is what STATUS is for, even
            # though ADD/DEL would still work (slowly) in-process. docs/agent.md explains.
            code, out, err = 1, error_json(
                stdin, NOT_AVAILABLE, f"tenantnet is not available: {exc} (the node config declares "
                                      "agentSocket; ADD and DEL fall back to the slow in-process path)"), b""
        else:
            code, out = _in_process(in_process, stdin)
            err = b""
    return _print(code, out, err)


def _print(code: int, out: bytes, err: bytes) -> int:
    # Through the text layer, as cni.skel.main writes: the bytes are the same (the JSON is
    # ASCII), and a caller that swapped sys.stdout for its own object still sees the write.
    if out:
        sys.stdout.write(out.decode("utf-8", "replace"))
    sys.stdout.flush()
    if err:
        sys.stderr.write(err.decode("utf-8", "replace"))
        sys.stderr.flush()
    return code
