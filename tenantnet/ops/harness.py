"""The manual harness: drive the plugin exactly as kubelet/Multus would — exec with CNI env
and the network config on stdin — against pod namespaces it creates for you.

Results are cached like libcni caches them, so `check` and `detach` can send prevResult.
Pods made here are listed under `<stateDir>/harness/pods/` so `lab down` can remove them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
DEFAULT_CNI_PATH = ("/usr/lib/cni", "/opt/cni/bin")
# <network>-<64 hex container id>-<ifname>.json, as libcni names its cache files
_CACHE_NAME = re.compile(r"^(?P<network>.+)-(?P<cid>[0-9a-f]{64})-(?P<ifname>.+)\.json$")


class HarnessError(Exception):
    pass


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str) -> Pod:
        ns, sep, name = text.partition("/")
        if not sep:
            ns, name = "default", text
        for what, value in (("namespace", ns), ("name", name)):
            if not _DNS_LABEL.match(value):
                raise HarnessError(
                    f"--pod {text!r}: pod {what} {value!r} must be a DNS label "
                    "(lowercase letters, digits, '-', at most 63 characters)"
                )
        return cls(ns, name)

    @property
    def netns_name(self) -> str:
        return f"tnpod_{self.namespace}_{self.name}"[:200]

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns_name}"

    @property
    def container_id(self) -> str:
        return hashlib.sha256(f"{self.namespace}/{self.name}".encode()).hexdigest()

    @property
    def uid(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"tenantnet-harness:{self.namespace}/{self.name}"))

    def cni_args(self, mac: str = "", ips: str = "") -> str:
        args = [
            "IgnoreUnknown=1",
            f"K8S_POD_NAMESPACE={self.namespace}",
            f"K8S_POD_NAME={self.name}",
            f"K8S_POD_INFRA_CONTAINER_ID={self.container_id}",
            f"K8S_POD_UID={self.uid}",
        ]
        if mac:
            args.append(f"MAC={mac}")
        if ips:
            args.append(f"IP={ips}")
        return ";".join(args)


def load_network_config(path: str) -> dict[str, Any]:
    """A NAD file: plain JSON config, or a NetworkAttachmentDefinition in YAML/JSON."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise HarnessError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise HarnessError(f"{path} is neither JSON nor YAML: {exc}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{path} must hold a JSON/YAML object")
    if data.get("kind") == "NetworkAttachmentDefinition":
        config = (data.get("spec") or {}).get("config")
        if not isinstance(config, str):
            raise HarnessError(f"{path}: NetworkAttachmentDefinition has no spec.config string")
        try:
            conf = json.loads(config)
        except ValueError as exc:
            raise HarnessError(f"{path}: spec.config is not valid JSON: {exc}") from None
        if not isinstance(conf, dict):
            raise HarnessError(f"{path}: spec.config must be a JSON object")
        # Multus names the network after the NAD when the config does not.
        conf.setdefault("name", (data.get("metadata") or {}).get("name", ""))
        return conf
    return data


class Harness:
    def __init__(self, node_config: str | None, state_dir: str) -> None:
        self.node_config = node_config
        self.root = Path(state_dir) / "harness"
        here = Path(sys.executable).parent
        self.plugin = str(here / "tenantnet")
        self.cni_path = tuple([str(here)] + [p for p in DEFAULT_CNI_PATH if os.path.isdir(p)])

    # ---- pods -------------------------------------------------------------------------
    def ensure_netns(self, pod: Pod) -> bool:
        if os.path.exists(pod.netns_path):
            return False
        subprocess.run(["ip", "netns", "add", pod.netns_name], check=True, capture_output=True)
        (self.root / "pods").mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.root / "pods" / pod.netns_name).write_text(json.dumps(pod.__dict__))
        return True

    def remove_netns_if_unused(self, pod: Pod) -> bool:
        if any(self._cache_dir().glob(f"*-{pod.container_id}-*.json")):
            return False
        marker = self.root / "pods" / pod.netns_name
        if not marker.exists():
            return False  # not ours
        subprocess.run(["ip", "netns", "delete", pod.netns_name], check=False, capture_output=True)
        marker.unlink(missing_ok=True)
        return True

    # ---- cache ------------------------------------------------------------------------
    def _cache_dir(self) -> Path:
        d = self.root / "results"
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d

    def _cache_file(self, network: str, pod: Pod, ifname: str) -> Path:
        return self._cache_dir() / f"{network}-{pod.container_id}-{ifname}.json"

    # ---- exec -------------------------------------------------------------------------
    def invoke(self, command: str, conf: dict[str, Any], pod: Pod | None, ifname: str,
               netns: str | None = None, cni_args: str = "") -> tuple[int, str]:
        env = {
            "CNI_COMMAND": command,
            "CNI_PATH": os.pathsep.join(self.cni_path),
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }
        if self.node_config:
            env["TENANTNET_CONFIG"] = self.node_config
        if pod is not None:
            env.update({
                "CNI_CONTAINERID": pod.container_id,
                "CNI_NETNS": pod.netns_path if netns is None else netns,
                "CNI_IFNAME": ifname,
                "CNI_ARGS": cni_args or pod.cni_args(),
            })
        proc = subprocess.run([self.plugin], input=json.dumps(conf).encode(), env=env,
                              capture_output=True, check=False)
        if proc.stderr:
            sys.stderr.write(proc.stderr.decode(errors="replace"))
        return proc.returncode, proc.stdout.decode(errors="replace").strip()

    def attach(self, conf: dict[str, Any], pod: Pod, ifname: str, mac: str = "",
               ips: str = "") -> tuple[int, str]:
        created = self.ensure_netns(pod)
        code, out = self.invoke("ADD", conf, pod, ifname, cni_args=pod.cni_args(mac, ips))
        if code == 0:
            self._cache_file(conf.get("name", ""), pod, ifname).write_text(out)
        else:
            # As the runtimes do: a failed ADD is followed by a DEL without prevResult.
            self.invoke("DEL", conf, pod, ifname)
            if created:
                self.remove_netns_if_unused(pod)
        return code, out

    def _with_prev(self, conf: dict[str, Any], pod: Pod, ifname: str) -> dict[str, Any]:
        cache = self._cache_file(conf.get("name", ""), pod, ifname)
        if cache.exists():
            try:
                return {**conf, "prevResult": json.loads(cache.read_text())}
            except ValueError:
                pass
        return conf

    def check(self, conf: dict[str, Any], pod: Pod, ifname: str) -> tuple[int, str]:
        return self.invoke("CHECK", self._with_prev(conf, pod, ifname), pod, ifname)

    def detach(self, conf: dict[str, Any], pod: Pod, ifname: str,
               keep_netns: bool = False) -> tuple[int, str]:
        netns = pod.netns_path if os.path.exists(pod.netns_path) else ""
        code, out = self.invoke("DEL", self._with_prev(conf, pod, ifname), pod, ifname, netns=netns)
        if code == 0:
            self._cache_file(conf.get("name", ""), pod, ifname).unlink(missing_ok=True)
            if not keep_netns:
                self.remove_netns_if_unused(pod)
        return code, out

    def gc(self, conf: dict[str, Any]) -> tuple[int, str]:
        """GC keeping every attachment the harness still has cached for this network."""
        network = conf.get("name", "")
        keep = []
        for f in self._cache_dir().glob("*.json"):
            m = _CACHE_NAME.match(f.name)
            if m and m["network"] == network:
                keep.append({"containerID": m["cid"], "ifname": m["ifname"]})
        return self.invoke("GC", {**conf, "cni.dev/valid-attachments": keep}, None, "")
