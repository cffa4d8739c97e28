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
    except CniError as err:
        if set_up_logging:
            logsetup.setup_one_shot(node.log_file, node.log_level)
        if env.command != "DEL":
            log_refused(env.command, env.container_id, env.ifname, raw, err.code, err.msg)
            raise
        log.get("tenantnet").warning("log_settings.ignored", error="the NAD's logFile/logLevel is "
                                     "not allowed; DEL goes on and logs here")
    else:
        if set_up_logging:
            logsetup.setup_one_shot(log_file, log_level)
    plugin = Plugin(node)
    try:
        return dispatch(plugin, env, raw)
    except CniError as err:
        if not plugin.add_failure_logged and env.command == "ADD":
            if set_up_logging and (log_file, log_level) != (node.log_file, node.log_level):
                # The refusal goes to the node's log, not where the NAD's logFile/logLevel
                # sent this call's lines (a NAD must not hide its refusals from the admin).
                logsetup.setup_one_shot(node.log_file, node.log_level)
            log_refused(env.command, env.container_id, env.ifname, raw, err.code, err.msg)
        raise


# What a refusal line keeps of each caller-given string (a value in a message can be large).
_LOGGED_CHARS = 1024


def log_refused(command: str, container_id: str, ifname: str, raw: object, code: object,
                msg: object) -> None:
    """One structured line for a refused ADD (event add.refused: the CNI code and message,
    the container id, ifname and network where known), whatever refused it: the env, stdin,
    the config, the settings or the policy. An ADD that failed after its record was written
    has its own line (add.failed); other verbs log their own outcomes."""
    if command != "ADD":
        return
    try:
        from tenantnet.plugin import log

        network = raw.get("name") if isinstance(raw, dict) else None

        def clip(value: object) -> str | None:
            return value[:_LOGGED_CHARS] if isinstance(value, str) and value else None

        log.get("tenantnet").warning("add.refused", code=code, msg=clip(msg), container_id=clip(container_id),
                                     ifname=clip(ifname), network=clip(network))
    except Exception:
        pass  # a log that cannot be written must not change the answer


def _log_refused_answer(environ: Mapping[str, str], stdin: bytes, text: str) -> None:
    """`log_refused` for an answer made before the handler ran (env or stdin refused)."""
    import json

    from cni.netconf import decode_json

    try:
        answer = json.loads(text)
    except ValueError:
        answer = {}
    try:
        raw: object = decode_json(stdin)
    except Exception:
        raw = {}
    answer = answer if isinstance(answer, dict) else {}
    log_refused(environ.get("CNI_COMMAND", ""), environ.get("CNI_CONTAINERID", ""),
                environ.get("CNI_IFNAME", ""), raw, answer.get("code"), answer.get("msg"))


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
        _log_refused_answer(environ, stdin, refused[1])
        return refused
    reached: list[bool] = []

    def handler(env: CniEnv, raw: dict[str, Any]) -> dict[str, Any] | None:
        config = node()
        reached.append(True)  # from here on, `handle` logs a refusal itself
        return handle(env, raw, config, set_up_logging=set_up_logging)

    code, text = skel.run(handler, environ, stdin, log_unexpected)
    if code and not reached:  # the env or stdin was refused before the handler ran
        _log_refused_answer(environ, stdin, text)
    return code, text


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


def log_shim_refusal(environb: Mapping[bytes, bytes], answer: bytes) -> None:
    """An ADD the shim refused itself (stdin over 1 MiB, before any agent or in-process
    call): its `add.refused` line in the node's log."""
    import os

    from tenantnet.entry import logsetup
    from tenantnet.plugin import nodeconfig

    environ = {os.fsdecode(k): os.fsdecode(v) for k, v in environb.items()}
    if environ.get("CNI_COMMAND") != "ADD":
        return
    try:
        config = nodeconfig.load(environ=environ)
    except Exception:
        return  # no node config to find the log by; the answer itself says what was refused
    logsetup.setup_one_shot(config.log_file, config.log_level)
    _log_refused_answer(environ, b"", answer.decode("utf-8", "replace"))


def main() -> None:
    from tenantnet.entry import shim

    shim.main("tenantnet", run_in_process, log_shim_refusal)


if __name__ == "__main__":
    main()
