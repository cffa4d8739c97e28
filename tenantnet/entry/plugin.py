"""`tenantnet`: the CNI plugin executable kubelet, the runtime or Multus runs.

The executable is the standard-library-only shim (`tenantnet/entry/shim.py`): it forwards
env + stdin to the node's agent (`tenantnetctl agent run`, docs/agent.md) and prints its
answer. This module owns the *in-process* way in: `run_call` is the one way a CNI call
runs — used by the shim when no agent answers (`run_in_process`) and by the agent for each
request — env + stdin → `tenantnet.plugin.core.Plugin` → stdout, through `cni.skel.run`,
so both ways give the same output byte for byte.

Nothing outside the standard library is imported at module level: importing this module
(the console script does) must stay as cheap as the shim. VERSION is answered without
importing pyroute2, ovsdbapp or structlog.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are strings here
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from cni.env import CniEnv
    from tenantnet.plugin.core import Plugin
    from tenantnet.plugin.nodeconfig import NodeConfig


def dispatch(plugin: Plugin, env: CniEnv, raw: dict[str, Any]) -> dict[str, Any] | None:
    """The verb switch: one CNI call on a ready `Plugin`."""
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


def handle(env: CniEnv, raw: dict[str, Any], node: NodeConfig, *, set_up_logging: bool = True
           ) -> dict[str, Any] | None:
    """One call on the node config `node`: the NAD's log settings, then `dispatch`.

    A NAD's `logFile`/`logLevel` are checked (tenantnet.plugin.settings) before any file is
    opened: outside the node's log directory they are refused with code 7 — except on DEL,
    which must always be able to clean up, and then logs to the node's own file. With
    `set_up_logging` (an exec that runs this one call) the one-shot log is set up there; with
    it false (the agent, whose log is set up once) the same refusals apply and nothing is
    reconfigured."""
    from cni.errors import CniError
    from tenantnet.entry import logsetup
    from tenantnet.plugin import log, settings
    from tenantnet.plugin.core import Plugin

    try:
        log_file, log_level = settings.log_settings(raw, node)
    except CniError:
        if set_up_logging:
            logsetup.setup_one_shot(node.log_file, node.log_level)
        if env.command != "DEL":
            raise
        log.get("tenantnet").warning("log_settings.ignored", error="the NAD's logFile/logLevel is "
                                     "not allowed; DEL goes on and logs here")
    else:
        if set_up_logging:
            logsetup.setup_one_shot(log_file, log_level)
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
    """A bug: its traceback goes to the log file (stderr gets one line, logsetup)."""
    try:
        from tenantnet.plugin import log

        log.get("tenantnet").error("internal_error", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
    except Exception:
        pass


def run_call(environ: Mapping[str, str], stdin: bytes, node: Callable[[], NodeConfig], *,
             set_up_logging: bool = True) -> tuple[int, str]:
    """One CNI call: (exit code, stdout text without the final newline). `node` gives the
    node config (read per exec in-process, cached by the agent)."""
    from cni import skel

    refused = refuse_delegated(environ, stdin)
    if refused is not None:
        return refused

    def handler(env: CniEnv, raw: dict[str, Any]) -> dict[str, Any] | None:
        return handle(env, raw, node(), set_up_logging=set_up_logging)

    return skel.run(handler, environ, stdin, log_unexpected)


def _node_log_target(node: Callable[[], NodeConfig]) -> None:
    """Errors before the node config is used (undecodable stdin) go to the node's log."""
    from tenantnet.entry import logsetup

    try:
        config = node()
    except Exception:
        return  # the call itself reads it again and reports the error
    logsetup.set_default_target(config.log_file, config.log_level, one_shot=True)


def run_in_process(environ: Mapping[str, str], stdin: bytes) -> tuple[int, str]:
    """One CNI call in this process (the shim's fallback when no agent answers)."""
    from tenantnet.plugin import nodeconfig

    refused = refuse_delegated(environ, stdin)
    if refused is not None:
        return refused
    loaded: list[NodeConfig] = []

    def node() -> NodeConfig:  # read once per exec; a failed read is retried (and reported)
        if not loaded:
            loaded.append(nodeconfig.load(environ=environ))
        return loaded[0]

    if environ.get("CNI_COMMAND") != "VERSION":
        _node_log_target(node)
    code, text = run_call(environ, stdin, node)
    if "tenantnet.plugin.system.ovsdb" in sys.modules:
        from tenantnet.plugin.system import ovsdb

        ovsdb.close_all()
    return code, text


def main() -> None:
    from tenantnet.entry import shim

    shim.main("tenantnet", run_in_process)


if __name__ == "__main__":
    main()
