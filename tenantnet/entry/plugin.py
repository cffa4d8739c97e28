"""`tenantnet`: the CNI plugin executable kubelet, the runtime or Multus runs.

The executable is the standard-library-only shim (`tenantnet/entry/shim.py`): it forwards env +
stdin to the node's agent (`tenantnetctl agent run`, docs/agent.md) and prints its answer.
This module owns the *in-process* way in, used by the shim when no agent answers and by
the agent itself: env + stdin → `tenantnet.plugin.core.Plugin` → stdout. Both ways run
`cni.skel.run` with `dispatch` below, so their output is the same byte for byte.

Nothing outside the standard library is imported at module level: importing this module
(the console script does) must stay as cheap as the shim. VERSION is answered without
importing pyroute2, ovsdbapp or structlog.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are strings here
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from cni.env import CniEnv
    from tenantnet.plugin.core import Plugin


def dispatch(plugin: Plugin, env: CniEnv, raw: dict[str, Any]) -> dict[str, Any] | None:
    """The verb switch: one CNI call on a ready `Plugin` (shared by both ways in)."""
    if env.command == "GC":
        plugin.gc(env, raw)
        return None
    if env.command == "STATUS":
        plugin.status(env, raw)
        return None
    from cni.netconf import parse_netconf

    conf = parse_netconf(raw)
    if env.command == "ADD":
        return plugin.add(env, conf)
    if env.command == "DEL":
        plugin.delete(env, conf)
        return None
    plugin.check(env, conf)
    return None


def handle(env: CniEnv, raw: dict[str, Any]) -> dict[str, Any] | None:
    """In-process handler: node config and logging for this one call, then `dispatch`.

    A NAD's `logFile`/`logLevel` are checked (tenantnet.plugin.settings) before any file is opened:
    outside the node's log directory they are refused with code 7 — except on DEL, which
    must always be able to clean up, and then logs to the node's own file."""
    from cni import log
    from cni.errors import CniError
    from tenantnet.plugin import nodeconfig as config
    from tenantnet.plugin import settings
    from tenantnet.plugin.core import Plugin

    node = config.load()
    try:
        log_file, log_level = settings.log_settings(raw, node)
    except CniError:
        log.setup(node.log_file, node.log_level)
        if env.command != "DEL":
            raise
        log.get("tenantnet").warning("log_settings.ignored", error="the NAD's logFile/logLevel is "
                                     "not allowed; DEL goes on and logs here")
    else:
        log.setup(log_file, log_level)
    return dispatch(Plugin(node), env, raw)


def refuse_delegated(environ: Mapping[str, str], stdin: bytes) -> tuple[int, str] | None:
    """tenantnet run as a delegate of a tenantnet call (an IPAM type that leads back to it):
    answered at once with code 7, so that no NAD can make the plugin exec itself for ever."""
    from tenantnet.plugin.settings import delegation_depth

    if delegation_depth(environ) == 0:
        return None
    import json

    from cni.errors import CniError, Code
    from cni.netconf import config_version

    try:
        raw = json.loads(stdin)
    except ValueError:
        raw = {}
    err = CniError(Code.INVALID_CONFIG, "invalid network config: ipam.type leads back to tenantnet "
                                        "itself (tenantnet was run as the delegate of a tenantnet call)")
    return 1, json.dumps(err.to_dict(config_version(raw if isinstance(raw, dict) else {})))


def log_unexpected(exc: BaseException) -> None:
    """A bug: its traceback goes to the log file (stderr gets one line, cni.log)."""
    try:
        from cni import log

        log.get("tenantnet").error("internal_error", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
    except Exception:
        pass


def _node_log_target(environ: Mapping[str, str]) -> None:
    """Errors before the node config is read (undecodable stdin) go to the node's log."""
    from cni import log
    from tenantnet.plugin import nodeconfig as config

    try:
        node = config.load(environ.get("TENANTNET_CONFIG") or None)
    except Exception:
        return
    log.set_default_target(node.log_file, node.log_level)


def run_in_process(environ: Mapping[str, str], stdin: bytes) -> tuple[int, str]:
    """One CNI call in this process; (exit code, stdout text without the final newline)."""
    from cni import skel

    refused = refuse_delegated(environ, stdin)
    if refused is not None:
        return refused
    if environ.get("CNI_COMMAND") != "VERSION":
        _node_log_target(environ)
    code, text = skel.run(handle, environ, stdin, log_unexpected)
    if "tenantnet.plugin.system.ovsdb" in sys.modules:
        from tenantnet.plugin.system import ovsdb

        ovsdb.close_all()
    return code, text


def main() -> None:
    from tenantnet.entry import shim

    shim.main("tenantnet")


if __name__ == "__main__":
    main()
