"""Operators' commands: `tenantnetctl ipam ls | show | release | gc | import-host-local |
nodes | leave | release-node`, and `tenantnetctl cluster nodes`.

`register(subparsers)` adds the `ipam` command to an argparse subparsers object; every
handler takes the parsed namespace and returns the process exit code: 0 done, 1 nothing
matched / refused (the reason on stderr), 2 usage errors (argparse's own).

`gc` here has two modes, because an operator usually has no list of live attachments:
  * `--keep-file FILE`: like CNI GC — release every allocation (of `--network`, or of all
    networks) whose (containerID, ifname) is not listed. FILE is JSON: a list of
    {"containerID", "ifname"} or an object with "cni.dev/valid-attachments".
  * otherwise: release allocations whose recorded network namespace path no longer
    exists (the sandbox is gone). Allocations with no recorded netns (imported from
    host-local, or recorded by a caller that gave none) are never released this way.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from cni.errors import CniError, Code
from cni.netconf import valid_attachments
from ipam.config import DEFAULT_DATA_DIR
from ipam.sqlite_store import DB_NAME, SqliteStore
from ipam.store import Allocation, release_addresses


def _given(args: argparse.Namespace) -> str | None:
    from tenantnet.plugin import nodepath

    return nodepath.given(getattr(args, "node_config", None))


def register(subparsers: Any, node_config_path: Callable[[argparse.Namespace], str | None] = _given
             ) -> argparse.ArgumentParser:
    """Add `ipam` and its sub-commands to `subparsers` (from `add_subparsers()`);
    `node_config_path` resolves the node config (the cluster store's settings)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR,
        help=f"the IPAM store's directory, the config's ipam.dataDir (default {DEFAULT_DATA_DIR})",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")

    ipam = subparsers.add_parser("ipam", help="inspect and repair IP address allocations")
    sub = ipam.add_subparsers(dest="ipam_command", metavar="COMMAND", required=True)

    cluster_wide = argparse.ArgumentParser(add_help=False)
    cluster_wide.add_argument(
        "--cluster", action="store_true",
        help="every node of the cluster store (etcd, from the node config): other nodes' allocations "
             "as they last published them (every 5 s), with the node and block of each")
    cluster_wide.set_defaults(node_config_path=node_config_path)

    p = sub.add_parser("ls", parents=[common, cluster_wide], help="list allocations")
    p.add_argument("--network", help="only this network")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("show", parents=[common, cluster_wide], help="show who holds an address")
    p.add_argument("address")
    p.add_argument("--network", help="only this network")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("release", parents=[common, cluster_wide], help="release one address",
                       description="Release one address. With --cluster, an address another node holds "
                                   "is released by that node's agent (on its next heartbeat, ≤ 5 s).")
    p.add_argument("address")
    p.add_argument("--network", help="the network (needed when several hold the address)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="with --cluster: wait up to SECONDS for the holding node to release it")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser(
        "gc", parents=[common, cluster_wide],
        help="release allocations whose container is gone",
        description="Without --keep-file: release allocations whose recorded netns no longer "
                    "exists. With --keep-file: release every allocation not listed in it "
                    "(with --cluster: on every node; other nodes' agents carry it out).",
    )
    p.add_argument("--network", help="only this network")
    p.add_argument("--keep-file", help="JSON list of {containerID, ifname} to keep")
    p.add_argument("--dry-run", action="store_true", help="only say what would be released")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser(
        "import-host-local", parents=[common],
        help="take over host-local's allocations (its dataDir, or one network's directory)",
    )
    p.add_argument("dir", help="host-local's dataDir, e.g. /var/lib/cni/networks")
    p.add_argument("--network", help="import only this network (or: name for a network dir)")
    p.add_argument("--default-ifname", default="eth0",
                   help="interface for files from old host-local releases that name none")
    p.add_argument("--dry-run", action="store_true", help="only say what would be imported")
    p.set_defaults(func=cmd_import_host_local)
    p = sub.add_parser("nodes", help="cluster mode: which node owns how many address blocks, and is it alive")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_nodes, node_config_path=node_config_path, only_alive=False)
    p = sub.add_parser("leave", help="cluster mode: this node stops allocating from its address blocks and "
                                     "claims no more, so that `ipam release-node` may return them")
    p.set_defaults(func=cmd_leave, node_config_path=node_config_path)
    p = sub.add_parser("release-node", help="cluster mode: return the address blocks of a node that left (or "
                                            "is gone) to the pool")
    p.add_argument("node", help="the node's name (nodeName)")
    p.add_argument("--force", action="store_true",
                   help="although the node did not run `ipam leave` (only for a node you know is gone for "
                        "good: if it is alive it may give out addresses of those blocks until it next "
                        "verifies them)")
    p.set_defaults(func=cmd_release_node, node_config_path=node_config_path)
    return ipam


