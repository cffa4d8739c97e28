"""Getting addresses for an attachment: exec any CNI IPAM plugin on CNI_PATH, or run
tenantnet's own IPAM in-process (no exec) when `ipam.type` is `tenantnet-ipam`.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from typing import Any

from cni import version as cniversion
from cni.env import CniEnv
from cni.errors import CniError, Code
from cni.netconf import NetConf, parse_netconf
from cni.result import Result
from tenantnet.plugin import faults
from tenantnet.plugin.settings import DELEGATION_ENV

OWN_IPAM = "tenantnet-ipam"
# The spec's codes an IPAM plugin's error keeps; any other becomes 104 (IPAM plugin failed).
_PASSED_ON = {Code.INCOMPATIBLE_VERSION, Code.UNSUPPORTED_FIELD, Code.UNKNOWN_CONTAINER, Code.INVALID_ENV,
              Code.IO_FAILURE, Code.DECODE_FAILURE, Code.INVALID_CONFIG, Code.TRY_AGAIN_LATER}
EXEC_TIMEOUT = 60.0


@dataclass(frozen=True)
class IpamCall:
    """Who the IPAM call is for: the CNI env fields an IPAM plugin receives."""

    command: str
    container_id: str
    ifname: str
    netns: str
    cni_args: str
    cni_path: tuple[str, ...]


def call_for(env: CniEnv, command: str | None = None, netns: str | None = None) -> IpamCall:
    args = ";".join(f"{k}={v}" for k, v in env.args.raw.items())
    return IpamCall(
        command=command or env.command,
        container_id=env.container_id,
        ifname=env.ifname,
        netns=env.netns if netns is None else netns,
        cni_args=args,
        cni_path=env.path,
    )


def confinement(node: Any) -> Any:
    """The node's limits on an IPAM config's dataDir and resolvConf (ipam.config.Confinement)."""
    from ipam.config import Confinement

    return Confinement(node.ipam_data_dirs, node.resolv_conf_paths, node.ipam_data_dir,
                       os.path.join(node.state_dir, "ipam-stores"))


def cluster_node(node: Any) -> Any:
    """This node in tenantnet-ipam's cluster store (an ipam.cluster.ClusterNode), or None when
    the node config names no etcd (networks with ipam.cluster are then refused)."""
    if not node.etcd_endpoints:
        return None
    import ipaddress

    from ipam.cluster import ClusterNode, default_node_name
    from ipam.etcd import EtcdConfig

    etcd = EtcdConfig(node.etcd_endpoints, node.etcd_ca_file, node.etcd_cert_file, node.etcd_key_file,
                      node.etcd_timeout)
    pools = tuple(ipaddress.ip_network(p) for p in node.cluster_pools)
    return ClusterNode(node.node_name or default_node_name(), etcd, node.etcd_prefix, pools)


def _is_tenantnet(candidate: str, cni_path: tuple[str, ...]) -> bool:
    """Is `candidate` the tenantnet plugin itself under another name (a link or copy)?"""
    for directory in cni_path:
        own = os.path.join(directory, "tenantnet")
        try:
            if os.path.samefile(candidate, own):
                return True
        except OSError:
            continue
    return False


def find_plugin(ipam_type: str, cni_path: tuple[str, ...]) -> str:
    if not cni_path:
        raise CniError(
            Code.INVALID_ENV,
            f"missing environment variable CNI_PATH (needed to find IPAM plugin {ipam_type!r})",
        )
    for directory in cni_path:
        candidate = os.path.join(directory, ipam_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            if _is_tenantnet(candidate, cni_path):
                raise CniError(Code.INVALID_CONFIG, f"invalid network config: ipam.type={ipam_type!r}: "
                                                    f"{candidate} is tenantnet itself, not an IPAM plugin")
            return candidate
    raise CniError(
        Code.INVALID_CONFIG,
        f"invalid network config: ipam.type={ipam_type!r}: no such executable in "
        f"CNI_PATH ({os.pathsep.join(cni_path)})",
    )


def _exec(ipam_type: str, call: IpamCall, conf_raw: dict[str, Any]) -> dict[str, Any] | None:
    plugin = find_plugin(ipam_type, call.cni_path)
    env = {
        "CNI_COMMAND": call.command,
        "CNI_CONTAINERID": call.container_id,
        "CNI_NETNS": call.netns,
        "CNI_IFNAME": call.ifname,
        "CNI_ARGS": call.cni_args,
        "CNI_PATH": os.pathsep.join(call.cni_path),
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
    }
    for key in ("TENANTNET_CONFIG",):
        if key in os.environ:
            env[key] = os.environ[key]
    # A delegate that (through any chain) runs tenantnet again is refused there.
    env[DELEGATION_ENV] = "1"
    try:
        proc = _run_child(plugin, json.dumps(conf_raw).encode(), env)
    except subprocess.TimeoutExpired:
        raise CniError(
            Code.TRY_AGAIN_LATER,
            f"IPAM plugin {ipam_type} did not answer {call.command} within {EXEC_TIMEOUT:.0f}s",
        ) from None
    except OSError as exc:
        raise CniError(Code.IPAM_PLUGIN_FAILED, f"cannot run IPAM plugin {plugin}: {exc.strerror}") from None
    out = proc.stdout.decode(errors="replace").strip()
    if proc.returncode != 0:
        try:
            err = json.loads(out)
            code = int(err.get("code", Code.IPAM_PLUGIN_FAILED))
            msg = str(err.get("msg", ""))
            details = str(err.get("details", ""))
        except (ValueError, AttributeError, TypeError):
            code, msg = int(Code.IPAM_PLUGIN_FAILED), out or proc.stderr.decode(errors="replace").strip()
            details = ""
        if code not in _PASSED_ON:
            # Another plugin's own codes mean nothing in tenantnet's table (docs/errors.md).
            msg, code = f"{msg} (its code {code})", int(Code.IPAM_PLUGIN_FAILED)
        raise CniError(code, f"IPAM plugin {ipam_type} {call.command} failed: {msg}", details)
    if not out:
        return None
    try:
        parsed = json.loads(out)
    except ValueError:
        raise CniError(Code.IPAM_PLUGIN_FAILED,
                       f"IPAM plugin {ipam_type} printed something that is not JSON: {out[:200]!r}") from None
    return parsed if isinstance(parsed, dict) else None


def _run_child(plugin: str, stdin: bytes, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """The IPAM plugin as a child process, bounded in time; killed if it overruns."""
    with subprocess.Popen([plugin], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env) as child:
        assert child.stdin is not None
        try:
            child.stdin.write(stdin)  # an IPAM plugin reads its whole config first
            child.stdin.close()
        except BrokenPipeError:
            pass
        child.stdin = None
        faults.step("ipam.child-running")  # a crash here leaves the child to finish alone
        try:
            out, err = child.communicate(timeout=EXEC_TIMEOUT)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        return subprocess.CompletedProcess([plugin], child.returncode, out, err)


def _in_process(call: IpamCall, conf_raw: dict[str, Any], node: Any) -> Result | None:
    from cni.env import parse_env
    from ipam import plugin

    env = parse_env({
        "CNI_COMMAND": call.command, "CNI_CONTAINERID": call.container_id,
        "CNI_NETNS": call.netns, "CNI_IFNAME": call.ifname, "CNI_ARGS": call.cni_args,
        "CNI_PATH": os.pathsep.join(call.cni_path),
    })
    conf = parse_netconf(conf_raw)
    limits = confinement(node)
    if call.command == "ADD":
        return plugin.add(env, conf, limits, cluster_node(node))
    if call.command == "DEL":
        plugin.delete(env, conf, limits, cluster_node(node))
    elif call.command == "CHECK":
        plugin.check(env, conf, limits)
    return None


def gc_own(conf: NetConf, keep: set[tuple[str, str]], node: Any) -> None:
    """GC of tenantnet-ipam's store for network `conf` (CNI 1.1.0): every allocation not
    owned by one of `keep`'s (container id, ifname) is released. Other IPAM plugins get
    no GC from us (the runtime calls them itself)."""
    if not cniversion.at_least(conf.cni_version, "1.1.0") or not isinstance(conf.ipam, dict) \
            or conf.ipam.get("type") != OWN_IPAM:
        return
    from ipam import plugin

    plugin.gc(conf, keep, confinement(node), cluster_node(node))


# IPAM types whose ADD never looks at the pod's interface (addresses from a store or the
# config), so they may run while the driver is still making it; `dhcp` needs the interface.
INTERFACE_BLIND = frozenset({OWN_IPAM, "host-local", "static", "whereabouts"})


def run(ipam_type: str, call: IpamCall, conf_raw: dict[str, Any], node: Any) -> Result | None:
    """ADD returns the IPAM result; DEL and CHECK return None or raise CniError."""
    if ipam_type == OWN_IPAM:
        return _in_process(call, conf_raw, node)
    out = _exec(ipam_type, call, conf_raw)
    if call.command == "ADD":
        if out is None:
            raise CniError(Code.IPAM_PLUGIN_FAILED, f"IPAM plugin {ipam_type} returned no result")
        return Result.from_dict(out, f"result of IPAM plugin {ipam_type}")
    return None
