"""`tenantnet-ipam`: the CNI IPAM executable (ADD, DEL, CHECK, GC, STATUS, VERSION).

The executable is the standard-library-only shim (`tenantnet/entry/shim.py`), which forwards the
call to the node's agent when one runs (docs/agent.md). This module owns the in-process
frame over `ipam.plugin` that the shim falls back to and the agent runs: `cni.skel` turns
errors into CNI error JSON. Nothing outside the standard library is imported at module
level; the structured logger is imported only when a bug has to be recorded.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are strings here
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from cni.env import CniEnv
    from ipam.cluster import ClusterNode
    from ipam.config import Confinement
    from tenantnet.plugin.nodeconfig import NodeConfig


def confinement(node: NodeConfig) -> Confinement | None:
    """The node config's limits on dataDir and resolvConf (the executable runs as root on
    tenant input just as the main plugin does)."""
    from tenantnet.plugin import ipam_client

    if node.source == "(defaults)":
        return None  # no node config: ipam.config's built-in defaults (the same directories)
    return ipam_client.confinement(node)


def handle(env: CniEnv, raw: dict[str, Any], limits: Confinement | None = None,
           cluster: ClusterNode | None = None) -> dict[str, Any] | None:
    """One IPAM call; `limits` None means ipam.config's built-in confinement, `cluster` None
    a node without a cluster store."""
    from cni.netconf import parse_netconf, valid_attachments
    from ipam import plugin

    conf = parse_netconf(raw)
    if env.command == "ADD":
        return plugin.add(env, conf, limits, cluster).to_dict(conf.cni_version, ipam=True)
    if env.command == "DEL":
        plugin.delete(env, conf, limits, cluster)
    elif env.command == "CHECK":
        plugin.check(env, conf, limits)
    elif env.command == "GC":
        plugin.gc(conf, valid_attachments(raw), limits, cluster)
    elif env.command == "STATUS":
        plugin.status(conf, limits)
    return None


def log_unexpected(exc: BaseException) -> None:
    from tenantnet.plugin import log

    log.get("tenantnet-ipam").error("internal_error", error=f"{type(exc).__name__}: {exc}", exc_info=exc)


def run_call(environ: Mapping[str, str], stdin: bytes, node: Callable[[], NodeConfig]) -> tuple[int, str]:
    """One CNI IPAM call: (exit code, stdout text without the final newline); `node` gives
    the node config (read per exec in-process, cached by the agent)."""
    from cni import skel

    def handler(env: CniEnv, raw: dict[str, Any]) -> dict[str, Any] | None:
        from tenantnet.plugin import ipam_client

        config = node()
        return handle(env, raw, confinement(config), ipam_client.cluster_node(config))

    return skel.run(handler, environ, stdin, on_unexpected=log_unexpected)


def run_in_process(environ: Mapping[str, str], stdin: bytes) -> tuple[int, str]:
    """One CNI call in this process (the shim's fallback when no agent answers)."""
    from tenantnet.entry import logsetup
    from tenantnet.plugin import nodeconfig

    logsetup.default_target_from_env(one_shot=True)
    return run_call(environ, stdin, lambda: nodeconfig.load(environ=environ))


def main() -> None:
    from tenantnet.entry import shim

    shim.main("tenantnet-ipam", run_in_process)


if __name__ == "__main__":
    main()
