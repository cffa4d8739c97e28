"""`tenantnetctl`: the operators' CLI and manual test harness.

    tenantnetctl lab up|down|status          a private OVS lab and a node config for it
    tenantnetctl attach|check|detach ...     run the plugin as kubelet/Multus would
    tenantnetctl gc|status --config NAD      the CNI GC / STATUS verbs for one network
    tenantnetctl ls                          attachment records on this node
    tenantnetctl pod up|down POD.yaml ...    a pod's networks, attached as Multus would
    tenantnetctl policy show|check           the tenancy policy
    tenantnetctl offload                     which datapath flows run in the NIC, per pod/tenant
    tenantnetctl agent run|status            the resident per-node agent (fast path)
    tenantnetctl ipam ...                    tenantnet-ipam's address store
    tenantnetctl doctor                      is this node ready? each check PASS/FAIL with its fix
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EPILOG = """examples:
  tenantnetctl lab up                    # private OVS + node config in /run/tenantnet-lab
  export TENANTNET_CONFIG=/run/tenantnet-lab/tenantnet.yaml
  tenantnetctl attach --config packaging/examples/ovs-vlan100.json --pod demo/a --ifname net1
  tenantnetctl check  --config packaging/examples/ovs-vlan100.json --pod demo/a --ifname net1
  tenantnetctl detach --config packaging/examples/ovs-vlan100.json --pod demo/a --ifname net1
  tenantnetctl lab down
