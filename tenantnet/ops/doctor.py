"""`tenantnetctl doctor`: what this node lacks for tenantnet, one line per check, each FAIL
with its fix.

A check is a `Check`: PASS, FAIL (the node is not ready: `fix` says the command or node-config
key that mends it), WARN (works, but not as it should: no agent, one etcd member down) or
SKIP (cannot be told here, and `detail` says why — never a silent pass). The checks come in
families, one thread each, run at once and joined against a deadline: a probe that hangs
(an OVSDB that accepts and never answers, a kubectl waiting on a dead API server) becomes a
FAIL naming the family and its bound instead of a doctor that never returns. Each probe has
its own time-out besides (`--timeout`).

What is checked, and why each matters (docs/install.md, "tenantnetctl doctor", says the
same for operators):

- the node config loads (and its tenancy policy): everything else reads it;
- the kubelet's CNI dirs exist, and the runtime's CNI config (the first file by name in the
  conf dir, as libcni picks it) is Multus's: `type: multus` (thin) or `multus-shim` (thick);
  Multus's binary answers `--version`; thin: its kubeconfig exists, thick: its daemon socket
  answers;
- `tenantnet` and `tenantnet-ipam` are in the CNI bin dir and answer the CNI `VERSION` call;
- the agent answers on its socket (docs/agent.md STATUS) and is served by root;
- OVSDB answers, every bridge the node config or the tenancy policy declares exists, and
  `other_config:hw-offload` is true where a network is declared ovs-offload;
- every PF the tenancy policy declares is in sysfs with VFs (`sriov_numvfs` > 0), its eswitch
  in switchdev mode where the network is ovs-offload;
- the kubelet's pod-resources socket answers where rails may be aligned, and a device
  plugin has registered (where PFs are declared: Multus takes VFs' deviceIDs from it);
- every etcd endpoint answers when `etcdEndpoints` are set;
- with `ovn:` (overlay networks, docs/overlay.md): the OVN northbound database answers; per
  rail, its integration bridge exists in the rail's OVSDB, the local Open_vSwitch row
  configures an ovn-controller for the rail's chassis on that bridge (`ovn-bridge[-<chassis>]`,
  `ovn-encap-ip[-<chassis>]`, ovn-controller(8)) with an encap IP that is an address of this
  node and no other rail's, the declared `underlayMtu` fits the `underlayBridge`'s interfaces,
  and `userspaceDatapath` matches the integration bridge's datapath_type;
- the device-info directory is a directory (not a symlink);
- with a kubeconfig: the NetworkAttachmentDefinition CRD and tenantnet's TenantNetwork CRD are
  established, and the agent's and renderer's ServiceAccounts may do what they must
  (SelfSubjectAccessReviews, as them);
- with `dra: true` (docs/dra.md): the kubelet's `plugins_registry` is there under
  `kubeletRootDir` (in a running kubelet's root dir), the agent is the driver and the kubelet
  registered it (else the kubelet's refusal), containerd's NRI socket is there and the agent is
  connected to it, `cdiDir` takes a new file, and (with a kubeconfig) the agent's
  ServiceAccount may write ResourceSlices, read claims and write their status and devices.

The agent's STATUS is asked once and shared by the agent and DRA families.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import re
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from tenantnet.ops import kubeclient
from tenantnet.ops.kubeclient import KubeUnavailable, read_bounded, run_bounded

DEFAULT_CNI_CONF_DIR = "/etc/cni/net.d"
DEFAULT_CNI_BIN_DIR = "/opt/cni/bin"
DEFAULT_TIMEOUT = 5.0
# The ServiceAccounts packaging/rbac.yaml binds: the DaemonSet's agent and the renderer's.
DEFAULT_SERVICE_ACCOUNT = "kube-system/tenantnet"
DEFAULT_RENDERER_SERVICE_ACCOUNT = "kube-system/tenantnet-renderer"
MULTUS_SOCKET_DIR = "/run/multus/"  # multus-shim's daemonSocketDir default
MAX_CONF_FILES = 256  # a conf dir with more is read this far (libcni would pick among these)
NAD_CRD = "network-attachment-definitions.k8s.cni.cncf.io"
TENANTNET_CRD = "tenantnetworks.tenantnet.io"


class Status(enum.StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    WARN = "WARN"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Check:
    """One line of the report. `detail` says what was found (for SKIP: why it could not be
    told); `fix`, for FAIL and WARN, the one sentence that mends it."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {**asdict(self), "status": self.status.value}


def passed(name: str, detail: str) -> Check:
    return Check(name, Status.PASS, detail)


def failed(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.FAIL, detail, fix)


def warned(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.WARN, detail, fix)


def skipped(name: str, reason: str) -> Check:
    return Check(name, Status.SKIP, reason)


@dataclass(frozen=True)
class Access:
    """One question of a SelfSubjectAccessReview: may the ServiceAccount `verb` this?"""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    name: str = ""

    @property
    def kind(self) -> str:
        """As kubectl's --resource writes it: resource[.group][/subresource]."""
        text = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{text}/{self.subresource}" if self.subresource else text

    def __str__(self) -> str:
        return f"{self.verb} {self.kind}" + (f" named {self.name}" if self.name else "")

    def review(self) -> dict[str, Any]:
        attrs = {"verb": self.verb, "group": self.group, "resource": self.resource}
        attrs |= {"subresource": self.subresource} if self.subresource else {}
        attrs |= {"name": self.name} if self.name else {}
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}


# What the DRA driver does with the API (tenantnet/kube/slices.py, dra.py; packaging/rbac.yaml):
# its node's ResourceSlices, the claims it prepares, their status — and, since Kubernetes 1.36,
# the claim's status.devices entries of its own driver, on claims allocated on its own node.
DRA_ACCESS = (Access("list", "resource.k8s.io", "resourceslices"),
              Access("create", "resource.k8s.io", "resourceslices"),
              Access("delete", "resource.k8s.io", "resourceslices"),
              Access("get", "resource.k8s.io", "resourceclaims"),
              Access("patch", "resource.k8s.io", "resourceclaims", "status"),
              Access("associated-node:patch", "resource.k8s.io", "resourceclaims", "driver", "tenantnet.io"))
# containerd's NRI section, for the fix lines
NRI_SECTION = "[plugins.'io.containerd.nri.v1.nri']"


@dataclass
class Options:
    node_config: str | None = None
    kubeconfig: str | None = None
    cni_conf_dir: str = DEFAULT_CNI_CONF_DIR
    cni_bin_dir: str = DEFAULT_CNI_BIN_DIR
    timeout: float = DEFAULT_TIMEOUT
    agent_service_account: str = DEFAULT_SERVICE_ACCOUNT
    renderer_service_account: str = DEFAULT_RENDERER_SERVICE_ACCOUNT
    kube_client: str = "auto"  # auto (kubectl when on PATH) | kubectl | builtin
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))


# ---- small bounded probes --------------------------------------------------------------------

def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _directory(name: str, path: str, fix: str) -> Check:
    """PASS when `path` is a directory itself (a symlink is refused: the admin's directories
    are named by their real path, docs/security.md)."""
    st = _lstat(path)
    if st is None:
        return failed(name, f"{path} does not exist", fix)
    if stat.S_ISLNK(st.st_mode):
        return failed(name, f"{path} is a symlink (to {os.readlink(path)}), not a directory",
                      f"name the real directory instead of the link ({os.path.realpath(path)})")
    if not stat.S_ISDIR(st.st_mode):
        return failed(name, f"{path} exists but is not a directory", fix)
    return passed(name, f"{path} is a directory")


