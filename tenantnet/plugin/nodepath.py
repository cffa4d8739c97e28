"""Where the node config is, and which agent socket it declares: the one resolver of each.

The `tenantnet` shim needs both before it can forward a call, and it imports only cheap
parts of the standard library — so this module imports nothing but `sys`, and reads
`agentSocket` without a YAML parser. The node config loader (`nodeconfig.load`) takes its
`agentSocket` from here too, and refuses a file whose YAML says otherwise, so the shim and
the agent can never silently use different sockets.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs milliseconds to import in the shim
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

CONFIG_ENV = "TENANTNET_CONFIG"
DEFAULT_PATH = "/etc/tenantnet/tenantnet.yaml"
DEFAULT_AGENT_SOCKET = "/run/tenantnet/agent.sock"
MAX_CONFIG_BYTES = 1 << 20


def _fsdecode(value: bytes) -> str:
    return value.decode(sys.getfilesystemencoding(), "surrogateescape")


def environb() -> Mapping[bytes, bytes]:
    """The process environment as bytes. `os` costs ≈ 2 ms to import in an interpreter
    started with -S (nothing imported it yet); the builtin `posix` holds the same data. Once
    `os` is loaded (always, without -S), its view is used: it follows os.environ changes."""
    loaded = sys.modules.get("os")
    if loaded is not None:
        return loaded.environb  # type: ignore[no-any-return]
    import posix

    return posix.environ


def given(explicit: str | None = None, environ: Mapping[str, str] | Mapping[bytes, bytes] | None = None
          ) -> str | None:
    """The node config path the caller chose: `explicit` (a --node-config option), else
    $TENANTNET_CONFIG of `environ` (default: this process's); None when neither is set."""
    if explicit:
        return explicit
    env: Mapping[Any, Any] = environb() if environ is None else environ
    for key in (CONFIG_ENV, CONFIG_ENV.encode()):  # a str- or a bytes-keyed environment
        try:
            value = env.get(key)
        except TypeError:  # os.environb refuses str keys
            continue
        if value:
            return _fsdecode(value) if isinstance(value, bytes) else str(value)
    return None


def node_config_path(explicit: str | None = None,
                     environ: Mapping[str, str] | Mapping[bytes, bytes] | None = None) -> str:
    """`given(...)`, else the default path."""
    return given(explicit, environ) or DEFAULT_PATH


def agent_socket_of(config_path: str) -> tuple[str, bool]:
    """(socket path, whether the node config names it) — without a YAML parser.

    Only a plain top-level `agentSocket: /path` line is recognised (quotes and a trailing
    comment allowed); an unreadable or missing file means the default socket.
    """
    try:
        with open(config_path, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES)
    except OSError:
        return DEFAULT_AGENT_SOCKET, False
    for line in data.split(b"\n"):
        if not line.startswith(b"agentSocket:"):
            continue
        value = line[len(b"agentSocket:"):]
        if b" #" in value:
            value = value.split(b" #", 1)[0]
        value = value.strip()
        if len(value) >= 2 and value[:1] == value[-1:] and value[:1] in (b"'", b'"'):
            value = value[1:-1]
        if value:
            return _fsdecode(value), True
    return DEFAULT_AGENT_SOCKET, False
