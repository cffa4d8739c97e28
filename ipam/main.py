"""`tenantnet-ipam`: the CNI IPAM executable (ADD, DEL, CHECK, GC, STATUS, VERSION).

A thin frame over `ipam.plugin`; `cni.skel` turns errors into CNI error JSON. Imports are
kept to the standard library plus `cni`/`ipam` so an exec costs little more than the
interpreter; the structured logger is imported only when a bug has to be recorded.
"""

from __future__ import annotations

import sys
from typing import Any

from cni import skel
from cni.env import CniEnv
from cni.netconf import parse_netconf, valid_attachments


def handle(env: CniEnv, raw: dict[str, Any]) -> dict[str, Any] | None:
    from ipam import plugin

    conf = parse_netconf(raw)
    if env.command == "ADD":
        return plugin.add(env, conf).to_dict(conf.cni_version, ipam=True)
    if env.command == "DEL":
        plugin.delete(env, conf)
    elif env.command == "CHECK":
        plugin.check(env, conf)
    elif env.command == "GC":
        plugin.gc(conf, valid_attachments(raw))
    elif env.command == "STATUS":
        plugin.status(conf)
    return None


def _log_unexpected(exc: BaseException) -> None:
    from cni import log

    log.get("tenantnet-ipam").error("unexpected error", exc_info=exc)


def main() -> int:
    return skel.main(handle, on_unexpected=_log_unexpected)


if __name__ == "__main__":
    sys.exit(main())
