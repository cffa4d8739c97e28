"""`tenantnetctl offload`: which datapath flows of this node's attachments run in the NIC.

This module owns the command line only (arguments, exit codes, choosing the output);
`report.py` builds the report, `render.py` formats it, `server.py` serves /metrics.

Exit codes: 0 report printed (whatever it found), 1 the flows could not be read (the
report still prints, with the error), 2 bad arguments or node config.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import Any

from tenantnet.plugin import nodepath

LOG_TAIL_BYTES = 4 << 20  # --vswitchd-log reads at most the last 4 MB

EPILOG = """examples:
  tenantnetctl offload                         # every attachment on this node, as a table
  tenantnetctl offload --tenant team-a --json
  tenantnetctl offload --pod team-a/train-0 --prometheus
  tenantnetctl offload --listen 127.0.0.1:9477 # serve /metrics for Prometheus
  tenantnetctl offload --vswitchd-log /var/log/openvswitch/ovs-vswitchd.log  # why flows are not offloaded
"""


def _given(args: argparse.Namespace) -> str | None:
    return nodepath.given(getattr(args, "node_config", None))


def register(subparsers: Any, node_config_path: Callable[[argparse.Namespace], str | None] = _given
             ) -> argparse.ArgumentParser:
    """Add `offload` to tenantnetctl's subcommands; `node_config_path` resolves the node config
    from the parsed options (tenantnetctl passes its own resolver)."""
    p = subparsers.add_parser(
        "offload", help="which datapath flows of each attachment run in hardware (table, JSON, Prometheus)",
        description=__doc__.split("\n\n")[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pod", metavar="NS/NAME", help="only this pod's attachments")
    p.add_argument("--tenant", metavar="T", help="only pods of this tenant (from the tenancy policy)")
    p.add_argument("--network", metavar="N", help="only attachments to this network")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable report")
    out.add_argument("--prometheus", action="store_true",
                     help="Prometheus text format: the offload families of the agent's /metrics when the "
                          "node config sets metricsPort (else read from OVS here)")
    out.add_argument("--listen", metavar="ADDR:PORT",
                     help="serve /metrics over HTTP until interrupted (port 0: any free port); with the "
                          "node config's metricsTokenFile, scrapes must present its bearer token")
    p.add_argument("--appctl-target", metavar="PATH",
                   help="ovs-vswitchd's control socket (default: found next to the node config's OVSDB "
                        "socket, else ovs-appctl's default)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="per ovs-appctl / ovs-vsctl call (default: the node config's ovsdbTimeout)")
    p.add_argument("--vswitchd-log", metavar="PATH",
                   help="also read the last 4 MB of this ovs-vswitchd log and blame each offload refusal "
                        "in it on the pod whose port it names (findings offload-REASON)")
    p.set_defaults(func=cmd_offload, node_config_path=node_config_path)
    return p


def _node(args: argparse.Namespace) -> Any:
    from tenantnet.plugin import nodeconfig

    return nodeconfig.load(args.node_config_path(args))


def cmd_offload(args: argparse.Namespace) -> int:
    from tenantnet.ops.flowreport import (
        attribution,  # noqa: F401 (imported for its finding source: per-pod offload failures)
        render,
    )
    from tenantnet.ops.flowreport.report import Filters, build_report, collect, load_views
    from tenantnet.plugin.system import offloadlog

    if args.pod is not None and args.pod.count("/") != 1:
        print("tenantnetctl offload: --pod takes NAMESPACE/NAME", file=sys.stderr)
        return 2
    if args.timeout is not None and not 0.1 <= args.timeout <= 120:
        print("tenantnetctl offload: --timeout must be 0.1-120 seconds", file=sys.stderr)
        return 2
    try:
        node = _node(args)
    except Exception as exc:  # CniError from an invalid node config
        print(f"tenantnetctl offload: {exc}", file=sys.stderr)
        return 2
    filters = Filters(pod=args.pod, tenant=args.tenant, network=args.network)

    def build() -> Any:
        # report_for_node, with the log lines put into the snapshot before the findings run
        views, warnings = load_views(node, filters)
        snap = collect(node, args.appctl_target, args.timeout)
        if args.vswitchd_log:
            try:
                snap.vswitchd_log = offloadlog.read_tail(args.vswitchd_log, LOG_TAIL_BYTES)
            except OSError as exc:
                warnings.append(f"--vswitchd-log: {exc}")
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        return build_report(node, snap, views)

    if args.listen:
        return _listen(args.listen, lambda: render.render_prometheus(build()), node.metrics_token_file)
    if args.prometheus and node.metrics_port:
        served = _from_agent(node, filters)
        if served is not None:
            sys.stdout.write(served)
            return 0
    report = build()
    if args.json:
        print(render.render_json(report))
    elif args.prometheus:
        sys.stdout.write(render.render_prometheus(report))
    else:
        sys.stdout.write(render.render_table(report))
    if report.snapshot.error:
        if not args.json:
            print(f"tenantnetctl offload: {report.snapshot.error}", file=sys.stderr)
        return 1
    return 0


def _from_agent(node: Any, filters: Any) -> str | None:
    """The offload families of the agent's /metrics (what Prometheus scrapes; at most
    metricsOffloadInterval old), filtered like the report; None (and a warning) if the
    agent does not answer, so the caller reads OVS itself."""
    import urllib.request

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tenantnet.ops.flowreport.collector import PREFIX

    host = node.metrics_address
    host = "127.0.0.1" if host == "0.0.0.0" else "::1" if host == "::" else host
    url = f"http://{f'[{host}]' if ':' in host else host}:{node.metrics_port}/metrics"
    request = urllib.request.Request(url)
    if node.metrics_token_file:
        from tenantnet.entry.httpserve import read_token

        token, problem = read_token(node.metrics_token_file)
        if token is None:
            print(f"warning: metricsTokenFile {node.metrics_token_file}: {problem}, so the agent's {url} "
                  "cannot be asked; reading OVS directly", file=sys.stderr)
            return None
        request.add_header("Authorization", "Bearer " + token.decode("latin-1"))
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            text = resp.read(64 << 20).decode()
    except (OSError, ValueError) as exc:
        print(f"warning: the agent's {url} did not answer ({exc}); reading OVS directly", file=sys.stderr)
        return None

    def keep(labels: dict[str, str]) -> bool:
        if filters.pod and "pod" in labels and f"{labels.get('namespace')}/{labels['pod']}" != filters.pod:
            return False
        if filters.tenant and "tenant" in labels and labels["tenant"] != filters.tenant:
            return False
        return not (filters.network and "network" in labels and labels["network"] != filters.network)

    families = []
    for family in text_string_to_metric_families(text):
        if family.name.startswith(PREFIX):
            family.samples = [s for s in family.samples if keep(s.labels)]
            families.append(family)

    class Served:
        def collect(self) -> Any:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Served())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def _listen(value: str, produce: Any, token_file: str) -> int:
    """`token_file`: the node config's metricsTokenFile; scrapes present its token, as the agent's do."""
    from tenantnet.ops.flowreport.server import MetricsServer, parse_listen

    try:
        host, port = parse_listen(value)
        server = MetricsServer(host, port, produce, token_file)
    except (ValueError, OSError) as exc:
        print(f"tenantnetctl offload: {exc}", file=sys.stderr)
        return 2
    host, port = server.address
    shown = f"[{host}]" if ":" in host else host
    print(f"serving /metrics on http://{shown}:{port}/metrics", flush=True)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def main(argv: list[str] | None = None) -> None:
    """`python -m tenantnet.ops.flowreport.cli [--node-config PATH] [options]`: the same command
    without tenantnetctl (for a node image that ships only this, and for tests)."""
    parser = argparse.ArgumentParser(prog="tenantnet-offload")
    parser.add_argument("--node-config", metavar="PATH",
                        help="node config file (default: $TENANTNET_CONFIG or /etc/tenantnet/tenantnet.yaml)")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    # `--node-config P` stays in front of the subcommand; everything else belongs to it.
    head = argv[:2] if argv[:1] == ["--node-config"] else []

    def run() -> int:
        args = parser.parse_args([*head, "offload", *argv[len(head):]])
        return int(args.func(args) or 0)

    from tenantnet.entry.agentctl import exit_status_of

    sys.exit(exit_status_of(run))


if __name__ == "__main__":
    main()
