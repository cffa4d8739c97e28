"""The node configuration: `/etc/tenantnet/tenantnet.yaml` (or `$TENANTNET_CONFIG`).

A missing file means defaults. An invalid file is an error naming the file and the key,
because a silently ignored typo in a node config is how attachments end up on the wrong
OVS or state goes to the wrong place.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from cni.errors import CniError, Code
from hostfiles.confined import plain_path_problem, within
from ipam.config import DEFAULT_CONFINEMENT
from tenantnet.plugin import nodepath
from tenantnet.plugin.log import level_number
from tenantnet.plugin.pci import normalise_pci_address

if TYPE_CHECKING:
    from tenantnet.plugin.overlay import OvnSettings

DEFAULT_PATH = nodepath.DEFAULT_PATH
DEFAULT_OVSDB = "unix:/var/run/openvswitch/db.sock"
DEFAULT_STATE_DIR = "/var/lib/tenantnet"
DEFAULT_LOG_FILE = "/var/log/tenantnet/tenantnet.log"
DEFAULT_AGENT_SOCKET = nodepath.DEFAULT_AGENT_SOCKET
# Where Multus puts the device-info files it names in CNIDeviceInfoFile (network-attachment-
# definition-client's GetCNIDeviceInfoPath: <base>/cni/<network>-<container>_<ifname>); a
# device plugin's own files are in <base>/dp, which tenantnet has no reason to write.
DEFAULT_DEVICE_INFO_DIR = "/var/run/k8s.cni.cncf.io/devinfo/cni"
# What a NAD may name (docs/security.md): each path must be one of these or below one.
DEFAULT_OVS_CONFIGURATION_PATHS = ("/etc/kubernetes/cni/net.d/ovs.d",)
DEFAULT_RESOLV_CONF_PATHS = DEFAULT_CONFINEMENT.resolv_conf_paths
DEFAULT_IPAM_DATA_DIRS = DEFAULT_CONFINEMENT.data_dirs
PRECONDITIONS = {"eswitchSwitchdev": "warn", "hwTcOffload": "warn", "ovsHwOffload": "warn"}


@dataclass(frozen=True)
class NodeConfig:
    """The node's own settings (the admin's file, never tenant input), with their defaults."""

    ovsdb: str = DEFAULT_OVSDB
    state_dir: str = DEFAULT_STATE_DIR
    log_file: str = DEFAULT_LOG_FILE
    log_level: str = "info"
    ovsdb_timeout: float = 5.0
    # ADD/DEL of an OVS port wait until ovs-vswitchd has applied it (ovs-vsctl's default)
    # instead of returning once OVSDB committed it (`--no-wait`, what ovs-cni does).
    ovs_wait: bool = False
    sysfs_root: str = "/sys"
    # How VFs are configured through their PF: "netlink" (a real NIC) or "lab:<lab dir>"
    # (the lab's simulated NIC, see tenantnet/lab/nic.py).
    vf_control: str = "netlink"
    # Modules that register the VF control `vf_control` names when it is not netlink.
    vf_control_modules: tuple[str, ...] = ()
    # How a VF's RDMA device is moved into the pod: "netlink" (the kernel's RDMA netlink) or
    # "lab-rdma:<lab dir>" (the lab's simulation, tenantnet/lab/rdma.py).
    rdma_control: str = "netlink"
    rdma_control_modules: tuple[str, ...] = ()
    # Rail alignment (docs/rails.md): the kubelet's pod-resources API names the pod's GPUs,
    # the nvidia driver's /proc files (or gpuMap) their PCI addresses.
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    gpu_resource_names: tuple[str, ...] = ("nvidia.com/gpu",)
    nvidia_proc_root: str = "/proc"
    gpu_map: dict[str, str] | None = None  # GPU UUID or device id -> PCI address
    tenancy: dict[str, Any] | None = None  # inline tenancy policy (tenantnet/plugin/tenancy.py)
    tenancy_file: str | None = None
    # Where `tenantnetctl agent run` listens and the `tenantnet` shim connects (docs/agent.md).
    agent_socket: str = DEFAULT_AGENT_SOCKET
    # Mode ovs-offload preconditions: "warn" (default) or "refuse", per precondition.
    offload_preconditions: dict[str, str] = field(default_factory=lambda: dict(PRECONDITIONS))
    # Tenant-named host paths are honoured only inside these (docs/security.md).
    device_info_dir: str = DEFAULT_DEVICE_INFO_DIR
    ovs_configuration_paths: tuple[str, ...] = DEFAULT_OVS_CONFIGURATION_PATHS
    resolv_conf_paths: tuple[str, ...] = DEFAULT_RESOLV_CONF_PATHS
    ipam_data_dirs: tuple[str, ...] = DEFAULT_IPAM_DATA_DIRS
    # tenantnet-ipam's store when a network config names no dataDir (one of ipam_data_dirs).
    ipam_data_dir: str = DEFAULT_CONFINEMENT.default_data_dir
    # OVSDB endpoints a NAD's socket_file may name, besides `ovsdb`.
    ovsdb_endpoints: tuple[str, ...] = ()
    # Cluster mode of tenantnet-ipam (docs/ipam.md): this node's name and the cluster store.
    node_name: str | None = None  # default: the host name
    node_address: str | None = None  # the node's underlay address, shown to operators
    etcd_endpoints: tuple[str, ...] = ()
    etcd_ca_file: str | None = None
    etcd_cert_file: str | None = None
    etcd_key_file: str | None = None
    etcd_prefix: str = "/tenantnet/"
    etcd_timeout: float = 5.0
    # The admin's cluster pools: a cluster network's ranges must lie inside one (a NAD is a
    # tenant's, and its ranges are recorded cluster-wide). Normalised CIDRs.
    cluster_pools: tuple[str, ...] = ()
    # The agent's /metrics endpoint (docs/metrics.md): 0 = not served. Its series name pods
    # and tenants, so it stays on the node unless the admin opens it, and then preferably
    # behind a bearer token (metricsTokenFile: "" = no token asked for).
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    metrics_token_file: str = ""
    # How old the offload gauges of a scrape may be (each refresh reads ovs-vswitchd).
    metrics_offload_interval: float = 15.0
    # Where ovs-vswitchd logs: its tc/flower refusals are blamed on pods (docs/offload.md).
    vswitchd_log: str = "/var/log/openvswitch/ovs-vswitchd.log"
    # Pre-warm (docs/offload.md): the default for networks that do not say `prewarm`, the
    # most peers one attachment is paired with, and the datapath idle time to ask OVS for
    # (other_config:max-idle, in ms; None: leave OVS's setting alone).
    prewarm: bool = False
    prewarm_max_peers: int = 64
    prewarm_max_idle_ms: int | None = None
    # How often the agent re-writes pre-warm rules that vanished (an ovs-vswitchd restart)
    # and removes those that no longer send to their attachment's live port.
    prewarm_reconcile_interval: float = 30.0
    # Pre-warm writes OpenFlow rules that name ports by number on a bridge shared by
    # tenants, so where it may run is the admin's: these bridges (every bridge when
    # `prewarm` is true). On such a bridge a tenant may not choose its port's OpenFlow
    # number or its MAC (with either it could take the place a rule sends to) unless
    # granted here: "ofport_request", "mac" (docs/security.md).
    prewarm_bridges: tuple[str, ...] = ()
    prewarm_grants: tuple[str, ...] = ()
    # Kubernetes mode (docs/kubernetes.md): networks are the admin's TenantNetworks, which the
    # agent watches (with `kubeconfig`, "" = in-cluster) into the state dir's cache; a NAD
    # naming none is refused unless `legacyNads` (then the tenancy policy applies). A
    # namespace's tenant comes from these label sources, in this order.
    kubernetes: bool = False
    kubeconfig: str = ""
    legacy_nads: bool = False
    tenant_sources: tuple[str, ...] = ("label",)
    # DRA (docs/dra.md): the agent is also the kubelet plugin of driver `tenantnet.io` (its
    # sockets under the kubelet's root dir), publishes this node's VFs as ResourceSlices,
    # and moves prepared devices into pods through containerd's NRI socket; CDI specs go to
    # `cdiDir`. Needs `kubernetes: true` (the claims and the tenants come from the API).
    dra: bool = False
    kubelet_root_dir: str = "/var/lib/kubelet"
    nri_socket: str = "/var/run/nri/nri.sock"
    cdi_dir: str = "/var/run/cdi"
    # Overlay networks (docs/overlay.md): the OVN northbound database and, per rail NIC, the
    # chassis (integration bridge, underlay MTU) an overlay attachment on that rail binds to.
    ovn: OvnSettings | None = None
    source: str = "(defaults)"

    @property
    def log_dir(self) -> str:
        """The directory of the node's log: a NAD's `logFile` must be directly in it."""
        return os.path.dirname(self.log_file)

    def allowed_ovsdb(self) -> tuple[str, ...]:
        return (self.ovsdb, *self.ovsdb_endpoints)

    def prewarm_bridge(self, bridge: str) -> bool:
        """Whether pre-warm may run on `bridge` ("": mode ovs-offload's bridge, found only at
        ADD — taken to be one when any bridge may pre-warm)."""
        if self.prewarm:
            return True
        return bridge in self.prewarm_bridges if bridge else bool(self.prewarm_bridges)


# YAML key -> (dataclass field, type check, description of what is allowed)
_KEYS: dict[str, tuple[str, type, str]] = {
    "ovsdb": ("ovsdb", str, "an OVSDB endpoint: unix:/path, tcp:host:port or ssl:host:port"),
    "stateDir": ("state_dir", str, "an absolute directory path"),
    "logFile": ("log_file", str, "an absolute file path"),
    "logLevel": ("log_level", str, "one of debug, info, warning, error"),
    "ovsdbTimeout": ("ovsdb_timeout", float, "a number of seconds between 0.1 and 120"),
    "ovsWait": ("ovs_wait", bool, "true or false"),
    "sysfsRoot": ("sysfs_root", str, "an absolute directory path (default /sys)"),
    "vfControl": ("vf_control", str, "netlink, or <scheme>:<argument> served by one of vfControlModules "
                                     "(the lab: lab:/path/of/the/lab)"),
    "vfControlModules": ("vf_control_modules", list, "a list of Python module names (dotted) that "
                                                     "register VF controls"),
    "rdmaControl": ("rdma_control", str, "netlink, or <scheme>:<argument> served by one of "
                                         "rdmaControlModules (the lab: lab-rdma:/path/of/the/lab)"),
    "rdmaControlModules": ("rdma_control_modules", list, "a list of Python module names (dotted) that "
                                                         "register RDMA controls"),
    "podResourcesSocket": ("pod_resources_socket", str, "an absolute path of the kubelet's pod-resources "
                                                        "socket"),
    "gpuResourceNames": ("gpu_resource_names", list, "a list of extended resource names of GPUs "
                                                     "(default [nvidia.com/gpu])"),
    "nvidiaProcRoot": ("nvidia_proc_root", str, "an absolute directory path holding driver/nvidia/gpus "
                                                "(default /proc)"),
    "gpuMap": ("gpu_map", dict, "a mapping of GPU UUIDs (or device ids) to PCI addresses"),
    "tenancy": ("tenancy", dict, "a mapping with tenants (see docs/tenancy.md)"),
    "tenancyFile": ("tenancy_file", str, "an absolute path of a YAML file with the tenancy policy"),
    "agentSocket": ("agent_socket", str, "an absolute path of the agent's unix socket"),
    "offloadPreconditions": ("offload_preconditions", dict,
                             "a mapping of eswitchSwitchdev, hwTcOffload, ovsHwOffload to warn or refuse"),
    "deviceInfoDir": ("device_info_dir", str, "an absolute directory path (Multus's devinfo directory)"),
    "ovsConfigurationPaths": ("ovs_configuration_paths", list,
                              "a list of absolute paths a NAD's configuration_path may name or be below"),
    "resolvConfPaths": ("resolv_conf_paths", list,
                        "a list of absolute paths a NAD's ipam.resolvConf may name or be below"),
    "ipamDataDir": ("ipam_data_dir", str, "an absolute directory path inside one of ipamDataDirs "
                                          "(tenantnet-ipam's store when a network config names no dataDir)"),
    "ipamDataDirs": ("ipam_data_dirs", list,
                     "a list of absolute directories a NAD's ipam.dataDir may name or be below"),
    "replaceDefaults": ("replace_defaults", list,
                        "a list of ovsConfigurationPaths, resolvConfPaths, ipamDataDirs: the lists this "
                        "config gives in full (without the built-in defaults; each must be given)"),
    "ovsdbEndpoints": ("ovsdb_endpoints", list,
                       "a list of OVSDB endpoints (unix:/path, tcp:host:port) a NAD's socket_file may name"),
    "nodeName": ("node_name", str, "this node's name in the cluster (a DNS name; default: the agent's "
                                   "$TENANTNET_NODE_NAME, which the DaemonSet sets to spec.nodeName, for its "
                                   "Node, else the host name)"),
    "nodeAddress": ("node_address", str, "this node's underlay IP address"),
    "etcdEndpoints": ("etcd_endpoints", list, "a list of etcd client URLs (http://host:port or https://)"),
    "etcdCaFile": ("etcd_ca_file", str, "an absolute path of the CA bundle etcd's certificate is checked "
                                        "against"),
    "etcdCertFile": ("etcd_cert_file", str, "an absolute path of this node's client certificate for etcd"),
    "etcdKeyFile": ("etcd_key_file", str, "an absolute path of the key of etcdCertFile"),
    "etcdPrefix": ("etcd_prefix", str, "a key prefix starting and ending with / (default /tenantnet/)"),
    "etcdTimeout": ("etcd_timeout", float, "a number of seconds between 0.1 and 30"),
    "clusterPools": ("cluster_pools", list, "a list of CIDRs (IPv4 /8 or longer, IPv6 /16 or longer) that "
                                            "cluster networks' ranges must lie inside"),
    "metricsPort": ("metrics_port", int, "a TCP port for the agent's /metrics (1-65535), or 0 for none"),
    "metricsAddress": ("metrics_address", str, "an IP address to serve /metrics on (default 127.0.0.1; "
                                               "0.0.0.0 or :: for all)"),
    "metricsTokenFile": ("metrics_token_file", str, "an absolute path of a file holding the bearer token "
                                                    "a scrape of /metrics must present"),
    "metricsOffloadInterval": ("metrics_offload_interval", float, "a number of seconds between 1 and 3600"),
    "vswitchdLog": ("vswitchd_log", str, "an absolute path of ovs-vswitchd's log file"),
    "prewarm": ("prewarm", bool, "true or false (the default of networks that do not say)"),
    "prewarmMaxPeers": ("prewarm_max_peers", int, "a number of peers between 1 and 1024"),
    "prewarmMaxIdleMs": ("prewarm_max_idle_ms", int, "milliseconds between 1000 and 3600000"),
    "prewarmReconcileInterval": ("prewarm_reconcile_interval", float,
                                 "a number of seconds between 1 and 3600"),
    "prewarmBridges": ("prewarm_bridges", list, "a list of OVS bridge names pre-warm may run on"),
    "kubernetes": ("kubernetes", bool, "true or false (networks are TenantNetworks, docs/kubernetes.md)"),
    "kubeconfig": ("kubeconfig", str, "an absolute path of the agent's kubeconfig (default: in-cluster)"),
    "legacyNads": ("legacy_nads", bool, "true or false (in Kubernetes mode: NADs naming no TenantNetwork "
                                        "are allowed, under the tenancy policy)"),
    "tenantSources": ("tenant_sources", list, "a list of distinct tenant sources, in order, from label, "
                                              "capsule, hnc, name"),
    "dra": ("dra", bool, "true or false (the agent is the DRA driver tenantnet.io, docs/dra.md; "
                         "needs kubernetes: true)"),
    "kubeletRootDir": ("kubelet_root_dir", str, "an absolute path of the kubelet's root dir "
                                                "(its plugins_registry and plugins folders)"),
    "nriSocket": ("nri_socket", str, "an absolute path of containerd's NRI socket"),
    "cdiDir": ("cdi_dir", str, "an absolute path of a directory the runtime reads CDI specs from"),
    "ovn": ("ovn", dict, "a mapping with northbound (the OVN NB endpoint), timeout, rails (name -> "
                         "integrationBridge, ovsdb, underlayMtu, underlayBridge, chassis, userspaceDatapath) "
                         "and defaultRail (docs/overlay.md)"),
    "prewarmGrants": ("prewarm_grants", list, 'a list of "ofport_request" and "mac": what a network '
                                              "config may set on a bridge that pre-warms"),
}

# Patterns of keys few node configs have, as text: `re.fullmatch` compiles one (and keeps
# it) the first time a config has the key, instead of every exec compiling all of them.
_VF_CONTROL = r"[a-z][a-z0-9-]*:\S+"
_RESOURCE = r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"
_MODULE = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_PATH_LIST_KEYS = ("ovsConfigurationPaths", "resolvConfPaths", "ipamDataDirs")
# What each allowed-paths list holds when the config does not give it; a config's list adds
# to these (docs/security.md: "add the directory" must not take the defaults away, or every
# NAD relying on one breaks), unless `replaceDefaults` names it.
_PATH_LIST_DEFAULTS = {"ovsConfigurationPaths": DEFAULT_OVS_CONFIGURATION_PATHS,
                       "resolvConfPaths": DEFAULT_RESOLV_CONF_PATHS,
                       "ipamDataDirs": DEFAULT_IPAM_DATA_DIRS}


_PATH_KEYS = ("stateDir", "logFile", "sysfsRoot", "tenancyFile", "agentSocket", "deviceInfoDir",
              "ipamDataDir", "podResourcesSocket", "nvidiaProcRoot",
              "etcdCaFile", "etcdCertFile", "etcdKeyFile", "vswitchdLog", "metricsTokenFile", "kubeconfig",
              "kubeletRootDir", "nriSocket", "cdiDir")
_ETCD_URL = r"https?://[A-Za-z0-9.\-]+(?::\d{1,5})?|https?://\[[0-9A-Fa-f:.]+\](?::\d{1,5})?"
_NODE_NAME = r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?"
_BRIDGE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"  # as a network config's `bridge` (tnconf)
PREWARM_GRANTS = ("ofport_request", "mac")


NODE_NAME_ENV = "TENANTNET_NODE_NAME"  # packaging/daemonset.yaml: the pod's spec.nodeName


def node_name_of(node: NodeConfig) -> str:
    """This node's name in the cluster: the node config's, else the DaemonSet's env, else the
    host's (the agent's Node, an overlay's logical ports, `rails --claims`)."""
    import socket

    return node.node_name or os.environ.get(NODE_NAME_ENV, "") or socket.gethostname()


