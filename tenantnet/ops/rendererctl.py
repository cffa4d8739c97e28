"""`tenantnetctl renderer run`: the TenantNetwork renderer (tenantnet/kube/render.py).

Run by the DaemonSet's renderer Deployment under its ServiceAccount (in-cluster), or by an
operator with `--kubeconfig`. It reads the node config only for the tenant resolver
(`tenantSources`, and the tenancy policy's namespace globs when `name` is a source): the
renderer and every node must resolve tenants the same way.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def register(subparsers: Any, node_config_path: Callable[[argparse.Namespace], str | None]) -> None:
    p = subparsers.add_parser(
        "renderer", help="render TenantNetworks into NADs (a leader-elected controller)"
    )
    sub = p.add_subparsers(dest="renderer_cmd", required=True)
    run = sub.add_parser("run", help="elect a leader through a Lease, watch, reconcile until stopped")
    run.add_argument("--kubeconfig", default="", help="a kubeconfig (default: the pod's ServiceAccount)")
    run.add_argument("--namespace", default="kube-system", help="where the Lease lives (default kube-system)")
    run.add_argument(
        "--auto-vlans",
        default="",
        metavar="LO-HI",
        help="the range `vlan: auto` networks get their VLAN from (e.g. 3000-3999)",
    )
    run.add_argument(
        "--ovn-northbound",
        default="",
        metavar="ENDPOINT",
        help="the OVN northbound database (unix:PATH or tcp:HOST:PORT): the renderer then keeps the "
        "logical switch tn-<name>.<segment> of every overlay TenantNetwork, with tunnel key = its "
        "segment, and deletes the switches of networks gone or refused once no logical port is left "
        "on them (default: none, overlay networks' switches are left to the nodes' agents)",
    )
    run.add_argument(
        "--ovn-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="bound on each OVN northbound transaction (default 5)",
    )
    run.add_argument("--identity", default="", help="this replica's name in the Lease (default: host name)")
    run.add_argument("--once", action="store_true", help="one reconcile, without a Lease, then exit")
    run.set_defaults(func=cmd_run, node_config_path=node_config_path)


class StderrLog:
    """One JSON line per event on stderr: what `kubectl logs` of the renderer shows. The
    renderer writes NADs from several threads: each line goes out whole, in one write under
    a lock (print() writes the text and its newline separately, and two threads' events
    ended up on one line)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def _line(self, level: str, event: str, **kw: Any) -> None:
        line = json.dumps({"time": round(time.time(), 3), "level": level, "event": event, **kw}, default=str)
        with self._lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def info(self, event: str, **kw: Any) -> None:
        self._line("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._line("warning", event, **kw)


def cmd_run(args: argparse.Namespace) -> int:
    from tenantnet.kube import api
    from tenantnet.kube.render import FIELD_MANAGER, Renderer, parse_range
    from tenantnet.plugin import nodeconfig, tnadmit

    node = nodeconfig.load(args.node_config_path(args))
    log = StderrLog()
    auto = parse_range(args.auto_vlans) if args.auto_vlans else None
    renderer = Renderer(
        api.client(args.kubeconfig, FIELD_MANAGER),
        tnadmit.resolver_for(node),
        log,
        auto_vlans=auto,
        namespace=args.namespace,
        identity=args.identity,
        ovn_northbound=args.ovn_northbound,
        ovn_timeout=args.ovn_timeout,
    )
    if args.once:
        out = renderer.reconcile()
        print(
            f"created {out.created}, restored {out.restored}, deleted {out.deleted}, "
            f"statuses {out.statuses}, errors {len(out.errors)}"
        )
        return 1 if out.errors else 0
    signal.signal(signal.SIGTERM, lambda *_: renderer.stop())
    renderer.run()
    return 0
