"""`tenantnet`: the CNI plugin executable kubelet, the runtime or Multus runs.

The executable is the standard-library-only shim (`tenantnet/shim.py`): it forwards env +
stdin to the node's agent (`tenantnetctl agent run`, docs/agent.md) and prints its answer.
This module owns the *in-process* way in, used by the shim when no agent answers and by
the agent itself: env + stdin → `tenantnet.core.Plugin` → stdout. Both ways run
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
    from tenantnet.core import Plugin


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
    """In-process handler: node config and logging for this one call, then `dispatch`."""
    from cni import log
    from tenantnet import config
    from tenantnet.core import Plugin

    node = config.load()
    log_file = raw.get("logFile") if isinstance(raw.get("logFile"), str) else None
    log_level = raw.get("logLevel") if raw.get("logLevel") in ("debug", "info", "warning", "error") else None
    log.setup(log_file or node.log_file, log_level or node.log_level)
    return dispatch(Plugin(node), env, raw)


def _log_unexpected(exc: BaseException) -> None:
    try:
        from cni import log

        log.get("tenantnet").error("internal_error", exc_info=exc)
    except Exception:
        pass


def run_in_process(environ: Mapping[str, str], stdin: bytes) -> tuple[int, str]:
    """One CNI call in this process; (exit code, stdout text without the final newline)."""
    from cni import skel

    code, text = skel.run(handle, environ, stdin, _log_unexpected)
    if "tenantnet.system.ovsdb" in sys.modules:
        from tenantnet.system import ovsdb

        ovsdb.close_all()
    return code, text


def main() -> None:
    from tenantnet import shim

    shim.main("tenantnet")


if __name__ == "__main__":
    main()