def register_cluster(subparsers: Any, node_config_path: Callable[[argparse.Namespace], str | None] = _given
                     ) -> argparse.ArgumentParser:
    """Add `cluster nodes` (the nodes registered in the cluster store)."""
    cluster = subparsers.add_parser("cluster", help="the nodes sharing the cluster store (etcd)")
    sub = cluster.add_subparsers(dest="cluster_command", metavar="nodes", required=True)
    p = sub.add_parser("nodes", help="registered (alive) nodes: name, underlay address, blocks")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_nodes, node_config_path=node_config_path, only_alive=True)
    return cluster


def _cluster_store(args: argparse.Namespace) -> Any:
    """(etcd client, key prefix) from the node config; None (said on stderr) without one."""
    found = _this_node(args)
    if found is None:
        return None
    from ipam import cluster

    who, _ = found
    return cluster.client(who.etcd), who.prefix


def _this_node(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """(this node's ClusterNode, its node config); None (said on stderr) without a cluster store."""
    from tenantnet.plugin import ipam_client, nodeconfig

    try:
        node = nodeconfig.load(args.node_config_path(args))
    except CniError as err:
        print(f"tenantnetctl: {err.msg}", file=sys.stderr)
        return None
    who = ipam_client.cluster_node(node)
    if who is None:
        print(f"tenantnetctl: the node config ({node.source}) names no cluster store (etcdEndpoints)",
              file=sys.stderr)
        return None
    return who, node


def cmd_nodes(args: argparse.Namespace) -> int:
    from ipam import cluster
    from ipam import nodes as ipam_nodes

    store = _cluster_store(args)
    if store is None:
        return 1
    etcd, prefix = store
    try:
        alive = ipam_nodes.alive_nodes(etcd, prefix)
        blocks = ipam_nodes.blocks_by_node(etcd, prefix)
    except (cluster.EtcdUnavailable, cluster.EtcdError) as exc:
        print(f"tenantnetctl: {exc}", file=sys.stderr)
        return 1
    names = sorted(alive) if args.only_alive else sorted(set(alive) | set(blocks))
    rows = [{"name": n, "alive": n in alive, "address": alive.get(n, {}).get("address"),
             "blocks": len(blocks.get(n, [])), "networks": sorted({net for net, _ in blocks.get(n, [])})}
            for n in names]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'NODE':<24} {'ALIVE':<6} {'ADDRESS':<16} {'BLOCKS':>6}  NETWORKS")
    for r in rows:
        flag = "yes" if r["alive"] else "no"
        nets = ",".join(cast(list[str], r["networks"])) or "-"
        print(f"{r['name']:<24} {flag:<6} {r['address'] or '-':<16} {r['blocks']:>6}  {nets}")
    return 0


def cmd_release_node(args: argparse.Namespace) -> int:
    from ipam import cluster
    from ipam import nodes as ipam_nodes

    store = _cluster_store(args)
    if store is None:
        return 1
    etcd, prefix = store
    try:
        released = ipam_nodes.release_node(etcd, prefix, args.node, args.force)
    except CniError as err:
        print(f"tenantnetctl ipam release-node: {err.msg}" + (f"; {err.details}" if err.details else ""),
              file=sys.stderr)
        return 1
    except (cluster.EtcdUnavailable, cluster.EtcdError) as exc:
        print(f"tenantnetctl ipam release-node: {exc}", file=sys.stderr)
        return 1
    for network, block in released:
        print(f"released block {block} of network {network} (was node {args.node})")
    if not released:
        print(f"node {args.node} owns no block")
    return 0


