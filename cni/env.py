"""The CNI environment: which verb, which container, which netns — validated per verb.

`CNI_ARGS` is parsed here too. Real callers repeat keys and change their order (Multus,
containerd and podman each build it differently; docs/multus.md lists what Multus sends),
so the parser tolerates both and only refuses what is malformed, or unknown keys when the
caller did not say `IgnoreUnknown`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cni.errors import CniError, Code
from cni.names import check_env_name, container_id_problem, ifname_problem

VERBS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}")  # fullmatch: "$" would allow "\n"
_KNOWN_ARGS = {
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_UID",
    "K8S_POD_INFRA_CONTAINER_ID",
    "MAC",
    "IP",
}
_TRUE = {"1", "true", "True", "TRUE"}
# The pod identity, in the shapes Kubernetes and podman give it (podman passes its container
# name as K8S_POD_NAME, which may hold '_' and capitals). These end up in OVS external_ids,
# logs and the tenancy decision, so anything else — '/', whitespace, control characters,
# over-long values — is refused rather than passed on.
_POD_FIELDS = {
    "K8S_POD_NAMESPACE": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"),
                          "a namespace name (at most 63 letters, digits, '-', '_', '.')"),
    "K8S_POD_NAME": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}"),
                     "a pod name (at most 253 letters, digits, '-', '_', '.')"),
    "K8S_POD_UID": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}"), "letters, digits, '-', '_' (a UID)"),
    "K8S_POD_INFRA_CONTAINER_ID": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}"), "a container id"),
}


def mac_problem(value: str) -> str | None:
    if not _MAC_RE.fullmatch(value):
        return "must be a MAC address like 02:00:00:00:00:01"
    if int(value[:2], 16) & 1:
        return "must be a unicast MAC (the lowest bit of the first octet must be 0)"
    if value.replace(":", "") == "0" * 12:
        return "must not be all zeros"
    return None


@dataclass(frozen=True)
class CniArgs:
    """The parsed `CNI_ARGS`; pod identity as Kubernetes runtimes pass it."""

    pod_namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    infra_container_id: str = ""
    mac: str = ""
    ips: tuple[str, ...] = ()
    raw: Mapping[str, str] = field(default_factory=dict)


def parse_cni_args(text: str) -> CniArgs:
    pairs: dict[str, str] = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CniError(
                Code.INVALID_ENV,
                f"invalid CNI_ARGS: item {item!r} is not KEY=VALUE (items are separated by ';')",
            )
        pairs[key] = value  # a repeated key: the last one wins, as in libcni
    if pairs.get("IgnoreUnknown") not in _TRUE:
        unknown = sorted(k for k in pairs if k not in _KNOWN_ARGS)
        if unknown:
            raise CniError(
                Code.INVALID_ENV,
                f"invalid CNI_ARGS: unknown key(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(_KNOWN_ARGS))} (or pass IgnoreUnknown=1)",
            )
    for key, (shape, allowed) in _POD_FIELDS.items():
        value = pairs.get(key, "")
        if value and not shape.fullmatch(value):
            shown = value if len(value) <= 80 else value[:77] + "..."
            raise CniError(Code.INVALID_ENV, f"invalid CNI_ARGS: {key}={shown!r}: must be {allowed}")
    mac = pairs.get("MAC", "")
    if mac:
        problem = mac_problem(mac)
        if problem:
            raise CniError(Code.INVALID_ENV, f"invalid CNI_ARGS: MAC={mac!r}: {problem}")
    ips: list[str] = []
    for ip in filter(None, (p.strip() for p in pairs.get("IP", "").split(","))):
        try:
            ips.append(str(ipaddress.ip_interface(ip)))
        except ValueError:
            raise CniError(
                Code.INVALID_ENV,
                f"invalid CNI_ARGS: IP={ip!r}: must be an IPv4 or IPv6 address (optionally /prefix)",
            ) from None
    return CniArgs(
        pod_namespace=pairs.get("K8S_POD_NAMESPACE", ""),
        pod_name=pairs.get("K8S_POD_NAME", ""),
        pod_uid=pairs.get("K8S_POD_UID", ""),
        infra_container_id=pairs.get("K8S_POD_INFRA_CONTAINER_ID", ""),
        mac=mac.lower(),
        ips=tuple(ips),
        raw=pairs,
    )


@dataclass(frozen=True)
class CniEnv:
    """The CNI_* environment of one call, validated (CNI_ARGS parsed)."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: CniArgs = field(default_factory=CniArgs)
    path: tuple[str, ...] = ()


def _required(environ: Mapping[str, str], var: str, command: str) -> str:
    value = environ.get(var, "")
    if not value:
        raise CniError(Code.INVALID_ENV, f"missing environment variable {var} (required for {command})")
    return value


def parse_env(environ: Mapping[str, str] | None = None) -> CniEnv:
    """Read and validate the CNI variables the verb in `CNI_COMMAND` needs."""
    env = os.environ if environ is None else environ
    command = env.get("CNI_COMMAND", "")
    if not command:
        raise CniError(Code.INVALID_ENV, "missing environment variable CNI_COMMAND")
    if command not in VERBS:
        raise CniError(
            Code.INVALID_ENV,
            f"invalid CNI_COMMAND={command!r}; allowed: {', '.join(VERBS)}",
        )
    path = tuple(p for p in env.get("CNI_PATH", "").split(os.pathsep) if p)
    if command in ("VERSION", "STATUS", "GC"):
        return CniEnv(command=command, path=path)

    container_id = check_env_name(
        "CNI_CONTAINERID",
        _required(env, "CNI_CONTAINERID", command),
        container_id_problem(env.get("CNI_CONTAINERID", "")),
    )
    ifname = check_env_name(
        "CNI_IFNAME", _required(env, "CNI_IFNAME", command), ifname_problem(env.get("CNI_IFNAME", ""))
    )
    netns = env.get("CNI_NETNS", "")
    if command in ("ADD", "CHECK"):
        netns = _required(env, "CNI_NETNS", command)
    if netns and not netns.startswith("/"):
        if command == "DEL":
            # podman sends CNI_NETNS=dummy style values around VERSION/DEL; a DEL must
            # still clean up, so an unusable netns is treated as "already gone".
            netns = ""
        else:
            raise CniError(
                Code.INVALID_ENV, f"invalid CNI_NETNS={netns!r}: must be an absolute path"
            )
    if "\0" in netns or "/../" in netns or netns.endswith("/.."):
        raise CniError(Code.INVALID_ENV, f"invalid CNI_NETNS={netns!r}: must be a plain path")
    return CniEnv(
        command=command,
        container_id=container_id,
        netns=netns,
        ifname=ifname,
        args=parse_cni_args(env.get("CNI_ARGS", "")),
        path=path,
    )
