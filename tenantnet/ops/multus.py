"""The Multus-style harness: what Multus (thin) does for a pod's secondary networks.

Reads the pod's `k8s.v1.cni.cncf.io/networks` annotation (short form `ns/name@ifname, …`
or the JSON list form), resolves each NetworkAttachmentDefinition (namespace defaulting to
the pod's, as Multus does), names interfaces `net1, net2, …` by position, injects device
IDs for NADs with a `k8s.v1.cni.cncf.io/resourceName`, builds `CNI_ARGS` and
`runtimeConfig` from the capabilities the config declares, calls each delegate in order —
and produces the `k8s.v1.cni.cncf.io/network-status` Multus would write.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NETWORKS = "k8s.v1.cni.cncf.io/networks"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
RESOURCE_NAME = "k8s.v1.cni.cncf.io/resourceName"
_DNS1123 = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")


class MultusError(Exception):
    pass


@dataclass
class Selection:
    """One entry of the pod's networks annotation."""

    name: str
    namespace: str
    interface: str | None = None
    mac: str | None = None
    ips: list[str] = field(default_factory=list)
    cni_args: dict[str, Any] | None = None
    device_id: str | None = None
    default_route: list[str] = field(default_factory=list)


@dataclass
class Nad:
    namespace: str
    name: str
    config: dict[str, Any]
    resource_name: str | None = None


@dataclass
class PodSpec:
    namespace: str
    name: str
    annotations: dict[str, str]


def _check_name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not _DNS1123.match(value):
        raise MultusError(f"{what} {value!r} is not a valid Kubernetes name (lowercase DNS-1123)")
    return value


def parse_selections(text: str, pod_namespace: str) -> list[Selection]:
    text = text.strip()
    if not text:
        raise MultusError(f"annotation {NETWORKS} is empty")
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise MultusError(f"annotation {NETWORKS} is not valid JSON: {exc}") from None
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "name" not in item:
                raise MultusError(f"annotation {NETWORKS}[{i}] must be an object with a name")
            ips = item.get("ips") or []
            if not isinstance(ips, list):
                raise MultusError(f"annotation {NETWORKS}[{i}].ips must be a list")
            out.append(Selection(
                name=_check_name("network", item["name"]),
                namespace=_check_name("namespace", item.get("namespace") or pod_namespace),
                interface=item.get("interface"), mac=item.get("mac"), ips=[str(x) for x in ips],
                cni_args=item.get("cni-args"), device_id=item.get("deviceID"),
                default_route=list(item.get("default-route") or []),
            ))
        return out
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        ref, _, ifname = part.partition("@")
        ns, sep, name = ref.partition("/")
        if not sep:
            ns, name = pod_namespace, ref
        out.append(Selection(name=_check_name("network", name), namespace=_check_name("namespace", ns),
                             interface=ifname or None))
    return out


