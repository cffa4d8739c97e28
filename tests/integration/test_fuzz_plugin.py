"""Property-based fuzzing of the whole plugin against the lab, with hostile tenant input.

Each example starts from the valid `ovs` NetConf of `PluginRunner.conf()`, lets hypothesis
replace, insert or drop the fields a tenant writes (docs/security.md: the whole network
config on stdin, and `CNI_ARGS`), runs ADD in-process (`tenantnet.entry.plugin.run_in_process`) in a
fresh netns and then DEL with the same input, and checks:

- ADD prints exactly one JSON document: a result, or an error with an int code < 200 and a
  msg; an error code is one of docs/errors.md's and never 100. DEL prints nothing or one
  such error.
- After the DEL nothing is left: no OVS port of ours, no host link of this example, no
  record or temp file under the state dir's attachments, no allocation in the lab's IPAM
  directories.
- Nothing outside the lab's directories was created, changed or removed: /, /tmp and /run,
  the lab's parent directory, the lab's own directory outside the places tenantnet may
  write, and the plugin's working directory are snapshotted around every example. /var/lib,
  /var/log, /etc, /root and /dev/shm (libcni's cache, tenantnet's default state, IPAM store
  and log, the Kubernetes lab's files, semaphores: other runs on this machine write there
  all the time) are seen by the plugin through overlays whose upper layers are this file's
  own (hostile_support.PrivateWrites, entered by the one worker thread every call runs on):
  whatever is in the upper layers is the plugin's doing, whatever its name. Nothing was written into a FIFO the config names; no
  process outlived its call and no delegate ran another process.
- An ADD that succeeded got past no constraint of the trust model (`refusals()` restates
  them independently of the code: logFile, logLevel, socket_file, configuration_path,
  ipam.type/dataDir/resolvConf, vlan, trunk, mtu, the MACs, the IP lists, runtimeConfig.dns,
  prevResult, CNI_ARGS MAC/IP).

Four properties: the paths a tenant names, the values, everything at once with CNI_ARGS,
and CNI_ARGS alone; each also runs one explicit example per row of docs/security.md that
the random search might not reach. Each kind of violation raises its own exception class,
so hypothesis shrinks and reports each kind on its own.

Paths in the strategies are templates (`⟦LOG⟧/…`) resolved against this session's lab.
Every name a path strategy ends in contains "tnfuzz" and traversals come only before it, so
whatever a bug makes the plugin create outside the lab carries the marker and is removed
after the example (anything else is reported, never guessed at). Hostile text never
contains '/' here: only the templates reach real directories. This machine runs other labs
and test sessions at the same time, so host-wide directories count only paths this file's
input or tenantnet's defaults can name, and host links only this example's.

Safety nets, because a bug must not take the host down with it: the FIFOs a config may name
are served by a thread (a reader for those the plugin may write, a writer for those it may
read) so that no open blocks; the test process is a child subreaper, and a delegate that
starts another process (ipam.type "tenantnet" re-executing itself) is stopped and killed at
once, as is anything running past CALL_LIMIT or outliving its call.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import BIN, GO_PLUGINS, Lab, PluginRunner, new_cid
from tests.integration.hostile_support import OtherWork, PrivateWrites
from tests.unit.test_fuzz_decode import (
    HOSTILE,
    env_text,
    mac_ok,
    numbers,
    prev_result_problems,
    prev_results,
)

MARK = "tnfuzz"
NETWORK = "tnfuzz-net"
IFNAME = "net1"
DOCUMENTED = {1, 2, 4, 6, 7, 11, 101, 102, 104, 110, 111, 120}  # docs/errors.md
CALL_LIMIT = 20.0  # seconds; a CNI call of the lab takes milliseconds
MAX_FILE = 64 << 10
MODES = ("ovs", "sriov", "ovs-offload")
DEFAULT_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1"
PR_SET_CHILD_SUBREAPER = 36
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")

FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

# ---- strategies (templates: ⟦KEY⟧ is replaced by this session's lab path) ------------------

T = {k: f"⟦{k}⟧" for k in ("LOG", "DEVINFO", "IPAM", "HOSTLOCAL", "RESOLV", "OVSD", "LAB", "LAB0",
                           "OUT", "OVSDB", "OVSSOCK", "BRIDGE", "LABNAME")}

# Text without '/': as a path it can only name something in the plugin's working directory.
safe_text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12)).map(lambda s: s.replace("/", "_"))
junk_scalars = st.one_of(st.none(), st.booleans(), numbers, safe_text)
junk = st.recursive(
    junk_scalars,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(safe_text, c, max_size=3)),
    max_leaves=8,
)


def fuzzed(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: usually (3 in 4) from `strategy`, else junk of any type."""
    return st.integers(0, 3).flatmap(lambda i: junk if i == 0 else strategy)


_BASES = [T["LOG"], T["DEVINFO"], T["IPAM"], T["HOSTLOCAL"], T["RESOLV"], T["OVSD"], T["LAB"], T["LAB0"],
          T["OUT"], "/etc", "/tmp", "/root", "/var/log", "/var/lib", "/run", "/dev/shm", ""]
# A directory a traversal names carries the marker too, so that whatever gets created is marked.
_TRAVERSALS = ["", "", f"/{MARK}-sub", f"/{MARK}-sub/deeper", "/..", "/../..", "/.", "//", f"/./{MARK}-sub",
               "/" + "../" * 16 + "tmp", "/" + "../" * 16 + "etc"]
_NAMES = st.builds(
    lambda stem, ext: MARK + stem + ext,
    st.sampled_from(["", "-a", "_b.c", "-é", "-\u202e", " x", "-\n", "-\0", "-\t", "..x", "-" + "a" * 240]),
    st.sampled_from(["", ".log", ".json", ".conf", "/", "/."]),
)


def paths(anchor: str, specials: list[str]) -> st.SearchStrategy[Any]:
    """Path-valued field: prepared files, absolute and relative paths (any traversal *before*
    a "tnfuzz" name), junk."""
    absolute = st.builds(lambda b, t, n: f"{b}{t}/{n}",
                         st.sampled_from([anchor] * 4 + _BASES), st.sampled_from(_TRAVERSALS), _NAMES)
    relative = st.builds(lambda t, n: t + n, st.sampled_from(["", "./", "../", "../../", f"{MARK}-sub/"]), _NAMES)
    return st.one_of(st.sampled_from(specials), absolute, relative, junk)


log_files = paths(T["LOG"], [f"{T['LOG']}/{MARK}.log", f"{T['LOG']}/{MARK}-w.fifo", f"{T['LOG']}/{MARK}-link.log",
                             f"{T['LOG']}/{MARK}-dir.log", f"{T['OUT']}/{MARK}-canary.log", "", f"{T['LOG']}/"])
devinfo_files = paths(T["DEVINFO"], [f"{T['DEVINFO']}/{MARK}.json", f"{T['DEVINFO']}/{MARK}-existing.json",
                                     f"{T['DEVINFO']}/sub/{MARK}.json", f"{T['DEVINFO']}/{MARK}-link.json",
                                     f"{T['DEVINFO']}/{MARK}-dir.json", f"{T['OUT']}/{MARK}-canary-devinfo.json"])
