"""The packaged DaemonSet on the lab's Kubernetes node: tenantnet's image built here, without a
registry or a container engine, and packaging/'s manifests applied with the lab's paths.

The image (`image_archive`) is what packaging/Containerfile makes, from the same pieces: the
relocatable runtime of packaging/build_runtime.py (Debian's python3.11 — the venv's
interpreter —, the standard library, tenantnet and its dependencies as this venv has them,
every library they load, a static busybox, the trampoline) at `/opt/tenantnet/runtime`, and
the launchers the build writes into `/usr/local/bin` (`tenantnet-install`, `tenantnetctl`,
the plugins), naming that path. It sits on the lab's busybox layer (kubeimages) and is
written as one `docker save` archive for `ctr -n k8s.io images import`. No ovs-vsctl or
iproute2 (the final stage's tools for operators): tenantnet itself speaks OVSDB and netlink.
The runtime is built once per source tree into `build/kube-image/<key>/` (the key hashes the
sources, the dependencies' versions, build_runtime.py and the trampoline's source).

`deploy(lab)` applies `packaging/crds/*.yaml`, `rbac.yaml`, `configmap.yaml`,
`daemonset.yaml` and `renderer.yaml` as they are but for the lab's paths (`lab_manifests`):

- the image (`imagePullPolicy: Never`);
- every hostPath the DaemonSet mounts moves into the lab (`host_paths`), and a mount at the
  host's own path (or under `/host`) moves with it, so a path means the same on the host and
  in the pod; the installer is told the lab's CNI bin dir, runtime dir and node config;
- the node config (the ConfigMap) gets the same paths (the agent's socket under the lab: the
  trampoline Multus execs on the host reads it there), Kubernetes mode, no metrics port, and
  the DRA paths (`kubeletRootDir`, `nriSocket`, `cdiDir`) of the lab's kubelet and containerd,
  where the DaemonSet's DRA mounts now point, whether or not `dra` is on;
- the lab has no kube-proxy: the pods' `KUBERNETES_SERVICE_HOST/PORT` name the API server's
  own address instead of the `kubernetes` Service;
- the renderer's Deployment runs one replica.

The pods' network namespaces live under containerd's state dir: `deploy` makes that directory
a shared mount point, so the agent's `HostToContainer` mount sees the ones made after it
started (containerd refuses that propagation from a private mount).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from tenantnet.lab import kubeimages
from tenantnet.lab.ovs import LabError

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
CACHE = REPO / "build" / "kube-image"
PACKAGES = ("cni", "hostfiles", "ipam", "tenantnet")
IMAGE_RUNTIME = "/opt/tenantnet/runtime"
LAUNCHERS = "/usr/local/bin"
SYSTEM_PYTHON = "/usr/bin/python3.11"
MANIFESTS = ("crds/network-attachment-definitions.yaml", "crds/tenantnetwork.yaml", "rbac.yaml",
             "configmap.yaml", "daemonset.yaml", "renderer.yaml")
# containerd (netns_mounts_under_state_dir) puts the pods' network namespaces here, under its state
NETNS_DIR = "containerd/state/io.containerd.grpc.v1.cri/netns"


class DeployError(LabError):
    pass


# ------------------------------------------------------------------------------ the image


def _build_runtime_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_runtime", PACKAGING / "build_runtime.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_runtime", module)
    spec.loader.exec_module(module)
    return module


def _dependencies() -> dict[str, importlib.metadata.Distribution]:
    """tenantnet's runtime dependencies (no extras), transitively, as installed in this venv."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = ["tenantnet"]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name in found:
            continue
        found[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def _stale_stubs() -> list[str]:
    """The .proto files of tenantnet/kube/proto whose generated stubs (the Makefile's, never
    checked in; the image takes them with the rest of the tree) are missing or older."""
    stale = []
    for proto in sorted((REPO / "tenantnet" / "kube" / "proto").glob("*.proto")):
        stubs = [proto.with_name(proto.stem + s) for s in ("_pb2.py", "_pb2_grpc.py")]
        if not all(s.exists() and s.stat().st_mtime >= proto.stat().st_mtime for s in stubs):
            stale.append(str(proto.relative_to(REPO)))
    return stale


def _source_files() -> list[Path]:
    files = [PACKAGING / "build_runtime.py", REPO / "trampoline" / "trampoline.c"]
    for pkg in PACKAGES:
        files += sorted(f for f in (REPO / pkg).rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    return files


def image_key() -> str:
    h = hashlib.sha256()
    for f in _source_files():
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    for name, dist in sorted(_dependencies().items()):
        h.update(f"{name}=={dist.version}\0".encode())
    return h.hexdigest()[:16]


def _make_site(site: Path) -> str:
    """tenantnet from the repository and its dependencies' files from this venv; its version."""
    deps = _dependencies()
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, site / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name, dist in deps.items():
        if name == "tenantnet":
            continue
        for rel in dist.files or []:
            src = Path(str(dist.locate_file(rel))).resolve()
            if "__pycache__" in rel.parts or rel.parts[0] in ("..", "bin") or not src.is_file():
                continue
            dst = site / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return deps["tenantnet"].version


def build_runtime() -> Path:
    """The runtime of this source tree, built once into build/kube-image/<key>/runtime."""
    stale = _stale_stubs()
    if stale:
        raise DeployError(f"the gRPC stubs of {', '.join(stale)} are missing or older than the .proto: "
                          "`make venv` generates them")
    key = image_key()
    done = CACHE / key / "runtime"
    if (done / "tenantnet-runtime.json").exists():
        return done
    for tool in (SYSTEM_PYTHON, kubeimages.BUSYBOX):
        if not os.path.exists(tool):
            raise DeployError(f"{tool} is missing (bash scripts/install-deps.sh)")
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=CACHE))
    try:
        version = _make_site(work / "site")
        br = _build_runtime_module()
        try:
            br.build(work / "runtime", work / "site", Path(SYSTEM_PYTHON), Path(kubeimages.BUSYBOX),
                     version=version)
        except br.BuildError as exc:
            raise DeployError(f"building tenantnet's runtime: {exc}") from None
        shutil.rmtree(work / "site")
        (CACHE / key).mkdir(exist_ok=True)
        try:
            os.rename(work / "runtime", done)  # another lab may have built it meanwhile: keep theirs
        except OSError:
            if not (done / "tenantnet-runtime.json").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for old in CACHE.iterdir():  # earlier trees' runtimes (not one another lab is building now)
        if old.name != key and time.time() - old.stat().st_mtime > 600:
            shutil.rmtree(old, ignore_errors=True)
    return done