def _cluster_pools(given: list[object]) -> tuple[str, ...] | None:
    """`clusterPools` as normalised CIDRs, or None when one is not a CIDR within the bounds."""
    from ipam.config import WIDEST_CLUSTER_PREFIX

    out = []
    for item in given:
        try:
            net = ipaddress.ip_network(item, strict=False) if isinstance(item, str) else None
        except ValueError:
            net = None
        if net is None or net.prefixlen < WIDEST_CLUSTER_PREFIX[net.version]:
            return None
        out.append(str(net))
    return tuple(out)


def normalise_ovsdb_endpoint(value: str) -> str | None:
    """`unix:/p`, `tcp:h:p`, `ssl:h:p`, or a bare absolute path (taken as unix:)."""
    if value.startswith("/"):
        return "unix:" + value
    kind, _, rest = value.partition(":")
    if kind == "unix" and rest.startswith("/"):
        return value
    if kind in ("tcp", "ssl"):
        host, _, port = rest.rpartition(":")
        if host and port.isdigit() and 0 < int(port) < 65536:
            return value
    return None


def _bad(path: str, key: str, value: Any, allowed: str) -> CniError:
    return CniError(
        Code.INVALID_CONFIG,
        f"invalid node config {path}: {key}={value!r}: {allowed}",
    )