configuration_paths = paths(T["OVSD"], [f"{T['OVSD']}/{MARK}-{n}" for n in (
    "ok.json", "bare.json", "none.json", "other.json", "tcp.json", "big.json", "bad.json", "r.fifo",
    "link.json", "dir.json")] + [f"{T['OVSD']}/sub/{MARK}-ok.json", T["OVSD"], f"{T['OUT']}/{MARK}-canary-ovs.json"])
resolv_confs = paths(T["RESOLV"], [f"{T['RESOLV']}/{MARK}-{n}" for n in (
    "ok.conf", "big.conf", "r.fifo", "link.conf", "dir.conf")] + [T["RESOLV"], f"{T['OUT']}/{MARK}-canary.conf"])
data_dirs = paths(T["HOSTLOCAL"], [T["HOSTLOCAL"], T["IPAM"], f"{T['IPAM']}/{MARK}-sub", f"{T['HOSTLOCAL']}/",
                                   f"{T['HOSTLOCAL']}/./{MARK}", f"{T['OUT']}/{MARK}-ipam"])
socket_files = st.one_of(
    st.sampled_from([T["OVSDB"], T["OVSSOCK"], T["OVSDB"] + "/", f"unix:{T['LAB']}//db.sock",
                     f"unix:{T['LAB']}/./db.sock", f"unix:{T['LAB']}/../{T['LABNAME']}/db.sock",
                     T["OVSDB"] + "\n", "tcp:127.0.0.1:1", "ssl:127.0.0.1:6640", "unix:/run/openvswitch/db.sock",
                     f"unix:{T['OUT']}/{MARK}.sock", "", "unix:", "unix:relative.sock"]),
    junk,
)
macs = fuzzed(st.one_of(
    st.sampled_from(["02:00:00:00:00:01", "02:AB:CD:EF:00:01", "01:00:5e:00:00:01", "00:00:00:00:00:00",
                     "ff:ff:ff:ff:ff:ff", "02:00:00:00:00:01\n", "02-00-00-00-00-01", "", "zz", "2:0:0:0:0:1"]),
    st.lists(st.integers(0, 255), min_size=6, max_size=6).map(lambda b: ":".join(f"{x:02x}" for x in b)),
))
ip_items = fuzzed(st.sampled_from(["10.77.0.5/24", "10.77.0.6", "10.77.0.5/24 ", "10.78.0.5/24", "fd00::5/64",
                                   "x", "10.77.0.999/24", "", "10.77.0.0/24", "10.77.0.255/24"]))
ip_lists = fuzzed(st.lists(ip_items, max_size=3))
dns_lists = {
    "servers": st.lists(fuzzed(st.sampled_from(["10.0.0.53", "fd00::53", "x", "10.0.0.53\nnameserver 1.1.1.1",
                                                "10.0.0.53 ", ""])), max_size=3),
    "searches": st.lists(fuzzed(st.sampled_from(["example.org", "a b", "x\ny", ""])), max_size=3),
    "options": st.lists(fuzzed(st.sampled_from(["ndots:5", "rotate", "x\ny"])), max_size=3),
}
dns_values = fuzzed(st.fixed_dictionaries({}, optional={
    **dns_lists, "Servers": dns_lists["servers"], "Searches": dns_lists["searches"]}))
runtime_configs = fuzzed(st.fixed_dictionaries({}, optional={
    "mac": macs, "ips": ip_lists, "deviceID": fuzzed(st.sampled_from(["0000:3b:00.2", "zz", ""])),
    "CNIDeviceInfoFile": devinfo_files, "dns": dns_values,
    "Mac": macs, "IPs": ip_lists, "DNS": dns_values,  # containerd capitalises capability keys
}))
vlan_ids = st.one_of(st.integers(-2, 4100), st.sampled_from([0, 4094, 4095]), junk)
trunks = fuzzed(st.lists(fuzzed(st.one_of(
    st.fixed_dictionaries({"id": vlan_ids}),
    st.fixed_dictionaries({"minID": vlan_ids, "maxID": vlan_ids}),
)), max_size=3))
ranges = fuzzed(st.sampled_from([
    [[{"subnet": "10.77.0.0/24"}]], [[{"subnet": "10.77.0.0/30"}]], [[{"subnet": "fd00:77::/64"}]],
    [[{"subnet": "10.77.0.0/24", "rangeStart": "10.77.0.250", "rangeEnd": "10.77.0.10"}]],
    [[{"subnet": "10.77.0.0/24", "gateway": "10.78.0.1"}]], [[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd00:77::/64"}]],
    [[{"subnet": "10.77.0.0/32"}]], [[{"subnet": "x"}]], [[]], [], "10.77.0.0/24",
]))
ipam_types = fuzzed(st.sampled_from(["host-local", "host-local", "tenantnet-ipam", "static", "tenantnet", "dhcp",
                                     "no-such", "", "host-local\n", "HOST-LOCAL", "tenantnetctl", ".", "..",
                                     "host-local "]))
IPAM_FIELDS = {"type": ipam_types, "dataDir": data_dirs, "resolvConf": resolv_confs, "ranges": ranges}


@st.composite
def ipams(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(junk)
    ipam: dict[str, Any] = {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]], "dataDir": T["HOSTLOCAL"]}
    for key in draw(st.lists(st.sampled_from(sorted(IPAM_FIELDS)), unique=True, max_size=3)):
        if draw(st.integers(0, 5)) == 0:
            ipam.pop(key, None)
        else:
            ipam[key] = draw(IPAM_FIELDS[key])
    return ipam


FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "logFile": log_files,
    "logLevel": fuzzed(st.sampled_from(["debug", "info", "warning", "error", "panic", "", "DEBUG", "trace",
                                        "info\n", "critical"])),
    "runtimeConfig": runtime_configs,
    "args": fuzzed(st.fixed_dictionaries({"cni": fuzzed(st.fixed_dictionaries({"ips": ip_lists}))})),
    "prevResult": prev_results,
    "bridge": fuzzed(st.sampled_from([T["BRIDGE"], "br-nowhere", "", T["BRIDGE"] + "\n", " " + T["BRIDGE"],
                                      "a" * 64, "br_lab", T["BRIDGE"].upper(), "..", "br lab"])),
    "vlan": st.one_of(vlan_ids, st.sampled_from(["100", "tenant", True, 1.5, 100.0])),
    "trunk": trunks,
    "mtu": fuzzed(st.one_of(st.integers(0, 70000), st.sampled_from([67, 68, 1500, 9000, 65535, 65536]))),
    "mac": macs,
    "socket_file": socket_files,
    "configuration_path": configuration_paths,
    "ipam": ipams(),
    "mode": fuzzed(st.sampled_from(["ovs", "sriov", "ovs-offload", "", "OVS", "ovs\n"])),
}


def base_conf(version: str = "1.0.0") -> dict[str, Any]:
    """The valid `ovs` config every example starts from (PluginRunner.conf(), on this lab)."""
    return {"cniVersion": version, "name": NETWORK, "type": "tenantnet", "bridge": T["BRIDGE"], "vlan": 100,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]], "dataDir": T["HOSTLOCAL"]}}