def cmd_leave(args: argparse.Namespace) -> int:
    """This node leaves the cluster: declared in etcd first (no claim after it), then every
    block of every store revoked locally (no allocation after it)."""
    from ipam import cluster, holdings, plugin
    from ipam import nodes as ipam_nodes
    from ipam.config import ClusterSettings

    found = _this_node(args)
    if found is None:
        return 1
    who, node = found
    try:
        ipam_nodes.declare_leaving(cluster.client(who.etcd), who.prefix, who.name)
    except (cluster.EtcdUnavailable, cluster.EtcdError) as exc:
        print(f"tenantnetctl ipam leave: {exc}", file=sys.stderr)
        return 1
    for data_dir in dict.fromkeys([node.ipam_data_dir, *node.ipam_data_dirs]):
        for network in holdings.cluster_networks(data_dir):
            ledger = cluster.Ledger(who, network, data_dir, ClusterSettings())
            for block in ledger.surrender(plugin.open_store(data_dir, create=False)):
                print(f"stopped allocating from block {block} of network {network} ({data_dir})")
    print(f"node {who.name} is leaving: run `tenantnetctl ipam release-node {who.name}` to return its blocks")
    return 0


# ---- output helpers ---------------------------------------------------------------------


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "-"


def _table(rows: list[Allocation]) -> str:
    header = ("NETWORK", "ADDRESS", "CONTAINER", "IFNAME", "POD", "CREATED")
    lines = [header] + [
        (
            a.network,
            str(a.address),
            a.container_id[:16],
            a.ifname,
            f"{a.pod_namespace}/{a.pod_name}" if a.pod_name else "-",
            _when(a.created),
        )
        for a in rows
    ]
    return columns(lines)


def columns(lines: Sequence[Sequence[str]]) -> str:
    """Rows of cells (the first: the header) as left-aligned columns."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif text:
        print(text)


def _fail(message: str) -> int:
    print(f"tenantnetctl ipam: {message}", file=sys.stderr)
    return 1


def _store(args: argparse.Namespace, *, create: bool = False) -> SqliteStore | None:
    if not create and not os.path.exists(os.path.join(args.data_dir, DB_NAME)):
        _fail(f"no IPAM store in {args.data_dir} (is --data-dir the config's ipam.dataDir?)")
        return None
    return SqliteStore(args.data_dir)


def _matching(store: SqliteStore, address: str, network: str | None) -> list[Allocation] | None:
    try:
        wanted = ipaddress.ip_address(address.split("/", 1)[0])
    except ValueError:
        _fail(f"{address!r} is not an IPv4 or IPv6 address")
        return None
    return [a for a in store.allocations(network) if a.address == wanted]


def _guard(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A store that cannot be opened or written is a message and exit code 1, not a trace."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except CniError as err:
            return _fail(err.msg)

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


# ---- cluster-wide: every node's published allocations (ipam/holdings.py) ----------------


class _ClusterView:
    """Every node's allocations: this node's read from its stores now, the others' as they
    last published them; and where an address's block is, and whose."""

    def __init__(self, args: argparse.Namespace) -> None:
        from ipam import cluster, holdings

        found = _this_node(args)
        if found is None:
            raise _Refused()
        self.who, node = found
        self.etcd = cluster.client(self.who.etcd)
        self.data_dirs = [d for d in dict.fromkeys((args.data_dir, node.ipam_data_dir))
                          if os.path.exists(os.path.join(d, DB_NAME))]
        network = getattr(args, "network", None)
        try:
            others = [h for h in holdings.published(self.etcd, self.who.prefix, network)
                      if h.node != self.who.name]
            self.blocks = _blocks_by_owner(self.etcd, self.who.prefix)
        except (cluster.EtcdUnavailable, cluster.EtcdError) as exc:
            raise _Refused(f"the cluster store: {exc}") from None
        mine = [h for d in self.data_dirs for h in holdings.local(self.who.name, d, SqliteStore(d), network)]
        self.holdings = sorted(mine + others, key=lambda h: (
            h.allocation.network, h.allocation.address.version, h.allocation.address, h.node))

    def stores(self) -> list[SqliteStore]:
        return [SqliteStore(d) for d in self.data_dirs]

    def block_of(self, network: str | None, address: ipaddress.IPv4Address | ipaddress.IPv6Address
                 ) -> list[tuple[str, str, str]]:
        """(network, block, owner) of every claimed block holding `address`."""
        return [(net, str(b), owner) for (net, b), owner in self.blocks.items()
                if (network is None or net == network) and b.version == address.version and address in b]


