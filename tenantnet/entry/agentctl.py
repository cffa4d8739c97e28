"""The agent's command line: `tenantnetctl agent run|status` (also `python -m
tenantnet.entry.agentctl [--node-config PATH] run|status`). `run` is how the DaemonSet
starts the agent (`tenantnet/entry/agent.py`); `status` is its liveness probe.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tenantnet.entry import shim
from tenantnet.entry.agent import (
    DEFAULT_ADDS_AT_ONCE,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_WEDGED_AFTER,
    DEFAULT_WORKERS,
    STATUS_OP,
    Agent,
    AgentError,
    CollectorMaker,
)
from tenantnet.plugin import nodepath


def _node_config_path(args: argparse.Namespace) -> str:
    return nodepath.node_config_path(getattr(args, "node_config", None))


def cmd_run(args: argparse.Namespace) -> int:
    """`agent run`: serve until SIGTERM/SIGINT; returns only on a start-up error."""
    from cni.errors import CniError
    from tenantnet.plugin import nodeconfig as config

    path = _node_config_path(args)
    try:
        node = config.load(path)
    except CniError as err:
        print(f"tenantnetctl agent run: {err.msg}", file=sys.stderr)
        return 2
    socket_path = args.socket or node.agent_socket  # nodeconfig.load agrees with the shim's reading
    if args.max_inflight < 1 or args.workers < 1 or args.adds_at_once < 1:
        print("tenantnetctl agent run: --max-inflight, --workers and --adds-at-once must be at least 1",
              file=sys.stderr)
        return 2
    agent = Agent(socket_path, path, max_inflight=args.max_inflight, workers=args.workers,
                  adds_at_once=args.adds_at_once, collectors=getattr(args, "collectors", ()))
    try:
        agent.start(node.log_file, node.log_level)
    except (AgentError, OSError) as exc:
        print(f"tenantnetctl agent run: {exc}", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    print(f"tenantnet agent serving {socket_path} (pid {os.getpid()})", file=sys.stderr, flush=True)
    agent.serve_forever()
    # Every request has been answered and the socket removed. A normal interpreter exit
    # would now wait ≈ 1.5 s for ovsdbapp's connection thread; nothing is left to flush
    # but the log, so leave at once (a restart during a rollout should be quick).
    logging.shutdown()
    os._exit(0)


def query_status(socket_path: str, timeout: float = 5.0) -> dict[str, Any]:
    """The agent's health report; raises shim.AgentUnavailable / shim.AgentFailed."""
    code, out, _ = shim.ask(socket_path, STATUS_OP, {}, b"", timeout)
    if code != 0:
        raise shim.AgentFailed(out.decode(errors="replace"))
    return json.loads(out)  # type: ignore[no-any-return]


def cmd_status(args: argparse.Namespace) -> int:
    path = _node_config_path(args)
    socket_path = args.socket or nodepath.agent_socket_of(path)[0]
    try:
        report = query_status(socket_path, args.timeout)
    except (shim.AgentUnavailable, shim.AgentFailed, ValueError) as exc:
        if args.json:
            print(json.dumps({"running": False, "socket": socket_path, "error": str(exc)}, indent=2))
        else:
            print(f"tenantnet agent: not running ({exc}); plugin calls run in-process", file=sys.stderr)
        return 3
    wedged = report.get("oldestRunningS", 0) > args.wedged_after
    if args.json:
        print(json.dumps({"running": True, **report, "wedged": wedged}, indent=2))
    else:
        print(f"tenantnet agent: running, pid {report['pid']}, socket {report['socket']}, "
              f"up {report['uptimeS']} s")
        print(f"  served {report['served']}, rejected {report['rejected']} (limit {report['maxInflight']} "
              f"in flight, {report['workers']} workers, {report.get('addsAtOnce', '?')} of them for ADDs), "
              f"expired {report['expired']}")
        print(f"  RSS {report['rssKb'] / 1024:.1f} MB (peak {report['peakRssKb'] / 1024:.1f} MB)")
    if wedged:
        print(f"tenantnet agent: wedged: a worker has been busy on one request for "
              f"{report['oldestRunningS']:.1f} s (more than --wedged-after {args.wedged_after:g} s)",
              file=sys.stderr)
        return 4
    return 0


