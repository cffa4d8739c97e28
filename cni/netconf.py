"""Decoding of the network configuration on stdin: the parts every CNI plugin shares.

Plugin-specific fields (tenantnet's `bridge`, `vlan`, …; an IPAM plugin's `ranges`) are
read by the plugin from `NetConf.raw`; unknown keys are ignored as the spec demands.
`runtimeConfig` keys are matched case-insensitively because containerd capitalises them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cni import version as cniversion
from cni.errors import CniError, Code
from cni.names import check_config_name, network_name_problem
from cni.result import Result


def ci_get(mapping: Mapping[str, Any] | None, key: str, default: Any = None) -> Any:
    """`mapping[key]`, matching the key without regard to case."""
    if not mapping:
        return default
    if key in mapping:
        return mapping[key]
    lowered = key.lower()
    for k, v in mapping.items():
        if isinstance(k, str) and k.lower() == lowered:
            return v
    return default


@dataclass(frozen=True)
class NetConf:
    """A network configuration from stdin: the fields every plugin reads, and the raw object."""

    cni_version: str
    name: str
    type: str
    raw: dict[str, Any]
    runtime_config: dict[str, Any] = field(default_factory=dict)
    args_cni: dict[str, Any] = field(default_factory=dict)
    ipam: dict[str, Any] = field(default_factory=dict)
    prev_result: Result | None = None

    def runtime(self, key: str, default: Any = None) -> Any:
        return ci_get(self.runtime_config, key, default)


MAX_STDIN_BYTES = 1 << 20
MAX_NESTING = 64
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in the JSON text (strings skipped), without
    recursion: the stdlib decoder would recurse once per level and a hostile config of
    100,000 brackets would end in RecursionError instead of a decode error."""
    depth = deepest = 0
    for ch in _BRACKETS.findall(_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def bounded_loads(text: str) -> Any:
    """json.loads for a document a caller named, refusing (ValueError) nesting deeper than
    MAX_NESTING instead of recursing until RecursionError."""
    if text.count("[") + text.count("{") > MAX_NESTING and nesting_depth(text) > MAX_NESTING:
        raise ValueError(f"nests arrays/objects more than {MAX_NESTING} levels deep")
    return json.loads(text)


def decode_json(data: bytes | str) -> dict[str, Any]:
    """stdin as a JSON object (bounded in size and nesting), or code 6."""
    size = len(data.encode("utf-8", "surrogateescape")) if isinstance(data, str) else len(data)
    if size > MAX_STDIN_BYTES:
        raise CniError(Code.DECODE_FAILURE, f"network config on stdin is {size} bytes; at most "
                                            f"{MAX_STDIN_BYTES} allowed")
    try:
        # As json.loads does for bytes (UTF-8, -16 or -32), but decoded once here so that
        # the nesting is measured on the text the decoder will see.
        text = data if isinstance(data, str) else data.decode(json.detect_encoding(data), "surrogatepass")
    except (UnicodeDecodeError, LookupError) as exc:
        raise CniError(Code.DECODE_FAILURE, f"cannot decode network config from stdin: {exc}") from None
    if text.count("[") + text.count("{") > MAX_NESTING and nesting_depth(text) > MAX_NESTING:
        raise CniError(Code.DECODE_FAILURE, f"network config on stdin nests arrays/objects more than "
                                            f"{MAX_NESTING} levels deep")
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CniError(Code.DECODE_FAILURE, f"cannot decode network config from stdin: {exc}") from None
    if not isinstance(obj, dict):
        raise CniError(
            Code.DECODE_FAILURE,
            f"network config on stdin must be a JSON object, got {type(obj).__name__}",
        )
    return obj


def config_version(raw: Mapping[str, Any]) -> str:
    """The config's cniVersion if it is one we speak; errors are then emitted in it."""
    v = raw.get("cniVersion")
    return v if isinstance(v, str) and v in cniversion.SUPPORTED else cniversion.CURRENT


def parse_netconf(raw: dict[str, Any], *, need_name: bool = True) -> NetConf:
    if "cniVersion" not in raw:
        raise CniError(Code.INVALID_CONFIG, "invalid network config: cniVersion is missing")
    version = cniversion.require_supported(raw.get("cniVersion"))
    name = raw.get("name", "")
    if need_name or name:
        name = check_config_name("name", name, network_name_problem)
    ptype = raw.get("type", "")
    if not isinstance(ptype, str):
        raise CniError(Code.INVALID_CONFIG, f"invalid network config: type={ptype!r}: must be a string")

    def obj(key: str, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise CniError(
                Code.INVALID_CONFIG,
                f"invalid network config: {key}={value!r}: must be a JSON object",
            )
        return value

    runtime_config = obj("runtimeConfig", raw.get("runtimeConfig"))
    args = obj("args", raw.get("args"))
    args_cni = obj("args.cni", args.get("cni"))
    ipam = obj("ipam", raw.get("ipam"))
    prev = raw.get("prevResult")
    prev_result = Result.from_dict(prev, "prevResult") if prev is not None else None
    return NetConf(
        cni_version=version,
        name=name,
        type=ptype,
        raw=raw,
        runtime_config=runtime_config,
        args_cni=args_cni,
        ipam=ipam,
        prev_result=prev_result,
    )


def valid_attachments(raw: Mapping[str, Any]) -> set[tuple[str, str]]:
    """GC's list of attachments to keep, from `cni.dev/valid-attachments` (or the older key)."""
    items = raw.get("cni.dev/valid-attachments")
    if items is None:
        items = raw.get("cni.dev/attachments")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise CniError(
            Code.INVALID_CONFIG,
            "invalid network config: cni.dev/valid-attachments must be a list of "
            "{containerID, ifname} objects",
        )
    keep: set[tuple[str, str]] = set()
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("containerID"), str):
            raise CniError(
                Code.INVALID_CONFIG,
                f"invalid network config: cni.dev/valid-attachments item {item!r}: "
                "needs containerID and ifname strings",
            )
        keep.add((item["containerID"], str(item.get("ifname", ""))))
    return keep