class _Refused(Exception):
    """Said on stderr (when there is something to say) and exit code 1."""


def _blocks_by_owner(etcd: Any, prefix: str) -> dict[tuple[str, Any], str]:
    from ipam import nodes as ipam_nodes

    return {(net, ipaddress.ip_network(block)): owner
            for owner, blocks in ipam_nodes.blocks_by_node(etcd, prefix).items() for net, block in blocks}


def _age(h: Any) -> str:
    return "now" if not h.as_of else f"{max(0, round(datetime.now(UTC).timestamp() - h.as_of))}s ago"


def _cluster_table(rows: list[Any]) -> str:
    header = ("NODE", "NETWORK", "ADDRESS", "BLOCK", "CONTAINER", "IFNAME", "POD", "AS OF")
    lines = [header] + [
        (h.node, h.allocation.network, str(h.allocation.address), h.block, h.allocation.container_id[:16],
         h.allocation.ifname,
         f"{h.allocation.pod_namespace}/{h.allocation.pod_name}" if h.allocation.pod_name else "-", _age(h))
        for h in rows]
    return columns(lines)


def _cluster_guard(handler: Callable[[argparse.Namespace, _ClusterView], int]
                   ) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args, _ClusterView(args))
        except _Refused as why:
            return _fail(str(why)) if str(why) else 1
        except CniError as err:
            return _fail(err.msg)

    return run


@_cluster_guard
def _cluster_ls(args: argparse.Namespace, view: _ClusterView) -> int:
    _emit(args, [h.to_dict() for h in view.holdings], _cluster_table(view.holdings))
    return 0


def _address_of(args: argparse.Namespace) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(args.address.split("/", 1)[0])
    except ValueError:
        raise _Refused(f"{args.address!r} is not an IPv4 or IPv6 address") from None


@_cluster_guard
def _cluster_show(args: argparse.Namespace, view: _ClusterView) -> int:
    wanted = _address_of(args)
    held = [h for h in view.holdings if h.allocation.address == wanted]
    blocks = view.block_of(args.network, wanted)
    if not held:
        where = "; ".join(f"in block {b} of network {n}, owned by node {o}" for n, b, o in blocks) \
            or "in no claimed block"
        return _fail(f"{args.address} is not allocated cluster-wide ({where})")
    text = "\n\n".join(
        "\n".join(f"{k:13} {v}" for k, v in h.allocation.to_dict().items() if k != "created")
        + f"\n{'created':13} {_when(h.allocation.created)}\n{'node':13} {h.node}\n{'block':13} {h.block}"
        + f"\n{'as of':13} {_age(h)}"
        for h in held)
    _emit(args, [h.to_dict() for h in held], text)
    return 0


@_cluster_guard
def _cluster_release(args: argparse.Namespace, view: _ClusterView) -> int:
    wanted = _address_of(args)
    held = [h for h in view.holdings if h.allocation.address == wanted
            and (args.network is None or h.allocation.network == args.network)]
    if not held:
        return _fail(f"{args.address} is not allocated cluster-wide"
                     + (f" in network {args.network!r}" if args.network else ""))
    if len({h.allocation.network for h in held}) > 1:
        nets = ", ".join(sorted({h.allocation.network for h in held}))
        return _fail(f"{args.address} is allocated in several networks ({nets}); choose one with --network")
    return _release_everywhere(args, view, held)


