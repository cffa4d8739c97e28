"""The settings layer: where tenant input meets the admin's policy (docs/security.md).

A network config (a NAD, plus what Multus injects) is tenant input; the node config and the
tenancy policy are the admin's. This module is the one place that decides which NAD fields
are honoured, confined or refused before anything on the host is touched:

- host paths a NAD names (`logFile`, `configuration_path`, `runtimeConfig.CNIDeviceInfoFile`,
  and for IPAM `dataDir` / `resolvConf`) — only inside the directories the node config
  allows, through `hostfiles.confined` (no symlinks, no FIFOs, bounded reads);
- OVSDB endpoints (`socket_file`, or the one in `configuration_path`) — only the node's own
  and those listed in `ovsdbEndpoints`;
- the fabric (bridge, OVSDB, PFs) under a tenancy policy — the admin's declaration of the
  network, which a NAD may only repeat; anything else is code 120 naming the field;
- the IPAM type — never tenantnet itself.

`settle` runs it all for ADD and CHECK and returns the typed, checked `TenantnetConf`.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from cni.errors import CniError, Code, invalid_config
from cni.netconf import NetConf, bounded_loads, ci_get
from hostfiles.confined import confined, confined_dir, read_confined, within
from ipam.config import DEFAULT_DATA_DIR, HOST_LOCAL_DATA_DIR
from tenantnet.plugin.nodeconfig import NodeConfig, normalise_ovsdb_endpoint

# A NAD's `"vlan": "tenant"`: the tenancy policy (tenantnet/plugin/tenancy.py) picks the VLAN.
TENANT_VLAN = "tenant"

LOG_LEVELS = ("debug", "info", "warning", "error", "panic")
_LOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
# The plugin's own names: an `ipam.type` that is one of these would make tenantnet exec
# itself (for ever, on ADD and DEL alike).
SELF_TYPES = ("tenantnet",)
DELEGATION_ENV = "TENANTNET_DELEGATION_DEPTH"


# ---- logging ------------------------------------------------------------------------------

def log_settings(raw: dict[str, Any], node: NodeConfig) -> tuple[str, str]:
    """(log file, level) for this call: a NAD's `logFile` only directly in the node's log
    directory, `logLevel` from the known set; checked before any file is opened."""
    level = raw.get("logLevel")
    if level is not None and level not in LOG_LEVELS:
        raise invalid_config("logLevel", level, "must be one of debug, info, warning, error")
    log_file = raw.get("logFile")
    if log_file is not None:
        confined("logFile", log_file, (node.log_dir,), "a file")
        assert isinstance(log_file, str)
        if os.path.dirname(log_file) != node.log_dir or not _LOG_NAME.fullmatch(os.path.basename(log_file)):
            raise invalid_config("logFile", log_file, f"must be a file directly in the node's log "
                                                      f"directory {node.log_dir} (a name of letters, "
                                                      "digits, '_', '.', '-')")
        try:
            st = os.lstat(log_file)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise invalid_config("logFile", log_file, f"cannot be checked: {exc.strerror}") from None
        else:
            if not stat.S_ISREG(st.st_mode):
                raise invalid_config("logFile", log_file, "exists and is not a regular file (a symlink, "
                                                          "FIFO, device or directory is never written to)")
    chosen_level = "error" if level == "panic" else (level or node.log_level)
    return (log_file or node.log_file), chosen_level


# ---- OVSDB --------------------------------------------------------------------------------

def _allowed_endpoint(field: str, value: Any, node: NodeConfig) -> str:
    endpoint = normalise_ovsdb_endpoint(value) if isinstance(value, str) else None
    if endpoint is None:
        raise invalid_config(field, value, "must be unix:/path, tcp:host:port, ssl:host:port or /path")
    if endpoint.startswith("ssl:"):
        raise CniError(Code.UNSUPPORTED_FIELD, f"unsupported field value: {field}={value!r}: ssl: "
                                               "endpoints are not supported yet; use unix: or tcp:")
    if endpoint not in node.allowed_ovsdb():
        raise invalid_config(field, value, "must be an OVSDB endpoint the node config allows "
                                           f"({', '.join(node.allowed_ovsdb())}; add others to "
                                           "ovsdbEndpoints)")
    return endpoint


def _socket_from_configuration_path(path: Any, node: NodeConfig) -> Any:
    """ovs-cni's flat-file override: a JSON file that may hold `socket_file`."""
    data = read_confined("configuration_path", path, node.ovs_configuration_paths, "a JSON file")
    try:
        doc = bounded_loads((data or b"").decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_config("configuration_path", path, f"is not a usable JSON file ({exc})") from None
    return doc.get("socket_file") if isinstance(doc, dict) else None


def ovsdb_endpoint(raw: dict[str, Any], node: NodeConfig) -> str:
    """The OVSDB endpoint a network config names (ovs-cni's `socket_file` or
    `configuration_path`), else the node's; only endpoints the node config allows."""
    if raw.get("socket_file") is not None:
        return _allowed_endpoint("socket_file", raw["socket_file"], node)
    if raw.get("configuration_path") is not None:
        inner = _socket_from_configuration_path(raw["configuration_path"], node)
        if inner is not None:
            return _allowed_endpoint("configuration_path socket_file", inner, node)
    return node.ovsdb


# ---- device info, IPAM --------------------------------------------------------------------

def device_info_file(conf: NetConf, node: NodeConfig) -> str | None:
    """Multus's `runtimeConfig.CNIDeviceInfoFile`, confined to the node's `deviceInfoDir`."""
    value = conf.runtime("CNIDeviceInfoFile")
    if value in (None, ""):
        return None
    # A file already there (a device plugin's) must be one we may read and replace: checked
    # now, before the VF is touched, not when the write comes.
    read_confined("runtimeConfig.CNIDeviceInfoFile", value, (node.device_info_dir,), "a file",
                  missing_ok=True)
    return str(value)


def ipam_type(conf: NetConf) -> str:
    """`ipam.type`: a plain executable name, and never tenantnet itself."""
    if not conf.ipam:
        return ""
    value = conf.ipam.get("type", "")
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", value):
        raise invalid_config("ipam.type", value, "must name an IPAM plugin executable on CNI_PATH")
    if value in SELF_TYPES:
        raise invalid_config("ipam.type", value, "names tenantnet itself; an IPAM plugin must be "
                                                 "another executable (e.g. tenantnet-ipam, host-local)")
    return value


# Where IPAM plugins we know keep their state when the config names no dataDir.
DEFAULT_DATA_DIRS = {"host-local": HOST_LOCAL_DATA_DIR, "tenantnet-ipam": DEFAULT_DATA_DIR}


def ipam_paths(ipam: dict[str, Any], node: NodeConfig) -> None:
    """`dataDir` and `resolvConf` of any IPAM type: tenantnet hands them to the IPAM plugin it
    runs as root, so they are confined like its own paths — and checked here, before the
    plugin runs, because another plugin would follow a symlink or block on a FIFO."""
    if not isinstance(ipam, dict):
        return
    if ipam.get("dataDir") not in (None, ""):
        confined_dir("ipam.dataDir", ipam["dataDir"], node.ipam_data_dirs)
    else:
        default = node.ipam_data_dir if ipam.get("type") == "tenantnet-ipam" else \
            DEFAULT_DATA_DIRS.get(ipam.get("type", ""))
        if default is not None and not within(default, node.ipam_data_dirs):
            raise invalid_config("ipam.dataDir", None, f"is not set, and {ipam['type']}'s default {default} "
                                                       "is not one of the node config's ipamDataDirs "
                                                       f"({', '.join(node.ipam_data_dirs)}); set it")
    if ipam.get("resolvConf") not in (None, ""):
        read_confined("ipam.resolvConf", ipam["resolvConf"], node.resolv_conf_paths, "a file")


def delegation_depth(environ: Any) -> int:
    """How many tenantnet calls are above this one (0: called by the runtime or Multus)."""
    value = environ.get(DELEGATION_ENV, "") if environ is not None else ""
    return int(value) if isinstance(value, str) and value.isdigit() else 0


# ---- the fabric under a tenancy policy ----------------------------------------------------

def _deny(field: str, value: Any, why: str) -> CniError:
    return CniError(Code.TENANT_DENIED, f"tenant isolation: {field}={value!r}: {why}")


def bind_fabric(policy: Any, raw: dict[str, Any], node: NodeConfig) -> dict[str, Any]:
    """The NAD with the admin's declared fabric filled in; a NAD field naming another fabric
    is refused with code 120. Without a policy, or for an undeclared network (which the
    policy then refuses itself), the NAD is returned as it is."""
    if policy is None:
        return raw
    decl = policy.networks.get(raw.get("name"))
    if decl is None:
        return raw
    name = raw.get("name")
    where = f"network {name} is declared by the admin"
    out = dict(raw)
    mode = raw.get("mode")
    if mode is not None and mode not in decl.modes():
        raise _deny("mode", mode, f"{where} for mode {' or '.join(decl.modes())}")
    if decl.overlay or raw.get("overlay") not in (None, "", False):
        return _bind_overlay(decl, raw, out, where)
    if raw.get("bridge") not in (None, "") and raw["bridge"] != decl.bridge:
        raise _deny("bridge", raw["bridge"], f"{where} on bridge {decl.bridge or '(none: SR-IOV)'}")
    if decl.bridge:
        declared_db = decl.ovsdb or node.ovsdb
        for field in ("socket_file", "configuration_path"):
            if raw.get(field) is None:
                continue
            got = ovsdb_endpoint({field: raw[field]}, node)
            if got != declared_db:
                raise _deny(field, raw[field], f"{where} on OVSDB {declared_db}, not {got}")
        out["bridge"] = decl.bridge
        out.pop("configuration_path", None)
        out["socket_file"] = declared_db
    if raw.get("pf") is not None and raw["pf"] not in decl.pfs:
        raise _deny("pf", raw["pf"], f"{where} on PFs {', '.join(decl.pfs) or '(none)'}")
    pfs = raw.get("pfs")
    if pfs is not None and (not isinstance(pfs, list) or not set(pfs) <= set(decl.pfs)):
        raise _deny("pfs", pfs, f"{where} on PFs {', '.join(decl.pfs) or '(none)'}")
    runtime = raw.get("runtimeConfig")
    runtime_vf = ci_get(runtime, "deviceID") if isinstance(runtime, dict) else None
    names_vf = {k: v for k, v in (("runtimeConfig.deviceID", runtime_vf), ("deviceID", raw.get("deviceID")),
                                  ("pciBusID", raw.get("pciBusID"))) if v not in (None, "")}
    if names_vf and not decl.pfs:
        field, value = next(iter(names_vf.items()))
        raise _deny(field, value, f"{where} without PFs (an OVS veth port), so no VF may be named")
    if decl.pfs and raw.get("pf") is None and pfs is None:
        out["pfs"] = list(decl.pfs)
    return out


def _bind_overlay(decl: Any, raw: dict[str, Any], out: dict[str, Any], where: str) -> dict[str, Any]:
    """An overlay network's declaration over the NAD: overlay and rail are the admin's; a NAD
    may not make a declared VLAN network an overlay, nor name another rail or a bridge."""
    if not decl.overlay:
        fabric = f"bridge {decl.bridge}" if decl.bridge else f"PFs {', '.join(decl.pfs)}"
        raise _deny("overlay", raw.get("overlay"), f"{where} as a VLAN network on {fabric}, not an overlay")
    for field, declared in (("overlay", decl.overlay), ("rail", decl.rail)):
        if raw.get(field) not in (None, "") and raw[field] != declared:
            raise _deny(field, raw[field], f"{where} with {field} {declared or '(the node default)'}")
    for field in ("bridge", "socket_file", "configuration_path"):
        if raw.get(field) not in (None, ""):
            raise _deny(field, raw[field], f"{where} as an overlay: its port goes on the rail's integration "
                                           "bridge, which the node config names")
    if raw.get("pf") is not None and raw["pf"] not in decl.pfs:
        raise _deny("pf", raw["pf"], f"{where} on PFs {', '.join(decl.pfs) or '(none)'}")
    pfs = raw.get("pfs")
    if pfs is not None and (not isinstance(pfs, list) or not set(pfs) <= set(decl.pfs)):
        raise _deny("pfs", pfs, f"{where} on PFs {', '.join(decl.pfs) or '(none)'}")
    out["overlay"] = decl.overlay
    if decl.rail:
        out["rail"] = decl.rail
    else:
        out.pop("rail", None)
    if decl.pfs and raw.get("pf") is None and raw.get("pfs") is None:
        out["pfs"] = list(decl.pfs)
    return out
