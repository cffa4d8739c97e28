"""What the Kubernetes lab's components are told: where each part of a lab lives, the names
and addresses a lab takes on the host (`NodeNet`), and the configurations written for
containerd, the kubelet, Multus and the cluster network, and Multus's RBAC. Pure text and
paths, no process started: `tenantnet/lab/kube.py` brings the lab up with them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from tenantnet.lab import kubeimages

META = "kube.json"
SERVICE_RANGE = "172.30.254.0/24"  # only allocated, never routed (no kube-proxy)
SLOTS = 64  # labs side by side: node /30s in 172.30.255.0/24, pod /24s 172.30.0-63.0
KUBELET_PORT = 10250  # on the lab's own node address
# CNI network names (libcni's result cache, /var/lib/cni/results, names its entries after them).
MULTUS_NETWORK, POD_NETWORK = "tenantnet-lab-multus", "tenantnet-lab-pods"
GO_PLUGINS = Path("/usr/lib/cni")


@dataclass(frozen=True)
class NodeNet:
    """What a lab names on the host, distinct per lab dir so that labs can run side by side:
    its links, cgroup, node address (a /30 on its veth pair, never routed off the machine)
    and pod subnet (on its bridge)."""

    tag: str  # from the lab dir's path
    slot: int  # 0..SLOTS-1: which addresses

    @property
    def link(self) -> str:
        return f"tk{self.tag}n"

    @property
    def peer(self) -> str:
        return f"tk{self.tag}p"

    @property
    def bridge(self) -> str:
        return f"tk{self.tag}b"

    @property
    def cgroup(self) -> str:
        return f"tenantnet-kube-{self.tag}"

    @property
    def node_ip(self) -> str:
        return f"172.30.255.{4 * self.slot + 1}"

    @property
    def pod_subnet(self) -> str:
        return f"172.30.{self.slot}.0/24"


def tag(root: str) -> str:
    return hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:5]


class LabPaths:
    """Where each part of a lab lives under its directory."""

    def __init__(self, root: str) -> None:
        r = Path(os.path.abspath(root))
        self.root, self.meta = r, r / META
        self.ovs, self.pki, self.logs = r / "ovs", r / "pki", r / "logs"
        self.kubeconfigs = r / "kubeconfig"
        self.admin_kubeconfig = self.kubeconfigs / "admin.kubeconfig"
        self.etcd = r / "etcd"
        self.containerd = r / "containerd"
        self.containerd_sock = self.containerd / "containerd.sock"
        self.kubelet = r / "kubelet"
        self.cni_bin, self.cni_conf, self.cni_state = (r / "cni" / d for d in ("bin", "net.d", "state"))
        self.images = r / "images.tar"


def write_cni(p: LabPaths, net: NodeNet, multus: Path, multus_kc: str, venv_bin: Path) -> None:
    """The lab's CNI bin dir (Multus, Debian's plugins, the venv's tenantnet) and Multus thin's
    config, delegating the cluster network to bridge + host-local."""
    links = {"multus": multus}
    links.update({plugin.name: plugin for plugin in GO_PLUGINS.iterdir()})
    # The venv's executables (a symlink: the trampoline finds its -shim beside its real path).
    links.update({name: venv_bin / name for name in ("tenantnet", "tenantnet-ipam")})
    for name, target in links.items():
        (p.cni_bin / name).symlink_to(target)
    cluster = {"cniVersion": "1.0.0", "name": POD_NETWORK, "plugins": [
        {"type": "bridge", "bridge": net.bridge, "isGateway": True, "isDefaultGateway": True, "ipMasq": False,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": net.pod_subnet}]],
                  "dataDir": str(p.cni_state / "host-local")}}]}
    conf = {"cniVersion": "1.0.0", "name": MULTUS_NETWORK, "type": "multus",
            "kubeconfig": multus_kc, "cniDir": str(p.cni_state / "multus"), "binDir": str(p.cni_bin),
            "logFile": str(p.logs / "multus.log"), "logLevel": "verbose", "delegates": [cluster]}
    (p.cni_conf / "00-multus.conf").write_text(json.dumps(conf, indent=2))


def write_containerd_config(p: LabPaths) -> None:
    c = p.containerd
    for d in ("root", "state", "cdi", "nri", "opt", "tmp", "s"):
        (c / d).mkdir(parents=True, exist_ok=True)
    q = json.dumps  # TOML basic strings accept JSON string syntax for these paths
    (c / "config.toml").write_text(f"""\
# written by `tenantnetctl lab up --kubernetes`: every path of this containerd is in the lab
version = 3
root = {q(str(c / 'root'))}
state = {q(str(c / 'state'))}
temp = {q(str(c / 'tmp'))}
imports = []
[grpc]
  address = {q(str(p.containerd_sock))}
[ttrpc]
  address = {q(str(p.containerd_sock) + '.ttrpc')}
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = {q(kubeimages.PAUSE_IMAGE)}
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = [{q(str(c / 'cdi'))}]
  # network namespaces of pods under the state dir, not /var/run/netns
  netns_mounts_under_state_dir = true
  # never below containerd's own oom_score_adj: lowering it needs CAP_SYS_RESOURCE, which a
  # root without it (a container, this lab's CI) lacks; runc's init then dies at start
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = 'runc'
  Root = {q(str(c / 'runc'))}
  SystemdCgroup = false
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [{q(str(p.cni_bin))}]
  conf_dir = {q(str(p.cni_conf))}
  max_conf_num = 1
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
[plugins.'io.containerd.internal.v1.opt']
  path = {q(str(c / 'opt'))}
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = {q(str(c / 'nri' / 'nri.sock'))}
  plugin_path = {q(str(c / 'nri' / 'plugins'))}
  plugin_config_path = {q(str(c / 'nri' / 'conf.d'))}
  # tenantnet moves a pod's DRA devices at RunPodSandbox (docs/dra.md): 8 VFs in parallel
  # take ~0.5 s here, more on a busy machine; past the default 2 s NRI drops the plugin and
  # the pod starts without them (caught up only at the next Synchronize).
  plugin_request_timeout = '15s'
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = {q(str(c / 's'))}
""")


def kubelet_config(p: LabPaths, net: NodeNet, ca: str, cert: str, key: str, healthz: int) -> str:
    return f"""\
# written by `tenantnetctl lab up --kubernetes` (docs/kubernetes.md, "The lab's Kubernetes node")
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# a cgroup v1 host: kubelet 1.36 refuses it unless told; cgroupfs, a cgroup root of the lab's own
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{net.cgroup}
failSwapOn: false
address: {net.node_ip}
port: {KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://{p.containerd_sock}
podLogsDir: {p.root}/pod-logs
volumePluginDir: {p.kubelet}/volume-plugins
resolvConf: ""
# the lab's images are imported, never pulled: no image GC, no eviction on a full disk
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
serializeImagePulls: false
registerNode: true
"""


MULTUS_RBAC = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tenantnet-lab-multus}
rules:
- apiGroups: ["k8s.cni.cncf.io"]
  resources: ["*"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods", "pods/status"]
  verbs: ["get", "list", "watch", "update", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tenantnet-lab-multus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tenantnet-lab-multus}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: tenantnet-lab-multus}
"""


# ------------------------------------------------------------------------------ down