def _not_a_regular_file(path: str) -> str | None:
    """Why `path` (followed if a symlink) is neither absent nor a regular file, or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return None if stat.S_ISREG(st.st_mode) else f"{path} is not a regular file"


def _socket_answers(path: str, timeout: float) -> str | None:
    """None when a unix socket at `path` accepts a connection within `timeout`, else why not."""
    st = _lstat(path)
    if st is None:
        return f"nothing at {path}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except TimeoutError:
        return f"{path} did not accept a connection within {timeout:g}s"
    except OSError as exc:
        return f"cannot connect to {path}: {exc.strerror or exc}"
    finally:
        sock.close()
    return None


def _read_json(path: str) -> Any:
    """A small JSON file of the admin's (a CNI config): symlinks resolved as the runtime would,
    then opened without following one, bounded."""
    return json.loads(read_bounded(os.path.realpath(path), 1 << 20))


# ---- the doctor ------------------------------------------------------------------------------

class Doctor:
    """The checks of one node. `families()` lists them; `run()` runs them, bounded."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.node: Any = None  # NodeConfig once loaded
        self.policy: Any = None  # TenantPolicy, None without one
        self.node_problem = ""  # why the node config is unusable
        self.policy_problem = ""  # why the tenancy policy is (its networks are then unknown)
        self._kube: kubeclient.KubeApi | None = None
        self._kube_problem = ""
        # The agent's STATUS, asked once for the agent and DRA families (whichever comes first).
        self._status_lock = threading.Lock()
        self._status: tuple[int, dict[str, Any]] | Exception | None = None

    # -- the node config: first, alone; everything else reads it ---------------------------
    def load_node(self) -> list[Check]:
        from cni.errors import CniError, Code
        from tenantnet.plugin import nodeconfig, nodepath, tenancy

        path = nodepath.node_config_path(self.opts.node_config, self.opts.environ)
        fix = f"correct {path} (keys: README, \"Node configuration\")"
        # The loader opens it plainly: a FIFO there would block it, so only a regular file
        # (or none) gets that far.
        problem = _not_a_regular_file(path)
        if problem:
            self.node_problem = f"the node config did not load ({problem})"
            return [failed("node config", problem, fix)]
        try:
            self.node = nodeconfig.load(path, environ=self.opts.environ)
        except CniError as exc:
            self.node_problem = f"the node config did not load ({exc.msg})"
            return [failed("node config", exc.msg, fix)]
        source = self.node.source if os.path.exists(path) else f"{path} absent: the defaults"
        checks = [passed("node config", f"loaded {source}")]
        problem = _not_a_regular_file(self.node.tenancy_file) if self.node.tenancy_file else None
        try:
            if problem:
                raise CniError(Code.IO_FAILURE, f"tenancyFile {problem}")
            self.policy = tenancy.load(self.node)
        except CniError as exc:
            self.policy_problem = f"the tenancy policy did not load ({exc.msg})"
            return [*checks, failed("tenancy policy", exc.msg,
                                    f"correct tenancy/tenancyFile in {path} (docs/tenancy.md)")]
        if self.policy is None:
            checks.append(passed("tenancy policy", "none: every pod may use every network"))
        else:
            checks.append(passed("tenancy policy", f"{len(self.policy.tenants)} tenants, "
                                                   f"{len(self.policy.networks)} declared networks "
                                                   f"from {self.policy.source}"))
        return checks

    def families(self) -> list[tuple[str, Callable[[], list[Check]]]]:
        return [("CNI dirs", self.check_cni_dirs), ("Multus", self.check_multus),
                ("tenantnet executables", self.check_executables), ("agent", self.check_agent),
                ("OVS", self.check_ovs), ("SR-IOV", self.check_sriov),
                ("pod-resources", self.check_pod_resources), ("device plugin", self.check_device_plugin),
                ("etcd", self.check_etcd), ("OVN", self.check_ovn),
                ("device-info dir", self.check_device_info_dir), ("Kubernetes API", self.check_kubernetes),
                ("DRA", self.check_dra)]

    def run(self) -> list[Check]:
        checks = self.load_node()
        families = self.families()
        results: list[list[Check] | None] = [None] * len(families)

        def work(i: int, check: Callable[[], list[Check]]) -> None:
            try:
                results[i] = check()
            except Exception as exc:  # a check's own bug: its family's FAIL, not a traceback
                results[i] = [failed(families[i][0], f"the check itself failed: {type(exc).__name__}: {exc}",
                                     "report this as a tenantnet bug, with this line")]

        # Daemon threads: one that hangs past its bound is left behind, and exiting does not wait.
        threads = [threading.Thread(target=work, args=(i, fn), daemon=True, name=f"doctor-{name}")
                   for i, (name, fn) in enumerate(families)]
        for t in threads:
            t.start()
        bound = self.family_bound()
        deadline = time.monotonic() + bound
        for (name, _), t, i in zip(families, threads, range(len(families)), strict=True):
            t.join(max(deadline - time.monotonic(), 0))
            got = results[i]
            if got is None:
                checks.append(failed(name, f"did not finish within {bound:g}s (its probes hang)",
                                     f"run `tenantnetctl doctor --timeout {self.opts.timeout:g}` again; "
                                     "if it recurs, the service this family probes is wedged"))
            else:
                checks.extend(got)
        return checks

    def family_bound(self) -> float:
        """How long every family together may take: a family makes a few probes in turn, each
        bounded by --timeout (a kubectl run by --timeout + 2)."""
        return 4 * self.opts.timeout + 10

    # -- CNI dirs and Multus --------------------------------------------------------------
    def check_cni_dirs(self) -> list[Check]:
        o = self.opts
        return [
            _directory("CNI conf dir", o.cni_conf_dir,
                       f"give the kubelet's CNI config directory with --cni-conf-dir (the runtime's "
                       f"conf_dir; default {DEFAULT_CNI_CONF_DIR})"),
            _directory("CNI bin dir", o.cni_bin_dir,
                       f"give the runtime's CNI binary directory with --cni-bin-dir (default "
                       f"{DEFAULT_CNI_BIN_DIR}); the installer never creates it"),
        ]

    def cni_configs(self) -> list[tuple[str, str]]:
        """(file name, plugin type) of each CNI config in the conf dir, by name (libcni's order);
        type "" when the file is unreadable or not a CNI config."""
        try:
            names = sorted(n for n in os.listdir(self.opts.cni_conf_dir)
                           if n.endswith((".conf", ".conflist", ".json")))[:MAX_CONF_FILES]
        except OSError:
            return []
        out = []
        for name in names:
            try:
                doc = _read_json(os.path.join(self.opts.cni_conf_dir, name))
            except (OSError, ValueError):
                out.append((name, ""))
                continue
            plugins = doc.get("plugins") if isinstance(doc, dict) else None
            first = plugins[0] if isinstance(plugins, list) and plugins else doc
            kind = first.get("type") if isinstance(first, dict) else None
            out.append((name, kind if isinstance(kind, str) else ""))
        return out

    def check_multus(self) -> list[Check]:
        o = self.opts
        if not os.path.isdir(o.cni_conf_dir):
            return [skipped("Multus config", f"no CNI conf dir {o.cni_conf_dir}")]
        configs = self.cni_configs()
        multus = [(n, t) for n, t in configs if t in ("multus", "multus-shim")]
        install = ("install Multus (thin: its DaemonSet writes 00-multus.conf; thick: "
                   "multus-daemonset-thick.yml) so that the kubelet's CNI config is Multus's")
        checks: list[Check] = []
        if not multus:
            first = f"the runtime uses {configs[0][0]} (type {configs[0][1] or '?'})" if configs else \
                "no CNI config at all"
            checks.append(failed("Multus config", f"no Multus config in {o.cni_conf_dir}: {first}", install))
            flavour = ""
        else:
            name, kind = multus[0]
            flavour = "thin" if kind == "multus" else "thick"
            path = os.path.join(o.cni_conf_dir, name)
            if configs[0][0] != name:
                checks.append(failed(
                    "Multus config", f"{path} ({flavour}) is there, but the runtime uses {configs[0][0]}, "
                                     "the first CNI config by name",
                    f"rename Multus's config to sort first (e.g. 00-multus.conf) or remove {configs[0][0]}"))
            else:
                checks.append(passed("Multus config", f"{flavour} (type {kind}) in {path}, the runtime's "
                                                      "CNI config"))
            checks += self._multus_flavour(path, flavour)
        checks.append(self._multus_version(flavour))
        return checks

    def _multus_flavour(self, path: str, flavour: str) -> list[Check]:
        """Where thin Multus's kubeconfig lives (and that it is there); where thick Multus's
        daemon listens (and that it answers)."""
        try:
            conf = _read_json(path)
        except (OSError, ValueError) as exc:
            return [failed("Multus config", f"{path} is unreadable: {exc}", f"rewrite {path} as valid JSON")]
        conf = conf if isinstance(conf, dict) else {}
        if flavour == "thin":
            kubeconfig = conf.get("kubeconfig")
            if not isinstance(kubeconfig, str) or not kubeconfig:
                return [warned("Multus kubeconfig", f"{path} names no kubeconfig: Multus reads NADs only "
                                                    "if it runs in a pod with a ServiceAccount",
                               f"set \"kubeconfig\" in {path} (the thin DaemonSet writes "
                               "/etc/cni/net.d/multus.d/multus.kubeconfig)")]
            if not os.path.isfile(kubeconfig):
                return [failed("Multus kubeconfig", f"{path} names {kubeconfig}, which does not exist",
                               f"restart Multus's DaemonSet pod on this node (it writes {kubeconfig})")]
            return [passed("Multus kubeconfig", f"{kubeconfig} (named by {path})")]
        socket_dir = conf.get("daemonSocketDir") if isinstance(conf.get("daemonSocketDir"), str) else None
        sock = os.path.join(socket_dir or MULTUS_SOCKET_DIR, "multus.sock")
        problem = _socket_answers(sock, self.opts.timeout)
        daemon_conf = os.path.join(self.opts.cni_conf_dir, "multus.d", "daemon-config.json")
        where = f"; daemon config {daemon_conf}" if os.path.isfile(daemon_conf) else \
            "; daemon config in the multus-daemon pod (/etc/cni/net.d/multus.d/daemon-config.json)"
        if problem:
            return [failed("Multus daemon", f"{problem}: multus-shim cannot reach multus-daemon{where}",
                           "start the multus-daemon pod on this node (kubectl -n kube-system get pods -l "
                           "app=multus), with socketDir matching the shim's daemonSocketDir")]
        return [passed("Multus daemon", f"answering on {sock}{where}")]

    def _multus_version(self, flavour: str) -> Check:
        names = {"thin": ["multus"], "thick": ["multus-shim"]}.get(flavour, ["multus", "multus-shim"])
        binary = next((os.path.join(self.opts.cni_bin_dir, n) for n in names
                       if os.path.isfile(os.path.join(self.opts.cni_bin_dir, n))), None)
        if binary is None:
            wanted = " or ".join(os.path.join(self.opts.cni_bin_dir, n) for n in names)
            if not flavour:
                return skipped("Multus version", f"no Multus config and no binary ({wanted})")
            return failed("Multus version", f"the {flavour} config is there but {wanted} is missing",
                          "restart Multus's DaemonSet pod on this node (its init step copies the binary)")
        code, out, err = run_bounded([binary, "--version"], self.opts.timeout, env={"PATH": "/usr/bin:/bin"},
                                     cap=4096)
        if code is None:
            return failed("Multus version",
                          f"{binary} --version did not answer within {self.opts.timeout:g}s",
                          f"replace {binary} with Multus 4.x's binary")
        text = (out or err).decode(errors="replace").strip()
        if code != 0 or "version" not in text:
            return failed("Multus version", f"{binary} --version failed (exit {code}): {text[:200]}",
                          f"replace {binary} with Multus 4.x's binary")
        kind = f" ({flavour})" if flavour else ""
        # "multus: version:v4.3.0(clean,released), commit:…, date:…": the version is what matters.
        m = re.search(r"version:\s*([^\s,(]+(?:\([^)]*\))?)", text)
        return passed("Multus version", f"{m[1] if m else text.splitlines()[0][:200]}, {binary}{kind}")

    # -- tenantnet's own executables ------------------------------------------------------
    def check_executables(self) -> list[Check]:
        if not os.path.isdir(self.opts.cni_bin_dir):
            return [skipped("tenantnet executables", f"no CNI bin dir {self.opts.cni_bin_dir}")]
        return [self._executable(name) for name in ("tenantnet", "tenantnet-ipam")]

    def _executable(self, name: str) -> Check:
        path = os.path.join(self.opts.cni_bin_dir, name)
        install = (f"tenantnetctl install --cni-bin-dir {self.opts.cni_bin_dir} (the DaemonSet's init "
                   "container)")
        if not os.path.isfile(path):
            return failed(name, f"{path} is missing", install)
        if not os.access(path, os.X_OK):
            return failed(name, f"{path} is not executable", install)
        env = {"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin"}
        if self.opts.node_config:
            env["TENANTNET_CONFIG"] = self.opts.node_config
        code, out, err = run_bounded([path], self.opts.timeout * 2, stdin=b'{"cniVersion":"1.0.0"}', env=env,
                                     cap=16384)
        if code is None:
            return failed(name, f"{path} did not answer VERSION within {self.opts.timeout * 2:g}s", install)
        try:
            versions = json.loads(out).get("supportedVersions", [])
        except (ValueError, AttributeError):
            versions = []
        if code != 0 or "1.0.0" not in versions:
            said = (out or err).decode(errors="replace").strip()[:200]
            return failed(name, f"{path} answered VERSION with exit {code}: {said or 'nothing'}", install)
        return passed(name, f"{path} answers VERSION ({', '.join(versions)})")

    # -- the agent ------------------------------------------------------------------------
    def check_agent(self) -> list[Check]:
        if self.node is None:
            return [skipped("agent", self.node_problem)]
        from tenantnet.entry import shim
        from tenantnet.entry.agent import DEFAULT_WEDGED_AFTER

        path = self.node.agent_socket
        run = "run the DaemonSet's agent container (tenantnetctl agent run)"
        if _lstat(path) is None:
            return [warned("agent", f"no agent socket at {path}: plugin calls run in-process (slower)", run)]
        try:
            uid, report = self.agent_report()
        except (shim.AgentUnavailable, shim.AgentFailed) as exc:
            return [failed("agent", str(exc),
                           f"restart the agent ({run}); `tenantnetctl agent status` says more")]
        if uid != 0:
            return [failed("agent", f"{path} is served by uid {uid}, not root: the plugin sends it nothing",
                           f"stop what serves {path} and {run} (as root)")]
        if report.get("oldestRunningS", 0) > DEFAULT_WEDGED_AFTER:
            return [failed("agent", f"wedged: a worker has been busy for {report['oldestRunningS']:.0f}s",
                           "restart the agent pod (its liveness probe, `agent status`, should have)")]
        return [passed("agent", f"pid {report.get('pid')} (root) answers on {path}, "
                                f"up {report.get('uptimeS')}s, served {report.get('served')}")]

    def agent_report(self) -> tuple[int, dict[str, Any]]:
        """`agent_status` of the node config's socket, asked once (the other family waits for
        it, within the same probe's time-out)."""
        with self._status_lock:
            if self._status is None:
                try:
                    self._status = agent_status(self.node.agent_socket, self.opts.timeout)
                except Exception as exc:  # kept, raised again for each family that asks
                    self._status = exc
            if isinstance(self._status, Exception):
                raise self._status
            return self._status

    # -- OVS ------------------------------------------------------------------------------
    def declared_bridges(self) -> dict[tuple[str, str], list[str]]:
        """(OVSDB endpoint, bridge) → who declares it (tenancy networks, prewarmBridges)."""
        out: dict[tuple[str, str], list[str]] = {}
        for net, decl in (self.policy.networks.items() if self.policy else ()):
            if decl.bridge:
                out.setdefault((decl.ovsdb or self.node.ovsdb, decl.bridge), []).append(f"network {net}")
        for bridge in self.node.prewarm_bridges:
            out.setdefault((self.node.ovsdb, bridge), []).append("prewarmBridges")
        return out

    def check_ovs(self) -> list[Check]:
        if self.node is None:
            return [skipped("OVSDB", self.node_problem)]
        from tenantnet.plugin import nodeconfig
        from tenantnet.plugin.system import ovsdb

        bridges = self.declared_bridges()
        offload = [net for net, d in (self.policy.networks.items() if self.policy else ())
                   if "ovs-offload" in d.modes()]
        endpoints = list(dict.fromkeys([self.node.ovsdb, *(e for e, _ in bridges)]))
        checks: list[Check] = []
        for endpoint in endpoints:
            used = endpoint != self.node.ovsdb or bridges or offload
            try:
                ovsdb.probe(endpoint, timeout=self.opts.timeout, timeout_source="doctor --timeout")
            except ovsdb.OvsdbUnavailable as exc:
                fix = (f"start Open vSwitch (ovsdb-server) or set the node config's ovsdb to its socket "
                       f"(now {self.node.ovsdb})")
                checks.append(failed(f"OVSDB {endpoint}", str(exc), fix) if used else
                              warned(f"OVSDB {endpoint}", f"{exc} (no bridge is declared, so only "
                                                          "NADs of mode ovs need it)", fix))
                checks += [skipped(f"bridge {b}", f"OVSDB {e} does not answer")
                           for e, b in bridges if e == endpoint]
                continue
            checks.append(passed(f"OVSDB {endpoint}", "answers (Open_vSwitch database)"))
            db = ovsdb.Ovsdb(endpoint, self.opts.timeout, timeout_source="doctor --timeout")
            db_option = "" if endpoint == nodeconfig.DEFAULT_OVSDB else f" --db={endpoint}"
            try:
                for (e, bridge), who in bridges.items():
                    if e != endpoint:
                        continue
                    name = f"bridge {bridge}"
                    if db.bridge_exists(bridge):
                        checks.append(passed(name, f"exists on {endpoint} ({', '.join(who)})"))
                    else:
                        checks.append(failed(name, f"bridge {bridge}, declared by {', '.join(who)}, does not "
                                                   f"exist on {endpoint}",
                                             f"ovs-vsctl{db_option} add-br {bridge}"))
                if offload and endpoint == self.node.ovsdb:
                    value = db.other_config().get("hw-offload")
                    nets = ", ".join(offload)
                    if value == "true":
                        checks.append(passed("OVS hw-offload",
                                             f"other_config:hw-offload=true (ovs-offload: {nets})"))
                    else:
                        checks.append(failed(
                            "OVS hw-offload",
                            f"other_config:hw-offload is {value or 'unset'}, so no flow of {nets} "
                            "(ovs-offload) is offloaded",
                            f"ovs-vsctl{db_option} set Open_vSwitch . other_config:hw-offload=true, then "
                            "restart ovs-vswitchd"))
            except (ovsdb.OvsdbUnavailable, ovsdb.OvsdbFailure) as exc:
                checks.append(failed(f"OVSDB {endpoint}", f"answered list_dbs, then: {exc}",
                                     "restart ovsdb-server; check its log"))
            finally:
                db.close()
        if self.policy_problem:
            checks.append(skipped("tenancy bridges", self.policy_problem))
        elif not bridges:
            checks.append(skipped("OVS bridges", "no bridge declared (tenancy networks, prewarmBridges)"))
        return checks

    # -- SR-IOV ---------------------------------------------------------------------------
    def check_sriov(self) -> list[Check]:
        if self.node is None or self.policy_problem:
            return [skipped("SR-IOV", self.node_problem or self.policy_problem)]
        pfs: dict[str, list[str]] = {}
        offload: set[str] = set()
        for net, decl in (self.policy.networks.items() if self.policy else ()):
            for pf in decl.pfs:
                pfs.setdefault(pf, []).append(net)
                if "ovs-offload" in decl.modes():
                    offload.add(pf)
        if not pfs:
            return [skipped("SR-IOV PFs", "the tenancy policy declares no PF (networks.*.pfs)")]
        from tenantnet.plugin.system.sysfs import Sysfs, SysfsError

        sysfs = Sysfs(self.node.sysfs_root)
        checks = []
        for pf, nets in pfs.items():
            name = f"PF {pf}"
            try:
                address = sysfs.pf_address(pf)
            except SysfsError as exc:
                checks.append(failed(name, f"{exc} (networks {', '.join(nets)})",
                                     f"correct networks.{nets[0]}.pfs in the tenancy policy, or load the "
                                     f"NIC's driver (ls {self.node.sysfs_root}/class/net)"))
                continue
            dev = os.path.join(self.node.sysfs_root, "bus", "pci", "devices", address)
            try:
                numvfs = int(read_bounded(os.path.join(dev, "sriov_numvfs"), 64).decode().strip() or "0")
            except (OSError, ValueError):
                numvfs = len(sysfs.vfs_of_pf(address))
            if numvfs <= 0:
                checks.append(failed(name, f"{address} has no VFs (sriov_numvfs 0)",
                                     f"echo N > /sys/bus/pci/devices/{address}/sriov_numvfs (or the SR-IOV "
                                     "network operator's policy)"))
                continue
            checks.append(passed(name, f"{address}, {numvfs} VFs (networks {', '.join(nets)})"))
            if pf in offload:
                checks.append(self._eswitch(pf, address, sysfs))
        return checks

    def _eswitch(self, pf: str, address: str, sysfs: Any) -> Check:
        from tenantnet.plugin.system import vfcontrol

        name = f"eswitch {pf}"
        vfs = sysfs.vfs_of_pf(address)
        netdev = vfs[0].pf_netdev if vfs and vfs[0].pf_netdev else (sysfs.netdevs_of(address) or [pf])[0]
        control = vfcontrol.control_for(self.node.vf_control, self.node.vf_control_modules)
        mode = control.eswitch_mode(netdev, address)
        fix = f"devlink dev eswitch set pci/{address} mode switchdev"
        if mode == "switchdev":
            return passed(name, f"{address} is in switchdev mode (ovs-offload)")
        if mode is None:
            return warned(name, f"the eswitch mode of {address} cannot be told (devlink)",
                          f"install iproute2's devlink, then check: devlink dev eswitch show pci/{address}")
        return failed(name, f"{address} is in {mode} mode; ovs-offload needs switchdev", fix)

    # -- pod-resources --------------------------------------------------------------------
    def check_pod_resources(self) -> list[Check]:
        if self.node is None:
            return [skipped("pod-resources", self.node_problem)]
        from tenantnet.plugin import nodeconfig
        from tenantnet.plugin.system import podresources

        path = self.node.pod_resources_socket
        declared_pfs = any(d.pfs for d in (self.policy.networks.values() if self.policy else ()))
        used = path != nodeconfig.NodeConfig.pod_resources_socket or self.node.gpu_map or declared_pfs
        if not used:
            return [skipped("pod-resources", "no rail alignment here (no podResourcesSocket, gpuMap or "
                                             "SR-IOV network declared)")]
        fix = ("enable the kubelet's pod-resources API (on by default) or set the node config's "
               "podResourcesSocket to its socket")
        try:
            with podresources.PodResourcesClient(path, timeout=self.opts.timeout) as client:
                pods = client.list_pods()
        except (podresources.PodResourcesError, podresources.WireFormatError, ValueError) as exc:
            return [failed("pod-resources", f"{path}: {exc} (railAlignment needs it)", fix)]
        return [passed("pod-resources", f"{path} answers List ({len(pods)} pods)")]

    # -- the device plugin --------------------------------------------------------------
    def check_device_plugin(self) -> list[Check]:
        """Whether anything hands out VFs through the kubelet: a device plugin registered in the
        kubelet's device-plugins directory (its socket, and its resources in the kubelet's
        checkpoint). Multus takes a VF's `deviceID` from there for NADs with a resourceName."""
        if self.node is None or self.policy_problem:
            return [skipped("device plugin", self.node_problem or self.policy_problem)]
        if not any(d.pfs for d in (self.policy.networks.values() if self.policy else ())):
            return [skipped("device plugin", "the tenancy policy declares no PF: no VF to hand out")]
        # The kubelet's root dir, as the pod-resources socket's path gives it (<root>/pod-resources/…).
        kubelet_root = os.path.dirname(os.path.dirname(self.node.pod_resources_socket))
        directory = os.path.join(kubelet_root, "device-plugins")
        try:
            names = sorted(os.listdir(directory))[:MAX_CONF_FILES]
        except OSError:
            names = []
        sockets = [n for n in names if n != "kubelet.sock" and (st := _lstat(os.path.join(directory, n)))
                   and stat.S_ISSOCK(st.st_mode)]
        resources: list[str] = []
        try:
            checkpoint = json.loads(read_bounded(os.path.join(directory, "kubelet_internal_checkpoint"),
                                                 8 << 20))
            registered = (checkpoint.get("Data") or {}).get("RegisteredDevices") or {}
            resources = sorted(str(r) for r in registered) if isinstance(registered, dict) else []
        except (OSError, ValueError, AttributeError):
            pass
        if resources or sockets:
            said = [f"resources {', '.join(resources)}"] if resources else []
            said += [f"sockets {', '.join(sockets)}"] if sockets else []
            return [passed("device plugin", f"registered with the kubelet ({directory}): {'; '.join(said)}")]
        return [warned("device plugin", f"no device plugin has registered with the kubelet ({directory}: no "
                                        "plugin socket, no registered resource): a NAD with a resourceName "
                                        "gets no VF",
                       "deploy the SR-IOV network device plugin with a resource for the declared PFs "
                       "(docs/install.md), or hand VFs out through DRA")]

    # -- etcd -----------------------------------------------------------------------------
    def check_etcd(self) -> list[Check]:
        if self.node is None:
            return [skipped("etcd", self.node_problem)]
        if not self.node.etcd_endpoints:
            return [skipped("etcd", "no etcdEndpoints: tenantnet-ipam keeps its store on the node")]
        from ipam.etcd import Etcd, EtcdConfig, EtcdError, EtcdUnavailable

        results: list[tuple[str, str | None, str]] = []  # endpoint, problem, version
        for endpoint in self.node.etcd_endpoints:
            config = EtcdConfig((endpoint,), self.node.etcd_ca_file, self.node.etcd_cert_file,
                                self.node.etcd_key_file,
                                timeout=min(self.node.etcd_timeout, self.opts.timeout))
            try:
                client = Etcd(config)
                try:
                    answer = client.call("/v3/maintenance/status", {})
                finally:
                    client.close()
                results.append((endpoint, None, str(answer.get("version", "?"))))
            except (EtcdUnavailable, EtcdError, OSError, ValueError) as exc:
                results.append((endpoint, str(exc), ""))
        down = [r for r in results if r[1]]
        checks = []
        for endpoint, problem, version in results:
            name = f"etcd {endpoint}"
            if not problem:
                checks.append(passed(name, f"answers (etcd {version})"))
                continue
            fix = (f"start etcd at {endpoint} or correct etcdEndpoints (and etcdCaFile/CertFile/KeyFile) "
                   "in the node config")
            if len(down) == len(results):
                checks.append(failed(name, f"{problem}: no endpoint answers, so cluster IPAM cannot lease "
                                           "blocks", fix))
            else:
                checks.append(warned(name, f"{problem} (other endpoints answer)", fix))
        return checks

    # -- OVN (overlay networks) -------------------------------------------------------------
    def check_ovn(self) -> list[Check]:
        """With `ovn:` in the node config: the northbound database, then each rail's chassis
        (module doc). One SKIP line when the node has no overlay."""
        if self.node is None:
            return [skipped("OVN", self.node_problem)]
        settings = self.node.ovn
        if settings is None:
            return [skipped("OVN", "overlays are not configured (no ovn: in the node config, "
                                   "docs/overlay.md)")]
        checks: list[Check] = []
        name = "OVN northbound"
        if settings.northbound.startswith("ssl:"):
            # The doctor's OVSDB client (tenantnet.plugin.system.ovsdb) speaks unix: and tcp:.
            checks.append(skipped(name, f"{settings.northbound}: the doctor probes unix: and tcp: endpoints "
                                        "only (check it with ovn-nbctl --db=... show)"))
        else:
            checks.append(self._northbound(settings.northbound))
        local = self.local_addresses()
        encaps: dict[str, str] = {}  # encap IP -> the rail that has it (one NIC per rail)
        dead: dict[str, str] = {}  # OVSDB endpoint -> why it did not answer: not asked again
        for rail in settings.rails.values():
            checks += self._ovn_rail(rail, local, encaps, dead)
        return checks

    def _northbound(self, endpoint: str) -> Check:
        from tenantnet.plugin.system import ovsdb

        name = "OVN northbound"
        try:
            ovsdb.probe(endpoint, timeout=self.opts.timeout, timeout_source="doctor --timeout",
                        database="OVN_Northbound")
        except ovsdb.OvsdbUnavailable as exc:
            return failed(name, f"{exc}: no overlay attachment can be made (its logical switch port is "
                                "written there)",
                          "start ovn-central (ovsdb-server for OVN_Northbound) or set the node config's "
                          f"ovn.northbound to its endpoint (now {endpoint})")
        return passed(name, f"{endpoint} answers (OVN_Northbound database)")

    def local_addresses(self) -> dict[str, str] | str:
        """Every address of this node's network namespace → its interface (rtnetlink), or why
        they could not be read."""
        import ipaddress

        from tenantnet.plugin.system import rtnl

        out: dict[str, str] = {}
        try:
            with rtnl.Rtnl() as nl:
                for link in nl.links():
                    for address in nl.addresses(link.index):
                        out[str(ipaddress.ip_interface(address).ip)] = link.name
        except OSError as exc:
            return f"cannot list this node's addresses (rtnetlink): {exc}"
        return out

    def _ovn_rail(self, rail: Any, local: dict[str, str] | str, encaps: dict[str, str],
                  dead: dict[str, str]) -> list[Check]:
        """One rail's checks: its integration bridge, its chassis's ovn-controller keys and
        encap IP, its underlay MTU, its datapath type."""
        from tenantnet.plugin import nodeconfig
        from tenantnet.plugin.system import ovsdb

        endpoint = rail.ovsdb or self.node.ovsdb
        prefix = f"rail {rail.name}"
        names = [f"{prefix} bridge", f"{prefix} chassis", f"{prefix} encap IP", f"{prefix} underlay MTU",
                 f"{prefix} datapath"]
        db_option = "" if endpoint == nodeconfig.DEFAULT_OVSDB else f" --db={endpoint}"
        bridge = rail.integration_bridge
        fix_db = (f"start Open vSwitch (ovsdb-server) or set ovn.rails.{rail.name}.ovsdb (or the node's "
                  f"ovsdb) to its socket (now {endpoint})")
        if endpoint in dead:
            return [failed(names[0], f"OVSDB {endpoint} (the rail's ovsdb): {dead[endpoint]}", fix_db),
                    *(skipped(n, f"OVSDB {endpoint} does not answer") for n in names[1:])]
        db = ovsdb.Ovsdb(endpoint, self.opts.timeout, timeout_source="doctor --timeout")
        checks: list[Check] = []
        try:
            ids, = self._ovs_select(db, "reading Open_vSwitch external_ids",
                                    {"op": "select", "table": "Open_vSwitch", "where": [],
                                     "columns": ["external_ids"]})
            row = ids[0].get("external_ids") if ids else None
            external = {str(k): str(v) for k, v in ovsdb._map(row).items()}
            if not db.bridge_exists(bridge):
                checks.append(failed(names[0], f"the integration bridge {bridge} (ovn.rails.{rail.name}."
                                               f"integrationBridge) does not exist on {endpoint}",
                                     f"start the rail's ovn-controller with external_ids:ovn-bridge"
                                     f"{_chassis_suffix(rail, external)}={bridge} (it creates the bridge), "
                                     f"or ovs-vsctl{db_option} add-br {bridge}, or correct "
                                     f"ovn.rails.{rail.name}.integrationBridge"))
            else:
                checks.append(passed(names[0], f"{bridge} exists on {endpoint}"))
            checks += self._ovn_chassis(rail, endpoint, db_option, external, local, encaps, names[1:3])
            checks.append(self._underlay_mtu(db, rail, endpoint, names[3]))
            checks.append(self._ovn_datapath(db, rail, db_option, names[4]) if checks[0].status == Status.PASS
                          else skipped(names[4], f"no bridge {bridge} on {endpoint}"))
        except (ovsdb.OvsdbUnavailable, ovsdb.OvsdbFailure) as exc:
            done = {c.name for c in checks}
            dead[endpoint] = str(exc)
            checks.append(failed(names[0] if names[0] not in done else f"{prefix} OVSDB",
                                 f"OVSDB {endpoint} (the rail's ovsdb): {exc}", fix_db))
            checks += [skipped(n, f"OVSDB {endpoint} does not answer") for n in names[1:] if n not in done]
        finally:
            db.close()
        return checks

    @staticmethod
    def _ovs_select(db: Any, what: str, *ops: dict[str, Any]) -> list[list[dict[str, Any]]]:
        """Read-only selects in one transaction on the doctor's own handle (the reads
        ovsdb.Ovsdb has no method for: the Open_vSwitch row's external_ids, a bridge's
        interfaces)."""
        return [db._rpc_rows(r) for r in db._rpc_ops(what, list(ops))]

    def _ovn_chassis(self, rail: Any, endpoint: str, db_option: str, external: dict[str, str],
                     local: dict[str, str] | str, encaps: dict[str, str],
                     names: list[str]) -> list[Check]:
        """ovn-controller(8): a chassis reads `<key>-<chassis>` first, then the plain key; its
        name is `-n`/system-id-override, else external_ids:system-id. ovn-bridge defaults to
        br-int; there is no default encap IP."""
        chassis = rail.chassis or external.get("system-id", "")
        who = f"chassis {chassis}" if chassis else "the node's chassis (no chassis, no system-id)"

        def key(option: str) -> tuple[str, str | None]:
            specific = f"{option}-{chassis}" if chassis else ""
            if specific and specific in external:
                return specific, external[specific]
            return option, external.get(option)

        bridge_key, bridge = key("ovn-bridge")
        bridge_said = f"{bridge_key}={bridge}" if bridge is not None else f"{bridge_key} unset (br-int)"
        encap_key, encap = key("ovn-encap-ip")
        suffix = _chassis_suffix(rail, external)
        set_keys = (f"ovs-vsctl{db_option} set Open_vSwitch . external_ids:ovn-bridge{suffix}="
                    f"{rail.integration_bridge} external_ids:ovn-encap-ip{suffix}="
                    f"<rail {rail.name}'s address>")
        if (bridge or "br-int") != rail.integration_bridge:
            return [failed(names[0], f"{who}'s ovn-controller uses {bridge or 'br-int'} ({bridge_said} "
                                     f"in {endpoint}), not the rail's integrationBridge "
                                     f"{rail.integration_bridge}: no port tenantnet puts there is bound",
                           f"{set_keys}, or correct ovn.rails.{rail.name}.integrationBridge/chassis"),
                    skipped(names[1], f"{who} is not the rail's")]
        if not encap:
            return [failed(names[0], f"{who} has no encap IP ({encap_key} unset in {endpoint}): its "
                                     "ovn-controller makes no tunnel", set_keys),
                    skipped(names[1], f"{who} has no encap IP")]
        chassis_ok = passed(names[0], f"{who}: {bridge_said}, {encap_key}={encap} "
                                      f"(external_ids on {endpoint})")
        addresses = [a.strip() for a in encap.split(",") if a.strip()]  # later OVNs take a list
        shared = [encaps[a] for a in addresses if a in encaps]
        for a in addresses:
            encaps.setdefault(a, rail.name)
        if shared:
            return [chassis_ok,
                    failed(names[1], f"{encap} is also rail {shared[0]}'s encap IP: both rails' Geneve "
                                     "traffic would leave through one NIC",
                           f"give {who} its own rail's address: {set_keys}")]
        if isinstance(local, str):
            return [chassis_ok, skipped(names[1], local)]
        missing = [a for a in addresses if a not in local]
        if missing:
            return [chassis_ok,
                    failed(names[1], f"{', '.join(missing)} ({encap_key}) is not an address of this "
                                     f"node: other chassis' tunnels to {who} go nowhere",
                           f"put {missing[0]} on rail {rail.name}'s NIC (or its underlayBridge), or set "
                           f"{encap_key} to an address it has")]
        on = ", ".join(f"{a} on {local[a]}" for a in addresses)
        return [chassis_ok, passed(names[1], f"{on} (this node's)")]

    def _underlay_mtu(self, db: Any, rail: Any, endpoint: str, name: str) -> Check:
        """The rail's declared underlayMtu against its underlayBridge's own interface and
        uplinks: a larger one makes pods' MTU (underlayMtu - 58) send frames the rail drops."""
        if not rail.underlay_bridge:
            return skipped(name, f"no ovn.rails.{rail.name}.underlayBridge: the rail NIC's MTU cannot be "
                                 f"told here (underlayMtu {rail.underlay_mtu} is taken as said)")
        bridges, ports, ifaces = self._ovs_select(
            db, f"reading bridge {rail.underlay_bridge}",
            {"op": "select", "table": "Bridge", "where": [["name", "==", rail.underlay_bridge]],
             "columns": ["ports"]},
            {"op": "select", "table": "Port", "where": [], "columns": ["_uuid", "interfaces"]},
            {"op": "select", "table": "Interface", "where": [], "columns": ["_uuid", "name", "type", "mtu"]})
        if not bridges:
            return failed(name, f"the underlayBridge {rail.underlay_bridge} (ovn.rails.{rail.name}) does "
                                f"not exist on {endpoint}",
                          f"correct ovn.rails.{rail.name}.underlayBridge, or remove it")
        from tenantnet.plugin.system import ovsdb

        members = set(ovsdb._set(bridges[0].get("ports")))
        held = {u for p in ports if ovsdb._atom(p.get("_uuid")) in members
                for u in ovsdb._set(p.get("interfaces"))}
        # The bridge's own interface (the encap IP's) and its uplinks; patch ports carry no frame.
        mtus = {str(i.get("name")): ovsdb._opt(i.get("mtu")) for i in ifaces
                if ovsdb._atom(i.get("_uuid")) in held
                and i.get("type") in ("", "internal", "system", "dpdk")}
        known = {n: m for n, m in mtus.items() if isinstance(m, int)}
        if not known:
            return skipped(name, f"no interface of {rail.underlay_bridge} reports an MTU (is ovs-vswitchd "
                                 "running?)")
        smallest = min(known, key=lambda n: known[n])
        limit = known[smallest]
        if rail.underlay_mtu > limit:
            overhead = rail.underlay_mtu - rail.pod_mtu
            return warned(name, f"underlayMtu {rail.underlay_mtu} is larger than {smallest}'s MTU {limit} "
                                f"(of {rail.underlay_bridge}): pods would get MTU {rail.pod_mtu} and send "
                                "frames the rail drops",
                          f"set ovn.rails.{rail.name}.underlayMtu to {limit} (pods then get "
                          f"{limit - overhead}), or raise {smallest}'s MTU")
        said = ", ".join(f"{n} {m}" for n, m in sorted(known.items()))
        return passed(name, f"underlayMtu {rail.underlay_mtu} fits {rail.underlay_bridge} ({said}); pods get "
                            f"MTU {rail.pod_mtu}")

    def _ovn_datapath(self, db: Any, rail: Any, db_option: str, name: str) -> Check:
        """userspaceDatapath says whether the plugin switches TX checksum offload off on a pod's
        veth end: needed on a netdev (userspace) bridge, where TCP fails otherwise (CNI-FACTS §7),
        a needless cost elsewhere."""
        bridge = rail.integration_bridge
        datapath = db.bridge_datapath(bridge) or "system"
        key = f"ovn.rails.{rail.name}.userspaceDatapath"
        if rail.userspace_datapath and datapath != "netdev":
            return warned(name, f"{key} is true but {bridge} is datapath_type {datapath}: pods' TX checksum "
                                "offload is switched off for nothing",
                          f"set {key}: false (or ovs-vsctl{db_option} set Bridge {bridge} "
                          "datapath_type=netdev if the userspace datapath is meant)")
        if not rail.userspace_datapath and datapath == "netdev":
            return warned(name, f"{bridge} is datapath_type netdev (userspace) but {key} is false: TX "
                                "checksum offload would not be switched off on pods' veth ends, and their "
                                "TCP fails",
                          f"set {key}: true")
        return passed(name, f"{bridge} is datapath_type {datapath}, {key} is "
                            f"{'true' if rail.userspace_datapath else 'false'}")

    # -- device-info dir ------------------------------------------------------------------
    def check_device_info_dir(self) -> list[Check]:
        if self.node is None:
            return [skipped("device-info dir", self.node_problem)]
        path = self.node.device_info_dir
        if _lstat(path) is None:
            # Emptied by a reboot (it is under /run): the plugin creates it, never through a
            # symlink, at the first ADD that names a device-info file.
            return [warned("device-info dir", f"{path} does not exist yet (tenantnet creates it at the first "
                                              "ADD with a device-info file)",
                           f"nothing, or mkdir -p {path}; if Multus uses another directory, set the node "
                           "config's deviceInfoDir to it")]
        return [_directory("device-info dir", path,
                           f"remove {path} and let tenantnet create it, or set the node config's "
                           "deviceInfoDir to Multus's devinfo directory")]

    # -- Kubernetes -----------------------------------------------------------------------
    def kube(self) -> kubeclient.KubeApi | None:
        if self._kube is None and not self._kube_problem:
            path, how = kubeclient.find_kubeconfig(self.opts.kubeconfig, self.opts.environ)
            try:
                self._kube = kubeclient.connect(path, how, self.opts.timeout, self.opts.kube_client,
                                                self.opts.environ)
            except KubeUnavailable as exc:
                self._kube_problem = str(exc)
        return self._kube

    def check_kubernetes(self) -> list[Check]:
        names = ["NAD CRD", "TenantNetwork CRD", "RBAC agent", "RBAC renderer"]
        if self.node is not None and self.node.dra:
            names.append("RBAC agent DRA")
        api = self.kube()
        if api is None:
            return [skipped(n, self._kube_problem) for n in names]
        try:
            nad_fix = ("kubectl apply the NetworkAttachmentDefinition CRD (in Multus's "
                       "deployments/multus-daemonset.yml)")
            checks = [self._crd(api, "NAD CRD", NAD_CRD, nad_fix),
                      self._crd(api, "TenantNetwork CRD", TENANTNET_CRD, "kubectl apply -f packaging/crds/")]
        except KubeUnavailable as exc:
            return [skipped(n, f"{exc} ({api.source})") for n in names]
        agent = self._service_account("agent", self.opts.agent_service_account)
        renderer = self._service_account("renderer", self.opts.renderer_service_account)
        # What packaging/rbac.yaml grants each for its work: the agent's watcher reads the
        # networks and namespaces and publishes its node's PFs on its Node; the renderer
        # writes NADs and reads the Nodes' PFs.
        checks.append(self._rbac(api, "RBAC agent", agent, [
            ("list", "tenantnet.io", "tenantnetworks"), ("watch", "tenantnet.io", "tenantnetworks"),
            ("list", "", "namespaces"), ("watch", "", "namespaces"), ("patch", "", "nodes")]))
        checks.append(self._rbac(api, "RBAC renderer", renderer, [
            ("create", "k8s.cni.cncf.io", "network-attachment-definitions"), ("list", "", "nodes"),
            ("watch", "", "nodes")]))
        if "RBAC agent DRA" in names:
            checks.append(self._rbac_dra(api, agent))
        return checks

    @staticmethod
    def _service_account(role: str, text: str) -> tuple[str, str]:
        namespace, _, name = text.partition("/")
        if not namespace or not name:
            raise ValueError(f"--{role}-service-account {text!r}: expected NAMESPACE/NAME")
        return namespace, name

    @staticmethod
    def _crd(api: kubeclient.KubeApi, name: str, crd: str, fix: str) -> Check:
        answer = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        if answer.status == 404:
            return failed(name, f"{crd} is not installed", fix)
        if answer.status != 200:
            return skipped(name, f"the API server answered {answer.status}: {answer.text[:200]} "
                                 f"({api.source} may not read CRDs)")
        conditions = (answer.body.get("status") or {}).get("conditions") or []
        established = any(c.get("type") == "Established" and c.get("status") == "True"
                          for c in conditions if isinstance(c, dict))
        if not established:
            return failed(name, f"{crd} is installed but not Established",
                          f"kubectl describe crd {crd} (its conditions say why: a names conflict?)")
        versions = [v.get("name") for v in (answer.body.get("spec") or {}).get("versions") or []
                    if isinstance(v, dict) and v.get("served")]
        return passed(name, f"{crd} established (served: {', '.join(map(str, versions)) or '?'})")

    @staticmethod
    def _reviews(api: kubeclient.KubeApi, name: str, sa: tuple[str, str],
                 accesses: Iterable[Access]) -> list[Access] | Check:
        """SelfSubjectAccessReviews as the ServiceAccount (impersonated): the accesses it is
        denied, or the SKIP Check saying why they could not be asked."""
        who = kubeclient.Identity.service_account(*sa)
        denied: list[Access] = []
        for access in accesses:
            try:
                answer = api.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", access.review(),
                                  who)
            except KubeUnavailable as exc:
                return skipped(name, f"{exc} ({api.source})")
            if answer.status == 403:
                return skipped(name, f"cannot ask as {who.user}: {answer.text[:200]} (give a kubeconfig "
                                     "whose user may impersonate ServiceAccounts, e.g. the cluster admin's)")
            if answer.status not in (200, 201):
                return skipped(name, f"the API server answered {answer.status}: {answer.text[:200]}")
            if not (answer.body.get("status") or {}).get("allowed"):
                denied.append(access)
        return denied

    @staticmethod
    def _rbac(api: kubeclient.KubeApi, name: str, sa: tuple[str, str],
              asks: list[tuple[str, str, str]]) -> Check:
        """What the ServiceAccount may not do of `asks` (verb, group, resource)."""
        accesses = [Access(verb, group, resource) for verb, group, resource in asks]
        denied = Doctor._reviews(api, name, sa, accesses)
        if isinstance(denied, Check):
            return denied
        sa_text = f"{sa[0]}/{sa[1]}"
        if not denied:
            return passed(name, f"ServiceAccount {sa_text} may {', '.join(map(str, accesses))}")
        verbs = sorted({a.verb for a in denied})
        resources = sorted({a.kind for a in denied})
        role = f"tenantnet-{name.split()[-1]}"
        return failed(name, f"ServiceAccount {sa_text} may not {', '.join(map(str, denied))}",
                      f"kubectl create clusterrole {role} --verb={','.join(verbs)} "
                      f"--resource={','.join(resources)} && kubectl create clusterrolebinding {role} "
                      f"--clusterrole={role} --serviceaccount={sa[0]}:{sa[1]}")

    @staticmethod
    def _rbac_dra(api: kubeclient.KubeApi, sa: tuple[str, str]) -> Check:
        """The DRA driver's API access, asked as the agent's ServiceAccount. The grant printed
        is one ClusterRole per verb (and resource name): exactly the access denied, never a
        verb on every resource named."""
        name = "RBAC agent DRA"
        denied = Doctor._reviews(api, name, sa, DRA_ACCESS)
        if isinstance(denied, Check):
            return denied
        sa_text = f"{sa[0]}/{sa[1]}"
        if not denied:
            return passed(name, f"ServiceAccount {sa_text} may {', '.join(map(str, DRA_ACCESS))}")
        groups: dict[tuple[str, str], list[str]] = {}
        for access in denied:
            groups.setdefault((access.verb, access.name), []).append(access.kind)
        commands = []
        for (verb, resource_name), kinds in groups.items():
            role = "tenantnet-agent-dra-" + re.sub(r"[^a-z0-9-]", "-", verb)
            named = f" --resource-name={resource_name}" if resource_name else ""
            commands += [f"kubectl create clusterrole {role} --verb={verb} --resource={','.join(kinds)}"
                         f"{named}",
                         f"kubectl create clusterrolebinding {role} --clusterrole={role} "
                         f"--serviceaccount={sa[0]}:{sa[1]}"]
        return failed(name, f"ServiceAccount {sa_text} may not {', '.join(map(str, denied))} "
                            "(the DRA driver tenantnet.io needs it: packaging/rbac.yaml grants it)",
                      " && ".join(commands))

    # -- DRA ------------------------------------------------------------------------------
    def check_dra(self) -> list[Check]:
        """With `dra: true`: what the agent needs to be the node's DRA driver (module doc)."""
        if self.node is None:
            return [skipped("DRA", self.node_problem)]
        if not self.node.dra:
            return [skipped("DRA", "dra is off in the node config (docs/dra.md)")]
        dra, why = self._agent_dra()
        return [self._plugins_registry(), self._dra_registration(dra, why), self._nri(dra, why),
                self._cdi_dir()]

    def _agent_dra(self) -> tuple[dict[str, Any] | None, Check | None]:
        """The `dra` part of the agent's STATUS, or the Check that says why there is none."""
        from tenantnet.entry import shim

        name = "DRA registration"
        path = self.node.agent_socket
        restart = ("kubectl -n kube-system rollout restart daemonset/tenantnet (or restart tenantnetctl "
                   "agent run)")
        if _lstat(path) is None:
            return None, failed(name, f"no agent socket at {path}: nothing serves the DRA driver "
                                      "tenantnet.io",
                                "run the DaemonSet's agent container (tenantnetctl agent run)")
        try:
            uid, report = self.agent_report()
        except (shim.AgentUnavailable, shim.AgentFailed) as exc:
            return None, skipped(name, f"the agent does not answer (the agent line says more): {exc}")
        if uid != 0:
            return None, skipped(name, f"{path} is served by uid {uid}, not root (the agent line says more)")
        dra = report.get("dra")
        if not isinstance(dra, dict):
            return None, failed(name, f"the agent (pid {report.get('pid')}) runs without DRA: it was started "
                                      f"before dra: true or with another node config "
                                      f"({report.get('nodeConfig') or '?'})", f"restart the agent: {restart}")
        return dra, None

    def _plugins_registry(self) -> Check:
        name = "DRA plugins_registry"
        root = self.node.kubelet_root_dir
        path = os.path.join(root, "plugins_registry")
        fix = (f"set the node config's kubeletRootDir to the kubelet's --root-dir (now {root}), and the "
               "DaemonSet's kubelet hostPaths (plugins_registry, plugins/tenantnet.io) with it")
        check = _directory(name, path, fix)
        if check.status != Status.PASS:
            return check
        # The kubelet makes pods/ beside plugins_registry/ at its start; a plugins_registry
        # alone was made by someone else (a hostPath of type DirectoryOrCreate, the agent).
        if _lstat(os.path.join(root, "pods")) is None:
            return failed(name, f"{path} exists but {root} has no pods/: not a running kubelet's root dir "
                                "(the kubelet would never see the driver's registration socket)", fix)
        return passed(name, f"{path} is a directory (the kubelet watches it for plugins)")

    def _dra_registration(self, dra: dict[str, Any] | None, why: Check | None) -> Check:
        name = "DRA registration"
        if dra is None:
            assert why is not None
            return why
        from tenantnet.plugin.draclaims import DRIVER

        root = self.node.kubelet_root_dir
        registration = os.path.join(root, "plugins_registry", f"{DRIVER}-reg.sock")
        if dra.get("registered"):
            return passed(name, f"the kubelet registered the driver {DRIVER} ({registration})")
        error = dra.get("registrationError")
        if error:
            return failed(name, f"the kubelet refused the driver {DRIVER}: {error}",
                          "run a kubelet serving DRA v1 (Kubernetes 1.34 or later); the kubelet's log names "
                          "the refusal")
        return failed(name, f"the kubelet has not registered the driver {DRIVER}: it never called "
                            f"{registration}",
                      f"set the node config's kubeletRootDir to the kubelet's --root-dir (now {root}), mount "
                      "it at the same path in the agent's container (packaging/daemonset.yaml), and restart "
                      "the agent")

    def _nri(self, dra: dict[str, Any] | None, why: Check | None) -> Check:
        name = "DRA NRI"
        path = self.node.nri_socket
        st = _lstat(path)
        if st is None or not stat.S_ISSOCK(st.st_mode):
            found = "nothing" if st is None else "something that is not a socket"
            return failed(name, f"{found} at {path} (nriSocket): containerd's NRI is disabled or listens "
                                "elsewhere, so pods would start without their DRA devices",
                          f"enable NRI in containerd's config ({NRI_SECTION} disable = false, "
                          f"plugin_request_timeout = '15s') and restart containerd, or set the node config's "
                          f"nriSocket to its socket_path (now {path})")
        if dra is None:
            return skipped(name, f"{path} is a socket; whether the agent is connected cannot be told "
                                 f"({why.detail if why else 'no DRA report'})")
        if not dra.get("nriConnected"):
            return failed(name, f"{path} is a socket but the agent is not connected to it: pods would start "
                                "without their DRA devices",
                          f"check containerd's {NRI_SECTION}: disable = false, disable_connections = false, "
                          f"socket_path = the node config's nriSocket ({path}); the agent's log (nri.*) says "
                          "why it cannot connect")
        return passed(name, f"the agent is connected to containerd's NRI at {path}")

    def _cdi_dir(self) -> Check:
        name = "DRA CDI dir"
        path = self.node.cdi_dir
        check = _directory(name, path, f"mkdir -p {path}, or set the node config's cdiDir to one of "
                                       "containerd's cdi_spec_dirs (default /etc/cdi, /var/run/cdi)")
        if check.status != Status.PASS:
            return check
        # A file made and removed: what the agent does at prepare (as root). A dot-name
        # without .json/.yaml, which containerd's CDI cache never reads.
        probe = os.path.join(path, f".tenantnet-doctor-{os.getpid()}-{threading.get_ident()}")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if os.geteuid() != 0:
                return skipped(name, f"cannot create a file in {path} as uid {os.geteuid()} "
                                     f"({exc.strerror}); the agent writes there as root: run the doctor "
                                     "as root")
            return failed(name, f"cannot create a file in {path}: {exc.strerror or exc} (the agent writes "
                                "each claim's CDI spec there)",
                          f"make {path} writable (a read-only mount?), or set the node config's cdiDir to a "
                          "writable one of containerd's cdi_spec_dirs")
        os.close(fd)
        os.unlink(probe)
        return passed(name, f"{path} is a directory the agent can write CDI specs into")