"""


def node_config_path(args: argparse.Namespace) -> str | None:
    """--node-config, else $TENANTNET_CONFIG, else the default lab's while it is up (None:
    the default path)."""
    from tenantnet.lab import cli as lab_cli
    from tenantnet.plugin import nodepath

    if getattr(args, "lab_node", None):  # `pod up --node`: a simulated node of the cluster lab
        try:
            return lab_cli.cluster_node_config(args.lab_dir, args.lab_node)
        except lab_cli.LabError as exc:
            print(f"tenantnetctl: --node {args.lab_node}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    return nodepath.given(args.node_config) or lab_cli.running_node_config()


def _harness(args: argparse.Namespace) -> Any:
    from tenantnet.ops.harness import Harness
    from tenantnet.plugin import nodeconfig as config

    path = node_config_path(args)
    node = config.load(path)
    return Harness(path, node.state_dir)


def _print_plugin_output(code: int, out: str) -> int:
    if out:
        try:
            print(json.dumps(json.loads(out), indent=2))
        except ValueError:
            print(out)
    return code


def cmd_pod_verb(args: argparse.Namespace) -> int:
    from tenantnet.ops.harness import HarnessError, Pod, load_network_config

    try:
        pod = Pod.parse(args.pod)
        conf = load_network_config(args.config)
        harness = _harness(args)
    except HarnessError as exc:
        print(f"tenantnetctl {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # node config errors come as CniError
        print(f"tenantnetctl {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.command == "attach":
        return _print_plugin_output(*harness.attach(conf, pod, args.ifname, args.mac or "", args.ip or ""))
    if args.command == "check":
        code, out = harness.check(conf, pod, args.ifname)
        if code == 0:
            print(f"CHECK ok: {pod.namespace}/{pod.name} {args.ifname} on {conf.get('name')}")
        return _print_plugin_output(code, out)
    return _print_plugin_output(*harness.detach(conf, pod, args.ifname, args.keep_netns))


def cmd_network_verb(args: argparse.Namespace) -> int:
    from tenantnet.ops.harness import load_network_config

    try:
        conf = load_network_config(args.config)
        harness = _harness(args)
    except Exception as exc:
        print(f"tenantnetctl {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.command == "gc":
        code, out = harness.gc(conf)
    else:
        code, out = harness.invoke("STATUS", conf, None, "")
    if code == 0:
        print(f"{args.command.upper()} ok for network {conf.get('name')}")
    return _print_plugin_output(code, out)


def cmd_ls(args: argparse.Namespace) -> int:
    from tenantnet.plugin import modes
    from tenantnet.plugin import nodeconfig as config
    from tenantnet.plugin.drivers.ovs import OvsPlan
    from tenantnet.plugin.drivers.ovsport import PortPlan
    from tenantnet.plugin.drivers.vf import VfPlan
    from tenantnet.plugin.records import CorruptRecord, RecordStore

    node = config.load(node_config_path(args))
    rows = []
    store = RecordStore(node.state_dir, modes.plan_type)
    corrupt = []
    for rec in store.list(args.network):
        if isinstance(rec, CorruptRecord):
            corrupt.append({"path": rec.path, "problem": str(rec), "quarantined": False})
            continue
        ips = [ip["address"] for ip in (rec.result or {}).get("ips", [])]
        plan = rec.plan
        # The veth's host end for ovs, else the VF's PCI address; the port's bridge and VLAN.
        shown = plan.host_ifname if isinstance(plan, OvsPlan) else \
            plan.device_id if isinstance(plan, VfPlan) else ""
        port = plan if isinstance(plan, PortPlan) else None
        vf = plan if isinstance(plan, VfPlan) else None
        rows.append({
            "network": rec.network,
            "pod": "/".join(p for p in (rec.pod.namespace, rec.pod.name) if p) or "-",
            "containerID": rec.container_id, "ifname": rec.ifname, "mode": rec.mode,
            "phase": rec.phase, "hostIfname": shown, "bridge": (port.bridge if port else None) or "",
            "vlan": port.vlan if port else None, "ips": ips,
            # The VF's RDMA device (and whether it is in the pod), the GPU it is paired with.
            "rdmaDevice": vf.rdma if vf else None, "rdmaInPod": bool(vf and vf.rdma and vf.rdma_isolated),
            "gpu": vf.gpu if vf else None, "gpuDistance": vf.gpu_distance if vf else None,
            # The outcome of its pre-warm (docs/offload.md); "" where the network does not pre-warm.
            "prewarm": (port.prewarm or port.prewarm_note) if port else "",
            # An overlay attachment: its logical switch and port (docs/overlay.md).
            "overlaySwitch": port.overlay_switch if port else "",
            "overlayPort": port.overlay_port if port else "",
        })
    # Unreadable records moved aside by DEL/GC (tenantnet.plugin.records): listed so nobody misses them.
    corrupt += [{"path": p, "problem": "unreadable record (quarantined)", "quarantined": True}
                for p in store.quarantined()]
    if args.json:
        print(json.dumps(rows if not corrupt else rows + [{"corrupt": True, **c} for c in corrupt], indent=2))
        return 0
    for c in corrupt:
        print(f"corrupt: {c['path']}: {c['problem']}", file=sys.stderr)
    header = ("NETWORK", "POD", "IFNAME", "MODE", "PHASE", "HOST/VF", "BRIDGE", "VLAN", "RDMA", "GPU",
              "PREWARM", "IPS")
    table = [header] + [
        (r["network"], r["pod"], r["ifname"], r["mode"], r["phase"], r["hostIfname"], r["bridge"],
         "" if r["vlan"] is None else str(r["vlan"]),
         (r["rdmaDevice"] + ("" if r["rdmaInPod"] else " (host)")) if r["rdmaDevice"] else "",
         f"{r['gpu']} {r['gpuDistance']}" if r["gpu"] else "", r["prewarm"], ",".join(r["ips"])) for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_pod(args: argparse.Namespace) -> int:
    """`pod up|down`: a pod's secondary networks, attached and removed as Multus would."""
    from tenantnet.ops import multus
    from tenantnet.ops.harness import Pod

    try:
        spec = multus.load_pod(args.pod_file)
        harness = _harness(args)
        pod = Pod(spec.namespace, spec.name)
        state_file = harness.root / "multus" / f"{spec.namespace}_{spec.name}.json"
        if args.pod_command == "down":
            return _pod_down(harness, pod, state_file)
        text = spec.annotations.get(multus.NETWORKS)
        if not text:
            raise multus.MultusError(f"pod {spec.namespace}/{spec.name} has no {multus.NETWORKS} annotation")
        selections = multus.parse_selections(text, spec.namespace)
        devices = {}
        for item in args.devices or []:
            resource, sep, pcis = item.partition("=")
            if not sep or not pcis:
                raise multus.MultusError(f"--devices {item!r}: expected RESOURCE=PCI[,PCI…]")
            devices[resource] = [p for p in pcis.split(",") if p]
        from tenantnet.plugin import nodeconfig as config

        # Where Multus would put them: the node's deviceInfoDir, the only place the plugin
        # writes device-info files (docs/security.md).
        devinfo_dir = multus.devinfo_dir(config.load(node_config_path(args)))
        delegates = multus.plan_delegates(spec, selections, multus.load_nads(args.nad), devices,
                                          pod.container_id, pod.uid, devinfo_dir)
    except (multus.MultusError, OSError) as exc:
        print(f"tenantnetctl pod {args.pod_command}: {exc}", file=sys.stderr)
        return 2
    if state_file.exists():
        print(f"tenantnetctl pod up: pod {spec.namespace}/{spec.name} is already up (pod down first)",
              file=sys.stderr)
        return 2
    created = harness.ensure_netns(pod)
    done: list[dict[str, Any]] = []
    statuses = []
    for delegate, sel in zip(delegates, selections, strict=True):
        code, out = harness.invoke("ADD", delegate.conf, pod, delegate.ifname, cni_args=delegate.cni_args)
        if code != 0:
            print(f"tenantnetctl pod up: {delegate.nad.namespace}/{delegate.nad.name} ({delegate.ifname}) "
                  f"failed: {out}", file=sys.stderr)
            # Multus unwinds: DEL the failed one and everything attached before it, in reverse.
            harness.invoke("DEL", delegate.conf, pod, delegate.ifname, cni_args=delegate.cni_args)
            for prior in reversed(done):
                harness.invoke("DEL", {**prior["conf"], "prevResult": prior["result"]}, pod,
                               prior["ifname"], cni_args=prior["cniArgs"])
                _remove_devinfo(prior.get("devinfo"))
            _remove_devinfo(delegate.devinfo_file)
            if created:
                harness.remove_netns_if_unused(pod)
            return 1
        result = json.loads(out)
        done.append({"nad": f"{delegate.nad.namespace}/{delegate.nad.name}", "ifname": delegate.ifname,
                     "conf": delegate.conf, "cniArgs": delegate.cni_args, "result": result,
                     "devinfo": delegate.devinfo_file})
        statuses.append(multus.network_status(delegate, result, sel.default_route))
    state_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    state_file.write_text(json.dumps({"netns": pod.netns_path, "created": created, "attachments": done}))
    print(json.dumps(statuses, indent=2))
    return 0