def _runtime_layer(runtime: Path) -> bytes:
    """/opt/tenantnet/runtime and the launchers naming it, as the Containerfile's final stage."""
    br = _build_runtime_module()
    rtmod = br._installer(runtime)  # tenantnet.ops.runtime, the installer's (build_runtime's way)
    rt = rtmod.load_runtime(runtime)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(info: tarfile.TarInfo, data: bytes | None = None) -> None:
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        for d in ("opt", "opt/tenantnet", IMAGE_RUNTIME[1:], "usr", "usr/local", LAUNCHERS[1:]):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            add(info)
        for path in sorted(runtime.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=f"{IMAGE_RUNTIME[1:]}/{path.relative_to(runtime)}")
            add(info, path.read_bytes() if info.isfile() else None)
        for command in br.ENTRYPOINTS:
            for name, data in rtmod.plugin_files(rt, IMAGE_RUNTIME, command):
                info = tarfile.TarInfo(f"{LAUNCHERS[1:]}/{name}")
                info.mode = rtmod.SHIM_MODE
                add(info, data)
    return buf.getvalue()


def image_name(runtime: Path) -> str:
    manifest = json.loads((runtime / "tenantnet-runtime.json").read_text())
    return f"localhost/tenantnet-lab/tenantnet:{manifest['version']}-{manifest['digest'][:12]}"


