"""`tenantnet`: the CNI plugin executable kubelet, the runtime or Multus runs.

Thin on purpose: env + stdin → `tenantnet.core.Plugin` → stdout. VERSION is answered
without importing pyroute2, ovsdbapp or structlog.
"""

from __future__ import annotations

import sys
from typing import Any

from cni import skel
from cni.env import CniEnv


def handle(env: CniEnv, raw: dict[str, Any]) -> dict[str, Any] | None:
    from cni import log
    from cni.netconf import parse_netconf
    from tenantnet import config
    from tenantnet.core import Plugin

    node = config.load()
    log_file = raw.get("logFile") if isinstance(raw.get("logFile"), str) else None
    log_level = raw.get("logLevel") if raw.get("logLevel") in ("debug", "info", "warning", "error") else None
    log.setup(log_file or node.log_file, log_level or node.log_level)
    plugin = Plugin(node)
    if env.command == "GC":
        plugin.gc(env, raw)
        return None
    if env.command == "STATUS":
        plugin.status(env, raw)
        return None
    conf = parse_netconf(raw)
    if env.command == "ADD":
        return plugin.add(env, conf)
    if env.command == "DEL":
        plugin.delete(env, conf)
        return None
    plugin.check(env, conf)
    return None


def _log_unexpected(exc: BaseException) -> None:
    try:
        from cni import log

        log.get("tenantnet").error("internal_error", exc_info=exc)
    except Exception:
        pass


def main() -> None:
    code = skel.main(handle, _log_unexpected)
    if "tenantnet.system.ovsdb" in sys.modules:
        from tenantnet.system import ovsdb

        ovsdb.close_all()
    sys.exit(code)


if __name__ == "__main__":
    main()