def _yaml_docs(path: str) -> list[Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            return [d for d in yaml.safe_load_all(fh) if d is not None]
    except OSError as exc:
        raise MultusError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise MultusError(f"{path} is not valid YAML: {exc}") from None


def load_pod(path: str) -> PodSpec:
    docs = [d for d in _yaml_docs(path) if isinstance(d, dict) and d.get("kind") == "Pod"]
    if len(docs) != 1:
        raise MultusError(f"{path} must hold exactly one Pod")
    meta = docs[0].get("metadata") or {}
    return PodSpec(namespace=_check_name("pod namespace", meta.get("namespace") or "default"),
                   name=_check_name("pod name", meta.get("name")),
                   annotations=dict(meta.get("annotations") or {}))


def load_nads(paths: list[str]) -> dict[tuple[str, str], Nad]:
    nads: dict[tuple[str, str], Nad] = {}
    for path in paths:
        for doc in _yaml_docs(path):
            if not isinstance(doc, dict) or doc.get("kind") != "NetworkAttachmentDefinition":
                continue
            meta = doc.get("metadata") or {}
            ns = _check_name("NAD namespace", meta.get("namespace") or "default")
            name = _check_name("NAD name", meta.get("name"))
            raw = (doc.get("spec") or {}).get("config")
            try:
                config = json.loads(raw) if isinstance(raw, str) else None
            except ValueError as exc:
                raise MultusError(f"{path}: NAD {ns}/{name}: spec.config is not valid JSON: {exc}") from None
            if not isinstance(config, dict):
                raise MultusError(f"{path}: NAD {ns}/{name}: spec.config must be a JSON object string")
            if "plugins" in config:
                raise MultusError(f"{path}: NAD {ns}/{name}: conflists are not supported by this harness")
            config.setdefault("name", name)
            nads[(ns, name)] = Nad(ns, name, config, (meta.get("annotations") or {}).get(RESOURCE_NAME))
    return nads


@dataclass
class Delegate:
    """One CNI call as Multus would make it."""

    nad: Nad
    ifname: str
    conf: dict[str, Any]
    cni_args: str
    device_id: str | None
    devinfo_file: str | None


def devinfo_dir(node: Any) -> str:
    """Where this Multus puts the device-info files it names in `CNIDeviceInfoFile`: the node
    config's `deviceInfoDir` itself (Multus's /var/run/k8s.cni.cncf.io/devinfo/cni in
    production), so the plugin is never handed a path its node config refuses."""
    return str(node.device_info_dir)


def plan_delegates(pod: PodSpec, selections: list[Selection], nads: dict[tuple[str, str], Nad],
                   devices: dict[str, list[str]], container_id: str, pod_uid: str,
                   devinfo_dir: str) -> list[Delegate]:
    pools = {r: list(pcis) for r, pcis in devices.items()}
    out = []
    used: set[str] = set()
    for index, sel in enumerate(selections):
        nad = nads.get((sel.namespace, sel.name))
        if nad is None:
            known = ", ".join("/".join(k) for k in nads) or "none"
            raise MultusError(f"NetworkAttachmentDefinition {sel.namespace}/{sel.name} not found "
                              f"among the --nad files (known: {known})")
        ifname = sel.interface or f"net{index + 1}"
        if ifname in used:
            raise MultusError(f"interface {ifname} is requested twice")
        used.add(ifname)
        conf = json.loads(json.dumps(nad.config))
        caps = conf.pop("capabilities", None) or {}  # never passed to a plugin
        device_id = sel.device_id
        if nad.resource_name and not device_id:
            pool = pools.get(nad.resource_name)
            if not pool:
                raise MultusError(f"NAD {nad.namespace}/{nad.name} needs a device of resource "
                                  f"{nad.resource_name}: give --devices {nad.resource_name}=PCI[,PCI…]")
            device_id = pool.pop(0)
        runtime: dict[str, Any] = {}
        if device_id:
            conf["deviceID"] = device_id
            conf["pciBusID"] = device_id
            if caps.get("deviceID"):
                runtime["deviceID"] = device_id
        if caps.get("mac") and sel.mac:
            runtime["mac"] = sel.mac
        if caps.get("ips") and sel.ips:
            runtime["ips"] = sel.ips
        devinfo_file = None
        if caps.get("CNIDeviceInfoFile"):
            devinfo_file = f"{devinfo_dir}/{nad.namespace}-{nad.name}-{container_id}_{ifname}"
            runtime["CNIDeviceInfoFile"] = devinfo_file
        if runtime:
            conf["runtimeConfig"] = runtime
        if sel.cni_args:
            conf.setdefault("args", {})["cni"] = sel.cni_args
        args = ["IgnoreUnknown=true", f"K8S_POD_NAMESPACE={pod.namespace}", f"K8S_POD_NAME={pod.name}",
                f"K8S_POD_INFRA_CONTAINER_ID={container_id}", f"K8S_POD_UID={pod_uid}"]
        if sel.mac:
            args.append(f"MAC={sel.mac}")
        if sel.ips:
            args.append(f"IP={','.join(sel.ips)}")
        out.append(Delegate(nad, ifname, conf, ";".join(args), device_id, devinfo_file))
    return out


def network_status(delegate: Delegate, result: dict[str, Any], default_route: list[str]) -> dict[str, Any]:
    """One entry of the network-status annotation, as Multus derives it from a CNI result."""
    entry: dict[str, Any] = {"name": f"{delegate.nad.namespace}/{delegate.nad.name}",
                             "interface": delegate.ifname}
    sandboxed = [i for i in result.get("interfaces") or [] if i.get("sandbox")]
    if sandboxed:
        last = sandboxed[-1]
        entry["interface"] = last.get("name", delegate.ifname)
    ips = [ip["address"].split("/")[0] for ip in result.get("ips") or []]
    if ips:
        entry["ips"] = ips
    if sandboxed and sandboxed[-1].get("mac"):
        entry["mac"] = sandboxed[-1]["mac"]
    if sandboxed and sandboxed[-1].get("mtu"):
        entry["mtu"] = sandboxed[-1]["mtu"]
    entry["dns"] = result.get("dns") or {}
    if default_route:
        # "default" marks the cluster network only; a secondary with default-route gets "gateway".
        entry["gateway"] = list(default_route)
    if delegate.devinfo_file and Path(delegate.devinfo_file).exists():
        try:
            entry["device-info"] = json.loads(Path(delegate.devinfo_file).read_text())
        except ValueError:
            pass
    return entry