def image_archive(path: Path) -> str:
    """Write tenantnet's image (`docker save` format) to `path`; its name."""
    runtime = build_runtime()
    name = image_name(runtime)
    layers = [kubeimages._layer(), _runtime_layer(runtime)]
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
        "config": {"Entrypoint": [f"{LAUNCHERS}/tenantnet-install"], "Cmd": ["--host-root", "/host"],
                   "Env": ["PATH=/usr/local/bin:/bin"], "WorkingDir": "/",
                   "Labels": {"org.opencontainers.image.title": "tenantnet"}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "tenantnet lab (busybox-static)"},
                    {"created": "2026-01-01T00:00:00Z",
                     "created_by": "tenantnet lab (packaging/build_runtime.py)"}],
    }, sort_keys=True).encode()
    blobs = {f"layer{i}.tar": layer for i, layer in enumerate(layers)}
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    blobs[config_name] = config
    blobs["manifest.json"] = json.dumps([{"Config": config_name, "RepoTags": [name],
                                          "Layers": [f"layer{i}.tar" for i in range(len(layers))]}]).encode()
    with tarfile.open(path, "w") as tar:
        for member, data in blobs.items():
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return name


# ------------------------------------------------------------------------------ the manifests


def host_paths(lab: Any) -> dict[str, str]:
    """The DaemonSet's host paths -> where the lab has them (its node config's directory is the
    lab OVS's: containerd's TENANTNET_CONFIG names the file the installer writes there)."""
    root, ovs = lab.root, lab.ovs_root
    kubelet, containerd = lab.kubelet_root, os.path.dirname(lab.containerd_socket)
    return {
        "/opt/cni/bin": lab.cni_bin_dir, "/opt/tenantnet": f"{root}/tenantnet", "/etc/tenantnet": ovs,
        "/var/lib/tenantnet": f"{ovs}/state", "/var/log/tenantnet": f"{ovs}/log", "/run/openvswitch": ovs,
        "/var/log/openvswitch": ovs, "/var/run/netns": f"{root}/{NETNS_DIR}",
        "/var/run/k8s.cni.cncf.io/devinfo": f"{ovs}/devinfo", "/run/tenantnet": f"{ovs}/run",
        "/var/lib/cni": f"{root}/cni/state", "/sys": "/sys",
        # DRA: the lab kubelet's root dir (--root-dir), the lab containerd's NRI socket and CDI dirs
        "/var/lib/kubelet": kubelet, "/var/lib/kubelet/plugins_registry": f"{kubelet}/plugins_registry",
        "/var/lib/kubelet/plugins/tenantnet.io": f"{kubelet}/plugins/tenantnet.io",
        "/var/run/nri": f"{containerd}/nri", "/var/run/cdi": f"{containerd}/cdi",
    }


# The node config's keys naming what the DaemonSet's DRA mounts hold, and their defaults
# (nodeconfig.NodeConfig): written with the lab's paths even while `dra` is off, so that a
# `dra: true` never makes a lab agent reach for the host's own kubelet or containerd.
DRA_PATH_KEYS = {"kubeletRootDir": "/var/lib/kubelet", "nriSocket": "/var/run/nri/nri.sock",
                 "cdiDir": "/var/run/cdi"}


def _moved(value: str, paths: dict[str, str]) -> str:
    """`value` with a leading host path (whole components) replaced by the lab's; also in
    `--flag=PATH` and under `/host`."""
    if value.startswith("--") and "=" in value:
        flag, _, rest = value.partition("=")
        return f"{flag}={_moved(rest, paths)}"
    prefix = "/host" if value.startswith("/host/") else ""
    path = value[len(prefix):]
    for old in sorted(paths, key=len, reverse=True):
        if path == old or path.startswith(old + "/"):
            return prefix + paths[old] + path[len(old):]
    return value


def _api_env(server: str) -> list[dict[str, str]]:
    host, port = server.removeprefix("https://").rsplit(":", 1)
    return [{"name": "KUBERNETES_SERVICE_HOST", "value": host},
            {"name": "KUBERNETES_SERVICE_PORT", "value": port}]