@st.composite
def netconfs(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]], max_fields: int) -> dict[str, Any]:
    """The base config with up to `max_fields` of `fields` replaced, inserted or dropped; a
    dotted key ("ipam.dataDir") is a field inside an object (made if missing)."""
    conf = base_conf(draw(st.sampled_from(["1.0.0", "1.1.0", "0.4.0", "0.3.1"])))
    for name in draw(st.lists(st.sampled_from(sorted(fields)), unique=True, min_size=1, max_size=max_fields)):
        outer, _, inner = name.partition(".")
        target, key = conf, outer
        if inner:
            if not isinstance(conf.get(outer), dict):
                conf[outer] = {}
            target, key = conf[outer], inner
        if draw(st.integers(0, 7)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(fields[name])
    return conf


OMIT = object()  # in with_fields(): drop the field


def with_fields(changes: dict[str, Any]) -> dict[str, Any]:
    """base_conf() with dotted fields set (or dropped: OMIT) — for explicit examples."""
    conf = base_conf()
    for name, value in changes.items():
        outer, _, inner = name.partition(".")
        target, key = (conf.setdefault(outer, {}), inner) if inner else (conf, outer)
        if value is OMIT:
            target.pop(key, None)
        else:
            target[key] = value
    return conf


def examples(*changes: dict[str, Any]) -> Any:
    """One explicit hypothesis example per spec row that must hold (each runs on every run)."""
    def decorate(test: Any) -> Any:
        for change in reversed(changes):
            test = example(conf=with_fields(change))(test)
        return test
    return decorate


# Paths a tenant names (docs/security.md, "Fields that reach the host").
PATH_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "logFile": log_files, "configuration_path": configuration_paths, "socket_file": socket_files,
    "ipam.dataDir": data_dirs, "ipam.resolvConf": resolv_confs, "ipam.type": ipam_types,
    "runtimeConfig.CNIDeviceInfoFile": devinfo_files,
}
# Values: MACs, VLANs, IP lists, DNS, prevResult, …
VALUE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "logLevel": FIELDS["logLevel"], "runtimeConfig.mac": macs, "runtimeConfig.ips": ip_lists,
    "runtimeConfig.dns": dns_values, "runtimeConfig.deviceID": fuzzed(st.sampled_from(["0000:3b:00.2", "zz", ""])),
    "args": FIELDS["args"], "prevResult": prev_results, "bridge": FIELDS["bridge"], "vlan": FIELDS["vlan"],
    "trunk": trunks, "mtu": FIELDS["mtu"], "mac": macs, "mode": FIELDS["mode"], "ipam.ranges": ranges,
}


_ARG_VALUES = {
    "K8S_POD_NAMESPACE": st.sampled_from(["ns1", "", "kube-system", "a" * 300]),
    "K8S_POD_NAME": st.sampled_from(["pod1", "", "pod\n1", "../pod"]),
    "K8S_POD_UID": st.sampled_from(["0f0e0d0c-0000-4000-8000-000000000001", "", "x"]),
    "K8S_POD_INFRA_CONTAINER_ID": st.sampled_from(["abc", ""]),
    "MAC": st.sampled_from(["02:00:00:00:00:02", "01:00:5e:00:00:01", "00:00:00:00:00:00", "zz", "",
                            "02:00:00:00:00:02\n"]),
    "IP": st.sampled_from(["10.77.0.7/24", "10.77.0.7", "10.77.0.7/24,fd00:77::7/64", "10.77.0.999", "",
                           "10.99.0.7/24", ",,", "x"]),
    "IgnoreUnknown": st.sampled_from(["1", "true", "0", "false", ""]),
}
cni_args_items = st.one_of(
    st.sampled_from(sorted(_ARG_VALUES)).flatmap(
        lambda k: st.one_of(_ARG_VALUES[k], env_text).map(lambda v: f"{k}={v}")),
    st.sampled_from(["FOO=bar", "=x", "novalue", " ", "K8S_POD_NAME", "a=b=c"]),
    env_text,
)
cni_args_strings = st.one_of(st.just(DEFAULT_ARGS), st.lists(cni_args_items, max_size=5).map(";".join))


def resolve(value: Any, tokens: dict[str, str]) -> Any:
    if isinstance(value, str):
        for token, real in tokens.items():
            value = value.replace(token, real)
        return value
    if isinstance(value, list):
        return [resolve(v, tokens) for v in value]
    if isinstance(value, dict):
        return {resolve(k, tokens): resolve(v, tokens) for k, v in value.items()}
    return value


# ---- the trust model's constraints (docs/security.md), independent of the code ------------


def plain_path(path: Any) -> bool:
    return (isinstance(path, str) and path.startswith("/") and "\0" not in path
            and os.path.normpath(path) == path and not path.startswith("//"))


def within(path: str, roots: list[Path]) -> bool:
    return any(path == str(r) or path.startswith(str(r).rstrip("/") + "/") for r in roots)


def regular_small_file(path: str) -> str | None:
    """Why `path` is not a regular file of at most 64 KiB (not following symlinks), or None."""
    try:
        st_ = os.lstat(path)
    except OSError as exc:
        return f"cannot be stat'ed ({exc.strerror})"
    if not stat.S_ISREG(st_.st_mode):
        return "is not a regular file"
    if st_.st_size > MAX_FILE:
        return f"is {st_.st_size} bytes"
    return None


def ci(mapping: Any, key: str) -> Any:
    if not isinstance(mapping, dict):
        return None
    if key in mapping:
        return mapping[key]
    return next((v for k, v in mapping.items() if isinstance(k, str) and k.lower() == key.lower()), None)


def endpoint(value: str) -> str:
    return "unix:" + value if value.startswith("/") else value