def agent_status(path: str, timeout: float) -> tuple[int, dict[str, Any]]:
    """(uid serving `path`, the agent's STATUS report): the plugin's own client call
    (shim.ask: the same request, framing and time-out), trusting root only, so that a socket
    served by anyone else is sent nothing (uid, {})."""
    from tenantnet.entry import shim
    from tenantnet.entry.agent import STATUS_OP

    try:
        code, out, _ = shim.ask(path, STATUS_OP, {}, b"", timeout, trusted=(0,))
    except shim.AgentUntrusted as exc:
        if exc.uid is None:
            raise
        return exc.uid, {}
    if code != 0:
        raise shim.AgentFailed(f"the agent at {path} answered STATUS with code {code}: "
                               f"{out.decode(errors='replace')[:200]}")
    try:
        report = json.loads(out)
    except ValueError:
        raise shim.AgentFailed(f"the agent at {path} answered STATUS with something not JSON") from None
    return 0, report if isinstance(report, dict) else {}


def _chassis_suffix(rail: Any, external: dict[str, str]) -> str:
    """How the rail's chassis's own keys are spelt in fixes: plain for the node's system-id
    (or no chassis named), `-<chassis>` for another ovn-controller (`-n <chassis>`)."""
    return f"-{rail.chassis}" if rail.chassis and rail.chassis != external.get("system-id") else ""