def _release_everywhere(args: argparse.Namespace, view: _ClusterView, held: list[Any]) -> int:
    """Release `held`: this node's now, other nodes' by request to their agents."""
    import time

    from ipam import cluster, holdings

    lines, done, requested = [], [], []
    for h in held:
        a = h.allocation
        if h.node == view.who.name:
            for store in view.stores():
                done += [x.to_dict() for x in release_addresses(store, [a])]
            lines.append(f"released {a.address} ({a.network}, container {a.container_id} {a.ifname})")
            continue
        try:
            holdings.request_release(view.etcd, view.who.prefix, h, view.who.name)
        except (cluster.EtcdUnavailable, cluster.EtcdError) as exc:
            return _fail(f"cannot file the release of {a.address} for node {h.node}: {exc}")
        requested.append(h)
        lines.append(f"requested {a.address} ({a.network}, container {a.container_id} {a.ifname}) from node "
                     f"{h.node}: its agent releases it on its next heartbeat")
    wait = float(getattr(args, "wait", 0.0) or 0.0)
    deadline = time.monotonic() + max(0.0, wait)
    pending = requested
    while pending and time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            now = {(h.node, h.allocation.network, h.allocation.address, h.allocation.attachment)
                   for h in holdings.published(view.etcd, view.who.prefix)}
        except (cluster.EtcdUnavailable, cluster.EtcdError):
            continue
        pending = [h for h in pending
                   if (h.node, h.allocation.network, h.allocation.address, h.allocation.attachment) in now]
    if requested and wait:
        lines += [f"node {h.node} has not released {h.allocation.address} yet" for h in pending]
        if not pending:
            lines.append("every requested release is done")
    _emit(args, {"released": done, "requested": [h.to_dict() for h in requested],
                 "pending": [h.to_dict() for h in pending] if wait else None},
          "\n".join(lines))
    return 1 if pending and wait else 0


@_cluster_guard
def _cluster_gc(args: argparse.Namespace, view: _ClusterView) -> int:
    if not args.keep_file:
        return _fail("gc --cluster needs --keep-file: whether a sandbox still exists can only be seen "
                     "on its own node (run `tenantnetctl ipam gc` there)")
    try:
        keep = _keep_from_file(args.keep_file)
    except (OSError, ValueError, CniError) as exc:
        return _fail(f"cannot use --keep-file {args.keep_file}: {exc}")
    stale = [h for h in view.holdings if h.allocation.attachment not in keep]
    if args.dry_run:
        _emit(args, {"wouldRelease": [h.to_dict() for h in stale]},
              "\n".join(f"would release {h.allocation.address} ({h.allocation.network}, node {h.node}, "
                        f"container {h.allocation.container_id} {h.allocation.ifname})" for h in stale)
              or "nothing to release")
        return 0
    if not stale:
        _emit(args, {"released": [], "requested": []}, "nothing to release")
        return 0
    return _release_everywhere(args, view, stale)


# ---- commands ---------------------------------------------------------------------------


@_guard
def cmd_ls(args: argparse.Namespace) -> int:
    if getattr(args, "cluster", False):
        return _cluster_ls(args)
    store = _store(args)
    if store is None:
        return 1
    rows = store.allocations(args.network)
    _emit(args, [a.to_dict() for a in rows], _table(rows))
    return 0


def _held(args: argparse.Namespace) -> tuple[Any, list[Any]] | int:
    """The store and the allocations of args.address (in args.network), or an exit code."""
    store = _store(args)
    if store is None:
        return 1
    rows = _matching(store, args.address, args.network)
    if rows is None:
        return 1
    if not rows:
        return _fail(f"{args.address} is not allocated"
                     + (f" in network {args.network!r}" if args.network else ""))
    return store, rows


@_guard
def cmd_show(args: argparse.Namespace) -> int:
    if getattr(args, "cluster", False):
        return _cluster_show(args)
    held = _held(args)
    if isinstance(held, int):
        return held
    _, rows = held
    text = "\n\n".join(
        "\n".join(f"{k:13} {v}" for k, v in a.to_dict().items() if k != "created")
        + f"\n{'created':13} {_when(a.created)}"
        for a in rows
    )
    _emit(args, [a.to_dict() for a in rows], text)
    return 0