def ip_list_problems(where: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        return [f"{where}={value!r} is not a list"]
    out = []
    for item in value:
        try:
            if not isinstance(item, str):
                raise ValueError
            ipaddress.ip_interface(item)
        except ValueError:
            out.append(f"{where} item {item!r} is not an IP address")
    return out


def vlan_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 4094


def refusals(conf: dict[str, Any], cni_args: str, fz: Fuzz) -> list[str]:
    """Everything in this input that docs/security.md says must be refused."""
    out: list[str] = []
    absent = (None, "")
    log_file = conf.get("logFile")
    if log_file not in absent:
        name = os.path.basename(log_file) if isinstance(log_file, str) else ""
        if not plain_path(log_file) or os.path.dirname(log_file) != str(fz.log_dir) \
                or not _FILE_NAME_RE.fullmatch(name) or name in (".", ".."):
            out.append(f"logFile={log_file!r} is not a file directly in the node's log directory {fz.log_dir}")
        elif os.path.lexists(log_file) and not stat.S_ISREG(os.lstat(log_file).st_mode):
            out.append(f"logFile={log_file!r} is not a regular file")
    if conf.get("logLevel") not in (*absent, "debug", "info", "warning", "error", "panic"):
        out.append(f"logLevel={conf.get('logLevel')!r}")
    socket_file = conf.get("socket_file")
    if socket_file not in absent:
        if not isinstance(socket_file, str) or endpoint(socket_file) not in fz.endpoints:
            out.append(f"socket_file={socket_file!r} is not an endpoint the node config allows")
    elif conf.get("configuration_path") not in absent:
        path = conf["configuration_path"]
        if not plain_path(path) or not within(path, fz.ovs_dirs):
            out.append(f"configuration_path={path!r} is not inside ovsConfigurationPaths")
        elif regular_small_file(path):
            out.append(f"configuration_path={path!r} {regular_small_file(path)}")
        else:
            try:
                data = json.loads(Path(path).read_text())
            except ValueError:
                data = None
            inner = data.get("socket_file") if isinstance(data, dict) else None
            if data is None or (inner not in absent and (not isinstance(inner, str)
                                                         or endpoint(inner) not in fz.endpoints)):
                out.append(f"configuration_path={path!r} names socket_file={inner!r} (or is not JSON)")
    if conf.get("mode") is not None and conf.get("mode") not in MODES:
        out.append(f"mode={conf.get('mode')!r}")
    vlan = conf.get("vlan")
    if vlan is not None and vlan != "tenant" and not vlan_ok(vlan):
        out.append(f"vlan={vlan!r}")
    trunk = conf.get("trunk")
    if trunk is not None:
        items = trunk if isinstance(trunk, list) else [None]
        for item in items:
            ok = isinstance(item, dict) and (
                ("id" in item and vlan_ok(item["id"]))
                or ("id" not in item and vlan_ok(item.get("minID")) and vlan_ok(item.get("maxID"))
                    and item["minID"] <= item["maxID"]))
            if not ok:
                out.append(f"trunk item {item!r}")
    mtu = conf.get("mtu")
    if mtu is not None and not (isinstance(mtu, int) and not isinstance(mtu, bool) and 68 <= mtu <= 65535):
        out.append(f"mtu={mtu!r}")
    runtime = conf.get("runtimeConfig")
    if runtime is not None and not isinstance(runtime, dict):
        out.append(f"runtimeConfig={runtime!r} is not an object")
    for where, value in (("mac", conf.get("mac")), ("runtimeConfig.mac", ci(runtime, "mac"))):
        if value not in absent and not (isinstance(value, str) and mac_ok(value)):
            out.append(f"{where}={value!r} is not a unicast MAC")
    args = conf.get("args")
    if args is not None and not isinstance(args, dict):
        out.append(f"args={args!r} is not an object")
    args_cni = args.get("cni") if isinstance(args, dict) else None
    if args_cni is not None and not isinstance(args_cni, dict):
        out.append(f"args.cni={args_cni!r} is not an object")
    out += ip_list_problems("runtimeConfig.ips", ci(runtime, "ips"))
    out += ip_list_problems("args.cni.ips", args_cni.get("ips") if isinstance(args_cni, dict) else None)
    dns = ci(runtime, "dns")
    if dns is not None:
        if not isinstance(dns, dict):
            out.append(f"runtimeConfig.dns={dns!r} is not an object")
        else:
            for key in ("servers", "searches", "options"):
                value = ci(dns, key)
                if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                    out.append(f"runtimeConfig.dns.{key}={value!r} is not a list of strings")
            servers = ci(dns, "servers")
            for server in servers if isinstance(servers, list) else []:
                try:
                    ipaddress.ip_address(server)
                except (ValueError, TypeError):
                    out.append(f"runtimeConfig.dns.servers item {server!r} is not an IP address")
    if conf.get("prevResult") is not None:
        out += [f"prevResult: {p}" for p in prev_result_problems(conf["prevResult"])]
    pairs: dict[str, str] = {}
    for item in cni_args.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            pairs[key.strip()] = value  # the last one wins
    if pairs.get("MAC") and not mac_ok(pairs["MAC"]):
        out.append(f"CNI_ARGS MAC={pairs['MAC']!r} is not a unicast MAC")
    out += ip_list_problems("CNI_ARGS IP", [ip.strip() for ip in pairs.get("IP", "").split(",") if ip.strip()])
    ipam = conf.get("ipam")
    if ipam is not None and not isinstance(ipam, dict):
        out.append(f"ipam={ipam!r} is not an object")
    if isinstance(ipam, dict):
        ptype = ipam.get("type")
        if ptype == "tenantnet" or (ptype not in absent and not (isinstance(ptype, str) and _NAME_RE.fullmatch(ptype))):
            out.append(f"ipam.type={ptype!r}")
        data_dir = ipam.get("dataDir")
        if data_dir not in absent and (not plain_path(data_dir) or not within(data_dir, fz.ipam_dirs)):
            out.append(f"ipam.dataDir={data_dir!r} is not inside ipamDataDirs")
        resolv = ipam.get("resolvConf")
        if resolv not in absent:
            if not plain_path(resolv) or not within(resolv, fz.resolv_dirs):
                out.append(f"ipam.resolvConf={resolv!r} is not inside resolvConfPaths")
            elif regular_small_file(resolv):
                out.append(f"ipam.resolvConf={resolv!r} {regular_small_file(resolv)}")
    return out


# ---- the harness ---------------------------------------------------------------------------


def _not_ours(path: str) -> bool:
    """For host-wide directories: a path no input of this file (nor a tenantnet default) names."""
    if path.startswith(("/root/.claude", "/run/netns")):
        return True
    return MARK not in path and "tenantnet" not in path.lower()


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, depth) of every process below `pid` (depth 1: its children)."""
    found: list[tuple[int, int]] = []
    todo = [(pid, 0)]
    while todo:
        parent, depth = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                found.append((kid, depth + 1))
                todo.append((kid, depth + 1))
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip() or f"[{pid}]"
    except OSError:
        return f"[{pid}]"


def _stop_and_kill() -> list[str]:
    """SIGSTOP every descendant (so none can fork any more), then SIGKILL them all."""
    me, stopped, seen = os.getpid(), set(), []
    while True:
        new = [p for p, _ in _descendants(me) if p not in stopped]
        if not new:
            break
        for pid in new:
            seen.append(_cmdline(pid))
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            stopped.add(pid)
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return seen


def _reap_orphans() -> None:
    """Zombies re-parented to us (we are a subreaper); only between calls, when no
    subprocess of the plugin is waiting for its own child."""
    for pid, depth in _descendants(os.getpid()):
        if depth == 1:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


class ChildWatch:
    """Around one plugin call: a delegate that starts another process, or anything running
    past CALL_LIMIT, is stopped and killed; what outlives the call is killed too."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fuzz-childwatch")

    def __enter__(self) -> ChildWatch:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.004):
            tree = _descendants(os.getpid())
            if any(depth >= 2 for _, depth in tree):
                self.problems.append("a delegate started another process (killed): "
                                     + " | ".join(_stop_and_kill()))
            elif tree and time.monotonic() - self._start > CALL_LIMIT:
                self.problems.append(f"still running after {CALL_LIMIT}s (killed): " + " | ".join(_stop_and_kill()))

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        if _descendants(os.getpid()):
            time.sleep(0.05)
            if any(_cmdline(p) != f"[{p}]" for p, _ in _descendants(os.getpid())):
                self.problems.append("processes outlived the call (killed): " + " | ".join(_stop_and_kill()))
        _reap_orphans()


class FifoService:
    """Keeps the FIFOs a config may name from blocking anyone: a permanent reader on those the
    plugin may write (anything written is a finding), a one-shot writer for each reader of
    those it may read."""

    def __init__(self, writes: list[Path], reads: dict[Path, bytes]) -> None:
        self.written: list[str] = []
        self._reads = reads
        self._fds = {os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC): p for p in writes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fuzz-fifos")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            for fd, path in self._fds.items():
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:  # EAGAIN: a writer, but nothing written yet
                    continue
                if data:
                    self.written.append(f"{path}: {data[:80]!r}")
            for path, payload in self._reads.items():
                try:
                    wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                except OSError:  # ENXIO: nobody reads it now (or a bug removed it: served no more)
                    continue
                try:
                    os.write(wfd, payload)
                except OSError:
                    pass
                finally:
                    os.close(wfd)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for fd in self._fds:
            os.close(fd)