def _container(c: dict[str, Any], image: str, server: str, paths: dict[str, str] | None) -> None:
    c["image"], c["imagePullPolicy"] = image, "Never"
    env = [e for e in c.get("env", []) if not e["name"].startswith("KUBERNETES_SERVICE_")]
    c["env"] = env + _api_env(server)
    if paths is None:
        return
    for key in ("command", "args"):
        if key in c:
            c[key] = [_moved(a, paths) for a in c[key]]
    for probe in ("readinessProbe", "livenessProbe"):
        if probe in c:
            c[probe]["exec"]["command"] = [_moved(a, paths) for a in c[probe]["exec"]["command"]]
    for e in c["env"]:
        if "value" in e:
            e["value"] = _moved(e["value"], paths)
    mounts: dict[str, dict[str, Any]] = {}
    for m in c.get("volumeMounts", []):
        m = dict(m, mountPath=_moved(m["mountPath"], paths))
        seen = mounts.get(m["mountPath"])
        if seen is None:
            mounts[m["mountPath"]] = m
        elif not m.get("readOnly"):  # one mount per path: the lab's dirs coincide (one directory)
            seen.pop("readOnly", None)
    c["volumeMounts"] = list(mounts.values())


def node_config(lab: Any) -> str:
    """The packaged node config with the lab's paths, in Kubernetes mode, no metrics port (labs
    side by side share the host's ports)."""
    cm = yaml.safe_load((PACKAGING / "configmap.yaml").read_text())
    paths = host_paths(lab)
    lines = []
    for line in cm["data"]["tenantnet.yaml"].splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith("#") and value.strip():
            scheme = "unix:" if value.startswith("unix:") else ""
            line = f"{key}: {scheme}{_moved(value.removeprefix(scheme), paths)}"
        if key == "metricsPort":
            line = "metricsPort: 0"
        lines.append(line)
    given = {line.partition(":")[0] for line in lines if not line.startswith("#")}
    lines += ["# the lab (tenantnet/lab/kubedeploy.py): Kubernetes mode on its one node", "kubernetes: true"]
    lines += [f"{key}: {_moved(default, paths)}" for key, default in DRA_PATH_KEYS.items()
              if key not in given]
    return "\n".join(lines) + "\n"