def _remove_devinfo(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _pod_down(harness: Any, pod: Any, state_file: Any) -> int:
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        print(f"tenantnetctl pod down: pod {pod.namespace}/{pod.name} is not up", file=sys.stderr)
        return 2
    netns = pod.netns_path if os.path.exists(pod.netns_path) else ""
    failed = 0
    for att in reversed(state["attachments"]):  # Multus deletes in reverse order
        code, out = harness.invoke("DEL", {**att["conf"], "prevResult": att["result"]}, pod, att["ifname"],
                                   netns=netns, cni_args=att["cniArgs"])
        if code != 0:
            failed += 1
            print(f"tenantnetctl pod down: DEL {att['nad']} ({att['ifname']}) failed: {out}", file=sys.stderr)
        _remove_devinfo(att.get("devinfo"))
    if failed:
        return 1
    state_file.unlink()
    if state.get("created") and os.path.exists(pod.netns_path):
        import subprocess

        subprocess.run(["ip", "netns", "delete", pod.netns_name], capture_output=True, check=False)
        (harness.root / "pods" / pod.netns_name).unlink(missing_ok=True)
    print(f"pod {pod.namespace}/{pod.name} is down: {len(state['attachments'])} attachments deleted")
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    from cni.env import parse_env
    from cni.errors import CniError
    from cni.netconf import parse_netconf
    from tenantnet.ops.harness import HarnessError, Pod, load_network_config
    from tenantnet.plugin import nodeconfig as config
    from tenantnet.plugin import tenancy, tnconf
    from tenantnet.plugin.settings import TENANT_VLAN

    try:
        node = config.load(node_config_path(args))
        policy = tenancy.load(node)
        if args.policy_command == "show":
            return _policy_show(policy, args.json)
        pod = Pod.parse(args.pod)
        raw = load_network_config(args.config)
        env = parse_env({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": pod.container_id, "CNI_NETNS": "/",
                         "CNI_IFNAME": "net1", "CNI_ARGS": pod.cni_args()})
        from tenantnet.plugin import settings

        conf = tnconf.parse(parse_netconf(settings.bind_fabric(policy, raw, node)), env, node)
    except (CniError, HarnessError) as exc:
        print(f"tenantnetctl policy: {exc}", file=sys.stderr)
        # An invalid policy (undeclared network, one VLAN granted twice) is a policy answer.
        return 1 if isinstance(exc, CniError) and "tenancy policy" in exc.msg else 2
    if policy is None:
        print(f"allowed: no tenancy policy in {node.source}; every pod may use every network")
        return 0
    settings = conf.ovs or conf.vf
    deferred = raw.get("vlan") == TENANT_VLAN
    d = tenancy.decide(policy, pod.namespace, pod.name, conf.name, raw,
                       None if deferred or settings is None else settings.vlan,
                       conf.ovs.trunks if conf.ovs else ())
    extra = f" (vlan \"tenant\" resolves to {d.vlan})" if d.vlan is not None else ""
    print(f"{'allowed' if d.allowed else 'refused'}: {d.reason}{extra}")
    return 0 if d.allowed else 1


def _policy_show(policy: Any, as_json: bool) -> int:
    if policy is None:
        print("[]" if as_json else "no tenancy policy: every pod may use every network")
        return 0
    tenants = [{
        "name": t.name, "namespaces": list(t.namespaces),
        "networks": {n: {"vlans": g.describe(), "default": g.default} for n, g in t.networks.items()},
        "sriov": {"spoofchk": "required" if t.spoofchk_required else "any",
                  "trust": "forbidden" if t.trust_forbidden else "any"},
    } for t in policy.tenants]
    networks = {n: {"bridge": d.bridge, "ovsdb": d.ovsdb, "pfs": list(d.pfs), "modes": list(d.modes())}
                for n, d in policy.networks.items()}
    if as_json:
        print(json.dumps({"source": policy.source, "networks": networks, "tenants": tenants}, indent=2))
        return 0
    print(f"tenancy policy from {policy.source} (default deny)")
    for net, d in networks.items():
        on = f" on {d['ovsdb']}" if d["ovsdb"] else ""
        fabric = [f"bridge {d['bridge']}{on}"] if d["bridge"] else []
        fabric += [f"PFs {', '.join(d['pfs'])}"] if d["pfs"] else []
        print(f"network {net}: {', '.join(fabric)} (mode {'/'.join(d['modes'])})")
    for t in tenants:
        print(f"tenant {t['name']}: namespaces {', '.join(t['namespaces'])}")
        for net, grant in t["networks"].items():
            default = f" (tenant VLAN {grant['default']})" if grant["default"] is not None else ""
            print(f"  network {net}: vlans {grant['vlans']}{default}")
        print(f"  sriov: spoofchk {t['sriov']['spoofchk']}, trust {t['sriov']['trust']}")
    return 0


def _offload_collector(node: Any, busy: Any) -> Any:
    """The offload report's /metrics families for the agent, imported only when it serves them."""
    from tenantnet.ops.flowreport.collector import node_collector

    return node_collector(node, busy)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tenantnetctl", description=__doc__.split("\n\n")[0],
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--node-config", metavar="PATH",
                        help="node config file (default: $TENANTNET_CONFIG or /etc/tenantnet/tenantnet.yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from tenantnet.lab import cli as lab_cli  # the lab's entry point (docs/architecture.md)

    lab_cli.register(sub)

    for name, text in (("attach", "create the pod netns if needed and run ADD"),
                       ("check", "run CHECK with the cached result as prevResult"),
                       ("detach", "run DEL and remove the pod netns once nothing is attached")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True, metavar="NAD",
                       help="network config: CNI JSON, or a NetworkAttachmentDefinition (YAML/JSON)")
        p.add_argument("--pod", required=True, metavar="NS/NAME", help="the pod (namespace/name)")
        p.add_argument("--ifname", default="net1", help="interface name in the pod (default net1)")
        if name == "attach":
            p.add_argument("--mac", help="request a MAC (sent as CNI_ARGS MAC=)")
            p.add_argument("--ip", help="request addresses (sent as CNI_ARGS IP=, comma-separated)")
        if name == "detach":
            p.add_argument("--keep-netns", action="store_true", help="leave the pod netns in place")
        p.set_defaults(func=cmd_pod_verb)

    for name, text in (("gc", "CNI GC for a network, keeping what the harness has attached"),
                       ("status", "CNI STATUS for a network (is the plugin ready?)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True, metavar="NAD", help="network config file")
        p.set_defaults(func=cmd_network_verb)

    p_pod = sub.add_parser("pod", help="a pod's secondary networks, as Multus would attach them")
    pod_sub = p_pod.add_subparsers(dest="pod_command", required=True, metavar="up|down")
    p = pod_sub.add_parser("up", help="attach every network of the pod's networks annotation; print "
                                      "the network-status Multus would write")
    p.add_argument("pod_file", metavar="POD.yaml")
    p.add_argument("--nad", action="append", required=True, metavar="NAD.yaml",
                   help="NetworkAttachmentDefinition file(s) (repeatable; multi-document YAML is fine)")
    p.add_argument("--devices", action="append", metavar="RESOURCE=PCI,PCI",
                   help="device-plugin stand-in: VFs handed to NADs with that resourceName, in order")
    p.set_defaults(func=cmd_pod)
    p = pod_sub.add_parser("down", help="delete the pod's attachments in reverse order")
    p.add_argument("pod_file", metavar="POD.yaml")
    p.set_defaults(func=cmd_pod)
    for p in pod_sub.choices.values():
        p.add_argument("--node", dest="lab_node", metavar="NAME",
                       help="on this simulated node of the cluster lab (lab up --nodes N): its node config")
        p.add_argument("--lab-dir", default="/run/tenantnet-lab-cluster", metavar="DIR",
                       help="the cluster lab's directory, with --node (default /run/tenantnet-lab-cluster)")

    p_pol = sub.add_parser("policy", help="the tenancy policy: show it, or explain a decision")
    pol_sub = p_pol.add_subparsers(dest="policy_command", required=True, metavar="show|check")
    p = pol_sub.add_parser("show", help="tenants, their namespaces and segments")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_policy)
    p = pol_sub.add_parser("check", help="would ADD allow this pod on this network? (attaches nothing)")
    p.add_argument("--pod", required=True, metavar="NS/NAME")
    p.add_argument("--config", required=True, metavar="NAD")
    p.set_defaults(func=cmd_policy)

    p_ls = sub.add_parser("ls", help="list attachment records on this node")
    p_ls.add_argument("--network", help="only this network")
    p_ls.add_argument("--json", action="store_true", help="machine-readable output")
    p_ls.set_defaults(func=cmd_ls)

    from tenantnet.entry import agentctl as agent_cli
    from tenantnet.ops import doctor, install, railsctl, rendererctl
    from tenantnet.ops import ipamctl as ipam_cli
    from tenantnet.ops.flowreport import cli as offload_cli

    ipam_cli.register(sub, node_config_path)
    ipam_cli.register_cluster(sub, node_config_path)
    install.register(sub)
    offload_cli.register(sub, node_config_path)
    railsctl.register(sub, node_config_path)
    rendererctl.register(sub, node_config_path)
    agent_cli.register(sub, collectors=(_offload_collector,))
    doctor.register(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Every subcommand, its help and usage errors included, through agentctl.exit_status_of:
    `tenantnetctl … | head -1` ends quietly (exit 141), without a BrokenPipeError traceback."""
    from tenantnet.entry.agentctl import exit_status_of

    def run() -> int:
        args = build_parser().parse_args(argv)
        try:
            return int(args.func(args) or 0)
        except KeyboardInterrupt:
            return 130

    sys.exit(exit_status_of(run))


if __name__ == "__main__":
    main()