Snapshot = dict[str, tuple[Any, ...]]


def _entry(path: str, st_: os.stat_result, names_only: bool) -> tuple[Any, ...]:
    kind = stat.S_IFMT(st_.st_mode)
    if stat.S_ISDIR(st_.st_mode) or names_only and not stat.S_ISREG(st_.st_mode):
        return (kind,)
    return (kind, st_.st_ino, st_.st_size, st_.st_mtime_ns, stat.S_IMODE(st_.st_mode))


def snapshot_tree(root: str, *, depth: int, skip: Any = lambda p: False, names_only: bool = False) -> Snapshot:
    """lstat of everything below `root` down to `depth` levels (0: the root's entries only)."""
    out: Snapshot = {}
    todo = [(root, 0)]
    while todo:
        directory, level = todo.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if skip(entry.path):
                continue
            try:
                st_ = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            out[entry.path] = _entry(entry.path, st_, names_only)
            if stat.S_ISDIR(st_.st_mode) and level < depth:
                todo.append((entry.path, level + 1))
    return out


@dataclass
class Call:
    code: int
    text: str
    seconds: float
    problems: list[str]


@dataclass(repr=False)
class Fuzz:
    lab: Lab
    root: Path  # outside the lab: the plugin's working directory and the canaries
    cwd: Path
    out: Path
    log_dir: Path
    devinfo_dir: Path
    ipam_dirs: list[Path]
    resolv_dirs: list[Path]
    ovs_dirs: list[Path]
    endpoints: set[str]
    tokens: dict[str, str]
    fifos: FifoService | None = None
    # /var/lib and /var/log as the plugin sees them, and the one thread every call runs on
    # (in the mount namespace with those overlays): fixture `fz` sets them up.
    view: PrivateWrites | None = None
    worker: ThreadPoolExecutor | None = None
    lab_internal: set[str] = field(default_factory=set)
    fifo_paths: set[str] = field(default_factory=set)
    netns: set[str] = field(default_factory=set)

    def __repr__(self) -> str:  # hypothesis prints the fixture with every falsifying example
        return f"Fuzz(lab={str(self.lab.root)!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    # -- observing ------------------------------------------------------------------------
    def files(self) -> Snapshot:
        lab_root = str(self.lab.root)
        allowed = [str(self.lab.state_dir), str(self.devinfo_dir), *map(str, self.ipam_dirs),
                   str(self.lab.hostlocal_dir)]

        def in_lab_skip(path: str) -> bool:
            if path in self.fifo_paths or any(path == a or path.startswith(a + "/") for a in allowed):
                return True
            if os.path.dirname(path) == str(self.log_dir) and os.path.isfile(path) and not os.path.islink(path):
                return True  # a log file directly in the log directory: allowed
            return path in self.lab_internal  # the lab's own OVS files change all the time

        snap: Snapshot = {}
        # Host-wide directories are shared with everyone (other test runs on this machine
        # write to /tmp, /root, …): there only paths a bug of ours can make count — every
        # path this file generates carries the marker, and tenantnet's defaults say so.
        # The directories self.view overlays (/var/lib, /var/log, /etc, /root, /dev/shm) are
        # not among them: the plugin writes there only into its upper layers, in self.root.
        private = self.view.layers if self.view else {}
        for tree, depth in (("/", 0), ("/etc", 64), ("/root", 2), ("/tmp", 0), ("/run", 0), ("/dev/shm", 64)):
            if tree not in private:
                snap.update(snapshot_tree(tree, depth=depth, skip=_not_ours))
        work = tuple(str(w) for _, w in self.view.layers.values()) if self.view else ()
        snap.update(snapshot_tree(str(self.root), depth=64, skip=lambda p: p in self.fifo_paths or p in work))
        snap.update(snapshot_tree(str(self.lab.root.parent), depth=0, names_only=True,
                                  skip=lambda p: p in (lab_root, str(self.lab.hostlocal_dir))))
        snap.update(snapshot_tree(lab_root, depth=64, skip=in_lab_skip))
        return snap

    def allocations(self) -> set[str]:
        found = set()
        for d in {*self.ipam_dirs, self.lab.hostlocal_dir}:
            for f in d.rglob("*") if d.is_dir() else []:
                if not f.is_file() or f.name.startswith(("last_reserved_ip", "lock")):
                    continue
                if f.name == "ipam.db":  # tenantnet-ipam's store
                    try:
                        with closing(sqlite3.connect(f"file:{quote(str(f))}?mode=ro", uri=True)) as db:
                            for row in db.execute("SELECT network, address, container_id FROM allocation"):
                                found.add(f"{f}: {row}")
                    except sqlite3.Error as exc:
                        found.add(f"{f}: unreadable ({exc})")
                elif _is_address(f.name):  # host-local: one file per address
                    found.add(str(f))
        return found

    def records(self) -> set[str]:
        base = self.lab.state_dir / "attachments"
        return {str(p) for p in base.rglob("*") if not p.is_dir()} if base.is_dir() else set()

    @staticmethod
    def links() -> dict[str, str]:
        """Host links: name -> interface alias."""
        out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
        return {link["ifname"]: link.get("ifalias", "") for link in json.loads(out)}

    def state(self) -> dict[str, Any]:
        return {"links": self.links(), "ports": set(self.lab.owned_ports()), "records": self.records(),
                "allocations": self.allocations(), "files": self.files(),
                "written": len(self.fifos.written) if self.fifos else 0}

    # -- acting ---------------------------------------------------------------------------
    def env(self, command: str, cid: str, netns: str, cni_args: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command,
                "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{netns}", "CNI_IFNAME": IFNAME,
                "CNI_PATH": f"{BIN}:{GO_PLUGINS}", "CNI_ARGS": cni_args,
                "TENANTNET_CONFIG": str(self.lab.node_config)}

    def call(self, env: dict[str, str], stdin: bytes) -> Call:
        from tenantnet.entry.plugin import run_in_process

        assert self.worker is not None
        started = time.monotonic()
        with ChildWatch() as watch:
            code, text = self.worker.submit(run_in_process, env, stdin).result()
        return Call(code, text, time.monotonic() - started, watch.problems)

    def scrub(self, cid: str, netns: str, before: dict[str, Any], after: dict[str, Any] | None) -> list[str]:
        """Remove what the example left (each thing only if it is provably ours), from `after`
        (the state after its DEL; measured again if the example did not get that far);
        returns what could not be removed."""
        after = after or self.state()
        kept: list[str] = []
        for port in after["ports"] - before["ports"]:
            self.lab.vsctl("--if-exists", "del-port", port)
        for link in self.new_links(before, after, cid):
            subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
        for record in after["records"] - before["records"]:
            Path(record).unlink(missing_ok=True)
        for d in {*self.ipam_dirs, self.lab.hostlocal_dir} if after["allocations"] - before["allocations"] else ():
            for f in d.rglob("*") if d.is_dir() else []:
                if f.name == "ipam.db":
                    try:
                        with closing(sqlite3.connect(str(f))) as db, db:
                            db.execute("DELETE FROM allocation WHERE container_id = ?", (cid,))
                    except sqlite3.Error as exc:
                        kept.append(f"allocations of {cid} in {f} ({exc})")
                elif f.is_file() and _is_address(f.name) and f.read_bytes().split(b"\r\n", 1)[0].strip() == cid.encode():
                    f.unlink()  # host-local: the file of an address holds the container id
        # Deepest first. Ours: a marked path, or anything new in our own scratch directory; a
        # directory nobody had before (say /var/lib/cni/networks) goes once it is empty again.
        for path in sorted(set(after["files"]) - set(before["files"]), key=len, reverse=True):
            try:
                if MARK in path or path.startswith(str(self.root) + "/"):
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
                elif os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
                    os.rmdir(path)
                else:
                    kept.append(f"file {path}")
            except FileNotFoundError:
                pass
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)
        self.netns.discard(netns)
        return kept

    # -- one example ----------------------------------------------------------------------
    def exercise(self, conf: dict[str, Any], cni_args: str, meanwhile: OtherWork | None = None) -> None:
        """One example: ADD, DEL, the checks. `meanwhile`: other work done on the machine from
        just after the first snapshot until the end (the watchers must not count it)."""
        conf = resolve(conf, self.tokens)
        cni_args = resolve(cni_args, self.tokens)
        stdin = json.dumps(conf).encode()
        cid, netns = new_cid(), f"tnt-{uuid.uuid4().hex[:10]}"
        subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
        self.netns.add(netns)
        before: dict[str, Any] = {}
        after: dict[str, Any] | None = None
        try:
            before = self.state()
            if meanwhile is not None:
                meanwhile.start()
            add = self.call(self.env("ADD", cid, netns, cni_args), stdin)
            dele = self.call(self.env("DEL", cid, netns, cni_args), stdin)
            after = self.state()
            self.check(conf, cni_args, add, dele, before, after, cid)
        finally:
            if meanwhile is not None:
                meanwhile.stop()
            if before:
                kept = self.scrub(cid, netns, before, after)
                if kept:
                    print("tnfuzz: left in place (not provably ours):", kept)
            else:
                subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)
                self.netns.discard(netns)

    @staticmethod
    def new_links(before: dict[str, Any], after: dict[str, Any], cid: str) -> set[str]:
        """Host links of this example that appeared: its host veth, a pod end that landed in the
        host, or any link whose alias names its container. (Not a plain diff: this machine
        runs other labs at the same time, whose links come and go.)"""
        from tenantnet.plugin.drivers.ovs import host_ifname

        ours = {host_ifname(cid, IFNAME), IFNAME}
        return {n for n, alias in after["links"].items()
                if n not in before["links"] and (n in ours or cid in alias)}

    def check(self, conf: dict[str, Any], cni_args: str, add: Call, dele: Call,
              before: dict[str, Any], after: dict[str, Any], cid: str) -> None:
        found = violations(conf, cni_args, add, dele, before, after, self.new_links(before, after, cid),
                           self.fifos.written[before["written"]:] if self.fifos else [], self, cid)
        if found:
            kind, what = found[0]
            others = "".join(f"\n  also {k}: {w}" for k, w in found[1:])
            raise violation(kind)(
                f"{kind}: {what}{others}\nCNI_ARGS={cni_args!r}\nADD -> {add.code} {add.text[:800]}"
                f"\nDEL -> {dele.code} {dele.text[:400]}")