def lab_manifests(lab: Any, image: str) -> list[dict[str, Any]]:
    """packaging/'s manifests as applied to the lab (the module doc says what changes)."""
    server = yaml.safe_load(Path(lab.kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    paths = host_paths(lab)
    docs: list[dict[str, Any]] = []
    for name in MANIFESTS:
        docs += [d for d in yaml.safe_load_all((PACKAGING / name).read_text()) if d]
    for doc in docs:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "tenantnet-node-config":
            doc["data"]["tenantnet.yaml"] = node_config(lab)
        elif doc["kind"] == "DaemonSet":
            spec = doc["spec"]["template"]["spec"]
            for v in spec["volumes"]:
                if "hostPath" in v:
                    v["hostPath"]["path"] = paths[v["hostPath"]["path"]]
            for c in spec.get("initContainers", []) + spec["containers"]:
                _container(c, image, server, paths)
        elif doc["kind"] == "Deployment":
            doc["spec"]["replicas"] = 1
            for c in doc["spec"]["template"]["spec"]["containers"]:
                _container(c, image, server, None)
    return copy.deepcopy(docs)


# ------------------------------------------------------------------------------ deploy


def _shared_netns_dir(root: str) -> str:
    """containerd's netns directory made a shared mount point (bound onto itself once)."""
    d = f"{root}/{NETNS_DIR}"
    os.makedirs(d, mode=0o755, exist_ok=True)
    with open("/proc/self/mountinfo") as fh:
        mounted = any(line.split()[4] == d for line in fh)
    if not mounted:
        subprocess.run(["mount", "--rbind", d, d], check=True, capture_output=True)
    subprocess.run(["mount", "--make-rshared", d], check=True, capture_output=True)
    return d


def deploy(lab: Any, timeout: float = 300) -> dict[str, Any]:
    """Build and import tenantnet's image, apply the packaged manifests for the lab, and wait
    for the DaemonSet and the renderer to be ready; what was done, with timings."""
    from tenantnet.lab import kube

    t0 = time.monotonic()
    bin_dir = Path(lab.cni_bin_dir)
    saved = {"nodeConfig": Path(lab.node_config).read_text(),
             "links": {c: os.readlink(bin_dir / c) for c in ("tenantnet", "tenantnet-ipam")
                       if (bin_dir / c).is_symlink()}}
    archive = Path(lab.root) / "tenantnet-image.tar"
    image = image_archive(archive)
    built = time.monotonic() - t0
    ctr = [str(Path(kube.kubebin.locate()["ctr"])), f"--address={lab.containerd_socket}",
           "--namespace=k8s.io"]
    proc = subprocess.run([*ctr, "images", "import", "--snapshotter=overlayfs", str(archive)],
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise DeployError(f"importing {image}: {proc.stderr.strip()}")
    archive.unlink()
    imported = time.monotonic() - t0
    _shared_netns_dir(lab.root)
    docs = lab_manifests(lab, image)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    kube.apply(lab, json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}))
    kube.kubectl(lab, "wait", "--for=condition=Established", *(f"crd/{d['metadata']['name']}" for d in crds),
                 "--timeout=60s", timeout=90)
    kube.apply(lab, json.dumps({"apiVersion": "v1", "kind": "List",
                                "items": [d for d in docs if d["kind"] != "CustomResourceDefinition"]}))
    applied = time.monotonic() - t0
    for what in ("daemonset/tenantnet", "deployment/tenantnet-renderer"):
        try:
            kube.kubectl(lab, "-n", "kube-system", "rollout", "status", what, f"--timeout={timeout:.0f}s",
                         timeout=timeout + 30)
        except kube.KubeError as exc:
            pods = kube.kubectl(lab, "-n", "kube-system", "get", "pods", "-o", "wide")
            events = kube.kubectl(lab, "-n", "kube-system", "get", "events",
                                  "--field-selector", "type=Warning")
            raise DeployError(f"{what} not ready: {exc}\n{pods}\n{events}") from None
    timings = {"imageBuilt": built, "imported": imported, "applied": applied, "ready": time.monotonic() - t0}
    return {"image": image, "timings": {k: round(v, 1) for k, v in timings.items()}, "saved": saved}


def undeploy(lab: Any, deployed: dict[str, Any], timeout: float = 120) -> None:
    """The lab node as before `deploy` (a lab that goes on: the e2e session's): the DaemonSet
    and the renderer deleted and their pods gone, then the rest of what was applied (RBAC,
    ConfigMap, the TenantNetwork CRD), the lab's own node config and the venv's plugin links
    back, the agent's cache removed. The image and the runtime copy stay."""
    from tenantnet.lab import kube

    kube.kubectl(lab, "-n", "kube-system", "delete", "daemonset/tenantnet", "deployment/tenantnet-renderer",
                 "--ignore-not-found", "--wait=true", f"--timeout={timeout:.0f}s", timeout=timeout + 20)
    deadline = time.monotonic() + timeout
    while kube.kubectl(lab, "-n", "kube-system", "get", "pods", "-o", "name",
                       "-l", "app.kubernetes.io/name in (tenantnet, tenantnet-renderer)").strip():
        if time.monotonic() > deadline:
            raise DeployError(f"the DaemonSet's and the renderer's pods still run after {timeout:.0f} s")
        time.sleep(0.3)
    # and what else deploy applied, but the NAD CRD (the lab's own, from its bring-up)
    rest = [d for d in lab_manifests(lab, deployed["image"])
            if d["metadata"]["name"] != "network-attachment-definitions.k8s.cni.cncf.io"]
    kube.kubectl(lab, "delete", "-f", "-", "--ignore-not-found", "--wait=true", f"--timeout={timeout:.0f}s",
                 input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rest}), timeout=timeout + 20)
    saved = deployed["saved"]
    Path(lab.node_config).write_text(saved["nodeConfig"])
    bin_dir = Path(lab.cni_bin_dir)
    for command, target in saved["links"].items():
        for name in (command, f"{command}-shim"):
            with contextlib.suppress(FileNotFoundError):
                (bin_dir / name).unlink()
        (bin_dir / command).symlink_to(target)
    shutil.rmtree(Path(lab.ovs_root) / "state" / "kube", ignore_errors=True)