def register(subparsers: Any, collectors: Sequence[CollectorMaker] = ()) -> argparse.ArgumentParser:
    """Add `agent run|status` to `subparsers` (from `add_subparsers()`). `collectors`: makers
    of extra /metrics collectors for `run` (see Agent)."""
    p = subparsers.add_parser("agent", help="the per-node agent serving plugin calls fast (docs/agent.md)")
    sub = p.add_subparsers(dest="agent_command", required=True, metavar="run|status")
    run = sub.add_parser("run", help="serve CNI calls on the node config's agentSocket until SIGTERM")
    run.add_argument("--socket", help="unix socket path (default: the node config's agentSocket)")
    run.add_argument("--max-inflight", type=int, default=DEFAULT_MAX_INFLIGHT, metavar="N",
                     help=f"requests in flight before new ones get code 11 (default {DEFAULT_MAX_INFLIGHT})")
    run.add_argument("--workers", type=int, default=DEFAULT_WORKERS, metavar="N",
                     help=f"requests executed at once (default {DEFAULT_WORKERS})")
    run.add_argument("--adds-at-once", type=int, default=DEFAULT_ADDS_AT_ONCE, metavar="N",
                     help=f"of them, ADDs (CPU-bound; the other workers serve DELs, which mostly wait "
                          f"for the kernel) (default {DEFAULT_ADDS_AT_ONCE})")
    run.set_defaults(func=cmd_run, collectors=tuple(collectors))
    st = sub.add_parser("status", help="is the agent answering? (exit 3 if not)")
    st.add_argument("--socket", help="unix socket path (default: the node config's agentSocket)")
    st.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--wedged-after", type=float, default=DEFAULT_WEDGED_AFTER, metavar="S",
                    help="fail (exit 4) when a worker has been busy on one request for longer than "
                         f"this many seconds, so a liveness probe restarts the agent (default "
                         f"{DEFAULT_WEDGED_AFTER:g})")
    st.set_defaults(func=cmd_status)
    return p


# A command whose reader went away (`tenantnetctl agent status | head -1`) exits as a process
# killed by SIGPIPE would (128 + 13), quietly. SIGPIPE itself stays ignored, as Python sets
# it: the agent writes to sockets whose callers may have given up.
EXIT_BROKEN_PIPE = 141


def exit_status_of(run: Callable[[], int | None]) -> int:
    """The exit status of `run()` (a command line's work, argument parsing included), with
    stdout's reader gone taken quietly: no BrokenPipeError traceback, neither from the
    command nor from the interpreter's last flush, and EXIT_BROKEN_PIPE. Every tenantnetctl
    subcommand goes through here (tenantnet/ops/ctl.py main). A broken pipe that is not
    stdout's (a socket) is raised as ever."""
    try:
        try:
            code = run()
        finally:
            sys.stdout.flush()  # here, not at exit, so a reader that left shows up here
        return int(code or 0)
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        try:  # what is still buffered goes nowhere, silently, at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket nobody reads any more (POLLERR/POLLHUP); True when
    that cannot be told (stdout without a descriptor)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError, AttributeError):
        return True
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events)


def main(argv: list[str] | None = None) -> int:
    """`python -m tenantnet.entry.agentctl run|status` (the same as `tenantnetctl agent …`)."""
    return exit_status_of(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="tenantnet-agent")
    parser.add_argument("--node-config", metavar="PATH",
                        help="node config file (default: $TENANTNET_CONFIG or /etc/tenantnet/tenantnet.yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(sub)
    rest = list(sys.argv[1:] if argv is None else argv)
    head: list[str] = []  # the global option goes before the implied `agent` word
    while rest and rest[0].startswith("--node-config"):
        option = rest.pop(0)
        head.append(option)
        if "=" not in option and rest:
            head.append(rest.pop(0))
    args = parser.parse_args([*head, "agent", *rest])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