_VIOLATIONS: dict[str, type[AssertionError]] = {}


def violation(kind: str) -> type[AssertionError]:
    """One exception class per kind of violation: hypothesis tells bugs apart by where they
    are raised and by type, so each kind is shrunk and reported on its own."""
    if kind not in _VIOLATIONS:
        name = "Violation_" + re.sub(r"\W", "_", kind)
        _VIOLATIONS[kind] = type(name, (AssertionError,), {})
    return _VIOLATIONS[kind]


def _error_problem(doc: Any, code: int, verb: str) -> tuple[str, str] | None:
    """What is wrong with an error document (None if nothing)."""
    if code != 1 or not isinstance(doc, dict) or not set(doc) <= {"cniVersion", "code", "msg", "details"} \
            or not isinstance(doc.get("msg"), str):
        return (f"{verb} error shape", f"exit code {code}, document {doc!r}")
    value = doc.get("code")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 200:
        return (f"{verb} code not an int < 200", repr(value))
    if value == 100:
        return (f"{verb} code 100", doc["msg"])
    if value not in DOCUMENTED:
        return (f"{verb} undocumented code", f"{value}: {doc['msg']}")
    return None


def _changed_by_us(path: str, old: tuple[Any, ...] | None, fz: Fuzz, cid: str) -> bool:
    """Whether a new or changed entry is this example's doing. Anything marked, or in our own
    or the lab's directories (the overlay's upper layers included: only the plugin writes
    there), is; tenantnet's own log directory (/var/log/tenantnet, in the upper layer), and a
    host-wide tenantnet path, only if it is a regular file whose new bytes mention this
    example."""
    shown = fz.view.show(path) if fz.view else path  # a path of an upper layer: as the plugin wrote it
    tenantnet_log = shown == "/var/log/tenantnet" or shown.startswith("/var/log/tenantnet/")
    if MARK in path or (path.startswith((str(fz.root) + "/", str(fz.lab.root.parent) + "/")) and not tenantnet_log):
        return True
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with open(path, "rb") as fh:
            fh.seek(old[2] if old is not None and len(old) > 2 else 0)
            added = fh.read(1 << 20)
    except OSError:
        return False  # gone again: not something we left
    return MARK.encode() in added or cid.encode() in added


def violations(conf: dict[str, Any], cni_args: str, add: Call, dele: Call, before: dict[str, Any],
               after: dict[str, Any], new_links: set[str], written: list[str], fz: Fuzz,
               cid: str) -> list[tuple[str, str]]:
    """Every property of one ADD + DEL that does not hold, as (kind, detail), most basic first."""
    out: list[tuple[str, str]] = []
    try:
        doc = json.loads(add.text)  # exactly one JSON document
    except ValueError:
        return [("ADD output not one JSON document", repr(add.text[:300]))]
    if add.code == 0:
        if not isinstance(doc, dict) or "code" in doc or doc.get("cniVersion") != conf.get("cniVersion"):
            out.append(("ADD result shape", repr(doc)[:300]))
    elif problem := _error_problem(doc, add.code, "ADD"):
        out.append(problem)
    if dele.text:
        try:
            ddoc = json.loads(dele.text)
        except ValueError:
            ddoc = dele.text
        if problem := _error_problem(ddoc, dele.code, "DEL"):
            out.append(problem)
    elif dele.code != 0:
        out.append(("DEL error shape", f"exit code {dele.code} without a document"))
    for verb, call in (("ADD", add), ("DEL", dele)):
        for problem in call.problems:
            out.append((f"{verb} processes", problem))
        if call.seconds >= CALL_LIMIT:
            out.append((f"{verb} slow", f"{call.seconds:.1f}s"))
    # nothing left after the DEL
    for kind, left in (("OVS ports left", after["ports"] - before["ports"]), ("host links left", new_links),
                       ("records left", after["records"] - before["records"]),
                       ("allocations left", after["allocations"] - before["allocations"])):
        if left:
            out.append((kind, repr(sorted(left))))
    # nothing touched outside the lab's directories
    old, new = before["files"], after["files"]
    touched = sorted([f"new {p}" for p in set(new) - set(old) if _changed_by_us(p, None, fz, cid)]
                     + [f"removed {p}" for p in set(old) - set(new)]
                     + [f"changed {p}" for p in set(old) & set(new) if old[p] != new[p]
                        and _changed_by_us(p, old[p], fz, cid)])
    if touched:
        out.append(("files touched outside the lab's directories", repr(touched)))
    if written:
        out.append(("written into a FIFO", repr(written)))
    # an ADD that succeeded got past no constraint of the trust model
    if add.code == 0:
        for refusal in refusals(conf, cni_args, fz):
            field_name = re.match(r"[A-Za-z_.]*", refusal).group()  # type: ignore[union-attr]
            out.append((f"ADD accepted bad {field_name}", refusal))
    return out


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