# ------------------------------------------------------------------------------ two tenants

# Two tenants, a TenantNetwork each on the lab's bridge: VLANs and pools of their own.
TENANTS = {"tenant-a": (101, "10.71.0.0/24"), "tenant-b": (102, "10.72.0.0/24")}


def tenant_objects(lab: Any, pods_per_tenant: int = 2) -> list[dict[str, Any]]:
    """A namespace labelled with its tenant, a TenantNetwork granting it, and pods asking for
    it (busybox, NET_ADMIN to add a route across to the other tenant's pool)."""
    items: list[dict[str, Any]] = []
    for tenant, (vlan, subnet) in TENANTS.items():
        items.append({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": tenant, "labels": {"tenantnet.io/tenant": tenant}}})
        items.append({"apiVersion": "tenantnet.io/v1alpha1", "kind": "TenantNetwork",
                      "metadata": {"name": f"{tenant}-net"},
                      "spec": {"tenants": [tenant], "fabric": {"mode": "ovs", "bridge": lab.bridge},
                               "vlan": vlan, "ipam": {"ranges": [[{"subnet": subnet}]]}}})
    return items


def tenant_pods(pods_per_tenant: int = 2) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"p{i}", "namespace": tenant,
                          "annotations": {"k8s.v1.cni.cncf.io/networks": f"{tenant}-net"}},
             "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                 "name": "main", "image": kubeimages.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                 "command": ["sleep", "3600"],
                 "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]}}
            for tenant in TENANTS for i in (1, 2)[:pods_per_tenant]]