def load(path: str | None = None, *, environ: Mapping[str, str] | None = None) -> NodeConfig:
    """The node config at `path`, else at the path `environ` (default: this process's) names
    (`nodepath.node_config_path`); defaults when there is no file."""
    path = nodepath.node_config_path(path, environ)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return NodeConfig()
    except OSError as exc:
        raise CniError(Code.IO_FAILURE, f"cannot read node config {path}: {exc.strerror}") from None
    from tenantnet.plugin import plainyaml

    # A flat config (the lab's, the DaemonSet's) is read without PyYAML (≈ 20 ms to import);
    # anything else is PyYAML's, which reads it as before (and words its errors).
    data = plainyaml.read(text)
    if data is None:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CniError(Code.INVALID_CONFIG,
                           f"invalid node config {path}: not valid YAML: {exc}") from None
    if data is None:
        return replace(NodeConfig(), source=path)
    if not isinstance(data, dict):
        raise CniError(Code.INVALID_CONFIG, f"invalid node config {path}: must be a YAML mapping")
    values: dict[str, Any] = {"source": path}
    for key, value in data.items():
        if key not in _KEYS:
            raise CniError(
                Code.INVALID_CONFIG,
                f"invalid node config {path}: unknown key {key!r}; known keys: {', '.join(_KEYS)}",
            )
        attr, typ, allowed = _KEYS[key]
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool):
            raise _bad(path, key, value, allowed)
        # `typ` is a variable, so mypy leaves `value` an `object` after that check: each branch
        # casts it to the type _KEYS gives its key, which the check just above established.
        if key == "ovsdb":
            value = normalise_ovsdb_endpoint(cast(str, value))
            if value is None:
                raise _bad(path, key, data[key], allowed)
        elif key in ("vfControl", "rdmaControl") and not (
                value == "netlink" or re.fullmatch(_VF_CONTROL, cast(str, value))):
            raise _bad(path, key, value, allowed)
        elif key in ("vfControlModules", "rdmaControlModules"):
            modules = cast("list[object]", value)
            if not all(isinstance(v, str) and re.fullmatch(_MODULE, v) for v in modules):
                raise _bad(path, key, value, allowed)
            value = tuple(modules)
        elif key in _PATH_KEYS and plain_path_problem(value):
            raise _bad(path, key, value, allowed)
        elif key in _PATH_LIST_KEYS:
            paths = cast("list[object]", value)
            if any(plain_path_problem(v) for v in paths):
                raise _bad(path, key, value, allowed)
            value = tuple(paths)
        elif key == "replaceDefaults":
            lists = cast("list[object]", value)
            if not all(k in _PATH_LIST_KEYS for k in lists):
                raise _bad(path, key, value, allowed)
            missing = [k for k in lists if k not in data]
            if missing:
                raise _bad(path, key, value, f"names {missing[0]}, which this config does not give; "
                                             f"give {missing[0]} in full, or leave it out here")
            value = tuple(cast("list[str]", lists))
        elif key == "gpuResourceNames":
            names = cast("list[object]", value)
            if not names or not all(isinstance(n, str) and re.fullmatch(_RESOURCE, n) for n in names):
                raise _bad(path, key, value, allowed)
            value = tuple(names)
        elif key == "gpuMap":
            pairs = cast("dict[object, object]", value)
            if not all(isinstance(k, str) and isinstance(v, str) and normalise_pci_address(v) for k, v in
                       pairs.items()):
                raise _bad(path, key, value, allowed)
            value = {str(k): str(normalise_pci_address(cast(str, v))) for k, v in pairs.items()}
        elif key == "ovsdbEndpoints":
            given = cast("list[object]", value)
            endpoints = [normalise_ovsdb_endpoint(v) if isinstance(v, str) else None for v in given]
            if None in endpoints:
                raise _bad(path, key, value, allowed)
            value = tuple(e for e in endpoints if e)
        elif key == "offloadPreconditions":
            chosen = cast("dict[object, object]", value)
            known = set(chosen) <= set(PRECONDITIONS)
            if not known or not all(v in ("warn", "refuse") for v in chosen.values()):
                raise _bad(path, key, value, allowed)
            # Just checked: the keys are PRECONDITIONS names, the values "warn" or "refuse".
            value = {**PRECONDITIONS, **cast("dict[str, str]", chosen)}
        elif key == "logLevel":
            try:
                level_number(cast(str, value))
            except KeyError:
                raise _bad(path, key, value, allowed) from None
        elif key == "ovsdbTimeout" and not 0.1 <= cast(float, value) <= 120:
            raise _bad(path, key, value, allowed)
        elif key == "etcdTimeout" and not 0.1 <= cast(float, value) <= 30:
            raise _bad(path, key, value, allowed)
        elif key == "etcdEndpoints":
            urls = cast("list[object]", value)
            if not urls or not all(isinstance(u, str) and re.fullmatch(_ETCD_URL, u) for u in urls):
                raise _bad(path, key, value, allowed)
            value = tuple(urls)
        elif key == "nodeName" and not re.fullmatch(_NODE_NAME, cast(str, value)):
            raise _bad(path, key, value, allowed)
        elif key == "nodeAddress":
            try:
                value = str(ipaddress.ip_address(cast(str, value)))
            except ValueError:
                raise _bad(path, key, value, allowed) from None
        elif key == "metricsPort" and not 0 <= cast(int, value) <= 65535:
            raise _bad(path, key, value, allowed)
        elif key == "metricsAddress":
            try:
                value = str(ipaddress.ip_address(cast(str, value)))
            except ValueError:
                raise _bad(path, key, value, allowed) from None
        elif key == "metricsOffloadInterval" and not 1 <= cast(float, value) <= 3600:
            raise _bad(path, key, value, allowed)
        elif key == "prewarmMaxPeers" and not 1 <= cast(int, value) <= 1024:
            raise _bad(path, key, value, allowed)
        elif key == "prewarmMaxIdleMs" and not 1000 <= cast(int, value) <= 3600000:
            raise _bad(path, key, value, allowed)
        elif key == "prewarmReconcileInterval" and not 1 <= cast(float, value) <= 3600:
            raise _bad(path, key, value, allowed)
        elif key == "prewarmBridges":
            names = cast("list[object]", value)
            if not all(isinstance(n, str) and re.fullmatch(_BRIDGE, n) for n in names):
                raise _bad(path, key, value, allowed)
            value = tuple(cast("list[str]", names))
        elif key == "prewarmGrants":
            grants = cast("list[object]", value)
            if not all(g in PREWARM_GRANTS for g in grants):
                raise _bad(path, key, value, allowed)
            value = tuple(cast("list[str]", grants))
        elif key == "clusterPools":
            pools = _cluster_pools(cast("list[object]", value))
            if pools is None:
                raise _bad(path, key, value, allowed)
            value = pools
        elif key == "tenantSources":
            from tenantnet.plugin.tenants import parse_sources

            sources = parse_sources(value)
            if sources is None:
                raise _bad(path, key, value, allowed)
            value = sources
        elif key == "ovn":
            from tenantnet.plugin.overlay import parse_node_ovn

            value = parse_node_ovn(value, lambda k, v, allowed: _bad(path, k, v, allowed),
                                   normalise_ovsdb_endpoint)
        elif key == "etcdPrefix":
            prefix = cast(str, value)
            if not (prefix.startswith("/") and prefix.endswith("/")) or not prefix.isprintable():
                raise _bad(path, key, value, allowed)
        values[attr] = value
    replaced = values.pop("replace_defaults", ())
    for key, defaults in _PATH_LIST_DEFAULTS.items():
        attr = _KEYS[key][0]
        if attr in values and key not in replaced:
            values[attr] = tuple(dict.fromkeys((*defaults, *values[attr])))
    config = replace(NodeConfig(), **values)
    # Checked only when given: without it an omitted dataDir is refused per call (settings).
    if "ipam_data_dir" in values and not within(config.ipam_data_dir, config.ipam_data_dirs):
        raise _bad(path, "ipamDataDir", config.ipam_data_dir, _KEYS["ipamDataDir"][2] +
                   f" ({', '.join(config.ipam_data_dirs)})")
    if config.dra and not config.kubernetes:
        raise _bad(path, "dra", True, "true only with kubernetes: true (a claim's tenant and network "
                                      "come from the API)")
    # The shim reads agentSocket without YAML (nodepath): one reading for both, or none.
    seen, _ = nodepath.agent_socket_of(path)
    if values.get("agent_socket", DEFAULT_AGENT_SOCKET) != seen:
        raise CniError(Code.INVALID_CONFIG,
                       f"invalid node config {path}: agentSocket is {values.get('agent_socket')!r} to a "
                       f"YAML reader but {seen!r} to the tenantnet shim; write it as one plain top-level "
                       "line `agentSocket: /path`")
    return config