@pytest.fixture(scope="module")
def fz(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    node = yaml.safe_load(lab.node_config.read_text()) or {}
    root_dir = lab.root
    log_dir = Path(os.path.dirname(node.get("logFile") or str(root_dir / "log" / "tenantnet.log")))
    fuzz_root = tmp_path_factory.mktemp("fuzz")
    fzz = Fuzz(
        lab=lab, root=fuzz_root, cwd=fuzz_root / "cwd" / "deep", out=fuzz_root / "outside", log_dir=log_dir,
        devinfo_dir=Path(node.get("deviceInfoDir") or root_dir / "devinfo"),
        ipam_dirs=[Path(p) for p in node.get("ipamDataDirs") or [root_dir / "ipam", root_dir / "host-local"]],
        resolv_dirs=[Path(p) for p in node.get("resolvConfPaths") or [root_dir / "resolv.d"]],
        ovs_dirs=[Path(p) for p in node.get("ovsConfigurationPaths") or [root_dir / "ovs.d"]],
        endpoints={endpoint(e) for e in [lab.ovsdb, *(node.get("ovsdbEndpoints") or [])]},
        tokens={},
    )
    fzz.tokens = {
        T["LOG"]: str(fzz.log_dir), T["DEVINFO"]: str(fzz.devinfo_dir), T["IPAM"]: str(fzz.ipam_dirs[0]),
        T["HOSTLOCAL"]: str(lab.hostlocal_dir), T["RESOLV"]: str(fzz.resolv_dirs[0]), T["OVSD"]: str(fzz.ovs_dirs[0]),
        T["LAB"]: str(lab.root), T["LAB0"]: str(lab.root.parent), T["OUT"]: str(fzz.out), T["OVSDB"]: lab.ovsdb,
        T["OVSSOCK"]: lab.ovsdb.removeprefix("unix:"), T["BRIDGE"]: lab.bridge, T["LABNAME"]: lab.root.name,
    }
    for d in (fzz.cwd, fzz.out, fzz.log_dir, fzz.devinfo_dir, *fzz.ipam_dirs, lab.hostlocal_dir,
              *fzz.resolv_dirs, *fzz.ovs_dirs, fzz.ovs_dirs[0] / "sub"):
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    ovs, resolv, out = fzz.ovs_dirs[0], fzz.resolv_dirs[0], fzz.out
    good = json.dumps({"socket_file": lab.ovsdb})
    files = {
        ovs / f"{MARK}-ok.json": good, ovs / "sub" / f"{MARK}-ok.json": good,
        ovs / f"{MARK}-bare.json": json.dumps({"socket_file": lab.ovsdb.removeprefix("unix:")}),
        ovs / f"{MARK}-none.json": "{}",
        ovs / f"{MARK}-other.json": json.dumps({"socket_file": "unix:/run/openvswitch/db.sock"}),
        ovs / f"{MARK}-tcp.json": json.dumps({"socket_file": "tcp:127.0.0.1:1"}),
        ovs / f"{MARK}-big.json": good + " " * (MAX_FILE + 10), ovs / f"{MARK}-bad.json": "not json",
        resolv / f"{MARK}-ok.conf": "nameserver 10.0.0.53\nsearch example.org\noptions ndots:2\n",
        resolv / f"{MARK}-big.conf": "nameserver 10.0.0.53\n" + "#" * (MAX_FILE + 10) + "\n",
        fzz.devinfo_dir / f"{MARK}-existing.json": json.dumps({"type": "pci", "version": "1.1.0", "pci": {}}),
        out / f"{MARK}-canary-ovs.json": good, out / f"{MARK}-canary.conf": "nameserver 10.0.0.53\n",
        out / f"{MARK}-canary.log": "", out / f"{MARK}-canary-devinfo.json": "{}",
    }
    for path, text in files.items():
        path.write_text(text)
    links = {ovs / f"{MARK}-link.json": out / f"{MARK}-canary-ovs.json",
             resolv / f"{MARK}-link.conf": out / f"{MARK}-canary.conf",
             fzz.log_dir / f"{MARK}-link.log": out / f"{MARK}-canary.log",
             fzz.devinfo_dir / f"{MARK}-link.json": out / f"{MARK}-canary-devinfo.json"}
    for link, target in links.items():
        if not link.is_symlink():
            link.symlink_to(target)
    for d in (ovs / f"{MARK}-dir.json", resolv / f"{MARK}-dir.conf", fzz.log_dir / f"{MARK}-dir.log",
              fzz.devinfo_dir / f"{MARK}-dir.json"):
        d.mkdir(exist_ok=True)
    write_fifos = [fzz.log_dir / f"{MARK}-w.fifo"]
    read_fifos = {ovs / f"{MARK}-r.fifo": good.encode(), resolv / f"{MARK}-r.fifo": b"nameserver 10.0.0.53\n"}
    for fifo in [*write_fifos, *read_fifos]:
        if not fifo.exists():
            os.mkfifo(fifo, 0o600)
        fzz.fifo_paths.add(str(fifo))
    fzz.lab_internal = {e.path for e in os.scandir(lab.root) if not e.is_dir(follow_symlinks=False)}
    fzz.lab_internal |= {str(lab.root / n) for n in ("conf.db", ".conf.db.~lock~", "db.sock")}
    fzz.fifos = FifoService(write_fifos, read_fifos)
    fzz.view = PrivateWrites(fuzz_root / "private")
    view, cwd = fzz.view, fzz.cwd

    def enter() -> None:
        view.enter()
        os.chdir(cwd)  # the namespace gave this thread a filesystem context of its own

    fzz.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fuzz-plugin", initializer=enter)
    fzz.worker.submit(lambda: None).result()  # mounted now, before any example's snapshot
    old_cwd, old_config = os.getcwd(), os.environ.get("TENANTNET_CONFIG")
    os.chdir(fzz.cwd)  # a relative path in a config lands here, where it is watched
    os.environ["TENANTNET_CONFIG"] = str(lab.node_config)  # config.load() reads the process env
    _set_subreaper(True)
    try:
        yield fzz
    finally:
        fzz.worker.shutdown(wait=True)
        _set_subreaper(False)
        _stop_and_kill()
        _reap_orphans()
        os.chdir(old_cwd)
        if old_config is None:
            os.environ.pop("TENANTNET_CONFIG", None)
        else:
            os.environ["TENANTNET_CONFIG"] = old_config
        fzz.fifos.close()
        for netns in list(fzz.netns):
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)


# ---- the tests -----------------------------------------------------------------------------