@_guard
def cmd_release(args: argparse.Namespace) -> int:
    if getattr(args, "cluster", False):
        return _cluster_release(args)
    held = _held(args)
    if isinstance(held, int):
        return held
    store, rows = held
    if len(rows) > 1:
        nets = ", ".join(a.network for a in rows)
        return _fail(f"{args.address} is allocated in several networks ({nets}); "
                     "choose one with --network")
    released = release_addresses(store, rows)
    _emit(args, [a.to_dict() for a in released],
          "\n".join(f"released {a.address} ({a.network}, container {a.container_id} "
                    f"{a.ifname})" for a in released))
    return 0 if released else _fail(f"{args.address} changed hands meanwhile; nothing released")


def _keep_from_file(path: str) -> set[tuple[str, str]]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if isinstance(data, list):
        data = {"cni.dev/valid-attachments": data}
    if not isinstance(data, dict):
        raise CniError(Code.INVALID_CONFIG, f"--keep-file {path}: must hold a JSON list or object")
    return valid_attachments(data)


@_guard
def cmd_gc(args: argparse.Namespace) -> int:
    if getattr(args, "cluster", False):
        return _cluster_gc(args)
    store = _store(args)
    if store is None:
        return 1
    rows = store.allocations(args.network)
    unknown: list[Allocation] = []
    if args.keep_file:
        try:
            keep = _keep_from_file(args.keep_file)
        except (OSError, ValueError, CniError) as exc:
            return _fail(f"cannot use --keep-file {args.keep_file}: {exc}")
        stale = [a for a in rows if a.attachment not in keep]
    else:
        stale = [a for a in rows if a.netns and not os.path.exists(a.netns)]
        unknown = [a for a in rows if not a.netns]
    released = stale if args.dry_run else release_addresses(store, stale)
    verb = "would release" if args.dry_run else "released"
    lines = [f"{verb} {a.address} ({a.network}, container {a.container_id} {a.ifname})"
             for a in released]
    if unknown:
        lines.append(f"kept {len(unknown)} allocation(s) with no recorded netns "
                     "(use --keep-file to collect those)")
    _emit(args, {"released" if not args.dry_run else "wouldRelease":
                 [a.to_dict() for a in released],
                 "keptUnknown": [a.to_dict() for a in unknown]},
          "\n".join(lines) or "nothing to release")
    return 0


@_guard
def cmd_import_host_local(args: argparse.Namespace) -> int:
    from ipam.hostlocal import import_dir

    store = _store(args, create=True)
    assert store is not None
    try:
        report = import_dir(store, args.dir, args.network,
                            default_ifname=args.default_ifname, dry_run=args.dry_run)
    except (CniError, OSError) as exc:
        return _fail(f"cannot import {args.dir}: {exc}")
    lines = []
    for ours, theirs in report.conflicts:
        lines.append(f"conflict: {ours.address} ({ours.network}) is {ours.container_id} "
                     f"{ours.ifname} in host-local but {theirs.container_id} {theirs.ifname} here")
    verb = "imported" if report.recorded else "would import"
    lines.append(f"{verb} {len(report.imported)} allocation(s); "
                 f"{len(report.already)} already present")
    if report.conflicts:
        lines.append("nothing recorded: resolve the conflicts first (tenantnetctl ipam release)")
    _emit(args, {
        "recorded": report.recorded,
        "imported": [a.to_dict() for a in report.imported],
        "already": [a.to_dict() for a in report.already],
        "conflicts": [{"hostLocal": a.to_dict(), "store": b.to_dict()}
                      for a, b in report.conflicts],
    }, "\n".join(lines))
    return 1 if report.conflicts else 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m tenantnet.ops.ipamctl ipam ls`) until tenantnetctl wires `register`."""
    parser = argparse.ArgumentParser(prog="tenantnetctl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