# ---- output and the command line -------------------------------------------------------------

def render_table(checks: list[Check]) -> str:
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{c.status.value:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in (Status.FAIL, Status.WARN):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    counts = {s: sum(1 for c in checks if c.status == s) for s in Status}
    lines.append(f"{counts[Status.PASS]} passed, {counts[Status.FAIL]} failed, "
                 f"{counts[Status.WARN]} warnings, {counts[Status.SKIP]} skipped")
    return "\n".join(lines)


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == Status.FAIL for c in checks) else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    if not 0 < args.timeout <= 120:  # NaN too
        print("tenantnetctl doctor: --timeout must be between 0 and 120 seconds", file=sys.stderr)
        return 2
    for role in ("agent", "renderer"):
        value = getattr(args, f"{role}_service_account")
        if value.count("/") != 1 or not all(value.split("/")):
            print(f"tenantnetctl doctor: --{role}-service-account {value!r}: expected NAMESPACE/NAME",
                  file=sys.stderr)
            return 2
    opts = Options(node_config=getattr(args, "node_config", None), kubeconfig=args.kubeconfig,
                   cni_conf_dir=args.cni_conf_dir, cni_bin_dir=args.cni_bin_dir, timeout=args.timeout,
                   agent_service_account=args.agent_service_account,
                   renderer_service_account=args.renderer_service_account, kube_client=args.kube_client)
    checks = Doctor(opts).run()
    if args.json:
        print(json.dumps({"ok": exit_code(checks) == 0, "checks": [c.as_dict() for c in checks]}, indent=2))
    else:
        print(render_table(checks))
    return exit_code(checks)