def test_harness_sees_what_it_should(fz):
    """The plain config attaches and detaches cleanly, and the watchers do notice a file
    appearing outside the lab, a FIFO being written and a leftover process."""
    assert resolve(base_conf(), fz.tokens) == PluginRunner(fz.lab).conf(name=NETWORK)
    fz.exercise(base_conf(), DEFAULT_ARGS)
    before = fz.files()
    probe = Path("/tmp") / f"{MARK}-selftest-{uuid.uuid4().hex[:6]}"
    probe.write_text("x")
    try:
        assert f"{probe}" in set(fz.files()) - set(before)
    finally:
        probe.unlink()
    assert fz.fifos is not None
    count = len(fz.fifos.written)
    with open(fz.log_dir / f"{MARK}-w.fifo", "w") as fh:
        fh.write("probe")
    deadline = time.monotonic() + 2
    while len(fz.fifos.written) == count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(fz.fifos.written) == count + 1
    with ChildWatch() as watch:
        proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30"])
        time.sleep(0.2)
    proc.wait(timeout=5)
    assert any("another process" in p for p in watch.problems), watch.problems


def test_watchers_count_the_plugins_doing_and_nothing_else(fz):
    """The watchers attribute: while an example runs, another run's files under /var/lib and
    /var/log (libcni's results, an IPAM store, a log), a bridge and a veth named like an
    attachment's are made in the host and no violation is found; a file the plugin's own
    calls write there (on the worker thread every call runs on: the plugin's mount namespace)
    is found, although its name carries no marker, and a host link marked with this
    example's container id is too."""
    other = OtherWork()
    fz.exercise(base_conf(), DEFAULT_ARGS, meanwhile=other)
    assert other.made_dirs == []  # what it made is gone again

    assert fz.view is not None and fz.worker is not None
    before = fz.files()
    leak = "/var/lib/tenantnet/ipam/ipam.db-shm"

    def write() -> None:
        os.makedirs(os.path.dirname(leak), exist_ok=True)
        with open(leak, "wb") as fh:
            fh.write(b"written by the process under test")

    fz.worker.submit(write).result()
    upper = str(fz.view.layers["/var/lib"][0])
    try:
        new = set(fz.files()) - set(before)
        assert f"{upper}/tenantnet" in new or f"{upper}/tenantnet/ipam/ipam.db-shm" in new, sorted(new)
        assert not os.path.exists(leak) or os.path.getsize(leak) != len(b"written by the process under test")
    finally:
        shutil.rmtree(f"{upper}/tenantnet", ignore_errors=True)

    from tenantnet.plugin.drivers.base import owner_mark

    cid = new_cid()
    links_before = {"links": Fuzz.links()}
    name = "tnleak" + uuid.uuid4().hex[:6]
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True,
                   capture_output=True)
    try:
        subprocess.run(["ip", "link", "set", name, "alias", owner_mark(NETWORK, cid, IFNAME)], check=True,
                       capture_output=True)
        assert Fuzz.new_links(links_before, {"links": Fuzz.links()}, cid) == {name}
    finally:
        subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


@settings(FUZZ, max_examples=100)
@given(conf=netconfs(PATH_FIELDS, 2))
@examples(
    {"logFile": f"{T['LOG']}/{MARK}-w.fifo"}, {"logFile": f"{T['LOG']}/{MARK}-link.log"},
    {"logFile": f"{T['LOG']}/{MARK}-dir.log"}, {"logFile": f"/tmp/{MARK}.log"},
    {"logFile": f"{T['LOG']}/../{MARK}.log"},
    {"configuration_path": f"{T['OVSD']}/{MARK}-link.json"}, {"configuration_path": f"{T['OVSD']}/{MARK}-r.fifo"},
    {"configuration_path": f"{T['OVSD']}/{MARK}-big.json"}, {"configuration_path": f"{T['OUT']}/{MARK}-canary-ovs.json"},
    {"socket_file": f"unix:{T['LAB']}//db.sock"}, {"socket_file": "unix:/run/openvswitch/db.sock"},
    {"ipam.resolvConf": f"{T['RESOLV']}/{MARK}-r.fifo"}, {"ipam.resolvConf": f"{T['RESOLV']}/{MARK}-link.conf"},
    {"ipam.resolvConf": f"{T['RESOLV']}/{MARK}-big.conf"}, {"ipam.resolvConf": f"{T['RESOLV']}/{MARK}-dir.conf"},
    {"ipam.dataDir": OMIT}, {"ipam.dataDir": f"/tmp/{MARK}-ipam"}, {"ipam.dataDir": f"{T['HOSTLOCAL']}/../../{MARK}"},
    {"ipam.type": "tenantnet"}, {"ipam.type": "tenantnet-ipam", "ipam.dataDir": OMIT},
    {"runtimeConfig.CNIDeviceInfoFile": f"/etc/{MARK}-devinfo.json"},
)
def test_fuzz_paths(fz, conf):
    """The paths a tenant names: logFile, configuration_path, socket_file, ipam.dataDir,
    ipam.resolvConf, ipam.type, runtimeConfig.CNIDeviceInfoFile."""
    fz.exercise(conf, DEFAULT_ARGS)


@settings(FUZZ, max_examples=100)
@given(conf=netconfs(VALUE_FIELDS, 3))
@examples(
    {"runtimeConfig.dns": {"servers": ["10.0.0.53\nnameserver 1.1.1.1"]}}, {"runtimeConfig.dns": {"servers": [1]}},
    {"runtimeConfig.ips": ["x"]}, {"args": {"cni": {"ips": [5]}}}, {"runtimeConfig.deviceID": "0000:3b:00.2"},
    {"runtimeConfig.mac": "01:00:5e:00:00:01"}, {"mac": "00:00:00:00:00:00"}, {"vlan": 4095}, {"mtu": 67},
    {"trunk": [{"minID": 30, "maxID": 20}]}, {"logLevel": "trace"}, {"mode": "OVS"}, {"bridge": T["BRIDGE"] + "\n"},
    {"prevResult": {"ips": [{"address": 5}]}}, {"prevResult": {"interfaces": [{"name": "a", "mtu": 1e308}]}},
    {"ipam.ranges": OMIT},
)
def test_fuzz_values(fz, conf):
    """The values: logLevel, runtimeConfig (mac, ips, dns, deviceID), args.cni.ips, prevResult,
    bridge, vlan, trunk, mtu, mac, mode, ipam.ranges."""
    fz.exercise(conf, DEFAULT_ARGS)


@settings(FUZZ, max_examples=100)
@given(conf=netconfs(FIELDS, 4), cni_args=cni_args_strings)
def test_fuzz_add_del(fz, conf, cni_args):
    """Everything at once: whole objects (runtimeConfig, args, ipam, prevResult) replaced by
    anything, together with CNI_ARGS."""
    fz.exercise(conf, cni_args)


@settings(FUZZ, max_examples=30)
@given(cni_args=st.lists(cni_args_items, max_size=6).map(";".join))
@example(cni_args="IgnoreUnknown=1;IP=10.77.0.7/24,fd00:77::7/64")
@example(cni_args="K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1")  # no IgnoreUnknown: all keys are known
@example(cni_args="IgnoreUnknown=1;K8S_POD_NAME=../pod;MAC=02:00:00:00:00:02")
def test_fuzz_cni_args(fz, cni_args):
    """CNI_ARGS alone, on the valid config: pod identity, MAC=, IP=, IgnoreUnknown, garbage."""
    fz.exercise(base_conf(), cni_args)