def run_tenants(lab: Any, timeout: float = 180) -> dict[str, str]:
    """Apply the two tenants, wait for their NADs (the renderer) and their pods; each pod's
    net1 address by `namespace/name`. Every pod gets a route to the other tenant's pool over
    net1, so only the VLAN keeps them apart."""
    from tenantnet.lab import kube

    kube.apply(lab, json.dumps({"apiVersion": "v1", "kind": "List", "items": tenant_objects(lab)}))
    deadline = time.monotonic() + timeout
    while True:
        got = [kube.kubectl(lab, "get", "network-attachment-definitions", "-n", t, "-o", "name",
                            "-l", f"tenantnet.io/tenant-network={t}-net") for t in TENANTS]
        sa = [kube.kubectl(lab, "get", "serviceaccount", "-n", t, "-o", "name") for t in TENANTS]
        if all(got) and all("default" in s for s in sa):
            break
        if time.monotonic() > deadline:
            raise DeployError(f"the renderer rendered {' '.join(got) or 'nothing'} within {timeout:.0f} s")
        time.sleep(0.3)
    pods = tenant_pods()
    kube.apply(lab, json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    addrs: dict[str, str] = {}
    for pod in pods:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            kube.kubectl(lab, "wait", "--for=condition=Ready", f"pod/{name}", "-n", ns,
                         f"--timeout={timeout:.0f}s", timeout=timeout + 20)
        except kube.KubeError as exc:
            events = kube.kubectl(lab, "get", "events", "-n", ns, "--field-selector", "type=Warning")
            raise DeployError(f"{ns}/{name} not Ready: {exc}\n{events}") from None
        obj = json.loads(kube.kubectl(lab, "get", "pod", name, "-n", ns, "-o", "json"))
        status = json.loads(obj["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"])
        [ours] = [s for s in status if s.get("interface") == "net1"]
        addrs[f"{ns}/{name}"] = ours["ips"][0]
    for key in addrs:
        ns, name = key.split("/")
        other = next(subnet for t, (_, subnet) in TENANTS.items() if t != ns)
        kube.kubectl(lab, "exec", "-n", ns, name, "--", "ip", "route", "add", other, "dev", "net1")
    return addrs


def remove_tenants(lab: Any, timeout: float = 120) -> None:
    """The two tenants' pods, TenantNetworks (their NADs, whose finalizer the renderer lifts:
    while it runs) and namespaces deleted."""
    from tenantnet.lab import kube

    for t in TENANTS:
        kube.kubectl(lab, "delete", "pods", "--all", "-n", t, "--ignore-not-found", "--wait=true",
                     f"--timeout={timeout:.0f}s", timeout=timeout + 20)
    kube.kubectl(lab, "delete", "tenantnetworks", *(f"{t}-net" for t in TENANTS), "--ignore-not-found",
                 "--wait=true", f"--timeout={timeout:.0f}s", timeout=timeout + 20)
    deadline = time.monotonic() + timeout
    while any(kube.kubectl(lab, "get", "network-attachment-definitions", "-n", t, "-o", "name").strip()
              for t in TENANTS):
        if time.monotonic() > deadline:
            raise DeployError(f"the tenants' NADs are still there {timeout:.0f} s after their TenantNetworks")
        time.sleep(0.3)
    kube.kubectl(lab, "delete", "namespaces", *TENANTS, "--ignore-not-found", "--wait=false")


def reaches(lab: Any, src: str, ip: str) -> bool:
    from tenantnet.lab import kube

    ns, name = src.split("/")
    try:
        kube.kubectl(lab, "exec", "-n", ns, name, "--", "ping", "-c", "2", "-W", "2", ip, timeout=60)
    except kube.KubeError:
        return False
    return True


# ------------------------------------------------------------------------------ the demo's act


def demo(root: str) -> int:
    """`make demo`'s act on the real node (scripts/demo.sh), on a running lab in `root`: the
    DaemonSet deployed, two tenants' pods, who reaches whom. Prints [ok  ]/[FAIL] lines;
    the number of failures."""
    from tenantnet.lab import kube

    lab = kube.status(root)
    failures = 0

    def mark(ok: bool, what: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"  [{'ok  ' if ok else 'FAIL'}] {what}", flush=True)

    print("  building tenantnet's image (packaging/build_runtime.py), applying packaging/*.yaml", flush=True)
    done = deploy(lab)
    t = done["timings"]
    mark(True, f"{done['image']}: imported {t['imported']} s, DaemonSet and renderer ready {t['ready']} s")
    bin_dir = lab.cni_bin_dir
    installed = [c for c in ("tenantnet", "tenantnet-ipam")
                 if not os.path.islink(f"{bin_dir}/{c}") and os.path.exists(f"{bin_dir}/{c}-shim")]
    mark(len(installed) == 2, f"the DaemonSet installed {', '.join(installed) or 'nothing'} into {bin_dir}")
    nads = "network-attachment-definitions"
    for sa, verb, resource, want in (("tenantnet", "create", nads, "no"),
                                     ("tenantnet", "watch", "tenantnetworks.tenantnet.io", "yes"),
                                     ("tenantnet-renderer", "create", nads, "yes"),
                                     ("tenantnet-renderer", "get", "secrets", "no")):
        proc = subprocess.run([lab.kubectl, f"--kubeconfig={lab.kubeconfig}", "auth", "can-i", verb,
                               resource, f"--as=system:serviceaccount:kube-system:{sa}"],
                              capture_output=True, text=True, timeout=60, check=False)
        mark(proc.stdout.strip() == want, f"ServiceAccount {sa} may {verb} {resource}: {proc.stdout.strip()}")
    print("  two tenants, a TenantNetwork each (VLAN 101 / 102); two pods each, a route across", flush=True)
    addrs = run_tenants(lab)
    for pod, ip in addrs.items():
        print(f"         {pod:14} net1 {ip}")
    for src in ("tenant-a/p1", "tenant-b/p1"):
        for dst, ip in addrs.items():
            if dst == src:
                continue
            want = dst.split("/")[0] == src.split("/")[0]
            got = reaches(lab, src, ip)
            mark(got == want, f"{src} -> {dst:12} {'reaches' if got else 'blocked'} "
                              f"(expected: {'reaches' if want else 'blocked'})")
    return failures


if __name__ == "__main__":
    try:
        sys.exit(min(demo(sys.argv[1]), 100))
    except LabError as exc:
        print(f"  [FAIL] {exc}")
        sys.exit(1)