EPILOG = """each line: PASS, FAIL (with `fix:`), WARN (works, not as it should) or SKIP (cannot be
told here; the line says why). Exit 0 when nothing FAILs, 1 otherwise, 2 on a usage error.
What each check means: docs/install.md, "tenantnetctl doctor".

examples:
  tenantnetctl doctor                                   # this node, /etc/cni/net.d, /opt/cni/bin
  tenantnetctl doctor --kubeconfig /etc/kubernetes/admin.conf --json
  tenantnetctl --node-config /run/tenantnet-lab/tenantnet.yaml doctor --cni-bin-dir .venv/bin
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "doctor", help="is this node ready for tenantnet? each check PASS/FAIL with its fix",
        description="Check this node's readiness for tenantnet: Multus, the CNI dirs, tenantnet's "
                    "executables, the agent, OVS and its bridges, SR-IOV PFs, pod-resources, etcd, "
                    "the device-info dir, with ovn: the OVN northbound database and each rail's chassis, "
                    "(with a kubeconfig) the CRDs and RBAC, and with dra: true "
                    "the DRA driver's kubelet registration, NRI connection, CDI dir and RBAC.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # SUPPRESS: given here or before `doctor` (tenantnetctl's own --node-config), either works.
    p.add_argument("--node-config", metavar="PATH", default=argparse.SUPPRESS,
                   help="node config file (default: $TENANTNET_CONFIG or /etc/tenantnet/tenantnet.yaml)")
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="for the CRD and RBAC checks (default: $KUBECONFIG, ~/.kube/config, "
                        "/etc/kubernetes/admin.conf, in-cluster; none: those checks SKIP)")
    p.add_argument("--cni-conf-dir", default=DEFAULT_CNI_CONF_DIR, metavar="DIR",
                   help=f"the kubelet's (runtime's) CNI config directory (default {DEFAULT_CNI_CONF_DIR})")
    p.add_argument("--cni-bin-dir", default=DEFAULT_CNI_BIN_DIR, metavar="DIR",
                   help=f"the runtime's CNI binary directory (default {DEFAULT_CNI_BIN_DIR})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds each probe may take (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--agent-service-account", default=DEFAULT_SERVICE_ACCOUNT, metavar="NS/NAME",
                   help=f"the agent's ServiceAccount, for the RBAC check (default {DEFAULT_SERVICE_ACCOUNT})")
    p.add_argument("--renderer-service-account", default=DEFAULT_RENDERER_SERVICE_ACCOUNT, metavar="NS/NAME",
                   help="the NAD renderer's ServiceAccount, for the RBAC check (default "
                        f"{DEFAULT_RENDERER_SERVICE_ACCOUNT})")
    p.add_argument("--kube-client", choices=("auto", "kubectl", "builtin"), default="auto",
                   help="how to reach the API server: kubectl (auto: when on PATH) or the built-in client")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)
    return p
